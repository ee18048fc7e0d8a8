"""Rigorous bounds of elementary functions on whole float arrays: ``exp`` and the normal CDF.

:mod:`lipbound.rigorous.functions` encloses one mpmath interval at a time; the local
certificates need the same guarantee for millions of entries (attention weights, GELU slopes),
so these work on numpy arrays and use only operations IEEE 754 rounds correctly (``+ - * /``,
``sqrt``, ``ldexp``), never the platform's ``exp`` or ``erf``, whose accuracy is not specified.

* :func:`exp_bounds` -- ``exp(x) = 2^k exp(r)``, ``r = x - k ln 2`` enclosed with an outward
  enclosure of ``ln 2``, and ``exp(r)``, ``|r| <= 0.35``, by its Taylor polynomial of degree 16
  (Horner, error ``gamma_{34} e^{|r|}`` by Higham's Horner bound, *Accuracy and Stability of
  Numerical Algorithms*, eq. 5.3), truncation ``|r|^17 / 17! e^{|r|}``.
* :func:`normal_cdf_bounds` -- ``Phi(x) = Phi(t) + sum_{m=1}^{M} a_m (x - t)^m + R`` about the
  grid point t nearest to x (step 1/32 on [-8, 8]), with ``a_m = phi^{(m-1)}(t) / m!``
  ``= (-1)^{m-1} He_{m-1}(t) phi(t) / m!`` and ``|R| <= |x - t|^{M+1} / (M+1)! sup |phi^{(M)}|``
  over the grid cell; the table is built once in interval arithmetic at 160 bits by stepping the
  same series from ``Phi(0) = 1/2``, so no ``erf`` is called.  Beyond |x| > 8 the monotone tails
  ``[0, Phi(-8)]`` and ``[Phi(8), 1]`` are returned.

Every function returns ``(lower, upper)`` float arrays with ``lower <= f(x) <= upper`` for every
entry of the float array x (taken exactly).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from mpmath import libmp

from ..errors import NotCertifiedError
from .functions import erf
from .intervals import IV, _raw, interval, lower, precision, upper

__all__ = ["UNIT_ROUNDOFF", "SMALLEST_SUBNORMAL", "down", "up", "up_nonnegative", "all_finite", "gamma_bound",
           "exp_bounds", "normal_cdf_bounds", "normal_pdf_bounds",
           "inv_sqrt_2pi", "gelu_slope_extrema"]

UNIT_ROUNDOFF = 2.0 ** -53
#: The smallest positive double: the most a rounding into the subnormals moves a result.
SMALLEST_SUBNORMAL = 2.0 ** -1074
_U = UNIT_ROUNDOFF
_TAYLOR_DEGREE = 16
_EXP_OVERFLOW = 709.0  # exp(709.78) overflows a double


_ULP_FACTOR = 2.0 ** -52


def down(x):
    """A float at or below the next float below every entry: it encloses the exact result of one
    correctly rounded operation.  ``x - (|x| 2^-52 + 2^-1074)``: the subtracted amount is at least
    one ulp of x (exactly scaled, the smallest subnormal covering underflow), and rounding to
    nearest is monotone, so the result is at most ``nextafter(x, -inf)``."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        return x - (np.abs(x) * _ULP_FACTOR + SMALLEST_SUBNORMAL)
    step = np.abs(x)          # one temporary, updated in place: the same roundings as the formula
    step *= _ULP_FACTOR
    step += SMALLEST_SUBNORMAL
    return np.subtract(x, step, out=step)


