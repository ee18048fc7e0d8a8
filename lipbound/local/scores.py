"""What the local theorems read of an attention kernel and its mask: rotated projections, visibility.

The local theorems cover heads whose score is a dot product of position-rotated queries and keys,

    s_ij = c (q_i M_i) . (k_j M_j),     q_i = x_i W_Q + b_Q,  k_j = x_j W_K + b_K,

with ``M_p`` the rotation of RoPE at position p (:class:`~lipbound.numeric.kernels.Rotary`; Su et al.
2021) or the identity (:class:`~lipbound.numeric.kernels.DotProduct`), under a softmax whose mask hides
keys (causal, sliding window) and adds nothing to the scores.  Such a head is, pair by pair, a
dot-product head with the matrices ``W_Q M_i`` and ``W_K M_j``: its query at i and key at j interact
through ``A_ij = W_Q M_i M_j^T W_K^T = W_Q R(p_i - p_j) W_K^T`` (rotations in each plane commute),
which depends on the offset alone.  A hidden key has mass 0 in its query's softmax.

:func:`rotation_enclosures` encloses ``M_p`` rigorously (the angles ``p base^(-2t/D)`` and their cosines
and sines in interval arithmetic); :func:`head_projections` gives rotated queries, keys and values per
head (the keys and values of a key/value group repeated for each of its heads); :func:`visibility` the
mask as a boolean (H, m, n) array; :class:`ScoreNorms` the per-pair norms the score-deviation theorem
reads (``a_ij = ||W_Q M_i k~_j^T||``, ``b_ij = ||W_K M_j q~_i^T||``, ``g_ij = ||W_Q R(p_i - p_j) W_K^T||``),
shaped to broadcast over (H, queries, keys).  Other kernels, position biases and soft-caps are refused.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import WeightsError
from ..numeric.attention import AttentionMap
from ..numeric.kernels import SOFTMAX, DotProduct, Rotary
from ..numeric.model import Layer
from ..rigorous.arrays import IntervalArray
from ..rigorous.intervals import IV, lower, upper
from ..rigorous.linalg import Enclosure, product_norm_interval

__all__ = ["LOCAL_KERNELS", "check_scope", "rotation_enclosures", "head_projections", "visibility", "group_index",
           "score_scale", "ScoreNorms"]

#: The kernels the local theorems cover: a dot product of rotated queries and keys (module docstring).
LOCAL_KERNELS = (DotProduct, Rotary)


def check_scope(engine: AttentionMap) -> None:
    """Refuse a head or layer outside the local theorems' scope (module docstring)."""
    kernel = engine.kernel
    masks = engine.masks.masks
    if not isinstance(kernel, LOCAL_KERNELS) or engine.weights is not SOFTMAX \
            or any(mask.bias is not None or mask.softcap is not None for mask in masks):
        raise WeightsError("target", "softmax attention with a dot-product or rotary (RoPE) score, masked causally "
                           "or by a window or not at all (the local theorems' scope)",
                           f"{kernel.describe()} with {', '.join(sorted({m.describe() for m in masks}))}",
                           "use lipbound verify for heads with position biases, soft-caps or other scores")


def score_scale(engine: AttentionMap) -> IntervalArray:
    """``c``: the kernel's scale, or ``1 / sqrt(d_k)``, enclosed."""
    scale = engine.kernel.scale
    return IntervalArray.constant(1 / IV.sqrt(engine.d_k) if scale is None else scale)


def group_index(engine: AttentionMap) -> np.ndarray:
    """The key/value group each head reads (H,)."""
    target = engine.target
    if isinstance(target, Layer):
        return np.array([target.group_of(h) for h in range(engine.H)])
    return np.zeros(engine.H, dtype=np.int64)


@functools.lru_cache(maxsize=64)
def _rotations(base: float, dims: int, pairing: str, d_k: int, offsets: tuple) -> tuple[np.ndarray, np.ndarray]:
    half = dims // 2
    if pairing == "half":
        first, second = np.arange(half), np.arange(half) + half
    else:
        first, second = np.arange(0, dims, 2), np.arange(1, dims, 2)
    count = len(offsets)
    lo, hi = np.zeros((count, d_k, d_k)), np.zeros((count, d_k, d_k))
    rest = np.arange(dims, d_k)
    lo[:, rest, rest] = hi[:, rest, rest] = 1.0
    frequencies = [IV.mpf(base) ** (IV.mpf(-2 * t) / dims) for t in range(half)]
    for index, p in enumerate(offsets):
        for t, theta in enumerate(frequencies):
            angle = IV.mpf(p) * theta
            cos, sin = IV.cos(angle), IV.sin(angle)
            a, b = first[t], second[t]
            # rows: u'_a = u_a cos - u_b sin, u'_b = u_b cos + u_a sin, so u' = u M with
            # M[a, a] = M[b, b] = cos, M[a, b] = sin, M[b, a] = -sin
            for (row, column), value in (((a, a), cos), ((b, b), cos), ((a, b), sin), ((b, a), -sin)):
                lo[index, row, column], hi[index, row, column] = lower(value), upper(value)
    return lo, hi


