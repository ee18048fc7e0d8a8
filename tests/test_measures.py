"""Attention on empirical measures (Vuckovic, Baratin, Tachet des Combes 2020).

Independent routes: the measure form (kernel weighted by masses) against token-level
attention in lipbound.numeric.attention, and repeated points against masses.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError, WeightsError
from lipbound.measures import (
    EmpiricalMeasure,
    attention_map,
    cross_attention_measure,
    layer_map,
    self_attention_layer_measure,
    self_attention_measure,
    w1,
)
from lipbound.numeric import attention
from lipbound.numeric.kernels import AttentionMask, DotProduct, L2Distance, ScaledCosine
from lipbound.numeric.model import Head, Layer

SCORES = ("dot", "l2", "cosine")
KERNELS = {"dot": DotProduct(), "l2": L2Distance(), "cosine": ScaledCosine(tau=2.0)}


def random_head(seed: int, score: str = "dot", d: int = 5, d_k: int = 3, d_v: int = 4) -> Head:
    rng = np.random.default_rng(seed)
    return Head(rng.standard_normal((d, d_k)), rng.standard_normal((d, d_k)),
                rng.standard_normal((d, d_v)), rng.standard_normal(d_k),
                rng.standard_normal(d_k), rng.standard_normal(d_v), kernel=KERNELS[score])


# EmpiricalMeasure ---------------------------------------------------------------
def test_uniform_by_default_and_read_only():
    mu = EmpiricalMeasure(np.arange(6.0).reshape(3, 2))
    np.testing.assert_allclose(mu.weights, np.full(3, 1 / 3), rtol=1e-15)
    assert mu.size == 3 and mu.dim == 2 and mu.is_uniform
    np.testing.assert_allclose(mu.mean(), [2.0, 3.0], rtol=1e-15)
    with pytest.raises(ValueError):
        mu.points[0, 0] = 1.0  # the measure cannot change behind a cached result


def test_flat_points_are_a_measure_on_the_line():
    mu = EmpiricalMeasure([0.0, 2.0, 5.0], [0.2, 0.3, 0.5])
    assert mu.points.shape == (3, 1) and not mu.is_uniform
    np.testing.assert_allclose(mu.radius(), 5.0, rtol=0)
    np.testing.assert_allclose(mu.radius(center=[2.0]), 3.0, rtol=0)


@pytest.mark.parametrize("points, weights, argument", [
    (np.zeros((0, 2)), None, "points"),
    (np.zeros((2, 2, 2)), None, "points"),
    (np.array([[0.0, np.nan]]), None, "points"),
    (np.array([[0.0, np.inf]]), None, "points"),
    (np.zeros((3, 2)), [0.5, 0.5], "weights"),
    (np.zeros((2, 2)), [1.2, -0.2], "weights"),
    (np.zeros((2, 2)), [0.5, 0.6], "weights"),
    (np.zeros((2, 2)), [0.5, np.nan], "weights"),
])
def test_invalid_measures_are_refused(points, weights, argument):
    with pytest.raises(AssumptionError) as info:
        EmpiricalMeasure(points, weights)
    assert info.value.argument == argument
    assert "Fix:" in str(info.value)


def test_weights_within_rounding_are_accepted_and_renormalised():
    mu = EmpiricalMeasure(np.zeros((3, 1)), [0.1, 0.2, 0.7 + 1e-12])
    np.testing.assert_allclose(mu.weights.sum(), 1.0, rtol=1e-15)


def test_merged_adds_masses_of_repeated_points():
    points = np.array([[1.0, 0.0], [2.0, 0.0], [1.0, 0.0], [-0.0, 3.0], [0.0, 3.0]])
    merged = EmpiricalMeasure(points, [0.1, 0.2, 0.3, 0.15, 0.25]).merged()
    np.testing.assert_allclose(merged.points, [[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]], rtol=0)
    np.testing.assert_allclose(merged.weights, [0.4, 0.2, 0.4], rtol=1e-14)


# Uniform measures = token-level attention ----------------------------------------------
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("n", [1, 2, 7])
def test_self_attention_on_uniform_measure_is_token_attention(score, n):
    head = random_head(n, score)
    X = np.random.default_rng(10 + n).standard_normal((n, head.d))
    out = self_attention_measure(head, EmpiricalMeasure.uniform(X))
    np.testing.assert_allclose(out.points, attention.self_forward(head, X)[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.weights, np.full(n, 1 / n), rtol=1e-15)


@pytest.mark.parametrize("score", SCORES)
def test_cross_attention_on_uniform_measures_is_token_cross_attention(score):
    head = random_head(3, score)
    rng = np.random.default_rng(4)
    Y, X = rng.standard_normal((4, head.d)), rng.standard_normal((6, head.d))
    nu = EmpiricalMeasure(Y, [0.1, 0.2, 0.3, 0.4])  # query masses are carried, not used by the kernel
    out = cross_attention_measure(head, nu, EmpiricalMeasure.uniform(X))
    np.testing.assert_allclose(out.points, attention.cross_forward(head, Y, X)[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.weights, nu.weights, rtol=0)


@pytest.mark.parametrize("residual", [False, True])
def test_multi_head_layer_on_uniform_measure_is_layer_forward(residual):
    heads = tuple(random_head(s, "dot", d=6, d_k=2, d_v=3) for s in range(3))
    rng = np.random.default_rng(5)
    layer = Layer(heads, rng.standard_normal((9, 6)), rng.standard_normal(6), residual=residual)
    X = rng.standard_normal((5, 6))
    out = self_attention_layer_measure(layer, EmpiricalMeasure.uniform(X))
    np.testing.assert_allclose(out.points, attention.layer_forward(layer, X)[0], rtol=1e-12, atol=1e-12)


# Masses -----------------------------------------------------------------------------
@pytest.mark.parametrize("score", SCORES)
def test_duplicated_points_behave_like_mass(score):
    head = random_head(7, score)
    rng = np.random.default_rng(8)
    a, b, c = rng.standard_normal((3, head.d))
    repeated = EmpiricalMeasure.uniform(np.stack([a, b, b, c]))
    weighted = EmpiricalMeasure(np.stack([a, b, c]), [0.25, 0.5, 0.25])
    queries = rng.standard_normal((5, head.d))
    np.testing.assert_allclose(attention_map(head, repeated, queries), attention_map(head, weighted, queries),
                               rtol=1e-12, atol=1e-12)
    # As measures, the two outputs are the same: W1 = 0.
    assert w1(self_attention_measure(head, repeated), self_attention_measure(head, weighted)) <= 1e-12


@settings(max_examples=40, deadline=None)
@given(multiplicities=st.lists(st.integers(1, 4), min_size=1, max_size=5), seed=st.integers(0, 2**16))
def test_any_multiplicities_behave_like_masses(multiplicities, seed):
    head = random_head(seed % 5, ("dot", "l2", "cosine")[seed % 3])
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((len(multiplicities), head.d))
    repeated = EmpiricalMeasure.uniform(np.repeat(points, multiplicities, axis=0))
    masses = np.array(multiplicities, dtype=float) / sum(multiplicities)
    weighted = EmpiricalMeasure(points, masses)
    queries = rng.standard_normal((3, head.d))
    np.testing.assert_allclose(attention_map(head, repeated, queries), attention_map(head, weighted, queries),
                               rtol=1e-10, atol=1e-10)


def test_zero_mass_points_are_absent():
    head = random_head(1)
    rng = np.random.default_rng(2)
    X = rng.standard_normal((3, head.d))
    far = 1e3 * rng.standard_normal((1, head.d))  # a point that would dominate the softmax if present
    with_ghost = EmpiricalMeasure(np.vstack([X, far]), [0.5, 0.25, 0.25, 0.0])
    without = EmpiricalMeasure(X, [0.5, 0.25, 0.25])
    queries = rng.standard_normal((4, head.d))
    np.testing.assert_allclose(attention_map(head, with_ghost, queries), attention_map(head, without, queries),
                               rtol=1e-12, atol=1e-12)


def test_permuting_the_support_does_not_change_the_output_measure():
    head = random_head(9, "l2")
    rng = np.random.default_rng(9)
    X, weights = rng.standard_normal((6, head.d)), rng.dirichlet(np.ones(6))
    order = rng.permutation(6)
    out = self_attention_measure(head, EmpiricalMeasure(X, weights))
    permuted = self_attention_measure(head, EmpiricalMeasure(X[order], weights[order]))
    assert w1(out, permuted) <= 1e-12


def test_dirac_context_returns_its_value():
    head = random_head(11)
    y = np.random.default_rng(11).standard_normal(head.d)
    queries = np.random.default_rng(12).standard_normal((3, head.d))
    expected = np.tile(y @ head.W_V + head.b_V, (3, 1))
    np.testing.assert_allclose(attention_map(head, EmpiricalMeasure(y[None]), queries), expected, rtol=1e-13)


def test_output_points_lie_in_the_convex_hull_of_the_values():
    head = random_head(13)
    rng = np.random.default_rng(13)
    mu = EmpiricalMeasure(3 * rng.standard_normal((5, head.d)), rng.dirichlet(np.ones(5)))
    values = mu.points @ head.W_V + head.b_V
    out = self_attention_measure(head, mu).points
    # Each output is a convex combination: it cannot leave the bounding box of the values.
    assert np.all(out <= values.max(axis=0) + 1e-12) and np.all(out >= values.min(axis=0) - 1e-12)


# Errors ---------------------------------------------------------------------------------
def test_causal_heads_are_refused_on_measures():
    head = Head(np.eye(2), np.eye(2), np.eye(2), mask=AttentionMask(causal=True))
    with pytest.raises(AssumptionError) as info:
        self_attention_measure(head, EmpiricalMeasure(np.zeros((2, 2))))
    assert info.value.argument == "head"


def test_dimension_mismatch_names_the_measure():
    head = random_head(0)
    with pytest.raises(WeightsError) as info:
        cross_attention_measure(head, EmpiricalMeasure(np.zeros((2, head.d + 1))),
                                EmpiricalMeasure(np.zeros((2, head.d))))
    assert info.value.argument == "nu_queries"
    with pytest.raises(WeightsError) as info:
        attention_map(head, EmpiricalMeasure(np.zeros((2, head.d))), np.zeros((3, head.d - 1)))
    assert info.value.argument == "x"


def test_plain_arrays_are_not_measures():
    head = random_head(0)
    with pytest.raises(AssumptionError) as info:
        self_attention_measure(head, np.zeros((2, head.d)))
    assert info.value.argument == "mu"
    with pytest.raises(WeightsError):
        layer_map("not a layer", EmpiricalMeasure(np.zeros((2, head.d))), np.zeros((1, head.d)))


def test_measure_witness_is_exact_and_below_the_certified_w1_constant():
    """Witness search on measures for a real head: exact W1 on both sides, below the constant."""
    from lipbound.measures.wasserstein import w1 as exact_w1
    from lipbound.measures.witness import measure_witness
    from lipbound.numeric.certify import head_constant
    from lipbound.numeric.domains import TokenBall
    from lipbound.numeric.model import load_default
    layer = load_default(layers=5).layers[5]
    domain = TokenBall(layer.ln_in.radius_about_origin)
    head = layer.heads[2]
    witness = measure_witness(head, domain=domain, n=6, budget_seconds=2.0)
    assert witness.mu.size == witness.nu.size == 6 and witness.mu.is_uniform
    assert np.all(np.linalg.norm(witness.nu.points, axis=1) <= domain.radius)
    np.testing.assert_allclose(exact_w1(witness.mu, witness.nu), witness.w1_in, rtol=1e-12)
    constant = head_constant(head, "w1", domain, 6).value
    print(f"measure witness {witness.ratio:.4g} <= certified W1 constant {constant:.4g}")
    assert 1.0 < witness.ratio <= constant
