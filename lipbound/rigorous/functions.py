"""Rigorous interval versions of the functions lipbound's bounds contain.

Each function takes intervals of :data:`~lipbound.rigorous.intervals.IV` (or exact numbers)
and returns an interval that encloses the exact image:

* ``sqrt``, ``log`` (clipping a lower end that rounding pushed below 0), ``minimum``,
  ``log10_upper_product`` (the decimal exponent of a product too large for a float),
  ``maximum``, ``tanh`` (through ``exp``, increasing);
* ``lambertw`` -- the principal branch ``W_0``, endpoints certified through ``w e^w``;
* ``digamma`` -- the asymptotic series with its remainder bound (DLMF 5.11(ii));
* ``erf`` -- the alternating Taylor series with its tail, or ``1 - erfc`` with the
  bound ``erfc(x) <= e^{-x^2} / (x sqrt(pi))`` for large arguments;
* lipbound's column-sum constants ``kappa(n, omega) = n / (1 + (n - 1) e^{-omega})`` and
  ``causal_kappa(n, omega) = sum_{i=1}^{n} 1 / (1 + (i - 1) e^{-omega})``, and the Lambert
  level ``W_0((n - 1)/e)``, in forms where each argument appears once (tight intervals).
"""

from __future__ import annotations

import functools
import math

import mpmath
from mpmath import libmp

from ..errors import NotCertifiedError
from .intervals import IV, _raw, hull, interval, point, precision, upper

__all__ = ["sqrt", "log", "log10_upper_product", "tanh", "minimum", "maximum", "lambertw", "digamma", "polygamma",
           "erf", "kappa", "causal_kappa", "lambert_level", "exact_positive_integer"]


def sqrt(x):
    """Square root; a lower end below 0 (rounding of a non-negative quantity) is clipped to 0."""
    lo, hi = _raw(interval(x))
    if libmp.mpf_lt(hi, libmp.fzero):
        raise NotCertifiedError("sqrt argument", "a non-negative number", f"the interval {interval(x)}",
                                "the expression takes the square root of a negative quantity")
    if libmp.mpf_lt(lo, libmp.fzero):
        lo = libmp.fzero
    return IV.sqrt(IV.make_mpf((lo, hi)))


def log(x):
    lo, hi = _raw(interval(x))
    if libmp.mpf_le(hi, libmp.fzero):
        raise NotCertifiedError("log argument", "a positive number", f"the interval {interval(x)}",
                                "the expression takes the logarithm of a non-positive quantity")
    return IV.log(IV.make_mpf((libmp.fzero if libmp.mpf_lt(lo, libmp.fzero) else lo, hi)))


def log10_upper_product(*values) -> float:
    """``log10`` of the product of positive factors, rounded up: finite where the product itself overflows a float.

    The product is formed in interval arithmetic (mpmath's exponents do not overflow), so a whole model's
    bound of 1e400 is reported as its exponent 400.0... instead of ``inf``.
    """
    if not all(math.isfinite(value) for value in values):
        return math.inf
    total = interval(1.0)
    for value in values:
        total = total * interval(value)
    return upper(log(total) / IV.log(10))


def tanh(x):
    """``tanh x = 1 - 2 / (e^{2x} + 1)``: x appears once and the map increases, so the enclosure is tight."""
    return 1 - 2 / (IV.exp(2 * interval(x)) + 1)


def _extremum(args, largest: bool):
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    items = [_raw(interval(a)) for a in args]
    key = functools.cmp_to_key(libmp.mpf_cmp)
    pick = max if largest else min
    return IV.make_mpf((pick((lo for lo, _ in items), key=key), pick((hi for _, hi in items), key=key)))


def minimum(*args):
    """Interval minimum ``[min a_i, min b_i]`` (also of one list)."""
    return _extremum(args, largest=False)


def maximum(*args):
    """Interval maximum ``[max a_i, max b_i]`` (also of one list)."""
    return _extremum(args, largest=True)


