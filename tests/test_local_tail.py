"""A block's curve split at its attention output, the feed-forward block's second derivative, and the global
constant of a curve on a domain that holds its neighbourhood: each checked against independent float routes."""

from __future__ import annotations

import functools

import local_models
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ndtr

from lipbound.local.balls import TokenBalls
from lipbound.local.bounds import feedforward_bounds
from lipbound.local.chains import chain_for, chain_forward
from lipbound.local.curve import _curve, lipschitz_curve
from lipbound.local.enclosed import EnclosedFeedForward
from lipbound.local.witness_search import top_singular
from lipbound.measures.bert import load_text_model
from lipbound.numeric.certify import head_constant
from lipbound.numeric.domains import LayerNormOutputs
from lipbound.numeric.forward import hidden_states
from lipbound.numeric.model.transformer import Model


def _slope(h):
    return ndtr(h) + h * np.exp(-0.5 * h * h) / np.sqrt(2 * np.pi)


def _curvature(h):
    return np.exp(-0.5 * h * h) / np.sqrt(2 * np.pi) * (2 - h * h)


def _ffn_jacobian(ffn, y):
    """Row convention ``I + W_1 diag(GELU'(h)) W_2``, in float, written here from the formula."""
    return np.eye(y.size) + (ffn.W_1 * _slope(y @ ffn.W_1 + ffn.b_1)) @ ffn.W_2


def _second_derivative_norm(ffn, y, rng, restarts=4, steps=60):
    """A lower bound on ``max |sum_k g_k (u.w_k)(e.w_k)(r_k.v)|`` over unit u, e, v by alternating maximisation,
    and the direction e that attains it."""
    g = _curvature(y @ ffn.W_1 + ffn.b_1)
    best, best_e = 0.0, None
    for _ in range(restarts):
        e = rng.standard_normal(y.size)
        e /= np.linalg.norm(e)
        for _ in range(steps):
            M = (ffn.W_1 * (g * (e @ ffn.W_1))) @ ffn.W_2
            U, S, Vt = np.linalg.svd(M)
            e = ffn.W_1 @ (g * (U[:, 0] @ ffn.W_1) * (ffn.W_2 @ Vt[0]))
            e /= np.linalg.norm(e)
        if S[0] > best:
            best, best_e = S[0], e
    return best, best_e


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), width=st.sampled_from([10, 40]), scale=st.sampled_from([0.5, 1.0, 3.0]),
       radius=st.sampled_from([1e-3, 0.05, 0.5]))
def test_feedforward_second_derivative_bounds_the_change_of_its_jacobian(seed, width, scale, radius):
    """``Lambda_i^(1/2)`` is at least the norm of the second derivative found by alternating maximisation, and the
    variation bound holds along that worst direction, its opposite and random directions of the ball."""
    rng = np.random.default_rng(seed)
    ffn = local_models.layer(rng, d_ff=width).ffn
    ffn = type(ffn)(scale * ffn.W_1, ffn.b_1, ffn.W_2, ffn.b_2)
    Y = 2 * rng.standard_normal((3, 6))
    enclosed = EnclosedFeedForward(ffn, Y)
    roots = enclosed.curvature_norms()
    balls = TokenBalls(Y, np.full(3, radius))
    variation = np.diag(feedforward_bounds(ffn, balls, enclosed).variation)
    for i in range(3):
        found, e = _second_derivative_norm(ffn, Y[i], rng)
        assert found <= roots[i] * (1 + 1e-9)
        J = _ffn_jacobian(ffn, Y[i])
        directions = [e, -e] + [d / np.linalg.norm(d) for d in rng.standard_normal((6, 6))]
        for direction in directions:
            change = np.linalg.norm(_ffn_jacobian(ffn, Y[i] + radius * direction) - J, 2)
            assert change <= variation[i] * (1 + 1e-9)


def test_second_derivative_form_is_tighter_on_real_weights():
    """On a real feed-forward block at a small radius the second-derivative form is several times tighter than
    the slope-deviation form alone (the first theorem's box of slopes pays for every neuron at once)."""
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat slept all afternoon."))[0][:2]   # two tokens keep it short
    chain = chain_for(bert.model, "block", 0)
    Y = chain_forward(chain, X[None])[2][0]                        # the feed-forward block's inputs
    ffn = chain[2].target
    balls = TokenBalls(Y, np.full(Y.shape[0], 0.03))
    both = np.diag(feedforward_bounds(ffn, balls).variation)
    slopes_only = np.diag(feedforward_bounds(ffn, balls, want_variation=False).variation)
    assert np.all(both * 3 < slopes_only)


def _check_at_adversarial_points(chain, X, curve, seed):
    """Every point of the curve holds, and at the two points of U along the top singular direction of the
    Jacobian's change (found near X) the Jacobian norm and its change stay below the certified values; at those
    and at the two points along the top singular direction of DF(X) the chain moves X by at most the point's
    ``reach``."""
    moving = np.ones(X.shape[0], dtype=bool)
    reference = chain_forward(chain, X[None])
    _, top, _ = top_singular(chain, X, moving, None, 0)
    rng = np.random.default_rng(seed)
    for point in curve.points:
        assert point.verdict == "holds" and point.witness <= point.certified
        if point.eps == 0:
            continue
        _, E, _ = top_singular(chain, X + 1e-3 * rng.standard_normal(X.shape), moving, None, 0, reference=reference)
        for Y in (X + point.eps * E / np.linalg.norm(E), X - point.eps * E / np.linalg.norm(E)):
            assert top_singular(chain, Y, moving, None, 0)[0] <= point.certified * (1 + 1e-9)
            assert top_singular(chain, Y, moving, None, 0, reference=reference)[0] <= point.variation * (1 + 1e-9)
        for Y in (X + point.eps * E / np.linalg.norm(E), X + point.eps * top, X - point.eps * top):
            moved = np.linalg.norm(chain_forward(chain, Y[None])[-1] - reference[-1])
            assert moved <= point.reach * (1 + 1e-9) + 1e-12
        assert point.reach <= point.certified * point.eps * (1 + 1e-12)


