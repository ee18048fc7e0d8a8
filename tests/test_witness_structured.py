"""Structured witness inputs on the domain attention really lives on: two keys tied for many
queries, positions in the chart of an ellipsoid (a LayerNorm image), moves in the tokens' own
coordinates (lipbound.numeric.witness.structured).

Independent routes: the predicted Jacobian norm against power iteration on the attention engine
at the same input; the tie and the lift against scores computed from the head's own weights; the
inputs against the domain's own membership test; a multi-head start against the layer's Jacobian.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_loaders import WHISPER

from lipbound.errors import AssumptionError
from lipbound.numeric.attention import head_scores
from lipbound.numeric.domains import LayerNormOutputs, TokenBall
from lipbound.numeric.model import Layer, load_default, load_weights
from lipbound.numeric.recheck import recheck
from lipbound.numeric.sdp import matrix_aware_closed_form
from lipbound.numeric.witness import search_witness, structured_starts
from lipbound.numeric.witness.problem import SearchProblem
from lipbound.numeric.witness.starts import TieSurrogate, cross_starts
from lipbound.numeric.witness.structured import TieForm, predicted_norm


@pytest.fixture(scope="module")
def layer0():
    return load_default().layer(0)


def _in_domain(domain, tokens, slack=1e-9):
    """Membership by the domain's own description: a LayerNorm image is ``beta + gamma z``,
    ``z`` orthogonal to 1, ``||z|| <= sqrt(d)``."""
    norm = domain.norm
    z = (tokens - norm.beta) / norm.gamma
    d = tokens.shape[-1]
    return np.all(np.abs(z.sum(axis=-1)) <= 1e-6 * math.sqrt(d)) and \
        np.all(np.linalg.norm(z, axis=-1) <= math.sqrt(d) * (1 + slack))


def test_structured_starts_on_a_layernorm_image(layer0):
    """On the image of the embedded MiniLM's LayerNorm (semi-axes spread over two orders of magnitude),
    the predicted norm matches power iteration, the two keys tie for the queries, the queries' own
    score lies ``margin`` below the keys', and every token lies on the image."""
    head, domain = layer0.heads[0], LayerNormOutputs(layer0.ln_in)
    problem = SearchProblem(head, "self", domain, None, 8, None)
    W_Q, W_K, W_V, b_Q, _, _ = problem.engine.head_weights(0)
    Z, phi = structured_starts(W_Q, W_K, W_V, b_Q, 1 - 1e-6, 8, count=8, steps=150, shape=problem.context.root)
    assert np.all(np.diff(phi) <= 0)
    sigma, _ = problem.sigma(Z[:3], steps=60)
    np.testing.assert_allclose(sigma, phi[:3], rtol=0.03)
    tokens = problem.lift(Z)[0]
    assert _in_domain(domain, tokens)
    scores = head_scores(head, tokens[0], tokens[0])[0]     # rows: queries, columns: keys
    queries = scores[2:]
    np.testing.assert_allclose(queries[:, 0], queries[:, 1], rtol=0, atol=1e-7 * np.abs(queries).max())
    assert np.all(queries[:, 0] - np.diag(scores)[2:] >= 10.0 * (1 - 1e-6))
    with pytest.raises(AssumptionError, match="at least 3"):
        structured_starts(W_Q, W_K, W_V, b_Q, 1.0, 2, shape=problem.context.root)


def test_structured_witness_reaches_the_construction_on_an_ellipsoid(layer0):
    """The search on a LayerNorm image starts from the construction in the image's own metric: with
    the same budget, it finds at least what the construction predicts, and the witness re-checks."""
    head, domain = layer0.heads[0], LayerNormOutputs(layer0.ln_in)
    problem = SearchProblem(head, "self", domain, None, 8, None)
    W_Q, W_K, W_V, b_Q, _, _ = problem.engine.head_weights(0)
    _, phi = structured_starts(W_Q, W_K, W_V, b_Q, 1 - 1e-6, 8, count=8, steps=150, shape=problem.context.root)
    witness = search_witness(head, domain=domain, n=8, budget_seconds=1.0)
    assert witness.value >= 0.97 * phi[0]
    assert recheck(witness, head).valid