# Lambert W ------------------------------------------------------------------------------------
def _lambertw_endpoint(p, direction: int):
    """Certified bound on ``W_0(p)`` for a raw mpf ``p >= -1/e``: below it if ``direction < 0``,
    above it if ``direction > 0``.  A candidate from mpmath at raised precision is checked:
    ``f(w) = w e^w`` increases on ``[-1, oo)`` and ``f(W_0(p)) = p``, so ``w >= -1`` with
    ``sup f(w) <= p`` proves ``w <= W_0(p)`` (and symmetrically)."""
    if p in (libmp.finf, libmp.fninf):
        return p
    prec = IV.prec
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
        w = point(candidate)
        image_lo, image_hi = _raw(w * IV.exp(w))
        if direction < 0 and libmp.mpf_le(image_hi, p):
            return candidate
        if direction > 0 and libmp.mpf_ge(image_lo, p) and libmp.mpf_ge(candidate, minus_one):
            return candidate
        margin *= 2 ** 16
    raise NotCertifiedError("LambertW", "an enclosure certified by w e^w", f"argument {mpmath.mpf(p)}",
                            "evaluate inside lipbound.rigorous.precision(...) with more bits")


def lambertw(x, k=0):
    """Principal branch ``W_0`` on an interval (increasing on ``[-1/e, oo)``)."""
    if k != 0:
        raise NotCertifiedError("LambertW branch", "the principal branch k = 0", str(k),
                                "only W_0 has a rigorous interval version here")
    lo, hi = _raw(interval(x))
    floor = _raw(-IV.exp(-1))  # -1/e enclosed
    if libmp.mpf_lt(hi, floor[0]):
        raise NotCertifiedError("LambertW argument", "a number >= -1/e", f"the interval {interval(x)}",
                                "W_0 is real only on [-1/e, oo)")
    bottom = libmp.from_int(-1) if libmp.mpf_le(lo, floor[1]) else _lambertw_endpoint(lo, -1)
    return IV.make_mpf((bottom, _lambertw_endpoint(hi, +1)))


# Digamma --------------------------------------------------------------------------------------
# Bernoulli numbers B_2 .. B_18 for the asymptotic series (DLMF 5.11.2)
_BERNOULLI = ((1, 6), (-1, 30), (1, 42), (-1, 30), (5, 66), (-691, 2730), (7, 6), (-3617, 510), (43867, 798))


def _digamma_point(p):
    """``psi(p)`` for a raw mpf ``p > 0``: shift with ``psi(x) = psi(x + 1) - 1/x`` until
    ``x >= 16``, then ``psi(x) = ln x - 1/(2x) - sum_{k=1}^{8} B_{2k} / (2k x^{2k}) + r`` with
    ``|r|`` at most the first neglected term (DLMF 5.11(ii))."""
    if p == libmp.finf:
        return IV.make_mpf((libmp.finf, libmp.finf))
    x = point(p)
    shift = IV.mpf(0)
    sixteen = libmp.from_int(16)
    while libmp.mpf_lt(_raw(x)[0], sixteen):
        shift = shift + 1 / x
        x = x + 1
    inverse_square = 1 / (x * x)
    total = IV.log(x) - 1 / (2 * x)
    power = inverse_square
    for k, (num, den) in enumerate(_BERNOULLI[:-1], start=1):
        total = total - IV.mpf(num) / IV.mpf(den) / (2 * k) * power
        power = power * inverse_square
    num, den = _BERNOULLI[-1]
    remainder_hi = _raw(abs(IV.mpf(num) / IV.mpf(den)) / (2 * len(_BERNOULLI)) * power)[1]
    return total + IV.make_mpf((libmp.mpf_neg(remainder_hi), remainder_hi)) - shift


def digamma(x):
    """``psi`` on an interval in ``(0, oo)``, where it is increasing."""
    lo, hi = _raw(interval(x))
    if not libmp.mpf_gt(lo, libmp.fzero):
        raise NotCertifiedError("digamma argument", "an interval in (0, oo)", f"{interval(x)}",
                                "psi has poles at 0, -1, -2, ...; only positive arguments are supported")
    return IV.make_mpf((_raw(_digamma_point(lo))[0], _raw(_digamma_point(hi))[1]))


def polygamma(order, x):
    if order != 0:
        raise NotCertifiedError("polygamma order", "0 (the digamma function)", str(order),
                                "only psi = polygamma(0, .) has a rigorous interval version here")
    return digamma(x)


