"""Attention in numpy, batched: the forward pass, JVP, VJP and second-order term, for every score.

Tokens are rows.  Queries ``Y`` (b, m, d) attend to keys and values ``X`` (b, n, d); for
self-attention ``Y = X``.  A head maps ``f_i = sum_j softmax_j(s(y_i, x_j)) (x_j V + b_V)`` with

* ``"dot"``:    ``s = (y W_Q + b_Q) . (x W_K + b_K) / sqrt(d_k)`` (Vaswani et al. 2017);
* ``"l2"``:     ``s = -||(y W_Q + b_Q) - (x W_K + b_K)||^2 / sqrt(d_k)`` (Kim et al. 2021);
* ``"cosine"``: ``s = tau <q, k> / (N(q) N(k))``, ``N(u) = sqrt(||u||^2 + eps)`` (LipsFormer-style);

``V = W_V``, or ``W_Q W_Q^T W_V / sqrt(d_k)`` with Kim et al.'s values (:attr:`Head.V`).  A layer
maps ``F = [f^1, ..., f^H] W_O + b_O`` (plus X when residual).

:class:`AttentionMap` prepares a head or a layer once: all projections of all heads go through
one fused matrix product ``[Q | K | V] = X W + b``, optionally in *working coordinates*
``x' = (x - c) U`` (``U`` an orthonormal basis of the span of the projections; moving a token
orthogonally to it changes nothing, so a search there loses nothing).  :meth:`AttentionMap.linearize`
returns a :class:`Linearization` at a batch of inputs, whose ``jvp``, ``vjp`` and ``curvature``
(``grad_X <G, Df(X)[E]>``) reuse the projections and attention weights.  Derivatives are
analytic (the curvature of l2 and cosine scores by central differences of VJPs).  The functions
``self_forward``, ``cross_jvp``, ``layer_vjp``, ... are the same map called on plain arrays.

The deliberately independent implementation, in exact and interval arithmetic, is in
:mod:`lipbound.numeric.recheck`.
"""

from __future__ import annotations

import math
from typing import final

import numpy as np

from ..errors import WeightsError
from .model.components import Head, Layer

__all__ = ["GRAM_TOKENS", "AttentionMap", "Linearization", "heads_of", "self_forward", "self_jvp", "self_vjp",
           "cross_forward",
           "cross_jvp", "cross_vjp", "layer_forward", "layer_jvp", "layer_vjp", "jacobian_norm", "dense_jacobian",
           "head_scores", "unit_rows"]


#: Up to this many tokens a single head's power iteration runs in output space (its n x n Gram
#: sandwiches cost O(n^3) a step; token space costs O(n^2 d) and wins beyond).
GRAM_TOKENS = 64


def heads_of(target) -> tuple[tuple[Head, ...], np.ndarray | None, np.ndarray | None, bool]:
    """``(heads, W_O, b_O, residual)`` of a Head or a Layer."""
    if isinstance(target, Head):
        return (target,), None, None, False
    if isinstance(target, Layer):
        return tuple(target.heads), target.W_O, target.b_O, bool(target.residual)
    raise WeightsError("target", "a Head or a Layer (lipbound.numeric.model)", type(target).__name__,
                       "build one with Head(W_Q, W_K, W_V, ...) or model.layer(L).as_layer()")


def unit_rows(E: np.ndarray) -> np.ndarray:
    """Each batch entry of E scaled to unit Frobenius norm."""
    size = np.sqrt(np.sum(E * E, axis=tuple(range(1, E.ndim)), keepdims=True))
    return E / np.where(size > 0, size, 1.0)


def _tokens(name: str, T, d: int) -> np.ndarray:
    T = np.asarray(T, dtype=float)
    if T.ndim == 2:
        T = T[None]
    if T.ndim != 3 or T.shape[-1] != d:
        raise WeightsError(name, f"tokens of shape (batch, n, {d}) or (n, {d})", f"shape {T.shape}",
                           "tokens are rows; the last axis is the model width")
    return T


