"""Rigorous arithmetic: certified norm bounds in floating point, interval evaluation of SymPy.

Two tools, both sound by construction:

* **Certified matrix and vector norms.**  :func:`spectral_norm_upper` returns a float
  that provably bounds ``||M||_2`` from above, although every operation runs in
  IEEE double precision.  It bounds the rounding of the Gram matrix
  ``fl(M^T M)`` elementwise (``|fl(AB) - AB| <= gamma_k |A||B|``, Higham 2002,
  eq. 3.13) and proves ``t I - M^T M`` positive semidefinite by a floating-point
  Cholesky factorisation of a shifted matrix, with Rump's argument (S. M. Rump,
  "Verification of positive definiteness", BIT 46, 2006): if the factorisation
  of ``B`` runs to completion, then ``R^T R = B + Delta`` with
  ``|Delta| <= gamma_{n+1} |R^T||R|`` (Demmel 1989; Higham 2002, Thm 10.3), so
  ``lambda_min(B) >= -gamma_{n+1} / (1 - gamma_{n+1}) trace(B)``.
  :class:`MatrixEnclosure` carries an elementwise error bound through products and
  sums of matrices, so that norms of derived matrices (``W_Q W_K^T``,
  ``W_K b_Q + W_K W_Q^T c``) are certified too.
* **Interval evaluation of closed forms.**  :func:`interval_namespace` is a module
  namespace for :func:`sympy.lambdify` that turns a bound into code over
  ``mpmath.iv`` intervals (outward rounding), including rigorous Lambert W,
  digamma, interval ``min``/``max`` and exactly enclosed rational constants.

Conventions: ``u = 2^-53`` is the unit roundoff, ``eta = 2^-1074`` the smallest
subnormal, ``gamma_k = k u / (1 - k u)``.  Every floating-point error bound is
inflated by a safety factor of 2 and every returned float is rounded outward.
A check that rounding could flip answers :attr:`lipbound.assumptions.Truth.UNKNOWN`
(:func:`certify_le`) or ``False`` (:func:`is_psd_certified`), never a pass.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, final

import mpmath
import numpy as np
from mpmath import iv, libmp

from ..assumptions import Truth
from ..errors import AssumptionError, NotCertifiedError, WeightsError

__all__ = [
    "UNIT_ROUNDOFF", "spectral_norm_upper", "spectral_norm_lower", "product_norm_upper",
    "vector_norm_upper", "vector_norm_lower", "is_psd_certified", "MatrixEnclosure", "product_norm_interval",
    "certify_le", "interval", "lower", "upper", "float_up", "float_down",
    "interval_namespace", "interval_lambdify",
]

UNIT_ROUNDOFF = 2.0 ** -53
_ETA = 2.0 ** -1074  # smallest positive subnormal: the absolute error of an underflow
_SAFETY = 2  # every rounding-error term is doubled


# Intervals and directed rounding ------------------------------------------------
def interval(value) -> "iv.mpf":
    """An ``mpmath.iv`` interval enclosing ``value``.

    Accepts an interval, an int, a float (taken exactly), an ``mpmath.mpf``, a decimal
    string (enclosed outward), a pair ``(lo, hi)``, or a raw mpf tuple
    ``(sign, man, exp, bc)`` as printed by SymPy's mpmath printer (taken exactly).
    """
    if hasattr(value, "_mpi_"):  # an interval or an interval constant (iv.pi)
        return iv.make_mpf(value._mpi_)
    if hasattr(value, "_mpf_"):  # mpmath.mpf or sympy.Float: its exact binary value
        raw = value._mpf_
        return iv.make_mpf((raw, raw))
    if hasattr(value, "p") and hasattr(value, "q") and isinstance(getattr(value, "q"), int):
        return iv.mpf(int(value.p)) / iv.mpf(int(value.q))  # sympy Rational: enclosed outward
    if isinstance(value, tuple) and len(value) == 4 and all(isinstance(v, int) for v in value):
        sign, man, exp, _ = value
        raw = libmp.from_man_exp(-man if sign else man, exp)  # exact: no precision given
        return iv.make_mpf((raw, raw))
    if isinstance(value, (tuple, list)) and len(value) == 2:
        lo_raw, hi_raw = _raw(interval(value[0]))[0], _raw(interval(value[1]))[1]
        if libmp.mpf_gt(lo_raw, hi_raw):
            raise AssumptionError("interval", "lo <= hi", f"({value[0]}, {value[1]})", "swap the endpoints")
        return iv.make_mpf((lo_raw, hi_raw))
    if isinstance(value, (bool, np.bool_)):
        raise AssumptionError("value", "a number", repr(value), "pass an int, a float or an interval")
    if isinstance(value, (np.integer,)):
        value = int(value)
    if isinstance(value, np.floating):
        value = float(value)
    if isinstance(value, float) and math.isnan(value):
        raise NotCertifiedError("value", "a number", "NaN", "the computation that produced it failed; check its inputs")
    return iv.mpf(value)


def _raw(x) -> tuple:
    """The raw endpoints ``(lo, hi)`` of an interval (mpmath's internal mpf tuples)."""
    return x._mpi_


def _to_float(raw, upward: bool) -> float:
    if raw == libmp.fnan:
        raise NotCertifiedError("interval endpoint", "a number", "NaN", "check the inputs of the evaluation")
    value = libmp.to_float(raw)  # rounds to nearest; fixed below
    exact = libmp.from_float(value)
    if upward and libmp.mpf_lt(exact, raw):
        value = math.nextafter(value, math.inf)
    elif not upward and libmp.mpf_gt(exact, raw):
        value = math.nextafter(value, -math.inf)
    return value


def upper(x) -> float:
    """The upper end of ``interval(x)`` as a float rounded up."""
    return _to_float(_raw(interval(x))[1], upward=True)


def lower(x) -> float:
    """The lower end of ``interval(x)`` as a float rounded down."""
    return _to_float(_raw(interval(x))[0], upward=False)


float_up = upper
float_down = lower


def _gamma(k: int):
    """``gamma_k = k u / (1 - k u)`` as an interval (Higham 2002, eq. 3.8)."""
    if k * UNIT_ROUNDOFF >= 0.5:
        raise NotCertifiedError("size", f"k u < 1/2 (k < {int(0.5 / UNIT_ROUNDOFF)})", str(k),
                                "the problem is too large for the floating-point error bounds")
    ku = interval(k) * interval(UNIT_ROUNDOFF)
    return ku / (1 - ku)


def _inflate(array: np.ndarray, operations: int, underflows: int) -> np.ndarray:
    """An elementwise upper bound on a non-negative quantity computed in floating point.

    ``array`` is the computed value of a non-negative quantity ``T`` along a path of at most
    ``operations`` roundings (each of relative size at most u) and ``underflows`` underflows
    (each of absolute size at most eta).  Returns a float array ``>= T`` elementwise:
    ``T <= fl(T) (1 + 2 operations u) + underflows eta``, then one ulp upward absorbs the
    rounding of this very expression.
    """
    factor = 1.0 + 2.0 * _SAFETY * (operations + 2) * UNIT_ROUNDOFF
    with np.errstate(over="ignore"):
        bound = np.asarray(array, dtype=np.float64) * factor + _SAFETY * underflows * _ETA
    return np.nextafter(bound, np.inf)


def _as_matrix(name: str, M) -> np.ndarray:
    try:
        array = np.asarray(M, dtype=np.float64)
    except (TypeError, ValueError):
        raise WeightsError(name, "a real 2-d array", type(M).__name__, "pass a numpy array of floats") from None
    if array.ndim != 2:
        raise WeightsError(name, "a 2-d array (a matrix)", f"shape {array.shape}",
                           "reshape it, e.g. v[:, None] for a column vector")
    if not np.all(np.isfinite(array)):
        raise WeightsError(name, "finite entries", "NaN or Inf", "check how the matrix was computed")
    return array


def _as_vector(name: str, v) -> np.ndarray:
    try:
        array = np.asarray(v, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise WeightsError(name, "a real array", type(v).__name__, "pass a numpy array of floats") from None
    if not np.all(np.isfinite(array)):
        raise WeightsError(name, "finite entries", "NaN or Inf", "check how the vector was computed")
    return array


def _power_of_two_scale(array: np.ndarray) -> tuple[np.ndarray, int, bool]:
    """``array * 2^-e`` with the largest entry in [1/2, 1), the exponent e, and whether the
    scaling was exact (scaling down can round entries into the subnormal range)."""
    largest = float(np.max(np.abs(array)))
    _, exponent = math.frexp(largest)
    scaled = np.ldexp(array, -exponent)
    exact = bool(np.array_equal(np.ldexp(scaled, exponent), array))
    return scaled, exponent, exact


# Vector norms ---------------------------------------------------------------------
def _sum_of_squares_bounds(v: np.ndarray) -> tuple:
    """Interval enclosing ``sum v_i^2`` for a float vector whose entries are at most 1 in size."""
    n = v.size
    computed = float(np.dot(v, v))  # any summation order: |fl - s| <= gamma_n s + n eta
    g = _gamma(n) * _SAFETY
    slack = interval(n) * interval(_ETA) * _SAFETY
    hi = (interval(computed) + slack) / (1 - g)
    lo = (interval(computed) - slack) / (1 + g)
    return lo, hi


def vector_norm_upper(v) -> float:
    """Certified upper bound on the Euclidean norm ``||v||_2`` (any shape is flattened).

    The vector is scaled by an exact power of two, ``fl(v . v)`` is bounded with
    ``|fl(v.v) - v.v| <= gamma_n v.v + n eta`` and the square root is taken in interval
    arithmetic; the result is rounded up.
    """
    v = _as_vector("v", v)
    if v.size == 0 or not np.any(v):
        return 0.0
    scaled, exponent, exact = _power_of_two_scale(v)
    _, hi = _sum_of_squares_bounds(scaled)
    norm = iv.sqrt(hi)
    if not exact:  # rounding into subnormals: each entry moved by at most eta
        norm = norm + iv.sqrt(interval(v.size)) * interval(_ETA)
    return upper(norm * iv.mpf(2) ** exponent)


def vector_norm_lower(v) -> float:
    """Certified lower bound on ``||v||_2`` (rounded down, never negative)."""
    v = _as_vector("v", v)
    if v.size == 0 or not np.any(v):
        return 0.0
    scaled, exponent, exact = _power_of_two_scale(v)
    lo, _ = _sum_of_squares_bounds(scaled)
    if libmp.mpf_le(_raw(lo)[0], libmp.fzero):
        return 0.0
    norm = iv.sqrt(iv.make_mpf((_raw(lo)[0], _raw(lo)[0])))
    if not exact:
        norm = norm - iv.sqrt(interval(v.size)) * interval(_ETA)
    return max(0.0, lower(norm * iv.mpf(2) ** exponent))


# Positive definiteness ----------------------------------------------------------------
def _cholesky_completes(B: np.ndarray) -> bool:
    """Floating-point Cholesky of a symmetric matrix, right-looking, in elementwise IEEE
    operations (no fused multiply-add, no blocking), so that the rounding model of
    Demmel's and Rump's analysis holds literally.  True if every pivot is positive."""
    R = np.array(B, dtype=np.float64, copy=True)
    n = R.shape[0]
    with np.errstate(all="ignore"):
        for k in range(n):
            pivot = R[k, k]
            if not (np.isfinite(pivot) and pivot > 0.0):
                return False
            row = R[k, k + 1:] / np.sqrt(pivot)
            if not np.all(np.isfinite(row)):
                return False
            R[k + 1:, k + 1:] -= np.outer(row, row)
    return True


def _min_eigenvalue_lower(A: np.ndarray, shift: float):
    """A certified lower bound (raw mpf) on ``lambda_min(A)`` for a symmetric float matrix,
    or None when the Cholesky factorisation of ``B = fl(A - shift I)`` does not complete.

    If it completes, ``lambda_min(B_exact) >= -gamma_{n+1}/(1 - gamma_{n+1}) trace(B)``
    (Rump 2006, from Demmel's ``|R^T R - B| <= gamma_{n+1}|R^T||R|`` and
    ``(|R^T||R|)_ij <= ||r_i|| ||r_j||``, ``||r_i||^2 <= b_ii / (1 - gamma_{n+1})``);
    the diagonal of B is off ``A - shift I`` by at most ``u/(1-u) |b_ii|``; underflow adds
    at most ``n (n + 2 + 2 sqrt(max b_ii)) eta`` to the spectral norm of the residual.
    All of these are doubled.
    """
    n = A.shape[0]
    B = np.array(A, dtype=np.float64, copy=True)
    idx = np.diag_indices(n)
    B[idx] = A[idx] - shift
    if not np.all(np.isfinite(B)) or not _cholesky_completes(B):
        return None
    diagonal = B[idx]
    trace = interval(math.fsum(diagonal)) * (1 + 2 * interval(UNIT_ROUNDOFF))  # fsum: correctly rounded
    largest = interval(float(np.max(diagonal)))
    g = _gamma(n + 1)
    loss = (_SAFETY * g / (1 - g) * trace
            + _SAFETY * interval(UNIT_ROUNDOFF) / (1 - interval(UNIT_ROUNDOFF)) * largest
            + _SAFETY * interval(n) * (n + 3 + 2 * iv.sqrt(largest + 1)) * interval(_ETA))
    return _raw(interval(shift) - loss)[0]


def is_psd_certified(A, margin: float = 0.0) -> bool:
    """True only if ``lambda_min(A) >= margin`` is proved for the symmetric float matrix A.

    Parameters
    ----------
    A : array_like, shape (n, n)
        Exactly symmetric, finite.
    margin : float
        The eigenvalue floor to certify (0 for positive semidefiniteness).

    Returns
    -------
    bool
        ``True``: proved (Rump's floating-point Cholesky test on ``A - c I`` with ``c``
        slightly above ``margin``).  ``False``: not proved -- A may still satisfy it, e.g.
        a singular PSD matrix with ``margin = 0`` sits on the boundary and is never certified.
    """
    A = _as_matrix("A", A)
    n, cols = A.shape
    if n != cols:
        raise WeightsError("A", "a square matrix", f"shape {A.shape}", "pass a symmetric (n, n) matrix")
    if not np.array_equal(A, A.T):
        raise AssumptionError("A", "an exactly symmetric matrix", "A != A.T",
                              "symmetrize first, e.g. A = (A + A.T) / 2, and certify that matrix")
    margin = float(margin)
    if n == 0:
        return True
    excess = np.diag(A) - margin
    if np.any(excess < 0):  # e_i^T A e_i < margin: certainly not
        return False
    g = upper(_gamma(n + 1))
    # room for the certificate's loss (about 2 gamma trace) plus rounding of the shifted diagonal
    shift = margin + 4.0 * _SAFETY * g * math.fsum(excess) + 4.0 * UNIT_ROUNDOFF * abs(margin) + 1e3 * n * n * _ETA
    bound = _min_eigenvalue_lower(A, shift)
    return bound is not None and libmp.mpf_ge(bound, libmp.from_float(margin))


# Spectral norms -------------------------------------------------------------------------
def _gram_side(M: np.ndarray) -> np.ndarray:
    """M or M^T, whichever has fewer columns (its Gram matrix is the smaller one)."""
    return M if M.shape[1] <= M.shape[0] else M.T


def _spectral_bounds_scaled(M: np.ndarray) -> tuple:
    """Certified ``(lower, upper)`` intervals for ``||M||_2``, ``max |M_ij|`` in [1/2, 1), at
    least two rows and columns.  ``upper`` is None when the Cholesky test never succeeds.

    One symmetric eigendecomposition of the (smaller) Gram matrix gives the estimate
    ``lambda`` and the top right singular vector v; the upper bound certifies
    ``lambda (1 + delta) I - fl(G)`` positive definite, the lower bound is ``||M v|| / ||v||``.
    """
    M = _gram_side(M)
    k, n = M.shape
    G = M.T @ M
    G = np.triu(G) + np.triu(G, 1).T  # one computed value per entry, exactly symmetric
    eigenvalues, eigenvectors = np.linalg.eigh(G)
    estimate, v = max(float(eigenvalues[-1]), 0.0), eigenvectors[:, -1]

    # lower: |fl(Mv) - Mv| <= gamma_n |M||v| + n eta, elementwise
    product = M @ v
    error = _inflate(upper(_gamma(n)) * (np.abs(M) @ np.abs(v)), n + 2, n + 1)
    image = interval(vector_norm_lower(product)) - interval(vector_norm_upper(error))
    low = image / interval(vector_norm_upper(v))

    # upper: ||fl(G) - G||_2 <= max row sum of |fl(G) - G| <= gamma_k max row sum of |M|^T|M| + n k eta
    absolute = np.abs(M)
    row_sum = float(np.max((absolute.T @ absolute).sum(axis=1)))
    gk, gn = _gamma(k), _gamma(n)
    gram_error = _SAFETY * (gk / ((1 - gk) * (1 - gn)) * interval(row_sum) + interval(n * k) * interval(_ETA))
    slack = 4.0 * (n + 2) ** 2 * UNIT_ROUNDOFF
    for _ in range(8):
        shift = estimate * (1.0 + slack) + n * _ETA
        bound = _min_eigenvalue_lower(-G, -shift)  # lambda_min(-G) >= bound  <=>  lambda_max(G) <= -bound
        if bound is not None:
            return low, iv.sqrt(-_point(bound) + gram_error)
        slack *= 16.0
    return low, None


def _spectral_bounds(M: np.ndarray) -> tuple[float, float]:
    """Certified ``(lower, upper)`` floats for ``||M||_2`` of a finite float matrix."""
    if M.size == 0 or not np.any(M):
        return 0.0, 0.0
    if min(M.shape) == 1:
        return vector_norm_lower(M), vector_norm_upper(M)
    frobenius = vector_norm_upper(M)
    scaled, exponent, exact = _power_of_two_scale(M)
    low, high = _spectral_bounds_scaled(scaled)
    factor = iv.mpf(2) ** exponent
    if not exact:  # ||Delta M||_2 <= ||Delta M||_F <= sqrt(mn) eta
        deviation = iv.sqrt(interval(M.size)) * interval(_ETA)
        low = low - deviation
        high = None if high is None else high + deviation
    top = frobenius if high is None else min(upper(high * factor), frobenius)
    return max(0.0, lower(low * factor)), top


def spectral_norm_upper(M) -> float:
    """Certified upper bound on the spectral norm ``||M||_2`` of a float matrix.

    Parameters
    ----------
    M : array_like, shape (m, n)
        Finite float64 entries (taken exactly).

    Returns
    -------
    float
        ``>= ||M||_2``, rounded up; typically within a relative ``10 n^2 u`` of it.

    Notes
    -----
    With ``G = M^T M`` (or ``M M^T``, the smaller) and ``lambda`` its computed top
    eigenvalue, the shift ``t = lambda (1 + delta)`` is certified to satisfy
    ``t >= lambda_max(fl(G))`` by a Cholesky factorisation of ``t I - fl(G)`` (Rump 2006),
    and the rounding of ``fl(G)`` is bounded by ``gamma_k |M|^T |M|`` (Higham 2002,
    eq. 3.13), so ``||M||_2^2 <= t + ||fl(G) - G||_2``.  If the test fails (it retries with
    larger delta) the Frobenius norm, also certified, is returned.
    """
    return _spectral_bounds(_as_matrix("M", M))[1]


def spectral_norm_lower(M) -> float:
    """Certified lower bound on ``||M||_2``: ``||M v|| / ||v||`` for the computed top right
    singular vector v, with the rounding of ``M v`` bounded by ``gamma_n |M||v|``.

    Returns a float rounded down, never negative.
    """
    return _spectral_bounds(_as_matrix("M", M))[0]


@final
@dataclass(frozen=True)
class MatrixEnclosure:
    """A real matrix known up to rounding: ``|exact - value| <= error`` elementwise.

    Products, sums, scalings and transposes propagate the bound (Higham 2002, eq. 3.13:
    ``|fl(AB) - AB| <= gamma_k |A||B|`` plus ``k eta`` for underflow; propagated errors
    ``|dA||B| + (|A| + |dA|)|dB|``).  Norms of the exact matrix are then bracketed by
    certified norms of ``value`` plus or minus ``||error||_F``.

    Parameters
    ----------
    value : ndarray, shape (p, q)
        The floating-point matrix.
    error : ndarray, shape (p, q)
        Non-negative elementwise error bound.
    """

    value: np.ndarray
    error: np.ndarray

    def __post_init__(self):
        value = _as_matrix("value", self.value)
        error = _as_matrix("error", self.error)
        if error.shape != value.shape or np.any(error < 0):
            raise WeightsError("error", f"a non-negative array of shape {value.shape}",
                               f"shape {error.shape}", "use MatrixEnclosure.exact(value) for exact data")
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "error", error)

    @classmethod
    def exact(cls, array) -> "MatrixEnclosure":
        """An exactly known float matrix (a vector becomes a column)."""
        array = np.asarray(array, dtype=np.float64)
        if array.ndim == 1:
            array = array[:, None]
        return cls(array, np.zeros_like(array))

    @property
    def shape(self) -> tuple[int, int]:
        return self.value.shape

    @property
    def T(self) -> "MatrixEnclosure":
        return MatrixEnclosure(self.value.T, self.error.T)

    @property
    def is_exact(self) -> bool:
        return not np.any(self.error)

    def __matmul__(self, other: "MatrixEnclosure") -> "MatrixEnclosure":
        if self.shape[1] != other.shape[0]:
            raise WeightsError("other", f"a matrix with {self.shape[1]} rows", f"shape {other.shape}",
                               "check the order of the factors")
        k = self.shape[1]
        with np.errstate(over="ignore"):
            value = self.value @ other.value
            total = upper(_gamma(k)) * (np.abs(self.value) @ np.abs(other.value))
            if not self.is_exact:
                total = total + self.error @ np.abs(other.value)
            if not other.is_exact:
                total = total + (np.abs(self.value) + self.error) @ other.error
        if not np.all(np.isfinite(value)) or not np.all(np.isfinite(total)):
            raise NotCertifiedError("product", "finite floating-point values", "overflow",
                                    "rescale the weights; the product exceeds the float range")
        return MatrixEnclosure(value, _inflate(total, k + 6, 4 * k + 4))

    def _combine(self, other: "MatrixEnclosure", sign: float) -> "MatrixEnclosure":
        if self.shape != other.shape:
            raise WeightsError("other", f"shape {self.shape}", f"shape {other.shape}", "add matrices of one shape")
        value = self.value + sign * other.value
        total = self.error + other.error + 2.0 * UNIT_ROUNDOFF * np.abs(value)  # |fl(a+b) - (a+b)| <= u/(1-u)|fl(a+b)|
        return MatrixEnclosure(value, _inflate(total, 4, 0))

    def __add__(self, other: "MatrixEnclosure") -> "MatrixEnclosure":
        return self._combine(other, 1.0)

    def __sub__(self, other: "MatrixEnclosure") -> "MatrixEnclosure":
        return self._combine(other, -1.0)

    def __neg__(self) -> "MatrixEnclosure":
        return MatrixEnclosure(-self.value, self.error)

    def scale(self, factor) -> "MatrixEnclosure":
        """``factor * self`` for a scalar ``factor`` (an interval, an int or a float)."""
        factor = interval(factor)
        lo, hi = _raw(factor)
        middle = libmp.to_float(libmp.mpf_shift(libmp.mpf_add(lo, hi), -1))  # exact sum, then nearest
        radius = upper(_interval_max(_point(hi) - middle, middle - _point(lo)))
        value = middle * self.value
        total = (abs(middle) * self.error + radius * (np.abs(self.value) + self.error)
                 + 2.0 * UNIT_ROUNDOFF * np.abs(value))
        return MatrixEnclosure(value, _inflate(total, 6, 2))

    def norm_interval(self):
        """Interval enclosing the spectral norm of the exact matrix (Euclidean for a vector)."""
        deviation = interval(vector_norm_upper(self.error)) if not self.is_exact else interval(0)
        lo, hi = _spectral_bounds(self.value)
        top = interval(hi) + deviation
        bottom = interval(lo) - deviation
        bottom_raw = _raw(bottom)[0]
        if libmp.mpf_lt(bottom_raw, libmp.fzero):
            bottom_raw = libmp.fzero
        return iv.make_mpf((bottom_raw, _raw(top)[1]))

    def norm_upper(self) -> float:
        return upper(self.norm_interval())

    def norm_lower(self) -> float:
        return lower(self.norm_interval())


def _mirrored(enclosure: MatrixEnclosure) -> MatrixEnclosure:
    """An exactly symmetric enclosure of a matrix known to be symmetric: the upper triangle
    mirrored (each computed entry encloses its exact value, and the exact matrix is symmetric)."""
    value, error = enclosure.value, enclosure.error
    return MatrixEnclosure(np.triu(value) + np.triu(value, 1).T, np.triu(error) + np.triu(error, 1).T)


def _top_eigenvalue_bounds(S: MatrixEnclosure):
    """Intervals ``(lower, upper)`` for ``lambda_max`` of the exact symmetric matrix enclosed by
    the (exactly symmetric) enclosure S, or None when the certificate fails.

    Lower: the Rayleigh quotient ``v^T S v / v^T v`` at the computed top eigenvector, in
    enclosure arithmetic.  Upper: ``lambda_max(value) <= t`` by Cholesky of ``t I - value``
    (Rump 2006), then Weyl: ``lambda_max(exact) <= t + ||error||_F``.
    """
    n = S.shape[0]
    eigenvalues, eigenvectors = np.linalg.eigh(S.value)
    estimate, v = float(eigenvalues[-1]), eigenvectors[:, -1]
    quotient = MatrixEnclosure.exact(v[None, :]) @ (S @ MatrixEnclosure.exact(v[:, None]))
    low = (interval(float(quotient.value[0, 0])) - interval(float(quotient.error[0, 0]))) \
        / interval(vector_norm_upper(v)) ** 2
    deviation = interval(vector_norm_upper(S.error)) if not S.is_exact else interval(0)
    scale = max(abs(estimate), abs(float(eigenvalues[0])), float(np.max(np.abs(np.diag(S.value)))), 1e-300)
    slack = 4.0 * (n + 2) ** 2 * UNIT_ROUNDOFF
    for _ in range(8):
        bound = _min_eigenvalue_lower(-S.value, -(estimate + slack * scale))
        if bound is not None:
            return low, -_point(bound) + deviation
        slack *= 16.0
    return None


def product_norm_interval(X, Y):
    """Interval enclosing ``||X Y||_2`` for matrices (or :class:`MatrixEnclosure` s) X, Y.

    When the inner dimension k is small (``2 k <= min(p, q)``, e.g. ``W_Q W_K^T`` with
    d = 384, d_k = 32) the product is never formed: ``||X Y||^2 = lambda_max(G_X G_Y)`` with the
    k x k Gram matrices ``G_X = X^T X``, ``G_Y = Y Y^T``.  With a floating Cholesky factor
    ``L L^T = G_Y + E`` (E enclosed), ``G_X G_Y`` is similar to
    ``G_X^{1/2} (L L^T - E) G_X^{1/2}``, so by Weyl
    ``|lambda_max(G_X G_Y) - lambda_max(L^T G_X L)| <= ||G_X|| ||E||``, and
    ``lambda_max(L^T G_X L)`` is bracketed by :func:`_top_eigenvalue_bounds`.
    Otherwise the product is formed with its error bound and its norm bracketed.
    """
    X = X if isinstance(X, MatrixEnclosure) else MatrixEnclosure.exact(_as_matrix("X", X))
    Y = Y if isinstance(Y, MatrixEnclosure) else MatrixEnclosure.exact(_as_matrix("Y", Y))
    (p, k), q = X.shape, Y.shape[1]
    if 2 * k <= min(p, q):
        gram_x, gram_y = _mirrored(X.T @ X), _mirrored(Y @ Y.T)
        try:
            factor = MatrixEnclosure.exact(np.linalg.cholesky(gram_y.value))
        except np.linalg.LinAlgError:
            factor = None
        if factor is not None:
            residual = factor @ factor.T - gram_y
            residual_norm = interval(vector_norm_upper(residual.value)) + interval(vector_norm_upper(residual.error))
            core, outer = _top_eigenvalue_bounds(_mirrored(factor.T @ gram_x @ factor)), _top_eigenvalue_bounds(gram_x)
            if core is not None and outer is not None:
                spread = interval(upper(outer[1])) * residual_norm
                low_raw = _raw(core[0] - spread)[0]
                low = iv.sqrt(_point(libmp.fzero if libmp.mpf_lt(low_raw, libmp.fzero) else low_raw))
                return iv.make_mpf((_raw(low)[0], _raw(_interval_sqrt(core[1] + spread))[1]))
    return (X @ Y).norm_interval()


def product_norm_upper(*factors) -> float:
    """Certified upper bound on ``||F_1 F_2 ... F_k||_2`` for float matrices ``F_i``.

    The product is formed in floating point with a rigorous elementwise error bound
    (:class:`MatrixEnclosure`), except for the last multiplication, which goes through
    :func:`product_norm_interval` (no product formed when it has low rank).  Sharper than
    ``prod ||F_i||`` whenever the factors are not aligned (``||W_Q W_K^T||`` against
    ``||W_Q|| ||W_K||``).
    """
    if not factors:
        raise AssumptionError("factors", "at least one matrix", "none", "pass the factors of the product")
    enclosures = [MatrixEnclosure.exact(_as_matrix(f"factors[{i}]", f)) for i, f in enumerate(factors)]
    if len(enclosures) == 1:
        return enclosures[0].norm_upper()
    head = enclosures[0]
    for factor in enclosures[1:-1]:
        head = head @ factor
    return upper(product_norm_interval(head, enclosures[-1]))


# Decisions ---------------------------------------------------------------------------------
def certify_le(a, b) -> Truth:
    """Decide ``a <= b`` for intervals (or exact numbers).

    Returns ``Truth.TRUE`` if ``sup a <= inf b``, ``Truth.FALSE`` if ``inf a > sup b``,
    ``Truth.UNKNOWN`` when the intervals overlap otherwise (rounding could decide either way).
    """
    a_lo, a_hi = _raw(interval(a))
    b_lo, b_hi = _raw(interval(b))
    if libmp.mpf_le(a_hi, b_lo):
        return Truth.TRUE
    if libmp.mpf_gt(a_lo, b_hi):
        return Truth.FALSE
    return Truth.UNKNOWN


# Rigorous special functions ---------------------------------------------------------------
def _point(raw):
    return iv.make_mpf((raw, raw))


def _interval_min(*args):
    """Interval minimum: ``[min a_i, min b_i]`` (also accepts one iterable, like ``min``)."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    items = [_raw(interval(a)) for a in args]
    key = functools.cmp_to_key(libmp.mpf_cmp)
    return iv.make_mpf((min((lo for lo, _ in items), key=key), min((hi for _, hi in items), key=key)))


def _interval_max(*args):
    """Interval maximum: ``[max a_i, max b_i]``."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    items = [_raw(interval(a)) for a in args]
    key = functools.cmp_to_key(libmp.mpf_cmp)
    return iv.make_mpf((max((lo for lo, _ in items), key=key), max((hi for _, hi in items), key=key)))


def _interval_sqrt(x):
    """Square root; a lower end below 0 (rounding of a non-negative quantity) is clipped to 0."""
    lo, hi = _raw(interval(x))
    if libmp.mpf_lt(hi, libmp.fzero):
        raise NotCertifiedError("sqrt argument", "a non-negative number", f"the interval {interval(x)}",
                                "the expression takes the square root of a negative quantity")
    if libmp.mpf_lt(lo, libmp.fzero):
        lo = libmp.fzero
    return iv.sqrt(iv.make_mpf((lo, hi)))


def _interval_log(x):
    lo, hi = _raw(interval(x))
    if libmp.mpf_le(hi, libmp.fzero):
        raise NotCertifiedError("log argument", "a positive number", f"the interval {interval(x)}",
                                "the expression takes the logarithm of a non-positive quantity")
    return iv.log(iv.make_mpf((libmp.fzero if libmp.mpf_lt(lo, libmp.fzero) else lo, hi)))


def _lambertw_endpoint(p, direction: int):
    """Certified bound on ``W_0(p)`` for a raw mpf ``p >= -1/e``: below it if ``direction < 0``,
    above it if ``direction > 0``.  Candidate from mpmath at raised precision, then checked:
    ``f(w) = w e^w`` is increasing on ``[-1, oo)`` and ``f(W_0(p)) = p``, so
    ``w >= -1`` with ``sup f(w) <= p`` proves ``w <= W_0(p)`` (and symmetrically)."""
    if p in (libmp.finf, libmp.fninf):
        return p
    prec = iv.prec
    minus_one = libmp.from_int(-1)
    with mpmath.workprec(2 * prec + 40):
        estimate = mpmath.lambertw(mpmath.mpf(p)).real
    margin = mpmath.mpf(2) ** (-prec) * (abs(estimate) + 1)
    for _ in range(8):
        with mpmath.workprec(2 * prec + 40):
            candidate = (estimate - margin if direction < 0 else estimate + margin)._mpf_
        candidate = libmp.mpf_pos(candidate, prec, libmp.round_floor if direction < 0 else libmp.round_ceiling)
        if direction < 0 and libmp.mpf_le(candidate, minus_one):
            return minus_one  # W_0 >= -1 on its whole domain
        w = _point(candidate)
        image_lo, image_hi = _raw(w * iv.exp(w))
        if direction < 0 and libmp.mpf_le(image_hi, p):
            return candidate
        if direction > 0 and libmp.mpf_ge(image_lo, p) and libmp.mpf_ge(candidate, minus_one):
            return candidate
        margin *= 2 ** 16
    raise NotCertifiedError("LambertW", "an enclosure certified by w e^w", f"argument {mpmath.mpf(p)}",
                            "raise mpmath.iv.prec")


def _interval_lambertw(x, k=0):
    """Principal branch ``W_0`` on an interval (monotone increasing on ``[-1/e, oo)``)."""
    if k != 0:
        raise NotCertifiedError("LambertW branch", "the principal branch k = 0", str(k),
                                "only W_0 has a rigorous interval version here")
    lo, hi = _raw(interval(x))
    floor = _raw(-iv.exp(-1))  # -1/e enclosed
    if libmp.mpf_lt(hi, floor[0]):
        raise NotCertifiedError("LambertW argument", "a number >= -1/e", f"the interval {interval(x)}",
                                "W_0 is real only on [-1/e, oo)")
    bottom = libmp.from_int(-1) if libmp.mpf_le(lo, floor[1]) else _lambertw_endpoint(lo, -1)
    return iv.make_mpf((bottom, _lambertw_endpoint(hi, +1)))


# Bernoulli numbers B_2 .. B_18 for the digamma asymptotic series (DLMF 5.11.2)
_BERNOULLI = ((1, 6), (-1, 30), (1, 42), (-1, 30), (5, 66), (-691, 2730), (7, 6), (-3617, 510), (43867, 798))


def _digamma_point(p):
    """Interval enclosing ``psi(p)`` for a raw mpf ``p > 0``.

    Shift with ``psi(x) = psi(x + 1) - 1/x`` until ``x >= 16``, then
    ``psi(x) = ln x - 1/(2x) - sum_{k=1}^{8} B_{2k} / (2k x^{2k}) + r`` where, for real
    ``x > 0``, ``|r|`` is at most the first neglected term (DLMF 5.11(ii)).
    """
    if p == libmp.finf:
        return iv.make_mpf((libmp.finf, libmp.finf))
    x = _point(p)
    shift = iv.mpf(0)
    sixteen = libmp.from_int(16)
    while libmp.mpf_lt(_raw(x)[0], sixteen):
        shift = shift + 1 / x
        x = x + 1
    inverse_square = 1 / (x * x)
    total = iv.log(x) - 1 / (2 * x)
    power = inverse_square
    for k, (num, den) in enumerate(_BERNOULLI[:-1], start=1):
        total = total - iv.mpf(num) / iv.mpf(den) / (2 * k) * power
        power = power * inverse_square
    num, den = _BERNOULLI[-1]
    remainder = abs(iv.mpf(num) / iv.mpf(den)) / (2 * len(_BERNOULLI)) * power
    remainder_hi = _raw(remainder)[1]
    return total + iv.make_mpf((libmp.mpf_neg(remainder_hi), remainder_hi)) - shift


def _interval_digamma(x):
    """Digamma ``psi`` on an interval in ``(0, oo)``, where it is increasing."""
    lo, hi = _raw(interval(x))
    if not libmp.mpf_gt(lo, libmp.fzero):
        raise NotCertifiedError("digamma argument", "an interval in (0, oo)", f"{interval(x)}",
                                "psi has poles at 0, -1, -2, ...; only positive arguments are supported")
    return iv.make_mpf((_raw(_digamma_point(lo))[0], _raw(_digamma_point(hi))[1]))


def _interval_polygamma(order, x):
    if order != 0:
        raise NotCertifiedError("polygamma order", "0 (the digamma function)", str(order),
                                "only psi = polygamma(0, .) has a rigorous interval version here")
    return _interval_digamma(x)


def _interval_kappa(size, spread):
    """``kappa(n, omega) = n e^omega / (e^omega + n - 1) = n / (1 + (n - 1) e^-omega)``; omega
    appears once in the second form, so interval arithmetic is tight."""
    size = interval(size)
    return size / (1 + (size - 1) * iv.exp(-interval(spread)))


def _exact_positive_integer(name: str, value) -> int:
    lo, hi = _raw(interval(value))
    as_int = libmp.to_int(lo)
    if lo != hi or libmp.from_int(as_int) != lo or as_int < 1:
        raise NotCertifiedError(name, "an exact positive integer", str(interval(value)),
                                "pass the size as an int")
    return as_int


def _causal_sum(size: int, spread_raw, direction: int):
    """Bound on ``g(omega) = sum_{i=1}^{n} 1 / (1 + (i - 1) e^-omega)`` at a point omega."""
    omega = _point(spread_raw)
    q = iv.exp(-omega)
    if size <= 4096:
        total = iv.mpf(0)
        for i in range(size):
            total = total + 1 / (1 + i * q)
        return total
    correction = q * (size * (size - 1) // 2)
    if libmp.mpf_le(_raw(correction)[1], libmp.from_man_exp(1, -60)):
        # 1 - (i-1) q <= 1 / (1 + (i-1) q) <= 1
        return iv.mpf(size) - iv.make_mpf((libmp.fzero, _raw(correction)[1]))
    old = iv.prec
    try:  # g = X (psi(X + n) - psi(X)), X = e^omega: cancellation needs about log2(X) extra bits
        iv.prec = old + 64 + max(0, int(float(mpmath.mpf(spread_raw)) * 1.4427) + 1)
        X = iv.exp(_point(spread_raw))
        value = X * (_interval_digamma(X + size) - _interval_digamma(X))
    finally:
        iv.prec = old
    return value


def _interval_causal_kappa(size, spread):
    """``sum_{i=1}^{n} e^omega / (e^omega + i - 1)`` (increasing in omega), evaluated at the
    endpoints of omega so that the cancellation in the digamma form never widens it."""
    n = _exact_positive_integer("n", size)
    lo, hi = _raw(interval(spread))
    return iv.make_mpf((_raw(_causal_sum(n, lo, -1))[0], _raw(_causal_sum(n, hi, +1))[1]))


def _interval_lambert_level(size):
    """``W_0((n - 1) / e)``."""
    return _interval_lambertw((interval(size) - 1) * iv.exp(-1))


def _refuse(name: str) -> Callable:
    def refuse(*args, **kwargs):
        raise NotCertifiedError(
            name, "a function with a rigorous interval version (sqrt, exp, log, abs, min, max, cos, sin, "
            "LambertW, digamma, kappa, causal_kappa, lambert_level)", name,
            "rewrite the expression with supported functions, or evaluate it with the mpmath backend "
            "(not certified)")
    refuse.__name__ = f"refuse_{name}"
    return refuse


class _IntervalNamespace(dict):
    """A dict that :func:`sympy.lambdify` recognises as the mpmath module (it looks at
    ``__name__``), so that it prints with ``MpmathPrinter``: rationals as ``mpf(p)/mpf(q)``,
    floats as exact ``mpf((sign, man, exp, bc))``, ``E``/``pi`` as ``e``/``pi``.  Here
    ``mpf`` builds intervals, so every constant is enclosed exactly or outward."""

    __name__ = "mpmath"


@functools.lru_cache(maxsize=1)
def _namespace_entries() -> dict:
    # Every public mpmath name is shadowed, so that lambdify never falls back to importing a
    # non-interval mpmath function (it runs `from mpmath import f` for names it misses).
    entries = {name: _refuse(name) for name in dir(mpmath) if not name.startswith("_")}
    entries.update({
        "mpf": interval, "mpi": interval,
        "sqrt": _interval_sqrt, "exp": iv.exp, "log": _interval_log, "ln": _interval_log,
        "cos": iv.cos, "sin": iv.sin,
        "abs": abs, "fabs": abs, "Abs": abs,
        "min": _interval_min, "max": _interval_max, "Min": _interval_min, "Max": _interval_max,
        "pi": iv.pi, "e": iv.e, "E": iv.e, "euler": iv.euler,
        "inf": iv.inf, "ninf": -iv.inf,
        "LambertW": _interval_lambertw, "lambertw": _interval_lambertw,
        "digamma": _interval_digamma, "polygamma": _interval_polygamma, "psi": _interval_polygamma,
        "kappa": _interval_kappa, "causal_kappa": _interval_causal_kappa,
        "lambert_level": _interval_lambert_level,
    })
    return entries


def interval_namespace() -> dict:
    """Module namespace for ``sympy.lambdify(symbols, expr, modules=[interval_namespace()])``.

    Called with ``mpmath.iv.mpf`` arguments, the generated function returns an interval that
    encloses the exact value of ``expr`` (outward rounding throughout):

    * ``sqrt, exp, log, cos, sin, Abs`` -- ``mpmath.iv``;  ``Min, Max`` -- interval min/max;
    * ``pi, E`` -- enclosing intervals;  rationals ``p/q`` -- ``mpf(p)/mpf(q)`` in intervals;
      Floats -- their exact binary value;
    * ``LambertW`` (principal branch, certified through ``w e^w``), ``digamma`` (asymptotic
      series with its DLMF 5.11(ii) remainder);
    * lipbound's ``kappa``, ``causal_kappa``, ``lambert_level`` in tight monotone forms.

    Any other function raises :class:`~lipbound.errors.NotCertifiedError` when called.
    Not covered: ``Piecewise`` and relations (lambdify turns them into Python ``if``, which
    intervals cannot decide); :func:`interval_lambdify` refuses them.
    """
    return _IntervalNamespace(_namespace_entries())


_FLOAT_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*|\.\d+|\d+[eE][-+]?\d+)")


def interval_lambdify(symbols: Iterable, expr) -> Callable:
    """``sympy.lambdify`` with :func:`interval_namespace`, checked.

    Refuses (:class:`~lipbound.errors.NotCertifiedError`) expressions with ``Piecewise`` or
    relations, and generated code that contains a float literal (a constant that would not
    be enclosed).  Call the result with ``mpmath.iv.mpf`` arguments.
    """
    import inspect

    import sympy as sp

    expr = sp.sympify(expr)
    if expr.atoms(sp.Piecewise) or expr.atoms(sp.core.relational.Relational):
        raise NotCertifiedError("expr", "an expression without Piecewise or relations", str(expr),
                                "interval arithmetic cannot decide branches; split the cases")
    function = sp.lambdify(list(symbols), expr, modules=[interval_namespace()])
    source = inspect.getsource(function)
    body = source.split(":", 1)[1] if ":" in source else source
    stripped = re.sub(r"mpf\(\([^)]*\)\)", "", body)
    if _FLOAT_LITERAL.search(stripped):
        raise NotCertifiedError("expr", "code whose constants are all enclosed", source.strip(),
                                "report this expression: a constant was printed as a float")
    return function
