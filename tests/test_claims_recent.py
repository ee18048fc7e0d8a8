"""Claims of 2024-2026: the theorems lipbound proves about them, checked by independent routes; each
checker's verdict; each checker refuting a deliberately wrong variant; the CLI's exit statuses."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.cli import main
from lipbound.numeric.claim_checks import _sigmoid_bound, proximal_solver_slope
from lipbound.numeric.claims import CHECKERS, check
from lipbound.numeric.model import Head, load_default
from lipbound.numeric.sigmoid import (
    certified_ratio,
    sigmoid_forward,
    sigmoid_jvp,
    sigmoid_vjp,
    sigmoid_witness,
)
from lipbound.numeric.softmax_jacobian import (
    balanced_mass,
    column_sum_norm,
    equal_split,
    inf_to_one_norm,
    softmax_enclosure,
)
from lipbound.rigorous.compiler import compile_interval
from lipbound.rigorous.intervals import lower, upper
from lipbound.symbolic import symbols as S
from lipbound.symbolic.claim_table import REPORTED, claim_report, scalar_instance_numbers
from lipbound.symbolic.claim_theorems import (
    bias_free_forms,
    bound_regions,
    explicit_step_slope,
    prox_slope,
    proximal_map,
    reduced_score,
    score_ratio,
    sigmoid_scalar_instance,
    softmax_inf_to_one,
)
from lipbound.symbolic.claims import CLAIMS, p_max, tau, theta
from lipbound.symbolic.lemmas import LEMMAS
from lipbound.symbolic.product_bounds import compose_constants, constrained_layer, uniform_budget


# An independent softmax and Jacobian, written here ----------------------------------------------
def softmax(u: np.ndarray) -> np.ndarray:
    e = np.exp(u - u.max())
    return e / e.sum()


def vertex_norm(J: np.ndarray) -> float:
    """max over the cube's vertices of ||J x||_1, by brute force in floats."""
    return max(float(np.abs(J @ np.array(x)).sum()) for x in itertools.product((1.0, -1.0), repeat=J.shape[1]))


weights = st.lists(st.integers(1, 40), min_size=1, max_size=9)


# emadi-softmax-inf1 ------------------------------------------------------------------------------
@given(weights)
@settings(max_examples=150, deadline=None)
def test_theta_is_the_operator_norm_exactly(integers):
    """theta(p) = 1 - min_s (p.s)^2 equals max over the cube's vertices of ||J x||_1, in rationals,
    with the theorem's consequences checked by routes that do not use theta."""
    p = [Fraction(w, sum(integers)) for w in integers]
    mass = balanced_mass(p)
    assert inf_to_one_norm(p) == mass
    assert 1 - max(p) ** 2 <= mass <= 1
    assert (mass == 1) == equal_split(p)
    assert column_sum_norm(p) <= mass
    J = np.diag([float(v) for v in p]) - np.outer([float(v) for v in p], [float(v) for v in p])
    assert np.linalg.norm(J, 2) <= float(mass) + 1e-12          # the l_2 -> l_2 norm (at most 1/2) is below theta
    np.testing.assert_allclose(vertex_norm(J), float(mass), rtol=1e-12)


@given(st.lists(st.floats(-4, 4), min_size=2, max_size=7), st.sampled_from([0.5, 1.0, 3.0]))
@settings(max_examples=60, deadline=None)
def test_theta_over_tau_is_the_derivative_in_the_logits(logits, temperature):
    """Finite differences of softmax(u / tau) along the best vertex reach theta/tau; random points of the
    cube never exceed it; the enclosures from the logits contain the float values."""
    u = np.array(logits)
    p = softmax(u / temperature)
    enclosed = softmax_enclosure(u, temperature)
    value = balanced_mass(enclosed) / temperature
    J = (np.diag(p) - np.outer(p, p)) / temperature
    best = max(itertools.product((1.0, -1.0), repeat=len(u)), key=lambda x: np.abs(J @ np.array(x)).sum())
    h = 1e-6
    difference = (softmax((u + h * np.array(best)) / temperature)
                  - softmax((u - h * np.array(best)) / temperature)) / (2 * h)
    np.testing.assert_allclose(np.abs(difference).sum(), float(value.mid), rtol=1e-5, atol=1e-9)
    rng = np.random.default_rng(0)
    for x in rng.uniform(-1, 1, (200, len(u))):
        assert np.abs(J @ x).sum() <= upper(value) + 1e-12
    assert lower(inf_to_one_norm(enclosed)) <= float(np.abs(J @ np.array(best)).sum()) * temperature + 1e-12


