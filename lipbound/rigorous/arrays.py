"""Interval arithmetic on whole numpy arrays, rounded outward: the vectorised twin of :data:`IV`.

An :class:`IntervalArray` holds float arrays ``lo <= hi`` and stands for every real array between
them.  Each operation returns an array that encloses the exact result for every choice of the
operands inside theirs:

* ``+ - * /`` and ``sqrt`` round each result one ulp outward (``nextafter``): IEEE 754 rounds
  these correctly, so the exact result lies within one ulp of the computed one;
* ``exp``, the normal CDF and density, GELU and the range of its slope go through
  :mod:`lipbound.rigorous.elementwise` (no platform ``exp`` or ``erf``);
* sums along an axis add ``gamma_{k} sum |x|`` (Higham, eq. 3.5, any order of summation);
* contractions (``matmul``, ``bmm``, ``einsum``) in midpoint-radius form (Rump 1999), two or three
  BLAS products with an a-priori bound of their rounding (:func:`_product`);
* an array built from one float array is an exact point (``lo is hi``): operations on points skip
  what is known to vanish (the radius, two of the four end products); large arrays are processed in
  blocks where a temporary would otherwise be as large as the array;
* :meth:`IntervalArray.norm_upper` / :meth:`norm_lower` bound the Euclidean norm of every array
  in the box along an axis.

A computation that overflows or meets NaN raises :class:`~lipbound.errors.NotCertifiedError`.
"""

from __future__ import annotations

from typing import final

import numpy as np

from ..errors import NotCertifiedError
from .elementwise import (
    _ULP_FACTOR,
    SMALLEST_SUBNORMAL,
    UNIT_ROUNDOFF,
    all_finite,
    down,
    exp_bounds,
    gamma_bound,
    gelu_slope_extrema,
    normal_cdf_bounds,
    normal_pdf_bounds,
    up,
    up_nonnegative,
)
from .intervals import interval, lower, upper
from .linalg import Enclosure

__all__ = ["IntervalArray", "as_interval_array", "softmax", "gelu", "gelu_slope", "gelu_curvature", "gelu_third",
           "gelu_curvature_range", "gelu_curvature_magnitude", "gelu_third_magnitude", "gelu_with_slopes", "normal_cdf",
           "normal_pdf"]

_ETA = SMALLEST_SUBNORMAL
#: Entries per block of the blockwise loops (large arrays): temporaries stay in the cache and the heap.
_BLOCK = 1 << 15


