"""CPU seconds of each tutorial notebook's kernel, as stored and with the test suite's fast parameters, side by side.

For every notebook of ``notebooks/`` (or those named), executes it with nbclient as ``tests/test_notebooks.py`` does:
once as stored and, when the tests give it smaller sizes (their ``FAST`` table, assigned in a cell inserted after its
cell tagged ``parameters``), once with those; prints the kernel's user + system CPU seconds (the child process's, so
the load of other processes does not count), the wall seconds, the ratio fast / stored, and the load average.

Usage: python bench/bench_notebooks.py [token_edits.ipynb ...] [--stored-only]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import test_notebooks  # noqa: E402  (the table of fast parameters and the cell that assigns them)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def kernel_seconds(path: Path, fast: bool) -> tuple[float, float]:
    """``(cpu, wall)`` seconds of one top-to-bottom run of the notebook in a fresh python3 kernel."""
    import nbclient
    import nbformat
    notebook = nbformat.read(str(path), as_version=4)
    if fast:
        notebook = test_notebooks._with_fast_parameters(notebook, path.name)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    cpu, wall = _children_cpu(), time.perf_counter()
    client.execute()
    return _children_cpu() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook file names (default: every notebook)")
    parser.add_argument("--stored-only", action="store_true", help="skip the fast runs")
    options = parser.parse_args()
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    paths = [Path(p) for p in test_notebooks.NOTEBOOKS]
    if options.names:
        paths = [p for p in paths if p.name in options.names]
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'notebook':26s} {'stored CPU-s':>12s} {'fast CPU-s':>10s} {'fast/stored':>11s} {'wall s':>14s}")
    total_stored = total_fast = 0.0
    for path in paths:
        stored, stored_wall = kernel_seconds(path, fast=False)
        has_fast = path.name in test_notebooks.FAST and not options.stored_only
        fast, fast_wall = kernel_seconds(path, fast=True) if has_fast else (stored, stored_wall)
        total_stored, total_fast = total_stored + stored, total_fast + fast
        ratio = f"{fast / stored:11.2f}" if has_fast else f"{'(as stored)':>11s}"
        print(f"{path.name:26s} {stored:12.1f} {fast:10.1f} {ratio} {stored_wall:6.0f} / {fast_wall:5.0f}")
    print(f"{'all':26s} {total_stored:12.1f} {total_fast:10.1f} {total_fast / total_stored:11.2f}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
