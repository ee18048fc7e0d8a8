"""The components of a transformer layer evaluated rigorously at a point: values and Jacobian blocks.

Each class takes its input as an :class:`~lipbound.rigorous.arrays.IntervalArray` (a float array
taken exactly, or an enclosure of an exact point) and holds interval enclosures of everything the
local theorems read: projections, scores, attention weights, head outputs, LayerNorm scales, FFN
pre-activations and slopes, and the output.  Jacobian blocks are in row convention:
``d out_i = sum_j e_j B_ij`` for token perturbations ``e_j`` (rows), so ``B_ij`` is (d_in, d_out)
and ``||B_ij||_2 = ||d out_i / d x_j||_2``.

* :class:`EnclosedAttention` -- a head, or a multi-head layer with its residual:
  ``B_ij = [i = j] I + sum_h (p_ij V + c p_ij w_i u_ij + [i = j] c W_Q C_i) W_O^h`` with
  ``u_ij = v_j - f_i``, ``w_i = W_K q_i^T``, ``C_i = sum_l p_il k_l^T u_il`` (the derivative of
  softmax attention, lemma ``softmax-derivative``);
* :class:`EnclosedLayerNorm` -- ``B_ii = (P - g g^T) diag(gamma) sqrt(d) / n(u)`` (lemma
  ``layernorm-jacobian``);
* :class:`EnclosedFeedForward` -- ``x + GELU(x W_1 + b_1) W_2 + b_2``, ``B_ii = I + W_1 diag(GELU'(h_i)) W_2``.
"""

from __future__ import annotations

import numpy as np

from ..errors import WeightsError
from ..numeric.attention import AttentionMap
from ..numeric.dispatch import dot_product_scope
from ..numeric.model import FeedForward, Head, Layer, LayerNorm
from ..rigorous.arrays import IntervalArray, as_interval_array, gelu, gelu_curvature, gelu_slope
from ..rigorous.intervals import IV
from ..rigorous.linalg import Enclosure, lambda_max_upper, spectral_norm_upper_large

__all__ = ["EnclosedAttention", "EnclosedLayerNorm", "EnclosedFeedForward", "inverse_sqrt", "head_products", "softmax",
           "trilinear_norm", "feedforward_grams"]


def inverse_sqrt(k: int) -> IntervalArray:
    """``1 / sqrt(k)`` enclosed."""
    return IntervalArray.constant(1 / IV.sqrt(k))


def head_products(engine: AttentionMap) -> IntervalArray:
    """``V^h W_O^h`` for every head (H, d, d_out), enclosed (``V^h`` alone for a head without W_O)."""
    if engine.W_O is None:
        return IntervalArray(np.stack([engine.head_weights(h)[2] for h in range(engine.H)]))
    blocks = []
    for h in range(engine.H):
        value = engine.head_weights(h)[2]
        rows = engine.target.output_block(h)
        blocks.append(IntervalArray.from_enclosure(Enclosure.exact(value) @ Enclosure.exact(rows)))
    return IntervalArray.stack(blocks)


