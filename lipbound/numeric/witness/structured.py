"""Two keys tied for many queries: the structured inputs of one dot-product head, on a ball or an
ellipsoid (a LayerNorm image), for self-attention and for cross-attention in each argument.

The keys lie in ``{u S : ||u|| <= 1}`` and the queries in ``{b S_Q : ||b|| <= 1}`` (chart points u,
b; ``S``, ``S_Q`` symmetric, working coordinates about the domains' centres; ``S_Q = S`` for
self-attention, ``S = R I`` for a ball).  Positions are chart points, moves are measured in the
tokens' own coordinates: this distinction matters on a LayerNorm image, whose semi-axes span
orders of magnitude.  With ``A = W_Q W_K^T / sqrt(d_k)`` and ``u_0 = W_K b_Q / sqrt(d_k)``, m
queries at the chart point b see a key at x with the score ``g . x`` (up to terms in the query
alone), ``g = b S_Q A + u_0`` the key gradient.  Two keys at the chart points ``mid +- a'`` tie
for the queries when ``(g S) . a = 0``; moving them apart along g (beta-type) gives each query
``||g|| ||c||``, ``c = (p_1 (v_1 - vbar) - p_2 (v_2 - vbar)) / sqrt 2``, and moving a query along
``A (k_1 - k_2)`` (alpha-type) gives ``p_1 p_2 ||A (k_1 - k_2)|| ||v_1 - v_2||``.  The predicted
Jacobian norm (:func:`predicted_norm`) is

    self, cross-joint:  phi^2 = alpha^2 + m beta^2,   cross-context: sqrt(m) beta,   cross-queries: alpha,

and :func:`ascend` maximises ``log ||a S W_V||^2 + log(m/2 ||g||^2 + ||a S A^T||^2)`` (the terms a
role uses) over unit a, b by batched Riemannian Adam, the tie imposed by projection after each
step, b also feeling how it turns the tie hyperplane under a.

For self-attention the queries must not attend to each other: the keys' midpoint
``mid = t (g S) / ||g S||`` lifts both keys' scores ``margin`` above the queries' own score, and
``a' = sqrt(1 - t^2) a`` keeps the keys on the sphere (the ascent counts the share ``1 - t^2`` it
leaves).  On scores as large as real heads have, t is small.  For cross-attention the other
context tokens are parked where the queries' scores are lowest, ``-(g S) / ||g S||``.
"""

from __future__ import annotations

import math
from typing import final

import numpy as np

from ...errors import AssumptionError
from ..attention import unit_rows
from ..blas import one_blas_thread
from ..kernels import softmax
from .clock import WorkClock

__all__ = ["structured_starts", "TieForm", "ascend", "predicted_norm"]

#: The terms of the predicted norm each role uses: (alpha weight, beta weight).
_TERMS = {"self": (1.0, 1.0), "cross-joint": (1.0, 1.0), "cross-context": (0.0, 1.0), "cross-queries": (1.0, 0.0)}


