"""The theorems for modern heads and blocks against an independent forward pass.

Rotary attention, QK-norm, sliding windows, ALiBi and relative biases, soft-capped logits, grouped-query
layers, gated feed-forward blocks and the residual blocks around them are written here again in numpy
(the rotation applied to queries and keys at their absolute positions, as models do), and their Jacobians
taken by the complex step (exact to rounding).  Every bound is evaluated at the norms numpy computes,
rounded up (down where a symbol divides), and must stay above the Jacobian norm at every sampled input:
random tokens, tokens on the sphere, keys tied for many queries, and a short random climb.  Witness
families must really grow, and the unrotated constant must really fail on a generated example.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf
from soundness_cases import operator_norm

from lipbound.symbolic import symbols as S
from lipbound.symbolic import theorems as T
from lipbound.symbolic.assumptions import Assumptions, Ball, RMSNormImage, Unbounded
from lipbound.symbolic.blocks import GatedFeedForwardMap, NormalizationMap, NormResidual
from lipbound.symbolic.claims import PENDING_CLAIMS
from lipbound.symbolic.masks import Mask, largest_cap_column
from lipbound.symbolic.positional import SoftCapped, positioned
from lipbound.symbolic.qknorm import QKNormScore
from lipbound.symbolic.registry import variant
from lipbound.symbolic.rotary import RotaryScore, unrotated_counterexample
from lipbound.symbolic.scores import DotProduct
from lipbound.symbolic.variants import CrossAttention, SelfAttention

#: One xdist process runs this module with test_symbolic and test_proofs, which form the same derivations.
pytestmark = pytest.mark.xdist_group("derivations")

#: Symbols a bound decreases in: their values are rounded down, every other one up.
DECREASING = {"epsilon", "eps", "m_A"}
ROUND = 1e-9
NORMS = ("fro", "2,1", "2,inf", "inf")


# An independent forward pass ---------------------------------------------------------------------
def rotate(M, positions, theta):
    """RoPE at absolute positions: each pair (2l, 2l + 1) of a row turned by theta_l p (works on complex M)."""
    out = np.array(M, dtype=complex)
    for pair, frequency in enumerate(theta):
        angle = frequency * np.asarray(positions, dtype=float)[:, None]
        a, b = M[:, 2 * pair:2 * pair + 1], M[:, 2 * pair + 1:2 * pair + 2]
        out[:, 2 * pair:2 * pair + 1] = np.cos(angle) * a - np.sin(angle) * b
        out[:, 2 * pair + 1:2 * pair + 2] = np.sin(angle) * a + np.cos(angle) * b
    return out


def rms(M, gain, eps):
    """A per-row RMSNorm, analytic (sum of squares, no absolute values) for the complex step."""
    return gain * M / np.sqrt(np.sum(M * M, axis=-1, keepdims=True) / M.shape[-1] + eps)


def attention(X, w, queries=None, theta=None, q_positions=None, k_positions=None, causal=False, window=None,
              bias=None, cap=None, qk=None, scale=None):
    """Softmax attention of the queries (default: X itself) over X, everything a keyword away."""
    Y = X if queries is None else queries
    n, m = len(X), len(Y)
    Q, K = Y @ w["W_Q"] + w["b_Q"], X @ w["W_K"] + w["b_K"]
    d_k = Q.shape[1]
    if qk is not None:
        Q, K = rms(Q, qk["gamma_q"], qk["eps"]), rms(K, qk["gamma_k"], qk["eps"])
    if theta is not None:
        Q = rotate(Q, np.arange(m) if q_positions is None else q_positions, theta)
        K = rotate(K, np.arange(n) if k_positions is None else k_positions, theta)
    scores = (Q @ K.T) * (1 / np.sqrt(d_k) if scale is None else scale)
    if cap is not None:
        scores = cap * np.tanh(scores / cap)
    if bias is not None:
        scores = scores + bias
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    mask = np.ones((m, n))
    if causal:
        mask = mask * (j <= i)
    if window is not None:
        mask = mask * ((i - j < window) if causal else (np.abs(i - j) < window))
    weights = np.exp(scores - np.max(np.where(mask > 0, scores.real, -np.inf), axis=1, keepdims=True)) * mask
    return (weights / weights.sum(axis=1, keepdims=True)) @ (X @ w["W_V"] + w["b_V"])


def jacobian(f, X):
    """The Jacobian of f at X (rows: outputs, columns: inputs) by the complex step, exact to rounding."""
    X = np.asarray(X, dtype=float)
    columns = []
    for index in range(X.size):
        Z = X.astype(complex)
        Z.flat[index] += 1e-30j
        columns.append(np.imag(f(Z)).ravel() / 1e-30)
    return np.array(columns).T


def weights_of(rng, d, d_k, d_v=None, scale=1.0, biases=True):
    d_v = d if d_v is None else d_v
    return {"W_Q": scale * rng.standard_normal((d, d_k)) / np.sqrt(d),
            "W_K": scale * rng.standard_normal((d, d_k)) / np.sqrt(d),
            "W_V": rng.standard_normal((d, d_v)) / np.sqrt(d),
            "b_Q": rng.standard_normal(d_k) * biases, "b_K": rng.standard_normal(d_k) * biases,
            "b_V": rng.standard_normal(d_v)}


def points(rng, n, d, radius, centre, count, A=None):
    """Tokens in the ball B(centre, radius): random, on its sphere, and keys tied at +-R a for the queries."""
    out = []
    for k in range(count):
        U = rng.standard_normal((n, d))
        U /= np.linalg.norm(U, axis=1, keepdims=True)
        lengths = np.where(rng.random((n, 1)) < 0.6, 1.0, rng.random((n, 1)) ** (1 / d))
        X = U * lengths
        if k % 3 == 0 and n >= 2:  # two far keys, the other tokens where they split their attention
            a = rng.standard_normal(d)
            a /= np.linalg.norm(a)
            X[0], X[1] = a, -a
            if A is not None and d >= 2:
                b = rng.standard_normal(d)
                direction = A @ a
                b -= direction * (b @ direction) / max(direction @ direction, 1e-300)
                X[2:] = b / max(np.linalg.norm(b), 1e-300)
        out.append(centre + radius * (1 - 1e-9) * X)
    return out


def climb(f, X, radius, centre, rng, norm, steps=12):
    """The largest lower bound on the operator norm of Df seen along a short random climb in the ball."""
    best = operator_norm(jacobian(f, X), norm, len(X), len(X), rng)
    for step in range(steps):
        candidate = X + 0.3 * radius / (1 + step / 4) * rng.standard_normal(X.shape)
        offsets = candidate - centre
        candidate = centre + offsets * np.minimum(1.0, radius * (1 - 1e-9) / np.linalg.norm(offsets, axis=1,
                                                                                             keepdims=True))
        value = operator_norm(jacobian(f, candidate), norm, len(X), len(X), rng)
        if value > best:
            best, X = value, candidate
    return best


# Evaluating a bound at numpy's numbers -----------------------------------------------------------
def matrix_value(name: str, matrices: dict) -> float:
    """The norm a MatrixNormSymbol or VectorNormSymbol names, from the numpy matrices (biases and the centre are
    columns)."""
    if name == "A":
        return float(np.linalg.norm(matrices["W_Q"] @ matrices["W_K"].T, 2) / np.sqrt(matrices["W_Q"].shape[1]))
    local = {key: sp.Matrix(np.atleast_2d(value).T if value.ndim == 1 else value) for key, value in matrices.items()}
    value = np.array(sp.sympify(name, locals=local).evalf(), dtype=float)
    return float(np.linalg.norm(value, 2))


def bound_value(expr, numbers: dict, matrices: dict) -> float:
    """``expr`` with every symbol replaced by its value, each rounded the way that can only raise the bound."""
    expr = S.expand_special(sp.sympify(expr))
    values = {}
    for symbol in expr.free_symbols:
        if isinstance(symbol, (S.MatrixNormSymbol, S.VectorNormSymbol)):
            value = matrix_value(symbol.name, matrices)
        elif symbol.name in numbers:
            value = numbers[symbol.name]
        else:
            raise KeyError(f"no value for {symbol}")
        integer = isinstance(value, (int, np.integer))
        values[symbol] = sp.Integer(int(value)) if integer else \
            sp.Float(value * (1 - ROUND if symbol.name in DECREASING else 1 + ROUND), 30)
    return float(sp.N(expr.xreplace(values), 30))


def rotation(offset, theta):
    """R_Delta: the block-diagonal rotation by theta_l Delta."""
    blocks = [np.array([[math.cos(f * offset), -math.sin(f * offset)], [math.sin(f * offset), math.cos(f * offset)]])
              for f in theta]
    out = np.zeros((2 * len(theta), 2 * len(theta)))
    for k, block in enumerate(blocks):
        out[2 * k:2 * k + 2, 2 * k:2 * k + 2] = block
    return out


def rotary_values(w, theta, offsets, centre, query_centre=None) -> dict:
    """a, g_Q, g_K, s_c over the offsets, computed with numpy."""
    query_centre = centre if query_centre is None else query_centre
    root = np.sqrt(w["W_Q"].shape[1])
    q_c, k_c = query_centre @ w["W_Q"] + w["b_Q"], centre @ w["W_K"] + w["b_K"]
    rotations = [rotation(offset, theta) for offset in offsets]
    return {"a": max(np.linalg.norm(w["W_Q"] @ r @ w["W_K"].T, 2) for r in rotations) / root,
            "g_Q": max(np.linalg.norm(w["W_K"] @ r.T @ q_c) for r in rotations) / root,
            "g_K": max(np.linalg.norm(w["W_Q"] @ r @ k_c) for r in rotations) / root,
            "s_c": max(abs(q_c @ r @ k_c) for r in rotations) / root}


def columns(w, centre) -> dict:
    """The weights, biases and the centre as the bound's matrix names read them."""
    return {**{key: np.asarray(value, dtype=float) for key, value in w.items()}, "c": np.asarray(centre, dtype=float)}


