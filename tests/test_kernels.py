"""Every attention kernel and mask against an independent implementation written here.

The reference below is a per-query, per-key loop over the published equations (no lipbound
code): the dot product (Vaswani et al. 2017), L2 distance (Kim et al. 2021), scaled cosine,
RoPE in Hugging Face's ``rotate_half`` form and GPT-J's ``rotate_every_two`` form (Su et al. 2021),
QK-norm (RMS per head, then RoPE, as in Qwen3), sigmoid attention (Ramapuram et al. 2024), linear
attention with ``elu + 1`` (Katharopoulos et al. 2020), user-defined scores written out by hand;
masks: causal, sliding window, ALiBi (Press et al. 2022), T5 buckets (Raffel et al. 2020, as
Hugging Face computes them), soft-cap (Gemma 2); grouped-query attention by ``repeat_kv``.
Derivatives: JVPs against central finite differences, VJPs against JVPs (``<J e, g> = <e, J^T g>``),
over generated shapes, group ratios, kernels and masks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError, WeightsError
from lipbound.numeric.attention import AttentionMap, self_jvp
from lipbound.numeric.dispatch import check_layer, head_facts
from lipbound.numeric.domains import TokenBall
from lipbound.numeric.kernels import (
    KERNELS,
    ALiBi,
    AttentionMask,
    CustomKernel,
    DotProduct,
    FeatureMap,
    L2Distance,
    QKNorm,
    Rotary,
    ScaledCosine,
    Sigmoid,
    T5Bias,
    kernel_from_arrays,
    t5_buckets,
)
from lipbound.numeric.model import Head, Layer
from lipbound.numeric.recheck import SCORE_CHECKS, directional_norm, recheck
from lipbound.numeric.sdp.registry import SDP_ENCODINGS
from lipbound.numeric.witness import Witness, search_witness
from lipbound.numeric.witness.kernel_starts import KERNEL_STARTS, kernel_starts
from lipbound.numeric.witness.problem import SearchProblem

D, DK, DV = 6, 4, 3


def kernel_examples(rng, d_k: int = DK) -> list:
    """One instance of every registered kernel (two for RoPE: both pairings, one partial)."""
    return [DotProduct(), DotProduct(scale=0.3), L2Distance(), ScaledCosine(tau=1.7, eps=0.4),
            Rotary(base=100.0, pairing="half"), Rotary(base=50.0, dims=2, pairing="interleaved"),
            QKNorm(1 + 0.3 * rng.standard_normal(d_k), 1 + 0.3 * rng.standard_normal(d_k), eps=1e-3,
                   rotary=Rotary(base=30.0)),
            QKNorm(1 + 0.3 * rng.standard_normal(d_k), 1 + 0.3 * rng.standard_normal(d_k), eps=1e-2),
            Sigmoid(), Sigmoid(bias=-0.5, scale=0.7), FeatureMap(),
            CustomKernel("Inner(q, k)**2 / d_k"), CustomKernel("tau * Inner(q, k) / (Norm(q) * Norm(k))", tau=2.0),
            CustomKernel("-Norm(q - 2*k)**2 / sqrt(d_k) + exp(Inner(q, k) / d)")]


def mask_examples(rng) -> list:
    return [AttentionMask(), AttentionMask(causal=True), AttentionMask(window=2), AttentionMask(causal=True, window=3),
            AttentionMask(bias=ALiBi(0.37)), AttentionMask(softcap=1.5),
            AttentionMask(causal=True, bias=T5Bias(rng.standard_normal(8), 8, 16, False)),
            AttentionMask(bias=T5Bias(rng.standard_normal(8), 8, 16, True), softcap=2.0)]


# The independent reference ------------------------------------------------------------------------
def rotate_half_reference(u, position, base, dims):
    """Hugging Face: ``u * cos + rotate_half(u) * sin`` on the first ``dims`` coordinates."""
    inv_freq = 1.0 / (base ** (np.arange(0, dims, 2) / dims))
    angles = np.concatenate([position * inv_freq, position * inv_freq])
    head, rest = u[:dims], u[dims:]
    half = dims // 2
    rotated = np.concatenate([-head[half:], head[:half]])
    return np.concatenate([head * np.cos(angles) + rotated * np.sin(angles), rest])


def rotate_every_two_reference(u, position, base, dims):
    """GPT-J: pairs (2t, 2t+1), ``rotate_every_two(x) = (-x_1, x_0, -x_3, x_2, ...)``."""
    inv_freq = 1.0 / (base ** (np.arange(0, dims, 2) / dims))
    angles = np.repeat(position * inv_freq, 2)
    head, rest = u[:dims], u[dims:]
    rotated = np.stack([-head[1::2], head[0::2]], axis=-1).reshape(-1)
    return np.concatenate([head * np.cos(angles) + rotated * np.sin(angles), rest])


def rotate_reference(rotary, u, position):
    dims = rotary.dims or len(u)
    rotate = rotate_half_reference if rotary.pairing == "half" else rotate_every_two_reference
    return rotate(u, position, rotary.base, dims)


def rms_reference(u, gamma, eps):
    return gamma * u / math.sqrt(np.mean(u * u) + eps)


def custom_reference(text, q, k, d, tau):
    d_k = len(q)
    if text == "Inner(q, k)**2 / d_k":
        return (q @ k) ** 2 / d_k
    if text.startswith("tau * Inner"):
        return tau * (q @ k) / (np.linalg.norm(q) * np.linalg.norm(k))
    return -np.sum((q - 2 * k) ** 2) / math.sqrt(d_k) + math.exp((q @ k) / d)


def score_reference(kernel, q, k, i, j, d):
    """``s(q_i, k_j)`` at positions i and j, before the mask."""
    d_k = len(q)
    scale = 1 / math.sqrt(d_k) if getattr(kernel, "scale", None) is None else kernel.scale
    if isinstance(kernel, (DotProduct, Sigmoid)):
        return scale * (q @ k)
    if isinstance(kernel, L2Distance):
        return -scale * np.sum((q - k) ** 2)
    if isinstance(kernel, ScaledCosine):
        return kernel.tau * (q @ k) / (math.sqrt(q @ q + kernel.eps) * math.sqrt(k @ k + kernel.eps))
    if isinstance(kernel, Rotary):
        return scale * (rotate_reference(kernel, q, i) @ rotate_reference(kernel, k, j))
    if isinstance(kernel, QKNorm):
        qn, kn = rms_reference(q, kernel.gamma_q, kernel.eps), rms_reference(k, kernel.gamma_k, kernel.eps)
        if kernel.rotary is not None:
            qn, kn = rotate_reference(kernel.rotary, qn, i), rotate_reference(kernel.rotary, kn, j)
        return scale * (qn @ kn)
    if isinstance(kernel, FeatureMap):
        phi = lambda u: np.where(u > 0, u + 1, np.exp(np.minimum(u, 0)))  # noqa: E731
        return math.log(phi(q) @ phi(k))
    return custom_reference(kernel.score, q, k, d, kernel.tau)


def t5_bucket_reference(relative, bidirectional, num_buckets, max_distance):
    """Hugging Face's ``_relative_position_bucket`` for one relative position, torch's float32 logarithm."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if relative > 0 else 0
        relative = abs(relative)
    else:
        relative = -min(relative, 0)
    max_exact = num_buckets // 2
    if relative < max_exact:
        return bucket + relative
    large = np.float32(np.log(np.float32(relative) / np.float32(max_exact))) \
        / np.float32(math.log(max_distance / max_exact))
    large = max_exact + int(np.float32(large * np.float32(num_buckets - max_exact)))
    return bucket + min(large, num_buckets - 1)


