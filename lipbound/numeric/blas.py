"""One BLAS thread for the small matrix products of searches and certificates.

Witness searches and SDP certificates multiply many matrices of a few hundred rows; handing
each to a second OpenBLAS thread costs more than it saves (measured 5-40x slower on a busy
2-core machine).  :func:`single_threaded_blas` sets numpy's bundled OpenBLAS to one thread
inside a block and restores it; it does nothing when the library exposes no thread control.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

__all__ = ["single_threaded_blas", "one_blas_thread"]

_CONTROL: list = []


def _thread_control():
    if not _CONTROL:
        found = None
        try:
            import ctypes
            with open("/proc/self/maps") as handle:
                libraries = sorted({line.split()[-1] for line in handle if "openblas" in line.lower()})
            for library in libraries:
                lib = ctypes.CDLL(library)
                for pattern in ("scipy_openblas_{}_num_threads64_", "openblas_{}_num_threads64_",
                                "openblas_{}_num_threads"):
                    getter = getattr(lib, pattern.format("get"), None)
                    setter = getattr(lib, pattern.format("set"), None)
                    if getter is not None and setter is not None:
                        getter.restype = ctypes.c_int
                        found = (getter, lambda count, _set=setter: _set(ctypes.c_int(count)))
                        break
                if found:
                    break
        except (OSError, ValueError):
            found = None
        _CONTROL.append(found)
    return _CONTROL[0]


@contextlib.contextmanager
def single_threaded_blas():
    """numpy's OpenBLAS on one thread inside the block (restored afterwards)."""
    control = _thread_control()
    if control is None:
        yield
        return
    getter, setter = control
    before = getter()
    setter(1)
    try:
        yield
    finally:
        setter(before)


def one_blas_thread(function: Callable) -> Callable:
    """Decorator: run ``function`` inside :func:`single_threaded_blas`."""
    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with single_threaded_blas():
            return function(*args, **kwargs)
    return wrapped
