"""Interval arithmetic on whole numpy arrays, rounded outward: the vectorised twin of :data:`IV`.

An :class:`IntervalArray` holds float arrays ``lo <= hi`` and stands for every real array between
them.  Each operation returns an array that encloses the exact result for every choice of the
operands inside theirs:

* ``+ - * /`` and ``sqrt`` round each result one ulp outward (``nextafter``): IEEE 754 rounds
  these correctly, so the exact result lies within one ulp of the computed one;
* ``exp``, the normal CDF and density, GELU and the range of its slope go through
  :mod:`lipbound.rigorous.elementwise` (no platform ``exp`` or ``erf``);
* sums along an axis add ``gamma_{k} sum |x|`` (Higham, eq. 3.5, any order of summation);
* products with a float matrix go through :class:`~lipbound.rigorous.linalg.Enclosure`;
* :meth:`IntervalArray.norm_upper` / :meth:`norm_lower` bound the Euclidean norm of every array
  in the box along an axis.

A computation that overflows or meets NaN raises :class:`~lipbound.errors.NotCertifiedError`.
"""

from __future__ import annotations

from typing import final

import numpy as np

from ..errors import NotCertifiedError
from .elementwise import (UNIT_ROUNDOFF, down, exp_bounds, gamma_bound, gelu_slope_extrema, normal_cdf_bounds,
                          normal_pdf_bounds, up)
from .intervals import interval, lower, upper
from .linalg import Enclosure

__all__ = ["IntervalArray", "as_interval_array", "gelu", "gelu_slope", "normal_cdf", "normal_pdf"]

_ETA = 2.0 ** -1074


def _finite(name: str, *arrays) -> None:
    for array in arrays:
        if not np.all(np.isfinite(array)):
            raise NotCertifiedError(name, "finite numbers", "an overflow or NaN",
                                    "rescale the inputs; the computation exceeds the float range")


