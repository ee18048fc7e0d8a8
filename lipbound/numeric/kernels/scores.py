r"""The position-free softmax kernels: dot product, L2 distance, scaled cosine; and the score map
``S = c T_q(Q) T_k(K)^T`` every dot product of transformed queries and keys shares.

* :class:`DotProduct` -- ``s = c q . k``, ``c = 1/sqrt(d_k)`` unless stated (Vaswani et al. 2017);
* :class:`L2Distance` -- ``s = -c ||q - k||^2`` (Kim, Papamakarios and Mnih 2021);
* :class:`ScaledCosine` -- ``s = tau q . k / (N(q) N(k))``, ``N(u) = sqrt(||u||^2 + eps)``
  (LipsFormer-style): the dot product of the soft-normalised q and k
  (:class:`~lipbound.numeric.normalization.NormalizedPoint` with gain 1 and divisor 1).

:class:`BilinearScores` is ``S = c T_q(Q) T_k(K)^T`` for linearised transforms ``T`` of the
queries and keys (the identity here; a rotation for RoPE, an RMS normalisation for QK-norm), with

    dS = c (T_q'[dQ] T_k^T + T_q T_k'[dK]^T),    gQ = c T_q'^T[gS T_k],    gK = c T_k'^T[gS^T T_q].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, final

import numpy as np

from ..checks import positive_float
from ..normalization import NormalizedPoint
from .base import AttentionKernel, KernelFacts, ScoreMap, default_scale, reduce_to, register

__all__ = ["DotProduct", "L2Distance", "ScaledCosine", "BilinearScores", "Unchanged", "scale_of", "check_scale"]


def _swap(M: np.ndarray) -> np.ndarray:
    return M.swapaxes(-1, -2)


def scale_of(scale: float | None, d_k: int) -> float:
    """The scale a kernel applies: its own, or ``1/sqrt(d_k)``."""
    return default_scale(d_k) if scale is None else scale


def check_scale(scale) -> float | None:
    return None if scale is None else positive_float("scale", scale, "pass the score's scale, or None for 1/sqrt(d_k)")


def _standard(scale: float | None, d_k: int) -> bool:
    return scale is None or scale == default_scale(d_k)


@final
class Unchanged:
    """The identity as a linearised transform (``F``, ``jvp``, ``vjp``)."""

    __slots__ = ("F",)

    def __init__(self, U: np.ndarray):
        self.F = U

    def jvp(self, dU):
        return dU

    def vjp(self, gU):
        return gU


@final
class BilinearScores(ScoreMap):
    """``S = c T_q(Q) T_k(K)^T`` (module docstring); ``tq``, ``tk`` linearised transforms."""

    def __init__(self, c: float, tq, tk):
        self.tq, self.tk = tq, tk
        c = tq.F.dtype.type(c)
        self.c = c
        self.Qc = c * tq.F
        self.KT = _swap(tk.F)
        self.S = self.Qc @ self.KT

    def jvp(self, dQ, dK):
        dS = None
        if dQ is not None:
            dS = (self.c * self.tq.jvp(dQ)) @ self.KT
        if dK is not None:
            part = self.Qc @ _swap(self.tk.jvp(dK))
            dS = part if dS is None else dS + part
        return np.zeros_like(self.S) if dS is None else dS

    def vjp(self, gS):
        gQ = self.tq.vjp(self.c * (gS @ self.tk.F))
        gK = self.tk.vjp(reduce_to(_swap(gS) @ self.Qc, self.tk.F.shape))
        return gQ, gK


@register
@final
@dataclass(frozen=True, eq=False)
class DotProduct(AttentionKernel):
    """``s_ij = scale * q_i . k_j``, ``scale = 1/sqrt(d_k)`` when None (Vaswani et al. 2017)."""

    scale: float | None = None
    name: ClassVar[str] = "dot"
    sdp_encoding: ClassVar[str | None] = "dot-product"

    def __post_init__(self):
        object.__setattr__(self, "scale", check_scale(self.scale))

    def facts(self, d_k: int) -> KernelFacts:
        return KernelFacts("dot", standard_scale=_standard(self.scale, d_k), describe=self.describe())

    def linearize(self, Q, K, pos_q, pos_k, d):
        return BilinearScores(scale_of(self.scale, Q.shape[-1]), Unchanged(Q), Unchanged(K))

    def bilinear_scale(self, d_k: int) -> float | None:
        return scale_of(self.scale, d_k)

    def relative_rotation(self, d_k: int, offset: int) -> np.ndarray:
        """The identity: a dot-product head scores ``c q . k`` at every offset."""
        return np.eye(d_k)


@final
class _L2Scores(ScoreMap):
    """``S = -c (||q||^2 - 2 q . k + ||k||^2)``."""

    def __init__(self, c: float, Q, K):
        self.c, self.Q, self.K = Q.dtype.type(c), Q, K
        qq = (Q * Q).sum(axis=-1)[..., :, None]
        kk = (K * K).sum(axis=-1)[..., None, :]
        self.S = -self.c * (qq - 2 * Q @ _swap(K) + kk)

    def jvp(self, dQ, dK):
        dS = np.zeros_like(self.S)
        if dQ is not None:
            dS += (self.Q * dQ).sum(axis=-1)[..., :, None] - dQ @ _swap(self.K)
        if dK is not None:
            dS += (self.K * dK).sum(axis=-1)[..., None, :] - self.Q @ _swap(dK)
        dS *= -2 * self.c
        return dS

    def vjp(self, gS):
        gQ = -2 * self.c * (gS.sum(axis=-1)[..., None] * self.Q - gS @ self.K)
        gK = 2 * self.c * (_swap(gS) @ self.Q - gS.sum(axis=-2)[..., None] * self.K)
        return gQ, reduce_to(gK, self.K.shape)


@register
@final
@dataclass(frozen=True, eq=False)
class L2Distance(AttentionKernel):
    """``s_ij = -scale * ||q_i - k_j||^2``, ``scale = 1/sqrt(d_k)`` when None (Kim et al. 2021)."""

    scale: float | None = None
    name: ClassVar[str] = "l2"
    values_through_A: ClassVar[bool] = True

    def __post_init__(self):
        object.__setattr__(self, "scale", check_scale(self.scale))

    def facts(self, d_k: int) -> KernelFacts:
        return KernelFacts("l2", standard_scale=_standard(self.scale, d_k), describe=self.describe())

    def linearize(self, Q, K, pos_q, pos_k, d):
        return _L2Scores(scale_of(self.scale, Q.shape[-1]), Q, K)


@register
@final
@dataclass(frozen=True, eq=False)
class ScaledCosine(AttentionKernel):
    """``s_ij = tau q_i . k_j / (N(q_i) N(k_j))``, ``N(u) = sqrt(||u||^2 + eps)``."""

    tau: float = 1.0
    eps: float = 1.0
    name: ClassVar[str] = "cosine"

    def __post_init__(self):
        for key in ("tau", "eps"):
            object.__setattr__(self, key, positive_float(key, getattr(self, key),
                                                         "the cosine score needs tau > 0 and eps > 0"))

    def facts(self, d_k: int) -> KernelFacts:
        return KernelFacts("cosine", describe=self.describe())

    def symbol_values(self) -> dict[str, float]:
        """The values of the theorem's symbols ``tau`` and ``epsilon``."""
        return {"tau": self.tau, "epsilon": self.eps}

    def linearize(self, Q, K, pos_q, pos_k, d):
        return BilinearScores(self.tau, NormalizedPoint(Q, 1.0, self.eps, 1.0, False),
                              NormalizedPoint(K, 1.0, self.eps, 1.0, False))
