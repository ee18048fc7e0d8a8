r"""QK-norm (Qwen3, Gemma 3, OLMo 2): queries and keys RMS-normalised per head before the dot
product, rotated after the norm when the model has rotary positions:

    s_ij = c rot_i(rms_q(q_i)) . rot_j(rms_k(k_j)),    rms(u) = gamma * u / sqrt(||u||^2 / d_k + eps).

The normalisation is :class:`~lipbound.numeric.normalization.NormalizedPoint` (divisor d_k), the
rotation :class:`~lipbound.numeric.kernels.rotary.Rotation`; the derivatives chain theirs.  The
scores are 0-homogeneous in q and in k up to ``eps``: the largest derivatives sit where q or k is
small, near the null spaces of ``W_Q`` and ``W_K``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, final

import numpy as np

from ...errors import WeightsError
from ..checks import finite_array, positive_float
from ..normalization import NormalizedPoint
from .base import AttentionKernel, KernelFacts, register
from .rotary import Rotary
from .scores import BilinearScores, _standard, check_scale, scale_of

__all__ = ["QKNorm", "Composed"]


@final
class Composed:
    """``second(first(U))`` of two linearised transforms (``F``, ``jvp``, ``vjp``)."""

    __slots__ = ("first", "second", "F")

    def __init__(self, first, second):
        self.first, self.second, self.F = first, second, second.F

    def jvp(self, dU):
        return self.second.jvp(self.first.jvp(dU))

    def vjp(self, gU):
        return self.first.vjp(self.second.vjp(gU))


@register
@final
@dataclass(frozen=True, eq=False)
class QKNorm(AttentionKernel):
    """QK-norm (module docstring).

    Parameters
    ----------
    gamma_q, gamma_k : ndarray (d_k,)
        The gains of ``q_norm`` and ``k_norm`` as the model applies them.
    eps : float
    rotary : Rotary, optional
        Rotary positions applied after the norm.
    scale : float, optional
        ``c`` (None: ``1/sqrt(d_k)``).
    """

    gamma_q: np.ndarray
    gamma_k: np.ndarray
    eps: float = 1e-6
    rotary: Rotary | None = None
    scale: float | None = None
    name: ClassVar[str] = "qk-norm"

    def __post_init__(self):
        object.__setattr__(self, "gamma_q", finite_array("gamma_q", self.gamma_q, 1))
        object.__setattr__(self, "gamma_k", finite_array("gamma_k", self.gamma_k, 1))
        object.__setattr__(self, "eps", positive_float("eps", self.eps, "use the checkpoint's rms_norm_eps"))
        if self.rotary is not None and not isinstance(self.rotary, Rotary):
            raise WeightsError("rotary", "a Rotary kernel or None", type(self.rotary).__name__,
                               "pass Rotary(base, dims, pairing) for models with rotary positions")
        object.__setattr__(self, "scale", check_scale(self.scale))

    @property
    def positional(self) -> bool:  # type: ignore[override]
        return self.rotary is not None

    def check(self, d: int, d_k: int, where: str) -> None:
        for key in ("gamma_q", "gamma_k"):
            if getattr(self, key).shape != (d_k,):
                raise WeightsError(f"{where}.kernel.{key}", f"shape ({d_k},) (one gain per key coordinate)",
                                   f"shape {getattr(self, key).shape}", "pass q_norm.weight and k_norm.weight")
        if self.rotary is not None:
            self.rotary.check(d, d_k, where)

    def facts(self, d_k: int) -> KernelFacts:
        return KernelFacts("qk-norm", standard_scale=_standard(self.scale, d_k), describe=self.describe())

    def symbol_values(self) -> dict[str, float]:
        """``epsilon``, ``gamma_q = max|gamma_q|``, ``gamma_k = max|gamma_k|`` (exact) and ``gamma_qk = max_l |gamma_q,l
        gamma_k,l|`` rounded up (the theorems increase in it); ``tau`` when the scale is stated."""
        product = float(np.max(np.abs(self.gamma_q * self.gamma_k)))
        values = {"epsilon": float(self.eps), "gamma_q": float(np.max(np.abs(self.gamma_q))),
                  "gamma_k": float(np.max(np.abs(self.gamma_k))), "gamma_qk": math.nextafter(product, math.inf)}
        return values if self.scale is None else {**values, "tau": float(self.scale)}

    def _transform(self, U, gamma, positions):
        normed = NormalizedPoint(U, gamma, self.eps, U.shape[-1], False)
        return normed if self.rotary is None else Composed(normed, self.rotary.rotation(normed.F, positions))

    def linearize(self, Q, K, pos_q, pos_k, d):
        return BilinearScores(scale_of(self.scale, Q.shape[-1]), self._transform(Q, self.gamma_q, pos_q),
                              self._transform(K, self.gamma_k, pos_k))
