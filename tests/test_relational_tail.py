"""A block's per-token maps carried on the attention's Taylor set (lipbound/local/relational_tail.py): the sets' token
radii and the block's reach hold at sampled points of U and at points found by ascent, pushed through the float
block; the form steps hold at points of their own input sets; dropping the feed-forward remainder fails."""

from __future__ import annotations

import local_models
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf

from lipbound.local import feedforward_taylor, relational_tail
from lipbound.local.centre import ChainCentre
from lipbound.local.chains import chain_for, chain_forward, chain_vjp
from lipbound.local.curvature import CURVATURE_TOKENS
from lipbound.local.curve import _curve
from lipbound.local.relational_tail import TokenForms, block_form_radii, gelu_curvature_ceiling
from lipbound.numeric.forward import hidden_states
from lipbound.rigorous.arrays import IntervalArray
from lipbound.rigorous.zonotope import AffineForm


def _setting(seed: int, eps: float, scale: float = 1.0):
    """A generated one-layer model, X, the block's chain and centre, and the attention's Taylor remainders on the
    Frobenius ball of radius eps (as the block's curve forms them)."""
    generated = local_models.model(seed=seed % 50, layers=1, scale=scale)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    chain = chain_for(generated, "block", 0)
    centre = ChainCentre(chain, X, True, keep=(1,))
    attention = _curve(generated, X, "layer", 0, None, None, "fro", "fro", (), [eps], 0, 0, CURVATURE_TOKENS, None,
                       chain=chain[:1], centre=centre.part(chain, 0, 1, True), want_reach=True)
    point = attention.points[0]
    rests = np.minimum(point.remainder, point.token_remainders) if point.token_remainders else point.remainder
    return chain, X, centre, rests


def _stage_movements(chain, X, centre, Y):
    """Per stage k = 1..4, each token's distance to the chain's float point there, and the output's Frobenius
    distance to the float output."""
    states = chain_forward(chain, Y[None])
    per_token = [np.linalg.norm(states[k][0] - centre.points[k], axis=-1) for k in range(1, 5)]
    return per_token, np.linalg.norm(states[4][0] - chain_forward(chain, X[None])[4][0])


def _ascent_points(chain, X, eps, rng, stage: int, token: int, steps: int = 25):
    """Points of the Frobenius ball that climb token ``token``'s movement at stage ``stage`` (float)."""
    sub = chain[:stage]
    base = chain_forward(sub, X[None])[-1][0]
    E = rng.standard_normal(X.shape)
    E *= eps / np.linalg.norm(E)
    step = 0.3 * eps
    for _ in range(steps):
        states = chain_forward(sub, (X + E)[None])
        diff = states[-1][0] - base
        G = np.zeros_like(diff)
        G[token] = diff[token] / max(np.linalg.norm(diff[token]), 1e-300)
        g = chain_vjp(states, G[None])[0]
        E = E + step * g / (np.linalg.norm(g) + 1e-300)
        E *= eps / np.linalg.norm(E)
        step *= 0.9
    return X + E


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([1e-3, 3e-2, 0.3]), scale=st.sampled_from([1.0, 2.0]))
def test_token_forms_hold_at_sampled_and_ascent_points(seed, eps, scale):
    """Every stage's token radii bound each token's movement about the chain's float point, and the reach the whole
    output's, at random points of U (on the sphere and inside) and at points that climb one token's movement."""
    chain, X, centre, rests = _setting(seed, eps, scale)
    radii, reach = block_form_radii(chain, centre, centre.prefix_jacobian[1], eps, rests)
    rng = np.random.default_rng(seed)
    points = []
    for _ in range(16):
        E = rng.standard_normal(X.shape)
        points.append(X + eps * E / np.linalg.norm(E) * (1.0 if rng.random() < 0.7 else rng.random()))
    points += [_ascent_points(chain, X, eps, rng, stage, int(rng.integers(X.shape[0]))) for stage in (2, 3, 4)]
    for Y in points:
        per_token, whole = _stage_movements(chain, X, centre, Y)
        for k in range(4):
            assert np.all(per_token[k] <= radii[k] * (1 + 1e-9) + 1e-12)
        assert whole <= reach * (1 + 1e-9) + 1e-12


def _forms_about(Y, scale: float, rng, symbols: int = 12) -> TokenForms:
    """Rows ``e G_i`` (random generators of norm about ``scale``) about the float point Y, no balls."""
    from lipbound.rigorous.zonotope import Symbols
    n, d = Y.shape
    shared = Symbols()
    generators = [scale * rng.standard_normal((symbols, d)) / np.sqrt(symbols) for _ in range(n)]
    rows = tuple(AffineForm.generated(IntervalArray(np.zeros(d)), IntervalArray(G), shared) for G in generators)
    return TokenForms(rows, np.zeros(n))