def test_softmax_claim_is_confirmed_and_the_theorem_cites_known_lemmas():
    result = check("emadi-softmax-inf1", budget=2)
    print(result.describe())
    assert result.verdict == "confirmed"
    assert "NP-complete" in result.notes and "softmax-half" in result.notes
    for theorem in (softmax_inf_to_one(), proximal_map(), sigmoid_scalar_instance()):
        assert set(theorem.proof.lemmas) <= set(LEMMAS)


@pytest.mark.parametrize("wrong", [theta / (2 * tau), 1 / tau, (1 - p_max ** 2) / tau, theta])
def test_the_softmax_checker_refutes_wrong_readings(wrong):
    """theta/(2 tau), the constant 1/tau, 1 - p_max^2 and a missing temperature are each refuted."""
    item = dataclasses.replace(CLAIMS["emadi-softmax-inf1"], key="emadi-wrong", statement=wrong)
    result = CHECKERS["emadi-softmax-inf1"](item, 0, 2.0, None)
    print(result.describe())
    assert result.verdict == "REFUTED"
    assert result.witness["claimed value"] != result.witness["operator norm (cube vertices, exact)"]


# sigmoid-regularity ---------------------------------------------------------------------------------
def _random_head(rng, d, d_k, biases: bool) -> Head:
    scale = rng.uniform(0.3, 2.0)
    bias = (lambda size: rng.standard_normal(size)) if biases else (lambda size: None)
    return Head(scale * rng.standard_normal((d, d_k)), scale * rng.standard_normal((d, d_k)),
                rng.standard_normal((d, d_k)), bias(d_k), bias(d_k), bias(d_k))


@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 3), st.booleans(), st.integers(0, 10 ** 6))
@settings(max_examples=40, deadline=None)
def test_sigmoid_derivatives_against_finite_differences(n, d, d_k, biases, seed):
    rng = np.random.default_rng(seed)
    head = _random_head(rng, d, d_k, biases)
    X, E, G = rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.standard_normal((n, d_k))
    h = 1e-6
    difference = (sigmoid_forward(head, X + h * E) - sigmoid_forward(head, X - h * E)) / (2 * h)
    np.testing.assert_allclose(sigmoid_jvp(head, X, E), difference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.sum(G * sigmoid_jvp(head, X, E)), np.sum(sigmoid_vjp(head, X, G) * E),
                               rtol=1e-9, atol=1e-9)
    low, high = certified_ratio(head, X, E)
    ratio = np.linalg.norm(sigmoid_jvp(head, X, E)) / np.linalg.norm(E)
    assert low <= ratio * (1 + 1e-12) and ratio <= high * (1 + 1e-12)


@given(st.integers(1, 5), st.integers(1, 4), st.booleans(), st.floats(0.05, 3.0), st.integers(0, 10 ** 6))
@settings(max_examples=25, deadline=None)
def test_sigmoid_witnesses_never_beat_the_sigmoid_theorem(n, d, biases, radius, seed):
    """Soundness of lipbound's sigmoid theorem by an independent route: the certified ratio at the
    searched input stays below the bound evaluated on the same weights and ball."""
    rng = np.random.default_rng(seed)
    head = _random_head(rng, d, 2, biases)
    value, X, E = sigmoid_witness(head, radius, n, steps=8, starts=2, seed=seed)
    assert np.all(np.linalg.norm(X, axis=1) <= radius * (1 + 1e-12))
    assert certified_ratio(head, X, E)[0] <= _sigmoid_bound(head, radius, n)


@pytest.mark.parametrize("n, radius", [(2, 0.5), (16, 1.75), (64, 2.0)])
def test_scalar_instance_closed_form_against_the_jacobian(n, radius):
    """n (sigma + 2 sigma' R^2) is the norm of the dense Jacobian built by finite differences here."""
    head = Head(np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)))
    X = np.full((n, 1), radius)
    h = 1e-6
    columns = [(sigmoid_forward(head, X + h * np.eye(n)[:, [k]]) - sigmoid_forward(head, X - h * np.eye(n)[:, [k]]))
               .ravel() / (2 * h) for k in range(n)]
    dense = np.linalg.norm(np.array(columns).T, 2)
    closed = compile_interval(sigmoid_scalar_instance().statement, [S.n, S.R])(n, radius)
    np.testing.assert_allclose(dense, float(closed.mid), rtol=1e-6)
    low, _ = certified_ratio(head, X, np.ones((n, 1)))
    assert lower(closed) - 1e-9 <= low <= upper(closed) + 1e-9