def test_block_curve_splits_at_the_attention_output():
    """A block's variation is the smaller of the blockwise bound and the split at the attention's output; the
    curve still holds against exact Jacobians at adversarial points of U (the top singular directions of the
    Jacobian's change, scaled onto the sphere) and starts at ||DF(X)||."""
    generated = local_models.model(seed=7, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2, 9])[0]
    eps = [0.0, 1e-5, 1e-2, 0.2]
    curve = lipschitz_curve(generated, X, kind="block", layer=0, eps=eps, ascent_steps=3)
    assert curve.variation_bound == "attention-tail"
    _check_at_adversarial_points(chain_for(generated, "block", 0), X, curve, seed=1)
    assert curve.points[0].certified == pytest.approx(curve.jacobian_norm, rel=1e-6)
    assert curve.points[1].certified <= 1.01 * curve.jacobian_norm


def test_curve_global_constant_holds_off_the_layernorm_image():
    """U(X, eps) leaves the LayerNorm image, where the image's constant does not hold: points of U found by
    sampling beat it, and the curve's certified value (its global constant taken on a ball holding U) is
    above every one of them; the curve's own witness comes within a factor 2 of them."""
    rng = np.random.default_rng(0)
    norm = local_models.norm(rng, 6, scale=0.05)
    item = local_models.layer(rng, ln_in=norm, scale=2.0)
    model = Model("generated", {0: item}, num_heads=2, hidden=6, num_layers=1)
    X = norm(rng.standard_normal((3, 6)))
    eps = 4.0
    chain = chain_for(model, "head", 0, 0)
    image = head_constant(model.head(0, 0), "fro", LayerNormOutputs(norm), 3).value
    found = 0.0
    for _ in range(40):
        E = rng.standard_normal(X.shape)
        found = max(found, top_singular(chain, X + E * (eps / np.linalg.norm(E)), np.ones(3, dtype=bool), None, 0)[0])
    assert found > image  # a cap at the image's constant would be refuted
    curve = lipschitz_curve(model, X, kind="head", head=0, layer=0, eps=[eps, 0.5], ascent_steps=2)
    point = curve.points[0]
    assert point.eps == eps and point.verdict == "holds" and found <= point.certified
    assert point.global_constant >= found
    # the witness search reaches beyond X's own maximum (3.16 from X alone), and a point found for the
    # smaller eps (computed first) counts for the larger one
    assert point.witness >= found / 2
    assert point.witness >= curve.points[1].witness and point.variation_witness >= curve.points[1].variation_witness


#: The radii of the two-layer stack's curve that the next tests share: eps = 0 (the Jacobian at X), a radius where
#: the curve starts at ||DF(X)||, one where the composed local bound is certified, one where the global constant is.
STACK_EPS = [0.0, 1e-5, 1e-3, 1.0]
#: The tests reading :func:`stack_curve` run in one process, which forms it once (a stack curve costs seconds a radius).
STACK_GROUP = pytest.mark.xdist_group("local-tail-stack")


@pytest.fixture(scope="module")
def stack_curve():
    """A generated two-layer model, its hidden states X of four tokens and the stack's curve at :data:`STACK_EPS`.
    One ascent step: its witnesses at 1e-5 and 1e-3 are those of three to 4e-9 (2.1227309, 2.1281306 against the
    certified 2.1285, 2.7588; at 1.0 it is 5.7 for 8.7 under 1.4e17), and the curve costs 11.4 -> 9.1 CPU-s."""
    generated = local_models.model(seed=3, layers=2)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    return generated, X, lipschitz_curve(generated, X, kind="stack", layer=0, last=1, eps=STACK_EPS, ascent_steps=1)


@STACK_GROUP
def test_stack_curve_composes_its_blocks(stack_curve, monkeypatch):
    """A stack of two generated layers takes its blocks' own curves, composed: at eps = 0 the certified value is
    the Jacobian norm at X (the blockwise product of rounding balls gave more), and at every eps it holds against
    exact Jacobians at adversarial points of U and lies below the blockwise bound."""
    generated, X, curve = stack_curve
    eps = STACK_EPS
    assert curve.variation_bound == "stack-blocks" and curve.jacobian_bound == "block-products"
    first, second = curve.to_json()["blocks"]
    assert (first["layer"], second["layer"]) == (0, 1) and first["radius"] == eps
    for point, L_1, L_2 in zip(curve.points[1:], first["certified"][1:], second["certified"][1:]):
        assert point.certified <= L_1 * L_2 * (1 + 1e-12)   # the product of the blocks' constants is one route
    from lipbound.measures.curves import curve_table
    assert [line.split(":")[0] for line in curve_table(curve).splitlines() if line.startswith("  layer")] \
        == ["  layer 0", "  layer 1"]
    assert all(r > e for r, e in zip(second["radius"][1:], eps[1:]))   # U_2 holds the images: at least L_1 eps
    _check_at_adversarial_points(chain_for(generated, "stack", 0, last=1), X, curve, seed=2)
    assert curve.points[0].certified == pytest.approx(curve.jacobian_norm, rel=1e-6)
    assert curve.points[1].certified <= 1.05 * curve.jacobian_norm
    from lipbound.local import curve as module
    monkeypatch.setattr(module, "StackOfBlocks", lambda *args, **kwargs: None)
    blockwise = lipschitz_curve(generated, X, kind="stack", layer=0, last=1, eps=eps, ascent_steps=0)
    assert blockwise.variation_bound == "blockwise"
    assert all(a.variation <= b.variation for a, b in zip(curve.points, blockwise.points))
    assert curve.points[0].variation < blockwise.points[0].variation


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the enclosures overflow: by design here
def test_a_stack_of_three_blocks_past_the_float_range_falls_back_to_its_global_constant():
    """Three blocks (the chain theorem for three steps) and a radius whose balls leave the float range: the
    blockwise enclosures overflow, so that radius is certified by the global constant alone, and the small
    radius of the same call keeps its composed bound; both hold against the witnesses found."""
    generated = local_models.model(seed=3, layers=3)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    curve = lipschitz_curve(generated, X, kind="stack", layer=0, last=2, eps=[1e-3, 1e40], ascent_steps=1)
    small, huge = curve.points
    assert small.route.endswith("(stack-blocks)") and small.certified < small.global_constant
    assert huge.route == "global" and huge.certified == huge.global_constant < np.inf
    assert all(p.verdict == "holds" and p.witness <= p.certified for p in curve.points)
    # the composed bounds (the prefix products' norms, lemma prefix-chain) against the Jacobian written in
    # local_models, at X and at random points of U's sphere
    at_x = local_models.stack_jacobian(generated, X, 3)
    assert np.linalg.norm(at_x, 2) <= curve.jacobian_norm * (1 + 1e-7)
    rng = np.random.default_rng(5)
    for _ in range(3):
        E = rng.standard_normal(X.shape)
        J = local_models.stack_jacobian(generated, X + small.eps * E / np.linalg.norm(E), 3)
        assert np.linalg.norm(J, 2) <= small.certified and np.linalg.norm(J - at_x, 2) <= small.variation


