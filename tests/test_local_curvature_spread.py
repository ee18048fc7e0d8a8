"""The curvature bound's forms without the m term (lemmas curvature-covariance-spread and curvature-rows-variance),
checked against quantities formed here at points of the ball: the values' weighted spread, each query's second group
against the scaled rows of z, the first group's rows against their variance form; the cases where a step is an
equality (a looser statement fails them); and the real first layer of all-MiniLM-L6-v2.  The heads' movement through
the weights' ratios and the values' spread (lemma head-movement-spread) against the heads' outputs formed here at
points of the ball, on small layers and on MiniLM's first layer.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_local_curvature import (
    _centred_rows,
    _forward,
    _frobenius_case,
    _frobenius_points,
    _parts,
    _second,
    _softmax,
    _steepest_points,
    _target,
    _zeta,
)

from lipbound.local.balls import Neighbourhood
from lipbound.local.bounds import attention_bounds
from lipbound.local.centred import CentredRows, weight_ratios, weighted_reach
from lipbound.local.curvature import AttentionCurvature
from lipbound.local.enclosed import EnclosedAttention
from lipbound.numeric.model import Head, Layer


def _at(target, Y):
    """Per head at Y: the weights P (n, n), the rows ``u_ij = v_j - f_i`` in the output space (n, n, d_out)."""
    out = []
    for W_Q, W_K, A, b_Q, b_K, b_A in _parts(target):
        P = _softmax((Y @ W_Q + b_Q) @ (Y @ W_K + b_K).T / np.sqrt(W_Q.shape[1]))
        v = Y @ A + b_A
        out.append((P, v[None, :, :] - (P @ v)[:, None, :]))
    return out


def _spread(P, u):
    """``||diag(p_i)^(1/2) U_i||_2`` per query (n,)."""
    return np.array([np.linalg.norm(np.sqrt(P[i])[:, None] * u[i], 2) for i in range(P.shape[0])])


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["head", "layer"]), n=st.integers(2, 4),
       scale=st.sampled_from([0.5, 1.5]), eps=st.sampled_from([0.05, 0.3, 1.0]))
def test_the_values_weighted_spread_is_bounded_on_the_ball(seed, kind, n, scale, eps):
    """``sigma_hi >= ||diag(p_i(Y))^(1/2) U_hi(Y)||_2`` at points of the Frobenius ball (lemma
    curvature-covariance-spread), with the tokens sharing the radius and each taking all of it."""
    rng, target, X, curvature, _, facts, _ = _frobenius_case(seed, kind, n, scale, eps)
    shared, alone = curvature.value_spread.on(facts, eps), curvature.value_spread.on(facts)
    assert np.all(shared <= alone)
    for Y in _frobenius_points(rng, X, eps, 3 * n) + _steepest_points(target, X, eps):
        for h, (P, u) in enumerate(_at(target, Y)):
            assert np.all(_spread(P, u) <= shared[h] * (1 + 1e-9) + 1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_values_weighted_spread_is_its_value_at_the_centre(seed):
    """At eps = 0 the weights' upper ends are X's and the values do not move: sigma is the spectral norm itself
    (within the certified norm's margin), below the rows' Frobenius norm a looser statement would take."""
    rng = np.random.default_rng(seed)
    target = _target(rng, "layer", d=8, heads=2, d_k=2, scale=0.5)
    X = rng.standard_normal((5, 8))
    E = EnclosedAttention(target, X)
    balls = Neighbourhood("fro", 0.0).balls(X)
    sigma = AttentionCurvature(E, target).value_spread.on(attention_bounds(target, balls, E).facts, 0.0)
    looser = []
    for h, (P, u) in enumerate(_at(target, X)):
        exact = _spread(P, u)
        np.testing.assert_allclose(sigma[h], exact, rtol=5e-3)
        assert np.all(exact <= sigma[h])
        looser.append(np.sqrt(np.sum(P * np.sum(u * u, axis=-1), axis=1)) / sigma[h])   # the rows' Frobenius norm
    assert np.max(looser) > 1.05   # (beyond the margin above: the test tells them apart)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["head", "layer"]), n=st.integers(2, 4),
       scale=st.sampled_from([0.5, 1.5]), eps=st.sampled_from([0.05, 0.3, 1.0]))
def test_each_querys_second_group_is_at_most_its_spread_scaled_rows_of_z(seed, kind, n, scale, eps):
    """Lemma curvature-covariance-spread at points Y of the ball: ``||sum_(h,j) p_ij zeta_ij(e) zeta_ij(f) u_ij|| <=
    ||S_i z_i(Y) e|| ||S_i z_i(Y) f||`` (z formed here at Y) for random e, f and along each query's top direction."""
    rng, target, X, curvature, _, facts, _ = _frobenius_case(seed, kind, n, scale, eps)
    H = len(_parts(target))
    weight = np.sqrt(facts["p_hi"] * (curvature.rho.hi + facts["value_shift"][:, None, :]
                                       + facts["head_movement"][:, :, None]))
    scales = CentredRows.spread_scales(facts, weight, curvature.value_spread.on(facts, eps))
    for Y in _frobenius_points(rng, X, eps, 2 * n) + _steepest_points(target, X, eps)[:4]:
        z = _centred_rows(target, X, Y)[0].reshape(H, n, n, -1)
        zeta = _zeta(target, Y).reshape(H, n, n, -1)
        heads = _at(target, Y)
        for i in range(n):
            S_z = (scales[:, i, :, None] * z[:, i]).reshape(H * n, -1)
            top = np.linalg.svd(S_z)[2][0]
            for e, f in [(top, top)] + [tuple(rng.standard_normal((2, n * 4))) for _ in range(4)]:
                group = sum(np.einsum("j,jd->d", P[i] * (zeta[h, i] @ e) * (zeta[h, i] @ f), u[i])
                            for h, (P, u) in enumerate(heads))
                bound = np.linalg.norm(S_z @ e) * np.linalg.norm(S_z @ f)
                assert np.linalg.norm(group) <= bound * (1 + 1e-9) + 1e-12


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["head", "layer"]), n=st.integers(2, 4),
       scale=st.sampled_from([0.5, 1.5]), eps=st.sampled_from([0.05, 0.3, 1.0]))
