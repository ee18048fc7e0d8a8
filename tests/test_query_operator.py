"""Each output token's row of an attention layer's second derivative as one operator (lemmas curvature-row-operator and
curvature-row-change): ``operator_tops`` is ``sup_w ||H_i(w)||_F`` for the Hessians ``H_i(w)`` of ``w . A(X)_i`` formed
here from the tests' own closed form of the second derivative (within rounding, from above), so it bounds the row;
``query_changes`` bounds ``||D^2A(Y)[e, f]_i - D^2A(X)[e, f]_i||`` at points of the ball along an alternating ascent
over unit e, f; and the per-query integral that takes the smaller of the groups and the operator route still bounds
each row on the ball."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_local_curvature import _frobenius_case, _frobenius_points, _second
from test_query_curvature import _largest_row, _row_bounds

from lipbound.local.enclosed import EnclosedAttention
from lipbound.local.query_operator import operator_tops, query_changes


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


def _matricized(target, X, i):
    """Row i's second derivative at X matricized: (n d n d, d_out), ``w`` against it the Hessian ``H_i(w)`` (the
    tests' closed form on the whole basis)."""
    n, d = X.shape
    basis = np.eye(n * d).reshape(-1, n, d)
    return np.stack([_second(target, X, basis, f)[:, i] for f in basis]).reshape((n * d) ** 2, -1)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4), scale=st.sampled_from([0.5, 1.5, 3.0]))
def test_each_rows_operator_is_its_hessians_largest_frobenius_norm(seed, n, scale):
    """``operator_tops`` against ``sup_w ||H_i(w)||_F`` (the top singular value of the matricized row, which is at
    least the row's norm): above it, and within 1e-6 of it (dropping any of ``G_i``'s terms moves it)."""
    _, target, X, *_ = _frobenius_case(seed, "layer", n, scale, 1e-12)
    tops = operator_tops(EnclosedAttention(target, X), target)
    for i in range(n):
        exact = np.linalg.norm(_matricized(target, X, i), 2)
        assert exact <= tops[i] * (1 + 1e-9) + 1e-12 and tops[i] <= exact * (1 + 1e-6) + 1e-9


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4), scale=st.sampled_from([0.5, 1.5, 3.0]),
       eps=st.sampled_from([0.003, 0.05]))
def test_the_per_query_integral_with_the_operator_bounds_each_row(seed, n, scale, eps):
    """One step of the per-query integral on the Frobenius ball (``chi_i``, now the smaller of the groups and
    ``lambda_max(G_i(X))^(1/2) + kappa_i``) bounds row i of the second derivative at points of the ball along an
    ascent, and is never above the groups alone."""
    rng, target, X, *_ = _frobenius_case(seed, "layer", n, scale, eps)
    chi, own, whole = _row_bounds(target, X, eps)
    assert np.all(chi <= own.sum(axis=0) * (1 + 1e-12))
    for Y in _frobenius_points(rng, X, eps, 2):
        for i in range(n):
            assert _largest_row(target, Y, i, rng, ("I", "II", "III"), restarts=2) <= chi[i] * (1 + 1e-9)


def test_a_layer_without_the_operator_keeps_the_groups():
    """Where ``operator_tops`` is not formed (inf: rotations, masks) the per-query integral is the groups' own, finite
    (an inf route must not reach the minimum as a NaN)."""
    from unittest import mock

    from lipbound.local.curvature_integral import CurvatureIntegral
    _, target, X, *_ = _frobenius_case(5, "layer", 3, 1.5, 0.05)
    with mock.patch.object(CurvatureIntegral, "operator_tops", lambda integral: np.full(3, np.inf)):
        groups, own, whole = _row_bounds(target, X, 0.05)
    chi, *_ = _row_bounds(target, X, 0.05)
    assert np.all(np.isfinite(groups)) and np.all(chi <= groups)
