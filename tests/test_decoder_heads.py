"""Heads and layers of the decoders people deploy: rotary positions, QK-norm, grouped-query attention,
causal masks, sliding windows, position biases and soft-capped logits, on a ball or an RMSNorm image.

Soundness: every certified bound ``verify`` reports (the theorem the head's facts select, the
matrix-aware and joint forms of :mod:`lipbound.numeric.sdp.rotary`) against the spectral norm of a
Jacobian computed here, by central differences of the independent forward pass of
tests/decoder_reference.py (Llama / Qwen3 / Gemma attention, written from the published equations), at
lipbound's own witness and at random points of the domain.  Weights, shapes, masks, ratios of query to
key/value heads and domains come from hypothesis.
"""

from __future__ import annotations

import math
import os

import decoder_reference as reference
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError
from lipbound.numeric.certify import head_bounds, layer_bounds
from lipbound.numeric.dispatch import head_facts, head_variant, positional_scope
from lipbound.numeric.domains import DomainSpec, RMSNormOutputs, TokenBall
from lipbound.numeric.evaluate import symbol_intervals
from lipbound.numeric.kernels import ALiBi, AttentionMask, DotProduct, QKNorm, Rotary, Sigmoid, T5Bias
from lipbound.numeric.model import Head, Layer, RMSNorm
from lipbound.numeric.offsets import HeadRows, offsets_of, rotation_enclosure
from lipbound.numeric.sdp.region import Region
from lipbound.numeric.sdp.rotary import PositionalHeadBounds, positional_bound
from lipbound.numeric.sdp.rotary_layer import positional_layer_bound
from lipbound.numeric.witness import search_witness
from lipbound.numeric.witness.kernel_starts import rotary_tied_keys
from lipbound.numeric.witness.problem import SearchProblem
from lipbound.numeric.witness.values import jacobian_parts
from lipbound.rigorous.intervals import lower, upper
from lipbound.rigorous.linalg import Enclosure
from lipbound.symbolic.assumptions import Assumptions, RMSNormImage

SLOW = os.environ.get("LIPBOUND_SLOW") == "1"
# LIPBOUND_EXAMPLES=N draws N cases (a longer soundness run); LIPBOUND_SLOW=1 draws 300
EXAMPLES = int(os.environ.get("LIPBOUND_EXAMPLES", "300" if SLOW else "6"))
CASES = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: nominal seconds of each witness search in the soundness test: on these tiny maps a nominal second costs about
#: one CPU second, and at 0.2 every stage of the search (starts, continuation, polish) runs in all 12 searches
#: (at 0.1 the continuation did not in two); the slow profile searches longer
SEARCH_BUDGET = 1.2 if SLOW else 0.2


# The reference: one head through tests/decoder_reference.py -----------------------------------------
def reference_head(head: Head, X: np.ndarray) -> np.ndarray:
    """One head at positions 0..n-1: QK-norm, RoPE, scores, soft-cap, bias, mask, softmax, values."""
    n = X.shape[0]
    kernel, mask = head.kernel, head.mask
    Q, K, V = ((X @ W + b)[:, None, :] for W, b in ((head.W_Q, head.b_Q), (head.W_K, head.b_K), (head.W_V, head.b_V)))
    rotary = kernel if isinstance(kernel, Rotary) else getattr(kernel, "rotary", None)
    if isinstance(kernel, QKNorm):
        Q, K = reference.rms_norm(Q, kernel.gamma_q, kernel.eps), reference.rms_norm(K, kernel.gamma_k, kernel.eps)
    if rotary is not None:
        Q, K = (reference.rope(U, rotary.base, rotary.pairing, rotary.dims) for U in (Q, K))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if isinstance(mask.bias, ALiBi):
        bias = -mask.bias.slope * np.abs(i - j)
    elif mask.bias is not None:
        bias = mask.bias.matrix(np.arange(n), np.arange(n))     # a constant table: only the weights see it
    else:
        bias = None
    return reference.attention(Q, K, V, 1 / math.sqrt(head.d_k), mask.window, mask.softcap, mask.causal, bias)


def reference_map(target):
    if isinstance(target, Head):
        return lambda X: reference_head(target, X)
    return lambda X: np.concatenate([reference_head(h, X) for h in target.heads], axis=1) @ target.W_O


def reference_norm(target, X: np.ndarray, step: float = 1e-6) -> float:
    """``||Df(X)||_2`` by central differences of the reference (Frobenius norms on inputs and outputs)."""
    f = reference_map(target)
    columns = []
    for index in range(X.size):
        E = np.zeros(X.size)
        E[index] = step
        E = E.reshape(X.shape)
        columns.append(((f(X + E) - f(X - E)) / (2 * step)).reshape(-1))
    return float(np.linalg.norm(np.array(columns).T, 2))


def layer_setting(layer, domain, n: int):
    """``(region, per-head constants, W_O blocks, value forms)`` as ``positional_layer_bound`` forms them."""
    region = Region.of(domain, None, layer.d)
    heads = [PositionalHeadBounds(head, region, n, output=layer.output_block(h)) for h, head in enumerate(layer.heads)]
    blocks = [Enclosure.exact(layer.output_block(h)) for h in range(layer.num_heads)]
    value_forms = []
    for head in layer.heads:
        shaped = region.times_shape(Enclosure.exact(head.W_V.T))
        value_forms.append((shaped @ shaped.T).sym())
    return region, heads, blocks, value_forms


