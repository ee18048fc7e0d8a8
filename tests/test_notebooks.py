"""Every notebook in notebooks/ runs top to bottom without an error (nbclient, kernel python3),
against this checkout, and is stored with its outputs so that it reads on a web page."""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(glob.glob(str(ROOT / "notebooks" / "*.ipynb")))
TUTORIALS = {"measure_view.ipynb", "new_kernel_to_paper.ipynb", "verify_checkpoint.ipynb", "token_edits.ipynb",
             "regular_minilm.ipynb"}
#: a tutorial must run in under three minutes
TIME_LIMIT_S = 180


def test_there_are_the_tutorials():
    assert {os.path.basename(path) for path in NOTEBOOKS} >= TUTORIALS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_is_stored_with_its_outputs(path):
    import nbformat
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.get("execution_count") for cell in code), "run it and save it with its outputs"
    assert sum(bool(cell.outputs) for cell in code) >= len(code) - 1
    assert not [output for cell in code for output in cell.outputs if output.get("output_type") == "error"]
    assert any("image/png" in output.get("data", {}) for cell in code for output in cell.outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    import nbclient
    import nbformat
    # the kernel imports lipbound from this checkout, whatever is installed
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=TIME_LIMIT_S, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    elapsed = time.perf_counter() - start
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    assert not errors
    assert all(cell.get("execution_count") for cell in notebook.cells if cell.cell_type == "code")
    assert elapsed < TIME_LIMIT_S, f"{os.path.basename(path)} took {elapsed:.0f} s"
