"""The change of z, the score changes centred at X's weights, on a Frobenius ball with the heads' score maps taken
together (lemma curvature-centred-change), checked against z formed here from the scores' derivative: at sampled and
steepest points of the ball and at the largest change an alternating ascent finds (z's change is bilinear in the
movement and the direction), all rows, per head and per query; a purpose-built case where both of the lemma's terms
are needed; and the real first layer of all-MiniLM-L6-v2.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_local_curvature import (
    _centred_rows,
    _frobenius_case,
    _frobenius_points,
    _parts,
    _softmax,
    _steepest_points,
)

from lipbound.local.balls import Neighbourhood
from lipbound.local.bounds import attention_bounds
from lipbound.local.centred_change import CentredChange
from lipbound.local.curvature import AttentionCurvature
from lipbound.local.enclosed import EnclosedAttention
from lipbound.local.zeta_changes import Changes
from lipbound.numeric.model import Head


def _change_tensor(target, X):
    """z's change as a bilinear form: ``T[r, a, b]`` with ``(z(X + Delta) - z(X))_r . e = sum T[r, a, b] e_a Delta_b``,
    rows r = (h, i, j), e and Delta flattened (n d)."""
    at_x = _centred_rows(target, X, X)[0]
    columns = [_centred_rows(target, X, X + step.reshape(X.shape))[0] - at_x for step in np.eye(X.size)]
    return np.stack(columns, axis=-1)


def _centred_jacobian(target, X, Y):
    """z at Y as an array (H, n(i), n(j), n(m), d): ``ds_ij`` differentiated by token m's coordinates straight from
    ``s_ij = c q_i . k_j`` (``c (delta_im W_Q k_j^T + delta_jm W_K q_i^T)``), centred with X's weights; the same rows as
    ``_centred_rows``, without a pass per direction (for the real layer)."""
    n = X.shape[0]
    eye = np.eye(n)
    out = []
    for W_Q, W_K, _A, b_Q, b_K, _b_A in _parts(target):
        c = 1 / np.sqrt(W_Q.shape[1])
        P_X = _softmax(c * (X @ W_Q + b_Q) @ (X @ W_K + b_K).T)
        q, k = Y @ W_Q + b_Q, Y @ W_K + b_K
        ds = c * (eye[:, None, :, None] * (k @ W_Q.T)[None, :, None, :]
                  + eye[None, :, :, None] * (q @ W_K.T)[:, None, None, :])            # (i, j, m, d)
        out.append(ds - np.einsum("il,ilmd->imd", P_X, ds)[:, None])
    return np.stack(out)


def _largest_change(T, scales, t, rng, starts=3, steps=40):
    """Alternating ascent on ``||diag(s) (z(X + Delta) - z(X))||_2`` over ``||Delta||_F = t`` (T of
    :func:`_change_tensor`, s over its rows): for fixed Delta the top singular pair, then the Delta the pair reads
    most."""
    S = scales[:, None, None] * T
    best = 0.0
    for _ in range(starts):
        delta = rng.standard_normal(T.shape[2])
        delta *= t / np.linalg.norm(delta)
        for _ in range(steps):
            u, value, v = np.linalg.svd(S @ delta)
            best = max(best, value[0])
            along = np.einsum("r,rab,a->b", u[:, 0], S, v[0])
            delta = t * along / max(np.linalg.norm(along), 1e-300)
    return best


def _rows(moved, axis, k, n):
    """The rows of head k (axis 0) or query k (axis 1) of ``moved`` (H, n, n, columns), or all (axis None)."""
    if axis is None:
        return moved.reshape(-1, moved.shape[-1])
    return np.take(moved, k, axis=axis).reshape(-1, moved.shape[-1])


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["head", "layer"]), n=st.integers(2, 4),
       scale=st.sampled_from([0.5, 1.5, 4.0]), eps=st.sampled_from([0.05, 0.3, 1.0]))
def test_the_centred_changes_with_the_heads_together_hold_on_the_ball(seed, kind, n, scale, eps):
    """``||diag(s) (z(Y) - z(X))||_2`` against :class:`CentredChange` at points of the Frobenius ball (random,
    steepest, and the ascent's largest), over all rows, per head and per query, for random row scales."""
    rng, target, X, *_ = _frobenius_case(seed, kind, n, scale, eps)
    E = EnclosedAttention(target, X)
    heads = CentredChange(E)
    H = len(_parts(target))
    scales = rng.uniform(0, 2, (H, n, n))
    bounds = {axis: heads.norms(scales, eps, axis) for axis in (None, 0, 1)}
    at_x = _centred_rows(target, X, X)[0]
    for Y in _frobenius_points(rng, X, eps, 2 * n) + _steepest_points(target, X, eps):
        z = _centred_rows(target, X, Y)[0]
        np.testing.assert_allclose(_centred_jacobian(target, X, Y).reshape(z.shape), z, atol=1e-9)   # (real layer's)
        moved = (scales.reshape(-1, 1) * (z - at_x)).reshape(H, n, n, -1)
        for axis, bound in bounds.items():
            for k in range(1 if axis is None else moved.shape[axis]):
                largest = bound if axis is None else bound[k]
                assert np.linalg.norm(_rows(moved, axis, k, n), 2) <= largest * (1 + 1e-9) + 1e-12
    T = _change_tensor(target, X).reshape(H, n, n, X.size, X.size)
    for axis, bound in bounds.items():
        for k in range(1 if axis is None else T.shape[axis]):
            rows = np.take(T, k, axis=axis) if axis is not None else T
            s = np.take(scales, k, axis=axis) if axis is not None else scales
            found = _largest_change(rows.reshape(-1, X.size, X.size), s.ravel(), eps, rng)
            assert found <= (bound if axis is None else bound[k]) * (1 + 1e-9) + 1e-12


def test_both_terms_of_the_lemma_are_needed():
    """One head with ``W_Q = W_K = I`` on two tokens, the scales on row (0, 1) alone: z's change there is ``c p_0
    (e_0 . (Delta_1 - 2 Delta_0) + e_1 . Delta_0)``, whose largest norm on the unit ball is ``c p_0 (1 + 2^(1/2))``
    (the top singular value of [[-2, 1], [1, 0]]).  The lemma gives ``2^(3/2) c p_0`` (0.85 of it reached); either
    term alone, ``2^(1/2) c p_0``, is exceeded."""
    d = 2
    head = Head(np.eye(d), np.eye(d), np.eye(d), np.zeros(d), np.zeros(d), np.zeros(d), name="identity")
    X = np.array([[0.3, -0.2], [0.5, 0.4]])
    E = EnclosedAttention(head, X)
    p0, c = E.P.mid[0, 0, 0], 1 / np.sqrt(d)
    scales = np.zeros((1, 2, 2))
    scales[0, 0, 1] = 1.0
    bound = CentredChange(E).norms(scales, 1.0, None)
    truth = _largest_change(_change_tensor(head, X), scales.ravel(), 1.0, np.random.default_rng(0))
    np.testing.assert_allclose(truth, c * p0 * (1 + np.sqrt(2)), rtol=1e-9)
    np.testing.assert_allclose(bound, 2 * np.sqrt(2) * c * p0, rtol=5e-3)   # (the certified norms' margin)
    assert truth <= bound
    assert truth > np.sqrt(2) * c * p0 * (1 + 1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_heads_together_are_below_the_blocks_bound_on_generated_layers(seed):
    """On layers of several heads whose score maps read different directions, the centred part's norms with the heads
    together are below the blockwise ones (the tokens sharing the radius) over all rows and per query."""
    rng, target, X, curvature, balls, facts, deviation = _frobenius_case(seed, "layer", 4, 1.5, 0.3)
    centred = deviation[2][0]
    blockwise = Changes(centred.per_token, centred.fixed, centred.linear, centred.radii, centred.frobenius)
    scales = rng.uniform(0.5, 1.5, centred.per_token.shape[:3])
    assert centred.norms(scales) < blockwise.norms(scales)
    assert np.all(centred.norms(scales, 1) <= blockwise.norms(scales, 1))


def test_the_real_first_layer_keeps_its_centred_changes_below_the_bound():
    """all-MiniLM-L6-v2's first attention layer at four tokens, the Frobenius ball of 1e-2 of its LayerNorm radius:
    z's change at sampled and steepest points, per query and over all rows, below the lemma's bound, which is below
    the blockwise one."""
    from lipbound.local.chains import chain_for
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat sat on the mat."))[0][:4]
    n = X.shape[0]
    eps = 1e-2 * bert.layernorm_feeding(0).radius_about_center
    target = chain_for(bert.model, "layer", 0)[0].target
    E = EnclosedAttention(target, X)
    curvature = AttentionCurvature(E, target)
    balls = Neighbourhood("fro", eps).balls(X)
    facts = attention_bounds(target, balls, E).facts
    centred = curvature._functional_deviation(facts, balls.radii, eps)[2][0]
    H = E.engine.H
    scales = np.sqrt(facts["p_hi"])
    whole, per_query = centred.norms(scales), centred.norms(scales, 1)
    blockwise = Changes(centred.per_token, centred.fixed, centred.linear, centred.radii, centred.frobenius)
    assert whole < blockwise.norms(scales)
    at_x = _centred_jacobian(target, X, X)
    rng = np.random.default_rng(0)
    for Y in _frobenius_points(rng, X, eps, 6) + _steepest_points(target, X, eps)[::8]:
        moved = (scales[..., None, None] * (_centred_jacobian(target, X, Y) - at_x)).reshape(H, n, n, -1)
        assert np.linalg.norm(moved.reshape(-1, moved.shape[-1]), 2) <= whole
        for i in range(n):
            assert np.linalg.norm(moved[:, i].reshape(-1, moved.shape[-1]), 2) <= per_query[i]
