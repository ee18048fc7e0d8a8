"""Exact Wasserstein-1 distance between empirical measures (Euclidean ground cost).

For ``mu = sum_i a_i delta_{x_i}`` and ``nu = sum_j b_j delta_{y_j}``,

    W1(mu, nu) = min_{pi >= 0, pi 1 = a, pi^T 1 = b}  sum_ij pi_ij ||x_i - y_j||_2

(Kantorovich's transport problem; Villani, "Optimal Transport: Old and New", 2009, Ch. 6).
Two exact routes:

* equal sizes and uniform masses: by Birkhoff's theorem an optimal plan is a
  permutation, found by the assignment problem (``scipy.optimize.linear_sum_assignment``);
* any masses and sizes: the transport linear program, solved by HiGHS
  (``scipy.optimize.linprog(method="highs")``).  Its answer is re-checked: the plan's
  marginals must match and the dual potentials, repaired by a c-transform into an
  exactly dual-feasible pair, must close the duality gap; otherwise
  :class:`~lipbound.errors.SolverError`.

On the line, :func:`w1_line` gives the closed form ``int |F_mu(t) - F_nu(t)| dt``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import sparse
from scipy.optimize import linear_sum_assignment, linprog
from scipy.spatial.distance import cdist

from ..errors import AssumptionError, SolverError
from .empirical import EmpiricalMeasure

__all__ = ["OptimalCoupling", "w1", "w1_with_plan", "w1_line", "ground_cost"]

# HiGHS works to a feasibility tolerance of about 1e-7; anything looser than this
# (relative to the masses and to the cost) means the solver did not converge.
_MARGINAL_TOLERANCE = 1e-7
_GAP_TOLERANCE = 1e-7


class OptimalCoupling(NamedTuple):
    """An optimal transport plan and its cost.

    Attributes
    ----------
    value : float
        ``sum_ij plan_ij ||x_i - y_j||`` = W1(mu, nu).
    plan : ndarray, shape (k, l)
        The coupling: non-negative, rows sum to the masses of ``mu``, columns to those of ``nu``.
    """

    value: float
    plan: np.ndarray


def _check_pair(mu, nu) -> tuple[EmpiricalMeasure, EmpiricalMeasure]:
    for name, m in (("mu", mu), ("nu", nu)):
        if not isinstance(m, EmpiricalMeasure):
            raise AssumptionError(name, "an EmpiricalMeasure", type(m).__name__,
                                  "wrap the points: EmpiricalMeasure(points, weights)")
    if mu.dim != nu.dim:
        raise AssumptionError("nu", f"points of dimension {mu.dim} like mu", f"dimension {nu.dim}",
                              "both measures must live in the same space")
    return mu, nu


def ground_cost(mu: EmpiricalMeasure, nu: EmpiricalMeasure) -> np.ndarray:
    """Euclidean distances ``C_ij = ||x_i - y_j||_2``, shape (k, l), from coordinate differences
    (no ``|x|^2 + |y|^2 - 2 x.y`` cancellation)."""
    mu, nu = _check_pair(mu, nu)
    return cdist(mu.points, nu.points, metric="euclidean")


def _assignment(cost: np.ndarray) -> OptimalCoupling:
    n = cost.shape[0]
    rows, cols = linear_sum_assignment(cost)
    plan = np.zeros_like(cost)
    plan[rows, cols] = 1.0 / n
    return OptimalCoupling(math.fsum(cost[rows, cols]) / n, plan)


def _transport_lp(cost: np.ndarray, a: np.ndarray, b: np.ndarray) -> OptimalCoupling:
    k, l = cost.shape
    # Row sums (k constraints) and column sums; the last column constraint is implied
    # by the others (both marginals have mass 1) and is dropped to keep the system consistent.
    row_sums = sparse.kron(sparse.eye(k), np.ones((1, l)))
    col_sums = sparse.kron(np.ones((1, k)), sparse.eye(l))
    A_eq = sparse.vstack([row_sums, col_sums.tocsr()[: l - 1]]).tocsc()
    b_eq = np.concatenate([a, b[: l - 1]])
    result = linprog(cost.ravel(), A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if result.status != 0 or result.x is None:
        raise SolverError("transport LP", "an optimal solution from HiGHS",
                          f"status {result.status}: {result.message}",
                          "check the measures (finite points, masses summing to 1)")
    plan = np.clip(result.x.reshape(k, l), 0.0, None)
    marginal_error = max(np.max(np.abs(plan.sum(axis=1) - a)), np.max(np.abs(plan.sum(axis=0) - b)))
    if marginal_error > _MARGINAL_TOLERANCE:
        raise SolverError("transport LP", f"plan marginals within {_MARGINAL_TOLERANCE}",
                          f"error {marginal_error:.3g}", "rescale the problem or report the instance")
    value = math.fsum((plan * cost).ravel())
    # Dual certificate: potentials f from HiGHS, g by c-transform g_j = min_i (C_ij - f_i),
    # so that f_i + g_j <= C_ij holds by construction and a.f + b.g <= W1 <= value.
    f = np.asarray(result.eqlin.marginals[:k], dtype=float)
    g = np.min(cost - f[:, None], axis=0)
    dual = math.fsum(np.concatenate([a * f, b * g]))
    if value - dual > _GAP_TOLERANCE * (1.0 + abs(value)):
        raise SolverError("transport LP", f"a duality gap below {_GAP_TOLERANCE} (relative)",
                          f"primal {value!r}, dual {dual!r}", "report the instance; the LP did not converge")
    return OptimalCoupling(value, plan)


def w1_with_plan(mu: EmpiricalMeasure, nu: EmpiricalMeasure) -> OptimalCoupling:
    """Exact ``W1(mu, nu)`` and an optimal coupling.

    Parameters
    ----------
    mu : EmpiricalMeasure, k points in R^d
    nu : EmpiricalMeasure, l points in R^d

    Returns
    -------
    OptimalCoupling
        ``(value, plan)`` with ``plan`` of shape (k, l).  Equal sizes with uniform masses
        go through the assignment problem (the plan is a permutation scaled by 1/k);
        everything else through the transport LP (HiGHS), re-checked by duality.

    Raises
    ------
    AssumptionError
        Not measures, or of different dimensions.
    SolverError
        HiGHS failed, or its answer did not pass the marginal and duality-gap checks.
    """
    mu, nu = _check_pair(mu, nu)
    cost = ground_cost(mu, nu)
    if mu.size == nu.size and mu.is_uniform and nu.is_uniform:
        return _assignment(cost)
    if mu.size == 1 or nu.size == 1:
        # Only one coupling exists: the product of the marginals.
        plan = np.outer(mu.weights, nu.weights)
        return OptimalCoupling(math.fsum((plan * cost).ravel()), plan)
    return _transport_lp(cost, mu.weights, nu.weights)


def w1(mu: EmpiricalMeasure, nu: EmpiricalMeasure) -> float:
    """Exact Wasserstein-1 distance ``W1(mu, nu)`` with Euclidean ground cost (see :func:`w1_with_plan`)."""
    return w1_with_plan(mu, nu).value


def w1_line(mu: EmpiricalMeasure, nu: EmpiricalMeasure) -> float:
    """Closed form on the real line: ``W1 = int |F_mu(t) - F_nu(t)| dt``.

    With all support points sorted as ``t_1 <= ... <= t_N`` the integrand is constant
    between consecutive points, so ``W1 = sum_i |F_mu(t_i) - F_nu(t_i)| (t_{i+1} - t_i)``
    (Vallender 1974; Villani 2009, Remark 2.19).  Both measures must be 1-dimensional.
    """
    mu, nu = _check_pair(mu, nu)
    if mu.dim != 1:
        raise AssumptionError("mu", "measures on the line (d = 1)", f"dimension {mu.dim}",
                              "use w1 for d > 1")
    t = np.concatenate([mu.points[:, 0], nu.points[:, 0]])
    signed = np.concatenate([mu.weights, -nu.weights])  # jumps of F_mu - F_nu
    order = np.argsort(t, kind="stable")
    t, difference = t[order], np.cumsum(signed[order])
    return math.fsum(np.abs(difference[:-1]) * np.diff(t))
