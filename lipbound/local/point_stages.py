"""The stages of the per-candidate passes: a batch of float points with certified radii through one stage.

An edited sentence is a point, so only the rounding of its evaluation needs enclosing.  Each is carried,
vectorised over a chunk of candidates, as a float point ``X~`` (n, d) and per token a radius ``rho_i`` with the
exact hidden state within ``rho_i`` of ``x~_i`` (Euclidean): stage by stage (the attention block ``X + MHA(X)``, the
LayerNorm, the residual feed-forward block, the output LayerNorm) the stage is evaluated at the point in
interval arithmetic (:class:`~lipbound.rigorous.arrays.IntervalArray`, outward rounded), its midpoint is
the next point, and the next radius is the enclosure's own radius plus a certified Lipschitz bound of
the stage on the balls ``B(x~_i, rho_i)`` times the radii (:func:`attention_radii`, :func:`chain_radii`,
:func:`norm_radii`; docs/mathematics.md, "Point passes").  The bounds follow the stages' local behaviour at
the point: the attention block's query path through the key-value covariance of each row, the LayerNorm,
feed-forward block and output LayerNorm as one chain through the slopes GELU' at the point (a Frobenius norm
from a slope Gram matrix).  The matrix products and the LayerNorms' sums are exact (``exact_sums`` of
:meth:`~lipbound.rigorous.arrays.IntervalArray.matmul` and ``sum``), so an evaluation at a point adds radii of
about 1e-15 of the values instead of ``k u |x| |W|``; the products by ``W_O`` and ``W_2`` carry the rounding
before them as a ball (``||W||_2 ||rad||``).  The attention block's two Gram forms (the key path's output-space
norms and the query part's key-value covariance) are evaluated in floats with their rounding and the boxes' radii
bounded a posteriori (:mod:`lipbound.local.rounded_grams`, lemma float-gram), a third of the interval forms'
time.  On all-MiniLM-L6-v2 the radii grow about 350-fold per layer (attention block 21-34, chain 6-18 per token by
reference slopes), about 100-fold with ``exact_chain`` (chain 4-5), where the global-type factors of the stages
gave 1e4 and interval arithmetic's entrywise ``|W|`` 1e6.

:mod:`lipbound.local.candidates` runs the passes and turns them into bounds on the movement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

import numpy as np

from ..numeric.attention import AttentionMap
from ..rigorous.arrays import IntervalArray, gelu, gelu_with_slopes, softmax
from ..rigorous.batched import spectral_norms_upper
from ..rigorous.elementwise import SMALLEST_SUBNORMAL, gamma_bound, inv_sqrt_2pi
from ..rigorous.linalg import spectral_norm_upper
from .bounds import _column_norms, attention_norms, feedforward_global
from .enclosed import EnclosedNorm, inverse_sqrt, kept_per_block
from .rounded_grams import block_majorants, key_path_squares, query_squares
from .scores import ScoreNorms

__all__ = ["PointStates", "attention_radii", "norm_radii", "feedforward_radii", "chain_radii", "SlopeReference"]


@final
@dataclass(frozen=True)
class PointStates:
    """A batch of hidden states known to lie in token balls: the exact state of token i of sentence b is
    within ``radii[b, i]`` of the float point ``points[b, i]`` (Euclidean norm)."""

    points: np.ndarray
    radii: np.ndarray

    @classmethod
    def from_enclosure(cls, X: IntervalArray, radii: np.ndarray | float = 0.0) -> PointStates:
        """The midpoint of an enclosure, its radius (per token, bounded in the l2 norm) plus ``radii``."""
        rounding = (X - IntervalArray(X.mid)).norm_upper()
        return cls(X.mid, (IntervalArray(rounding) + IntervalArray(np.asarray(radii, dtype=np.float64))).hi)


def _ball_product(A: IntervalArray, W: np.ndarray, W_norm: float) -> tuple[IntervalArray, np.ndarray]:
    """``a W`` for every row ``a`` of the box A (..., k): the exactly summed product at A's midpoint, enclosed,
    and per row the ball radius ``||W||_2 ||a - mid||_2 <= W_norm ||rad||_2`` of the rest.  Interval arithmetic's
    ``rad |W|`` grows a rounding-sized radius by the entrywise ``|W|``, about ``sqrt(k)`` times ``||W||_2`` for
    a dense matrix: the rounding of the previous operations is carried as a ball instead."""
    rest = IntervalArray(W_norm) * IntervalArray(IntervalArray(A.rad).norm_upper())
    return IntervalArray(A.mid).matmul(W, exact_sums=True), rest.hi


def _head_stack(engine: AttentionMap, part: int) -> np.ndarray:
    """``W_Q`` (part 0) or ``W_K`` (part 1) of every head, (H, d, d_k)."""
    return np.stack([engine.head_weights(h)[part] for h in range(engine.H)])


def _gram_norms(vectors: IntervalArray, weights: np.ndarray) -> np.ndarray:
    """Upper bounds on ``||W^h y||`` for vectors y (B, H, n, d_k) and per-head W^h (H, d, d_k), through the
    enclosed Gram matrices ``W^hT W^h`` (d_k x d_k: no d-dimensional product per vector)."""
    exact = IntervalArray(weights)
    gram = exact.swapaxes(1, 2).bmm(exact)                                                      # (H, d_k, d_k)
    return (vectors.bmm(gram) * vectors).sum(axis=-1).clip_below(0.0).sqrt().hi


def _query_covariance(engine: AttentionMap, P: IntervalArray, K: IntervalArray, V: IntervalArray, F: IntervalArray,
                      moved: IntervalArray, gaps: IntervalArray, drift: IntervalArray, c, query_norms) -> np.ndarray:
    """Upper bounds (B, H, n) on ``||W_Q^h Cbar^h_i||`` for the query part of the score path of lemma point-attention:
    ``Cbar_i = c int_0^1 sum_j p_ij(t) k~_j (v~_j - phi_i(t))^T dt`` (d_k x d_v), so that the part is
    ``(y_i - x~_i) W_Q^h Cbar_i``.  At the point ``C~_i = c sum_j p~_ij k~_j (v~_j - f~_i)^T`` (keys and values move
    together: no triangle inequality over j) and ``||W_Q^h C~_i||_F^2 = c^2 sum_jl p~_ij p~_il (k~_j W_Q^hT W_Q^h k~_l)
    (v~_j - f~_i).(v~_l - f~_i)`` (Gram matrices of the keys and values, (n, n) per head: no d_k x d_v matrix per
    row; in floats with the rounding bounded a posteriori, :func:`~lipbound.local.rounded_grams.query_squares`); as
    ``sum_j p_ij(t) (v~_j - phi_i(t)) = 0`` the keys may be centred on any fixed ``kappa_i`` (the mean key
    at the point), so
    ``||Cbar_i - C~_i||_F <= c sum_j ||k~_j - kappa_i|| (dp_ij (||v~_j - f~_i|| + drift_i) + p~_ij drift_i)`` and
    ``||W_Q^h Cbar_i|| <= ||W_Q^h C~_i||_F + ||W_Q^h|| ||Cbar_i - C~_i||_F``."""
    exact = IntervalArray(_head_stack(engine, 0))
    squares = query_squares(K, V, F, P, exact.swapaxes(1, 2).bmm(exact))       # in floats, lemma float-gram
    at_point = IntervalArray(np.maximum(squares, 0.0)).sqrt() * c
    kappa = IntervalArray(P.einsum("bhij,bhjk->bhik", K).mid)
    spread = (K.expand(2) - kappa.expand(3)).norm_upper()                                        # (B, H, i, j)
    change = (IntervalArray(spread) * (moved * (gaps + drift) + IntervalArray(P.hi) * drift)).sum(axis=-1) * c
    return (at_point + IntervalArray(query_norms)[None, :, None] * change).hi


#: id(engine) -> (engine, W_O's head blocks W_O^h W_O^gT, W_K's W_K^hT W_K^g), enclosed, (H, ., H, .), and their
#: majorants (:func:`~lipbound.local.rounded_grams.block_majorants`).
_HEAD_GRAMS: dict = {}


def _head_block_grams(engine: AttentionMap) -> tuple[IntervalArray, IntervalArray, tuple]:
    """``Omega_hg = W_O^h W_O^gT`` (d_v x d_v) and ``Psi_hg = W_K^hT W_K^g`` (d_k x d_k) for every pair of heads,
    enclosed, and their :func:`~lipbound.local.rounded_grams.block_majorants`, once per layer: the inner products of
    the key path's vectors in d dimensions from head-sized ones."""
    entry = _HEAD_GRAMS.get(id(engine))
    if entry is None or entry[0] is not engine:
        if len(_HEAD_GRAMS) >= 16:
            _HEAD_GRAMS.clear()
        H, d_v, d_k = engine.H, engine.d_v, engine.d_k
        keys = np.concatenate([engine.head_weights(h)[1] for h in range(H)], axis=1)      # (d, H d_k)
        outputs = IntervalArray(engine.W_O).bmm(IntervalArray(np.ascontiguousarray(engine.W_O.T)))
        products = IntervalArray(np.ascontiguousarray(keys.T)).bmm(IntervalArray(keys))
        Omega, Psi = outputs.reshape(H, d_v, H, d_v), products.reshape(H, d_k, H, d_k)
        entry = _HEAD_GRAMS[id(engine)] = (engine, Omega, Psi, block_majorants(Omega, Psi))
    return entry[1], entry[2], entry[3]


