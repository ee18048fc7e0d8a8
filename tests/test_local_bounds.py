"""Local certificates on generated small models, checked exhaustively against independent routes.

Every bound of lipbound.local (movement, Jacobian blocks and their variation on token balls, L(eps), the
path certificate, the set propagation) is compared with the truth found by sampling the neighbourhood
densely (random points, points on the spheres, adversarial points along the Jacobian's top singular
directions) and, for edit sets, by enumerating every edit of a small vocabulary.  Jacobians are
written independently here by central differences of the model's forward pass.
"""

from __future__ import annotations

import local_models
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.local.balls import Neighbourhood, TokenBalls
from lipbound.local.bounds import attention_bounds, feedforward_bounds, norm_bounds, simplex_box_max
from lipbound.local.curve import lipschitz_curve
from lipbound.local.enclosed import EnclosedAttention
from lipbound.local.path import identity_plan, path_certificate
from lipbound.local.propagate import coupling_bound, propagate
from lipbound.measures.edits import edit_set, edited_ids
from lipbound.measures.empirical import EmpiricalMeasure
from lipbound.measures.wasserstein import w1, w1_with_plan
from lipbound.numeric.attention import self_forward
from lipbound.numeric.forward import attention_block, hidden_states
from lipbound.rigorous.arrays import IntervalArray


def central_jacobian(f, X, h=1e-6):
    """Dense Jacobian by central differences: ``J[i, a, j, b] = d f(X)_{i a} / d X_{j b}``."""
    n, d = X.shape
    out = None
    for j in range(n):
        for b in range(d):
            E = np.zeros_like(X)
            E[j, b] = h
            column = (f(X + E) - f(X - E)) / (2 * h)
            if out is None:
                out = np.zeros(column.shape + (n, d))
            out[:, :, j, b] = column
    return out


def _block_norms(J):
    n_out, n_in = J.shape[0], J.shape[2]
    return np.array([[np.linalg.norm(J[i, :, j, :], 2) for j in range(n_in)] for i in range(n_out)])


def _points(rng, balls: TokenBalls, count: int):
    """Random points of the product of balls: inside, on the spheres, and at single-token corners."""
    n, d = balls.center.shape
    for k in range(count):
        E = rng.standard_normal((n, d))
        E /= np.linalg.norm(E, axis=1, keepdims=True)
        scale = rng.random((n, 1)) ** (1 / d) if k % 3 == 0 else np.ones((n, 1))
        if k % 3 == 2:
            scale = (rng.random((n, 1)) < 0.5).astype(float)
        yield balls.center + E * scale * balls.radii[:, None]


def _check_component(f, bounds, balls, rng, count=40, tol=1e-6):
    J0 = central_jacobian(f, balls.center)
    assert np.all(_block_norms(J0) <= bounds.at_center * (1 + tol) + tol)
    for Y in _points(rng, balls, count):
        moved = np.linalg.norm(f(Y) - f(balls.center), axis=1)
        assert np.all(moved <= bounds.movement * (1 + tol) + tol), (moved, bounds.movement)
        J = central_jacobian(f, Y)
        assert np.all(_block_norms(J) <= bounds.blocks * (1 + tol) + 1e-5)
        assert np.all(_block_norms(J - J0) <= bounds.variation * (1 + tol) + 1e-5)


@settings(max_examples=6)
@given(seed=st.integers(0, 10_000), radius=st.sampled_from([0.0, 1e-3, 0.05, 0.5, 3.0]),
       scale=st.sampled_from([0.5, 2.0]))
def test_attention_bounds_hold_on_token_balls(seed, radius, scale):
    rng = np.random.default_rng(seed)
    item = local_models.layer(rng, scale=scale)
    X = item.ln_in(rng.standard_normal((4, 6)))
    radii = radius * rng.random(4)
    balls = TokenBalls(X, radii)
    layer = item.as_layer(residual=True)
    _check_component(lambda Y: self_forward(layer, Y)[0], attention_bounds(layer, balls), balls, rng, count=12)
    head = item.heads[1]
    _check_component(lambda Y: self_forward(head, Y)[0], attention_bounds(head, balls), balls, rng, count=12)


