"""Attention in numpy, batched: the forward pass, JVP, VJP and second-order term, for every kernel.

Tokens are rows.  Queries ``Y`` (b, m, d) attend to keys and values ``X`` (b, n, d); for
self-attention ``Y = X``.  A head maps ``f_i = sum_j p_ij (x_j V + b_V)`` with

    p_i. = weights(mask(s(q_i, k_j; p_i, p_j))),    q = y W_Q + b_Q,  k = x W_K + b_K,

``s`` the head's attention kernel (:mod:`lipbound.numeric.kernels`: dot product, L2 distance,
scaled cosine, RoPE, QK-norm, sigmoid, linear, user-defined), the mask its causal mask, window,
position bias and soft-cap, the weights a softmax (or the kernel's own), ``p_i`` and ``p_j`` the
positions of queries and keys (0..m-1 and 0..n-1 unless given); ``V = W_V``, or
``W_Q W_Q^T W_V / sqrt(d_k)`` with Kim et al.'s values (:attr:`Head.V`).  A layer maps
``F = [f^1, ..., f^H] W_O + b_O`` (plus X when residual).

:class:`AttentionMap` prepares a head or a layer once: all projections go through one fused
matrix product ``[Q | K | V] = X W + b`` -- the queries of every head, the keys and values of
every key/value group once (grouped-query attention: the heads of a group share them) --
optionally in *working coordinates* ``x' = (x - c) U`` (``U`` an orthonormal basis of the span of
the projections; moving a token orthogonally to it changes nothing, so a search there loses
nothing).  The per-head split is :meth:`AttentionMap.split`: queries (b, G, r, m, d_k), keys and
values (b, G, 1, n, .) for G groups of r heads, so that one matrix product broadcasts a group's
keys over its heads.  :meth:`AttentionMap.linearize` returns a :class:`Linearization` at a batch
of inputs, whose ``jvp``, ``vjp`` and ``curvature`` (``grad_X <G, Df(X)[E]>``) reuse the
projections, scores and weights.  The functions ``self_forward``, ``cross_jvp``, ``layer_vjp``,
... are the same map called on plain arrays.

The deliberately independent implementation, in exact and interval arithmetic, is in
:mod:`lipbound.numeric.recheck`.
"""

from __future__ import annotations

from typing import final

import numpy as np

from ..errors import WeightsError
from .kernels import SOFTMAX, HeadMasks, reduce_to
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
    size = np.sqrt((E * E).sum(axis=tuple(range(1, E.ndim)), keepdims=True))
    return E / np.where(size > 0, size, 1.0)


def _tokens(name: str, T, d: int) -> np.ndarray:
    T = np.asarray(T, dtype=float)
    if T.ndim == 2:
        T = T[None]
    if T.ndim != 3 or T.shape[-1] != d:
        raise WeightsError(name, f"tokens of shape (batch, n, {d}) or (n, {d})", f"shape {T.shape}",
                           "tokens are rows; the last axis is the model width")
    return T


def _positions(name: str, positions, count: int) -> np.ndarray:
    if positions is None:
        return np.arange(count)
    positions = np.asarray(positions)
    if positions.shape != (count,) or not np.issubdtype(positions.dtype, np.integer):
        raise WeightsError(name, f"{count} integer positions, one per token", f"{positions.dtype} of shape "
                           f"{positions.shape}", "positions count from 0 (token i of a sequence sits at i)")
    return positions