def _escape(step_map, forms: TokenForms, Y, after, out: TokenForms, rng, samples: int = 200) -> float:
    """The largest ``||g(x_i) - after_i - f_i(e)|| - (||err_i|| + b_i)`` over sampled unit e (x_i = Y_i + e G_i): at
    most 0 where the step's set holds the map's values."""
    worst = -np.inf
    for _ in range(samples):
        e = rng.standard_normal(forms.rows[0].l2.shape[0])
        e /= np.linalg.norm(e) if rng.random() < 0.7 else np.linalg.norm(e) / rng.random()
        x = np.stack([Y[i] + row.center + e @ row.l2 for i, row in enumerate(forms.rows)])
        value = step_map(x)
        for i, row in enumerate(out.rows):
            gap = np.linalg.norm(value[i] - after[i] - row.center - e @ row.l2)
            worst = max(worst, gap - (np.linalg.norm(row.err) + out.balls[i]))
    return worst


def _generated_block(seed: int):
    """The block chain of a generated one-layer model and its centre at a four-token sentence."""
    generated = local_models.model(seed=seed, layers=1, scale=2.0)
    chain = chain_for(generated, "block", 0)
    return chain, ChainCentre(chain, hidden_states(generated, [1, 5, 7, 2])[0], False)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.05, 0.5, 2.0]))
def test_each_step_holds_the_maps_values(seed, scale):
    """The LayerNorm and feed-forward steps: at sampled points of the input set, the map's value lies in the output
    form (evaluated at the same symbols) plus its ball."""
    chain, centre = _generated_block(seed % 50)
    rng = np.random.default_rng(seed)
    for k, step in ((1, TokenForms.norm_step), (2, TokenForms.feedforward_step), (3, TokenForms.norm_step)):
        Y = centre.points[k]
        forms = _forms_about(Y, scale, rng)
        out = step(forms, centre.enclosed[k], centre.points[k + 1])
        if not np.all(np.isfinite(out.balls)):
            continue
        assert _escape(lambda x: chain[k].step.linearize(x[None], None).F[0], forms, Y, centre.points[k + 1], out,
                       rng) <= 1e-9


def test_dropping_a_remainder_fails(monkeypatch):
    """Mutations: without the feed-forward block's second-order remainder, or without the LayerNorm's variation,
    sampled points leave the step's set."""
    chain, centre = _generated_block(3)
    rng = np.random.default_rng(0)
    monkeypatch.setattr(relational_tail, "feedforward_remainder", lambda *args: 0.0)
    forms = _forms_about(centre.points[2], 2.0, rng)
    out = forms.feedforward_step(centre.enclosed[2], centre.points[3])
    assert _escape(lambda x: chain[2].step.linearize(x[None], None).F[0], forms, centre.points[2], centre.points[3],
                   out, rng) > 0
    monkeypatch.setattr(relational_tail, "norm_bounds", lambda *args: _no_variation(*args))
    forms = _forms_about(centre.points[1], 2.0, rng)
    out = forms.norm_step(centre.enclosed[1], centre.points[2])
    assert _escape(lambda x: chain[1].step.linearize(x[None], None).F[0], forms, centre.points[1], centre.points[2],
                   out, rng) > 0


def _no_variation(norm, balls, enclosed):
    from lipbound.local.bounds import norm_bounds
    found = norm_bounds(norm, balls, enclosed)
    return type(found)(found.movement, found.blocks, 0 * found.variation, found.at_center, found.output, found.facts)


def test_gelu_curvature_ceiling_holds_on_a_grid():
    """``|GELU''| = phi(x) |2 - x^2|`` stays below the ceiling, which is within 1e-12 of its value at 0."""
    x = np.linspace(-12.0, 12.0, 200_001)
    curvature = np.exp(-x * x / 2) / np.sqrt(2 * np.pi) * np.abs(2 - x * x)
    assert np.max(curvature) <= gelu_curvature_ceiling()
    assert gelu_curvature_ceiling() == pytest.approx(2 / np.sqrt(2 * np.pi), rel=1e-12)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), symbols=st.sampled_from([1, 5, 40]), shape=st.sampled_from([(3,), (2, 4)]))
