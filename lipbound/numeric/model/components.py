"""The parts of a transformer, as lipbound reads them: heads, attention layers, norms, MLPs.

Conventions (those of the symbolic layer, in row form): tokens are rows; a head projects
``q = x W_Q + b_Q``, ``k = x W_K + b_K``, ``v = x W_V + b_V`` with ``W_Q, W_K`` of shape
(d, d_k) and ``W_V`` of shape (d, d_v), i.e. Hugging Face ``weight.T`` sliced by columns; an
attention layer maps ``X -> [f^1(X), ..., f^H(X)] W_O + b_O`` with ``W_O`` of shape (H d_v, d).
The forward passes live in :mod:`lipbound.numeric.attention` (attention) and here (norms and
MLPs, which are pointwise).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import final

import numpy as np

from ...errors import WeightsError
from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import vector_norm_upper

__all__ = ["SCORES", "Head", "Layer", "LayerNorm", "FeedForward", "ACTIVATIONS", "activation"]

#: Score functions of a head: dot product (Vaswani et al. 2017), L2 distance (Kim et al. 2021),
#: scaled cosine (LipsFormer-style).
SCORES = ("dot", "l2", "cosine")


def _positive_eps(value, fix: str) -> float:
    """A normalisation's variance regulariser: a positive finite float, or :class:`WeightsError`."""
    eps = float(value)
    if not (math.isfinite(eps) and eps > 0):
        raise WeightsError("eps", "a positive finite float", repr(value), fix)
    return eps


def _finite(name: str, value, ndim: int) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != ndim:
        raise WeightsError(name, f"a {ndim}-d array", f"shape {array.shape}",
                           "pass a matrix" if ndim == 2 else "pass one value per feature")
    if not np.all(np.isfinite(array)):
        raise WeightsError(name, "finite entries", f"{int(np.sum(~np.isfinite(array)))} NaN or Inf entries",
                           "the checkpoint is corrupt or diverged; re-export it")
    return array


@final
@dataclass(frozen=True)
class Head:
    """One attention head.

    Parameters
    ----------
    W_Q, W_K : ndarray, shape (d, d_k)
    W_V : ndarray, shape (d, d_v)
        Value weights: ``v(y) = y W_V + b_V``, or with ``kim_values`` the values go through
        ``A`` as in Kim et al. (2021): ``v(y) = y W_Q W_Q^T W_V / sqrt(d_k) + b_V``.
        :attr:`V` is the matrix actually applied.
    b_Q, b_K : ndarray, shape (d_k,), optional (zeros)
    b_V : ndarray, shape (d_v,), optional (zeros)
    score : {"dot", "l2", "cosine"}
    tau, eps : float
        Temperature and regulariser of the cosine score.
    causal : bool
        Row i attends to keys 1..i (self-attention only).
    kim_values : bool
        Values through ``A = W_Q W_Q^T / sqrt(d_k)`` (L2 attention of Kim et al.).
    name : str
        Where the head comes from (``"layer0.head3"``), for messages and reports.
    """

    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    b_Q: np.ndarray | None = None
    b_K: np.ndarray | None = None
    b_V: np.ndarray | None = None
    score: str = "dot"
    tau: float = 1.0
    eps: float = 1.0
    causal: bool = False
    kim_values: bool = False
    name: str = field(default="", compare=False)

    def __post_init__(self):
        if self.score not in SCORES:
            raise WeightsError("score", f"one of {SCORES}", repr(self.score), "pick a built-in score")
        if self.kim_values and self.score != "l2":
            raise WeightsError("kim_values", "score 'l2' (values through A belong to Kim et al.'s L2 attention)",
                               f"score {self.score!r}", "set score='l2' or kim_values=False")
        for key in ("W_Q", "W_K", "W_V"):
            object.__setattr__(self, key, _finite(f"{self.name or 'head'}.{key}", getattr(self, key), 2))
        d, d_k = self.W_Q.shape
        if self.W_K.shape != (d, d_k):
            raise WeightsError(f"{self.name or 'head'}.W_K", f"shape {(d, d_k)} like W_Q", f"shape {self.W_K.shape}",
                               "query and key projections must have the same shape")
        if self.W_V.shape[0] != d:
            raise WeightsError(f"{self.name or 'head'}.W_V", f"{d} rows (the token width of W_Q)",
                               f"shape {self.W_V.shape}", "transpose Hugging Face weights: W = weight.T")
        for key, size in (("b_Q", d_k), ("b_K", d_k), ("b_V", self.W_V.shape[1])):
            value = getattr(self, key)
            value = np.zeros(size) if value is None else _finite(f"{self.name or 'head'}.{key}", value, 1)
            if value.shape != (size,):
                raise WeightsError(f"{self.name or 'head'}.{key}", f"shape ({size},)", f"shape {value.shape}",
                                   "check the bias slice")
            object.__setattr__(self, key, value)
        for key in ("tau", "eps"):
            value = float(getattr(self, key))
            if not (math.isfinite(value) and value > 0):
                raise WeightsError(key, "a positive finite float", repr(getattr(self, key)),
                                   "the cosine score needs tau > 0 and eps > 0")
            object.__setattr__(self, key, value)

    @property
    def d(self) -> int:
        return self.W_Q.shape[0]

    @property
    def d_k(self) -> int:
        return self.W_Q.shape[1]

    @property
    def d_v(self) -> int:
        return self.W_V.shape[1]

    @property
    def A(self) -> np.ndarray:
        """``A = W_Q W_K^T / sqrt(d_k)``, shape (d, d)."""
        return self.W_Q @ self.W_K.T / np.sqrt(self.d_k)

    @functools.cached_property
    def V(self) -> np.ndarray:
        """The value matrix actually applied, shape (d, d_v) (computed once)."""
        if self.kim_values:
            return self.W_Q @ (self.W_Q.T @ self.W_V) / np.sqrt(self.d_k)
        return self.W_V

    @functools.cached_property
    def norm_cache(self) -> dict:
        """Certified norms of matrix expressions of this head, computed once (see
        :mod:`lipbound.numeric.evaluate`); the head is immutable, so they stay valid."""
        return {}

    @property
    def tied(self) -> bool:
        """``W_Q = W_K`` exactly."""
        return bool(np.array_equal(self.W_Q, self.W_K))

    @property
    def biased(self) -> bool:
        """The score has a non-zero query or key bias."""
        return bool(np.any(self.b_Q) or np.any(self.b_K))

    def with_kim_values(self) -> "Head":
        """The same head with values through A, as in Kim et al. (2021)."""
        return replace(self, kim_values=True)