@final
class AttentionMap:
    """A head or a multi-head layer prepared for batched evaluation.

    Parameters
    ----------
    target : Head or Layer
        Every head of a layer must share its kernel and shapes (the projections are fused); each
        head keeps its own mask.
    center : ndarray of shape (d,), optional
        Origin of the working coordinates (default 0).
    reduce : bool
        Work in an orthonormal basis of the span of the projections (ignored for residual layers,
        whose identity sees every direction).
    tangent, query_center, query_tangent : optional
        The tokens move in ``center + span(tangent)``; the queries of cross-attention in their
        own frame.
    dtype : numpy float type
        float64 (default), or float32 for screening.
    """

    def __init__(self, target: Head | Layer, center: np.ndarray | None = None, reduce: bool = False,
                 tangent: np.ndarray | None = None, query_center: np.ndarray | None = None,
                 query_tangent: np.ndarray | None = None, dtype=np.float64):
        heads, W_O, b_O, residual = heads_of(target)
        first = heads[0]
        if any((h.d, h.d_k, h.d_v) != (first.d, first.d_k, first.d_v) or h.kernel != first.kernel for h in heads):
            raise WeightsError("target.heads", "heads of one kernel and shape (they are evaluated together)",
                               "a layer of mixed heads", "evaluate its heads one at a time")
        self.target, self.heads, self.dtype = target, heads, np.dtype(dtype)
        self.H, self.d, self.d_k, self.d_v = len(heads), first.d, first.d_k, first.d_v
        self.G = target.num_groups if isinstance(target, Layer) else 1
        self.r = self.H // self.G
        self.kernel, self.masks = first.kernel, HeadMasks(tuple(h.mask for h in heads))
        self.weights = self.kernel.weights()
        self.causal = self.masks.causal
        self.residual = residual
        self.W_O = None if W_O is None else W_O.astype(self.dtype, copy=False)
        self.b_O = None if b_O is None else b_O.astype(self.dtype, copy=False)
        shared = [heads[g * self.r] for g in range(self.G)]        # the first head of each group
        W = np.concatenate([h.W_Q for h in heads] + [h.W_K for h in shared] + [h.V for h in shared], axis=1)
        bias = np.concatenate([h.b_Q for h in heads] + [h.b_K for h in shared] + [h.b_V for h in shared])
        self.center, self.basis = self._frame(W, center, tangent, reduce and not residual, slice(None))
        self.W = (W if self.basis is None else self.basis.T @ W).astype(self.dtype, copy=False)
        self.bias = (bias + self.center @ W).astype(self.dtype, copy=False)
        # queries of cross-attention may live in another set: their own frame, seeing only W_Q
        self.query_center, self.query_basis = self.center, self.basis
        if query_center is not None or query_tangent is not None:
            self.query_center, self.query_basis = self._frame(W, query_center, query_tangent, reduce and not residual,
                                                              slice(0, self.H * self.d_k))
        self.Wq = (W if self.query_basis is None else self.query_basis.T @ W).astype(self.dtype, copy=False)
        self.bias_q = (bias + self.query_center @ W).astype(self.dtype, copy=False)
        self.WT = np.ascontiguousarray(self.W.T)
        self.width = self.W.shape[1]
        self.columns = (slice(0, self.H * self.d_k), slice(self.H * self.d_k, (self.H + self.G) * self.d_k),
                        slice((self.H + self.G) * self.d_k, self.width))
        # scores c q.k under a softmax and a mask without soft-cap: analytic curvature, Gram sandwiches
        self.scale = self.kernel.bilinear_scale(self.d_k)
        self.bilinear = self.scale is not None and self.weights is SOFTMAX and \
            all(mask.softcap is None for mask in self.masks.masks)
        self.gram = None  # a single bilinear head: power iteration in output space (Gram blocks of W)
        if self.H == 1 and W_O is None and not residual and self.bilinear:
            W_Q, W_K, W_V = (self.W[:, c] for c in self.columns)
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

    def head_weights(self, h: int, queries: bool = False) -> tuple[np.ndarray, ...]:
        """``(W_Q, W_K, V, b_Q, b_K, b_V)`` of head ``h`` in working coordinates (``W_Q``, ``b_Q`` in
        the queries' frame when ``queries``)."""
        dk, dv, g = self.d_k, self.d_v, h // self.r
        q, k, v = self.columns
        cols = [slice(q.start + h * dk, q.start + (h + 1) * dk), slice(k.start + g * dk, k.start + (g + 1) * dk),
                slice(v.start + g * dv, v.start + (g + 1) * dv)]
        W_Q, b_Q = (self.Wq, self.bias_q) if queries else (self.W, self.bias)
        return (W_Q[:, cols[0]], self.W[:, cols[1]], self.W[:, cols[2]], b_Q[cols[0]], self.bias[cols[1]],
                self.bias[cols[2]])

    # the per-head layout, written once -------------------------------------------------------
    def project(self, Zw: np.ndarray, queries: bool = False, bias: bool = True) -> np.ndarray:
        """The fused projection ``Z W (+ b)`` (b, L, width) of tokens (or directions) in working coordinates."""
        W, b = (self.Wq, self.bias_q) if queries else (self.W, self.bias)
        out = Zw.reshape(-1, W.shape[0]) @ W
        if bias:
            out += b
        return out.reshape(Zw.shape[0], Zw.shape[1], self.width)

    def per_head(self, Z, part: str):
        """The fused projection ``Z`` (..., L, width) -- a float array or an interval array -- split
        per head: ``"queries"`` (..., H, L, d_k), ``"keys"`` (..., G, L, d_k) or ``"values"``
        (..., G, L, d_v), G the key/value groups (H without grouped-query attention)."""
        index = ("queries", "keys", "values").index(part)
        count, width = ((self.H, self.d_k), (self.G, self.d_k), (self.G, self.d_v))[index]
        block = Z[..., self.columns[index]]
        return block.reshape(block.shape[:-1] + (count, width)).swapaxes(-2, -3)

    def split(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fused projection (b, L, width) -> queries (b, G, r, L, d_k), keys (b, G, 1, L, d_k) and
        values (b, G, 1, L, d_v): a group's keys and values broadcast over its r heads."""
        b, L = Z.shape[0], Z.shape[1]
        Q = self.per_head(Z, "queries").reshape(b, self.G, self.r, L, self.d_k)
        return Q, self.per_head(Z, "keys")[:, :, None], self.per_head(Z, "values")[:, :, None]

    def merge(self, gQ: np.ndarray | None, gK: np.ndarray, gV: np.ndarray) -> np.ndarray:
        """Cotangents of :meth:`split`'s parts -> the fused projection space (b, L, width); ``gQ`` None
        for the context of cross-attention, whose tokens are not queries."""
        b, L = gK.shape[0], gK.shape[3]
        first = np.zeros((b, L, self.H * self.d_k), dtype=gK.dtype) if gQ is None else \
            gQ.transpose(0, 3, 1, 2, 4).reshape(b, L, -1)
        return np.concatenate([first, gK.transpose(0, 3, 1, 2, 4).reshape(b, L, -1),
                               gV.transpose(0, 3, 1, 2, 4).reshape(b, L, -1)], axis=-1)

    def linearize(self, Xw: np.ndarray, Yw: np.ndarray | None = None, positions=None,
                  query_positions=None) -> Linearization:
        """The map and its derivatives at a batch of inputs in working coordinates: keys and values
        ``Xw`` (b, n, d_in); queries ``Yw`` (b, m, d_in) for cross-attention (None: self-attention);
        the positions of keys and queries (default 0..n-1 and 0..m-1; self-attention: the same)."""
        Xw = np.asarray(Xw, dtype=self.dtype)
        return Linearization(self, Xw, None if Yw is None else np.asarray(Yw, dtype=self.dtype), positions,
                             query_positions)

    def forward(self, Xw: np.ndarray, Yw: np.ndarray | None = None, positions=None, query_positions=None) -> np.ndarray:
        return self.linearize(Xw, Yw, positions, query_positions).F


def _swap(M: np.ndarray) -> np.ndarray:
    return M.swapaxes(-1, -2)


@final
class Linearization:
    """Projections, scores and attention weights at a batch of inputs, reused by JVPs, VJPs and
    the second-order term.  Shapes (G groups of r heads, H = G r): ``Q5`` (b, G, r, m, d_k),
    ``K5`` (b, G, 1, n, d_k), ``V5`` (b, G, 1, n, d_v), ``S`` and ``P`` (b, H, m, n) -- the raw
    scores of the kernel and the weights after mask and softmax."""

    def __init__(self, engine: AttentionMap, Xw: np.ndarray, Yw: np.ndarray | None, positions=None,
                 query_positions=None):
        self.k = engine
        self.X, self.Y = Xw, Yw
        self.cross = Yw is not None
        self.b, self.n = Xw.shape[0], Xw.shape[1]
        self.m = Yw.shape[1] if self.cross else self.n
        self.pos_k = _positions("positions", positions, self.n)
        self.pos_q = _positions("query_positions", query_positions, self.m) \
            if self.cross or query_positions is not None else self.pos_k
        proj = engine.project(Xw)
        Q, K, V = engine.split(proj)
        if self.cross:
            Q = engine.split(engine.project(Yw, queries=True))[0]
        self.Q5, self.K5, self.V5 = Q, K, V
        self.scores = engine.kernel.linearize(Q, K, self.pos_q, self.pos_k, engine.d)
        self.S = self.scores.S.reshape(self.b, engine.H, self.m, self.n)
        masked, self.slope = engine.masks.apply(self.S, self.pos_q, self.pos_k, self.cross)
        self.P = engine.weights.forward(masked)
        self.P5 = self.P.reshape(self.b, engine.G, engine.r, self.m, self.n)
        self._F = None

    # per-head views (b, H, ., .) -----------------------------------------------------------------
    def _heads(self, M5: np.ndarray) -> np.ndarray:
        k = self.k
        full = np.broadcast_to(M5, (M5.shape[0], k.G, k.r) + M5.shape[3:])
        return full.reshape((M5.shape[0], k.H) + M5.shape[3:])

    @property
    def Q(self) -> np.ndarray:
        return self._heads(self.Q5)

    @property
    def K(self) -> np.ndarray:
        return self._heads(self.K5)

    @property
    def V(self) -> np.ndarray:
        return self._heads(self.V5)

    # output layout ---------------------------------------------------------------------------------
    def _heads_out(self, F5: np.ndarray) -> np.ndarray:
        """(b, G, r, m, d_v) -> the map's output (b, m, d_out), without bias."""
        b, m = F5.shape[0], F5.shape[3]
        merged = F5.transpose(0, 3, 1, 2, 4).reshape(b * m, self.k.H * self.k.d_v)
        if self.k.W_O is not None:
            merged = merged @ self.k.W_O                       # one matrix product, not b small ones
        return merged.reshape(b, m, -1)

    def _heads_in(self, G: np.ndarray) -> np.ndarray:
        """Cotangent of the output (b, m, d_out) -> per head (b, G, r, m, d_v)."""
        b, m = G.shape[0], G.shape[1]
        if self.k.W_O is not None:
            G = G.reshape(b * m, -1) @ self.k.W_O.T
        return G.reshape(b, m, self.k.G, self.k.r, self.k.d_v).transpose(0, 2, 3, 1, 4)

    def _from_proj(self, Z: np.ndarray) -> np.ndarray:
        return (Z.reshape(-1, self.k.width) @ self.k.WT).reshape(Z.shape[0], Z.shape[1], self.k.d_in)

    def _masked(self, dS: np.ndarray) -> np.ndarray:
        """A tangent of the raw scores (b, G, r, m, n) -> of the masked scores (b, H, m, n)."""
        dS = dS.reshape(self.b, self.k.H, self.m, self.n)
        return dS * self.slope if self.slope is not None else dS

    # the map -------------------------------------------------------------------------------------
    @property
    def F(self) -> np.ndarray:
        """``f(X)`` (b, m, d_out), with the output bias (plus the input for a residual layer)."""
        if self._F is None:
            out = self._heads_out(self.P5 @ self.V5)
            if self.k.b_O is not None:
                out += self.k.b_O
            self._F = out + self.k.from_work(self.X) if self.k.residual else out
        return self._F

    def _jvp_heads(self, dQ, dK, dV) -> np.ndarray:
        dP = self.k.weights.derivative(self.P, self._masked(self.scores.jvp(dQ, dK)))
        out = dP.reshape(self.P5.shape) @ self.V5
        out += self.P5 @ dV
        return self._heads_out(out)

    def jvp(self, E: np.ndarray, EY: np.ndarray | None = None) -> np.ndarray:
        """``Df[E]``: ``E`` (b, n, d_in) moves the keys and values (and the queries in
        self-attention); ``EY`` (b, m, d_in) moves the queries of cross-attention."""
        dQ, dK, dV = self.k.split(self.k.project(E, bias=False))
        if self.cross:
            dQ = None if EY is None else self.k.split(self.k.project(EY, queries=True, bias=False))[0]
        out = self._jvp_heads(dQ, dK, dV)
        return out + self.k.direction_from_work(E) if self.k.residual else out

    def jvp_parts(self, E: np.ndarray) -> dict[str, np.ndarray]:
        """``Df[E]`` of self-attention split by the role in which a token moves: ``"query"`` (its query in its own
        row's scores), ``"key"`` (its key in the scores of the rows that see it) and ``"value"`` (its value: the mean
        part ``sum_j p_ij V^T e_j``), each (b, n, d_out) without the residual; their sum is :meth:`jvp` less the
        residual's ``E``.  The parts the certified bounds bound apart (the query, key and mean terms)."""
        if self.cross:
            raise ValueError("jvp_parts splits self-attention; cross-attention moves queries and context apart already")
        moved = self.k.split(self.k.project(E, bias=False))
        parts = {}
        for index, role in enumerate(("query", "key", "value")):
            parts[role] = self._jvp_heads(*(M if k == index else np.zeros_like(M) for k, M in enumerate(moved)))
        return parts

    def _score_cotangent(self, Gh: np.ndarray) -> np.ndarray:
        """``gS`` of the raw scores (b, G, r, m, n) for head cotangents Gh (b, G, r, m, d_v)."""
        gP = (Gh @ _swap(self.V5)).reshape(self.P.shape)
        gS = self.k.weights.derivative(self.P, gP)
        if self.slope is not None:
            gS *= self.slope
        return gS.reshape(self.P5.shape)

    def vjp(self, G: np.ndarray):
        """``Df^T[G]`` for G (b, m, d_out): an array for self-attention, ``(gY, gX)`` for cross."""
        Gh = self._heads_in(G)
        gQ, gK = self.scores.vjp(self._score_cotangent(Gh))
        gV = reduce_to(_swap(self.P5) @ Gh, self.V5.shape)
        k = self.k
        if not self.cross:
            out = self._from_proj(k.merge(gQ, gK, gV))
            return out + (G if k.basis is None else G @ k.basis) if k.residual else out
        gY = (gQ.transpose(0, 3, 1, 2, 4).reshape(self.b, self.m, -1) @ k.Wq[:, k.columns[0]].T).reshape(
            self.b, self.m, k.d_query)
        gX = self._from_proj(k.merge(None, gK, gV))
        return gY, gX

    def curvature(self, E: np.ndarray, G: np.ndarray) -> np.ndarray:
        """``grad_X <G, Df(X)[E]>`` with E, G held fixed (self-attention), shape (b, n, d_in).

        Scores ``S = c Q K^T`` under a softmax (:attr:`AttentionMap.bilinear`), reverse mode
        through the JVP (``P = softmax(mask(S))``, the mask adding constants and ``-inf``)::

            dS  = c (dQ K^T + Q dK^T),  m = rowsum(P o dS),  dP = P o (dS - m),  dF = dP V + P dV
            gdP = G V^T,  a = rowsum(P o gdP),  gdS = P o (gdP - a)
            gP  = G dV^T + gdP o (dS - m) - a o dS,  gS = P o (gP - rowsum(P o gP))
            gQ  = c (gdS dK + gS K),  gK = c (gdS^T dQ + gS^T Q),  gV = dP^T G
            grad = [gQ | gK | gV] W^T

        Other kernels: the central difference ``(Df(X + hE)^T G - Df(X - hE)^T G) / 2h`` (symmetry of
        the Hessian of ``<G, f>``).  With ``G = Df[E] / ||Df[E]||`` and E the top right singular vector
        this is the gradient of the local Jacobian norm (envelope theorem).
        """
        if self.cross:
            raise WeightsError("curvature", "self-attention", "cross-attention", "use jvp and vjp")
        k = self.k
        if not k.bilinear:
            scale = np.sqrt((self.X ** 2).sum(axis=(1, 2), keepdims=True)) + 1.0
            h = 1e-5 * scale
            plus = k.linearize(self.X + h * E, positions=self.pos_k).vjp(G)
            minus = k.linearize(self.X - h * E, positions=self.pos_k).vjp(G)
            return (plus - minus) / (2 * h)
        dQ, dK, dV = k.split(k.project(E, bias=False))
        Gh = self._heads_in(G)
        c, P = k.scale, self.P5
        Q, K, V = self.Q5, self.K5, self.V5
        dS = c * (dQ @ _swap(K) + Q @ _swap(dK))
        m = (P * dS).sum(axis=-1, keepdims=True)
        dP = P * (dS - m)
        gdP = Gh @ _swap(V)
        a = (P * gdP).sum(axis=-1, keepdims=True)
        gdS = P * (gdP - a)
        gP = Gh @ _swap(dV) + gdP * (dS - m) - a * dS
        gS = P * (gP - (P * gP).sum(axis=-1, keepdims=True))
        gQ = c * (gdS @ dK + gS @ K)
        gK = reduce_to(c * (_swap(gdS) @ dQ + _swap(gS) @ Q), K.shape)
        gV = reduce_to(_swap(dP) @ Gh, V.shape)
        return self._from_proj(k.merge(gQ, gK, gV))

    # power iteration -------------------------------------------------------------------------------
    def top_singular(self, start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``steps`` rounds of power iteration from ``start`` (b, n, d_in), self-attention.

        Returns ``(sigma, E, JE)``: unit directions E, ``JE = Df[E]`` and ``sigma = ||JE||_F``, so each
        sigma is a lower bound on the local Jacobian norm whatever the convergence.  A single
        bilinear head with at most :data:`GRAM_TOKENS` tokens iterates ``Df Df^T`` in output space
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
        """``Df Df^T G`` for a single bilinear head, G of shape (b, n, d_v), in O(n^2 (n + d_v)).

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
            Q, K, V = self.Q5[:, 0, 0], self.K5[:, 0, 0], self.V5[:, 0, 0]
            KT, QT = _swap(K), _swap(Q)
            M1, M2, M3 = K @ g["QQ"] @ KT, Q @ g["KQ"] @ KT, Q @ g["KK"] @ QT
            N2, N3 = Q @ g["KV"], K @ g["QV"]
            right = np.concatenate([np.concatenate([c * M1, c * N3], axis=2),
                                    np.concatenate([c * M2, c * N2], axis=2)], axis=1)
            left = np.concatenate([c * M2, c * M3, N2], axis=2)
            P = self.P[:, 0]
            self._sandwich = (np.ascontiguousarray(right), np.ascontiguousarray(left),
                              np.ascontiguousarray(_swap(N3)), P, np.ascontiguousarray(_swap(P)),
                              V, np.ascontiguousarray(_swap(V)))
        right, left, N3T, P, PT, V, VT = self._sandwich
        c = self.k.scale
        b, n, dv = G.shape
        gS = G @ VT
        gS -= (P * gS).sum(axis=-1, keepdims=True)
        gS *= P
        gST = _swap(gS)
        Gv = PT @ G
        both = np.concatenate([gS, gST], axis=2) @ right                 # [dS part | dV part]
        dS = both[..., :n]
        dS += Gv @ N3T
        dS += left @ np.concatenate([gST, gS, _swap(Gv)], axis=1)
        dS *= c
        dS -= (P * dS).sum(axis=-1, keepdims=True)
        dS *= P
        dV = both[..., n:]
        dV += (Gv.reshape(b * n, dv) @ self.k.gram["VV"]).reshape(b, n, dv)
        out = dS @ V
        out += P @ dV
        return out


# The same map on plain arrays ----------------------------------------------------------------------
def head_scores(head: Head, Y, X) -> np.ndarray:
    """The scores ``s(y_i, x_j)`` of one head, shape (b, m, n), before the mask and the weights."""
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
    return np.sqrt((dF * dF).sum(axis=tuple(range(1, dF.ndim)))), E


def dense_jacobian(jvp, X: np.ndarray) -> np.ndarray:
    """The full Jacobian of one input ``X`` (n, d) as a matrix (outputs x inputs), from a function
    ``jvp(X, E) -> (F, dF)`` applied to the basis.  For tests and small sizes only."""
    X = np.asarray(X, dtype=float)
    size = X.size
    basis = np.eye(size).reshape((size,) + X.shape)
    _, dF = jvp(np.broadcast_to(X, basis.shape), basis)
    return dF.reshape(size, -1).T
