"""Steps 6 and 7 of :mod:`.rotary` for one head: its rows' query and key parts split, row by row
(:func:`split_head_rows`), and on the spans of ``Pi W_Q`` and ``Pi W_K`` apart (:func:`_rows_apart`).  The proofs are
in :mod:`.rotary`'s module docstring; the constants come from a :class:`~.rotary.PositionalHeadBounds`.
"""

from __future__ import annotations

import math

import numpy as np

from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, gram_norm_upper, is_psd_certified
from .joint import _golden_min
from .layer import coupled_rows, ridged_root, row_factors, split_rows

__all__ = ["query_inverse", "row_splits", "split_head_rows"]


def split_head_rows(bounds, b, apart: bool = True):
    """``||S + cov||`` of the head whose constants are ``bounds`` (a :class:`~.rotary.PositionalHeadBounds`) with the
    rows' query and key parts split (step 6 of :mod:`.rotary`): the query part ``b`` per row with two keys or more,
    the key part per row from step 2b (or step 2 with a centre or a query bias); with ``apart`` also step 7 (the query
    part on the span of ``Pi W_Q``, the key part on that of ``Pi W_K``), the smaller; an interval."""
    rows = bounds.rows
    rho2 = bounds.spread ** 2
    gains = bounds.offset_gains() if bounds.column_key is not None else None
    beta2 = IV.mpf(bounds.key_gain.value) ** 2
    has_query, t = row_splits(bounds, b, gains)
    factors = row_factors(t)
    norms = bounds.column_norms(factors) if gains is not None else None
    if norms is not None:
        columns = [rho2 * (bounds.r * interval(v)) ** 2 for v in norms]
    else:
        columns = [rho2 * beta2 * sum((IV.mpf(upper(bounds.row_nu(i) * interval(float(factors[i]))))
                                      for i in range(rows.n) if rows.visible[i, j]), IV.mpf(0))
                   for j in range(rows.n)]
    aligned = coupled_rows(b, has_query, t, columns)
    apart = _rows_apart(bounds, b, has_query, t) if gains is not None and apart else None
    return apart if apart is not None and upper(apart) < upper(aligned) else aligned


