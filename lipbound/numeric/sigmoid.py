r"""Sigmoid self-attention with the weights of a dot-product head: the map, its derivatives, a
witness search and a certified directional norm.

The weights of a :class:`~lipbound.numeric.model.Head` (dot-product score) define, with sigmoid
weights in place of the softmax (Ramapuram et al. 2024; lipbound's theorem is
:func:`lipbound.symbolic.nonsoftmax.sigmoid_attention`),

    f_i(X) = sum_j sigma(s_ij - log n) v(x_j),   s_ij = q_i . k_j / sqrt(d_k),
    q_i = x_i W_Q + b_Q,  k_j = x_j W_K + b_K,  v(y) = y W_V + b_V,

    Df_i[E] = sum_j sigma_ij e_j W_V + sum_j sigma'_ij ds_ij v(x_j),
    ds_ij = ((e_i W_Q) . k_j + q_i . (e_j W_K)) / sqrt(d_k),   sigma' = sigma (1 - sigma).

With ``C_ij = sigma'_ij (g_i . v_j)`` the adjoint is
``E* = sigma^T G W_V^T + (C K) W_Q^T / sqrt(d_k) + (C^T Q) W_K^T / sqrt(d_k)``.  The float map, its
JVP and VJP are the one attention engine (:mod:`lipbound.numeric.attention`) with the head's
kernel replaced by :class:`~lipbound.numeric.kernels.Sigmoid`; this module compares the two maps
on the same weights (:mod:`lipbound.numeric.claim_checks`).

:func:`certified_ratio` recomputes ``||Df(X)[E]||_F / ||E||_F`` in interval arithmetic
(:class:`~lipbound.rigorous.arrays.IntervalArray`, outward rounding, ``exp`` from correctly
rounded operations); its lower end bounds the map's Lipschitz constant from below on any domain
holding X.  :func:`sigmoid_witness` searches X in the ball of radius R about 0 by a seeded ascent
in the span of the head's projections (a token's component outside that span changes nothing).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import AssumptionError
from ..rigorous.arrays import IntervalArray
from ..rigorous.functions import log
from ..rigorous.intervals import IV, interval, lower, upper
from ..rigorous.linalg import vector_norm_lower, vector_norm_upper
from .attention import AttentionMap
from .dispatch import dot_product_scope
from .kernels import AttentionMask, Sigmoid
from .model import Head

__all__ = ["check_sigmoid_head", "sigmoid_forward", "sigmoid_jvp", "sigmoid_vjp", "sigmoid_jacobian_norm",
           "certified_ratio", "sigmoid_witness"]


def check_sigmoid_head(head: Head) -> Head:
    """The head, if its weights define sigmoid attention here: a dot-product score, no mask."""
    if not isinstance(head, Head) or not dot_product_scope(head) or head.causal:
        got = head.kernel.describe() if isinstance(head, Head) else type(head).__name__
        raise AssumptionError("head", "a dot-product head without a causal mask (its W_Q, W_K, W_V and biases "
                              "define the sigmoid map)", got, "pass a dot-product head")
    return head


def _engine(head: Head) -> AttentionMap:
    """The head's weights with sigmoid weights (the :class:`~lipbound.numeric.kernels.Sigmoid` kernel,
    ``b = -log n``) on the one attention engine."""
    return AttentionMap(replace(check_sigmoid_head(head), kernel=Sigmoid(), mask=AttentionMask()))


def sigmoid_forward(head: Head, X: np.ndarray) -> np.ndarray:
    """``f(X)``, shape (n, d_v)."""
    return _engine(head).forward(np.asarray(X, dtype=float)[None])[0]


def sigmoid_jvp(head: Head, X: np.ndarray, E: np.ndarray) -> np.ndarray:
    """``Df(X)[E]``, shape (n, d_v)."""
    return _engine(head).linearize(np.asarray(X, dtype=float)[None]).jvp(np.asarray(E, dtype=float)[None])[0]


def sigmoid_vjp(head: Head, X: np.ndarray, G: np.ndarray) -> np.ndarray:
    """``Df(X)^T[G]``, shape (n, d)."""
    return _engine(head).linearize(np.asarray(X, dtype=float)[None]).vjp(np.asarray(G, dtype=float)[None])[0]


def sigmoid_jacobian_norm(head: Head, X: np.ndarray, iterations: int = 30, seed: int = 0):
    """``(||Df(X)||_2, E)`` by power iteration on ``Df^T Df`` (float; E of unit Frobenius norm)."""
    lin = _engine(head).linearize(np.asarray(X, dtype=float)[None])
    E = np.random.default_rng(seed).standard_normal(np.shape(X))
    E /= np.linalg.norm(E)
    for _ in range(iterations):
        E = lin.vjp(lin.jvp(E[None]))[0]
        size = np.linalg.norm(E)
        if size == 0:
            return 0.0, E
        E /= size
    return float(np.linalg.norm(lin.jvp(E[None]))), E


def _interval_sigmoid(S: IntervalArray) -> IntervalArray:
    """``sigma(S) = 1 / (1 + e^{-S})`` entrywise, in the form that cannot overflow for each entry
    (``e^{S} / (1 + e^{S})`` where S may be negative)."""
    lo, hi = np.empty(S.shape), np.empty(S.shape)
    positive = S.lo >= 0
    for mask, form in ((positive, lambda T: (1 + (-T).exp()).reciprocal()),
                       (~positive, lambda T: T.exp() / (1 + T.exp()))):
        if np.any(mask):
            part = form(IntervalArray(S.lo[mask], S.hi[mask]))
            lo[mask], hi[mask] = part.lo, part.hi
    return IntervalArray(lo, hi)


def certified_ratio(head: Head, X: np.ndarray, E: np.ndarray) -> tuple[float, float]:
    """An enclosure ``(lower, upper)`` of ``||Df(X)[E]||_F / ||E||_F`` from the floats X, E and the
    head's weights, all taken exactly."""
    check_sigmoid_head(head)
    X, E = np.asarray(X, dtype=float), np.asarray(E, dtype=float)
    n = X.shape[0]
    x, e = IntervalArray(X), IntervalArray(E)
    Q, K, V = x.matmul(head.W_Q) + head.b_Q, x.matmul(head.W_K) + head.b_K, x.matmul(head.W_V) + head.b_V
    scale = IntervalArray.constant(1 / IV.sqrt(interval(head.d_k)))
    S = Q.bmm(K.swapaxes(-1, -2)) * scale - IntervalArray.constant(log(n))
    weights = _interval_sigmoid(S)
    slopes = weights * (1 - weights)
    dS = (e.matmul(head.W_Q).bmm(K.swapaxes(-1, -2)) + Q.bmm(e.matmul(head.W_K).swapaxes(-1, -2))) * scale
    out = weights.bmm(e.matmul(head.W_V)) + (slopes * dS).bmm(V)
    flat = out.reshape(-1)
    vector = E.reshape(-1)
    below = interval(float(flat.norm_lower())) / interval(vector_norm_upper(vector))
    above = interval(float(flat.norm_upper())) / interval(vector_norm_lower(vector))
    return lower(below), upper(above)


