"""The Gram forms of lemma point-attention (the key path's and the query part's) in floats, with their rounding
bounded a posteriori.

The key path's output-space norms ``||N_ij||_F`` (:func:`~lipbound.local.point_stages._key_path_norms`) are the
square roots of

``S_ij = sum_hg p^h_ij p^g_ij K^i_hg O^ij_hg``,  ``K^i_hg = q^h_i Psi_hg q^gT_i``,
``O^ij_hg = v^h_j Omega_hg v^gT_j - f^h_i Omega_hg v^gT_j - f^g_i Omega_gh v^hT_j + f^h_i Omega_hg f^gT_i``

over boxes of the queries, values, means, weights (B, H, n, .) and of the head blocks ``Psi`` (H, d_k, H, d_k) and
``Omega`` (H, d_v, H, d_v).  Instead of interval arithmetic over the (B, n, n, H, H) arrays, ``S`` is evaluated once
in floats at the boxes' midpoints and bounded by lemma float-gram (docs/mathematics.md):

``S <= fl(S~) + gamma_m x^T M x + 2 x^T M (x_p + x_q + x_a) + x^T M_r x + (underflow)``

per (b, i, j), with ``x_h = |p|^h_ij ||q^h_i|| (||v^h_j|| + ||f^h_i||)`` from the boxes' magnitudes, ``x_p, x_q, x_a``
the same with one factor replaced by its radius, ``M = psi o omega`` and ``M_r = psi_r o omega + psi o omega_r``
(H x H: upper bounds on the spectral norms of the blocks ``|Psi_hg|``, ``|Omega_hg|`` and of their radii) and
``m = 2 (d_k + d_v) + H^2 + 8`` roundings per monomial.  The error terms cost (B, n, n, H) arrays; the float
evaluation is about fourteen times faster than the interval one on all-MiniLM-L6-v2.  The query part's form
(:func:`query_squares`) is bounded the same way with the keys in place of the heads.
"""

from __future__ import annotations

import numpy as np

from ..errors import NotCertifiedError
from ..rigorous.arrays import IntervalArray
from ..rigorous.elementwise import SMALLEST_SUBNORMAL, gamma_bound

__all__ = ["block_majorants", "key_path_squares", "query_squares"]


def _block_norms(blocks: np.ndarray) -> np.ndarray:
    """Upper bounds (H, G) on ``||A_hg||_2`` of the non-negative blocks of ``blocks`` (H, k, G, l):
    ``||A||_2 <= (||A||_1 ||A||_inf)^(1/2)`` (Hoelder)."""
    A = IntervalArray(blocks)
    rows = np.max(A.sum(axis=3).hi, axis=1)                                              # (H, H): row sums
    columns = np.max(A.sum(axis=1).hi, axis=-1)                                         # (H, H): column sums
    return (IntervalArray(rows) * IntervalArray(columns)).sqrt().hi


def _symmetric(norms: np.ndarray) -> np.ndarray:
    """The larger of the ``hg`` and ``gh`` bounds: the form's pieces use both blocks."""
    return np.maximum(norms, norms.T)