def _softnorm(U: np.ndarray, eps: float) -> np.ndarray:
    return np.sqrt(np.sum(U * U, axis=-1, keepdims=True) + eps)


@final
class AttentionMap:
    """A head or a multi-head layer prepared for batched evaluation.

    Parameters
    ----------
    target : Head or Layer
        Every head of a layer must share its score, mask, temperature and shapes (the
        projections are fused).
    center : ndarray of shape (d,), optional
        Origin of the working coordinates (default 0).
    reduce : bool
        Work in an orthonormal basis of the span of the projections (ignored for residual layers,
        whose identity sees every direction).
    """

    def __init__(self, target: Head | Layer, center: np.ndarray | None = None, reduce: bool = False,
                 tangent: np.ndarray | None = None, query_center: np.ndarray | None = None,
                 query_tangent: np.ndarray | None = None):
        heads, W_O, b_O, residual = heads_of(target)
        first = heads[0]
        facts = lambda h: (h.d, h.d_k, h.d_v, h.causal, h.score, h.tau, h.eps)  # noqa: E731
        if any(facts(h) != facts(first) for h in heads):
            raise WeightsError("target.heads", "heads of one score, mask and shape (they are evaluated together)",
                               "a layer of mixed heads", "evaluate its heads one at a time")
        self.target, self.heads = target, heads
        self.H, self.d, self.d_k, self.d_v = len(heads), first.d, first.d_k, first.d_v
        self.score, self.causal, self.tau, self.eps = first.score, first.causal, first.tau, first.eps
        self.residual, self.W_O, self.b_O = residual, W_O, b_O
        W = np.concatenate([h.W_Q for h in heads] + [h.W_K for h in heads] + [h.V for h in heads], axis=1)
        bias = np.concatenate([h.b_Q for h in heads] + [h.b_K for h in heads] + [h.b_V for h in heads])
        self.center, self.basis = self._frame(W, center, tangent, reduce and not residual, slice(None))
        self.W = W if self.basis is None else self.basis.T @ W
        self.bias = bias + self.center @ W
        # queries of cross-attention may live in another set: their own frame, seeing only W_Q
        self.query_center, self.query_basis = self.center, self.basis
        if query_center is not None or query_tangent is not None:
            self.query_center, self.query_basis = self._frame(W, query_center, query_tangent, reduce and not residual,
                                                              slice(0, self.H * self.d_k))
        self.Wq = W if self.query_basis is None else self.query_basis.T @ W
        self.bias_q = bias + self.query_center @ W
        self.WT = np.ascontiguousarray(self.W.T)
        self.scale = 1.0 / math.sqrt(self.d_k)
        self.width = self.W.shape[1]
        self.gram = None  # a single dot-product head: power iteration in output space (Gram blocks of W)
        if self.H == 1 and W_O is None and not residual and self.score == "dot":
            dk = self.d_k
            W_Q, W_K, W_V = self.W[:, :dk], self.W[:, dk:2 * dk], self.W[:, 2 * dk:]
            self.gram = {"QQ": W_Q.T @ W_Q, "KQ": W_K.T @ W_Q, "KK": W_K.T @ W_K, "QV": W_Q.T @ W_V,
                         "KV": W_K.T @ W_V, "VV": W_V.T @ W_V}

    def _frame(self, W: np.ndarray, center, tangent, reduce: bool, columns: slice):
        """``(c, U)``: the origin and an orthonormal basis (None: all of R^d) of the working coordinates.

        ``tangent`` (d, r) orthonormal: the tokens move in ``c + span(tangent)`` only (a flat domain,
        e.g. a LayerNorm image).  ``reduce``: keep only the part of that span the projections
        ``W[:, columns]`` see; moving a token orthogonally to it changes nothing."""
        center = np.zeros(self.d) if center is None else np.asarray(center, dtype=float)
        if center.shape != (self.d,):
            raise WeightsError("center", f"shape ({self.d},)", f"shape {center.shape}",
                               "the centre has the width of a token")
        basis = None
        if tangent is not None:
            basis = np.asarray(tangent, dtype=float)
            if basis.ndim != 2 or basis.shape[0] != self.d or basis.shape[1] > self.d:
                raise WeightsError("tangent", f"an orthonormal basis of shape ({self.d}, r)", f"shape {basis.shape}",
                                   "pass TokenDomain.frame()'s basis")
        if reduce:
            seen = W[:, columns] if basis is None else basis.T @ W[:, columns]
            left, singular, _ = np.linalg.svd(seen, full_matrices=False)
            rank = int(np.sum(singular > singular[0] * 1e-12)) if singular.size and singular[0] > 0 else 0
            width = self.d if basis is None else basis.shape[1]
            if 0 < rank < width:
                basis = left[:, :rank] if basis is None else basis @ left[:, :rank]
        if basis is not None and basis.shape == (self.d, self.d) and tangent is None:
            basis = None
        return center, basis

    @property
    def d_in(self) -> int:
        """Working coordinates per token."""
        return self.d if self.basis is None else self.basis.shape[1]

    @property
    def d_query(self) -> int:
        """Working coordinates per query of cross-attention."""
        return self.d if self.query_basis is None else self.query_basis.shape[1]

    @property
    def d_out(self) -> int:
        return self.H * self.d_v if self.W_O is None else self.W_O.shape[1]

    def _frame_of(self, queries: bool):
        return (self.query_center, self.query_basis) if queries else (self.center, self.basis)

    def to_work(self, X: np.ndarray, queries: bool = False) -> np.ndarray:
        """Working coordinates of tokens (of the queries of cross-attention when ``queries``)."""
        center, basis = self._frame_of(queries)
        shifted = np.asarray(X, dtype=float) - center
        return shifted if basis is None else shifted @ basis

    def from_work(self, Xw: np.ndarray) -> np.ndarray:
        return self.direction_from_work(Xw) + self.center

    def direction_from_work(self, Ew: np.ndarray, queries: bool = False) -> np.ndarray:
        basis = self._frame_of(queries)[1]
        return Ew if basis is None else Ew @ basis.T

    def head_weights(self, h: int) -> tuple[np.ndarray, ...]:
        """``(W_Q, W_K, V, b_Q, b_K, b_V)`` of head ``h`` in working coordinates."""
        H, dk, dv = self.H, self.d_k, self.d_v
        cols = [slice(h * dk, (h + 1) * dk), slice(H * dk + h * dk, H * dk + (h + 1) * dk),
                slice(2 * H * dk + h * dv, 2 * H * dk + (h + 1) * dv)]
        return tuple(self.W[:, c] for c in cols) + tuple(self.bias[c] for c in cols)

    def linearize(self, Xw: np.ndarray, Yw: np.ndarray | None = None) -> "Linearization":
        """The map and its derivatives at a batch of inputs in working coordinates: keys and values
        ``Xw`` (b, n, d_in); queries ``Yw`` (b, m, d_in) for cross-attention (None: self-attention)."""
        return Linearization(self, np.asarray(Xw, dtype=float), None if Yw is None else np.asarray(Yw, dtype=float))

    def forward(self, Xw: np.ndarray, Yw: np.ndarray | None = None) -> np.ndarray:
        return self.linearize(Xw, Yw).F