def _key_path_norms(engine: AttentionMap, Q: IntervalArray, V: IntervalArray, F: IntervalArray, P: IntervalArray,
                    c) -> np.ndarray:
    """Upper bounds (B, n, n) on ``||N_ij||_F`` for the key path in the output space (lemma point-attention),
    ``N_ij = c sum_h p~^h_ij (W_K^h q~^h_i) (v~^h_j - f~^h_i) W_O^h`` (d x d, rank at most H), the map from a move
    ``e_j`` of token j to its first-order key-path change of output i, heads and ``W_O`` together:
    ``||N_ij||_F^2 = c^2 sum_hg p_h p_g (u_h . u_g) (y_h . y_g)`` with ``u_h = W_K^h q~^h_i`` and ``y_h = (v~^h_j -
    f~^h_i) W_O^h``: Gram matrices over the heads (H x H per pair), no d x d matrix; ``u_h . u_g = q~^h Psi_hg q~^gT``
    and ``y_h . y_g`` likewise through ``Omega`` (:func:`_head_block_grams`), head-sized products only, evaluated in
    floats with the rounding and the boxes' radii bounded a posteriori
    (:func:`~lipbound.local.rounded_grams.key_path_squares`, lemma float-gram)."""
    Omega, Psi, majorants = _head_block_grams(engine)    # (H, d_v, H, d_v), (H, d_k, H, d_k), enclosed; (H, H)
    squares = key_path_squares(Q, V, F, P, Omega, Psi, majorants)
    return (IntervalArray(np.maximum(squares, 0.0)).sqrt() * c).hi


