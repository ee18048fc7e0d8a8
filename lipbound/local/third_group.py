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
from ..rigorous.linalg import lambda_max_upper_large

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
    d = queries[0].shape[0]
    # Qt_h^T Qt_g = W_K^h (W_Q^h^T W_Q^g) W_K^g^T through the heads' width, (H, H, d, d)
    W_Q, W_K = IntervalArray(np.stack(queries)), IntervalArray(np.stack(keys))          # (H, d, d_k)
    inner = W_Q.einsum("hak,gam->hgkm", W_Q)                                              # (H, H, d_k, d_k)
    left = W_K.einsum("hak,hgkm->hgam", inner)                                            # (H, H, d, d_k)
    crossed = left.einsum("hgam,gbm->abhg", W_K).reshape(d * d, H * H)                    # (d^2, H^2), rows (a, b)
    del left
    tokens = rows.einsum("hijk,gilk->hgjl", rows).reshape(H * H, n * n)                   # sum_i D_hi D_gi^T
    summed = crossed.bmm(tokens)                                                          # (d^2, n^2)
    del crossed
    S = summed.reshape(d, d, n, n).swapaxes(1, 2).reshape(d * n, d * n).to_enclosure()    # rows (a, j), columns (b, l)
    del summed
    top = max(lambda_max_upper_large(S.sym()), 0.0)
    return float(IntervalArray(top).sqrt().hi)
