"""Every notebook in notebooks/ runs top to bottom without an error (nbclient, kernel python3)."""

from __future__ import annotations

import glob
import os
import time

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), os.pardir, "notebooks", "*.ipynb")))
#: a tutorial must run in under three minutes
TIME_LIMIT_S = 180


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb file"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_runs(path):
    import nbformat
    import nbclient
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