# Rotary attention ------------------------------------------------------------------------------
@settings(max_examples=10)
@given(n=st.integers(2, 4), d=st.integers(1, 3), pairs=st.integers(1, 2), biased=st.booleans(),
       centred=st.booleans(), causal=st.booleans(), radius=st.floats(0.3, 2.5), scale=st.floats(0.5, 3.0),
       norm=st.sampled_from(NORMS), seed=st.integers(0, 2 ** 16))
def test_rotary_bound_holds_against_the_rotated_forward_pass(n, d, pairs, biased, centred, causal, radius, scale,
                                                            norm, seed):
    rng = np.random.default_rng(seed)
    d_k = 2 * pairs
    w = weights_of(rng, d, d_k, scale=scale, biases=biased)
    theta = rng.uniform(0.1, 3.0, pairs)
    start = int(rng.integers(0, 50))  # absolute positions p_i = start + i: only the offsets matter
    centre = rng.standard_normal(d) if centred else np.zeros(d)
    domain = Ball(center=S.c) if centred else Ball()
    chosen = SelfAttention(RotaryScore(biases=biased), causal=causal)
    bound = chosen.derive(Assumptions(domain=domain, norm=norm), "rope")
    offsets = range(-(n - 1), 1 if causal else n)
    numbers = {"n": n, "d": d, "d_k": d_k, "R": radius, **rotary_values(w, theta, offsets, centre)}
    value = bound_value(bound.expr, numbers, columns(w, centre))
    positions = start + np.arange(n)

    def f(X):
        return attention(X, w, theta=theta, q_positions=positions, k_positions=positions, causal=causal)

    for X in points(rng, n, d, radius, centre, 6):
        assert climb(f, X, radius, centre, rng, norm) <= value


def test_rotary_constants_are_the_dot_products_with_a_on_a_ball_about_0():
    rope = variant("rope-nobias").derive(Assumptions(domain=RMSNormImage()), "rope-nobias")
    dot = variant("dot-product-nobias").derive(Assumptions(domain=RMSNormImage()), "dot-product-nobias")
    assert rope.expr == dot.expr.xreplace({S.MatrixNormSymbol("A"): S.a_rot})
    assert S.MatrixNormSymbol("A") not in rope.expr.free_symbols


