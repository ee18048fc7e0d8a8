"""The split bound on the norms of ``zeta``'s scaled rows, for inputs longer than the curvature bound's Gram route
reaches (:class:`~lipbound.local.curvature.AttentionCurvature`): it forms ``zeta`` one query at a time.  With ``a_hi =
W_K q_i``, row (h, i, j) of ``zeta`` is its own block ``o_hij = c ((delta_ij - p_ii) a_hi + W_Q (k_j - kappa_i))`` on
``e_i`` plus ``c (delta_mj - p_im) a_hi`` on the other tokens' ``e_m``; for row scales s (Minkowski, then
Cauchy-Schwarz per (h, i))

    ||diag(s) zeta|| <= max_i ||diag(s_i) [o_hij]_(h,j)|| + c ||diag(nu) [a_hi]_(h,i)||,
    nu_hi = ||diag(s_hi) [delta_mj - p_im]_(j, m != i)||  (an n x (n - 1) matrix),

while the rows of one query i, ``H n`` of them, get their norms from their own Gram matrix.  It takes
one ``H n x d`` Gram matrix, 2 n of size ``H n`` and ``H n`` of size n (at a cost that no longer grows as n^6); its
deviation arrays have ``H n^4`` entries (:data:`~lipbound.local.curvature.SPLIT_ENTRIES` caps them).
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import RowGram

__all__ = ["SplitRows", "query_rows"]


def query_rows(coefficient: IntervalArray, query_part: IntervalArray, key_part: IntervalArray, c: IntervalArray,
               i: int) -> IntervalArray:
    """``zeta``'s rows ``(h, j)`` of query i, block m of each being ``c (delta_mj - p_im) a_him + [m = i] c W_Q M_i
    (k~_j - kappa_i)`` with ``a_him = W_K M_m q~_i^T`` (``W_K q_i`` for a dot product): shape (H, n(j), n(m), d).
    ``query_part`` is (H, n(i), n(m) or 1, d)."""
    block = coefficient[:, i].expand(-1) * query_part[:, i].expand(1)
    lo, hi = block.lo.copy(), block.hi.copy()
    own = IntervalArray(lo[:, :, i], hi[:, :, i]) + key_part[:, i]
    lo[:, :, i], hi[:, :, i] = own.lo, own.hi
    return IntervalArray(lo, hi) * c


class SplitRows:
    """Certified ``||diag(s) zeta_R||`` by the split bound (module docstring), with the interface of
    :class:`~lipbound.rigorous.linalg.RowGram`: scales on the rows ``R`` (all by default) of ``zeta``'s
    rows ``(h, i, j)``, the others zero.  The rows of one query have a Gram matrix of their own (``H n``
    rows), which gives their norms without the split."""

    def __init__(self, query_part: IntervalArray, key_part: IntervalArray, coefficient: IntervalArray,
                 c: IntervalArray):
        H, n, _, d = query_part.shape
        self.shape, self.c = (H, n, n), c
        self.own, self.per_query = [], []
        for i in range(n):
            rows = query_rows(coefficient, query_part, key_part, c, i)                   # (H, n(j), n(m), d)
            self.per_query.append(RowGram(rows.reshape(H * n, n * d).to_enclosure()))
            self.own.append(RowGram(rows[:, :, i].reshape(H * n, d).to_enclosure()))      # its own blocks o_hij
        self.queries = RowGram(query_part[:, :, 0].reshape(H * n, d).to_enclosure())      # rows a_hi, (h, i)
        others = [np.arange(n) != i for i in range(n)]
        # (delta_mj - p_im)_{j, m != i}
        self.others = [[RowGram(coefficient[h, i][:, others[i]].to_enclosure()) for i in range(n)] for h in range(H)]

    def norm_upper(self, scales, rows=None) -> float:
        s = np.zeros(int(np.prod(self.shape)))
        s[slice(None) if rows is None else rows] = scales
        s = s.reshape(self.shape)
        queries = np.flatnonzero(np.any(s > 0, axis=(0, 2)))
        if queries.size == 0:
            return 0.0
        moving = [np.flatnonzero(s[:, i].ravel()) for i in queries]
        if queries.size == 1:
            return self.per_query[queries[0]].norm_upper(s[:, queries[0]].ravel()[moving[0]], moving[0])
        own = max(self.own[i].norm_upper(s[:, i].ravel()[rows_i], rows_i) for i, rows_i in zip(queries, moving))
        nu = np.array([[self.others[h][i].norm_upper(s[h, i]) if np.any(s[h, i]) else 0.0
                        for i in range(self.shape[1])] for h in range(self.shape[0])]).ravel()   # (H n)
        active = np.flatnonzero(nu)
        other = self.queries.norm_upper(nu[active], active) if active.size else 0.0
        return (IntervalArray(own) + self.c * IntervalArray(other)).hi.item()
