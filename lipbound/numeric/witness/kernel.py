"""A batched kernel for the witness search: forward, JVP, VJP and the second-order term.

Dot-product heads and layers run through :class:`AttentionKernel` (fused projections, working
coordinates in the span of the head's projections, power iteration in output space through
``n x n`` Gram sandwiches); other scores through :mod:`lipbound.numeric.attention` with the
second-order term by central differences of VJPs.
"""

from __future__ import annotations

import math
from typing import final

import numpy as np

from ...errors import AssumptionError, WeightsError
from ..attention import layer_forward, layer_jvp, layer_vjp, self_forward, self_jvp, self_vjp
from ..blas import one_blas_thread
from ..model import Head, Layer

__all__ = ["AttentionKernel", "jacobian_norms", "kernel_for", "heads_of", "unit_rows", "CHUNK"]

#: Inputs per block in :func:`jacobian_norms` (measured fastest: the block's arrays stay in cache).
CHUNK = 128


@final
class AttentionKernel:
    """Dot-product attention (one head, or a multi-head layer) prepared for batched search.

    The tokens are taken in *working coordinates* ``x' = (x - c) U`` (``U`` an orthonormal basis
    of the span of the head's ``W_Q, W_K, W_V`` columns when ``reduce``; the identity
    otherwise), so that the domain becomes the ball of radius R about 0 and a single head
    costs ``3 d_k`` instead of ``d`` coordinates per token.  Moving a token orthogonally to
    that span changes nothing but its norm, so the search loses nothing.

    All projections go through one fused GEMM over the whole batch:
    ``[Q | K | V] = X' W + b`` with ``W = U^T [W_Q^1..W_Q^H | W_K^1..W_K^H | W_V^1..W_V^H]``,
    ``b = [b_Q | b_K | b_V] + c W``.

    Parameters
    ----------
    target : Head or Layer
        Dot-product score (causal masks allowed); every head of a layer must have the same shapes.
    center : ndarray of shape (d,), optional
        Centre of the ball (default 0).
    reduce : bool
        Work in the span of the head's projections (ignored for residual layers, whose identity
        sees every direction).
    """

    def __init__(self, target: Head | Layer, center: np.ndarray | None = None, reduce: bool = True):
        heads, W_O, residual = heads_of(target)
        if any(h.score != "dot" for h in heads):
            raise AssumptionError("target", "dot-product heads for the batched kernel",
                                  f"scores {sorted({h.score for h in heads})}",
                                  "use the generic path (search_witness handles other scores)")
        first = heads[0]
        if any((h.d, h.d_k, h.d_v, h.causal) != (first.d, first.d_k, first.d_v, first.causal) for h in heads):
            raise WeightsError("target.heads", "heads of equal shapes and masking", "mixed heads",
                               "split the layer into separate heads")
        self.target = target
        self.H, self.d, self.d_k, self.d_v = len(heads), first.d, first.d_k, first.d_v
        self.causal = first.causal
        self.residual = residual
        self.W_O = W_O
        self.center = np.zeros(self.d) if center is None else np.asarray(center, dtype=float)
        if self.center.shape != (self.d,):
            raise WeightsError("center", f"shape ({self.d},)", f"shape {self.center.shape}",
                               "the centre has the width of a token")
        W = np.concatenate([h.W_Q for h in heads] + [h.W_K for h in heads] + [h.W_V for h in heads], axis=1)
        bias = np.concatenate([h.b_Q for h in heads] + [h.b_K for h in heads] + [h.b_V for h in heads])
        self.basis = None
        if reduce and not residual:
            left, singular, _ = np.linalg.svd(W, full_matrices=False)
            rank = int(np.sum(singular > singular[0] * 1e-12)) if singular.size and singular[0] > 0 else 0
            if 0 < rank < self.d:
                self.basis = left[:, :rank]
        self.W = W if self.basis is None else self.basis.T @ W
        self.bias = bias + self.center @ W
        self.WT = np.ascontiguousarray(self.W.T)
        self.scale = 1.0 / math.sqrt(self.d_k)
        self.width = self.W.shape[1]
        # a single head: power iteration on Df Df^T in output space, through Gram blocks of W
        self.gram = None
        if self.H == 1 and W_O is None and not residual:
            dk = self.d_k
            W_Q, W_K, W_V = self.W[:, :dk], self.W[:, dk:2 * dk], self.W[:, 2 * dk:]
            self.gram = {"QQ": W_Q.T @ W_Q, "KQ": W_K.T @ W_Q, "KK": W_K.T @ W_K, "QV": W_Q.T @ W_V,
                         "KV": W_K.T @ W_V, "VV": W_V.T @ W_V}

    # coordinates ---------------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        """Working coordinates per token."""
        return self.d if self.basis is None else self.basis.shape[1]

    def to_work(self, X: np.ndarray) -> np.ndarray:
        shifted = np.asarray(X, dtype=float) - self.center
        return shifted if self.basis is None else shifted @ self.basis

    def from_work(self, Xw: np.ndarray) -> np.ndarray:
        return (Xw if self.basis is None else Xw @ self.basis.T) + self.center

    def direction_from_work(self, Ew: np.ndarray) -> np.ndarray:
        return Ew if self.basis is None else Ew @ self.basis.T

    def head_weights(self, h: int) -> tuple[np.ndarray, ...]:
        """``(W_Q, W_K, W_V, b_Q, b_K, b_V)`` of head ``h`` in working coordinates."""
        H, dk, dv = self.H, self.d_k, self.d_v
        cols = [slice(h * dk, (h + 1) * dk), slice(H * dk + h * dk, H * dk + (h + 1) * dk),
                slice(2 * H * dk + h * dv, 2 * H * dk + (h + 1) * dv)]
        return tuple(self.W[:, c] for c in cols) + tuple(self.bias[c] for c in cols)

    # evaluation ------------------------------------------------------------------------------
    def linearize(self, Xw: np.ndarray) -> "_Linearization":
        """The map and its derivatives at a batch ``Xw`` of shape (b, n, d_in)."""
        return _Linearization(self, np.asarray(Xw, dtype=float))

    def forward(self, Xw: np.ndarray) -> np.ndarray:
        return self.linearize(Xw).F


