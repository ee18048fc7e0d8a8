"""Report files and progress for long runs: written atomically after every finished row.

A run of ``verify`` on a whole model takes minutes.  :class:`ReportFiles` rewrites every
requested file (JSON, CSV, Markdown, LaTeX) after each row, atomically, with ``"complete":
false`` and "partial" in the header until the last row; an interrupted run therefore leaves
the rows it finished.  :class:`Progress` prints one line per row on stderr with the time left.
"""

from __future__ import annotations

import json
import sys
import time
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
    """``[k/N] what: result (elapsed, about T left)`` on stderr, one line per finished row."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream, self.started = total, stream or sys.stderr, time.perf_counter()

    def update(self, done: int, text: str) -> None:
        elapsed = time.perf_counter() - self.started
        left = elapsed / done * (self.total - done) if done else float("nan")
        self.stream.write(f"[{done}/{self.total}] {text} ({elapsed:.0f} s elapsed, about {left:.0f} s left)\n")
        self.stream.flush()
