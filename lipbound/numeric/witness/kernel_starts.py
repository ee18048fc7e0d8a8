"""Structured starting points of the witness search, per attention kernel.

:data:`KERNEL_STARTS` maps every registered kernel class (:data:`lipbound.numeric.kernels.KERNELS`;
a test checks the keys) to the starts the search adds to its random ones, or to None (random and
continuation starts only):

* :class:`~lipbound.numeric.kernels.DotProduct` -- two keys tied for many queries (:mod:`.structured`),
  several heads tied at once, Castin et al.'s input (:func:`.starts.self_starts`), and for
  cross-attention the ties in the charts of both domains (:func:`.starts.cross_starts`);
* :class:`~lipbound.numeric.kernels.Rotary` -- at a fixed offset ``Delta = p_j - p_i`` a RoPE head
  is the dot-product head ``A_Delta = c W_Q R(Delta theta) W_K^T``
  (:meth:`~lipbound.numeric.kernels.Rotary.relative_rotation`): the dot-product starts of every head
  with the proxies ``W_Q R_Delta`` of the offset whose ``||A_Delta||`` is largest and of the middle
  offset (no one matrix is exact, since each query sees its keys at its own offsets: the polish then
  climbs on the rotary map itself), and two keys tied for every query at all of its offsets at once
  (:func:`rotary_tied_keys`: the ties are linear in the keys), for the largest heads one by one and for
  all heads together, the same with each query turned to its own point towards the keys' one common move
  (:func:`.spread_starts.rotary_spread_queries`, the largest heads one by one; each head's best query point is
  ranked first, since the pool is ranked in chunks until a deadline), and token 1 tied between key 0 and itself, so
  that one move shifts its query and one of its keys at once, with the later queries at a point where the same two
  keys tie for them too (:func:`rotary_self_tied`, the two largest heads);
* :class:`~lipbound.numeric.kernels.QKNorm` -- the scores are 0-homogeneous in q and k up to the
  regulariser, so their derivatives grow like ``1 / ||k||`` (``1 / ||q||``): one token near the
  affine null set ``x W_K + b_K = 0`` of the keys at the first position, which every query sees
  (or near ``x W_Q + b_Q = 0`` at the last, which sees every key), moved off it by about
  ``sqrt(d_k eps)``, the others on the domain's boundary.

Each start is a batch of inputs in the problem's working coordinates, pulled into the domain.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import CustomKernel, DotProduct, FeatureMap, L2Distance, QKNorm, Rotary, ScaledCosine, Sigmoid
from ..kernels.scores import scale_of
from ..offsets import HeadRows
from .layer_starts import aligned_spread
from .spread_starts import rotary_spread_queries
from .starts import cross_starts, left_singular, orthogonal_value_spread, product_norm, self_starts

__all__ = ["KERNEL_STARTS", "kernel_starts", "joint_ties", "head_ties"]


def _dot_product_starts(problem, rng, deadline, work: float):
    return cross_starts(problem, rng, deadline) if problem.cross else self_starts(problem, rng, deadline, work)


def _head_order(problem) -> list[int]:
    """Heads in decreasing order of ``||W_Q^h|| ||W_K^h|| ||V^h||`` (the budget may end early)."""
    engine = problem.engine
    sizes = [np.prod([np.linalg.norm(M, 2) for M in engine.head_weights(h)[:3]]) for h in range(engine.H)]
    return [int(h) for h in np.argsort(sizes)[::-1]]


def proxy_rotations(head, n: int) -> list[np.ndarray]:
    """The rotations ``R_Delta`` (d_k, d_k) whose dot-product proxies ``W_Q R_Delta`` stand for a rotary head
    in the structured starts: the offset with the largest ``||W_Q R_Delta W_K^T||`` and the middle one of the
    offsets the mask lets occur (module docstring)."""
    kernel = head.kernel
    offsets = HeadRows(head, n).offsets
    rotations = {o: kernel.relative_rotation(head.d_k, o) for o in offsets}
    left, right = np.linalg.qr(head.W_Q)[1], np.linalg.qr(head.W_K)[1]     # ||W_Q R W_K^T|| = ||r_Q R r_K^T||
    largest = max(offsets, key=lambda o: np.linalg.norm(left @ rotations[o] @ right.T, 2))
    return [rotations[o] for o in dict.fromkeys([largest, offsets[len(offsets) // 2]])]


def rotary_tied_keys(problem, heads: list[int], count: int = 3, margins=(10.0,),
                     trade_offs=(0.0, 0.25, 1.0, 4.0, 16.0), penalties=(4.0, 16.0), aligned_only: bool = False
                     ) -> np.ndarray:
    """Chart inputs (b, n, width) of self-attention where the first two tokens are keys tied, at every offset at
    once and for every head in ``heads``, for the queries 2..n-1 of a rotary head or layer (module docstring).

    Every query sits at the chart point b, the keys at ``mid +- a'``: ``mid`` the least-norm point whose scores
    ``(b S A^h_Delta S) . mid`` all equal head h's largest score of a query on a query plus a margin, ``a'`` the
    widest direction of the summed value map ``a S sum_h V_h`` (``V_h W_O^h`` in a layer) made orthogonal to every
    key gradient, so that the two keys tie exactly for every query and head (when the ``(n - 1) |heads|`` key
    gradients are independent: they lie in the span of the heads' key projections).  The keys' part of the Jacobian is
    about ``||F^T b|| (1 - ||mid||^2)^(1/2)``, ``F F^T = sum_h ||S V_h||^2 sum_Delta S A^h_Delta S S A^hT_Delta S`` over
    the keys' offsets; b is the best ``count`` of the top eigenvectors of ``F F^T - t H`` (``H`` the symmetric part
    of the queries' own score forms, t over ``trade_offs`` scaled to the two matrices): a query that scores
    itself high needs a long ``mid``.  For several heads of a layer one more spread makes their images through ``W_O``
    add (:func:`~.layer_starts.aligned_spread`); ``aligned_only``: that spread alone (each input of a layer costs a
    layer evaluation)."""
    engine, n, S = problem.engine, problem.n, problem.context.root
    kernel, d_k = engine.kernel, engine.d_k
    sigma = scale_of(kernel.scale, d_k)
    rotations = [kernel.relative_rotation(d_k, delta) for delta in range(-(n - 1), 1)]
    through_W_O = getattr(problem.target, "W_O", None) is not None
    factors, chosen = [], []
    # the summed value map as a product, group by group: sum_g (S V_g) (sum of the group's W_O^h), a layer's width
    # against the groups' few d_v columns (its decompositions then cost a few d_v, not the layer's width)
    value_factors: dict[int, list] = {}
    for h in heads:
        W_Q, W_K, V, b_Q, _, _ = engine.head_weights(h)
        P, K = S @ W_Q, S @ W_K                                    # the chart's query and key factors
        keys = sum(R @ (K.T @ K) @ R.T for R in rotations[:n - 1])   # offsets -(n-1) .. -1: the keys' offsets
        SV = S @ V
        if through_W_O:
            output = problem.target.output_block(h)
            weight = product_norm(SV, output) ** 2                  # ||S V W_O^h||^2
            group = value_factors.setdefault(h // engine.r, [SV, 0.0])
            group[1] = group[1] + output
        else:
            weight = np.linalg.norm(SV, 2) ** 2
            group = value_factors.setdefault(0, [0.0, None])
            group[0] = group[0] + SV
        factors.append(np.sqrt(weight) * sigma * P @ np.linalg.cholesky(keys + 1e-12 * np.trace(keys) * np.eye(d_k)))
        chosen.append((P, K, b_Q, weight))
    spread_left = np.concatenate([SV for SV, _ in value_factors.values()], axis=1)
    spread_right = None if not through_W_O else np.concatenate([out for _, out in value_factors.values()], axis=0)
    # every form below lives on the span of the heads' query and key factors: eigenvectors there
    span = np.linalg.qr(np.concatenate([M for P, K, _, _ in chosen for M in (P, K)], axis=1))[0]
    F = span.T @ np.concatenate(factors, axis=1)
    gram = F @ F.T
    own_form = sum(weight * sigma * (span.T @ P) @ (K.T @ span) for P, K, _, weight in chosen)
    own_form = (own_form + own_form.T) / 2                         # offset 0: a query on itself
    scale = np.linalg.norm(gram, 2) / max(np.linalg.norm(own_form, 2), 1e-300)
    candidates = (span @ np.concatenate([np.linalg.eigh(gram - t * scale * own_form)[1][:, -count:]
                                         for t in trade_offs], axis=1)).T
    left, widths = left_singular(spread_left, spread_right)
    left, widths = left[:, :d_k], widths[:d_k]                     # the values' widest directions
    value_direction = left[:, 0]

    def spreads(tied: np.ndarray, frame: np.ndarray) -> list[np.ndarray]:
        """The values' widest direction orthogonal to the key gradients (exact ties), and nearly tied ones:
        the top eigenvector of ``S V V^T S - mu sum g g^T`` with ``(g . a')`` a few units for the chart's keys
        (on the span of the values' widest directions and the gradients)."""
        exact = value_direction - frame @ (frame.T @ value_direction)
        out = [exact / max(np.linalg.norm(exact), 1e-300)]
        out.append(orthogonal_value_spread(spread_left, spread_right, frame))
        basis = np.linalg.qr(np.concatenate([left, tied.T], axis=1))[0]
        values = (basis.T @ left) * widths
        value_form, gradients = values @ values.T, (tied @ basis).T @ (tied @ basis)
        unit = np.linalg.norm(value_form, 2) / max(np.linalg.norm(gradients, 2), 1e-300)
        for mu in penalties:
            out.append(basis @ np.linalg.eigh(value_form - mu * unit * gradients)[1][:, -1])
        return out

    def tie(b: np.ndarray, margin: float) -> tuple[np.ndarray, list[np.ndarray]]:
        tied, own = [], []
        for P, K, b_Q, _ in chosen:
            query = sigma * (b @ P + b_Q)                          # g_Delta = query R_Delta K^T
            gradients = np.array([query @ R @ K.T for R in rotations])
            tied.append(gradients[:n - 1])
            own += [max(gradients[n - 1 + delta] @ b for delta in range(-(n - 3), 1))] * (n - 1)
        mid = np.linalg.lstsq(np.concatenate(tied), np.array(own) + margin, rcond=None)[0]
        return mid * min(1.0, 0.95 / max(np.linalg.norm(mid), 1e-300)), tied

    # several heads through W_O: the spread whose images through the heads' blocks of W_O add (layer_starts)
    images = [S @ engine.head_weights(h)[2] @ problem.target.output_block(h) for h in heads] \
        if through_W_O and len(heads) > 1 else None

    def aligned(per_head: list[np.ndarray], frame: np.ndarray) -> list[np.ndarray]:
        if images is None:
            return []
        # row i (2..n-1) reads key 0 at offset -i (index n - 1 - i) and key 1 at 1 - i: its score difference's
        # gradient in the two keys' moves; sigma_h the top singular value of those rows
        strengths = np.array([np.linalg.norm(np.hstack([g[n - 1 - np.arange(2, n)], -g[n - np.arange(2, n)]]), 2)
                              for g in per_head])
        return [aligned_spread(images, strengths, frame)]

    predicted = [np.linalg.norm(F.T @ (span.T @ b)) * math.sqrt(max(1 - np.linalg.norm(tie(b, margins[0])[0]) ** 2,
                                                                    0.0)) for b in candidates]
    out = []
    for k in np.argsort(predicted)[::-1][:count]:
        b = candidates[k]
        for margin in margins:
            mid, per_head = tie(b, margin)
            tied = np.concatenate(per_head)
            frame = np.linalg.svd(tied.T, full_matrices=False)[0]
            kinds = aligned(per_head, frame) if aligned_only else spreads(tied, frame) + aligned(per_head, frame)
            for spread in kinds:
                half = math.sqrt(max(1.0 - mid @ mid, 0.0)) * spread
                U = np.zeros((n, problem.width))
                U[0], U[1], U[2:] = mid + half, mid - half, b
                out.append(U)
    if not out:                                                     # aligned_only with one head: no such spread
        return np.zeros((0, n, problem.width))
    return problem.retract(problem.from_unit(np.array(out)), 1 - 1e-6)


def rotary_self_tied(problem, h: int, trade_offs=(0.25, 1.0, 4.0), count: int = 2) -> np.ndarray:
    """Chart inputs (b, n, width) of self-attention where token 1 is a query tied between key 0 and itself, for head
    h of a rotary head or layer (module docstring): moving token 1 moves its query and one of its two keys at once.

    With key 0 at ``-u`` and token 1 at ``u`` (chart points, ``||u|| = 1``) the row's output moves along
    ``(v_0 - v_1) / 4`` by ``e . g``, ``g = -(A_{-1} + A_0 + A_0^T) S^T u`` (``A_Delta = sigma W_Q R_Delta W_K^T`` in
    working coordinates, where the moves are measured), so the row stretches by about ``||u S V|| ||B u|| / 2``,
    ``B = (A_{-1} + A_0 + A_0^T) S^T``.  u is a top eigenvector of ``S V V^T S^T / ||.|| + t B^T B / ||.||``, turned in
    the plane of an eigenvector of ``Q = sym(C_{-1} + C_0)`` (``C_Delta = S A_Delta S^T``, the scores in the chart) of
    the other sign until ``u^T Q u = 0``, the tie (a direction where no such turn exists is dropped).  The queries
    2..n-1 sit at one chart point where keys 0 and 1 tie for each of them as well (:func:`_tying_queries`), so that
    moving the two keys apart adds the key parts of all later rows to token 1's own part; with n = 2 there are none
    (n < 3: the other tokens sit on token 1 or on key 0)."""
    engine, n, S = problem.engine, problem.n, problem.context.root
    kernel, d_k = engine.kernel, engine.d_k
    sigma = scale_of(kernel.scale, d_k)
    W_Q, W_K, V, _, _, _ = engine.head_weights(h)
    # every form below lives on the span of the head's chart factors (a few d_k of a layer's width)
    span = np.linalg.qr(np.concatenate([S @ W_Q, S @ W_K, S @ V], axis=1))[0]
    if getattr(problem.target, "W_O", None) is not None:
        V = V @ problem.target.output_block(h)
    A = {o: sigma * W_Q @ kernel.relative_rotation(d_k, o) @ W_K.T for o in (-1, 0)}
    B = (A[-1] + A[0] + A[0].T) @ (S.T @ span)
    Q = (span.T @ S) @ (A[-1] + A[0]) @ (S.T @ span)
    Q = 0.5 * (Q + Q.T)
    spread = (span.T @ S @ V) @ (span.T @ S @ V).T
    gradient = B.T @ B
    spread, gradient = (M / max(np.linalg.norm(M, 2), 1e-300) for M in (spread, gradient))
    values, vectors = np.linalg.eigh(Q)
    # the chart's score forms C_Delta = S A_Delta S of the offsets at which queries 2..n-1 read the two keys (and
    # each other), on the span: a query point that ties the keys for every later row (_tying_queries)
    charted = {o: (span.T @ S) @ (sigma * W_Q @ kernel.relative_rotation(d_k, o) @ W_K.T) @ (S.T @ span)
               for o in range(-(n - 1), 1)}
    Q_own = 0.5 * (charted[0] + charted[0].T)
    out = []
    for t in trade_offs:
        for u in np.linalg.eigh(spread + t * gradient)[1][:, -count:].T:
            a = u @ Q @ u
            # eigenvectors of the other sign of the score form, most extreme first: the first that keeps its sign
            # once made orthogonal to u gives the tie
            for w in (vectors.T if a > 0 else vectors.T[::-1]):
                if a == 0:
                    break
                w = w - (w @ u) * u
                if np.linalg.norm(w) <= 1e-12:
                    continue
                w = w / np.linalg.norm(w)
                b, c = u @ Q @ w, w @ Q @ w
                if a * c < 0:
                    roots = (-b + np.array([1.0, -1.0]) * math.sqrt(b * b - a * c)) / c     # tan of the turn
                    turn = math.atan(roots[np.argmin(np.abs(roots))])
                    u = math.cos(turn) * u + math.sin(turn) * w
                    a = 0.0
                    break
            if a != 0:
                continue                                                    # no tie on this direction
            points = _tying_queries(u, charted, Q_own, n)
            u = span @ u
            for rest in [span @ b for b in points] or [u, -u]:
                U = np.empty((n, problem.width))
                U[0], U[1], U[2:] = -u, u, rest
                out.append(U)
    if not out:
        return np.zeros((0, n, problem.width))
    return problem.retract(problem.from_unit(np.array(out)), 1 - 1e-6)


def _tying_queries(u: np.ndarray, charted: dict, own: np.ndarray, n: int, trade_offs=(0.0, 1.0, 4.0)) -> list:
    """Chart points b (unit, on the span) for the queries 2..n-1 of a self-tied start (key 0 at ``-u``, token 1 at
    ``u``) at which the two keys tie for every one of those rows: row i reads key 0 at offset ``-i`` and key 1 at
    ``1 - i``, so the tie ``b C_{-i} (-u) = b C_{1-i} u`` is linear in b (b orthogonal to ``(C_{-i} + C_{1-i}) u``).
    Among those points, the top eigenvectors of ``G - t H`` on the ties' complement: ``G = sum_Delta C_Delta C_Delta^T``
    over the keys' offsets (the rows' key gradients in the chart, which move the outputs of all the later rows
    together) less ``t`` times the queries' own score form ``H`` (a query that scores itself above the keys' common
    level takes the weight from them), with the sign that scores the keys above 0 for the last row.  Empty for
    n < 3."""
    if n < 3:
        return []
    ties = np.array([(charted[-i] + charted[1 - i]) @ u for i in range(2, n)])
    frame = np.linalg.svd(ties.T, full_matrices=False)[0]
    keys = sum(C @ C.T for o, C in charted.items() if o < 0)
    scale = np.linalg.norm(keys, 2) / max(np.linalg.norm(own, 2), 1e-300)
    out = []
    for t in trade_offs:
        form = keys - t * scale * own
        form = form - frame @ (frame.T @ form)
        form = form - (form @ frame) @ frame.T
        b = np.linalg.eigh(0.5 * (form + form.T))[1][:, -1]
        b = b - frame @ (frame.T @ b)
        if np.linalg.norm(b) <= 1e-12:
            continue
        b = b / np.linalg.norm(b)
        level = -b @ charted[-(n - 1)] @ u                                # the keys' score for the last row
        out.append(b if level >= 0 else -b)
    return out


def _by_query_point(inputs: np.ndarray) -> list[np.ndarray]:
    """Consecutive runs of ``inputs`` (b, n, width) that share token 2 (the tied-key starts come as several value
    spreads per query point, best point first)."""
    cuts = [k for k in range(1, len(inputs)) if not np.array_equal(inputs[k, 2], inputs[k - 1, 2])]
    return [part for part in np.split(inputs, cuts) if len(part)]


def _rotary_starts(problem, rng, deadline, work: float):
    """The dot-product starts of every head with its proxies ``W_Q R_Delta``, and two keys tied at every offset
    (:func:`rotary_tied_keys`) for the largest heads (module docstring); self-attention."""
    if problem.cross:
        return []
    pool = []
    if problem.n >= 3:
        order = _head_order(problem)
        ranked = []
        for heads in [[h] for h in order[:3]] + ([order] if len(order) > 1 else []):
            tied = rotary_tied_keys(problem, heads)
            ranked.append([(group, "rotary-tied") for group in _by_query_point(tied)])
            if len(heads) == 1:
                ranked.append([(group, "rotary-spread") for group in rotary_spread_queries(problem, heads[0], tied)])
        # the pool is ranked in chunks until a deadline: each head's best query point first, then the second best
        pool += [entries[rank] for rank in range(max(map(len, ranked))) for entries in ranked if rank < len(entries)]
    if problem.n >= 2:
        pool += [(rotary_self_tied(problem, h), "rotary-self-tied") for h in _head_order(problem)[:2]]
    return pool + self_starts(problem, rng, deadline, work, rotations=lambda head: proxy_rotations(head, problem.n))


def _qk_norm_starts(problem, rng, deadline, work: float):
    """One key near its null set at the first position, seen by every query (or one query near its
    null set at the last position, which sees every key), the other tokens on the domain's boundary:
    the tiny k (q) turns its scores as it moves (module docstring); self-attention."""
    engine = problem.engine
    if problem.cross or problem.n < 2:
        return []
    n, width, pool = problem.n, problem.width, []
    size = math.sqrt(engine.d_k * engine.kernel.eps)
    count = max(2, int(8 / work))
    for h in _head_order(problem)[:3]:
        W_Q, W_K, V, b_Q, b_K, _ = engine.head_weights(h)
        spread = np.linalg.svd(V, full_matrices=False)[0][:, 0]             # the values' widest direction
        for which, (anchor, W, row) in {"keys": (-b_K @ np.linalg.pinv(W_K), W_K, 0),
                                        "queries": (-b_Q @ np.linalg.pinv(W_Q), W_Q, n - 1)}.items():
            Z = rng.standard_normal((count, n, width))                      # random directions, on the boundary
            Z[: count // 2] = np.where(np.arange(n)[:, None] % 2 == 0, 1.0, -1.0) * spread   # or +-spread
            Z *= 1e6 / np.linalg.norm(Z, axis=-1, keepdims=True)
            move = rng.standard_normal((count, width))
            scale = size * np.exp(rng.uniform(math.log(0.3), math.log(30.0), (count, 1)))
            Z[:, row] = anchor + move * scale / np.maximum(np.linalg.norm(move @ W, axis=-1, keepdims=True), 1e-300)
            pool.append((problem.retract(Z), f"qk-norm-{which}"))
    return pool


#: kernel class -> ``starts(problem, rng, deadline, work) -> [(inputs, family)]``, or None: random starts only
KERNEL_STARTS = {DotProduct: _dot_product_starts, Rotary: _rotary_starts, QKNorm: _qk_norm_starts, L2Distance: None,
                 ScaledCosine: None, Sigmoid: None, FeatureMap: None, CustomKernel: None}


def head_ties(problem) -> np.ndarray:
    """Two keys tied for every query of the problem's one head (:func:`rotary_tied_keys`): the few starts that say
    how high a head of a layer can reach through its block of ``W_O`` (:func:`~.layer_starts.scout_heads`); none for
    n < 3."""
    if problem.n < 3:
        return np.zeros((0, problem.n, problem.width))
    return rotary_tied_keys(problem, [0])


def joint_ties(problem, heads: list[int]) -> np.ndarray:
    """Two keys tied for several heads of a rotary layer at once, spread so that their images through ``W_O`` add
    (:func:`rotary_tied_keys` with the aligned spread alone, the best query point); none for n < 3."""
    if problem.n < 3:
        return np.zeros((0, problem.n, problem.width))
    return rotary_tied_keys(problem, heads, count=1, aligned_only=True)


def kernel_starts(problem, rng, deadline, work: float = 1.0) -> list:
    """The structured starts of the problem's kernel (``[]`` when it has none)."""
    entry = KERNEL_STARTS[type(problem.engine.kernel)]
    return [] if entry is None else entry(problem, rng, deadline, work)