def test_generated_form_and_its_radius_hold_sampled_points(seed, symbols, shape):
    """``AffineForm.generated`` holds ``c + e G`` for unit e (enclosed generators: their radii in ``err``), and
    ``radius`` bounds ``||x - c||`` over the whole form; on exact generators it is their operator norm (within the
    certified norm's margin)."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((symbols,) + shape)
    c = rng.standard_normal(shape)
    form = AffineForm.generated(IntervalArray.around(c, 1e-3 * np.ones(shape)),
                                IntervalArray.around(G, 1e-3 * np.abs(G)))
    exact = AffineForm.generated(IntervalArray(c), IntervalArray(G))
    operator = np.linalg.norm(G.reshape(symbols, -1), 2)
    assert operator <= exact.radius() <= operator * (1 + 1e-5)
    for _ in range(50):
        e = rng.standard_normal(symbols)
        e /= np.linalg.norm(e)
        true_G = G * (1 + 1e-3 * rng.uniform(-1, 1, G.shape))
        x = c + 1e-3 * rng.uniform(-1, 1, shape) + np.tensordot(e, true_G, axes=1)
        assert np.all(np.abs(x - form.center - np.tensordot(e, form.l2, axes=1)) <= form.err * (1 + 1e-12))
        assert np.linalg.norm(x - form.center) <= form.radius() * (1 + 1e-12)


def _remainder_escape(enclosed, Y, forms: TokenForms, bound, rng, samples: int = 300) -> float:
    """The largest ``||FF(x) - FF(y) - (x - y) DFF(y)|| - bound(i)`` over sampled ``x_i = y_i + c_i + e G_i + u`` (unit
    or shorter e, ``||u|| <= b_i``; plus ``z_i N_i`` with unit or shorter ``z_i`` where the set carries balls), y the
    float point of ``enclosed``: at most 0 where ``bound`` holds."""
    from lipbound.numeric.model import FeedForward
    ffn: FeedForward = enclosed.ffn
    step = lambda x: x + ffn(x)   # noqa: E731  (the residual feed-forward block in floats)
    h = Y @ ffn.W_1 + ffn.b_1
    slope = 0.5 * (1 + erf(h / np.sqrt(2))) + h * np.exp(-h * h / 2) / np.sqrt(2 * np.pi)
    worst = -np.inf
    bounds = [bound(i) for i in range(Y.shape[0])]
    for _ in range(samples):
        e = rng.standard_normal(forms.rows[0].l2.shape[0])
        e /= np.linalg.norm(e) if rng.random() < 0.7 else np.linalg.norm(e) / rng.random()
        for i, row in enumerate(forms.rows):
            u = rng.standard_normal(Y.shape[1])
            u *= forms.balls[i] / np.linalg.norm(u) * (1.0 if rng.random() < 0.7 else rng.random())
            delta = row.center + e @ row.l2 + u
            for part in forms.shape(i):
                delta = delta + part.center + _unit_or_shorter(rng, part.l2.shape[0]) @ part.l2
            linear = delta + ((delta @ ffn.W_1) * slope[i]) @ ffn.W_2
            gap = np.linalg.norm(step(Y[i] + delta) - step(Y[i]) - linear)
            worst = max(worst, gap - bounds[i])
    return worst


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.05, 0.5, 2.0]), ball=st.sampled_from([0.0, 0.02, 0.5]),
       carried=st.sampled_from([0.0, 0.5]))
def test_signed_feedforward_remainder_holds_sampled_points(seed, scale, ball, carried):
    """Lemma feedforward-taylor-signed alone (and the smaller of both bounds): on generated blocks, the feed-forward
    block's Taylor remainder at sampled points of a token's form plus ball (and carried ball) stays below it."""
    chain, centre = _generated_block(seed % 50)
    rng = np.random.default_rng(seed)
    Y, enclosed = centre.points[2], centre.enclosed[2]
    forms = _carried_about(Y, scale, carried, rng) if carried else _forms_about(Y, scale, rng)
    forms = TokenForms(forms.rows, np.full(len(forms.rows), ball), forms.shapes)

    def signed(i):
        parts = feedforward_taylor._remainder_parts(enclosed, i, forms.rows[i], ball, None, forms.shape(i))
        return feedforward_taylor.signed_remainder(*parts)

    def smaller(i):
        return feedforward_taylor.feedforward_remainder(enclosed, i, forms.rows[i], ball, None, forms.shape(i))
    assert _remainder_escape(enclosed, Y, forms, signed, rng) <= 1e-12
    assert _remainder_escape(enclosed, Y, forms, smaller, rng) <= 1e-12


def _one_neuron(at: float):
    """A feed-forward block of one neuron (d = 2) whose pre-activation at y = 0 is ``at``, enclosed at y, and a form
    that moves that neuron by up to 0.6."""
    from lipbound.local.enclosed import EnclosedFeedForward
    from lipbound.numeric.model import FeedForward
    from lipbound.rigorous.zonotope import Symbols
    ffn = FeedForward(np.array([[1.0], [0.0]]), np.array([at]), np.array([[1.0, 0.0]]), np.zeros(2))
    Y = np.zeros((1, 2))
    row = AffineForm.generated(IntervalArray(np.zeros(2)), IntervalArray(np.array([[0.6, 0.0], [0.0, 0.3]])),
                               Symbols())
    return EnclosedFeedForward(ffn, Y), Y, TokenForms((row,), np.zeros(1))


def test_signed_remainder_mutations_fail(monkeypatch):
    """Mutations of lemma feedforward-taylor-signed: without the spread part (the Taylor quotients' spread about
    their midpoint), a neuron at GELU's curvature's zero (pre-activation 2^(1/2), where the remainder is all third
    order) leaves the bound; without the quadratic part, a
    neuron at 0 (the largest curvature) does."""
    rng = np.random.default_rng(1)

    def signed(enclosed, forms):
        return lambda i: feedforward_taylor.signed_remainder(*feedforward_taylor._remainder_parts(
            enclosed, i, forms.rows[i], 0.0))
    for at in (np.sqrt(2.0), 0.0):   # both hold as they are
        enclosed, Y, forms = _one_neuron(at)
        assert _remainder_escape(enclosed, Y, forms, signed(enclosed, forms), rng) <= 1e-12
    enclosed, Y, forms = _one_neuron(np.sqrt(2.0))
    with monkeypatch.context() as patched:
        split = feedforward_taylor.curvature_split
        patched.setattr(feedforward_taylor, "curvature_split",
                        lambda *args: (lambda g, S, M: (g, np.zeros_like(S), M))(*split(*args)))
        assert _remainder_escape(enclosed, Y, forms, signed(enclosed, forms), rng) > 0
    enclosed, Y, forms = _one_neuron(0.0)
    with monkeypatch.context() as patched:
        patched.setattr(feedforward_taylor, "_signed_part", lambda *args: (1.0, 0.0))
        assert _remainder_escape(enclosed, Y, forms, signed(enclosed, forms), rng) > 0


def _norm_gaps(chain, centre, radii, rng, samples: int = 60) -> np.ndarray:
    """Per token, the largest ``||g(x) - g(x~) - (x - x~) J||`` found for the block's first LayerNorm g at sampled
    points of ``B(x~, r)`` (on the sphere and inside), J its float Jacobian at x~."""
    Z = centre.points[1]
    g = lambda x: chain[1].step.linearize(x[None], None).F[0]   # noqa: E731
    enclosed = centre.enclosed[1]
    jacobians = [enclosed.jacobian_block(i).mid for i in range(Z.shape[0])]
    at = g(Z)
    worst = np.zeros(Z.shape[0])
    for _ in range(samples):
        delta = rng.standard_normal(Z.shape)
        delta *= (radii / np.linalg.norm(delta, axis=1) * (1.0 if rng.random() < 0.8 else rng.random()))[:, None]
        moved = g(Z + delta) - at
        worst = np.maximum(worst, [np.linalg.norm(moved[i] - delta[i] @ jacobians[i]) for i in range(Z.shape[0])])
    return worst


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), fraction=st.sampled_from([0.02, 0.3, 0.8]))
def test_norm_taylor_remainder_holds_sampled_points(seed, fraction):
    """Lemma token-form-nested for a LayerNorm: on generated blocks the remainder's bound on ``B(x~, r)`` (r a fraction
    of the centred norm) holds at sampled points, and is at most ``r V(r)``."""
    from lipbound.local.balls import TokenBalls
    from lipbound.local.bounds import norm_bounds
    chain, centre = _generated_block(seed % 50)
    enclosed = centre.enclosed[1]
    radii = fraction * enclosed.nu.lo
    bound = relational_tail.norm_taylor_remainder(enclosed, radii)
    whole = radii * np.diag(norm_bounds(enclosed.norm, TokenBalls(enclosed.Z.mid, radii), enclosed).variation)
    assert np.all(bound <= whole * (1 + 1e-12))
    assert np.all(_norm_gaps(chain, centre, radii, np.random.default_rng(seed)) <= bound)


def test_norm_taylor_remainder_needs_its_outer_balls(monkeypatch):
    """Mutation: with every nested ball's variation read on the innermost one (radius r / 8), sampled points of a
    generated LayerNorm's ball leave the bound."""
    chain, centre = _generated_block(3)
    enclosed = centre.enclosed[1]
    radii = 0.5 * enclosed.nu.lo
    original = relational_tail.norm_bounds

    def innermost(norm, balls, enclosed):
        from lipbound.local.balls import TokenBalls
        return original(norm, TokenBalls(balls.center, radii / relational_tail.NESTED_BALLS), enclosed)
    monkeypatch.setattr(relational_tail, "norm_bounds", innermost)
    bound = relational_tail.norm_taylor_remainder(enclosed, radii)
    assert np.any(_norm_gaps(chain, centre, radii, np.random.default_rng(0)) > bound)