@final
class TieForm:
    """The quantities of the construction for one head.

    Parameters
    ----------
    S : ndarray (w, w)
        The keys' chart (symmetric).
    A : ndarray (w_Q, w)
        ``W_Q W_K^T / sqrt(d_k)`` in working coordinates.
    u : ndarray (w,)
        ``W_K b_Q / sqrt(d_k)``, the query bias with the queries' centre folded in.
    V : ndarray (w, d_out)
        The value map (``W_V``, or ``W_V W_O^h`` inside a layer).
    m : int
        Queries.
    role : one of ``"self"``, ``"cross-queries"``, ``"cross-context"``, ``"cross-joint"``
    margin : float
        How far the keys' scores are lifted above the queries' own (self-attention).
    query_shape : ndarray (w_Q, w_Q), optional
        The queries' chart (cross-attention; self-attention: S).
    """

    def __init__(self, S, A, u, V, m: int, role: str = "self", margin: float = 10.0, query_shape=None):
        if role not in _TERMS:
            raise AssumptionError("role", f"one of {tuple(_TERMS)}", repr(role), "choose the argument of the constant")
        self.S, self.u, self.m, self.margin, self.role = S, u, m, margin, role
        self.SQ = S if query_shape is None else query_shape
        self.alpha, self.beta = _TERMS[role]
        self.B, self.C = self.SQ @ A, S @ A.T          # g = b B + u; a C the query gradient against the key a S
        self.BS = self.B @ S
        self.SV = S @ V
        self.VV = self.SV @ self.SV.T
        self.own = role == "self"

    def gradient(self, b):
        """The key gradient ``g = b S_Q A + u_0`` of queries at the chart points b (rows)."""
        return b @ self.B + self.u

    def tie(self, a, b):
        """a projected on the tie hyperplane ``(g S) . a = 0``, normalised."""
        w = self.gradient(b) @ self.S
        return unit_rows(a - (np.sum(w * a, axis=1) / np.maximum(np.sum(w * w, axis=1), 1e-300))[:, None] * w)

    def _lift(self, b):
        """``(t, w, |w|)``: the keys' lift t (0 for cross-attention), the chart gradient ``w = g S``."""
        w = self.gradient(b) @ self.S
        size = np.maximum(np.linalg.norm(w, axis=1), 1e-300)
        if not self.own:
            return np.zeros(len(b)), w, size
        own = np.sum((b @ self.SQ) * self.gradient(b), axis=1)          # s(q, q), up to terms in q alone
        return np.clip((own + self.margin) / size, 0.0, 0.9), w, size

    def keys(self, a, b):
        """Chart points ``mid +- sqrt(1 - t^2) a`` of the two keys, ``mid = t (g S) / ||g S||``, t the
        smallest in [0, 0.9] that lifts the keys' scores ``margin`` above the queries' own."""
        t, w, size = self._lift(b)
        mid = t[:, None] * w / size[:, None]
        spread = np.sqrt(1 - t * t)[:, None] * a
        return mid + spread, mid - spread

    def parked(self, b):
        """Chart points where the queries' scores are lowest, ``-(g S) / ||g S||`` (cross-attention)."""
        _, w, size = self._lift(b)
        return -w / size[:, None]

    def lift_gradient(self, b):
        """Gradient in b of ``log(1 - t^2)``, the share of the keys' spread the lift leaves (0 where t = 0)."""
        t, w, size = self._lift(b)
        if not self.own:
            return np.zeros_like(b)
        d_own = b @ (self.BS + self.BS.T) + self.u @ self.S
        d_t = (d_own - t[:, None] * ((w / size[:, None]) @ self.BS.T)) / size[:, None]
        active = ((t > 0) & (t < 0.9))[:, None]
        return np.where(active, -2 * t[:, None] / (1 - t[:, None] ** 2) * d_t, 0.0)

    def power(self, a, b, steps: int):
        """Projected power steps on the tie hyperplane for ``(a VV a)(beta m/2 ||g||^2 + alpha a C C^T a)``:
        ``a <- tie(grad)`` (monotone where the product is convex in a)."""
        slope = self.beta * 0.5 * self.m * np.sum(self.gradient(b) ** 2, axis=1)[:, None]
        for _ in range(steps):
            wa, ca = a @ self.VV, self.alpha * (a @ self.C) @ self.C.T
            a = self.tie(wa * (slope + np.sum(a * ca, axis=1, keepdims=True))
                         + ca * np.sum(a * wa, axis=1, keepdims=True), b)
        return a


