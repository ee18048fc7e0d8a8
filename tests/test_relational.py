"""The relational enclosure engine and the routes of ``local`` that use it, against independent routes.

* every operation of :class:`~lipbound.rigorous.zonotope.AffineForm` encloses the exact operation on
  sampled points of its input set (hypothesis: shapes, weights, radii), boundary points included;
* rounding goes outward: a form of a point set whose operations are exact keeps its point, and the
  symbols a reduction drops land in ``err``;
* an attention layer on the Frobenius ball (:class:`~lipbound.local.relational.RelationalAttention`):
  scores, weights and outputs of sampled points of U (a forward pass written here) lie in its
  enclosures, and its token radii bound the sampled tokens' movements;
* the curve with the relational route: no witness above a certified value, and never above the curve
  without it (generated models, several radii).
"""

from __future__ import annotations

import local_models
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lipbound.local.balls import Neighbourhood
from lipbound.local.bounds import attention_bounds
from lipbound.local.enclosed import EnclosedAttention
from lipbound.local.relational import RelationalAttention, covers, frobenius_scores
from lipbound.numeric.model import Head, Layer
from lipbound.rigorous.arrays import IntervalArray
from lipbound.rigorous.zonotope import AffineForm


def _ball_points(rng, X, eps, count):
    """Points of the Frobenius ball about X: random directions, half of them on the boundary."""
    out = []
    for k in range(count):
        E = rng.standard_normal(X.shape)
        size = eps if k % 2 == 0 else eps * rng.uniform() ** (1 / X.size)
        out.append(X + E * (size * (1 - 1e-12) / np.linalg.norm(E)))
    return out


def _ascend_on_ball(X, eps, value, rng, steps, rate=1.0, h=1e-6):
    """A point of the Frobenius ball about X where ``value`` is large: projected gradient ascent (central
    differences, steps of ``rate eps``) from a random boundary point."""
    Y = _ball_points(rng, X, eps, 1)[0]
    for _ in range(steps):
        gradient = np.zeros(X.size)
        for k in range(X.size):
            step = np.zeros(X.size)
            step[k] = h
            gradient[k] = (value(Y + step.reshape(X.shape)) - value(Y - step.reshape(X.shape))) / (2 * h)
        if not np.any(gradient):
            break
        Y = Y + rate * eps * gradient.reshape(X.shape) / np.linalg.norm(gradient)
        Y = X + (Y - X) * min(1.0, eps * (1 - 1e-12) / np.linalg.norm(Y - X))
    return Y


def _heads(Z, H, k):
    return Z.reshape(Z.shape[:-1] + (H, k)).swapaxes(-2, -3)


def _softmax(S):
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    return P / P.sum(axis=-1, keepdims=True)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 5), st.integers(2, 6), st.integers(1, 3), st.integers(1, 3),
       st.floats(1e-4, 1.0))
def test_every_operation_encloses_sampled_points(seed, n, d, H, k, eps):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W_Q, W_K, W_V = (rng.standard_normal((d, H * k)) for _ in range(3))
    W_O, b = rng.standard_normal((H * k, d)), rng.standard_normal(H * k)
    c = 1 / np.sqrt(k)

    def exact(Y):
        Q, K, V = _heads(Y @ W_Q + b, H, k), _heads(Y @ W_K, H, k), _heads(Y @ W_V, H, k)
        S = np.einsum("hik,hjk->hij", Q, K) * c
        P = _softmax(S)
        F = np.einsum("hij,hjk->hik", P, V)
        return {"Q": Q, "S": S, "P": P, "F": F, "O": F.swapaxes(0, 1).reshape(n, H * k) @ W_O + Y,
                "D": Q - _heads(Y @ W_K, H, k)}

    U = AffineForm.ball(X, eps)
    Q, K, V = _heads(U.linear(W_Q, b), H, k), _heads(U.linear(W_K), H, k), _heads(U.linear(W_V), H, k)
    S = Q.dot(K).scale(IntervalArray(c))
    P, ranges = S.softmax()
    F = P.mix(V, ranges)
    forms = {"Q": Q, "S": S, "P": P, "F": F, "O": F.swapaxes(-2, -3).reshape(n, H * k).linear(W_O) + U,
             "D": Q - K}
    hulls = {name: form.hull() for name, form in forms.items()}
    radii = forms["O"].token_radii()
    centre = forms["O"].center
    for Y in _ball_points(rng, X, eps, 60):
        values = exact(Y)
        for name, hull in hulls.items():
            assert hull.contains(values[name]), name
        assert ranges.contains(values["P"])
        assert np.all(np.linalg.norm(values["O"] - centre, axis=1) <= radii)


