"""Edit sets by groups of candidates: one certified pass covers every word of a group at once.

A replacement at one slot p by any of K candidate words (the whole vocabulary, say) is, at the input, the set of
sentences whose token p is one of the candidates' input rows ``e_w`` (word + position + type embedding, then the
embedding LayerNorm: :func:`~lipbound.local.propagate.embedding_enclosure`).  The candidates are cut into groups by a
deterministic bisection tree (:func:`bisect`: at the median of the principal direction of the group's rows); a group
G gets a centre ``c_G`` (the mean of its rows, a float vector) and a certified radius
``r_G >= max_{w in G} ||e_w - c_G||`` (the enclosures' distance to ``c_G``, outward rounded).  Every edited sentence
of G then lies in the product of balls ``B(c_G, r_G)`` at p and the original tokens' rounding balls elsewhere, and the
point passes' stages (:mod:`lipbound.local.point_stages`: certified Lipschitz bounds of each stage on balls of any
radius) carry that product of balls through the layers.  With the identity coupling (theorem local-coupling)

``W1(mu_l, mu_l(w)) <= (1/n) sum_i (||z~_i(G) - z_i^0|| + rho_i(G))``  for every w in G

(lemma edit-group-ball, docs/local.md).  A group whose bound is at most the caller's threshold at every layer asked
is settled; one above it is split in two, down to ``smallest`` words, whose words are then passed one by one by
:func:`~lipbound.local.candidates.candidate_passes`.  The set's bound at a layer is the largest bound of its settled
groups and of those passes: the threshold decides only how the work is spent, never whether a bound holds.
"""

from __future__ import annotations

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
from .candidates import candidate_passes
from .point_stages import PointStates, SlopeReference, attention_radii, chain_radii

__all__ = ["GroupBalls", "GroupCertificate", "bisect", "group_balls", "group_pass_bounds", "group_certificate"]


