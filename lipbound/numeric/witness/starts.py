"""Structured starting points for dot-product heads: ties between far keys (alpha- and
beta-type), several heads tied at one input, and Castin et al.'s adversarial input."""

from __future__ import annotations

import math
import time
from typing import final

import numpy as np

from ...errors import AssumptionError
from ..blas import one_blas_thread
from ..attention import AttentionMap, unit_rows

__all__ = ["structured_starts", "TieSurrogate", "castin_input", "cross_starts"]


@one_blas_thread
def structured_starts(W_Q: np.ndarray, W_K: np.ndarray, W_V: np.ndarray, b_Q: np.ndarray, radius: float,
                      n: int, count: int = 64, steps: int = 300, margin: float = 10.0,
                      seed: int = 0, deadline: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Alpha/beta-type inputs for one dot-product head, ball about the origin.

    With ``A = W_Q W_K^T / sqrt(d_k)``, ``u = W_K b_Q / sqrt(d_k)`` and ``m = n - 2`` queries,
    maximises over unit ``a, b`` the predicted Jacobian norm

        phi(a, b)^2 = R^2 ||W_V^T a||^2 ( m/2 ||R A^T b + u||^2 + R^2 ||A a||^2 )

    under the tie ``(R A^T b + u) . a = 0`` (linear in a: imposed exactly by projection after
    every step) and a penalty keeping the query-query score ``R^2 b^T A b + R u . b`` below
    ``-margin``.  Starts: b among the top left singular vectors of A (and random), a the best of the top left
    singular vectors of ``W_V`` projected on the tie hyperplane; then Riemannian Adam on both spheres.
    The input is ``x_1 = R a``, ``x_2 = -R a``, ``x_3 = .. = x_n = R b``.

    Parameters
    ----------
    W_Q, W_K, W_V : ndarray, shapes (d, d_k), (d, d_k), (d, d_v)
    deadline : float, optional
        ``time.perf_counter()`` at which the ascent stops (the inputs are valid at every step).
    b_Q : ndarray, shape (d_k,)
        Query bias with the ball's centre folded in (``b_Q + c W_Q``); the key bias only shifts
        a whole row of scores.
    radius : float
    n : int
        Tokens, at least 3 (two keys and a query).

    Returns
    -------
    X : ndarray, shape (count, n, d)
        Candidate inputs, best first.
    phi : ndarray, shape (count,)
        Predicted Jacobian norms (:func:`_predicted_norm`, which counts the attention the
        queries keep on each other).
    """
    if n < 3:
        raise AssumptionError("n", "at least 3 tokens (two keys and a query)", repr(n),
                              "use random or Castin starts for n = 2")
    d, d_k = W_Q.shape
    R = float(radius)
    A = W_Q @ W_K.T / math.sqrt(d_k)
    u = W_K @ b_Q / math.sqrt(d_k)
    VV, AtA, As = W_V @ W_V.T, A.T @ A, A + A.T
    m = n - 2
    rng = np.random.default_rng(seed)
    left = np.linalg.svd(A)[0][:, :min(8, d)]
    k = left.shape[1]
    coef = rng.standard_normal((count, k)) * np.geomspace(1.0, 0.2, k)
    coef[:min(k, count)] = np.eye(k)[:min(k, count)]
    b = unit_rows(coef @ left.T)
    b[count // 2:] = unit_rows(rng.standard_normal((count - count // 2, d)))

    def tie(a, b):
        w = R * b @ A + u
        return unit_rows(a - (np.sum(w * a, axis=1) / np.maximum(np.sum(w * w, axis=1), 1e-300))[:, None] * w)

    # a: of the top left singular vectors of W_V projected on the tie hyperplane, the one W_V stretches most
    w = unit_rows(R * b @ A + u)
    tops = np.linalg.svd(W_V, full_matrices=False)[0][:, :min(8, W_V.shape[1])].T          # (k, d)
    projected = tops[None] - (tops @ w.T).T[:, :, None] * w[:, None, :]                     # (count, k, d)
    stretch = np.linalg.norm(projected @ W_V, axis=2) / np.maximum(np.linalg.norm(projected, axis=2), 1e-300)
    a = tie(projected[np.arange(count), np.argmax(stretch, axis=1)], b)
    moments = [np.zeros_like(a), np.zeros_like(b)]
    squares = [np.zeros_like(a), np.zeros_like(b)]
    for step in range(1, steps + 1):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        lr = 0.02 * (1 - step / (steps + 1)) + 0.001
        wa = a @ VV
        w = R * b @ A + u
        inner = 0.5 * m * np.sum(w * w, axis=1) + R * R * np.sum((a @ A.T) ** 2, axis=1) + 1e-300
        excess = np.maximum(R * R * np.sum(b * (b @ A.T), axis=1) + R * b @ u + margin, 0.0) / (R * R)
        grad_a = 2 * wa / np.maximum(np.sum(a * wa, axis=1), 1e-300)[:, None] + 2 * R * R * (a @ AtA) / inner[:, None]
        grad_b = m * R * (w @ A.T) / inner[:, None] - 20 * excess[:, None] * (b @ As + u / R)
        for index, (x, g) in enumerate(((a, grad_a), (b, grad_b))):
            g = g - np.sum(g * x, axis=1, keepdims=True) * x        # tangent to the sphere
            moments[index] = 0.9 * moments[index] + 0.1 * g
            squares[index] = 0.999 * squares[index] + 0.001 * g * g
            x[:] = unit_rows(x + lr * (moments[index] / (1 - 0.9 ** step))
                         / (np.sqrt(squares[index] / (1 - 0.999 ** step)) + 1e-12))
        a[:] = tie(a, b)
    # the queries may do better inside the ball (a weaker pull towards each other): scan their radius
    phi = _predicted_norm(a, b, A, u, W_V, R, m)
    for shrink in np.linspace(0.95, 0.3, 14):
        a_shrunk = tie(a, shrink * b)
        trial = _predicted_norm(a_shrunk, shrink * b, A, u, W_V, R, m)
        better = trial > phi
        a[better], b[better], phi[better] = a_shrunk[better], shrink * b[better], trial[better]
    order = np.argsort(-phi)
    a, b, phi = a[order], b[order], phi[order]
    X = np.empty((count, n, d))
    X[:, 0], X[:, 1] = R * a, -R * a
    X[:, 2:] = R * b[:, None, :]
    return X, phi


def _predicted_norm(a: np.ndarray, b: np.ndarray, A: np.ndarray, u: np.ndarray, W_V: np.ndarray,
                    R: float, m: int) -> np.ndarray:
    """Predicted ``||Df||`` at ``x_1 = R a, x_2 = -R a, x_3..x_{m+2} = R b`` (rows of a, b: a batch).

    The queries attend to (key 1, key 2, the m queries) with the softmax of
    ``(R t, -R t, R^2 b^T A b + R u . b + log m)``, ``t = (R A^T b + u) . a``.  Moving the keys
    by ``+-g / sqrt 2`` along ``w = R A^T b + u`` gives each query ``||w|| ||c||`` with
    ``c = (p_1 (v_1 - vbar) - p_2 (v_2 - vbar)) / sqrt 2`` (beta part); moving a query along
    ``A a`` gives ``2 R ||A a|| ||p_1 p_2 (v_1 - v_2) + ...||``, taken as ``4 p_1 p_2 R^2 ||A a||
    ||W_V^T a||`` (alpha part); the two add in quadrature, the beta part ``sqrt(m)`` times.
    """
    w = R * b @ A + u
    t = R * np.sum(w * a, axis=1)
    scores = np.stack([t, -t, R * R * np.sum(b * (b @ A.T), axis=1) + R * b @ u + math.log(max(m, 1))], axis=1)
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    va, vb = R * a @ W_V, R * b @ W_V                 # the value bias cancels in every difference
    mean = p[:, :1] * va - p[:, 1:2] * va + p[:, 2:] * vb
    c = (p[:, :1] * (va - mean) - p[:, 1:2] * (-va - mean)) / math.sqrt(2)
    beta = math.sqrt(m) * np.linalg.norm(c, axis=1) * np.linalg.norm(w, axis=1)
    alpha = 4 * p[:, 0] * p[:, 1] * R * R * np.linalg.norm(a @ A.T, axis=1) * np.linalg.norm(a @ W_V, axis=1)
    return np.sqrt(beta ** 2 + alpha ** 2)


@final
class TieSurrogate:
    """Predicted Jacobian norm of a multi-head layer at a structured input ``u_1 = a``,
    ``u_2 = -a``, ``u_3 = .. = u_n = b`` (chart coordinates of a :class:`~.problem.SearchProblem`,
    where the domain is the unit ball), counting the queries' rows under key moves
    ``e_1 = -e_2 = g / sqrt 2``.

    For head h, with ``w_h = A_h^T b + u_h`` (weights seen from the chart), the queries' attention
    ``p`` on (key 1, key 2, the m queries) is the softmax of ``(w_h . a, -w_h . a, b^T A_h b + u_h . b
    + log m)``, and ``Cov_{j~p}(ds_j, v_j) = (w_h . g) c_h``, ``c_h = (p_1 (v_1 - vbar) - p_2 (v_2 - vbar)) / sqrt 2``.
    The layer's output per query is ``sum_h (w_h . g) W_O^h^T c_h``, so the prediction is
    ``sqrt(m) sigma_max(sum_h W_O^h^T c_h w_h^T)``.  Ties for a set S of heads,
    ``w_h . a = 0`` for h in S, are linear in a: :meth:`tie` imposes them by projection.
    """

    def __init__(self, problem, n: int):
        self.problem, self.R, self.m = problem, 1.0, n - 2
        kernel = problem.kernel
        self.heads = []
        for h in range(kernel.H):
            W_Q, W_K, W_V, b_Q, _, b_V = problem.head_weights_in_chart(h)
            A = W_Q @ W_K.T / math.sqrt(kernel.d_k)
            W_O = kernel.W_O[h * kernel.d_v:(h + 1) * kernel.d_v] if kernel.W_O is not None else np.eye(kernel.d_v)
            self.heads.append((A, W_K @ b_Q / math.sqrt(kernel.d_k), W_V, b_V, W_O))

    def directions(self, b: np.ndarray) -> list[np.ndarray]:
        return [self.R * b @ A + u for A, u, *_ in self.heads]

    def value(self, a: np.ndarray, b: np.ndarray, directions: list[np.ndarray] | None = None) -> float:
        R, m = self.R, self.m
        directions = self.directions(b) if directions is None else directions
        outputs = []
        for (A, u, W_V, b_V, W_O), w in zip(self.heads, directions):
            t = R * (w @ a)
            scores = np.array([t, -t, R * R * (b @ A @ b) + R * (u @ b) + math.log(m)])
            p = np.exp(scores - scores.max())
            p /= p.sum()
            values = np.stack([R * a @ W_V + b_V, -R * a @ W_V + b_V, R * b @ W_V + b_V])
            mean = p @ values
            outputs.append((p[0] * (values[0] - mean) - p[1] * (values[1] - mean)) / math.sqrt(2) @ W_O)
        # sigma_max(O^T W) for the rank-H matrix sum_h o_h w_h^T, through two thin QRs
        r_out = np.linalg.qr(np.array(outputs).T, mode="r")
        r_dir = np.linalg.qr(np.array(directions).T, mode="r")
        return math.sqrt(m) * float(np.linalg.norm(r_out @ r_dir.T, 2))

    @staticmethod
    def tie(a: np.ndarray, directions: list[np.ndarray]) -> np.ndarray:
        basis, _ = np.linalg.qr(np.array(directions).T)
        return unit_rows(a - basis @ (basis.T @ a))

    def combine(self, X: np.ndarray) -> np.ndarray:
        """Greedily add heads whose tie raises the prediction (one structured input (n, width) in
        the problem's working coordinates)."""
        U = self.problem.to_unit(X[None])[0]
        a, b = unit_rows(U[0]), unit_rows(U[2])
        directions = self.directions(b)
        current, chosen = self.value(a, b, directions), []
        while len(chosen) < len(self.heads) - 1:
            trials = []
            for h in range(len(self.heads)):
                if h not in chosen:
                    tied = self.tie(a, [directions[k] for k in chosen + [h]])
                    trials.append((self.value(tied, b, directions), h))
            best, head = max(trials)
            if best <= current * 1.001:
                break
            current, chosen = best, chosen + [head]
        if not chosen:
            return X
        a = self.tie(a, [directions[k] for k in chosen])
        out = U.copy()
        out[0], out[1] = np.linalg.norm(U[0]) * a, -np.linalg.norm(U[1]) * a
        return self.problem.from_unit(out[None])[0]


def cross_starts(problem, rng, per_head: int = 6, heads: int = 3) -> list[tuple[np.ndarray, str]]:
    """Structured inputs of dot-product cross-attention, in the charts of the queries and the context
    (both unit balls there; ``s(y, x) = y^T A x + u . x`` up to terms in y alone).

    * context (beta-type): every query at b, the keys at ``+-a`` with the tie ``(A^T b + u) . a = 0``;
      moving the keys along ``A^T b + u`` gives each query ``~ ||A^T b + u|| ||V^T a||``; b among the
      top left singular vectors of A, a the top eigenvector of ``V V^T`` on the tie hyperplane;
    * queries (alpha-type): keys at ``+-a``, a maximising ``||A a|| ||V^T a||`` (top eigenvectors of
      ``A^T A / ||A||^2 + V V^T / ||V||^2``), queries on the tie hyperplane ``b . A a = -u . a``.

    Heads are taken in decreasing order of ``||A_h|| ||V_h||``; returns ``[(Z, family)]``."""
    kernel, q, x = problem.kernel, problem.queries, problem.context
    H, dk, dv = kernel.H, kernel.d_k, kernel.d_v
    sizes, weights = [], []
    for h in range(H):
        W_Q = q.root @ kernel.Wq[:, h * dk:(h + 1) * dk]
        W_K = x.root @ kernel.W[:, H * dk + h * dk:H * dk + (h + 1) * dk]
        V = x.root @ kernel.W[:, 2 * H * dk + h * dv:2 * H * dk + (h + 1) * dv]
        if kernel.W_O is not None:
            V = V @ kernel.W_O[h * dv:(h + 1) * dv]
        b_Q = kernel.bias_q[h * dk:(h + 1) * dk]
        A = W_Q @ W_K.T / math.sqrt(dk)
        u = W_K @ b_Q / math.sqrt(dk)
        weights.append((A, u, V))
        sizes.append(np.linalg.norm(A, 2) * np.linalg.norm(V, 2))
    out = []
    for h in np.argsort(sizes)[::-1][:heads]:
        A, u, V = weights[h]
        starts = []
        if problem.role in ("cross-context", "cross-joint"):
            left = np.linalg.svd(A)[0][:, :max(1, per_head // 2)]
            for b in np.concatenate([left.T, -left.T]):
                w = b @ A + u
                w = w / max(np.linalg.norm(w), 1e-300)
                plane = np.eye(x.width) - np.outer(w, w)
                a = np.linalg.eigh(plane @ (V @ V.T) @ plane)[1][:, -1]
                starts.append((np.tile(b, (q.count, 1)), a))
        if problem.role in ("cross-queries", "cross-joint"):
            form = A.T @ A / max(np.linalg.norm(A, 2) ** 2, 1e-300) + V @ V.T / max(np.linalg.norm(V, 2) ** 2, 1e-300)
            for a in np.linalg.eigh(form)[1][:, ::-1][:, :max(1, per_head // 2)].T:
                w = A @ a
                B = unit_rows(rng.standard_normal((q.count, q.width)))
                B = B - ((B @ w + u @ a) / max(w @ w, 1e-300))[:, None] * w
                B = B / np.maximum(np.linalg.norm(B, axis=1, keepdims=True), 1.0)
                starts.append((B, a))
        for B, a in starts:
            U = np.zeros((1, problem.rows, problem.width))
            U[0, q.rows, :q.width] = B * (1 - 1e-6)
            signs = np.where(np.arange(x.count) % 2 == 0, 1.0, -1.0)
            U[0, x.rows, :x.width] = signs[:, None] * a[None, :] * (1 - 1e-6)
            out.append((problem.from_unit(U), "cross-structured"))
    return out


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


