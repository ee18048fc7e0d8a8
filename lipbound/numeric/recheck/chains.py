"""A chain of maps at an exact input, re-checked: attention layers with their residual, LayerNorms or RMSNorms,
feed-forward blocks with their residual, one after the other (a whole post-norm layer, a stack of them).

The input and the direction are exact binary numbers; every later state is an interval per entry
(``mpmath.iv`` at the digits of :data:`CHAIN_PRECISIONS`, outward rounded).  A product by a weight matrix turns the
intervals into balls (an exact centre, a float radius) and multiplies the centre exactly
(:class:`~.exact.Ball`); everything else -- scores, softmax, the norms' scales, GELU -- runs on the intervals,
GELU's normal CDF and density enclosed first by the package's outward-rounded float64 bounds at the intervals'
float ends (:func:`lipbound.rigorous.elementwise.normal_cdf_bounds`, relative width near 1e-16), then, where the
enclosure comes out too wide, by the error function's series at a higher precision.  Forward pass and JVP are
written here from the maps' formulas; nothing of the float engine is reused.  Covered: softmax dot-product heads
without masks or position terms (BERT-type encoders), LayerNorm and RMSNorm, and the feed-forward blocks with the
exact GELU ``x Phi(x)``; anything else is refused by :func:`chain_gaps`.

Formulas (row convention, token x of width d, tangent e):

* attention head: ``S = c Q K^T``, ``P = softmax_rows(S)``, ``f = P V``; ``dS = c (dQ K^T + Q dK^T)``,
  ``dP = P o (dS - rowsum(P o dS))``, ``df = dP V + P dV``; the layer ``[f^h] W_O + b_O + X``;
* norm: ``y = gamma o u / s + beta``, ``u = Pi x`` (centred for LayerNorm), ``s = (||u||^2 / d + eps)^(1/2)``;
  ``dy = gamma o (du / s - u (u . du) / (d s^3))``;
* feed-forward: ``y = x + GELU(x W_1 + b_1) W_2 + b_2``, ``GELU(h) = h Phi(h)``, ``GELU'(h) = Phi(h) + h phi(h)``.
"""

from __future__ import annotations

import mpmath
import numpy as np
from mpmath.libmp import ComplexResult

from ...errors import NotCertifiedError
from ...rigorous.elementwise import normal_cdf_bounds, normal_pdf_bounds
from ...rigorous.functions import erf
from ...rigorous.intervals import IV, lower, precision, upper
from ..kernels import DotProduct
from ..kernels.masks import AttentionMask
from ..model import FeedForward, Layer
from ..normalization import Normalization
from .exact import Ball, Dyadic
from .maps import softmax_row, softmax_tangent
from .scores import score_scale

__all__ = ["CHAIN_PRECISIONS", "CHAIN_WIDTH", "DIGITS_PER_BLOCK", "ERF_SERIES_TO", "chain_gaps",
           "chain_directional_norm"]

#: ``(decimal digits, GELU's normal CDF by the error function's series)`` tried in turn: the package's float64 bounds
#: of the CDF (relative width 1e-16) serve a block at 20 digits in about 10 CPU s on MiniLM; a stack's intervals
#: widen through the blocks past what 1e-16 leaves (7-8 digits a block), and the series at the working precision
#: costs about four times as much
CHAIN_PRECISIONS = ((20, False), (40, True), (80, True))
#: GELU's error function by its series up to this argument (its tail bound beyond 6 is about e^(-36) wide, which a
#: re-check at 40 digits cannot afford); beyond it the tail bound's width e^(-x^2) is below 1e-86
ERF_SERIES_TO = 14
#: digits the intervals lose per block (attention, norms, feed-forward), measured on MiniLM's six layers at 80 digits:
#: 7-8; a precision with the series is tried only when it holds this many per block and 10 more, the float64 CDF
#: bounds (16 digits, 2-3 lost in the block they enter) for one block only, the last precision always
DIGITS_PER_BLOCK = 8
#: the widest enclosure accepted, relative (a witness needs a few digits; the verdict's float allowance is 1e-9)
CHAIN_WIDTH = 1e-9


