"""Certified spectral norms of many small float matrices at once (a stack, batched BLAS and LAPACK).

For a stack F (T, m, k) of float matrices (taken exactly), :func:`spectral_norms_upper` returns per matrix an
upper bound on ``||F_t||_2`` that rounding cannot break, with one Gram product, a few power steps and one
Cholesky factorisation per matrix -- no eigendecomposition:

* ``C = fl(F^T F)`` (upper triangle mirrored), ``|C - F^T F| <= gamma_m |F|^T |F| + m eta`` entrywise (Higham,
  eq. 3.13), so ``||C - F^T F||_2 <= gamma_m ||F||_F^2 + k m eta``;
* a level ``t`` a little above the power estimate of ``lambda_max(C)``: if the floating-point Cholesky
  factorisation of ``B = fl(t I - C)`` runs to completion, ``L L^T = B + Delta`` with ``|Delta| <= gamma_{k+1}
  |L| |L|^T`` (Higham, *Accuracy and Stability*, Thm 10.3; ``k (k + 2) eta`` more for underflow), hence
  ``lambda_min(B) >= -gamma_{k+1} ||L||_F^2``; ``fl(t - C_ii)`` moved the diagonal by at most
  ``u |t - C_ii|``, so ``lambda_max(C) <= t + gamma_{k+1} ||L||_F^2 + u max|B_ii| + k (k + 2) eta`` (Weyl);
* ``||F||_2^2 = lambda_max(F^T F) <= lambda_max(C) + ||C - F^T F||_2``.

Every scalar is assembled in outward-rounded arithmetic.  A matrix whose factorisation fails at every level
tried gets its Frobenius norm (always an upper bound).
"""

from __future__ import annotations

import numpy as np

from .arrays import IntervalArray
from .elementwise import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, gamma_bound, up_nonnegative

__all__ = ["spectral_norms_upper", "interval_spectral_norms_upper"]

_ETA = SMALLEST_SUBNORMAL


def _squares_upper(F: np.ndarray) -> np.ndarray:
    """Upper bounds on ``||F_t||_F^2`` (T,): ``fl(sum x^2)`` within ``gamma_{mk+1}`` plus underflow."""
    count = F.shape[1] * F.shape[2]
    total = np.einsum("tij,tij->t", F, F)
    return up_nonnegative((total + count * _ETA) * (1 + 2 * gamma_bound(count + 2)))


def _power_estimate(C: np.ndarray, steps: int) -> np.ndarray:
    """Float estimates of ``lambda_max`` of the symmetric PSD stack C (T, k, k) (no guarantee: they place the level)."""
    v = np.ones(C.shape[:2]) + 0.01 * np.arange(C.shape[1])
    for _ in range(steps):
        v = np.matmul(C, v[..., None])[..., 0]
        v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-300)
    return np.einsum("ti,tij,tj->t", v, C, v)


def _levels_certified(C: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Upper bounds on ``lambda_max(C_t)`` from Cholesky factorisations at ``levels`` (inf where one fails)."""
    T, k, _ = C.shape
    B = -C
    index = np.arange(k)
    B[:, index, index] = levels[:, None] - C[:, index, index]
    out = np.full(T, np.inf)
    try:
        factors = np.linalg.cholesky(B)
        good = np.all(np.isfinite(factors), axis=(1, 2))
    except np.linalg.LinAlgError:  # one failed: factor one by one
        factors, good = np.zeros_like(B), np.zeros(T, dtype=bool)
        for t in range(T):
            try:
                factors[t] = np.linalg.cholesky(B[t])
                good[t] = bool(np.all(np.isfinite(factors[t])))
            except np.linalg.LinAlgError:
                pass
    loss = gamma_bound(k + 1) * _squares_upper(factors) + np.max(np.abs(B[:, index, index]), axis=1) \
        * UNIT_ROUNDOFF + k * (k + 2) * _ETA
    bound = up_nonnegative((levels + up_nonnegative(loss * (1 + 8 * UNIT_ROUNDOFF))) * (1 + 4 * UNIT_ROUNDOFF))
    out[good] = bound[good]
    return out, good


def spectral_norms_upper(F: np.ndarray, steps: int = 12, margin: float = 2e-3) -> np.ndarray:
    """Certified upper bounds (T,) on ``||F_t||_2`` for a stack of float matrices F (T, m, k) (module docstring);
    the level sits ``margin`` (relative) above the power estimate, raised fourfold while a factorisation fails.
    Each matrix is scaled by a power of two to a largest entry in [1/2, 1) first (no overflow or underflow in its
    Gram matrix); an entry the scaling pushes below the normal range moves by at most ``eta``, so
    ``sqrt(m k) eta`` is added before scaling back."""
    F = np.asarray(F, dtype=np.float64)
    T, m, k = F.shape
    if m < k:
        F = F.swapaxes(1, 2)
        m, k = k, m
    exponents = np.frexp(np.max(np.abs(F), axis=(1, 2), initial=0.0))[1]
    scaled = _unit_norms_upper(np.ldexp(F, -exponents[:, None, None]), steps, margin)
    scaled = up_nonnegative((scaled + np.sqrt(float(m * k)) * 2.0 * _ETA) * (1 + 4 * UNIT_ROUNDOFF))
    out = np.ldexp(scaled, exponents)
    inexact = np.ldexp(out, -exponents) < scaled     # rounded down below the normal range
    out[inexact] = np.nextafter(out[inexact], np.inf)
    return out


def _unit_norms_upper(F: np.ndarray, steps: int, margin: float) -> np.ndarray:
    """:func:`spectral_norms_upper` for a stack (T, m, k), m >= k, whose entries are at most 1 in size."""
    T, m, k = F.shape
    squares = _squares_upper(F)
    C = np.matmul(F.swapaxes(1, 2), F)
    C = np.triu(C) + np.triu(C, 1).swapaxes(1, 2)
    gram_error = up_nonnegative((gamma_bound(m) * squares + k * m * _ETA) * (1 + 4 * UNIT_ROUNDOFF))
    estimate = np.maximum(_power_estimate(C, steps), 0.0)
    top = np.full(T, np.inf)
    pending = np.ones(T, dtype=bool)
    for attempt in range(6):
        rows = np.flatnonzero(pending)
        if rows.size == 0:
            break
        levels = estimate[rows] * (1 + margin * 4.0 ** attempt) + 1e-300
        bounds, good = _levels_certified(C[rows], levels)
        top[rows[good]] = bounds[good]
        pending[rows[good]] = False
    squared = up_nonnegative((top + gram_error) * (1 + 4 * UNIT_ROUNDOFF))
    norms = np.nextafter(np.sqrt(squared), np.inf)
    frobenius = np.nextafter(np.sqrt(squares), np.inf)
    return np.minimum(norms, frobenius)


def interval_spectral_norms_upper(matrices: IntervalArray) -> np.ndarray:
    """Certified upper bounds on the spectral norms of a stack of interval matrices (an ``IntervalArray`` of shape
    (..., rows, columns)): the midpoints' (:func:`spectral_norms_upper`) plus the radii's Frobenius norms (Weyl),
    shape (...)."""
    lead, mid = matrices.shape[:-2], matrices.mid
    radius = IntervalArray((matrices - IntervalArray(mid)).magnitude.reshape(lead + (-1,))).norm_upper()
    middle = spectral_norms_upper(mid.reshape((-1,) + matrices.shape[-2:])).reshape(lead)
    return (IntervalArray(middle) + IntervalArray(radius)).hi