@final
class IntervalArray:
    """Every real array between ``lo`` and ``hi`` (entrywise, closed).

    Parameters
    ----------
    lo, hi : array_like
        Float arrays of one shape (broadcast); ``hi`` defaults to ``lo`` (a point array).
    """

    __slots__ = ("lo", "hi")
    __array_priority__ = 100  # numpy arrays defer to our operators

    def __init__(self, lo, hi=None):
        lo = np.asarray(lo, dtype=np.float64)
        hi = lo if hi is None else np.asarray(hi, dtype=np.float64)
        if lo.shape != hi.shape:
            lo, hi = (np.array(a) for a in np.broadcast_arrays(lo, hi))
        _finite("interval array", lo, hi)
        if np.any(lo > hi):
            raise NotCertifiedError("interval array", "lo <= hi", "a reversed interval", "build it from (lo, hi)")
        self.lo, self.hi = lo, hi

    # construction --------------------------------------------------------------------------------
    @classmethod
    def point(cls, value) -> "IntervalArray":
        """A float array taken as exact."""
        return cls(value)

    @classmethod
    def around(cls, center, radius) -> "IntervalArray":
        """``center +- radius`` (rounded outward)."""
        center, radius = np.asarray(center, dtype=np.float64), np.asarray(radius, dtype=np.float64)
        return cls(down(center - radius), up(center + radius))

    @classmethod
    def from_enclosure(cls, enclosure: Enclosure) -> "IntervalArray":
        return cls.around(enclosure.mid, enclosure.rad)

    @classmethod
    def constant(cls, value) -> "IntervalArray":
        """A 0-d enclosure of an exact number or an mpmath interval (``1 / sqrt(d_k)``)."""
        x = interval(value)
        return cls(lower(x), upper(x))

    def to_enclosure(self) -> Enclosure:
        mid = 0.5 * self.lo + 0.5 * self.hi
        rad = np.maximum(up(self.hi - mid), up(mid - self.lo))
        return Enclosure(mid, rad)

    # shape ---------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.lo.shape

    @property
    def ndim(self) -> int:
        return self.lo.ndim

    @property
    def mid(self) -> np.ndarray:
        return 0.5 * self.lo + 0.5 * self.hi

    @property
    def rad(self) -> np.ndarray:
        """An upper bound on the half-width."""
        mid = self.mid
        return np.maximum(up(self.hi - mid), up(mid - self.lo))

    @property
    def magnitude(self) -> np.ndarray:
        """``max |x|`` over each interval (exact)."""
        return np.maximum(np.abs(self.lo), np.abs(self.hi))

    @property
    def mignitude(self) -> np.ndarray:
        """``min |x|`` over each interval (exact)."""
        return np.where((self.lo <= 0) & (self.hi >= 0), 0.0, np.minimum(np.abs(self.lo), np.abs(self.hi)))

    def __getitem__(self, index) -> "IntervalArray":
        return IntervalArray(self.lo[index], self.hi[index])

    def __len__(self) -> int:
        return len(self.lo)

    def reshape(self, *shape) -> "IntervalArray":
        return IntervalArray(self.lo.reshape(*shape), self.hi.reshape(*shape))

    def lmatmul(self, W) -> "IntervalArray":
        """``W x`` over the second-to-last axis for a float matrix W (taken exactly)."""
        return self.swapaxes(-1, -2).matmul(np.asarray(W, dtype=np.float64).T).swapaxes(-1, -2)

    def swapaxes(self, a: int, b: int) -> "IntervalArray":
        return IntervalArray(np.swapaxes(self.lo, a, b), np.swapaxes(self.hi, a, b))

    def expand(self, axis: int) -> "IntervalArray":
        return IntervalArray(np.expand_dims(self.lo, axis), np.expand_dims(self.hi, axis))

    def contains(self, value) -> bool:
        value = np.asarray(value, dtype=np.float64)
        return bool(np.all((self.lo <= value) & (value <= self.hi)))

    def __repr__(self) -> str:
        return f"IntervalArray(shape={self.shape}, max width={float(np.max(self.hi - self.lo, initial=0.0)):.3g})"

    # arithmetic ----------------------------------------------------------------------------------
    def __add__(self, other) -> "IntervalArray":
        other = as_interval_array(other)
        return IntervalArray(down(self.lo + other.lo), up(self.hi + other.hi))

    __radd__ = __add__

    def __sub__(self, other) -> "IntervalArray":
        other = as_interval_array(other)
        return IntervalArray(down(self.lo - other.hi), up(self.hi - other.lo))

    def __rsub__(self, other) -> "IntervalArray":
        return as_interval_array(other) - self

    def __neg__(self) -> "IntervalArray":
        return IntervalArray(-self.hi, -self.lo)

    def __mul__(self, other) -> "IntervalArray":
        other = as_interval_array(other)
        with np.errstate(invalid="ignore", over="ignore"):
            products = (self.lo * other.lo, self.lo * other.hi, self.hi * other.lo, self.hi * other.hi)
        low = np.minimum(np.minimum(products[0], products[1]), np.minimum(products[2], products[3]))
        high = np.maximum(np.maximum(products[0], products[1]), np.maximum(products[2], products[3]))
        return IntervalArray(down(low), up(high))

    __rmul__ = __mul__

    def reciprocal(self) -> "IntervalArray":
        if np.any((self.lo <= 0) & (self.hi >= 0)):
            raise NotCertifiedError("divisor", "intervals that exclude 0", "an interval containing 0",
                                    "bound the denominator away from zero first")
        return IntervalArray(down(1.0 / self.hi), up(1.0 / self.lo))

    def __truediv__(self, other) -> "IntervalArray":
        return self * as_interval_array(other).reciprocal()

    def __rtruediv__(self, other) -> "IntervalArray":
        return as_interval_array(other) * self.reciprocal()

    def square(self) -> "IntervalArray":
        low, high = self.mignitude, self.magnitude
        return IntervalArray(np.maximum(down(low * low), 0.0), up(high * high))

    def sqrt(self) -> "IntervalArray":
        if np.any(self.hi < 0):
            raise NotCertifiedError("sqrt argument", "non-negative numbers", "a negative interval",
                                    "the expression takes the square root of a negative quantity")
        return IntervalArray(np.maximum(down(np.sqrt(np.maximum(self.lo, 0.0))), 0.0), up(np.sqrt(self.hi)))

    def exp(self) -> "IntervalArray":
        return IntervalArray(exp_bounds(self.lo)[0], exp_bounds(self.hi)[1])

    def abs(self) -> "IntervalArray":
        return IntervalArray(self.mignitude, self.magnitude)

    def maximum(self, other) -> "IntervalArray":
        other = as_interval_array(other)
        return IntervalArray(np.maximum(self.lo, other.lo), np.maximum(self.hi, other.hi))

    def minimum(self, other) -> "IntervalArray":
        other = as_interval_array(other)
        return IntervalArray(np.minimum(self.lo, other.lo), np.minimum(self.hi, other.hi))

    def clip_below(self, floor: float) -> "IntervalArray":
        """Intersect with ``[floor, inf)``: for a quantity known to be at least ``floor``."""
        return IntervalArray(np.maximum(self.lo, floor), np.maximum(self.hi, floor))

    def hull(self, other) -> "IntervalArray":
        other = as_interval_array(other)
        return IntervalArray(np.minimum(self.lo, other.lo), np.maximum(self.hi, other.hi))

    # reductions ----------------------------------------------------------------------------------
    def sum(self, axis=-1, keepdims: bool = False) -> "IntervalArray":
        """Sum along ``axis`` with the rounding of any summation order bounded."""
        count = self.lo.shape[axis] if self.lo.ndim else 1
        gamma = gamma_bound(max(count, 2))
        ends = []
        for values, direction in ((self.lo, -1.0), (self.hi, 1.0)):
            total = np.sum(values, axis=axis, keepdims=keepdims)
            spread = np.sum(np.abs(values), axis=axis, keepdims=keepdims) * (gamma * (1 + gamma) * (1 + 4 * UNIT_ROUNDOFF))
            ends.append(down(total - spread) if direction < 0 else up(total + spread))
        return IntervalArray(*ends)

    def norm_upper(self, axis=-1) -> np.ndarray:
        """Upper bounds on ``max ||x||_2`` along ``axis`` over the box."""
        return _norm_upper(self.magnitude, axis)

    def norm_lower(self, axis=-1) -> np.ndarray:
        """Lower bounds on ``min ||x||_2`` along ``axis`` over the box."""
        return _norm_lower(self.mignitude, axis)

    def matmul(self, W) -> "IntervalArray":
        """``x W`` over the last axis for a float matrix W (taken exactly), any leading shape."""
        W = np.asarray(W, dtype=np.float64)
        enclosure = self.to_enclosure()
        lead = self.shape[:-1]
        product = Enclosure(enclosure.mid.reshape(-1, self.shape[-1]), enclosure.rad.reshape(-1, self.shape[-1])) \
            @ Enclosure.exact(W)
        return IntervalArray.around(product.mid.reshape(lead + (W.shape[1],)), product.rad.reshape(lead + (W.shape[1],)))

    def bmm(self, other) -> "IntervalArray":
        """``self @ other`` over the last two axes (batched, broadcast), by BLAS, with the error model of
        :meth:`einsum`: ``|ab - a_m b_m| <= |a_m| r_b + r_a (|b_m| + r_b)`` plus ``gamma_k |a_m| |b_m|``."""
        other = as_interval_array(other)
        a, b = self.to_enclosure(), other.to_enclosure()
        count = self.shape[-1]
        am = np.abs(a.mid)
        mid = a.mid @ b.mid
        if b.is_exact and a.is_exact:
            spread = gamma_bound(count + 2) * (am @ np.abs(b.mid))
        elif b.is_exact:
            spread = (gamma_bound(count + 2) * am + a.rad) @ np.abs(b.mid)
        else:
            bm = np.abs(b.mid)
            spread = (gamma_bound(count + 2) * am) @ bm + am @ b.rad + a.rad @ (bm + b.rad)
        spread = up(spread * (1 + gamma_bound(count + 4)) + (count + 4) * _ETA)
        return IntervalArray.around(mid, spread)

    def einsum(self, spec: str, other: "IntervalArray") -> "IntervalArray":
        """``np.einsum(spec, self, other)`` of two interval arrays whose contraction is a sum of
        products: midpoint-radius arithmetic, ``|ab - a_m b_m| <= |a_m| r_b + r_a |b_m| + r_a r_b``,
        and the rounding of the midpoint product bounded by ``gamma_k |a_m| |b_m|``."""
        other = as_interval_array(other)
        a, b = self.to_enclosure(), other.to_enclosure()
        inputs, output = spec.split("->")
        left, right = inputs.split(",")
        sizes = {**dict(zip(right, other.shape)), **dict(zip(left, self.shape))}
        count = int(np.prod([sizes[c] for c in set(left + right) - set(output)], dtype=np.int64))
        am, bm = np.abs(a.mid), np.abs(b.mid)
        fast = count > 64  # long contractions through BLAS; short ones in einsum's own loop (faster there)
        mid = np.einsum(spec, a.mid, b.mid, optimize=fast)
        spread = (gamma_bound(count + 2) * np.einsum(spec, am, bm, optimize=fast)
                  + np.einsum(spec, am, b.rad, optimize=fast) + np.einsum(spec, a.rad, bm + b.rad, optimize=fast))
        spread = up(spread * (1 + gamma_bound(count + 4)) + (count + 4) * _ETA)
        return IntervalArray.around(mid, spread)