def up(x):
    """A float at or above the next float above every entry (see :func:`down`)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        return x + (np.abs(x) * _ULP_FACTOR + SMALLEST_SUBNORMAL)
    step = np.abs(x)
    step *= _ULP_FACTOR
    step += SMALLEST_SUBNORMAL
    return np.add(x, step, out=step)


_STEP_UP = 1.0 + 2.0 ** -52  # nextafter(1, inf), exactly representable


def up_nonnegative(x, out=None):
    """:func:`up` for non-negative entries, in two passes: ``fl(fl(x (1 + 2^-52)) + 2^-1074)``.

    For a normal ``x`` in ``[2^e, 2^(e+1))`` the exact product exceeds x by ``x 2^-52 >= 2^(e-52)``, one
    ulp of x, so it is at least ``nextafter(x, inf)``, a float; rounding to nearest is monotone and keeps
    floats, so ``fl(x (1 + 2^-52)) >= nextafter(x, inf)``, and adding ``2^-1074`` cannot lower it.  For a
    subnormal x (or 0) the product rounds to at least x and adding the smallest subnormal is exact
    there, giving at least ``x + 2^-1074 = nextafter(x, inf)``.  ``out`` may be x itself (the caller
    owns a temporary)."""
    x = np.asarray(x, dtype=np.float64)
    result = np.multiply(x, _STEP_UP, out=out if isinstance(out, np.ndarray) else None)
    result += SMALLEST_SUBNORMAL
    return result


#: Up to this many entries :func:`all_finite` tests each entry at once: the sum's error-state context costs more
#: than the temporary (about 9 against 2 microseconds a call for 16 entries; tiny maps make 10^5 such calls).
_SMALL_ARRAY = 1024


def all_finite(array: np.ndarray) -> bool:
    """Whether every entry is finite.  A small array is tested entry by entry; for a larger one a finite sum
    proves it (an Inf or NaN entry makes the sum Inf or NaN) in one pass without a temporary; only a sum that
    is not finite is looked at entry by entry (an entry is not finite, or the sum of finite entries
    overflowed)."""
    if getattr(array, "size", _SMALL_ARRAY + 1) <= _SMALL_ARRAY:
        return bool(np.isfinite(array).all())
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.sum(array)):
            return True
    return bool(np.all(np.isfinite(array)))


def gamma_bound(k: int) -> float:
    """``gamma_k = k u / (1 - k u)``, rounded up (Higham, Lemma 3.1)."""
    if k * _U >= 0.25:
        raise NotCertifiedError("size", f"k u < 1/4 (k < {int(0.25 / _U)})", str(k),
                                "the problem is too large for the floating-point error bounds")
    return k * _U / (1.0 - k * _U) * (1.0 + 4 * _U)


def _ends(value) -> tuple[float, float]:
    return lower(value), upper(value)


@functools.lru_cache(maxsize=1)
def _exp_constants():
    with precision(120):
        ln2 = _ends(IV.log(2))
        coefficients = []
        factorial = 1
        for m in range(_TAYLOR_DEGREE + 1):
            factorial *= max(m, 1)
            coefficients.append(float(1.0 / factorial))  # rounded to nearest; its error enters the bound
    # |fl(p(r)) - e^r| <= gamma_{2N+2} e^{|r|} (Horner with coefficients within u of 1/m!)
    #                     + |r|^{N+1} / (N+1)! e^{|r|}; with |r| <= 0.36 and N = 16 this is below 6e-15.
    bound = (gamma_bound(2 * _TAYLOR_DEGREE + 2) + 2 * _U) * math.exp(0.37) * 1.001 \
        + 0.37 ** 17 / math.factorial(17) * 2
    return ln2, np.array(coefficients), bound


def _taylor_exp(r: np.ndarray) -> np.ndarray:
    coefficients = _exp_constants()[1]
    total = np.full_like(r, coefficients[-1])
    for c in coefficients[-2::-1]:
        total = total * r + c
    return total


def exp_bounds(x) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` with ``lower <= exp(x) <= upper`` for every entry of the float array x.

    Raises
    ------
    NotCertifiedError
        An entry above 709 (the result would overflow) or NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    if np.any(np.isnan(x)):
        raise NotCertifiedError("exp argument", "numbers", "NaN", "check the computation that produced it")
    if np.any(x > _EXP_OVERFLOW):
        raise NotCertifiedError("exp argument", f"values at most {_EXP_OVERFLOW} (exp overflows beyond)",
                                f"a value {float(np.max(x)):.6g}", "shift the scores by their row maximum first")
    (ln2_lo, ln2_hi), _, error = _exp_constants()
    clipped = np.maximum(x, -746.0)  # exp(-746) is below the smallest subnormal
    k = np.rint(clipped / ln2_hi)  # an integer-valued float, |k| <= 1077
    # k ln 2 lies between k ln2_lo and k ln2_hi; the products are rounded outward
    ends = (k * ln2_lo, k * ln2_hi)
    product_lo, product_hi = down(np.minimum(*ends)), up(np.maximum(*ends))
    r_lo, r_hi = down(clipped - product_hi), up(clipped - product_lo)
    p_lo = down(_taylor_exp(r_lo) - error)
    p_hi = up(_taylor_exp(r_hi) + error)
    exponent = k.astype(np.int64)
    lo = np.maximum(down(np.ldexp(np.maximum(p_lo, 0.0), exponent)), 0.0)
    hi = up(np.ldexp(p_hi, exponent))  # ldexp is exact unless the result is subnormal (then within 1 ulp)
    lo = np.where(x < -746.0, 0.0, lo)
    return lo, hi


# The normal distribution ---------------------------------------------------------------------
_STEPS = 32          # grid points per unit
_LIMIT = 8           # table on [-8, 8]
_ORDER = 9           # Taylor order of the evaluation, |x - t| <= 1/64
_STEP_ORDER = 16     # Taylor order of the steps that build the table, |s| = 1/32


_INTEGERS = [IV.mpf(m) for m in range(64)]


def _symmetric(bound_raw):
    return IV.make_mpf((libmp.mpf_neg(bound_raw), bound_raw))


def _hermite(t, order: int) -> list:
    """Probabilists' Hermite polynomials ``He_0(t), ..., He_order(t)``: ``He_{m+1} = t He_m - m He_{m-1}``."""
    values = [IV.mpf(1), t]
    for m in range(1, order):
        values.append(t * values[m] - _INTEGERS[m] * values[m - 1])
    return values[:order + 1]