def sigmoid_witness(head: Head, radius: float, n: int, *, steps: int = 40, starts: int = 6, seed: int = 0,
                    iterations: int = 12):
    """``(value, X, E)``: an input in the ball ``||x_i|| <= radius`` where the sigmoid map stretches
    (float value; certify it with :func:`certified_ratio`).

    Starts: every token at ``t u`` for the top singular directions u of ``W_Q W_K^T`` and of W_V and
    t in (0, radius] (all scores equal: the saturated regime), and random tokens in the span of the
    projections; then ``steps`` rounds of a seeded random-direction ascent in that span, each token
    kept in the ball."""
    check_sigmoid_head(head)
    rng = np.random.default_rng(seed)
    span, _, _ = np.linalg.svd(np.hstack([head.W_Q, head.W_K, head.W_V]), full_matrices=False)
    basis = span[:, :min(8, span.shape[1])]

    def clip(X):
        norms = np.linalg.norm(X, axis=1, keepdims=True)
        return X * np.minimum(1.0, radius / np.maximum(norms, 1e-300))

    def value(C):
        X = clip(C @ basis.T)
        return sigmoid_jacobian_norm(head, X, iterations, seed)[0], X

    candidates = []
    directions = [np.linalg.svd(head.W_Q @ head.W_K.T)[0][:, 0], np.linalg.svd(head.W_V)[0][:, 0]]
    for u in directions:
        for t in (0.25, 0.5, 1.0):
            candidates.append(np.tile((t * radius * u) @ basis, (n, 1)))
    for _ in range(starts):
        C = rng.standard_normal((n, basis.shape[1]))
        candidates.append(C * rng.uniform(0.1, 1.0) * radius / np.linalg.norm(C, axis=1, keepdims=True))
    best = (-1.0, None)
    for C in candidates:
        current, _ = value(C)
        step = 0.1 * radius
        for _ in range(steps):
            D = rng.standard_normal(C.shape)
            D *= step / np.linalg.norm(D)
            moved = [(value(C + sign * D)[0], C + sign * D) for sign in (1.0, -1.0)]
            top, C_top = max(moved, key=lambda item: item[0])
            if top > current:
                current, C = top, C_top
            else:
                step *= 0.8
        if current > best[0]:
            best = (current, C)
    X = clip(best[1] @ basis.T)
    norm, E = sigmoid_jacobian_norm(head, X, 4 * iterations, seed)
    return norm, X, E