def test_attention_bounds_hold_when_the_scores_leave_the_float_range():
    """Score ranges 718 wide (known ranges passed in, as the set certificates do): a lower end's exponential
    is subnormal, and the theorems' reciprocal of it overflowed before the trivial end 0 was taken there;
    the bounds are finite and hold."""
    rng = np.random.default_rng(3)
    item = local_models.layer(rng)
    X = item.ln_in(rng.standard_normal((4, 6)))
    balls = TokenBalls(X, 0.3 * rng.random(4))
    layer = item.as_layer(residual=True)
    E = EnclosedAttention(layer, X)
    bounds = attention_bounds(layer, balls, E, scores=E.S + IntervalArray(-359.0, 359.0))
    assert np.all(bounds.facts["p_lo"] == 0.0) and np.all(bounds.facts["p_hi"] == 1.0)
    assert np.all(np.isfinite(bounds.movement))
    _check_component(lambda Y: self_forward(layer, Y)[0], bounds, balls, rng, count=6)


@settings(max_examples=6)
@given(seed=st.integers(0, 10_000), radius=st.sampled_from([0.0, 1e-3, 0.05, 0.5, 5.0]))
def test_layernorm_and_feedforward_bounds_hold_on_token_balls(seed, radius):
    rng = np.random.default_rng(seed)
    item = local_models.layer(rng)
    Z = 2 * rng.standard_normal((3, 6))
    balls = TokenBalls(Z, radius * rng.random(3))
    _check_component(item.ln_out, norm_bounds(item.ln_out, balls), balls, rng, count=15)
    balls = TokenBalls(item.ln_out(Z), radius * rng.random(3))
    _check_component(lambda Y: Y + item.ffn(Y), feedforward_bounds(item.ffn, balls), balls, rng, count=15)


def test_key_masses_enter_the_attention_bounds_as_weights():
    """Tokens with masses m_j attend like m_j repeated tokens: the enclosure contains the repeated forward pass."""
    rng = np.random.default_rng(3)
    item = local_models.layer(rng)
    X = item.ln_in(rng.standard_normal((3, 6)))
    masses = np.array([1.0, 3.0, 2.0])
    enclosed = EnclosedAttention(item.as_layer(residual=True), X, masses)
    repeated = np.repeat(X, masses.astype(int), axis=0)
    direct = self_forward(item.as_layer(residual=True), repeated)[0][[0, 1, 4]]
    assert enclosed.output.contains(direct)


@settings(max_examples=25)
@given(seed=st.integers(0, 10_000))
def test_simplex_box_maximum_matches_a_linear_program(seed):
    from scipy.optimize import linprog
    rng = np.random.default_rng(seed)
    size = int(rng.integers(2, 7))
    p = rng.dirichlet(np.ones(size))
    low, high = p * rng.random(size), np.minimum(1.0, p + rng.random(size) * 0.5)
    z = rng.standard_normal(size) * 3
    exact = -linprog(-z, A_eq=np.ones((1, size)), b_eq=[1.0], bounds=list(zip(low, high)), method="highs").fun
    bound = simplex_box_max(low, high, z)
    assert exact <= bound <= exact + 1e-9 * (1 + abs(exact))


def test_lipschitz_curve_sandwich_on_a_generated_block():
    """Certified L(eps) >= the largest Jacobian norm found by sampling U(X, eps), for a whole layer (block),
    and it starts at ||DF(X)|| and tends to it as eps -> 0."""
    generated = local_models.model(seed=4, layers=2)
    X = hidden_states(generated, [1, 5, 7, 2])[0]
    curve = lipschitz_curve(generated, X, kind="block", layer=0, eps=[0.0, 1e-5, 1e-2, 0.3], ascent_steps=2)
    rng = np.random.default_rng(0)
    item = generated.layer(0)

    def block(Y):
        Z = Y + self_forward(item.as_layer(), Y)[0]
        Y2 = item.ln_out(Z)
        return item.ffn_norm(Y2 + item.ffn(Y2))

    for point in curve.points:
        assert point.verdict == "holds"
        assert point.witness <= point.certified
        for Y in _points(rng, Neighbourhood("fro", point.eps).balls(X), 4):
            offset = Y - X
            size = np.linalg.norm(offset)
            Y = X + (offset * min(1.0, point.eps / size) if size > 0 else 0)
            J = central_jacobian(block, Y).reshape(X.size, X.size)
            assert np.linalg.norm(J, 2) <= point.certified * (1 + 1e-6)
    assert curve.points[0].certified == pytest.approx(curve.jacobian_norm, rel=1e-6)
    assert curve.points[1].certified <= 1.05 * curve.jacobian_norm