def attention_radii(engine: AttentionMap, X: PointStates, output_norm: float | None = None) -> PointStates:
    """``Z = X + MHA(X)`` of a batch (B, n, d) given in balls: the enclosure at the points, and per token

    ``rho'_i = rho_i + ||W_O|| (sum_h delta_hi^2)^(1/2) + (the enclosure's radius)``,
    ``delta_hi = ||V^h|| sum_j p+_ij rho_j + sum_j p+_ij sigma_ij (||v~_j - f~_i|| + sum_l |dp|_il ||v~_l - f~_i||)``

    (lemma point-attention, docs/mathematics.md): at the points ``|s_ij(Y) - s_ij(X~)| <= sigma_ij =
    c (a_j rho_i + b_i rho_j + g rho_i rho_j)`` (theorem local-score: ``a_j = ||W_Q^h k~_j||``,
    ``b_i = ||W_K^h q~_i||``, ``g = ||W_Q^h W_K^hT||``); along ``p(t) = softmax(s~ + t ds)``,
    ``|p_ij(t) - p~_ij| <= |dp|_ij = p~_ij (u_ij m_i + sum_l p~_il u_il)`` with ``u = sigma e^sigma``,
    ``m_i = 1 + sum_l p~_il u_il`` (Jensen's inequality below, ``e^x - 1 <= x e^x`` above) and
    ``p+ = p~ + |dp|``; the value shift ``sum_j p_ij(1) (v_j - v~_j)`` and the integral of
    ``sum_j p_ij(t) ds_ij (v~_j - sum_l p_il(t) v~_l)`` give the two terms.  An unmasked dot-product layer
    with ``W_O`` (BERT's), as an :class:`~lipbound.numeric.attention.AttentionMap` of the layer with its residual
    (kept across calls: its matrices are split once for the exactly summed products of
    :meth:`~lipbound.rigorous.arrays.IntervalArray.matmul`); ``output_norm``: a certified ``||W_O||`` if known.
    Per token the smaller of this and the same with the key path's first-order term in the output space
    (:func:`_key_path_norms`: ``sum_j rho_j ||N_ij||_F``, the rest of the key term per head); the product by ``W_O``
    carries the rounding before it as a ball (:func:`_ball_product`).  For large score deviations the weights'
    moves, the values' part and each row's score part also take bounds linear in ``sigma`` (:func:`_weight_moves`)."""
    B, n = X.points.shape[:2]
    points = IntervalArray(X.points)
    projected = points.matmul(engine.W, exact_sums=True) + IntervalArray(engine.bias)
    Q, K, V = (engine.per_head(projected, part) for part in ("queries", "keys", "values"))   # (B, H, n, .)
    c = inverse_sqrt(engine.d_k)
    P = softmax(Q.einsum("bhik,bhjk->bhij", K) * c, np.ones(n))
    F = P.einsum("bhij,bhjv->bhiv", V)
    merged = F.swapaxes(1, 2).reshape(B, n, engine.H * engine.d_v)
    output_norm = output_norm or spectral_norm_upper(engine.W_O)
    mixed, mixed_rounding = _ball_product(merged, engine.W_O, output_norm)
    Z = mixed + IntervalArray(engine.b_O) + points
    norms = attention_norms(engine)
    g = np.array([ScoreNorms._offset_norm(engine.heads[h], *engine.head_weights(h)[:2], None) for h in range(engine.H)])
    a, b = (_gram_norms(vectors, _head_stack(engine, part)) for vectors, part in ((K, 0), (Q, 1)))    # (B, H, n)
    rho = IntervalArray(X.radii)[:, None]                                                        # (B, 1, n)
    sigma = (IntervalArray(a)[:, :, None, :] * rho[..., :, None] + IntervalArray(b)[..., None] * rho[..., None, :]
             + IntervalArray(g)[None, :, None, None] * rho[..., :, None] * rho[..., None, :]) * c   # (B, H, i, j)
    moved, total = _weight_moves(P, sigma)                                         # |p(Y) - p~|, ||p(Y) - p~||_1
    p_most = IntervalArray(P.hi) + moved
    squares = V.square().sum(axis=-1).expand(2) + F.square().sum(axis=-1).expand(3) \
        - F.einsum("bhiv,bhjv->bhij", V) * 2.0
    gaps = IntervalArray(squares.clip_below(0.0).sqrt().hi)                                      # ||v~_j - f~_i||
    drift = IntervalArray(np.minimum((moved * gaps).sum(axis=-1, keepdims=True).hi,             # (B, H, n, 1)
                                     (total * IntervalArray(np.max(gaps.hi, axis=-1, keepdims=True))).hi))
    keyed = (IntervalArray(b)[..., None] * rho[..., None, :]
             + IntervalArray(g)[None, :, None, None] * rho[..., :, None] * rho[..., None, :]) * c  # sigma - c a_j rho_i
    queried = (p_most * IntervalArray(a)[:, :, None, :] * (gaps + drift)).sum(axis=-1) * c      # (B, H, n)
    covariance = _query_covariance(engine, P, K, V, F, moved, gaps, drift, c, norms["W_Q"])
    query = IntervalArray(np.minimum(queried.hi, covariance))
    # the values' part: sum_j p_ij(1) ||v_j - v~_j|| with the weights summing to one, at most ||V|| max_j rho_j
    value = IntervalArray(norms["L_V"])[None, :, None] * IntervalArray(np.minimum(
        (p_most * rho[..., None, :]).sum(axis=-1).hi, np.max(X.radii, axis=-1)[:, None, None]))
    # the scores' part of a row at most max_j sigma_ij max_j ||v~_j - phi_i(t)|| (the weights sum to one)
    row = (total * IntervalArray(np.max((gaps + drift).hi, axis=-1, keepdims=True)))[..., 0]
    scored = query * rho[:, 0][:, None] + (p_most * keyed * (gaps + drift)).sum(axis=-1)
    delta = value + IntervalArray(np.minimum(scored.hi, row.hi))                                 # (B, H, n)
    heads = delta.square().sum(axis=1).sqrt()                                                    # (B, n)
    # the key path's first-order term in the output space, the rest of sigma's key part per head as above
    first = (IntervalArray(_key_path_norms(engine, Q, V, F, P, c)) * rho).sum(axis=-1)              # (B, n)
    rest = (IntervalArray(b)[..., None] * rho[..., None, :] * (moved * (gaps + drift) + IntervalArray(P.hi) * drift)
            ).sum(axis=-1) * c \
        + (p_most * IntervalArray(g)[None, :, None, None] * rho[..., :, None] * rho[..., None, :] * (gaps + drift)
           ).sum(axis=-1) * c
    split = value + query * rho[:, 0][:, None] + rest
    output_space = IntervalArray(output_norm) * split.square().sum(axis=1).sqrt() + first
    mixing = np.minimum((IntervalArray(output_norm) * heads).hi, output_space.hi)
    radii = IntervalArray(X.radii) + IntervalArray(mixed_rounding) + IntervalArray(mixing)
    return PointStates.from_enclosure(Z, radii.hi)


