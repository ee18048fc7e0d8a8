"""The components of a transformer layer evaluated rigorously at a point: values and Jacobian blocks.

Each class takes its input as an :class:`~lipbound.rigorous.arrays.IntervalArray` (a float array
taken exactly, or an enclosure of an exact point) and holds interval enclosures of everything the
local theorems read: projections, scores, attention weights, head outputs, norm scales, FFN
pre-activations and slopes, and the output.  Jacobian blocks are in row convention:
``d out_i = sum_j e_j B_ij`` for token perturbations ``e_j`` (rows), so ``B_ij`` is (d_in, d_out)
and ``||B_ij||_2 = ||d out_i / d x_j||_2``.

* :class:`EnclosedAttention` -- a head, or a multi-head layer with its residual, of a dot-product or
  rotary score under a causal, windowed or no mask, grouped-query layers included
  (:mod:`lipbound.local.scores`):
  ``B_ij = [i = j] I + sum_h (p_ij V + c p_ij w_ij u_ij + [i = j] c W_Q M_i C_i) W_O^h`` with
  ``u_ij = v_j - f_i``, ``w_ij = W_K M_j q~_i^T``, ``C_i = sum_l p_il k~_l^T u_il`` (the derivative of
  softmax attention, lemma ``softmax-derivative``; ``M_p`` the rotation at position p, the identity for
  a dot product, ``q~``, ``k~`` the rotated queries and keys; a hidden key has ``p_ij = 0``);
* :class:`EnclosedNorm` -- a LayerNorm or an RMSNorm, ``B_ii = (P - g g^T) diag(gamma) sqrt(d) / n(u)``
  (lemma ``layernorm-jacobian``; P the centring projection, or the identity for an RMSNorm);
* :class:`EnclosedFeedForward` -- ``x + GELU(x W_1 + b_1) W_2 + b_2``, ``B_ii = I + W_1 diag(GELU'(h_i)) W_2``
  (the gated block of a decoder: :mod:`lipbound.local.gated`).
"""

from __future__ import annotations

import numpy as np

from ..errors import NotCertifiedError, WeightsError
from ..numeric.attention import AttentionMap
from ..numeric.model import FeedForward, Head, Layer
from ..numeric.normalization import Normalization
from ..rigorous.arrays import IntervalArray, as_interval_array, gelu, gelu_curvature, gelu_slope, softmax
from ..rigorous.intervals import IV
from ..rigorous.linalg import Enclosure, lambda_max_upper, spectral_norm_upper_large
from ..rigorous.rayleigh import sandwich_top_bounds
from .scores import ScoreNorms, head_projections, score_scale, visibility

#: pieces per side of the interval of a neuron's pre-activation on which its secant slopes are enclosed
#: (:meth:`EnclosedFeedForward.secant_slopes`): the slopes' range over piece j counts with weight 1 / (j + 1)
SECANT_PIECES = 16

__all__ = ["EnclosedAttention", "EnclosedNorm", "EnclosedFeedForward", "inverse_sqrt", "head_products", "softmax",
           "trilinear_norm", "feedforward_grams", "feedforward_float_grams", "feedforward_hadamards", "kept_per_block",
           "release_block",
           "key_masses", "hidden_fill"]


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


def key_masses(masses: np.ndarray, visible: np.ndarray | None) -> np.ndarray:
    """The mass of key j in the softmax of query i: ``m_j``, 0 where the mask hides the key ((n,), or
    (H, n, n) with a mask)."""
    return masses if visible is None else masses[None, None, :] * visible


def hidden_fill(S: IntervalArray, visible: np.ndarray | None) -> IntervalArray:
    """Scores with every hidden entry set to the smallest visible lower end of its row: a hidden key has
    mass 0, so its score never counts, but the row's shift by its largest score (which keeps the
    exponentials in range) must come from the keys it sees."""
    if visible is None:
        return S
    floor = np.min(np.where(visible, S.lo, np.inf), axis=-1, keepdims=True)
    return IntervalArray(np.where(visible, S.lo, floor), np.where(visible, S.hi, floor))


