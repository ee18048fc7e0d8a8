r"""LipSDP-Neuron for a feed-forward block, for any slope range ``[alpha, beta]`` (``alpha < 0`` allowed).

The block is ``f(x) = phi(x W_1 + b_1) W_2 + b_2`` per token (rows; ``W_1`` (d, m), ``W_2`` (m, p)).
For two inputs write ``dz = (x - x') W_1`` and ``dv = phi(z) - phi(z')``.  Every neuron's secant
slope lies in ``[alpha, beta]`` (the certified slope range of the activation,
:mod:`lipbound.symbolic.activations`), so ``(dv_i - alpha dz_i)(beta dz_i - dv_i) >= 0`` for each
i (a quadratic constraint; Fazlyab, Robey, Hassani, Morari, Pappas, NeurIPS 2019, whose code
takes ``[0, 1]``, wrong for GELU and SiLU).  With multipliers ``lam >= 0``, ``T = diag(lam)``,
``ab = alpha beta``, ``c = (alpha + beta) / 2``:

    K(rho, lam) = [[rho I + ab W_1 T W_1^T,  -c W_1 T], [-c T W_1^T,  T - W_2 W_2^T]]  >= 0
    ==>  ||f(x) - f(x')|| <= sqrt(rho) ||x - x'||.

Proof: ``(dx, dv) K (dx, dv)^T = rho ||dx||^2 - ||dv W_2||^2 - sum_i lam_i (dv_i - alpha dz_i)(beta dz_i
- dv_i)``, and the sum is non-negative.  The LMI is ``(d + m)`` square with ``m + 1`` unknowns.

Solvers: cvxpy with Clarabel or SCS for small blocks (``solver="clarabel"``, ``"scs"``; ``"auto"``
takes Clarabel up to ``d + m = 48`` and SCS up to :data:`CVXPY_MAX_SIZE`: Clarabel's dense
Newton system grows like ``(d + m)^4``), and for real blocks (384 x 1536) the structured descent of
:mod:`lipbound.numeric.sdp.ffn_multipliers` (``"descent"``; ``"uniform"``: one multiplier for
every neuron, a cheaper sound variant).  Whatever proposed ``lam``, the value reported comes from
the re-check (:func:`certify_multipliers`): ``K(rho', lam)`` is built from the original weights in
enclosure arithmetic and certified positive semidefinite with
:func:`lipbound.rigorous.linalg.lambda_min_lower`; a solver's objective that disagrees with the
certificate makes the result "not certified".
"""

from __future__ import annotations

import math
import time

import numpy as np

from ...errors import AssumptionError, SolverError
from ...rigorous.elementwise import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF
from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, lambda_min_lower
from ...rigorous.slopes import SlopeRange
from ...rigorous.value import CertifiedValue
from ..blas import one_blas_thread
from ..blocks.activations import check_activation, slope_range
from ..blocks.ffn import check_weights, lift
from .ffn_multipliers import descend, rho_for, uniform_multiplier
from .joint import _cvxpy_solve, sdp_value

__all__ = ["SOLVERS", "CVXPY_MAX_SIZE", "lipsdp_neuron", "certify_multipliers", "lmi_enclosure"]

SOLVERS = ("auto", "clarabel", "scs", "descent", "uniform")
#: ``solver="auto"`` uses cvxpy while ``d + m`` is at most this (Clarabel up to 48, then SCS).
CVXPY_MAX_SIZE = 200
_CLARABEL_MAX_SIZE = 48
_TOLERANCE = {"clarabel": 1e-5, "scs": 2e-3}
_PROVENANCE = ("LipSDP-Neuron with the certified slope range [alpha, beta] (Fazlyab et al. 2019, one hidden "
               "layer), K(rho, lam) certified PSD in enclosure arithmetic; lipbound.numeric.sdp.ffn")


def _slopes(act: str | None, slopes) -> tuple[float, float]:
    if slopes is None:
        if act is None:
            raise AssumptionError("act", "an activation name or slopes=(alpha, beta)", "neither",
                                  "pass act='gelu' (its certified slope range is used)")
        slopes = slope_range(check_activation(act))
    alpha, beta = (slopes.alpha, slopes.beta) if isinstance(slopes, SlopeRange) else map(float, slopes)
    if not (math.isfinite(alpha) and math.isfinite(beta) and alpha < beta):
        raise AssumptionError("slopes", "a finite range alpha < beta", f"({alpha}, {beta})",
                              "pass the activation's slope range, e.g. slope_range('gelu')")
    return alpha, beta