def test_the_rotary_query_term_needs_its_centre_term():
    """alpha bounds std_{j ~ p}(grad_x s(x_i, x_j) . e) / ||e||.  With the dot product the keys' query gradients
    A x_j differ by A (x_j - x_k), within R ||A|| of each other; with RoPE each key has its own rotation, and the
    centre term W_Q R_Delta k_c / sqrt(d_k) differs from key to key.  On a small ball far from 0 the spread exceeds
    R a, the mean-value constant with ||A|| -> a, and stays below lipbound's R a + g_K."""
    d, n, radius = 2, 3, 1e-3
    w = {"W_Q": np.eye(2), "W_K": np.eye(2), "b_Q": np.zeros(2), "b_K": np.zeros(2)}
    theta = np.array([math.pi / 2])
    centre = np.array([4.0, 0.0])
    values = rotary_values(w, theta, range(-(n - 1), n), centre)
    X = centre + radius * np.array([[0.0, 1.0], [1.0, 0.0], [0.0, -1.0]])
    rng = np.random.default_rng(0)
    largest = 0.0
    for _ in range(200):
        e = rng.standard_normal(d)
        e /= np.linalg.norm(e)
        gradients = np.array([w["W_Q"] @ rotation(j - 0, theta) @ (X[j] @ w["W_K"]) for j in range(n)]) / np.sqrt(2)
        p = rng.dirichlet(np.ones(n))
        z = gradients @ e
        largest = max(largest, float(np.sqrt(p @ (z - p @ z) ** 2)))
    assert largest > 10 * radius * values["a"]
    assert largest <= radius * values["a"] + values["g_K"]


def test_the_unrotated_constant_is_beaten_by_a_generated_example():
    """The claim rope-unrotated: d = 1, d_k = 2, W_Q = (1, 0), W_K = (0, 1), theta = pi/2.  W_Q W_K^T = 0, so the
    claimed constant is ||W_V|| = 1; the rotated scores move the weights.  Certified by lipbound, and again by the
    forward pass here."""
    item = PENDING_CLAIMS["rope-unrotated"]
    assert item.tag == "known-wrong" and item.variant == "rope"
    w = {"W_Q": np.array([[1.0, 0.0]]), "W_K": np.array([[0.0, 1.0]]), "W_V": np.eye(1), "b_Q": np.zeros(2),
         "b_K": np.zeros(2), "b_V": np.zeros(1)}
    claimed = bound_value(item.statement, {"n": 2, "R": 1.0, "d_k": 2}, columns(w, np.zeros(1)))
    assert claimed == pytest.approx(1.0)
    found = unrotated_counterexample()
    assert found["lower"] > 1.2 > claimed
    X = np.array([[0.95], [-0.3]])
    J = jacobian(lambda Z: attention(Z, w, theta=np.array([math.pi / 2])), X)
    np.testing.assert_allclose(J, np.array(found["jacobian"].evalf(), dtype=float), rtol=1e-12, atol=1e-14)
    assert np.linalg.norm(J, 2) > claimed
    # and lipbound's theorem holds there: a = max_Delta ||A_Delta|| = 1 / sqrt(2)
    bound = variant("rope-nobias").derive(Assumptions(domain=Ball()), "rope-nobias")
    numbers = {"n": 2, "R": 1.0, "d_k": 2, **rotary_values(w, [math.pi / 2], (-1, 0, 1), np.zeros(1))}
    assert numbers["a"] == pytest.approx(1 / math.sqrt(2))
    assert bound_value(bound.expr, numbers, columns(w, np.zeros(1))) >= np.linalg.norm(J, 2)


@settings(max_examples=6)
@given(n=st.integers(1, 3), m=st.integers(1, 3), d=st.integers(1, 3), radius=st.floats(0.3, 2.0),
       seed=st.integers(0, 2 ** 16))
def test_rotary_cross_attention_jointly(n, m, d, radius, seed):
    rng = np.random.default_rng(seed)
    w = weights_of(rng, d, 2, scale=2.0)
    theta = rng.uniform(0.1, 3.0, 1)
    bound = CrossAttention(RotaryScore(), "joint").derive(Assumptions(domain=Ball()), "rope-cross-joint")
    offsets = range(-(m - 1), n)  # j - i over queries 0..m-1, keys 0..n-1
    numbers = {"n": n, "m": m, "d": d, "d_k": 2, "R": radius, **rotary_values(w, theta, offsets, np.zeros(d))}
    value = bound_value(bound.expr, numbers, columns(w, np.zeros(d)))
    for _ in range(5):
        Z = points(rng, n + m, d, radius, np.zeros(d), 1)[0]

        def f(W):
            return attention(W[m:], w, queries=W[:m], theta=theta)

        assert np.linalg.norm(jacobian(f, Z), 2) <= value


# QK-norm ------------------------------------------------------------------------------------------
@settings(max_examples=10)
@given(n=st.integers(2, 4), d=st.integers(1, 3), d_k=st.sampled_from([2, 4]), rotary=st.booleans(),
       causal=st.booleans(), radius=st.floats(0.3, 4.0), eps=st.floats(1e-3, 1.0), norm=st.sampled_from(NORMS),
       seed=st.integers(0, 2 ** 16))
