"""Batched attention in numpy: forward pass, JVP and VJP, for every built-in score.

Tokens are rows.  Shapes: queries ``Y`` (b, m, d), keys/context ``X`` (b, n, d);
for self-attention ``Y = X``.  A head maps
``f_i = sum_j softmax_j(s(y_i, x_j)) (x_j W_V + b_V)`` with

* ``"dot"``:    ``s = (y W_Q + b_Q) . (x W_K + b_K) / sqrt(d_k)`` (Vaswani et al. 2017);
* ``"l2"``:     ``s = -||(y W_Q + b_Q) - (x W_K + b_K)||^2 / sqrt(d_k)`` (Kim et al. 2021);
* ``"cosine"``: ``s = tau <q, k> / (N(q) N(k))``, ``N(u) = sqrt(||u||^2 + eps)`` (LipsFormer-style).

The matrices are those of the symbolic layer (``v(y) = W_V^T y + b_V`` in column
form), i.e. Hugging Face ``weight.T``.  Derivatives are analytic: ``jvp`` returns
``Df[E]`` and ``vjp`` returns ``Df^T[G]``, both exact up to rounding, batched
over the leading axis, with no explicit Jacobian.
"""

from __future__ import annotations

import numpy as np

from ..errors import WeightsError
from .model.components import Head, Layer

__all__ = ["self_forward", "self_jvp", "self_vjp",
           "cross_forward", "cross_jvp", "cross_vjp", "layer_forward", "layer_jvp", "layer_vjp",
           "jacobian_norm", "dense_jacobian"]


# Scores ---------------------------------------------------------------------
def _project(head: Head, Y: np.ndarray, X: np.ndarray):
    return Y @ head.W_Q + head.b_Q, X @ head.W_K + head.b_K


def _softnorm(U: np.ndarray, eps: float) -> np.ndarray:
    return np.sqrt(np.sum(U * U, axis=-1, keepdims=True) + eps)