def chain_gaps(maps) -> str:
    """What of ``maps`` (``(kind, target)`` pairs) the re-check cannot follow ('' when it covers them all)."""
    for kind, target in maps:
        if kind == "attention":
            if not isinstance(target, Layer) or not target.residual:
                return "an attention map other than a layer with its residual"
            for head in target.heads:
                if not isinstance(head.kernel, DotProduct) or not head.kernel.weights().normalised \
                        or head.mask != AttentionMask() or head.kim_values:
                    return f"head {head.name or '?'}: only softmax dot-product heads without masks are re-checked"
        elif kind == "norm":
            if not isinstance(target, Normalization):
                return f"a norm of type {type(target).__name__}"
        elif kind == "feedforward":
            if not isinstance(target, FeedForward) or target.act != "gelu":
                return "a feed-forward block other than the exact GELU's"
        else:
            return f"a {kind} map"
    return ""


def _exact(array: np.ndarray) -> np.ndarray:
    return Dyadic.of(array).intervals()


class _Weights:
    """A float matrix, exact, multiplied into interval rows through balls (``|W|`` is exact in floats)."""

    def __init__(self, W: np.ndarray):
        self.exact, self.absolute = Dyadic.of(W), np.abs(W)

    def times(self, values: np.ndarray) -> np.ndarray:
        return Ball.of_intervals(values).matmul_exact(self.exact, self.absolute).intervals()