def as_interval_array(value) -> IntervalArray:
    if isinstance(value, IntervalArray):
        return value
    if isinstance(value, Enclosure):
        return IntervalArray.from_enclosure(value)
    return IntervalArray(value)


def _norm_upper(magnitude: np.ndarray, axis) -> np.ndarray:
    magnitude = np.asarray(magnitude, dtype=np.float64)
    count = magnitude.shape[axis] if magnitude.ndim else 1
    total = np.sum(magnitude * magnitude, axis=axis)
    total = total * (1 + gamma_bound(count + 2)) + (count + 1) * _ETA  # products and sums of non-negatives
    result = up(np.sqrt(up(total)))
    _finite("norm", result)
    return result


def _norm_lower(mignitude: np.ndarray, axis) -> np.ndarray:
    mignitude = np.asarray(mignitude, dtype=np.float64)
    count = mignitude.shape[axis] if mignitude.ndim else 1
    total = np.sum(mignitude * mignitude, axis=axis)
    total = total / (1 + gamma_bound(count + 2)) - (count + 1) * _ETA
    return np.maximum(down(np.sqrt(np.maximum(down(total), 0.0))), 0.0)


# Functions of the normal distribution and GELU ------------------------------------------------------
def normal_cdf(x: IntervalArray) -> IntervalArray:
    """``Phi`` on each interval (increasing)."""
    x = as_interval_array(x)
    return IntervalArray(normal_cdf_bounds(x.lo)[0], normal_cdf_bounds(x.hi)[1])