def test_feedforward_remainders_only_where_the_set_wins():
    """Given the chain's balls before the feed-forward block, the sets form the feed-forward remainder only for the
    tokens whose set there is smaller: the others' radii after it are inf, the rest as without the chain's balls."""
    chain, X, centre, rests = _setting(7, 3e-2)
    radii, _ = block_form_radii(chain, centre, centre.prefix_jacobian[1], 3e-2, rests)
    forms = relational_tail.BlockForms(chain, centre, centre.prefix_jacobian[1], 3e-2, rests)
    chained = radii[1] * 2.0
    chained[0] = radii[1][0]                                  # token 0's set is not below its chained ball
    gated = [forms.next_radii(), forms.next_radii(chained), forms.next_radii()]
    assert np.array_equal(gated[1], radii[1])
    assert gated[2][0] == np.inf and np.array_equal(gated[2][1:], radii[2][1:])


def test_feedforward_remainders_skipped_only_where_no_set_can_win(monkeypatch):
    """Given the chain's balls after the feed-forward block, the remainders are not formed (every radius inf) where
    no token's set there can be below them by its remainder's floor; where one token's can, its certified remainder is
    formed first, and the others' only where its set wins (then every set is as without the chain's balls)."""
    chain, X, centre, rests = _setting(7, 3e-2)
    radii, _ = block_form_radii(chain, centre, centre.prefix_jacobian[1], 3e-2, rests)
    calls = []
    original = relational_tail.feedforward_remainder

    def counted(*args, **kwargs):
        calls.append(args[1])
        return original(*args, **kwargs)
    monkeypatch.setattr(relational_tail, "feedforward_remainder", counted)

    def third(ceiling):
        forms = relational_tail.BlockForms(chain, centre, centre.prefix_jacobian[1], 3e-2, rests)
        return [forms.next_radii(), forms.next_radii(), forms.next_radii(ceiling)][2]
    one = np.zeros_like(radii[2])
    one[1] = radii[2][1] * 1.5                               # token 1's set is below its ball there
    assert np.array_equal(third(one), radii[2]) and len(calls) == len(one)
    calls.clear()
    assert np.all(third(np.zeros_like(radii[2])) == np.inf) and not calls
    monkeypatch.setattr(relational_tail, "feedforward_remainder",
                        lambda enclosed, i, row, ball, second=None, shape=None, kept=None:
                        feedforward_taylor.remainder_floor(enclosed, i, row, ball, shape))
    floors = third(None)                                     # the radii with the remainders' floors
    assert np.all(floors <= radii[2]) and np.any(floors < radii[2])
    monkeypatch.setattr(relational_tail, "feedforward_remainder", counted)
    calls.clear()
    assert np.all(third(floors) == np.inf) and not calls
    # token k alone may win by its floor: its certified remainder is formed first, the others' only where it wins
    k = len(one) - 1
    loses = floors.copy()
    loses[k] = (floors[k] + radii[2][k]) / 2
    assert np.all(third(loses) == np.inf) and calls == [k]
    calls.clear()
    wins = floors.copy()
    wins[k] = radii[2][k] * (1 + 1e-9)
    assert np.array_equal(third(wins), radii[2]) and calls[0] == k and sorted(calls) == list(range(len(one)))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.5, 1.0, 2.0]), eps=st.sampled_from([1e-2, 5e-2, 0.2]))
