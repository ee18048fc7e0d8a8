"""The whole layer's joint bound (lipbound.numeric.sdp.layer): the inequalities of its steps on generated
data (the query term's halving, the key term's condition with the offsets inside, the rows of step 5),
the forms binding on a real layer, and generated layers against witnesses and finite-difference
Jacobians."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_layers import check_case, tangent_basis
from test_sdp_rows import row_form

from lipbound.numeric.domains import LayerNormOutputs
from lipbound.numeric.model import Layer, load_default
from lipbound.numeric.sdp import layer_joint_bound


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2 ** 31), size=st.integers(1, 6), rank=st.integers(1, 6), aligned=st.floats(-1.0, 1.0))
def test_query_halving_lemma(seed, size, rank, aligned):
    """Step 1: for ``C >= 0``, ``t^T C q <= tr C (||t|| ||q|| + t . q) / 2`` (the largest eigenvalue of
    ``(q t^T + t q^T) / 2``), on generated covariances, some of rank one along the worst direction."""
    rng = np.random.default_rng(seed)
    t, q = rng.standard_normal(size), rng.standard_normal(size)
    q = aligned * np.linalg.norm(q) / np.linalg.norm(t) * t + (1 - abs(aligned)) * q
    Z = rng.standard_normal((size, rank))
    if rng.random() < 0.3:       # the worst rank-one covariance: along the top eigenvector of q t^T + t q^T
        values, vectors = np.linalg.eigh(np.outer(q, t) + np.outer(t, q))
        Z = vectors[:, -1:]
    C = Z @ Z.T
    bound = np.trace(C) * (np.linalg.norm(t) * np.linalg.norm(q) + t @ q) / 2
    assert t @ C @ q <= bound + 1e-12 * (1 + abs(bound))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2 ** 31), heads=st.integers(1, 5), p=st.integers(1, 6), k=st.integers(1, 4),
       sigma=st.floats(1e-3, 1e3))
def test_offsets_inside_the_condition(seed, heads, p, k, sigma):
    """Step 2: the matrix with columns ``(F_h w + k_h) / lambda_h^(1/2)`` has norm at most ``(r^2 + 1 /
    sigma)^(1/2) lambda_max(sum_h (F_h F_h^T + sigma k_h k_h^T) / lambda_h)^(1/2)`` for ``||w|| <= r``; w drawn
    at random and along the worst direction of the stacked F."""
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((heads, p, k))
    offsets = rng.standard_normal((heads, p)) * rng.uniform(0, 3)
    lam = rng.uniform(0.1, 5.0, heads)
    r = rng.uniform(0.1, 3.0)
    form = sum((F[h] @ F[h].T + sigma * np.outer(offsets[h], offsets[h])) / lam[h] for h in range(heads))
    bound = math.sqrt(r * r + 1 / sigma) * math.sqrt(max(np.linalg.eigvalsh(form)[-1], 0.0))
    stacked = np.hstack([F[h] / math.sqrt(lam[h]) for h in range(heads)])
    worst = np.linalg.svd(stacked)[2][0].reshape(heads, k)
    for w in (rng.standard_normal(k), worst[int(rng.integers(heads))]):
        w *= r / max(np.linalg.norm(w), 1e-300)
        columns = np.stack([(F[h] @ w + offsets[h]) / math.sqrt(lam[h]) for h in range(heads)], axis=1)
        assert np.linalg.norm(columns, 2) <= bound * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2 ** 31), n=st.integers(2, 9), heads=st.integers(1, 6), peaked=st.floats(0.05, 20.0),
       concentrated=st.floats(0.0, 1.0))
def test_layer_rows_lemma(seed, n, heads, peaked, concentrated):
    """The layer's step 5: H heads' row-stochastic weights, shares ``pi_h >= 0`` of a row's key gradient with
    ``sum_h pi_h <= 1`` and unit token norms eps: the sum over rows of ``(b eps_i + sum_h L_h u^h_i + kappa
    (sum_j nu_ij eps_j^2)^(1/2))^2``, ``nu_ij = sum_h pi_ih 2 p^h_ij (1 - p^h_ij)``, stays below step 9's bound
    with ``L = sum_h L_h``, ``rho beta = kappa`` and the cap ``2 max p (1 - p)`` over every head and row."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(n, 1.0 / peaked), size=(heads, n))
    if rng.random() < 0.5:      # every head ties two keys of its own choice
        P = np.zeros((heads, n, n))
        for h in range(heads):
            for i in range(n):
                P[h, i, rng.choice(n, 2, replace=False)] = 0.5
    shares = rng.dirichlet(np.ones(heads), size=n) * rng.uniform(0.5, 1.0, (n, 1))       # (rows, heads)
    nu = np.einsum("ih,hij->ij", shares, 2 * P * (1 - P))
    eps = np.abs(rng.standard_normal(n)) ** (1 + 6 * concentrated)
    eps /= np.linalg.norm(eps)
    b, kappa = rng.uniform(0, 5, 2)
    L = rng.uniform(0, 2, heads)
    means = np.sqrt(np.einsum("hij,j->hi", P, eps ** 2))                                     # u^h_i
    rows = b * eps + L @ means + kappa * np.sqrt(nu @ eps ** 2)
    cap = max(float(np.max(2 * P * (1 - P))), 1e-3)
    bound = row_form(n, b, float(L.sum()), kappa, cap)
    assert np.sum(rows ** 2) <= bound ** 2 * (1 + 1e-12)


