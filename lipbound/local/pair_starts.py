"""Starting points for the witness of an attention layer on a large ball: one query's weights split between two keys.

A softmax head's query path at a point Y is ``c e_i W_Q K'^T J'_i V' W_O^h`` (row i), the covariance under
``p'_i`` of ``x . a_j`` and ``y . u_j`` (``a_j = W_Q k_j^T``, ``u_j = v_j W_O^h``).  It is largest where ``p'_i`` puts
half its mass on each of two keys j, l far apart in both: then it is ``c (a_j - a_l)(u_j - u_l)^T / 4``.  Where the
weights of X are nearly one-hot the layer's Jacobian is small at X and along the ascent from X, yet moving the
query token i alone, by the least ``e`` with

    c e . (a_j - a_l) = s_il - s_ij   and   c e . (a_j - a_m) >= s_im - s_ij + margin   (m != j, l),

makes the two keys tie above every other (only ``q_i`` moves: ``s_im(Y) = s_im + c e . a_m``).  Moving token i also
moves key i of every other row, which may split a second row at once; the starts are ranked by the query and key
paths' Frobenius norms at the point (:func:`_paths_size`, one forward each).  On MiniLM's layer 0 at 1e-1 R the best
start has ``||DF(Y)|| = 13.75`` (head 2's rows 6 and 7 split by moving token 6) where projected ascent from X and from
random points found 5.18.  Floats only: a start is a candidate for the witness ascent, never a bound.
"""

from __future__ import annotations

import numpy as np

from ..numeric.attention import AttentionMap
from ..numeric.model import Layer
from .scores import score_scale

__all__ = ["pair_starts"]

#: candidate (head, query, key pair) triples solved for a start, the largest ``c ||a_j - a_l|| ||u_j - u_l|| / 4``
#: first (the covariance the split reaches); the starts are then ranked by :func:`_paths_size` (on MiniLM's layer 0
#: at 1e-1 R the best start, 13.75, is the 81st triple by reach and splits two rows)
PAIR_CANDIDATES = 150
#: how far the two keys' scores end above every other key's (0: at least level with them; a margin of 3 left out
#: the best start above)
PAIR_MARGIN = 0.0


def _least_moves(G: np.ndarray, h: np.ndarray, sweeps: int = 200) -> np.ndarray:
    """``argmin ||e||`` subject to ``G_c e <= h_c`` for each problem c of the batch (G (C, m, d), h (C, m); Hildreth's
    dual coordinate ascent, all problems at once; floats, approximate)."""
    lam, e = np.zeros(h.shape), np.zeros((G.shape[0], G.shape[2]))
    sizes = np.einsum("cmd,cmd->cm", G, G)
    safe = np.where(sizes > 0, sizes, 1.0)
    for _ in range(sweeps):
        moved = np.zeros(G.shape[0])
        for r in range(G.shape[1]):
            step = np.where(sizes[:, r] > 0,
                            np.maximum(-lam[:, r], (np.einsum("cd,cd->c", G[:, r], e) - h[:, r]) / safe[:, r]), 0.0)
            lam[:, r] += step
            e -= step[:, None] * G[:, r]
            moved = np.maximum(moved, np.abs(step) * np.sqrt(sizes[:, r]))
        if np.all(moved <= 1e-9 * (1.0 + np.linalg.norm(e, axis=1))):
            break
    return e


def _paths_size(engine: AttentionMap, target: Layer, Y: np.ndarray, c: float) -> float:
    """``(sum_(h,i) ||Q_hi||_F^2 + ||K_hi||_F^2)^(1/2)`` at Y: the Frobenius norms of every head's query and key path
    rows (``Q_hi = c W_Q K^T J_i V W_O^h``, ``K_hi: E -> c (E b_i)^T J_i V W_O^h``), from one forward through Gram
    matrices of the keys and values (n x n); ranks the starts, never a bound."""
    at = engine.linearize(engine.to_work(Y)[None])
    total = 0.0
    for h in range(engine.H):
        W_Q, W_K = engine.head_weights(h)[:2]
        keys, values = at.K[0, h] @ W_Q.T, at.V[0, h] @ target.output_block(h)
        b_squares = np.sum((at.Q[0, h] @ W_K.T) ** 2, axis=1)
        P = at.P[0, h]
        J = P[:, :, None] * np.eye(P.shape[1]) - P[:, :, None] * P[:, None, :]      # J_i, (n, n, n)
        JU, JA = J @ (values @ values.T), J @ (keys @ keys.T)                       # J_i U U^T, J_i A A^T
        total += float(np.sum(JA * np.swapaxes(JU, 1, 2))) + float(b_squares @ np.sum(J * np.swapaxes(JU, 1, 2),
                                                                                        axis=(1, 2)))
    return c * float(np.sqrt(max(total, 0.0)))


def pair_starts(target: Layer, X: np.ndarray, eps: float, count: int = 6) -> list[np.ndarray]:
    """Up to ``count`` points Y with ``||Y - X||_F < eps`` (only one token moved), the query's weights split between
    two keys (module docstring), the largest query and key paths (:func:`_paths_size`) first."""
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
    problems = []
    for _, h, i, first, second in candidates[:PAIR_CANDIDATES]:
        keys, scores = heads[h]
        others = [o for o in range(n) if o not in (first, second)]
        tie = c * (keys[first] - keys[second])
        G = np.vstack([tie[None], -tie[None], c * (keys[others] - keys[first])])
        limits = np.concatenate([[scores[i, second] - scores[i, first], scores[i, first] - scores[i, second]],
                                 scores[i, first] - scores[i, others] - PAIR_MARGIN])
        # each constraint alone already needs |limit| / ||row|| where its limit is negative
        if not np.any(-limits >= eps * np.linalg.norm(G, axis=1)):
            problems.append((i, G, limits))
    if not problems:
        return []
    moves = _least_moves(np.array([G for _, G, _ in problems]), np.array([limits for _, _, limits in problems]))
    starts = []
    for (i, _, _), e in zip(problems, moves):
        if np.linalg.norm(e) < eps * (1 - 1e-9):
            Y = X.copy()
            Y[i] += e
            starts.append(Y)
    sizes = [_paths_size(engine, target, Y, c) for Y in starts]
    return [starts[k] for k in np.argsort(sizes)[::-1][:count]]