def _scaled_columns(W: np.ndarray, lam: np.ndarray) -> Enclosure:
    """``W diag(lam)``: each entry one rounded product, ``|fl(w l) - w l| <= u |fl(w l)| / (1 - u)``."""
    mid = W * lam
    return Enclosure(mid, np.abs(mid) * (UNIT_ROUNDOFF * (1 + 4 * UNIT_ROUNDOFF)) + SMALLEST_SUBNORMAL)


def lmi_enclosure(W_1: np.ndarray, W_2: np.ndarray, lam: np.ndarray, rho: float, alpha: float,
                  beta: float) -> Enclosure:
    """``K(rho, lam)`` (module docstring) as an enclosure of the exact matrix."""
    ab = interval(alpha) * interval(beta)
    c = (interval(alpha) + interval(beta)) / 2
    WT = _scaled_columns(W_1, lam)
    top = (WT @ Enclosure.exact(W_1.T)).scale(ab) + Enclosure.exact(np.eye(W_1.shape[0]) * rho)
    side = WT.scale(-c)
    bottom = Enclosure.exact(np.diag(lam)) - Enclosure.exact(W_2) @ Enclosure.exact(W_2.T)
    return Enclosure(np.block([[top.mid, side.mid], [side.mid.T, bottom.mid]]),
                     np.block([[top.rad, side.rad], [side.rad.T, bottom.rad]]))


def certify_multipliers(W_1, W_2, lam, alpha: float, beta: float, slacks=(1e-9, 1e-7, 1e-5, 1e-3)) -> dict:
    """Certify multipliers: for growing slack s, ``lam' = (1 + s) lam`` and ``rho' = (1 + s)
    rho(lam') + s``-scaled, until ``lambda_min(K(rho', lam')) >= 0`` is proved.

    Returns ``{"rho", "lam_scale", "slack", "min_eig_lower"}`` (``rho`` NaN when nothing is proved)."""
    W_1, W_2, _ = check_weights(W_1, W_2)
    lam = np.asarray(lam, dtype=float)
    if lam.shape != (W_1.shape[1],) or not np.all(np.isfinite(lam)) or np.any(lam <= 0):
        return {"rho": math.nan, "reason": "multipliers must be finite and positive, one per hidden unit"}
    attempts = []
    for slack in slacks:
        trial = lam * (1 + slack)
        rho = rho_for(W_1, W_2, trial, alpha, beta)
        if not math.isfinite(rho):
            attempts.append((slack, "T - W_2 W_2^T not positive definite"))
            continue
        rho = rho * (1 + slack) + slack * max(rho, 1e-300)
        floor = lambda_min_lower(lmi_enclosure(W_1, W_2, trial, rho, alpha, beta))
        if floor >= 0.0:
            return {"rho": rho, "lam_scale": 1 + slack, "slack": slack, "min_eig_lower": floor, "lam": trial}
        attempts.append((slack, f"lambda_min lower bound {floor:.3g}"))
    return {"rho": math.nan, "reason": "K(rho, lam) not certified PSD: " + "; ".join(f"slack {s:g}: {why}"
                                                                                   for s, why in attempts)}


def _cvxpy_multipliers(A: np.ndarray, B: np.ndarray, alpha: float, beta: float, solver: str):
    """``min rho s.t. K(rho, lam) >= 0`` with cvxpy; the top-left block is ``ab reshape(M lam)`` with
    the columns of M the vectorised ``a_i a_i^T`` (no product of expressions is formed)."""
    import cvxpy as cp
    d, m = A.shape
    ab, c = alpha * beta, 0.5 * (alpha + beta)
    lam, rho = cp.Variable(m, nonneg=True), cp.Variable()
    outer = np.einsum("ik,jk->ijk", A, A).reshape(d * d, m)
    top = rho * np.eye(d) + ab * cp.reshape(outer @ lam, (d, d), order="C")
    side = -c * (A @ cp.diag(lam))
    K = cp.bmat([[top, side], [side.T, cp.diag(lam) - B @ B.T]])
    problem = cp.Problem(cp.Minimize(rho), [0.5 * (K + K.T) >> 0])
    status, seconds = _cvxpy_solve(problem, solver)
    if status != "optimal" or lam.value is None:
        return status, None, math.nan, seconds
    return status, np.maximum(np.asarray(lam.value, dtype=float), 1e-12 * max(1.0, float(np.max(lam.value)))), \
        float(rho.value), seconds