def test_bias_free_forms_are_the_hand_forms_and_their_limits():
    sigmoid, softmax_bound = bias_free_forms()
    for n, x, c in [(1, 0.3, 1), (8, 0.51, 1), (64, 2.0, 1.4), (1024, 0.03, 1)]:
        w = n / (1 + n * math.exp(-c * x))
        k = n / (1 + (n - 1) * math.exp(-2 * x))
        at = {S.n: n, reduced_score: x, score_ratio: c}
        np.testing.assert_allclose(float(sigmoid.subs(at)), w + 2 * x * min(n / 4, w), rtol=1e-12)
        np.testing.assert_allclose(float(softmax_bound.subs(at)), math.sqrt(k) + x * (1 + math.sqrt(min(3 * n / 4, k))),
                                   rtol=1e-12)
    value = lambda expr, n, x: float(expr.subs({S.n: n, reduced_score: x, score_ratio: 1}))  # noqa: E731
    np.testing.assert_allclose(value(sigmoid, 5, 1e-9), 5 / 6, rtol=1e-6)               # x -> 0
    np.testing.assert_allclose(value(softmax_bound, 5, 1e-9), 1, rtol=1e-6)
    x = 0.7                                                                               # n -> infinity
    np.testing.assert_allclose(value(sigmoid, 10 ** 12, x), math.exp(x) * (1 + 2 * x), rtol=1e-6)
    np.testing.assert_allclose(value(softmax_bound, 10 ** 12, x), math.exp(x) + x * (1 + math.exp(x)), rtol=1e-6)
    for n in (6, 7):                                                                      # x -> infinity
        ratio = value(sigmoid, n, 1e4) / value(softmax_bound, n, 1e4)
        np.testing.assert_allclose(ratio, (n / 2) / (1 + math.sqrt(3 * n) / 2), rtol=1e-3)
        assert (ratio < 1) == (n <= 6)


#: the tests that compute the regions of n = 8 run in one test process, where bound_regions keeps them
SIGMOID_REGIONS = pytest.mark.xdist_group("sigmoid-bound-regions")


@SIGMOID_REGIONS
def test_bound_regions_agree_with_the_hand_forms():
    pieces = bound_regions(8)
    assert [relation for _, _, relation in pieces] == ["sigmoid < softmax", "undecided", "sigmoid > softmax"]
    crossing = pieces[1][0]
    np.testing.assert_allclose(crossing, 0.5108, rtol=1e-3)
    w = lambda x: 8 / (1 + 8 * math.exp(-x))  # noqa: E731
    def gap(x):
        return (math.sqrt(8 / (1 + 7 * math.exp(-2 * x))) + x * (1 + math.sqrt(min(6, 8 / (1 + 7 * math.exp(-2 * x)))))
                         - w(x) - 2 * x * min(2, w(x)))  # noqa: E731
    assert gap(crossing * 0.99) > 0 > gap(crossing * 1.01)


def test_sigmoid_check_decides_both_ways_on_certified_instances(tmp_path, capsys):
    """The scalar instance refutes the pointwise reading (exit status 3); bias-free heads at a small
    radius confirm it: the comparison can refute either direction."""
    assert main(["check", "sigmoid-regularity", "--budget", "1", "--json", str(tmp_path / "check.json")]) == 3
    print(capsys.readouterr().out)
    result = json.loads((tmp_path / "check.json").read_text())
    assert result["verdict"] == "REFUTED" and "as read" in result["notes"]
    lines = list(result["witness"].values())
    assert "sigmoid less regular (certified)" in lines[0]                    # the scalar instance
    assert any("more regular (certified)" in line for line in lines)
    witness, bound, refuted = scalar_instance_numbers()
    assert refuted and lower(witness) > 33 and upper(bound) < 18