@settings(max_examples=20, deadline=None)
@given(centre=st.floats(-6, 6), width=st.floats(0, 3))
def test_gelu_derivative_enclosures_hold_the_derivatives(centre, width):
    """The enclosures of GELU'' and GELU''' over an interval hold the derivatives (written here from their
    formulas) at points throughout it."""
    from lipbound.rigorous.arrays import IntervalArray, gelu_curvature, gelu_third
    lo, hi = centre - width, centre + width
    box = IntervalArray(np.array([lo]), np.array([hi]))
    second, third = gelu_curvature(box), gelu_third(box)
    x = np.linspace(lo, hi, 101)
    density = np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
    slack = 1e-12
    values = density * (2 - x * x)
    assert np.all(second.lo[0] - slack <= values) and np.all(values <= second.hi[0] + slack)
    values = x * density * (x * x - 4)
    assert np.all(third.lo[0] - slack <= values) and np.all(values <= third.hi[0] + slack)


def _tail_setting(model, X, eps):
    """The block's chain at X, its tail, and the per-component balls, bounds and radii on the Frobenius ball of
    radius eps (as the curve forms them, without the attention's cap)."""
    from lipbound.local.balls import Neighbourhood
    from lipbound.local.centre import ChainCentre
    from lipbound.local.tail import BlockTail
    chain = chain_for(model, "block", 0)
    centre = ChainCentre(chain, X, False)
    balls = Neighbourhood("fro", eps).balls(X)
    M, V, N, radii = [], [], [], []
    for k, component in enumerate(chain):
        bounds = component.bounds(balls, centre.enclosed[k])
        zero = component.bounds(TokenBalls(centre.points[k], centre.rounding[k]), centre.enclosed[k])
        M.append(bounds.blocks), V.append(bounds.variation), N.append(zero.at_center), radii.append(balls.radii)
        if k < 3:
            balls = TokenBalls(centre.points[k + 1], (bounds.movement + centre.rounding[k + 1]) * (1 + 1e-12))
    return chain, centre, BlockTail(centre.enclosed), (M, V, N, radii, centre.rounding)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([1e-3, 3e-2, 0.3]))
def test_block_tail_bounds_hold_per_token(seed, eps):
    """Both bounds of a block's per-token maps (telescoped, and with the LayerNorms folded into the feed-forward
    block's second derivative) hold against Jacobians by central differences at points of the token's ball after
    the attention: random, on the sphere, and along the direction that moves the Jacobian most among them."""
    generated = local_models.model(seed=seed % 50, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    chain, centre, tail, setting = _tail_setting(generated, X, eps)
    telescoped, folded = tail.omega_tokens(*setting)
    item = generated.layer(0)

    def per_token(z):
        y = item.ln_out(z[None])
        return item.ffn_norm(y + item.ffn(y))[0]

    def jacobian(z, h=1e-6):
        return np.stack([(per_token(z + h * e) - per_token(z - h * e)) / (2 * h) for e in np.eye(z.size)])

    rng = np.random.default_rng(seed)
    radius = setting[3][1]
    for i in range(X.shape[0]):
        x = centre.points[1][i]
        at_centre = jacobian(x)
        worst, rate = 0.0, 0.0
        for _ in range(12):
            e = rng.standard_normal(x.size)
            z = x + radius[i] * e / np.linalg.norm(e) * (1.0 if rng.random() < 0.7 else rng.random())
            worst = max(worst, np.linalg.norm(jacobian(z) - at_centre, 2))
            rate = max(rate, np.linalg.norm(per_token(z) - per_token(x)) / np.linalg.norm(z - x))
        assert worst <= folded[i] * (1 + 1e-6) + 1e-7
        assert worst <= telescoped[i] * (1 + 1e-6) + 1e-7
        # lemma block-reach: the map moves a point of the ball by at most tau_i + omega_i times its distance to x
        assert rate <= (tail.taus[i] + min(folded[i], telescoped[i])) * (1 + 1e-9)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([1e-3, 3e-2, 0.3]))
