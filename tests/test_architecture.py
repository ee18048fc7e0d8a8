"""The layers stay layers: no import cycle, each layer imports only those below it, and the
symbolic commands start without the numeric layer."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_graph.py"


def _graph_module():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_import_graph_has_no_cycle_and_no_layer_violation():
    graph = _graph_module()
    modules, problems = graph.build()
    assert len(modules) > 50
    assert graph.cycles(modules) == []
    assert problems == []


def test_the_checker_finds_a_planted_cycle_and_violations(tmp_path):
    graph = _graph_module()
    planted = {"lipbound.a": {"lipbound.b"}, "lipbound.b": {"lipbound.c"}, "lipbound.c": {"lipbound.a"}}
    assert graph.cycles(planted) == [["lipbound.a", "lipbound.b", "lipbound.c"]]
    root = tmp_path / "lipbound"
    for folder in ("symbolic", "numeric"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "numeric" / "weights.py").write_text("X = 1\n")
    (root / "symbolic" / "scores.py").write_text(
        "import scipy\nfrom ..numeric import weights\n\ndef f():\n    from . import other\n")
    (root / "symbolic" / "other.py").write_text("from .scores import f\n")
    modules, problems = graph.build(root)
    assert any("layer numeric is above symbolic" in p for p in problems)
    assert any("imports no scipy" in p for p in problems)
    assert any("inside a function" in p for p in problems)
    assert graph.cycles(modules) == [["lipbound.symbolic.other", "lipbound.symbolic.scores"]]


def test_importing_the_symbolic_layer_loads_no_numeric_code():
    code = ("import sys, lipbound.symbolic.registry, lipbound.symbolic.claim_table, lipbound.printing.document; "
            "print(sorted(m for m in sys.modules if m.startswith(('lipbound.numeric', 'lipbound.measures', "
            "'cvxpy', 'scipy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_benchmark_script_is_listed_in_the_benchmarks_readme():
    bench = SCRIPT.parent.parent / "bench"
    listed = (bench / "README.md").read_text()
    missing = [path.name for path in sorted(bench.glob("*.py")) if f"`{path.name}`" not in listed]
    assert not missing, f"bench/README.md does not list {missing}"