def test_qk_norm_bound_holds(n, d, d_k, rotary, causal, radius, eps, norm, seed):
    rng = np.random.default_rng(seed)
    w = weights_of(rng, d, d_k, scale=2.0)
    qk = {"gamma_q": rng.uniform(-2, 2, d_k), "gamma_k": rng.uniform(-2, 2, d_k), "eps": eps}
    tau = float(rng.uniform(0.2, 2.0))
    theta = rng.uniform(0.1, 3.0, d_k // 2) if rotary else None
    bound = SelfAttention(QKNormScore(rotary), causal=causal).derive(Assumptions(domain=Ball(), norm=norm), "qk")
    numbers = {"n": n, "d": d, "d_k": d_k, "R": radius, "tau": tau, "epsilon": eps,
               "gamma_q": np.max(np.abs(qk["gamma_q"])), "gamma_k": np.max(np.abs(qk["gamma_k"])),
               "gamma_qk": np.max(np.abs(qk["gamma_q"] * qk["gamma_k"]))}
    value = bound_value(bound.expr, numbers, columns(w, np.zeros(d)))

    def f(X):
        return attention(X, w, theta=theta, causal=causal, qk=qk, scale=tau)

    for X in points(rng, n, d, radius, np.zeros(d), 5):
        assert climb(f, X, radius, np.zeros(d), rng, norm) <= value


def test_qk_norm_logits_are_bounded_whatever_the_input():
    """|s| < tau d_k gamma_qk (gamma_q gamma_k with rotations), at inputs of any size, and nearly attained."""
    rng = np.random.default_rng(7)
    d_k = 4
    gamma_q, gamma_k = rng.uniform(-2, 2, d_k), rng.uniform(-2, 2, d_k)
    product = np.max(np.abs(gamma_q * gamma_k))
    for scale in (1e-3, 1.0, 1e3):
        Q, K = rms(scale * rng.standard_normal((50, d_k)), gamma_q, 1e-6), rms(scale * rng.standard_normal((50, d_k)),
                                                                              gamma_k, 1e-6)
        assert np.max(np.abs(Q @ K.T)) < d_k * product
        rotated = rotate(Q, np.zeros(50), rng.uniform(0, 3, 2)) @ rotate(K, np.arange(50), rng.uniform(0, 3, 2)).T
        assert np.max(np.abs(rotated)) < d_k * np.max(np.abs(gamma_q)) * np.max(np.abs(gamma_k))
    top = int(np.argmax(np.abs(gamma_q * gamma_k)))  # both normalised vectors along the best coordinate
    unit = np.eye(d_k)[top:top + 1] * 1e3
    assert abs((rms(unit, gamma_q, 1e-6) @ rms(unit, gamma_k, 1e-6).T)[0, 0]) > 0.999 * d_k * product


@pytest.mark.parametrize("name", ["qk-norm", "qk-norm-rope"])
def test_qk_norm_is_not_lipschitz_and_its_witness_family_grows(name):
    result = variant(name).derive(Assumptions(domain=Unbounded()), name)
    assert not result.lipschitz and result.limit == sp.oo
    growth = [float(result.growth.xreplace({S.t: t})) for t in (10, 100, 1000)]
    assert growth[0] < growth[1] < growth[2] and growth[2] > 100
    # the entry is the Jacobian of the forward pass along X_t = (0, t): d = d_k = 1, unit gains, tau = epsilon = 1
    w = {"W_Q": np.eye(1), "W_K": np.eye(1), "W_V": np.eye(1), "b_Q": np.zeros(1), "b_K": np.zeros(1),
         "b_V": np.zeros(1)}
    qk = {"gamma_q": np.ones(1), "gamma_k": np.ones(1), "eps": 1.0}
    family = np.array(result.family.tolist(), dtype=object)
    for t in (3.0, 30.0):
        X = np.array([[float(sp.sympify(v).xreplace({S.t: t}))] for v in family[:, 0]])
        J = jacobian(lambda Z: attention(Z, w, qk=qk, scale=1.0), X)
        assert np.max(np.abs(J)) == pytest.approx(float(result.growth.xreplace({S.t: t})), rel=1e-9)


# Masks, position biases, soft caps -------------------------------------------------------------
def test_column_sums_of_windows_bound_the_caps_and_causal_windows_are_exact():
    for n in range(1, 14):
        for w in range(1, 9):
            for omega in (0.0, 0.3, 1.0, 3.0, 9.0):
                K, _ = Mask(window=w).column_sums(n, omega, _Record())
                assert float(S.expand_special(K)) >= largest_cap_column(n, w, omega) - 1e-12
                K_c, _ = Mask(causal=True, window=w).column_sums(n, omega, _Record())
                assert float(S.expand_special(K_c).doit()) == pytest.approx(largest_cap_column(n, w, omega, True),
                                                                             rel=1e-12)


class _Record:
    def add(self, *args, **kwargs):
        return self


@settings(max_examples=25)
@given(n=st.integers(2, 9), w=st.integers(1, 6), causal=st.booleans(), omega=st.floats(0.0, 6.0),
       slope=st.floats(0.05, 3.0), bias=st.sampled_from(["none", "relative", "alibi"]), seed=st.integers(0, 2 ** 16))
def test_real_attention_matrices_respect_the_column_sums(n, w, causal, omega, slope, bias, seed):
    """Scores whose rows spread by at most omega, plus position biases, through the masked softmax: every column
    sum is at most K of Mask.column_sums (the biases' spread Delta_b measured on the table, ALiBi's slope m_A)."""
    rng = np.random.default_rng(seed)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    table = {"none": np.zeros((n, n)), "relative": rng.normal(size=2 * n)[(j - i) + n],
             "alibi": -slope * np.abs(i - j)}[bias]
    mask = np.ones((n, n)) * ((i - j < w) & (j <= i) if causal else (np.abs(i - j) < w))
    spread = max(np.ptp(table[r][mask[r] > 0]) for r in range(n))
    K, _ = Mask(causal, w, bias).column_sums(n, S.omega, _Record())
    cap = float(S.expand_special(K.xreplace({S.omega: omega, S.Delta_b: spread, S.m_A: slope})).doit())
    for _ in range(30):
        scores = rng.uniform(0, omega, (n, n)) if rng.random() < 0.5 else \
            np.where(rng.random((n, n)) < 0.5, 0.0, omega)  # extreme rows: each score at an end of the spread
        weights = np.exp(scores + table) * mask
        weights /= weights.sum(axis=1, keepdims=True)
        assert weights.sum(axis=0).max() <= cap + 1e-12


@settings(max_examples=10)
@given(n=st.integers(2, 5), d=st.integers(1, 3), w=st.integers(1, 4), causal=st.booleans(),
       bias=st.sampled_from(["none", "t5", "alibi"]), radius=st.floats(0.3, 2.5), norm=st.sampled_from(NORMS),
       seed=st.integers(0, 2 ** 16))
def test_windows_and_biases_bound_the_forward_pass(n, d, w, causal, bias, radius, norm, seed):
    rng = np.random.default_rng(seed)
    weights = weights_of(rng, d, 2, scale=2.0)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    slope = float(rng.uniform(0.1, 2.0))
    table = {"none": None, "t5": rng.normal(size=2 * n)[(j - i) + n], "alibi": -slope * np.abs(i - j)}[bias]
    chosen = positioned(variant("dot-product"), causal=causal, window=sp.Integer(w),
                        bias=None if bias == "none" else bias)
    bound = chosen.derive(Assumptions(domain=Ball(), norm=norm), "masked")
    mask = ((i - j < w) & (j <= i)) if causal else (np.abs(i - j) < w)
    spread = 0.0 if table is None else max(np.ptp(table[r][mask[r]]) for r in range(n))
    numbers = {"n": n, "d": d, "d_k": 2, "R": radius, "Delta_b": spread, "m_A": slope}
    value = bound_value(bound.expr, numbers, columns(weights, np.zeros(d)))

    def f(X):
        return attention(X, weights, causal=causal, window=w, bias=table)

    for X in points(rng, n, d, radius, np.zeros(d), 5):
        assert climb(f, X, radius, np.zeros(d), rng, norm) <= value


@settings(max_examples=10)
@given(n=st.integers(2, 4), d=st.integers(1, 3), cap=st.floats(0.05, 3.0), centred=st.booleans(),
       rotary=st.booleans(), radius=st.floats(0.3, 2.5), norm=st.sampled_from(NORMS), seed=st.integers(0, 2 ** 16))
def test_soft_capped_bounds_hold(n, d, cap, centred, rotary, radius, norm, seed):
    rng = np.random.default_rng(seed)
    w = weights_of(rng, d, 2, scale=3.0)
    centre = 2 * rng.standard_normal(d) if centred else np.zeros(d)
    theta = rng.uniform(0.1, 3.0, 1) if rotary else None
    score = SoftCapped(RotaryScore() if rotary else DotProduct())
    bound = SelfAttention(score).derive(Assumptions(domain=Ball(center=S.c) if centred else Ball(), norm=norm), "cap")
    numbers = {"n": n, "d": d, "d_k": 2, "R": radius, "c_cap": cap}
    if rotary:
        numbers.update(rotary_values(w, theta, range(-(n - 1), n), centre))
    value = bound_value(bound.expr, numbers, columns(w, centre))

    def f(X):
        return attention(X, w, theta=theta, cap=cap)

    for X in points(rng, n, d, radius, centre, 5):
        assert climb(f, X, radius, centre, rng, norm) <= value


def test_a_soft_cap_bounds_the_spread_and_keeps_beta():
    capped = SoftCapped(DotProduct()).kernel_constants(Assumptions(domain=Ball()))
    plain = DotProduct().kernel_constants(Assumptions(domain=Ball()))
    assert capped.beta == plain.beta and capped.omega == sp.Min(plain.omega, 2 * S.c_cap)
    # the mean-value alpha R ||A|| gains half the centre term ||W_Q b_K|| / sqrt(d_k): a factor per key breaks it
    assert sp.simplify(capped.alpha - plain.alpha - S.VectorNormSymbol("W_Q*b_K") / (2 * sp.sqrt(S.d_k))) == 0


@pytest.mark.parametrize("name", ["sliding-window", "alibi", "t5-bias", "softcap", "rope", "gqa"])
def test_every_masked_or_rotated_variant_is_not_lipschitz_on_R_d(name):
    result = variant(name).derive(Assumptions(domain=Unbounded()), name)
    assert not result.lipschitz and result.limit == sp.oo


# Grouped-query layers ------------------------------------------------------------------------------
def test_grouped_heads_keep_sqrt_H_not_sqrt_G():
    """Multi-query attention (G = 1) whose H heads attend alike: at n = 1 the layer is x -> sum_h B^T V^T x, so its
    constant is H ||V B||.  The rule with sqrt(H) (lipbound's) is exact there; with sqrt(G) it would be beaten."""
    H, d = 4, 3
    V, B = np.eye(d), np.eye(d)
    W_O = np.vstack([B] * H)
    true = np.linalg.norm(V @ sum([B] * H), 2)
    per_head = np.linalg.norm(V, 2)  # each head at n = 1 is x -> V^T x
    assert np.linalg.norm(W_O, 2) * math.sqrt(H) * per_head == pytest.approx(true)
    assert np.linalg.norm(W_O, 2) * math.sqrt(1) * per_head < true
    grouped = variant("gqa").derive(Assumptions(domain=Ball()), "gqa")
    assert S.H in grouped.expr.free_symbols and S.G not in grouped.expr.free_symbols


@settings(max_examples=20)
@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3), d=st.integers(1, 4),
       norm=st.sampled_from(["fro", "2,1", "2,inf"]),
       seed=st.integers(0, 2 ** 16))