def test_feedforward_change_behind_the_layernorm_holds(seed, eps):
    """``K >= sup ||J_1(x) (J_F(y_2) - J_F(x_2))||`` (theorem local-feedforward-front, or ``N_1 V_F``) against the
    float Jacobians at points y of the token's ball after the attention, y_2 = LN_1(y)."""
    generated = local_models.model(seed=seed % 50, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    chain, centre, tail, (M, V, N, radii, rounding) = _tail_setting(generated, X, eps)
    change, _ = tail.feedforward_change(V, N, radii, rounding)
    item, rng, h = generated.layer(0), np.random.default_rng(seed), 1e-6
    for i in range(X.shape[0]):
        x = centre.points[1][i]
        J_1 = np.stack([(item.ln_out(x + h * e) - item.ln_out(x - h * e)) / (2 * h) for e in np.eye(x.size)])
        at_centre = _ffn_jacobian(item.ffn, item.ln_out(x))
        for _ in range(12):
            e = rng.standard_normal(x.size)
            y = x + radii[1][i] * e / np.linalg.norm(e) * (1.0 if rng.random() < 0.7 else rng.random())
            moved = J_1 @ (_ffn_jacobian(item.ffn, item.ln_out(y)) - at_centre)
            assert np.linalg.norm(moved, 2) <= change[i] * (1 + 1e-6) + 1e-7


@pytest.mark.slow   # 13 CPU-s; the generated blocks above check both bounds, this one the factor on MiniLM
def test_folding_the_layernorms_tightens_the_tail_on_real_weights():
    """On the first block of all-MiniLM-L6-v2 at 1e-6 of the LayerNorm radius (token balls without the attention's
    cap), folding the LayerNorms' Jacobians into the feed-forward block's second derivative at least halves every
    token's bound, and the change of the feed-forward Jacobian seen through the first LayerNorm."""
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat slept all afternoon."))[0][:2]   # two tokens keep it short
    eps = 1e-6 * bert.layernorm_feeding(0).radius_about_center
    *_, tail, setting = _tail_setting(bert.model, X, eps)
    telescoped, folded = tail.omega_tokens(*setting)
    assert np.all(2 * folded < telescoped)
    # the first LayerNorm folded into the change of the feed-forward Jacobian: at least halves N_1 V_F
    M, V, N, radii, rounding = setting
    change, _ = tail.feedforward_change(V, N, radii, rounding)
    assert np.all(2 * change < np.diag(N[1]) * np.diag(V[2]))


@STACK_GROUP
def test_whole_layer_and_stack_curves_end_at_their_global_constants(stack_curve):
    """A whole layer's or a stack's global constant is the product of its components' (the first attention on
    the ball about the LayerNorm bias that holds U, the next one on the image of the LayerNorm before it, the
    LayerNorms and feed-forward blocks on all of R^d): finite, above the Jacobian norms at random points of
    U, above the local bound at a small eps, and the certified value where the local bounds outgrow it."""
    generated, X, stack = stack_curve
    rng = np.random.default_rng(4)
    moving = np.ones(X.shape[0], dtype=bool)
    block = lipschitz_curve(generated, X, kind="block", layer=0, eps=[1e-3, 1.0], ascent_steps=1)
    for kind, last, curve in (("block", None, block), ("stack", 1, stack)):
        small, large = (next(p for p in curve.points if p.eps == eps) for eps in (1e-3, 1.0))
        assert np.isfinite(large.global_constant) and large.certified == min(large.local, large.global_constant)
        if kind == "stack":   # (a block's attention-tail bound, with its attention's L(eps) from the Jacobian
            # enclosed over U, stays below the global constant here: 8.0e7 against 3.9e8)
            assert large.certified == large.global_constant < large.local
        assert small.certified == small.local < small.global_constant
        chain = chain_for(generated, kind, 0, last=last)
        for _ in range(10):
            E = rng.standard_normal(X.shape)
            assert top_singular(chain, X + E / np.linalg.norm(E), moving, None, 0)[0] <= large.global_constant


def test_nested_curves_share_the_centre_and_change_no_value(monkeypatch):
    """A stack hands its enclosures at the centre (and their caches) to its blocks, a block its attention's to the
    attention curve: every value of the curve is the same as with a centre enclosed afresh for each nested curve,
    and the CPU seconds add up (the set-up plus the points' own work, nested curves' radii in their points)."""
    from lipbound.local import curve as module
    generated = local_models.model(seed=3, layers=2)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    eps = [0.0, 1e-3]
    calls = []
    original = module.ChainCentre.part

    def counted(self, chain, start, stop, dense):
        calls.append((start, stop))
        return original(self, chain, start, stop, dense)

    monkeypatch.setattr(module.ChainCentre, "part", counted)
    shared = lipschitz_curve(generated, X, kind="stack", layer=0, last=1, eps=eps, ascent_steps=1)
    assert (0, 4) in calls and (4, 8) in calls and (0, 1) in calls  # the blocks', the attentions'

    def fresh(self, chain, start, stop, dense):
        return module.ChainCentre(chain[start:stop], self.points[start], dense)

    monkeypatch.setattr(module.ChainCentre, "part", fresh)
    alone = lipschitz_curve(generated, X, kind="stack", layer=0, last=1, eps=eps, ascent_steps=1)

    def values(curve):
        out = curve.to_json()
        del out["setup_cpu_seconds"]
        for point in out["points"]:
            del point["cpu_seconds"]
        return out

    assert values(shared) == values(alone)
    assert shared.setup_cpu_seconds >= -1e-3 and all(p.cpu_seconds >= 0 for p in shared.points)
    assert all(p.cpu_seconds > 0 for p in shared.points if p.eps > 0)
    assert set(shared.to_json()["points"][0]) >= {"cpu_seconds"} and "setup_cpu_seconds" in shared.to_json()


def _central_jacobian(f, x, h=1e-6):
    """Row convention ``d f / d x`` of a map of one token by central differences."""
    return np.stack([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)])


def _gelu(h):
    return h * ndtr(h)


