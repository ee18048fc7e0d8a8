r"""Normalisations as maps, written once: LayerNorm, RMSNorm, and the normalised queries and keys
of attention kernels (QK-norm, the scaled cosine score).

Every one of them is, over the last axis of a batch,

    N(u) = gamma * c / s(c) + beta,    c = Pi u,    s(c) = sqrt(||c||^2 / m + eps),

with ``Pi = I - 1 1^T / d`` (LayerNorm, Ba, Kiros and Hinton 2016) or ``Pi = I`` (RMSNorm, Zhang
and Sennrich 2019; QK-norm of Qwen3 and Gemma 3; the soft norm ``u / sqrt(||u||^2 + eps)`` of the
scaled cosine score with ``m = 1``), ``m`` the divisor of the mean square (``d`` for the norms
of a model).  Its derivative at u is

    DN(u)[e] = gamma * (Pi e - c (c . Pi e) / (m s^2)) / s,
    DN(u)^T[g] = Pi t,   t = (gamma g - c (c . gamma g) / (m s^2)) / s.

:class:`NormalizedPoint` holds ``c`` and ``s`` at a batch of points and applies both;
:class:`LayerNorm` and :class:`RMSNorm` are the model description's two kinds, sharing the
:class:`Normalization` interface (``kind``, ``__call__``, ``jvp``, ``vjp``, ``linearize``,
``gamma_max``, ``radius_about_center``, ``center``, ``d``, ``eps``).  Arithmetic runs in the
dtype of the input (float64, or float32 for screening); parameters are cast to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, final

import numpy as np

from ..errors import WeightsError
from ..rigorous.intervals import IV, interval, upper
from ..rigorous.linalg import vector_norm_upper
from .checks import finite_array, positive_float

__all__ = ["Normalization", "LayerNorm", "RMSNorm", "NormalizedPoint", "NORM_KINDS", "as_float"]

#: The kinds of normalisation, by the name :attr:`Normalization.kind` reports.
NORM_KINDS = ("layernorm", "rmsnorm")


def as_float(X) -> np.ndarray:
    """``X`` as a floating array: float32 and float64 stay, everything else becomes float64."""
    X = np.asarray(X)
    return X if X.dtype in (np.float32, np.float64) else X.astype(np.float64)


@final
class NormalizedPoint:
    """``N(u) = gamma * c / s + beta`` at a batch ``U`` (..., w), with its JVP and VJP (module docstring).

    Parameters
    ----------
    U : ndarray (..., w)
    gamma : ndarray (w,) or float
    eps : float
    divisor : float
        ``m``: the mean square is ``||c||^2 / m``.
    centred : bool
        ``Pi`` centres (LayerNorm) or is the identity.
    beta : ndarray (w,), optional
    """

    __slots__ = ("gamma", "c", "s", "s2m", "centred", "F")

    def __init__(self, U: np.ndarray, gamma, eps: float, divisor: float, centred: bool, beta=None):
        dtype = U.dtype
        self.gamma = np.asarray(gamma).astype(dtype, copy=False)
        self.centred = centred
        self.c = U - U.mean(axis=-1, keepdims=True) if centred else U
        square = np.sum(self.c * self.c, axis=-1, keepdims=True)
        square /= divisor
        square += eps
        self.s = np.sqrt(square)
        self.s2m = square * divisor                                   # m s^2
        F = self.c / self.s
        F *= self.gamma
        if beta is not None:
            F += np.asarray(beta).astype(dtype, copy=False)
        self.F = F

    def _centre(self, E):
        return E - E.mean(axis=-1, keepdims=True) if self.centred else E

    def jvp(self, E: np.ndarray) -> np.ndarray:
        P = self._centre(E)
        out = P - self.c * (np.sum(self.c * P, axis=-1, keepdims=True) / self.s2m)
        out /= self.s
        out *= self.gamma
        return out

    def vjp(self, G: np.ndarray) -> np.ndarray:
        h = self.gamma * G
        t = h - self.c * (np.sum(self.c * h, axis=-1, keepdims=True) / self.s2m)
        t /= self.s
        return self._centre(t)


class Normalization:
    """The interface of a model's normalisations (:class:`LayerNorm`, :class:`RMSNorm`).

    ``N(x) = gamma * Pi x / sqrt(||Pi x||^2 / d + eps) + center`` over the last axis; every output
    lies within ``max|gamma| sqrt(d)`` of :attr:`center` (``||Pi x|| / s < sqrt(d)``).
    """

    kind: ClassVar[str]
    centred: ClassVar[bool]
    gamma: np.ndarray
    eps: float

    @property
    def d(self) -> int:
        return self.gamma.size

    @property
    def center(self) -> np.ndarray:
        """The centre of the image: beta (LayerNorm) or 0 (RMSNorm)."""
        return np.zeros(self.d)

    @property
    def _beta(self):
        return None

    @property
    def gamma_max(self) -> float:
        """``||gamma||_inf`` (exact: one of the entries)."""
        return float(np.max(np.abs(self.gamma)))

    @property
    def radius_about_center(self) -> float:
        """``max|gamma| sqrt(d)``, rounded up: every output x has ``||x - center|| <= it``."""
        return upper(interval(self.gamma_max) * IV.sqrt(self.d))

    @property
    def radius_about_origin(self) -> float:
        """``max|gamma| sqrt(d) + ||center||``, rounded up: every output has ``||x|| <= it``."""
        return upper(interval(self.gamma_max) * IV.sqrt(self.d) + interval(vector_norm_upper(self.center)))

    def _tokens(self, X) -> np.ndarray:
        X = as_float(X)
        if X.shape[-1] != self.d:
            raise WeightsError("X", f"tokens with {self.d} features (last axis)", f"shape {X.shape}",
                               "tokens are rows; the last axis is the model width")
        return X

    def linearize(self, X) -> NormalizedPoint:
        """The map at a batch of tokens X (..., d): ``.F``, ``.jvp(E)``, ``.vjp(G)``."""
        return NormalizedPoint(self._tokens(X), self.gamma, self.eps, self.d, self.centred, self._beta)

    def __call__(self, X) -> np.ndarray:
        """The normalisation of the rows of ``X`` (..., d), in X's float dtype."""
        return self.linearize(X).F

    def jvp(self, X, E) -> np.ndarray:
        """``DN(X)[E]``, batched."""
        return self.linearize(X).jvp(E)

    def vjp(self, X, G) -> np.ndarray:
        """``DN(X)^T[G]``, batched."""
        return self.linearize(X).vjp(G)


