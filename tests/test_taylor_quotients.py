"""GELU's second-order Taylor quotients (lipbound/local/taylor_quotients.py): the enclosure of ``q(t) = 2 (GELU(h + t)
- GELU(h) - GELU'(h) t) / t^2`` over ``|t| <= dev`` holds the quotients computed at 60 digits at sampled and extreme
t, and the split ``(g, S, M)`` holds ``|q - g| <= S`` and ``|q| <= M``; a range read at the pieces' left ends fails."""

from __future__ import annotations

import mpmath
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.local import taylor_quotients
from lipbound.local.taylor_quotients import curvature_split, quotient_range
from lipbound.rigorous.arrays import IntervalArray, gelu_curvature

mpmath.mp.dps = 60


def _quotient(h: float, t: float) -> mpmath.mpf:
    """``q(t)`` at 60 digits (``GELU''(h)`` at t = 0)."""
    h, t = mpmath.mpf(h), mpmath.mpf(t)
    pdf = lambda x: mpmath.exp(-x * x / 2) / mpmath.sqrt(2 * mpmath.pi)   # noqa: E731
    cdf = lambda x: (1 + mpmath.erf(x / mpmath.sqrt(2))) / 2              # noqa: E731
    if t == 0:
        return pdf(h) * (2 - h * h)
    gelu = lambda x: x * cdf(x)                                           # noqa: E731
    return 2 * (gelu(h + t) - gelu(h) - (cdf(h) + h * pdf(h)) * t) / (t * t)


def _escape(h: np.ndarray, dev: np.ndarray, found: IntervalArray, g: IntervalArray, S: np.ndarray, M: np.ndarray,
            rng, samples: int = 12) -> float:
    """The largest amount by which a quotient at a sampled or extreme ``|t| <= dev`` leaves the enclosure, ``g +- S``
    or ``|q| <= M`` (at most 0 where all hold)."""
    worst = -np.inf
    for k in range(h.shape[0]):
        ts = [0.0, dev[k], -dev[k]] + list(rng.uniform(-dev[k], dev[k], samples))
        for t in ts:
            value = _quotient(h[k], t)
            for gap in (found.lo[k] - value, value - found.hi[k], abs(value - g.lo[k]) - S[k], abs(value) - M[k]):
                worst = max(worst, float(gap))
    return worst


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), spread=st.sampled_from([0.01, 0.5, 2.0, 6.0]),
       pieces=st.sampled_from([1, 3, 8]))
def test_quotients_hold_at_sampled_points(seed, spread, pieces):
    """Generated pre-activations (about GELU's inflection points and its flat parts) and reaches: every sampled
    quotient lies in the enclosure and in ``g +- S``, and ``|q| <= M``."""
    rng = np.random.default_rng(seed)
    h = np.concatenate([rng.uniform(-4, 4, 10), [0.0, np.sqrt(2.0), -2.0, 2.0, -9.0]])
    dev = rng.uniform(0, spread, h.shape[0])
    dev[0] = 0.0
    found = quotient_range(IntervalArray(h), dev, pieces)
    g, S, M = curvature_split(IntervalArray(h), dev, (), pieces)
    assert _escape(h, dev, found, g, S, M, rng) <= 0


def test_quotients_tighter_than_the_ranges_of_gelus_derivatives():
    """Where the reach is wide the spread is below both ``T dev / 3`` and ``|GELU''|``'s largest value, and the split's
    midpoint moves off ``GELU''(h)``; where it is small it is within 2% of ``T dev / 3``'s order (the intersection)."""
    from lipbound.rigorous.arrays import gelu_curvature_magnitude, gelu_third_magnitude
    h, dev = np.array([0.0, 1.0, -1.5]), np.array([2.5, 2.5, 2.5])
    g, S, M = curvature_split(IntervalArray(h), dev)
    hull = IntervalArray(h - dev, h + dev)
    assert np.all(S < gelu_third_magnitude(hull) * dev / 3)
    largest = gelu_curvature_magnitude(hull)
    assert M[0] <= largest[0] * (1 + 1e-12) and np.all(M[1:] < largest[1:])
    assert np.all(np.abs(g.lo - gelu_curvature(IntervalArray(h)).lo) > 0.05)
    small = np.array([1e-3, 1e-3, 1e-3])
    _, S_small, _ = curvature_split(IntervalArray(h), small)
    assert np.all(S_small <= gelu_third_magnitude(IntervalArray(h - small, h + small)) * small / 3 * 1.02 + 1e-15)


def test_a_range_read_at_the_pieces_left_ends_fails(monkeypatch):
    """Mutation: GELU'''s range over each piece replaced by its value at the piece's left end lets quotients leave
    the enclosure."""
    rng = np.random.default_rng(3)
    h, dev = np.array([0.3, -0.5, 1.0, 2.2]), np.array([1.5, 2.0, 1.0, 3.0])
    args = (IntervalArray(h), dev)
    assert _escape(h, dev, quotient_range(*args), *curvature_split(*args), rng) <= 0
    monkeypatch.setattr(taylor_quotients, "gelu_third_magnitude", lambda x: np.full(x.shape, 1e6))
    monkeypatch.setattr(taylor_quotients, "gelu_curvature_range", lambda x: gelu_curvature(IntervalArray(x.lo)))
    assert _escape(h, dev, quotient_range(*args), *curvature_split(*args), rng) > 0