def test_grouped_composition_on_linear_heads(sizes, d, norm, seed):
    """Heads that are linear maps x -> V_g^T x (shared within a group) with constants L_h = ||V_g||: the layer
    sum_h V_g W_O^h is a token-wise linear map, whose norm each form of compose_groups bounds."""
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal((d, d)) for _ in sizes]
    heads = [values[g] for g, size in enumerate(sizes) for _ in range(size)]
    blocks = [rng.standard_normal((d, d)) for _ in heads]
    layer = sum(V @ B for V, B in zip(heads, blocks))
    true = np.linalg.norm(layer, 2)
    theorem = T.compose_groups(tuple(sizes), norm)
    numbers = {f"L_{h + 1}": np.linalg.norm(V, 2) for h, V in enumerate(heads)}
    numbers.update({f"W_O^{h + 1}": np.linalg.norm(B, 2) for h, B in enumerate(blocks)})
    starts = np.cumsum([0] + list(sizes))
    numbers.update({f"W_O^g{g + 1}": np.linalg.norm(np.vstack(blocks[starts[g]:starts[g + 1]]), 2)
                    for g in range(len(sizes))})
    numbers["W_O"] = np.linalg.norm(np.vstack(blocks), 2)
    values_ = {s: sp.Float(numbers[s.name] * (1 + ROUND), 30) for s in theorem.statement.free_symbols}
    for form in theorem.statement.args:
        assert true <= float(form.xreplace(values_)) + 1e-12