def _movement_witness(ffn, y, radius, rng, restarts=3, steps=40):
    """The largest ``||FF(y + e) - FF(y)||`` found over ``||e|| <= radius`` by projected ascent (the gradient
    ``J(y + e) (FF(y + e) - FF(y))`` written here from the formulas), from the top right singular vector of the
    Jacobian at y and from random points of the sphere."""
    def moved(e):
        return e + (_gelu((y + e) @ ffn.W_1 + ffn.b_1) - _gelu(y @ ffn.W_1 + ffn.b_1)) @ ffn.W_2
    starts = [np.linalg.svd(_ffn_jacobian(ffn, y))[0][:, 0]] + list(rng.standard_normal((restarts, y.size)))
    best = 0.0
    for e in starts:
        e = radius * e / np.linalg.norm(e)
        for _ in range(steps):
            best = max(best, np.linalg.norm(moved(e)))
            step = _ffn_jacobian(ffn, y + e) @ moved(e)
            e = e + radius * step / (np.linalg.norm(step) + 1e-300)
            e = radius * e / np.linalg.norm(e)
        best = max(best, np.linalg.norm(moved(e)))
    return best


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 10_000), radius=st.sampled_from([1e-2, 0.5, 4.0]), weight=st.sampled_from([1.0, 3.0]))
def test_feedforward_movement_holds_and_is_tight_on_small_balls(seed, radius, weight):
    """Lemmas secant-slope-range and feedforward-movement: the secant slopes of every neuron, computed here from
    GELU's formula at points throughout its pre-activation's interval, lie in their enclosure, and no movement
    ``||FF(y) - FF(y_i)||`` found by ascent or at random points of the ball exceeds the bound; on small balls the
    ascent comes within 5% of it (the bound halved would fail)."""
    rng = np.random.default_rng(seed)
    ffn = local_models.layer(rng, d_ff=12).ffn
    ffn = type(ffn)(weight * ffn.W_1, ffn.b_1, ffn.W_2, ffn.b_2)
    Y = 1.5 * rng.standard_normal((3, 6))
    enclosed = EnclosedFeedForward(ffn, Y)
    radii = np.full(3, radius)
    secants, bound = enclosed.secant_slopes(radii), enclosed.movement(radii)
    reach = np.linalg.norm(ffn.W_1, axis=0) * radius
    for i in range(3):
        h = Y[i] @ ffn.W_1 + ffn.b_1
        t = reach * np.concatenate([np.linspace(-1, -1e-3, 200), np.linspace(1e-3, 1, 200)])[:, None]
        secant = (_gelu(h + t) - _gelu(h)) / t
        assert np.all(secants.lo[i] - 1e-9 <= secant) and np.all(secant <= secants.hi[i] + 1e-9)
        found = _movement_witness(ffn, Y[i], radius, rng)
        for e in rng.standard_normal((20, 6)):
            e *= radius * rng.random() ** (1 / 6) / np.linalg.norm(e)
            y = Y[i] + e
            found = max(found, np.linalg.norm(y + _gelu(y @ ffn.W_1 + ffn.b_1) @ ffn.W_2
                                              - Y[i] - _gelu(h) @ ffn.W_2))
        assert found <= bound[i] * (1 + 1e-9)
        if radius <= 1e-2:
            assert bound[i] <= 1.05 * found
    assert np.all(enclosed.movement(np.array([0.0, np.inf, radius]))[:2] == [0.0, np.inf])


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_weighted_tail_variation_holds_for_blocks_that_move_unevenly(seed):
    """Lemma tail-weighted: ``||DA(Y) T(Y) - DA(X) T(X)||`` (row convention, ``T`` block diagonal) for any
    ``DA(Y)`` within ``var`` of ``DA(X)``, blocks ``T_i(X)`` of norm at most ``tau`` and changes of norm
    ``omega_i``, stays below the weighted bound, which is below ``tau var + max omega Lip`` when one token's maps
    move far more than the others'."""
    from lipbound.local.tail import weighted_tail_variation
    from lipbound.rigorous.linalg import Enclosure
    rng = np.random.default_rng(seed)
    n, d, var, tau = 4, 3, 0.3, 1.5
    omegas = np.array([2.0, 0.1, 0.2, 0.05]) * rng.random(4)
    at_x = rng.standard_normal((n * d, n * d))
    bound = weighted_tail_variation(tau, omegas, var, Enclosure.exact(at_x))

    def blocks(norms):
        out = np.zeros((n * d, n * d))
        for i, size in enumerate(norms):
            B = rng.standard_normal((d, d))
            out[i * d:(i + 1) * d, i * d:(i + 1) * d] = size * B / np.linalg.norm(B, 2)
        return out
    for _ in range(20):
        change = rng.standard_normal((n * d, n * d))
        at_y = at_x + var * rng.random() * change / np.linalg.norm(change, 2)
        T_x = blocks(np.full(n, tau))
        found = np.linalg.norm(at_y @ (T_x + blocks(omegas)) - at_x @ T_x, 2)
        assert found <= bound * (1 + 1e-12)
    assert bound < tau * var + omegas.max() * (np.linalg.norm(at_x, 2) + var)


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([1e-2, 0.3]))
def test_folded_slope_remainder_holds_behind_the_layernorm(seed, eps):
    """Lemma slope-remainder-folded: with the feed-forward input ``e = LN_1(z) - x_2`` for z on the first LayerNorm's
    ball (radius r, its variation V_1 and the centre's rounding giving delta), ``||(J_1 W_1) diag(rho) (W_2 J_2)||``
    and ``||(J_1 W_1) diag(rho) W_2||`` (``rho`` written here from GELU's derivatives, ``J_1``, ``J_2`` by central
    differences) at random points and on the sphere never exceed :meth:`BlockTail.quadratic_remainder` with
    ``near``."""
    generated = local_models.model(seed=seed % 50, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    _, centre, tail, (M, V, N, radii, rounding) = _tail_setting(generated, X, eps)
    item, rng, ffn = generated.layer(0), np.random.default_rng(seed), generated.layer(0).ffn
    for i in range(X.shape[0]):
        x_1, x_2, x_3 = centre.points[1][i], centre.points[2][i], centre.points[3][i]
        r = radii[1][i]
        folded, front = tail.quadratic_remainder(i, radii[2][i], (r, V[1][i, i] * r * (1 + 1e-12) + rounding[2][i]))
        J_1 = _central_jacobian(lambda z: item.ln_out(z[None])[0], x_1)
        J_2 = _central_jacobian(lambda z: item.ffn_norm(z[None])[0], x_3)
        A, B, h = J_1 @ ffn.W_1, ffn.W_2 @ J_2, x_2 @ ffn.W_1 + ffn.b_1
        for _ in range(6):
            z = rng.standard_normal(x_1.size)
            z = x_1 + r * z / np.linalg.norm(z) * (1.0 if rng.random() < 0.7 else rng.random())
            moved = (item.ln_out(z[None])[0] - x_2) @ ffn.W_1
            rho = _slope(h + moved) - _slope(h) - _curvature(h) * moved
            assert np.linalg.norm((A * rho) @ B, 2) <= folded * (1 + 1e-6) + 1e-9
            assert np.linalg.norm((A * rho) @ ffn.W_2, 2) <= front * (1 + 1e-6) + 1e-9


def _third(h):
    return h * np.exp(-0.5 * h * h) / np.sqrt(2 * np.pi) * (h * h - 4)


def test_gelu_third_ceiling_holds_and_is_tight():
    """The certified ``sup |GELU'''|`` is above GELU''' on a fine grid (written here from its formula) and within half a
    percent of its largest value, at the root of ``x^4 - 7 x^2 + 4`` (where GELU'''' vanishes)."""
    from lipbound.local.bounds import gelu_third_ceiling
    grid = np.linspace(-30, 30, 600_001)
    ceiling = gelu_third_ceiling()
    assert np.max(np.abs(_third(grid))) <= ceiling
    top = abs(_third(np.sqrt((7 - np.sqrt(33)) / 2)))
    assert ceiling <= top * 1.005


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), width=st.sampled_from([10, 40]), scale=st.sampled_from([0.5, 1.0, 3.0]),
       radius=st.sampled_from([0.05, 0.5, 2.0]))
