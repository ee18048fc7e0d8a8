r"""Step 9 of :mod:`lipbound.numeric.sdp.rotary`: a row's key part centred over its keys, which couples the columns
of the row split (docs/mathematics.md, section 14, item 8).

**Why.**  Steps 2b and 6 bound row i's key part through ``Var_p(z) <= 2 sum_j p_j (1 - p_j) z_j^2 <= (1/2) sum_j
z_j^2`` (``z_j = e_j . g_ij``, the score change of key j as that key moves), one term per key: the row is charged
for every key that moves, as if each could carry weight 1/2 at once.  A variance sees only the spread of z:

    Var_p(z) <= (max_j z_j - min_j z_j)^2 / 4 <= (z_a - c)^2 / 2 + (z_b - c)^2 / 2 <= (1/2) sum_j (z_j - c)^2

for every distribution p over the row's keys and every c (a and b the keys where z is largest and smallest), so
with ``c`` the mean of z over the row's ``N_i`` keys, ``Var_p(z) <= (1/2) sum_j (z_j - zbar)^2``.  It is the plain
bound when one key moves against another, and smaller when several keys of a row move their scores alike (one
key alone: ``(1/2) (1 - 1/N_i) z_j^2``).

**The bound.**  No soft-cap (the factors ``phi'_ij`` would differ per key), no centre and no query bias, so that
``z_j = w_i . M^T A_{j-i} e_j`` with ``||w_i|| <= r``.  For unit y, ``y^T cov_i = Cov_p(delta, z)`` with ``Var_p(delta)
<= rho^2`` (step 2), and with ``c_j = M^T A_{j-i} e_j - (1/N_i) sum_l M^T A_{l-i} e_l``,

    ||cov_i||^2 <= rho^2 (1/2) sum_j (w_i . c_j)^2 <= rho^2 r^2 (1/2) sum_j ||c_j||^2
                 = rho^2 r^2 (1/2) sum_{j, l in V_i} (delta_jl - 1/N_i) u_j^T R_{j-i}^T Q R_{l-i} u_l,

``u_j = (Pi W_K)^T e_j``, ``Q = sigma^2 W_Q^T M M^T W_Q``: a quadratic form in the moves of all the row's keys
together (step 2b's form is its diagonal).  A row whose weights are confined (``nu_i < 1/2``) keeps step 2b's
``nu_i`` on the diagonal.  Steps 6 and 7 then give, as there,

    ||S + cov||_F^2 <= sum_i (1 + t_i) b_i^2 ||P_Q e_i||^2 + sum_i (1 + 1/t_i) ||cov_i||^2,

``||P_Q e||^2 <= e^T Z C Z^T e`` (step 7).  The right side is ``E^T (I (x) F) D (I (x) F)^T E`` with ``F = [Pi W_Q,
Pi W_K]`` (each token's ``2 d_k`` coordinates) and D the block matrix of the query forms ``(1 + t_j) b_j^2 C`` on
the diagonal and the rows' centred key forms, PSD.  For any L with ``L L^T >= F^T F`` (certified),
``lambda_max(D^(1/2) (I (x) F^T F) D^(1/2)) <= lambda_max((I (x) L)^T D (I (x) L))``, an ``n 2 d_k`` square
matrix whose top eigenvalue is certified by one Cholesky factorisation
(:func:`~lipbound.rigorous.linalg.lambda_max_upper_large`).  The ``t_i`` are step 6's times one factor ``e^s`` chosen
in floats: the matrix is ``A + e^s B + e^-s C`` with B, C PSD, so its top eigenvalue is convex in s, and a bisection on
the sign of its slope at the top eigenvector finds the minimum (also at the kink where the query-led and the key-led
eigenvalues cross).  At the same ``t_i`` the form is step 7's less a PSD part, so where it applies step 7 is not
formed.

**Merged rows** (step 10 of :mod:`.rotary`).  For a row i whose own key is merged into its query part (step 8), row
i's form leaves out key i (``z'_i = 0``; the inequality above holds for every vector, so the principal part of the
row's form on the other keys majorises ``Var z'``), and token i's query block is ``(1 + t_i) b'^2 C_F`` in the
coordinates ``F^T e_i``, ``C_F >= (F^T F)^-1`` certified as step 7's C, since the merged query part reads ``e_i``
through ``W_Q^T e_i`` and ``W_K^T e_i``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse.linalg import eigsh

from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, lambda_max_upper_large, weighted_sum
from .layer import gram_factor, row_factors
from .rotary_rows import query_inverse, row_splits

__all__ = ["centred_head_rows"]


def centred_head_rows(bounds, b, splits: np.ndarray | None = None, merged: frozenset = frozenset(),
                      b_merged=None, estimate: bool = False, move: bool = False):
    """``||S + cov||`` of the head whose constants are ``bounds`` (a :class:`~.rotary.PositionalHeadBounds`) with each
    row's key part centred over its keys (module docstring), an interval; None with a soft-cap, a centre or a query
    bias, a singular ``Z^T Z``, or a bound not certified.  ``splits``: the ``t_i`` to take as they are (default:
    step 6's times one factor chosen in floats).  ``merged``: the rows whose own key joins their query part (step 8,
    "Merged rows" in the module docstring), with the query term ``b_merged`` (``b'``, an interval); with ``estimate``
    the float value at the chosen splits, never a bound, and with ``move`` as well ``(value, E, t)``: E (n, d) the
    form's worst move, unit, each token's ``e_j`` the least-norm solution of ``F^T e_j = L v_j`` (v the top
    eigenvector), so that the form at E and the chosen splits t is the value squared (``L L^T = F^T F`` up to the
    enlargement of :func:`~.layer.gram_factor`)."""
    head, rows, n = bounds.head, bounds.rows, bounds.rows.n
    if rows.softcap is not None or bounds.centred(head.W_Q, head.b_Q) is not None:
        return None
    C = query_inverse(bounds.gram("query_left"))
    L = gram_factor(bounds.gram("query_and_key_left"))                                 # L L^T >= F^T F, F = [Z, X]
    if C is None or L is None:
        return None
    k = C.shape[0]
    has_query, t_start = row_splits(bounds, b, bounds.offset_gains())
    size = 2 * k
    top = (Enclosure.exact(L[:k].T) @ C @ Enclosure.exact(L[:k])).sym()              # the query block, L^T diag(C, 0) L
    merged = frozenset(i for i in merged if has_query[i])
    if merged:
        C_both = query_inverse(bounds.gram("query_and_key_left"))                     # C_F >= (F^T F)^-1
        if C_both is None or b_merged is None:
            return None
        top_both = (Enclosure.exact(L.T) @ C_both @ Enclosure.exact(L)).sym()       # L^T C_F L: ||P_F e||^2
    key_rows = Enclosure.exact(L[k:])                                                 # (k, 2k)
    queries = bounds.gram("queries_shaped")                                          # sigma^2 W_Q^T M M^T W_Q
    turned = {delta: R @ key_rows for delta, R in bounds.rotations.items()}
    weighed = {delta: queries @ T for delta, T in turned.items()}
    products: dict = {}

    def product(first: int, second: int) -> Enclosure:
        """``(R_first W)^T Q (R_second W)``, each pair of offsets once."""
        if (first, second) not in products:
            if (second, first) in products:
                products[(first, second)] = products[(second, first)].T
            else:
                products[(first, second)] = turned[first].T @ weighed[second]
        return products[(first, second)]

    # each row's form on pairs of its keys: (1/2)(delta_jl - theta_i) with a dyadic theta_i <= 1/N_i (a smaller theta
    # only enlarges the PSD form I - theta 11^T), or nu_i delta_jl for a row whose weights are confined (nu_i < 1/2)
    forms: dict = {}                                   # row i -> (keys, weight, theta or None)
    for i in range(n):
        keys = [j for j in range(n) if rows.visible[i, j]]
        nu = float(upper(bounds.row_nu(i)))
        if len(keys) >= 2 and nu > 0:
            centred = nu >= 0.5
            forms[i] = (keys, 0.5 if centred else nu,
                        math.floor(2.0 ** 20 / len(keys)) / 2.0 ** 20 if centred else None)
    scale2 = bounds.spread ** 2 * bounds.r ** 2
    b2 = b ** 2

    # floats, to choose one factor e^s of the t_i: with t = t_start e^s the matrix is A + e^s B + e^-s C, B the query
    # blocks at b^2 t_start, C the rows' forms at rho^2 r^2 / t_start, A both at factor 1
    b2_float, scale2_float = float(upper(b2)), float(upper(scale2))
    b2_merged_float = float(upper(b_merged ** 2)) if merged else 0.0
    fixed, rising, falling = (np.zeros((size * n, size * n)) for _ in range(3))
    for i, (keys, weight, theta) in forms.items():
        for j in keys:
            for l in keys:
                coefficient = (1.0 if j == l else 0.0) - (0.0 if theta is None else theta)
                if coefficient and not (i in merged and i in (j, l)):
                    part = product(j - i, l - i).mid * (scale2_float * weight * coefficient)
                    fixed[j * size:(j + 1) * size, l * size:(l + 1) * size] += part
                    falling[j * size:(j + 1) * size, l * size:(l + 1) * size] += part / t_start[i]
    for j in range(n):
        if has_query[j]:
            query_float = (b2_merged_float * top_both.mid) if j in merged else (b2_float * top.mid)
            rising[j * size:(j + 1) * size, j * size:(j + 1) * size] = t_start[j] * query_float
            fixed[j * size:(j + 1) * size, j * size:(j + 1) * size] += query_float

    # lambda_max(A + e^s B + e^-s C) is convex in s, and at the top eigenvector v of s its slope is e^s v^T B v - e^-s
    # v^T C v: bisection on the slope's sign, the smallest value kept
    best, best_s, low, high, vector = math.inf, 0.0, -3.0, 3.0, np.ones(size * n)
    for _step in range(10):
        s = 0.5 * (low + high)
        values, vectors = eigsh(fixed + math.exp(s) * rising + math.exp(-s) * falling, k=1, which="LA", tol=1e-6,
                                v0=vector)
        vector = vectors[:, 0]
        if values[0] < best:
            best, best_s = float(values[0]), s
        slope = math.exp(s) * float(vector @ rising @ vector) - math.exp(-s) * float(vector @ falling @ vector)
        low, high = (low, s) if slope > 0 else (s, high)
    if estimate and move:
        v = eigsh(fixed + math.exp(best_s) * rising + math.exp(-best_s) * falling, k=1, which="LA", tol=1e-9,
                  v0=vector)[1][:, 0]
        F = np.concatenate([bounds.query_left.mid, bounds.key_left.mid], axis=1)          # (d, 2 d_k)
        E = np.linalg.lstsq(F.T, L @ v.reshape(n, size).T, rcond=None)[0].T           # F^T e_j = L v_j
        return math.sqrt(max(best, 0.0)), E / np.linalg.norm(E), t_start * math.exp(best_s)
    if estimate:
        return math.sqrt(max(best, 0.0))
    t = np.asarray(splits, dtype=float) if splits is not None else t_start * math.exp(best_s)
    factors = row_factors(t)
    # certified: row i's form times u_i >= (1 + 1/t_i) rho^2 r^2 weight_i as exact floats, its coefficients a_diag on
    # the diagonal and a_off off it with a_off >= -u_i theta_i and a_diag - a_off >= u_i, so that a_diag I + a_off (11^T
    # - I) >= u_i (I - theta_i 11^T): the form only grows
    entries: dict = {}                                 # (j, l) -> [(weight, offset pair)]
    for i, (keys, weight, theta) in forms.items():
        u = interval(float(factors[i])) * scale2 * interval(weight)
        if theta is None:
            on, off = float(upper(u)), 0.0
        else:
            off = float(upper(-(u * interval(theta))))
            on = float(upper(u + interval(off)))
        for j in keys:
            for l in keys:
                if (j == l or off) and not (i in merged and i in (j, l)):
                    entries.setdefault((j, l), []).append((on if j == l else off, (j - i, l - i)))
    blocks: dict = {}
    for (j, l), terms in entries.items():
        parts = [product(*pair) for _, pair in terms]
        blocks[(j, l)] = weighted_sum([w for w, _ in terms], np.stack([p.mid for p in parts]),
                                      np.stack([p.rad for p in parts]))
    for j in range(n):
        if has_query[j]:
            query = (top_both.scale((1 + interval(float(t[j]))) * b_merged ** 2) if j in merged
                     else top.scale((1 + interval(float(t[j]))) * b2))
            blocks[(j, j)] = query if (j, j) not in blocks else blocks[(j, j)] + query
    mid, rad = np.zeros((size * n, size * n)), np.zeros((size * n, size * n))
    for (j, l), block in blocks.items():
        mid[j * size:(j + 1) * size, l * size:(l + 1) * size] = block.mid
        rad[j * size:(j + 1) * size, l * size:(l + 1) * size] = block.rad
    value = lambda_max_upper_large(Enclosure(mid, rad).sym(), estimate=best if splits is None else None)
    if not math.isfinite(value):
        return None
    return IV.sqrt(interval(max(value, 0.0)))
