"""Affine forms with Euclidean and box noise: relational enclosures of sets pushed through attention.

An :class:`AffineForm` of shape S stands for the set

    { c + sum_s e_s G_s + sum_b t_b B_b + u :  ||e||_2 <= 1,  |t_b| <= 1,  |u| <= err entrywise }

with float arrays ``c`` (S), ``G`` (m, *S) (the Euclidean symbols: a Frobenius ball ``||Y - X||_F <= eps``
is ``c = X``, ``G = eps I``, as in DeepT, Bonaert et al., PLDI 2021), ``B`` (k, *S) (box symbols, one per
linearisation error that later operations share) and ``err`` (S, non-negative; independent errors:
rounding, dropped symbols).  A computation may restrict its first m box symbols to a finite point set ``P`` in
``[-1, 1]^m`` (``Symbols(points=P)``: the coordinates of a finite set of inputs, e.g. the words a token may be
replaced by); every operation holds pointwise in the symbols, so it holds at those points, and
:meth:`AffineForm.deviation` bounds those symbols' part by the largest ``|t . B|`` over the points instead of
``sum_b |B_b|``, the bilinear products their quadratic part by its largest value over the points.
Every entry of every array built from the same input keeps its relation
to the others through the shared symbols: the scores, weights and values of an attention layer move
together, which the per-token balls of :mod:`lipbound.local.balls` forget.

Rounding: each float operation on ``c``, ``G``, ``B`` is evaluated by :class:`~lipbound.rigorous.arrays.IntervalArray`
(outward rounding, midpoint-radius products); the midpoint is kept and the radius moves into ``err``:
for the Euclidean symbols ``|sum_s e_s r_s| <= (sum_s r_s^2)^(1/2)`` (Cauchy-Schwarz), for the box symbols
``sum_b r_b``.  :class:`~lipbound.errors.NotCertifiedError` is raised by the interval layer on overflow.

Operations: :meth:`AffineForm.linear` (``x W + b`` over the last axis), ``+``, ``-``, :meth:`scale`,
:meth:`dot` (``q . k`` over the last axis, batched: the scores), :meth:`mix` (``p v``: the weighted values),
:meth:`softmax` (mean-value form: the softmax Jacobian at the centre on the generators, the change of the
Jacobian over the enclosed score box times the scores' deviation as a new box symbol per entry),
:meth:`hull`, :meth:`token_radii` (``sup ||x_i - c_i||`` per row, through the operator norm of each row's
generators), :meth:`row_norms` (the same for the symbolic part over the last axis, any leading shape),
:meth:`reduce` (the smallest Euclidean symbols merged into ``err``); :meth:`elementwise` (a function of each entry
by its mean-value form, from enclosures of its value at the centre and of its slope over the hull), :meth:`product`
(an entrywise or contracted product of two forms) and :meth:`shift` (a constant added).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from .arrays import IntervalArray
from .linalg import spectral_norm_upper, spectral_norm_upper_large

__all__ = ["AffineForm", "Symbols", "single_rows", "sum_upper"]

#: Euclidean symbols processed at a time by the products (bounds the temporaries' memory).
_CHUNK = 512


@final
class Symbols:
    """The box symbols of one computation: a counter shared by every form derived from the same input, so
    that symbol b means the same noise in each of them.

    ``points`` (N, m), optional: float32 coordinates in ``[-1, 1]`` of N points; the first m box symbols then
    take the points' values only (module docstring), and they are allocated at once."""

    def __init__(self, points: np.ndarray | None = None) -> None:
        self.points = None
        self.count = 0
        if points is not None:
            points = np.asarray(points)
            if points.dtype != np.float32 or points.ndim != 2 or not np.all(np.abs(points) <= 1):
                raise AssumptionError("points", "float32 coordinates (N, m) in [-1, 1]", f"{points.dtype} "
                                      f"{points.shape}", "scale the coordinates into the box first")
            self.points = points
            self.count = points.shape[1]

    def fresh(self, count: int) -> int:
        """Allocate ``count`` new symbols; returns the first index."""
        first = self.count
        self.count += int(count)
        return first


def _up(x) -> np.ndarray:
    """Upper end of an interval array (a bound that may be used as a radius)."""
    return np.maximum(x.hi, 0.0)


def _settle(parts: IntervalArray) -> tuple[np.ndarray, np.ndarray]:
    """``(mid, rad)`` of an interval array with the enclosure property (:meth:`IntervalArray.to_enclosure`)."""
    enclosure = parts.to_enclosure()
    return enclosure.mid, enclosure.rad


