"""Every notebook in notebooks/ runs top to bottom without an error (nbclient, kernel python3),
against this checkout, and is stored with its outputs so that it reads on a web page.

A notebook whose sizes are worth shrinking has a code cell tagged ``parameters`` that assigns them; the default
profile runs it with the smaller values of :data:`FAST`, assigned in a cell inserted right after that one (the
convention of papermill), so every cell still runs; the slow profile runs it as stored."""

from __future__ import annotations

import glob
import os
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(glob.glob(str(ROOT / "notebooks" / "*.ipynb")))
TUTORIALS = {"measure_view.ipynb", "new_kernel_to_paper.ipynb", "verify_checkpoint.ipynb", "token_edits.ipynb",
             "regular_minilm.ipynb"}
#: The notebooks share one kernel (:func:`kernel`), so one xdist process runs them all.
NOTEBOOK_GROUP = pytest.mark.xdist_group("notebooks")
#: a tutorial must run in under three minutes
TIME_LIMIT_S = 180
#: The default profile's sizes, by notebook: each name is one its ``parameters`` cell assigns (the kernel's CPU
#: seconds, stored -> these, measured one after the other).
FAST = {
    # the curve at 0 and 1e-3 R (2 R is one more point of the same curve), 4 of the 16 replacement tokens:
    # 30.1 -> 24.5 CPU-s
    "token_edits.ipynb": {"VOCABULARY": "4", "RADII": "(0, 1e-3)"},
    # 4 of the 12 heads (the worst of them is cooled), 32 of 128 candidates, one LayerNorm epsilon: 15.9 -> 11.9 CPU-s
    # 32 of the 256 replacement words of the perturbation table (its cell 3.2 -> 2.3 CPU-s)
    "measure_view.ipynb": {"VOCABULARY": "32"},
    "regular_minilm.ipynb": {"HEADS": "4", "CANDIDATES": "32", "EPSILONS": "(1e-3,)"},
}


def test_there_are_the_tutorials():
    assert {os.path.basename(path) for path in NOTEBOOKS} >= TUTORIALS


def _parameters_cell(notebook) -> int:
    found = [i for i, cell in enumerate(notebook.cells)
             if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", [])]
    assert len(found) == 1, f"{len(found)} cells tagged parameters"
    return found[0]


def _with_fast_parameters(notebook, name: str):
    """The notebook with the cell assigning :data:`FAST`'s values inserted after its ``parameters`` cell."""
    import nbformat
    values = FAST[name]
    index = _parameters_cell(notebook)
    assigned = set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*=", notebook.cells[index].source, flags=re.MULTILINE))
    assert set(values) <= assigned, f"{name}: {sorted(set(values) - assigned)} not assigned by its parameters cell"
    source = "\n".join(f"{key} = {value}" for key, value in values.items())
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return notebook


@pytest.mark.parametrize("name", sorted(FAST))
def test_the_fast_parameters_are_the_notebooks_own(name):
    import nbformat
    notebook = _with_fast_parameters(nbformat.read(str(ROOT / "notebooks" / name), as_version=4), name)
    index = _parameters_cell(notebook)
    stored, fast = notebook.cells[index].source, notebook.cells[index + 1].source
    for key in FAST[name]:
        assert re.search(rf"^{key}\s*=", stored, flags=re.MULTILINE) and f"{key} = " in fast
        # a parameter the notebook never reads would leave the fast run as slow as the stored one
        assert any(re.search(rf"\b{key}\b", cell.source) for cell in notebook.cells[index + 2:]), key


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_is_stored_with_its_outputs(path):
    import nbformat
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.get("execution_count") for cell in code), "run it and save it with its outputs"
    assert sum(bool(cell.outputs) for cell in code) >= len(code) - 1
    assert not [output for cell in code for output in cell.outputs if output.get("output_type") == "error"]
    assert any("image/png" in output.get("data", {}) for cell in code for output in cell.outputs)


@pytest.fixture(scope="module")
def kernel():
    """One python3 kernel for the module's notebooks, started in notebooks/ and importing lipbound from this
    checkout, whatever is installed.  Each notebook starts on an empty namespace (``%reset -f``); only the
    imported modules are shared, which spares each notebook a kernel's start and the numeric stack's import
    (about 2.5 CPU-s each)."""
    import nbclient
    import nbformat
    from nbclient.util import run_sync
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        manager = nbclient.NotebookClient(nbformat.v4.new_notebook(), kernel_name="python3").create_kernel_manager()
        run_sync(manager.start_kernel)(cwd=str(ROOT / "notebooks"))
    yield manager
    run_sync(manager.shutdown_kernel)(now=True)


@NOTEBOOK_GROUP
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_runs(path, kernel, request):
    import nbclient
    import nbformat
    notebook = nbformat.read(path, as_version=4)
    name = os.path.basename(path)
    slow = request.config.getoption("--runslow") or os.environ.get("LIPBOUND_SLOW") == "1"
    if name in FAST and not slow:
        notebook = _with_fast_parameters(notebook, name)
    # the namespace the previous notebook left is emptied before this one's first cell
    notebook.cells.insert(0, nbformat.v4.new_code_cell("%reset -f", metadata={"tags": ["injected-reset"]}))
    client = nbclient.NotebookClient(notebook, km=kernel, timeout=TIME_LIMIT_S, kernel_name="python3")
    start = time.perf_counter()
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
    elapsed = time.perf_counter() - start
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    assert not errors
    assert all(cell.get("execution_count") for cell in notebook.cells if cell.cell_type == "code")
    assert elapsed < TIME_LIMIT_S, f"{os.path.basename(path)} took {elapsed:.0f} s"