@final
@dataclass(frozen=True)
class Layer:
    """Multi-head attention: ``F(X) = [f^1(X), ..., f^H(X)] W_O + b_O`` (plus X if residual).

    ``W_O`` has shape (H d_v, d); its rows ``W_O^h`` that read head h follow the heads' order.
    """

    heads: tuple[Head, ...]
    W_O: np.ndarray
    b_O: np.ndarray | None = None
    residual: bool = False

    def __post_init__(self):
        heads = tuple(self.heads)
        if not heads or not all(isinstance(h, Head) for h in heads):
            raise WeightsError("heads", "a non-empty tuple of Head", repr(type(self.heads).__name__),
                               "build the heads with Head(W_Q, W_K, W_V, ...)")
        d = heads[0].d
        if any(h.d != d for h in heads):
            raise WeightsError("heads", f"heads reading {d} features each", str([h.d for h in heads]),
                               "all heads of a layer read the same tokens")
        W_O = _finite("W_O", self.W_O, 2)
        width = sum(h.d_v for h in heads)
        if W_O.shape[0] != width:
            raise WeightsError("W_O", f"shape ({width}, d): one row per value feature of the heads",
                               f"shape {W_O.shape}", "the output projection takes the concatenated heads")
        b_O = np.zeros(W_O.shape[1]) if self.b_O is None else _finite("b_O", self.b_O, 1)
        if b_O.shape != (W_O.shape[1],):
            raise WeightsError("b_O", f"shape ({W_O.shape[1]},)", f"shape {b_O.shape}", "one bias per output feature")
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "W_O", W_O)
        object.__setattr__(self, "b_O", b_O)

    @property
    def d(self) -> int:
        return self.heads[0].d

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def output_block(self, h: int) -> np.ndarray:
        """``W_O^h``: the rows of ``W_O`` that read head ``h``, shape (d_v, d_out)."""
        start = sum(head.d_v for head in self.heads[:h])
        return self.W_O[start:start + self.heads[h].d_v]