def masked_reference(mask, s, i, j):
    """``s`` after the soft-cap and bias, or None where the key is hidden."""
    if mask.causal and j > i:
        return None
    if mask.window is not None and abs(i - j) >= mask.window:
        return None
    if mask.softcap is not None:
        s = mask.softcap * math.tanh(s / mask.softcap)
    if isinstance(mask.bias, ALiBi):
        s += -mask.bias.slope * abs(i - j)
    elif isinstance(mask.bias, T5Bias):
        b = mask.bias
        s += b.table[t5_bucket_reference(j - i, b.bidirectional, b.num_buckets, b.max_distance)]
    return s


def head_reference(head: Head, Y, X, query_positions=None, positions=None):
    """Queries Y (m, d) attend to X (n, d): (m, d_v), by loops."""
    m, n = len(Y), len(X)
    pq = range(m) if query_positions is None else query_positions
    pk = range(n) if positions is None else positions
    values = X @ head.W_V + head.b_V
    out = np.zeros((m, head.d_v))
    for a, (y, i) in enumerate(zip(Y, pq)):
        q = y @ head.W_Q + head.b_Q
        scores = {}
        for b, (x, j) in enumerate(zip(X, pk)):
            s = masked_reference(head.mask, score_reference(head.kernel, q, x @ head.W_K + head.b_K, i, j, head.d),
                                 i, j)
            if s is not None:
                scores[b] = s
        if isinstance(head.kernel, Sigmoid):
            bias = -math.log(n) if head.kernel.bias is None else head.kernel.bias
            weights = {b: 1 / (1 + math.exp(-(s + bias))) for b, s in scores.items()}
        else:
            top = max(scores.values())
            weights = {b: math.exp(s - top) for b, s in scores.items()}
            total = sum(weights.values())
            weights = {b: w / total for b, w in weights.items()}
        for b, w in weights.items():
            out[a] += w * values[b]
    return out