@final
class _Linearization:
    """Projections and attention weights at a batch of inputs, reused by JVPs, VJPs and the
    second-order term.  Shapes: ``Q, K`` (b, H, n, d_k), ``V`` (b, H, n, d_v), ``P`` (b, H, n, n)."""

    def __init__(self, kernel: AttentionKernel, Xw: np.ndarray):
        self.k = kernel
        self.X = Xw
        self.b, self.n = Xw.shape[0], Xw.shape[1]
        proj = (Xw.reshape(-1, kernel.d_in) @ kernel.W + kernel.bias).reshape(self.b, self.n, kernel.width)
        # contiguous copies: every JVP/VJP multiplies by them again
        self.Q, self.K, self.V = (np.ascontiguousarray(M) for M in self._split(proj))
        S = kernel.scale * (self.Q @ np.swapaxes(self.K, -1, -2))
        if kernel.causal:
            S = np.where(np.tril(np.ones((self.n, self.n), dtype=bool)), S, -np.inf)
        S = S - np.max(S, axis=-1, keepdims=True)
        P = np.exp(S)
        self.P = P / np.sum(P, axis=-1, keepdims=True)
        self.PT = np.ascontiguousarray(np.swapaxes(self.P, -1, -2))
        # scaled and transposed copies reused by every JVP/VJP (c = 1/sqrt(d_k))
        self.Pc = kernel.scale * self.P
        self.Qc = kernel.scale * self.Q
        self.KTc = np.ascontiguousarray(kernel.scale * np.swapaxes(self.K, -1, -2))
        self.VT = np.ascontiguousarray(np.swapaxes(self.V, -1, -2))
        self._F = None

    # layout helpers ----------------------------------------------------------------------------
    def _split(self, Z: np.ndarray):
        k, b, n = self.k, Z.shape[0], Z.shape[1]
        H, dk, dv = k.H, k.d_k, k.d_v
        Q = Z[..., :H * dk].reshape(b, n, H, dk).transpose(0, 2, 1, 3)
        K = Z[..., H * dk:2 * H * dk].reshape(b, n, H, dk).transpose(0, 2, 1, 3)
        V = Z[..., 2 * H * dk:].reshape(b, n, H, dv).transpose(0, 2, 1, 3)
        return Q, K, V

    def _merge(self, gQ, gK, gV) -> np.ndarray:
        b, n = gQ.shape[0], gQ.shape[2]
        return np.concatenate([g.transpose(0, 2, 1, 3).reshape(b, n, -1) for g in (gQ, gK, gV)], axis=-1)

    def _heads_out(self, Fh: np.ndarray) -> np.ndarray:
        """(b, H, n, d_v) -> the map's output (b, n, d_out), without bias."""
        b, H, n, dv = Fh.shape
        merged = Fh.transpose(0, 2, 1, 3).reshape(b, n, H * dv)
        return merged if self.k.W_O is None else merged @ self.k.W_O

    def _heads_in(self, G: np.ndarray) -> np.ndarray:
        """Cotangent of the output (b, n, d_out) -> per head (b, H, n, d_v)."""
        if self.k.W_O is not None:
            G = G @ self.k.W_O.T
        b, n = G.shape[0], G.shape[1]
        return G.reshape(b, n, self.k.H, self.k.d_v).transpose(0, 2, 1, 3)

    def _work_to_proj(self, E: np.ndarray) -> np.ndarray:
        return (E.reshape(-1, self.k.d_in) @ self.k.W).reshape(E.shape[0], E.shape[1], self.k.width)

    def _proj_to_work(self, Z: np.ndarray) -> np.ndarray:
        return (Z.reshape(-1, self.k.width) @ self.k.WT).reshape(Z.shape[0], Z.shape[1], self.k.d_in)

    # the map -------------------------------------------------------------------------------
    @property
    def F(self) -> np.ndarray:
        """``f(X)`` (b, n, d_out), output bias omitted (it cancels in every difference)."""
        if self._F is None:
            out = self._heads_out(self.P @ self.V)
            self._F = out + self.X if self.k.residual else out
        return self._F

    def jvp_proj(self, Z: np.ndarray) -> np.ndarray:
        """``Df[E]`` from the projected tangent ``Z = E W`` (b, n, width)."""
        dQ, dK, dV = self._split(Z)
        dS = dQ @ self.KTc
        dS += self.Qc @ np.swapaxes(dK, -1, -2)
        dS -= np.sum(self.P * dS, axis=-1, keepdims=True)
        dS *= self.P                                           # dP = P o (dS - rowsum(P o dS))
        out = dS @ self.V
        out += self.P @ dV
        return self._heads_out(out)

    def vjp_proj(self, G: np.ndarray) -> np.ndarray:
        """``Df^T[G]`` in projection space (b, n, width); ``Df^T[G] = (that) W^T``."""
        Gh = self._heads_in(G)
        gS = Gh @ self.VT
        gS -= np.sum(self.P * gS, axis=-1, keepdims=True)
        gS *= self.Pc                                          # c P o (gP - rowsum(P o gP))
        return self._merge(gS @ self.K, np.swapaxes(gS, -1, -2) @ self.Q, self.PT @ Gh)

    def jvp(self, E: np.ndarray) -> np.ndarray:
        """``Df(X)[E]``, E of shape (b, n, d_in)."""
        out = self.jvp_proj(self._work_to_proj(E))
        return out + E if self.k.residual else out

    def vjp(self, G: np.ndarray) -> np.ndarray:
        """``Df(X)^T[G]``, G of shape (b, n, d_out)."""
        out = self._proj_to_work(self.vjp_proj(G))
        return out + G if self.k.residual else out

    def curvature(self, E: np.ndarray, G: np.ndarray) -> np.ndarray:
        """``grad_X <G, Df(X)[E]>`` with E, G held fixed, shape (b, n, d_in).

        Reverse mode through the JVP (``S = c Q K^T``, ``P = softmax(S)``)::

            dS  = c (dQ K^T + Q dK^T),  m = rowsum(P o dS),  dP = P o (dS - m),  dF = dP V + P dV
            gdP = G V^T,  a = rowsum(P o gdP),  gdS = P o (gdP - a)
            gP  = G dV^T + gdP o (dS - m) - a o dS,  gS = P o (gP - rowsum(P o gP))
            gQ  = c (gdS dK + gS K),  gK = c (gdS^T dQ + gS^T Q),  gV = dP^T G
            grad = [gQ | gK | gV] W^T

        With ``G = Df[E] / ||Df[E]||`` and E the top right singular vector this is the gradient
        of the local Jacobian norm ``sigma_max(Df(X))`` (envelope theorem).
        """
        dQ, dK, dV = self._split(self._work_to_proj(E))
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
        return self._proj_to_work(self._merge(gQ, gK, gV))

    # power iteration ---------------------------------------------------------------------------
    def top_singular(self, start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See :func:`_top_singular`."""
        return _top_singular(self, start, steps)

    def _gram_step(self, G: np.ndarray) -> np.ndarray:
        """``Df Df^T G`` for a single head, G of shape (b, n, d_v), in O(n^2 (n + d_v)) per input.

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


def unit_rows(E: np.ndarray) -> np.ndarray:
    size = np.sqrt(np.sum(E * E, axis=tuple(range(1, E.ndim)), keepdims=True))
    return E / np.where(size > 0, size, 1.0)


def heads_of(target: Head | Layer):
    if isinstance(target, Head):
        return (target,), None, False
    if isinstance(target, Layer):
        return tuple(target.heads), target.W_O, bool(target.residual)
    raise WeightsError("target", "a Head or a Layer (lipbound.numeric.attention)", type(target).__name__,
                       "build one with Head(W_Q, W_K, W_V, ...) or Model.layers[i].as_layer()")


@final
class _GenericKernel:
    """Any :class:`Head` or :class:`Layer` (l2, cosine scores) through
    :mod:`lipbound.numeric.attention`; the second-order term by a central difference of VJPs:
    ``grad_X <G, Df(X)[E]> = d/dt Df(X + tE)^T[G] at t = 0`` (symmetry of the Hessian of
    ``<G, f>``)."""

    gram = None

    def __init__(self, target: Head | Layer, center: np.ndarray | None = None):
        heads, _, residual = heads_of(target)
        self.target = target
        self.d = heads[0].d
        self.center = np.zeros(self.d) if center is None else np.asarray(center, dtype=float)
        self.basis = None
        self.residual = residual
        if isinstance(target, Head):
            self._forward = lambda X: self_forward(target, X)
            self._jvp = lambda X, E: self_jvp(target, X, E)[1]
            self._vjp = lambda X, G: self_vjp(target, X, G)
        else:
            self._forward = lambda X: layer_forward(target, X)
            self._jvp = lambda X, E: layer_jvp(target, X, E)[1]
            self._vjp = lambda X, G: layer_vjp(target, X, G)

    @property
    def d_in(self) -> int:
        return self.d

    def to_work(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, dtype=float) - self.center

    def from_work(self, Xw: np.ndarray) -> np.ndarray:
        return Xw + self.center

    def direction_from_work(self, Ew: np.ndarray) -> np.ndarray:
        return Ew

    def linearize(self, Xw: np.ndarray) -> "_GenericLinearization":
        return _GenericLinearization(self, np.asarray(Xw, dtype=float))

    def forward(self, Xw: np.ndarray) -> np.ndarray:
        return self._forward(Xw + self.center)


@final
class _GenericLinearization:
    def __init__(self, kernel: _GenericKernel, Xw: np.ndarray):
        self.k, self.X = kernel, Xw
        self._full = Xw + kernel.center

    @property
    def F(self) -> np.ndarray:
        return self.k._forward(self._full)

    def jvp(self, E):
        return self.k._jvp(self._full, E)

    def vjp(self, G):
        return self.k._vjp(self._full, G)

    def curvature(self, E, G):
        scale = np.sqrt(np.sum(self._full ** 2, axis=(1, 2), keepdims=True)) + 1.0
        h = 1e-5 * scale
        plus, minus = self.k._vjp(self._full + h * E, G), self.k._vjp(self._full - h * E, G)
        return (plus - minus) / (2 * h)

    def top_singular(self, start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _top_singular(self, start, steps)


def _top_singular(lin, start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``steps`` rounds of power iteration from ``start`` (b, n, d_in) at a linearisation.

    Returns ``(sigma, E, JE)``: unit directions E, ``JE = Df[E]`` and ``sigma = ||JE||_F``, so
    each sigma is a lower bound on the local Jacobian norm whatever the convergence.  A single
    head iterates ``Df Df^T`` in output space (:meth:`_Linearization._gram_step`), other maps
    ``Df^T Df`` in token space.
    """
    E = unit_rows(start)
    if getattr(lin.k, "gram", None) is not None and steps > 0:
        G = lin.jvp(E)
        for _ in range(steps):
            G = lin._gram_step(G)
            G *= (1.0 / np.maximum(np.sqrt(np.einsum("bij,bij->b", G, G)), 1e-300))[:, None, None]
        E = unit_rows(lin.vjp(G))
    else:
        for _ in range(steps):
            E = unit_rows(lin.vjp(lin.jvp(E)))
    JE = lin.jvp(E)
    return np.sqrt(np.einsum("bij,bij->b", JE, JE)), E, JE


def kernel_for(target: Head | Layer, center: np.ndarray | None, reduce: bool = True):
    heads, _, _ = heads_of(target)
    first = heads[0]
    uniform = all((h.d, h.d_k, h.d_v, h.causal) == (first.d, first.d_k, first.d_v, first.causal) for h in heads)
    if all(h.score == "dot" for h in heads) and uniform:
        return AttentionKernel(target, center, reduce=reduce)
    return _GenericKernel(target, center)


@one_blas_thread
def jacobian_norms(kernel: AttentionKernel, Xw: np.ndarray, steps: int = 20, seed: int = 0,
                   directions: bool = True):
    """Batched local Jacobian norms by power iteration with a fixed number of steps.

    Parameters
    ----------
    kernel : AttentionKernel
    Xw : ndarray, shape (b, n, d_in)
        Inputs in the kernel's working coordinates (``kernel.to_work(X)``).
    steps : int
        Power-iteration steps, each one application of ``Df Df^T`` (a JVP after a VJP).
    directions : bool
        Also return the unit input directions (one more VJP in token space).

    Returns
    -------
    sigma : ndarray (b,)
        ``||Df(X_b)[E_b]||_F`` for unit directions ``E_b = Df^T G_b / ||Df^T G_b||`` (lower bounds
        on the local norm), computed as ``||Df Df^T G|| / <G, Df Df^T G>^(1/2)``.
    E : ndarray (b, n, d_in), or None
    """
    Xw = np.asarray(Xw, dtype=float)
    rng = np.random.default_rng(seed)
    if kernel.gram is None:
        sigma, E, _ = kernel.linearize(Xw).top_singular(rng.standard_normal(Xw.shape), steps)
        return sigma, (E if directions else None)
    starts = rng.standard_normal((Xw.shape[0], Xw.shape[1], kernel.d_v))
    sigma, E = np.empty(len(Xw)), (np.empty(Xw.shape) if directions else None)
    for first in range(0, len(Xw), CHUNK):     # chunks keep the working set in cache
        part = slice(first, first + CHUNK)
        lin = kernel.linearize(Xw[part])
        G = starts[part]
        for _ in range(steps):
            G = lin._gram_step(G)
            G *= (1.0 / np.maximum(np.sqrt(np.einsum("bij,bij->b", G, G)), 1e-300))[:, None, None]
        JJG = lin._gram_step(G)
        sigma[part] = np.sqrt(np.einsum("bij,bij->b", JJG, JJG)
                              / np.maximum(np.einsum("bij,bij->b", G, JJG), 1e-300))
        if directions:
            E[part] = unit_rows(lin.vjp(G))
    return sigma, E