def test_joint_slope_remainder_holds_on_the_ball(seed, width, scale, radius):
    """Lemma slope-remainder-quadratic with ``A = W_1``, ``B = W_2``: ``||W_1 diag(rho) W_2||`` (``rho`` the slopes'
    change less its first-order term, written here from GELU's derivatives) at random points of the ball and on its
    sphere never exceeds :func:`joint_remainder`; the variation of the feed-forward Jacobian, which now takes the
    smaller of the split and the joint remainder, still holds along the sampled directions."""
    from lipbound.local.bounds import joint_remainder
    rng = np.random.default_rng(seed)
    ffn = local_models.layer(rng, d_ff=width).ffn
    ffn = type(ffn)(scale * ffn.W_1, ffn.b_1, ffn.W_2, ffn.b_2)
    Y = 2 * rng.standard_normal((3, 6))
    enclosed = EnclosedFeedForward(ffn, Y)
    variation = np.diag(feedforward_bounds(ffn, TokenBalls(Y, np.full(3, radius)), enclosed).variation)
    for i in range(3):
        bound = joint_remainder(enclosed, i, radius)
        h = Y[i] @ ffn.W_1 + ffn.b_1
        J = _ffn_jacobian(ffn, Y[i])
        for _ in range(40):
            e = rng.standard_normal(6)
            e *= radius / np.linalg.norm(e) * (1.0 if rng.random() < 0.7 else rng.random())
            moved = e @ ffn.W_1
            rho = _slope(h + moved) - _slope(h) - _curvature(h) * moved
            assert np.linalg.norm((ffn.W_1 * rho) @ ffn.W_2, 2) <= bound * (1 + 1e-9) + 1e-12
            assert np.linalg.norm(_ffn_jacobian(ffn, Y[i] + e) - J, 2) <= variation[i] * (1 + 1e-9) + 1e-12


@pytest.mark.slow   # 6 CPU-s: two 1536 x 1536 eigenvalue bounds per token
def test_joint_slope_remainder_is_tighter_on_real_weights():
    """On the first feed-forward block of all-MiniLM-L6-v2, on balls of the radii a block meets at 1e-3 of the
    LayerNorm radius (0.2-0.3), the joint remainder is below the per-neuron split (which pays ``||w_k|| R`` for every
    neuron at once)."""
    from lipbound.local.bounds import _split_norms, joint_remainder, remainder_weights
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat slept all afternoon."))[0][:2]
    chain = chain_for(bert.model, "block", 0)
    Y = chain_forward(chain, X[None])[2][0]
    ffn = chain[2].target
    enclosed, radii = EnclosedFeedForward(ffn, Y), np.array([0.2, 0.3])
    weights = remainder_weights(ffn, enclosed, radii, range(2))
    for i in range(2):
        a, b = _split_norms(ffn, weights[i])
        assert joint_remainder(enclosed, i, radii[i]) < a * b


#: The two tests reading :func:`_first_attention_curve` run in one process: both draw seed 0 first, formed once.
ATTENTION_GROUP = pytest.mark.xdist_group("local-tail-attention")


@functools.lru_cache(maxsize=4)
def _first_attention_curve(seed: int):
    """A generated model's hidden states X, the chain of its first attention layer and that layer's curve at 1e-3 and
    0.3 with the reach (remainders) formed (kept per seed: the tests only read them)."""
    generated = local_models.model(seed=seed % 50, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2, 9])[0]
    chain = chain_for(generated, "block", 0)[:1]
    curve = _curve(generated, X, "layer", 0, None, None, "fro", "fro", (), [1e-3, 0.3], 0, 0, 20, None,
                   chain=chain, want_reach=True)
    return X, chain, curve


@ATTENTION_GROUP
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_each_token_moves_within_its_own_reach_after_the_attention(seed):
    """Lemma attention-token-reach: on the Frobenius ball U(X, eps), ``||A(Y)_i - A(X)_i||`` at random points of U,
    on its sphere and along the top singular directions of DA(X) never exceeds ``c_i eps + rest`` (``c_i`` the
    certified column blocks' norms of DA(X), ``rest`` the attention curve's Taylor remainder), and at the small
    radius, where the linear part dominates, the per-token reaches are below the whole output's reach for some token."""
    from lipbound.local.enclosed import EnclosedAttention
    from lipbound.local.tail import column_block_norms, token_reach
    X, chain, curve = _first_attention_curve(seed)
    n, d = X.shape
    attention = chain[0]
    J = attention.jacobian(EnclosedAttention(attention.target, X))
    columns = column_block_norms(J.to_enclosure(), n)
    centre = chain_forward(chain, X[None])[-1][0]
    rng = np.random.default_rng(seed)
    dense = np.zeros((n * d, n * d))
    for j in range(n * d):   # DA(X) by central differences: its top singular directions
        e = np.zeros(n * d)
        e[j] = 1e-6
        dense[j] = (chain_forward(chain, (X + e.reshape(n, d))[None])[-1][0]
                    - chain_forward(chain, (X - e.reshape(n, d))[None])[-1][0]).ravel() / 2e-6
    top = np.linalg.svd(dense)[0][:, 0].reshape(n, d)
    for point in curve.points:
        bound = token_reach(columns, point.remainder, 1.0, point.eps)
        assert np.all(np.isfinite(bound))
        assert point.eps > 1e-3 or np.min(bound) < point.reach
        directions = [top, -top] + [rng.standard_normal((n, d)) for _ in range(8)]
        for E in directions:
            scale = point.eps / np.linalg.norm(E) * (1.0 if rng.random() < 0.7 else rng.random())
            moved = np.linalg.norm(chain_forward(chain, (X + scale * E)[None])[-1][0] - centre, axis=-1)
            assert np.all(moved <= bound * (1 + 1e-9) + 1e-12)


@ATTENTION_GROUP
@settings(max_examples=1, deadline=None)   # (a generated block's curve: seconds per example)
@given(seed=st.integers(0, 10_000))
def test_each_token_pays_its_own_taylor_remainder(seed):
    """Lemma curvature-per-query: on the Frobenius ball U(X, eps), ``||(A(Y) - A(X) - DA(X)(Y - X))_i||`` (the linear
    part by central differences of the chain's own forward) at random points of U, on its sphere and along an ascent on
    token i's remainder never exceeds the point's ``token_remainders[i]``, and some token's bound is below the whole
    output's remainder (the bound reads only query i's rows)."""
    X, chain, curve = _first_attention_curve(seed)
    n, d = X.shape
    centre = chain_forward(chain, X[None])[-1][0]
    rng = np.random.default_rng(seed)

    def rest(E):   # token by token, (n,)
        step = 1e-6 * np.linalg.norm(E) ** -1
        linear = (chain_forward(chain, (X + step * E)[None])[-1][0]
                  - chain_forward(chain, (X - step * E)[None])[-1][0]) / (2 * step)
        return np.linalg.norm(chain_forward(chain, (X + E)[None])[-1][0] - centre - linear, axis=-1)

    for point in curve.points:
        bounds = np.array(point.token_remainders)
        assert bounds.shape == (n,) and np.all(np.isfinite(bounds))
        assert np.min(bounds) < point.remainder
        worst = np.zeros(n)
        for _ in range(12):
            E = rng.standard_normal((n, d))
            E *= point.eps / np.linalg.norm(E) * (1.0 if rng.random() < 0.7 else rng.random())
            worst = np.maximum(worst, rest(E))
        for i in range(n):   # coordinate ascent on token i's remainder over the sphere
            E = rng.standard_normal((n, d))
            E *= point.eps / np.linalg.norm(E)
            for _ in range(15):
                trial = E + 0.3 * point.eps * rng.standard_normal((n, d)) / np.sqrt(n * d)
                trial *= point.eps / np.linalg.norm(trial)
                if rest(trial)[i] > rest(E)[i]:
                    E = trial
            worst[i] = max(worst[i], rest(E)[i])
        assert np.all(worst <= bounds * (1 + 1e-6) + 1e-9)


