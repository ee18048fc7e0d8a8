r"""Certified ranges of a derivative over the real line: the slope range of an activation.

An activation :math:`\varphi` of a feed-forward block has secant slopes
``(phi(s) - phi(t)) / (s - t)`` in ``[inf phi', sup phi']`` (mean value theorem), and every
bound of the block rests on that range.  :func:`derivative_range` encloses ``inf f`` and
``sup f`` of ``f = phi'`` over ``R`` from interval versions of ``f`` and ``g = f' = phi''``:

* on ``[-L, L]``, branch and bound: a box on which ``g`` has one sign (certified) holds its
  extremes at its ends, evaluated as point intervals; a box on which ``g`` may vanish is
  bisected until it is narrower than ``width``, and then enclosed by the mean-value form
  ``f(m) + g(box) (box - m)``, whose overestimate is of order ``|f''| width^2`` because
  ``g(box)`` contains 0; boxes whose enclosure cannot hold the minimum (or the maximum) are
  set aside once a point value beats them;
* outside ``[-L, L]``, an enclosure of ``f`` supplied by the caller (a tail lemma of the
  activation, :mod:`lipbound.symbolic.activations`).

The result is a :class:`SlopeRange`: two intervals, each certain to hold the true infimum or
supremum, and the points where they are (nearly) attained.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

from mpmath import libmp

from ..errors import NotCertifiedError
from .intervals import IV, _raw, interval, lower, upper

__all__ = ["SlopeRange", "derivative_range"]


@final
@dataclass(frozen=True)
class SlopeRange:
    """Certified enclosures of ``inf phi'`` and ``sup phi'`` over the real line.

    Attributes
    ----------
    name : str
        The activation.
    minimum, maximum : mpmath intervals
        Each holds the true infimum (supremum) of ``phi'``.
    argmin, argmax : float
        Where the extremes are attained, to about ``width`` (``nan``: in the limit only).
    method : str
        How the enclosures were obtained.
    """

    name: str
    minimum: object
    maximum: object
    argmin: float
    argmax: float
    method: str = ""

    @property
    def alpha(self) -> float:
        """A float at most every slope of phi (the lower end of :attr:`minimum`, rounded down)."""
        return lower(self.minimum)

    @property
    def beta(self) -> float:
        """A float at least every slope of phi (the upper end of :attr:`maximum`, rounded up)."""
        return upper(self.maximum)

    @property
    def ell(self) -> float:
        """``sup |phi'| <= max(-alpha, beta)``, rounded up."""
        return max(-self.alpha, self.beta)

    @property
    def width(self) -> float:
        """The larger width of the two enclosures (how well the range is known)."""
        return max(upper(x) - lower(x) for x in (self.minimum, self.maximum))

    def to_json(self) -> dict:
        return {"name": self.name, "minimum": [lower(self.minimum), upper(self.minimum)],
                "maximum": [lower(self.maximum), upper(self.maximum)], "argmin": self.argmin,
                "argmax": self.argmax, "alpha": self.alpha, "beta": self.beta, "ell": self.ell,
                "method": self.method}


def _positive(x) -> bool:
    return libmp.mpf_gt(_raw(x)[0], libmp.fzero)


def _negative(x) -> bool:
    return libmp.mpf_lt(_raw(x)[1], libmp.fzero)


def derivative_range(first: Callable, second: Callable, limit: float, outside, name: str = "",
                     pieces: int = 64, width: float = 2.0 ** -30, max_boxes: int = 20000) -> SlopeRange:
    """Enclose ``inf f`` and ``sup f`` over ``R`` (see the module docstring).

    Parameters
    ----------
    first, second : callables on intervals
        ``f`` and its derivative ``g``, each returning an interval that holds the exact image.
    limit : float
        ``L``: the branch and bound covers ``[-L, L]``.
    outside : interval
        Holds every value of ``f`` on ``|t| >= L``.
    pieces, width, max_boxes : int, float, int
        The first split of ``[-L, L]``, the width below which a box is enclosed by the
        mean-value form, and a cap on the work (past it nothing is certified).

    Raises
    ------
    NotCertifiedError
        The cap is reached (an ``f`` too flat to separate its extremes at this width).
    """
    edges = [-limit + 2.0 * limit * k / pieces for k in range(pieces)] + [limit]
    boxes = deque(zip(edges[:-1], edges[1:]))
    best_min_upper, best_max_lower = math.inf, -math.inf   # point values: min <= it, max >= it
    argmin = argmax = math.nan
    minima, maxima = [], []                                 # enclosures of each kept box's extremes

    def point(t: float):
        nonlocal best_min_upper, best_max_lower, argmin, argmax
        value = first(t)
        if upper(value) < best_min_upper:
            best_min_upper, argmin = upper(value), t
        if lower(value) > best_max_lower:
            best_max_lower, argmax = lower(value), t
        return value

    for a, b in list(boxes):
        point(0.5 * (a + b))
    processed = 0
    while boxes:
        processed += 1
        if processed > max_boxes:
            raise NotCertifiedError(name or "f", f"a range certified within {max_boxes} boxes",
                                    "more boxes", "raise max_boxes or the width of the final boxes")
        a, b = boxes.popleft()
        box = interval((a, b))
        slope = second(box)
        if _positive(slope) or _negative(slope):          # monotone: the extremes are at the ends
            left, right = point(a), point(b)
            low, high = (left, right) if _positive(slope) else (right, left)
            minima.append(low)
            maxima.append(high)
            continue
        middle = 0.5 * (a + b)
        centre = point(middle)
        enclosure = centre + slope * (box - middle)       # mean-value form
        wanted_min = lower(enclosure) <= best_min_upper
        wanted_max = upper(enclosure) >= best_max_lower
        if not (wanted_min or wanted_max):
            continue                                       # neither extreme can lie here
        if b - a <= width or middle in (a, b):
            if wanted_min:
                minima.append(interval((lower(enclosure), upper(centre))))
            if wanted_max:
                maxima.append(interval((lower(centre), upper(enclosure))))
            continue
        boxes.append((a, middle))
        boxes.append((middle, b))
    minimum = _extreme(minima, outside, largest=False)
    maximum = _extreme(maxima, outside, largest=True)
    return SlopeRange(name, minimum, maximum, argmin, argmax,
                      f"branch and bound on [-{limit:g}, {limit:g}] ({processed} boxes, final width "
                      f"{width:.3g}, mean-value form) and a tail enclosure beyond")


def _extreme(parts: list, outside, largest: bool):
    """The enclosure of the extreme of several pieces: ``[min lo, min hi]`` for a minimum."""
    parts = parts + [interval(outside)]
    pick, order = (max if largest else min), functools.cmp_to_key(libmp.mpf_cmp)
    return IV.make_mpf((pick((_raw(p)[0] for p in parts), key=order), pick((_raw(p)[1] for p in parts), key=order)))