def _cdf_coefficients(t, order: int, inv_sqrt_2pi) -> list:
    """``a_m = Phi^{(m)}(t) / m! = (-1)^{m-1} He_{m-1}(t) phi(t) / m!`` for m = 1..order."""
    phi = IV.exp(-t * t / 2) * inv_sqrt_2pi
    he = _hermite(t, order)
    out, factorial = [], IV.mpf(1)
    for m in range(1, order + 1):
        factorial = factorial * _INTEGERS[m]
        term = he[m - 1] * phi / factorial
        out.append(term if m % 2 else -term)
    return out


def _cdf_remainder(h, order: int, inv_sqrt_2pi):
    """``sup_{|xi| <= 8.1} |phi^{(order)}(xi)| |h|^{order+1} / (order+1)!``, a bound on the Taylor
    remainder of Phi over any cell of the table (the supremum over 64 subintervals)."""
    cells = [IV.mpf([k, k + 1]) * (_LIMIT + 0.125) / 64 for k in range(0, 64)]
    derivative = max((_raw(abs(_hermite(c, order)[order] * IV.exp(-c * c / 2) * inv_sqrt_2pi))[1] for c in cells),
                     key=functools.cmp_to_key(libmp.mpf_cmp))
    return point_raw(derivative) * abs(h) ** (order + 1) / math.factorial(order + 1)


def point_raw(raw):
    return IV.make_mpf((raw, raw))


@functools.lru_cache(maxsize=1)
def _normal_table():
    """Per grid point ``t_k = k / 32`` on [-8, 8]: ``Phi(t_k)`` enclosed, the Taylor coefficients
    ``a_1..a_9`` (float midpoints), and one error bound for the cell ``|x - t_k| <= 1/64`` (the
    coefficients' radii, the rounding of the float Horner evaluation and the remainder).  Built for
    t >= 0 and mirrored: ``Phi(-t) = 1 - Phi(t)`` and ``a_m(-t) = (-1)^(m-1) a_m(t)``."""
    side = _LIMIT * _STEPS
    cdf_lo, cdf_hi = np.empty(2 * side + 1), np.empty(2 * side + 1)
    coef_mid, cell_error = np.empty((2 * side + 1, _ORDER)), np.empty(2 * side + 1)
    parity = np.array([(-1.0) ** m for m in range(_ORDER)])  # a_{m+1}(-t) = (-1)^m a_{m+1}(t)
    with precision(100):
        inv = 1 / IV.sqrt(2 * IV.pi)
        half, s = IV.mpf(1) / (2 * _STEPS), IV.mpf(1) / _STEPS
        current = IV.mpf(1) / 2  # Phi(0) = 1/2 exactly; step outwards
        evaluation_remainder = _cdf_remainder(half, _ORDER, inv)
        step_remainder = _symmetric(_raw(_cdf_remainder(s, _STEP_ORDER, inv))[1])
        for j in range(side + 1):
            t = IV.mpf(j) / _STEPS
            lo_c, hi_c = _ends(current)
            cdf_lo[side + j], cdf_hi[side + j] = lo_c, hi_c
            cdf_lo[side - j], cdf_hi[side - j] = _ends(1 - current)
            sizes, radii = IV.mpf(0), IV.mpf(0)
            for m, a in enumerate(_cdf_coefficients(t, _ORDER, inv)):
                lo_a, hi_a = _ends(a)
                mid = 0.5 * lo_a + 0.5 * hi_a
                coef_mid[side + j, m] = mid
                radius = abs(interval((lo_a, hi_a)) - mid)
                sizes = sizes + (abs(IV.mpf(mid)) + radius) * half ** (m + 1)
                radii = radii + radius * half ** (m + 1)
            rounding = interval(gamma_bound(2 * _ORDER + 4)) * sizes
            cell_error[side + j] = cell_error[side - j] = upper(rounding + radii + evaluation_remainder)
            coef_mid[side - j] = coef_mid[side + j] * parity
            if j < side:
                increment = sum((a * s ** (m + 1) for m, a in enumerate(_cdf_coefficients(t, _STEP_ORDER, inv))),
                                IV.mpf(0))
                current = current + increment + step_remainder
    return cdf_lo, cdf_hi, coef_mid, cell_error