def rotation_enclosures(kernel, positions, d_k: int) -> IntervalArray | None:
    """``M_p`` (len(positions), d_k, d_k) for a rotary kernel (row convention: ``q~ = q M_p``), enclosed;
    None for a dot product (the identity)."""
    if not isinstance(kernel, Rotary):
        return None
    lo, hi = _rotations(float(kernel.base), kernel.rotated(d_k), kernel.pairing, d_k,
                        tuple(int(p) for p in np.asarray(positions)))
    return IntervalArray(lo, hi)


def visibility(engine: AttentionMap, pos_q, pos_k) -> np.ndarray | None:
    """Which keys each query sees, (H, m, n) booleans, or None: every key."""
    masks = engine.masks.masks
    if not any(mask.hides for mask in masks):
        return None
    shape = (len(pos_q), len(pos_k))
    return np.stack([np.ones(shape, dtype=bool) if not mask.hides else mask.visible(pos_q, pos_k) for mask in masks])


def head_projections(engine: AttentionMap, Z: IntervalArray, positions) -> tuple:
    """Rotated queries and keys and the values of every head at tokens Z (n, d) at ``positions``:
    ``(Q~, K~, V)`` of shapes (H, n, d_k), (H, n, d_k), (H, n, d_v), enclosed (a group's keys and values
    repeated for each of its heads), and the rotations (n, d_k, d_k) or None."""
    check_scope(engine)
    projected = Z.matmul(engine.W) + IntervalArray(engine.bias)
    groups = group_index(engine)
    Q = engine.per_head(projected, "queries")
    K, V = (engine.per_head(projected, part)[groups] for part in ("keys", "values"))
    rotations = rotation_enclosures(engine.kernel, positions, engine.d_k)
    if rotations is not None:
        Q, K = (part.einsum("hik,ikl->hil", rotations) for part in (Q, K))
    return Q, K, V, rotations


class ScoreNorms:
    """The norms of the score-deviation theorem for the heads of ``engine`` at rotated queries ``Q~`` and
    keys ``K~`` (H, n, d_k) and positions p, each shaped to broadcast over (H, queries i, keys j):

    * ``a`` -- ``||W_Q M_i k~_j^T||`` (dot product: (H, 1, n));
    * ``b`` -- ``||W_K M_j q~_i^T||`` (dot product: (H, n, 1)), the norm of ``w_ij = W_K M_j q~_i^T``,
      the key-side gradient of s_ij;
    * ``g`` -- ``||W_Q R(p_i - p_j) W_K^T||`` (dot product: (H, 1, 1), ``||W_Q W_K^T||``);

    and the vectors themselves: ``w`` -- ``w_ij = W_K M_j q~_i^T``, (H, n, n, d) (dot product: (H, n, 1, d)), and
    ``key_vectors`` -- ``W_Q M_i k~_j^T``, (H, n, n, d) (dot product: (H, 1, n, d)).
    """

    def __init__(self, engine: AttentionMap, Q: IntervalArray, K: IntervalArray, rotations: IntervalArray | None,
                 positions):
        self.engine, self.rotations = engine, rotations
        H = engine.H
        weights = [engine.head_weights(h)[:2] for h in range(H)]
        if rotations is None:
            self.w = IntervalArray.stack([Q[h].matmul(W_K.T) for h, (_, W_K) in enumerate(weights)]).expand(2)
            self.key_vectors = IntervalArray.stack([K[h].matmul(W_Q.T) for h, (W_Q, _) in enumerate(weights)]).expand(1)
            self.a, self.b = self.key_vectors.norm_upper(), self.w.norm_upper()
            self.g = np.array([self._offset_norm(engine.heads[h], W_Q, W_K, None)
                               for h, (W_Q, W_K) in enumerate(weights)])
            self.g = self.g[:, None, None]
            return
        # un-rotate by the other token's position: q~_i M_j^T and k~_j M_i^T, (H, n_i, n_j, d_k)
        queries = Q.einsum("hik,jlk->hijl", rotations)
        keys = K.einsum("hjk,ilk->hijl", rotations)
        self.w = IntervalArray.stack([queries[h].matmul(W_K.T) for h, (_, W_K) in enumerate(weights)])
        self.b = self.w.norm_upper()
        self.key_vectors = IntervalArray.stack([keys[h].matmul(W_Q.T) for h, (W_Q, _) in enumerate(weights)])
        self.a = self.key_vectors.norm_upper()
        p = np.asarray(positions, dtype=np.int64)
        offsets = p[:, None] - p[None, :]
        distinct = np.unique(offsets)
        turned = rotation_enclosures(engine.kernel, distinct, engine.d_k)
        per_offset = np.array([[self._offset_norm(engine.heads[h], W_Q, W_K, (int(delta), turned[k]))
                                for k, delta in enumerate(distinct)] for h, (W_Q, W_K) in enumerate(weights)])
        self.g = per_offset[:, np.searchsorted(distinct, offsets)]

    @staticmethod
    def _offset_norm(head, W_Q: np.ndarray, W_K: np.ndarray, offset) -> float:
        """``||W_Q R W_K^T||`` certified (R the rotation by an offset, or the identity), kept in the head's
        cache of norms (the head is immutable; its kernel fixes R for an offset)."""
        cache = head.norm_cache
        key = ("local", "QK") if offset is None else ("local", "QK", offset[0])
        if key not in cache:
            left = Enclosure.exact(W_Q) if offset is None else Enclosure.exact(W_Q) @ offset[1].to_enclosure()
            cache[key] = upper(product_norm_interval(left, Enclosure.exact(W_K.T)))
        return cache[key]