def normal_pdf(x: IntervalArray) -> IntervalArray:
    """``phi`` on each interval (decreasing in |x|)."""
    x = as_interval_array(x)
    return IntervalArray(normal_pdf_bounds(x.magnitude)[0], normal_pdf_bounds(x.mignitude)[1])


def _slope_at(x: np.ndarray) -> IntervalArray:
    """``GELU'(x) = Phi(x) + x phi(x)`` at float points."""
    point = IntervalArray(x)
    return IntervalArray(*normal_cdf_bounds(x)) + point * IntervalArray(*normal_pdf_bounds(x))


def gelu_slope(x: IntervalArray) -> IntervalArray:
    """The range of ``GELU'`` over each interval.  ``GELU'' = phi (2 - x^2)``: GELU' increases on
    ``[-sqrt 2, sqrt 2]`` and decreases outside, so the range is the hull of the values at the ends
    and at the critical points ``+-sqrt 2`` the interval contains (Hendrycks and Gimpel 2016)."""
    x = as_interval_array(x)
    (bottom_lo, bottom_hi), (top_lo, top_hi), (root_lo, root_hi) = gelu_slope_extrema()
    ends_lo, ends_hi = _slope_at(x.lo), _slope_at(x.hi)
    lo = np.minimum(ends_lo.lo, ends_hi.lo)
    hi = np.maximum(ends_lo.hi, ends_hi.hi)
    has_top = (x.lo <= root_hi) & (x.hi >= root_lo)
    has_bottom = (x.lo <= -root_lo) & (x.hi >= -root_hi)
    hi = np.where(has_top, np.maximum(hi, top_hi), hi)
    lo = np.where(has_bottom, np.minimum(lo, bottom_lo), lo)
    return IntervalArray(np.maximum(lo, bottom_lo), np.minimum(hi, top_hi))


def gelu(x: IntervalArray) -> IntervalArray:
    """``GELU(x) = x Phi(x)`` on each interval, in mean-value form about the midpoint:
    ``GELU(m) + GELU'([x]) ([x] - m)`` (tight for the narrow intervals of a rigorous forward pass)."""
    x = as_interval_array(x)
    mid = x.mid
    at_mid = IntervalArray(mid) * IntervalArray(*normal_cdf_bounds(mid))
    if not np.any(x.hi > x.lo):
        return at_mid
    return at_mid + gelu_slope(x) * (x - IntervalArray(mid))