@settings(max_examples=6)
@given(n=st.integers(1, 3), d=st.integers(2, 3), groups=st.integers(1, 2), per_group=st.integers(1, 2),
       radius=st.floats(0.3, 1.5), seed=st.integers(0, 2 ** 16))
def test_grouped_multi_head_bound_holds_on_a_layer_with_shared_keys_and_values(n, d, groups, per_group, radius, seed):
    rng = np.random.default_rng(seed)
    H = groups * per_group
    shared = [weights_of(rng, d, 2, scale=2.0) for _ in range(groups)]
    heads = [{**shared[g], "W_Q": 2 * rng.standard_normal((d, 2)) / np.sqrt(d), "b_Q": rng.standard_normal(2)}
             for g in range(groups) for _ in range(per_group)]
    W_O = rng.standard_normal((H * d, d)) / np.sqrt(H * d)
    bound = variant("gqa").derive(Assumptions(domain=Ball()), "gqa")
    A = max(np.linalg.norm(h["W_Q"] @ h["W_K"].T, 2) for h in heads) / np.sqrt(2)
    expr = bound.expr.xreplace({S.MatrixNormSymbol("A"): sp.Float(A * (1 + ROUND), 30)})
    largest = {}
    for name in ("W_V", "W_Q", "W_K", "W_K*b_Q", "b_Q"):  # per-head constants are maxima over heads and groups
        largest[name] = max(matrix_value(name, columns(h, np.zeros(d))) for h in heads)
    expr = expr.xreplace({s: sp.Float(largest[s.name] * (1 + ROUND), 30) for s in expr.free_symbols
                          if isinstance(s, (S.MatrixNormSymbol, S.VectorNormSymbol)) and s.name in largest})
    value = bound_value(expr, {"n": n, "d": d, "d_k": 2, "R": radius, "H": H}, {"W_O": W_O})

    def f(X):
        return np.hstack([attention(X, h) for h in heads]) @ W_O

    for X in points(rng, n, d, radius, np.zeros(d), 4):
        assert np.linalg.norm(jacobian(f, X), 2) <= value


# Gated feed-forward blocks ---------------------------------------------------------------------------
ACTIVATIONS = {"swiglu": lambda t: t / (1 + np.exp(-t)), "geglu": lambda t: t * (1 + erf(t / np.sqrt(2))) / 2,
               "geglu-tanh": lambda t: t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t ** 3))) / 2}


def gated(name, w):
    return lambda X: (ACTIVATIONS[name](X @ w["W_gate"]) * (X @ w["W_up"])) @ w["W_down"]


def gated_values(w) -> dict:
    a, b = np.linalg.norm(w["W_up"], axis=0), np.linalg.norm(w["W_gate"], axis=0)
    def scaled(left, weights, right):  # ||left^T D^(1/2)|| ||D^(1/2) right^T||, D = diag(weights)
        return np.linalg.norm(left.T * np.sqrt(weights), 2) * np.linalg.norm(np.sqrt(weights)[:, None] * right.T, 2)

    return {"Gamma_up": scaled(w["W_down"], a, w["W_gate"]), "Gamma_gate": scaled(w["W_down"], b, w["W_up"]),
            "mu_up": a.max(), "mu_gate": b.max()}