#: A row with a score deviation above this takes only the linear bounds of :func:`_weight_moves`: the exponential
#: bound is then far above them (``sigma e^sigma`` > 1e18) and its sums could overflow.
_LARGEST_EXPONENT = 40.0


def _weight_moves(P: IntervalArray, sigma: IntervalArray) -> tuple[IntervalArray, IntervalArray]:
    """How far the attention weights can move on the balls: per entry ``|p_ij(t) - p~_ij|`` (B, H, n, n) and per row
    ``||p_i(t) - p~_i||_1`` (B, H, n, 1), for every ``t`` in [0, 1] along ``softmax(s~ + t ds)`` with ``|ds_ij| <=
    sigma_ij`` (lemma point-attention, docs/mathematics.md).  Per entry the smaller of the exponential bound
    ``p~_ij (u_ij m_i + sum_l p~_il u_il)``, ``u = sigma e^sigma``, ``m_i <= 1 + sum_l p~_il u_il``, tight for small
    sigma, and the linear one ``max_l sigma_il / 2``; per row ``max_l sigma_il``: the weights' derivative
    ``p o (ds - p.ds)`` has l1 norm ``sum_l p_l |ds_l - p.ds|``, a mean absolute deviation of ``ds``, at most half
    its range ``2 max_l sigma_il``, and a change of weights sums to zero, so each entry is at most half its l1
    norm.  Rows with a deviation above :data:`_LARGEST_EXPONENT` take the linear bounds alone."""
    top = IntervalArray(np.max(sigma.hi, axis=-1, keepdims=True))                                # (B, H, n, 1)
    linear = (top * 0.5).hi
    tame = np.all(sigma.hi <= _LARGEST_EXPONENT, axis=-1, keepdims=True)
    bounded = IntervalArray(np.where(tame, sigma.lo, 0.0), np.where(tame, sigma.hi, 0.0))
    u = bounded * bounded.exp()
    p_hi = IntervalArray(P.hi)
    spread = (p_hi * u).sum(axis=-1, keepdims=True)
    exponential = np.where(tame, (p_hi * (u * (IntervalArray(1.0) + spread) + spread)).hi, np.inf)
    return IntervalArray(np.minimum(np.minimum(exponential, linear), 1.0)), IntervalArray(top.hi)