@final
class Linearization:
    """Projections and attention weights at a batch of inputs, reused by JVPs, VJPs and the
    second-order term.  Shapes: ``Q`` (b, H, m, d_k), ``K`` (b, H, n, d_k), ``V`` (b, H, n, d_v),
    ``P`` (b, H, m, n)."""

    def __init__(self, engine: AttentionMap, Xw: np.ndarray, Yw: np.ndarray | None):
        self.k = engine
        self.X, self.Y = Xw, Yw
        self.cross = Yw is not None
        self.b, self.n = Xw.shape[0], Xw.shape[1]
        self.m = Yw.shape[1] if self.cross else self.n
        if engine.causal and self.cross:
            raise WeightsError("target", "a non-causal head for cross-attention", "a causal head",
                               "causal masks apply to self-attention")
        proj = self._project(Xw)
        _, K, V = self._split(proj)
        Q = self._split(self._project(Yw, queries=True))[0] if self.cross else self._split(proj)[0]
        self.Q, self.K, self.V = (np.ascontiguousarray(M) for M in (Q, K, V))
        S = self.S = self._scores()
        if engine.causal:
            S = np.where(np.tril(np.ones((self.m, self.n), dtype=bool)), S, -np.inf)
        S = S - np.max(S, axis=-1, keepdims=True)
        P = np.exp(S)
        self.P = P / np.sum(P, axis=-1, keepdims=True)
        self.PT = np.ascontiguousarray(np.swapaxes(self.P, -1, -2))
        self.VT = np.ascontiguousarray(np.swapaxes(self.V, -1, -2))
        if engine.score == "dot":  # scaled copies reused by every JVP and VJP
            self.Qc = engine.scale * self.Q
            self.KTc = np.ascontiguousarray(engine.scale * np.swapaxes(self.K, -1, -2))
        self._F = None

    # layout ------------------------------------------------------------------------------------
    def _project(self, Zw: np.ndarray, queries: bool = False) -> np.ndarray:
        k = self.k
        W, bias = (k.Wq, k.bias_q) if queries else (k.W, k.bias)
        return (Zw.reshape(-1, W.shape[0]) @ W + bias).reshape(Zw.shape[0], Zw.shape[1], k.width)

    def _split(self, Z: np.ndarray):
        k, b, n = self.k, Z.shape[0], Z.shape[1]
        H, dk, dv = k.H, k.d_k, k.d_v
        Q = Z[..., :H * dk].reshape(b, n, H, dk).transpose(0, 2, 1, 3)
        K = Z[..., H * dk:2 * H * dk].reshape(b, n, H, dk).transpose(0, 2, 1, 3)
        V = Z[..., 2 * H * dk:].reshape(b, n, H, dv).transpose(0, 2, 1, 3)
        return Q, K, V

    def _merge(self, gQ, gK, gV) -> np.ndarray:
        """Per-head cotangents of Q, K, V -> the fused projection space (b, n, width); ``gQ`` None
        for cross-attention, whose queries are not these tokens."""
        b, n = gK.shape[0], gK.shape[2]
        first = np.zeros((b, n, self.k.H * self.k.d_k)) if gQ is None else gQ.transpose(0, 2, 1, 3).reshape(b, n, -1)
        return np.concatenate([first, gK.transpose(0, 2, 1, 3).reshape(b, n, -1),
                               gV.transpose(0, 2, 1, 3).reshape(b, n, -1)], axis=-1)

    def _heads_out(self, Fh: np.ndarray) -> np.ndarray:
        """(b, H, m, d_v) -> the map's output (b, m, d_out), without bias."""
        b, H, m, dv = Fh.shape
        merged = Fh.transpose(0, 2, 1, 3).reshape(b, m, H * dv)
        return merged if self.k.W_O is None else merged @ self.k.W_O

    def _heads_in(self, G: np.ndarray) -> np.ndarray:
        """Cotangent of the output (b, m, d_out) -> per head (b, H, m, d_v)."""
        if self.k.W_O is not None:
            G = G @ self.k.W_O.T
        b, m = G.shape[0], G.shape[1]
        return G.reshape(b, m, self.k.H, self.k.d_v).transpose(0, 2, 1, 3)

    def _to_proj(self, E: np.ndarray, queries: bool = False) -> np.ndarray:
        W = self.k.Wq if queries else self.k.W
        return (E.reshape(-1, W.shape[0]) @ W).reshape(E.shape[0], E.shape[1], self.k.width)

    def _from_proj(self, Z: np.ndarray) -> np.ndarray:
        return (Z.reshape(-1, self.k.width) @ self.k.WT).reshape(Z.shape[0], Z.shape[1], self.k.d_in)

    # scores --------------------------------------------------------------------------------------
    def _scores(self) -> np.ndarray:
        k, Q, K = self.k, self.Q, self.K
        KT = np.swapaxes(K, -1, -2)
        if k.score == "dot":
            return k.scale * (Q @ KT)
        if k.score == "l2":
            qq = np.sum(Q * Q, axis=-1)[..., :, None]
            kk = np.sum(K * K, axis=-1)[..., None, :]
            return -k.scale * (qq - 2 * Q @ KT + kk)
        self.nq, self.nk = _softnorm(Q, k.eps), _softnorm(K, k.eps)
        self.Qn, self.Kn = Q / self.nq, K / self.nk
        return k.tau * self.Qn @ np.swapaxes(self.Kn, -1, -2)

    def _score_jvp(self, dQ, dK) -> np.ndarray:
        k, Q, K = self.k, self.Q, self.K
        if k.score == "dot":
            dS = dQ @ self.KTc
            dS += self.Qc @ np.swapaxes(dK, -1, -2)
            return dS
        if k.score == "l2":
            qdq = np.sum(Q * dQ, axis=-1)[..., :, None]
            kdk = np.sum(K * dK, axis=-1)[..., None, :]
            return -2 * k.scale * (qdq - dQ @ np.swapaxes(K, -1, -2) - Q @ np.swapaxes(dK, -1, -2) + kdk)
        dQn = dQ / self.nq - Q * np.sum(Q * dQ, axis=-1, keepdims=True) / self.nq ** 3
        dKn = dK / self.nk - K * np.sum(K * dK, axis=-1, keepdims=True) / self.nk ** 3
        return k.tau * (dQn @ np.swapaxes(self.Kn, -1, -2) + self.Qn @ np.swapaxes(dKn, -1, -2))

    def _score_vjp(self, gS):
        k, Q, K = self.k, self.Q, self.K
        gST = np.swapaxes(gS, -1, -2)
        if k.score == "dot":
            return k.scale * gS @ K, k.scale * gST @ Q
        if k.score == "l2":
            gQ = -2 * k.scale * (np.sum(gS, axis=-1)[..., None] * Q - gS @ K)
            gK = 2 * k.scale * (gST @ Q - np.sum(gS, axis=-2)[..., None] * K)
            return gQ, gK
        gQn, gKn = k.tau * gS @ self.Kn, k.tau * gST @ self.Qn
        gQ = gQn / self.nq - Q * np.sum(Q * gQn, axis=-1, keepdims=True) / self.nq ** 3
        gK = gKn / self.nk - K * np.sum(K * gKn, axis=-1, keepdims=True) / self.nk ** 3
        return gQ, gK

    # the map -------------------------------------------------------------------------------------
    @property
    def F(self) -> np.ndarray:
        """``f(X)`` (b, m, d_out), with the output bias (plus the input for a residual layer)."""
        if self._F is None:
            out = self._heads_out(self.P @ self.V)
            if self.k.b_O is not None:
                out = out + self.k.b_O
            self._F = out + self.k.from_work(self.X) if self.k.residual else out
        return self._F

    def _jvp_heads(self, dQ, dK, dV) -> np.ndarray:
        dS = self._score_jvp(dQ, dK)
        dS -= np.sum(self.P * dS, axis=-1, keepdims=True)
        dS *= self.P                                           # dP = P o (dS - rowsum(P o dS))
        out = dS @ self.V
        out += self.P @ dV
        return self._heads_out(out)

    def jvp(self, E: np.ndarray, EY: np.ndarray | None = None) -> np.ndarray:
        """``Df[E]``: ``E`` (b, n, d_in) moves the keys and values (and the queries in
        self-attention); ``EY`` (b, m, d_in) moves the queries of cross-attention."""
        _, dK, dV = self._split(self._to_proj(E))
        if self.cross:
            dQ = self._split(self._to_proj(EY, queries=True))[0] if EY is not None else np.zeros_like(self.Q)
        else:
            dQ = self._split(self._to_proj(E))[0]
        out = self._jvp_heads(dQ, dK, dV)
        return out + self.k.direction_from_work(E) if self.k.residual else out

    def vjp(self, G: np.ndarray):
        """``Df^T[G]`` for G (b, m, d_out): an array for self-attention, ``(gY, gX)`` for cross."""
        Gh = self._heads_in(G)
        gS = Gh @ self.VT
        gS -= np.sum(self.P * gS, axis=-1, keepdims=True)
        gS *= self.P                                           # P o (gP - rowsum(P o gP))
        gQ, gK = self._score_vjp(gS)
        gV = self.PT @ Gh
        if not self.cross:
            out = self._from_proj(self._merge(gQ, gK, gV))
            return out + (G if self.k.basis is None else G @ self.k.basis) if self.k.residual else out
        k = self.k
        gY = (gQ.transpose(0, 2, 1, 3).reshape(self.b, self.m, -1) @ k.Wq[:, :k.H * k.d_k].T).reshape(
            self.b, self.m, k.d_query)
        gX = self._from_proj(self._merge(None, gK, gV))
        return gY, gX

    def curvature(self, E: np.ndarray, G: np.ndarray) -> np.ndarray:
        """``grad_X <G, Df(X)[E]>`` with E, G held fixed (self-attention), shape (b, n, d_in).

        Dot-product scores, reverse mode through the JVP (``S = c Q K^T``, ``P = softmax(S)``)::

            dS  = c (dQ K^T + Q dK^T),  m = rowsum(P o dS),  dP = P o (dS - m),  dF = dP V + P dV
            gdP = G V^T,  a = rowsum(P o gdP),  gdS = P o (gdP - a)
            gP  = G dV^T + gdP o (dS - m) - a o dS,  gS = P o (gP - rowsum(P o gP))
            gQ  = c (gdS dK + gS K),  gK = c (gdS^T dQ + gS^T Q),  gV = dP^T G
            grad = [gQ | gK | gV] W^T

        Other scores: the central difference ``(Df(X + hE)^T G - Df(X - hE)^T G) / 2h`` (symmetry of
        the Hessian of ``<G, f>``).  With ``G = Df[E] / ||Df[E]||`` and E the top right singular vector
        this is the gradient of the local Jacobian norm (envelope theorem).
        """
        if self.cross:
            raise WeightsError("curvature", "self-attention", "cross-attention", "use jvp and vjp")
        if self.k.score != "dot":
            scale = np.sqrt(np.sum(self.X ** 2, axis=(1, 2), keepdims=True)) + 1.0
            h = 1e-5 * scale
            plus, minus = self.k.linearize(self.X + h * E).vjp(G), self.k.linearize(self.X - h * E).vjp(G)
            return (plus - minus) / (2 * h)
        dQ, dK, dV = self._split(self._to_proj(E))
        Gh = self._heads_in(G)
        c, P = self.k.scale, self.P
        KT, dKT = np.swapaxes(self.K, -1, -2), np.swapaxes(dK, -1, -2)
        dS = c * (dQ @ KT + self.Q @ dKT)
        m = np.sum(P * dS, axis=-1, keepdims=True)
        dP = P * (dS - m)
        gdP = Gh @ np.swapaxes(self.V, -1, -2)
        a = np.sum(P * gdP, axis=-1, keepdims=True)
        gdS = P * (gdP - a)
        gP = Gh @ np.swapaxes(dV, -1, -2) + gdP * (dS - m) - a * dS
        gS = P * (gP - np.sum(P * gP, axis=-1, keepdims=True))
        gQ = c * (gdS @ dK + gS @ self.K)
        gK = c * (np.swapaxes(gdS, -1, -2) @ dQ + np.swapaxes(gS, -1, -2) @ self.Q)
        gV = np.swapaxes(dP, -1, -2) @ Gh
        return self._from_proj(self._merge(gQ, gK, gV))

    # power iteration -------------------------------------------------------------------------------
    def top_singular(self, start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``steps`` rounds of power iteration from ``start`` (b, n, d_in), self-attention.

        Returns ``(sigma, E, JE)``: unit directions E, ``JE = Df[E]`` and ``sigma = ||JE||_F``, so each
        sigma is a lower bound on the local Jacobian norm whatever the convergence.  A single
        dot-product head with at most :data:`GRAM_TOKENS` tokens iterates ``Df Df^T`` in output space
        (:meth:`gram_step`, O(n^3) a step), other maps ``Df^T Df`` in token space (O(n^2 d)).
        """
        E = unit_rows(start)
        if self.k.gram is not None and steps > 0 and self.n <= GRAM_TOKENS:
            G = self.jvp(E)
            for _ in range(steps):
                G = self.gram_step(G)
                G *= (1.0 / np.maximum(np.sqrt(np.einsum("bij,bij->b", G, G)), 1e-300))[:, None, None]
            E = unit_rows(self.vjp(G))
        else:
            for _ in range(steps):
                E = unit_rows(self.vjp(self.jvp(E)))
        JE = self.jvp(E)
        return np.sqrt(np.einsum("bij,bij->b", JE, JE)), E, JE

    def gram_step(self, G: np.ndarray) -> np.ndarray:
        """``Df Df^T G`` for a single dot-product head, G of shape (b, n, d_v), in O(n^2 (n + d_v)).

        ``Df^T G = [c gS K | c gS^T Q | P^T G] W^T`` with ``gS = P o (G V^T - rowsum(P o G V^T))``;
        applying ``Df`` needs only ``Z = (Df^T G) W``, i.e. the Gram blocks ``Gamma_XY = W_X^T W_Y``.
        Sandwiched with the projections they give, once per X, ``M_1 = K Gamma_QQ K^T``,
        ``M_2 = Q Gamma_KQ K^T``, ``M_3 = Q Gamma_KK Q^T``, ``N_2 = Q Gamma_KV``, ``N_3 = K Gamma_QV``, and
        with ``L = [gS | gS^T | P^T G]`` (n x (2n + d_v)):

            dS = c (L [c M_1; c M_2; N_3^T] + [c M_2 | c M_3 | N_2] L'),   L' = [gS^T; gS; G^T P]
            dV = L [c N_3; c N_2; Gamma_VV]
            Df Df^T G = P o (dS - rowsum(P o dS)) V + P dV.
        """
        if not hasattr(self, "_sandwich"):
            g, c = self.k.gram, self.k.scale
            Q, K = self.Q[:, 0], self.K[:, 0]
            KT, QT = np.swapaxes(K, -1, -2), np.swapaxes(Q, -1, -2)
            M1, M2, M3 = K @ g["QQ"] @ KT, Q @ g["KQ"] @ KT, Q @ g["KK"] @ QT
            N2, N3 = Q @ g["KV"], K @ g["QV"]
            right = np.concatenate([np.concatenate([c * M1, c * N3], axis=2),
                                    np.concatenate([c * M2, c * N2], axis=2)], axis=1)
            left = np.concatenate([c * M2, c * M3, N2], axis=2)
            self._sandwich = (np.ascontiguousarray(right), np.ascontiguousarray(left),
                              np.ascontiguousarray(np.swapaxes(N3, -1, -2)), self.P[:, 0], self.PT[:, 0],
                              self.V[:, 0], self.VT[:, 0])
        right, left, N3T, P, PT, V, VT = self._sandwich
        c = self.k.scale
        b, n, dv = G.shape
        gS = G @ VT
        gS -= np.sum(P * gS, axis=-1, keepdims=True)
        gS *= P
        gST = np.swapaxes(gS, -1, -2)
        Gv = PT @ G
        both = np.concatenate([gS, gST], axis=2) @ right                 # [dS part | dV part]
        dS = both[..., :n]
        dS += Gv @ N3T
        dS += left @ np.concatenate([gST, gS, np.swapaxes(Gv, -1, -2)], axis=1)
        dS *= c
        dS -= np.sum(P * dS, axis=-1, keepdims=True)
        dS *= P
        dV = both[..., n:]
        dV += (Gv.reshape(b * n, dv) @ self.k.gram["VV"]).reshape(b, n, dv)
        out = dS @ V
        out += P @ dV
        return out


# The same map on plain arrays ----------------------------------------------------------------------
def head_scores(head: Head, Y, X) -> np.ndarray:
    """The scores ``s(y_i, x_j)`` of one head, shape (b, m, n), before the mask and the softmax."""
    return AttentionMap(head).linearize(_tokens("X", X, head.d), _tokens("Y", Y, head.d)).S[:, 0]


def cross_forward(head: Head, Y, X) -> np.ndarray:
    """Cross-attention: queries ``Y`` (b, m, d) attend to ``X`` (b, n, d); returns (b, m, d_v)."""
    engine = AttentionMap(head)
    return engine.linearize(_tokens("X", X, head.d), _tokens("Y", Y, head.d)).F


def cross_jvp(head: Head, Y, X, dY, dX):
    """``(f, Df[dY, dX])`` for cross-attention (``dY = 0`` or ``dX = 0`` for one argument)."""
    Y, X = _tokens("Y", Y, head.d), _tokens("X", X, head.d)
    lin = AttentionMap(head).linearize(X, Y)
    return lin.F, lin.jvp(np.broadcast_to(dX, X.shape), np.broadcast_to(dY, Y.shape))


def cross_vjp(head: Head, Y, X, G):
    """``Df^T G`` split into ``(gY, gX)`` for a cotangent ``G`` of shape (b, m, d_v)."""
    return AttentionMap(head).linearize(_tokens("X", X, head.d), _tokens("Y", Y, head.d)).vjp(G)


def self_forward(target: Head | Layer, X) -> np.ndarray:
    """Self-attention ``f(X)`` of a head (b, n, d_v) or a layer (b, n, d_out)."""
    return AttentionMap(target).linearize(_tokens("X", X, _width(target))).F


def self_jvp(target: Head | Layer, X, E):
    """``(f(X), Df(X)[E])`` for self-attention of a head or a layer."""
    X = _tokens("X", X, _width(target))
    lin = AttentionMap(target).linearize(X)
    return lin.F, lin.jvp(np.broadcast_to(E, X.shape))


def self_vjp(target: Head | Layer, X, G):
    """``Df(X)^T [G]`` for self-attention of a head or a layer, shape (b, n, d)."""
    return AttentionMap(target).linearize(_tokens("X", X, _width(target))).vjp(G)


def _width(target) -> int:
    return heads_of(target)[0][0].d


#: A multi-head layer is evaluated by the same engine as a head.
layer_forward, layer_jvp, layer_vjp = self_forward, self_jvp, self_vjp


def jacobian_norm(jvp, vjp, X: np.ndarray, iterations: int = 50, seed: int = 0, start: np.ndarray | None = None):
    """Largest singular value of the Jacobian of a map at each of a batch of inputs, by power
    iteration on ``J^T J`` (JVP then VJP); no Jacobian is formed.

    ``jvp(X, E) -> (F, dF)`` and ``vjp(X, G) -> gX``.  Returns ``(sigma, E)``: the estimates (b,)
    and unit directions (b, n, d); ``sigma_b = ||J E_b||`` exactly for the returned ``E_b``, hence a
    valid lower bound on the local Jacobian norm.
    """
    X = np.asarray(X, dtype=float)
    rng = np.random.default_rng(seed)
    E = unit_rows(rng.standard_normal(X.shape) if start is None else np.array(start, dtype=float))
    for _ in range(iterations):
        _, dF = jvp(X, E)
        E = unit_rows(vjp(X, dF))
    _, dF = jvp(X, E)
    return np.sqrt(np.sum(dF * dF, axis=tuple(range(1, dF.ndim)))), E


def dense_jacobian(jvp, X: np.ndarray) -> np.ndarray:
    """The full Jacobian of one input ``X`` (n, d) as a matrix (outputs x inputs), from a function
    ``jvp(X, E) -> (F, dF)`` applied to the basis.  For tests and small sizes only."""
    X = np.asarray(X, dtype=float)
    size = X.size
    basis = np.eye(size).reshape((size,) + X.shape)
    _, dF = jvp(np.broadcast_to(X, basis.shape), basis)
    return dF.reshape(size, -1).T
