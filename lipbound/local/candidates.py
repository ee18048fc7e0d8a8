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

With the exact chains the passes screen in tiers (:func:`candidate_passes`, ``screen``): every sentence by the
cheapest plan of exact chains first, the dearer plans only for the sentences whose bound could still be the set's
maximum; every bound of every tier is certified, and each sentence keeps the smallest of its own.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from ..numeric.attention import AttentionMap
from ..numeric.blas import one_blas_thread
from ..numeric.model import Model
from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import spectral_norm_upper
from .point_stages import PointStates, SlopeReference, attention_radii, chain_radii

__all__ = ["CandidatePasses", "candidate_passes", "MOST_SENTENCES", "EXACT_CHAIN_FROM", "SCREEN_EXACT_FROM"]

#: The most edited sentences one set's passes evaluate.
MOST_SENTENCES = 1 << 17
#: The first layer whose passes need the exact chain bound, the default when ``last`` reaches it: with the
#: reference slopes the radii grow about 350-fold per layer and stop being tight there on all-MiniLM-L6-v2.
EXACT_CHAIN_FROM = 4
#: The first layer whose chains the screening passes bound exactly for every token (before it, for the edited tokens
#: only, the others by reference slopes).  On all-MiniLM-L6-v2 layer 5's bound needs the radii entering it below
#: about 1e-2: with 3 the screening bound at layer 5 is 1.04-1.30 times the all-exact one (median 1.11, 33 tokens of
#: "The cat sat on the mat." at position 3) for 40% of the exact chains' products.
SCREEN_EXACT_FROM = 3
#: The most floats the states kept between screening tiers may take (8 bytes each): 1 GB, the whole vocabulary of
#: all-MiniLM-L6-v2 at one position of a 9-token sentence takes 0.85 GB.
MOST_KEPT_FLOATS = 1 << 27
#: How many sentences each refining pass takes.
REFINE_BATCH = 4
#: The cheapest screening tier bounds exactly only the edited tokens' chains, and only before this layer (on
#: all-MiniLM-L6-v2 the edited token's chain at layer 4 and the others' before layer 3 change the bound at layer 5
#: by less than 1%; 4 exact products per sentence instead of the second tier's 21, 0.33 CPU-s per sentence instead of
#: 0.61, and 57% of 42 sampled sentences of "The cat sat on the mat." at position 3 settled by it).
CHEAP_EDITED_UNTIL = 4
#: Before the first refined sentence, this many sentences with the largest first bounds at each layer are passed with
#: every chain exact: they place the set's maximum that decides which sentences the dearer tiers must take.
SEED_PER_LAYER = 2


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
    refined : int
        How many sentences were passed again with every chain exact (``screen`` of :func:`candidate_passes`).
    settled : tuple of int
        With ``screen``: how many sentences each screening tier left with their last bound, cheapest tier first, the
        all-exact pass last (they sum to the number of sentences).
    seconds : dict
        CPU seconds by stage: ``attention`` (:func:`attention_radii`), ``chain``, ``edited exact chain`` and
        ``exact chain`` (:func:`chain_radii` by the reference slopes, exactly at the edited tokens only, and exactly),
        ``bounds`` (the distances to the references), each summed over every pass, and ``refine`` (every pass after
        the first).
    """

    words: np.ndarray
    bounds: dict
    widths: dict
    stopped: str
    refined: int = 0
    seconds: dict = field(default_factory=dict)
    settled: tuple = ()

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


def _exact_tokens(plan, layer: int, slots: list):
    """Which tokens' chains of ``layer`` are bounded exactly: every token (True), the edited ones (``slots``) or none
    (False).  ``plan``: None (none anywhere), a layer from which every token's are (before it the edited tokens', whose
    slopes are the furthest from any reference), or a string per layer, ``"all"``, ``"edited"`` or ``"none"``."""
    if plan is None:
        return False
    if isinstance(plan, int):
        return True if layer >= plan else slots
    kind = plan[layer] if layer < len(plan) else "none"
    return True if kind == "all" else slots if kind == "edited" else False


def _screen_tiers(last: int) -> list:
    """The screening tiers, cheapest first, as plans of :func:`_exact_tokens`: the edited tokens' chains exact before
    :data:`CHEAP_EDITED_UNTIL`; every token's from :data:`SCREEN_EXACT_FROM` on and the edited tokens' before it;
    every chain exact (the refining pass)."""
    cheap = tuple("edited" if layer < CHEAP_EDITED_UNTIL else "none" for layer in range(last))
    return [cheap, SCREEN_EXACT_FROM, 0]


@final
@dataclass
class _KeptStates:
    """The certified states (points and radii, :class:`PointStates`) of every sentence entering ``layer``, as a pass
    left them (``held``: which sentences have them).  Any certified ball of a sentence's state is a sound start, so a
    dearer tier that chains the layers before ``layer`` as the cheaper one did starts there instead of at layer 0."""

    layer: int
    points: np.ndarray
    radii: np.ndarray
    held: np.ndarray

    @classmethod
    def room(cls, layer: int, total: int, n: int, d: int) -> _KeptStates | None:
        """Empty room for ``total`` sentences, or None when it would pass :data:`MOST_KEPT_FLOATS`."""
        if layer <= 0 or total * n * (d + 1) > MOST_KEPT_FLOATS:
            return None
        return cls(layer, np.empty((total, n, d)), np.empty((total, n)), np.zeros(total, dtype=bool))


def _evaluate(model: Model, engines: list, own: IntervalArray, slots: list, candidates: list, shape: tuple,
              picked: np.ndarray, references: list, last: int, chunk: int, widest: float, exact_from,
              seconds: dict, progress=None, keep: _KeptStates | None = None, resume: _KeptStates | None = None):
    """The passes of the edited sentences ``picked`` (flat indices into ``shape``), the chains bounded exactly where
    the plan ``exact_from`` says (:func:`_exact_tokens`): their bounds and widths per layer, the last layer
    reached and why the passes stopped before ``last``; the CPU seconds of each stage are added to ``seconds``.
    ``engines``: per layer its attention block and a certified ``||W_O||``.  ``keep``: record the states entering its
    layer; ``resume``: start there from the states it holds (the bounds of the layers before it are then infinite:
    the caller keeps its earlier ones)."""
    def timed(stage: str, began: float) -> None:
        seconds[stage] = seconds.get(stage, 0.0) + time.process_time() - began

    n = own.shape[0]
    bounds = {layer: np.empty(picked.size) for layer in range(last + 1)}
    widths = {layer: 0.0 for layer in range(last + 1)}
    reached, stopped = last, ""
    references_of: dict = {}
    for begin in range(0, picked.size, chunk):
        part = picked[begin:begin + chunk]
        choice = np.unravel_index(part, shape)
        b = choice[0].size
        start = 0
        if resume is not None and resume.layer <= reached and np.all(resume.held[part]):
            start = resume.layer
            X = PointStates(resume.points[part], resume.radii[part])
            for layer in range(start):
                bounds[layer][begin:begin + b] = np.inf
        else:
            lo = np.broadcast_to(own.lo, (b, n, own.shape[1])).copy()
            hi = np.broadcast_to(own.hi, (b, n, own.shape[1])).copy()
            for slot, options, chosen in zip(slots, candidates, choice):
                lo[:, slot], hi[:, slot] = options.lo[chosen], options.hi[chosen]
            X = PointStates.from_enclosure(IntervalArray(lo, hi))
        previous = 0.0
        for layer in range(start, reached + 1):
            item = model.layer(layer)
            if keep is not None and layer == keep.layer:
                keep.points[part], keep.radii[part], keep.held[part] = X.points, X.radii, True
            began = time.process_time()
            try:
                engine, output_norm = engines[layer]
                Z = attention_radii(engine, X, output_norm)
            except NotCertifiedError as error:
                reached, stopped = layer - 1, f"layer {layer}: {error}"
                break
            finally:
                timed("attention", began)
            began = time.process_time()
            distance = (IntervalArray(Z.points) - IntervalArray(references[layer])).norm_upper()     # (b, n)
            bounds[layer][begin:begin + b] = ((IntervalArray(distance) + IntervalArray(Z.radii)).sum(axis=-1)
                                              / float(n)).hi
            timed("bounds", began)
            width = float(np.max(Z.radii))
            widths[layer] = max(widths[layer], width)
            ahead = width * max(1.0, width / previous) if layer > start else width
            previous = width
            if ahead > widest * float(np.max(bounds[layer][begin:begin + b])) and layer < reached:
                reached, stopped = layer, f"layer {layer + 1}: radius {width:.3g} at layer {layer}, {ahead:.3g} ahead"
            if layer == reached:
                break
            exact = _exact_tokens(exact_from, layer, slots)
            began = time.process_time()
            try:
                if layer not in references_of and exact is not True:   # the first chunk's median serves every chunk
                    references_of[layer] = SlopeReference.of(item, Z.points)
                X = chain_radii(item, Z, references_of.get(layer), exact=exact, plain=slots)
            except NotCertifiedError as error:
                reached, stopped = layer, f"layer {layer + 1}: {error}"
                break
            finally:
                timed("exact chain" if exact is True else "chain" if exact is False else "edited exact chain", began)
        if progress is not None:
            progress(begin + b, picked.size)
    return bounds, widths, reached, stopped


@one_blas_thread
def candidate_passes(model: Model, own: IntervalArray, slots, candidates: list, words: list, references: list,
                     last: int, *, chunk: int = 256, widest: float = 20.0, exact_chain: bool | None = None,
                     screen: bool = True, refine_within: float = 0.0, cheap_tier: bool = True,
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
        ``exact``: one d x d_ff x d product per token and layer) instead of the reference slopes' route: the radii
        grow about 100-fold per layer instead of about 350-fold, enough to carry the passes through layer 5 of
        all-MiniLM-L6-v2.  Default (None): exact when ``last`` is at least :data:`EXACT_CHAIN_FROM`.
    screen : bool
        With ``exact_chain``, bound every sentence first by the cheapest screening tier (:func:`_screen_tiers`: the
        edited tokens' chains exact before layer :data:`CHEAP_EDITED_UNTIL`), pass with every chain exact the
        :data:`SEED_PER_LAYER` sentences of largest bound at each layer, then take one tier up (every token's chains
        exact from layer :data:`SCREEN_EXACT_FROM` on), together, the sentences whose bound at some layer is above
        the largest bound of the all-exact ones (the set's value is a maximum: a sentence below it needs no tighter
        bound), and through the all-exact passes, a few at a time, those still above it after the dearest screening
        tier; each sentence keeps the smallest of its bounds.  ``refined`` counts the all-exact passes,
        ``settled`` the sentences each tier left.
    cheap_tier : bool
        With ``screen``, start at the cheapest tier (default) or at the second one (every token's chains exact from
        :data:`SCREEN_EXACT_FROM`), as before the cheap tier existed.
    refine_within : float
        With ``screen``, leave unrefined the sentences whose first bound is within this fraction above the largest
        refined bound at every layer: the set's value is then at most ``1 + refine_within`` times the value with every
        such sentence refined (a refined bound is at most its sentence's all-exact bound), for fewer second passes.
    """
    if not model.complete or model.embeddings is None:
        raise AssumptionError("model", "a full checkpoint (embeddings, every layer)", "an attention-only model",
                              "load the whole model directory")
    for index in range(last + 1):
        _check_layer(model.layer(index))
    if not (math.isfinite(refine_within) and refine_within > -1.0):  # at -1 the open test compares with 0 * max
        raise AssumptionError("refine_within", "a number above -1 (0: refine every sentence that can lower a layer's "
                              "value)", repr(refine_within), "pass refine_within=0.0, or a tolerance such as 0.05")
    if exact_chain is None:
        exact_chain = last >= EXACT_CHAIN_FROM
    slots = [int(s) for s in slots]
    shape = tuple(c.shape[0] for c in candidates)
    total = int(np.prod(shape, dtype=np.int64))
    if total > MOST_SENTENCES:
        raise AssumptionError("candidates", f"at most {MOST_SENTENCES} edited sentences (the product of the slots' "
                              "candidate counts)", f"{' x '.join(map(str, shape))} = {total}",
                              "sample fewer candidates, or leave this set to the set route")
    screening = exact_chain and screen and SCREEN_EXACT_FROM < last
    tiers = _screen_tiers(last)[0 if cheap_tier else 1:] if screening else [0 if exact_chain else None]
    seconds: dict = {}
    maps = [AttentionMap(model.layer(index).as_layer(residual=True)) for index in range(last + 1)]
    engines = [(engine, spectral_norm_upper(engine.W_O)) for engine in maps]
    everything = np.arange(total)
    starts = tiers[:-1] if screening else tiers
    # the cheap tier and the next chain the layers before both's exact ones alike: the next starts after them
    kept = _KeptStates.room(min(CHEAP_EDITED_UNTIL, SCREEN_EXACT_FROM), total, *own.shape) \
        if screening and cheap_tier else None
    for first, plan in enumerate(starts):   # the cheapest tier that reaches every layer (or the dearest screening one)
        bounds, widths, reached, stopped = _evaluate(model, engines, own, slots, candidates, shape, everything,
                                                     references, last, chunk, widest, plan, seconds, progress,
                                                     keep=kept if first == 0 else None)
        if reached == last or first == len(starts) - 1:
            break
    began = time.process_time()
    tier = np.full(total, first)                         # each sentence's last screening tier (len(tiers) - 1: exact)
    final = len(tiers) - 1

    def improve(picked: np.ndarray, plan, resume: _KeptStates | None = None) -> None:
        again, again_widths, again_reached, _ = _evaluate(model, engines, own, slots, candidates, shape, picked,
                                                          references, reached, chunk, np.inf, plan, seconds,
                                                          resume=resume)
        for layer in range(again_reached + 1):
            bounds[layer][picked] = np.minimum(bounds[layer][picked], again[layer])
            widths[layer] = max(widths[layer], again_widths[layer])

    batch = min(REFINE_BATCH, chunk)
    layers = range(reached + 1)
    while screening:
        refined = tier == final
        largest = [float(np.max(bounds[layer][refined], initial=-np.inf)) for layer in layers]
        open_ = np.flatnonzero(~refined & np.any([bounds[layer] > largest[layer] * (1.0 + refine_within)
                                                  for layer in layers], axis=0))
        if open_.size == 0:
            break
        if not refined.any():      # the sentences largest at some layer first: they settle the maximum
            picked = np.unique(np.concatenate([np.argsort(-bounds[layer], kind="stable")[:max(1, SEED_PER_LAYER)]
                                               for layer in layers]))
            improve(picked, 0)
            tier[picked] = final
            continue
        below = open_[tier[open_] < final - 1]
        if below.size:             # the open sentences of the cheaper tiers one tier up, together
            for level in np.unique(tier[below]):
                group = below[tier[below] == level]
                improve(group, tiers[level + 1], kept if level == 0 else None)
                tier[group] = level + 1
            continue
        order = np.argsort(-np.max([bounds[layer][open_] / max(largest[layer], np.finfo(float).tiny)
                                    for layer in layers], axis=0), kind="stable")   # furthest above the maximum first
        picked = open_[order[:batch]]        # a few at a time: the largest bounds usually settle the maximum
        improve(picked, 0)
        tier[picked] = final
    if screening:
        seconds["refine"] = time.process_time() - began
    refined = tier == final if screening else np.zeros(total, dtype=bool)
    every = np.unravel_index(np.arange(total), shape)
    chosen = np.stack([np.asarray(w)[picked] for w, picked in zip(words, every)], axis=1)
    settled = tuple(int(np.sum(tier == level)) for level in range(len(tiers))) if screening else ()
    return CandidatePasses(chosen, {layer: bounds[layer] for layer in range(reached + 1)},
                           {layer: widths[layer] for layer in range(reached + 1)}, stopped, int(refined.sum()), seconds,
                           settled)