@final
@dataclass(frozen=True, eq=False)
class LayerNorm(Normalization):
    """``LN(x) = gamma * (x - mean x) / sqrt(var x + eps) + beta`` over the last axis (Ba, Kiros,
    Hinton 2016; biased variance, as in torch).

    Its output is ``gamma * z + beta`` with ``z`` orthogonal to the all-ones vector and
    ``||z|| = sqrt(d) std / sqrt(std^2 + eps) < sqrt(d)``.

    Parameters
    ----------
    gamma, beta : ndarray, shape (d,)
        Gain and bias (Hugging Face ``LayerNorm.weight`` and ``LayerNorm.bias``).
    eps : float
        The variance regulariser, > 0 (1e-12 for BERT, 1e-5 for GPT-2 and Whisper).
    """

    gamma: np.ndarray
    beta: np.ndarray
    eps: float = 1e-12
    kind: ClassVar[str] = "layernorm"
    centred: ClassVar[bool] = True

    def __post_init__(self):
        gamma = finite_array("gamma", self.gamma, 1)
        beta = finite_array("beta", self.beta, 1)
        if beta.shape != gamma.shape:
            raise WeightsError("beta", f"shape {gamma.shape} like gamma", f"shape {beta.shape}",
                               "pass one value per feature")
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "eps", positive_float("eps", self.eps,
                                                       "use the checkpoint's layer_norm_eps (1e-12 for BERT)"))

    @property
    def center(self) -> np.ndarray:
        return self.beta

    @property
    def _beta(self):
        return self.beta


@final
@dataclass(frozen=True, eq=False)
class RMSNorm(Normalization):
    """``N(x) = gamma * x / sqrt(||x||^2 / d + eps)`` over the last axis (Zhang and Sennrich 2019).

    Parameters
    ----------
    gamma : ndarray, shape (d,)
        The gain as the model applies it (Gemma stores ``w`` and applies ``1 + w``: the loader
        passes ``gamma = 1 + w``).
    eps : float
        > 0 (1e-6 for Llama, 1e-5 for SmolLM2).
    """

    gamma: np.ndarray
    eps: float = 1e-6
    kind: ClassVar[str] = "rmsnorm"
    centred: ClassVar[bool] = False

    def __post_init__(self):
        object.__setattr__(self, "gamma", finite_array("gamma", self.gamma, 1))
        object.__setattr__(self, "eps", positive_float("eps", self.eps, "use the checkpoint's rms_norm_eps"))
