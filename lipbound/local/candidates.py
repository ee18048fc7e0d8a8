"""Certified per-candidate passes: every edited sentence of a replacement set pushed through the layers.

For a replacement at positions p_1..p_k by any of the candidate words of each slot (every combination:
a k = 1 set over the whole vocabulary, or a k = 2 set over a sample), each edited sentence
is evaluated in interval arithmetic (:class:`~lipbound.rigorous.arrays.IntervalArray`, outward
rounded), vectorised over a chunk of candidates: embeddings, the attention block ``X + MHA(X)``, the
LayerNorm, the residual feed-forward block and the output LayerNorm, layer after layer.  At layer l the
identity matching of the original tokens with the edited ones is a transport plan, so

``W1(mu_l, mu_l(w)) <= (1/n) sum_i max_{z in [z_i(w)]} ||z_i - z_i^0||``

for the original outputs ``z^0`` (the reference points of :class:`~lipbound.local.propagate.LayerSet`)
and the enclosures ``[z_i(w)]``; the largest over the candidates bounds the whole set (theorem
local-coupling with radii of rounding only).  Unlike the set route of :mod:`lipbound.local.propagate`,
nothing is relaxed: the only loss is the growth of the enclosures of rounding, which interval arithmetic
multiplies by about ``|W|`` at every linear map (about 1e3 per layer on all-MiniLM-L6-v2).  A layer
whose enclosure cannot be formed (a softmax denominator or a LayerNorm scale no longer bounded away from
zero) or is wider than ``widest`` ends the passes: that layer and the later ones are left to the set route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from ..numeric.attention import AttentionMap
from ..numeric.model import Model
from ..rigorous.arrays import IntervalArray, gelu
from .enclosed import EnclosedNorm, inverse_sqrt, softmax

__all__ = ["CandidatePasses", "candidate_passes", "attention_block", "feedforward_stage", "MOST_SENTENCES"]

#: The most edited sentences one set's passes evaluate (about 10 CPU-ms each for two layers at n = 8-9).
MOST_SENTENCES = 1 << 17


@final
@dataclass(frozen=True)
class CandidatePasses:
    """Per-sentence certified W1 bounds of a replacement set (every combination of the slots' candidates).

    Attributes
    ----------
    words : ndarray of int, shape (K, k)
        The word ids of every edited sentence, one column per slot.
    bounds : dict
        ``bounds[l]`` (K,): certified upper bound on the W1 movement of the attention block of layer l
        under each edited sentence, for every layer the passes reached.
    widths : dict
        ``widths[l]``: the largest rounding radius ``max_i max ||[z_i] - mid||`` over the candidates at layer l.
    stopped : str
        Why the passes ended before the last layer asked for ("" when they reached it).
    """

    words: np.ndarray
    bounds: dict
    widths: dict
    stopped: str

    def largest(self, layer: int) -> float:
        """The set's certified bound at ``layer`` (NaN when the passes did not reach it)."""
        return float(np.max(self.bounds[layer])) if layer in self.bounds else float("nan")


def attention_block(layer, X: IntervalArray) -> IntervalArray:
    """``X + MHA(X)`` of a batch of sentences (B, n, d), enclosed (an unmasked dot-product layer)."""
    engine = AttentionMap(layer)
    B, n = X.shape[0], X.shape[1]
    projected = X.matmul(engine.W) + IntervalArray(engine.bias)
    Q, K, V = (engine.per_head(projected, part) for part in ("queries", "keys", "values"))   # (B, H, n, .)
    S = Q.einsum("bhik,bhjk->bhij", K) * inverse_sqrt(engine.d_k)
    F = softmax(S, np.ones(n)).einsum("bhij,bhjv->bhiv", V)
    merged = F.swapaxes(1, 2).reshape(B, n, engine.H * engine.d_v)
    return merged.matmul(engine.W_O) + IntervalArray(engine.b_O) + X


def feedforward_stage(item, Z: IntervalArray) -> IntervalArray:
    """From attention block outputs (.., d) to the next layer's inputs: LayerNorm, ``y + GELU(y W_1 + b_1) W_2
    + b_2``, LayerNorm, enclosed (GELU with its global slope range: :func:`~lipbound.rigorous.arrays.gelu`)."""
    Y = EnclosedNorm(item.ln_out, Z).output
    ffn = item.ffn
    hidden = gelu(Y.matmul(ffn.W_1) + IntervalArray(ffn.b_1), global_slopes=True)
    return EnclosedNorm(item.ffn_norm, Y + hidden.matmul(ffn.W_2) + IntervalArray(ffn.b_2)).output


def _check_layer(item) -> None:
    """The passes evaluate BERT's post-norm layer: no LayerScale, the exact GELU."""
    if item.placement != "post" or item.ln_out is None or item.attn_scale is not None or item.ffn_scale is not None \
            or item.ffn is None or item.ffn.act != "gelu":
        raise AssumptionError(f"layer {item.index}", "a post-norm BERT layer (attention norm, exact-GELU feed-forward "
                              "block, no LayerScale)", f"a {item.placement}-norm layer of another form",
                              "per-candidate passes cover BERT-style encoders; use the set route")


def candidate_passes(model: Model, own: IntervalArray, slots, candidates: list, words: list, references: list,
                     last: int, *, chunk: int = 256, widest: float = 1e-2, progress=None) -> CandidatePasses:
    """Certified per-candidate passes of a replacement at ``slots`` by every combination of their candidates
    (module docstring): ``prod_s K_s`` edited sentences, at most :data:`MOST_SENTENCES`.

    Parameters
    ----------
    model : Model
        A full BERT checkpoint.
    own : IntervalArray (n, d)
        The original sentence's embeddings, enclosed.
    slots : sequence of int
        The replaced positions.
    candidates : list of IntervalArray (K_s, d)
        Per slot, the candidate words' embeddings there, enclosed.
    words : list of ndarray (K_s,)
        Their ids (reported).
    references : list of ndarray (n, d)
        The original outputs ``z^0`` per layer the bounds are measured from.
    last : int
        The last layer wanted.
    widest : float
        The passes stop after a layer whose rounding radius (a token's, in the l2 norm) exceeds this
        fraction of the largest bound of a chunk at that layer: the enclosures grow about 1e3-fold per
        layer, so the next layer would not be certified within the set route's reach.
    """
    if not model.complete or model.embeddings is None:
        raise AssumptionError("model", "a full checkpoint (embeddings, every layer)", "an attention-only model",
                              "load the whole model directory")
    for index in range(last + 1):
        _check_layer(model.layer(index))
    slots = [int(s) for s in slots]
    shape = tuple(c.shape[0] for c in candidates)
    total = int(np.prod(shape, dtype=np.int64))
    if total > MOST_SENTENCES:
        raise AssumptionError("candidates", f"at most {MOST_SENTENCES} edited sentences (the product of the slots' "
                              "candidate counts)", f"{' x '.join(map(str, shape))} = {total}",
                              "sample fewer candidates, or leave this set to the set route")
    n = own.shape[0]
    bounds = {layer: np.empty(total) for layer in range(last + 1)}
    widths = {layer: 0.0 for layer in range(last + 1)}
    reached, stopped = last, ""
    for begin in range(0, total, chunk):
        choice = np.unravel_index(np.arange(begin, min(begin + chunk, total)), shape)
        b = choice[0].size
        lo = np.broadcast_to(own.lo, (b, n, own.shape[1])).copy()
        hi = np.broadcast_to(own.hi, (b, n, own.shape[1])).copy()
        for slot, options, picked in zip(slots, candidates, choice):
            lo[:, slot], hi[:, slot] = options.lo[picked], options.hi[picked]
        X = IntervalArray(lo, hi)
        for layer in range(reached + 1):
            item = model.layer(layer)
            try:
                Z = attention_block(item.as_layer(residual=True), X)
            except NotCertifiedError as error:
                reached, stopped = layer - 1, f"layer {layer}: {error}"
                break
            distance = (Z - IntervalArray(references[layer])).norm_upper()             # (b, n)
            bounds[layer][begin:begin + b] = (IntervalArray(distance).sum(axis=-1) / float(n)).hi
            width = float(np.max((Z - IntervalArray(Z.mid)).norm_upper()))
            widths[layer] = max(widths[layer], width)
            if width > widest * float(np.max(bounds[layer][begin:begin + b])) and layer < reached:
                reached, stopped = layer, f"layer {layer + 1}: rounding radius {width:.3g} at layer {layer}"
            if layer == reached:
                break
            try:
                X = feedforward_stage(item, Z)
            except NotCertifiedError as error:
                reached, stopped = layer, f"layer {layer + 1}: {error}"
                break
        if progress is not None:
            progress(min(begin + chunk, total), total)
    every = np.unravel_index(np.arange(total), shape)
    chosen = np.stack([np.asarray(w)[picked] for w, picked in zip(words, every)], axis=1)
    return CandidatePasses(chosen, {layer: bounds[layer] for layer in range(reached + 1)},
                           {layer: widths[layer] for layer in range(reached + 1)}, stopped)