def bisect(rows: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two halves of ``members`` (indices into ``rows`` (K, d)): ranked by their projection on the principal direction
    of their centred rows (top eigenvector of the d x d scatter matrix, or top right singular vector of the rows), the
    lower half and the upper half (a stable sort: the same rows give the same halves)."""
    members = np.asarray(members)
    part = rows[members] - rows[members].mean(axis=0)
    if members.size < part.shape[1]:     # fewer rows than dimensions: the top right singular vector is cheaper
        direction = np.linalg.svd(part, full_matrices=False)[2][0]
    else:
        direction = np.linalg.eigh(part.T @ part)[1][:, -1]
    order = np.argsort(part @ direction, kind="stable")
    half = members.size // 2
    return members[np.sort(order[:half])], members[np.sort(order[half:])]


@final
@dataclass(frozen=True)
class GroupBalls:
    """Groups of candidates as input balls: ``members[g]`` (indices into the candidates), centre ``centres[g]`` (d,)
    and certified radius ``radii[g]``, at least the distance from the centre to every exact candidate row of the
    group."""

    members: tuple
    centres: np.ndarray
    radii: np.ndarray


def group_balls(candidates: IntervalArray, members: list) -> GroupBalls:
    """The balls of the groups ``members`` of the enclosed candidate rows (K, d): centre the mean of the rows'
    midpoints, radius the largest outward-rounded norm of ``Y_w - c`` (Y_w the enclosure: it holds the exact row)."""
    rows = candidates.mid                                           # formed once: it is a (K, d) array each time
    centres = np.stack([rows[m].mean(axis=0) for m in members])
    radii = np.array([float(np.max((candidates[m] - IntervalArray(c)).norm_upper())) for m, c in zip(members, centres)])
    return GroupBalls(tuple(members), centres, radii)


def group_pass_bounds(model: Model, own: IntervalArray, slot: int, balls: GroupBalls, references: list, last: int,
                      thresholds: np.ndarray, *, chunk: int = 64, seconds: dict | None = None) -> np.ndarray:
    """Certified W1 bounds (G, last + 1) of every group's edits, layer by layer (lemma edit-group-ball).

    Each group's input is the original embeddings ``own`` (n, d, enclosed) with token ``slot`` in the ball
    ``B(centre, radius)``, carried by :func:`~lipbound.local.point_stages.attention_radii` and
    :func:`~lipbound.local.point_stages.chain_radii` (the slot's chain by its certified norm at the point, the others'
    by the batch's reference slopes); the bound at layer l is ``(1/n) sum_i (||z~_i - z_i^0|| + rho_i)`` for the
    original outputs ``references[l]`` (n, d).  A group stops (``inf`` from there on) after the first layer whose bound
    exceeds ``thresholds[l]``, or where its chunk's evaluation overflows (:class:`NotCertifiedError`).
    """
    began = time.process_time()
    count = balls.radii.size
    out = np.full((count, last + 1), np.inf)
    rounding = (own - IntervalArray(own.mid)).norm_upper()
    engines = [AttentionMap(model.layer(index).as_layer(residual=True)) for index in range(last + 1)]
    output_norms = [spectral_norm_upper(engine.W_O) for engine in engines]
    for begin in range(0, count, chunk):
        alive = np.arange(begin, min(begin + chunk, count))
        with np.errstate(over="ignore", invalid="ignore"):   # an overflow is a NotCertifiedError: the group stops
            _pass_chunk(model, (engines, output_norms), own, rounding, slot, balls, alive, references, last,
                        thresholds, out)
    if seconds is not None:
        seconds["groups"] = seconds.get("groups", 0.0) + time.process_time() - began
    return out


def _pass_chunk(model, maps, own, rounding, slot, balls, alive, references, last, thresholds, out) -> None:
    """The groups ``alive`` of :func:`group_pass_bounds`, passed together; their bounds written into ``out``.
    ``maps``: per layer the attention blocks and their certified ``||W_O||``."""
    n, d = own.shape
    points = np.broadcast_to(own.mid, (alive.size, n, d)).copy()
    points[:, slot] = balls.centres[alive]
    radii = np.broadcast_to(rounding, (alive.size, n)).copy()
    radii[:, slot] = (IntervalArray(radii[:, slot]) + IntervalArray(balls.radii[alive])).hi
    _carry(model, maps, slot, PointStates(points, radii), alive, 0, references, last, thresholds, out)


def _carry(model, maps, slot, X: PointStates, alive, first: int, references, last, thresholds, out) -> None:
    """Carry the states X of the groups ``alive`` from layer ``first`` on.  An overflow stops only the groups that
    cause it: the batch is halved and each half carried on from that stage alone, down to one group."""
    engines, output_norms = maps
    n = X.points.shape[1]
    for layer in range(first, last + 1):
        try:
            Z = attention_radii(engines[layer], X, output_norms[layer])
        except NotCertifiedError:
            _halves(model, maps, slot, X, alive, layer, references, last, thresholds, out)
            return
        distance = (IntervalArray(Z.points) - IntervalArray(references[layer])).norm_upper()           # (b, n)
        bound = ((IntervalArray(distance) + IntervalArray(Z.radii)).sum(axis=-1) / float(n)).hi
        out[alive, layer] = bound
        keep = bound <= thresholds[layer]
        if layer == last or not keep.any():
            return
        alive, Z = alive[keep], PointStates(Z.points[keep], Z.radii[keep])
        try:
            X = _through_chain(model, layer, Z, slot)
        except NotCertifiedError:      # the chain's overflow: the halves pass it again from the attention outputs
            _halves(model, maps, slot, Z, alive, layer, references, last, thresholds, out, chain_first=True)
            return


def _through_chain(model, layer: int, Z: PointStates, slot: int) -> PointStates:
    """Layer ``layer``'s per-token chain on the attention outputs Z: the slot's chain by its certified norm at the
    point, the others' by the batch's reference slopes."""
    item = model.layer(layer)
    return chain_radii(item, Z, SlopeReference.of(item, Z.points), exact=[slot], plain=[slot])


def _halves(model, maps, slot, X: PointStates, alive, layer: int, references, last, thresholds, out,
            chain_first: bool = False) -> None:
    """After an overflow at ``layer``: each half of the batch again from that stage (one group: it stops there)."""
    if alive.size == 1:
        return
    half = alive.size // 2
    for part in (slice(0, half), slice(half, None)):
        states = PointStates(X.points[part], X.radii[part])
        if chain_first:
            try:
                states = _through_chain(model, layer, states, slot)
            except NotCertifiedError:
                _halves(model, maps, slot, states, alive[part], layer, references, last, thresholds, out, True)
                continue
            _carry(model, maps, slot, states, alive[part], layer + 1, references, last, thresholds, out)
        else:
            _carry(model, maps, slot, states, alive[part], layer, references, last, thresholds, out)


@final
@dataclass(frozen=True)
class GroupCertificate:
    """A one-slot edit set certified by groups and, where a group could not settle, word by word.

    Attributes
    ----------
    bounds : ndarray, shape (last + 1,)
        The set's certified W1 bound per layer: the largest over the settled groups and the word-by-word passes.
    settled : tuple of (ndarray, ndarray)
        Per settled group its members (indices into the candidates) and its bounds per layer.
    singles : ndarray of int
        The candidates passed word by word (:func:`~lipbound.local.candidates.candidate_passes`).
    single_bounds : ndarray, shape (len(singles), last + 1)
        Their certified bounds.
    generations : list of dict
        Per round of the tree: ``groups``, ``median_radius``, ``largest_radius`` and ``settled``.
    seconds : dict
        CPU seconds: ``groups`` (the group passes), ``singles`` (the word-by-word passes), ``tree`` (bisection and
        balls).
    """

    bounds: np.ndarray
    settled: tuple
    singles: np.ndarray
    single_bounds: np.ndarray
    generations: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)


@one_blas_thread
def group_certificate(model: Model, own: IntervalArray, slot: int, candidates: IntervalArray, words: np.ndarray,
                      references: list, last: int, thresholds, *, first_groups: int = 1, smallest: int = 1,
                      chunk: int = 64, exact_chain: bool | None = None, progress=None) -> GroupCertificate:
    """Certify every replacement of token ``slot`` by one of ``candidates`` through layers ``0..last`` (module
    docstring).

    Parameters
    ----------
    model : Model
        A full BERT checkpoint (the stages of :mod:`lipbound.local.point_stages`).
    own : IntervalArray (n, d)
        The original sentence's embeddings, enclosed.
    slot : int
        The replaced position.
    candidates : IntervalArray (K, d)
        The candidate words' input rows at ``slot``, enclosed; ``words`` (K,) their ids.
    references : list of ndarray (n, d)
        The original outputs ``z^0`` per layer.
    thresholds : float or array (last + 1,)
        A group settles when its bound is at most this at every layer (e.g. a factor times the worst edit found).
    first_groups : int
        Bisect the candidates to at least this many groups before the first passes.
    smallest : int
        Groups of at most this many words that do not settle are passed word by word.
    exact_chain : bool, optional
        ``exact_chain`` of the word-by-word passes.
    progress : callable, optional
        ``progress(text)`` after each round.
    """
    say = progress or (lambda text: None)
    words = np.asarray(words)
    K = candidates.shape[0]
    if K == 0 or words.shape != (K,):
        raise AssumptionError("candidates", "at least one candidate row and one word id per row",
                              f"{K} rows, {words.shape} ids", "pass the enclosed rows and their ids")
    limits = np.broadcast_to(np.asarray(thresholds, dtype=np.float64), (last + 1,))
    seconds: dict = {}
    rows = candidates.mid
    began = time.process_time()
    queue = [np.arange(K)]
    while len(queue) < first_groups and any(m.size > 1 for m in queue):
        queue = [half for m in queue for half in (bisect(rows, m) if m.size > 1 else (m,))]
    seconds["tree"] = time.process_time() - began
    settled: list = []
    singles: list = []
    generations: list = []
    while queue:
        small = [m for m in queue if m.size <= smallest]
        singles.extend(small)
        queue = [m for m in queue if m.size > smallest]
        if not queue:
            break
        began = time.process_time()
        balls = group_balls(candidates, queue)
        order = np.argsort(balls.radii, kind="stable")        # chunks of like radii stop together
        balls = GroupBalls(tuple(balls.members[g] for g in order), balls.centres[order], balls.radii[order])
        seconds["tree"] += time.process_time() - began
        bounds = group_pass_bounds(model, own, slot, balls, references, last, limits, chunk=chunk, seconds=seconds)
        ok = np.all(bounds <= limits, axis=1)
        settled.extend((balls.members[g], bounds[g]) for g in np.flatnonzero(ok))
        generations.append({"groups": len(queue), "median_radius": float(np.median(balls.radii)),
                            "largest_radius": float(np.max(balls.radii)), "settled": int(ok.sum())})
        say(f"{len(queue)} groups, radius median {np.median(balls.radii):.3g}: {int(ok.sum())} settled")
        began = time.process_time()
        queue = [half for g in np.flatnonzero(~ok) for half in bisect(rows, balls.members[g])]
        seconds["tree"] += time.process_time() - began
    single = np.sort(np.concatenate(singles)) if singles else np.zeros(0, dtype=np.int64)
    single_bounds = np.zeros((0, last + 1))
    if single.size:
        began = time.process_time()
        passes = candidate_passes(model, own, [slot], [candidates[single]], [words[single]], references, last,
                                  exact_chain=exact_chain)
        seconds["singles"] = time.process_time() - began
        single_bounds = np.full((single.size, last + 1), np.inf)
        for layer, values in passes.bounds.items():
            single_bounds[:, layer] = values
    columns = [b for _, b in settled] + list(single_bounds)
    total = np.max(np.stack(columns), axis=0)
    return GroupCertificate(total, tuple(settled), single, single_bounds, generations, seconds)