class EnclosedAttention:
    """A head or an attention layer at one input, in interval arithmetic.

    Parameters
    ----------
    target : Head or Layer
        Dot-product, non-causal (the local theorems are stated for these; others are refused).
    X : IntervalArray or ndarray, shape (n, d)
    masses : ndarray, shape (n,), optional
        Key masses (``p_ij`` proportional to ``m_j e^{s_ij}``).

    Attributes
    ----------
    Q, K : IntervalArray (H, n, d_k)
    V, F : IntervalArray (H, n, d_v)
        Values (bias included) and head outputs ``f_i = sum_j p_ij v_j``.
    S, P : IntervalArray (H, n, n)
        Scores ``c q_i . k_j`` and attention weights.
    output : IntervalArray (n, d_out)
        ``[f^1..f^H] W_O + b_O`` (+ X for a residual layer); the head output for a head.
    """

    def __init__(self, target: Head | Layer, X, masses=None):
        engine = AttentionMap(target)
        if not dot_product_scope(target) or engine.causal:
            raise WeightsError("target", "a non-causal dot-product head or layer (the local theorems' scope)",
                               f"{engine.kernel.describe()}{', causal' if engine.causal else ''}",
                               "local certificates cover BERT-style attention; use lipbound verify for others")
        self.engine = engine
        X = as_interval_array(X)
        if X.ndim != 2 or X.shape[1] != engine.d:
            raise WeightsError("X", f"tokens of shape (n, {engine.d})", f"shape {X.shape}", "tokens are rows")
        self.X, self.n = X, X.shape[0]
        self.masses = np.ones(self.n) if masses is None else np.asarray(masses, dtype=np.float64)
        H, dk, dv = engine.H, engine.d_k, engine.d_v
        projected = X.matmul(engine.W) + IntervalArray(engine.bias)
        self.Q, self.K, self.V = (engine.per_head(projected, part) for part in ("queries", "keys", "values"))
        self.c = inverse_sqrt(dk)
        self.S = self.Q.einsum("hik,hjk->hij", self.K) * self.c
        self.P = softmax(self.S, self.masses)
        self.F = self.P.einsum("hij,hjv->hiv", self.V)
        merged = self.F.swapaxes(0, 1).reshape(self.n, H * dv)
        if engine.W_O is None:
            self.output = merged
        else:
            self.output = merged.matmul(engine.W_O) + IntervalArray(engine.b_O)
            if engine.residual:
                self.output = self.output + X
        self._products = None

    @property
    def d_out(self) -> int:
        return self.engine.d_out

    def _parts(self):
        """``V^h W_O^h`` (H, d, d_out), ``w_i = q_i W_K^T`` (H, n, d), ``u_ij W_O^h`` (H, n, n, d_out) and the
        diagonal term ``sum_h W_Q^h C^h_i W_O^h`` (n, d, d_out)."""
        if self._products is None:
            e = self.engine
            U = self.V.expand(1) - self.F.expand(2)                      # u_ij = v_j - f_i, (H, n, n, d_v)
            ws, os, cs = [], [], []
            for h in range(e.H):
                W_K = e.head_weights(h)[1]
                rows = np.eye(e.d_v) if e.W_O is None else e.target.output_block(h)
                ws.append(self.Q[h].matmul(W_K.T))                         # (n, d)
                os.append(U[h].matmul(rows))                               # (n, n, d_out)
                C_h = (self.P[h].expand(-1).expand(-1) * (self.K[h].expand(0).expand(-1) * U[h].expand(2))).sum(axis=1)
                cs.append(C_h.matmul(rows))                                # (n, d_k, d_out): sum_l p_il k_l^T u_il W_O^h
            W_Q_all = np.concatenate([e.head_weights(h)[0] for h in range(e.H)], axis=1)      # (d, H d_k)
            C_all = IntervalArray(np.concatenate([c.lo for c in cs], axis=1), np.concatenate([c.hi for c in cs], axis=1))
            self._products = (head_products(e), IntervalArray.stack(ws), IntervalArray.stack(os), C_all.lmatmul(W_Q_all))
        return self._products

    def jacobian_column(self, j: int, outputs=None) -> IntervalArray:
        """The blocks ``B_ij`` for every output token i (or those listed in ``outputs``), shape
        (n or len(outputs), d, d_out)."""
        values, w, o, G = self._parts()
        rows = np.arange(self.n) if outputs is None else np.asarray(outputs, dtype=np.int64)
        Pj = self.P[:, rows, j]                                              # (H, m)
        first = Pj.einsum("hi,hab->iab", values)
        second = (Pj * self.c).expand(-1).__mul__(w[:, rows]).einsum("hia,hib->iab", o[:, rows, j, :])
        column = first + second
        own = np.flatnonzero(rows == j)
        if own.size == 0:
            return column
        diagonal = G[j] * self.c                                             # (d, d_out)
        lo, hi = column.lo.copy(), column.hi.copy()
        block = IntervalArray(lo[own[0]], hi[own[0]]) + diagonal
        if self.engine.residual:
            block = block + IntervalArray(np.eye(self.engine.d))
        lo[own[0]], hi[own[0]] = block.lo, block.hi
        return IntervalArray(lo, hi)

    def jacobian(self) -> IntervalArray:
        """The dense Jacobian in row convention, shape (n d, n d_out): rows index ``(j, a)`` inputs."""
        n, d = self.n, self.engine.d
        lo, hi = np.empty((n * d, n * self.d_out)), np.empty((n * d, n * self.d_out))
        for j in range(n):  # filled in place: no stacked copy of the whole matrix
            column = self.jacobian_column(j)
            lo[j * d:(j + 1) * d] = column.lo.transpose(1, 0, 2).reshape(d, -1)
            hi[j * d:(j + 1) * d] = column.hi.transpose(1, 0, 2).reshape(d, -1)
        return IntervalArray(lo, hi)