@settings(max_examples=12)
@given(name=st.sampled_from(sorted(ACTIVATIONS)), d=st.integers(1, 4), d_ff=st.integers(1, 6),
       radius=st.floats(0.2, 6.0), centred=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gated_bound_holds(name, d, d_ff, radius, centred, seed):
    rng = np.random.default_rng(seed)
    w = {"W_gate": rng.standard_normal((d, d_ff)), "W_up": rng.standard_normal((d, d_ff)),
         "W_down": rng.standard_normal((d_ff, d))}
    centre = rng.standard_normal(d) if centred else np.zeros(d)
    block = GatedFeedForwardMap(name)
    bound = block.derive(Assumptions(domain=Ball(center=S.c) if centred else Ball()), name)
    numbers = {"R": radius, "d": d, **gated_values(w), "ell_phi": float(dict(
        swiglu=1.0998393201288677, geglu=1.1289041451851555, **{"geglu-tanh": 1.1289930686587727})[name])}
    value = bound_value(bound.expr, numbers, {"c": centre[:, None]})
    assert value <= bound_value(bound.expr.xreplace({S.Gamma_up: S.mu_up * S.MatrixNormSymbol("W_down") *
                                                     S.MatrixNormSymbol("W_gate"),
                                                     S.Gamma_gate: S.mu_gate * S.MatrixNormSymbol("W_down") *
                                                     S.MatrixNormSymbol("W_up")}),
                                numbers, {**w, "c": centre[:, None]}) + 1e-9  # the matrix form is the smaller
    for X in points(rng, 1, d, radius, centre, 12):
        assert np.linalg.norm(jacobian(gated(name, w), X), 2) <= value


def test_gated_constants_are_certified_and_the_unit_ratio_holds():
    from lipbound.symbolic.gated import certified_slope
    grid = np.linspace(-12, 12, 240001)
    for name, activation in (("swiglu", "silu"), ("geglu", "gelu"), ("geglu-tanh", "gelu_new")):
        phi = ACTIVATIONS[name]
        slope = np.gradient(phi(grid), grid)
        assert np.max(np.abs(slope)) <= float(certified_slope(activation)) <= np.max(np.abs(slope)) + 1e-6
        ratio = phi(grid[grid != 0]) / grid[grid != 0]
        assert np.all(np.abs(ratio) <= 1) and phi(40.0) / 40 > 1 - 1e-12  # sup |phi(t) / t| = 1
    assert float(certified_slope("silu")) == pytest.approx(1.0998393201, abs=1e-10)
    assert float(certified_slope("gelu")) == pytest.approx(1.1289041452, abs=1e-10)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_gated_blocks_are_not_lipschitz_and_grow_quadratically(name):
    result = variant(name).derive(Assumptions(domain=Unbounded()), name)
    assert not result.lipschitz
    ratio = next(step.claim for step in result.record.steps if "linearly" in step.justification)
    assert ratio.rhs == 2
    f = gated(name, {"W_gate": np.eye(1), "W_up": np.eye(1), "W_down": np.eye(1)})
    for t in (5.0, 50.0, 500.0):
        entry = jacobian(f, np.array([[t]]))[0, 0]
        assert entry == pytest.approx(float(result.growth.xreplace({S.t: t})), rel=1e-9)
        assert entry / t == pytest.approx(2, rel=0.05)


# Normalisations and residual blocks ------------------------------------------------------------------
@settings(max_examples=20)
@given(d=st.integers(1, 6), eps=st.floats(1e-6, 1.0), scale=st.sampled_from([1e-4, 1e-2, 1.0, 30.0]),
       seed=st.integers(0, 2 ** 16))
def test_rmsnorm_jacobian_local_bound_and_image(d, eps, scale, seed):
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(-3, 3, d)
    x = scale * rng.standard_normal(d)
    s = np.sqrt(x @ x / d + eps)
    J = jacobian(lambda z: rms(z, gamma, eps), x[None, :])
    np.testing.assert_allclose(J, np.diag(gamma) @ (np.eye(d) - np.outer(x, x) / (d * s * s)) / s, rtol=1e-10,
                               atol=1e-12 / s)
    assert np.linalg.norm(J, 2) <= np.max(np.abs(gamma)) / s * (1 + 1e-12)
    assert np.max(np.abs(gamma)) / s <= np.max(np.abs(gamma)) / np.sqrt(eps)
    u = rms(x[None, :], np.ones(d), eps)
    assert np.linalg.norm(u) < np.sqrt(d)
    at_zero = jacobian(lambda z: rms(z, gamma, eps), np.zeros((1, d)))
    assert np.linalg.norm(at_zero, 2) == pytest.approx(np.max(np.abs(gamma)) / np.sqrt(eps), rel=1e-12)


@settings(max_examples=10)
@given(d=st.integers(1, 4), d_ff=st.integers(1, 5), eps=st.floats(1e-3, 1.0), sandwich=st.booleans(),
       layerscale=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_residual_blocks_around_a_gated_branch(d, d_ff, eps, sandwich, layerscale, seed):
    """x + diag(lambda) N'(SwiGLU(N(x))): the concrete bound with RMSNorms, and the rule in L_F, L_N, L_N', at
    inputs of every scale (RMSNorm is steepest at 0, the gated block on the largest inputs its norm allows)."""
    rng = np.random.default_rng(seed)
    w = {"W_gate": rng.standard_normal((d, d_ff)), "W_up": rng.standard_normal((d, d_ff)),
         "W_down": rng.standard_normal((d_ff, d))}
    gamma, gamma_post, lam = rng.uniform(-2, 2, d), rng.uniform(-2, 2, d), rng.uniform(-1, 1, d)
    branch = gated("swiglu", w)

    def block(X):
        out = branch(rms(X, gamma, eps))
        out = rms(out, gamma_post, eps) if sandwich else out
        return X + (lam * out if layerscale else out)

    numbers = {"d": d, "eps": eps, "gamma_max": np.max(np.abs(gamma)), "gamma_post": np.max(np.abs(gamma_post)),
               "lambda_max": np.max(np.abs(lam)), "ell_phi": 1.0998393201288677, **gated_values(w)}
    r = numbers["gamma_max"] * np.sqrt(d)
    L_F = r * (numbers["ell_phi"] * numbers["Gamma_up"] + numbers["Gamma_gate"])
    rule = NormResidual("pre", layerscale=layerscale, sandwich=sandwich).derive(Assumptions(domain=Unbounded()))
    rule_value = bound_value(rule.expr, {**numbers, "L_F": L_F, "L_N": numbers["gamma_max"] / np.sqrt(eps),
                                         "L_N'": numbers["gamma_post"] / np.sqrt(eps)}, {})
    values = [rule_value]
    if not layerscale:
        concrete = NormResidual("pre", GatedFeedForwardMap("swiglu"), NormalizationMap("rmsnorm"), sandwich=sandwich,
                                after=NormalizationMap("rmsnorm") if sandwich else None)
        values.append(bound_value(concrete.derive(Assumptions(domain=Unbounded())).expr, numbers, {}))
        assert values[1] == pytest.approx(rule_value, rel=1e-7)  # the same, up to the rounding of each factor
    for scale in (1e-3, 0.1, 1.0, 10.0):
        for _ in range(4):
            X = scale * rng.standard_normal((1, d))
            assert np.linalg.norm(jacobian(block, X), 2) <= min(values)


# Regimes in n ----------------------------------------------------------------------------------------
def test_regimes_in_n_of_the_new_bounds():
    """For large radii the weights saturate: the dot product's bound grows like sqrt(n) (Castin et al.'s order), the
    rotary one too (with a for ||A||), and a sliding window stops the growth at w."""
    from lipbound.symbolic.asymptotics import growth_exponent, leading_term
    A = S.MatrixNormSymbol("A")
    values = {S.MatrixNormSymbol("W_V"): 1, S.a_rot: 1, A: 1}

    def large_radius(expr):
        return leading_term(S.expand_special(expr.xreplace(values)), S.R)

    rope = variant("rope-nobias").derive(Assumptions(domain=Ball()), "rope-nobias").expr
    dot = variant("dot-product-nobias").derive(Assumptions(domain=Ball()), "dot-product-nobias").expr
    assert growth_exponent(large_radius(rope), S.n) == growth_exponent(large_radius(dot), S.n) == sp.Rational(1, 2)
    window = positioned(variant("dot-product-nobias"), causal=True, window=sp.Integer(16)).derive(
        Assumptions(domain=Ball()), "w").expr
    assert window.xreplace({S.n: 16}) == window.xreplace({S.n: 10 ** 6})  # the same bound for every n >= w


# The command line ------------------------------------------------------------------------------------
NEW = ("rope", "rope-nobias", "rope-causal", "rope-multi-head", "rope-residual", "rope-cross-joint", "qk-norm",
       "qk-norm-rope", "gqa", "sliding-window", "sliding-window-bidirectional", "alibi", "t5-bias", "softcap",
       "rmsnorm", "swiglu", "geglu", "geglu-tanh", "pre-rmsnorm-swiglu", "layerscale-residual", "sandwich-residual",
       "sandwich-geglu")


def test_list_names_every_new_variant(capsys):
    from lipbound.cli import main
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in NEW:
        assert f"  {name} " in out, name
    for theorem in ("self-attention-causal-window-fro", "self-attention-causal-alibi-fro", "gated-feed-forward-silu",
                    "not-lipschitz-swiglu", "grouped-multi-head-self-attention-fro",
                    "sandwich-pre-rmsnorm-geglu-tanh", "layerscale-residual"):
        assert f"  {theorem} " in out, theorem         # the id, then its description


@pytest.mark.parametrize("arguments, expected", [
    (["derive", "swiglu"], "NOT LIPSCHITZ"),
    (["derive", "swiglu", "--domain", "rmsnorm"], "gamma_max*sqrt(d)*(ell_phi*Gamma_up + Gamma_gate)"),
    (["derive", "qk-norm", "--domain", "unbounded"], "NOT LIPSCHITZ"),
    (["derive", "rope-nobias", "--domain", "rmsnorm"], "kappa_n(2*gamma_max**2*d*a)"),
    (["derive", "rope-causal", "--window", "4096", "--softcap"], "kappa^c_{min(4096, n)}"),
    (["derive", "dot-product", "--causal", "--bias", "alibi"], "log(exp("),
    (["derive", "qk-norm-rope", "--window", "w", "--norm", "2,1"], "kappa_{min(n, 2*w - 1)}"),
    (["derive", "gqa", "--H", "8"], "2*sqrt(2)*||W_O||_2"),
])
def test_derive_the_new_variants_and_options(arguments, expected, capsys):
    from lipbound.cli import main
    assert main(arguments) == 0
    assert expected in capsys.readouterr().out


@pytest.mark.parametrize("arguments, fragment", [
    (["derive", "swiglu", "--window", "4"], "--window"),
    (["derive", "cross-joint", "--causal"], "--causal"),
    (["derive", "l2-tied", "--window", "4"], "--window"),
    (["derive", "rope", "--window", "0"], "--window"),
    (["derive", "alibi", "--softcap"], "--bias"),
    (["derive", "rope", "--bias", "alibi", "--softcap"], "--bias"),
])
def test_bad_options_are_one_line_errors(arguments, fragment, capsys):
    from lipbound.cli import main
    try:
        code = main(arguments)
    except SystemExit as exit_:  # an option's converter: argparse stops there
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["rope", "qk-norm-rope", "sliding-window", "alibi", "softcap", "gqa", "swiglu",
                                  "sandwich-geglu", "rmsnorm"])
def test_latex_json_and_proof_outputs(name, capsys):
    import json

    from lipbound.cli import main
    domain = ["--domain", "rmsnorm"]
    assert main(["derive", name, *domain, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["variant"] == name
    assert main(["derive", name, *domain, "--latex"]) == 0
    assert "\\" in capsys.readouterr().out
    assert main(["derive", name, *domain, "--proof"]) == 0
    proof = capsys.readouterr().out
    assert "\\begin{proof}" in proof and "\\begin{lbtheorem}" in proof


def test_a_limit_through_nested_minima_leaves_no_placeholder():
    """point_limit freezes each Min as a placeholder; a Min that holds another (ALiBi's column bound holds the
    score spread) must come back whole: as R -> 0 the spread vanishes and the bound is sqrt(min(kappa^c_n(m_A (n -
    1)), 1 + log 2 / m_A)) ||W_V||."""
    from lipbound.symbolic.asymptotics import regime
    bound = variant("alibi").derive(Assumptions(domain=Ball()), "alibi").expr
    limit = regime(bound, S.R, sp.Integer(0)).leading
    assert not [s for s in limit.free_symbols if isinstance(s, sp.Dummy)]
    numbers = {S.n: 5, S.m_A: sp.Rational(1, 2), S.MatrixNormSymbol("W_V"): 1}
    value = float(S.expand_special(limit).xreplace(numbers).doit())
    expected = math.sqrt(min(sum(1 / (1 + (i - 1) * math.exp(-0.5 * 4)) for i in range(1, 6)), 1 + math.log(2) / 0.5))
    assert value == pytest.approx(expected, rel=1e-12)


#: one variant per new citation and kind of statement (rotary, QK-norm, grouped, position bias, gated block,
#: sandwich norm): the default profile's paper; every new variant is the slow profile's
CITING = ("rope-causal", "qk-norm", "gqa", "alibi", "swiglu", "sandwich-residual")


@pytest.mark.tex
@pytest.mark.parametrize("variants, least_pages", [
    pytest.param(CITING, 10, id="one-per-citation"),
    pytest.param(NEW, 40, id="every-new-variant", marks=pytest.mark.slow)])
def test_a_paper_section_of_the_new_variants_compiles(tmp_path, variants, least_pages):
    """``lipbound paper`` with the new variants and blocks: one latexmk run, no error, every reference and
    citation resolved, no line overfull by more than 10 pt."""
    import shutil

    from lipbound.cli import main
    if not (shutil.which("latexmk") and shutil.which("pdflatex") and shutil.which("bibtex")):
        pytest.skip("latexmk, pdflatex and bibtex are needed")
    from test_paper import compile_latex
    out = tmp_path / "section"
    assert main(["paper", *variants, "-o", str(out)]) == 0
    section = (out / "lipbound-section.tex").read_text()
    for key in ("lb-su2021", "lb-henry2020", "lb-press2022", "lb-ainslie2023", "lb-shazeer2020", "lb-gemma2024"):
        assert key in section
    _, pages = compile_latex(out)
    assert pages > least_pages
