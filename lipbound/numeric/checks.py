"""Checks of the arrays and numbers a model description holds, written once.

Every class of the model description and every attention kernel validates its parameters with
these: a finite array of the expected rank, a positive finite number.  Failures are
:class:`~lipbound.errors.WeightsError` (argument, expected, got, fix).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import WeightsError

__all__ = ["finite_array", "positive_float"]


def finite_array(name: str, value, ndim: int) -> np.ndarray:
    """``value`` as a float64 array of ``ndim`` dimensions with finite entries."""
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != ndim:
        raise WeightsError(name, f"a {ndim}-d array", f"shape {array.shape}",
                           "pass a matrix" if ndim == 2 else "pass one value per feature")
    if not np.all(np.isfinite(array)):
        raise WeightsError(name, "finite entries", f"{int(np.sum(~np.isfinite(array)))} NaN or Inf entries",
                           "the checkpoint is corrupt or diverged; re-export it")
    return array


def positive_float(name: str, value, fix: str) -> float:
    """``value`` as a positive finite float."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WeightsError(name, "a positive finite float", repr(value), fix) from None
    if not (math.isfinite(number) and number > 0):
        raise WeightsError(name, "a positive finite float", repr(value), fix)
    return number
