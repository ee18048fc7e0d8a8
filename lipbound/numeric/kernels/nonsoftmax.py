r"""Kernels whose weights are not a softmax of a dot product.

* :class:`Sigmoid` -- sigmoid attention (Ramapuram et al. 2024): the dot-product score
  ``s = c q . k``, weights ``sigma(s + b)`` (:class:`~lipbound.numeric.kernels.weights.SigmoidWeights`),
  rows not normalised, ``b = -log n`` unless stated.
* :class:`FeatureMap` -- linear attention (Katharopoulos et al. 2020): the positive kernel
  ``K(q, k) = phi(q) . phi(k)`` normalised over the keys, ``p_ij = K_ij / sum_l K_il``: a Markov
  kernel, exactly the softmax of the score ``s = log K``, which is what this kernel reports
  (its derivative ``ds = dK / K``).  ``phi = elu + 1``: ``phi(u) = u + 1`` for u > 0, ``e^u`` else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, final

import numpy as np

from ...errors import WeightsError
from .base import AttentionKernel, KernelFacts, ScoreMap, reduce_to, register
from .scores import BilinearScores, Unchanged, _standard, check_scale, scale_of
from .weights import SigmoidWeights, Weights

__all__ = ["Sigmoid", "FeatureMap", "FEATURE_MAPS"]


@register
@final
@dataclass(frozen=True, eq=False)
class Sigmoid(AttentionKernel):
    """Sigmoid attention (module docstring): ``bias`` None means ``-log n``; ``scale`` None ``1/sqrt(d_k)``."""

    bias: float | None = None
    scale: float | None = None
    name: ClassVar[str] = "sigmoid"

    def __post_init__(self):
        if self.bias is not None:
            bias = float(self.bias)
            if not math.isfinite(bias):
                raise WeightsError("bias", "a finite float or None (-log n)", repr(self.bias),
                                   "pass the sigmoid's bias")
            object.__setattr__(self, "bias", bias)
        object.__setattr__(self, "scale", check_scale(self.scale))

    def facts(self, d_k: int) -> KernelFacts:
        return KernelFacts("dot", weights="sigmoid", standard_scale=_standard(self.scale, d_k),
                           describe=self.describe())

    def weights(self) -> Weights:
        return SigmoidWeights(self.bias)

    def linearize(self, Q, K, pos_q, pos_k, d):
        return BilinearScores(scale_of(self.scale, Q.shape[-1]), Unchanged(Q), Unchanged(K))


def _elu_plus_one(U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(phi(U), phi'(U))`` for ``phi = elu + 1``."""
    positive = U > 0
    exp = np.exp(np.minimum(U, 0))
    return np.where(positive, U + 1, exp), np.where(positive, 1, exp).astype(U.dtype)


#: feature-map name -> ``U -> (phi(U), phi'(U))``
FEATURE_MAPS = {"elu+1": _elu_plus_one}


@final
class _LogKernelScores(ScoreMap):
    """``S = log(phi(Q) phi(K)^T)`` with ``dS = (dphi(Q) phi(K)^T + phi(Q) dphi(K)^T) / K``."""

    def __init__(self, feature, Q, K):
        (self.Qp, self.Qs), (self.Kp, self.Ks) = feature(Q), feature(K)
        self.kernel = self.Qp @ np.swapaxes(self.Kp, -1, -2)
        self.S = np.log(self.kernel)

    def jvp(self, dQ, dK):
        dKer = np.zeros_like(self.kernel)
        if dQ is not None:
            dKer += (self.Qs * dQ) @ np.swapaxes(self.Kp, -1, -2)
        if dK is not None:
            dKer += self.Qp @ np.swapaxes(self.Ks * dK, -1, -2)
        return dKer / self.kernel

    def vjp(self, gS):
        g = gS / self.kernel
        gQ = self.Qs * (g @ self.Kp)
        gK = self.Ks * reduce_to(np.swapaxes(g, -1, -2) @ self.Qp, self.Kp.shape)
        return gQ, gK


@register
@final
@dataclass(frozen=True, eq=False)
class FeatureMap(AttentionKernel):
    """Linear attention with a positive feature map (module docstring); ``feature`` names it."""

    feature: str = "elu+1"
    name: ClassVar[str] = "linear"

    def __post_init__(self):
        if self.feature not in FEATURE_MAPS:
            raise WeightsError("feature", f"one of {sorted(FEATURE_MAPS)}", repr(self.feature),
                               "use the feature map of Katharopoulos et al. (elu+1)")

    def facts(self, d_k: int) -> KernelFacts:
        return KernelFacts("feature-map", describe=self.describe())

    def linearize(self, Q, K, pos_q, pos_k, d):
        return _LogKernelScores(FEATURE_MAPS[self.feature], Q, K)