def test_the_remainder_floor_is_below_the_certified_remainder(seed, scale, eps):
    """``remainder_floor`` (float estimates from below of both lemmas' ball parts) never exceeds the certified
    ``feedforward_remainder`` on the sets before a generated block's feed-forward block, and is not 0 where the set has
    a ball."""
    chain, X, centre, rests = _setting(seed, eps, scale)
    forms = relational_tail.BlockForms(chain, centre, centre.prefix_jacobian[1], eps, rests)
    forms.next_radii()
    forms.next_radii()
    before = forms.formed[1]
    enclosed = centre.enclosed[2]
    for i, (row, ball) in enumerate(zip(before.rows, before.balls)):
        floor = feedforward_taylor.remainder_floor(enclosed, i, row, ball)
        assert 0 < floor <= feedforward_taylor.feedforward_remainder(enclosed, i, row, ball)


def _carried_about(Y, scale: float, carried: float, rng, symbols: int = 12) -> TokenForms:
    """Rows ``e G_i`` (norm about ``scale``) and carried balls ``z_i N_i`` (random N_i of norm about ``carried``, each
    token's over symbols of its own) about the float point Y."""
    forms = _forms_about(Y, scale, rng, symbols)
    n, d = Y.shape
    shapes = tuple((AffineForm.generated(IntervalArray(np.zeros(d)),
                                         IntervalArray(carried * rng.standard_normal((d, d)) / np.sqrt(d))),)
                   for _ in range(n))
    return TokenForms(forms.rows, np.zeros(n), shapes)


def _unit_or_shorter(rng, size: int) -> np.ndarray:
    z = rng.standard_normal(size)
    return z * (1.0 if rng.random() < 0.7 else rng.random()) / np.linalg.norm(z)


def _carried_escape(step_map, forms: TokenForms, Y, after, out: TokenForms, rng, samples: int = 200) -> float:
    """As :func:`_escape` with each token's own carried symbols drawn too (unit or shorter, independent); the output's
    carried balls (those of the input, then any the step adds, at extreme or inner points of their own) are read at the
    same symbols, its added ones' generators at fresh ones: the largest distance beyond the output's set."""
    worst = -np.inf
    for _ in range(samples):
        e = rng.standard_normal(forms.rows[0].l2.shape[0])
        e /= np.linalg.norm(e) if rng.random() < 0.7 else np.linalg.norm(e) / rng.random()
        z = [[_unit_or_shorter(rng, part.l2.shape[0]) for part in forms.shape(i)] for i in range(len(forms.rows))]
        x = np.stack([Y[i] + row.center + e @ row.l2 + sum(part.center + zp @ part.l2
                                                           for part, zp in zip(forms.shape(i), z[i]))
                      for i, row in enumerate(forms.rows)])
        value = step_map(x)
        for i, row in enumerate(out.rows):
            inherited = out.shape(i)[:len(z[i])]
            rest = value[i] - after[i] - row.center - e @ row.l2 - sum(part.center + zp @ part.l2
                                                                       for part, zp in zip(inherited, z[i]))
            # the step's own carried balls: the distance from rest to their set, bounded by a projection onto it
            slack = np.linalg.norm(row.err) + sum(np.linalg.norm(part.err) for part in out.shape(i)) + out.balls[i]
            for part in out.shape(i)[len(z[i]):]:
                rest = rest - part.center
                coefficients = np.linalg.lstsq(part.l2.T, rest, rcond=None)[0]
                if not np.all(np.isfinite(coefficients)):   # (generators about 0: any point of the set will do)
                    coefficients = np.zeros_like(coefficients)
                if np.linalg.norm(coefficients) > 1:
                    coefficients /= np.linalg.norm(coefficients)
                rest = rest - coefficients @ part.l2
            worst = max(worst, np.linalg.norm(rest) - slack)
    return worst


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.05, 0.5]), carried=st.sampled_from([0.1, 1.0]))
def test_carried_balls_hold_the_maps_values(seed, scale, carried):
    """Lemma token-form-carried: the LayerNorm and feed-forward steps on sets with carried balls hold the map's values
    at sampled points (rows and each token's own carried symbols drawn together), the carried balls taking the steps'
    linear maps; the token radii hold every sampled point."""
    chain, centre = _generated_block(seed % 50)
    rng = np.random.default_rng(seed)
    for k, step in ((1, TokenForms.norm_step), (2, TokenForms.feedforward_step), (3, TokenForms.norm_step)):
        Y = centre.points[k]
        forms = _carried_about(Y, scale, carried, rng)
        out = step(forms, centre.enclosed[k], centre.points[k + 1])
        if not np.all(np.isfinite(out.balls)):
            continue
        assert len(out.shapes) == len(forms.shapes)
        assert _carried_escape(lambda x: chain[k].step.linearize(x[None], None).F[0], forms, Y, centre.points[k + 1],
                               out, rng) <= 1e-9