def norm_radii(norm, X: PointStates) -> PointStates:
    """A LayerNorm (or RMSNorm) of states in balls: ``z -> gamma sqrt(d) u / n(u) + beta`` with ``u = P z``,
    ``n(u) = (||u||^2 + d eps)^(1/2)``, whose Jacobian has norm at most ``max|gamma| sqrt(d) / n(u)``; on the
    ball ``||u|| >= ||P z~|| - rho``, so ``rho' = max|gamma| sqrt(d) rho / ((||P z~|| - rho)_+^2 + d eps)^(1/2)``
    plus the enclosure's radius at the point."""
    E = EnclosedNorm(norm, X.points, exact_sums=True)
    return PointStates.from_enclosure(E.output, (IntervalArray(np.array(norm.gamma_max)) * _normalised(E, X)).hi)


def _normalised(E: EnclosedNorm, X: PointStates) -> IntervalArray:
    """How far ``sqrt(d) u / n(u)`` moves on the balls: ``sqrt(d) rho / ((||P z~|| - rho)_+^2 + d eps)^(1/2)``."""
    rho = IntervalArray(X.radii)
    low = IntervalArray(np.maximum((IntervalArray(E.nu.lo) - rho).lo, 0.0))
    return E.root_d / (low.square() + E.delta).sqrt() * rho


def feedforward_radii(ffn, X: PointStates) -> PointStates:
    """``y + GELU(y W_1 + b_1) W_2 + b_2`` of states in balls: the enclosure at the points and
    ``rho' = (1 + max GELU' ||W_1|| ||W_2||) rho`` (:func:`~lipbound.local.bounds.feedforward_global`) plus its
    radius.  GELU at the points: mean-value form with the global slope range about the midpoints of their
    (rounding-only) pre-activations."""
    points = IntervalArray(X.points)
    hidden = gelu(points.matmul(ffn.W_1, exact_sums=True) + IntervalArray(ffn.b_1), global_slopes=True)
    output = points + hidden.matmul(ffn.W_2, exact_sums=True) + IntervalArray(ffn.b_2)
    return PointStates.from_enclosure(output, (IntervalArray(feedforward_global(ffn)) * IntervalArray(X.radii)).hi)


#: (ffn, gamma) -> the facts of :func:`_slope_gram` (:func:`~.enclosed.kept_per_block`)
_SLOPE_GRAMS: dict = {}


