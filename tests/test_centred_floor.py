"""Lemma centred-floor (lipbound/local/relational_tail.py): the floor of a LayerNorm's centred norm on a token's set
holds at points of the set that descend the centred norm along the floor's direction, pushed through the real
feed-forward block, and at points of U that descend it through the whole float chain; a floor without the form's part
or without the feed-forward remainder's bound along its direction fails."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf
from test_relational_tail import _carried_about, _generated_block, _setting

from lipbound.errors import AssumptionError
from lipbound.local import feedforward_taylor, relational_tail
from lipbound.local.balls import TokenBalls
from lipbound.local.bounds import norm_bounds
from lipbound.local.chains import chain_forward, chain_vjp


def _centred(x: np.ndarray) -> float:
    return float(np.linalg.norm(x - np.mean(x)))


def _along(x: np.ndarray, w: np.ndarray) -> float:
    """``max(<P x, w> / ||w||, 0)``: at most ``||P x||`` (the lemma's first step), so a floor above it is a floor above
    the centred norm too, and the sharper check (the lemma bounds ``<P x, w>`` itself where its floor is positive)."""
    return max(float(np.dot(x - np.mean(x), w) / np.linalg.norm(w)), 0.0)


def _feedforward_floor_escape(seed: int, scale: float, carried: float, ball: float, steps: int = 30):
    """Feed-forward step of a generated block on a set with rows, carried balls and a ball, its sets' floors before
    the output LayerNorm, and the largest ``floor_i - max(<P x, w_i> / ||w_i||, 0)`` (at least ``floor_i - ||P
    x||``) over points x of the step's image: the real map's values at the points of the input set that minimise
    ``<w_i, FF(x)>`` (a fixed point of the linearised minimiser: every part at its extreme against ``J_F(x) w_i``), at
    sampled ones, and on the segments from the float point.
    Also the floors and ``max(nu - R, 0)`` for comparison."""
    chain, centre = _generated_block(seed % 50)
    rng = np.random.default_rng(seed)
    Y, after, enclosed = centre.points[2], centre.points[3], centre.enclosed[2]
    forms = _carried_about(Y, scale, carried, rng)
    forms = relational_tail.TokenForms(forms.rows, np.full(len(forms.rows), ball), forms.shapes)
    out = forms.feedforward_step(enclosed, after)
    floors = out.centred_floors(after)
    ffn = enclosed.ffn
    worst = -np.inf
    for i, row in enumerate(forms.rows):
        w = out.directions[i]
        parts = [row.l2] + [part.l2 for part in forms.shape(i)]
        base = Y[i] + row.center + sum(part.center for part in forms.shape(i))

        def point(symbols, u):
            return base + sum(z @ G for z, G in zip(symbols, parts)) + u

        def image(x):
            return x + ffn(x)
        starts = [([rng.standard_normal(G.shape[0]) for G in parts], rng.standard_normal(Y.shape[1]))
                  for _ in range(6)]
        for symbols, u in starts:
            symbols = [z / np.linalg.norm(z) for z in symbols]
            u = u * ball / np.linalg.norm(u)
            for _ in range(steps):   # descend <w, FF(x)> over the set
                x = point(symbols, u)
                h = x @ ffn.W_1 + ffn.b_1
                slope = 0.5 * (1 + erf(h / np.sqrt(2))) + h * np.exp(-h * h / 2) / np.sqrt(2 * np.pi)
                grad = w + ffn.W_1 @ (slope * (ffn.W_2 @ w))
                symbols = [-(G @ grad) / max(np.linalg.norm(G @ grad), 1e-300) for G in parts]
                u = -ball * grad / max(np.linalg.norm(grad), 1e-300)
            value = image(point(symbols, u))
            for s in (1.0, 0.5, 0.1):   # the segment from the float point
                worst = max(worst, floors[i] - _along(after[i] + s * (value - after[i]), w))
        for _ in range(40):
            symbols = [z / np.linalg.norm(z) * rng.random() ** 0.2 for z in (rng.standard_normal(G.shape[0])
                                                                             for G in parts)]
            u = rng.standard_normal(Y.shape[1])
            worst = max(worst, floors[i] - _along(image(point(symbols, ball * u / np.linalg.norm(u))), w))
    nu = np.array([_centred(x) for x in after])
    return worst, floors, np.maximum(nu - out.radii, 0.0)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.1, 0.5, 1.0]), carried=st.sampled_from([0.0, 0.5]),
       ball=st.sampled_from([0.0, 0.1]))
def test_floor_holds_on_the_feedforward_image(seed, scale, carried, ball):
    """Every token's floor is at most the centred norm (indeed its part along w) at the points of the step's image that
    descend it (and at sampled ones and on the segments from the float point), and where the set reaches far the
    floor is above ``nu - R``."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(relational_tail, "FLOOR_WORTH", 0.0)   # the remainder along w at every token
        worst, floors, plain = _feedforward_floor_escape(seed, scale, carried, ball)
    assert worst <= 1e-9
    assert np.all(floors >= 0)
    if scale == 0.5:
        assert np.any(floors > plain)


def test_floor_mutations_fail(monkeypatch):
    """Mutations: without the form's part along w, or with the feed-forward remainder along w taken as 0 (the ball
    without it), descending points of the image go below the floor."""
    monkeypatch.setattr(relational_tail, "FLOOR_WORTH", 0.0)
    assert _feedforward_floor_escape(11, 0.5, 0.5, 0.0)[0] <= 1e-9
    with monkeypatch.context() as patched:
        real = relational_tail._along
        patched.setattr(relational_tail, "_along", lambda form, w: real(form, w) if form.l2.shape[0] > 12 else 0.0)
        assert _feedforward_floor_escape(11, 0.5, 0.5, 0.0)[0] > 0
    with monkeypatch.context() as patched:
        patched.setattr(feedforward_taylor, "directed_remainder", lambda *args: 0.0)
        assert _feedforward_floor_escape(11, 0.5, 0.5, 0.0)[0] > 0


def _descend_centred(chain, X, eps, rng, stage: int, token: int, steps: int = 30):
    """A point of the Frobenius ball of radius eps about X that descends token ``token``'s centred norm at ``stage``
    of the float chain."""
    sub = chain[:stage]
    E = rng.standard_normal(X.shape)
    E *= eps / np.linalg.norm(E)
    step = 0.3 * eps
    for _ in range(steps):
        states = chain_forward(sub, (X + E)[None])
        z = states[-1][0][token]
        centred = z - np.mean(z)
        G = np.zeros_like(states[-1][0])
        G[token] = -centred / max(np.linalg.norm(centred), 1e-300)
        g = chain_vjp(states, G[None])[0]
        E = E + step * g / (np.linalg.norm(g) + 1e-300)
        E *= eps / max(np.linalg.norm(E), eps)
        step *= 0.9
    return X + E


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([3e-2, 0.3, 1.0]))
def test_block_floors_hold_through_the_chain(seed, eps):
    """The floors of the sets before both LayerNorms of a generated block (:class:`BlockForms`) are at most the
    centred norms there at sampled points of U and at points that descend one token's centred norm."""
    chain, X, centre, rests = _setting(seed, eps, 2.0)
    forms = relational_tail.BlockForms(chain, centre, centre.prefix_jacobian[1], eps, rests)
    floors = {}
    for k in range(1, 4):
        forms.next_radii()
        floors[k] = forms.floors
    rng = np.random.default_rng(seed)
    points = [X + eps * E / np.linalg.norm(E) for E in rng.standard_normal((8,) + X.shape)]
    points += [_descend_centred(chain, X, eps, rng, stage, int(rng.integers(X.shape[0]))) for stage in (1, 3)]
    for Y in points:
        states = chain_forward(chain, Y[None])
        for k in (1, 3):
            if floors[k] is not None:
                centred = np.linalg.norm(states[k][0] - states[k][0].mean(axis=-1, keepdims=True), axis=-1)
                assert np.all(floors[k] <= centred * (1 + 1e-12) + 1e-12)