def _step_escape(k: int, step, scale: float, carried: float) -> float:
    """How far sampled points of a set with a carried ball (:func:`_carried_about`, about the block's centre point k of
    a generated model) leave the set that ``step`` maps it to."""
    chain, centre = _generated_block(3)
    Y, rng = centre.points[k], np.random.default_rng(0)
    forms = _carried_about(Y, scale, carried, rng)
    out = step(forms, centre.enclosed[k], centre.points[k + 1])
    return _carried_escape(lambda x: chain[k].step.linearize(x[None], None).F[0], forms, Y, centre.points[k + 1], out,
                           rng)


def test_dropping_the_carried_ball_fails(monkeypatch):
    """Mutation: a feed-forward remainder that forgets the carried ball (its columns and rows zero, as if the set were
    the rows alone) lets sampled points leave the step's set."""
    assert _step_escape(2, TokenForms.feedforward_step, 0.05, 2.0) <= 1e-9
    monkeypatch.setattr(feedforward_taylor, "_carried_ball",
                        lambda shape, ffn: feedforward_taylor.CarriedBall((), (), np.zeros(ffn.W_1.shape[1])))
    assert _step_escape(2, TokenForms.feedforward_step, 0.05, 2.0) > 0


def test_signed_remainder_reads_the_carried_ball(monkeypatch):
    """Lemma feedforward-taylor-signed with a carried ball (its symbols a third part of the quadratic form): a neuron at
    0 (the largest curvature) moved mostly by the carried ball stays below the bound; with the carried ball's Gram
    term dropped from K, sampled points leave it."""
    from lipbound.rigorous.zonotope import Symbols
    enclosed, Y, _ = _one_neuron(0.0)
    row = AffineForm.generated(IntervalArray(np.zeros(2)), IntervalArray(np.array([[0.01, 0.0]])), Symbols())
    shape = AffineForm.generated(IntervalArray(np.zeros(2)), IntervalArray(np.array([[0.6, 0.0], [0.0, 0.3]])))
    forms = TokenForms((row,), np.zeros(1), ((shape,),))

    def signed(i):
        return feedforward_taylor.signed_remainder(*feedforward_taylor._remainder_parts(enclosed, i, forms.rows[i], 0.0,
                                                                                  None, forms.shape(i)))
    rng = np.random.default_rng(2)
    assert _remainder_escape(enclosed, Y, forms, signed, rng) <= 1e-12
    original = feedforward_taylor._signed_gram
    monkeypatch.setattr(feedforward_taylor, "_signed_gram",
                        lambda ffn, a_gram, beta, carried: original(ffn, a_gram, beta, None))
    assert _remainder_escape(enclosed, Y, forms, signed, rng) > 0


def test_dropping_the_norms_carried_remainder_fails(monkeypatch):
    """Mutation: a LayerNorm step whose carried Taylor remainder (the ball ``rho diag(gamma)``) is zero lets sampled
    points leave the step's set."""
    assert _step_escape(1, TokenForms.norm_step, 0.5, 1.0) <= 1e-9
    monkeypatch.setattr(relational_tail, "norm_taylor_remainder",
                        lambda enclosed, radii, floors=None: np.zeros(len(radii)))
    assert _step_escape(1, TokenForms.norm_step, 0.5, 1.0) > 0


