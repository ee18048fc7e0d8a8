"""Certified per-candidate passes: every edited sentence of a replacement set pushed through the layers.

For a replacement at positions p_1..p_k by any of the candidate words of each slot (every combination:
a k = 1 set over the whole vocabulary, or a k = 2 set over a sample), each edited sentence is a point,
so only the rounding of its evaluation needs enclosing: each is carried, vectorised over a chunk of
candidates, as a float point with a certified radius per token, stage by stage
(:mod:`lipbound.local.point_stages`: the attention block, then the LayerNorm, feed-forward block and output
LayerNorm as one chain; docs/mathematics.md, "Point passes").

At layer l the identity matching of the original tokens with the edited ones is a transport plan, so

``W1(mu_l, mu_l(w)) <= (1/n) sum_i (||z~_i(w) - z_i^0|| + rho_i(w))``

for the original outputs ``z^0`` (the reference points of :class:`~lipbound.local.propagate.LayerSet`);
the largest over the candidates bounds the whole set (theorem local-coupling).  Nothing is relaxed: the
only loss is the radii.  The passes stop after a layer whose radii, grown once more by their growth over
that layer, would exceed ``widest`` times the largest bound of a chunk there: the later layers are left to
the set route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from ..numeric.attention import AttentionMap
from ..numeric.blas import one_blas_thread
from ..numeric.model import Model
from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import spectral_norm_upper
from .point_stages import PointStates, SlopeReference, attention_radii, chain_radii

__all__ = ["CandidatePasses", "candidate_passes", "MOST_SENTENCES", "EXACT_CHAIN_FROM"]

#: The most edited sentences one set's passes evaluate.
MOST_SENTENCES = 1 << 17
#: The first layer whose passes need the exact chain bound, the default when ``last`` reaches it: with the
#: reference slopes the radii grow about 350-fold per layer and stop being tight there on all-MiniLM-L6-v2.
EXACT_CHAIN_FROM = 4


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
        ``widths[l]``: the largest radius ``max rho_i`` of the attention block outputs over the candidates at
        layer l (how far an exact state can be from the float point the bound measures).
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


def _check_layer(item) -> None:
    """The passes evaluate BERT's post-norm layer: no LayerScale, the exact GELU."""
    if item.placement != "post" or item.ln_out is None or item.attn_scale is not None or item.ffn_scale is not None \
            or item.ffn is None or item.ffn.act != "gelu":
        raise AssumptionError(f"layer {item.index}", "a post-norm BERT layer (attention norm, exact-GELU feed-forward "
                              "block, no LayerScale)", f"a {item.placement}-norm layer of another form",
                              "per-candidate passes cover BERT-style encoders; use the set route")


@one_blas_thread
def candidate_passes(model: Model, own: IntervalArray, slots, candidates: list, words: list, references: list,
                     last: int, *, chunk: int = 256, widest: float = 20.0, exact_chain: bool | None = None,
                     progress=None) -> CandidatePasses:
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
        The passes stop after a layer whose largest radius, times its growth since the previous layer, exceeds
        this multiple of the largest bound of a chunk there: the next layer's radii would be about that large
        (they grow 100- to 350-fold per layer on all-MiniLM-L6-v2), beyond the set route's reach (the token balls
        are about 100 times the worst edit from layer 1 on) or its softmax bounds would overflow.
    exact_chain : bool, optional
        Bound each chain by the certified norm of its Jacobian part at the point (:func:`chain_radii` with
        ``exact``: one d x d_ff x d product per token and layer, about 0.5-1 CPU-s per sentence through six layers
        of all-MiniLM-L6-v2) instead of the reference slopes' route: the radii grow about 100-fold per layer instead
        of about 350-fold, enough to carry the passes through layer 5 there.  Default (None): exact when ``last``
        is at least :data:`EXACT_CHAIN_FROM`.
    """
    if not model.complete or model.embeddings is None:
        raise AssumptionError("model", "a full checkpoint (embeddings, every layer)", "an attention-only model",
                              "load the whole model directory")
    for index in range(last + 1):
        _check_layer(model.layer(index))
    if exact_chain is None:
        exact_chain = last >= EXACT_CHAIN_FROM
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
    engines = [AttentionMap(model.layer(index).as_layer(residual=True)) for index in range(last + 1)]
    output_norms = [spectral_norm_upper(engine.W_O) for engine in engines]
    references_of: dict = {}
    for begin in range(0, total, chunk):
        choice = np.unravel_index(np.arange(begin, min(begin + chunk, total)), shape)
        b = choice[0].size
        lo = np.broadcast_to(own.lo, (b, n, own.shape[1])).copy()
        hi = np.broadcast_to(own.hi, (b, n, own.shape[1])).copy()
        for slot, options, picked in zip(slots, candidates, choice):
            lo[:, slot], hi[:, slot] = options.lo[picked], options.hi[picked]
        X = PointStates.from_enclosure(IntervalArray(lo, hi))
        previous = 0.0
        for layer in range(reached + 1):
            item = model.layer(layer)
            try:
                Z = attention_radii(engines[layer], X, output_norms[layer])
            except NotCertifiedError as error:
                reached, stopped = layer - 1, f"layer {layer}: {error}"
                break
            distance = (IntervalArray(Z.points) - IntervalArray(references[layer])).norm_upper()     # (b, n)
            bounds[layer][begin:begin + b] = ((IntervalArray(distance) + IntervalArray(Z.radii)).sum(axis=-1)
                                              / float(n)).hi
            width = float(np.max(Z.radii))
            widths[layer] = max(widths[layer], width)
            ahead = width * max(1.0, width / previous) if layer else width
            previous = width
            if ahead > widest * float(np.max(bounds[layer][begin:begin + b])) and layer < reached:
                reached, stopped = layer, f"layer {layer + 1}: radius {width:.3g} at layer {layer}, {ahead:.3g} ahead"
            if layer == reached:
                break
            try:
                if layer not in references_of and not exact_chain:   # the first chunk's median serves every chunk
                    references_of[layer] = SlopeReference.of(item, Z.points)
                X = chain_radii(item, Z, references_of.get(layer), exact=exact_chain, plain=slots)
            except NotCertifiedError as error:
                reached, stopped = layer, f"layer {layer + 1}: {error}"
                break
        if progress is not None:
            progress(min(begin + chunk, total), total)
    every = np.unravel_index(np.arange(total), shape)
    chosen = np.stack([np.asarray(w)[picked] for w, picked in zip(words, every)], axis=1)
    return CandidatePasses(chosen, {layer: bounds[layer] for layer in range(reached + 1)},
                           {layer: widths[layer] for layer in range(reached + 1)}, stopped)
