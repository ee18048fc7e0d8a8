"""The command line called in this test process: ``lipbound ARGS`` through :func:`lipbound.cli.main`, with the
exit status, standard output and standard error a shell would see.

A subprocess pays Python's start-up and lipbound's imports (a second or more of CPU) and loses what this
process has already derived or loaded; the few tests about the process itself (``python -m lipbound``, a closed
pipe, Ctrl-C, the modules a command imports) start one, the others call :func:`call` or :func:`run`.
"""

from __future__ import annotations

import contextlib
import io
import subprocess

from lipbound.cli import main


def exit_status(stop: SystemExit) -> int:
    """The status a process ending with ``stop`` exits with (``sys.exit("message")`` exits with 1)."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


def call(argv: list[str]) -> int:
    """``main(argv)`` as the shell sees it: argparse's errors and ``--help`` exit, library errors return 2."""
    try:
        return main(argv)
    except SystemExit as stop:
        return exit_status(stop)


def run(*args: str) -> subprocess.CompletedProcess:
    """``lipbound ARGS`` in this process, its output captured as text, as ``subprocess.run(..., text=True,
    capture_output=True)`` returns it; an exception other than an exit propagates (a subprocess would print a
    traceback)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = call(list(args))
    return subprocess.CompletedProcess(["lipbound", *args], status, out.getvalue(), err.getvalue())
