"""Report files and progress for long runs: written atomically after every finished row.

A run of ``verify`` on a whole model takes minutes.  :class:`ReportFiles` rewrites every
requested file (JSON, CSV, Markdown, LaTeX) after each row, atomically, with ``"complete":
false`` and "partial" in the header until the last row; an interrupted run therefore leaves
the rows it finished.  :class:`Progress` shows a bar with the time left on a terminal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..io import write_text

__all__ = ["ReportFiles", "Progress"]


class ReportFiles:
    """The report files a command was asked for (None entries are skipped)."""

    def __init__(self, json_path: Path | None = None, csv_path: Path | None = None, markdown_path: Path | None = None,
                 latex_path: Path | None = None):
        self.paths = {"--json": json_path, "--csv": csv_path, "--markdown": markdown_path, "--latex": latex_path}

    def write(self, report) -> None:
        renderers = {"--json": lambda: json.dumps(report.to_json(), indent=2), "--csv": report.csv,
                     "--markdown": report.markdown, "--latex": getattr(report, "latex", None)}
        for option, path in self.paths.items():
            if path is not None and renderers[option] is not None:
                write_text(path, renderers[option](), option)

    def describe(self) -> str:
        return ", ".join(str(p) for p in self.paths.values() if p is not None)


class Progress:
    """The one progress display of every long run: a tqdm bar on stderr with the elapsed time and the
    time left, silent when stderr is not a terminal (logs and pipes get the results only).

    ``update(done, total, what)`` moves the bar to ``done`` of ``total`` and shows ``what``; ``note(text)``
    prints a finished row above the bar.  Use it as a context manager (the bar is closed at the end).
    """

    def __init__(self, what: str = "", total: int | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.what, self.bar = what, None
        if total is not None:
            self._start(what, total)

    def _start(self, what: str, total: int | None) -> None:
        from tqdm import tqdm
        if self.bar is not None:
            self.bar.close()
        self.what = what
        self.bar = tqdm(total=total, desc=what, file=self.stream, disable=not self.enabled, leave=False,
                        dynamic_ncols=True, bar_format="{desc}: {n_fmt}/{total_fmt} {bar} [{elapsed}<{remaining}]")

    def update(self, done: int, total: int | None = None, what: str | None = None) -> None:
        """``done`` of ``total`` finished, the last being ``what``; a new total, or a count that goes back,
        starts a new stage (the local curves: the blocks of the Jacobian, then the radii)."""
        if self.bar is None or (total is not None and total != self.bar.total) or done < self.bar.n:
            self._start(self.what, total if total is not None else (self.bar.total if self.bar is not None else None))
        if what is not None:
            self.bar.set_description_str(what, refresh=False)
        self.bar.update(done - self.bar.n)

    def note(self, text: str) -> None:
        if self.enabled:
            from tqdm import tqdm
            tqdm.write(text, file=self.stream)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
