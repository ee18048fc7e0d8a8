"""Writing files safely: output paths checked before work starts, files written atomically.

:func:`check_output` fails early, naming the option, when a path cannot be written (its folder
is missing or read-only, or the path is a folder), so that a long run never ends by losing its
results.  :func:`atomic_write` writes to a temporary file beside the target and renames it into
place only when the content is complete: a reader sees the old file or the new one, never half.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import OutputError

__all__ = ["check_output", "atomic_write", "write_text"]


def check_output(path, option: str, suffixes: tuple[str, ...] = ()) -> Path:
    """``path`` as a Path, after checking that it can be written; ``option`` names it in errors.

    ``suffixes``: the accepted file endings (e.g. ``(".json",)``), empty for any.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputError(option, "a file path", f"the folder {path}",
                          f"give a file name, e.g. `{option}` {path / 'report'}")
    if suffixes and path.suffix.lower() not in suffixes:
        raise OutputError(option, f"a file ending in {' or '.join(suffixes)}", repr(str(path)),
                          f"use e.g. `{option}` {path.with_suffix(suffixes[0])}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(option, "a path in an existing folder", f"{path} (no folder {folder})",
                          f"create it first (mkdir -p {folder}) or choose another `{option}`")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputError(option, "a writable location", f"{path} (permission denied)",
                          f"choose another `{option}` in a folder you can write")
    return path


@contextlib.contextmanager
def atomic_write(path, option: str = "output", mode: str = "wb"):
    """Open a temporary file beside ``path`` for writing; on success it replaces ``path``."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=folder)
    except OSError as error:
        raise OutputError(option, "a writable location", f"{path} ({error.strerror})",
                          f"choose another `{option}`") from None
    try:
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        with os.fdopen(descriptor, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    current = os.umask(0o022)  # the only way to read it; restored at once
    os.umask(current)
    return current


def write_text(path, text: str, option: str = "output") -> Path:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_write(path, option, "w") as handle:
        handle.write(text)
    return Path(path)