class EnclosedAttention:
    """A head or an attention layer at one input, in interval arithmetic.

    Parameters
    ----------
    target : Head or Layer
        Dot-product or rotary, causal, windowed or unmasked (:func:`lipbound.local.scores.check_scope`).
    X : IntervalArray or ndarray, shape (n, d)
    masses : ndarray, shape (n,), optional
        Key masses (``p_ij`` proportional to ``m_j e^{s_ij}`` over the keys query i sees).
    positions : ndarray of int, shape (n,), optional
        The tokens' positions (default 0..n-1).

    Attributes
    ----------
    Q, K : IntervalArray (H, n, d_k)
        Rotated queries and keys (a group's keys repeated for each of its heads).
    V, F : IntervalArray (H, n, d_v)
        Values (bias included) and head outputs ``f_i = sum_j p_ij v_j``.
    S, P : IntervalArray (H, n, n)
        Scores ``c q~_i . k~_j`` (hidden ones filled by :func:`hidden_fill`) and attention weights (0 where hidden).
    masses : ndarray
        :func:`key_masses`.
    norms : ScoreNorms
        ``a_ij``, ``b_ij``, ``g_ij`` and ``w_ij`` (:class:`~lipbound.local.scores.ScoreNorms`).
    output : IntervalArray (n, d_out)
        ``[f^1..f^H] W_O + b_O`` (+ X for a residual layer); the head output for a head.
    """

    def __init__(self, target: Head | Layer, X, masses=None, positions=None):
        engine = AttentionMap(target)
        self.engine = engine
        X = as_interval_array(X)
        if X.ndim != 2 or X.shape[1] != engine.d:
            raise WeightsError("X", f"tokens of shape (n, {engine.d})", f"shape {X.shape}", "tokens are rows")
        self.X, self.n = X, X.shape[0]
        self.positions = np.arange(self.n) if positions is None else np.asarray(positions, dtype=np.int64)
        H, dv = engine.H, engine.d_v
        self.Q, self.K, self.V, self.rotations = head_projections(engine, X, self.positions)
        self.visible = visibility(engine, self.positions, self.positions)
        self.masses = key_masses(np.ones(self.n) if masses is None else np.asarray(masses, dtype=np.float64),
                                 self.visible)
        self.c = score_scale(engine)
        self.S = hidden_fill(self.Q.einsum("hik,hjk->hij", self.K) * self.c, self.visible)
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
        self._norms = None

    @property
    def d_out(self) -> int:
        return self.engine.d_out

    @property
    def norms(self) -> ScoreNorms:
        if self._norms is None:
            self._norms = ScoreNorms(self.engine, self.Q, self.K, self.rotations, self.positions)
        return self._norms

    def _parts(self):
        """``V^h W_O^h`` (H, d, d_out), ``w_ij`` (H, n, n or 1, d), ``u_ij W_O^h`` (H, n, n, d_out) and the
        diagonal term ``sum_h W_Q^h M_i C^h_i W_O^h`` (n, d, d_out)."""
        if self._products is None:
            e = self.engine
            U = self.V.expand(1) - self.F.expand(2)                      # u_ij = v_j - f_i, (H, n, n, d_v)
            os, cs = [], []
            for h in range(e.H):
                rows = np.eye(e.d_v) if e.W_O is None else e.target.output_block(h)
                os.append(U[h].matmul(rows))                               # (n, n, d_out)
                C_h = (self.P[h].expand(-1).expand(-1) * (self.K[h].expand(0).expand(-1) * U[h].expand(2))).sum(axis=1)
                if self.rotations is not None:                             # M_i C_i: back to the unrotated queries
                    C_h = self.rotations.einsum("ikl,ild->ikd", C_h)
                cs.append(C_h.matmul(rows))                                # (n, d_k, d_out)
            W_Q_all = np.concatenate([e.head_weights(h)[0] for h in range(e.H)], axis=1)      # (d, H d_k)
            C_all = IntervalArray(np.concatenate([c.lo for c in cs], axis=1),
                                  np.concatenate([c.hi for c in cs], axis=1))
            self._products = (head_products(e), self.norms.w, IntervalArray.stack(os), C_all.lmatmul(W_Q_all))
        return self._products

    def release_products(self) -> None:
        """Let the Jacobian's products go (:meth:`_parts`: ``u_ij W_O^h`` (H, n, n, d_out), the diagonal term (n, d,
        d_out), ``V^h W_O^h``, with their operands' midpoints and magnitudes: about 0.2 GB at n = 20 on MiniLM); a
        Jacobian asked for later forms them again.  A stack lets each block's go once the block's curve has run: only
        its Jacobians read them, and the enclosure itself stays for the stack's own radii."""
        self._products = None

    def jacobian_column(self, j: int, outputs=None) -> IntervalArray:
        """The blocks ``B_ij`` for every output token i (or those listed in ``outputs``), shape
        (n or len(outputs), d, d_out)."""
        values, w, o, G = self._parts()
        rows = np.arange(self.n) if outputs is None else np.asarray(outputs, dtype=np.int64)
        Pj = self.P[:, rows, j]                                              # (H, m)
        first = Pj.einsum("hi,hab->iab", values)
        w_j = w[:, rows, 0] if w.shape[2] == 1 else w[:, rows, j]           # (H, m, d)
        second = (Pj * self.c).expand(-1).__mul__(w_j).einsum("hia,hib->iab", o[:, rows, j, :])
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
        return IntervalArray(*self._jacobian_rows(lambda column: (column.lo, column.hi)))

    def jacobian_enclosure(self, inputs=None, outputs=None, tails: IntervalArray | None = None) -> Enclosure:
        """:meth:`jacobian` as midpoint and radius (the same floats as ``jacobian().to_enclosure()``, which is
        entrywise), formed input token by input token: no end-point pair of the whole matrix beside it.  With
        ``inputs`` / ``outputs`` (token indices) only those rows ``(j, a)`` and columns ``(i, c)``; with ``tails``
        (len(outputs), d_out, d') each output token's block followed by its own map (rows ``(j, a)``, columns
        ``(i, c')``)."""
        def settled(column: IntervalArray) -> tuple:
            enclosure = (column if tails is None else column.bmm(tails)).to_enclosure()
            return enclosure.mid, enclosure.rad
        return Enclosure._trusted(*self._jacobian_rows(settled, inputs, outputs))

    def _jacobian_rows(self, parts, inputs=None, outputs=None) -> tuple[np.ndarray, np.ndarray]:
        """The two arrays ``parts(column)`` of the input tokens' rows (all, or ``inputs``) of the Jacobian's columns
        of ``outputs`` (all by default), filled in place: no stacked copy of the whole matrix."""
        d = self.engine.d
        inputs = range(self.n) if inputs is None else inputs
        wholes: tuple = ()
        for row, j in enumerate(inputs):
            column = parts(self.jacobian_column(int(j), outputs))                     # two (m, d, width)
            if not wholes:
                m, _, width = column[0].shape
                wholes = (np.empty((len(inputs) * d, m * width)), np.empty((len(inputs) * d, m * width)))
            for whole, part in zip(wholes, column):
                whole[row * d:(row + 1) * d] = part.transpose(1, 0, 2).reshape(d, -1)
        return wholes[0], wholes[1]