def _finite(name: str, *arrays) -> None:
    for array in arrays:
        if not all_finite(array):
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

    __slots__ = ("lo", "hi", "_operand")
    __array_priority__ = 100  # numpy arrays defer to our operators

    def __init__(self, lo, hi=None):
        lo = np.asarray(lo, dtype=np.float64)
        if hi is None or hi is lo:  # a point array: one array stands for both ends
            _finite("interval array", lo)
            self.lo = self.hi = lo
            self._operand = None
            return
        hi = np.asarray(hi, dtype=np.float64)
        if lo.shape != hi.shape:
            lo, hi = (np.array(a) for a in np.broadcast_arrays(lo, hi))
        _finite("interval array", lo, hi)
        if np.any(lo > hi):
            raise NotCertifiedError("interval array", "lo <= hi", "a reversed interval", "build it from (lo, hi)")
        self.lo, self.hi = lo, hi
        self._operand = None

    @classmethod
    def _ordered(cls, lo: np.ndarray, hi: np.ndarray, check: bool = True) -> IntervalArray:
        """Ends that are ordered by construction (outward rounding of ordered operands is monotone):
        only finiteness is checked (an overflow), and not at all for views of a checked array."""
        if check:
            _finite("interval array", lo) if hi is lo else _finite("interval array", lo, hi)
        out = object.__new__(cls)
        out.lo, out.hi = lo, hi
        out._operand = None
        return out

    def _view(self, transform) -> IntervalArray:
        """The same transform (a view: index, reshape, swap) of both ends, a point array staying one."""
        lo = transform(self.lo)
        return IntervalArray._ordered(lo, lo if self.is_point else transform(self.hi), check=False)

    @property
    def is_point(self) -> bool:
        """True for an array built from one float array (both ends the same object): an exact point."""
        return self.lo is self.hi

    # construction --------------------------------------------------------------------------------
    @classmethod
    def point(cls, value) -> IntervalArray:
        """A float array taken as exact."""
        return cls(value)

    @classmethod
    def around(cls, center, radius) -> IntervalArray:
        """``center +- radius`` (rounded outward)."""
        center, radius = np.asarray(center, dtype=np.float64), np.asarray(radius, dtype=np.float64)
        if np.any(radius < 0):
            raise NotCertifiedError("radius", "a non-negative radius", "a negative entry", "pass |radius|")
        return cls._ordered(down(center - radius), up(center + radius))

    @classmethod
    def from_enclosure(cls, enclosure: Enclosure) -> IntervalArray:
        return cls.around(enclosure.mid, enclosure.rad)

    @classmethod
    def stack(cls, parts) -> IntervalArray:
        """The enclosures ``parts`` (one shape) stacked along a new first axis."""
        parts = list(parts)
        return cls(np.stack([p.lo for p in parts]), np.stack([p.hi for p in parts]))

    @classmethod
    def constant(cls, value) -> IntervalArray:
        """A 0-d enclosure of an exact number or an mpmath interval (``1 / sqrt(d_k)``)."""
        x = interval(value)
        return cls(lower(x), upper(x))

    def to_enclosure(self) -> Enclosure:
        mid, rad = self._mid_rad()
        return Enclosure._trusted(mid, np.zeros_like(mid) if rad is None else rad)

    def _as_operand(self) -> tuple:
        """``(mid, rad, |mid|, max |mid|)`` of a factor of :func:`_product`, computed once per array (an
        array multiplied by many others, e.g. ``V^h W_O^h`` for every Jacobian column, pays once)."""
        if self._operand is None:
            mid, rad = self._mid_rad()
            magnitude = np.abs(mid)
            self._operand = (mid, rad, magnitude, float(np.max(magnitude, initial=0.0)))
        return self._operand

    def _mid_rad(self) -> tuple[np.ndarray, np.ndarray | None]:
        """``(mid, rad)`` with ``[lo, hi]`` inside ``mid +- rad`` entrywise; ``rad`` is None for a point.

        ``mid = fl(lo/2 + hi/2)``; the computed differences ``D1 = fl(hi - mid)``, ``D2 = fl(mid - lo)``
        lie within half an ulp of the exact ones, so ``max(hi - mid, mid - lo) <= nextafter(max(D1, D2),
        inf)``, which :func:`~lipbound.rigorous.elementwise.up_nonnegative` bounds (``D1 + D2 = hi - lo
        >= 0`` exactly, so the larger one is not negative)."""
        if self.is_point:
            return self.lo, None
        lo, hi = self.lo, self.hi
        if lo.size < 2 * _BLOCK or not (lo.flags.c_contiguous and hi.flags.c_contiguous):
            mid = lo * 0.5
            mid += hi * 0.5
            rad = np.maximum(hi - mid, mid - lo)
            return mid, up_nonnegative(rad, out=rad)
        mid, rad = np.empty_like(lo), np.empty_like(lo)
        flat = [a.reshape(-1) for a in (lo, hi, mid, rad)]
        spare = np.empty(_BLOCK)
        for start in range(0, lo.size, _BLOCK):  # block by block: no large temporaries
            low, high, m, r = (a[start:start + _BLOCK] for a in flat)
            t = spare[:low.size]
            np.multiply(low, 0.5, out=m)
            m += np.multiply(high, 0.5, out=t)
            np.subtract(high, m, out=r)
            np.maximum(r, np.subtract(m, low, out=t), out=r)
            up_nonnegative(r, out=r)
        return mid, rad

    # shape ---------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.lo.shape

    @property
    def ndim(self) -> int:
        return self.lo.ndim

    @property
    def mid(self) -> np.ndarray:
        return self.lo if self.is_point else 0.5 * self.lo + 0.5 * self.hi

    @property
    def rad(self) -> np.ndarray:
        """An upper bound on the half-width (about :attr:`mid`)."""
        mid, rad = self._mid_rad()
        return np.zeros_like(mid) if rad is None else rad

    @property
    def magnitude(self) -> np.ndarray:
        """``max |x|`` over each interval (exact)."""
        if self.is_point:
            return np.abs(self.lo)
        return np.maximum(np.abs(self.lo), np.abs(self.hi))

    @property
    def mignitude(self) -> np.ndarray:
        """``min |x|`` over each interval (exact)."""
        if self.is_point:
            return np.abs(self.lo)
        return np.where((self.lo <= 0) & (self.hi >= 0), 0.0, np.minimum(np.abs(self.lo), np.abs(self.hi)))

    def __getitem__(self, index) -> IntervalArray:
        return self._view(lambda a: a[index])

    def __len__(self) -> int:
        return len(self.lo)

    def reshape(self, *shape) -> IntervalArray:
        return self._view(lambda a: a.reshape(*shape))

    def lmatmul(self, W) -> IntervalArray:
        """``W x`` over the second-to-last axis for a float matrix W (taken exactly)."""
        return self.swapaxes(-1, -2).matmul(np.asarray(W, dtype=np.float64).T).swapaxes(-1, -2)

    def swapaxes(self, a: int, b: int) -> IntervalArray:
        return self._view(lambda x: np.swapaxes(x, a, b))

    def expand(self, axis: int) -> IntervalArray:
        return self._view(lambda x: np.expand_dims(x, axis))

    def contains(self, value) -> bool:
        value = np.asarray(value, dtype=np.float64)
        return bool(np.all((self.lo <= value) & (value <= self.hi)))

    def __repr__(self) -> str:
        return f"IntervalArray(shape={self.shape}, max width={float(np.max(self.hi - self.lo, initial=0.0)):.3g})"

    # arithmetic ----------------------------------------------------------------------------------
    def __add__(self, other) -> IntervalArray:
        other = as_interval_array(other)
        if self.is_point and other.is_point:
            total = self.lo + other.lo
            return IntervalArray._ordered(down(total), up(total))
        return IntervalArray._ordered(down(self.lo + other.lo), up(self.hi + other.hi))

    __radd__ = __add__

    def __sub__(self, other) -> IntervalArray:
        other = as_interval_array(other)
        if self.is_point and other.is_point:
            difference = self.lo - other.lo
            return IntervalArray._ordered(down(difference), up(difference))
        return IntervalArray._ordered(down(self.lo - other.hi), up(self.hi - other.lo))

    def __rsub__(self, other) -> IntervalArray:
        return as_interval_array(other) - self

    def __neg__(self) -> IntervalArray:
        if self.is_point:
            negated = -self.lo
            return IntervalArray._ordered(negated, negated, check=False)
        return IntervalArray._ordered(-self.hi, -self.lo, check=False)

    def __mul__(self, other) -> IntervalArray:
        """The hull of the products of the ends, rounded outward: four products in general (one minimum
        and one maximum when one factor is non-negative: ``x y`` is then smallest at ``x_lo`` and largest
        at ``x_hi``), two when one factor is a point, one for two points."""
        other = as_interval_array(other)
        if self.is_point and not other.is_point or (self.lo.size < other.lo.size and not other.is_point):
            self, other = other, self  # the product commutes: the special factor goes second
        with np.errstate(invalid="ignore", over="ignore"):
            if other.is_point:
                if self.is_point:
                    product = self.lo * other.lo
                    return IntervalArray._ordered(down(product), up(product))
                first, second = self.lo * other.lo, self.hi * other.lo
                low, high = np.minimum(first, second), np.maximum(first, second)
            elif self.lo.ndim == other.lo.ndim == 2 and self.lo.size >= 2 * _BLOCK \
                    and self.lo.shape == np.broadcast_shapes(self.lo.shape, other.lo.shape):
                # a large matrix: by panels of rows, the same floats
                return _panel_products(self, other, signed=other.lo.size > self.lo.size or bool(np.any(other.lo < 0)))
            elif other.lo.size <= self.lo.size and not np.any(other.lo < 0):  # other >= 0: the sign of x decides
                low = np.minimum(self.lo * other.lo, self.lo * other.hi)
                high = np.maximum(self.hi * other.lo, self.hi * other.hi)
            else:
                products = (self.lo * other.lo, self.lo * other.hi, self.hi * other.lo, self.hi * other.hi)
                low = np.minimum(np.minimum(products[0], products[1]), np.minimum(products[2], products[3]))
                high = np.maximum(np.maximum(products[0], products[1]), np.maximum(products[2], products[3]))
        return IntervalArray._ordered(down(low), up(high))

    __rmul__ = __mul__

    def reciprocal(self) -> IntervalArray:
        if np.any((self.lo <= 0) & (self.hi >= 0)):
            raise NotCertifiedError("divisor", "intervals that exclude 0", "an interval containing 0",
                                    "bound the denominator away from zero first")
        if self.is_point:
            inverse = 1.0 / self.lo
            return IntervalArray._ordered(down(inverse), up(inverse))
        return IntervalArray._ordered(down(1.0 / self.hi), up(1.0 / self.lo))

    def __truediv__(self, other) -> IntervalArray:
        return self * as_interval_array(other).reciprocal()

    def __rtruediv__(self, other) -> IntervalArray:
        return as_interval_array(other) * self.reciprocal()

    def square(self) -> IntervalArray:
        if self.is_point:
            squared = self.lo * self.lo
            return IntervalArray._ordered(np.maximum(down(squared), 0.0), up_nonnegative(squared, out=squared))
        low, high = self.mignitude, self.magnitude
        return IntervalArray._ordered(np.maximum(down(low * low), 0.0), up_nonnegative(high * high))

    def sqrt(self) -> IntervalArray:
        if np.any(self.hi < 0):
            raise NotCertifiedError("sqrt argument", "non-negative numbers", "a negative interval",
                                    "the expression takes the square root of a negative quantity")
        if self.is_point:
            root = np.sqrt(np.maximum(self.lo, 0.0))
            return IntervalArray._ordered(np.maximum(down(root), 0.0), up_nonnegative(root, out=root))
        return IntervalArray._ordered(np.maximum(down(np.sqrt(np.maximum(self.lo, 0.0))), 0.0),
                                      up_nonnegative(np.sqrt(self.hi)))

    def exp(self) -> IntervalArray:
        if self.is_point:
            return IntervalArray._ordered(*exp_bounds(self.lo))
        return IntervalArray._ordered(exp_bounds(self.lo)[0], exp_bounds(self.hi)[1])

    def abs(self) -> IntervalArray:
        if self.is_point:
            return self._view(np.abs)
        return IntervalArray._ordered(self.mignitude, self.magnitude, check=False)

    def maximum(self, other) -> IntervalArray:
        other = as_interval_array(other)
        return IntervalArray._ordered(np.maximum(self.lo, other.lo), np.maximum(self.hi, other.hi), check=False)

    def minimum(self, other) -> IntervalArray:
        other = as_interval_array(other)
        return IntervalArray._ordered(np.minimum(self.lo, other.lo), np.minimum(self.hi, other.hi), check=False)

    def clip_below(self, floor: float) -> IntervalArray:
        """Intersect with ``[floor, inf)``: for a quantity known to be at least ``floor``."""
        if self.is_point:
            return self._view(lambda a: np.maximum(a, floor))
        return IntervalArray._ordered(np.maximum(self.lo, floor), np.maximum(self.hi, floor), check=False)

    def hull(self, other) -> IntervalArray:
        other = as_interval_array(other)
        return IntervalArray._ordered(np.minimum(self.lo, other.lo), np.maximum(self.hi, other.hi), check=False)

    # reductions ----------------------------------------------------------------------------------
    def sum(self, axis=-1, keepdims: bool = False, exact_sums: bool = False) -> IntervalArray:
        """Sum along ``axis`` with the rounding of any summation order bounded; with ``exact_sums`` the ends are
        summed by :func:`_exact_sum` (rounding about ``u |sum|`` instead of ``k u sum |x|``)."""
        if exact_sums and self.lo.ndim:
            axis = axis % self.lo.ndim
            ends = [_exact_sum(values, axis) for values in ((self.lo,) if self.is_point else (self.lo, self.hi))]
            (total_lo, spread_lo), (total_hi, spread_hi) = ends[0], ends[-1]
            lo, hi = down(down(total_lo) - spread_lo), up(up(total_hi) + spread_hi)
            if keepdims:
                lo, hi = np.expand_dims(lo, axis), np.expand_dims(hi, axis)
            return IntervalArray._ordered(lo, hi)
        count = self.lo.shape[axis] if self.lo.ndim else 1
        gamma = gamma_bound(max(count, 2))
        factor = gamma * (1 + gamma) * (1 + 4 * UNIT_ROUNDOFF)
        ends = []
        for values in ((self.lo,) if self.is_point else (self.lo, self.hi)):
            total = np.sum(values, axis=axis, keepdims=keepdims)
            spread = np.sum(np.abs(values), axis=axis, keepdims=keepdims) * factor
            ends.append((total, spread))
        (total_lo, spread_lo), (total_hi, spread_hi) = ends[0], ends[-1]
        return IntervalArray._ordered(down(total_lo - spread_lo), up(total_hi + spread_hi))

    def norm_upper(self, axis=-1) -> np.ndarray:
        """Upper bounds on ``max ||x||_2`` along ``axis`` over the box."""
        return _norm_upper(self.magnitude, axis)

    def norm_lower(self, axis=-1) -> np.ndarray:
        """Lower bounds on ``min ||x||_2`` along ``axis`` over the box."""
        return _norm_lower(self.mignitude, axis)

    def matmul(self, W, exact_sums: bool = False) -> IntervalArray:
        """``x W`` over the last axis for a float matrix W (taken exactly), any leading shape
        (the error model of :func:`_product`; with ``exact_sums`` that of :func:`_split_product`, whose
        rounding is about ``u |x W|`` instead of ``k u |x| |W|``, at one more BLAS product)."""
        k = self.shape[-1]
        flat = self.reshape(-1, k)
        if exact_sums:   # the matrix object itself: its split is kept
            center, spread = _split_product(flat, W)
            W = np.asarray(W)
        else:
            W = np.asarray(W, dtype=np.float64)
            center, spread = _product(np.matmul, flat, IntervalArray._ordered(W, W, check=False), k)
        shape = self.shape[:-1] + (W.shape[1],)
        return IntervalArray.around(center.reshape(shape), spread.reshape(shape))

    def bmm(self, other) -> IntervalArray:
        """``self @ other`` over the last two axes (batched, broadcast), by BLAS (:func:`_product`)."""
        center, spread = _product(np.matmul, self, as_interval_array(other), self.shape[-1])
        return IntervalArray.around(center, spread)

    def einsum(self, spec: str, other: IntervalArray) -> IntervalArray:
        """``np.einsum(spec, self, other)`` of two interval arrays whose contraction is a sum of
        products (:func:`_product`)."""
        other = as_interval_array(other)
        inputs, output = spec.split("->")
        left, right = inputs.split(",")
        sizes = {**dict(zip(right, other.shape)), **dict(zip(left, self.shape))}
        count = int(np.prod([sizes[c] for c in set(left + right) - set(output)], dtype=np.int64))
        fast = count > 64  # long contractions through BLAS; short ones in einsum's own loop (faster there)
        contract = lambda a, b: np.einsum(spec, a, b, optimize=fast)  # noqa: E731
        center, spread = _product(contract, self, other, count)
        return IntervalArray.around(center, spread)


