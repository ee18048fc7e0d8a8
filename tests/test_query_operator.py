"""The change of output token i's row of the second derivative over a Frobenius ball (lemma curvature-row-change):
``query_changes`` bounds ``||D^2A(Y)[e, f]_i - D^2A(X)[e, f]_i||`` (the tests' own closed form of both, at points of
the ball) along an alternating ascent over unit e, f."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_local_curvature import _frobenius_case, _frobenius_points, _second

from lipbound.local.query_operator import query_changes


def _largest_change(target, X, Y, i, rng, restarts=3, steps=25):
    """Alternating ascent on ``||D^2A(Y)[e, f]_i - D^2A(X)[e, f]_i||`` over unit e, f (the difference is symmetric
    in e and f, so the supremum over e, f is reached with the alternation's fixed points)."""
    n, d = X.shape
    basis = np.eye(n * d).reshape(-1, n, d)

    def moved(e, f):
        return _second(target, Y, e, f) - _second(target, X, e, f)
    best = 0.0
    for _ in range(restarts):
        e, f = (rng.standard_normal((n, d)) for _ in range(2))
        e, f = e / np.linalg.norm(e), f / np.linalg.norm(f)
        for _ in range(steps):
            w = moved(e, f)[i]
            w = w / max(np.linalg.norm(w), 1e-300)
            e = (moved(basis, f)[:, i] @ w).reshape(n, d)
            e /= max(np.linalg.norm(e), 1e-300)
            e, f = f, e
        best = max(best, float(np.linalg.norm(moved(e, f)[i])))
    return best


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4), scale=st.sampled_from([0.5, 1.5, 3.0]),
       eps=st.sampled_from([0.01, 0.05, 0.3]))
def test_each_rows_change_is_bounded_on_the_ball(seed, n, scale, eps):
    rng, target, X, curvature, balls, facts, _ = _frobenius_case(seed, "layer", n, scale, eps)
    kappa = query_changes(curvature, SimpleNamespace(facts=facts), balls.radii, eps)
    assert kappa.shape == (n,) and np.all(np.isfinite(kappa)) and np.all(kappa >= 0)
    for Y in _frobenius_points(rng, X, eps, n + 1):
        for i in range(n):
            assert _largest_change(target, X, Y, i, rng) <= kappa[i] * (1 + 1e-9)


def test_the_change_vanishes_with_the_ball():
    """At radius 0 nothing moves: every bound is 0 up to rounding (a bound that carried the groups' sizes instead of
    their changes fails here)."""
    _, _, _, curvature, balls, facts, _ = _frobenius_case(3, "layer", 3, 1.5, 1e-12)
    kappa = query_changes(curvature, SimpleNamespace(facts=facts), balls.radii, 1e-12)
    assert np.all(kappa < 1e-8)