def layer_part(layer, X: np.ndarray, moving: str, step: float = 1e-6) -> np.ndarray:
    """The part of a causal rotary layer's Jacobian (n d_out, n d) where the tokens move only as ``moving``
    (``"queries"`` or ``"keys"``), the other roles fixed at X, by central differences of the reference forward."""

    def forward(Y: np.ndarray) -> np.ndarray:
        roles = {"queries": X, "keys": X, moving: Y}
        outputs = []
        for head in layer.heads:
            kernel = head.kernel
            Q, K, V = (Z[:, None, :] for Z in (roles["queries"] @ head.W_Q, roles["keys"] @ head.W_K, X @ head.W_V))
            Q, K = (reference.rope(U, kernel.base, kernel.pairing, kernel.dims) for U in (Q, K))
            outputs.append(reference.attention(Q, K, V, 1 / math.sqrt(head.d_k), None, None, True, None))
        return (np.concatenate(outputs, axis=1) @ layer.W_O).reshape(-1)

    columns = []
    for index in range(X.size):
        E = np.zeros(X.size)
        E[index] = step
        E = E.reshape(X.shape)
        columns.append((forward(X + E) - forward(X - E)) / (2 * step))
    return np.array(columns).T


# Generated decoders ------------------------------------------------------------------------------
SHAPES = ("llama", "qwen3", "gemma2", "gemma3", "masked")


def soundness_kernels() -> set[str]:
    """The names of the kernels the soundness test below draws (tests/test_head_kinds.py's completeness
    test counts them as covered)."""
    rng = np.random.default_rng(0)
    return {head.kernel.name for shape in SHAPES for head in _layer(shape, rng, 4, 4, 2, 1, 1.0).heads}