def softmax(S: IntervalArray, masses: np.ndarray) -> IntervalArray:
    """Rows of ``m_j e^{s_ij} / sum_l m_l e^{s_il}`` over the last axis, enclosed (shift by the row
    maximum first; the shift cancels exactly)."""
    shift = np.max(S.hi, axis=-1, keepdims=True)
    weights = (S - IntervalArray(shift)).exp() * IntervalArray(masses)
    P = weights / weights.sum(axis=-1, keepdims=True)
    return IntervalArray(np.maximum(P.lo, 0.0), np.minimum(P.hi, 1.0))


class EnclosedLayerNorm:
    """``LN(z) = gamma * sqrt(d) u / n(u) + beta``, ``u = P z``, ``n(u) = sqrt(||u||^2 + d eps)``, per token.

    Attributes
    ----------
    nu : IntervalArray (n,)
        ``||P z||``.
    scale : IntervalArray (n,)
        ``n(u)``.
    g : IntervalArray (n, d)
        ``u / n(u)``.
    output : IntervalArray (n, d)
    """

    def __init__(self, norm: LayerNorm, Z):
        Z = as_interval_array(Z)
        self.norm, self.Z = norm, Z
        d = norm.d
        mean = Z.sum(axis=-1, keepdims=True) * IntervalArray.constant(IV.mpf(1) / d)
        u = Z - mean
        squares = u.square().sum(axis=-1)
        self.nu = squares.sqrt()
        self.delta = IntervalArray.constant(IV.mpf(d) * IV.mpf(norm.eps))
        self.scale = (squares + self.delta).sqrt()
        self.g = u / self.scale.expand(-1)
        self.root_d = IntervalArray.constant(IV.sqrt(d))
        self.output = self.g * (IntervalArray(norm.gamma) * self.root_d) + IntervalArray(norm.beta)

    def jacobian_block(self, i: int) -> IntervalArray:
        """``B_ii`` (d, d)."""
        d = self.norm.d
        g = self.g[i]
        centring = IntervalArray(np.eye(d)) - IntervalArray.constant(IV.mpf(1) / d)
        inner = centring - g.expand(-1) * g.expand(0)
        return inner * (IntervalArray(self.norm.gamma) * self.root_d / self.scale[i]).expand(0)


