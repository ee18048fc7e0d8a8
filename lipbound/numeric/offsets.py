"""The positions a head's scores see: which keys each query sees, the offsets ``p_j - p_i`` that occur,
the position biases over each row, and the rotary matrices ``R_Delta`` of those offsets, enclosed.

Token i of a sequence sits at position i (0..n-1); a query at ``p_i`` and a key at ``p_j`` are ``Delta =
p_j - p_i`` apart.  A rotary score ``q_i^T R_Delta k_j`` sees each key through its own offset's matrix, and
the theorems of rotary attention are stated in maxima over the offsets that occur: ``2n - 1`` of them in
self-attention, ``n`` under a causal mask, fewer under a window, ``m + n - 1`` in cross-attention.
"""

from __future__ import annotations

import functools
from typing import final

import numpy as np

from ..rigorous.intervals import IV, upper
from ..rigorous.linalg import Enclosure
from .kernels import Rotary
from .model import Head

__all__ = ["HeadRows", "rotation_enclosure", "offsets_of"]


@final
class HeadRows:
    """The rows of a head of self-attention at positions ``0..n-1``: the keys each query sees, the
    offsets ``p_j - p_i`` that occur, and the spread of the position bias over each row.

    Attributes
    ----------
    visible : ndarray (n, n) of bool
    key_counts : ndarray (n,) of int
    offsets : tuple of int
        Every offset ``p_j - p_i`` of a visible pair, increasing.
    bias_spread : ndarray (n,)
        ``max - min`` of the position bias over the keys of each row (0 without a bias).
    softcap : float or None
    """

    def __init__(self, head: Head, n: int):
        positions = np.arange(int(n))
        visible = head.mask.visible(positions, positions)
        self.visible = np.ones((n, n), dtype=bool) if visible is None else visible
        self.key_counts = self.visible.sum(axis=1)
        delta = positions[None, :] - positions[:, None]
        self.offsets = tuple(sorted({int(v) for v in delta[self.visible]}))
        bias = head.mask.bias
        if bias is None:
            self.bias_spread = np.zeros(n)
        else:
            table = bias.matrix(positions, positions)
            self.bias_spread = np.array([np.ptp(table[i, self.visible[i]]) for i in range(n)], dtype=float)
        self.softcap = head.mask.softcap
        self.n = int(n)

    def column_sum(self, per_row) -> object:
        """``max_j sum_{i: j in V_i} per_row[i]`` (intervals), a column sum of any per-row bound."""
        return max((sum((per_row[i] for i in range(self.n) if self.visible[i, j]), IV.mpf(0)) for j in range(self.n)),
                   key=upper)


@functools.lru_cache(maxsize=512)
def rotation_enclosure(kernel, d_k: int, offset: int) -> Enclosure:
    """``R_Delta`` (d_k, d_k) with ``q^T R_Delta k`` the rotary score of a query and a key ``Delta = offset``
    positions apart, enclosed: the angles ``Delta base^(-2t/D)`` and their cosines and sines in interval
    arithmetic.  The identity for a dot product."""
    if not isinstance(kernel, Rotary) or offset == 0:
        return Enclosure.exact(np.eye(d_k))
    D = kernel.rotated(d_k)
    half = D // 2
    mid, rad = np.eye(d_k), np.zeros((d_k, d_k))
    log_base = IV.log(IV.mpf(kernel.base))
    for t in range(half):
        angle = IV.mpf(offset) * IV.exp(-IV.mpf(2 * t) / D * log_base)
        cos, sin = IV.cos(angle), IV.sin(angle)
        a, b = (t, t + half) if kernel.pairing == "half" else (2 * t, 2 * t + 1)
        # rotated coordinates: u'_a = u_a cos - u_b sin, u'_b = u_b cos + u_a sin; R maps k to R k
        for (row, col), value in (((a, a), cos), ((b, b), cos), ((a, b), -sin), ((b, a), sin)):
            centre = float(value.mid)
            mid[row, col] = centre
            rad[row, col] = max(upper(value - centre), upper(centre - value))
    return Enclosure(mid, rad)


def offsets_of(head: Head, n: int, m: int | None = None) -> tuple[int, ...]:
    """The offsets ``p_j - p_i`` that occur: self-attention at n tokens under the head's mask, or m queries
    at positions 0..m-1 against n keys at 0..n-1 (cross-attention, no mask)."""
    if m is None:
        return HeadRows(head, n).offsets
    return tuple(range(-(int(m) - 1), int(n)))