def _layer(shape: str, rng, d: int, d_k: int, heads: int, groups: int, scale: float) -> Layer:
    """A tiny attention layer of the named family: Llama (RoPE, GQA, causal), Qwen3 (QK-norm then RoPE),
    Gemma 2 (soft-capped logits, a sliding window), Gemma 3 (QK-norm, window), or a dot product with an
    ALiBi or T5 bias."""
    rotary = Rotary(base=float(rng.choice([3.0, 100.0, 10000.0])), pairing=str(rng.choice(["half", "interleaved"])),
                    dims=None if rng.random() < 0.7 or d_k < 4 else 2)
    if shape == "llama":
        kernel, mask = rotary, AttentionMask(causal=True)
    elif shape == "qwen3":
        kernel = QKNorm(rng.uniform(0.3, 1.5, d_k), rng.uniform(0.3, 1.5, d_k), eps=1e-3, rotary=rotary)
        mask = AttentionMask(causal=True)
    elif shape == "gemma2":
        kernel, mask = rotary, AttentionMask(causal=True, window=int(rng.integers(1, 4)),
                                             softcap=float(rng.uniform(1, 8)))
    elif shape == "gemma3":
        kernel = QKNorm(rng.uniform(0.3, 1.5, d_k), rng.uniform(0.3, 1.5, d_k), eps=1e-3, rotary=rotary)
        mask = AttentionMask(causal=True, window=int(rng.integers(2, 4)))
    else:
        kernel = DotProduct()
        bias = ALiBi(float(rng.uniform(0.1, 1.0))) if rng.random() < 0.5 \
            else T5Bias(rng.standard_normal(8), 8, 16, True)
        mask = AttentionMask(causal=bool(rng.random() < 0.5), bias=bias)
    biased = shape in ("masked", "qwen3") and rng.random() < 0.5
    per_group = heads // groups
    W_K = [scale * rng.standard_normal((d, d_k)) for _ in range(groups)]
    W_V = [rng.standard_normal((d, d_k)) for _ in range(groups)]
    b_K = [rng.standard_normal(d_k) if biased else None for _ in range(groups)]
    made = tuple(Head(scale * rng.standard_normal((d, d_k)), W_K[h // per_group], W_V[h // per_group],
                      b_Q=rng.standard_normal(d_k) if biased else None, b_K=b_K[h // per_group], kernel=kernel,
                      mask=mask) for h in range(heads))
    return Layer(made, rng.standard_normal((heads * d_k, d)) / math.sqrt(heads * d_k),
                 groups=tuple(h // per_group for h in range(heads)) if groups < heads else None)


def _domain(rng, d: int, kind: str):
    if kind == "rmsnorm":
        return RMSNormOutputs(RMSNorm(rng.uniform(0.05, 1.0, d), 1e-5))
    return TokenBall(float(rng.uniform(0.3, 2.0)), rng.standard_normal(d) if kind == "centred" else None)


cases = st.fixed_dictionaries({
    "shape": st.sampled_from(SHAPES), "d": st.integers(2, 5), "d_k": st.sampled_from([2, 4]),
    "n": st.integers(1, 5), "heads": st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (3, 1)]),
    "scale": st.sampled_from([0.3, 1.0, 2.5]), "domain": st.sampled_from(["rmsnorm", "ball", "centred"]),
    "seed": st.integers(0, 2 ** 31),
})


#: generated causal RoPE grouped-query layers of :func:`rotary_case` (the sdp lemmas' tests)
rotary_cases = st.fixed_dictionaries({"d": st.integers(3, 6), "n": st.integers(2, 5),
                                      "heads": st.sampled_from([(2, 1), (4, 2), (2, 2)]),
                                      "domain": st.sampled_from(["ball", "rmsnorm"]), "seed": st.integers(0, 2 ** 31)})


def rotary_case(case) -> tuple:
    """``(rng, layer, domain)`` of a :data:`rotary_cases` draw: a Llama-shaped layer with head size 2 and a token
    ball or an RMSNorm image as the domain (``rng`` then draws the points)."""
    rng = np.random.default_rng(case["seed"])
    heads, groups = case["heads"]
    layer = _layer("llama", rng, case["d"], 2, heads, groups, 2.0)
    domain = TokenBall(float(rng.uniform(0.5, 2.0))) if case["domain"] == "ball" else \
        RMSNormOutputs(RMSNorm(rng.uniform(0.1, 1.0, case["d"]), 1e-5))
    return rng, layer, domain


def _points(rng, domain, n: int, d: int, count: int) -> list[np.ndarray]:
    """Points of the domain: random ones and ones on its boundary."""
    radius, center = domain.enclosing_ball()
    out = []
    for k in range(count):
        X = rng.standard_normal((n, d))
        if isinstance(domain, RMSNormOutputs):
            u = X / np.linalg.norm(X, axis=1, keepdims=True) * math.sqrt(domain.norm.d) * (1 - 1e-9)
            X = domain.norm.gamma * u * (rng.uniform(0.3, 1.0) if k % 2 else 1.0)
        else:
            X = (center if center is not None else 0) \
                + radius * (1 - 1e-9) * X / np.linalg.norm(X, axis=1, keepdims=True)
        out.append(X)
    return out


@CASES
@given(cases)
def test_certified_bounds_of_decoder_heads_and_layers_hold_against_an_independent_jacobian(case):
    rng = np.random.default_rng(case["seed"])
    heads, groups = case["heads"]
    layer = _layer(case["shape"], rng, case["d"], case["d_k"], heads, groups, case["scale"])
    domain = _domain(rng, case["d"], case["domain"])
    n = case["n"]
    for target in (layer.heads[0], layer):
        bounds = head_bounds(target, domain, n) if isinstance(target, Head) else layer_bounds(target, domain, n)
        certified = [b for b in bounds if b.certified]
        assert certified and certified[0].name == "derived"
        if positional_scope(target):
            names = {b.name for b in certified}
            assert names >= ({"matrix-aware"} if isinstance(target, Head) else {"joint"})
            if "matrix-aware" not in names:       # left out: its certified floor lies above the joint bound
                _assert_the_skipped_candidate_is_above_its_floor(target, domain, n, certified)
        witness = search_witness(target, domain=domain, n=n, budget_seconds=SEARCH_BUDGET, seed=case["seed"] % 1000)
        at_witness = reference_norm(target, witness.X)
        found = max([at_witness] + [reference_norm(target, X) for X in _points(rng, domain, n, case["d"], 3)])
        np.testing.assert_allclose(at_witness, witness.value, rtol=2e-4, atol=1e-8)
        for bound in certified:
            assert found <= bound.value * (1 + 1e-5) + 1e-9, (bound.name, found, bound.value, case)


def _layer_candidate(layer: Layer, domain, n: int) -> tuple[list, list]:
    """The layer's per-head constants (value maps through ``W_O``) and each head's ``positional_bound``."""
    from lipbound.numeric.sdp.region import Region

    region = Region.of(domain, None, layer.d)
    heads = [PositionalHeadBounds(head, region, n, output=layer.output_block(h)) for h, head in enumerate(layer.heads)]
    return heads, [positional_bound(head, region, n, bounds=hb) for head, hb in zip(layer.heads, heads)]


def _assert_the_skipped_candidate_is_above_its_floor(layer: Layer, domain, n: int, certified: list) -> None:
    joint = next(b for b in certified if b.name == "joint")
    floor = joint.details["matrix_aware_floor"]
    _, split = _layer_candidate(layer, domain, n)
    assert floor > joint.value
    assert sum(v.value for v in split) >= floor


@CASES
@given(st.fixed_dictionaries({"d": st.sampled_from([5, 12]), "d_k": st.sampled_from([2, 4]), "n": st.integers(2, 6),
                              "heads": st.sampled_from([(2, 1), (4, 2)]), "scale": st.sampled_from([0.3, 1.0]),
                              "domain": st.sampled_from(["rmsnorm", "ball"]), "seed": st.integers(0, 2 ** 31)}))
def test_the_floor_under_the_layers_per_head_candidate_lies_below_it(case):
    """The certified floor of :mod:`lipbound.numeric.sdp.rotary_floor` lies below every head's ``positional_bound`` (the
    smallest of its forms), the layer's floor below their sum, and its Rayleigh quotients below the float eigenvalues
    they bound."""
    from lipbound.numeric.sdp.rotary_floor import _rayleigh_floor, candidate_floor, layer_candidate_floor

    rng = np.random.default_rng(case["seed"])
    heads, groups = case["heads"]
    layer = _layer("llama", rng, case["d"], case["d_k"], heads, groups, case["scale"])
    domain, n = _domain(rng, case["d"], case["domain"]), case["n"]
    constants, split = _layer_candidate(layer, domain, n)
    for bounds, value in zip(constants, split):
        floor = candidate_floor(bounds)
        assert floor is not None and 0 < floor <= value.value, (floor, value.value)
        keys, queries = bounds.gram("key_left"), bounds.gram("queries_shaped")
        form = sum(((R.T @ queries @ R).sym() for R in bounds.rotations.values()), start=queries.scale(0.0)).sym()
        exact = np.linalg.eigvalsh(bounds.key_left.mid @ form.mid @ bounds.key_left.mid.T)[-1]
        assert _rayleigh_floor(keys, form) <= exact * (1 + 1e-9) + 1e-12
    floor = layer_candidate_floor(constants)
    assert floor is not None and floor <= sum(v.value for v in split)


def test_a_wide_layer_skips_its_per_head_candidate_and_keeps_the_same_best_bound():
    """A layer of six rotary heads on 24 dimensions, where the joint bound wins by a margin: the per-head candidate is
    not formed, and formed here it is larger than its floor, which is larger than the joint bound."""
    rng = np.random.default_rng(0)
    layer = _layer("llama", rng, 24, 4, 6, 2, 1.0)
    domain = _domain(rng, 24, "rmsnorm")
    bounds = layer_bounds(layer, domain, 6)
    assert [b.name for b in bounds] == ["derived", "joint"]
    joint = bounds[1]
    _, split = _layer_candidate(layer, domain, 6)
    assert sum(v.value for v in split) >= joint.details["matrix_aware_floor"] > joint.value


def test_the_witness_of_rotary_heads_and_layers_is_fixed_by_its_seed():
    """A seed fixes the witness (the work clock, not the wall clock, ends the search): two searches of a rotary GQA
    layer and of one of its heads give the same point, direction and value, also when the rotations' tables are
    formed afresh for the second (their cache emptied)."""
    from lipbound.numeric.kernels.rotary import _tables

    rng = np.random.default_rng(8)
    layer = _layer("llama", rng, 6, 4, 4, 2, 1.0)
    domain = _domain(rng, 6, "rmsnorm")
    for target in (layer.heads[2], layer):
        first = search_witness(target, domain=domain, n=5, budget_seconds=0.05, seed=3)
        _tables.cache_clear()
        again = search_witness(target, domain=domain, n=5, budget_seconds=0.05, seed=3)
        np.testing.assert_array_equal(first.X, again.X)
        np.testing.assert_array_equal(first.E, again.E)
        assert first.value == again.value


def test_one_key_per_row_is_linear_and_the_bounds_are_exact():
    """A window of width 1: each token attends to itself, ``f(X) = X V``; matrix-aware and joint bounds equal
    ``||V||`` and ``||[V_1 .. V_H] W_O||``, which the witness attains."""
    rng = np.random.default_rng(3)
    layer = _layer("llama", rng, 4, 2, 2, 1, 1.0)
    layer = Layer(tuple(Head(h.W_Q, h.W_K, h.W_V, kernel=h.kernel, mask=AttentionMask(causal=True, window=1))
                        for h in layer.heads), layer.W_O, groups=layer.groups)
    domain = TokenBall(1.5)
    head_value = positional_bound(layer.heads[0], domain, 4).value
    np.testing.assert_allclose(head_value, np.linalg.norm(layer.heads[0].W_V, 2), rtol=1e-9)
    joint = positional_layer_bound(layer, domain, 4).value
    stacked = np.concatenate([h.W_V for h in layer.heads], axis=1) @ layer.W_O
    np.testing.assert_allclose(joint, np.linalg.norm(stacked, 2), rtol=1e-9)


# The pieces ----------------------------------------------------------------------------------------
def test_rotation_enclosures_hold_the_kernels_float_rotation_and_compose():
    for pairing in ("half", "interleaved"):
        kernel = Rotary(base=500.0, pairing=pairing, dims=4)
        u = np.arange(1.0, 7.0)
        rotate = lambda x, position: reference.rope(x[None], 500.0, pairing, 4, [position])[0]  # noqa: E731
        for delta in (-5, -1, 0, 3):
            R = rotation_enclosure(kernel, 6, delta)
            float_rotation = kernel.rotation(np.eye(6), np.full(6, float(delta))).F.T
            assert np.all(np.abs(R.mid - float_rotation) <= R.rad + 1e-15)
            np.testing.assert_allclose(R.mid @ u, rotate(u, delta), rtol=1e-12, atol=1e-12)
            assert np.all(R.rad < 1e-15)
        # q^T R(p_j - p_i) k = (R(p_i) q) . (R(p_j) k)
        q, k = np.arange(6.0), np.linspace(-1, 2, 6)
        np.testing.assert_allclose(q @ rotation_enclosure(kernel, 6, 2).mid @ k,
                                   rotate(q, 3) @ rotate(k, 5), rtol=1e-12)


def test_offsets_and_rows_follow_the_mask():
    head = Head(np.eye(2), np.eye(2), np.eye(2), kernel=Rotary(), mask=AttentionMask(causal=True, window=3))
    rows = HeadRows(head, 6)
    assert rows.offsets == (-2, -1, 0) and list(rows.key_counts) == [1, 2, 3, 3, 3, 3]
    assert offsets_of(Head(np.eye(2), np.eye(2), np.eye(2), kernel=Rotary()), 4) == tuple(range(-3, 4))
    assert offsets_of(head, 4, m=2) == tuple(range(-1, 4))
    alibi = Head(np.eye(2), np.eye(2), np.eye(2), mask=AttentionMask(causal=True, bias=ALiBi(0.5)))
    np.testing.assert_allclose(HeadRows(alibi, 4).bias_spread, [0.0, 0.5, 1.0, 1.5])


def test_weight_quantities_of_rotary_heads_are_enclosed():
    """``a = max ||A_Delta||`` and the centre terms, against a float computation over the offsets."""
    rng = np.random.default_rng(5)
    head = Head(rng.standard_normal((5, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 3)),
                b_Q=rng.standard_normal(4), b_K=rng.standard_normal(4), kernel=Rotary(base=7.0),
                mask=AttentionMask(causal=True))
    c = rng.standard_normal(5)
    domain = TokenBall(1.3, c)
    bound = head_variant(head_facts(head)).derive(Assumptions(domain=domain.assumption, norm="fro"))
    values = symbol_intervals(bound, head, domain=domain, n=4)
    named = {str(s): v for s, v in values.items()}
    q_c, k_c = head.W_Q.T @ c + head.b_Q, head.W_K.T @ c + head.b_K
    expected = {"a": 0.0, "g_Q": 0.0, "g_K": 0.0, "s_c": 0.0}
    for delta in range(-3, 1):
        R = head.kernel.rotation(np.eye(4), np.full(4, float(delta))).F.T
        expected["a"] = max(expected["a"], np.linalg.norm(head.W_Q @ R @ head.W_K.T, 2) / 2)
        expected["g_Q"] = max(expected["g_Q"], np.linalg.norm(head.W_K @ R.T @ q_c) / 2)
        expected["g_K"] = max(expected["g_K"], np.linalg.norm(head.W_Q @ R @ k_c) / 2)
        expected["s_c"] = max(expected["s_c"], abs(q_c @ R @ k_c) / 2)
    for name, value in expected.items():
        assert lower(named[name]) <= value * (1 + 1e-12) and value <= upper(named[name]) * (1 + 1e-12)
        assert upper(named[name]) - lower(named[name]) < 1e-9 * (1 + value)


def test_the_coupled_query_term_is_the_joint_gain_without_rotation():
    """On a dot product (one offset) the coupled query term is ``r^2 max_u ||A M u|| ||V^T M u||``."""
    rng = np.random.default_rng(11)
    head = Head(rng.standard_normal((6, 2)), rng.standard_normal((6, 2)), rng.standard_normal((6, 2)),
                mask=AttentionMask(causal=True, window=2))
    bounds = PositionalHeadBounds(head, TokenBall(1.0), 3)
    A, V = head.W_Q @ head.W_K.T / math.sqrt(2), head.W_V
    directions = rng.standard_normal((200000, 6))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    sampled = float(np.max(np.linalg.norm(directions @ A.T, axis=1) * np.linalg.norm(directions @ V, axis=1)))
    assert sampled <= bounds.query_coupled.value * (1 + 1e-9)
    assert bounds.query_coupled.value <= sampled * 1.02


def _rotate(u: np.ndarray, position: int, base: float, dims: int, pairing: str) -> np.ndarray:
    """RoPE of one vector at one position, by the reference forward."""
    return reference.rope(np.asarray(u, dtype=float)[None], base, pairing, dims, [position])[0]


def _key_part(head: Head, X: np.ndarray) -> np.ndarray:
    """The key term of the Jacobian as a matrix (n d_v, n d): token j moves only as a key of the scores,
    ``ds_ij = sigma (R_{p_i} q_i) . (R_{p_j} W_K^T e_j)`` (the rotations written here),
    ``dp_i = p_i (ds_i - p_i . ds_i)``, output ``sum_j dp_ij V^T x_j``; causal mask."""
    n, d = X.shape
    kernel, d_k = head.kernel, head.d_k
    sigma = 1 / math.sqrt(d_k)
    queries = np.array([_rotate(X[i] @ head.W_Q, i, kernel.base, d_k, kernel.pairing) for i in range(n)])
    keys = np.array([_rotate(X[j] @ head.W_K, j, kernel.base, d_k, kernel.pairing) for j in range(n)])
    values = X @ head.W_V
    out = np.zeros((n, head.d_v, n, d))
    for i in range(n):
        scores = sigma * keys[: i + 1] @ queries[i]
        p = np.exp(scores - scores.max())
        p /= p.sum()
        for j in range(i + 1):
            unit = np.zeros((d_k, d))                                   # d s_ij / d x_j through the key only
            for c in range(d):
                unit[:, c] = _rotate(head.W_K[c], j, kernel.base, d_k, kernel.pairing)
            gradient = sigma * queries[i] @ unit                        # (d,)
            weights = -p[j] * p[: i + 1]
            weights[j] += p[j]
            out[i, :, j, :] += np.outer(weights @ values[: i + 1], gradient)
    return out.reshape(n * head.d_v, n * d)


def test_the_key_term_by_columns_holds_against_the_key_part_of_a_jacobian():
    """Step 2b: the column key term ``rho r max_j lambda_max(K_j)^(1/2)`` bounds the key part of the Jacobian (written
    here) at points of the ball with large and small scores, and is never above step 2's ``rho beta kappa_cov^(1/2)``;
    with fast rotations it is strictly below it."""
    rng = np.random.default_rng(17)
    for trial in range(4):
        d, d_k, n = 5, 4, 4
        head = Head(2.0 * rng.standard_normal((d, d_k)), 2.0 * rng.standard_normal((d, d_k)),
                    rng.standard_normal((d, 3)), kernel=Rotary(base=2.0 + trial), mask=AttentionMask(causal=True))
        domain = TokenBall(1.5)
        bounds = PositionalHeadBounds(head, domain, n)
        terms = bounds.terms()
        plain = upper(terms["rho_beta"] * terms["kappa_cov"] ** 0.5)
        assert bounds.column_key.certified
        key = upper(bounds.key_term)
        assert key <= plain * (1 + 1e-12)
        if trial == 0:
            assert key < 0.97 * plain
        largest = 0.0
        for X in _points(rng, domain, n, d, 40):
            for scale in (1.0, 0.3):
                largest = max(largest, np.linalg.norm(_key_part(head, scale * X), 2))
        assert 0 < largest <= key, (largest, key)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.integers(2, 6), st.integers(2, 5), st.integers(0, 2 ** 31))
def test_jacobian_parts_add_up_to_the_jacobian_and_the_key_part_is_the_one_written_here(n, d, seed):
    """:func:`~lipbound.numeric.witness.values.jacobian_parts` of a causal rotary head: the three parts add up to the
    central differences of the reference forward pass, the key part is the key term written here (``_key_part``),
    and row 0 (one key) has no query and no key part, only its value ``V^T e_0``; of a grouped-query layer, the parts
    add up to the reference layer's central differences."""
    rng = np.random.default_rng(seed)
    d_k = 4
    head = Head(2.0 * rng.standard_normal((d, d_k)), 2.0 * rng.standard_normal((d, d_k)),
                rng.standard_normal((d, d_k)), kernel=Rotary(base=float(rng.choice([2.0, 100.0]))),
                mask=AttentionMask(causal=True))
    X, E = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    parts = jacobian_parts(head, X, E)
    E = E / np.linalg.norm(E)
    step = 1e-6
    total = (reference_head(head, X + step * E) - reference_head(head, X - step * E)) / (2 * step)
    np.testing.assert_allclose(sum(parts.values()), total, rtol=1e-5, atol=1e-6 * np.abs(total).max())
    key = (_key_part(head, X) @ E.reshape(-1)).reshape(n, head.d_v)
    np.testing.assert_allclose(parts["key"], key, rtol=1e-9, atol=1e-12 * max(np.abs(key).max(), 1.0))
    assert not np.any(parts["query"][0]) and not np.any(parts["key"][0])
    np.testing.assert_allclose(parts["value"][0], E[0] @ head.W_V, rtol=1e-12, atol=1e-15)
    layer = _layer("llama", rng, d, d_k, 4, 2, 1.0)              # two key/value groups of two query heads
    parts = jacobian_parts(layer, X, E)
    f = reference_map(layer)
    total = (f(X + step * E) - f(X - step * E)) / (2 * step)
    np.testing.assert_allclose(sum(parts.values()), total, rtol=1e-5, atol=1e-6 * np.abs(total).max())


def test_rotary_tied_key_starts_tie_the_two_keys_for_every_query_offset_and_head():
    """The rotary witness start (:func:`~lipbound.numeric.witness.kernel_starts.rotary_tied_keys`): inside the
    domain, and the scores of tokens 0 and 1 (computed here with the rotations written here) are equal for every
    query 2..n-1 and every head tied, at the queries' own offsets, and in some starts above the queries' scores of
    each other (two heads of one key/value group: six key gradients in the eight dimensions of the keys)."""
    rng = np.random.default_rng(23)
    d, d_k, n = 16, 8, 5
    layer = _layer("llama", rng, d, d_k, 2, 1, 1.0)
    domain = RMSNormOutputs(RMSNorm(rng.uniform(0.2, 1.0, d), 1e-5))
    for target, tied in ((layer.heads[0], [0]), (layer, [0, 1])):
        problem = SearchProblem(target, "self", domain, None, n, None)
        assert np.all(domain.contains(problem.lift(rotary_tied_keys(problem, tied))[0]))
        X = problem.lift(rotary_tied_keys(problem, tied, penalties=()))[0]         # exact ties only
        assert np.all(domain.contains(X))
        above = []
        for tokens in X:
            wins = []
            for h in tied:
                head = layer.heads[h]
                kernel = head.kernel
                dims = kernel.rotated(d_k)
                q = [_rotate(x @ head.W_Q, i, kernel.base, dims, kernel.pairing) for i, x in enumerate(tokens)]
                k = [_rotate(x @ head.W_K, j, kernel.base, dims, kernel.pairing) for j, x in enumerate(tokens)]
                for i in range(2, n):
                    first, second = q[i] @ k[0], q[i] @ k[1]
                    np.testing.assert_allclose(first, second, rtol=1e-6, atol=1e-9 * abs(first))
                    wins.append(first > max(q[i] @ k[j] for j in range(2, i + 1)))
            above.append(all(wins))
        # one head: in some start the keys' midpoint is not cut at 0.95 of the chart (two heads fill the keys' span)
        assert any(above) or len(tied) > 1


def test_rotary_spread_starts_turn_each_query_towards_the_keys_common_move():
    """The spread-query witness start (:func:`~lipbound.numeric.witness.spread_starts.rotary_spread_queries`): inside
    the domain, and each query on the arc from the tied start's common point towards the point of the domain where
    row i's score difference ``s_i0 - s_i1`` moves most along the keys' one move f (scores with the rotations written
    here; f the top right singular vector of the rows' gradients in the keys at the common point), nearer that point
    than the common point is (a head and a head of a layer, two turns each)."""
    from lipbound.numeric.witness.spread_starts import rotary_spread_queries

    rng = np.random.default_rng(29)
    d, d_k, n = 12, 4, 5
    layer = _layer("llama", rng, d, d_k, 2, 1, 1.0)
    gamma = rng.uniform(0.2, 1.0, d)
    domain = RMSNormOutputs(RMSNorm(gamma, 1e-5))
    head = layer.heads[0]
    kernel = head.kernel
    dims = kernel.rotated(d_k)

    def rotated(u: np.ndarray, position: int) -> np.ndarray:
        return _rotate(u, position, kernel.base, dims, kernel.pairing)

    def key_gradients(query: np.ndarray, i: int) -> np.ndarray:
        """The gradient (2 d) of ``s_i0 - s_i1`` in ``(x_0, x_1)``: ``W_K R_j^T q`` for key j, q the rotated query."""
        q = rotated(query @ head.W_Q, i) / math.sqrt(d_k)
        return np.concatenate([sign * head.W_K @ np.array([q @ rotated(unit, j) for unit in np.eye(d_k)])
                               for sign, j in ((1, 0), (-1, 1))])

    for target in (head, layer):
        problem = SearchProblem(target, "self", domain, None, n, None)
        tied = rotary_tied_keys(problem, [0])
        common = problem.lift(tied)[0]
        points = [k for k in range(len(common)) if not any(np.allclose(common[k, 2], common[m, 2]) for m in range(k))]
        groups = rotary_spread_queries(problem, 0, tied)
        assert len(groups) == len(points)
        for k, group in zip(points, groups):
            b = common[k, 2]
            f = np.linalg.svd(np.array([key_gradients(b, i) for i in range(2, n)]))[2][0]
            for tokens in problem.lift(group)[0]:
                assert np.all(domain.contains(tokens[None]))
                for i in range(2, n):
                    # s_i0 - s_i1 along f is linear in the query token: w . x, largest on the domain at gamma^2 w
                    w = np.array([key_gradients(unit, i) @ f for unit in np.eye(d)])
                    best = gamma ** 2 * w
                    plane = np.linalg.qr(np.stack([b, best], axis=1))[0]
                    x = tokens[i]
                    np.testing.assert_allclose(plane @ (plane.T @ x), x, atol=1e-8 * np.linalg.norm(x))
                    assert abs(w @ x) / np.linalg.norm(x / gamma) >= abs(w @ b) / np.linalg.norm(b / gamma) * (1 - 1e-9)


def test_the_rmsnorm_image_is_an_ellipsoid_about_zero():
    norm = RMSNorm(np.array([0.5, 2.0, 0.1]), 1e-5)
    domain = DomainSpec.parse("layernorm").resolve(norm)
    assert isinstance(domain, RMSNormOutputs) and isinstance(domain.assumption, RMSNormImage)
    X = norm(np.random.default_rng(0).standard_normal((50, 3)) * 30)
    assert np.all(domain.contains(X))
    inside, coordinates = domain.representable(np.array([[0.5 * math.sqrt(3), 0.0, 0.0], [1.0, 1.0, 0.1]]) * 2)
    assert np.all(np.linalg.norm(coordinates["z"], axis=1) ** 2 < 3)
    np.testing.assert_array_equal(inside, norm.gamma * coordinates["z"])
    M, r = domain.shape()
    np.testing.assert_array_equal(M.mid, np.diag(norm.gamma))
    assert lower(r) ** 2 <= 3 <= upper(r) ** 2


def test_heads_no_theorem_covers_are_refused():
    rng = np.random.default_rng(2)
    sigmoid = Head(rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.standard_normal((3, 2)),
                   kernel=Sigmoid(), mask=AttentionMask(causal=True))
    with pytest.raises(AssumptionError, match="no theorem applies"):
        head_bounds(sigmoid, TokenBall(1.0), 3)
    odd_scale = Head(rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.standard_normal((3, 2)),
                     kernel=Rotary(scale=0.9))
    with pytest.raises(AssumptionError, match="1/sqrt"):
        head_bounds(odd_scale, TokenBall(1.0), 3)
    assert not positional_scope(odd_scale)


def test_the_row_split_bounds_every_split_of_a_unit_tangent_and_is_below_the_minkowski_sum():
    """Step 6 of :mod:`lipbound.numeric.sdp.rotary` (and of :mod:`.layer`) as an inequality on numbers: for row
    bounds ``b_i eps_i`` (0 for row 0, one key) and ``(sum_j W_ij eps_j^2)^(1/2)`` over the keys a causal row
    sees, ``sum_i (b_i eps_i + (sum_j W_ij eps_j^2)^(1/2))^2`` over unit vectors (random, and on one or two
    tokens) stays below the square of the split bound at the splits :func:`split_rows` finds, which is below the
    Minkowski sum ``b + max_j (sum_i W_ij)^(1/2)``."""
    from lipbound.numeric.sdp.layer import coupled_rows, row_factors, split_rows
    from lipbound.rigorous.intervals import IV, interval

    rng = np.random.default_rng(5)
    n = 6
    visible = np.tril(np.ones((n, n), dtype=bool))
    for _ in range(5):
        b = float(rng.uniform(0.5, 2.0))
        W = np.where(visible, rng.uniform(0.0, 1.0, (n, n)), 0.0)
        W[0] = 0.0                                                          # row 0: one key, no key part
        has_query = np.arange(n) >= 1
        t = split_rows(np.where(has_query, b * b, 0.0), W)
        factors = row_factors(t)
        columns = [sum((interval(float(W[i, j])) * interval(float(factors[i])) for i in range(n)), IV.mpf(0))
                   for j in range(n)]
        value = upper(coupled_rows(interval(b), has_query, t, columns))
        minkowski = b + math.sqrt(np.max(W.sum(axis=0)))
        assert value < minkowski
        units = list(rng.standard_normal((4000, n))) + list(np.eye(n)) + \
            [np.eye(n)[i] + s * np.eye(n)[j] for i in range(n) for j in range(n) for s in (0.5, 1.0, 2.0)]
        largest = 0.0
        for eps in units:
            eps = eps / np.linalg.norm(eps)
            rows = np.where(has_query, b * eps, 0.0) + np.sqrt(W @ eps ** 2)
            largest = max(largest, float(np.sum(rows ** 2)))
        assert largest <= value ** 2 * (1 + 1e-12), (largest, value ** 2)
        assert largest > 0.8 * value ** 2                                   # and it is not loose on these


def test_the_row_split_holds_against_an_independent_jacobian_of_causal_rotary_heads_and_layers():
    """A causal rotary head and a grouped-query layer on a ball and on an RMSNorm image: the row split (steps 6 and 7,
    or step 8, 9 or 10 where lower; a layer's steps 7 and 9) is the reported bound, below the Minkowski sum, and above
    the spectral norm of the Jacobian of the reference forward pass at points of the domain and at lipbound's witness
    for the layer.  With
    ``W_Q`` and ``W_K`` of rank 2 in width 8 a head's query part and its keys' parts read different directions of a
    move: step 7 is well below step 6."""
    rng = np.random.default_rng(29)
    d, d_k, n = 8, 2, 5
    for domain in (TokenBall(1.2), RMSNormOutputs(RMSNorm(rng.uniform(0.2, 1.0, d), 1e-5))):
        layer = _layer("llama", rng, d, d_k, 4, 2, 2.5)
        for target in (layer.heads[0],) if isinstance(domain, TokenBall) else (layer.heads[0], layer):
            bound = positional_bound(target, domain, n) if isinstance(target, Head) else \
                positional_layer_bound(target, domain, n)
            certificate = bound.details
            reported = min(certificate["coupled_rows"], certificate.get("own_key_rows", math.inf),  # steps 6-7, 8
                           certificate.get("centred_rows", math.inf),                   # a head's step 9
                           certificate.get("centred_merged_rows", math.inf),            # a head's step 10
                           certificate.get("key_columns_rows", math.inf),              # a layer's key columns
                           certificate.get("joined_columns_rows", math.inf))           # a layer's joined columns
            assert bound.value == pytest.approx(reported, rel=0, abs=0)
            assert certificate["coupled_rows"] < certificate["minkowski"]
            if isinstance(target, Head):
                bounds = PositionalHeadBounds(target, domain, n)
                apart, aligned = (upper(bounds.coupled_rows(bounds.query_term, apart=flag)) for flag in (True, False))
                assert apart < 0.95 * aligned, (apart, aligned)
            points = _points(rng, domain, n, d, 6)
            if isinstance(domain, RMSNormOutputs):
                points.append(search_witness(target, domain=domain, n=n, seed=1,
                                             budget_seconds=0.05).X)
            found = max(reference_norm(target, X) for X in points)
            assert found <= bound.value, (found, bound.value)


def test_rotary_self_tied_starts_tie_token_one_between_key_zero_and_itself():
    """The self-tied witness start (:func:`~lipbound.numeric.witness.kernel_starts.rotary_self_tied`): inside the
    domain, and query 1 scores key 0 and itself equally (scores computed here with the reference rotations), for a
    head and for a head of a layer (values through ``W_O``)."""
    from lipbound.numeric.witness.kernel_starts import rotary_self_tied

    rng = np.random.default_rng(31)
    d, d_k, n = 6, 4, 4
    layer = _layer("llama", rng, d, d_k, 2, 1, 1.0)
    domain = RMSNormOutputs(RMSNorm(rng.uniform(0.2, 1.0, d), 1e-5))
    for target in (layer.heads[0], layer):
        problem = SearchProblem(target, "self", domain, None, n, None)
        X = problem.lift(rotary_self_tied(problem, 0))[0]
        assert np.all(domain.contains(X))
        head = layer.heads[0]
        kernel = head.kernel
        dims = kernel.rotated(d_k)
        for tokens in X:
            q = _rotate(tokens[1] @ head.W_Q, 1, kernel.base, dims, kernel.pairing)
            k = [_rotate(tokens[j] @ head.W_K, j, kernel.base, dims, kernel.pairing) for j in (0, 1)]
            np.testing.assert_allclose(q @ k[0], q @ k[1], rtol=1e-6, atol=1e-9 * abs(q @ k[0]) + 1e-12)
            for i in range(2, n):
                # the later queries tie the two keys too, each at its own offsets -i and 1 - i
                q = _rotate(tokens[i] @ head.W_Q, i, kernel.base, dims, kernel.pairing)
                scale = np.linalg.norm(q) * max(np.linalg.norm(k[0]), np.linalg.norm(k[1]))
                np.testing.assert_allclose(q @ k[0], q @ k[1], rtol=0, atol=1e-9 * scale)
            # the later queries sit at their own point, not on token 1 or key 0
            assert not np.allclose(np.abs(tokens[2]), np.abs(tokens[1]))
