"""The curvature's third group with the heads and the direction's tokens taken together: one operator per query.

The third group of the attention's second derivative (theorem ``local-attention-curvature``) has at query i the
half ``c sum_h (e_i Qt_h F^T) D_hi`` (and the same with e and f swapped), ``Qt_h = W_Q^h W_K^h^T`` (d, d) and
``D_hi = diag(p_hi) U_hi`` (n, d_out) the rows ``p_hij u_hij``, ``u_hij = v_j A_h - f_hi`` in the output space.  Its
value at a unit ``y`` is ``c <F, sum_h (D_hi y^T)(e_i Qt_h)>``, and ``||sum_h (D_hi y^T)(e_i Qt_h)||_F
= ||K_i (e_i^T kron y^T)||`` with the one operator

    K_i = sum_h Qt_h^T kron D_hi  ((d n) x (d d_out)),   K_i K_i^T = sum_(h,g) (Qt_h^T Qt_g) kron (D_hi D_gi^T),

so the half is at most ``c ||e_i|| ||F||_F ||K_i||``, and ``max_i ||K_i||`` at most the top eigenvalue's root of
``sum_i K_i K_i^T`` (PSD terms; one certificate for all queries: :func:`third_group_norm`; lemma
``curvature-third-kronecker``, docs/mathematics.md).  The earlier forms bound each head's ``F^T D_hi`` by its own
spectral norm (every head chooses its own F) and add the heads through ``||W_O||`` or Cauchy-Schwarz; on MiniLM's
layer 0 around "The cat sat on the mat." they give 5.5-16 per query where ``||K_i||`` is 2.0-4.6 and ascent on the
trilinear form finds 1.7-4.4 (the sum over the queries: 7.47).

On a set U the matrices ``D_hi(Y) = D_hi(X) + Delta_hi`` with ``||Delta_hi||_2 <= delta_hi``, and
``||sum_h Qt_h^T kron Delta_hi|| <= (sum_h delta_hi)^(1/2) ||sum_h delta_hi Qt_h Qt_h^T||^(1/2)`` (the heads by the
triangle inequality, then Cauchy-Schwarz with weights delta: the curvature's heads-weighted form on the changes), so
``||K_i(Y)|| <= ||K_i(X)|| + that``.  ``K_i K_i^T`` has ``(d n)^2`` entries and a certified top eigenvalue costs one
Cholesky factorisation of the sum, at X only (:data:`KRONECKER_ROWS` caps ``d n``).
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.elementwise import up_nonnegative
from ..rigorous.linalg import Enclosure, lambda_max_upper_large

__all__ = ["KRONECKER_ROWS", "third_group_norm"]

#: Largest ``d n`` for which ``K_i K_i^T`` is formed (n <= 12 at MiniLM's width: about a second per query there)
KRONECKER_ROWS = 12 * 384


def third_group_norm(queries: list, keys: list, rows: IntervalArray) -> float:
    """A certified upper bound on ``max_i ||K_i||``, ``K_i = sum_h Qt_h^T kron D_hi`` (module docstring): the top
    eigenvalue of ``sum_i K_i K_i^T`` (each ``K_i K_i^T`` is PSD, so their sum bounds every one), one Cholesky
    factorisation for all queries.

    Parameters
    ----------
    queries, keys : list of (d, d_k) float arrays
        ``W_Q^h`` and ``W_K^h`` per head (``Qt_h = W_Q^h W_K^h^T``), taken exactly.
    rows : IntervalArray (H, n, n, d_out)
        ``D_hi``'s rows ``p_hij u_hij`` enclosed, indexed (h, i, j).
    """
    H, n = rows.shape[0], rows.shape[1]
    d, d_k = queries[0].shape
    # The pair (g, h) adds the transpose of the pair (h, g)'s term (Qt_g^T Qt_h = (Qt_h^T Qt_g)^T, the same for the
    # tokens), so the sum is Q + Q^T with Q over the pairs h <= g, those with h = g halved (exactly).
    # Qt_h^T Qt_g = W_K^h (W_Q^h^T W_Q^g) W_K^g^T through the heads' width: the middle factors for all pairs as one
    # product, then W_K^h on the left (rows (h, a)) and each W_K^g^T on the right, as point-matrix enclosures
    # (BLAS products with a priori rounding bounds)
    W_Q = Enclosure.exact(np.concatenate(queries, axis=1))                               # (d, H d_k)
    middle = W_Q.T @ W_Q                                                                  # (H d_k, H d_k)
    left = Enclosure.concatenate([Enclosure.exact(keys[h]) @ middle[h * d_k:(h + 1) * d_k, :] for h in range(H)],
                                 axis=0)                                                  # (H d, H d_k)
    first, second = np.triu_indices(H)                                                    # the pairs h <= g
    mid, rad = np.empty((first.size, d, d)), np.empty((first.size, d, d))
    for g in range(H):
        pair = left[:(g + 1) * d, g * d_k:(g + 1) * d_k] @ Enclosure.exact(keys[g].T)     # rows (h <= g, a)
        at = np.flatnonzero(second == g)                                                  # the pairs (0..g, g)
        mid[at], rad[at] = pair.mid.reshape(g + 1, d, d), pair.rad.reshape(g + 1, d, d)
    # the pairs h = g halved: exact unless a half falls into the subnormals (then off by at most 2^-1075 in the centre
    # and the radius each, which the radius's step up covers)
    same = first == second
    mid[same] *= 0.5
    rad[same] = up_nonnegative(rad[same] * 0.5)
    crossed = Enclosure._trusted(mid.reshape(-1, d * d), rad.reshape(-1, d * d)).T       # (d^2, pairs), rows (a, b)
    del mid, rad
    tokens = rows.einsum("hijk,gilk->hgjl", rows)[first, second].reshape(-1, n * n).to_enclosure()  # sum_i D_hi D_gi^T
    summed = crossed @ tokens                                                             # (d^2, n^2)
    del crossed
    # Q with rows (a, j), columns (b, l); Q + Q^T is exactly symmetric (fl(x + y) = fl(y + x))
    Q = Enclosure._trusted(*(part.reshape(d, d, n, n).swapaxes(1, 2).reshape(d * n, d * n)
                             for part in (summed.mid, summed.rad)))
    del summed
    top = max(lambda_max_upper_large(Q + Q.T), 0.0)
    return float(IntervalArray(top).sqrt().hi)
