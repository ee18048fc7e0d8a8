"""Batched L-BFGS ascent of the local Jacobian norm in smooth coordinates of the domain's chart
(:class:`~.problem.SearchProblem`: a ball, or an ellipsoid such as a LayerNorm image).  Deadlines
are read on the problem's :class:`~.clock.WorkClock` (work done, not wall-clock time)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import numpy as np

__all__ = ["Candidates", "start_candidates", "rank_pool", "take", "join", "polish", "polish_best", "continuation",
           "CONTINUATION_STAGES"]


@final
@dataclass
class Candidates:
    """A batch of inputs (working coordinates) with their directions and Jacobian-norm estimates."""

    X: np.ndarray
    E: np.ndarray
    sigma: np.ndarray
    family: list[str]


def start_candidates(problem, Xw: np.ndarray, family: list[str], rng, power_steps: int = 30) -> Candidates:
    """Candidates at the inputs Xw; an input a construction left non-finite gets sigma = -inf (never chosen)."""
    finite = np.all(np.isfinite(Xw), axis=(1, 2))
    Xw = np.where(finite[:, None, None], Xw, 0.0)
    sigma, E, _ = problem.evaluate(Xw, rng.standard_normal(Xw.shape), power_steps)
    sigma = np.where(finite & np.isfinite(sigma), sigma, -np.inf)
    return Candidates(Xw, E, sigma, list(family))


def take(c: Candidates, index) -> Candidates:
    index = np.asarray(index, dtype=int)
    return Candidates(c.X[index], c.E[index], c.sigma[index], [c.family[i] for i in index])


def join(*parts: Candidates) -> Candidates:
    parts = [p for p in parts if len(p.X)]
    return Candidates(*(np.concatenate([getattr(p, key) for p in parts]) for key in ("X", "E", "sigma")),
                       [f for p in parts for f in p.family])


def rank_pool(problem, pool, rng, power_steps: int, chunk: int, deadline: float):
    """Jacobian norms of the starting inputs ``pool`` (``[(inputs, family)]``) after ``power_steps`` power steps, in
    chunks of ``chunk`` until ``deadline`` (at least one chunk)."""
    Xw = np.concatenate([p[0] for p in pool])
    families = [p[1] for p in pool for _ in range(len(p[0]))]
    parts = []
    for first in range(0, len(Xw), chunk):
        if parts and problem.clock() >= deadline:
            break
        part = slice(first, first + chunk)
        parts.append(start_candidates(problem, problem.retract(Xw[part], 1 - 1e-9), families[part], rng,
                                      power_steps=power_steps))
    return join(*parts)



@final
class _Chart:
    """Smooth coordinates on the domain: token ``x' = s(rho) (z / ||z||) K^{1/2}`` in the chart of its
    row group (:class:`~.problem.SearchProblem`), ``s`` the logistic function, so that every point of
    the variables is feasible; tokens on the boundary stay there (``s'`` vanishes), tokens inside
    may grow.  Variables are flattened to (b, rows (width + 1))."""

    CAP = 20.0   # logit of 1 - 2e-9: tokens start at most that close to the boundary

    def __init__(self, problem, scale: float = 1.0):
        self.problem, self.scale = problem, scale
        self.n, self.d = problem.rows, problem.width

    def encode(self, X: np.ndarray) -> np.ndarray:
        U = self.problem.to_unit(X, self.scale)
        norms = np.linalg.norm(U, axis=-1)
        ratio = np.clip(norms, 1e-6, 1.0)
        rho = np.minimum(np.log(ratio) - np.log1p(-np.minimum(ratio, 1 - 1e-12)), self.CAP)
        Z = np.where(norms[..., None] > 0, U / np.where(norms > 0, norms, 1.0)[..., None], 1.0 / math.sqrt(self.d))
        Z = Z * self.problem.shape_mask
        return np.concatenate([Z.reshape(len(X), self.n * self.d), rho], axis=1)

    def decode(self, v: np.ndarray):
        b = len(v)
        Z = v[:, :self.n * self.d].reshape(b, self.n, self.d) * self.problem.shape_mask
        rho = v[:, self.n * self.d:]
        size = np.maximum(np.linalg.norm(Z, axis=-1, keepdims=True), 1e-300)
        scale = (0.5 + 0.5 * np.tanh(0.5 * rho))[..., None]   # logistic, without overflow
        return self.problem.from_unit(scale * Z / size, self.scale), (Z, size, scale, rho)

    def pullback(self, grad: np.ndarray, cache) -> np.ndarray:
        Z, size, scale, rho = cache
        grad = self.problem.from_unit(grad, self.scale)                 # d/du of x' = u K^{1/2} (K symmetric)
        unit = Z / size
        radial = (grad * unit).sum(axis=-1, keepdims=True)
        gZ = scale * (grad - radial * unit) / size
        s = 0.5 + 0.5 * np.tanh(0.5 * rho)
        grho = radial[..., 0] * s * (1 - s)
        return np.concatenate([gZ.reshape(len(grad), self.n * self.d), grho], axis=1)


def polish(problem, cands: Candidates, deadline: float, scale: float = 1.0, max_iterations: int = 10 ** 9,
           power_steps: int = 6, memory: int = 8) -> Candidates:
    """Batched L-BFGS ascent of ``sigma_max(Df(X))`` in the coordinates of :class:`_Chart`,
    with a backtracking (Armijo) line search per candidate.  Monotone: each candidate returns its
    best point, never worse than its start."""
    b, n, d = cands.X.shape
    if b == 0:
        return cands
    chart = _Chart(problem, scale)
    v = chart.encode(cands.X)
    X, cache = chart.decode(v)
    sigma, E, grad = problem.evaluate(X, cands.E, power_steps)
    g = -chart.pullback(grad, cache)                               # we minimise -sigma
    best = Candidates(cands.X.copy(), cands.E.copy(), cands.sigma.copy(), list(cands.family))
    improved = sigma > best.sigma
    best.X[improved], best.E[improved], best.sigma[improved] = X[improved], E[improved], sigma[improved]
    S = np.zeros((memory, b, v.shape[1]))                          # steps s_k, newest at (count - 1) % memory
    Yg = np.zeros_like(S)                                           # gradient changes y_k
    curv = np.zeros((memory, b))                                    # 1 / (s_k . y_k), 0 for unused pairs
    # initial inverse-Hessian scale: the first step moves the largest coordinate by 0.01
    gamma = 0.01 / np.maximum(np.max(np.abs(g), axis=1), 1e-300)
    count = 0
    active = np.ones(b, dtype=bool)
    for _ in range(max_iterations):
        if problem.clock() >= deadline or not np.any(active):
            break
        # two-loop recursion (Nocedal & Wright, Algorithm 7.4), batched over candidates
        q = g.copy()
        alphas = []
        for age in range(min(count, memory)):
            slot = (count - 1 - age) % memory
            alpha = curv[slot] * (S[slot] * q).sum(axis=1)
            q -= alpha[:, None] * Yg[slot]
            alphas.append((slot, alpha))
        q *= gamma[:, None]
        for slot, alpha in reversed(alphas):
            beta = curv[slot] * (Yg[slot] * q).sum(axis=1)
            q += (alpha - beta)[:, None] * S[slot]
        p = -q
        slope = (p * g).sum(axis=1)
        bad = slope >= 0                                            # not a descent direction: use -g
        p[bad] = -g[bad] * (0.01 / np.maximum(np.max(np.abs(g[bad]), axis=1), 1e-300))[:, None]
        # trust region: no coordinate moves by more than 1 (z starts with unit rows; flat regions
        # with vanishing curvature would otherwise ask for enormous steps)
        p *= np.minimum(1.0, 1.0 / np.maximum(np.max(np.abs(p), axis=1), 1e-300))[:, None]
        slope = (p * g).sum(axis=1)
        # backtracking line search on the active candidates
        t = np.ones(b)
        accepted = np.zeros(b, dtype=bool)
        new_v, new_sigma, new_E, new_g = v.copy(), sigma.copy(), E.copy(), g.copy()
        trying = active.copy()
        for _ in range(12):
            idx = np.flatnonzero(trying)
            if idx.size == 0 or problem.clock() >= deadline:
                break
            trial = v[idx] + t[idx, None] * p[idx]
            Xt, cache_t = chart.decode(trial)
            sig_t, E_t, grad_t = problem.evaluate(Xt, E[idx], power_steps)
            ok = -sig_t <= -sigma[idx] + 1e-4 * t[idx] * slope[idx]
            done = idx[ok]
            new_v[done], new_sigma[done], new_E[done] = trial[ok], sig_t[ok], E_t[ok]
            new_g[done] = -chart.pullback(grad_t[ok], tuple(c[ok] for c in cache_t))
            better = sig_t > best.sigma[idx]
            keep = idx[better]
            best.X[keep], best.E[keep], best.sigma[keep] = Xt[better], E_t[better], sig_t[better]
            accepted[done] = True
            trying[done] = False
            t[idx[~ok]] *= 0.3
        active &= accepted       # a candidate whose line search failed has converged
        s_new, y_new = new_v - v, new_g - g
        sy = (s_new * y_new).sum(axis=1)
        slot = count % memory
        good = accepted & (sy > 1e-12 * np.linalg.norm(s_new, axis=1) * np.linalg.norm(y_new, axis=1))
        S[slot] = np.where(good[:, None], s_new, 0.0)
        Yg[slot] = np.where(good[:, None], y_new, 0.0)
        curv[slot] = np.where(good, 1.0 / np.where(good, sy, 1.0), 0.0)
        gamma = np.where(good, sy / np.maximum((y_new * y_new).sum(axis=1), 1e-300), gamma)
        count += 1
        v, sigma, E, g = new_v, new_sigma, new_E, new_g
    return best


#: Start families without a construction behind them, polished last when time is left (:func:`polish_best`).
GENERIC_FAMILIES = frozenset({"random", "continuation", "castin"})


def polish_best(problem, cands: Candidates, deadline: float, share: float = 0.3, keep: int = 1) -> Candidates:
    """:func:`polish` every candidate for ``share`` of the time left, then the ``keep`` best for the rest; when they
    converge before ``deadline``, the two best candidates of each other start family in turn (constructed
    families first), then the others one by one.

    A polish step costs in proportion to the batch, so the few best candidates, which usually hold the witness,
    get several times more L-BFGS steps than in a batch of all of them.  A polish stops when its line searches
    fail (a local maximum): the time left then goes to another family's best points, which may climb to a higher
    maximum (a family that starts low can climb fast), before further points of a family already polished.  The
    others keep the points they reached; the first ``keep`` are polished exactly as without the later turns, so
    the result is never worse than :func:`polish` stopped at the first deadline, nor than the ``keep`` best
    polished alone."""
    start = problem.clock()
    cands = polish(problem, cands, start + share * (deadline - start))
    if len(cands.sigma) <= keep:
        return polish(problem, cands, deadline)
    order = [int(i) for i in np.argsort(-np.where(np.isfinite(cands.sigma), cands.sigma, -np.inf), kind="stable")]
    polished = {cands.family[i] for i in order[:keep]}
    rest = order[keep:]
    # the other families' two best points together (a family's best start is not always the one that climbs),
    # constructed families first: random and continuation starts have had their own ascent
    families = sorted(dict.fromkeys(cands.family[i] for i in rest if cands.family[i] not in polished),
                      key=lambda family: family in GENERIC_FAMILIES)
    turns = [order[:keep]] + [[i for i in rest if cands.family[i] == family][:2] for family in families]
    turns += [[i] for i in rest if not any(i in turn for turn in turns)]
    done: list[Candidates] = []
    waiting = list(order)
    for turn in turns:
        if done and problem.clock() >= deadline:
            break
        done.append(polish(problem, take(cands, turn), deadline))
        waiting = [i for i in waiting if i not in turn]
    return join(*done, take(cands, waiting))


#: The scales of the domain a continuation polishes on in turn.
CONTINUATION_STAGES = (0.25, 0.5, 1.0)


def continuation(problem, rng, count: int, deadline: float) -> Candidates:
    """Random inputs on the boundary polished on the domain scaled by 1/4 (softmax not yet
    saturated), then scaled to 1/2 and 1 and polished again."""
    Xw = problem.random(rng, count)
    stages = CONTINUATION_STAGES
    start_time = problem.clock()
    cands = None
    for index, fraction in enumerate(stages):
        share = (deadline - start_time) / len(stages)
        stage_deadline = min(deadline, start_time + share * (index + 1))
        if cands is None:
            cands = start_candidates(problem, Xw * fraction, ["continuation"] * count, rng)
        else:
            cands = start_candidates(problem, cands.X * (fraction / stages[index - 1]), cands.family, rng)
        cands = polish(problem, cands, stage_deadline, scale=fraction)
    return cands
