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
such start has ``||DF(Y)|| = 13.75`` (head 2's rows 6 and 7 split by moving token 6) where projected ascent from X and
from random points found 5.18.

The covariance grows with the two keys' distance as well: moving the keys j and l apart, ``e_j = -e_l`` along the top
left singular vector w of ``M = W_K W_Q^T`` (``a_j`` moves by ``e_j M``), widens ``x . (a_j - a_l)`` by up to
``2^(1/2) tau ||M||`` for a share tau of eps, and the rest of eps, along the part of the tie's gradient
``c q_i W_K^T`` orthogonal to w, ties the two keys in row i (:func:`_widened`; the tie is affine in the keys' moves,
so it is solved exactly).  On the same layer the best widened start has ``||DF(Y)|| = 16.8`` before the climb.
Floats only: a start is a candidate for the witness ascent, never a bound.
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
#: shares tau of eps that move a pair of keys apart in a widened start (the rest ties them; on MiniLM's layer 0 at
#: 1e-1 R the best widened starts used 0.8 and 0.95 of eps, half of eps gave 14.2 where 0.8 gave 16.8)
WIDEN_SHARES = (0.8, 0.95)


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


def _widened(engine: AttentionMap, at_x, X: np.ndarray, eps: float, c: float) -> list[np.ndarray]:
    """Points of ``U(X, eps)`` that move two keys j, l of row i's two largest weights other than i's own apart and
    tie them (module docstring): ``e_j = -e_l = (tau w + delta g) / 2^(1/2)``, w the top left singular vector of
    ``W_K W_Q^T`` (its sign adding to the pair's own distance), g the unit part of ``c q_i W_K^T`` orthogonal to w,
    delta solving ``s_ij(Y) = s_il(Y)`` (token i moves neither as key nor as query), kept where
    ``tau^2 + delta^2 < eps^2``."""
    n = X.shape[0]
    starts: list[np.ndarray] = []
    if n < 3:   # a row needs two keys besides its own token
        return starts
    for h in range(engine.H):
        W_Q, W_K = engine.head_weights(h)[:2]
        scores, queries, keys = at_x.S[0, h], at_x.Q[0, h], at_x.K[0, h]
        w = None
        for i in range(n):
            first, second = [j for j in np.argsort(-scores[i]) if j != i][:2]   # row i's query stays
            tie = c * (queries[i] @ W_K.T)                  # s_ij moves by tie . e_j
            # the tie alone needs |delta| >= gap / (2^(1/2) ||tie||): rows it cannot reach are left out
            reach = eps * np.sqrt(1 - min(WIDEN_SHARES) ** 2) * np.sqrt(2) * np.linalg.norm(tie)
            if not scores[i, first] - scores[i, second] < reach:
                continue
            if w is None:   # through the thin QR of W_K: M = Q_K (R_K W_Q^T), a (d_k, d) SVD
                basis, upper = np.linalg.qr(W_K)
                w = basis @ np.linalg.svd(upper @ W_Q.T, full_matrices=False)[0][:, 0]
            g = tie - (tie @ w) * w
            if not np.linalg.norm(g) > 0:
                continue
            g /= np.linalg.norm(g)
            # the sign of w that adds to the pair's own distance along the widened direction w M
            side = 1.0 if ((w @ W_K) @ W_Q.T) @ ((keys[first] - keys[second]) @ W_Q.T) >= 0 else -1.0
            for share in WIDEN_SHARES:
                tau = side * share * eps
                # s_ij - s_il moves by tie . (e_j - e_l) = 2^(1/2) (tau tie . w + delta tie . g)
                delta = ((scores[i, second] - scores[i, first]) / np.sqrt(2) - tau * (tie @ w)) / (tie @ g)
                if tau ** 2 + delta ** 2 < (eps * (1 - 1e-9)) ** 2:
                    move = (tau * w + delta * g) / np.sqrt(2)
                    Y = X.copy()
                    Y[first] += move
                    Y[second] -= move
                    starts.append(Y)
    return starts


def pair_starts(target: Layer, X: np.ndarray, eps: float, count: int = 6) -> list[np.ndarray]:
    """Up to ``count`` points Y with ``||Y - X||_F < eps``, a query's weights split between two keys (module
    docstring: one token moved, or two keys moved apart), the largest query and key paths (:func:`_paths_size`)
    first."""
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
    starts = _widened(engine, at_x, X, eps, c)
    if problems:
        moves = _least_moves(np.array([G for _, G, _ in problems]),
                             np.array([limits for _, _, limits in problems]))
        for (i, _, _), e in zip(problems, moves):
            if np.linalg.norm(e) < eps * (1 - 1e-9):
                Y = X.copy()
                Y[i] += e
                starts.append(Y)
    sizes = [_paths_size(engine, target, Y, c) for Y in starts]
    return [starts[k] for k in np.argsort(sizes)[::-1][:count]]