@settings(max_examples=1, deadline=None)   # (a generated block's curve: seconds per example)
@given(seed=st.integers(0, 10_000))
def test_the_weighted_block_reach_holds_on_the_ball(seed):
    """Lemma block-reach-weighted: every value of :func:`~lipbound.local.tail.weighted_tail_reach` a block's curve
    forms is at least ``||F(Y) - F(X)||_F`` at random points of U, on its sphere, along the top singular directions of
    DF(X) and along an ascent on the movement; it is finite at both radii."""
    from lipbound.local import curve as module
    from lipbound.local.tail import weighted_tail_reach
    generated = local_models.model(seed=seed % 50, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2, 9])[0]
    chain = chain_for(generated, "block", 0)
    formed = []
    original = module._weighted_reach

    def recorded(tail, omegas, jacobian, columns, attention, hood, other):   # the lemma's value, not screened
        bound = weighted_tail_reach(tail.taus, omegas, jacobian, 1.0, hood.eps, attention.remainder,
                                    attention.token_remainders)
        screened = original(tail, omegas, jacobian, columns, attention, hood, other)
        assert screened == bound or (screened == np.inf and bound >= other * (1 - 1e-6))
        formed.append((hood.eps, bound))
        return screened

    module._weighted_reach = recorded
    try:
        lipschitz_curve(generated, X, kind="block", layer=0, eps=[1e-3, 0.2], ascent_steps=0)
    finally:
        module._weighted_reach = original
    assert len(formed) == 2 and all(np.isfinite(bound) for _, bound in formed)
    centre = chain_forward(chain, X[None])[-1][0]
    _, top, _ = top_singular(chain, X, np.ones(X.shape[0], dtype=bool), None, 0)
    rng = np.random.default_rng(seed)

    def moved(E):
        return np.linalg.norm(chain_forward(chain, (X + E)[None])[-1][0] - centre)

    for eps, bound in formed:
        directions = [top, -top] + [rng.standard_normal(X.shape) for _ in range(8)]
        worst = max(moved(eps * E / np.linalg.norm(E) * (1.0 if k < 4 else rng.random()))
                    for k, E in enumerate(directions))
        E = eps * top / np.linalg.norm(top)
        for _ in range(20):   # a random ascent on the movement over the sphere
            trial = E + 0.3 * eps * rng.standard_normal(X.shape) / np.sqrt(X.size)
            trial *= eps / np.linalg.norm(trial)
            E = trial if moved(trial) > moved(E) else E
        worst = max(worst, moved(E))
        assert worst <= bound * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("centred", [True, False])
def test_each_query_bounds_its_row_of_the_second_derivative(centred, monkeypatch):
    """Lemma curvature-per-query, both forms of the second group (the score changes centred at X's weights, and
    read as one where those parts are not formed): output token i's row of ``D^2A(Y)[e, e]`` (second differences of
    the chain's own forward) at random points Y of the token balls, along a random ascent on unit e for each token,
    never exceeds ``chi_i`` on those balls (on these models the ascent comes within about 2-4 of it)."""
    from lipbound.local import curvature as module
    from lipbound.local.balls import Neighbourhood
    from lipbound.local.centre import ChainCentre
    from lipbound.local.curve import _CurvatureRoute
    if not centred:
        monkeypatch.setattr(module, "JOINT_ENTRIES", 0)
    generated = local_models.model(seed=11, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2, 9])[0]
    n, d = X.shape
    chain = chain_for(generated, "block", 0)[:1]
    radius = 1e-3
    route = _CurvatureRoute.of(chain, ChainCentre(chain, X, dense=False), X, [Neighbourhood("fro", radius)], 20, True)
    chi = route.integral.query_integral([(1.0, np.full(n, radius))], 1.0)   # one step of width 1: chi_i itself
    assert chi.shape == (n,) and np.all(np.isfinite(chi))
    rng = np.random.default_rng(5)

    def second(Y, e, step=1e-3):   # ||D^2A(Y)[e, e]_i|| per token
        rows = [chain_forward(chain, Z[None])[-1][0] for Z in (Y + step * e, Y, Y - step * e)]
        return np.linalg.norm((rows[0] - 2 * rows[1] + rows[2]) / step ** 2, axis=-1)

    for i in range(n):
        shift = rng.standard_normal((n, d))
        Y = X + shift / np.linalg.norm(shift, axis=1, keepdims=True) * radius * rng.random((n, 1)) * (i % 2)
        e = rng.standard_normal((n, d))
        e /= np.linalg.norm(e)
        found = current = second(Y, e)
        for _ in range(150):
            trial = e + 0.2 * rng.standard_normal((n, d)) / np.sqrt(n * d)
            trial /= np.linalg.norm(trial)
            values = second(Y, trial)
            found = np.maximum(found, values)
            if values[i] > current[i]:
                e, current = trial, values
        assert np.all(found <= chi * (1 + 1e-4) + 1e-5)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([1e-3, 3e-2, 0.3, 1.0]))
