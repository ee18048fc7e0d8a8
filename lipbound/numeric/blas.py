"""One BLAS thread for the small matrix products of searches and certificates.

Witness searches and SDP certificates multiply many matrices of a few hundred rows; handing
each to a second OpenBLAS thread costs more than it saves (measured 5-40x slower on a busy
2-core machine).  A process may hold several OpenBLAS libraries -- numpy's, scipy's (``scipy.linalg``'s
Cholesky factors of LipSDP-Neuron) and SCS's -- and a threaded one changes the order of the
sums and so the last bits of a result, which an optimiser then carries further: on
all-MiniLM-L6-v2 a serial ``verify --whole`` with scipy's BLAS on two threads gave LipSDP-Neuron
constants up to 1e-3 apart from the same run in one-thread workers (2.5123e103 against 2.5146e103
end to end).  :func:`single_threaded_blas` therefore sets *every* loaded OpenBLAS to one thread
inside a block and restores each afterwards, and sets ``OPENBLAS_NUM_THREADS=1`` in the block's
environment so that a library first loaded inside it (a lazy ``import scipy.linalg``) starts with
one thread too.  It does nothing to libraries that expose no thread control.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable

__all__ = ["single_threaded_blas", "one_blas_thread", "blas_thread_counts"]

#: library path -> (getter, setter), or None for a library without thread control
_CONTROLS: dict = {}
_PATTERNS = ("scipy_openblas_{}_num_threads64_", "scipy_openblas_{}_num_threads", "openblas_{}_num_threads64_",
             "openblas_{}_num_threads")
#: read by OpenBLAS (and OpenMP, MKL) when a library loads
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _control_of(library: str):
    import ctypes
    try:
        handle = ctypes.CDLL(library)
    except OSError:
        return None
    for pattern in _PATTERNS:
        getter = getattr(handle, pattern.format("get"), None)
        setter = getattr(handle, pattern.format("set"), None)
        if getter is not None and setter is not None:
            getter.restype = ctypes.c_int
            return getter, (lambda count, _set=setter: _set(ctypes.c_int(count)))
    return None


def _controls() -> list:
    """(getter, setter) of every OpenBLAS loaded in this process now."""
    try:
        with open("/proc/self/maps") as handle:
            libraries = sorted({line.split()[-1] for line in handle if "openblas" in line.lower()})
    except OSError:
        return []
    for library in libraries:
        if library not in _CONTROLS:
            _CONTROLS[library] = _control_of(library)
    return [control for library in libraries if (control := _CONTROLS[library]) is not None]


def blas_thread_counts() -> dict[str, int]:
    """The thread count of every loaded OpenBLAS that tells it, by library path (for tests and reports)."""
    _controls()
    return {library: control[0]() for library, control in sorted(_CONTROLS.items()) if control is not None}


@contextlib.contextmanager
def single_threaded_blas():
    """Every loaded OpenBLAS on one thread inside the block (restored afterwards); libraries that load
    inside the block start with one thread."""
    controls = _controls()
    before = [getter() for getter, _ in controls]
    saved = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
    os.environ.update({name: "1" for name in _THREAD_VARIABLES})
    for _, setter in controls:
        setter(1)
    try:
        yield
    finally:
        for (_, setter), count in zip(controls, before):
            setter(count)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def one_blas_thread(function: Callable) -> Callable:
    """Decorator: run ``function`` inside :func:`single_threaded_blas`."""
    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with single_threaded_blas():
            return function(*args, **kwargs)
    return wrapped
