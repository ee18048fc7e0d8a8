"""The third group of the curvature bound at one query (lemmas curvature-values-spectral and curvature-per-query): the
values' and heads' spectral forms at query i's own spreads bound the third group's row i, ``c sum_(h,j) p_ij (e_i Qt_h
f_j^T + f_i Qt_h e_j^T) u_ij`` (formed here from the weights and values, not from the bound's code), at points of a
Frobenius ball and along an ascent on it, and are never above the forms at the largest spreads over the queries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_local_curvature import _frobenius_case, _frobenius_points, _second

from lipbound.local.query_curvature import _own_spectral_forms


def _largest_row(target, Y, i, rng, groups=("III",), restarts=3, steps=25):
    """Alternating ascent on ``||D^2A(Y)[e, f]_i||`` (the sum of ``groups``, the tests' own closed form) over unit e,
    f (Frobenius): for fixed f and the output's direction w, the e that ``w . D^2A[., f]_i`` reads most, then f for e
    (each group is symmetric in e and f)."""
    n, d = Y.shape
    basis = np.eye(n * d).reshape(-1, n, d)
    best = 0.0
    for _ in range(restarts):
        e, f = (rng.standard_normal((n, d)) for _ in range(2))
        e, f = e / np.linalg.norm(e), f / np.linalg.norm(f)
        for _ in range(steps):
            w = _second(target, Y, e, f, groups)[i]
            w = w / max(np.linalg.norm(w), 1e-300)
            e = (_second(target, Y, basis, f, groups)[:, i] @ w).reshape(n, d)
            e /= max(np.linalg.norm(e), 1e-300)
            e, f = f, e
        best = max(best, float(np.linalg.norm(_second(target, Y, e, f, groups)[i])))
    return best


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4), scale=st.sampled_from([0.5, 1.5, 3.0]),
       eps=st.sampled_from([0.0, 0.05, 0.3]))
def test_each_querys_spectral_forms_bound_its_third_group(seed, n, scale, eps):
    rng, target, X, curvature, balls, facts, _ = _frobenius_case(seed, "layer", n, scale, max(eps, 1e-12))
    gamma = curvature.output_spreads(facts)
    own = _own_spectral_forms(curvature, facts, balls.radii, gamma, np.arange(n))
    uniform = min(curvature._values_joined(facts, balls.radii), curvature._heads_weighted(gamma))
    assert np.all(np.isfinite(own)) and np.all(own <= uniform * (1 + 1e-12))
    bound = 2 * curvature.c * own
    for Y in [X] + _frobenius_points(rng, X, max(eps, 1e-12), 2):
        for i in range(n):
            assert _largest_row(target, Y, i, rng) <= bound[i] * (1 + 1e-9)


def _row_bounds(target, X, eps):
    """``chi_i`` of the per-query integral on the Frobenius ball of radius eps (one step of width 1), the queries' own
    groups (3, n) and the whole output's ``(chi_I, chi_II, chi_III)`` there."""
    from types import SimpleNamespace

    from lipbound.local.curvature_integral import CurvatureIntegral
    from lipbound.local.enclosed import EnclosedAttention
    integral = CurvatureIntegral(SimpleNamespace(target=target), EnclosedAttention(target, X), per_query=True)
    radii = np.full(X.shape[0], eps)
    step = (1.0, radii, {"frobenius": eps}, ("frobenius", eps))
    chi = integral.query_integral([step], 1.0)
    return chi, integral._queries[(radii.tobytes(), ("frobenius", eps))], integral.chis(*step[1:])


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4), scale=st.sampled_from([0.5, 1.5, 3.0]),
       eps=st.sampled_from([0.0, 0.05, 0.3]))
def test_each_querys_groups_met_with_the_whole_outputs_bound_its_row(seed, n, scale, eps):
    """Lemma curvature-row-whole: ``chi_i`` (each group the smaller of query i's own and the whole output's) is at
    most the queries' own sum and each whole group, and bounds row i of the whole second derivative (the tests' closed
    form) at X and points of the Frobenius ball, along alternating ascent."""
    rng, target, X, *_ = _frobenius_case(seed, "layer", n, scale, max(eps, 1e-12))
    chi, own, whole = _row_bounds(target, X, max(eps, 1e-12))
    assert np.all(chi <= own.sum(axis=0) * (1 + 1e-12)) and np.all(chi <= sum(whole) * (1 + 1e-12))
    for Y in [X] + _frobenius_points(rng, X, max(eps, 1e-12), 2):
        for i in range(n):
            assert _largest_row(target, Y, i, rng, ("I", "II", "III"), restarts=2) <= chi[i] * (1 + 1e-9)


@pytest.mark.slow
def test_minilm_first_layer_rows_read_the_whole_third_group():
    """all-MiniLM-L6-v2's first attention layer at "The cat sat on the mat.", at X: the whole output's third group
    (the Kronecker form over all queries, 2.64) is below every query's own (3.4-4.9), so each token's ``chi_i`` is
    below its own groups' sum, and still above its row of the second derivative along random directions (the ascent on
    generated layers is the test above)."""
    from lipbound.local.chains import chain_for
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat sat on the mat."))[0]
    target = chain_for(bert.model, "layer", 0)[0].target
    chi, own, whole = _row_bounds(target, X, 0.0)
    assert np.all(own[2] > whole[2]) and np.all(chi < own.sum(axis=0) - 0.5)
    rng = np.random.default_rng(0)
    e = rng.standard_normal((4,) + X.shape)
    e /= np.linalg.norm(e, axis=(1, 2), keepdims=True)
    rows = np.linalg.norm(np.array([_second(target, X, v, v) for v in e]), axis=-1)     # (directions, n)
    assert np.all(rows <= chi)