def test_the_layer_forms_bind_on_a_real_layer():
    """Two heads of the embedded MiniLM layer 0 with their block of W_O (n = 8, LayerNorm image): the halved
    query term is below the weighted Cauchy-Schwarz one, the offsets inside the key term's condition are
    chosen, and the row form is what the joint bound reports, below Minkowski's ``b + m + k``."""
    layer = load_default().layer(0)
    two = Layer(layer.heads[:2], layer.attention.W_O[:2 * layer.heads[0].d_v])
    value = layer_joint_bound(two, LayerNormOutputs(layer.ln_in), n=8)
    details = value.details
    assert details["query"] == details["query_halved"] < 0.8 * details["query_joint"]
    # X from the weights and the LayerNorm's own description: M = diag(gamma) (I - 1 1^T / d), r^2 = d
    d = layer.attention.d
    M = layer.ln_in.gamma[:, None] * (np.eye(d) - 1.0 / d)
    basis = tangent_basis(LayerNormOutputs(layer.ln_in), d)
    Pi = basis @ basis.T
    X = sum(two.output_block(h).T @ head.W_V.T @ M @ M.T @ head.W_K @ head.W_Q.T @ Pi / math.sqrt(head.d_k)
            for h, head in enumerate(two.heads))
    expected = (details["query_joint"] + d * np.linalg.norm(X, 2)) / 2
    assert abs(details["query_halved"] - expected) <= 1e-6 * expected
    assert details["key_weights"]["offset_scale"] is not None
    assert details["row_form"] < 0.97 * (details["query"] + details["key"] + details["mean"])
    assert value.value == details["row_form"]


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 31), n=st.integers(3, 5), scale=st.sampled_from([1.0, 6.0]))
def test_no_point_beats_the_joint_bound(seed, n, scale):
    """Generated layers (self-attention on a LayerNorm image, causal on a ball, cross-attention jointly): the
    search's witness, re-checked, and finite-difference Jacobians stay below the joint bound itself."""
    for kind, domains in (("dot", ("ln",)), ("causal", ("ball",)), ("cross-joint", ("ln", "ball"))):
        lower, _, bounds = check_case(kind, "layer", domains, seed, n, 3, 2, scale, budget=0.15)
        joint = next(b for b in bounds if b.name == "joint")
        assert lower <= joint.value * (1 + 1e-6), (kind, lower, joint.value)


def test_the_row_split_of_causal_layers_is_below_the_minkowski_sum_and_no_point_beats_it():
    """Step 6 of :mod:`lipbound.numeric.sdp.layer` on generated causal layers (a ball and a LayerNorm image): the split
    is certified below ``b + mean + k``, and the search's re-checked witness and finite-difference Jacobians at
    boundary points stay below the joint bound (:func:`test_layers.check_case`)."""
    for seed, domains in ((3, ("ball",)), (11, ("ln",))):
        lower, _, bounds = check_case("causal", "layer", domains, seed, 5, 3, 2, 2.0, budget=0.15)
        joint = next(b for b in bounds if b.name == "joint")
        details = joint.details
        assert details["coupled_rows"] < details["query"] + details["key"] + details["mean"]
        assert joint.value <= details["coupled_rows"]
        assert lower <= joint.value * (1 + 1e-6)