def test_a_minilm_head_with_biases_is_less_regular_under_sigmoid_weights():
    """Layer 0, head 2 of all-MiniLM-L6-v2 at R = 0.1, n = 8: the sigmoid witness beats the softmax bound."""
    from lipbound.numeric.certify import head_bounds
    from lipbound.numeric.domains import TokenBall
    head = load_default(layers=0).layers[0].heads[2]
    value, X, E = sigmoid_witness(head, 0.1, 8, seed=0)
    softmax_bound = min(b.value for b in head_bounds(head, TokenBall(0.1), 8) if b.certified)
    print(f"sigmoid witness {certified_ratio(head, X, E)[0]:.4g} vs softmax bound {softmax_bound:.4g}")
    assert certified_ratio(head, X, E)[0] > softmax_bound


# newhouse-* -------------------------------------------------------------------------------------------
def test_composition_of_stated_constants_is_exact_and_decided():
    composition = compose_constants(["1.1", "1.2", "1.25"])
    assert lower(composition.value) <= 1.65 <= upper(composition.value)
    residual = compose_constants(["0.5", "1"], residual=True, layers=3, weight="0.1")
    expected = float((Fraction(21, 20) * Fraction(11, 10)) ** 3)
    assert lower(residual.value) <= expected <= upper(residual.value)
    assert residual.blocks == 6
    assert [composition.against(total).name for total in ("1.66", "1.65", "1.64")] == ["HOLDS", "UNKNOWN", "FAILS"]


@pytest.mark.parametrize("total, blocks", [("2", 24), ("1e264", 24), ("10", 7)])
def test_uniform_budgets(total, blocks):
    plain, branch = uniform_budget(total, blocks), uniform_budget(total, blocks, residual=True)
    assert lower(plain) ** blocks <= float(total) * (1 + 1e-12) and upper(plain) ** blocks >= float(total) * (1 - 1e-12)
    np.testing.assert_allclose(upper(branch), upper(plain) - 1, rtol=1e-12)


def test_constrained_layer_against_a_hand_computation():
    n, heads, a = 256, 4, 1 / 64
    layer = constrained_layer(heads=heads, n=n, score_norm=Fraction(1, 64))
    k = n / (1 + (n - 1) * math.exp(-2 * a))
    head = math.sqrt(k) + a * (1 + math.sqrt(min(3 * n / 4, k)))
    np.testing.assert_allclose(float(layer.attention.mid), math.sqrt(heads) * head, rtol=1e-12)
    np.testing.assert_allclose(float(layer.layer.mid), (1 + math.sqrt(heads) * head) * 2, rtol=1e-12)


def test_product_checker_verdicts_and_refutation():
    assert check("newhouse-2-lipschitz").verdict == "not refuted"
    assert "1e+11" in str(check("newhouse-nanogpt").witness["24 blocks"])
    base = CLAIMS["newhouse-2-lipschitz"]
    wrong = dataclasses.replace(base, key="product-wrong", blocks=(sp.Rational(3, 2), sp.Rational(3, 2)))
    assert CHECKERS["newhouse-2-lipschitz"](wrong, 0, 1.0, None).verdict == "REFUTED"
    right = dataclasses.replace(base, key="product-right", blocks=(sp.Rational(6, 5), sp.Rational(3, 2)))
    assert CHECKERS["newhouse-2-lipschitz"](right, 0, 1.0, None).verdict == "confirmed"


# lipattn-1-lipschitz --------------------------------------------------------------------------------
def _lse_gradient(y, q, temperature):
    return q * softmax(q * y / temperature)


def _solver(x, q, temperature, eta, steps):
    y = x.copy()
    for _ in range(steps):
        y = y - eta * (y + _lse_gradient(y, q, temperature) - x)
    return y


def test_solver_slope_against_simulating_the_solver():
    """The exact recursion of the K-step solver at 0 against finite differences of the simulated map."""
    q, temperature, h = 10.0, 1.0, 1e-9
    direction = np.array([1.0, -1.0]) / math.sqrt(2)
    for eta, steps in [(1.0, 1), (1.0, 3), (1 / 26, 3), (1 / 26, 30)]:
        slope = proximal_solver_slope(Fraction(int(q * q), 2), Fraction(eta).limit_denominator(100), steps)
        moved = (_solver(h * direction, q, temperature, eta, steps) - _solver(-h * direction, q, temperature, eta,
                                                                               steps)) / (2 * h)
        np.testing.assert_allclose(moved @ direction, float(slope), rtol=1e-5)
    np.testing.assert_allclose(float(explicit_step_slope(sp.Integer(10), sp.Integer(1))), 1 - 50)