def test_feedforward_bounds_on_the_folded_reach_hold(seed, eps):
    """Lemma feedforward-folded-reach: at points z of token i's ball after the attention (random, on the sphere,
    and along J_1(x)'s top directions), every pre-activation of y_2 = LN_1(z) moves by at most c_k, and the
    feed-forward Jacobian's norm, change and change seen through J_1(x) (float, from the formula) stay within the
    certified M_F, V_F and K."""
    generated = local_models.model(seed=seed % 50, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    chain, centre, tail, (M, V, N, radii, rounding) = _tail_setting(generated, X, eps)
    item, rng, h = generated.layer(0), np.random.default_rng(seed), 1e-6
    W_1 = item.ffn.W_1
    for i in range(X.shape[0]):
        x, x_2 = centre.points[1][i], centre.points[2][i]
        delta = V[1][i, i] * radii[1][i] * (1 + 1e-9) + rounding[2][i]
        reach = tail.folded.reach(i, radii[1][i], delta, radii[2][i])
        found = tail.folded.bounds(i, radii[1][i], delta, radii[2][i])
        J_1 = np.stack([(item.ln_out(x + h * e) - item.ln_out(x - h * e)) / (2 * h) for e in np.eye(x.size)])
        at_centre = _ffn_jacobian(item.ffn, x_2)
        directions = [rng.standard_normal(x.size) for _ in range(10)] + list(np.linalg.svd(J_1)[0].T[:2])
        for e in directions:
            z = x + radii[1][i] * e / np.linalg.norm(e) * (1.0 if rng.random() < 0.7 else rng.random())
            y_2 = item.ln_out(z)
            assert np.all(np.abs((y_2 - x_2) @ W_1) <= reach * (1 + 1e-9) + 1e-12)
            moved = _ffn_jacobian(item.ffn, y_2)
            assert np.linalg.norm(moved, 2) <= found["lipschitz"] * (1 + 1e-9)
            assert np.linalg.norm(moved - at_centre, 2) <= found["variation"] * (1 + 1e-9) + 1e-12
            assert np.linalg.norm(J_1 @ (moved - at_centre), 2) <= found["change"] * (1 + 1e-6) + 1e-9


@pytest.mark.parametrize("size", [7, 300])
def test_level_less_and_the_mirrored_triangle_are_the_whole_forms(size):
    """The certified top eigenvalue's ``level I - S`` and its mirrored triangle (``Enclosure.sym``, by panels of
    rows from 256 rows on) are the whole-matrix forms' own floats, signed zeros included; the panels' symmetry test
    is the whole one's."""
    from lipbound.rigorous.linalg import Enclosure, _is_symmetric, _level_less
    rng = np.random.default_rng(0)
    S = Enclosure(rng.standard_normal((size, size)), 1e-3 * rng.random((size, size)))
    S.mid[::3, ::2] = -0.0
    direct, difference = _level_less(2.5, S), Enclosure.exact(2.5 * np.eye(size)) - S
    assert np.array_equal(direct.mid, difference.mid) and np.array_equal(direct.rad, difference.rad)
    mirrored = S.sym()   # the upper triangle mirrored, added in place
    for mine, whole in ((mirrored.mid, S.mid), (mirrored.rad, S.rad)):
        expected = np.triu(whole) + np.triu(whole, 1).T
        assert np.array_equal(mine, expected) and np.array_equal(np.signbit(mine), np.signbit(expected))
    assert mirrored.sym() is mirrored and _is_symmetric(mirrored.mid) and not _is_symmetric(S.mid)
    almost = mirrored.mid.copy()
    almost[size - 1, size - 2] += 1.0   # one entry off, in the last panel
    assert _is_symmetric(almost) == np.array_equal(almost, almost.T) == False   # noqa: E712



@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), width=st.sampled_from([5, 12, 40]), rows=st.sampled_from([(6, 6), (4, 9)]))
def test_trilinear_norm_is_the_smaller_of_both_sides_formed(seed, width, rows):
    """``trilinear_norm`` is the same float as the smaller of both sides formed: the side it leaves is certified to
    lose by a Rayleigh quotient."""
    from lipbound.local import enclosed as module
    from lipbound.rigorous.arrays import IntervalArray
    rng = np.random.default_rng(seed)
    (d, e), m = rows, width

    def box(shape):
        mid = rng.standard_normal(shape)
        return IntervalArray(mid - 1e-8, mid + 1e-8)
    A, B, E, g = box((d, m)), box((m, e)), box((e, m)), box((m,))
    e_gram = E.swapaxes(0, 1).bmm(E)
    both = min(module._sandwich_top(outer * g.expand(0), gram) for outer, gram in
               zip((A, B.swapaxes(0, 1)), (e_gram * B.bmm(B.swapaxes(0, 1)), e_gram * A.swapaxes(0, 1).bmm(A))))
    assert module.trilinear_norm(g, A, B, e_gram) == IntervalArray(max(both, 0.0)).sqrt().hi.item()


def test_trilinear_norm_forms_one_side_on_real_weights(monkeypatch):
    """On a real feed-forward block the two sides differ by far: the second derivative's norm forms one."""
    from lipbound.local import enclosed as module
    formed = []
    monkeypatch.setattr(module, "_sandwich_top", lambda *side: formed.append(side) or module.lambda_max_upper(
        side[0].bmm(side[1]).bmm(side[0].swapaxes(0, 1)).to_enclosure()))
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat slept."))[0][:1]
    ffn = EnclosedFeedForward(chain_for(bert.model, "block", 0)[2].target, X)
    assert ffn.curvature_norms()[0] > 0 and len(formed) == 1


@pytest.mark.parametrize("budget", [0, 1, None])
def test_the_tails_grams_kept_or_formed_again_give_the_same_omegas(budget, monkeypatch):
    """The slopes' quadratic remainder reads each token's ``A^T A`` and ``B B^T`` kept from the set-up while they fit
    ``KEPT_GRAM_BYTES`` (none, the first token's only, or all) or formed again: the same floats."""
    from lipbound.local import tail as module
    generated = local_models.model(seed=3, layers=1)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    _, _, whole, setting = _tail_setting(generated, X, 3e-2)
    assert all("a_gram" in fact for fact in whole._facts)
    size = sum(whole._facts[0][key].lo.nbytes + whole._facts[0][key].hi.nbytes for key in ("a_gram", "b_gram"))
    monkeypatch.setattr(module, "KEPT_GRAM_BYTES", 0 if budget == 0 else size if budget == 1 else 10 ** 12)
    _, _, tail, setting = _tail_setting(generated, X, 3e-2)
    assert sum("a_gram" in fact for fact in tail._facts) == (0 if budget == 0 else 1 if budget == 1 else X.shape[0])
    refined = []
    original = module.BlockTail.quadratic_remainder
    monkeypatch.setattr(module.BlockTail, "quadratic_remainder",
                        lambda self, *args: refined.append(args) or original(self, *args))
    for ours, theirs in zip(tail.omega_tokens(*setting), whole.omega_tokens(*setting)):
        assert np.array_equal(ours, theirs)
    assert refined   # (the remainders were refined: the grams were read)
