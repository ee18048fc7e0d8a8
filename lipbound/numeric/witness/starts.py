"""Structured starting points of dot-product heads built on :mod:`.structured`: each head's
alpha/beta inputs, several heads of a layer tied at one input, cross-attention's inputs in the charts
of its two domains, and Castin et al.'s adversarial input."""

from __future__ import annotations

import math
from typing import final

import numpy as np

from ...errors import AssumptionError
from ..attention import heads_of, unit_rows
from ..kernels import softmax
from .clock import CALL_WORK
from .structured import TieForm, ascend, structured_starts

__all__ = ["TieSurrogate", "castin_input", "cross_starts", "left_singular", "orthogonal_value_spread", "product_norm",
           "self_starts"]


@final
class TieSurrogate:
    """Predicted Jacobian norm of a multi-head layer at a structured input: two keys at the chart
    points ``mid +- a'``, the ``m = n - 2`` queries at b (chart of a self-attention
    :class:`~.problem.SearchProblem`; positions in the chart, moves in working coordinates, as in
    :mod:`.structured`).

    Head h, with the value map ``V_h W_O^h``, has the key gradient ``g_h = b S A_h + u_h``; its
    queries attend to (key 1, key 2, the m queries) with the softmax of ``(g_h . k_1, g_h . k_2,
    g_h . q + log m)``.  Moving the keys by e gives each query ``sum_h (g_h . e) c_h``,
    ``c_h = (p_1 (v_1 - vbar) - p_2 (v_2 - vbar)) / sqrt 2``, so the prediction is
    ``sqrt(m) sigma_max(sum_h c_h g_h^T)``.  Ties for a set of heads, ``(g_h S) . a = 0``, are linear
    in a (:meth:`place` imposes them by projection), and the midpoint, the least-norm solution of
    ``(g_h S) . mid = s_h(q, q) + margin`` over the tied heads, lifts the keys above the queries' own
    scores for each of them.
    """

    def __init__(self, problem, n: int, margin: float = 10.0):
        self.problem, self.m = problem, n - 2
        engine, S = problem.engine, problem.context.root
        self.S = S
        self.forms = []
        for h in range(engine.H):
            W_Q, W_K, V, b_Q, _, _ = engine.head_weights(h)
            if engine.W_O is not None:
                V = V @ problem.target.output_block(h)
            self.forms.append(TieForm(S, W_Q @ W_K.T / math.sqrt(engine.d_k), W_K @ b_Q / math.sqrt(engine.d_k), V,
                                      self.m, "self", margin))

    def value(self, first: np.ndarray, second: np.ndarray, b: np.ndarray) -> float:
        """The prediction for keys at the chart points ``first``, ``second`` and queries at b."""
        m = self.m
        self.problem.clock.charge(len(self.forms) * (2 * CALL_WORK + 4 * b.size * self.forms[0].SV.shape[1]))
        outputs, directions = [], []
        for form in self.forms:
            g = form.gradient(b[None])[0]
            scores = np.array([g @ (first @ self.S), g @ (second @ self.S), g @ (b @ self.S) + math.log(m)])
            p = softmax(scores)
            values = np.stack([first @ form.SV, second @ form.SV, b @ form.SV])
            mean = p @ values
            outputs.append((p[0] * (values[0] - mean) - p[1] * (values[1] - mean)) / math.sqrt(2))
            directions.append(g)
        # sigma_max(O^T W) for the rank-H matrix sum_h o_h g_h^T, through two thin QRs
        r_out = np.linalg.qr(np.array(outputs).T, mode="r")
        r_dir = np.linalg.qr(np.array(directions).T, mode="r")
        return math.sqrt(m) * float(np.linalg.norm(r_out @ r_dir.T, 2))

    def place(self, a: np.ndarray, b: np.ndarray, tied: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Chart points of the two keys tied for the heads ``tied`` (a the direction they spread in)."""
        gradients = np.array([self.forms[h].gradient(b[None])[0] for h in tied])
        normals = gradients @ self.S
        basis, _ = np.linalg.qr(normals.T)
        a = a - basis @ (basis.T @ a)
        a = a / max(np.linalg.norm(a), 1e-300)
        own = gradients @ (b @ self.S)
        mid = np.linalg.lstsq(normals, np.maximum(own + self.forms[0].margin, 0.0), rcond=None)[0]
        mid = mid * min(1.0, 0.9 / max(np.linalg.norm(mid), 1e-300))
        spread = math.sqrt(max(1 - mid @ mid, 0.0)) * a
        return mid + spread, mid - spread

    def combine(self, X: np.ndarray) -> np.ndarray:
        """Greedily add heads whose tie raises the prediction (one structured input (n, width) in
        the problem's working coordinates)."""
        U = self.problem.to_unit(X[None])[0]
        b = U[2]
        a = unit_rows((U[0] - U[1])[None])[0]
        current, chosen, keys = self.value(U[0], U[1], b), [], None
        while len(chosen) < len(self.forms):
            trials = []
            for h in range(len(self.forms)):
                if h not in chosen:
                    first, second = self.place(a, b, chosen + [h])
                    trials.append((self.value(first, second, b), h, (first, second)))
            best, head, placed = max(trials, key=lambda trial: trial[0])
            if best <= current * 1.001:
                break
            current, chosen, keys = best, chosen + [head], placed
        if keys is None:
            return X
        out = U.copy()
        out[0], out[1] = keys
        return self.problem.from_unit(out[None])[0]


def cross_starts(problem, rng, deadline: float | None = None, count: int = 8, heads: int = 3,
                 keep: int = 3) -> list[tuple[np.ndarray, str]]:
    """Structured inputs of dot-product cross-attention (:mod:`.structured`): every query at the
    chart point b, two context tokens tied for them at ``+-a``, the other context tokens parked
    where the queries' scores are lowest ("cross-structured") or alternating on ``+-a``
    ("cross-alternating", as good for the alpha part and a fallback where the scores are too flat
    to park tokens).  ``(a, b)`` maximise the predicted norm of the role (beta-type for the
    context, alpha-type for the queries, both jointly), positions in the charts of the two
    domains, moves in working coordinates.

    Heads are taken in decreasing order of ``||S_Q A_h|| ||S V_h||`` (at most ``heads``), each
    ascended for a share of the clock's time left before ``deadline``; returns ``[(Z, family)]``."""
    engine, q, x = problem.engine, problem.queries, problem.context
    H, dk = engine.H, engine.d_k
    forms, sizes = [], []
    for h in range(H):
        W_Q, W_K, V, b_Q, _, _ = engine.head_weights(h, queries=True)
        if engine.W_O is not None:
            V = V @ problem.target.output_block(h)
        form = TieForm(x.root, W_Q @ W_K.T / math.sqrt(dk), W_K @ b_Q / math.sqrt(dk), V, problem.m, problem.role,
                       query_shape=q.root)
        forms.append(form)
        sizes.append(np.linalg.norm(form.B, 2) * np.linalg.norm(form.SV, 2))
    chosen = np.argsort(sizes)[::-1][:heads]
    out = []
    signs = np.where(np.arange(x.count) % 2 == 0, 1.0, -1.0)[:, None]
    for rank, h in enumerate(chosen):
        form = forms[h]
        share = None if deadline is None else problem.clock() + (deadline - problem.clock()) / (len(chosen) - rank)
        a, b, _ = ascend(form, count, rng, 150, share, problem.clock)
        first, second = form.keys(a[:keep], b[:keep])
        parked = form.parked(b[:keep])
        for i in range(len(first)):
            U = np.zeros((2, problem.rows, problem.width))
            U[:, q.rows, :q.width] = b[i]
            U[1, x.rows, :x.width] = signs * first[i]
            if x.count >= 2:
                U[0, x.rows, :x.width] = parked[i]
                U[0, x.rows.start, :x.width], U[0, x.rows.start + 1, :x.width] = first[i], second[i]
            Z = problem.from_unit(U * (1 - 1e-6))
            out += ([(Z[:1], "cross-structured")] if x.count >= 2 else []) + [(Z[1:], "cross-alternating")]
    return out


def product_norm(A: np.ndarray, B: np.ndarray) -> float:
    """``||A B||_2`` for a thin A (w, r) and a wide B (r, v), through the triangular factors of their QRs (r x r)."""
    return float(np.linalg.norm(np.linalg.qr(A, mode="r") @ np.linalg.qr(B.T, mode="r").T, 2))


def left_singular(A: np.ndarray, B: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Left singular vectors (w, k) and values (k,) of ``A B`` (``B`` None: of A), A (w, r) thin, ``k <= r``: through
    ``A = Q_A R_A``, ``B^T = Q_B R_B`` and the SVD of the small ``R_A R_B^T`` (the product has rank at most r)."""
    if B is None:
        return np.linalg.svd(A, full_matrices=False)[:2]
    Q, R = np.linalg.qr(A)
    core, widths, _ = np.linalg.svd(R @ np.linalg.qr(B.T, mode="r").T, full_matrices=False)
    return Q @ core, widths


def orthogonal_value_spread(left: np.ndarray, right: np.ndarray | None, frame: np.ndarray) -> np.ndarray:
    """The widest direction of the value map ``left right`` (``right`` None: ``left`` alone) among those orthogonal
    to the orthonormal columns ``frame`` (two keys' score gradients: spread along it, the keys stay tied): the top
    left singular vector of the map with that span taken out (not the projection of the map's widest direction)."""
    return left_singular(left - frame @ (frame.T @ left), right)[0][:, 0]


def castin_input(W_Q: np.ndarray, W_K: np.ndarray, radius: float, n: int, literal: bool = True) -> np.ndarray:
    """Castin, Ablin, Peyre (2024), code vcastin/how-smooth-is-attention (adversarial_data/toolbox.py).

    They take ``numpy.linalg.eig`` of ``K^T Q / sqrt(k)`` built from torch weights, which is our
    ``A^T = W_K W_Q^T / sqrt(d_k)`` (no symmetrisation), keep the real eigenvalues, and if
    ``lambda_max > -8 lambda_min`` use the top eigenvector u: ``x_1 = R u, x_2..x_n = R u / 2``;
    else the bottom one: ``x_1 = -R u, x_2..x_n = R u``.

    ``literal=True`` does exactly that (a d x d ``eig``).  ``literal=False`` uses that the nonzero
    eigenpairs of ``A^T`` are ``(lambda, W_K y)`` for the eigenpairs ``(lambda, y)`` of the
    d_k x d_k matrix ``W_Q^T W_K / sqrt(d_k)`` and that 0 is an eigenvalue when d > d_k: the same
    eigenvalue choice, with an eigenvector sign that may differ (``eig`` fixes none).
    """
    d, d_k = W_Q.shape
    if literal:
        values, vectors = np.linalg.eig(W_K @ W_Q.T / math.sqrt(d_k))
    else:
        values, small = np.linalg.eig(W_Q.T @ W_K / math.sqrt(d_k))
        vectors = W_K @ small
        if d > d_k:
            values = np.append(values, 0.0)
            vectors = np.concatenate([vectors, np.linalg.svd(W_K.T)[2][-1][:, None]], axis=1)
    real = np.isreal(values)
    if not np.any(real):
        raise AssumptionError("A", "at least one real eigenvalue (Castin et al.'s construction)",
                              "only complex eigenvalues", "use search_witness instead")
    values, vectors = values[real].real, vectors[:, real].real
    use_top = values.max() > -8 * values.min()
    u = vectors[:, int(np.argmax(values) if use_top else np.argmin(values))]
    u = u / np.linalg.norm(u)
    X = np.empty((n, d))
    if use_top:
        X[0], X[1:] = radius * u, radius * u / 2
    else:
        X[0], X[1:] = -radius * u, radius * u
    return X


def self_starts(problem, rng, deadline, work: float = 1.0, rotations=None) -> list[tuple[np.ndarray, str]]:
    """Structured starts of self-attention: for every dot-product head, the best alpha/beta inputs
    (found in that head's own reduced chart, for the value map the target applies: ``W_V^h W_O^h`` in a
    layer), several heads tied at once, Castin et al.'s input.  ``rotations(head)``: the matrices ``R`` (d_k, d_k)
    whose dot-product proxies ``W_Q R`` stand for a positional head (default ``[I]``)."""
    target, n = problem.target, problem.n
    heads = heads_of(target)[0]
    pool = []
    keep = max(1, int((max(2, 24 // len(heads)) if len(heads) > 1 else 16) / work))
    surrogate = None
    through_W_O = getattr(target, "W_O", None) is not None      # a Layer: head h acts through W_O^h
    # heads in decreasing order of a crude size, ||A_h|| ||W_V^h|| ||W_O^h||: the budget may end early
    sizes = [product_norm(h.W_Q, h.W_K.T) / math.sqrt(h.d_k) * np.linalg.norm(h.W_V, 2)
             * (np.linalg.norm(target.output_block(i), 2) if through_W_O else 1.0) for i, h in enumerate(heads)]
    for index in np.argsort(sizes)[::-1]:
        head = heads[index]
        if problem.clock() >= deadline and len(pool) > 0:
            break
        own = problem if len(heads) == 1 else problem.for_head(int(index))
        proxies = [np.eye(head.d_k)] if rotations is None else rotations(head)
        if n >= 3:
            # positions in the head's chart, moves in working coordinates
            W_Q, W_K, W_V, b_Q, _, _ = own.engine.head_weights(0)
            if through_W_O:
                W_V = W_V @ target.output_block(int(index))
            light = len(heads) > 1
            share = (deadline - problem.clock()) / (1 if not light else max(1, len(heads) // 3)) / len(proxies)
            for rotation in proxies:
                starts, _ = structured_starts(W_Q @ rotation, W_K, W_V, rotation.T @ b_Q, 1 - 1e-6, n,
                                              count=16 if light else 32, steps=120 if light else 200,
                                              seed=int(rng.integers(2 ** 31)),
                                              deadline=problem.clock() + max(share, 0.0), clock=problem.clock,
                                              shape=own.context.root)
                tokens = own.lift(starts[:keep])[0]
                pool.append((problem.retract(problem.to_work(tokens)), "structured"))
                if problem.engine.H > 1:
                    surrogate = surrogate or TieSurrogate(problem, n)
                    pool.append((problem.retract(surrogate.combine(pool[-1][0][0])[None]), "tied-heads"))
        try:
            R, c = problem.context.radius, problem.context.center
            castin = castin_input(head.W_Q @ proxies[0], head.W_K, R, n, literal=False)
            signs = np.stack([castin, -castin]) if len(heads) == 1 else castin[None]   # eig fixes no sign
            pool.append((problem.retract(problem.to_work(signs + c)), "castin"))
        except AssumptionError:
            pass
    return pool
