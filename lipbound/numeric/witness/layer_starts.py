"""Starts of a multi-head layer's witness search built from its heads: scouted alone, tied together, combined.

A layer ``F(X) = sum_h f^h(X) W_O^h`` is many times dearer to evaluate than one of its heads through its block of
``W_O`` (SmolLM2: nine heads on a working width of 576 against one head on the 192 directions its projections see,
about 27 times per input and step), and its witnesses so far were one head's tied keys.  So the layer's budget goes
first to its heads, then to inputs where several of them add:

* :func:`scout_heads` -- each head through ``W_O^h`` alone (:func:`head_problem`, the layer's clock), in its own
  reduced chart: its kernel's starts ranked and its best two polished for an equal share, the result lifted to
  full tokens of the domain;
* :func:`combined_starts` -- the two best heads' inputs mixed, ``t X_a + (1 - t) X_b`` and ``X_a + X_b`` pulled into
  the domain (a midpoint of two tied inputs keeps neither tie exactly; the polish decides);
* :func:`~.kernel_starts.rotary_tied_keys` for pairs and the triple of the best scouted heads, with the value spread
  that makes their images through ``W_O`` add (:func:`aligned_spread`).

Why the heads' images must align.  With two keys tied at weights 1/2, 1/2 for every query of every head in a set
G, the key move e moves row i of the layer by ``sum_{h in G} (c^h_i . e) u_h``, ``u_h = a' S V_h W_O^h / 4`` (a' the
keys' spread in the chart, ``c^h_i`` row i's score-difference gradient in head h).  The heads' key gradients lie in
different directions, so e can be split among them, and for one unit output direction z the component along z is
``sum_h (a' S V_h W_O^h z) (C^h e_h) / 4`` with ``||C^h e_h|| <= sigma_h ||e_h||``: its best split gives ``(sum_h
sigma_h^2 (a' M_h z)^2)^(1/2) / 4``, ``M_h = S V_h W_O^h``, when the rows' patterns ``C^h e_h`` agree.  If the
images ``a' M_h`` of the heads are orthogonal the split gains nothing over the best head alone.
"""

from __future__ import annotations

import numpy as np

from ..model import Layer
from .ascent import polish, rank_pool, start_candidates, take
from .problem import SearchProblem

__all__ = ["head_problem", "scout_heads", "combined_starts", "aligned_spread", "scouted", "layer_starts"]

#: Inputs per head that the scouts polish and lift.
SCOUT_KEEP = 2


def scouted(problem: SearchProblem) -> bool:
    """Whether the layer search starts from its heads: self-attention of a layer of several heads with ``W_O``
    whose kernel is positional and acts at each offset as one dot-product head (``relative_rotation``, which the ties
    of :func:`~.kernel_starts.rotary_tied_keys` need: rotary kernels).

    A dot-product layer has the ``relative_rotation`` too (the identity) but keeps the layer's own starts, whose ties
    of several heads are exact in the layer (:class:`~.starts.TieSurrogate`): scouted, all-MiniLM-L6-v2's six layers
    (n = 8, budgets 8 and 32) reach the same or less (layer 2: 888 against 1361) for about 1.6 times the CPU
    seconds, since their heads do not add through ``W_O`` at the witnesses (docs/mathematics.md, "Layer witnesses
    searched through the heads")."""
    target = problem.target
    kernel, d_k = problem.engine.kernel, problem.engine.d_k
    return (not problem.cross and isinstance(target, Layer) and target.num_heads > 1 and not target.residual
            and kernel.positional and kernel.relative_rotation(d_k, 0) is not None)


def layer_starts(problem: SearchProblem, rng, deadline: float, work: float, starts, first, joint) -> list:
    """The pool of a scouted layer (module docstring), ``[(inputs, family)]`` in the order the ranking takes them:
    the scouts of the four best heads (their best input each, then their second), the joint ties of the pairs and
    the triple of the three best heads (``joint(problem, heads)``: inputs in the layer's working coordinates), and
    the two best heads' inputs combined.  ``starts`` and ``first``: the kernel's starts of one head, all and the few
    that rank the heads (:func:`scout_heads`)."""
    found = scout_heads(problem, rng, deadline, work, starts, first)
    best: dict[int, list[np.ndarray]] = {}
    for h, _, X in found:
        best.setdefault(h, []).append(X)
    ranked = list(best)                                   # heads by their best scout, best first
    pool = [(lifted(problem, np.array([inputs[0] for inputs in best.values()][:4])), "head-scout")]
    pool += [(lifted(problem, np.array([inputs[1] for inputs in list(best.values())[:4] if len(inputs) > 1])),
              "head-scout")]
    top = ranked[:3]
    for heads in ([[a, b] for k, a in enumerate(top) for b in top[k + 1:]] + ([top] if len(top) > 2 else [])):
        pool.append((joint(problem, heads), "joint-tied"))
    if len(ranked) > 1:
        pool.append((combined_starts(problem, best[ranked[0]][0], best[ranked[1]][0]), "head-combined"))
    return [(inputs, family) for inputs, family in pool if len(inputs)]


