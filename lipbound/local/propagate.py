"""A set of edited sentences pushed through the layers, without running any of them through the model.

An :class:`EditTemplate` describes every edited sentence of a set token by token: token i of an
edited sentence carries one of the words ``words[i]`` at position ``position[i]``, and is centred on
the original token ``source[i]`` (a replaced token on itself, an inserted one on a neighbour).  The
set's embeddings lie in token balls about the original embeddings (radii: the largest distance over
the candidate words, in interval arithmetic), and layer after layer the balls are pushed through the
attention layer, its LayerNorm, the feed-forward block and the output LayerNorm by the movement
bounds of :mod:`lipbound.local.bounds`; the centres follow the chain of the *original* embeddings
(:class:`~lipbound.local.chains.Component` enclosures), never an edited sentence.

At the first layer the candidate words are known exactly, so the score ranges and value shifts of
the attention are maxima over the candidates (a finite set, linear maps: the convex relaxation loses
nothing there) instead of the ball's worst case.  :func:`coupling_bound` turns the balls of a layer
into a bound on the Wasserstein-1 distance to the original sentence's outputs (theorem local-coupling).
On request (``per_candidate``) a replacement set is also run edit by edit, each edited sentence a float
point with certified radii (:mod:`lipbound.local.candidates`), and :func:`set_bound` keeps the smaller of
the two certificates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..numeric.attention import AttentionMap
from ..numeric.blas import one_blas_thread
from ..numeric.model import Embeddings, Model
from ..rigorous.arrays import IntervalArray
from .balls import TokenBalls
from .bounds import attention_bounds, feedforward_bounds, norm_bounds
from .candidates import MOST_SENTENCES, candidate_passes
from .enclosed import EnclosedAttention, EnclosedFeedForward, EnclosedNorm, inverse_sqrt, softmax

__all__ = ["EditTemplate", "LayerSet", "propagate", "through_layer", "through_layer_steps", "embedding_enclosure",
           "coupling_bound", "set_bound"]


@final
@dataclass(frozen=True, eq=False)
class EditTemplate:
    """Every edited sentence of a set, token by token (module docstring).

    Attributes
    ----------
    original : ndarray of int, shape (n,)
        The original token ids.
    source : ndarray of int, shape (n',)
        The original token each edited token is centred on.
    position : ndarray of int, shape (n',)
        Position-embedding index of each edited token.
    words : tuple of ndarray of int
        Candidate word ids of each edited token (one id for a token that is not edited).
    """

    original: np.ndarray
    source: np.ndarray
    position: np.ndarray
    words: tuple

    def __post_init__(self):
        original = np.asarray(self.original, dtype=np.int64)
        source = np.asarray(self.source, dtype=np.int64)
        position = np.asarray(self.position, dtype=np.int64)
        words = tuple(np.atleast_1d(np.asarray(w, dtype=np.int64)) for w in self.words)
        if source.shape != position.shape or len(words) != source.size or any(w.size == 0 for w in words):
            raise AssumptionError("template", "one source, position and non-empty word set per edited token",
                                  f"{source.size} sources, {position.size} positions, {len(words)} word sets",
                                  "build it with the edit helpers of lipbound.measures.edits")
        if np.any(source < 0) or np.any(source >= original.size):
            raise AssumptionError("template.source", f"indices in 0..{original.size - 1}", repr(source),
                                  "fix the alignment")
        object.__setattr__(self, "original", original)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "position", position)
        object.__setattr__(self, "words", words)

    @property
    def n(self) -> int:
        return self.original.size

    @property
    def n_new(self) -> int:
        return self.source.size

    @property
    def edited(self) -> np.ndarray:
        """Tokens whose word or position differs from their source's."""
        return np.array([w.size > 1 or w[0] != self.original[s] or p != s
                         for w, s, p in zip(self.words, self.source, self.position)])


@final
@dataclass(frozen=True)
class LayerSet:
    """Where the set is at layer l: the attention block outputs ``X + MHA(X)`` of every edited sentence lie
    in the token balls ``(centers, radii)``.  ``original`` holds the original sentence's outputs as the
    float forward pass computes them (step by step at midpoints of enclosures): the reference the
    movement is measured from, as for the measured values."""

    layer: int
    centers: np.ndarray
    radii: np.ndarray
    original: np.ndarray
    facts: dict = field(default_factory=dict, compare=False)


def embedding_enclosure(embeddings: Embeddings, words: np.ndarray, position: int) -> IntervalArray:
    """``LN(E_word[w] + E_pos[position] + E_type[0])`` for every word w, enclosed (k, d)."""
    offset = embeddings.position_offset
    summed = IntervalArray(embeddings.word[np.asarray(words)].astype(np.float64)) \
        + IntervalArray(embeddings.position[offset + int(position)]) + IntervalArray(embeddings.token_type[0])
    return EnclosedNorm(embeddings.norm, summed, exact_sums=True).output


def _first_layer_facts(model: Model, template: EditTemplate, centers: np.ndarray, candidates: list, enclosed):
    """Score ranges (H, n', n') and value shifts (H, n') of the first attention layer, as maxima over
    the candidate embeddings (exact linear maps of a finite set), in interval arithmetic."""
    layer = model.layer(0).as_layer(residual=True)
    engine = enclosed.engine
    H, dk = engine.H, engine.d_k
    c = inverse_sqrt(dk)
    n_new = template.n_new
    Q, K, V = [], [], []   # per token: (H, k_i, .) projections of its candidates
    for Y in candidates:
        projected = Y.matmul(engine.W) + IntervalArray(engine.bias)
        Q.append(engine.per_head(projected, "queries"))
        K.append(engine.per_head(projected, "keys"))
        V.append(engine.per_head(projected, "values"))
    lo, hi = np.empty((H, n_new, n_new)), np.empty((H, n_new, n_new))
    for i in range(n_new):
        for j in range(n_new):
            if i == j:
                scores = (Q[i] * K[i]).sum(axis=-1) * c                               # (H, k_i)
            elif Q[i].shape[1] == 1 or K[j].shape[1] == 1:
                scores = Q[i].einsum("hak,hbk->hab", K[j]) * c                         # (H, k_i, k_j), one side single
            else:  # two candidate sets: the product of their boxes
                q_box = IntervalArray(Q[i].lo.min(axis=1), Q[i].hi.max(axis=1))
                k_box = IntervalArray(K[j].lo.min(axis=1), K[j].hi.max(axis=1))
                scores = (q_box * k_box).sum(axis=-1) * c
            flat = scores.reshape(H, -1)
            lo[:, i, j], hi[:, i, j] = flat.lo.min(axis=1), flat.hi.max(axis=1)
    shifts = np.zeros((H, n_new))
    for j in range(n_new):
        at_center = enclosed.V[:, j]                                                   # (H, d_v)
        for h in range(H):
            rows = layer.output_block(h)
            moved = (V[j][h] - at_center[h].expand(0)).matmul(rows)                    # (k_j, d)
            shifts[h, j] = float(np.max(moved.norm_upper()))
    return IntervalArray(lo, hi), shifts


def _first_block_enumerated(layer, template: EditTemplate, candidates: list, slot: int, center_output: np.ndarray,
                            chunk: int = 512) -> tuple[np.ndarray, float]:
    """One edited slot p: the first attention block ``X + MHA(X)`` of every candidate word, in interval
    arithmetic, and per token the largest distance to the centre's output -- the set's image is a
    finite set, enclosed token by token without loss -- and the largest over the words of the sum of a word's own
    distances, ``max_w sum_i ||z_i(w) - z^c_i||`` (outward rounded): the identity plan's cost of each edit, so that
    the set's W1 from the centre's outputs is at most this over n (lemma edit-enumerated-first-block).

    Only row p and column p of the scores depend on the candidate.  A row i != p attends with fixed
    weights ``e_ij`` (j != p, total ``T_i``) plus ``e_ip(w)``, so its head output is
    ``F0_i + pi_i(w) (v_p(w) - F0_i)`` with ``F0_i`` the head output without token p and
    ``pi_i = 1 / (1 + T_i / e_ip(w))``: in the output space, ``z_i(w) = base_i + sum_h pi^h_i(w) (u^h(w) - G^h_i)``
    with ``u^h(w) = v^h_p(w) W_O^h`` and ``G^h_i = F0^h_i W_O^h``.  Row p is computed in full."""
    engine = AttentionMap(layer)
    H, dk, dv, n = engine.H, engine.d_k, engine.d_v, template.n_new
    others = np.array([i for i in range(n) if i != slot])
    fixed = IntervalArray(np.stack([candidates[i].lo[0] if i != slot else np.zeros(engine.d) for i in range(n)]),
                          np.stack([candidates[i].hi[0] if i != slot else np.zeros(engine.d) for i in range(n)]))
    c = inverse_sqrt(dk)
    projected = fixed.matmul(engine.W) + IntervalArray(engine.bias)
    Q, K, V = (engine.per_head(projected, part) for part in ("queries", "keys", "values"))
    S = Q.einsum("hik,hjk->hij", K) * c                                                  # (H, n, n)
    S_rest = S[:, :, others]
    shift = np.max(S_rest.hi, axis=-1)                                                   # (H, n)
    e_rest = (S_rest - IntervalArray(shift[..., None])).exp()
    T = e_rest.sum(axis=-1)                                                              # (H, n)
    F0 = e_rest.einsum("hij,hjv->hiv", V[:, others]) / T.expand(-1)                      # (H, n, d_v)
    rows = [layer.output_block(h) for h in range(H)]
    blocks = np.stack(rows)                                                              # (H, d_v, d)
    G = IntervalArray.stack([F0[h].matmul(rows[h]) for h in range(H)])               # (H, n, d)
    base = fixed + IntervalArray(engine.b_O) + G.sum(axis=0)                             # (n, d)
    Y = candidates[slot]
    largest, per_edit = np.zeros(n), 0.0
    for begin in range(0, Y.shape[0], chunk):
        part = Y[begin:begin + chunk]
        b = part.shape[0]
        own = part.matmul(engine.W) + IntervalArray(engine.bias)
        q, k, v = (engine.per_head(own, part).swapaxes(0, 1) for part in ("queries", "keys", "values"))  # (b, H, .)
        u = v.swapaxes(0, 1).bmm(blocks).swapaxes(0, 1)                                 # (b, H, d): v_p W_O^h
        # rows i != p: the weight of the candidate key
        s_ip = k.einsum("bhk,hik->bhi", Q) * c                                           # (b, H, n)
        e_ip = (s_ip - IntervalArray(shift)[None]).exp()
        pi = (IntervalArray(1.0) + T.expand(0) / e_ip.clip_below(np.finfo(float).tiny)).reciprocal()
        by_token = pi.swapaxes(0, 2).swapaxes(1, 2)                                      # (n, b, H)
        moved = pi.swapaxes(1, 2).bmm(u) - by_token.bmm(G.swapaxes(0, 1)).swapaxes(0, 1) + base.expand(0)  # (b, n, d)
        distance = (moved - IntervalArray(center_output)).norm_upper()                  # (b, n)
        # row p in full: its query against every key (its own key is the candidate's)
        scores = q.einsum("bhk,hjk->bhj", K) * c                                        # (b, H, n)
        own_score = (q * k).sum(axis=-1) * c                                            # (b, H)
        lo, hi = scores.lo.copy(), scores.hi.copy()
        lo[:, :, slot], hi[:, :, slot] = own_score.lo, own_score.hi
        weights = softmax(IntervalArray(lo, hi), np.ones(n))                            # (b, H, n)
        values_lo = np.broadcast_to(V.lo, (b,) + V.shape).copy()
        values_hi = np.broadcast_to(V.hi, (b,) + V.shape).copy()
        values_lo[:, :, slot], values_hi[:, :, slot] = v.lo, v.hi
        heads = weights.einsum("bhj,bhjv->bhv", IntervalArray(values_lo, values_hi))     # (b, H, d_v)
        z_p = heads.reshape(b, H * dv).matmul(engine.W_O) + IntervalArray(engine.b_O) + part
        distance[:, slot] = (z_p - IntervalArray(center_output[slot])).norm_upper()
        largest = np.maximum(largest, distance.max(axis=0))
        per_edit = max(per_edit, float(np.max(IntervalArray(distance).sum(axis=-1).hi)))
    return largest, per_edit


@one_blas_thread
def propagate(model: Model, template: EditTemplate, layers=None, progress=None, per_candidate: bool = False,
              candidate_progress=None, exact_chain: bool | None = None, screen: bool = True,
              refine_within: float = 0.0) -> list[LayerSet]:
    """Push the set of edited sentences through the layers; one :class:`LayerSet` per layer (the
    attention block outputs of that layer), for layers ``0..max(layers)``.

    The centres follow the original sentence's embeddings (its tokens ``source``), the radii bound how
    far any edited sentence's token can be from them, layer by layer; no edited sentence is evaluated.
    The original sentence itself is carried along with radii of rounding only.

    ``per_candidate``: for a replacement, also run every edited sentence of the set through the layers
    when there are at most :data:`~lipbound.local.candidates.MOST_SENTENCES` of them
    (:func:`lipbound.local.candidates.candidate_passes`): every layer gets the fact ``candidates`` (the
    :class:`~lipbound.local.candidates.CandidatePasses`), each layer the passes reach ``per_candidate`` (the
    largest certified W1 over the candidates, a bound for the whole set); :func:`set_bound` takes the
    smaller route.  ``candidate_progress(done, total)`` follows the candidates; ``exact_chain``: whether the
    passes bound each feed-forward chain by its certified norm at the point (``exact_chain`` of
    :func:`~lipbound.local.candidates.candidate_passes`, which chooses by depth when it is None); ``screen``: whether
    the exact passes screen first and refine only what could be the set's maximum (``screen`` there), and
    ``refine_within`` how far above the refined maximum a sentence may stay unrefined.
    """
    embeddings = model.embeddings
    if embeddings is None or not model.complete:
        raise AssumptionError("model", "a full checkpoint (embeddings, every layer)", "an attention-only model",
                              "load the whole model directory")
    last = model.num_layers - 1 if layers is None else max(layers)
    own = embedding_enclosure_tokens(embeddings, template.original, np.arange(template.n))
    candidates = [embedding_enclosure(embeddings, words, position)
                  for words, position in zip(template.words, template.position)]
    centers = own.mid[template.source]
    radii = np.array([float(np.max((Y - IntervalArray(centers[i])).norm_upper())) for i, Y in enumerate(candidates)])
    same = template.n_new == template.n and np.array_equal(template.source, np.arange(template.n))
    original = own.mid
    out = []
    for index in range(last + 1):
        item = model.layer(index)
        layer = item.as_layer(residual=True)
        enclosed = EnclosedAttention(layer, centers)
        z_centers = enclosed.output.mid
        multiple = [i for i, words in enumerate(template.words) if words.size > 1]
        facts: dict = {"input_radii": radii}
        if index == 0 and len(multiple) == 1:      # one edited slot: its first-layer image, candidate by candidate
            movement, per_edit = _first_block_enumerated(layer, template, candidates, multiple[0], z_centers)
            if same:   # the reference is the centres' output itself: each edit's identity cost is known
                facts["enumerated"] = float((IntervalArray(per_edit) / float(template.n)).hi)
        else:
            overrides = {}
            if index == 0:
                scores, shifts = _first_layer_facts(model, template, centers, candidates, enclosed)
                overrides = {"scores": scores, "value_shift": shifts}
            movement = attention_bounds(layer, TokenBalls(centers, radii), enclosed, **overrides).movement
        z_radii = (IntervalArray(movement) + IntervalArray(_rounding(enclosed.output))).hi
        reference = enclosed if same else EnclosedAttention(layer, original)
        out.append(LayerSet(index, z_centers, z_radii, reference.output.mid, facts))
        if progress is not None:
            progress(index + 1, last + 1)
        if index == last:
            break
        centers, radii = through_layer(item, z_centers, z_radii)
        original = centers if same else _original_next(item, reference)
    slots = [i for i, words in enumerate(template.words) if words.size > 1]
    count = np.prod([template.words[i].size for i in slots], dtype=np.int64)
    if per_candidate and same and slots and count <= MOST_SENTENCES:
        passes = candidate_passes(model, own, slots, [candidates[i] for i in slots], [template.words[i] for i in slots],
                                  [s.original for s in out], last, exact_chain=exact_chain, screen=screen,
                                  refine_within=refine_within,
                                  progress=candidate_progress)
        out = [replace(s, facts={**s.facts, "candidates": passes, **({"per_candidate": passes.largest(s.layer)}
                                                                     if s.layer in passes.bounds else {})})
               for s in out]
    return out


def set_bound(layer_set: LayerSet, plan: np.ndarray) -> tuple[float, str]:
    """The set's certified W1 at a layer and the route that gave it: the smallest of :func:`coupling_bound`
    (``"balls"``), the per-candidate passes (``"candidates"``, when :func:`propagate` ran them to it) and, at the first
    layer of a one-slot replacement under the identity plan, the largest identity cost of the enumerated edits
    (``"enumerated"``, lemma edit-enumerated-first-block)."""
    routes = [(coupling_bound(layer_set, plan), "balls"),
              (layer_set.facts.get("per_candidate", math.inf), "candidates")]
    plan = np.asarray(plan)
    n = layer_set.original.shape[0]
    if "enumerated" in layer_set.facts and plan.shape == (n, n) and np.array_equal(plan, np.eye(n) * n):
        routes.append((layer_set.facts["enumerated"], "enumerated"))
    return min(routes, key=lambda route: route[0])


def embedding_enclosure_tokens(embeddings: Embeddings, ids: np.ndarray, positions: np.ndarray) -> IntervalArray:
    """The embeddings of a sentence (token i: word ``ids[i]`` at position ``positions[i]``), enclosed."""
    offset = embeddings.position_offset
    summed = IntervalArray(embeddings.word[ids].astype(np.float64)) \
        + IntervalArray(embeddings.position[offset + positions]) + IntervalArray(embeddings.token_type[0])
    return EnclosedNorm(embeddings.norm, summed, exact_sums=True).output


def _rounding(enclosure: IntervalArray) -> np.ndarray:
    """Per token, how far the exact point can be from the enclosure's midpoint."""
    return (enclosure - IntervalArray(enclosure.mid)).norm_upper()


def _per_token_stage(item):
    """The components between two attention blocks, in order, with their enclosures."""
    return ((item.ln_out, EnclosedNorm), (item.ffn, EnclosedFeedForward), (item.ffn_norm, EnclosedNorm))


def through_layer_steps(item, centers, radii):
    """:func:`through_layer` step by step: yields ``(component, enclosure, bounds, centers, radii)`` after each of
    the LayerNorm, the residual feed-forward block and the output LayerNorm."""
    for target, enclose in _per_token_stage(item):
        enclosed = enclose(target, centers)
        if enclose is EnclosedFeedForward:
            bounds = feedforward_bounds(target, TokenBalls(centers, radii), enclosed, want_variation=False)
        else:
            bounds = norm_bounds(target, TokenBalls(centers, radii), enclosed)
        centers = enclosed.output.mid
        radii = (IntervalArray(bounds.movement) + IntervalArray(_rounding(enclosed.output))).hi
        yield target, enclosed, bounds, centers, radii


def through_layer(item, centers, radii):
    """From the attention block outputs of a layer to the next layer's inputs: the LayerNorm, the residual
    feed-forward block and the output LayerNorm, each with its movement bound; the centres move to the
    midpoints of their enclosures, the radii grow by the rounding."""
    *_, last = through_layer_steps(item, centers, radii)
    return last[-2], last[-1]


def _original_next(item, reference: EnclosedAttention) -> np.ndarray:
    """The original sentence's next hidden states (float points, each step at the previous midpoint)."""
    states = reference.output.mid
    for target, enclose in _per_token_stage(item):
        states = enclose(target, states).output.mid
    return states


def coupling_bound(layer_set: LayerSet, plan: np.ndarray) -> float:
    """``W1 <= sum_ai pi_ai (||z_a - c_i|| + r_i)`` (theorem local-coupling) for an integer coupling
    ``plan`` (n, n') scaled by ``n n'`` between the original outputs and the balls."""
    plan = np.asarray(plan)
    n, n_new = plan.shape
    distance = (IntervalArray(layer_set.original).expand(1) - IntervalArray(layer_set.centers).expand(0)).norm_upper()
    cost = IntervalArray(distance) + IntervalArray(layer_set.radii)[None, :]
    weights = IntervalArray(plan.astype(np.float64)) / float(n * n_new)
    return float((cost * weights).sum(axis=-1).sum(axis=-1).hi)