def layer_reference(layer: Layer, X):
    """Each query head reads its group's keys and values (``repeat_kv``); heads concatenated, W_O."""
    outputs = [head_reference(head, X, X) for head in layer.heads]
    return np.concatenate(outputs, axis=1) @ layer.W_O + layer.b_O


def random_head(rng, kernel, mask, d=D, d_k=DK, d_v=DV, scale=0.8) -> Head:
    return Head(scale * rng.standard_normal((d, d_k)), scale * rng.standard_normal((d, d_k)),
                rng.standard_normal((d, d_v)), 0.3 * rng.standard_normal(d_k), 0.3 * rng.standard_normal(d_k),
                rng.standard_normal(d_v), kernel=kernel, mask=mask)


# Forward passes -------------------------------------------------------------------------------
def test_every_kernel_and_mask_matches_the_reference():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 7, D))
    cases = 0
    for kernel in kernel_examples(rng):
        for mask in mask_examples(rng):
            head = random_head(rng, kernel, mask)
            out = AttentionMap(head).forward(X)
            for b in range(2):
                np.testing.assert_allclose(out[b], head_reference(head, X[b], X[b]), rtol=1e-11, atol=1e-12,
                                           err_msg=f"{kernel.describe()} with {mask.describe()}")
            cases += 1
    assert cases == len(kernel_examples(rng)) * len(mask_examples(rng))


def test_cross_attention_has_its_own_positions():
    rng = np.random.default_rng(1)
    head = random_head(rng, Rotary(base=20.0), AttentionMask(window=4, bias=ALiBi(0.2)))
    X, Y = rng.standard_normal((5, D)), rng.standard_normal((3, D))
    keys, queries = np.array([0, 2, 3, 7, 9]), np.array([4, 5, 8])
    out = AttentionMap(head).forward(X[None], Y[None], positions=keys, query_positions=queries)[0]
    np.testing.assert_allclose(out, head_reference(head, Y, X, queries, keys), rtol=1e-11, atol=1e-12)
    with pytest.raises(WeightsError, match="causal"):
        AttentionMap(random_head(rng, DotProduct(), AttentionMask(causal=True))).forward(X[None], Y[None])