def predicted_norm(form: TieForm, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Predicted ``||Df||`` of the structured input for chart points a, b (rows: a batch).

    The queries attend to (key 1, key 2, and for self-attention the m queries) with the softmax
    of ``(s_1, s_2, s(q, q) + log m)``, ``s_1 = s_2`` by the tie (the parked tokens of
    cross-attention are ignored).  Beta part: each query ``||g|| ||c||``, ``c = (p_1 (v_1 - vbar) -
    p_2 (v_2 - vbar)) / sqrt 2``; alpha part: ``p_1 p_2 ||A (k_1 - k_2)|| ||v_1 - v_2||``; they add
    in quadrature, the beta part ``sqrt(m)`` times (module docstring).
    """
    m = form.m
    first, second = form.keys(a, b)
    g = form.gradient(b)
    key_score = np.sum((first @ form.S) * g, axis=1)
    columns = [key_score, key_score]
    if form.own:
        columns.append(np.sum((b @ form.SQ) * g, axis=1) + math.log(max(m, 1)))
    scores = np.stack(columns, axis=1)
    p = softmax(scores)
    v1, v2 = first @ form.SV, second @ form.SV                    # the value bias cancels in every difference
    mean = p[:, :1] * v1 + p[:, 1:2] * v2 + (p[:, 2:] * (b @ form.SV) if form.own else 0.0)
    c = (p[:, :1] * (v1 - mean) - p[:, 1:2] * (v2 - mean)) / math.sqrt(2)
    beta = form.beta * math.sqrt(m) * np.linalg.norm(c, axis=1) * np.linalg.norm(g, axis=1)
    difference = first - second
    alpha = form.alpha * p[:, 0] * p[:, 1] * np.linalg.norm(difference @ form.C, axis=1) \
        * np.linalg.norm(difference @ form.SV, axis=1)
    return np.sqrt(beta ** 2 + alpha ** 2)


def _better(form: TieForm, b: np.ndarray, *choices: np.ndarray) -> np.ndarray:
    """Per row, the key direction of ``choices`` with the larger predicted norm."""
    values = np.stack([predicted_norm(form, a, b) for a in choices])
    return np.stack(choices)[np.argmax(values, axis=0), np.arange(len(b))]


def ascend(form: TieForm, count: int, rng, steps: int, deadline: float | None, clock: WorkClock):
    """``(a, b, phi)``: ``count`` pairs of chart points maximising the predicted norm, best first.

    Starts: b among the top left singular vectors of ``S_Q A`` (and random), a the best of the top
    left singular vectors of ``S W_V`` projected on the tie hyperplane; then Riemannian Adam on
    both spheres until ``steps`` or the clock's ``deadline``; then projected power steps on a
    (Adam may stall where b has turned the tie hyperplane under it) and a scan of the queries'
    radius (inside the domain the queries pull less towards each other)."""
    wq, w = form.B.shape
    clock.charge(10 * max(wq, w) ** 3)                  # the decompositions of S_Q A and S W_V
    left = np.linalg.svd(form.B)[0][:, :min(8, wq)]
    k = left.shape[1]
    coef = rng.standard_normal((count, k)) * np.geomspace(1.0, 0.2, k)
    coef[:min(k, count)] = np.eye(k)[:min(k, count)]
    b = unit_rows(coef @ left.T)
    b[count // 2:] = unit_rows(rng.standard_normal((count - count // 2, wq)))
    # a: of the top left singular vectors of S W_V projected on the tie hyperplane, the one S W_V stretches most
    tie_normal = unit_rows(form.gradient(b) @ form.S)
    tops = np.linalg.svd(form.SV, full_matrices=False)[0][:, :min(8, form.SV.shape[1])].T     # (k, w)
    projected = tops[None] - (tops @ tie_normal.T).T[:, :, None] * tie_normal[:, None, :]
    stretch = np.linalg.norm(projected @ form.SV, axis=2) / np.maximum(np.linalg.norm(projected, axis=2), 1e-300)
    a = form.tie(projected[np.arange(count), np.argmax(stretch, axis=1)], b)
    moments = [np.zeros_like(a), np.zeros_like(b)]
    squares = [np.zeros_like(a), np.zeros_like(b)]
    for step in range(1, steps + 1):
        if deadline is not None and clock() >= deadline:
            break
        clock.charge(count * (w * w + wq * w))
        lr = 0.02 * (1 - step / (steps + 1)) + 0.001
        wa = a @ form.VV
        g = form.gradient(b)
        aC = a @ form.C
        inner = form.beta * 0.5 * form.m * np.sum(g * g, axis=1) + form.alpha * np.sum(aC * aC, axis=1) + 1e-300
        grad_a = 2 * wa / np.maximum(np.sum(a * wa, axis=1), 1e-300)[:, None] \
            + 2 * form.alpha * (aC @ form.C.T) / inner[:, None]
        # at a tied a, moving the tie normal n = g S by dn moves a by -n (a . dn) / ||n||^2
        normal = g @ form.S
        turn = np.sum(grad_a * normal, axis=1) / np.maximum(np.sum(normal * normal, axis=1), 1e-300)
        grad_b = form.beta * form.m * (g @ form.B.T) / inner[:, None] - turn[:, None] * (a @ form.BS.T) \
            + form.lift_gradient(b)
        for index, (x, grad) in enumerate(((a, grad_a), (b, grad_b))):
            grad = grad - np.sum(grad * x, axis=1, keepdims=True) * x        # tangent to the sphere
            moments[index] = 0.9 * moments[index] + 0.1 * grad
            squares[index] = 0.999 * squares[index] + 0.001 * grad * grad
            x[:] = unit_rows(x + lr * (moments[index] / (1 - 0.9 ** step))
                             / (np.sqrt(squares[index] / (1 - 0.999 ** step)) + 1e-12))
        a[:] = form.tie(a, b)
    a = _better(form, b, a, form.power(a, b, 30))
    phi = predicted_norm(form, a, b)
    for shrink in np.linspace(0.95, 0.3, 14):
        a_shrunk = form.tie(a, shrink * b)
        trial = predicted_norm(form, a_shrunk, shrink * b)
        better = trial > phi
        a[better], b[better], phi[better] = a_shrunk[better], shrink * b[better], trial[better]
    order = np.argsort(-phi)
    return a[order], b[order], phi[order]


@one_blas_thread
def structured_starts(W_Q: np.ndarray, W_K: np.ndarray, W_V: np.ndarray, b_Q: np.ndarray, radius: float,
                      n: int, count: int = 64, steps: int = 300, margin: float = 10.0,
                      seed: int = 0, deadline: float | None = None,
                      clock: WorkClock | None = None, shape: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Alpha/beta-type inputs for one dot-product self-attention head on the ellipsoid
    ``{R u S : ||u|| <= 1}`` about the origin (``S = shape``, symmetric; the identity by default:
    the ball of radius R): two keys tied for ``m = n - 2`` queries (module docstring).

    Parameters
    ----------
    W_Q, W_K, W_V : ndarray, shapes (d, d_k), (d, d_k), (d, d_v)
    b_Q : ndarray, shape (d_k,)
        Query bias with the domain's centre folded in (``b_Q + c W_Q``); the key bias only shifts
        a whole row of scores.
    radius : float
    n : int
        Tokens, at least 3 (two keys and a query).
    count, steps : int
        Candidates ascended together, and the most Adam steps.
    margin : float
        How far the keys' scores are lifted above the queries' own.
    deadline : float, optional
        The reading of ``clock`` at which the ascent stops (the inputs are valid at every step).
    clock : WorkClock, optional
        Charged for every step (a new one by default: the deadline is then in nominal seconds
        of work from 0).
    shape : ndarray, shape (d, d), optional
        The ellipsoid's symmetric chart matrix (a LayerNorm image in working coordinates:
        :attr:`~.problem.Group.root`); default the identity.

    Returns
    -------
    X : ndarray, shape (count, n, d)
        Candidate inputs ``x_1 = R (mid + a') S``, ``x_2 = R (mid - a') S``, ``x_3 = .. = x_n = R b S``,
        best first.
    phi : ndarray, shape (count,)
        Predicted Jacobian norms (:func:`predicted_norm`).
    """
    if n < 3:
        raise AssumptionError("n", "at least 3 tokens (two keys and a query)", repr(n),
                              "use random or Castin starts for n = 2")
    d, d_k = W_Q.shape
    S = float(radius) * (np.eye(d) if shape is None else np.asarray(shape, dtype=float))
    form = TieForm(S, W_Q @ W_K.T / math.sqrt(d_k), W_K @ b_Q / math.sqrt(d_k), W_V, n - 2, "self", margin)
    a, b, phi = ascend(form, count, np.random.default_rng(seed), steps, deadline,
                       WorkClock() if clock is None else clock)
    first, second = form.keys(a, b)
    X = np.empty((count, n, d))
    X[:, 0], X[:, 1] = first @ S, second @ S
    X[:, 2:] = (b @ S)[:, None, :]
    return X, phi