def _l2_sum(rad: np.ndarray, absolute: bool = False) -> np.ndarray:
    """Upper bound on ``(sum_s rad_s^2)^(1/2)`` over the first axis (of ``|rad|`` with ``absolute``), formed for
    panels of the other entries at a time when ``rad`` is contiguous: entry by entry the same floats, without
    whole-size temporaries (the generators of an output at n = 20 tokens of MiniLM are 0.47 GB)."""
    if rad.shape[0] == 0:
        return np.zeros(rad.shape[1:])
    if not rad.flags.c_contiguous:
        return IntervalArray(np.abs(rad) if absolute else rad).norm_upper(axis=0)
    flat = rad.reshape(rad.shape[0], -1)
    out = np.empty(flat.shape[1])
    # panels of at least two columns: numpy sums a single column pairwise, wider ones row after row as the whole
    edges = list(range(0, flat.shape[1], max(2, _PANEL_ENTRIES // flat.shape[0]))) + [flat.shape[1]]
    if len(edges) > 2 and edges[-1] - edges[-2] == 1:
        del edges[-2]
    for start, stop in zip(edges[:-1], edges[1:]):
        panel = flat[:, start:stop]
        out[start:stop] = IntervalArray(np.abs(panel) if absolute else panel).norm_upper(axis=0)
    return out.reshape(rad.shape[1:])


def _box_sum(rad: np.ndarray) -> np.ndarray:
    if rad.shape[0] == 0:
        return np.zeros(rad.shape[1:])
    return _up(IntervalArray(rad).sum(axis=0))


#: Entries of a generator array whose Euclidean sums are formed at a time (:func:`_l2_sum`).
_PANEL_ENTRIES = 1 << 22
#: Columns of the points' products formed at a time (bounds their float32 temporaries: N x this).
_POINT_COLUMNS = 1024
#: Points whose bilinear products are formed at a time.
_POINT_ROWS = 1024


def single_rows(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Generators (m, E) in float32 for products with points of ``[-1, 1]^m`` in float32, and per entry a bound on
    the products' error, ``|p . b - fl32(p . fl32(b))| <= sum_k |b_k - fl32(b_k)| + gamma_m sum_k |fl32(b_k)|``,
    ``gamma_m = m u / (1 - m u)``, ``u = 2^-24`` (``|p| <= 1``; any order of summation, with or without fused
    multiply-adds)."""
    m = flat.shape[0]
    single = flat.astype(np.float32)
    if not np.all(np.isfinite(single)):
        raise NotCertifiedError("generators", "float32 numbers", "an overflow", "split the points")
    wide = single.astype(np.float64)
    unit = IntervalArray(2.0 ** -24) * IntervalArray(float(m))
    gamma = unit / (IntervalArray(1.0) - unit)
    error = sum_upper(_up((IntervalArray(flat) - IntervalArray(wide)).abs().sum(axis=0)),
                 _up(IntervalArray(np.abs(wide)).sum(axis=0) * gamma))
    return single, error


def _points_sup(points: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Upper bound on ``max_p |p . B_e|`` for every entry e, B (m, *S) float64, points (N, m) float32 in [-1, 1]:
    the largest ``|fl32(p . fl32(B))|`` plus its error (:func:`single_rows`).  Entries whose generators are all zero
    cost nothing."""
    m = B.shape[0]
    flat = B.reshape(m, -1)
    out = np.zeros(flat.shape[1])
    live = np.flatnonzero(np.any(flat != 0, axis=0))
    if live.size == 0:
        return out.reshape(B.shape[1:])
    single, error = single_rows(flat[:, live])
    top = np.empty(live.size)
    for begin in range(0, live.size, _POINT_COLUMNS):
        part = points @ single[:, begin:begin + _POINT_COLUMNS]
        top[begin:begin + _POINT_COLUMNS] = np.maximum(part.max(axis=0), -part.min(axis=0)).astype(np.float64)
    out[live] = sum_upper(top, error)
    return out.reshape(B.shape[1:])


def sum_upper(*terms) -> np.ndarray:
    """Upper bound on the sum of non-negative arrays (or floats), in outward-rounded interval arithmetic."""
    total = IntervalArray(np.zeros(np.broadcast_shapes(*(np.shape(t) for t in terms))))
    for term in terms:
        total = total + IntervalArray(np.asarray(term, dtype=np.float64))
    return _up(total)


@final
@dataclass(frozen=True, eq=False)
class AffineForm:
    """``{c + e G + t B + u}`` (module docstring); arrays of float64, ``err >= 0``."""

    center: np.ndarray
    l2: np.ndarray
    box: np.ndarray
    err: np.ndarray
    symbols: Symbols

    # construction ----------------------------------------------------------------------------------
    @classmethod
    def ball(cls, X, eps: float, moving=None) -> AffineForm:
        """The Frobenius ball ``{Y : ||Y - X||_F <= eps}`` (rows ``moving`` only, if given), shape of X."""
        X = np.asarray(X, dtype=np.float64)
        if not (np.isfinite(eps) and eps >= 0):
            raise AssumptionError("eps", "a finite radius >= 0", repr(eps), "e.g. `eps` 1e-3")
        rows = np.arange(X.shape[0]) if moving is None else np.flatnonzero(np.asarray(moving, dtype=bool))
        width = int(np.prod(X.shape[1:], dtype=np.int64))
        l2 = np.zeros((rows.size * width,) + X.shape)
        index = np.arange(rows.size * width)
        flat = l2.reshape(l2.shape[0], X.shape[0], width)
        flat[index, np.repeat(rows, width), np.tile(np.arange(width), rows.size)] = float(eps)
        return cls(X.copy(), l2, np.zeros((0,) + X.shape), np.zeros(X.shape), Symbols())

    @classmethod
    def ball_image(cls, X, eps: float, W, b=None, columns: slice = slice(None)) -> tuple[AffineForm, AffineForm]:
        """The Frobenius ball about X (n, d) and its image ``Y W + b``, built directly: the image's generator
        of symbol (i, a) is ``eps W[a]`` on row i (the product of the identity by W is not formed).  ``columns``:
        only those columns of the image, the same floats as the whole image's (the centre is the whole product's)."""
        U = cls.ball(X, eps)
        W = np.asarray(W, dtype=np.float64)
        n, d = U.shape
        center = IntervalArray(U.center).matmul(W)
        if b is not None:
            center = center + IntervalArray(np.asarray(b, dtype=np.float64))
        center, W = center[..., columns], W[:, columns]
        rows, rows_rad = _settle(IntervalArray(float(eps)) * IntervalArray(W))        # (d, width)
        l2 = np.zeros((n * d, n, W.shape[1]))
        for i in range(n):
            l2[i * d:(i + 1) * d, i] = rows
        mid, rad = _settle(center)
        err = sum_upper(rad, np.broadcast_to(_l2_sum(rows_rad), mid.shape))
        return U, cls(mid, l2, np.zeros((0, n, W.shape[1])), err, U.symbols)

    @classmethod
    def generated(cls, center: IntervalArray, generators: IntervalArray, symbols: Symbols | None = None) -> AffineForm:
        """``{c + sum_s e_s G_s : ||e||_2 <= 1}`` for an enclosed centre (S) and enclosed Euclidean generators (m, *S)
        (e.g. a linear map's rows times a radius: the map's image of a Frobenius ball): the midpoints are kept,
        the radii move into ``err``."""
        symbols = Symbols() if symbols is None else symbols
        return cls._from_parts(center, iter([generators]), IntervalArray(np.zeros((0,) + center.shape)), 0.0,
                               symbols, generators.shape[0])

    def radius(self) -> float:
        """``sup ||x - c||_2`` over the whole form (every axis flattened), rounded up: the operator norm of its
        Euclidean generators (one certified Gram norm), the norms of its box generators and of ``err``."""
        flat = self.l2.reshape(self.l2.shape[0], -1)
        operator = spectral_norm_upper_large(flat) if flat.shape[0] and flat.shape[1] else 0.0
        boxed = 0.0
        if self.box.shape[0]:
            boxed = IntervalArray(_box_sum(np.abs(self.box.reshape(self.box.shape[0], -1)))).norm_upper().item()
        return sum_upper(operator, boxed, IntervalArray(self.err.reshape(-1)).norm_upper()).item()

    @classmethod
    def _from_parts(cls, center: IntervalArray, l2_parts, box: IntervalArray, extra, symbols: Symbols,
                    count: int) -> AffineForm:
        """A form from enclosures of its center, Euclidean generators (chunks along the ``count`` symbols, in
        order), box generators and a bound ``extra`` on the independent error: the radii move into ``err``.  The
        chunks may come one at a time (a generator): each is settled into the preallocated generators as it
        comes, so no list of chunks lives beside them (at n = 20 tokens of MiniLM the generators are 0.47 GB)."""
        mid, rad = _settle(center)
        l2: np.ndarray | None = None
        filled, l2_rads = 0, []
        for part in l2_parts:
            m, r = _settle(part)
            del part
            if l2 is None:
                l2 = np.empty((count,) + m.shape[1:])
            l2[filled:filled + m.shape[0]] = m
            filled += m.shape[0]
            l2_rads.append(_l2_sum(r))
        if filled != count:
            raise AssumptionError("count", f"{count} symbols in the chunks", str(filled), "pass the symbols' number")
        if l2 is None:
            l2 = np.zeros((0,) + mid.shape)
        box_mid, box_rad = _settle(box)
        err = sum_upper(extra, rad, _box_sum(box_rad), *l2_rads)
        return cls(mid, l2, box_mid, err, symbols)

    def with_symbols(self, symbols: Symbols) -> AffineForm:
        """The same set over another counter of box symbols, with its deviation if computed: a form without box symbols
        only (its Euclidean symbols are the rows of its generators, the same in any computation)."""
        if self.box.shape[0]:
            raise AssumptionError("form", "a form without box symbols", f"{self.box.shape[0]} box symbols",
                                  "derive the forms from one computation instead")
        out = AffineForm(self.center, self.l2, self.box, self.err, symbols)
        out.__dict__.update({key: value for key, value in self.__dict__.items()
                             if key in ("_deviation", "_deviation_parts")})
        return out

    # shape -----------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.center.shape

    def _view(self, transform) -> AffineForm:
        """The same view (index on trailing axes, reshape, swap of negative axes) of every part."""
        return AffineForm(transform(self.center), transform(self.l2), transform(self.box), transform(self.err),
                          self.symbols)

    def __getitem__(self, index) -> AffineForm:
        index = index if isinstance(index, tuple) else (index,)
        if Ellipsis not in index:
            index = index + (Ellipsis,)
        out_center = self.center[index]
        return AffineForm(out_center, self.l2[(slice(None),) + index], self.box[(slice(None),) + index],
                          self.err[index], self.symbols)

    def reshape(self, *shape) -> AffineForm:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        return AffineForm(self.center.reshape(shape), self.l2.reshape((self.l2.shape[0],) + tuple(shape)),
                          self.box.reshape((self.box.shape[0],) + tuple(shape)), self.err.reshape(shape), self.symbols)

    def swapaxes(self, a: int, b: int) -> AffineForm:
        if a >= 0 or b >= 0:
            raise AssumptionError("axes", "negative axes (counted from the end)", f"{a}, {b}", "e.g. -2, -3")
        return self._view(lambda x: np.swapaxes(x, a, b))

    def _box_rows(self, count: int) -> np.ndarray:
        """The box generators padded with zero rows up to ``count`` symbols."""
        if self.box.shape[0] == count:
            return self.box
        pad = np.zeros((count - self.box.shape[0],) + self.shape)
        return np.concatenate([self.box, pad])

    # ranges ----------------------------------------------------------------------------------------
    def deviation(self) -> np.ndarray:
        """Entrywise upper bound on ``|x - c|`` over the set (computed once: a form does not change)."""
        if "_deviation" not in self.__dict__:
            words, rest = self._parts()
            self.__dict__["_deviation"] = sum_upper(words, rest)
        return self.__dict__["_deviation"]

    def _parts(self) -> tuple[np.ndarray, np.ndarray]:
        """Entrywise bounds on the points' symbols' part ``|t B|`` (zero without points) and on the rest of
        ``|x - c|`` (the other symbols and ``err``), computed once."""
        if "_deviation_parts" not in self.__dict__:
            points = self.symbols.points
            m = 0 if points is None else min(points.shape[1], self.box.shape[0])
            words = np.zeros(self.shape)
            if points is not None and m:
                words = np.minimum(_points_sup(points[:, :m], self.box[:m]), _box_sum(np.abs(self.box[:m])))
            rest = sum_upper(_l2_sum(self.l2, absolute=True), _box_sum(np.abs(self.box[m:])), self.err)
            self.__dict__["_deviation_parts"] = words, rest
        return self.__dict__["_deviation_parts"]

    def _points_quadratic(self, other: AffineForm, spec: str) -> np.ndarray:
        """Upper bound on ``|einsum(spec, x - c_x, y - c_y)|`` over the points (the points' symbols at each point, the
        rest anywhere): ``max_p |einsum(spec, p A_x, p A_y)|`` evaluated point by point (float32 products enclosed
        as in :func:`_points_sup`), plus the cross terms of the words' parts with the rests and the rests' product."""
        points = self.symbols.points
        assert points is not None
        m = points.shape[1]
        inputs, output = spec.split("->")
        left, right = inputs.split(",")
        by_point = f"v{left},v{right}->v{output}"

        def word_rows(form: AffineForm) -> tuple[np.ndarray, np.ndarray]:
            return single_rows(form._box_rows(max(m, form.box.shape[0]))[:m].reshape(m, -1))
        (ax, ex), (ay, ey) = word_rows(self), word_rows(other)
        largest = None
        for begin in range(0, points.shape[0], _POINT_ROWS):
            chunk = points[begin:begin + _POINT_ROWS]
            a = IntervalArray.around((chunk @ ax).astype(np.float64), ex[None]).reshape((chunk.shape[0],) + self.shape)
            b = IntervalArray.around((chunk @ ay).astype(np.float64), ey[None]).reshape((chunk.shape[0],) + other.shape)
            value = a.einsum(by_point, b)
            top = np.max(np.maximum(value.hi, -value.lo), axis=0)
            largest = top if largest is None else np.maximum(largest, top)
        (wx, rx), (wy, ry) = self._parts(), other._parts()
        cross = [_up(IntervalArray(u).einsum(spec, IntervalArray(w))) for u, w in ((wx, ry), (rx, wy), (rx, ry))]
        return sum_upper(largest, *cross)

    def hull(self) -> IntervalArray:
        """The smallest box this bound gives: ``c +- deviation``."""
        return IntervalArray.around(self.center, self.deviation())

    def token_radii(self) -> np.ndarray:
        """``sup ||x_i - c_i||_2`` for each row i of a 2-d form (n, d): the operator norm of the row's
        Euclidean generators (one certified Gram norm per row), the norms of its box generators and of its
        independent errors."""
        if self.center.ndim != 2:
            raise AssumptionError("form", "a 2-d form (tokens, features)", f"shape {self.shape}", "reshape it")
        radii = []
        for i in range(self.shape[0]):
            G = self.l2[:, i, :]
            operator = spectral_norm_upper(G)
            boxed = 0.0
            if self.box.shape[0]:   # sup over the box of ||t B_i||: by symbols, or by coordinates
                by_symbol = _box_sum(IntervalArray(self.box[:, i, :]).norm_upper(axis=-1)[:, None])[0]
                by_coordinate = IntervalArray(_box_sum(np.abs(self.box[:, i, :]))).norm_upper()
                boxed = min(by_symbol, by_coordinate)
            radii.append(sum_upper(operator, boxed, IntervalArray(self.err[i]).norm_upper()).item())
        return np.array(radii)

    # linear operations ----------------------------------------------------------------------------------
    def linear(self, W, b=None) -> AffineForm:
        """``x W + b`` over the last axis (W, b floats taken exactly)."""
        W = np.asarray(W, dtype=np.float64)
        center = IntervalArray(self.center).matmul(W)
        if b is not None:
            center = center + IntervalArray(np.asarray(b, dtype=np.float64))
        chunks = (IntervalArray(self.l2[s:s + _CHUNK]).matmul(W) for s in range(0, self.l2.shape[0], _CHUNK))
        box = IntervalArray(self.box).matmul(W)
        extra = _up(IntervalArray(self.err).matmul(np.abs(W)))
        return AffineForm._from_parts(center, chunks, box, extra, self.symbols, self.l2.shape[0])

    def _combine(self, other: AffineForm, sign: float) -> AffineForm:
        if other.symbols is not self.symbols or other.l2.shape[0] != self.l2.shape[0]:
            raise AssumptionError("other", "a form over the same symbols", "a form of another input",
                                  "derive both forms from one AffineForm.ball")
        count = max(self.box.shape[0], other.box.shape[0])
        shape = np.broadcast_shapes(self.shape, other.shape)

        def both(a, b):
            return IntervalArray(a) + IntervalArray(sign * b)
        chunks = (both(self.l2[s:s + _CHUNK], other.l2[s:s + _CHUNK]) for s in range(0, self.l2.shape[0], _CHUNK))
        box = both(self._box_rows(count), other._box_rows(count))
        extra = np.broadcast_to(sum_upper(self.err, other.err), shape)
        return AffineForm._from_parts(both(self.center, other.center), chunks, box, extra, self.symbols,
                                      self.l2.shape[0])

    def __add__(self, other: AffineForm) -> AffineForm:
        return self._combine(other, 1.0)

    def __sub__(self, other: AffineForm) -> AffineForm:
        return self._combine(other, -1.0)

    def scale(self, factor: IntervalArray) -> AffineForm:
        """``factor x`` for an enclosed scalar (or array broadcasting against the form): the factor's
        midpoint on every part, its radius times the deviation and the center's size into ``err``."""
        factor = factor if isinstance(factor, IntervalArray) else IntervalArray(np.asarray(factor, dtype=np.float64))
        mid, rad = _settle(factor)
        f = IntervalArray(mid)
        spread = _up(IntervalArray(rad) * IntervalArray(sum_upper(np.abs(self.center), self.deviation())))
        chunks = (IntervalArray(self.l2[s:s + _CHUNK]) * f for s in range(0, self.l2.shape[0], _CHUNK))
        extra = sum_upper(spread, _up(IntervalArray(self.err) * IntervalArray(np.abs(mid))))
        return AffineForm._from_parts(IntervalArray(self.center) * f, chunks, IntervalArray(self.box) * f, extra,
                                      self.symbols, self.l2.shape[0])

    def shift(self, offset) -> AffineForm:
        """``x + offset`` for a constant (float or enclosed array broadcasting against the form)."""
        offset = offset if isinstance(offset, IntervalArray) else IntervalArray(np.asarray(offset, dtype=np.float64))
        mid, rad = _settle(IntervalArray(self.center) + offset)
        return AffineForm(mid, self.l2, self.box, sum_upper(self.err, rad), self.symbols)

    def elementwise(self, value: IntervalArray, slope: IntervalArray) -> AffineForm:
        """``f(x)`` entry by entry, for ``value`` enclosing ``f(c)`` and ``slope`` enclosing ``f'`` over :meth:`hull`.

        Mean value form: ``f(x) - f(c) = f'(xi) (x - c)`` with xi in the hull, so ``f(x) = f(c) + s (x - c) +
        (f'(xi) - s)(x - c)`` with s the slope's midpoint: the second term acts on the generators (and ``|s|`` on
        ``err``), the third is at most the slope's radius times the deviation (into ``err``)."""
        s_mid, s_rad = _settle(slope)
        s = IntervalArray(s_mid)
        spread = _up(IntervalArray(s_rad) * IntervalArray(self.deviation()))
        extra = sum_upper(spread, _up(IntervalArray(self.err) * IntervalArray(np.abs(s_mid))))
        chunks = (IntervalArray(self.l2[c:c + _CHUNK]) * s for c in range(0, self.l2.shape[0], _CHUNK))
        return AffineForm._from_parts(value, chunks, IntervalArray(self.box) * s, extra, self.symbols,
                                      self.l2.shape[0])

    def row_map(self, sigma: np.ndarray, at: IntervalArray) -> AffineForm:
        """``at + sigma (x - c)`` over the last axis of a 3-d form (H, n, k), row by row: ``sigma`` (H, n, l, k)
        floats taken exactly, one matrix per row; ``at`` (H, n, l) enclosed (a linearisation about the centre whose
        remainder the caller bounds)."""
        if self.center.ndim != 3:
            raise AssumptionError("form", "a 3-d form (H, n, k)", f"shape {self.shape}", "reshape it")
        spec = "shik,hilk->shil"
        chunks = (IntervalArray(self.l2[c:c + _CHUNK]).einsum(spec, IntervalArray(sigma))
                  for c in range(0, self.l2.shape[0], _CHUNK))
        box = IntervalArray(self.box).einsum(spec, IntervalArray(sigma))
        extra = _up(IntervalArray(self.err).einsum("hik,hilk->hil", IntervalArray(np.abs(sigma))))
        return AffineForm._from_parts(at, chunks, box, extra, self.symbols, self.l2.shape[0])

    def product(self, other: AffineForm, spec: str) -> AffineForm:
        """``einsum(spec, x, y)`` of two forms of one computation (e.g. ``"ik,i->ik"``, ``"ik,ik->i"``): the linear
        parts as generators, the product of the two deviations, summed as the spec sums, as one new box symbol
        per entry."""
        quadratic = _up(IntervalArray(self.deviation()).einsum(spec, IntervalArray(other.deviation())))
        return self._bilinear(other, spec, quadratic)

    # bilinear operations ----------------------------------------------------------------------------
    def _bilinear(self, other: AffineForm, spec: str, quadratic: np.ndarray) -> AffineForm:
        """``einsum(spec, x, y)`` for two forms over one computation: the linear parts exactly (as
        generators), the product of the two deviations bounded by ``quadratic`` (a new box symbol per
        entry: later operations share it)."""
        if other.symbols is not self.symbols:
            raise AssumptionError("other", "a form over the same symbols", "a form of another input",
                                  "derive both forms from one AffineForm.ball")
        inputs, output = spec.split("->")
        left, right = inputs.split(",")
        with_symbol = f"s{left},{right}->s{output}", f"{left},s{right}->s{output}"
        cx, cy = IntervalArray(self.center), IntervalArray(other.center)
        center = cx.einsum(spec, cy)

        def generators(a: np.ndarray, b: np.ndarray):
            return IntervalArray(a).einsum(with_symbol[0], cy) + cx.einsum(with_symbol[1], IntervalArray(b))

        chunks = (generators(self.l2[s:s + _CHUNK], other.l2[s:s + _CHUNK])
                  for s in range(0, self.l2.shape[0], _CHUNK))
        count = max(self.box.shape[0], other.box.shape[0])
        box = generators(self._box_rows(count), other._box_rows(count))
        # the independent errors times the other factor's whole size (centre and deviation)
        ax, ay = sum_upper(np.abs(self.center), self.deviation()), sum_upper(np.abs(other.center), other.deviation())
        extra = sum_upper(_up(IntervalArray(self.err).einsum(spec, IntervalArray(ay))),
                     _up(IntervalArray(ax).einsum(spec, IntervalArray(other.err))))
        if self.symbols.points is not None:   # the deviations' product point by point
            quadratic = np.minimum(quadratic, self._points_quadratic(other, spec))
        form = AffineForm._from_parts(center, chunks, box, extra, self.symbols, self.l2.shape[0])
        return form._with_box(quadratic)

    def _with_box(self, size: np.ndarray) -> AffineForm:
        """The form plus one new box symbol per entry of radius ``size`` (>= 0)."""
        size = np.broadcast_to(np.asarray(size, dtype=np.float64), self.shape)
        live = np.flatnonzero(size.reshape(-1) > 0)
        if live.size == 0:
            return self
        first = self.symbols.fresh(live.size)
        box = np.zeros((first + live.size, *self.shape))
        box[:self.box.shape[0]] = self.box
        flat = box.reshape(box.shape[0], -1)
        flat[first + np.arange(live.size), live] = size.reshape(-1)[live]
        return AffineForm(self.center, self.l2, box, self.err, self.symbols)

    def row_norms(self) -> np.ndarray:
        """``sup ||L_r||_2`` over the last axis for every leading index r, L the symbolic part (Euclidean:
        the operator norm of the row's generators, from its Gram matrix; box: the sum of the rows' norms)."""
        lead = self.shape[:-1]
        k = self.shape[-1]
        G = self.l2.reshape(self.l2.shape[0], int(np.prod(lead, dtype=np.int64)), k)   # (no -1: no symbols)
        out = np.empty(G.shape[1])
        for r in range(G.shape[1]):
            block = G[:, r, :]
            out[r] = spectral_norm_upper(block)
        if self.box.shape[0] == 0:
            return out.reshape(lead)
        box = IntervalArray(np.abs(self.box).reshape(self.box.shape[0], -1, k)).norm_upper(axis=-1)
        return sum_upper(out, _box_sum(box)).reshape(lead)

    def dot(self, other: AffineForm) -> AffineForm:
        """``x_hi . y_hj`` over the last axis of two 3-d forms (H, n, k), (H, l, k) -> (H, n, l).

        The product of the deviations is bounded by the smaller of the box bound ``sum_k |dx_k| |dy_k|`` and
        ``||L_x|| ||L_y||`` (operator norms of the rows' generators, halved when the two rows' Euclidean
        symbols are disjoint and neither has box symbols: ``sup_{a^2 + b^2 <= 1} a b = 1/2``), each plus the
        independent errors' share."""
        spec = "hik,hjk->hij"
        rx, ry = self.deviation(), other.deviation()
        boxed = _up(IntervalArray(rx).einsum(spec, IntervalArray(ry)))
        nx, ny = self.row_norms(), other.row_norms()
        support_x = (np.abs(self.l2).sum(axis=-1) > 0).astype(np.float64)        # (m, H, n)
        support_y = (np.abs(other.l2).sum(axis=-1) > 0).astype(np.float64)
        shared = np.einsum("shi,shj->hij", support_x, support_y) > 0
        plain_x = np.abs(self.box).sum(axis=(0, -1)) == 0
        plain_y = np.abs(other.box).sum(axis=(0, -1)) == 0
        no_box = plain_x[:, :, None] & plain_y[:, None, :]
        half = np.where(~shared & no_box, 0.5, 1.0)
        symbolic = _up(IntervalArray(nx[:, :, None]) * IntervalArray(ny[:, None, :]) * IntervalArray(half))
        errors = sum_upper(_up(IntervalArray(self.err).einsum(spec, IntervalArray(ry))),
                      _up(IntervalArray(rx).einsum(spec, IntervalArray(other.err))))
        return self._bilinear(other, spec, np.minimum(boxed, sum_upper(symbolic, errors)))

    def mix(self, values: AffineForm, ranges: IntervalArray | None = None) -> AffineForm:
        """``sum_j p_ij v_jk``: weights (H, n, l) and values (H, l, k) -> (H, n, k); the deviations' product
        bounded entrywise, the weights' deviation capped by ``ranges`` (an enclosure of p over the set: the
        product needs the symbolic parts only at the points of the set, where they are ``p - c - u``)."""
        spec = "hij,hjk->hik"
        rp = self.deviation()
        if ranges is not None:   # the symbolic part at a point of the set is p - c - u: |.| <= |p - c| + err
            capped = np.maximum(_up(ranges - IntervalArray(self.center)), _up(IntervalArray(self.center) - ranges))
            rp = np.minimum(rp, sum_upper(capped, self.err))
        quadratic = _up(IntervalArray(rp).einsum(spec, IntervalArray(values.deviation())))
        return self._bilinear(values, spec, quadratic)

    # softmax ----------------------------------------------------------------------------------------
    def softmax(self, ranges: IntervalArray | None = None) -> tuple[AffineForm, IntervalArray]:
        """Rows of the softmax over the last axis of a 3-d form (H, n, l) (unit masses), with an enclosure
        of its values; ``ranges`` must hold for every score vector of :meth:`hull` (not only those of the set).

        Mean value form: with ``s-bar`` the centre, ``p(s) - p(s-bar) = J(xi) (s - s-bar)`` for a point xi of
        the scores' box, and ``J(xi) = diag(p) - p p^T`` with p in the weights' box; so ``p(s) = p(s-bar) +
        Sigma (s - s-bar) + (J(xi) - Sigma)(s - s-bar)`` with ``Sigma`` the float Jacobian at the centre: the
        second term acts on the generators, the third is at most ``|J - Sigma| |s - s-bar|`` entrywise (a new box
        symbol per entry).  The weights' box is the softmax of the score box, intersected with ``ranges``
        (the caller's own softmax ranges) and with [0, 1]; it is returned as the second value."""
        S = self.hull()
        shift = np.max(S.hi, axis=-1, keepdims=True)
        weights = (S - IntervalArray(shift)).exp()
        total = weights.sum(axis=-1, keepdims=True)
        if np.all(total.lo > 0):
            box = weights / total
            lo, hi = np.maximum(box.lo, 0.0), np.minimum(box.hi, 1.0)
        else:   # every exponential of a row may underflow: only the simplex is known
            lo, hi = np.zeros(self.shape), np.ones(self.shape)
        if ranges is not None:
            lo, hi = np.maximum(lo, ranges.lo), np.minimum(hi, ranges.hi)
        at = IntervalArray(self.center - np.max(self.center, axis=-1, keepdims=True)).exp()
        p_bar = at / at.sum(axis=-1, keepdims=True)
        p_mid, _ = _settle(p_bar)
        sigma = p_mid[..., :, None] * (np.eye(self.shape[-1]) - p_mid[..., None, :])            # float, symmetric-ish
        # |J(xi) - Sigma| over the weights' box: diag(p) - p p^T with p anywhere in [lo, hi]
        P = IntervalArray(lo, hi)
        jac = IntervalArray(np.eye(self.shape[-1])) * P.expand(-1) - P.expand(-1) * P.expand(-2)
        deviation = self.deviation()
        gap = np.maximum(_up(jac - IntervalArray(sigma)), _up(IntervalArray(sigma) - jac))
        remainder = _up(IntervalArray(gap).einsum("hilm,him->hil", IntervalArray(deviation)))
        # or Taylor's second-order form: d^2 p_l[D, D] = p_l ((D_l - mu)^2 - var_p(D)) with mu = E_p D, so
        # |r_l| <= (1/2) p_l^+ (|D_l| + max_m |D_m|)^2, plus Sigma's rounding against the exact Jacobian at the centre
        at_centre = IntervalArray(np.eye(self.shape[-1])) * p_bar.expand(-1) - p_bar.expand(-1) * p_bar.expand(-2)
        rounding = np.maximum(_up(at_centre - IntervalArray(sigma)), _up(IntervalArray(sigma) - at_centre))
        reach = IntervalArray(deviation) + IntervalArray(np.max(deviation, axis=-1, keepdims=True))
        taylor = _up(IntervalArray(hi) * reach.square() * IntervalArray(0.5)
                     + IntervalArray(rounding).einsum("hilm,him->hil", IntervalArray(deviation)))
        remainder = np.minimum(remainder, taylor)
        spec = "shim,hilm->shil"
        chunks = (IntervalArray(self.l2[s:s + _CHUNK]).einsum(spec, IntervalArray(sigma))
                  for s in range(0, self.l2.shape[0], _CHUNK))
        box_part = IntervalArray(self.box).einsum(spec, IntervalArray(sigma))
        extra = _up(IntervalArray(np.abs(sigma)).einsum("hilm,him->hil", IntervalArray(self.err)))
        form = AffineForm._from_parts(p_bar, chunks, box_part, extra, self.symbols,
                                      self.l2.shape[0])._with_box(remainder)
        return form.within(IntervalArray(np.minimum(lo, hi), hi)), IntervalArray(np.minimum(lo, hi), hi)

    def within(self, ranges: IntervalArray) -> AffineForm:
        """The form with every entry whose deviation exceeds the half-width of ``ranges`` (an enclosure of
        that entry over the set) replaced by the range itself: its midpoint and a new box symbol of its
        radius (either description holds entry by entry)."""
        mid, rad = _settle(ranges)
        wide = self.deviation() > rad
        if not np.any(wide):
            return self
        keep = ~wide
        narrowed = AffineForm(np.where(keep, self.center, mid), self.l2 * keep, self.box * keep,
                              self.err * keep, self.symbols)
        return narrowed._with_box(np.where(wide, rad, 0.0))

    # symbols ----------------------------------------------------------------------------------------
    @staticmethod
    def reduce(forms: list, keep: int) -> list:
        """The forms of one computation with at most ``keep`` Euclidean symbols, the same ones in each (the
        largest by their generators' Frobenius norm summed over the forms); the others move into ``err``
        entrywise (``|sum_s e_s G_s| <= (sum_s G_s^2)^(1/2)`` over the dropped ones)."""
        count = forms[0].l2.shape[0]
        if count <= keep:
            return list(forms)
        if any(f.l2.shape[0] != count or f.symbols is not forms[0].symbols for f in forms):
            raise AssumptionError("forms", "forms over the same symbols", "forms of different inputs",
                                  "derive them from one AffineForm.ball")
        sizes = sum(np.sum(f.l2.reshape(count, -1) ** 2, axis=1) for f in forms)
        order = np.argsort(sizes)[::-1]
        kept, dropped = np.sort(order[:keep]), order[keep:]
        return [AffineForm(f.center, f.l2[kept], f.box, sum_upper(f.err, _l2_sum(np.abs(f.l2[dropped]))), f.symbols)
                for f in forms]
