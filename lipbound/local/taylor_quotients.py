"""GELU's second-order Taylor quotients over each neuron's own pre-activation range.

The feed-forward remainder of a token's set (:mod:`lipbound.local.feedforward_taylor`) is ``sum_k phi_k(t_k) r_k`` with
``phi_k(t) = GELU(h_k + t) - GELU(h_k) - GELU'(h_k) t`` and ``|t_k| <= dev_k``.  Its two lemmas read ``phi_k`` through
the quotient (lemma gelu-taylor-quotient, docs/local.md)

    q_k(t) = 2 phi_k(t) / t^2 = 2 int_0^1 (1 - u) GELU''(h_k + u t) du        (q_k(0) = GELU''(h_k)),

a weighted mean of GELU'' over the segment from ``h_k`` to ``h_k + t`` (the weights ``2 (1 - u)`` favour its start).
:func:`quotient_range` encloses ``{q_k(t) : |t| <= dev_k}``: for t in a piece ``[s_(m-1), s_m]`` of ``[0, dev_k]``
(and its mirror) and u in a piece ``[u_(j-1), u_j]`` of ``[0, 1]``, ``u t`` lies in ``[u_(j-1) s_(m-1), u_j s_m]``, so
``q_k(t)`` lies in ``sum_j w_j R_mj``, ``w_j = int 2 (1 - u) du`` over the u-piece and ``R_mj`` GELU'''s range over
``h_k`` plus that interval (:func:`~lipbound.rigorous.arrays.gelu_curvature_range`); the hull over the t-pieces and
both sides holds every ``q_k(t)``.  It is intersected with ``GELU''(h_k) +- T_k dev_k / 3`` (``T_k >= |GELU'''|`` on
``h_k +- dev_k``: ``|GELU''(h_k + u t) - GELU''(h_k)| <= T_k u |t|`` and ``2 int (1 - u) u du = 1/3``), which is the
tighter of the two where ``dev_k`` is small.

:func:`curvature_split` turns the enclosure into the signed lemma's pair: ``g_k`` its float midpoint and ``S_k`` its
half-width about ``g_k``, rounded up, so that ``|phi_k(t) - g_k t^2 / 2| <= S_k t^2 / 2``; the joint lemma takes
``|q_k| <= S_k`` with ``S_k`` the enclosure's magnitude.
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray, gelu_curvature, gelu_curvature_range, gelu_third_magnitude

__all__ = ["quotient_range", "curvature_split", "QUOTIENT_PIECES"]

#: pieces of ``[0, dev_k]`` (each side) and of ``[0, 1]`` in :func:`quotient_range`
QUOTIENT_PIECES = 8


def quotient_range(h: IntervalArray, dev: np.ndarray, pieces: int = QUOTIENT_PIECES) -> IntervalArray:
    """An enclosure of ``{q_k(t) : |t| <= dev_k}`` per neuron (module docstring), ``h`` (d_ff,) the enclosed
    pre-activations at the centre, ``dev`` (d_ff,) floats >= 0."""
    dev = np.asarray(dev, dtype=np.float64)
    # u-pieces [j / J, (j + 1) / J] and their weights int 2 (1 - u) du = (2 J - 2 j - 1) / J^2, enclosed
    J = IntervalArray(float(pieces))
    u = IntervalArray(np.arange(pieces + 1, dtype=np.float64)) / J                                    # (J + 1,)
    weights = IntervalArray(2.0 * pieces - 2.0 * np.arange(pieces) - 1.0) / (J * J)                # (J,)
    ends = np.stack([dev * (m / pieces) for m in range(pieces)] + [dev])                             # (M + 1, d_ff)
    # u t for t in [ends[m], ends[m + 1]] and u in [u_j, u_(j + 1)]: within [near, far] (M, J, d_ff), rounded out
    near = (u[:-1].expand(0).expand(-1) * IntervalArray(ends[:-1]).expand(1)).lo
    far = (u[1:].expand(0).expand(-1) * IntervalArray(ends[1:]).expand(1)).hi
    steps = IntervalArray(np.stack([near, -far]), np.stack([far, -near]))                           # both sides
    ranges = gelu_curvature_range(h.expand(0).expand(0).expand(0) + steps)                           # (2, M, J, d_ff)
    total = (ranges * weights.expand(-1)).sum(axis=2)                                               # (2, M, d_ff)
    lo, hi = np.min(total.lo, axis=(0, 1)), np.max(total.hi, axis=(0, 1))
    centre, third = gelu_curvature(h), gelu_third_magnitude(h + IntervalArray(-dev, dev))
    reach = (IntervalArray(third) * IntervalArray(dev) / IntervalArray(3.0)).hi
    # both enclose every q_k(t): their intersection does (never empty but for rounding, then the hull stands)
    lo, hi = np.maximum(lo, (centre - IntervalArray(reach)).lo), np.minimum(hi, (centre + IntervalArray(reach)).hi)
    return IntervalArray(np.minimum(lo, hi), np.maximum(lo, hi))


def curvature_split(h: IntervalArray, dev: np.ndarray, apart=(),
                    pieces: int = QUOTIENT_PIECES) -> tuple[IntervalArray, np.ndarray, np.ndarray]:
    """``(g, S, M)`` per neuron: ``g`` (point intervals) the midpoints of :func:`quotient_range` and ``S`` (floats)
    its half-widths about them, rounded up, so that ``|phi_k(t) - g_k t^2 / 2| <= S_k t^2 / 2`` on ``|t| <= dev_k``
    (lemma feedforward-taylor-signed), and ``M >= |q_k(t)|`` there (lemma feedforward-taylor-joint's ``S_k``).  The
    neurons ``apart`` (bounded by themselves, lemma feedforward-taylor-separated) have all three 0."""
    found = quotient_range(h, dev, pieces)
    g = np.array(found.mid, dtype=np.float64)
    centre = IntervalArray(g)
    spread = np.maximum((IntervalArray(found.hi) - centre).hi, (centre - IntervalArray(found.lo)).hi)
    magnitude = np.array(found.magnitude, dtype=np.float64)
    apart = np.asarray(apart, dtype=np.int64)
    g[apart], spread[apart], magnitude[apart] = 0.0, 0.0, 0.0
    return IntervalArray(g), spread, magnitude