def _outlier_block(seed: int):
    """A feed-forward block (d = 4, 64 neurons) whose neuron 0 is an outlier (its row of W_2 40 times the others', its
    column of W_1 3 times) at GELU's largest curvature (pre-activation 0 at y = 0), enclosed at y = 0, and a token form
    that moves the block's input by up to 0.5."""
    from lipbound.local.enclosed import EnclosedFeedForward
    from lipbound.numeric.model import FeedForward
    from lipbound.rigorous.zonotope import Symbols
    rng = np.random.default_rng(seed)
    W_1, W_2 = rng.standard_normal((4, 64)) / 2, rng.standard_normal((64, 4)) / 2
    W_1[:, 0] *= 3.0 / np.linalg.norm(W_1[:, 0])
    W_2[0] *= 40.0 / np.linalg.norm(W_2[0])
    b_1 = rng.standard_normal(64)
    b_1[0] = 0.0
    ffn = FeedForward(W_1, b_1, W_2, np.zeros(4))
    Y = np.zeros((1, 4))
    generators = 0.5 * rng.standard_normal((6, 4)) / np.sqrt(6)
    row = AffineForm.generated(IntervalArray(np.zeros(4)), IntervalArray(generators), Symbols())
    return EnclosedFeedForward(ffn, Y), Y, TokenForms((row,), np.zeros(1))


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_outlier_neurons_bounded_apart(seed):
    """Lemma feedforward-taylor-separated: an outlier neuron is found and bounded by itself; the joint and signed
    bounds with it apart hold at sampled points of the form."""
    enclosed, Y, forms = _outlier_block(seed)
    assert list(feedforward_taylor.outlier_neurons(enclosed.ffn)) == [0]
    rng = np.random.default_rng(seed)
    parts = feedforward_taylor._remainder_parts(enclosed, 0, forms.rows[0], 0.0)
    for bound in (feedforward_taylor.joint_remainder(*parts), feedforward_taylor.signed_remainder(*parts),
                  feedforward_taylor.feedforward_remainder(enclosed, 0, forms.rows[0], 0.0)):
        assert _remainder_escape(enclosed, Y, forms, lambda i: bound, rng) <= 1e-12


def test_dropping_the_separated_neurons_fails(monkeypatch):
    """Mutation: the outlier's own remainder left out (its curvature removed from the joint bound and nothing added)
    lets sampled points leave the bound."""
    enclosed, Y, forms = _outlier_block(0)
    monkeypatch.setattr(feedforward_taylor, "separated_remainder", lambda *args: 0.0)
    rng = np.random.default_rng(0)
    bound = feedforward_taylor.feedforward_remainder(enclosed, 0, forms.rows[0], 0.0)
    assert _remainder_escape(enclosed, Y, forms, lambda i: bound, rng) > 0


def _squares_ascent(N: np.ndarray, W_1: np.ndarray, W_2: np.ndarray, S: np.ndarray, rounds: int = 40) -> float:
    """The largest ``(sum_k S_k (z . N w_k)^2 (r_k . v)^2)^(1/2)`` found over unit z and v by alternating top
    eigenvectors (each step maximises one of them exactly for the other fixed): a lower bound on its supremum."""
    rows = N @ W_1                                                         # (m, d_ff): the vectors N w_k
    v = np.ones(W_2.shape[1]) / np.sqrt(W_2.shape[1])
    value = 0.0
    for _ in range(rounds):
        z = np.linalg.eigh((rows * (S * (W_2 @ v) ** 2)) @ rows.T)[1][:, -1]
        t = z @ rows
        top = np.linalg.eigh((W_2.T * (S * t * t)) @ W_2)
        v, value = top[1][:, -1], float(np.sqrt(max(top[0][-1], 0.0)))
    return value


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), width=st.sampled_from([1, 4, 12]))
def test_hadamard_term_holds_the_parts_squares(seed, width):
    """Lemma feedforward-taylor-joint's Q, a carried ball's term jointly over the neurons: ``(sum_k S_k (z . N w_k)^2
    (r_k . v)^2)^(1/2)`` found by ascent stays below the certified term; without W_2's Gram matrix in the Hadamard
    product (each ``r_k . v`` taken as 1) the ascent leaves it once the rows of W_2 are long."""
    rng = np.random.default_rng(seed)
    d, d_ff = 6, 24
    W_1, W_2 = rng.standard_normal((d, d_ff)), 3.0 * rng.standard_normal((d_ff, d))
    N, S = rng.standard_normal((width, d)), rng.uniform(0, 1, d_ff)
    rows = IntervalArray(N).matmul(W_1)
    gram = rows.swapaxes(0, 1).bmm(rows)
    b_gram = IntervalArray(W_2).bmm(IntervalArray(W_2.T))
    root = IntervalArray(S).sqrt()
    found = _squares_ascent(N, W_1, W_2, S)
    term = feedforward_taylor._hadamard_term(lambda: (gram * b_gram).mid, lambda: gram * b_gram, root, np.inf)
    assert found <= term * (1 + 1e-12)
    assert found > feedforward_taylor._hadamard_term(lambda: gram.mid, lambda: gram, root, np.inf)


def _joint_and_signed(seed: int, scale: float, carried: float, ball: float):
    """Per token of a generated block's feed-forward step on a set with rows, carried balls and a ball: the lemmas'
    parts and Taylor quotients' split, the certified joint and signed bounds, the joint one's float floor and the
    remainder :func:`feedforward_remainder` takes."""
    chain, centre = _generated_block(seed % 50)
    rng = np.random.default_rng(seed)
    Y, enclosed = centre.points[2], centre.enclosed[2]
    forms = _carried_about(Y, scale, carried, rng)
    found = []
    for i, row in enumerate(forms.rows):
        parts = feedforward_taylor._remainder_parts(enclosed, i, row, ball, None, forms.shape(i))
        split = feedforward_taylor.curvature_split(enclosed.h[i], parts[4],
                                                   feedforward_taylor.outlier_neurons(enclosed.ffn))
        found.append((feedforward_taylor.joint_remainder(*parts, split=split),
                      feedforward_taylor.signed_remainder(*parts, split=split),
                      feedforward_taylor.joint_floor(parts, split),
                      feedforward_taylor._remainder_on_parts(parts, split)))
    return found


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.05, 0.5, 2.0]), carried=st.sampled_from([0.0, 0.5]),
       ball=st.sampled_from([0.0, 0.1]))
