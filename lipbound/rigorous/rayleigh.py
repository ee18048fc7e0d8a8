"""Certified lower bounds from Rayleigh quotients: a float vector found by power steps, its quotient evaluated in
interval arithmetic with the Gram matrix's rounding subtracted (any vector is sound; the steps only bring the
bound close).  Beside :mod:`.linalg` (which :mod:`.arrays` is built on) because it needs interval arrays."""

from __future__ import annotations

import math

import numpy as np

from ..errors import WeightsError
from .arrays import IntervalArray
from .elementwise import SMALLEST_SUBNORMAL, gamma_bound
from .intervals import IV, interval, lower
from .linalg import RowGram

__all__ = ["row_gram_norm_lower", "sandwich_top_bounds"]


def row_gram_norm_lower(gram: RowGram, scales, rows=None, steps: int = 12) -> float:
    """Certified lower bound on ``||diag(scales) 2^e A_rows||_2``, the norm of a point of the enclosure (so below
    every :meth:`RowGram.norm_upper` of the same scales), from a Rayleigh quotient: for any vector v and ``w = D v``,

        ||D A_R||_2^2 >= w^T A A^T w / v^T v >= (w^T G w - gamma_k (sum_r |w_r| ||A_r||)^2 - k eta (sum_r |w_r|)^2)
                                               / v^T v,

    since ``|G - A A^T| <= gamma_k |A||A|^T + k eta`` entrywise and ``|A_r| . |A_c| <= ||A_r|| ||A_c||``; the form
    evaluated in interval arithmetic, v from ``steps`` float power steps on ``D G D`` (any v is sound; the steps
    only bring the bound close).  One product of the Gram matrix per step, no factorisation: it decides where a
    route whose norm would lose anyway need not be factorised.  The factors are scaled by a power of two rounded
    down (the norm grows with every factor)."""
    rows = np.arange(gram.m) if rows is None else np.asarray(rows, dtype=np.int64).ravel()
    s = np.asarray(scales, dtype=np.float64).ravel()
    if s.shape != rows.shape or not np.all(s >= 0) or not np.all(np.isfinite(s)):
        raise WeightsError("scales", f"{rows.size} finite non-negative row scales", f"shape {s.shape}",
                           "pass one row scale per row")
    if not np.any((s > 0) & gram.nonzero[rows]):
        return 0.0
    shift = math.frexp(float(np.max(s)))[1]
    t = np.ldexp(s, -shift)
    inexact = np.ldexp(t, shift) != s
    t[inexact] = np.nextafter(t[inexact], 0.0)
    every = rows.size == gram.m and np.array_equal(rows, np.arange(gram.m))
    G = gram.gram if every else gram.gram[np.ix_(rows, rows)]
    v = t * np.sqrt(gram.squares[rows])
    for _ in range(steps):
        v = t * (G @ (t * v))
        size = float(np.linalg.norm(v))
        if not (math.isfinite(size) and size > 0):
            return 0.0
        v /= size
    w = IntervalArray(t) * IntervalArray(v)
    form = (w * w.matmul(G)).sum(axis=-1)
    sizes = IntervalArray(w.magnitude)
    rounding = interval(gamma_bound(gram.k)) * interval(float((sizes * IntervalArray(gram.squares[rows]).sqrt())
                                                         .sum(axis=-1).hi)) ** 2 \
        + interval(gram.k) * interval(SMALLEST_SUBNORMAL) * interval(float(sizes.sum(axis=-1).hi)) ** 2
    top = interval(float(form.lo)) - rounding
    length = float((IntervalArray(v) * IntervalArray(v)).sum(axis=-1).hi)
    if not lower(top) > 0:
        return 0.0
    return lower(IV.sqrt(top / interval(length)) * IV.mpf(2) ** (shift + gram.exponent))


def sandwich_top_bounds(outer: IntervalArray, inner: IntervalArray, steps: int = 12) -> tuple[float, float]:
    """``(lower, estimate)`` for ``lambda_max(S H S^T)`` of the enclosed ``S`` (d, m) and ``H`` (m, m): ``lower``
    is certified below ``lambda_max`` of every such product of points of the enclosures, so below every certified
    upper bound of the same product; ``estimate`` is a float guess.

    For any vector v, ``lambda_max(S H S^T) >= w^T H w / v^T v`` with ``w = S^T v``; the form is evaluated in interval
    arithmetic (it encloses ``w^T H w`` for every point of S and H), v from ``steps`` float power steps on the
    midpoints (any v is sound; the steps only bring the bound close).  Products by ``S`` and ``H`` only: it decides
    where a side whose ``d x d`` product would lose anyway need not be formed."""
    S, H = outer._as_operand()[0], inner._as_operand()[0]   # (the midpoints the products by them read again)
    v = np.random.default_rng(0).standard_normal(S.shape[0])   # (a fixed start: the same bounds on every run)
    for _ in range(steps):
        v = S @ (H @ (S.T @ v))
        size = float(np.linalg.norm(v))
        if not (math.isfinite(size) and size > 0):
            return -math.inf, 0.0
        v /= size
    w = outer.swapaxes(0, 1).matmul(v[:, None])                          # (m, 1)
    form = (w * inner.bmm(w)).sum(axis=0)
    length = (IntervalArray(v) * IntervalArray(v)).sum(axis=-1)
    quotient = interval((float(form.lo.item()), float(form.hi.item()))) \
        / interval((float(length.lo), float(length.hi)))
    estimate = float(v @ (S @ (H @ (S.T @ v))))
    return lower(quotient), estimate