def _slope_gram(ffn, gamma: np.ndarray) -> tuple[IntervalArray, float, np.ndarray, float, float, tuple[float, float]]:
    """``G = (W_1^T diag(gamma)^2 W_1) o (W_2 W_2^T)`` (d_ff, d_ff), enclosed, with
    ``||diag(gamma) W_1 diag(s) W_2||_F^2 = s^T G s``; an upper bound on ``|| |G| ||_inf`` (>= ``|| |G| ||_2``,
    ``|G|`` symmetric), the column norms ``||diag(gamma) w_1k||``, a certified ``||W_2||``, an upper bound on
    ``|| |W_1| |W_2| ||_F`` (the error scale of products formed in floats) and the two bounds of
    :func:`_gram_center`; once per block."""
    def compute():
        scaled = IntervalArray(ffn.W_1) * IntervalArray(np.asarray(gamma, dtype=np.float64))[:, None]     # (d, d_ff)
        left = scaled.swapaxes(0, 1).bmm(scaled)
        right = IntervalArray(ffn.W_2).bmm(IntervalArray(np.ascontiguousarray(ffn.W_2.T)))
        G = left * right
        widest = float(np.max(IntervalArray(G.magnitude).sum(axis=-1).hi))
        absolute = IntervalArray(np.abs(ffn.W_1)).bmm(IntervalArray(np.abs(ffn.W_2)))
        return (G, widest, scaled.norm_upper(axis=0), spectral_norm_upper(ffn.W_2),
                float(IntervalArray(absolute.hi).square().sum(axis=-1).sum(axis=-1).sqrt().hi), _gram_center(G))
    return kept_per_block(_SLOPE_GRAMS, (ffn, gamma), compute)


def _curvature_top() -> float:
    """``max |GELU''| = 2 phi(0) = sqrt(2 / pi)`` (``GELU'' = phi (2 - x^2)``: at most ``2 phi(0)`` on ``x^2 <= 2``,
    and ``phi(x) (x^2 - 2) <= 2 phi(2) < 0.11`` beyond), rounded up."""
    return float(np.nextafter(2.0 * inv_sqrt_2pi()[1], np.inf))


@final
@dataclass(frozen=True)
class SlopeReference:
    """Reference slopes ``s0`` (n, d_ff) of a layer's feed-forward block, one vector per token position, with
    certified ``sigma0_i >= ||diag(gamma) (I + W_1 diag(s0_i) W_2)||_2`` (n,).  Any ``s0`` is sound (lemma
    point-chain: ``||diag(gamma) (I + W_1 diag(s) W_2)|| <= sigma0 + (the Frobenius norm of diag(gamma) W_1 diag(s -
    s0) W_2)``); the median over a batch of candidates keeps the difference small, since an edit moves most neurons
    of a token little."""

    slopes: np.ndarray
    spectral: np.ndarray

    @classmethod
    def of(cls, item, points: np.ndarray) -> SlopeReference:
        """The median slopes of the batch (B, n, d) of attention block outputs at each position, with their norms."""
        E = EnclosedNorm(item.ln_out, points, exact_sums=True)
        pre = IntervalArray(E.output.mid).matmul(item.ffn.W_1, exact_sums=True) + IntervalArray(item.ffn.b_1)
        slopes = np.median(gelu_with_slopes(pre)[1].mid, axis=0)                                  # (n, d_ff)
        return cls(slopes, _chain_spectral(item.ffn, item.ln_out.gamma, slopes))


def _gram_center(G: IntervalArray) -> tuple[float, float]:
    """For G's midpoint ``M`` (m, m): ``omega >= max_k ||(gamma_m |M| + rad G)_{:, k}||_2`` and ``max |M|``; for every
    ``G'`` in G and float vectors c, ``|c G' - fl(c M)| <= |c| (gamma_m |M| + rad G) + (m + 4) eta (3 + max|c| +
    max|M|)`` entrywise (Higham, eq. 3.13, and underflow as in the products of :mod:`lipbound.rigorous.arrays`), and
    ``|c| W <= ||c|| omega`` column by column (Cauchy-Schwarz).  Kept with G by :func:`_slope_gram`; the midpoint
    is formed again where it is used (a d_ff x d_ff matrix per block kept would add to the blocks' caches)."""
    mid = G.mid
    spread = IntervalArray(np.abs(mid)) * IntervalArray(gamma_bound(mid.shape[-1])) + IntervalArray(G.rad)
    return float(np.max(IntervalArray(spread.hi).norm_upper(axis=0))), float(np.max(np.abs(mid)))