def normal_cdf_bounds(x) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` enclosing the standard normal CDF ``Phi(x)`` entrywise (x taken exactly)."""
    x = np.asarray(x, dtype=np.float64)
    if np.any(np.isnan(x)):
        raise NotCertifiedError("Phi argument", "numbers", "NaN", "check the computation that produced it")
    cdf_lo, cdf_hi, coefficients, cell_error = _normal_table()
    edge = _LIMIT * _STEPS
    scaled = np.clip(np.rint(np.clip(x, -2.0 * _LIMIT, 2.0 * _LIMIT) * _STEPS), -edge, edge)
    index = (scaled + edge).astype(np.int64)
    h = x - scaled / _STEPS  # exact (Sterbenz) wherever |h| <= 1/64
    inside = np.abs(h) <= 1.0 / (2 * _STEPS)
    h = np.where(inside, h, 0.0)
    total = coefficients[index, -1]
    for m in range(_ORDER - 2, -1, -1):
        total = total * h + coefficients[index, m]
    total = total * h
    lo = np.maximum(down(down(cdf_lo[index] + total) - cell_error[index]), 0.0)
    hi = np.minimum(up(up(cdf_hi[index] + total) + cell_error[index]), 1.0)
    lo = np.where(inside, lo, np.where(x < 0, 0.0, cdf_lo[-1]))   # monotone tails beyond |x| > 8
    hi = np.where(inside, hi, np.where(x < 0, cdf_hi[0], 1.0))
    return lo, hi


@functools.lru_cache(maxsize=1)
def _normal_constants():
    with precision(120):
        inv = 1 / IV.sqrt(2 * IV.pi)
        root = IV.sqrt(2)
        # GELU'(x) = Phi(x) + x phi(x) has its extrema at x = +-sqrt(2) (GELU'' = phi (2 - x^2))
        phi_root = IV.exp(IV.mpf(-1)) * inv
        cdf_root = (1 + erf(IV.mpf(1))) / 2
        top = cdf_root + root * phi_root
        bottom = (1 - cdf_root) - root * phi_root
    return _ends(inv), _ends(bottom), _ends(top), _ends(root)


def inv_sqrt_2pi() -> tuple[float, float]:
    """``1 / sqrt(2 pi)`` enclosed."""
    return _normal_constants()[0]


def gelu_slope_extrema() -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
    """Enclosures of ``min GELU' = GELU'(-sqrt 2)``, ``max GELU' = GELU'(sqrt 2)`` and of ``sqrt 2``."""
    _, bottom, top, root = _normal_constants()
    return bottom, top, root


#: Where the exponent's rounding ``delta`` stays below this, :func:`normal_pdf_bounds` widens one exponential by
#: ``e^(+-delta)`` (``1 - delta <= e^-delta``, ``e^delta <= 1 + 2 delta`` for ``delta <= 1``).
_PDF_ONE_EXP = 2.0 ** -20


def normal_pdf_bounds(x) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` enclosing ``phi(x) = exp(-x^2 / 2) / sqrt(2 pi)`` entrywise.

    One exponential at ``t = -fl(x^2) / 2``: the exact exponent lies within ``delta = |fl(x^2)| 2^-53 + 2^-1070`` of
    it (``fl(x^2)`` is within ``u |fl(x^2)| / (1 - u) + 2^-1075`` of ``x^2``, u = 2^-53), so ``exp(-x^2 / 2)`` lies
    in ``exp(t) [1 - delta, 1 + 2 delta]``; entries with ``delta`` above :data:`_PDF_ONE_EXP` take the exponentials
    at both ends of the exponent's enclosure (``x^2`` is taken at most 1e300: ``exp(-1e300 / 2)`` is 0 in floats)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):   # beyond 1e300 the exponential is 0 below and the smallest float above
        square = np.minimum(x * x, 1e300)
    delta = np.abs(square) * 2.0 ** -53 + 2.0 ** -1070
    e_lo, e_hi = exp_bounds(-square * 0.5)
    e_lo, e_hi = np.maximum(down(e_lo * down(1.0 - delta)), 0.0), up(e_hi * up(1.0 + 2.0 * delta))
    wide = delta > _PDF_ONE_EXP
    if np.any(wide):
        e_lo, e_hi = np.array(e_lo, dtype=np.float64), np.array(e_hi, dtype=np.float64)
        e_lo[wide] = exp_bounds(-up(up(square[wide]) * 0.5))[0]
        e_hi[wide] = exp_bounds(-down(down(square[wide]) * 0.5))[1]
    c_lo, c_hi = inv_sqrt_2pi()
    return np.maximum(down(e_lo * c_lo), 0.0), up(e_hi * c_hi)
