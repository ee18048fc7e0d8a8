"""Exact Wasserstein-1: hand-made cases, the 1-d closed form, POT's exact solver, metric properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lipbound.errors import AssumptionError
from lipbound.measures import EmpiricalMeasure, ground_cost, w1, w1_line, w1_with_plan
from lipbound.measures.wasserstein import _assignment, _transport_lp


def random_measure(rng, k, d, uniform=False, scale=1.0):
    points = scale * rng.standard_normal((k, d))
    return EmpiricalMeasure(points, None if uniform else rng.dirichlet(np.ones(k)))


def assert_is_coupling(plan, mu, nu):
    assert plan.shape == (mu.size, nu.size)
    assert np.all(plan >= 0)
    np.testing.assert_allclose(plan.sum(axis=1), mu.weights, atol=1e-8)
    np.testing.assert_allclose(plan.sum(axis=0), nu.weights, atol=1e-8)


# Hand-made cases -------------------------------------------------------------------------
def test_two_diracs():
    x, y = np.array([[1.0, 2.0, 2.0]]), np.array([[4.0, 6.0, 2.0]])
    np.testing.assert_allclose(w1(EmpiricalMeasure(x), EmpiricalMeasure(y)), 5.0, rtol=1e-15)


def test_dirac_against_a_cloud_is_the_mean_distance():
    # Only one coupling exists: W1(delta_x, nu) = sum_j b_j ||x - y_j||.
    nu = EmpiricalMeasure([[3.0, 4.0], [0.0, 1.0], [-6.0, -8.0]], [0.5, 0.25, 0.25])
    np.testing.assert_allclose(w1(EmpiricalMeasure([[0.0, 0.0]]), nu), 0.5 * 5 + 0.25 * 1 + 0.25 * 10, rtol=1e-15)


@pytest.mark.parametrize("uniform", [True, False])
def test_translation_moves_the_measure_by_the_shift(uniform):
    # W1(mu, mu + t) = ||t||: the identity coupling costs ||t||, and Jensen on the mean gives >= ||t||.
    rng = np.random.default_rng(1)
    mu = random_measure(rng, 8, 3, uniform=uniform)
    shift = np.array([0.3, -1.2, 0.4])
    nu = EmpiricalMeasure(mu.points + shift, mu.weights)
    np.testing.assert_allclose(w1(mu, nu), np.linalg.norm(shift), rtol=1e-9)


def test_two_point_swap_on_the_line():
    # mu = (delta_0 + delta_1)/2, nu = (delta_0 + delta_3)/2: move the mass at 1 to 3, W1 = 2 * 1/2 = 1.
    mu, nu = EmpiricalMeasure([0.0, 1.0]), EmpiricalMeasure([0.0, 3.0])
    np.testing.assert_allclose(w1(mu, nu), 1.0, rtol=1e-15)
    np.testing.assert_allclose(w1_line(mu, nu), 1.0, rtol=1e-15)


def test_splitting_mass():
    # mu = delta_0 on the plane, nu = 0.5 delta_(1,0) + 0.5 delta_(0,2): W1 = 0.5 + 1 = 1.5.
    value, plan = w1_with_plan(EmpiricalMeasure([[0.0, 0.0]]), EmpiricalMeasure([[1.0, 0.0], [0.0, 2.0]], [0.5, 0.5]))
    np.testing.assert_allclose(value, 1.5, rtol=1e-15)
    np.testing.assert_allclose(plan, [[0.5, 0.5]], rtol=1e-15)


def test_unequal_masses_on_the_line_by_hand():
    # F_mu - F_nu for mu = 0.2 d0 + 0.8 d1, nu = 0.6 d0 + 0.4 d2:
    # on [0,1): 0.2-0.6 = -0.4; on [1,2): 1-0.6 = 0.4; so W1 = 0.4 + 0.4 = 0.8.
    mu, nu = EmpiricalMeasure([0.0, 1.0], [0.2, 0.8]), EmpiricalMeasure([0.0, 2.0], [0.6, 0.4])
    np.testing.assert_allclose(w1_line(mu, nu), 0.8, rtol=1e-14)
    np.testing.assert_allclose(w1(mu, nu), 0.8, rtol=1e-9)


def test_assignment_plan_is_a_scaled_permutation():
    rng = np.random.default_rng(2)
    mu, nu = random_measure(rng, 6, 2, uniform=True), random_measure(rng, 6, 2, uniform=True)
    value, plan = w1_with_plan(mu, nu)
    np.testing.assert_allclose(np.sort(plan.ravel())[-6:], np.full(6, 1 / 6), rtol=0)
    assert np.count_nonzero(plan) == 6
    assert_is_coupling(plan, mu, nu)
    np.testing.assert_allclose(value, np.sum(plan * ground_cost(mu, nu)), rtol=1e-14)


# Independent routes ------------------------------------------------------------------------
@pytest.mark.parametrize("k, l", [(2, 3), (5, 5), (9, 4), (20, 31)])
def test_one_dimensional_closed_form(k, l):
    rng = np.random.default_rng(k * 100 + l)
    mu, nu = random_measure(rng, k, 1), random_measure(rng, l, 1, scale=2.0)
    np.testing.assert_allclose(w1(mu, nu), w1_line(mu, nu), rtol=1e-8)


def test_one_dimensional_closed_form_uniform_equal_size_is_sorted_matching():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(25), rng.standard_normal(25) + 0.5
    sorted_matching = np.mean(np.abs(np.sort(x) - np.sort(y)))  # monotone coupling is optimal on R
    np.testing.assert_allclose(w1_line(EmpiricalMeasure(x), EmpiricalMeasure(y)), sorted_matching, rtol=1e-13)
    np.testing.assert_allclose(w1(EmpiricalMeasure(x), EmpiricalMeasure(y)), sorted_matching, rtol=1e-13)


@pytest.mark.parametrize("k, l, d, uniform", [
    (7, 7, 3, True), (12, 12, 5, False), (6, 11, 2, False), (15, 4, 8, False), (10, 13, 3, True), (40, 40, 16, True),
])
def test_against_pot_exact_solver(k, l, d, uniform):
    import ot  # POT (about a CPU second to import): here, not in every test process's collection
    rng = np.random.default_rng(k + 10 * l + 100 * d)
    mu, nu = random_measure(rng, k, d, uniform), random_measure(rng, l, d, uniform, scale=1.5)
    value, plan = w1_with_plan(mu, nu)
    cost = ot.dist(mu.points, nu.points, metric="euclidean")
    reference = ot.emd2(mu.weights, nu.weights, cost, numItermax=10**7)
    np.testing.assert_allclose(value, reference, rtol=1e-9)
    assert_is_coupling(plan, mu, nu)
    np.testing.assert_allclose(value, np.sum(plan * ground_cost(mu, nu)), rtol=1e-12)


def test_assignment_and_transport_lp_agree():
    rng = np.random.default_rng(4)
    cost = ground_cost(random_measure(rng, 10, 3, True), random_measure(rng, 10, 3, True))
    uniform = np.full(10, 0.1)
    np.testing.assert_allclose(_assignment(cost).value, _transport_lp(cost, uniform, uniform).value, rtol=1e-9)


def test_zero_mass_points_do_not_count():
    rng = np.random.default_rng(5)
    mu, nu = random_measure(rng, 4, 2), random_measure(rng, 5, 2)
    padded = EmpiricalMeasure(np.vstack([mu.points, [[100.0, 100.0]]]), np.append(mu.weights, 0.0))
    np.testing.assert_allclose(w1(padded, nu), w1(mu, nu), rtol=1e-9)


# Metric properties ---------------------------------------------------------------------------
def measures(max_points=6, d=2):
    coordinates = st.floats(-10, 10, allow_nan=False, allow_infinity=False)

    @st.composite
    def build(draw):
        k = draw(st.integers(1, max_points))
        points = draw(hnp.arrays(np.float64, (k, d), elements=coordinates))
        raw = draw(hnp.arrays(np.float64, (k,), elements=st.floats(0.05, 1.0)))
        return EmpiricalMeasure(points, raw / raw.sum())
    return build()


@settings(max_examples=40, deadline=None)
@given(mu=measures(), nu=measures())
def test_symmetry_and_nonnegativity(mu, nu):
    forward, backward = w1(mu, nu), w1(nu, mu)
    assert forward >= 0
    np.testing.assert_allclose(forward, backward, rtol=1e-7, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(mu=measures(), nu=measures(), rho=measures())
def test_triangle_inequality(mu, nu, rho):
    slack = 1e-7 * (1 + w1(mu, rho) + w1(rho, nu))  # the LP's feasibility tolerance, scaled
    assert w1(mu, nu) <= w1(mu, rho) + w1(rho, nu) + slack


@settings(max_examples=40, deadline=None)
@given(mu=measures(), displacement=hnp.arrays(np.float64, (6, 2), elements=st.floats(-3, 3)))
def test_bounded_by_any_coupling_and_by_the_mean_shift(mu, displacement):
    # Moving each point x_i to x_i + delta_i is a coupling of mu and its image, so
    # ||mean shift|| <= W1 <= sum_i w_i ||delta_i|| <= max_i ||delta_i||.
    delta = displacement[: mu.size]
    nu = EmpiricalMeasure(mu.points + delta, mu.weights)
    distance = w1(mu, nu)
    lengths = np.linalg.norm(delta, axis=1)
    assert distance <= np.dot(mu.weights, lengths) + 1e-9
    assert distance <= lengths.max() + 1e-9
    assert np.linalg.norm(nu.mean() - mu.mean()) <= distance + 1e-9


@settings(max_examples=25, deadline=None)
@given(mu=measures(d=1), nu=measures(d=1))
def test_line_closed_form_agrees_with_the_lp(mu, nu):
    np.testing.assert_allclose(w1(mu, nu), w1_line(mu, nu), rtol=1e-7, atol=1e-9)


# Errors -------------------------------------------------------------------------------------
def test_dimension_mismatch_and_non_measures():
    with pytest.raises(AssumptionError) as info:
        w1(EmpiricalMeasure(np.zeros((2, 2))), EmpiricalMeasure(np.zeros((2, 3))))
    assert info.value.argument == "nu"
    with pytest.raises(AssumptionError) as info:
        w1(np.zeros((2, 2)), EmpiricalMeasure(np.zeros((2, 2))))
    assert info.value.argument == "mu"
    with pytest.raises(AssumptionError) as info:
        w1_line(EmpiricalMeasure(np.zeros((2, 2))), EmpiricalMeasure(np.zeros((2, 2))))
    assert "w1" in info.value.fix
