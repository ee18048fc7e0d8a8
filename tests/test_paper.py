"""``lipbound paper`` as an author uses it: the written section compiles with a real TeX engine.

One ``paper`` run covers dot-product, tied L2, cross-attention and a user-defined score, with the
figure of a real head (the embedded all-MiniLM-L6-v2 layer 0, short witness searches), and one
``latexmk`` compiles it: zero errors, every reference and citation resolved, no line overfull by
more than 10 pt; a page of each variant and the figure's page are rendered with ``pdftoppm`` and
checked not blank.  Content checks (labels, prefixes, bibliography, rounding directions) need no TeX.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from lipbound.cli import main
from lipbound.cli.symbolic import chosen_variant, derive_result
from lipbound.printing.bibliography import REFERENCES
from lipbound.printing.paper import (
    BIB_FILE,
    MAIN_FILE,
    PREAMBLE_FILE,
    SECTION_FILE,
    PaperEntry,
    ScalingFigure,
    Series,
    paper_files,
)

#: one test process writes the section once (the module's fixture) and runs every check on it
pytestmark = pytest.mark.xdist_group("paper")

TEX = shutil.which("latexmk") and shutil.which("pdflatex") and shutil.which("pdftoppm") and shutil.which("bibtex")
needs_tex = pytest.mark.skipif(not TEX, reason="latexmk, pdflatex, bibtex and pdftoppm are needed")
#: A line overfull by more than this is a layout bug.
OVERFULL_PT = 10.0
VARIANTS = ["dot-product", "l2-tied", "cross-joint", "custom"]
SCORE = "Inner(q, k)**2/d_k"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("paper") / "section"
    assert main(["paper", *VARIANTS, "--score", SCORE, "--weights", "default", "--budget", "0.05",
                 "--n-values", "2,4,8", "-o", str(out)]) == 0
    return out


def compile_latex(directory: Path, name: str = MAIN_FILE) -> tuple[str, int]:
    """latexmk -pdf (bibtex included); returns the log and the page count after checking errors,
    references, citations and overfull lines."""
    run = subprocess.run(["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", name], cwd=directory,
                         capture_output=True, text=True, timeout=600)
    log = (directory / (Path(name).stem + ".log")).read_text(encoding="latin-1")
    errors = [line for line in log.splitlines() if line.startswith("! ")]
    assert run.returncode == 0 and not errors, f"{errors[:5]}\n{run.stdout[-1500:]}"
    assert "There were undefined references" not in log and "LaTeX Warning: Reference" not in log
    assert "LaTeX Warning: Citation" not in log and "There were undefined citations" not in log
    overfull = [float(w) for w in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    assert all(width <= OVERFULL_PT for width in overfull), f"overfull by {sorted(overfull)[-3:]} pt"
    pages = int(re.search(r"Output written on \S+ \((\d+) pages?", log).group(1))
    return log, pages


def page_of(directory: Path, label: str, stem: str = "main") -> int:
    """The page a label is on, from the .aux file."""
    aux = (directory / f"{stem}.aux").read_text(encoding="latin-1")
    match = re.search(r"\\newlabel\{%s\}\{\{[^{}]*\}\{(\d+)\}" % re.escape(label), aux)
    assert match, f"no label {label}"
    return int(match.group(1))


def ink(png: Path) -> float:
    """Share of pixels that are not white."""
    from matplotlib.image import imread
    pixels = imread(str(png))[..., :3]
    return float(np.mean(pixels.min(axis=-1) < 0.9))


def render(pdf: Path, page: int, out: Path) -> Path:
    subprocess.run(["pdftoppm", "-r", "40", "-png", "-f", str(page), "-l", str(page), "-singlefile", str(pdf),
                    str(out)], check=True, timeout=120)
    return out.with_suffix(".png")


@pytest.mark.tex
@needs_tex
def test_the_section_of_four_variants_compiles_and_every_page_has_ink(written, tmp_path):
    log, pages = compile_latex(written)
    assert pages >= 8
    assert (written / "main.bbl").exists() and "\\bibitem" in (written / "main.bbl").read_text()
    for key in ("dot-product-fro-ball", "l2-tied-fro-ball", "cross-joint-fro-ball", "custom-fro-ball"):
        page = page_of(written, f"lb:cor:{key}")
        assert ink(render(written / "main.pdf", page, tmp_path / key)) > 0.01, key
    figure_page = page_of(written, "lb:fig:scaling")
    assert ink(render(written / "main.pdf", figure_page, tmp_path / "figure")) > 0.03


def test_the_section_is_for_input_with_prefixed_environments_and_stable_labels(written):
    section = (written / SECTION_FILE).read_text()
    assert "\\documentclass" not in section and "\\begin{document}" not in section
    for env in ("theorem", "lemma", "proposition", "corollary", "assumption"):
        assert f"\\begin{{{env}}}" not in section, env  # only lbtheorem, lblemma, ...
    assert "\\begin{lbtheorem}" in section and "\\begin{lblemma}" in section
    labels = re.findall(r"\\label\{([^}]+)\}", section)
    assert len(labels) == len(set(labels)), "a label is defined twice"
    assert all(label.startswith("lb:") for label in labels)
    references = set(re.findall(r"\\ref\{([^}]+)\}", section))
    assert references <= set(labels)
    for key in ("dot-product-fro-ball", "l2-tied-fro-ball", "cross-joint-fro-ball", "custom-fro-ball"):
        assert f"\\label{{lb:cor:{key}}}" in section and f"\\label{{lb:asm:{key}}}" in section
    # the symbol A is defined: in the legend and by the proofs, before it is used
    assert re.search(r"\\item\[\$A\$\] \$A = W_Q W_K\^\\top / \\sqrt\{d_k\}\$", section)
    assert "A &\\coloneqq" in section
    # assumptions are mathematics, not "sizes: n=n" or "attends to itself: True"
    assert "sizes:" not in section and ": True" not in section
    assert "\\paragraph{Asymptotic regimes.}" in section and "\\toprule" in section
    assert "castin-theorem" in section and "unverified" in section  # a published claim, with its tag
    assert "derived \\textless{} claim (proved)" in section
    preamble = (written / PREAMBLE_FILE).read_text()
    assert "\\documentclass" not in preamble and "\\newtheorem{lbtheorem}{Theorem}" in preamble


def test_a_user_defined_score_is_named_in_words_and_by_its_formula(written):
    """No internal name in the text a reader sees: labels may say custom, titles and sentences do not."""
    section = (written / SECTION_FILE).read_text()
    readable = re.sub(r"\\(label|ref)\{[^}]*\}", "", section)
    assert "custom" not in readable
    assert r"\subsection{Self-attention (user-defined score)}" in section
    assert "The score is $s(x, y) = \\frac{\\langle W_Q^\\top x, W_K^\\top y\\rangle^{2}}{d_k}$" in section


def test_every_cited_paper_is_in_the_bibliography_with_its_arxiv_identifier(written):
    section = (written / SECTION_FILE).read_text()
    cited = {key for group in re.findall(r"\\cite\{([^}]+)\}", section) for key in group.split(",")}
    assert {"lb-vaswani2017", "lb-kim2021", "lb-castin2024"} <= cited
    bib = (written / BIB_FILE).read_text()
    entries = dict(re.findall(r"@\w+\{([^,]+),(.*?)\n\}", bib, re.S))
    assert set(entries) == cited
    for key, body in entries.items():
        assert "archivePrefix = {arXiv}" in body and re.search(r"eprint = \{\d{4}\.\d{4,5}\}", body), key
        assert REFERENCES[key][1]["eprint"] in body


def test_the_figure_numbers_are_rounded_in_their_direction(written):
    section = (written / SECTION_FILE).read_text()
    rows = re.findall(r"\$n = (\d+)\$ & \$\\le ([\d.]+)\$ & \$\\ge ([\d.]+)\$", section)
    assert [int(n) for n, _, _ in rows] == [2, 4, 8]
    assert all(float(upper) > float(lower) for _, upper, lower in rows)
    assert (written / "lipbound-figure.pdf").read_bytes().startswith(b"%PDF")


def test_rounding_direction_on_known_numbers():
    series = Series("n", (2.0, 4.0), (2116.41, 1245.0001), (339.87, 12.34999))
    figure = ScalingFigure("a head", "self-attention-fro", "a ball", series, Series("R", (1.0, 2.0), (2.0, 8.0),
                                                                                      (1.0, 4.0)), 8, 2.0)
    chosen, facts = chosen_variant("dot-product-nobias", None, ())
    entry = PaperEntry("dot-product-nobias", chosen, derive_result("dot-product-nobias", chosen, facts, None,
                                                                   "ball", {}))
    section = paper_files([entry], figure=figure)[SECTION_FILE]
    assert r"$n = 2$ & $\le 2117$ & $\ge 339.8$" in section
    assert r"$n = 4$ & $\le 1246$ & $\ge 12.34$" in section
    assert "fitted slopes: bound $-0.77$, witness $-4.78$" in section


@pytest.mark.parametrize("args, fragments", [
    (["paper", "dot-product", "--score", SCORE, "-o", "{tmp}/x"], ["--score: expected the variant custom"]),
    (["paper", "custom", "-o", "{tmp}/x"], ["--score: expected a score for the variant custom"]),
    (["paper", "dot-product", "-o", "{tmp}/file.txt"], ["--output", "a folder"]),
    (["paper", "dot-product", "--prefix", "l_b", "-o", "{tmp}/x"], ["--prefix: expected letters only"]),
    (["paper", "dot-product", "--text-width", "200", "-o", "{tmp}/x"], ["--text-width: expected a text width"]),
    (["paper", "sigmoid", "--domain", "unbounded", "-o", "{tmp}/x"], ["--domain: expected a bounded domain"]),
])
def test_paper_errors_are_one_line_and_write_nothing(args, fragments, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("a file")
    assert call([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(fragment in err[0] for fragment in fragments), err
    assert not (tmp_path / "x").exists()


def call(args: list[str]) -> int:
    """``main`` as the shell sees it: argparse errors exit, library errors return 2."""
    try:
        return main(args)
    except SystemExit as exit:
        return exit.code