def row_splits(bounds, b, gains: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """``(has_query, t)``: which rows have a query part (two keys or more) and the splits ``t_i`` of step 6 found in
    floats (:func:`~.layer.split_rows`) from each row's key charge per key, ``rho^2 nu_i r^2 gain_Delta^2`` with the
    offsets' gains ``gains`` (:meth:`~.rotary.PositionalHeadBounds.offset_gains`), or ``rho^2 nu_i beta^2`` without;
    kept in ``bounds.splits`` (steps 6, 7 and 9 use the same splits)."""
    key = (float(upper(b)), gains is not None)
    if key in bounds.splits:
        return bounds.splits[key]
    rows = bounds.rows
    has_query = rows.key_counts >= 2
    nus = np.array([float(upper(bounds.row_nu(i))) for i in range(rows.n)])
    rho2, r2 = float(upper(bounds.spread ** 2)), float(upper(bounds.r ** 2))
    beta2 = float(upper(IV.mpf(bounds.key_gain.value) ** 2))
    proxy = np.zeros((rows.n, rows.n))
    for i in range(rows.n):
        for j in range(rows.n):
            if rows.visible[i, j]:
                proxy[i, j] = rho2 * nus[i] * (r2 * gains[j - i] ** 2 if gains is not None else beta2)
    bounds.splits[key] = has_query, split_rows(np.where(has_query, float(upper(b ** 2)), 0.0), proxy)
    return bounds.splits[key]


def query_inverse(gram_q: Enclosure) -> Enclosure | None:
    """An exact float matrix ``C >= (Z^T Z)^-1`` for the enclosed Gram matrix ``gram_q`` of ``Z = Pi W_Q`` (step 7 of
    :mod:`.rotary`): a float inverse enlarged by ``1 + 1e-9`` (or more), accepted when ``[[C, I], [I, G]] >= 0`` is
    certified (Schur complement); None when G is singular or no enlargement was certified."""
    k = gram_q.shape[0]
    try:
        inverse = np.linalg.inv(gram_q.mid)
    except np.linalg.LinAlgError:
        return None
    inverse = 0.5 * (inverse + inverse.T)
    for inflate in (1e-9, 1e-6, 1e-3):
        trial = Enclosure.exact(inverse * (1 + inflate))
        schur = Enclosure(np.block([[trial.mid, np.eye(k)], [np.eye(k), gram_q.mid]]),
                          np.block([[trial.rad, np.zeros((k, k))], [np.zeros((k, k)), gram_q.rad]]))
        if is_psd_certified(schur.sym()):      # [[C, I], [I, G]] >= 0 with G > 0: C >= G^-1
            return trial
    return None


def _rows_apart(bounds, b, has_query: np.ndarray, t_start: np.ndarray):
    """Step 7 of :mod:`.rotary`: ``(max_j lambda_max((1 + t_j) b_j^2 Z C Z^T + rho^2 r^2 X Y_j Y_j^T
    X^T))^(1/2)`` with ``Z = Pi W_Q``, ``X = Pi W_K``, ``C >= (Z^T Z)^-1`` (certified), ``Y_j Y_j^T = sum_{i sees j}
    (1 + 1/t_i) nu_i sigma^2 R^T W_Q^T M M^T W_Q R``; the ``t_i`` a multiple of ``t_start`` found in floats.
    An interval, or None when ``Z^T Z`` is singular or a bound was not certified."""
    rows, n = bounds.rows, bounds.rows.n
    C = query_inverse(bounds.gram("query_left"))
    if C is None:
        return None
    k = C.shape[0]
    gram = bounds.gram("query_and_key_left")                                        # F^T F, F = [Z, X]
    queries = bounds.gram("queries_shaped")
    nus = [float(upper(bounds.row_nu(i))) for i in range(n)]
    forms = {(i, j): (bounds.rotations[j - i].T @ queries @ bounds.rotations[j - i]).sym()
             for i in range(n) for j in range(n) if rows.visible[i, j] and nus[i] > 0}
    scale2 = float(upper(bounds.spread ** 2 * bounds.r ** 2))
    b2 = float(upper(b ** 2))
    root = ridged_root(gram.mid)

    def middles(t: np.ndarray) -> list[Enclosure]:
        factors = row_factors(t)
        out = []
        for j in range(n):
            mid, rad = np.zeros((2 * k, 2 * k)), np.zeros((2 * k, 2 * k))
            if has_query[j]:
                top = C.scale(interval(float(upper((1 + interval(float(t[j]))) * b ** 2))))
                mid[:k, :k], rad[:k, :k] = top.mid, top.rad
            for i in range(n):
                form = forms.get((i, j))
                if form is not None:
                    part = form.scale(interval(float(upper(interval(nus[i]) * interval(float(factors[i]))
                                                           * interval(scale2)))))
                    mid[k:, k:] += part.mid
                    rad[k:, k:] += part.rad
            out.append(Enclosure(mid, rad))
        return out

    # floats, to choose t: the query block and each row's key forms seen through the Cholesky factor of F^T F
    query_float = root[:k].T @ C.mid @ root[:k]
    key_float = {ij: root[k:].T @ form.mid @ root[k:] for ij, form in forms.items()}

    def largest(log_s: float) -> float:
        t = t_start * math.exp(log_s)
        worst = 0.0
        for j in range(n):
            total = (1 + t[j]) * b2 * query_float if has_query[j] else 0.0
            for i in range(n):
                if (i, j) in key_float:
                    total = total + nus[i] * (1 + 1 / t[i]) * scale2 * key_float[(i, j)]
            if not isinstance(total, float):
                worst = max(worst, float(np.linalg.eigvalsh(total)[-1]))
        return worst

    t = t_start * math.exp(_golden_min(largest, -6.0, 6.0, iterations=16))
    tops = []
    for middle in middles(t):
        if not np.any(middle.mid):
            tops.append(0.0)
            continue
        ridge = 1e-12 * float(np.max(np.abs(middle.mid)))
        lifted = Enclosure(middle.mid + ridge * np.eye(2 * k), middle.rad).sym()   # only larger
        tops.append(gram_norm_upper(gram, lifted))
    if not all(math.isfinite(v) for v in tops):
        return None
    return IV.mpf(max(tops))
