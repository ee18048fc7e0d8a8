"""Starting points for the witness of an attention layer on a large ball: one query's weights split between two keys.

A softmax head's query path at a point Y is ``c e_i W_Q K'^T J'_i V' W_O^h`` (row i), the covariance under
``p'_i`` of ``x . a_j`` and ``y . u_j`` (``a_j = W_Q k_j^T``, ``u_j = v_j W_O^h``).  It is largest where ``p'_i`` puts
half its mass on each of two keys j, l far apart in both: then it is ``c (a_j - a_l)(u_j - u_l)^T / 4``.  Where the
weights of X are nearly one-hot the layer's Jacobian is small at X and along the ascent from X, yet moving the
query token i alone, by the least ``e`` with

    c e . (a_j - a_l) = s_il - s_ij   and   c e . (a_j - a_m) >= s_im - s_ij + margin   (m != j, l),

makes the two keys tie above every other (only ``q_i`` moves: ``s_im(Y) = s_im + c e . a_m``).  On MiniLM's layer 0
at 1e-1 R this finds ``||DF(Y)|| = 12.6`` at a point of U where projected ascent from X and from random points found
5.18.  Floats only: a start is a candidate for the witness ascent, never a bound.
"""

from __future__ import annotations

import numpy as np

from ..numeric.attention import AttentionMap
from ..numeric.model import Layer
from .scores import score_scale

__all__ = ["pair_starts"]

#: candidate (head, query, key pair) triples solved for a start, the largest ``c ||a_j - a_l|| ||u_j - u_l|| / 4``
#: first (the covariance the split reaches)
PAIR_CANDIDATES = 60
#: how far the two keys' scores end above every other key's (``exp(-3)`` of the row's mass per other key at most)
PAIR_MARGIN = 3.0


def _least_move(G: np.ndarray, h: np.ndarray, sweeps: int = 200) -> np.ndarray:
    """``argmin ||e||`` subject to ``G e <= h`` (Hildreth's dual coordinate ascent; floats, approximate)."""
    lam, e = np.zeros(len(h)), np.zeros(G.shape[1])
    sizes = np.einsum("ij,ij->i", G, G)
    rows = np.flatnonzero(sizes > 0)
    for _ in range(sweeps):
        moved = 0.0
        for r in rows:
            step = max(-lam[r], (G[r] @ e - h[r]) / sizes[r])
            lam[r] += step
            e -= step * G[r]
            moved = max(moved, abs(step) * sizes[r] ** 0.5)
        if moved <= 1e-12 * (1.0 + np.linalg.norm(e)):
            break
    return e


def pair_starts(target: Layer, X: np.ndarray, eps: float, count: int = 6) -> list[np.ndarray]:
    """Up to ``count`` points Y with ``||Y - X||_F < eps`` (only one token moved), the query's weights split between
    two keys (module docstring), in the order of the covariance they aim at."""
    X = np.asarray(X, dtype=np.float64)
    engine = AttentionMap(target)
    c = float(score_scale(engine).hi)
    n = X.shape[0]
    j, m = np.triu_indices(n, 1)
    at_x = engine.linearize(engine.to_work(X)[None])                        # the one float forward at X
    heads, candidates = [], []
    for h in range(engine.H):
        keys = at_x.K[0, h] @ engine.head_weights(h)[0].T                   # a_j = W_Q k_j^T, (n, d)
        scores = at_x.S[0, h]
        outputs = at_x.V[0, h] @ target.output_block(h)                     # u_j
        heads.append((keys, scores))
        apart = np.linalg.norm(keys[j] - keys[m], axis=1)                    # ||a_j - a_m|| per pair
        reach = c * apart * np.linalg.norm(outputs[j] - outputs[m], axis=1) / 4
        # the tie alone moves the query by |s_ij - s_im| / (c ||a_j - a_m||): pairs it cannot reach are left out
        tie = np.abs(scores[:, j] - scores[:, m]) / np.maximum(c * apart, 1e-300)   # (n queries, pairs)
        for i, k in zip(*np.nonzero(tie < eps)):
            candidates.append((reach[k], h, i, j[k], m[k]))
    candidates.sort(key=lambda item: -item[0])
    starts = []
    for _, h, i, first, second in candidates[:PAIR_CANDIDATES]:
        keys, scores = heads[h]
        others = [o for o in range(n) if o not in (first, second)]
        tie = c * (keys[first] - keys[second])
        G = np.vstack([tie[None], -tie[None], c * (keys[others] - keys[first])])
        limits = np.concatenate([[scores[i, second] - scores[i, first], scores[i, first] - scores[i, second]],
                                 scores[i, first] - scores[i, others] - PAIR_MARGIN])
        # each constraint alone already needs |limit| / ||row|| where its limit is negative
        if np.any(-limits >= eps * np.linalg.norm(G, axis=1)):
            continue
        e = _least_move(G, limits)
        if np.linalg.norm(e) < eps * (1 - 1e-9):
            Y = X.copy()
            Y[i] += e
            starts.append(Y)
            if len(starts) == count:
                break
    return starts
