"""Gated feed-forward blocks (SwiGLU, GeGLU) on bounded domains: closed form, lifted SDP, witnesses.

The unit, its activations and its Jacobian are written again here (complex-step derivatives of a
forward pass with ``scipy.special.erf`` and ``numpy``, not the package's maps); every certified constant
is checked against that Jacobian at random points of the domain and at the witnesses, over
hypothesis-generated shapes, activations, biases, radii and domains (balls about 0 and about a point,
RMSNorm images), and the lifted Gram matrix against the lifted map written as a matrix.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf

from lipbound.errors import AssumptionError, WeightsError
from lipbound.numeric.blocks.constants import pre_norm_gated_constants, residual_constant
from lipbound.numeric.blocks.gated import closed_form, ellipsoid_of, gated_constants, jacobian
from lipbound.numeric.blocks.norms import local_constants, norm_constant, norm_jacobian
from lipbound.numeric.domains import AllTokens, TokenBall
from lipbound.numeric.model.components import GatedFeedForward
from lipbound.numeric.normalization import RMSNorm
from lipbound.numeric.sdp.gated import certify_lift, gated_sdp, lifted_unit
from lipbound.numeric.witness.blocks import gated_witness, norm_witness, recheck_block

ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh")
SOUNDNESS = settings(max_examples=25, deadline=None)


def phi(name: str, t):
    """The activations written out, for real or complex arguments."""
    if name == "silu":
        return t / (1 + np.exp(-t))
    if name == "gelu":
        return 0.5 * t * (1 + erf(t / math.sqrt(2)))
    return 0.5 * t * (1 + np.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3)))


def unit(ffn: GatedFeedForward, x):
    """``(phi(x W_g + b_g) * (x W_u + b_u)) W_d + b_d`` for one token (real or complex)."""
    return (phi(ffn.act, x @ ffn.W_gate + ffn.b_gate) * (x @ ffn.W_up + ffn.b_up)) @ ffn.W_down + ffn.b_down


def independent_jacobian(f, x, h=1e-30) -> np.ndarray:
    """Complex-step derivative of ``f`` at x: exact to rounding, no cancellation."""
    return np.column_stack([np.imag(f(x + 1j * h * e)) / h for e in np.eye(x.size)])


def sample(ellipsoid, rng, count: int) -> np.ndarray:
    """Points of the ellipsoid: a quarter inside, the rest within 1e-6 of its boundary."""
    W = rng.standard_normal((count, ellipsoid.d))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    W *= float(ellipsoid.radius.a) * (1 - 1e-6) * np.where(np.arange(count) < count // 4, rng.uniform(0, 1, count),
                                                           1.0)[:, None]
    return ellipsoid.points(W)


@st.composite
def gated_blocks(draw):
    d, m = draw(st.integers(2, 5)), draw(st.integers(1, 6))
    act = draw(st.sampled_from(ACTIVATIONS))
    seed = draw(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([0.3, 1.0, 2.0]))
    biases = draw(st.booleans())
    ffn = GatedFeedForward(rng.standard_normal((d, m)) * scale, rng.standard_normal((d, m)) * scale,
                           rng.standard_normal((m, d)) * scale, act,
                           *(rng.standard_normal(m) for _ in range(2)) if biases else (None, None),
                           rng.standard_normal(d) if biases else None)
    kind = draw(st.sampled_from(["ball", "centred ball", "rmsnorm"]))
    radius = draw(st.sampled_from([0.1, 1.0, 3.0]))
    if kind == "ball":
        domain = TokenBall(radius, np.zeros(d))
    elif kind == "centred ball":
        domain = TokenBall(radius, rng.standard_normal(d))
    else:
        domain = RMSNorm(rng.uniform(0.2, 1.5, d) * radius, 1e-5)
    return ffn, domain, seed


def test_jacobian_against_complex_step():
    rng = np.random.default_rng(0)
    for act in ACTIVATIONS:
        ffn = GatedFeedForward(*(rng.standard_normal(s) for s in ((4, 6), (4, 6), (6, 4))), act,
                               rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(4))
        x = rng.standard_normal(4) * 2
        np.testing.assert_allclose(jacobian(ffn, x), independent_jacobian(lambda y, f=ffn: unit(f, y), x),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(ffn(x), unit(ffn, x), rtol=1e-12)


@SOUNDNESS
@given(gated_blocks())
def test_no_certified_bound_below_a_witness(case):
    ffn, domain, seed = case
    ellipsoid = ellipsoid_of(domain, ffn.d)
    values = gated_constants(ffn, ellipsoid, effort=12)
    bounds = [v.value for v in values.values() if v is not None and v.certified]
    assert bounds, {k: v.reason for k, v in values.items() if v is not None}
    witness = gated_witness(ffn, ellipsoid, seed=seed, starts=3, steps=8)
    assert witness.certified <= witness.value * (1 + 1e-9)
    rng = np.random.default_rng(seed)
    stretches = [np.linalg.norm(independent_jacobian(lambda y: unit(ffn, y), x), 2) for x in sample(ellipsoid, rng, 12)]
    stretches.append(np.linalg.norm(independent_jacobian(lambda y: unit(ffn, y), witness.x), 2))
    for bound in bounds:
        assert max(stretches) <= bound * (1 + 1e-9)
        assert witness.certified <= bound


@settings(max_examples=8, deadline=None)
@given(gated_blocks(), st.booleans())
def test_lifted_gram_is_the_gram_of_the_lifted_map(case, fold):
    """H = Phi Phi^* with Phi written as a (2m, (d + 1) d) matrix from its definition."""
    ffn, domain, _ = case
    ellipsoid = ellipsoid_of(domain, ffn.d)
    lift = lifted_unit(ffn.W_gate, ffn.W_up, ffn.W_down, ffn.act, ellipsoid, ffn.b_gate, ffn.b_up, fold=fold)
    M = ellipsoid.axes.mid
    c = np.zeros(ffn.d) if ellipsoid.center is None else ellipsoid.center
    u_c, g_c = c @ ffn.W_up + ffn.b_up, c @ ffn.W_gate + ffn.b_gate
    tau = lift.tau
    side = M if fold else np.eye(ffn.d)
    rows = []
    for i in range(ffn.W_gate.shape[1]):       # Phi(X)_i = a_i^T X b_i, X = (w, tau) e^T
        a = np.append(M.T @ ffn.W_up[:, i], u_c[i] / tau if tau else 0.0)
        rows.append(np.outer(a, side.T @ ffn.W_gate[:, i]).ravel())
    for i in range(ffn.W_gate.shape[1]):
        a = np.append(M.T @ ffn.W_gate[:, i], g_c[i] / tau if tau else 0.0)
        rows.append(np.outer(a, side.T @ ffn.W_up[:, i]).ravel())
    Phi = np.array(rows)
    np.testing.assert_allclose(lift.gram.mid, Phi @ Phi.T, rtol=1e-10, atol=1e-10)
    assert np.all(lift.gram.rad <= 1e-10 * (1 + np.abs(lift.gram.mid)))


def test_certificate_refuses_a_rho_below_the_truth():
    """A check that can fail: multipliers that pass at their own rho are refused at 0.8 of the witness."""
    rng = np.random.default_rng(3)
    ffn = GatedFeedForward(*(rng.standard_normal(s) for s in ((4, 5), (4, 5), (5, 4))), "silu")
    norm = RMSNorm(rng.uniform(0.5, 1.5, 4), 1e-5)
    ellipsoid = ellipsoid_of(norm, 4)
    value = gated_sdp(ffn.W_gate, ffn.W_up, ffn.W_down, ffn.act, ellipsoid)
    assert value.certified
    lift = lifted_unit(ffn.W_gate, ffn.W_up, ffn.W_down, ffn.act, ellipsoid)
    lam = np.concatenate([np.full(5, value.details["lam_s"]), np.full(5, value.details["lam_mu"])])
    r2 = np.concatenate([np.full(5, float(lift.radii2[0].mid)), np.full(5, float(lift.radii2[1].mid))])
    roots = np.sqrt(lam * (1 + value.details["slack"]) * r2)
    assert certify_lift(lift, roots, value.details["rho"]) >= 0
    witness = gated_witness(ffn, ellipsoid, starts=4, steps=20)
    assert witness.certified <= value.value
    too_small = 0.8 * witness.certified ** 2 / float(lift.lifted_radius2.b)
    for scale in (0.5, 1.0, 2.0):
        assert certify_lift(lift, roots * scale, too_small) < 0


def test_the_lift_sees_the_matrices():
    """SmolLM2-shaped in miniature: the lifted SDP beats the closed form when the branches are not aligned."""
    rng = np.random.default_rng(7)
    d, m = 12, 32
    ffn = GatedFeedForward(rng.standard_normal((d, m)) / math.sqrt(d), rng.standard_normal((d, m)) / math.sqrt(d),
                           rng.standard_normal((m, d)) / math.sqrt(m), "silu")
    norm = RMSNorm(rng.uniform(0.05, 0.4, d), 1e-5)
    values = gated_constants(ffn, norm, effort=20)
    witness = gated_witness(ffn, norm)
    assert witness.certified <= values["lifted SDP"].value < values["closed form"].value
    assert values["best"] is values["lifted SDP"]


def test_unbounded_domain_is_refused():
    rng = np.random.default_rng(0)
    ffn = GatedFeedForward(*(rng.standard_normal(s) for s in ((3, 4), (3, 4), (4, 3))), "silu")
    with pytest.raises(AssumptionError):
        gated_constants(ffn, AllTokens())
    with pytest.raises(WeightsError):
        closed_form("not a block", TokenBall(1.0, np.zeros(3)))
    with pytest.raises(WeightsError):
        gated_sdp(ffn.W_gate, ffn.W_up, ffn.W_down, "relu6", ellipsoid_of(TokenBall(1.0, np.zeros(3)), 3))


def test_witness_recheck_is_exact_and_needs_the_domain():
    rng = np.random.default_rng(5)
    ffn = GatedFeedForward(*(rng.standard_normal(s) for s in ((4, 6), (4, 6), (6, 4))), "gelu_pytorch_tanh")
    norm = RMSNorm(rng.uniform(0.5, 1.5, 4), 1e-5)
    ellipsoid = ellipsoid_of(norm, 4)
    witness = gated_witness(ffn, norm, starts=3, steps=10)
    assert witness.certified == pytest.approx(witness.value, rel=1e-9)
    assert recheck_block(witness, ffn=ffn, ellipsoid=ellipsoid) == witness.certified
    outside = type(witness)(witness.block, witness.x, witness.direction, witness.value,
                            details={**witness.details, "w": witness.details["w"] * 1.01})
    assert math.isnan(recheck_block(outside, ffn=ffn, ellipsoid=ellipsoid))


# Residual blocks with LayerScale and sandwich norms --------------------------------------------------
def rms(gamma, eps, x):
    return gamma * x / np.sqrt(np.mean(x * x) + eps)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2 ** 16), st.booleans(), st.booleans())
def test_pre_norm_gated_block_with_layerscale_and_sandwich(seed, layerscale, sandwich):
    """``x + a * N'(f(N(x)))``: every certified rule holds against the block's Jacobian written here, at
    tokens of every scale (N stretches most near 0)."""
    rng = np.random.default_rng(seed)
    d, m = 4, 6
    ffn = GatedFeedForward(*(rng.standard_normal(s) for s in ((d, m), (d, m), (m, d))), "silu")
    gamma, eps = rng.uniform(0.3, 1.2, d), 1e-2
    norm = RMSNorm(gamma, eps)
    post = RMSNorm(rng.uniform(0.3, 1.2, d), 1e-2) if sandwich else None
    scale = rng.uniform(-0.5, 0.5, d) if layerscale else None

    def block(x):
        branch = unit(ffn, rms(gamma, eps, x))
        if post is not None:
            branch = rms(post.gamma, post.eps, branch)
        return x + (branch if scale is None else scale * branch)

    values = pre_norm_gated_constants(norm, ffn, effort=12, scale=scale,
                                      after=None if post is None else norm_constant(post))
    assert values["composed"].certified and values["best"] is not None
    points = [rng.standard_normal(d) * 10.0 ** k for k in range(-4, 2) for _ in range(3)]
    worst = max(np.linalg.norm(independent_jacobian(block, x), 2) for x in points)
    for value in values.values():
        if value is not None and value.certified:
            assert worst <= value.value


def test_residual_rules_compose_once():
    assert residual_constant("pre", 2.0, 3.0).value == pytest.approx(7.0)
    assert residual_constant("pre", 2.0, 3.0, scale=np.array([0.5, -0.25])).value == pytest.approx(4.0)
    assert residual_constant("pre", 2.0, 3.0, after=4.0).value == pytest.approx(25.0)
    assert residual_constant("pre", 2.0, 3.0, after=4.0, scale=0.5).value == pytest.approx(13.0)
    with pytest.raises(AssumptionError):
        residual_constant("post", 2.0, 3.0, scale=0.5)


# RMSNorm ------------------------------------------------------------------------------------------
def test_rmsnorm_global_local_and_witness():
    rng = np.random.default_rng(11)
    gamma, eps = rng.standard_normal(8), 1e-5
    norm = RMSNorm(gamma, eps)
    value = norm_constant(norm)
    assert value.value == pytest.approx(np.max(np.abs(gamma)) / math.sqrt(eps), rel=1e-12)
    assert value.value >= np.max(np.abs(gamma)) / math.sqrt(eps)
    witness = norm_witness(norm)
    assert np.all(witness.x == 0) and witness.certified == pytest.approx(value.value, rel=1e-12)
    assert witness.certified <= value.value
    X = rng.standard_normal((6, 8)) * (10.0 ** np.arange(-3, 3))[:, None]
    local = local_constants(norm, X)
    for x, bound in zip(X, local):
        exact = np.linalg.norm(independent_jacobian(lambda y: rms(gamma, eps, y), x), 2)
        assert exact <= bound
        assert bound == pytest.approx(np.max(np.abs(gamma)) / math.sqrt(np.mean(x * x) + eps), rel=1e-12)
        np.testing.assert_allclose(norm_jacobian(norm, x), independent_jacobian(lambda y: rms(gamma, eps, y), x),
                                   rtol=1e-9, atol=1e-9)