def test_chains_take_the_dense_jacobian_below_their_own_limit(monkeypatch):
    """A chain of several components forms its dense Jacobian only up to CHAIN_DENSE_LIMIT (its products cost
    (n d)^3 each), a single head or layer up to DENSE_LIMIT; beyond, the blocks between groups of tokens
    bound it (one group here: the dense value again), and without them the matrix of block norms."""
    from lipbound.local import curve as module
    generated = local_models.model(seed=4, layers=2)
    X = hidden_states(generated, [1, 5, 7, 2])[0]

    def curves():
        return {kind: lipschitz_curve(generated, X, kind=kind, layer=0, eps=[0.0], ascent_steps=1)
                for kind in ("block", "layer")}

    monkeypatch.setattr(module, "CHAIN_DENSE_LIMIT", 10_000)
    dense = curves()
    monkeypatch.setattr(module, "CHAIN_DENSE_LIMIT", 0)
    grouped = curves()
    monkeypatch.setattr(module.grouped, "covers", lambda chain: False)
    blockwise = curves()
    assert dense["block"].jacobian_norm == pytest.approx(dense["block"].jacobian_witness, rel=1e-6)
    assert [c["block"].jacobian_bound for c in (dense, grouped, blockwise)] == ["dense", "grouped", "blockwise"]
    assert grouped["block"].jacobian_norm == pytest.approx(dense["block"].jacobian_norm, rel=1e-6)
    assert blockwise["block"].jacobian_norm > dense["block"].jacobian_norm * (1 + 1e-6)
    assert blockwise["layer"].jacobian_norm == dense["layer"].jacobian_norm


@settings(max_examples=5)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["replace", "insert", "delete"]))
def test_path_certificate_bounds_the_exact_movement(seed, mode):
    """predicted_path >= the exact W1 of the block outputs, for replacements (identity coupling) and for
    insertions and deletions (the optimal plan of the inputs, as integer masses)."""
    from lipbound.measures.perturb import integer_plan
    generated = local_models.model(seed=seed, layers=1)
    rng = np.random.default_rng(seed)
    ids = [0, *rng.integers(2, 12, size=4), 1]
    new = edited_ids(ids, mode, [2], [int(rng.integers(2, 12))])
    X, X_new = hidden_states(generated, ids)[0], hidden_states(generated, new)[0]
    layer = generated.layer(0)
    coupling = w1_with_plan(EmpiricalMeasure.uniform(X), EmpiricalMeasure.uniform(X_new))
    plan = integer_plan(coupling.plan, len(X), len(X_new))
    certificate = path_certificate(layer.as_layer(residual=True), X, X_new, plan, tolerance=0.1)
    measured = w1(EmpiricalMeasure.uniform(attention_block(layer, X)[0]),
                  EmpiricalMeasure.uniform(attention_block(layer, X_new)[0]))
    assert measured <= certificate.bound * (1 + 1e-9)
    assert certificate.error <= 0.1 * certificate.main or certificate.pieces >= 2048
    if mode == "replace":
        assert np.array_equal(plan, identity_plan(len(X)))


@pytest.mark.parametrize("mode,k", [("replace", 1), ("replace", 2), ("insert", 1), ("delete", 2)])
def test_set_certificate_covers_every_edit_of_a_small_vocabulary(mode, k):
    """Propagate the set "any token of the vocabulary at these positions" and compare with every edit."""
    generated = local_models.model(seed=11, layers=2, vocab=9)
    ids = [0, 3, 4, 5, 6, 1]
    positions = [2, 4][:k]
    vocabulary = np.arange(9)
    template = edit_set(ids, mode, positions, vocabulary)
    sets = propagate(generated, template)
    states = hidden_states(generated, ids)
    original = [attention_block(generated.layer(l), states[l])[0] for l in range(2)]
    choices = [()] if mode == "delete" else np.stack(np.meshgrid(*[vocabulary] * k), -1).reshape(-1, k)
    worst = np.zeros(2)
    for choice in choices:
        new = edited_ids(ids, mode, positions, choice)
        edited = hidden_states(generated, new)
        for l in range(2):
            z = attention_block(generated.layer(l), edited[l])[0]
            worst[l] = max(worst[l], w1(EmpiricalMeasure.uniform(original[l]), EmpiricalMeasure.uniform(z)))
            if mode == "replace":  # token by token, every edited sentence lies in the balls
                assert np.all(np.linalg.norm(z - sets[l].centers, axis=1) <= sets[l].radii * (1 + 1e-9))
    from lipbound.measures.perturb import _set_plan
    for l in range(2):
        bound = coupling_bound(sets[l], _set_plan(sets[l], len(ids), template.n_new, mode))
        assert worst[l] <= bound * (1 + 1e-9)
