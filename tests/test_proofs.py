"""The generated proofs in ``proofs/``: up to date with the derivations, consistent, and compiling.

* Staleness: regenerating into a temporary directory gives exactly the committed files.
* Consistency (no TeX needed): every ``\\input``, ``\\ref`` and cited lemma resolves.
* Compilation (``@pytest.mark.tex``): ``proofs/main.tex``, a standalone bound document and a
  document of adversarial prose compile with ``latexmk -pdf`` without errors, undefined
  references or badly overfull lines.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lipbound.printing import proof_files as proofs
from lipbound.printing.document import bound_section, comparison_table, standalone
from lipbound.printing.proof_files import HEADER, generate
from lipbound.printing.prose import text_to_latex
from lipbound.symbolic import symbols as S
from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, Unbounded
from lipbound.symbolic.local import LOCAL_THEOREMS
from lipbound.symbolic.registry import variant

#: The derivations are formed once per process (the theorems are cached): test_proofs regenerates them all,
#: test_symbolic and test_symbolic_modern form most of them again, so one xdist process runs the three modules.
pytestmark = pytest.mark.xdist_group("derivations")

PROOFS = Path(__file__).resolve().parent.parent / "proofs"
REGENERATE = "lipbound proofs proofs/"
#: An overfull line wider than this (points) is a layout bug, not a rounding of TeX's line breaking.
OVERFULL_TOLERANCE_PT = 10.0

TEX_MISSING = shutil.which("latexmk") is None or shutil.which("pdflatex") is None
needs_tex = pytest.mark.skipif(TEX_MISSING, reason="no TeX engine on PATH (latexmk and pdflatex are needed)")


def _committed() -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(PROOFS.glob("*.tex"))}


def test_proofs_are_up_to_date(tmp_path):
    """Regenerate and compare byte for byte with the committed proofs/."""
    written = generate(tmp_path)
    fresh = {path.name: path.read_bytes() for path in written}
    committed = _committed()
    hint = f"proofs/ is stale; regenerate with `{REGENERATE}` and commit the result"
    assert sorted(fresh) == sorted(committed), f"{hint} (files differ: " \
        f"new {sorted(set(fresh) - set(committed))}, gone {sorted(set(committed) - set(fresh))})"
    changed = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not changed, f"{hint} (changed: {changed})"


def test_generation_keeps_foreign_files_and_removes_stale_generated_ones(tmp_path, monkeypatch):
    few = [proofs.Instance("dot-product-nobias", "fro", domain.key,
                           variant("dot-product-nobias").derive(Assumptions(domain=domain), "dot-product-nobias"))
           for domain in (Ball(), Unbounded())]
    monkeypatch.setattr(proofs, "derive_all", lambda: (few, [("cosine", "fro", "ball", "a reason")]))
    (tmp_path / "notes.tex").write_text("% a user's own file\n")
    (tmp_path / "old-theorem.tex").write_text(HEADER + "\\section{gone}\n")
    written = generate(tmp_path)
    assert [path.name for path in written] == [
        "claims.tex", "kernel-constants.tex", "local.tex", "main.tex", "not-lipschitz-dot-product.tex",
        "self-attention-fro.tex"]
    assert (tmp_path / "notes.tex").exists()
    assert not (tmp_path / "old-theorem.tex").exists()
    assert all(path.read_text().startswith(HEADER) for path in written)
    main = (tmp_path / "main.tex").read_text()
    assert "\\section{Not derived}" in main and "a reason" in main


def test_committed_proofs_are_consistent():
    """Every file main.tex inputs exists and every file is input; every reference has a label."""
    files = {path.name: path.read_text(encoding="utf-8") for path in PROOFS.glob("*.tex")}
    assert "main.tex" in files, f"proofs/main.tex is missing; run `{REGENERATE}`"
    main = files["main.tex"]
    inputs = re.findall(r"\\input\{([^}]+)\}", main)
    assert sorted(f"{name}.tex" for name in inputs) == sorted(set(files) - {"main.tex"})
    text = "\n".join(files.values())
    labels = set(re.findall(r"\\label\{([^}]+)\}", text))
    references = set(re.findall(r"\\ref\{([^}]+)\}", text))
    assert references <= labels, f"undefined: {sorted(references - labels)}"
    assert len(re.findall(r"\\label\{", text)) == len(labels), "a label is defined twice"
    theorem_files = sorted(set(files) - {"main.tex", "kernel-constants.tex", "claims.tex", "local.tex"})
    for name in theorem_files:
        assert f"\\label{{thm:{name[:-4]}}}" in files[name]
    assert {"self-attention-fro.tex", "not-lipschitz-dot-product.tex", "l2-global-fro.tex"} <= set(theorem_files)
    assert all(f"\\label{{thm:{theorem_id}}}" in files["local.tex"] for theorem_id in LOCAL_THEOREMS)


def _compile(directory: Path, name: str) -> str:
    """Run latexmk on ``directory/name``; return the log after checking errors and references."""
    run = subprocess.run(
        ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", name],
        cwd=directory, capture_output=True, text=True, timeout=600)
    log_path = directory / (Path(name).stem + ".log")
    log = log_path.read_text(encoding="latin-1") if log_path.exists() else ""
    errors = [line for line in log.splitlines() if line.startswith("! ")]
    assert run.returncode == 0 and not errors, \
        f"latexmk failed on {name} (exit {run.returncode}): {errors[:5]}\n{run.stdout[-2000:]}"
    assert "LaTeX Warning: Reference" not in log, "undefined references in " + name
    assert "There were undefined references" not in log
    assert "LaTeX Warning: Citation" not in log
    assert (directory / (Path(name).stem + ".pdf")).exists()
    overfull = [float(width) for width in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    assert all(width <= OVERFULL_TOLERANCE_PT for width in overfull), \
        f"lines overflow by {sorted(overfull)[-3:]} pt in {name}"
    return log


@pytest.mark.tex
@needs_tex
def test_proofs_compile(tmp_path):
    copy = tmp_path / "proofs"
    shutil.copytree(PROOFS, copy)
    log = _compile(copy, "main.tex")
    pages = re.search(r"Output written on main\.pdf \((\d+) pages", log)
    assert pages and int(pages.group(1)) > 10


@pytest.mark.tex
@needs_tex
def test_standalone_bound_document_compiles(tmp_path):
    results = [
        variant("dot-product").derive(Assumptions(domain=LayerNormImage()), "dot-product"),
        variant("cosine").derive(Assumptions(domain=Ball(), norm="2,1"), "cosine"),
        variant("multi-head-l2").derive(Assumptions(domain=Unbounded(), norm="inf"), "multi-head-l2"),
        variant("causal").derive(Assumptions(domain=Unbounded()), "causal"),
    ]
    rows = [{"variant": result.variant, "theorem": result.generic if result.lipschitz else None,
             "value": 2116.0} for result in results]  # table cells do not wrap: short statements
    body = "\n".join(bound_section(result) for result in results) + "\n" + comparison_table(
        rows, [("variant", "Variant"), ("theorem", "General theorem"), ("value", "Value")])
    (tmp_path / "bound.tex").write_text(standalone(body, "Bounds for dot-product, cosine and L2 attention"))
    _compile(tmp_path, "bound.tex")


@pytest.mark.tex
@needs_tex
def test_any_prose_compiles(tmp_path):
    """Justifications are free text: adversarial strings (TeX specials, ASCII math, Unicode)
    must come out compilable."""
    generator = random.Random(20240611)
    alphabet = list("abcxyzWQKRVE_^|<=>-+*/.,;:()[]{}$%&#~\\'\" 0123456789 éα≤∞⟂→") + [
        "||", "<=", "->", "sqrt(", "sum_j ", "sup_y ", "^T", "_ij", "gamma_max", ".T", "..", " . "]
    lines = []
    for _ in range(300):
        text = "".join(generator.choice(alphabet) for _ in range(generator.randint(1, 40)))
        lines.append(text_to_latex(text) + r"\par")
    lines.append(text_to_latex(str(S.MatrixNormSymbol("W_K*W_Q.T"))) + r"\par")
    (tmp_path / "prose.tex").write_text(standalone("\n".join(lines), "Prose"))
    _compile(tmp_path, "prose.tex")