def test_rounding_outward_and_reduction():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((3, 4))
    point = AffineForm.ball(X, 0.0).linear(rng.standard_normal((4, 5)) * 1e-3 + 1 / 3)
    exact = X @ (np.zeros((4, 5)) + 1 / 3)
    assert np.all(point.err > 0)           # 1/3 is not a float: the products' rounding is bounded, not ignored
    assert point.hull().contains(point.center)
    U = AffineForm.ball(X, 0.5)
    W = rng.standard_normal((4, 4))
    forms = [U.linear(W), U.linear(W.T)]
    reduced = AffineForm.reduce(forms, 5)
    assert all(f.l2.shape[0] == 5 for f in reduced)
    for before, after in zip(forms, reduced):
        assert np.all(after.deviation() >= before.deviation() * (1 - 1e-12))
    for Y in _ball_points(rng, X, 0.5, 40):
        assert reduced[0].hull().contains(Y @ W) and reduced[1].hull().contains(Y @ W.T)
    difference = reduced[0] - reduced[1]
    for Y in _ball_points(rng, X, 0.5, 40):
        assert difference.hull().contains(Y @ W - Y @ W.T)
    assert exact.shape == point.shape


def test_forms_of_different_inputs_are_refused():
    X = np.ones((2, 3))
    with pytest.raises(Exception, match="same symbols"):
        AffineForm.ball(X, 0.1) + AffineForm.ball(X, 0.1)
    with pytest.raises(Exception, match="eps"):
        AffineForm.ball(X, -1.0)


def _layer(seed, d=6, heads=2, d_k=3, scale=1.0):
    rng = np.random.default_rng(seed)
    made = tuple(Head(scale * rng.standard_normal((d, d_k)), scale * rng.standard_normal((d, d_k)),
                      rng.standard_normal((d, d_k)) / np.sqrt(d), 0.3 * rng.standard_normal(d_k),
                      0.3 * rng.standard_normal(d_k), 0.3 * rng.standard_normal(d_k), name=f"head{h}")
                 for h in range(heads))
    return Layer(made, rng.standard_normal((heads * d_k, d)) / np.sqrt(d), 0.2 * rng.standard_normal(d),
                 residual=True), rng


def _layer_forward(target, X):
    """The attention layer with residual, written from the heads' weights (independent of the package)."""
    out = X.copy() + target.b_O
    scores, weights = [], []
    for index, h in enumerate(target.heads):
        S = (X @ h.W_Q + h.b_Q) @ (X @ h.W_K + h.b_K).T / np.sqrt(h.W_Q.shape[1])
        P = _softmax(S)
        scores.append(S)
        weights.append(P)
        out = out + P @ (X @ h.V + h.b_V) @ target.output_block(index)
    return np.array(scores), np.array(weights), out


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 6), st.floats(1e-3, 1.0), st.floats(0.3, 2.0))
def test_relational_attention_encloses_the_layer_on_the_ball(seed, n, eps, scale):
    target, rng = _layer(seed, scale=scale)
    X = rng.standard_normal((n, 6))
    assert covers(target, Neighbourhood("fro", eps))
    relational = RelationalAttention(target, X, eps)
    _, _, at_x = _layer_forward(target, X)
    reach = relational.radii + relational.drift
    closed = frobenius_scores(EnclosedAttention(target, X), eps)
    theorem = attention_bounds(target, Neighbourhood("fro", eps).balls(X)).facts["scores"]
    slack = 1e-9 * (1 + np.abs(theorem.mid))     # both rounded outward: never wider than the token balls'
    assert np.all(closed.lo >= theorem.lo - slack) and np.all(closed.hi <= theorem.hi + slack)
    for Y in _ball_points(rng, X, eps, 40):
        S, P, out = _layer_forward(target, Y)
        assert relational.scores.contains(S) and relational.weights.contains(P) and closed.contains(S)
        assert relational.output.hull().contains(out)
        assert np.all(np.linalg.norm(out - at_x, axis=1) <= reach)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 6), st.floats(1e-3, 1.0), st.floats(0.3, 2.0),
       st.sampled_from([0, 3000, 10**9]))
