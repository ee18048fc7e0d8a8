r"""Masks and position terms between a kernel's scores and its weights.

:class:`AttentionMask` (frozen) applies, in this order, to the scores ``s_ij`` of a head whose
queries sit at positions ``p_i`` and keys at ``p_j``:

1. a soft-cap ``c tanh(s / c)`` (Gemma 2's ``attn_logit_softcapping``; derivative ``1 - tanh^2``);
2. a position bias ``b_ij`` constant in the tokens: :class:`ALiBi` (Press et al. 2022,
   ``b_ij = -slope |p_i - p_j|``) or :class:`T5Bias` (Raffel et al. 2020: a learned value per
   bucket of ``p_j - p_i``);
3. the mask: ``-inf`` where a key is hidden -- ``causal`` (``p_j <= p_i``, self-attention only),
   ``window=w`` (``|p_i - p_j| < w``; with ``causal``: ``p_i - w < p_j <= p_i``; Mistral, the
   local layers of Gemma 2 and 3).

:class:`HeadMasks` applies the masks of the heads of a layer (each head its own) to scores
(b, H, m, n) at once and returns the slope of the soft-cap for the derivatives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import numpy as np

from ...errors import WeightsError
from ..checks import finite_array, positive_float

__all__ = ["AttentionMask", "ALiBi", "T5Bias", "HeadMasks", "POSITION_BIASES", "t5_buckets"]


class _Value:
    """Equality and hashing by value (arrays by their bytes) for the frozen classes below."""

    def _key(self) -> tuple:
        return (type(self),) + tuple((v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v
                                     for v in self.__dict__.values())

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def _offsets(pos_q: np.ndarray, pos_k: np.ndarray) -> np.ndarray:
    """``p_j - p_i`` (m, n)."""
    return np.asarray(pos_k, dtype=np.int64)[None, :] - np.asarray(pos_q, dtype=np.int64)[:, None]


@final
@dataclass(frozen=True, eq=False)
class ALiBi(_Value):
    """``b_ij = -slope |p_i - p_j|`` (Press, Smith and Lewis 2022; one slope per head)."""

    slope: float

    def __post_init__(self):
        slope = float(self.slope)
        if not math.isfinite(slope):
            raise WeightsError("ALiBi.slope", "a finite float", repr(self.slope), "use the head's ALiBi slope")
        object.__setattr__(self, "slope", slope)

    def matrix(self, pos_q, pos_k) -> np.ndarray:
        return -self.slope * np.abs(_offsets(pos_q, pos_k)).astype(np.float64)

    def to_arrays(self) -> dict:
        return {"bias": np.asarray("alibi"), "slope": np.asarray(self.slope)}


def t5_buckets(relative: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """The bucket of each relative position ``p_j - p_i`` (T5's ``_relative_position_bucket``, as in
    Hugging Face transformers: exact buckets for small distances, logarithmic ones up to
    ``max_distance``; the logarithm in float32, as there)."""
    relative = np.asarray(relative, dtype=np.int64)
    buckets = np.zeros(relative.shape, dtype=np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0) * num_buckets
        distance = np.abs(relative)
    else:
        distance = -np.minimum(relative, 0)
    exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        ratio = np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(exact)) \
            / np.float32(math.log(max_distance / exact)) * np.float32(num_buckets - exact)
    large = np.minimum(exact + ratio.astype(np.int64), num_buckets - 1)
    return buckets + np.where(distance < exact, distance, large)


@final
@dataclass(frozen=True, eq=False)
class T5Bias(_Value):
    """``b_ij = table[bucket(p_j - p_i)]`` (Raffel et al. 2020; :func:`t5_buckets`).

    Parameters
    ----------
    table : ndarray (num_buckets,)
        This head's column of ``relative_attention_bias.weight``.
    num_buckets, max_distance : int
    bidirectional : bool
        True for an encoder, False for a decoder.
    """

    table: np.ndarray
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True

    def __post_init__(self):
        table = finite_array("T5Bias.table", self.table, 1)
        buckets, distance = int(self.num_buckets), int(self.max_distance)
        if buckets < 2 or table.shape != (buckets,):
            raise WeightsError("T5Bias.table", f"one value per bucket (num_buckets = {self.num_buckets} >= 2)",
                               f"shape {table.shape}", "pass the head's column of relative_attention_bias.weight")
        exact = buckets // (4 if self.bidirectional else 2)
        if exact < 1 or distance <= exact:
            raise WeightsError("T5Bias.max_distance", f"more than {exact} (the exact buckets)", repr(self.max_distance),
                               "use the checkpoint's relative_attention_max_distance")
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "num_buckets", buckets)
        object.__setattr__(self, "max_distance", distance)
        object.__setattr__(self, "bidirectional", bool(self.bidirectional))

    def matrix(self, pos_q, pos_k) -> np.ndarray:
        return self.table[t5_buckets(_offsets(pos_q, pos_k), self.bidirectional, self.num_buckets, self.max_distance)]

    def to_arrays(self) -> dict:
        return {"bias": np.asarray("t5"), "table": self.table, "num_buckets": np.asarray(self.num_buckets),
                "max_distance": np.asarray(self.max_distance), "bidirectional": np.asarray(self.bidirectional)}


#: position-bias name (the plain format's ``mask.bias``) -> class
POSITION_BIASES = {"alibi": ALiBi, "t5": T5Bias}


@final
@dataclass(frozen=True, eq=False)
class AttentionMask(_Value):
    """What a head's queries may see and the position terms of its scores (module docstring).

    Parameters
    ----------
    causal : bool
        The query at position p sees keys at positions <= p (self-attention only).
    window : int, optional
        Keys within ``w - 1`` positions of the query (sliding-window attention).
    bias : ALiBi or T5Bias, optional
    softcap : float, optional
        ``c`` of the soft-cap ``c tanh(s / c)``.
    """

    causal: bool = False
    window: int | None = None
    bias: ALiBi | T5Bias | None = None
    softcap: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "causal", bool(self.causal))
        if self.window is not None:
            if isinstance(self.window, bool) or not float(self.window).is_integer() or int(self.window) < 1:
                raise WeightsError("window", "a positive integer (keys within w - 1 positions)", repr(self.window),
                                   "use the checkpoint's sliding_window")
            object.__setattr__(self, "window", int(self.window))
        if self.bias is not None and not isinstance(self.bias, (ALiBi, T5Bias)):
            raise WeightsError("bias", "an ALiBi or a T5Bias position bias, or None", type(self.bias).__name__,
                               "build ALiBi(slope) or T5Bias(table, ...)")
        if self.softcap is not None:
            object.__setattr__(self, "softcap", positive_float("softcap", self.softcap,
                                                               "use the checkpoint's attn_logit_softcapping"))

    @property
    def plain(self) -> bool:
        """No window, no position bias, no soft-cap (a causal mask may be set)."""
        return self.window is None and self.bias is None and self.softcap is None

    @property
    def hides(self) -> bool:
        return self.causal or self.window is not None

    def visible(self, pos_q, pos_k) -> np.ndarray | None:
        """Which keys each query sees (m, n), or None: all of them."""
        if not self.hides:
            return None
        offsets = _offsets(pos_q, pos_k)                                # p_j - p_i
        seen = offsets <= 0 if self.causal else np.ones(offsets.shape, dtype=bool)
        if self.window is not None:
            seen &= np.abs(offsets) < self.window
        return seen

    def describe(self) -> str:
        parts = (["causal"] if self.causal else []) + ([f"window {self.window}"] if self.window else []) \
            + ([f"ALiBi slope {self.bias.slope:g}"] if isinstance(self.bias, ALiBi) else []) \
            + ([f"T5 bias ({self.bias.num_buckets} buckets)"] if isinstance(self.bias, T5Bias) else []) \
            + ([f"soft-cap {self.softcap:g}"] if self.softcap else [])
        return ", ".join(parts) or "no mask"

    def to_arrays(self) -> dict:
        """Plain arrays: ``causal``, and ``window``, ``softcap``, ``bias.*`` when set."""
        out = {"causal": np.asarray(self.causal)}
        if self.window is not None:
            out["window"] = np.asarray(self.window)
        if self.softcap is not None:
            out["softcap"] = np.asarray(self.softcap)
        if self.bias is not None:
            out.update({f"bias.{key}" if key != "bias" else "bias": value
                        for key, value in self.bias.to_arrays().items()})
        return out

    @classmethod
    def from_arrays(cls, arrays: dict) -> AttentionMask:
        def item(key, default=None):
            return np.asarray(arrays[key]).item() if key in arrays else default
        bias = None
        if "bias" in arrays:
            kind = str(item("bias"))
            if kind not in POSITION_BIASES:
                raise WeightsError("mask.bias", f"one of {sorted(POSITION_BIASES)}", repr(kind),
                                   "write the mask with save_plain (docs/formats.md)")
            fields_ = {key[5:]: arrays[key] for key in arrays if key.startswith("bias.")}
            values = {key: (np.asarray(v) if key == "table" else np.asarray(v).item()) for key, v in fields_.items()}
            bias = POSITION_BIASES[kind](**values)
        return cls(causal=bool(item("causal", False)), window=item("window"), bias=bias, softcap=item("softcap"))


@final
class HeadMasks:
    """The masks of H heads applied to their scores (b, H, m, n) at once.

    :meth:`apply` returns the masked scores and the soft-cap's slope ``1 - tanh^2(s/c)`` (None
    without a soft-cap): the JVP and VJP of the masked scores are ``slope * dS``.
    """

    def __init__(self, masks: tuple[AttentionMask, ...]):
        self.masks = tuple(masks)
        self.shared = all(mask == self.masks[0] for mask in self.masks)
        self.identity = self.shared and self.masks[0] == AttentionMask()
        self.causal = any(mask.causal for mask in self.masks)
        self._terms = None

    def _stack(self, arrays) -> np.ndarray | None:
        if all(a is None for a in arrays):
            return None
        return arrays[0][None] if self.shared else np.stack(arrays)

    def terms(self, pos_q, pos_k, cross: bool):
        """``(visible, bias, cap)`` as (H or 1, m, n), (H or 1, m, n), (H or 1, 1, 1) arrays or None."""
        pos_q, pos_k = np.asarray(pos_q), np.asarray(pos_k)
        key = (pos_q.tobytes(), pos_k.tobytes(), cross)
        if self._terms is not None and self._terms[0] == key:
            return self._terms[1]
        if cross and self.causal:
            raise WeightsError("target", "a non-causal head for cross-attention", "a causal head",
                               "causal masks apply to self-attention")
        masks = self.masks[:1] if self.shared else self.masks
        shape = (len(pos_q), len(pos_k))
        visible = [m.visible(pos_q, pos_k) for m in masks]
        visible = self._stack([None if all(v is None for v in visible) else
                               (np.ones(shape, dtype=bool) if v is None else v) for v in visible])
        biases = [None if m.bias is None else m.bias.matrix(pos_q, pos_k) for m in masks]
        bias = self._stack([None if all(b is None for b in biases) else (np.zeros(shape) if b is None else b)
                            for b in biases])
        caps = [m.softcap for m in masks]
        cap = None if all(c is None for c in caps) else \
            np.array([np.inf if c is None else c for c in caps])[:, None, None]
        terms = (visible, bias, cap)
        self._terms = (key, terms)
        return terms

    def apply(self, S: np.ndarray, pos_q, pos_k, cross: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """``(masked scores, soft-cap slope or None)`` for scores S (b, H, m, n)."""
        if self.identity:
            return S, None
        visible, bias, cap = self.terms(pos_q, pos_k, cross)
        slope = None
        if cap is not None:
            cap = cap.astype(S.dtype)
            squashed = np.tanh(S / cap)
            slope = 1 - squashed * squashed
            S = np.where(np.isfinite(cap), cap * squashed, S)
            slope = np.where(np.isfinite(cap), slope, 1)
        if bias is not None:
            S = S + bias.astype(S.dtype, copy=False)
        if visible is not None:
            S = np.where(visible, S, -np.inf).astype(S.dtype, copy=False)
        return S, slope