class EnclosedNorm:
    """``N(z) = gamma * sqrt(d) u / n(u) + center``, ``u = P z``, ``n(u) = sqrt(||u||^2 + d eps)``, per token:
    a LayerNorm (P the centring projection, centre beta) or an RMSNorm (P = I, centre 0).  ``exact_sums``: the mean
    and the sum of squares summed exactly (:meth:`~lipbound.rigorous.arrays.IntervalArray.sum`), for the narrow
    enclosures of a point pass.

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

    def __init__(self, norm: Normalization, Z, exact_sums: bool = False):
        Z = as_interval_array(Z)
        self.norm, self.Z = norm, Z
        d = norm.d
        u = Z - Z.sum(axis=-1, keepdims=True, exact_sums=exact_sums) * IntervalArray.constant(IV.mpf(1) / d) \
            if norm.centred else Z
        squares = u.square().sum(axis=-1, exact_sums=exact_sums)
        self.nu = squares.sqrt()
        self.delta = IntervalArray.constant(IV.mpf(d) * IV.mpf(norm.eps))
        self.scale = (squares + self.delta).sqrt()
        self.g = u / self.scale.expand(-1)
        self.root_d = IntervalArray.constant(IV.sqrt(d))
        self.output = self.g * (IntervalArray(norm.gamma) * self.root_d) + IntervalArray(norm.center)

    def jacobian_block(self, i: int) -> IntervalArray:
        """``B_ii`` (d, d)."""
        d = self.norm.d
        g = self.g[i]
        projection = IntervalArray(np.eye(d)) - IntervalArray.constant(IV.mpf(1) / d) if self.norm.centred \
            else IntervalArray(np.eye(d))
        inner = projection - g.expand(-1) * g.expand(0)
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
            first = feedforward_grams(self.ffn)[0]
            hadamards = feedforward_hadamards(self.ffn)     # the same for every token
            W_1, W_2, g = IntervalArray(self.ffn.W_1), IntervalArray(self.ffn.W_2), self.curvature
            for i in (i for i in tokens if i not in cache):
                cache[i] = trilinear_norm(g[i], W_1, W_2, first, hadamards=hadamards)
        for i in tokens:
            out[i] = cache[i]
        return out

    @property
    def curvature(self) -> IntervalArray:
        """``GELU''(h)`` (n, d_ff), enclosed."""
        if "_second" not in self.__dict__:
            self._second = gelu_curvature(self.h)
        return self._second

    def jacobian_block(self, i: int, slopes: IntervalArray | None = None) -> IntervalArray:
        """``B_ii = I + W_1 diag(GELU'(h_i)) W_2`` (d, d); with ``slopes`` (d_ff,), ``I + W_1 diag(slopes) W_2``."""
        scaled = IntervalArray(self.ffn.W_1) * (self.slope[i] if slopes is None else slopes).expand(0)
        return scaled.einsum("ak,kb->ab", IntervalArray(self.ffn.W_2)) + IntervalArray(np.eye(self.ffn.W_1.shape[0]))

    def secant_slopes(self, radii: np.ndarray, pieces: int = SECANT_PIECES) -> IntervalArray:
        """Per token i and neuron k, an enclosure of the secant slopes ``(GELU(h_ik + t) - GELU(h_ik)) / t`` over
        ``0 < |t| <= a_ik = ||w_k|| r_i`` (lemma secant-slope-range): with ``0 = t_0 < ... < t_K = a`` the ends of K
        pieces, a secant to a point t of piece j is the convex combination of the secant ``sigma_j`` to ``t_j`` and a
        mean of GELU' over ``[t_j, t]``, the latter weighted ``(t - t_j) / t <= lambda_j = 1 - t_j / t_(j+1)``; so
        the secants over piece j lie in the hull of ``sigma_j`` and ``sigma_j + lambda_j (GELU'(piece) - sigma_j)``
        (``sigma_0 = GELU'(h)``, ``lambda_0 = 1``).  Equal pieces give ``lambda_j = 1 / (j + 1)``: far from the
        centre the slopes' range counts little.  Shape (n, d_ff); a token of radius 0 keeps ``GELU'(h_i)``."""
        radii = np.asarray(radii, dtype=np.float64)
        a = (IntervalArray(IntervalArray(self.ffn.W_1).norm_upper(axis=0)).expand(0)
             * IntervalArray(radii).expand(-1)).hi                                          # (n, d_ff)
        if not np.all(np.isfinite(a)):
            raise NotCertifiedError("radii", "finite feed-forward balls", "a pre-activation interval beyond the "
                                    "float range", "take smaller radii")
        moving = radii > 0
        h, slope, a = self.h[moving], self.slope[moving], a[moving]
        lo, hi = self.slope.lo.copy(), self.slope.hi.copy()
        if not np.any(moving):
            return IntervalArray(lo, hi)
        fractions = np.arange(1, pieces + 1) / pieces
        ends = np.concatenate([fractions, -fractions])[:, None, None] * a                 # (2K, n', d_ff)
        ends[pieces - 1], ends[-1] = a, -a                                                # t_K = a exactly
        starts = np.concatenate([np.zeros((1,) + a.shape), ends[:pieces - 1], np.zeros((1,) + a.shape),
                                 ends[pieces:-1]])
        # every piece's slopes and every end's secant in one pass (2K of each)
        piece = gelu_slope((h.expand(0) + IntervalArray(starts)).hull(h.expand(0) + IntervalArray(ends)))
        reached = (gelu(h.expand(0) + IntervalArray(ends)) - gelu(h).expand(0)) / IntervalArray(ends)
        found_lo, found_hi = slope.lo.copy(), slope.hi.copy()
        for side in (0, pieces):
            secant = slope                                     # the secant's limit at t = 0: GELU'(h)
            for j in range(pieces):
                weight = (IntervalArray(1.0) - IntervalArray(starts[side + j]) / IntervalArray(ends[side + j])).hi \
                    if j else np.ones(a.shape)
                hull = secant + (piece[side + j] - secant) * IntervalArray(np.zeros(a.shape), weight)
                found_lo, found_hi = np.minimum(found_lo, hull.lo), np.maximum(found_hi, hull.hi)
                secant = reached[side + j]
        lo[moving], hi[moving] = found_lo, found_hi
        return IntervalArray(lo, hi)

    def movement(self, radii: np.ndarray) -> np.ndarray:
        """Per token, a certified bound on ``sup ||FF(y) - FF(y_i)||`` over ``||y - y_i|| <= r_i`` (lemma
        feedforward-movement): with ``sigma`` the secant slopes of :meth:`secant_slopes`, ``m`` their enclosures'
        midpoints and ``s`` their half widths, ``FF(y) - FF(y_i) = e (I + W_1 diag(sigma) W_2)`` for ``e = y - y_i``,
        so the movement is at most ``r_i (||I + W_1 diag(m) W_2|| + ||diag(s)^(1/2) W_1^T|| ||W_2^T diag(s)^(1/2)||)``
        (Cauchy-Schwarz over the neurons, as the slopes' variation is bounded): the GELU values' changes taken
        jointly, where the Jacobian's supremum pays every neuron's slope at its worst at once.  0 for radius 0, inf
        for an infinite radius."""
        radii = np.asarray(radii, dtype=np.float64)
        finite = np.isfinite(radii)
        secants = self.secant_slopes(np.where(finite, radii, 0.0))
        out = np.where(finite, 0.0, np.inf)
        for i in np.flatnonzero(finite & (radii > 0)):
            centre = IntervalArray(secants[i].mid)
            half = np.maximum((secants[i] - centre).hi, (centre - secants[i]).hi)
            root = IntervalArray(half).sqrt()
            left, right = IntervalArray(self.ffn.W_1) * root.expand(0), IntervalArray(self.ffn.W_2) * root.expand(-1)
            rate = _norm(self.jacobian_block(i, centre)) + _norm(left) * _norm(right)
            out[i] = (rate * IntervalArray(radii[i])).hi.item()
        return out


def _norm(M: IntervalArray) -> IntervalArray:
    """``||M||_2`` of an enclosed matrix, certified from above (a point interval)."""
    return IntervalArray(spectral_norm_upper_large(M.to_enclosure()))


#: a per-block cache keeps the most recent blocks only (each entry holds d_ff x d_ff enclosures, tens of MB for
#: all-MiniLM-L6-v2, and keeps its block alive)
BLOCKS_KEPT = 12


#: every cache :func:`kept_per_block` has filled (:func:`release_block` empties them of a block's entries)
_PER_BLOCK_CACHES: list = []


def kept_per_block(cache: dict, owners: tuple, compute):
    """``compute()`` once per tuple of ``owners`` (the block and whatever else the value depends on, compared by
    identity), remembered in ``cache`` for the most recent :data:`BLOCKS_KEPT` tuples."""
    if not any(kept is cache for kept in _PER_BLOCK_CACHES):
        _PER_BLOCK_CACHES.append(cache)
    key = tuple(id(owner) for owner in owners)
    entry = cache.get(key)
    if entry is None or any(kept is not owner for kept, owner in zip(entry[0], owners)):
        cache.pop(key, None)
        while len(cache) >= BLOCKS_KEPT:   # the oldest goes first (dicts keep insertion order)
            del cache[next(iter(cache))]
        entry = cache[key] = (owners, compute())
    return entry[1]


def release_block(*owners) -> None:
    """Drop every entry of the per-block caches (:func:`kept_per_block`) that one of ``owners`` (compared by identity)
    owns: a stack lets a block's ``d_ff x d_ff`` enclosures go once no later block reads them (about 0.19 GB a block
    of MiniLM, which the caches kept for the last :data:`BLOCKS_KEPT` blocks)."""
    for cache in _PER_BLOCK_CACHES:
        for key in [key for key, (kept, _) in cache.items() if any(o is owner for o in kept for owner in owners)]:
            del cache[key]


_GRAMS: dict = {}


def feedforward_grams(ffn: FeedForward) -> tuple:
    """``(W_1^T W_1, W_2 W_2^T)`` enclosed, once per block."""
    return kept_per_block(_GRAMS, (ffn,), lambda: (
        IntervalArray.from_enclosure(Enclosure.exact(ffn.W_1.T) @ Enclosure.exact(ffn.W_1)),
        IntervalArray.from_enclosure(Enclosure.exact(ffn.W_2) @ Enclosure.exact(ffn.W_2.T))))


_FLOAT_GRAMS: dict = {}


def feedforward_float_grams(ffn: FeedForward) -> tuple:
    """The midpoints of :func:`feedforward_grams` (floats: the estimates that order the work read them), once per
    block."""
    return kept_per_block(_FLOAT_GRAMS, (ffn,), lambda: tuple(gram.mid for gram in feedforward_grams(ffn)))


_HADAMARDS: dict = {}


def feedforward_hadamards(ffn: FeedForward) -> tuple:
    """``(G_1 o G_2, G_1 o G_1)`` enclosed, ``G_1 = W_1^T W_1``, ``G_2 = W_2 W_2^T`` (:func:`feedforward_grams`), ``o``
    entrywise: the Gram matrices of the vectors ``w_k (x) r_k`` and ``w_k (x) w_k`` (d_ff, d_ff), once per block."""
    def compute():
        first, second = feedforward_grams(ffn)
        return first * second, first * first
    return kept_per_block(_HADAMARDS, (ffn,), compute)


def trilinear_norm(g: IntervalArray, A: IntervalArray, B: IntervalArray, e_gram: IntervalArray,
                   a_gram: IntervalArray | None = None, b_gram: IntervalArray | None = None,
                   hadamards: tuple | None = None) -> float:
    """Certified bound on ``max |sum_k g_k (a.A_k) (e.E_k) (B_k.b)|`` over unit vectors a, e, b.

    ``A_k`` are the columns of A (d, m), ``B_k`` the rows of B (m, d'), ``E_k`` vectors with Gram matrix
    ``e_gram`` (m, m).  Gathering e with b (or with a) into one unit vector of a tensor product bounds the form
    by the norm of a ``d x (d d')`` matrix M with ``M M^T = A diag(g) (G_E o B B^T) diag(g) A^T`` (``o`` the
    entrywise product), or of its counterpart ``B^T diag(g) (G_E o A^T A) diag(g) B``; the smaller top
    eigenvalue's square root, certified, counts (theorem local-feedforward-curvature).  ``a_gram``, ``b_gram``:
    ``A^T A`` and ``B B^T`` when already formed; ``hadamards``: ``(e_gram * b_gram, e_gram * a_gram)`` when already
    formed (m x m products of intervals, the same for many calls)."""
    if hadamards is None:
        a_gram = A.swapaxes(0, 1).bmm(A) if a_gram is None else a_gram
        b_gram = B.bmm(B.swapaxes(0, 1)) if b_gram is None else b_gram
        hadamards = (e_gram * b_gram, e_gram * a_gram)
    sides = [(outer * g.expand(0), gram) for outer, gram in zip((A, B.swapaxes(0, 1)), hadamards)]   # (d, m), (m, m)
    found = [sandwich_top_bounds(*side) for side in sides]
    # the side estimated smaller first; the other is formed only where its certified lower bound does not already
    # pass the first's upper bound (then it could not be the smaller: the same float either way)
    first, second = sorted(range(2), key=lambda k: found[k][1])
    top = _sandwich_top(*sides[first])
    if not found[second][0] >= top:
        top = min(top, _sandwich_top(*sides[second]))
    return IntervalArray(max(top, 0.0)).sqrt().hi.item()


def _sandwich_top(scaled: IntervalArray, gram: IntervalArray) -> float:
    """Certified upper bound on ``lambda_max(S H S^T)`` for the enclosed ``S`` (d, m) and ``H`` (m, m)."""
    return lambda_max_upper(scaled.bmm(gram).bmm(scaled.swapaxes(0, 1)).to_enclosure())
