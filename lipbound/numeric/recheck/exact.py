"""Exact dyadic matrices and balls (an exact centre, a float radius rounded up): the arithmetic of
the re-check (:mod:`lipbound.numeric.recheck`)."""

from __future__ import annotations

import math
from typing import final

import numpy as np
from mpmath import libmp

from ...errors import AssumptionError
from ...rigorous.elementwise import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF
from ...rigorous.intervals import IV, upper

__all__ = ["Dyadic", "Ball", "exact_sqrt", "concat", "inflate", "widen"]


# ---------------------------------------------------------------------------------------------
# Exact dyadic matrices
# ---------------------------------------------------------------------------------------------
@final
class Dyadic:
    """An exact real matrix ``m * 2**e``: ``m`` an object array of Python ints, ``e`` an int."""

    __slots__ = ("m", "e")

    def __init__(self, m: np.ndarray, e: int):
        self.m, self.e = m, int(e)

    @classmethod
    def of(cls, array) -> Dyadic:
        """The exact value of a float64 array."""
        array = np.asarray(array, dtype=np.float64)
        mantissa, exponent = np.frexp(array)
        ints = np.ldexp(mantissa, 53).astype(np.int64)           # exact: |mantissa| < 1
        exponent = exponent.astype(np.int64) - 53
        nonzero = ints != 0
        base = int(exponent[nonzero].min()) if np.any(nonzero) else 0
        shifts = np.where(nonzero, exponent - base, 0).astype(object)
        return cls(ints.astype(object) << shifts, base)

    @property
    def shape(self):
        return self.m.shape

    def _aligned(self, other: Dyadic):
        e = min(self.e, other.e)
        return self.m << (self.e - e), other.m << (other.e - e), e

    def __add__(self, other: Dyadic) -> Dyadic:
        a, b, e = self._aligned(other)
        return Dyadic(a + b, e)

    def __sub__(self, other: Dyadic) -> Dyadic:
        a, b, e = self._aligned(other)
        return Dyadic(a - b, e)

    def __matmul__(self, other: Dyadic) -> Dyadic:
        return Dyadic(self.m @ other.m, self.e + other.e)

    def __mul__(self, other: Dyadic) -> Dyadic:
        return Dyadic(self.m * other.m, self.e + other.e)

    @property
    def T(self) -> Dyadic:
        return Dyadic(self.m.T, self.e)

    def row_sums_of_squares(self) -> Dyadic:
        return Dyadic(np.sum(self.m * self.m, axis=-1), 2 * self.e)

    def beside_square(self, radius: float) -> tuple[list[int], int]:
        """The entries and ``radius**2`` as integers on one exponent, to compare exactly (e.g. row sums of
        squares against a ball's squared radius)."""
        limit = Dyadic.of(np.array([radius]))
        limit = limit * limit
        e = min(self.e, limit.e)
        return [int(value) << (self.e - e) for value in self.m.ravel()], int(limit.m[0]) << (limit.e - e)

    def intervals(self) -> np.ndarray:
        """Exact (point) intervals, an object array of ``IV.mpf``."""
        out = np.empty(self.m.shape, dtype=object)
        for index, man in np.ndenumerate(self.m):
            raw = libmp.from_man_exp(int(man), self.e)       # no precision given: exact
            out[index] = IV.make_mpf((raw, raw))
        return out

    def abs_upper(self) -> np.ndarray:
        """``|value|`` elementwise as float64, rounded up."""
        out = np.empty(self.m.shape)
        for index, man in np.ndenumerate(self.m):
            raw = libmp.from_man_exp(abs(int(man)), self.e)
            out[index] = upper(IV.make_mpf((raw, raw)))
        return out

    def total(self) -> int:
        """Sum of all mantissas (for exact sums of squares, with exponent ``e``)."""
        return int(np.sum(self.m)) if self.m.size else 0


def exact_sqrt(man: int, e: int):
    """``sqrt(man 2^e)`` as an interval."""
    raw = libmp.from_man_exp(int(man), int(e))
    return IV.sqrt(IV.make_mpf((raw, raw)))


def concat(parts: list[Dyadic], axis: int) -> Dyadic:
    e = min(p.e for p in parts)
    return Dyadic(np.concatenate([p.m << (p.e - e) for p in parts], axis=axis), e)


# ---------------------------------------------------------------------------------------------
# Balls: exact centre +- float radius
# ---------------------------------------------------------------------------------------------
def inflate(array: np.ndarray, length: int) -> np.ndarray:
    """Upper bound on a non-negative float computation of ``length`` products summed: the
    computed value times ``1 + 2 (length + 2) u`` (doubled for safety), plus underflow slack,
    one ulp up (Higham 2002, eq. 3.13 with gamma_k <= 2 k u)."""
    factor = 1.0 + 4.0 * (length + 2) * UNIT_ROUNDOFF
    return np.nextafter(np.asarray(array, dtype=np.float64) * factor + (length + 2) * SMALLEST_SUBNORMAL, np.inf)