def test_tie_form_prediction_is_the_jacobian_on_a_ball():
    """On a ball (S = R I) with the scores saturated, the prediction is the top singular value
    of the Jacobian at the structured input: self-attention, and each role of cross-attention."""
    rng = np.random.default_rng(3)
    d, d_k = 6, 3
    head_scale = 4.0
    from lipbound.numeric.model import Head
    head = Head(head_scale * rng.standard_normal((d, d_k)), head_scale * rng.standard_normal((d, d_k)),
                rng.standard_normal((d, 4)))
    ball = TokenBall(3.0)
    for role in ("cross-context", "cross-queries", "cross-joint"):
        problem = SearchProblem(head, role, ball, ball, 6, 4)
        pool = cross_starts(problem, np.random.default_rng(0), heads=1)
        assert {family for _, family in pool} == {"cross-structured", "cross-alternating"}
        for Z, _ in pool:
            X, Y = problem.lift(Z)
            assert np.all(np.linalg.norm(X, axis=-1) <= 3.0) and np.all(np.linalg.norm(Y, axis=-1) <= 3.0)
        form = TieForm(problem.context.root, *_weights(problem), 4, role, query_shape=problem.queries.root)
        a, b = _tied_pair(form, rng)
        first, second = form.keys(a, b)
        q, x = problem.queries, problem.context
        U = np.zeros((1, problem.rows, problem.width))
        U[0, q.rows, :q.width] = b[0]
        U[0, x.rows, :x.width] = form.parked(b)[0]
        U[0, x.rows.start, :x.width], U[0, x.rows.start + 1, :x.width] = first[0], second[0]
        sigma, _ = problem.sigma(problem.from_unit(U), steps=80)
        np.testing.assert_allclose(sigma, predicted_norm(form, a, b), rtol=0.02)


def _weights(problem):
    engine = problem.engine
    W_Q, W_K, V, b_Q, _, _ = engine.head_weights(0, queries=True)
    return W_Q @ W_K.T / math.sqrt(engine.d_k), W_K @ b_Q / math.sqrt(engine.d_k), V


def _tied_pair(form, rng):
    """A chart pair (a, b) with the keys tied and the other tokens' scores far below."""
    while True:
        b = rng.standard_normal((1, form.B.shape[0]))
        b /= np.linalg.norm(b)
        if np.linalg.norm(form.gradient(b) @ form.S) > 40:
            return form.tie(rng.standard_normal((1, form.S.shape[0])), b), b


def test_tie_surrogate_places_keys_tied_for_every_chosen_head(layer0):
    """A layer's start tied for several heads at once: the keys tie for each chosen head and, with
    the queries, lie on the image."""
    domain = LayerNormOutputs(layer0.ln_in)
    problem = SearchProblem(layer0.attention, "self", domain, None, 8, None)
    surrogate = TieSurrogate(problem, 8)
    rng = np.random.default_rng(1)
    b = rng.standard_normal(problem.width)
    b /= np.linalg.norm(b)
    a = rng.standard_normal(problem.width)
    first, second = surrogate.place(a, b, [0, 3, 5])
    assert np.linalg.norm(first) <= 1 + 1e-12 and np.linalg.norm(second) <= 1 + 1e-12
    for h in (0, 3, 5):
        normal = surrogate.forms[h].gradient(b[None])[0] @ surrogate.S
        assert abs(normal @ (first - second)) <= 1e-9 * np.linalg.norm(normal)
    U = np.tile(b, (8, 1))
    U[0], U[1] = first, second
    tokens = problem.lift(problem.from_unit(U[None]))[0]
    assert _in_domain(domain, tokens)


def test_whisper_encoder_head_on_its_layernorm_image():
    """Whisper tiny.en's first encoder LayerNorm has gains from 1e-5 to 8: a construction in the
    chart's own metric would move the keys along the long axes, where the scores barely change.
    With the construction in the tokens' metric, one nominal second of search finds at least
    0.4 of the matrix-aware certified bound (a gap of at most 2.5), and the witness re-checks."""
    layer = load_weights(WHISPER, layers=[0]).layer(0, "encoder")
    head, domain = layer.attention.heads[0], LayerNormOutputs(layer.ln_in)
    witness = search_witness(head, domain=domain, n=8, budget_seconds=1.0, seed=0)
    bound = matrix_aware_closed_form(head, domain, n=8, solver="eig")
    assert bound.certified
    assert 0.4 * bound.value <= witness.value <= bound.value
    assert witness.details["family"] == "structured"
    assert recheck(witness, head).valid


def test_a_layers_structured_starts_see_each_head_through_its_block_of_W_O():
    """A whole layer's search starts from each head's structured inputs for the value map the layer
    applies, ``W_V^h W_O^h``: on the embedded MiniLM layer 5 the layer's witness reaches the layer's own
    Jacobian norm at the witness of head 5 alone through its block of ``W_O`` (a separate search),
    which the heads' ``W_V`` alone steer away from (382 against 434 at a budget of 3)."""
    layer = load_default().layer(5)
    domain = LayerNormOutputs(layer.ln_in)
    attention = layer.attention
    whole = Layer(attention.heads, attention.W_O, attention.b_O)
    d_v = attention.heads[5].d_v
    alone = Layer([attention.heads[5]], attention.W_O[5 * d_v:6 * d_v])
    reference = search_witness(alone, domain=domain, n=8, budget_seconds=0.5, seed=0)
    problem = SearchProblem(whole, "self", domain, domain, 8, None)
    at_reference = float(problem.sigma(problem.to_work(reference.X[None]))[0][0])
    found = search_witness(whole, domain=domain, n=8, budget_seconds=0.5, seed=0)
    assert found.value >= 0.99 * at_reference, (found.value, at_reference)