def block_majorants(Omega: IntervalArray, Psi: IntervalArray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """``M = psi o omega`` and ``M_r = psi_r o omega + psi o omega_r`` (H, H), rounded up, and ``max psi``, ``max
    omega``, from the enclosed head blocks: ``psi_hg >= || |Psi|_hg ||_2`` over the box (its magnitudes), ``psi_r``
    likewise of its radii."""
    psi, psi_r, omega, omega_r = (_symmetric(_block_norms(A)) for A in (Psi.magnitude, Psi.rad, Omega.magnitude,
                                                                         Omega.rad))
    M = IntervalArray(psi) * IntervalArray(omega)
    M_r = IntervalArray(psi_r) * IntervalArray(omega) + IntervalArray(psi) * IntervalArray(omega_r)
    return M.hi, M_r.hi, float(np.max(psi)), float(np.max(omega))


def _through(A: np.ndarray, M: np.ndarray) -> np.ndarray:
    """``a^h M_hg`` for every pair of heads in floats: A (B, n, H, k), M (H, k, G, l) -> (B, n, H, G, l)."""
    B, n, H, k = A.shape
    G, l = M.shape[2:]
    out = np.matmul(A.reshape(B * n, H, k).swapaxes(0, 1), M.reshape(H, k, G * l))              # (H, B n, G l)
    return out.reshape(H, B, n, G, l).swapaxes(0, 1).swapaxes(1, 2)


def _float_squares(Q: np.ndarray, V: np.ndarray, F: np.ndarray, P: np.ndarray, Omega: np.ndarray,
                   Psi: np.ndarray) -> np.ndarray:
    """``S~`` (B, n, n) in floats at the midpoints (module docstring): head-sized products only."""
    Vt, Ft, Qt = (A.swapaxes(1, 2) for A in (V, F, Q))                                       # (B, n, H, .)
    B, n, H, d_v = Vt.shape
    VO, FO = _through(Vt, Omega), _through(Ft, Omega)
    keys = np.einsum("bihgl,bigl->bihg", _through(Qt, Psi), Qt)                              # (B, i, H, H)
    values = np.einsum("bjhgw,bjgw->bjhg", VO, Vt)
    means = np.einsum("bihgw,bigw->bihg", FO, Ft)
    cross = np.matmul(FO.swapaxes(2, 3).swapaxes(1, 2).reshape(B, H, n * H, d_v),
                      Vt.swapaxes(1, 2).swapaxes(2, 3)).reshape(B, H, n, H, n).swapaxes(1, 4).swapaxes(1, 2)
    outputs = values[:, None] - cross - cross.swapaxes(3, 4) + means[:, :, None]               # (B, i, j, H, H)
    weights = P.swapaxes(1, 2).swapaxes(2, 3)                                                # (B, i, j, H)
    return np.einsum("bijh,bijg,bihg,bijhg->bij", weights, weights, keys, outputs)


def _norms(A: IntervalArray) -> tuple[IntervalArray, IntervalArray]:
    """Upper bounds on the norms over the last axis of the box's vectors and of its radii."""
    return IntervalArray(A.norm_upper()), IntervalArray(IntervalArray(A.rad).norm_upper())


def _quadratic(x: IntervalArray, M: np.ndarray, y: IntervalArray) -> IntervalArray:
    """``x^T M y`` over the last axis (H) of non-negative x, y, enclosed."""
    return (x.matmul(M) * y).sum(axis=-1)


def key_path_squares(Q: IntervalArray, V: IntervalArray, F: IntervalArray, P: IntervalArray, Omega: IntervalArray,
                     Psi: IntervalArray, majorants: tuple, rounding: bool = True) -> np.ndarray:
    """Upper bounds (B, n, n) on ``S_ij`` (module docstring) over the boxes Q (B, H, n, d_k), V, F (B, H, n, d_v),
    P (B, H, n, n), Omega, Psi (lemma float-gram); ``majorants``: :func:`block_majorants` of Omega and Psi.
    ``rounding=False`` drops the ``gamma_m`` term (for the test that must then fail, never for a bound)."""
    M, M_r, psi_top, omega_top = majorants
    H, d_k, d_v = Q.shape[1], Q.shape[-1], V.shape[-1]
    S = _float_squares(Q.mid, V.mid, F.mid, P.mid, Omega.mid, Psi.mid)
    (query_big, query_rad), (value_big, value_rad), (mean_big, mean_rad) = (_norms(A) for A in (Q, V, F))

    def to_pairs(A: IntervalArray) -> IntervalArray:                                     # (B, H, i) -> (B, i, 1, H)
        return A.swapaxes(1, 2).expand(2)

    vectors = value_big.swapaxes(1, 2).expand(1) + to_pairs(mean_big)                     # (B, i, j, H)
    vectors_rad = value_rad.swapaxes(1, 2).expand(1) + to_pairs(mean_rad)
    weights = IntervalArray(P.magnitude).swapaxes(1, 2).swapaxes(2, 3)                      # (B, i, j, H)
    weights_rad = IntervalArray(P.rad).swapaxes(1, 2).swapaxes(2, 3)
    queries, queries_rad = to_pairs(query_big), to_pairs(query_rad)
    x = weights * queries * vectors
    moved = weights_rad * queries * vectors + weights * queries_rad * vectors + weights * queries * vectors_rad
    m = 2 * (d_k + d_v) + H * H + 8
    outer = _quadratic(x, M, x)
    error = _quadratic(x, M, moved) * 2.0 + _quadratic(x, M_r, x)
    products = H * H * (d_k * d_k + d_k + 3 * (d_v * d_v + d_v) + 3)
    keys_top = IntervalArray(float(np.max(query_big.hi, initial=0.0))).square() * IntervalArray(psi_top)
    outputs_top = IntervalArray(float(np.max(vectors.hi, initial=0.0))).square() * IntervalArray(omega_top)
    return _a_posteriori(S, outer, error, m, products, (P.magnitude, Q.magnitude, np.maximum(V.magnitude, F.magnitude)),
                         keys_top, outputs_top, rounding)


def _a_posteriori(S: np.ndarray, outer: IntervalArray, radii_terms: IntervalArray, m: int, products: int, factors,
                  keys_top: IntervalArray, outputs_top: IntervalArray, rounding: bool = True) -> np.ndarray:
    """``fl(S~) + gamma_m (the magnitudes' form) + (the radii's terms) + (underflow)``, rounded up (lemma float-gram):
    ``outer`` bounds the sum of the monomials' magnitudes, ``products`` counts the products, ``factors`` (weights,
    first and second vectors' magnitudes) and the forms' largest entries bound what multiplies an underflow."""
    if not np.all(np.isfinite(S)):
        raise NotCertifiedError("Gram form", "finite Gram forms in floats", "an overflow",
                                "the states are too large for the float route")
    top = [float(np.max(A, initial=0.0)) for A in factors]
    later = IntervalArray(1.0 + top[0]).square() * IntervalArray(1.0 + top[1]) * IntervalArray(1.0 + top[2]) \
        * (keys_top + 1.0) * (outputs_top + 1.0)
    underflow = (later * IntervalArray(float(products) * SMALLEST_SUBNORMAL) * (1.0 + gamma_bound(m))).hi
    relative = gamma_bound(m) if rounding else 0.0
    return (IntervalArray(S) + outer * relative + radii_terms + IntervalArray(underflow)).hi


def query_squares(K: IntervalArray, V: IntervalArray, F: IntervalArray, P: IntervalArray, gram: IntervalArray,
                  rounding: bool = True) -> np.ndarray:
    """Upper bounds (B, H, n) on ``S_hi = sum_jl p_ij p_il (k_j Gamma_h k_l^T) (v_j - f_i).(v_l - f_i)`` over the
    boxes K (B, H, n, d_k), V, F (B, H, n, d_v), P (B, H, n, n) and ``gram`` (H, d_k, d_k) (``Gamma_h = W_Q^hT W_Q^h``
    for the query part of lemma point-attention), by lemma float-gram with the sum over the keys j, l in place of the
    heads': ``x_j = |p|_ij ||k_j|| (||v_j|| + ||f_i||)``, one block norm ``psi_h`` per head, so every form is
    ``psi_h (sum_j x_j)(sum_l y_l)``; ``m = 2 d_k + d_v + n^2 + 8``.  ``rounding=False`` as in
    :func:`key_path_squares`."""
    B, H, n, d_k = K.shape
    d_v = V.shape[-1]
    k, v, f, p, G = K.mid, V.mid, F.mid, P.mid, gram.mid
    keys = np.matmul(np.matmul(k, G[None]), k.swapaxes(2, 3))                                   # (B, H, j, l)
    cross = np.matmul(f, v.swapaxes(2, 3))                                                      # (B, H, i, l): f_i.v_l
    values = np.matmul(v, v.swapaxes(2, 3))[:, :, None] - cross[..., None, :] - cross[..., :, None] \
        + np.sum(f * f, axis=-1)[..., None, None]                                               # (B, H, i, j, l)
    S = np.einsum("bhij,bhil,bhjl,bhijl->bhi", p, p, keys, values)
    top = IntervalArray(_block_norms(gram.magnitude[:, :, None, :])[:, 0, None, None])        # (H, 1, 1): psi_h
    spread = IntervalArray(_block_norms(gram.rad[:, :, None, :])[:, 0, None, None])
    (key_big, key_rad), (value_big, value_rad), (mean_big, mean_rad) = (_norms(A) for A in (K, V, F))   # (B, H, j)
    vectors = value_big.expand(2) + mean_big.expand(3)                                          # (B, H, i, j)
    vectors_rad = value_rad.expand(2) + mean_rad.expand(3)
    weights, weights_rad = IntervalArray(P.magnitude), IntervalArray(P.rad)
    x = weights * key_big.expand(2) * vectors
    moved = weights_rad * key_big.expand(2) * vectors + weights * key_rad.expand(2) * vectors \
        + weights * key_big.expand(2) * vectors_rad
    total, total_moved = x.sum(axis=-1), moved.sum(axis=-1)                                     # (B, H, i)
    outer = top[..., 0] * total.square()
    m = 2 * d_k + d_v + n * n + 8
    error = top[..., 0] * total * total_moved * 2.0 + spread[..., 0] * total.square()
    products = n * n * (d_k * d_k + d_k + 3 + 2 * d_v) + n * d_v
    keys_top = IntervalArray(float(np.max(key_big.hi, initial=0.0))).square() * IntervalArray(float(np.max(top.hi)))
    outputs_top = IntervalArray(float(np.max(vectors.hi, initial=0.0))).square()
    return _a_posteriori(S, outer, error, m, products, (P.magnitude, K.magnitude, np.maximum(V.magnitude, F.magnitude)),
                         keys_top, outputs_top, rounding)