def _scores(head: Head, Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    scale = 1.0 / np.sqrt(head.d_k)
    if head.score == "dot":
        return scale * Q @ np.swapaxes(K, -1, -2)
    if head.score == "l2":
        qq = np.sum(Q * Q, axis=-1)[..., :, None]
        kk = np.sum(K * K, axis=-1)[..., None, :]
        return -scale * (qq - 2 * Q @ np.swapaxes(K, -1, -2) + kk)
    Qn, Kn = Q / _softnorm(Q, head.eps), K / _softnorm(K, head.eps)
    return head.tau * Qn @ np.swapaxes(Kn, -1, -2)


def _score_jvp(head: Head, Q, K, dQ, dK) -> np.ndarray:
    scale = 1.0 / np.sqrt(head.d_k)
    KT, dKT = np.swapaxes(K, -1, -2), np.swapaxes(dK, -1, -2)
    if head.score == "dot":
        return scale * (dQ @ KT + Q @ dKT)
    if head.score == "l2":
        qdq = np.sum(Q * dQ, axis=-1)[..., :, None]
        kdk = np.sum(K * dK, axis=-1)[..., None, :]
        return -2 * scale * (qdq - dQ @ KT - Q @ dKT + kdk)
    nq, nk = _softnorm(Q, head.eps), _softnorm(K, head.eps)
    Qn, Kn = Q / nq, K / nk
    dQn = dQ / nq - Q * np.sum(Q * dQ, axis=-1, keepdims=True) / nq ** 3
    dKn = dK / nk - K * np.sum(K * dK, axis=-1, keepdims=True) / nk ** 3
    return head.tau * (dQn @ np.swapaxes(Kn, -1, -2) + Qn @ np.swapaxes(dKn, -1, -2))


def _score_vjp(head: Head, Q, K, gS):
    scale = 1.0 / np.sqrt(head.d_k)
    gST = np.swapaxes(gS, -1, -2)
    if head.score == "dot":
        return scale * gS @ K, scale * gST @ Q
    if head.score == "l2":
        gQ = -2 * scale * (np.sum(gS, axis=-1)[..., None] * Q - gS @ K)
        gK = 2 * scale * (gST @ Q - np.sum(gS, axis=-2)[..., None] * K)
        return gQ, gK
    nq, nk = _softnorm(Q, head.eps), _softnorm(K, head.eps)
    Qn, Kn = Q / nq, K / nk
    gQn, gKn = head.tau * gS @ Kn, head.tau * gST @ Qn
    gQ = gQn / nq - Q * np.sum(Q * gQn, axis=-1, keepdims=True) / nq ** 3
    gK = gKn / nk - K * np.sum(K * gKn, axis=-1, keepdims=True) / nk ** 3
    return gQ, gK


def _softmax(S: np.ndarray, causal: bool) -> np.ndarray:
    if causal:
        m, n = S.shape[-2:]
        S = np.where(np.tril(np.ones((m, n), dtype=bool)), S, -np.inf)
    S = S - np.max(S, axis=-1, keepdims=True)
    P = np.exp(S)
    return P / np.sum(P, axis=-1, keepdims=True)


# One head ---------------------------------------------------------------------
def _check_tokens(name: str, T: np.ndarray, d: int) -> np.ndarray:
    T = np.asarray(T, dtype=float)
    if T.ndim == 2:
        T = T[None]
    if T.ndim != 3 or T.shape[-1] != d:
        raise WeightsError(name, f"tokens of shape (batch, n, {d}) or (n, {d})", f"shape {T.shape}",
                           "tokens are rows; the last axis is the model width")
    return T


def cross_forward(head: Head, Y: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Cross-attention: queries ``Y`` (b, m, d) attend to ``X`` (b, n, d); returns (b, m, d_v)."""
    Y, X = _check_tokens("Y", Y, head.d), _check_tokens("X", X, head.d)
    Q, K = _project(head, Y, X)
    P = _softmax(_scores(head, Q, K), head.causal)
    return P @ (X @ head.V + head.b_V)


def cross_jvp(head: Head, Y, X, dY, dX):
    """``(f, Df[dY, dX])`` for cross-attention (use ``dY = 0`` or ``dX = 0`` for one argument)."""
    Y, X = _check_tokens("Y", Y, head.d), _check_tokens("X", X, head.d)
    dY, dX = np.broadcast_to(dY, Y.shape), np.broadcast_to(dX, X.shape)
    Q, K = _project(head, Y, X)
    dQ, dK = dY @ head.W_Q, dX @ head.W_K
    P = _softmax(_scores(head, Q, K), head.causal)
    dS = _score_jvp(head, Q, K, dQ, dK)
    dP = P * (dS - np.sum(P * dS, axis=-1, keepdims=True))
    V = head.V
    values = X @ V + head.b_V
    return P @ values, dP @ values + P @ (dX @ V)


def cross_vjp(head: Head, Y, X, G):
    """``(Df^T G)`` split into ``(gY, gX)`` for a cotangent ``G`` of shape (b, m, d_v)."""
    Y, X = _check_tokens("Y", Y, head.d), _check_tokens("X", X, head.d)
    Q, K = _project(head, Y, X)
    P = _softmax(_scores(head, Q, K), head.causal)
    V = head.V
    values = X @ V + head.b_V
    gP = G @ np.swapaxes(values, -1, -2)
    gX = (np.swapaxes(P, -1, -2) @ G) @ V.T
    gS = P * (gP - np.sum(P * gP, axis=-1, keepdims=True))
    gQ, gK = _score_vjp(head, Q, K, gS)
    return gQ @ head.W_Q.T, gX + gK @ head.W_K.T


def self_forward(head: Head, X):
    """Self-attention ``f(X)``, shape (b, n, d_v)."""
    return cross_forward(head, X, X)


def self_jvp(head: Head, X, E):
    """``(f(X), Df(X)[E])`` for self-attention."""
    return cross_jvp(head, X, X, E, E)


def self_vjp(head: Head, X, G):
    """``Df(X)^T [G]`` for self-attention, shape (b, n, d)."""
    gY, gX = cross_vjp(head, X, X, G)
    return gY + gX


# A multi-head layer -------------------------------------------------------------
def layer_forward(layer: Layer, X):
    X = _check_tokens("X", X, layer.heads[0].d)
    out = np.concatenate([self_forward(h, X) for h in layer.heads], axis=-1) @ layer.W_O + layer.b_O
    return X + out if layer.residual else out


def layer_jvp(layer: Layer, X, E):
    X = _check_tokens("X", X, layer.heads[0].d)
    pairs = [self_jvp(h, X, E) for h in layer.heads]
    F = np.concatenate([p[0] for p in pairs], axis=-1) @ layer.W_O + layer.b_O
    dF = np.concatenate([p[1] for p in pairs], axis=-1) @ layer.W_O
    return (X + F, E + dF) if layer.residual else (F, dF)


def layer_vjp(layer: Layer, X, G):
    X = _check_tokens("X", X, layer.heads[0].d)
    G_heads = G @ layer.W_O.T
    out = np.zeros_like(X)
    start = 0
    for head in layer.heads:
        out = out + self_vjp(head, X, G_heads[..., start:start + head.d_v])
        start += head.d_v
    return out + G if layer.residual else out


# Jacobian norms -------------------------------------------------------------------
def jacobian_norm(jvp, vjp, X: np.ndarray, iterations: int = 50, seed: int = 0, start: np.ndarray | None = None):
    """Largest singular value of the Jacobian at each of a batch of inputs, by power
    iteration on ``J^T J`` (JVP then VJP); no Jacobian is formed.

    ``jvp(X, E) -> (F, dF)`` and ``vjp(X, G) -> gX``.  Returns ``(sigma, E)``: the
    estimates (b,) and unit directions (b, n, d).  ``sigma_b = ||J E_b||`` exactly for the
    returned ``E_b``, hence a valid lower bound on the local Jacobian norm.
    """
    X = np.asarray(X, dtype=float)
    rng = np.random.default_rng(seed)
    E = rng.standard_normal(X.shape) if start is None else np.array(start, dtype=float)
    axes = tuple(range(1, X.ndim))
    E /= np.sqrt(np.sum(E * E, axis=axes, keepdims=True))
    for _ in range(iterations):
        _, dF = jvp(X, E)
        E = vjp(X, dF)
        norms = np.sqrt(np.sum(E * E, axis=axes, keepdims=True))
        E = E / np.where(norms > 0, norms, 1.0)
    _, dF = jvp(X, E)
    sigma = np.sqrt(np.sum(dF * dF, axis=tuple(range(1, dF.ndim))))
    return sigma, E


def dense_jacobian(jvp, X: np.ndarray) -> np.ndarray:
    """The full Jacobian of one input ``X`` (n, d) as a matrix (outputs x inputs), by JVPs.
    For tests and small sizes only."""
    X = np.asarray(X, dtype=float)
    size = X.size
    basis = np.eye(size).reshape((size,) + X.shape)
    _, dF = jvp(np.broadcast_to(X, basis.shape), basis)
    return dF.reshape(size, -1).T