class EnclosedFeedForward:
    """``y + GELU(y W_1 + b_1) W_2 + b_2`` per token (the residual feed-forward block).

    Attributes
    ----------
    h : IntervalArray (n, d_ff)
        Pre-activations.
    slope : IntervalArray (n, d_ff)
        ``GELU'(h)``.
    output : IntervalArray (n, d)
    """

    def __init__(self, ffn: FeedForward, Y):
        if ffn.act != "gelu":
            raise WeightsError("hidden_act", "'gelu' (the exact GELU, enclosed rigorously)", repr(ffn.act),
                               "local certificates cover BERT's exact GELU")
        Y = as_interval_array(Y)
        self.ffn, self.Y = ffn, Y
        self.h = Y.matmul(ffn.W_1) + IntervalArray(ffn.b_1)
        self.slope = gelu_slope(self.h)
        self.output = Y + gelu(self.h).matmul(ffn.W_2) + IntervalArray(ffn.b_2)

    def jacobian_norms(self, tokens=None) -> np.ndarray:
        """Certified ``||B_ii||`` for the given tokens (all by default; 0 for the others), each computed once."""
        cache = self.__dict__.setdefault("_norms", {})
        n = self.h.shape[0]
        out = np.zeros(n)
        for i in (range(n) if tokens is None else tokens):
            if i not in cache:
                cache[i] = spectral_norm_upper_large(self.jacobian_block(i).to_enclosure())
            out[i] = cache[i]
        return out

    def curvature_norms(self, tokens=None) -> np.ndarray:
        """Certified ``Lambda_i^(1/2)``: the norm of the second derivative of the block at token i, the
        trilinear form ``(u, e, v) -> sum_k g_k (u.w_k) (e.w_k) (r_k.v)`` on unit vectors (``g = GELU''(h_i)``,
        ``w_k`` the columns of W_1, ``r_k`` the rows of W_2), by :func:`trilinear_norm` (theorem
        local-feedforward-curvature).  Tokens: all by default (0 for the others), each computed once."""
        cache = self.__dict__.setdefault("_curvature", {})
        n = self.h.shape[0]
        out = np.zeros(n)
        tokens = range(n) if tokens is None else tokens
        if any(i not in cache for i in tokens):
            first, second = feedforward_grams(self.ffn)
            W_1, W_2, g = IntervalArray(self.ffn.W_1), IntervalArray(self.ffn.W_2), self.curvature
            for i in (i for i in tokens if i not in cache):
                cache[i] = trilinear_norm(g[i], W_1, W_2, first, first, second)
        for i in tokens:
            out[i] = cache[i]
        return out

    @property
    def curvature(self) -> IntervalArray:
        """``GELU''(h)`` (n, d_ff), enclosed."""
        if "_second" not in self.__dict__:
            self._second = gelu_curvature(self.h)
        return self._second

    def jacobian_block(self, i: int) -> IntervalArray:
        """``B_ii = I + W_1 diag(GELU'(h_i)) W_2`` (d, d)."""
        scaled = IntervalArray(self.ffn.W_1) * self.slope[i].expand(0)
        return scaled.einsum("ak,kb->ab", IntervalArray(self.ffn.W_2)) + IntervalArray(np.eye(self.ffn.W_1.shape[0]))


_GRAMS: dict = {}


def feedforward_grams(ffn: FeedForward) -> tuple:
    """``(W_1^T W_1, W_2 W_2^T)`` enclosed, once per block."""
    key = id(ffn)
    if key not in _GRAMS or _GRAMS[key][0] is not ffn:
        first = IntervalArray.from_enclosure(Enclosure.exact(ffn.W_1.T) @ Enclosure.exact(ffn.W_1))
        second = IntervalArray.from_enclosure(Enclosure.exact(ffn.W_2) @ Enclosure.exact(ffn.W_2.T))
        _GRAMS[key] = (ffn, first, second)
    return _GRAMS[key][1:]


def trilinear_norm(g: IntervalArray, A: IntervalArray, B: IntervalArray, e_gram: IntervalArray,
                   a_gram: IntervalArray | None = None, b_gram: IntervalArray | None = None) -> float:
    """Certified bound on ``max |sum_k g_k (a.A_k) (e.E_k) (B_k.b)|`` over unit vectors a, e, b.

    ``A_k`` are the columns of A (d, m), ``B_k`` the rows of B (m, d'), ``E_k`` vectors with Gram matrix
    ``e_gram`` (m, m).  Gathering e with b (or with a) into one unit vector of a tensor product bounds the form
    by the norm of a ``d x (d d')`` matrix M with ``M M^T = A diag(g) (G_E o B B^T) diag(g) A^T`` (``o`` the
    entrywise product), or of its counterpart ``B^T diag(g) (G_E o A^T A) diag(g) B``; the smaller top
    eigenvalue's square root, certified, counts (theorem local-feedforward-curvature).  ``a_gram``, ``b_gram``:
    ``A^T A`` and ``B B^T`` when already formed."""
    a_gram = A.swapaxes(0, 1).bmm(A) if a_gram is None else a_gram
    b_gram = B.bmm(B.swapaxes(0, 1)) if b_gram is None else b_gram
    tops = []
    for outer, gram in ((A, e_gram * b_gram), (B.swapaxes(0, 1), e_gram * a_gram)):
        scaled = outer * g.expand(0)                                                      # (d, m)
        tops.append(lambda_max_upper(scaled.bmm(gram).bmm(scaled.swapaxes(0, 1)).to_enclosure()))
    return IntervalArray(max(min(tops), 0.0)).sqrt().hi.item()