def _rows(values: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    return values if bias is None else values + _exact(bias)[None, :]


def _attention(layer: Layer, cache: dict, X: np.ndarray, E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    heads_out, heads_tangent = [], []
    for h, head in enumerate(layer.heads):
        W_Q, W_K, W_V = (cache.setdefault((id(layer), h, key), _Weights(matrix))
                         for key, matrix in (("Q", head.W_Q), ("K", head.W_K), ("V", head.V)))
        Q, K, V = _rows(W_Q.times(X), head.b_Q), _rows(W_K.times(X), head.b_K), _rows(W_V.times(X), head.b_V)
        dQ, dK, dV = W_Q.times(E), W_K.times(E), W_V.times(E)
        c = score_scale(head.kernel, head.d_k)
        S = (Q @ K.T) * c
        dS = (dQ @ K.T + Q @ dK.T) * c
        P = np.array([softmax_row(list(row)) for row in S], dtype=object)
        heads_out.append(P @ V)
        heads_tangent.append(softmax_tangent(P, dS) @ V + P @ dV)
    W_O = cache.setdefault((id(layer), "O"), _Weights(layer.W_O))
    out = _rows(W_O.times(np.concatenate(heads_out, axis=1)), layer.b_O) + X
    return out, W_O.times(np.concatenate(heads_tangent, axis=1)) + E


def _norm(norm: Normalization, X: np.ndarray, E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = X.shape[1]
    gamma, centre = _exact(norm.gamma), _exact(np.broadcast_to(norm.center, (d,)))
    eps = IV.mpf(float(norm.eps))
    out, tangent = np.empty_like(X), np.empty_like(E)
    for i in range(X.shape[0]):
        u, du = X[i], E[i]
        if norm.centred:
            u, du = u - IV.fsum(u) / d, du - IV.fsum(du) / d
        s = IV.sqrt(IV.fsum(v ** 2 for v in u) / d + eps)
        inner = IV.fsum(a * b for a, b in zip(u, du))
        out[i] = gamma * u / s + centre
        tangent[i] = gamma * (du / s - u * inner / (d * s ** 3))
    return out, tangent


def _feedforward(ffn: FeedForward, cache: dict, X: np.ndarray, E: np.ndarray, series: bool) \
        -> tuple[np.ndarray, np.ndarray]:
    W_1 = cache.setdefault((id(ffn), 1), _Weights(ffn.W_1))
    W_2 = cache.setdefault((id(ffn), 2), _Weights(ffn.W_2))
    H, dH = _rows(W_1.times(X), ffn.b_1), W_1.times(E)
    cdf, pdf = _normal_series(H) if series else _normal_on(H)
    return _rows(W_2.times(H * cdf), ffn.b_2) + X, W_2.times((cdf + H * pdf) * dH) + E


def _normal_on(H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Phi`` and ``phi`` over each interval of H: the package's outward-rounded float64 bounds at the interval's
    float ends (Phi increases; phi increases below 0 and decreases above, and is largest at 0)."""
    a = np.array([lower(h) for h in H.ravel()])
    b = np.array([upper(h) for h in H.ravel()])
    cdf_lo, _ = normal_cdf_bounds(a)
    _, cdf_hi = normal_cdf_bounds(b)
    (pdf_a_lo, pdf_a_hi), (pdf_b_lo, pdf_b_hi) = normal_pdf_bounds(a), normal_pdf_bounds(b)
    pdf_lo = np.minimum(pdf_a_lo, pdf_b_lo)
    pdf_hi = np.where((a <= 0) & (b >= 0), normal_pdf_bounds(np.zeros(1))[1][0], np.maximum(pdf_a_hi, pdf_b_hi))
    cdf = np.array([IV.mpf([lo, hi]) for lo, hi in zip(cdf_lo, cdf_hi)], dtype=object).reshape(H.shape)
    pdf = np.array([IV.mpf([lo, hi]) for lo, hi in zip(pdf_lo, pdf_hi)], dtype=object).reshape(H.shape)
    return cdf, pdf


def _normal_series(H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Phi`` and ``phi`` over each interval of H at the working precision (the error function's series)."""
    root2, root2pi = IV.sqrt(IV.mpf(2)), IV.sqrt(2 * IV.pi)
    cdf = np.array([(1 + erf(h / root2, tail_from=ERF_SERIES_TO)) / 2 for h in H.ravel()],
                   dtype=object).reshape(H.shape)
    pdf = np.array([IV.exp(-h ** 2 / 2) / root2pi for h in H.ravel()], dtype=object).reshape(H.shape)
    return cdf, pdf


def _enclosure(maps, X: np.ndarray, E: np.ndarray, series: bool) -> tuple[float, float]:
    direction = _exact(E)
    values, tangent, cache = _exact(X), direction, {}
    for kind, target in maps:
        if kind == "attention":
            values, tangent = _attention(target, cache, values, tangent)
        elif kind == "norm":
            values, tangent = _norm(target, values, tangent)
        else:
            values, tangent = _feedforward(target, cache, values, tangent, series)
    ratio = IV.sqrt(IV.fsum(t ** 2 for t in tangent.ravel())) / IV.sqrt(IV.fsum(v ** 2 for v in direction.ravel()))
    return lower(ratio), upper(ratio)


def chain_directional_norm(maps, X: np.ndarray, E: np.ndarray) -> tuple[float, float]:
    """A rigorous enclosure ``(lower, upper)`` of ``||DF(X)[E]||_F / ||E||_F`` for the chain ``maps`` (``(kind,
    target)`` pairs, :func:`chain_gaps` empty) at the exact float input X (n, d) along E (n, d).

    Intervals widen from map to map (each entry's interval forgets how it depends on the others): the precisions
    of :data:`CHAIN_PRECISIONS` are tried in turn until the enclosure is at most :data:`CHAIN_WIDTH` wide
    (relative); :class:`~lipbound.errors.NotCertifiedError` when none is.
    """
    X, E = np.asarray(X, dtype=np.float64), np.asarray(E, dtype=np.float64)
    blocks = sum(kind == "attention" for kind, _ in maps)
    for dps, series in CHAIN_PRECISIONS:
        enough = dps >= DIGITS_PER_BLOCK * blocks + 10 if series else blocks == 1
        if not enough and dps < CHAIN_PRECISIONS[-1][0]:
            continue   # (a choice of work: too few digits for this many blocks, measured)
        with precision(int(dps * 3.3219280948873626) + 8), mpmath.workdps(dps):
            try:
                low, high = _enclosure(maps, X, E, series)
            except (ZeroDivisionError, ValueError, OverflowError, ComplexResult):   # past a root or a pole
                continue
        if 0 < low and high <= low * (1 + CHAIN_WIDTH):
            return low, high
    raise NotCertifiedError("witness", f"an enclosure within {CHAIN_WIDTH:g} (relative)",
                            f"wider at {CHAIN_PRECISIONS[-1][0]} digits", "re-check a shorter chain")