def test_the_first_groups_rows_are_at_most_their_variance_form(seed, kind, n, scale, eps):
    """Lemma curvature-rows-variance at points Y of the ball: ``||diag(p(Y)) zeta(Y) f|| <= ||diag(s) z(Y) f||`` for
    random f and the left side's top direction, and the certified ``variance_rows`` above the left side's norm."""
    rng, target, X, curvature, _, facts, deviation = _frobenius_case(seed, kind, n, scale, eps)
    H = len(_parts(target))
    scales = CentredRows.variance_scales(facts)
    bound = curvature.centred_rows.variance_rows(facts, deviation[2][0])
    for Y in _frobenius_points(rng, X, eps, 2 * n) + _steepest_points(target, X, eps)[:4]:
        z = _centred_rows(target, X, Y)[0]
        P = np.stack([P for P, _ in _at(target, Y)])                                   # (H, n, n)
        rows = P.reshape(-1, 1) * _zeta(target, Y)
        top = np.linalg.svd(rows)[2][0]
        for f in [top] + list(rng.standard_normal((4, n * 4))):
            assert np.linalg.norm(rows @ f) <= np.linalg.norm(scales.reshape(-1, 1) * z @ f) * (1 + 1e-9) + 1e-12
        assert np.linalg.norm(rows, 2) <= bound * (1 + 1e-9)
        assert scales.shape == (H, n, n)


def test_the_variance_form_is_an_equality_where_the_weights_are_uniform():
    """Uniform weights with moving scores (the keys' bias 0 at X = 0: every score 0, its derivative not): at eps = 0
    ``sum_j p_j^2 zeta_j^2 = max_l p_l sum_j p_j zeta_j^2`` and z = zeta, so the bound is the rows' norm itself."""
    rng = np.random.default_rng(0)
    d, d_k, n = 4, 3, 4
    head = Head(rng.standard_normal((d, d_k)), rng.standard_normal((d, d_k)), rng.standard_normal((d, d_k)),
                rng.standard_normal(d_k), np.zeros(d_k), rng.standard_normal(d_k))
    target = Layer((head,), rng.standard_normal((d_k, d)), np.zeros(d), residual=True)
    X = np.zeros((n, d))
    E = EnclosedAttention(target, X)
    balls = Neighbourhood("fro", 0.0).balls(X)
    facts = attention_bounds(target, balls, E).facts
    curvature = AttentionCurvature(E, target)
    centred = curvature._functional_deviation(facts, balls.radii, 0.0)[2][0]
    exact = np.linalg.norm(np.full((n * n, 1), 1 / n) * _zeta(target, X), 2)
    assert exact > 0.1
    np.testing.assert_allclose(curvature.centred_rows.variance_rows(facts, centred), exact, rtol=5e-3)


