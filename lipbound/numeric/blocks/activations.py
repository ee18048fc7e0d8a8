"""Activations in floating point: forward maps, slopes and curvatures for searches and tests.

The forward map of ``gelu``, ``gelu_new`` and ``relu`` is the model description's
(:func:`lipbound.numeric.model.components.activation`); SiLU and QuickGELU, which the model
description does not list, and every slope ``phi'`` and curvature ``phi''`` are the SymPy
expressions of :mod:`lipbound.symbolic.activations`, compiled to numpy once.  Certified slope
ranges come from :func:`lipbound.symbolic.activations.slope_range` (interval arithmetic).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import numpy as np
import sympy as sp

from ...errors import WeightsError
from ...symbolic import activations as A
from ..model.components import ACTIVATIONS as MODEL_ACTIVATIONS

__all__ = ["ActivationMaps", "activation_maps", "slope_range", "NAMES"]

#: Every activation name the blocks accept (aliases included).
NAMES = tuple(sorted(set(A.ACTIVATIONS) | set(A.ALIASES)))
slope_range = A.slope_range


@final
@dataclass(frozen=True)
class ActivationMaps:
    """``phi``, ``phi'`` and ``phi''`` of one activation as vectorised numpy functions."""

    name: str
    forward: Callable[[np.ndarray], np.ndarray]
    slope: Callable[[np.ndarray], np.ndarray]
    curvature: Callable[[np.ndarray], np.ndarray]


def _numpy(expr: sp.Expr, limits: tuple[float, float]) -> Callable:
    """Compiled ``expr``; arguments beyond +-40 are clipped there (every curve here is flat to
    machine precision by then, and the exponentials of the raw formulas would overflow)."""
    function = sp.lambdify(A.t, expr, modules=["scipy", "numpy"])

    def evaluate(z):
        z = np.asarray(z, dtype=np.float64)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return np.broadcast_to(function(np.clip(z, -40.0, 40.0)), z.shape).astype(np.float64)

    return evaluate


@functools.cache
def activation_maps(name: str) -> ActivationMaps:
    """The numpy maps of the activation ``name`` (a :data:`NAMES` entry)."""
    spec = A.activation(name)
    if spec.slopes is not None:  # ReLU: slope 1 on (0, oo), 0 below (either one-sided slope at 0)
        return ActivationMaps(spec.name, MODEL_ACTIVATIONS[spec.name], lambda z: (np.asarray(z) > 0).astype(float),
                              lambda z: np.zeros(np.shape(z)))
    forward = MODEL_ACTIVATIONS.get(name) or MODEL_ACTIVATIONS.get(spec.name)
    if forward is None:  # phi(t) is t (1 + o(1)) above 40 and o(1) below -40: clip only phi / t
        ratio = _numpy(sp.simplify(spec.expression / A.t), (-40.0, 40.0))
        forward = lambda z: np.asarray(z, dtype=np.float64) * ratio(z)  # noqa: E731
    return ActivationMaps(spec.name, forward, _numpy(spec.slope(), (-40.0, 40.0)),
                          _numpy(spec.curvature(), (-40.0, 40.0)))


def check_activation(name: str) -> str:
    if name not in NAMES:
        raise WeightsError("act", f"one of {', '.join(NAMES)}", repr(name), "use a supported activation")
    return name