def head_problem(problem: SearchProblem, h: int) -> SearchProblem:
    """Head h of the layer through its block ``W_O^h`` alone, on the same domain and clock (its own reduced chart)."""
    target = problem.target
    alone = Layer(heads=(target.heads[h],), W_O=target.output_block(h))
    return SearchProblem(alone, "self", problem.domain, None, problem.n, None, problem.clock)


def scout_heads(problem: SearchProblem, rng, deadline: float, work: float, starts, first,
                keep_heads: int = 3) -> list[tuple[int, float, np.ndarray]]:
    """The layer's heads through their blocks of ``W_O``, each searched alone in its own chart, the time to
    ``deadline`` spent where it pays: every head's first starts (``first(head_problem)``, a few inputs) ranked, which
    says which heads can reach high; then the ``keep_heads`` best heads each for an equal share: the kernel's starts
    (``starts(head_problem, rng, deadline, work)``) ranked and the best :data:`SCOUT_KEEP` (one per value) polished.
    Returns ``(head, value, tokens)`` per polished input, best first: ``tokens`` (n, d) a point of the domain,
    ``value`` the head's Jacobian norm there."""
    heads = problem.target.num_heads
    problems = [head_problem(problem, h) for h in range(heads)]
    promise = []
    for alone in problems:
        inputs = first(alone)
        promise.append(float(np.max(start_candidates(alone, inputs, ["first"] * len(inputs), rng, 6).sigma,
                                    initial=-np.inf)) if len(inputs) else -np.inf)
    chosen = [int(h) for h in np.argsort(promise)[::-1][:keep_heads]]
    found = []
    for rank, h in enumerate(chosen):
        now = problem.clock()
        share = (deadline - now) / (len(chosen) - rank)
        alone = problems[h]
        pool = starts(alone, rng, now + 0.3 * share, work) + [(alone.random(rng, 2, 1 - 1e-6), "random")]
        cands = rank_pool(alone, pool, rng, 6, max(1, int(32 / work)), now + 0.6 * share)
        order = np.argsort(-np.where(np.isfinite(cands.sigma), cands.sigma, -np.inf))
        kept: list[int] = []
        for i in order:
            if len(kept) < SCOUT_KEEP and all(abs(cands.sigma[i] - cands.sigma[j]) > 1e-3 * abs(cands.sigma[j])
                                              for j in kept):
                kept.append(int(i))
        cands = polish(alone, take(cands, kept), now + share)
        tokens = alone.lift(cands.X)[0]
        found += [(h, float(value), X) for value, X in zip(cands.sigma, tokens) if np.isfinite(value)]
    return sorted(found, key=lambda item: -item[1])


def lifted(problem: SearchProblem, tokens: np.ndarray) -> np.ndarray:
    """Working coordinates of the layer for full tokens (b, n, d), pulled into the domain."""
    return problem.retract(problem.to_work(tokens), 1 - 1e-6)


def combined_starts(problem: SearchProblem, first: np.ndarray, second: np.ndarray,
                    weights=(0.25, 0.5, 0.75)) -> np.ndarray:
    """Two heads' inputs (n, d) mixed: ``t first + (1 - t) second`` for t in ``weights`` and their sum, pulled into
    the domain; working coordinates of the layer (b, n, width)."""
    center = problem.context.center
    mixed = [center + t * (first - center) + (1 - t) * (second - center) for t in weights]
    mixed.append(center + (first - center) + (second - center))
    return lifted(problem, np.array(mixed))


def aligned_spread(maps: list[np.ndarray], strengths: np.ndarray, frame: np.ndarray, rounds: int = 30) -> np.ndarray:
    """The keys' spread a' (unit, chart coordinates, orthogonal to the columns of ``frame``) that makes the heads'
    images add: a local maximum of ``sum_h sigma_h^2 (a' M_h z)^2`` over unit a' and z (module docstring),
    alternating the two top singular vectors, from z the top right singular vector of the strongest head.

    ``maps``: ``M_h = S V_h W_O^h`` (width, d_out) as pairs ``(S V_h, W_O^h)`` would cost the same here, so they come
    whole; ``strengths``: ``sigma_h``, the norms of the heads' score-difference gradients."""
    projected = [M - frame @ (frame.T @ M) for M in maps]
    strongest = int(np.argmax([s * np.linalg.norm(M, 2) for s, M in zip(strengths, projected)]))
    z = np.linalg.svd(projected[strongest], full_matrices=False)[2][0]
    a = np.zeros(projected[0].shape[0])
    for _ in range(rounds):
        a = np.linalg.svd(np.array([s * (M @ z) for s, M in zip(strengths, projected)]).T, full_matrices=False)[0][:, 0]
        z = np.linalg.svd(np.array([s * (a @ M) for s, M in zip(strengths, projected)]).T, full_matrices=False)[0][:, 0]
    return a / max(float(np.linalg.norm(a)), 1e-300)