@example(0, 2, 0.00390625, 1.0, 0)     # the panel's radius 5e-16 above the whole form's: its sums' order differs
def test_token_rows_match_the_whole_output_form(seed, n, eps, scale, panel):
    """The output's token radii formed by panels of tokens (past WHOLE_OUTPUT_ENTRIES) bound the sampled tokens'
    movements and differ from the whole form's only in the roundings' bounds (fewer symbols counted: never wider but
    for the order in which the two sum their roundings, a few units in the last place)."""
    from unittest import mock

    from lipbound.local import relational as relational_module
    target, rng = _layer(seed, scale=scale)
    X = rng.standard_normal((n, 6))
    whole = RelationalAttention(target, X, eps)
    with mock.patch.object(relational_module, "WHOLE_OUTPUT_ENTRIES", 0), \
            mock.patch.object(relational_module, "TOKEN_PANEL_ENTRIES", panel):   # one token, some, all a panel
        rows = RelationalAttention(target, X, eps)
        assert not rows._whole_output(rows._engine, n)
        radii, drift = rows.radii, rows.drift
    assert "output" not in rows.__dict__                         # the whole output form was not built
    assert np.all(radii <= whole.radii * (1 + 1e-13)) and np.allclose(radii, whole.radii, rtol=1e-9, atol=0)
    assert np.allclose(rows._token_parts[1], whole.output.center, rtol=1e-12, atol=1e-12)
    _, _, at_x = _layer_forward(target, X)
    for Y in _ball_points(rng, X, eps, 40):
        out = _layer_forward(target, Y)[2]
        assert np.all(np.linalg.norm(out - at_x, axis=1) <= radii + drift)
        assert np.all(np.linalg.norm(out - rows._token_parts[1], axis=1) <= radii)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.floats(1e-3, 1.0), st.floats(0.3, 2.0))
def test_head_forms_part_by_part_are_the_fused_images_floats(seed, n, eps, scale):
    """The scores and values of the ball formed part by part (past WHOLE_OUTPUT_ENTRIES: no fused image) are the
    floats of the fused image's, every array and its deviation; so are the ball's."""
    from lipbound.local.relational import ball_head_forms, head_forms
    from lipbound.numeric.attention import AttentionMap
    target, rng = _layer(seed, scale=scale)
    X, engine = rng.standard_normal((n, 6)), AttentionMap(target)
    U, fused = AffineForm.ball_image(X, eps, engine.W, engine.bias)
    S, V = head_forms(engine, fused)
    U_parts, S_parts, V_parts = ball_head_forms(engine, X, eps)
    for whole, part in ((U, U_parts), (S, S_parts), (V, V_parts)):
        for name in ("center", "l2", "box", "err"):
            assert np.array_equal(getattr(whole, name), getattr(part, name))
        assert np.array_equal(whole.deviation(), part.deviation())
    assert S_parts.symbols is U_parts.symbols and V_parts.symbols is U_parts.symbols


def test_relational_route_scope():
    target, _ = _layer(0)
    assert not covers(target, Neighbourhood("2,inf", 0.1))
    assert not covers(target, Neighbourhood("fro", 0.0))
    assert not covers(target.heads[0], Neighbourhood("fro", 0.1))
    assert covers(target, Neighbourhood("2,1", 0.1))


# seed 1's layer takes the routes of seed 0's at both radii (relational-curvature, then jacobian-heads-joint): slow
@pytest.mark.parametrize(("seed", "kind"), [(0, "layer"), pytest.param(1, "layer", marks=pytest.mark.slow),
                                            (2, "block")])
def test_curve_with_the_relational_route_is_sound_and_no_looser(seed, kind):
    from unittest import mock

    from lipbound.local import curve as curve_module
    from lipbound.local.curve import lipschitz_curve
    generated = local_models.model(seed=seed, scale=1.5)
    rng = np.random.default_rng(seed)
    X = generated.layer(0).ln_in(rng.standard_normal((4, 6)))
    eps = [0.03, 0.5]
    curve = lipschitz_curve(generated, X, kind=kind, eps=eps, ascent_steps=3)
    # the certified values and variations come before the witness search and do not depend on it: none here
    with mock.patch.object(curve_module.RelationalRoute, "of", return_value=None):
        alone = lipschitz_curve(generated, X, kind=kind, eps=eps, ascent_steps=0)
    assert curve.relational and not alone.relational
    for with_route, without in zip(curve.points, alone.points):
        assert with_route.verdict == "holds"
        assert with_route.witness <= with_route.certified
        assert with_route.certified <= without.certified * (1 + 1e-12)
        assert with_route.variation <= without.variation * (1 + 1e-12)
