"""Floating-point linear algebra with rigorous error bounds: enclosures, norms, eigenvalues.

An :class:`Enclosure` is a real matrix known to lie within ``mid +- rad`` entrywise.  Its
arithmetic bounds every rounding error with the classical model
``|fl(X Y) - X Y| <= gamma_k |X| |Y| + k eta`` (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., Thm 3.5 and eq. 3.13; ``gamma_k = k u / (1 - k u)``, ``u = 2^-53``,
``eta = 2^-1074`` the spacing of subnormals), which holds for every order of summation,
blocked or fused, so numpy's BLAS may be used freely.

Eigenvalue bounds (:func:`lambda_min_lower`): for any real L and shift s,
``lambda_min(S) >= s - ||S - s I - L L^T||_2`` because ``L L^T`` is positive semidefinite;
L comes from a floating Cholesky factorisation of ``mid - s I`` and the residual is bounded
rigorously, so the bound does not depend on how L was computed.  Spectral norms
(:func:`spectral_norm_bounds`) bracket ``||M||_2`` by ``sqrt(lambda_max)`` of an enclosed Gram
matrix above and ``||M v|| / ||v||`` below; :func:`product_norm_interval` brackets
``||X Y||_2`` without forming a product of low inner rank.  Every returned float is rounded
outward, and a test that rounding could flip reports failure (nothing is claimed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import numpy as np
from mpmath import libmp

from ..errors import AssumptionError, NotCertifiedError, WeightsError
from . import functions as F
from .elementwise import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, all_finite, gamma_bound
from .intervals import IV, _raw, interval, lower, point, upper

__all__ = ["Enclosure", "vector_norm_upper", "vector_norm_lower", "spectral_norm_bounds",
           "spectral_norm_upper", "spectral_norm_lower", "lambda_min_lower", "lambda_max_upper",
           "top_eigenvalue_bounds", "is_psd_certified", "psd_floor", "product_norm_interval",
           "product_norm_upper", "spectral_norm_upper_large", "lambda_max_upper_large", "RowGram", "gram_norm_interval",
           "gram_norm_upper", "weighted_sum"]

_U = UNIT_ROUNDOFF
_ETA = SMALLEST_SUBNORMAL


def _safe(k: int) -> float:
    """Inflation factor for a non-negative quantity computed with at most ``k + 8`` roundings."""
    return 1.0 + 2.0 * gamma_bound(k + 8)


def _fro_upper(X: np.ndarray) -> float:
    """Upper bound on the Frobenius norm of a float array (of its entries' absolute values), rounding
    included.

    Largest entry between ``2^-400`` and ``2^400`` in size: one BLAS dot product of the array with itself,
    ``|fl(x . x) - x . x| <= gamma_N x . x + N eta`` (any summation order; ``eta`` covers the squares
    that underflow), so ``||X||_F^2 <= (fl(x . x) + N eta) / (1 - gamma_N)``, inflated by ``_safe`` for
    the roundings of that formula.  Otherwise the entries are scaled by the largest one first."""
    X = np.asarray(X, dtype=float)
    largest = max(float(np.max(X)), -float(np.min(X))) if X.size else 0.0
    if largest == 0.0:
        return 0.0
    if 2.0 ** -400 <= largest <= 2.0 ** 400:  # no square overflows (nor a sum of 2^53 of them)
        flat = X.ravel()
        total = (float(np.dot(flat, flat)) + X.size * _ETA) * _safe(X.size)
        return math.nextafter(math.sqrt(total), math.inf)
    scaled = np.abs(X) / largest  # entries in [0, 1]: no overflow; each division rounds by at most u (relative)
    total = float(np.sum(scaled * scaled)) * (1 + 4 * _U)
    total += 4 * X.size * _ETA  # entries that underflowed in the division
    return math.nextafter(largest * math.sqrt(total * _safe(X.size)) * (1 + 4 * _U), math.inf) + _ETA


def _as_array(name: str, value, ndim: tuple = (2,)) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise WeightsError(name, "a real array", type(value).__name__, "pass a numpy array of floats") from None
    if array.ndim not in ndim:
        raise WeightsError(name, f"a {' or '.join(map(str, ndim))}-d array", f"shape {array.shape}",
                           "reshape it, e.g. v[:, None] for a column vector")
    if not np.all(np.isfinite(array)):
        raise WeightsError(name, "finite entries", "NaN or Inf", "check how the matrix was computed")
    return array


# Enclosures ------------------------------------------------------------------------------------
@final
@dataclass(frozen=True)
class Enclosure:
    """A real matrix known to lie within ``mid +- rad`` entrywise.

    Parameters
    ----------
    mid : ndarray
        Floating-point midpoint: a matrix, or a 0-d scalar.
    rad : ndarray
        Non-negative radius of the same shape.

    ``@``, ``+``, ``-``, :meth:`scale` and ``.T`` return enclosures of the exact result of the
    same operation on the enclosed matrices.
    """

    mid: np.ndarray
    rad: np.ndarray

    def __post_init__(self):
        mid = np.asarray(self.mid, dtype=np.float64)
        rad = np.broadcast_to(np.asarray(self.rad, dtype=np.float64), mid.shape).copy()
        if not (np.all(np.isfinite(mid)) and np.all(np.isfinite(rad))):
            raise NotCertifiedError("matrix", "finite floating-point entries", "NaN or Inf (an overflow)",
                                    "rescale the weights; the computation exceeds the float range")
        if np.any(rad < 0):
            raise WeightsError("rad", "a non-negative radius", "a negative entry", "build with Enclosure.exact")
        object.__setattr__(self, "mid", mid)
        object.__setattr__(self, "rad", rad)

    @classmethod
    def _trusted(cls, mid: np.ndarray, rad: np.ndarray) -> Enclosure:
        """An enclosure from float64 arrays of one shape, ``rad >= 0`` by construction: no copy, only the
        check that nothing overflowed."""
        if not (all_finite(mid) and all_finite(rad)):
            raise NotCertifiedError("matrix", "finite floating-point entries", "NaN or Inf (an overflow)",
                                    "rescale the weights; the computation exceeds the float range")
        out = object.__new__(cls)
        object.__setattr__(out, "mid", mid)
        object.__setattr__(out, "rad", rad)
        return out

    @classmethod
    def exact(cls, value) -> Enclosure:
        """A float matrix taken as exact; a vector becomes a column, a scalar stays 0-d."""
        array = _as_array("value", value, (0, 1, 2))
        if array.ndim == 1:
            array = array[:, None]
        return cls(array, np.zeros_like(array))

    @classmethod
    def concatenate(cls, parts, axis: int = 1) -> Enclosure:
        """The enclosures ``parts`` joined along ``axis`` (side by side by default): midpoints and radii joined
        alike, exactly."""
        return cls._trusted(np.concatenate([p.mid for p in parts], axis=axis),
                            np.concatenate([p.rad for p in parts], axis=axis))

    @classmethod
    def scalar(cls, value) -> Enclosure:
        """A 0-d enclosure of an interval or exact number (e.g. ``1 / sqrt(d_k)``)."""
        x = interval(value)
        lo, hi = lower(x), upper(x)
        mid = 0.5 * lo + 0.5 * hi
        rad = max(upper(interval(hi) - interval(mid)), upper(interval(mid) - interval(lo)))
        return cls(np.asarray(mid), np.asarray(rad))  # 0-d arrays (__post_init__ makes them float64)

    @property
    def shape(self) -> tuple:
        return self.mid.shape

    @property
    def T(self) -> Enclosure:
        return Enclosure(self.mid.T, self.rad.T)

    @property
    def is_exact(self) -> bool:
        return not np.any(self.rad)

    def __getitem__(self, index) -> Enclosure:
        return Enclosure(self.mid[index], self.rad[index])

    def __matmul__(self, other) -> Enclosure:
        other = _as_enclosure(other)
        if self.mid.ndim != 2 or other.mid.ndim != 2 or self.shape[1] != other.shape[0]:
            raise WeightsError("other", f"a matrix with {self.shape[-1]} rows", f"shape {other.shape}",
                               "check the order of the factors")
        k = self.shape[1]
        # midpoint-radius (Rump 1999): |X Y - fl(X_m Y_m)| <= |X_m| (gamma_k |Y_m| + Y_r) + X_r (|Y_m| + Y_r)
        # + (k + 4) eta (2 + max|X_m| + max|Y_m|) (underflow, also in gamma_k |.|); three products at most
        with np.errstate(over="ignore"):
            mid = self.mid @ other.mid
            left, right = np.abs(self.mid), np.abs(other.mid)
            largest = float(np.max(left, initial=0.0)) + float(np.max(right, initial=0.0))
            if other.is_exact:
                weight = left * gamma_bound(k)
                if not self.is_exact:
                    weight += self.rad
                spread = weight @ right
            else:
                inner = right * gamma_bound(k)
                inner += other.rad
                spread = left @ inner
                if not self.is_exact:
                    right += other.rad
                    spread += self.rad @ right
            rad = spread * _safe(k)
            rad += (k + 4) * _ETA * (2.0 + largest)
        return Enclosure._trusted(mid, rad)

    def _combine(self, other, sign: float) -> Enclosure:
        other = _as_enclosure(other)
        mid = self.mid + sign * other.mid
        return Enclosure(mid, (self.rad + other.rad + _U * np.abs(mid)) * _safe(2) + _ETA)

    def hadamard(self, other) -> Enclosure:
        """The entrywise product (shapes equal, or broadcast): ``|XY - fl(X_m Y_m)| <= |X_m| Y_r + X_r (|Y_m|
        + Y_r) + u |fl(X_m Y_m)| + eta``."""
        other = _as_enclosure(other)
        mid = self.mid * other.mid
        rad = np.abs(self.mid) * other.rad + self.rad * (np.abs(other.mid) + other.rad)
        rad += _U * np.abs(mid)
        rad *= _safe(3)
        rad += _ETA
        return Enclosure._trusted(np.asarray(mid, dtype=np.float64), np.asarray(rad, dtype=np.float64))

    def __add__(self, other) -> Enclosure:
        return self._combine(other, 1.0)

    def __sub__(self, other) -> Enclosure:
        return self._combine(other, -1.0)

    def __neg__(self) -> Enclosure:
        return Enclosure(-self.mid, self.rad)

    def scale(self, factor) -> Enclosure:
        """``factor * self`` for a float (exact), an interval, or a 0-d :class:`Enclosure`."""
        if isinstance(factor, Enclosure):
            s, r = float(factor.mid), float(factor.rad)
        elif isinstance(factor, float):
            s, r = factor, 0.0
        else:
            enclosed = Enclosure.scalar(factor)
            s, r = float(enclosed.mid), float(enclosed.rad)
        mid = s * self.mid
        rad = (abs(s) * self.rad + r * (np.abs(self.mid) + self.rad) + _U * np.abs(mid)) * _safe(3) + _ETA
        return Enclosure(mid, rad)

    def sym(self) -> Enclosure:
        """An exactly symmetric enclosure of a matrix known to be symmetric: the upper triangle
        mirrored (each computed entry encloses its exact value, and the exact matrix is symmetric)."""
        if _is_symmetric(self.mid) and _is_symmetric(self.rad):
            return self
        return Enclosure._trusted(_mirrored(self.mid), _mirrored(self.rad))   # (a mirrored radius stays >= 0)

    def quad(self, v) -> Enclosure:
        """``v^T S v`` for a float vector v (taken exactly), as a 0-d enclosure."""
        column = Enclosure.exact(np.asarray(v, dtype=np.float64).reshape(-1, 1))
        product = column.T @ (self @ column)
        return Enclosure(product.mid.reshape(()), product.rad.reshape(()))

    def interval(self):
        """The enclosed scalar as an interval."""
        if self.mid.size != 1:
            raise WeightsError("enclosure", "a scalar", f"shape {self.mid.shape}", "index it first")
        m, r = float(self.mid.reshape(())), float(self.rad.reshape(()))
        return interval(m) + interval((-r, r))

    def norm_interval(self):
        """Interval enclosing the spectral norm of the exact matrix (Euclidean for a vector)."""
        lo, hi = spectral_norm_bounds(self.mid)
        if self.is_exact:
            return interval((lo, hi))
        deviation = interval(_fro_upper(self.rad))
        bottom = _raw(interval(lo) - deviation)[0]
        if libmp.mpf_lt(bottom, libmp.fzero):
            bottom = libmp.fzero
        return IV.make_mpf((bottom, _raw(interval(hi) + deviation)[1]))

    def norm_upper(self) -> float:
        return upper(self.norm_interval())

    def norm_lower(self) -> float:
        return lower(self.norm_interval())


def weighted_sum(weights, mids: np.ndarray, rads: np.ndarray) -> Enclosure:
    """``sum_e w_e P_e`` for exact float weights ``w`` (m,) and the enclosures ``P_e`` stacked as ``mids``, ``rads``
    (m, p, q), in one pass: ``mid = fl(sum_e fl(w_e P_e.mid))`` is a dot product of length m in each entry, so
    ``|mid - sum_e w_e P_e.mid| <= gamma_m sum_e |w_e P_e.mid| + m eta`` (Higham, eq. 3.5, with underflow), and the
    radii add ``sum_e |w_e| P_e.rad``; the radius is computed with at most ``2m + 2`` roundings (``_safe``) and at most
    2m products that may underflow (``eta`` each)."""
    weights = np.asarray(weights, dtype=np.float64)
    m = len(weights)
    mid = np.tensordot(weights, mids, axes=1)
    size = np.abs(weights)
    rad = np.tensordot(size, rads, axes=1)
    rad += gamma_bound(m) * np.tensordot(size, np.abs(mids), axes=1)
    rad *= _safe(2 * m + 2)
    rad += (3 * m + 2) * _ETA
    return Enclosure._trusted(np.asarray(mid, dtype=np.float64), rad)


#: rows of a square matrix handled at a time by :func:`_mirrored` and :func:`_is_symmetric` (from this size on)
MIRROR_ROWS = 64


def _mirrored(A: np.ndarray) -> np.ndarray:
    """``triu(A) + triu(A, 1)^T`` (exactly: each entry is one term plus zero, which turns -0 into +0); a large
    matrix by panels of :data:`MIRROR_ROWS` rows, each entry copied and 0 added (the same floats, without the two
    triangles' masks and copies)."""
    m = A.shape[0]
    if m < 4 * MIRROR_ROWS:
        out = np.triu(A)
        out += np.triu(A, 1).T
        return out
    out = np.empty_like(A)
    for start in range(0, m, MIRROR_ROWS):
        stop = min(start + MIRROR_ROWS, m)
        out[start:stop, start:] = A[start:stop, start:]
        out[start:stop, :start] = A[:start, start:stop].T
        block = out[start:stop, start:stop]
        lower = np.tril_indices(stop - start, -1)
        block[lower] = block.T[lower]
    out += 0.0
    return out


def _is_symmetric(A: np.ndarray) -> bool:
    """``np.array_equal(A, A.T)`` for a square matrix, by panels of :data:`MIRROR_ROWS` rows (no whole transposed
    comparison)."""
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        return bool(np.array_equal(A, A.T))
    m = A.shape[0]
    return all(np.array_equal(A[start:start + MIRROR_ROWS, start:], A[start:, start:start + MIRROR_ROWS].T)
               for start in range(0, m, MIRROR_ROWS))


def _as_enclosure(value) -> Enclosure:
    return value if isinstance(value, Enclosure) else Enclosure.exact(value)


# Vector norms ----------------------------------------------------------------------------------
def _power_of_two_scale(array: np.ndarray) -> tuple[np.ndarray, int, bool]:
    """``array * 2^-e`` with the largest entry in [1/2, 1), the exponent e, and whether the
    scaling was exact (scaling down can round entries into the subnormals)."""
    _, exponent = math.frexp(max(float(np.max(array)), -float(np.min(array))))
    scaled = np.ldexp(array, -exponent)
    if exponent <= 0:  # scaling up by a power of two is exact (the largest entry stays below 1)
        return scaled, exponent, True
    # scaling down is exact unless an entry falls into the subnormals; only those need a closer look
    tiny = (scaled < 2.0 ** -1022) & (scaled > -2.0 ** -1022)  # boolean temporaries only
    return scaled, exponent, not np.any(tiny) or bool(np.array_equal(np.ldexp(scaled[tiny], exponent), array[tiny]))


def _sum_of_squares_bounds(v: np.ndarray) -> tuple:
    """Interval ends enclosing ``sum v_i^2`` for a float vector with entries at most 1 in size:
    ``|fl(v . v) - v . v| <= gamma_n v . v + n eta`` for any summation order."""
    n = v.size
    computed = float(np.dot(v, v))
    g = interval(2 * gamma_bound(n))
    slack = interval(2 * n) * interval(_ETA)
    return (interval(computed) - slack) / (1 + g), (interval(computed) + slack) / (1 - g)


def vector_norm_upper(v) -> float:
    """Certified upper bound on the Euclidean norm ``||v||_2`` (any shape is flattened)."""
    v = _as_array("v", v, (0, 1, 2, 3)).ravel()
    if v.size == 0 or not np.any(v):
        return 0.0
    scaled, exponent, exact = _power_of_two_scale(v)
    norm = IV.sqrt(_sum_of_squares_bounds(scaled)[1])
    if not exact:  # rounding into subnormals moved each entry by at most eta
        norm = norm + IV.sqrt(interval(v.size)) * interval(_ETA)
    return upper(norm * IV.mpf(2) ** exponent)


def vector_norm_lower(v) -> float:
    """Certified lower bound on ``||v||_2`` (rounded down, never negative)."""
    v = _as_array("v", v, (0, 1, 2, 3)).ravel()
    if v.size == 0 or not np.any(v):
        return 0.0
    scaled, exponent, exact = _power_of_two_scale(v)
    low = _sum_of_squares_bounds(scaled)[0]
    if libmp.mpf_le(_raw(low)[0], libmp.fzero):
        return 0.0
    norm = IV.sqrt(point(_raw(low)[0]))
    if not exact:
        norm = norm - IV.sqrt(interval(v.size)) * interval(_ETA)
    return max(0.0, lower(norm * IV.mpf(2) ** exponent))


# Eigenvalues -----------------------------------------------------------------------------------
def lambda_min_lower(S, attempts: int = 8) -> float:
    """A certified lower bound on ``lambda_min`` of the symmetric matrix enclosed by ``S``.

    Pick ``s`` a little below the computed ``lambda_min`` of the (mirrored) midpoint, factor
    ``B = fl(mid - s I) = L L^T + Delta`` by Cholesky, bound ``||Delta||_2 <= ||Delta||_F``
    rigorously (``|fl(L L^T) - L L^T| <= gamma_m |L||L|^T + m eta``) and add the radius (Weyl):
    ``lambda_min(S) >= s - ||Delta||_F - ||rad||_F``.  Returns ``-inf`` if no factorisation
    succeeds (nothing is claimed).
    """
    if not isinstance(S, Enclosure):
        S = _as_array("S", S)
        if S.shape[0] != S.shape[-1] or not np.array_equal(S, S.T):
            raise AssumptionError("S", "an exactly symmetric square matrix", f"shape {S.shape}, not symmetric",
                                  "symmetrize first, e.g. (S + S.T) / 2, and certify that matrix")
    S = _as_enclosure(S).sym()
    M = S.mid
    m = M.shape[0] if M.ndim == 2 else -1
    if M.ndim != 2 or M.shape[1] != m:
        raise WeightsError("S", "a square matrix", f"shape {M.shape}", "pass a symmetric matrix")
    if m == 0:
        return math.inf
    radius = _fro_upper(S.rad)
    scale = float(np.linalg.norm(M))
    if scale == 0.0:
        return math.nextafter(-radius, -math.inf)
    estimate = float(np.linalg.eigvalsh(M)[0])
    for attempt in range(attempts):
        shift = estimate - 16.0 * (m + 2) * _U * scale * (8.0 ** attempt)
        B = M.copy()
        B[np.diag_indices(m)] = np.diag(M) - shift
        try:
            L = np.linalg.cholesky(B)
        except np.linalg.LinAlgError:
            continue
        absL = np.abs(L)
        residual = (np.abs(B - L @ L.T) * (1 + 2 * _U)
                    + (gamma_bound(m) * (absL @ absL.T) + m * _ETA) * _safe(m))
        residual[np.diag_indices(m)] += _U * np.abs(np.diag(B)) * (1 + 2 * _U) + _ETA  # fl(M_ii - s)
        delta = _fro_upper(residual) + radius
        return math.nextafter(math.nextafter(shift - delta, -math.inf), -math.inf)
    return -math.inf


def psd_floor(S, shift: float | None = None, extra: float = 0.0) -> float:
    """A certified lower bound on ``lambda_min`` of the symmetric matrix enclosed by ``S`` from one
    Cholesky factorisation and its a priori backward error, for large matrices known to be PSD with a
    margin.

    If the floating-point factorisation of ``B = fl(mid - s I)`` runs to completion, ``L L^T = B + Delta``
    with ``|Delta| <= gamma_{n+1} |L||L|^T`` (Higham, *Accuracy and Stability*, Thm 10.3; ``n (n + 2) eta``
    more for underflow), and ``|| |L||L|^T ||_2 <= ||L||_F^2``, so ``lambda_min(B) >= -gamma_{n+1} ||L||_F^2``;
    ``fl(mid_ii - s)`` moved the diagonal by at most ``u |mid_ii - s|``; Weyl adds the radius:

        lambda_min(S) >= s - u max|mid_ii - s| - gamma_{n+1} ||L||_F^2 - n (n + 2) eta - ||rad||_F.

    No eigendecomposition and no product (``lambda_min_lower`` computes the residual instead: tighter,
    three times the work).  ``extra`` bounds ``||T - S||_2`` for the matrix T meant, when part of its error
    is known in norm only (subtracted too, by Weyl).  ``shift`` defaults to ``4 (gamma_{n+1} sum max(mid_ii,
    0) + ||rad||_F + extra)``, what the bound loses; ``-inf`` if the factorisation breaks down (nothing is
    claimed).
    """
    S = _as_enclosure(S).sym()
    M = S.mid
    n = M.shape[0]
    if M.ndim != 2 or M.shape[1] != n:
        raise WeightsError("S", "a square matrix", f"shape {M.shape}", "pass a symmetric matrix")
    radius = _fro_upper(S.rad)
    g = gamma_bound(n + 1)
    if shift is None:
        shift = 4.0 * (g * float(np.sum(np.maximum(np.diag(M), 0.0))) + radius + float(extra))
    B = M.copy()
    B[np.diag_indices(n)] = np.diag(M) - shift
    try:
        L = np.linalg.cholesky(B)
    except np.linalg.LinAlgError:
        return -math.inf
    if not all_finite(L):
        return -math.inf
    diagonal = float(np.max(np.abs(np.diag(B)))) * _U * (1 + 2 * _U)
    loss = interval(g) * interval(_fro_upper(L)) ** 2 + interval(diagonal) + interval(n * (n + 2)) * interval(_ETA) \
        + interval(radius) + interval(extra)
    return lower(interval(shift) - loss)


def lambda_max_upper(S) -> float:
    """A certified upper bound on ``lambda_max`` of the symmetric matrix enclosed by ``S``."""
    return -lambda_min_lower(-S if isinstance(S, Enclosure) else -_as_array("S", S))


def lambda_max_upper_large(S, margins=(1e-6, 1e-4, 1e-2), estimate: float | None = None) -> float:
    """A certified upper bound on ``lambda_max`` of the symmetric matrix enclosed by S, from one Cholesky
    factorisation: at a level t a little above a float estimate of ``lambda_max`` (:func:`_top_estimate`: no
    eigendecomposition above 300 rows), ``lambda_min(t I - S) >= -loss`` (:func:`psd_floor`, with its a priori
    backward error) gives ``lambda_max(S) <= t + loss``; the level rises through ``margins`` (relative to the
    larger of the estimate and the largest entry) while the factorisation breaks down, then
    :func:`lambda_max_upper` decides.  For large matrices: about a third of :func:`lambda_max_upper`'s work.
    ``estimate``: a float estimate the caller has, in place of :func:`_top_estimate`'s (it only places the level)."""
    S = _as_enclosure(S)
    estimate = _top_estimate(S.mid) if estimate is None else float(estimate)
    scale = max(abs(estimate), float(np.max(np.abs(S.mid), initial=0.0)), 1e-300)
    for margin in margins:
        level = estimate + margin * scale
        floor = psd_floor(_level_less(level, S), shift=0.0)
        if math.isfinite(floor):
            return upper(interval(level) - interval(floor))
    return lambda_max_upper(S)


def _level_less(level: float, S: Enclosure) -> Enclosure:
    """``Enclosure.exact(level I) - S`` (the same floats, but for the sign of exact zeros), formed without the
    identity, its zero radius or their copies: ``mid = fl(level I - S_m)`` (exact off the diagonal) and ``rad =
    (S_r + u |mid|) (1 + 2 gamma_10) + eta``."""
    mid = np.negative(S.mid)
    diagonal = np.diag_indices(mid.shape[0])
    mid[diagonal] = level - S.mid[diagonal]
    rad = np.abs(mid)
    rad *= _U
    rad += S.rad
    rad *= _safe(2)
    rad += _ETA
    return Enclosure._trusted(mid, rad)


def top_eigenvalue_bounds(S):
    """Intervals ``(lower, upper)`` for ``lambda_max`` of the symmetric matrix enclosed by ``S``,
    or None when the upper certificate fails.  Lower: the Rayleigh quotient at the computed top
    eigenvector, in enclosure arithmetic; upper: :func:`lambda_max_upper`."""
    S = _as_enclosure(S).sym()
    _, vectors = np.linalg.eigh(S.mid)
    v = vectors[:, -1]
    quotient = S.quad(v).interval() / interval(vector_norm_upper(v)) ** 2
    top = lambda_max_upper(S)
    if not math.isfinite(top):
        return None
    return IV.make_mpf((_raw(quotient)[0], _raw(quotient)[0])), interval(top)


def is_psd_certified(S, margin: float = 0.0) -> bool:
    """True only if ``lambda_min(S) >= margin`` is proved (False: not proved, maybe true)."""
    return lambda_min_lower(S) >= margin


# Spectral norms --------------------------------------------------------------------------------
def _spectral_bounds_scaled(M: np.ndarray) -> tuple[float, float]:
    """Certified ``(lower, upper)`` for ``||M||_2`` when ``max |M_ij|`` is in [1/2, 1)."""
    M = M if M.shape[1] <= M.shape[0] else M.T  # the smaller Gram matrix
    gram = (Enclosure.exact(M.T) @ Enclosure.exact(M)).sym()
    top = lambda_max_upper(gram)
    high = math.nextafter(math.sqrt(max(top, 0.0)), math.inf) if math.isfinite(top) else math.inf
    _, vectors = np.linalg.eigh(gram.mid)
    v = vectors[:, -1]
    image = Enclosure.exact(M) @ Enclosure.exact(v)
    low = (interval(vector_norm_lower(image.mid)) - interval(_fro_upper(image.rad))) / interval(vector_norm_upper(v))
    return max(0.0, lower(low)), high


def spectral_norm_bounds(M) -> tuple[float, float]:
    """Certified ``(lower, upper)`` floats for ``||M||_2`` of a finite float matrix (taken exactly).

    Upper: ``sqrt(lambda_max(M^T M))`` through an enclosed Gram matrix (or the Frobenius norm,
    whichever is smaller); lower: ``||M v|| / ||v||`` at the computed top singular vector.
    """
    M = _as_array("M", M)
    if M.size == 0 or not np.any(M):
        return 0.0, 0.0
    if min(M.shape) == 1:
        return vector_norm_lower(M), vector_norm_upper(M)
    scaled, exponent, exact = _power_of_two_scale(M)
    low, high = _spectral_bounds_scaled(scaled)
    factor = IV.mpf(2) ** exponent
    low_iv, high_iv = interval(low) * factor, interval(high) * factor
    if not exact:  # ||Delta M||_2 <= ||Delta M||_F <= sqrt(mn) eta
        deviation = IV.sqrt(interval(M.size)) * interval(_ETA)
        low_iv, high_iv = low_iv - deviation, high_iv + deviation
    return max(0.0, lower(low_iv)), min(upper(high_iv), vector_norm_upper(M))


def spectral_norm_upper(M) -> float:
    """Certified upper bound on ``||M||_2`` for a float matrix or an :class:`Enclosure`."""
    if isinstance(M, Enclosure):
        return M.norm_upper()
    return spectral_norm_bounds(M)[1]


def spectral_norm_lower(M) -> float:
    """Certified lower bound on ``||M||_2`` (rounded down, never negative)."""
    if isinstance(M, Enclosure):
        return M.norm_lower()
    return spectral_norm_bounds(M)[0]


def _symmetric_gram(A: np.ndarray) -> np.ndarray:
    """``fl(A A^T)``, exactly symmetric: numpy's syrk path returns it so; otherwise the upper triangle is
    mirrored (each entry encloses its exact value either way)."""
    gram = A @ A.T
    if not np.array_equal(gram, gram.T):
        gram = np.triu(gram)
        gram += np.triu(gram, 1).T
    return gram


def spectral_norm_upper_large(M, estimate: float | None = None, margin: float = 1e-6) -> float:
    """Certified upper bound on ``||M||_2`` for a large float matrix or :class:`Enclosure`, with one
    Gram product and one Cholesky factorisation (no eigendecomposition).

    With ``A`` the scaled midpoint (entries in [1/2, 1)), ``G = fl(A^T A)`` and a level ``t`` just above
    the estimate of ``lambda_max(G)`` (:func:`_top_estimate`, or ``estimate^2`` if larger), factor
    ``fl(t I - G) = L L^T + Delta`` by Cholesky; then ``lambda_max(A^T A) <= t + ||Delta||_F +
    ||fl(A^T A) - A^T A||_F``, every term bounded rigorously (``gamma_k ||A||_F^2`` for the products,
    Higham Thm 3.5; ``||Delta||`` a priori from :data:`A_PRIORI_ROWS` columns on, as :class:`RowGram`).
    The enclosure's radius adds ``||rad||_F`` (Weyl).  Falls back to :func:`spectral_norm_upper` when the
    factorisation fails at every level tried.
    """
    M = _as_enclosure(M)
    mid = M.mid if M.mid.shape[0] >= M.mid.shape[1] else M.mid.T
    radius = _fro_upper(M.rad) if not M.is_exact else 0.0
    if mid.size == 0 or not np.any(mid):
        return radius
    scaled, exponent, exact = _power_of_two_scale(mid)
    rows, k = scaled.shape
    gram = _symmetric_gram(scaled.T)
    frobenius = _fro_upper(scaled)
    del scaled  # only the Gram matrix is needed from here on
    gram_error = gamma_bound(rows) * frobenius * frobenius * _safe(rows) + k * _ETA
    top = _top_estimate(gram)  # a failed factorisation costs more than the estimate
    if estimate is not None:
        top = max(top, (float(estimate) * 2.0 ** -exponent) ** 2)
    # the Gram matrix is not needed any more: the factorisation overwrites it
    top_bound = _top_by_cholesky(gram, top, margin, a_priori=k >= A_PRIORI_ROWS)
    if top_bound is not None:
        norm = F.sqrt(top_bound + interval(gram_error)) * IV.mpf(2) ** exponent
        if not exact:
            norm = norm + IV.sqrt(interval(mid.size)) * interval(_ETA)
        return upper(norm + interval(radius))
    return spectral_norm_upper(M)


def _top_estimate(S: np.ndarray, steps: int = 60) -> float:
    """Float estimate of ``lambda_max`` of a symmetric matrix (no guarantee: it only places the level of
    :func:`_top_by_cholesky`, which is certified whatever the estimate): all eigenvalues up to 300 rows; above,
    the largest Ritz value of ``steps`` Lanczos steps with full reorthogonalisation from a fixed random start
    (a few dozen products instead of a full eigendecomposition)."""
    k = S.shape[0]
    if k <= 300:
        return float(np.linalg.eigvalsh(S)[-1])
    return _top_ritz(S, steps, np.random.default_rng(0).standard_normal((k,)))[0]


def _top_ritz(S: np.ndarray, steps: int, start: np.ndarray, settled: float = 0.0) -> tuple[float, np.ndarray]:
    """The largest Ritz value of a symmetric S (k, k) and its Ritz vector after at most ``steps`` Lanczos steps with
    full reorthogonalisation from ``start``; with ``settled`` > 0 the steps stop once the Ritz pair's residual
    ``||S y - theta y|| = beta_j |u_j|`` is at most ``settled theta`` (checked every fourth step).  A float estimate
    only (:func:`_top_estimate`)."""
    k = S.shape[0]
    m = min(k, steps)
    basis = np.zeros((k, m))
    q: np.ndarray = start / float(np.linalg.norm(start))
    alpha, beta = np.zeros(m), np.zeros(m)
    for j in range(m):
        basis[:, j] = q
        w = S @ q
        alpha[j] = q @ w
        w -= basis[:, :j + 1] @ (basis[:, :j + 1].T @ w)   # full reorthogonalisation (twice is enough)
        w -= basis[:, :j + 1] @ (basis[:, :j + 1].T @ w)
        beta[j] = np.linalg.norm(w)
        if beta[j] <= 1e-12 * max(abs(alpha[j]), 1e-300):   # an invariant subspace: its Ritz values are exact
            m = j + 1
            break
        if settled > 0 and j % 4 == 3:
            values, vectors = _tridiagonal_top(alpha[:j + 1], beta[:j])
            if beta[j] * abs(vectors[-1]) <= settled * max(values, 1e-300):
                m = j + 1
                break
        q = w / beta[j]
    value, vector = _tridiagonal_top(alpha[:m], beta[:m - 1])
    return value, basis[:, :m] @ vector


def _tridiagonal_top(alpha: np.ndarray, beta: np.ndarray) -> tuple[float, np.ndarray]:
    """The largest eigenvalue of the symmetric tridiagonal matrix (diagonal alpha, off-diagonal beta) and its
    eigenvector."""
    tridiagonal = np.diag(alpha) + np.diag(beta, 1) + np.diag(beta, -1)
    # (the value by eigvalsh, as the estimates before the vector was asked for: the same floats)
    return float(np.linalg.eigvalsh(tridiagonal)[-1]), np.linalg.eigh(tridiagonal)[1][:, -1]


def _top_by_cholesky(S: np.ndarray, top: float, margin: float, a_priori: bool = False, attempts: int = 12):
    """An interval above ``lambda_max(S)`` for an exactly symmetric float matrix S (overwritten; as it came where
    every one of the ``attempts`` levels fails and None is returned).

    At a level t just above the estimate ``top`` (raised by factors of 4 in ``margin`` while it fails),
    factor ``fl(t I - S) = L L^T - Delta`` by Cholesky; since ``L L^T`` is positive semidefinite,
    ``lambda_max(S) <= t + ||Delta||_F``, with ``|fl(L L^T) - L L^T| <= gamma_k |L||L|^T`` (Higham Thm 3.5)
    and the rounding of ``t - S_ii`` counted.  With ``a_priori`` the product is not formed: the factorisation's
    own backward error ``|Delta| <= gamma_{k+1} |L||L|^T`` (Higham Thm 10.3, ``k (k + 2) eta`` more for
    underflow, as :func:`psd_floor`) gives ``||Delta||_2 <= gamma_{k+1} ||L||_F^2 + k (k + 2) eta``: the same size
    as the product's own error term above, at a third of the work (the product costs twice the factorisation).
    """
    k = S.shape[0]
    diagonal = np.diag(S).copy()
    B = np.negative(S, out=S)  # exact
    for attempt in range(attempts):
        level = top * (1 + margin * 4.0 ** attempt) + 1e-300
        np.fill_diagonal(B, level - diagonal)  # fl(level - S_ii): one rounding each
        try:
            L = np.linalg.cholesky(B)
        except np.linalg.LinAlgError:
            continue
        if a_priori:
            if not all_finite(L):
                continue
            residual = (gamma_bound(k + 1) * _fro_upper(L) ** 2 + k * (k + 2) * _ETA) * _safe(k)
        else:
            product = L @ L.T
            product -= B  # fl(fl(L L^T) - B): within a factor 1 + 2u of its exact value, entrywise
            residual = _fro_upper(product) * (1 + 4 * _U) + gamma_bound(k) * _fro_upper(L) ** 2 * _safe(k)
        residual += _U * float(np.max(np.abs(np.diag(B)))) * math.sqrt(k) * (1 + 4 * _U)  # fl(level - S_ii)
        return interval(level) + interval(residual)
    np.negative(B, out=B)   # S again, exactly (a caller may try another level)
    np.fill_diagonal(B, diagonal)
    return None


def _row_squares_upper(A: np.ndarray) -> np.ndarray:
    """Upper bounds on the squared Euclidean norms of the rows of a float matrix with entries below 2^400
    in size: ``fl(a . a)`` is within ``gamma_k a . a + k eta`` of ``a . a`` (any summation order)."""
    k = A.shape[1]
    return (np.einsum("ij,ij->i", A, A) + k * _ETA) * _safe(k)


def _weighted_squares_upper(s: np.ndarray, x: np.ndarray) -> float:
    """Upper bound on ``sum s_r^2 x_r`` for non-negative float vectors: each term ``fl(fl(s_r^2) x_r)`` is
    within ``gamma_2`` of its value plus ``(x_r + 1) eta`` of underflow, the sum within ``gamma_m``."""
    if s.size == 0:
        return 0.0
    return (float(np.dot(s * s, x)) + s.size * (float(np.max(x)) + 1) * _ETA) * _safe(s.size + 2)


def _ldexp_up(array: np.ndarray, exponent: int) -> np.ndarray:
    """``array * 2^exponent`` for a non-negative array, entries the scaling rounds rounded up."""
    scaled = np.ldexp(array, exponent)
    rounded = np.ldexp(scaled, -exponent) != array
    scaled[rounded] = np.nextafter(scaled[rounded], np.inf)
    return scaled


#: From this many rows on, :class:`RowGram` bounds its factorisation's residual a priori instead of forming ``L L^T``
#: (:func:`_top_by_cholesky`): the product is two thirds of the work and the bound moves by about ``k u`` relative
#: (972 rows, the curvature's Gram matrix of MiniLM's layer at 9 tokens: 52 -> 29 ms, 6e-14 relative).
A_PRIORI_ROWS = 512


@final
class RowGram:
    """The Gram matrix of the rows of an enclosed matrix Z (m, k), formed once, for certified upper
    bounds on ``||diag(s) Z_R||_2`` -- Z's rows R (all by default) scaled by non-negative factors s --
    for many scalings, each at the price of one Cholesky factorisation of size ``|R|``.

    With ``A = fl(2^-e mid)`` (largest entry in [1/2, 1); entries that the scaling rounds into the
    subnormals move by at most ``eta``, which the radius takes up) and ``G = fl(A A^T)``,
    ``|G - A A^T| <= gamma_k |A||A|^T + k eta``; with ``D = diag(s)`` and ``S_rc = fl(fl(s_r s_c) G_rc)``
    (exactly symmetric; each entry within ``gamma_2 |D G D| + (k + 2) eta`` of ``D G D``, the entries of G
    being at most k),

        ||D Z_R||_2 <= 2^e (lambda_max(S) + gamma_2' (||S||_F + e_u) + e_u
                            + gamma_k sum_r s_r^2 ||A_r||^2 + k eta ||s||^2)^(1/2) + ||D rad_R||_F

    (Weyl for the radius; ``gamma_2' = gamma_2 / (1 - gamma_2)``, ``e_u = |R| (k + 2) eta``),
    ``lambda_max(S)`` bounded by :func:`_top_by_cholesky` (its residual a priori from :data:`A_PRIORI_ROWS` rows on);
    when no level factorises, the Frobenius norm of
    ``D Z_R`` stands.  The radius is kept in the units of A (``2^-e rad``, rounded up), and the factors
    are scaled the same way per call (``s = 2^f s'`` with the largest of ``s'`` in [1/2, 1), rounded
    up), so that no square of a factor or of a radius overflows or vanishes; the result is multiplied
    by ``2^(e + f)`` in interval arithmetic.
    """

    def __init__(self, Z):
        Z = _as_enclosure(Z)
        if Z.mid.ndim != 2:
            raise WeightsError("Z", "a matrix", f"shape {Z.mid.shape}", "reshape the rows first")
        self.m, self.k = Z.mid.shape
        self.exponent, scaled, exact = 0, Z.mid, True
        if np.any(Z.mid):
            scaled, self.exponent, exact = _power_of_two_scale(Z.mid)
        rad = _ldexp_up(Z.rad, -self.exponent)                        # in the units of A
        if not exact:  # entries rounded into the subnormals moved by at most eta
            rad = np.nextafter(rad + _ETA, np.inf)
        self.gram = _symmetric_gram(scaled)
        self.squares = _row_squares_upper(scaled)                    # ||A_r||^2
        self.nonzero = np.any(scaled != 0, axis=1)
        self.radius_squares = None if not np.any(rad) else _row_squares_upper(rad)
        #: (rows, scales, Ritz vector) of the last few estimates: the starts of the next ones (:meth:`_estimate`)
        self._ritz: list = []

    def norm_upper(self, scales, rows=None, margin: float = 1e-5) -> float:
        """Certified upper bound on ``||diag(scales) Z_rows||_2`` over the enclosure (class docstring)."""
        rows = np.arange(self.m) if rows is None else np.asarray(rows, dtype=np.int64).ravel()
        s = np.asarray(scales, dtype=np.float64).ravel()
        if s.shape != rows.shape or not np.all(s >= 0) or not np.all(np.isfinite(s)):
            raise WeightsError("scales", f"{rows.size} finite non-negative row scales", f"shape {s.shape}",
                               "pass one upper bound per row")
        # rounding a factor up is safe: the norm grows with every factor
        shift = math.frexp(float(np.max(s)))[1] if s.size else 0
        return upper(self._norm_in_units(_ldexp_up(s, -shift), rows, margin) * IV.mpf(2) ** (shift + self.exponent))

    def _norm_in_units(self, s: np.ndarray, rows: np.ndarray, margin: float):
        """Interval above ``||diag(s) Z_rows|| / 2^e`` for factors s at most 1."""
        squared = _weighted_squares_upper(s, np.ones_like(s))                          # ||s||^2
        frobenius = _weighted_squares_upper(s, self.squares[rows])                      # ||D A_R||_F^2
        radius = 0.0 if self.radius_squares is None else \
            math.nextafter(math.sqrt(_weighted_squares_upper(s, self.radius_squares[rows])), math.inf)
        if not np.any((s > 0) & self.nonzero[rows]):
            return interval(radius)
        S = np.outer(s, s)  # fl(s_r s_c) = fl(s_c s_r): S is exactly symmetric
        every = rows.size == self.m and np.array_equal(rows, np.arange(self.m))
        S *= self.gram if every else self.gram[np.ix_(rows, rows)]
        g2 = interval(gamma_bound(2))
        underflow = interval(rows.size) * interval(self.k + 2) * interval(_ETA)            # ||.||_F of (k + 2) eta
        error = (g2 / (1 - g2) * (interval(_fro_upper(S)) + underflow) + underflow
                 + interval(gamma_bound(self.k)) * interval(frobenius)
                 + interval(self.k) * interval(_ETA) * interval(squared))
        estimate, warm = self._estimate(S, s, rows)
        a_priori = rows.size >= A_PRIORI_ROWS
        top = _top_by_cholesky(S, estimate, margin, a_priori=a_priori, attempts=1 if warm else 12)
        if top is None and warm:   # the warm start missed the top (a crossing of eigenvalues): the fixed start's level
            top = _top_by_cholesky(S, _top_estimate(S), margin, a_priori=a_priori)
        if top is None:  # the Frobenius norm bounds the spectral norm
            return IV.sqrt(interval(frobenius)) + interval(radius)
        return F.sqrt(top + error) + interval(radius)

    def _estimate(self, S: np.ndarray, s: np.ndarray, rows: np.ndarray) -> tuple[float, bool]:
        """A float estimate of ``lambda_max(S)`` for the factors s of these rows, which places the level of the
        certificate only (:func:`_top_by_cholesky`): :func:`_top_estimate`, or where an earlier estimate of the same
        rows had factors within :data:`WARM_COSINE` of s (the radii of a curvature integral scale the same rows
        alike), Lanczos steps from its Ritz vector until the residual settles (:data:`WARM_STEPS`,
        :data:`WARM_SETTLED`): on MiniLM's curvature rows at n = 20 a few steps instead of 60 products by a
        4800 x 4800 matrix.  Returns the estimate and whether it was started warm (its level is then tried once, and
        the fixed start's estimate places it where that fails)."""
        if rows.size <= 300:
            return _top_estimate(S), False
        start, best = None, WARM_COSINE
        for kept_rows, kept_scales, vector in self._ritz:
            if kept_rows.shape == rows.shape and np.array_equal(kept_rows, rows):
                cosine = float(kept_scales @ s) / max(float(np.linalg.norm(kept_scales) * np.linalg.norm(s)), 1e-300)
                if cosine >= best:
                    start, best = vector, cosine
        warm = start is not None and WARM_STEPS > 0
        if start is not None and warm:
            value, vector = _top_ritz(S, WARM_STEPS, start, WARM_SETTLED)
        else:
            value, vector = _top_ritz(S, 60, np.random.default_rng(0).standard_normal((S.shape[0],)))
        self._ritz = self._ritz[-(WARM_KEPT - 1):] + [(rows, s.copy(), vector)]
        return value, warm


#: A :class:`RowGram` estimate starts from the Ritz vector of an earlier one of the same rows whose factors have at
#: least this cosine with the new ones (the estimate places the certificate's level only)
WARM_COSINE = 0.99
#: Largest number of Lanczos steps of a warm-started estimate (0: every estimate from the fixed random start)
WARM_STEPS = 24
#: A warm-started estimate stops once its Ritz pair's residual is at most this share of the Ritz value
WARM_SETTLED = 1e-7
#: Ritz vectors a :class:`RowGram` keeps as starts
WARM_KEPT = 6


def product_norm_interval(X, Y):
    """Interval enclosing ``||X Y||_2`` for matrices or enclosures X (p, k), Y (k, q).

    When the inner dimension is small (``2 k <= min(p, q)``, e.g. ``W_Q W_K^T`` with d = 384,
    d_k = 32) the product is not formed: ``||X Y||^2 = lambda_max(G_X G_Y)`` with the k x k
    Gram matrices ``G_X = X^T X``, ``G_Y = Y Y^T``; with a floating Cholesky factor
    ``L L^T = G_Y + E`` (E enclosed), ``G_X G_Y`` is similar to ``G_X^{1/2} (L L^T - E) G_X^{1/2}``,
    so by Weyl ``|lambda_max(G_X G_Y) - lambda_max(L^T G_X L)| <= ||G_X|| ||E||``.
    Otherwise the product is formed with its error bound.
    """
    X, Y = _as_enclosure(X), _as_enclosure(Y)
    (p, k), q = X.shape, Y.shape[1]
    if 2 * k <= min(p, q):
        norm = gram_norm_interval((X.T @ X).sym(), (Y @ Y.T).sym())
        if norm is not None:
            return norm
    return (X @ Y).norm_interval()


def gram_norm_upper(gram_x: Enclosure, gram_y: Enclosure) -> float:
    """Certified upper bound on ``||X Y||_2`` from the Gram matrices (as :func:`gram_norm_interval`, the upper
    end only: two eigenvalue certificates, no Rayleigh quotients); ``inf`` when none was certified."""
    try:
        factor = Enclosure.exact(np.linalg.cholesky(gram_y.mid))
    except np.linalg.LinAlgError:
        return math.inf
    residual = factor @ factor.T - gram_y
    residual_norm = interval(vector_norm_upper(residual.mid)) + interval(_fro_upper(residual.rad))
    core, outer = lambda_max_upper((factor.T @ gram_x @ factor).sym()), lambda_max_upper(gram_x)
    if not (math.isfinite(core) and math.isfinite(outer)):
        return math.inf
    return upper(F.sqrt(interval(max(core, 0.0)) + interval(max(outer, 0.0)) * residual_norm))


def gram_norm_interval(gram_x: Enclosure, gram_y: Enclosure):
    """Interval enclosing ``||X Y||_2`` from the k x k Gram matrices ``G_X = X^T X`` and ``G_Y = Y Y^T``
    (symmetric enclosures; :func:`product_norm_interval`), or None when no bound was certified."""
    try:
        factor = Enclosure.exact(np.linalg.cholesky(gram_y.mid))
    except np.linalg.LinAlgError:
        return None
    residual = factor @ factor.T - gram_y
    residual_norm = interval(vector_norm_upper(residual.mid)) + interval(_fro_upper(residual.rad))
    core, outer = top_eigenvalue_bounds(factor.T @ gram_x @ factor), top_eigenvalue_bounds(gram_x)
    if core is None or outer is None:
        return None
    spread = interval(upper(outer[1])) * residual_norm
    low_raw = _raw(core[0] - spread)[0]

    low = IV.sqrt(point(libmp.fzero if libmp.mpf_lt(low_raw, libmp.fzero) else low_raw))
    return IV.make_mpf((_raw(low)[0], _raw(F.sqrt(core[1] + spread))[1]))


def product_norm_upper(*factors) -> float:
    """Certified upper bound on ``||F_1 F_2 ... F_k||_2``; sharper than ``prod ||F_i||`` whenever
    the factors are not aligned (``||W_Q W_K^T||`` against ``||W_Q|| ||W_K||``)."""
    if not factors:
        raise AssumptionError("factors", "at least one matrix", "none", "pass the factors of the product")
    enclosures = [Enclosure.exact(_as_array(f"factors[{i}]", f)) for i, f in enumerate(factors)]
    if len(enclosures) == 1:
        return enclosures[0].norm_upper()
    head = enclosures[0]
    for factor in enclosures[1:-1]:
        head = head @ factor
    return upper(product_norm_interval(head, enclosures[-1]))