@final
class Ball:
    """Elementwise enclosure ``center +- radius`` of a matrix: ``center`` exact, ``radius`` float64
    (every entry an upper bound)."""

    __slots__ = ("center", "radius")

    def __init__(self, center: Dyadic, radius: np.ndarray):
        self.center, self.radius = center, np.asarray(radius, dtype=np.float64)

    @classmethod
    def exact(cls, value: Dyadic) -> Ball:
        return cls(value, np.zeros(value.shape))

    @classmethod
    def of_intervals(cls, values: np.ndarray) -> Ball:
        """An interval matrix ``[lo, hi]`` as ``lo +- (hi - lo)`` (centre exact, radius rounded up)."""
        mans = np.empty(values.shape, dtype=object)
        exps = np.zeros(values.shape, dtype=np.int64)
        radius = np.empty(values.shape)
        for index, x in np.ndenumerate(values):
            lo, hi = x._mpi_
            if any(raw in (libmp.fninf, libmp.finf, libmp.fnan) for raw in (lo, hi)):
                raise AssumptionError("witness", "finite intermediate values", "an infinite interval",
                                      "raise the working precision (dps) or check the weights")
            sign, man, exp, _ = lo
            mans[index], exps[index] = (-man if sign else man), exp
            width = libmp.mpf_sub(hi, lo)                     # exact (no precision given)
            radius[index] = upper(IV.make_mpf((width, width)))
        nonzero = np.array([m != 0 for m in mans.ravel()], dtype=bool).reshape(values.shape)
        base = int(exps[nonzero].min()) if np.any(nonzero) else 0
        shifts = np.where(nonzero, exps - base, 0).astype(object)
        return cls(Dyadic(mans << shifts, base), radius)

    def intervals(self) -> np.ndarray:
        """The entries as intervals ``center +- radius`` (an object array of ``IV.mpf``; :meth:`of_intervals` the
        other way)."""
        out = self.center.intervals()
        for index, radius in np.ndenumerate(self.radius):
            out[index] = widen(out[index], float(radius))
        return out

    def __add__(self, other: Ball) -> Ball:
        return Ball(self.center + other.center, inflate(self.radius + other.radius, 1))

    def __sub__(self, other: Ball) -> Ball:
        return Ball(self.center - other.center, inflate(self.radius + other.radius, 1))

    def matmul_exact(self, matrix: Dyadic, absolute: np.ndarray | None = None) -> Ball:
        """``(c +- r) B = c B +- r |B|``; ``absolute``: an upper bound on ``|B|`` the caller holds (``|W|`` of a
        float matrix W is exact in floats)."""
        radius = inflate(self.radius @ (matrix.abs_upper() if absolute is None else absolute), matrix.shape[0])
        return Ball(self.center @ matrix, radius)

    def frobenius(self):
        """Interval enclosing ``||value||_F``."""
        c2 = self.center.row_sums_of_squares()
        centre = exact_sqrt(c2.total(), c2.e)
        spread = upper(IV.sqrt(IV.mpf(float(inflate(np.sum(self.radius ** 2), self.radius.size)))))
        return widen(centre, spread)

    def max_abs(self):
        """Interval enclosing ``max_ij |value_ij|`` (the l_inf norm of vec)."""
        lo, hi = IV.mpf(0), IV.mpf(0)
        for (_index, man), radius in zip(np.ndenumerate(self.center.m), self.radius.ravel()):
            raw = libmp.from_man_exp(abs(int(man)), self.center.e)
            entry = IV.make_mpf((raw, raw))
            lo = max(lo, entry - float(radius), key=lambda v: v.a)
            hi = max(hi, entry + float(radius), key=lambda v: v.b)
        return IV.make_mpf((lo._mpi_[0], hi._mpi_[1]))

    def mixed21(self):
        """Interval enclosing ``sum_i ||row_i||_2``."""
        c2 = self.center.row_sums_of_squares()
        total = IV.mpf(0)
        for man in c2.m:
            total += exact_sqrt(man, c2.e)
        spread = float(inflate(np.sum(np.sqrt(inflate(np.sum(self.radius ** 2, axis=-1), self.radius.shape[-1]))),
                                self.radius.shape[0]))
        return widen(total, math.nextafter(spread, math.inf))


def widen(x, radius: float):
    """``x +- radius`` as an interval (outward)."""
    return x + IV.mpf([-radius, radius])