def test_a_floor_lowers_the_layernorms_bounds():
    """``norm_bounds`` reads a floor where it is above ``nu - R`` (a smaller Jacobian bound and variation), a floor 0
    changes nothing, and a negative floor is refused."""
    chain, centre = _generated_block(5)
    enclosed = centre.enclosed[3]
    Z = centre.points[3]
    nu = np.array([_centred(x) for x in Z])
    radii = 0.9 * nu
    plain = norm_bounds(enclosed.norm, TokenBalls(Z, radii), enclosed)
    zero = norm_bounds(enclosed.norm, TokenBalls(Z, radii, floors=np.zeros(len(nu))), enclosed)
    floored = norm_bounds(enclosed.norm, TokenBalls(Z, radii, floors=0.5 * nu), enclosed)
    assert np.array_equal(np.diag(zero.blocks), np.diag(plain.blocks))
    assert np.all(np.diag(floored.blocks) < np.diag(plain.blocks))
    assert np.all(np.diag(floored.variation) < np.diag(plain.variation))
    with pytest.raises(AssumptionError):
        TokenBalls(Z, radii, floors=-np.ones(len(nu)))


def test_the_kept_parts_give_the_same_bound_along():
    """The remainder along w from the parts that the remainder's norm kept is the one formed afresh, and it reads them
    (parts whose ball is wider give a larger bound)."""
    chain, centre = _generated_block(3)
    rng = np.random.default_rng(3)
    Y, enclosed = centre.points[2], centre.enclosed[2]
    forms = _carried_about(Y, 0.5, 0.5, rng)
    w = relational_tail.centred_direction(centre.points[3][0])
    kept: dict = {}
    remainder = feedforward_taylor.feedforward_remainder(enclosed, 0, forms.rows[0], 0.1, None, forms.shape(0), kept)
    fresh = feedforward_taylor.feedforward_remainder_along(enclosed, 0, forms.rows[0], 0.1, None, forms.shape(0), w,
                                                           remainder)
    reused = feedforward_taylor.feedforward_remainder_along(enclosed, 0, forms.rows[0], 0.1, None, forms.shape(0), w,
                                                            remainder, kept)
    assert reused == fresh
    wider: dict = {}
    feedforward_taylor.feedforward_remainder(enclosed, 0, forms.rows[0], 0.5, None, forms.shape(0), wider)
    assert feedforward_taylor.feedforward_remainder_along(enclosed, 0, forms.rows[0], 0.1, None, forms.shape(0), w,
                                                          np.inf, wider) > fresh
