"""The parts of a transformer, as lipbound reads them: heads, attention layers, norms, MLPs.

Conventions (those of the symbolic layer, in row form): tokens are rows; a head projects
``q = x W_Q + b_Q``, ``k = x W_K + b_K``, ``v = x W_V + b_V`` with ``W_Q, W_K`` of shape
(d, d_k) and ``W_V`` of shape (d, d_v), i.e. Hugging Face ``weight.T`` sliced by columns; its
attention kernel (:mod:`lipbound.numeric.kernels`) turns queries and keys at their positions into
scores, its mask hides keys and adds position terms.  An attention layer maps
``X -> [f^1(X), ..., f^H(X)] W_O + b_O`` with ``W_O`` of shape (H d_v, d); heads of one
key/value group (grouped-query attention) share their keys and values.  The forward passes live
in :mod:`lipbound.numeric.attention` (attention), :mod:`lipbound.numeric.normalization` (norms)
and here (feed-forward blocks, which are token-wise).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import final

import numpy as np

from ...errors import WeightsError
from ..checks import finite_array
from ..kernels import AttentionKernel, AttentionMask, DotProduct
from ..normalization import LayerNorm, Normalization, RMSNorm

__all__ = ["Head", "Layer", "LayerNorm", "RMSNorm", "Normalization", "FeedForward", "GatedFeedForward",
           "ACTIVATIONS", "activation"]


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
    kernel : AttentionKernel
        The score (:mod:`lipbound.numeric.kernels`): ``DotProduct()``, ``L2Distance()``,
        ``ScaledCosine(tau, eps)``, ``Rotary(base, dims, pairing)``, ``QKNorm(...)``, ...
    mask : AttentionMask
        Causal mask, sliding window, position bias, soft-cap.
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
    kernel: AttentionKernel = field(default_factory=DotProduct)
    mask: AttentionMask = field(default_factory=AttentionMask)
    kim_values: bool = False
    name: str = field(default="", compare=False)

    def __post_init__(self):
        where = self.name or "head"
        if not isinstance(self.kernel, AttentionKernel):
            raise WeightsError(f"{where}.kernel", "an attention kernel of lipbound.numeric.kernels",
                               repr(self.kernel)[:40], "pass e.g. kernel=DotProduct() or kernel=Rotary(base=10000)")
        if not isinstance(self.mask, AttentionMask):
            raise WeightsError(f"{where}.mask", "an AttentionMask", repr(self.mask)[:40],
                               "pass e.g. mask=AttentionMask(causal=True)")
        if self.kim_values and not self.kernel.values_through_A:
            raise WeightsError("kim_values", "an L2Distance kernel (values through A belong to Kim et al.'s L2 "
                               "attention)", f"kernel {self.kernel.describe()}", "use L2Distance() or kim_values=False")
        for key in ("W_Q", "W_K", "W_V"):
            object.__setattr__(self, key, finite_array(f"{where}.{key}", getattr(self, key), 2))
        d, d_k = self.W_Q.shape
        if self.W_K.shape != (d, d_k):
            raise WeightsError(f"{where}.W_K", f"shape {(d, d_k)} like W_Q", f"shape {self.W_K.shape}",
                               "query and key projections must have the same shape")
        if self.W_V.shape[0] != d:
            raise WeightsError(f"{where}.W_V", f"{d} rows (the token width of W_Q)",
                               f"shape {self.W_V.shape}", "transpose Hugging Face weights: W = weight.T")
        for key, size in (("b_Q", d_k), ("b_K", d_k), ("b_V", self.W_V.shape[1])):
            value = getattr(self, key)
            value = np.zeros(size) if value is None else finite_array(f"{where}.{key}", value, 1)
            if value.shape != (size,):
                raise WeightsError(f"{where}.{key}", f"shape ({size},)", f"shape {value.shape}",
                                   "check the bias slice")
            object.__setattr__(self, key, value)
        self.kernel.check(d, d_k, where)

    @property
    def causal(self) -> bool:
        """The mask is causal (read-only: ``mask.causal``)."""
        return self.mask.causal

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
        """``A = W_Q W_K^T / sqrt(d_k)``, shape (d, d): the matrix of the position-free dot-product
        score (other kernels' scores are not ``x A y^T``; searches use it only to rank heads)."""
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

    def with_kim_values(self) -> Head:
        """The same head with values through A, as in Kim et al. (2021)."""
        return replace(self, kim_values=True)


@final
@dataclass(frozen=True)
class Layer:
    """Multi-head attention: ``F(X) = [f^1(X), ..., f^H(X)] W_O + b_O`` (plus X if residual).

    ``W_O`` has shape (H d_v, d); its rows ``W_O^h`` that read head h follow the heads' order.
    ``groups`` (grouped-query and multi-query attention): head h reads the keys and values of
    group ``groups[h]``; the heads of a group hold equal ``W_K, b_K, W_V, b_V`` and follow each
    other, ``groups[h] = h // (H / H_kv)`` (the Llama convention; Hugging Face's ``repeat_kv``).
    None: every head its own group.
    """

    heads: tuple[Head, ...]
    W_O: np.ndarray
    b_O: np.ndarray | None = None
    residual: bool = False
    groups: tuple[int, ...] | None = None

    def __post_init__(self):
        heads = tuple(self.heads)
        if not heads or not all(isinstance(h, Head) for h in heads):
            raise WeightsError("heads", "a non-empty tuple of Head", repr(type(self.heads).__name__),
                               "build the heads with Head(W_Q, W_K, W_V, ...)")
        d = heads[0].d
        if any(h.d != d for h in heads):
            raise WeightsError("heads", f"heads reading {d} features each", str([h.d for h in heads]),
                               "all heads of a layer read the same tokens")
        W_O = finite_array("W_O", self.W_O, 2)
        width = sum(h.d_v for h in heads)
        if W_O.shape[0] != width:
            raise WeightsError("W_O", f"shape ({width}, d): one row per value feature of the heads",
                               f"shape {W_O.shape}", "the output projection takes the concatenated heads")
        b_O = np.zeros(W_O.shape[1]) if self.b_O is None else finite_array("b_O", self.b_O, 1)
        if b_O.shape != (W_O.shape[1],):
            raise WeightsError("b_O", f"shape ({W_O.shape[1]},)", f"shape {b_O.shape}", "one bias per output feature")
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "W_O", W_O)
        object.__setattr__(self, "b_O", b_O)
        object.__setattr__(self, "residual", bool(self.residual))
        object.__setattr__(self, "groups", self._check_groups(heads))

    def _check_groups(self, heads) -> tuple[int, ...] | None:
        if self.groups is None:
            return None
        groups = tuple(int(g) for g in np.asarray(self.groups).reshape(-1))
        H = len(heads)
        count = max(groups, default=-1) + 1
        convention = tuple(h * count // H for h in range(H)) if count and H % count == 0 else None
        if len(groups) != H or groups != convention:
            raise WeightsError("groups", f"{H} group indices h // (H / H_kv) for some H_kv dividing H "
                               "(the heads of a group follow each other)", repr(self.groups),
                               "pass groups=tuple(h // (H // H_kv) for h in range(H))")
        for h, g in enumerate(groups):
            first = heads[groups.index(g)]
            if any(not np.array_equal(getattr(heads[h], key), getattr(first, key))
                   for key in ("W_K", "b_K", "W_V", "b_V")) \
                    or heads[h].kim_values:
                raise WeightsError("groups", f"heads of group {g} with equal W_K, b_K, W_V, b_V (shared keys and "
                                   "values, plain values)", f"head {h} differs from head {groups.index(g)}",
                                   "give each head its own group, or share the key and value weights")
        return None if count == H else groups

    @property
    def num_groups(self) -> int:
        """Key/value groups (H_kv): H without grouped-query attention."""
        return self.num_heads if self.groups is None else max(self.groups) + 1

    def group_of(self, h: int) -> int:
        return h if self.groups is None else self.groups[h]

    def group_heads(self, g: int) -> tuple[int, ...]:
        """The heads that read group g."""
        return tuple(h for h in range(self.num_heads) if self.group_of(h) == g)

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


# Activations ------------------------------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # accurate to a few ulp
    except ImportError:
        erf = np.vectorize(math.erf, otypes=[float])
    return erf(x)


def _silu(x: np.ndarray) -> np.ndarray:
    """``x sigma(x)`` (Elfwing et al. 2018; Llama's SwiGLU gate), in x's dtype."""
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """``x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2`` in x's dtype, with one temporary (the
    float32 screening of whole vocabularies runs it on every candidate)."""
    x = np.asarray(x)
    inner = x * x
    inner *= 0.044715
    inner += 1.0
    inner *= x
    inner *= math.sqrt(2.0 / math.pi)
    np.tanh(inner, out=inner)
    inner += 1.0
    inner *= 0.5
    inner *= x
    return inner


#: name -> pointwise function (Hugging Face ``hidden_act`` names; Hendrycks and Gimpel 2016 for GELU),
#: computed in the input's float dtype.
ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_new": _gelu_tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "silu": lambda x: _silu(np.asarray(x)),
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
        W_1, W_2 = finite_array("W_1", self.W_1, 2), finite_array("W_2", self.W_2, 2)
        b_1, b_2 = finite_array("b_1", self.b_1, 1), finite_array("b_2", self.b_2, 1)
        if W_2.shape[0] != W_1.shape[1] or b_1.shape != (W_1.shape[1],) or b_2.shape != (W_2.shape[1],):
            raise WeightsError("feed-forward", "W_1 (d, d_ff), b_1 (d_ff,), W_2 (d_ff, d), b_2 (d,)",
                               f"{W_1.shape}, {b_1.shape}, {W_2.shape}, {b_2.shape}",
                               "check the intermediate and output dense weights")
        activation(self.act)
        for key, value in (("W_1", W_1), ("b_1", b_1), ("W_2", W_2), ("b_2", b_2)):
            object.__setattr__(self, key, value)

    @property
    def d(self) -> int:
        return self.W_1.shape[0]

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return activation(self.act)(X @ self.W_1 + self.b_1) @ self.W_2 + self.b_2


@final
@dataclass(frozen=True)
class GatedFeedForward:
    """``x -> (act(x W_gate + b_gate) * (x W_up + b_up)) W_down + b_down`` (Shazeer 2020: SwiGLU with
    ``act = "silu"`` in Llama, Qwen, Mistral; GeGLU with ``"gelu_pytorch_tanh"`` in Gemma).

    ``W_gate, W_up`` (d, d_ff), ``W_down`` (d_ff, d); biases optional (zeros).
    """

    W_gate: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray
    act: str = "silu"
    b_gate: np.ndarray | None = None
    b_up: np.ndarray | None = None
    b_down: np.ndarray | None = None

    def __post_init__(self):
        W_gate, W_up, W_down = (finite_array(key, getattr(self, key), 2) for key in ("W_gate", "W_up", "W_down"))
        d, d_ff = W_gate.shape
        if W_up.shape != (d, d_ff) or W_down.shape != (d_ff, d):
            raise WeightsError("gated feed-forward", "W_gate (d, d_ff), W_up (d, d_ff), W_down (d_ff, d)",
                               f"{W_gate.shape}, {W_up.shape}, {W_down.shape}",
                               "transpose Hugging Face weights (W = weight.T) of gate_proj, up_proj, down_proj")
        for key, value in (("W_gate", W_gate), ("W_up", W_up), ("W_down", W_down)):
            object.__setattr__(self, key, value)
        for key, size in (("b_gate", d_ff), ("b_up", d_ff), ("b_down", d)):
            value = getattr(self, key)
            value = np.zeros(size) if value is None else finite_array(key, value, 1)
            if value.shape != (size,):
                raise WeightsError(key, f"shape ({size},)", f"shape {value.shape}", "one bias per output feature")
            object.__setattr__(self, key, value)
        activation(self.act)

    @property
    def d(self) -> int:
        return self.W_gate.shape[0]

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return (activation(self.act)(X @ self.W_gate + self.b_gate) * (X @ self.W_up + self.b_up)) @ self.W_down \
            + self.b_down