def test_the_joint_floor_is_below_the_joint_bound_and_the_remainder_the_smaller(seed, scale, carried, ball):
    """The joint bound's float floor is at most the certified joint bound, and the remainder the certified bounds'
    order of work gives is exactly the smaller of the two lemmas' bounds (which one is certified first never changes
    the value)."""
    for joint, signed, floor, taken in _joint_and_signed(seed, scale, carried, ball):
        assert 0 <= floor <= joint * (1 + 1e-9)
        assert taken == min(joint, signed)


def test_a_joint_floor_above_the_joint_bound_changes_the_remainder(monkeypatch):
    """Mutation: a floor ten times the joint one skips the joint bound where it is the smaller (seed 3 has such a
    token), so the remainder is no longer the smaller of the two."""
    cases = _joint_and_signed(3, 0.05, 0.5, 0.1)
    assert any(joint < signed for joint, signed, _, _ in cases)
    original = feedforward_taylor.joint_floor
    monkeypatch.setattr(feedforward_taylor, "joint_floor", lambda parts, split: 10 * original(parts, split))
    assert any(taken != min(joint, signed) for joint, signed, _, taken in _joint_and_signed(3, 0.05, 0.5, 0.1))


class _Block:
    """A feed-forward block's weights alone (W_1 (d, d_ff), W_2 (d_ff, d)): what the remainders' factors read."""

    def __init__(self, W_1: np.ndarray, W_2: np.ndarray):
        self.W_1, self.W_2 = W_1, W_2


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), beta=st.sampled_from([0.0, 0.3]), rows=st.sampled_from([3, 8]))
def test_the_ball_parts_floor_takes_the_hadamard_terms_as_the_certified_q(seed, beta, rows):
    """With no form part (``A = 0``) the ball parts' float floor of ``P Q / 2`` (what :func:`remainder_floor` reads) is
    at most the certified ``P Q / 2`` of ``_joint_factors`` on a block of 96 neurons, where the certified Q takes the
    carried ball's and the ball's Hadamard terms (far below their plain terms there): the floor must take them too.
    (Mutation: the plain terms alone put the floor 20-45% above the certified product.)"""
    rng = np.random.default_rng(seed)
    d, width = 8, 96
    ffn = _Block(rng.standard_normal((d, width)), rng.standard_normal((width, d)))
    N = rng.standard_normal((rows, d))
    carried = feedforward_taylor._carried_ball((AffineForm.generated(IntervalArray(np.zeros(d)), IntervalArray(N)),),
                                               ffn)
    S = rng.random(width)
    dev = np.full(width, 1e3)   # the cheap Q (max_k D_k dev_k ||W_2||) out of the way
    columns = IntervalArray(IntervalArray(ffn.W_1).norm_upper(axis=0))
    second = float(np.linalg.norm(ffn.W_2, 2)) * 1.01
    P, Q = feedforward_taylor._joint_factors(ffn, IntervalArray(np.zeros((width, width))), columns, beta, dev, S,
                                             second, carried)
    floor = feedforward_taylor._half_product_floor(ffn, S, beta, [N @ ffn.W_1], dev)
    assert 0.5 * P * Q * 0.9 < floor <= 0.5 * P * Q


def test_the_signed_gram_is_kept_per_form_and_ball():
    """``_signed_gram`` is formed once per set's form Gram matrix and ball (the signed and directed lemmas share it),
    and a kept one is never read for another ball or form: each equals the one formed afresh."""
    rng = np.random.default_rng(5)
    d, width = 6, 40
    ffn = _Block(rng.standard_normal((d, width)), rng.standard_normal((width, d)))
    shape = (AffineForm.generated(IntervalArray(np.zeros(d)), IntervalArray(rng.standard_normal((3, d)))),)
    carried = feedforward_taylor._carried_ball(shape, ffn)
    grams = [IntervalArray(G.T @ G) for G in (rng.standard_normal((4, width)), rng.standard_normal((4, width)))]
    first = feedforward_taylor._signed_gram(ffn, grams[0], 0.5, carried)
    assert feedforward_taylor._signed_gram(ffn, grams[0], 0.5, carried)[0] is first[0]
    for a_gram, beta in ((grams[0], 0.0), (grams[0], 0.25), (grams[1], 0.5)):
        K, c = feedforward_taylor._signed_gram(ffn, a_gram, beta, carried)
        fresh, count = feedforward_taylor._signed_gram(ffn, a_gram, beta, feedforward_taylor._carried_ball(shape, ffn))
        assert c == count and np.array_equal(K.lo, fresh.lo) and np.array_equal(K.hi, fresh.hi)