def _panel_products(x: IntervalArray, y: IntervalArray, signed: bool) -> IntervalArray:
    """``x * y`` of :meth:`IntervalArray.__mul__` for a large matrix x and y of its shape or broadcast to it (both
    non-points), formed by panels of about :data:`_BLOCK` entries: the same products, hulls and outward roundings
    entry by entry (so the same floats), with the temporaries in the cache instead of eight whole arrays.
    ``signed``: the hull of all four products of the ends; otherwise y >= 0, and x's ends give the ends."""
    rows, columns = x.lo.shape
    step = max(1, _BLOCK // max(columns, 1))
    low, high = np.empty(x.lo.shape), np.empty(x.lo.shape)
    first, second, spare = (np.empty((min(step, rows), columns)) for _ in range(3))

    def panel(array: np.ndarray, part: slice) -> np.ndarray:
        return array[part] if array.shape[0] == rows else array

    for start in range(0, rows, step):
        part = slice(start, start + step)
        x_lo, x_hi, y_lo, y_hi = panel(x.lo, part), panel(x.hi, part), panel(y.lo, part), panel(y.hi, part)
        size = x_lo.shape[0]
        p, q, t, lo, hi = first[:size], second[:size], spare[:size], low[part], high[part]
        np.multiply(x_lo, y_lo, out=p)
        np.multiply(x_lo, y_hi, out=q)
        np.minimum(p, q, out=lo)
        if signed:
            np.maximum(p, q, out=hi)
            np.multiply(x_hi, y_lo, out=p)
            np.multiply(x_hi, y_hi, out=q)
            np.minimum(lo, np.minimum(p, q, out=t), out=lo)
            np.maximum(hi, np.maximum(p, q, out=t), out=hi)
        else:
            np.multiply(x_hi, y_lo, out=p)
            np.multiply(x_hi, y_hi, out=q)
            np.maximum(p, q, out=hi)
        for end, away in ((lo, np.subtract), (hi, np.add)):   # down and up of elementwise, in place
            np.abs(end, out=t)
            t *= _ULP_FACTOR
            t += SMALLEST_SUBNORMAL
            away(end, t, out=end)
    return IntervalArray._ordered(low, high)


def _product(contract, a: IntervalArray, b: IntervalArray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Midpoint and radius of a bilinear contraction (a sum of ``count`` products per entry: ``@``,
    ``einsum``) of ``a`` in ``[a_m +- r_a]`` and ``b`` in ``[b_m +- r_b]``, in midpoint-radius
    arithmetic with at most three float contractions (Rump, "Fast and parallel interval arithmetic",
    BIT 39, 1999):

    ``|a b - fl(a_m b_m)| <= |a_m| (gamma |b_m| + r_b) + r_a (|b_m| + r_b) + count eta (2 + max|a_m| + max|b_m|)``

    with ``gamma = gamma_count``: ``|a b - a_m b_m| <= |a_m| r_b + r_a (|b_m| + r_b)`` exactly,
    ``|fl(a_m b_m) - a_m b_m| <= gamma_count |a_m| |b_m|`` for any summation order (Higham, eq. 3.13),
    and the last term covers underflow (at most ``eta / 2`` in each product and in each entry of
    ``gamma |a_m|``, ``gamma |b_m|``).  With ``b`` exact the first two terms are one contraction
    ``(gamma |a_m| + r_a) |b_m|``.  The float evaluation of the radius takes at most ``count + 3``
    roundings of non-negative numbers (two forming a factor, ``count`` in the contraction, one adding
    two contractions), each covered by the factor ``1 + gamma_{count+6}``; the last rounding by
    :func:`~lipbound.rigorous.elementwise.up_nonnegative`."""
    a_mid, a_rad, abs_a, largest_a = a._as_operand()
    b_mid, b_rad, abs_b, largest_b = b._as_operand()
    center = contract(a_mid, b_mid)
    gamma = gamma_bound(count)
    if b_rad is None:
        weight = abs_a * gamma
        if a_rad is not None:
            weight += a_rad
        spread = contract(weight, abs_b)
    else:
        inner = abs_b * gamma
        inner += b_rad
        spread = contract(abs_a, inner)
        if a_rad is not None:
            spread = spread + contract(a_rad, abs_b + b_rad)
    spread = np.multiply(spread, 1 + gamma_bound(count + 6))
    spread += (count + 4) * _ETA * (3.0 + largest_a + largest_b)
    return center, up_nonnegative(spread, out=spread)


#: Smallest quantum of a split: the product of two stays a normal number, so products of split parts are exact.
_SMALLEST_QUANTUM = 2.0 ** -500


def _split(values: np.ndarray, bits: int, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``values = high + low`` exactly, with ``high`` an integer multiple of ``quantum`` (a power of two per
    slice along ``axis``, kept with keepdims) and ``|high| <= 2^bits quantum``, ``|low| <= quantum / 2``.

    ``quantum = 2^(e - bits)`` with ``max|values| < 2^e`` over the slice; ``values / quantum`` is exact
    (a power of two, no underflow at or above :data:`_SMALLEST_QUANTUM`), ``rint`` of it is an integer of at
    most ``2^bits``, and ``low = values - high`` is a multiple of the ulp of ``values`` below
    ``quantum / 2 < 2^(e - bits)``, so exactly representable (Ozaki, Ogita, Oishi and Rump, "Error-free
    transformations of matrix multiplication", Numer. Algorithms 59, 2012)."""
    exponent = np.frexp(np.max(np.abs(values), axis=axis, keepdims=True))[1]
    quantum = np.ldexp(1.0, exponent - bits)
    if np.any(quantum < _SMALLEST_QUANTUM):
        raise NotCertifiedError("product", f"entries above {_SMALLEST_QUANTUM * 2.0 ** 60:.3g} in every row",
                                "tiny entries", "scale the operands, or multiply without exact_sums")
    high = np.rint(values / quantum) * quantum
    return high, values - high, quantum


def _exact_sum(values: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``(t, e)`` with the exact sum of ``values`` along ``axis`` in ``fl(H + L) +- (rounding of that addition) +- e``:
    ``values = high + low`` by :func:`_split` with ``2^bits`` quanta, ``bits = 53 - ceil(log2 k)``, so every
    partial sum of the highs is an integer multiple of the quantum below ``2^53`` quanta, exact in any order;
    the lows (each at most half a quantum, about ``2^-bits`` of the largest entry) are summed in floats, their
    rounding at most ``gamma_k sum |low|`` (Higham, eq. 3.13; Ozaki, Ogita, Oishi and Rump 2012).  The caller
    rounds ``t`` outward: one rounding of ``H + L``."""
    count = values.shape[axis]
    bits = 53 - int(np.ceil(np.log2(max(count, 2))))
    high, low, _ = _split(values, bits, axis)
    total = np.sum(high, axis=axis) + np.sum(low, axis=axis)
    gamma = gamma_bound(max(count, 2))
    spread = up_nonnegative(np.sum(np.abs(low), axis=axis) * (gamma * (1 + gamma) * (1 + 4 * UNIT_ROUNDOFF)))
    return total, spread


#: id(W) -> (W, its split): a weight matrix is split once (the entry keeps W alive, so its id stays its own).
_SPLITS: dict = {}


def _split_weights(W: np.ndarray, bits: int):
    """A weight matrix in float64, ``|W|``, its split by columns (:func:`_split`), its column quanta and an
    upper bound on ``sum_i |W_ij|``, computed once per matrix object."""
    entry = _SPLITS.get(id(W))
    if entry is None or entry[0] is not W or entry[1] != bits:
        if len(_SPLITS) >= 32:
            _SPLITS.clear()
        exact = np.asarray(W, dtype=np.float64)
        high, low, quantum = _split(exact, bits, axis=0)
        magnitude = np.abs(exact)
        entry = _SPLITS[id(W)] = (W, bits, exact, magnitude, high, low, quantum,
                                  np.sum(magnitude, axis=0) * (1 + gamma_bound(exact.shape[0] + 2)))
    return entry[2:]


def _split_product(a: IntervalArray, W) -> tuple[np.ndarray, np.ndarray]:
    """Midpoint and radius of ``a W`` (a: (M, k) interval, W: (k, N) exact) with sums that do not round.

    With ``a_m = x_hi + x_lo`` split by rows and ``W = W_hi + W_lo`` by columns (:func:`_split`,
    ``b_x + b_W = 53 - ceil(log2 k)`` bits), every product of ``x_hi W_hi`` is an integer multiple of
    ``q_i r_j`` below ``2^(b_x + b_W) q_i r_j`` and every partial sum below ``2^53 q_i r_j``: BLAS computes it
    exactly, in any order, with or without fused multiply-adds.  The rest ``x_hi W_lo + x_lo W`` is about
    ``2^-b`` of the product, and its rounding is at most ``gamma_k (sum |x_hi| r_j / 2 + q_i / 2 sum_l |W_lj|)``
    (Higham, eq. 3.13, with ``|W_lo| <= r / 2``, ``|x_lo| <= q / 2``); two more roundings form the midpoint,
    and the radius of ``a`` adds ``r_a |W|`` as in :func:`_product`."""
    mid, rad = a._mid_rad()
    k = W.shape[0]
    bits = 53 - int(np.ceil(np.log2(max(k, 2))))
    x_bits = bits // 2
    W, magnitude, W_hi, W_lo, r, column_sums = _split_weights(W, bits - x_bits)
    x_hi, x_lo, q = _split(mid, x_bits, axis=1)
    rest = x_hi @ W_lo
    rest += x_lo @ W
    center = x_hi @ W_hi
    center += rest
    gamma = gamma_bound(k + 4)
    row_sums = np.sum(np.abs(x_hi), axis=1, keepdims=True)
    spread = (row_sums * (r * 0.5) + (q * 0.5) * column_sums) * gamma
    spread += (np.abs(rest) + np.abs(center)) * (2 * UNIT_ROUNDOFF)
    if rad is not None:
        spread += rad @ magnitude
    spread *= 1 + gamma_bound(k + 8)
    spread += (k + 4) * _ETA * 4.0
    return center, up_nonnegative(spread, out=spread)


def as_interval_array(value) -> IntervalArray:
    if isinstance(value, IntervalArray):
        return value
    if isinstance(value, Enclosure):
        return IntervalArray.from_enclosure(value)
    return IntervalArray(value)


def softmax(S: IntervalArray, masses: np.ndarray) -> IntervalArray:
    """Rows of ``m_j e^{s_ij} / sum_l m_l e^{s_il}`` over the last axis, enclosed (shift by the row
    maximum first; the shift cancels exactly); ``masses`` broadcast against S (0 for a hidden key)."""
    shift = np.max(S.hi, axis=-1, keepdims=True)
    weights = (S - IntervalArray(shift)).exp() * IntervalArray(masses)
    P = weights / weights.sum(axis=-1, keepdims=True)
    return IntervalArray(np.maximum(P.lo, 0.0), np.minimum(P.hi, 1.0))


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
    if x.is_point:
        return IntervalArray._ordered(*normal_cdf_bounds(x.lo))
    return IntervalArray._ordered(normal_cdf_bounds(x.lo)[0], normal_cdf_bounds(x.hi)[1])


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
    ends_lo = _slope_at(x.lo)
    ends_hi = ends_lo if x.is_point else _slope_at(x.hi)
    lo = np.minimum(ends_lo.lo, ends_hi.lo)
    hi = np.maximum(ends_lo.hi, ends_hi.hi)
    has_top = (x.lo <= root_hi) & (x.hi >= root_lo)
    has_bottom = (x.lo <= -root_lo) & (x.hi >= -root_hi)
    hi = np.where(has_top, np.maximum(hi, top_hi), hi)
    lo = np.where(has_bottom, np.minimum(lo, bottom_lo), lo)
    return IntervalArray(np.maximum(lo, bottom_lo), np.minimum(hi, top_hi))


def gelu_curvature(x: IntervalArray) -> IntervalArray:
    """An enclosure of the range of ``GELU''(x) = phi(x) (2 - x^2)`` over each interval (the product of the
    two factors' ranges: wider than the range by at most the order of the interval's width)."""
    x = as_interval_array(x)
    return normal_pdf(x) * (IntervalArray(2.0) - x.square())


def gelu_third(x: IntervalArray) -> IntervalArray:
    """An enclosure of the range of the third derivative ``x phi(x) (x^2 - 4)`` of GELU over each interval
    (the product of the factors' ranges)."""
    x = as_interval_array(x)
    return x * normal_pdf(x) * (x.square() - IntervalArray(4.0))


def _range_over(f, x: IntervalArray, critical: tuple) -> IntervalArray:
    """The range of a continuous f over each interval of x, enclosed: its extremes on ``[lo, hi]`` lie at the ends or
    at critical points inside, so the hull of f enclosed at the ends and over each critical point's enclosure ``(c_lo,
    c_hi)`` that meets the interval."""
    ends = (f(IntervalArray(x.lo)), f(IntervalArray(x.hi)))
    lo, hi = np.minimum(ends[0].lo, ends[1].lo), np.maximum(ends[0].hi, ends[1].hi)
    for c_lo, c_hi in critical:
        value = f(IntervalArray(c_lo, c_hi))
        meets = (x.lo <= c_hi) & (x.hi >= c_lo)
        lo = np.where(meets, np.minimum(lo, value.lo.item()), lo)
        hi = np.where(meets, np.maximum(hi, value.hi.item()), hi)
    return IntervalArray._ordered(lo, hi)


def gelu_curvature_range(x: IntervalArray) -> IntervalArray:
    """The range of ``GELU''`` over each interval, enclosed: its derivative ``GELU''' = x phi(x) (x^2 - 4)`` vanishes
    at 0 and ``+-2`` only, so the ends and those of them inside decide (:func:`gelu_curvature` multiplies the factors'
    ranges: several times wider on intervals of width 1 and more)."""
    return _range_over(gelu_curvature, as_interval_array(x), ((-2.0, -2.0), (0.0, 0.0), (2.0, 2.0)))


def gelu_curvature_magnitude(x: IntervalArray) -> np.ndarray:
    """``max |GELU''|`` over each interval, rounded up (float array): the magnitude of :func:`gelu_curvature_range`."""
    return gelu_curvature_range(x).magnitude


def gelu_third_magnitude(x: IntervalArray) -> np.ndarray:
    """``max |GELU'''|`` over each interval, rounded up (float array): its derivative ``phi(x) (7 x^2 - x^4 - 4)``
    vanishes where ``x^2 = (7 -+ 33^(1/2)) / 2`` (``|x|`` 0.7923 and 2.5243), enclosed, so the ends and those points
    inside decide (``sup |GELU'''| = 0.7788...``)."""
    root = IntervalArray(33.0).sqrt()
    critical = []
    for square in ((IntervalArray(7.0) - root) / IntervalArray(2.0), (IntervalArray(7.0) + root) / IntervalArray(2.0)):
        c = square.sqrt()
        critical += [(-c.hi.item(), -c.lo.item()), (c.lo.item(), c.hi.item())]
    return _range_over(gelu_third, as_interval_array(x), tuple(critical)).magnitude


def gelu(x: IntervalArray, global_slopes: bool = False) -> IntervalArray:
    """``GELU(x) = x Phi(x)`` on each interval, in mean-value form about the midpoint:
    ``GELU(m) + GELU'([x]) ([x] - m)`` (tight for the narrow intervals of a rigorous forward pass);
    ``global_slopes`` takes GELU' over the whole real line instead of its range over each interval: one
    normal CDF per entry in place of three, at a width that only the intervals' own widths multiply."""
    x = as_interval_array(x)
    mid = x.mid
    return _gelu_about(x, IntervalArray(mid) * IntervalArray(*normal_cdf_bounds(mid)), global_slopes)


def _gelu_about(x: IntervalArray, at_mid: IntervalArray, global_slopes: bool) -> IntervalArray:
    """:func:`gelu` from its enclosure ``at_mid`` at the midpoints."""
    if not np.any(x.hi > x.lo):
        return at_mid
    if global_slopes:   # GELU' in [bottom, top] with |bottom| < top: the term is within +- top * rad
        top = gelu_slope_extrema()[1][1]
        return IntervalArray.around(at_mid.mid, up_nonnegative(up_nonnegative(x.rad * top) + at_mid.rad))
    return at_mid + gelu_slope(x) * (x - IntervalArray(x.mid))


def gelu_with_slopes(x: IntervalArray) -> tuple[IntervalArray, IntervalArray]:
    """:func:`gelu` with ``global_slopes`` and ``GELU'(m) = Phi(m) + m phi(m)`` at the midpoints m of ``x``, from one
    normal CDF per entry (a point pass's activations and the slopes its local Lipschitz bound starts from)."""
    x = as_interval_array(x)
    mid = IntervalArray(x.mid)
    cdf = IntervalArray(*normal_cdf_bounds(x.mid))
    return _gelu_about(x, mid * cdf, True), cdf + mid * IntervalArray(*normal_pdf_bounds(x.mid))