# The error function ---------------------------------------------------------------------------
def _erf_point(p, tail_from: int = 6):
    """``erf`` at a raw mpf ``p >= 0``, enclosed (beyond ``tail_from`` by ``1 - erfc`` with erfc's upper bound alone:
    an absolute width of about ``e^(-x^2)``)."""
    x = point(p)
    if libmp.mpf_gt(p, libmp.from_int(tail_from)):
        tail_hi = _raw(IV.exp(-x * x) / (x * IV.sqrt(IV.pi)))[1]  # 0 < erfc(x) <= e^{-x^2} / (x sqrt(pi))
        return IV.make_mpf((_raw(1 - point(tail_hi))[0], libmp.from_int(1)))
    # alternating series; terms decrease once k > x^2; cancellation costs about x^2 log2(e) bits
    x_squared = float(mpmath.mpf(p)) ** 2
    extra = int(x_squared * 1.45) + 16
    with precision(IV.prec + extra):
        x = point(p)
        square = x * x
        term = x  # x^(2k+1) / k!
        piece = term  # term / (2k + 1)
        total = IV.mpf(0)
        tiny = libmp.from_man_exp(1, -IV.prec - 4)
        k = 0
        while True:
            total = total + piece if k % 2 == 0 else total - piece
            term = term * square / (k + 1)
            k += 1
            piece = term / (2 * k + 1)
            if k > x_squared + 2 and libmp.mpf_lt(_raw(piece)[1], tiny):
                bound = _raw(piece)[1]  # the first neglected term bounds the alternating tail
                total = total + IV.make_mpf((libmp.mpf_neg(bound), bound))
                break
        result = 2 / IV.sqrt(IV.pi) * total
    return result


def erf(x, tail_from: int = 6):
    """The error function on an interval (odd and increasing); ``tail_from``: beyond it the series gives way to
    the tail bound, ``1 - e^(-x^2) / (x sqrt(pi)) <= erf(x) <= 1`` (cheap; width about 1e-17 at 6, which a
    high-precision evaluation cannot afford: it passes a larger limit)."""
    lo, hi = _raw(interval(x))

    def at(raw):
        if libmp.mpf_lt(raw, libmp.fzero):
            return -_erf_point(libmp.mpf_neg(raw), tail_from)
        return _erf_point(raw, tail_from)

    if lo == hi:  # a point: one series
        return at(lo)
    width = _raw(point(hi) - point(lo))[1]
    if libmp.mpf_lt(width, libmp.from_man_exp(1, -40)):  # narrow: erf' <= 2 / sqrt(pi) bounds the rest
        start = at(lo)
        return IV.make_mpf((_raw(start)[0], _raw(start + point(width) * 2 / IV.sqrt(IV.pi))[1]))
    return IV.make_mpf((_raw(at(lo))[0], _raw(at(hi))[1]))


# Column sums and Lambert levels ---------------------------------------------------------------
def kappa(size, spread):
    """``kappa(n, omega) = n / (1 + (n - 1) e^{-omega})`` (omega appears once: tight)."""
    size = interval(size)
    return size / (1 + (size - 1) * IV.exp(-interval(spread)))


def exact_positive_integer(name: str, value) -> int:
    """The exact positive integer an interval holds (a size), or :class:`NotCertifiedError`."""
    lo, hi = _raw(interval(value))
    as_int = libmp.to_int(lo)
    if lo != hi or libmp.from_int(as_int) != lo or as_int < 1:
        raise NotCertifiedError(name, "an exact positive integer", str(interval(value)), "pass the size as an int")
    return as_int


def _causal_sum(size: int, spread_raw):
    """``g(omega) = sum_{i=1}^{n} 1 / (1 + (i - 1) e^{-omega})`` at a point omega, enclosed."""
    q = IV.exp(-point(spread_raw))
    if size <= 4096:
        total = IV.mpf(0)
        for i in range(size):
            total = total + 1 / (1 + i * q)
        return total
    correction = q * (size * (size - 1) // 2)
    if libmp.mpf_le(_raw(correction)[1], libmp.from_man_exp(1, -60)):
        # 1 - (i - 1) q <= 1 / (1 + (i - 1) q) <= 1
        return IV.mpf(size) - IV.make_mpf((libmp.fzero, _raw(correction)[1]))
    # g = X (psi(X + n) - psi(X)), X = e^omega: the cancellation needs about log2(X) more bits
    with precision(IV.prec + 64 + max(0, int(float(mpmath.mpf(spread_raw)) * 1.4427) + 1)):
        X = IV.exp(point(spread_raw))
        return X * (digamma(X + size) - digamma(X))


def causal_kappa(size, spread):
    """``sum_{i=1}^{n} e^omega / (e^omega + i - 1)``, increasing in omega: evaluated at the ends of
    omega so that the cancellation of the digamma form never widens it."""
    n = exact_positive_integer("n", size)
    lo, hi = _raw(interval(spread))
    return hull(_causal_sum(n, lo), _causal_sum(n, hi))


def lambert_level(size):
    """``W_0((n - 1) / e)``."""
    return lambertw((interval(size) - 1) * IV.exp(-1))
