r"""How masked scores become attention weights: the one float softmax, and sigmoid weights.

* :data:`SOFTMAX` -- ``p_ij = exp(s_ij) / sum_l exp(s_il)`` over the visible keys (hidden keys
  carry ``s = -inf`` and weight 0; a query that sees no key gets zero weights), computed stably
  (the row maximum subtracted), in the dtype of the scores.  Its derivative is
  ``dp = p o (ds - rowsum(p o ds))``, self-adjoint.
* :class:`SigmoidWeights` -- ``p_ij = sigma(s_ij + b)`` (Ramapuram et al. 2024), rows not
  normalised, ``b = -log n`` unless stated; ``dp = p (1 - p) ds``.

Every float path of lipbound that turns scores into weights calls one of these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import numpy as np

__all__ = ["Weights", "Softmax", "SigmoidWeights", "SOFTMAX", "softmax"]


def softmax(S: np.ndarray) -> np.ndarray:
    """The row softmax of ``S`` (..., n) over the last axis, stable; rows of ``-inf`` (no visible
    key) give zeros.  A new array in the dtype of S."""
    top = np.max(S, axis=-1, keepdims=True)
    if not np.all(np.isfinite(top)):
        top = np.where(np.isfinite(top), top, 0)
    P = S - top
    np.exp(P, out=P)
    total = P.sum(axis=-1, keepdims=True)
    P /= np.where(total > 0, total, 1)
    return P


class Weights:
    """Scores -> weights with the derivative (self-adjoint: the JVP and VJP are the same map)."""

    def forward(self, S: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def derivative(self, P: np.ndarray, dS: np.ndarray) -> np.ndarray:
        """``dP`` for a score tangent ``dS`` at weights P (may overwrite dS)."""
        raise NotImplementedError

    @property
    def normalised(self) -> bool:
        """Every row sums to one (a Markov kernel)."""
        return True


@final
class Softmax(Weights):
    """The row softmax (module docstring)."""

    def forward(self, S):
        return softmax(S)

    def derivative(self, P, dS):
        dS -= (P * dS).sum(axis=-1, keepdims=True)
        dS *= P
        return dS


#: The softmax every softmax kernel uses.
SOFTMAX = Softmax()


@final
@dataclass(frozen=True)
class SigmoidWeights(Weights):
    """``p_ij = sigma(s_ij + bias)`` on visible keys (module docstring); ``bias`` None: ``-log n``."""

    bias: float | None = None

    def offset(self, n: int) -> float:
        return -math.log(n) if self.bias is None else float(self.bias)

    def forward(self, S):
        shifted = S + S.dtype.type(self.offset(S.shape[-1]))
        with np.errstate(over="ignore"):
            return 1 / (1 + np.exp(-shifted))

    def derivative(self, P, dS):
        dS *= P * (1 - P)
        return dS

    @property
    def normalised(self) -> bool:
        return False
