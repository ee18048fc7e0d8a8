"""The attention layer's Jacobian enclosed over a Frobenius ball (lipbound/local/jacobian_forms.py), against a
Jacobian written here (central differences of a forward pass written from the heads' weights):

* ``||DF(Y) - DF(X)||_2 <= spread`` and ``||DF(Y)||_2 <= supremum`` at sampled points Y of U (boundary included),
  over generated layers, token counts, radii and weight scales (hypothesis);
* the weights' row changes ``||p_i(Y) - p_i(X)||`` and ``max_j |p_ij(Y) - p_ij(X)|`` below ``weight_changes``, with
  and without the weights' affine form;
* the curve names the route of each certified value, and that value is the smallest of the routes it reports.
"""

from __future__ import annotations

import local_models
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_relational import _ascend_on_ball, _ball_points, _layer, _layer_forward

from lipbound.local.balls import Neighbourhood
from lipbound.local.chains import Component
from lipbound.local.enclosed import EnclosedAttention
from lipbound.local.jacobian_forms import JacobianSpread, weight_changes
from lipbound.local.relational import RelationalAttention, RelationalRoute


def _jacobian(target, Y, h=1e-6):
    """``DF(Y)`` (n d, n d) by central differences of :func:`_layer_forward`."""
    columns = []
    for k in range(Y.size):
        step = np.zeros(Y.size)
        step[k] = h
        plus = _layer_forward(target, Y + step.reshape(Y.shape))[2]
        minus = _layer_forward(target, Y - step.reshape(Y.shape))[2]
        columns.append(((plus - minus) / (2 * h)).reshape(-1))
    return np.array(columns).T


def _paths(target, Y):
    """Per head, the value, query and key paths of ``DF(Y)`` in the output space, dense (n d, n d), from
    ``do_i[E] = (P E W_V)_i + c e_i W_Q K^T J_i V + c (W_K q_i)^T E^T J_i V`` written here."""
    n, d = Y.shape
    out = []
    for index, head in enumerate(target.heads):
        c = 1 / np.sqrt(head.W_Q.shape[1])
        Q, K, V = Y @ head.W_Q + head.b_Q, Y @ head.W_K + head.b_K, Y @ head.V + head.b_V
        P = np.exp(c * Q @ K.T - np.max(c * Q @ K.T, axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        W_O = target.output_block(index)
        softmax_jacobians = [np.diag(p) - np.outer(p, p) for p in P]
        N = [J @ V @ W_O for J in softmax_jacobians]
        b = Q @ head.W_K.T
        maps = (lambda E: P @ E @ head.V @ W_O,
                lambda E: np.array([c * E[i] @ head.W_Q @ K.T @ N[i] for i in range(n)]),
                lambda E: np.array([c * (E @ b[i]) @ N[i] for i in range(n)]))
        basis = np.eye(n * d).reshape(n * d, n, d)
        out.append(([np.array([f(e).reshape(-1) for e in basis]).T for f in maps], softmax_jacobians, N))
    return out


def _moved_weights(target, X, eps, rng, steps=8):
    """A point of the Frobenius ball about X where the attention weights move far: ascent on
    ``||P(Y) - P(X)||_F^2``."""
    P_x = _layer_forward(target, X)[1]
    return _ascend_on_ball(X, eps, lambda Y: np.sum((_layer_forward(target, Y)[1] - P_x) ** 2), rng, steps)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 6), st.floats(1e-3, 2.0), st.floats(0.3, 2.0))
def test_spread_and_supremum_hold_at_sampled_points(seed, n, eps, scale):
    target, rng = _layer(seed, scale=scale)
    X = rng.standard_normal((n, 6))
    E = EnclosedAttention(target, X)
    spread_of = JacobianSpread(target, E)
    relational = RelationalAttention(target, X, eps, E)
    at_x, paths_x = _jacobian(target, X), _paths(target, X)
    # the paths written here are the Jacobian (with the residual's identity)
    written = np.eye(X.size) + sum(sum(maps) for maps, _, _ in paths_x)
    np.testing.assert_allclose(written, at_x, atol=1e-6 * (1 + np.abs(at_x).max()))
    _, P_x, _ = _layer_forward(target, X)
    for form in (None, relational.weights_form):
        weights = relational.weights
        delta = weight_changes(weights, E.P, form)
        changes, levels = spread_of.terms(eps, weights, delta), spread_of.levels(eps, weights, delta)
        spread, supremum = spread_of.spread(eps, weights, delta), spread_of.supremum(eps, weights, delta)
        for Y in _ball_points(rng, X, eps, 8) + [_moved_weights(target, X, eps, rng) for _ in range(2)]:
            _, P, _ = _layer_forward(target, Y)
            assert np.all(np.linalg.norm(P - P_x, axis=-1) <= delta * (1 + 1e-9) + 1e-12)
            for h, (at_y, at_centre) in enumerate(zip(_paths(target, Y), paths_x)):
                for name, now, then in zip(("value", "query", "key"), at_y[0], at_centre[0]):
                    assert np.linalg.norm(now - then, 2) <= changes[name][h] * (1 + 1e-9), name
                    assert np.linalg.norm(now, 2) <= levels[name][h] * (1 + 1e-9), name
                for i in range(n):      # the softmax Jacobians' and N_i's changes, and N_i at Y
                    assert np.linalg.norm(at_y[1][i] - at_centre[1][i], 2) <= changes["J"][h, i] * (1 + 1e-9)
                    assert np.linalg.norm(at_y[2][i] - at_centre[2][i], 2) <= changes["N"][h, i] * (1 + 1e-9)
                    assert np.linalg.norm(at_y[2][i], 2) <= changes["at_y_N"][h, i] * (1 + 1e-9)
            jacobian = _jacobian(target, Y)
            slack = 1e-5 * (1 + np.linalg.norm(jacobian, 2))          # the differences' own error
            assert np.linalg.norm(jacobian - at_x, 2) <= spread + slack
            assert np.linalg.norm(jacobian, 2) <= supremum + slack


def test_the_route_is_offered_only_where_it_applies():
    target, rng = _layer(4)
    X = rng.standard_normal((3, 6))
    E = EnclosedAttention(target, X)
    route = RelationalRoute(Component("attention", target, "layer 0"), X, E, movement=False)
    assert route.jacobian(Neighbourhood("2,inf", 0.1)) == (np.inf, np.inf)
    spread, supremum = route.jacobian(Neighbourhood("fro", 0.1))
    assert 0 < spread < np.inf and 1 <= supremum < np.inf


def test_curve_names_the_route_of_its_certified_value():
    from lipbound.local.curve import lipschitz_curve
    generated = local_models.model(seed=5, scale=1.5)
    rng = np.random.default_rng(5)
    X = generated.layer(0).ln_in(rng.standard_normal((4, 6)))
    curve = lipschitz_curve(generated, X, kind="layer", eps=[0.01, 0.3, 1.0, 3.0], ascent_steps=2)
    for point in curve.points:
        assert point.verdict == "holds" and point.witness <= point.certified
        named = {"global": point.global_constant, "jacobian-supremum": point.certified,
                 "jacobian-heads-joint": point.certified}
        assert point.route.startswith("||DF(X)|| + variation (") or point.route in named
        if point.route.startswith("||DF(X)||"):
            np.testing.assert_allclose(point.certified, point.local)
        elif point.route == "global":
            np.testing.assert_allclose(point.certified, point.global_constant)
        assert point.to_json()["route"] == point.route
    assert {p.route for p in curve.points} & {"jacobian-supremum", "jacobian-heads-joint",
                                              "||DF(X)|| + variation (jacobian-enclosure)"}