def test_rope_depends_on_positions_only_through_their_offset():
    """``s_ij = c q^T R(p_j - p_i) k``: shifting every position leaves the scores unchanged."""
    rng = np.random.default_rng(2)
    for pairing in ("half", "interleaved"):
        head = random_head(rng, Rotary(base=10000.0, pairing=pairing), AttentionMask())
        X = rng.standard_normal((1, 6, D))
        engine = AttentionMap(head)
        S = engine.linearize(X).S
        shifted = engine.linearize(X, positions=np.arange(6) + 1000).S
        np.testing.assert_allclose(S, shifted, rtol=1e-9, atol=1e-10)
        assert not np.allclose(S, engine.linearize(X, positions=np.arange(6) * 3).S)


def test_rotations_at_the_same_positions_share_their_tables_and_rotate_as_the_reference():
    """The cos/sin tables are formed once per (base, rotated width, positions, dtype): a second rotation at the same
    positions reads the same read-only arrays, equal to tables formed afresh, and both rotate every row as the
    reference does (forward and transpose), for both pairings and a partial rotation."""
    rng = np.random.default_rng(5)
    for kernel in (Rotary(base=100.0, pairing="half"), Rotary(base=50.0, dims=4, pairing="interleaved")):
        U = rng.standard_normal((3, 7, 6))
        positions = np.arange(7) * 2
        first, second = kernel.rotation(U, positions), kernel.rotation(U[::-1].copy(), positions)
        assert first.cos is second.cos and first.sin is second.sin
        assert not first.cos.flags.writeable
        D, half = kernel.rotated(6), kernel.rotated(6) // 2
        angles = positions[:, None] * kernel.base ** (-np.arange(half) * 2.0 / D)
        pairs = (np.arange(half), np.arange(half, D)) if kernel.pairing == "half" else (np.arange(0, D, 2),
                                                                                        np.arange(1, D, 2))
        for place, sign in zip(pairs, (-1, 1)):
            np.testing.assert_array_equal(first.cos[:, place], np.cos(angles))
            np.testing.assert_array_equal(first.sin[:, place], sign * np.sin(angles))
        np.testing.assert_array_equal(first.cos[:, D:], 1.0)
        np.testing.assert_array_equal(first.sin[:, D:], 0.0)
        assert kernel.rotation(U, positions + 1).cos is not first.cos
        expected = np.array([[rotate_reference(kernel, u, p) for u, p in zip(rows, positions)] for rows in U])
        np.testing.assert_allclose(first.F, expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(first.vjp(first.F), U, rtol=1e-12, atol=1e-12)


def test_t5_buckets_match_hand_computed_values():
    relative = np.array([0, 1, -1, 7, -7, 8, -20, 20, -200, 200])
    # bidirectional: 16 buckets a side, 8 exact, 8 + int(log(20/8) / log(16) * 8) = 10; one side: 16 exact,
    # 16 + int(log(20/16) / log(8) * 16) = 17; beyond max_distance: the last bucket
    np.testing.assert_array_equal(t5_buckets(relative, True, 32, 128), [0, 17, 1, 23, 7, 24, 10, 26, 15, 31])
    np.testing.assert_array_equal(t5_buckets(relative, False, 32, 128), [0, 0, 1, 0, 7, 0, 17, 0, 31, 0])
    for r in range(-300, 300):
        for bidirectional in (True, False):
            assert t5_buckets(np.array([r]), bidirectional, 32, 128)[0] \
                == t5_bucket_reference(r, bidirectional, 32, 128)


def _group_layer(rng, kernel, mask, H, H_kv, d_k=DK, d_v=DV):
    """A grouped-query layer: H query heads, H_kv key/value heads, groups[h] = h // (H / H_kv)."""
    shared = [(rng.standard_normal((D, d_k)), rng.standard_normal(d_k), rng.standard_normal((D, d_v)),
               rng.standard_normal(d_v)) for _ in range(H_kv)]
    heads = []
    for h in range(H):
        W_K, b_K, W_V, b_V = shared[h // (H // H_kv)]
        heads.append(Head(0.8 * rng.standard_normal((D, d_k)), 0.8 * W_K, W_V, 0.3 * rng.standard_normal(d_k),
                          0.3 * b_K, b_V, kernel=kernel, mask=mask, name=f"head{h}"))
    groups = tuple(h // (H // H_kv) for h in range(H))
    return Layer(tuple(heads), rng.standard_normal((H * d_v, D)), rng.standard_normal(D), groups=groups)


def test_grouped_query_layers_match_repeat_kv():
    rng = np.random.default_rng(3)
    for H, H_kv in ((4, 2), (6, 1), (6, 3), (2, 2)):
        layer = _group_layer(rng, Rotary(base=500.0), AttentionMask(causal=True), H, H_kv)
        assert layer.num_groups == H_kv and layer.group_heads(H_kv - 1) == tuple(range(H - H // H_kv, H))
        X = rng.standard_normal((2, 5, D))
        engine = AttentionMap(layer)
        assert engine.W.shape[1] == H * DK + H_kv * (DK + DV)   # keys and values once per group
        out = engine.forward(X)
        for b in range(2):
            np.testing.assert_allclose(out[b], layer_reference(layer, X[b]), rtol=1e-11, atol=1e-11)


def test_groups_are_checked():
    rng = np.random.default_rng(4)
    layer = _group_layer(rng, DotProduct(), AttentionMask(), 4, 2)
    with pytest.raises(WeightsError, match="groups"):
        Layer(layer.heads, layer.W_O, groups=(0, 1, 0, 1))              # not the consecutive convention
    other = list(layer.heads)
    other[1] = Head(other[1].W_Q, other[1].W_K + 1, other[1].W_V)
    with pytest.raises(WeightsError, match="equal W_K"):
        Layer(tuple(other), layer.W_O, groups=(0, 0, 1, 1))
    with pytest.raises(WeightsError, match="groups"):
        Layer(layer.heads, layer.W_O, groups=(0, 0, 1))


# Derivatives ----------------------------------------------------------------------------------
def _check_derivatives(engine: AttentionMap, X, Y, rng, rtol=2e-5):
    """JVP against central differences and the VJP against the JVP, at one batch."""
    E = rng.standard_normal(X.shape)
    EY = None if Y is None else rng.standard_normal(Y.shape)
    lin = engine.linearize(X, Y)
    dF = lin.jvp(E, EY)
    h = 1e-6
    plus = engine.forward(X + h * E, None if Y is None else Y + h * EY)
    minus = engine.forward(X - h * E, None if Y is None else Y - h * EY)
    np.testing.assert_allclose(dF, (plus - minus) / (2 * h), rtol=rtol, atol=1e-6)
    G = rng.standard_normal(dF.shape)
    back = lin.vjp(G)
    inner = np.sum(E * back) if Y is None else np.sum(EY * back[0]) + np.sum(E * back[1])
    np.testing.assert_allclose(np.sum(dF * G), inner, rtol=1e-10, atol=1e-10)


def test_every_kernel_and_mask_differentiates_exactly():
    rng = np.random.default_rng(5)
    for kernel in kernel_examples(rng):
        for mask in mask_examples(rng):
            layer = _group_layer(rng, kernel, mask, 4, 2)
            X = rng.standard_normal((2, 5, D))
            _check_derivatives(AttentionMap(layer), X, None, rng)
            if not mask.causal:
                _check_derivatives(AttentionMap(layer.heads[0]), X, rng.standard_normal((2, 3, D)), rng)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 16), kernel_index=st.integers(0, 13), mask_index=st.integers(0, 7),
       H_kv=st.integers(1, 2), ratio=st.integers(1, 3), n=st.integers(1, 6), d_k=st.sampled_from([2, 4, 6]),
       residual=st.booleans())
def test_derivatives_over_shapes_groups_and_masks(seed, kernel_index, mask_index, H_kv, ratio, n, d_k, residual):
    rng = np.random.default_rng(seed)
    kernel = kernel_examples(rng, d_k)[kernel_index]
    mask = mask_examples(rng)[mask_index]
    layer = _group_layer(rng, kernel, mask, H_kv * ratio, H_kv, d_k=d_k)
    layer = Layer(layer.heads, layer.W_O, layer.b_O, residual=residual, groups=layer.groups)
    X = rng.standard_normal((2, n, D))
    _check_derivatives(AttentionMap(layer), X, None, rng)
    out = AttentionMap(layer).forward(X)
    expected = layer_reference(Layer(layer.heads, layer.W_O, layer.b_O, groups=layer.groups), X[0])
    np.testing.assert_allclose(out[0], expected + (X[0] if residual else 0), rtol=1e-10, atol=1e-10)


def test_curvature_matches_differences_of_vjps_for_masked_dot_products():
    """The analytic second-order term (bilinear scores, a mask adding constants) against central
    differences of VJPs."""
    rng = np.random.default_rng(6)
    for mask in (AttentionMask(causal=True, window=2), AttentionMask(bias=ALiBi(0.5))):
        layer = _group_layer(rng, DotProduct(), mask, 4, 2)
        engine = AttentionMap(layer)
        assert engine.bilinear
        X, E = rng.standard_normal((1, 4, D)), rng.standard_normal((1, 4, D))
        G = rng.standard_normal((1, 4, D))
        h = 1e-6
        expected = (engine.linearize(X + h * E).vjp(G) - engine.linearize(X - h * E).vjp(G)) / (2 * h)
        np.testing.assert_allclose(engine.linearize(X).curvature(E, G), expected, rtol=1e-5, atol=1e-7)


# Facts, dispatch, custom scores, the plain arrays ----------------------------------------------
def test_kernels_without_theorems_are_refused_never_bound_by_another():
    rng = np.random.default_rng(7)
    covered_kinds = (DotProduct, L2Distance, ScaledCosine, Rotary, QKNorm)
    for kernel in kernel_examples(rng):
        head = random_head(rng, kernel, AttentionMask())
        if type(kernel) in covered_kinds and kernel != DotProduct(scale=0.3):
            facts = head_facts(head)
            assert facts.rotary == kernel.positional and facts.qk_norm == isinstance(kernel, QKNorm)
        else:
            with pytest.raises(AssumptionError, match="no theorem applies"):
                head_facts(head)
    for mask in mask_examples(rng)[2:-1]:        # windows, position biases, soft-caps: each has its theorem
        facts = head_facts(random_head(rng, DotProduct(), mask))
        assert facts.window == (mask.window is not None) and facts.softcap == (mask.softcap is not None)
    with pytest.raises(AssumptionError, match="no theorem"):        # a soft-cap on top of a position bias
        head_facts(random_head(rng, DotProduct(), mask_examples(rng)[-1]))
    with pytest.raises(AssumptionError, match="no theorem applies"):
        head_facts(random_head(rng, L2Distance(), AttentionMask(window=2)))
    check_layer(_group_layer(rng, DotProduct(), AttentionMask(), 4, 2))   # grouped-query layers compose


def test_custom_kernels_refuse_what_has_no_value():
    with pytest.raises(WeightsError, match="m_Q"):
        CustomKernel("Inner(q, k) / m_Q")
    with pytest.raises(WeightsError, match="score"):
        CustomKernel("Inner(q, k) + __import__('os')")
    assert CustomKernel("Inner(q, k)") == CustomKernel("Inner(q, k)")
    assert CustomKernel("Inner(q, k)", tau=2.0) != CustomKernel("Inner(q, k)")


def test_kernels_round_trip_as_plain_arrays_and_validate():
    rng = np.random.default_rng(8)
    for kernel in kernel_examples(rng):
        again = kernel_from_arrays({key: np.asarray(value) for key, value in kernel.to_arrays().items()})
        assert again == kernel and hash(again) == hash(kernel)
    assert set(KERNELS) == {"dot", "l2", "cosine", "rope", "qk-norm", "sigmoid", "linear", "custom"}
    with pytest.raises(WeightsError, match="pairing"):
        Rotary(pairing="neox")
    with pytest.raises(WeightsError, match="dims"):
        random_head(rng, Rotary(dims=6), AttentionMask())          # more rotated coordinates than d_k = 4
    with pytest.raises(WeightsError, match="gamma_q"):
        random_head(rng, QKNorm(np.ones(3), np.ones(4)), AttentionMask())
    with pytest.raises(WeightsError, match="window"):
        AttentionMask(window=0)
    with pytest.raises(WeightsError, match="kim_values"):
        Head(np.eye(2), np.eye(2), np.eye(2), kernel=Rotary(), kim_values=True)


# The independent high-precision re-check ------------------------------------------------------------------
def test_the_recheck_encloses_every_kernel_and_mask():
    """recheck.py writes every kernel's score and every mask again in exact and interval arithmetic;
    its enclosure of ``||Df(X)[E]|| / ||E||`` holds the float engine's value (self- and cross-attention)."""
    rng = np.random.default_rng(9)
    masks = mask_examples(rng)
    for index, kernel in enumerate(kernel_examples(rng, 2)):
        head = random_head(rng, kernel, masks[index % len(masks)], d=3, d_k=2, d_v=2)
        X, E = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
        _, dF = self_jvp(head, X, E)
        value = float(np.linalg.norm(dF) / np.linalg.norm(E))
        witness = Witness(kind="jacobian", X=X, E=E, value=value, radius=10.0, center=None, score=kernel.name)
        result = recheck(witness, head, dps=30)
        assert result.valid and result.lower <= value * (1 + 1e-12) and value <= result.upper * (1 + 1e-12), \
            (kernel.describe(), result.message)
        assert result.upper - result.lower <= 1e-15 * max(value, 1.0)
        if not head.causal:
            low, high = directional_norm(head, X, E, dps=30)
            assert low <= value * (1 + 1e-12) and value <= high * (1 + 1e-12)


def test_every_kernel_has_its_recheck():
    assert set(SCORE_CHECKS) == set(KERNELS.values())


# Witness starts per kernel ---------------------------------------------------------------------------
def test_every_kernel_has_an_entry_for_its_witness_starts():
    assert set(KERNEL_STARTS) == set(KERNELS.values())


def test_rope_and_qk_norm_starts_reach_the_domain_and_recheck():
    """The structured starts of RoPE (the offset of largest ||A_Delta||) and of QK-norm (near the null sets)
    are valid inputs of the domain, and the witnesses found from them re-check."""
    rng = np.random.default_rng(10)
    for kernel in (Rotary(base=100.0), QKNorm(np.ones(DK), np.ones(DK), 1e-6, rotary=Rotary(base=100.0))):
        head = random_head(rng, kernel, AttentionMask(causal=True), d=8)
        domain = TokenBall(2.0)
        problem = SearchProblem(head, "self", domain, None, 5, None)
        starts = kernel_starts(problem, rng, problem.clock() + 0.2)
        assert starts and all(np.all(np.linalg.norm(problem.lift(Z)[0], axis=-1) <= 2.0 * (1 + 1e-9))
                              for Z, _ in starts)
        random_sigma = problem.sigma(problem.random(rng, 8))[0].max()
        start_sigma = max(problem.sigma(Z)[0].max() for Z, _ in starts)
        if isinstance(kernel, QKNorm):
            assert start_sigma > 10 * random_sigma, (start_sigma, random_sigma)   # the null sets matter
        witness = search_witness(head, domain=domain, n=5, budget_seconds=0.1, seed=1)
        assert recheck(witness, head).valid


def test_every_sdp_encoding_a_kernel_names_exists():
    assert {kernel.sdp_encoding for kernel in KERNELS.values()} - {None} <= set(SDP_ENCODINGS)
    assert DotProduct.sdp_encoding in SDP_ENCODINGS