def _frobenius_over_box(slope_gram: tuple, center: np.ndarray, spread: IntervalArray) -> IntervalArray:
    """``sup (s^T G s)^(1/2)`` over ``s`` in ``center +- spread`` (B, n, d_ff), for the slope Gram matrix G of
    ``slope_gram`` (:func:`_slope_gram`'s facts): ``s^T G s <= c^T G c + 2 r^T |G c| + ||r||^2 |||G|||``.  ``G c`` is
    one float product by G's midpoint, enclosed with the error bound of :func:`_gram_center`, ``||c|| omega`` per
    entry (3e-11 to 6.5e-9 of ``c^T G c`` at random slopes on all-MiniLM-L6-v2) instead of a second product by
    ``|G|``."""
    G, widest, (omega, top) = slope_gram[0], slope_gram[1], slope_gram[5]
    mid = G.mid
    m = mid.shape[-1]
    largest = float(np.max(np.abs(center), initial=0.0))
    underflow = IntervalArray(float((m + 4) * SMALLEST_SUBNORMAL)) * (IntervalArray(3.0 + largest) + IntervalArray(top))
    slack = IntervalArray(IntervalArray(center).norm_upper()) * IntervalArray(omega) + underflow       # (B, n)
    product = IntervalArray.around(np.matmul(center, mid), slack.hi[..., None])                 # G c, (B, n, d_ff)
    quadratic = (IntervalArray(center) * product).sum(axis=-1) \
        + (IntervalArray(product.magnitude) * spread).sum(axis=-1) * 2.0 \
        + spread.square().sum(axis=-1) * IntervalArray(widest)
    return quadratic.clip_below(0.0).sqrt()


#: Power steps placing the Cholesky level of a chain's norm: with 12, 6% of MiniLM's chain matrices failed the first
#: level (the retries, one matrix at a time, doubled the certification's time, and the raised level was up to 2.2%
#: above the norm); with 30 none failed and every bound was within 0.1%.
CHAIN_POWER_STEPS = 30


def _chain_spectral(ffn, gamma: np.ndarray, slopes: np.ndarray, group: int = 8) -> np.ndarray:
    """Certified ``||diag(gamma) (I + W_1 diag(c) W_2)||_2`` for every slope vector c (..., d_ff) (taken exactly): the
    matrix formed in floats, its norm certified by :func:`~lipbound.rigorous.batched.spectral_norms_upper`, plus the
    Frobenius norm of the forming's error, at most ``gamma_{d_ff + 4} max|gamma| (sqrt(d) + 2 max|c| || |W_1| |W_2|
    ||_F)`` (Higham, eq. 3.13, for the product and the three roundings around it; Weyl).  One d x d_ff x d product
    per vector: the exact route of lemma point-chain, for passes that must go deep."""
    absolute = _slope_gram(ffn, gamma)[4]
    d, d_ff = ffn.W_1.shape
    flat = slopes.reshape(-1, d_ff)
    gammas = np.asarray(gamma, dtype=np.float64)
    largest = (IntervalArray(float(np.max(np.abs(flat), initial=0.0))) * IntervalArray(absolute) * 2.0
               + IntervalArray(np.sqrt(float(d))).hull(IntervalArray(np.nextafter(np.sqrt(float(d)), np.inf))))
    error = (IntervalArray(gamma_bound(d_ff + 4)) * IntervalArray(float(np.max(np.abs(gammas)))) * largest).hi.item()
    out = np.empty(flat.shape[0])
    for begin in range(0, flat.shape[0], group):
        part = flat[begin:begin + group]
        M = np.matmul(ffn.W_1[None] * part[:, None, :], ffn.W_2)                             # (g, d, d)
        M[:, np.arange(d), np.arange(d)] += 1.0
        M *= gammas[None, :, None]
        norms = spectral_norms_upper(M, steps=CHAIN_POWER_STEPS)
        out[begin:begin + group] = (IntervalArray(norms) + IntervalArray(error)).hi
    return out.reshape(slopes.shape[:-1])