@final
@dataclass(frozen=True)
class LayerNorm:
    """``LN(x) = gamma * (x - mean x) / sqrt(var x + eps) + beta`` over the last axis (Ba, Kiros,
    Hinton 2016; biased variance, as in torch).

    Its output is ``gamma * z + beta`` with ``z`` orthogonal to the all-ones vector and
    ``||z|| = sqrt(d) std / sqrt(std^2 + eps) < sqrt(d)``, so every output lies within
    ``max|gamma| sqrt(d)`` of ``beta``, and within ``max|gamma| sqrt(d) + ||beta||`` of 0.

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

    def __post_init__(self):
        gamma = _finite("gamma", self.gamma, 1)
        beta = _finite("beta", self.beta, 1)
        if beta.shape != gamma.shape:
            raise WeightsError("beta", f"shape {gamma.shape} like gamma", f"shape {beta.shape}",
                               "pass one value per feature")
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "eps", _positive_eps(self.eps, "use the checkpoint's layer_norm_eps (1e-12 for BERT)"))

    @property
    def d(self) -> int:
        return self.gamma.size

    @property
    def gamma_max(self) -> float:
        """``||gamma||_inf`` (exact: one of the entries)."""
        return float(np.max(np.abs(self.gamma)))

    @property
    def radius_about_center(self) -> float:
        """``max|gamma| sqrt(d)``, rounded up: every output x has ``||x - beta|| <= it``."""
        return upper(interval(self.gamma_max) * IV.sqrt(self.d))

    @property
    def radius_about_origin(self) -> float:
        """``max|gamma| sqrt(d) + ||beta||``, rounded up: every output has ``||x|| <= it``."""
        return upper(interval(self.gamma_max) * IV.sqrt(self.d) + interval(vector_norm_upper(self.beta)))

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """Apply the LayerNorm to the rows of ``X`` (..., d)."""
        X = np.asarray(X, dtype=np.float64)
        if X.shape[-1] != self.d:
            raise WeightsError("X", f"tokens with {self.d} features (last axis)", f"shape {X.shape}",
                               "tokens are rows; the last axis is the model width")
        centred = X - X.mean(axis=-1, keepdims=True)
        return self.gamma * centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + self.eps) + self.beta


# Activations ------------------------------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # accurate to a few ulp
    except ImportError:
        erf = np.vectorize(math.erf, otypes=[float])
    return erf(x)


#: name -> pointwise function (Hugging Face ``hidden_act`` names; Hendrycks and Gimpel 2016 for GELU).
ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))),
    "gelu_new": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3))),
    "relu": lambda x: np.maximum(x, 0.0),
}
ACTIVATIONS["gelu_pytorch_tanh"] = ACTIVATIONS["gelu_new"]


def activation(name: str):
    """The activation called ``name`` (``"gelu"``: exact ``x Phi(x)``; ``"gelu_new"``: tanh form)."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise WeightsError("hidden_act", f"one of {sorted(ACTIVATIONS)}", repr(name),
                           "use a checkpoint with a supported activation") from None


@final
@dataclass(frozen=True)
class FeedForward:
    """``x -> act(x W_1 + b_1) W_2 + b_2`` with ``W_1`` (d, d_ff), ``W_2`` (d_ff, d)."""

    W_1: np.ndarray
    b_1: np.ndarray
    W_2: np.ndarray
    b_2: np.ndarray
    act: str = "gelu"

    def __post_init__(self):
        W_1, W_2 = _finite("W_1", self.W_1, 2), _finite("W_2", self.W_2, 2)
        b_1, b_2 = _finite("b_1", self.b_1, 1), _finite("b_2", self.b_2, 1)
        if W_2.shape[0] != W_1.shape[1] or b_1.shape != (W_1.shape[1],) or b_2.shape != (W_2.shape[1],):
            raise WeightsError("feed-forward", "W_1 (d, d_ff), b_1 (d_ff,), W_2 (d_ff, d), b_2 (d,)",
                               f"{W_1.shape}, {b_1.shape}, {W_2.shape}, {b_2.shape}",
                               "check the intermediate and output dense weights")
        activation(self.act)
        for key, value in (("W_1", W_1), ("b_1", b_1), ("W_2", W_2), ("b_2", b_2)):
            object.__setattr__(self, key, value)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return activation(self.act)(X @ self.W_1 + self.b_1) @ self.W_2 + self.b_2