@one_blas_thread
def lipsdp_neuron(W_1, W_2, act: str | None = None, *, slopes=None, solver: str = "auto", norm: str = "fro",
                  require: bool = False, effort: int = 60) -> CertifiedValue:
    """A certified Lipschitz constant of ``x -> phi(x W_1 + b_1) W_2 + b_2`` by LipSDP-Neuron.

    Parameters
    ----------
    W_1, W_2 : ndarray, shapes (d, m) and (m, p)
        Rows are tokens (Hugging Face ``weight.T``); the biases do not enter a global constant.
    act : str, optional
        The activation, whose certified slope range is used; or give ``slopes``.
    slopes : SlopeRange or (alpha, beta), optional
        Any range holding every secant slope of the activation.
    solver : {"auto", "clarabel", "scs", "descent", "uniform"}
    norm : {"fro", "2,1", "2,inf", "inf"}
        The norm on X (the first three: the per-token constant; l_inf on vec(X): times sqrt(d)).
    require : bool
        Raise :class:`~lipbound.errors.SolverError` instead of returning a value not certified.
    effort : int
        L-BFGS steps per smoothing level of ``solver="descent"`` (five levels).

    Returns
    -------
    CertifiedValue
        ``value = sqrt(rho')`` rounded up, from the re-checked certificate; ``details`` hold the
        solver, its status and seconds, the uniform-multiplier value and the certificate numbers.
    """
    started = time.perf_counter()
    if solver not in SOLVERS:
        raise AssumptionError("solver", f"one of {SOLVERS}", repr(solver), "e.g. solver='auto'")
    W_1, W_2, _ = check_weights(W_1, W_2)
    alpha, beta = _slopes(act, slopes)
    d, m = W_1.shape
    if solver == "auto":
        solver = "clarabel" if d + m <= _CLARABEL_MAX_SIZE else "scs" if d + m <= CVXPY_MAX_SIZE else "descent"
    s1, s2 = (float(np.linalg.norm(W, 2)) or 1.0 for W in (W_1, W_2))
    A, B = W_1 / s1, W_2 / s2
    certificate: dict = {"alpha": alpha, "beta": beta, "d": d, "m": m}
    objective = math.nan
    if solver in ("clarabel", "scs"):
        status, lam, rho, seconds = _cvxpy_multipliers(A, B, alpha, beta, solver)
        certificate.update(solver_status=status, solver_seconds=seconds)
        if lam is None:
            return _result(math.nan, certificate, solver, started, status, f"solver status {status!r}", norm, d,
                           require)
        objective = math.sqrt(max(rho, 0.0)) * s1 * s2
    elif solver == "descent":
        found = descend(A, B, alpha, beta, steps=effort)
        lam, status = found.lam, "converged"
        certificate.update(descent_steps=found.steps, solver_seconds=found.seconds)
    else:
        tau, _ = uniform_multiplier(A, B, alpha, beta)
        lam, status = np.full(m, tau), "uniform"
    checked = certify_multipliers(W_1, W_2, lam * s2 * s2, alpha, beta)
    certificate.update({key: value for key, value in checked.items() if key != "lam"})
    if not math.isfinite(checked["rho"]):
        return _result(math.nan, certificate, solver, started, status, checked["reason"], norm, d, require)
    value = upper(IV.sqrt(interval(checked["rho"])))
    certificate["objective"] = objective
    if math.isfinite(objective) and abs(objective - value) > _TOLERANCE[solver] * value:
        return _result(math.nan, certificate, solver, started, status,
                       f"solver objective {objective:.10g} disagrees with the re-checked certificate {value:.10g}",
                       norm, d, require)
    return _result(value, certificate, solver, started, status, "", norm, d, require)


def _result(value, certificate, solver, started, status, reason, norm, d, require) -> CertifiedValue:
    result = sdp_value("LipSDP-Neuron", value, math.isfinite(value), certificate, solver,
                       time.perf_counter() - started, status, _PROVENANCE, reason=reason)
    if require and not result.certified:
        raise SolverError("LipSDP-Neuron", "a certified bound", f"not certified ({result.reason})",
                          "try solver='descent' or 'uniform'")
    return lift(result, norm, d)