def chain_radii(item, X: PointStates, reference: SlopeReference | None = None, exact: bool | Sequence[int] = False,
                plain=None) -> PointStates:
    """The LayerNorm, the residual feed-forward block and the output LayerNorm of a layer, ``z -> N_2(f(N_1(z)))``,
    of attention block outputs in balls, through the block's local behaviour at the points (lemma point-chain,
    docs/mathematics.md).  With ``N_1(z) = gamma o nhat(z) + beta``, ``nhat(z) = sqrt(d) u / n(u)``:

    ``rho_f = (s_n rho + r_1 / min|gamma|) sup_s ||diag(gamma) (I + W_1 diag(s) W_2)|| + (the enclosure's radius)``

    ``s_n = sqrt(d) / ((||P z~|| - rho)_+^2 + d eps)^(1/2)`` the Lipschitz bound of ``nhat`` on the ball, ``r_1`` the
    rounding of the LayerNorm at the point (a move ``delta = gamma o (delta / gamma)`` of its output), ``s`` over the
    box of GELU' on the segment (its value at the pre-activations' midpoints
    :func:`~lipbound.rigorous.arrays.gelu_with_slopes`, plus ``max|GELU''|`` times how far a pre-activation can be:
    ``rad + s_n rho ||diag(gamma) w_1k|| + r_1 ||w_1k||``), and the norm bounded by the smaller of ``sigma0 + sup_s
    ((s - s0)^T G (s - s0))^(1/2)`` for the reference slopes ``s0`` of the token's position (:class:`SlopeReference`,
    by default the batch's own median; a Frobenius norm of the difference only) and ``max|gamma| + sup_s (s^T G
    s)^(1/2)`` (for the tokens ``plain`` only, all by default), with ``G`` of :func:`_slope_gram`.  Per token the
    smaller of this and the product of the stages' bounds (:func:`norm_radii`, :func:`feedforward_radii`), then
    :func:`norm_radii` of the output LayerNorm; the rounding of the product by ``W_2`` is carried as a ball
    (:func:`_ball_product`).  ``exact``: the norm at the slopes' centre certified in full as well
    (:func:`_chain_spectral`) for every token (True) or for the tokens it lists."""
    norm, ffn = item.ln_out, item.ffn
    if reference is None and exact is not True:
        reference = SlopeReference.of(item, X.points)
    E = EnclosedNorm(norm, X.points, exact_sums=True)
    moved = _normalised(E, X)                                                                   # ||nhat(z) - nhat(z~)||
    Y = PointStates.from_enclosure(E.output)
    points = IntervalArray(Y.points)
    pre = points.matmul(ffn.W_1, exact_sums=True) + IntervalArray(ffn.b_1)
    hidden, slopes = gelu_with_slopes(pre)
    slope_gram = _slope_gram(ffn, norm.gamma)
    widest, scaled_columns, down_norm = slope_gram[1:4]
    lowered, lowered_rounding = _ball_product(hidden, ffn.W_2, down_norm)
    output = points + lowered + IntervalArray(ffn.b_2)
    rounding = IntervalArray(Y.radii)
    reach = IntervalArray(pre.rad) + moved.expand(-1) * IntervalArray(scaled_columns) \
        + rounding.expand(-1) * IntervalArray(_column_norms(ffn))
    spread = IntervalArray((IntervalArray(slopes.rad) + IntervalArray(_curvature_top()) * reach).hi)
    gammas = np.abs(np.asarray(norm.gamma, dtype=np.float64))
    top = IntervalArray(float(np.max(gammas)))
    tokens = np.arange(X.points.shape[1]) if plain is None or reference is None else np.asarray(plain, dtype=int)
    bound = np.full(X.radii.shape, np.inf)                   # sup ||diag(gamma) (I + W_1 diag(s) W_2)||, per token
    bound[:, tokens] = (top + _frobenius_over_box(slope_gram, slopes.mid[:, tokens], spread[:, tokens])).hi
    if reference is not None:
        offset = IntervalArray(slopes.mid) - IntervalArray(reference.slopes)                      # c - s0, enclosed
        around = IntervalArray(reference.spectral) + _frobenius_over_box(slope_gram, offset.mid, spread + offset.rad)
        bound = np.minimum(bound, around.hi)
    if exact is not False:   # the norm at the slopes' centre in full, the box about it in Frobenius norm
        chosen = slice(None) if exact is True else np.asarray(exact, dtype=int)
        at_center = IntervalArray(_chain_spectral(ffn, norm.gamma, slopes.mid[:, chosen])) \
            + (spread[:, chosen].square().sum(axis=-1) * IntervalArray(widest)).sqrt()
        bound[:, chosen] = np.minimum(bound[:, chosen], at_center.hi)
    factor = IntervalArray(bound)
    global_ffn = IntervalArray(feedforward_global(ffn))
    local = (moved * factor + rounding * global_ffn).hi
    if np.min(gammas) > 0:
        local = np.minimum(local, ((moved + rounding / IntervalArray(float(np.min(gammas)))) * factor).hi)
    stages = (moved * top + rounding) * global_ffn
    radii = (IntervalArray(np.minimum(local, stages.hi)) + IntervalArray(lowered_rounding)).hi
    return norm_radii(item.ffn_norm, PointStates.from_enclosure(output, radii))