def test_the_weights_ratio_is_attained_by_changes_that_follow_the_rows():
    """``|sum_l dp_l x_l| <= kappa (sum_l p+_l x_l^2)^(1/2)`` with equality when ``dp_l`` is proportional to ``p+_l
    x_l`` at its bounds (Cauchy-Schwarz's case), the changes summing to 0."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(6)
    p_plus = rng.uniform(0.05, 1.0, 6)
    x -= np.sum(p_plus * x) / np.sum(p_plus)                            # sum_l p+_l x_l = 0: dp sums to 0
    dp = 0.1 * p_plus * x
    kappa = weight_ratios({"delta": np.abs(dp)[None, None], "p_hi": p_plus[None, None]})[0, 0]
    np.testing.assert_allclose(abs(np.sum(dp * x)), kappa * np.sqrt(np.sum(p_plus * x * x)), rtol=1e-12)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["head", "layer"]), n=st.integers(2, 4),
       scale=st.sampled_from([0.5, 1.5, 4.0]), eps=st.sampled_from([0.05, 0.3, 1.0]))
def test_each_weighted_value_spread_is_bounded_on_the_ball(seed, kind, n, scale, eps):
    """Lemma curvature-weight-reach: ``p_ij(Y) ||u_ij(Y)|| <= weighted_reach`` at points Y of the ball."""
    rng, target, X, curvature, _, facts, _ = _frobenius_case(seed, kind, n, scale, eps)
    rho = (curvature.rho.hi + facts["value_shift"][:, None, :] + facts["head_movement"][:, :, None])
    bound = weighted_reach(facts, rho, curvature.value_gaps)
    for Y in _frobenius_points(rng, X, eps, 3 * n) + _steepest_points(target, X, eps):
        for h, (P, u) in enumerate(_at(target, Y)):
            assert np.all(P * np.linalg.norm(u, axis=-1) <= bound[h] * (1 + 1e-9) + 1e-12)


def test_the_weighted_value_spread_is_an_equality_at_two_tokens():
    """With two tokens ``u_i1 = p_i2 (v_1 - v_2)``, so ``p_i1 ||u_i1|| = p_i1 (1 - p_i1) ||v_1 - v_2||``: at eps = 0 the
    bound is the value itself, where ``p+ ||u||`` alone is not (a looser statement fails)."""
    rng = np.random.default_rng(1)
    target = _target(rng, "layer", d=4, heads=2, d_k=2, scale=1.5)
    X = rng.standard_normal((2, 4))
    E = EnclosedAttention(target, X)
    facts = attention_bounds(target, Neighbourhood("fro", 0.0).balls(X), E).facts
    curvature = AttentionCurvature(E, target)
    bound = weighted_reach(facts, curvature.rho.hi + 0.5, curvature.value_gaps)   # (the first form well above)
    for h, (P, u) in enumerate(_at(target, X)):
        np.testing.assert_allclose(bound[h], P * np.linalg.norm(u, axis=-1), rtol=1e-9, atol=1e-12)


def test_the_real_first_layer_stays_below_the_curvature_bound_at_sampled_points():
    """all-MiniLM-L6-v2's first attention layer at four tokens, the Frobenius ball of 1e-2 of its LayerNorm radius: at
    sampled points of U the values' weighted spread stays below sigma, each group of the second derivative (its closed
    form) below its bound, and the second differences of the forward below their sum."""
    from lipbound.local.chains import chain_for
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat sat on the mat."))[0][:4]
    eps = 1e-2 * bert.layernorm_feeding(0).radius_about_center
    target = chain_for(bert.model, "layer", 0)[0].target
    E = EnclosedAttention(target, X)
    balls = Neighbourhood("fro", eps).balls(X)
    bounds = attention_bounds(target, balls, E)
    curvature = AttentionCurvature(E, target)
    chis = curvature.chis(bounds, balls.radii, eps)
    sigma = curvature.value_spread.on(bounds.facts, eps)
    rng = np.random.default_rng(0)
    for Y in _frobenius_points(rng, X, eps, 6):
        for h, (P, u) in enumerate(_at(target, Y)):
            assert np.all(_spread(P, u) <= sigma[h])
        for _ in range(2):
            e, f = rng.standard_normal((2,) + X.shape)
            e, f = e / np.linalg.norm(e), f / np.linalg.norm(f)
            for group, chi in zip(("I", "II", "III"), chis):
                assert np.linalg.norm(_second(target, Y, e, f, (group,))) <= chi
            h = 1e-3
            step = [_forward(target, Y + a * h * e + b * h * f) for a in (1, -1) for b in (1, -1)]
            second = (step[0] - step[1] - step[2] + step[3]) / (4 * h * h)
            assert np.linalg.norm(second) <= sum(chis)


def _head_outputs(target, Y):
    """Every head's output ``f_hi = sum_j p_ij v_j`` in the output space at Y, (H, n, d_out)."""
    out = []
    for W_Q, W_K, A, b_Q, b_K, b_A in _parts(target):
        out.append(_softmax((Y @ W_Q + b_Q) @ (Y @ W_K + b_K).T / np.sqrt(W_Q.shape[1])) @ (Y @ A + b_A))
    return np.array(out)


