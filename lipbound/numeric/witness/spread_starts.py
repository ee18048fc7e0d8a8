"""Two keys tied for queries that each sit at their own point: a start family for rotary heads and layers.

:func:`~.kernel_starts.rotary_tied_keys` puts every query at one chart point b.  Query i reads key 0 at offset
``-i`` and key 1 at offset ``1 - i``, so with one b the rows' key gradients turn apart with the offset, and a move
of the two keys that raises one row's score difference raises the others' less.  Long searches on SmolLM2 block 0
(the layer, budget 64) end with the queries at distinct points (cosines 0.88-0.99 between them), each turned
towards the one move of the keys that all rows then follow.  This module builds that shape directly.

With the keys moved by ``e_0 = Q_K f_0`` and ``e_1 = Q_K f_1`` (``Q_K`` an orthonormal basis of ``range W_K`` in
working coordinates, where moves are measured) and query i at the chart point ``b_i`` (``||b_i|| <= 1``, token
``b_i S``), the score difference of row i moves by

    c_i . f = b_i . (P N_i f),    N_i = sigma [R_{-i} W_K^T Q_K, -R_{1-i} W_K^T Q_K],    P = S W_Q,

and when the two keys are tied for every row (weights 1/2, 1/2, the other keys far below) row i's output moves by
``(v_0 - v_1) / 4 (c_i . f)``: the key part of the Jacobian on that move is ``||v_0 - v_1|| / 4 (sum_i (c_i .
f)^2)^(1/2)``.  Each ``b_i`` maximises its own term at ``b_i = P N_i f / ||P N_i f||``, and then the sum is ``f^T
(sum_i N_i^T P^T P N_i) f``: f is a top eigenvector of that ``2 d_k x 2 d_k`` form (one b for all rows can do no
better than ``max_b sum_i (b . P N_i f)^2``, at most this).  The keys are then placed as in
:func:`~.kernel_starts.rotary_tied_keys`: ``mid +- half``, ``mid`` the least-norm point that gives each row's two
keys one score a margin above the row's scores of the queries, ``half`` along the widest direction of the value map
orthogonal to every row's two key gradients.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.scores import scale_of
from .starts import orthogonal_value_spread

__all__ = ["rotary_spread_queries"]


def rotary_spread_queries(problem, h: int, tied: np.ndarray, turns=(0.2, 0.5), margins=(10.0,)) -> list[np.ndarray]:
    """Chart inputs (b, n, width) of self-attention with tokens 0 and 1 keys tied for every query 2..n-1 of head h
    (of a rotary head or layer), each query turned from a common point towards one common move of the keys (module
    docstring).

    ``tied`` holds inputs (working coordinates) of :func:`~.kernel_starts.rotary_tied_keys` for head h: their common
    query point b (token 2's chart point) was chosen to keep the queries' own scores low, which a query at its own
    optimum ``b_i*`` alone does not (on SmolLM2 block 0 head 7 those score themselves 250 above the keys' reach).  So
    f is the top right singular vector of the rows ``c_i`` at b, and query i sits at ``(1 - t) b + t b_i*``
    normalised, for t in ``turns``.  One array of inputs (working coordinates) per common point, in the order of
    ``tied``; none for n < 3."""
    engine, n, S = problem.engine, problem.n, problem.context.root
    if n < 3 or len(tied) == 0:
        return []
    kernel, d_k = engine.kernel, engine.d_k
    sigma = scale_of(kernel.scale, d_k)
    W_Q, W_K, V, b_Q, _, _ = engine.head_weights(h)
    output = problem.target.output_block(h) if getattr(problem.target, "W_O", None) is not None else None
    P, K, SV = S @ W_Q, S @ W_K, (S @ V, output)                  # the value map S V (W_O^h) as its factors
    basis = np.linalg.qr(W_K)[0]                                    # Q_K: the key moves that change scores
    C = W_K.T @ basis
    rotations = {delta: kernel.relative_rotation(d_k, delta) for delta in range(-(n - 1), 1)}
    rows = range(2, n)
    moves = {i: sigma * np.hstack([rotations[-i] @ C, -rotations[1 - i] @ C]) for i in rows}     # N_i
    out = []
    points = problem.to_unit(tied)[:, 2]
    for k, b in enumerate(points):
        if any(np.allclose(b, other, atol=1e-9) for other in points[:k]):
            continue                                                # the tied starts repeat b for several spreads
        group = []
        rows_at_b = np.array([b @ P @ moves[i] for i in rows])       # c_i, (n - 2, 2 d_k)
        f = np.linalg.svd(rows_at_b, full_matrices=False)[2][0]
        for turn in turns:
            B = np.zeros((n, problem.width))
            for i in rows:
                best = P @ (moves[i] @ f)
                best = best * np.sign(best @ b) / max(np.linalg.norm(best), 1e-300)
                B[i] = (1 - turn) * b + turn * best
                B[i] /= max(np.linalg.norm(B[i]), 1e-300)
            for margin in margins:
                group.append(_tied_pair(B, P, K, SV, b_Q, sigma, rotations, margin))
        out.append(problem.retract(problem.from_unit(np.array(group)), 1 - 1e-6))
    return out


def _tied_pair(B: np.ndarray, P, K, SV, b_Q, sigma: float, rotations: dict, margin: float,
               rcond: float = 1e-2) -> np.ndarray:
    """The input with the queries ``B[2:]`` (chart points) and keys 0, 1 at ``mid +- half`` tied for every row:
    ``mid`` the least-norm point scoring both keys of row i ``margin`` above row i's scores of the queries 2..i, and
    ``half`` along the widest direction of the value map ``S V (W_O^h)`` (``SV`` its two factors, the second None for
    a head) orthogonal to the key gradients (:func:`~.starts.orthogonal_value_spread`), scaled to keep the keys in
    the chart's unit ball."""
    n = len(B)
    gradients, own = [], []
    for i in range(2, n):
        query = sigma * (B[i] @ P + b_Q)
        own.append(max(query @ rotations[j - i] @ (K.T @ B[j]) for j in range(2, i + 1)))
        gradients += [query @ rotations[-i] @ K.T, query @ rotations[1 - i] @ K.T]
    G = np.array(gradients)
    # one score for all rows' keys (per-row levels make the system inconsistent along its tiny singular directions)
    mid = np.linalg.lstsq(G, np.full(len(G), max(own) + margin), rcond=rcond)[0]
    mid = mid * min(1.0, 0.95 / max(float(np.linalg.norm(mid)), 1e-300))
    frame, widths, _ = np.linalg.svd(np.vstack([G, mid]).T, full_matrices=False)
    frame = frame[:, widths > rcond * widths[0]]
    half = math.sqrt(max(1.0 - mid @ mid, 0.0)) * orthogonal_value_spread(*SV, frame)
    U = B.copy()
    U[0], U[1] = mid + half, mid - half
    return U