@given(st.lists(st.floats(-3, 3), min_size=2, max_size=6), st.floats(0.5, 30), st.floats(0.2, 3))
@settings(max_examples=40, deadline=None)
def test_the_exact_prox_is_one_lipschitz_whatever_the_weight(x, q, temperature):
    """Newton's method on y + grad phi(y) = x, then the Jacobian (I + hess phi)^{-1}: its norm is at most 1,
    with the translation direction attaining 1."""
    x = np.array(x)
    y = x.copy()
    for _ in range(100):
        p = softmax(q * y / temperature)
        hessian = (q * q / temperature) * (np.diag(p) - np.outer(p, p))
        y = y - np.linalg.solve(np.eye(len(x)) + hessian, y + q * p - x)
    p = softmax(q * y / temperature)
    jacobian = np.linalg.inv(np.eye(len(x)) + (q * q / temperature) * (np.diag(p) - np.outer(p, p)))
    assert np.linalg.norm(jacobian, 2) <= 1 + 1e-9
    np.testing.assert_allclose(jacobian @ np.ones(len(x)), np.ones(len(x)), atol=1e-9)
    if len(x) == 2 and np.allclose(x, 0):
        np.testing.assert_allclose(np.linalg.eigvalsh(jacobian)[0], float(prox_slope(q, temperature)), rtol=1e-9)


def test_proximal_claim_is_confirmed_and_a_smaller_constant_is_refuted():
    result = check("lipattn-1-lipschitz")
    print(result.describe())
    assert result.verdict == "confirmed" and "not in the abstract" in result.notes
    wrong = dataclasses.replace(CLAIMS["lipattn-1-lipschitz"], key="lipattn-wrong", statement=sp.Rational(1, 2))
    assert CHECKERS["lipattn-1-lipschitz"](wrong, 0, 1.0, None).verdict == "REFUTED"


# reports and the command line ------------------------------------------------------------------------
def test_every_recent_claim_has_a_report_and_a_checker():
    assert set(REPORTED) <= set(CHECKERS)
    for key in REPORTED:
        if key != "sigmoid-regularity":  # its report bisects bound regions (seconds); the CLI test runs it
            lines, _ = claim_report(key)
            assert lines[0].startswith(key) and CLAIMS[key].tag in lines[0]


def test_cli_compare_product_bound_exit_statuses(capsys):
    assert main(["compare", "product-bound", "--blocks", "1.5,1.5,2", "--claimed", "4"]) == 3
    assert "REFUTED" in capsys.readouterr().out
    assert main(["compare", "product-bound", "--blocks", "1.5,1.5,2", "--claimed", "4.5"]) == 0
    assert "consistent" in capsys.readouterr().out
    assert main(["compare", "newhouse-2-lipschitz", "--blocks", "0.01", "--residual", "--layers", "24"]) == 0
    assert main(["compare", "newhouse-2-lipschitz", "--blocks", "0.05", "--residual", "--layers", "24"]) == 3


@pytest.mark.parametrize("arguments, fragment", [
    (["compare", "product-bound"], "--blocks"),
    (["compare", "castin-theorem", "--blocks", "1"], "--blocks"),
    (["compare", "newhouse-2-lipschitz", "--claimed", "3"], "--claimed"),
    (["compare", "emadi-softmax-inf1", "--residual"], "--residual"),
])
def test_cli_compare_refuses_options_that_mean_nothing(arguments, fragment, capsys):
    assert main(arguments) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and fragment in error[0] and "Traceback" not in error[0]


@pytest.mark.parametrize("arguments, status", [
    (["check", "emadi-softmax-inf1", "--budget", "1"], 0),
    (["check", "lipattn-1-lipschitz"], 0),
    (["check", "newhouse-nanogpt"], 0),
    pytest.param(["compare", "sigmoid-regularity"], 3, marks=SIGMOID_REGIONS),
])
def test_cli_check_and_compare_exit_statuses(arguments, status, capsys):
    assert main(arguments) == status
    assert "[abstract]" in capsys.readouterr().out