def _value_points(target, X, eps):
    """All of eps on one token along the top left singular vector of a head's value map, or every token moved along it
    by ``eps / n^(1/2)`` (either sign): the values' shift at its largest, alone or all together."""
    points = []
    n = X.shape[0]
    for _, _, A, *_ in _parts(target):
        direction = np.linalg.svd(A)[0][:, 0]
        for sign in (1, -1):
            for token in range(n):
                Y = X.copy()
                Y[token] += sign * eps * (1 - 1e-9) * direction
                points.append(Y)
            points.append(X + sign * eps * (1 - 1e-9) / np.sqrt(n) * direction)
    return points


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["head", "layer"]), n=st.integers(2, 4),
       scale=st.sampled_from([0.5, 1.5, 4.0]), eps=st.sampled_from([0.05, 0.3, 1.0]))
def test_each_heads_movement_is_bounded_through_the_weights_ratios_on_the_ball(seed, kind, n, scale, eps):
    """Lemma head-movement-spread: ``||f_hi(Y) - f_hi(X)|| <= kappa_hi ||diag(p+)^(1/2) U_hi(X)||_2`` plus the values'
    mean shift, at points of the Frobenius ball (random, one token or two taking all of eps, the scores' and the
    values' steepest directions); never above the facts' own bound, and the same without the shared radius."""
    rng, target, X, curvature, balls, _, _ = _frobenius_case(seed, kind, n, scale, eps)
    bounds = attention_bounds(target, balls, curvature.E)
    moved = curvature.moved_heads(bounds, eps).facts["head_movement"]
    assert np.all(moved <= bounds.facts["head_movement"])
    assert np.all(moved <= curvature.moved_heads(bounds).facts["head_movement"])
    at_x = _head_outputs(target, X)
    for Y in _frobenius_points(rng, X, eps, 3 * n) + _steepest_points(target, X, eps) + _value_points(target, X, eps):
        assert np.all(np.linalg.norm(_head_outputs(target, Y) - at_x, axis=-1) <= moved * (1 + 1e-9) + 1e-12)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4), scale=st.sampled_from([0.5, 1.5, 4.0]),
       eps=st.sampled_from([0.05, 0.3, 1.0]))
def test_each_heads_movement_in_the_values_space_is_bounded_on_the_ball(seed, n, scale, eps):
    """The same lemma before W_O (``AttentionCurvature.value_movement``, read by chi_III's values-joined form): each
    head's ``sum_j p_ij v_j`` moves at most ``moved`` at points of the ball, where every token may take all of eps."""
    rng, target, X, curvature, balls, facts, _ = _frobenius_case(seed, "layer", n, scale, eps)
    _, moved = curvature.value_movement(facts, balls.radii)

    def outputs(Y):
        return np.array([_softmax((Y @ h.W_Q + h.b_Q) @ (Y @ h.W_K + h.b_K).T / np.sqrt(h.W_Q.shape[1]))
                         @ (Y @ h.V + h.b_V) for h in target.heads])

    at_x = outputs(X)
    for Y in _frobenius_points(rng, X, eps, 3 * n) + _steepest_points(target, X, eps) + [
            X + sign * eps * (1 - 1e-9) / np.sqrt(n) * np.linalg.svd(h.V)[0][:, 0] for h in target.heads
            for sign in (1, -1)]:
        assert np.all(np.linalg.norm(outputs(Y) - at_x, axis=-1) <= moved * (1 + 1e-9) + 1e-12)


def test_the_real_first_layers_heads_move_less_than_the_weights_box_says():
    """On all-MiniLM-L6-v2's first layer at "The cat sat on the mat." and 1e-2 of its LayerNorm radius, with the
    relational ranges of the curve: the heads' movement through the weights' ratios is below ``sum_j delta_ij
    ||u_ij||`` plus the shift for most heads and queries, and above the movement at sampled points of the ball."""
    from lipbound.local.chains import Component, chain_for
    from lipbound.local.relational import RelationalRoute
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat sat on the mat."))[0]
    eps = 1e-2 * bert.layernorm_feeding(0).radius_about_center
    target = chain_for(bert.model, "layer", 0)[0].target
    E = EnclosedAttention(target, X)
    route = RelationalRoute(Component("attention", target, "layer 0"), X, E, movement=False)
    balls = Neighbourhood("fro", eps).balls(X)
    bounds = attention_bounds(target, balls, E, **route.known(eps))
    moved = AttentionCurvature(E, target).moved_heads(bounds, eps).facts["head_movement"]
    ratio = moved / bounds.facts["head_movement"]
    assert np.median(ratio) < 0.8 and np.all(ratio <= 1)
    at_x = _head_outputs(target, X)
    rng = np.random.default_rng(0)
    for Y in _frobenius_points(rng, X, eps, 12) + _value_points(target, X, eps)[::5]:
        assert np.all(np.linalg.norm(_head_outputs(target, Y) - at_x, axis=-1) <= moved)
