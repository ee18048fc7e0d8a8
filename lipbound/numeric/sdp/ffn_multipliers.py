r"""The multipliers of LipSDP-Neuron for one hidden layer, found in the problem's own structure.

Rows are tokens: the block is ``phi(x A + b) B`` with ``A`` (d, m), ``B`` (m, p), the slopes of
``phi`` in ``[alpha, beta]``, ``c = (alpha + beta) / 2`` and ``r = (beta - alpha) / 2``.  For
multipliers ``lam > 0`` (``T = diag(lam)``) the LMI of :mod:`lipbound.numeric.sdp.ffn` holds with

    rho(lam) = lambda_max(F(lam)),   F(lam) = r^2 A T A^T + c^2 (A B) G^{-1} (A B)^T,
    G(lam) = I - B^T T^{-1} B  > 0,

by the Schur complement of ``T - B B^T`` and Woodbury's identity
``T (T - B B^T)^{-1} T = T + B G^{-1} B^T`` (:func:`rho_for`).  A conic solver stores the
``d^2 m`` coefficients of ``A T A^T`` (226 million for a 384 x 1536 block); here the convex
function ``rho(lam)`` is minimised directly:

* :func:`uniform_multiplier` -- ``T = tau I``: with ``B = U S V^T``,
  ``F = r^2 tau A A^T + c^2 (A U) diag(tau s^2 / (tau - s^2)) (A U)^T``, a search over one number;
* :func:`descend` -- all m multipliers, ``lam = e^theta``, by L-BFGS on the smoothed maximum
  ``lambda_max ~ (1/k) log sum_j exp(k mu_j(F))`` for growing k, whose gradient is
  ``sum_j w_j (r^2 (a_i . v_j)^2 - c^2 (b_i . G^{-1} (A B)^T v_j)^2 / lam_i^2)`` (eigenpairs
  ``(mu_j, v_j)``, softmax weights ``w_j``); points where G is not positive definite are refused
  by the line search.  Cost per step: a few d x m x d products and one d x d eigendecomposition.

The answer is a candidate: :func:`lipbound.numeric.sdp.ffn.lipsdp_neuron` re-checks it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import final

import numpy as np

from .joint import _golden_min  # the one golden-section search of the relaxations

__all__ = ["Multipliers", "rho_for", "uniform_multiplier", "descend"]


@final
@dataclass(frozen=True)
class Multipliers:
    """A candidate: multipliers ``lam``, the float ``rho(lam)``, the steps taken and the seconds."""

    lam: np.ndarray
    rho: float
    steps: int
    seconds: float


def _gram_factor(B: np.ndarray, lam: np.ndarray):
    """The Cholesky factor of ``G = I - B^T T^{-1} B``, or None if G is not positive definite."""
    from scipy.linalg import cho_factor
    if np.any(lam <= 0) or not np.all(np.isfinite(lam)):
        return None
    try:
        return cho_factor(np.eye(B.shape[1]) - (B.T / lam) @ B, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return None


def _F(A, B, AB, lam, c, r):
    from scipy.linalg import cho_solve
    factor = _gram_factor(B, lam)
    if factor is None:
        return None, None
    F = r * r * (A * lam) @ A.T + c * c * AB @ cho_solve(factor, AB.T, check_finite=False)
    return 0.5 * (F + F.T), factor


def rho_for(A: np.ndarray, B: np.ndarray, lam: np.ndarray, alpha: float, beta: float) -> float:
    """``lambda_max(F(lam))`` in floating point (``inf`` where G is not positive definite)."""
    F, _ = _F(A, B, A @ B, np.asarray(lam, dtype=float), 0.5 * (alpha + beta), 0.5 * (beta - alpha))
    return math.inf if F is None else float(np.linalg.eigvalsh(F)[-1])


def uniform_multiplier(A: np.ndarray, B: np.ndarray, alpha: float, beta: float) -> tuple[float, float]:
    """The best ``T = tau I``: ``(tau, rho)`` (module docstring)."""
    U, s, _ = np.linalg.svd(B, full_matrices=False)
    AU, s2 = A @ U, s * s
    gram = A @ A.T
    top = max(float(s2[0]) if s2.size else 0.0, 1e-300)
    c, r = 0.5 * (alpha + beta), 0.5 * (beta - alpha)

    def rho(log_gap: float) -> float:
        tau = top * (1 + math.exp(log_gap))
        return float(np.linalg.eigvalsh(r * r * tau * gram + c * c * (AU * (tau * s2 / (tau - s2))) @ AU.T)[-1])

    best = _golden_min(rho, math.log(1e-8), math.log(1e6), iterations=60)
    return top * (1 + math.exp(best)), rho(best)


def descend(A: np.ndarray, B: np.ndarray, alpha: float, beta: float, sharpness=(10, 30, 100, 300, 1000),
            steps: int = 60, memory: int = 20) -> Multipliers:
    """Minimise ``rho(lam)`` over all m multipliers from the best uniform one (module docstring).

    ``sharpness`` are the successive k (in units of ``1 / rho``) of the smoothed maximum, each
    run for at most ``steps`` L-BFGS steps."""
    from scipy.linalg import cho_solve
    started = time.perf_counter()
    c, r = 0.5 * (alpha + beta), 0.5 * (beta - alpha)
    AB = A @ B
    tau, rho0 = uniform_multiplier(A, B, alpha, beta)
    theta = np.full(A.shape[1], math.log(tau))

    def value(theta_, k, gradient=True):
        lam = np.exp(theta_)
        F, factor = _F(A, B, AB, lam, c, r)
        if F is None:
            return math.inf, None
        if not gradient:
            mu = np.linalg.eigvalsh(F)
            return mu[-1] + math.log(np.exp(k * (mu - mu[-1])).sum()) / k, None
        mu, V = np.linalg.eigh(F)
        shifted = np.exp(k * (mu - mu[-1]))
        smooth = mu[-1] + math.log(shifted.sum()) / k
        weights = shifted / shifted.sum()
        keep = weights > 1e-9
        V, weights = V[:, keep], weights[keep]
        BQ = B @ cho_solve(factor, AB.T @ V, check_finite=False)
        return smooth, ((r * r * (A.T @ V) ** 2 - c * c * BQ ** 2 / lam[:, None] ** 2) @ weights) * lam

    taken = 0
    for scale in sharpness:
        k = scale / max(rho0, 1e-300)
        current, grad = value(theta, k)
        S, Y = [], []
        for _ in range(steps):
            direction = _two_loop(grad, S, Y)
            if grad @ direction >= 0:
                direction, S, Y = -grad, [], []
            size = 1.0
            while size > 1e-10:
                trial, _ = value(theta + size * direction, k, gradient=False)
                if trial <= current + 1e-4 * size * (grad @ direction):
                    break
                size *= 0.5
            else:
                break
            taken += 1
            step = size * direction
            trial, new_grad = value(theta + step, k)
            if (new_grad - grad) @ step > 1e-12:
                S.append(step)
                Y.append(new_grad - grad)
                if len(S) > memory:
                    S.pop(0)
                    Y.pop(0)
            theta, current, grad = theta + step, trial, new_grad
            if abs(grad @ step) < 1e-12 * max(abs(current), 1e-300):
                break
    lam = np.exp(theta)
    return Multipliers(lam, rho_for(A, B, lam, alpha, beta), taken, time.perf_counter() - started)


def _two_loop(grad: np.ndarray, S: list, Y: list) -> np.ndarray:
    """The L-BFGS direction ``-H grad`` from the stored pairs."""
    q = grad.copy()
    alphas = []
    for s, y in zip(reversed(S), reversed(Y)):
        a = (s @ q) / (y @ s)
        alphas.append(a)
        q -= a * y
    if S:
        q *= (S[-1] @ Y[-1]) / (Y[-1] @ Y[-1])
    for (s, y), a in zip(zip(S, Y), reversed(alphas)):
        q += s * (a - (y @ q) / (y @ s))
    return -q
