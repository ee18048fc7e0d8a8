r"""Matrix-aware replacements of the norm products in the closed-form bound.

The closed form for dot-product self-attention on ``B(c, R)^n`` (docs/mathematics.md, section 2,
:func:`lipbound.symbolic.theorems.self_attention`) multiplies operator norms that ignore
how the concrete matrices align.  This module computes the joint quantities instead,
each as a :class:`~lipbound.rigorous.value.CertifiedValue` whose value comes from a
rigorous re-check, never from a solver's objective.

**The query-gradient term: gamma_{A,V}.**  Write ``A = W_Q W_K^T / sqrt(d_k)``,
``Sigma = Cov_{j~p}(x_j)``.  The covariance term driven by the query tangent e is

    Cov_p(e^T A x_j, W_V^T x_j) = W_V^T Sigma A^T e .

Proof that ``||W_V^T Sigma A^T e|| <= R^2 gamma_{A,V} ||e||`` with
``gamma_{A,V} = max_{||u|| = 1} ||A u|| ||W_V^T u||``: the keys lie in ``B(c, R)``, so
``tr Sigma <= E||x - c||^2 <= R^2``.  The map ``Sigma -> ||W_V^T Sigma A^T e||`` is convex
(a norm of a linear map), so its maximum over the compact convex set
``{Sigma >= 0, tr Sigma <= R^2}`` is attained at an extreme point, ``0`` or
``R^2 u u^T`` with ``||u|| = 1``, where it equals ``R^2 ||W_V^T u|| |u^T A^T e|
<= R^2 ||A u|| ||W_V^T u|| ||e||``.  The closed form has ``rho alpha = R^2 ||A|| ||W_V||``
in its place.

**Certificates.**  ``gamma^2`` is the maximum of ``x y`` over the joint numerical range
``W = {(u^T A^T A u, u^T W_V W_V^T u) : ||u|| = 1}``, which is convex (Brickman 1961;
Hausdorff-Toeplitz) and equals the image of the spectraplex ``{U >= 0, tr U = 1}`` under
``U -> (<A^T A, U>, <W_V W_V^T, U>)``.  Hence the SDP relaxation

    max  geo_mean(<A^T A, U>, <W_V W_V^T, U>)   s.t.  U >= 0, tr U = 1

(concave objective; cvxpy with Clarabel or SCS) is exact, and so is its dual, the
eigenvalue certificate (AM-GM: ``sqrt(x y) <= (a x + y / (4 a))``, any ``a > 0``)

    gamma <= lambda_max(a A^T A + W_V W_V^T / (4 a)),      a = 1 / (2 t).

The solver supplies ``t = sqrt(x* / y*)`` from its primal; the value reported is the
eigenvalue bound at that t, computed rigorously (:func:`~.certify.lambda_max_upper`);
the solver's objective must agree with it, else nothing is certified.  The certified
lower bound evaluates ``||A u|| ||W_V^T u||`` at the top eigenvector of the primal U
(and of the certificate matrix) in enclosure arithmetic.

**Low rank.**  ``A^T A`` lives on ``span(W_K)`` and ``W_V W_V^T`` on ``span(W_V)``, so the
SDP is posed on an orthonormal basis of their sum (dimension ``<= 2 d_k``; 64 for one
MiniLM head of width 384).  The basis only steers the search: certificates are
recomputed on the full matrices, so an inexact basis cannot make a value unsound.

**The key-gradient term: beta.**  ``grad_y s(x, y) = A^T x + u``, ``u = W_K b_Q / sqrt(d_k)``,
and ``beta = sup_{||x - c|| <= R} ||A^T x + u||`` is a trust-region problem
(:func:`lipbound.numeric.sdp.region.key_gradient_sup`).  With
``M = W_K W_Q^T``, ``w = W_K (W_Q^T c + b_Q)``, ``z = x - c``: ``d_k beta^2 = sup_{||z|| <= R}
||M z + w||^2``, whose exact value solves the secular equation
``||(lambda I - M^T M)^{-1} M^T w|| = R``.  Certificate (S-lemma): if

    [[lambda' I - R^2 M^T M, -R M^T w], [-R w^T M, tau - lambda' - ||w||^2]]  >= 0

then ``[z/R; 1]`` gives ``||M z + w||^2 <= tau - lambda' (1 - ||z||^2 / R^2) <= tau`` on the ball.
The closed form uses ``||A|| R + ||A^T c + u||`` instead.

**LayerNorm images.**  Tokens ``x = gamma * z + b`` with ``z`` orthogonal to 1 and
``||z|| = sqrt(d)``: the value spread is exactly ``sqrt(d) ||W_V^T diag(gamma) P||``
(``P = I - 1 1^T / d``) instead of ``||W_V|| gamma_max sqrt(d)``, and the query-gradient
term is ``d * gamma(A D P, W_V^T D P)``, ``D = diag(gamma)``, by the argument above with
``tr Cov(z) <= d``.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import final

import numpy as np

from ...errors import AssumptionError, SolverError, WeightsError
from ...rigorous.elementwise import UNIT_ROUNDOFF
from ...rigorous.intervals import IV, Verdict, lower, upper
from ...rigorous.linalg import Enclosure, lambda_max_upper, spectral_norm_upper
from ...rigorous.value import CertifiedValue
from ..blas import one_blas_thread
from ..dispatch import dot_product_scope
from ..model import Head

__all__ = ["JointRange", "SdpCandidate", "sdp_value", "joint_gain", "gamma_AV", "key_form", "value_gram",
           "layernorm_value_spread", "layernorm_joint_gain", "SOLVERS"]

#: Accepted solver names: conic solvers through cvxpy, "eig" (one-dimensional convex
#: search on the eigenvalue certificate, no conic solver), "auto" (Clarabel for small
#: reduced dimension, SCS above: Clarabel's dense KKT system grows like r^6).
SOLVERS = ("auto", "clarabel", "scs", "eig")
_AUTO_CLARABEL_MAX = 24
_TOLERANCE = {"clarabel": 1e-5, "scs": 2e-3, "eig": 0.0}
_PROVENANCE_GAMMA = ("gamma_{A,V} = max_u ||A u|| ||W_V^T u||: exact SDP over the joint numerical range "
                     "(Brickman 1961), certified by lambda_max(a A^T A + W_V W_V^T/(4a)) (AM-GM); "
                     "lipbound.numeric.sdp.joint")


def sdp_value(name: str, value: float, certified: bool, certificate: dict, solver: str, seconds: float,
              status: str, provenance: str, reason: str = "", lower: float = math.nan) -> CertifiedValue:
    """A relaxation's result as a :class:`~lipbound.rigorous.value.CertifiedValue`: ``details`` holds
    the solver, the seconds, the status and the re-check numbers of the certificate."""
    details = {"solver": solver, "seconds": seconds, "status": status, **certificate}
    if certified:
        return CertifiedValue(name, value, Verdict.HOLDS, provenance, lower=lower, details=details)
    return CertifiedValue(name, math.nan, Verdict.UNKNOWN, provenance, lower=lower, reason=reason or "not certified",
                          details=details)


# Gram matrices of a head ------------------------------------------------------------------
#: SDP encoding (a kernel's :attr:`~lipbound.numeric.kernels.AttentionKernel.sdp_encoding`) -> what it models
SDP_ENCODINGS = {"dot-product": "softmax attention with scores q . k / sqrt(d_k): the joint constants and "
                                "relaxations of this module and of lipbound.numeric.sdp.head"}


def check_encoding(target) -> None:
    """Refuse a head or layer whose kernels have no SDP encoding here, or that lies outside the scope
    the encoding states (:func:`lipbound.numeric.dispatch.dot_product_scope`)."""
    heads = (target,) if isinstance(target, Head) else tuple(getattr(target, "heads", ()))
    encodings = sorted({str(h.kernel.sdp_encoding) for h in heads})
    if encodings != ["dot-product"] or not dot_product_scope(target):
        kinds = sorted({h.kernel.describe() for h in heads} | {h.mask.describe() for h in heads if not h.mask.plain})
        raise AssumptionError("target", "heads with dot-product scores, the one SDP encoding (standard scale, "
                              "causal mask or none, one key/value group per head)",
                              f"{'; '.join(kinds)} (encodings {encodings})",
                              "use the symbolic closed form (lipbound.numeric.certify.head_bounds)")
def _check_head(head) -> Head:
    if not isinstance(head, Head):
        raise WeightsError("head", "a lipbound.numeric.attention.Head", type(head).__name__,
                           "build one with Head(W_Q=..., W_K=..., W_V=...)")
    check_encoding(head)
    return head


def key_form(head: Head) -> Enclosure:
    """``A^T A = W_K (W_Q^T W_Q) W_K^T / d_k`` (d x d) as an enclosure; ``||A u||^2 = u^T A^T A u``."""
    head = _check_head(head)
    W_Q, W_K = Enclosure.exact(head.W_Q), Enclosure.exact(head.W_K)
    inner = (W_Q.T @ W_Q)
    return (W_K @ inner @ W_K.T).scale(Enclosure.scalar(1 / IV.mpf(head.d_k))).sym()


def value_gram(W_V: np.ndarray | Enclosure) -> Enclosure:
    """``W_V W_V^T`` (d x d) as an enclosure; ``||W_V^T u||^2 = u^T W_V W_V^T u``."""
    W_V = W_V if isinstance(W_V, Enclosure) else Enclosure.exact(np.asarray(W_V, dtype=float))
    return (W_V @ W_V.T).sym()


# Solver plumbing --------------------------------------------------------------------------
@final
@dataclass(frozen=True)
class SdpCandidate:
    """What a conic solver returned (a candidate only; see :class:`JointRange`).

    Attributes
    ----------
    status : str
        cvxpy's status string (``"optimal"`` is the only one accepted).
    objective : float
        The optimal value in the normalised units of the problem.
    x, y : float
        ``<M1, U>`` and ``<M2, U>`` at the solution (normalised units).
    b : float
        The epigraph variable of the coupled problem (``nan`` for the plain gain).
    U : ndarray or None
        The primal matrix (reduced coordinates).
    seconds : float
    """

    status: str
    objective: float
    x: float
    y: float
    b: float
    U: np.ndarray | None
    seconds: float


def _cvxpy_solve(problem, solver: str):
    import cvxpy as cp
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():   # an inaccurate solution says so in its status, which the callers read
            warnings.filterwarnings("ignore", message="Solution may be inaccurate", category=UserWarning)
            if solver == "clarabel":
                problem.solve(solver=cp.CLARABEL)
            else:
                problem.solve(solver=cp.SCS, eps_abs=1e-7, eps_rel=1e-7, max_iters=50000)
        status = str(problem.status)
    except cp.error.SolverError as exc:
        status = f"solver_error: {exc}"
    return status, time.perf_counter() - started


def _solve_gain_sdp(M1: np.ndarray, M2: np.ndarray, solver: str) -> SdpCandidate:
    """``max geo_mean(<M1, U>, <M2, U>)`` over the spectraplex (normalised reduced matrices)."""
    import cvxpy as cp
    r = M1.shape[0]
    U = cp.Variable((r, r), PSD=True)
    x, y = cp.trace(M1 @ U), cp.trace(M2 @ U)
    problem = cp.Problem(cp.Maximize(cp.geo_mean(cp.hstack([x, y]))), [cp.trace(U) == 1])
    status, seconds = _cvxpy_solve(problem, solver)
    if status != "optimal":
        return SdpCandidate(status, math.nan, math.nan, math.nan, math.nan, None, seconds)
    return SdpCandidate(status, float(problem.value), float(x.value), float(y.value), math.nan,
                        np.array(U.value), seconds)


def _solve_coupled_sdp(M1: np.ndarray, M2: np.ndarray, ell: float, solver: str) -> SdpCandidate:
    """``max b sqrt(y + ell)`` s.t. ``b <= sqrt(<M1,U> <M2,U>)``, ``y = <M2,U>``, U in the spectraplex.

    Written as ``max geo_mean((b, y + ell), weights (2, 1))``, which is concave (DCP)."""
    import cvxpy as cp
    r = M1.shape[0]
    U = cp.Variable((r, r), PSD=True)
    b = cp.Variable(nonneg=True)
    x, y = cp.trace(M1 @ U), cp.trace(M2 @ U)
    problem = cp.Problem(cp.Maximize(cp.geo_mean(cp.hstack([b, y + ell]), p=[2, 1])),
                         [cp.trace(U) == 1, b <= cp.geo_mean(cp.hstack([x, y]))])
    status, seconds = _cvxpy_solve(problem, solver)
    if status != "optimal":
        return SdpCandidate(status, math.nan, math.nan, math.nan, math.nan, None, seconds)
    b_value = float(b.value)
    objective = b_value * math.sqrt(max(float(y.value) + ell, 0.0))
    return SdpCandidate(status, objective, float(x.value), float(y.value), b_value, np.array(U.value), seconds)


def _golden_min(fun, lo: float, hi: float, iterations: int = 60) -> float:
    """Minimiser of a unimodal function on [lo, hi] by golden-section search."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = fun(c), fun(d)
    for _ in range(iterations):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = fun(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = fun(d)
    return c if fc <= fd else d


# The joint numerical range ----------------------------------------------------------------------
@final
class JointRange:
    r"""Two PSD forms ``G1, G2`` (d x d) and the sets a relaxation needs from them.

    * ``W = {(u^T G1 u, u^T G2 u) : ||u|| = 1}``, convex (Brickman 1961), equal to the image
      of the spectraplex ``{U >= 0, tr U = 1}``;
    * ``K = conv{(sqrt(x y), y) : (x, y) in W}``, whose support function is bounded by
      the AM-GM certificate

          sup_K (k_1 + mu k_2) <= lambda_max(a G1 + (mu + 1 / (4 a)) G2)   for every a > 0.

    For ``G1 = A^T A``, ``G2 = W_V W_V^T``: ``sup_K k_1 = gamma_{A,V}``; for a covariance
    ``Sigma`` with ``tr Sigma <= t``, ``(||W_V^T Sigma A^T||, ||W_V^T Sigma W_V||)`` is dominated
    componentwise by ``t k`` for some ``k in K`` (write ``Sigma = sum_k lambda_k u_k u_k^T``
    and use the triangle inequality).

    Parameters
    ----------
    G1, G2 : Enclosure or ndarray, shape (d, d)
        Symmetric positive semidefinite.

    Searches run on an orthonormal basis of ``range(G1) + range(G2)``; every certificate
    is recomputed on the full enclosures.
    """

    def __init__(self, G1: Enclosure | np.ndarray, G2: Enclosure | np.ndarray):
        G1 = (G1 if isinstance(G1, Enclosure) else Enclosure.exact(G1)).sym()
        G2 = (G2 if isinstance(G2, Enclosure) else Enclosure.exact(G2)).sym()
        if G1.shape != G2.shape or len(G1.shape) != 2 or G1.shape[0] != G1.shape[1]:
            raise WeightsError("G1, G2", "two square matrices of the same shape",
                               f"shapes {G1.shape} and {G2.shape}", "pass d x d Gram matrices")
        self.G1, self.G2 = G1, G2
        norm1, norm2 = float(np.linalg.norm(G1.mid)), float(np.linalg.norm(G2.mid))
        if norm1 == 0.0 or norm2 == 0.0:
            self.basis = np.zeros((G1.shape[0], 0))
        else:
            # one eigendecomposition of the sum: its range is range(G1) + range(G2)
            values, vectors = np.linalg.eigh(G1.mid / norm1 + G2.mid / norm2)
            self.basis = vectors[:, values > 1e-11 * values[-1]]
        B = self.basis
        self.M1 = 0.5 * (B.T @ G1.mid @ B + (B.T @ G1.mid @ B).T)
        self.M2 = 0.5 * (B.T @ G2.mid @ B + (B.T @ G2.mid @ B).T)
        self.scale1 = float(max(np.linalg.eigvalsh(self.M1)[-1], 0.0)) if self.rank else 0.0
        self.scale2 = float(max(np.linalg.eigvalsh(self.M2)[-1], 0.0)) if self.rank else 0.0
        self.degenerate = self.scale1 == 0.0 or self.scale2 == 0.0

    @property
    def rank(self) -> int:
        """Dimension of the reduced space the searches and SDPs run in."""
        return self.basis.shape[1]

    def pick_solver(self, solver: str) -> str:
        if solver not in SOLVERS:
            raise AssumptionError("solver", f"one of {SOLVERS}", repr(solver),
                                  "choose 'clarabel', 'scs', 'eig' or 'auto'")
        if solver == "auto":
            return "clarabel" if self.rank <= _AUTO_CLARABEL_MAX else "scs"
        return solver

    # certificates -------------------------------------------------------------------------
    def support_upper(self, mu: float, a: float) -> tuple[float, float]:
        """Certified ``sup_K (k_1 + mu k_2) <= lambda_max(a G1 + b G2)``; returns ``(bound, b)``
        with ``b >= mu + 1/(4a)`` rounded up."""
        if not (a > 0 and math.isfinite(a) and mu >= 0 and math.isfinite(mu)):
            raise SolverError("a, mu", "a > 0 and mu >= 0, finite", f"a={a!r}, mu={mu!r}",
                              "the certificate needs a positive AM-GM weight")
        b = upper(IV.mpf(mu) + 1 / (4 * IV.mpf(a)))
        return lambda_max_upper(self.G1.scale(a) + self.G2.scale(b)), b

    def support_numeric(self, mu: float, a: float) -> float:
        return float(np.linalg.eigvalsh(a * self.M1 + (mu + 0.25 / a) * self.M2)[-1])

    def best_weight(self, mu: float) -> float:
        """The AM-GM weight a minimising the (convex in a) eigenvalue certificate."""
        centre = 0.5 * math.sqrt(self.scale2 / self.scale1)
        # 36 steps leave log a within 2e-6 of the minimiser, where the (smooth) bound is flat to 1e-11
        log_a = _golden_min(lambda s: self.support_numeric(mu, math.exp(s)),
                            math.log(centre) - 25.0, math.log(centre) + 25.0, iterations=36)
        return math.exp(log_a)

    def point(self, vector: np.ndarray):
        """Certified intervals of ``(x, y) = (v^T G1 v, v^T G2 v) / v^T v`` for a float vector v."""
        v = np.asarray(vector, dtype=float).reshape(-1)
        column = Enclosure.exact(v.reshape(-1, 1))
        norm2 = (column.T @ column).interval()
        return self.G1.quad(v).interval() / norm2, self.G2.quad(v).interval() / norm2

    def lift(self, reduced: np.ndarray) -> np.ndarray:
        return self.basis @ reduced

    def top_vector(self, mu: float, a: float) -> np.ndarray:
        _, vectors = np.linalg.eigh(a * self.M1 + (mu + 0.25 / a) * self.M2)
        return self.lift(vectors[:, -1])

    def gain_lower(self, vectors) -> float:
        """Certified lower bound on ``sup_W sqrt(x y)`` from candidate vectors."""
        best = 0.0
        for v in vectors:
            if v is None or not np.any(v):
                continue
            x, y = self.point(v)
            best = max(best, lower(IV.sqrt(IV.mpf(max(lower(x), 0.0)) * IV.mpf(max(lower(y), 0.0)))))
        return best

    # the gain sup_W sqrt(x y) ---------------------------------------------------------------
    @one_blas_thread
    def gain(self, solver: str = "auto", name: str = "gamma", provenance: str = _PROVENANCE_GAMMA,
             polish: bool = True) -> CertifiedValue:
        """``sup_{||u||=1} sqrt(u^T G1 u * u^T G2 u)``, certified.

        Parameters
        ----------
        solver : {"auto", "clarabel", "scs", "eig"}
        polish : bool
            Also certify at the best AM-GM weight found by a one-dimensional search and
            report the smaller of the two certified values (both are sound).
        """
        started = time.perf_counter()
        solver = self.pick_solver(solver)
        if self.degenerate:
            return self._zero(name, provenance, solver, started)
        certificate: dict = {"reduced_dimension": self.rank}
        vectors = []
        if solver == "eig":
            a = self.best_weight(0.0)
            status, objective = "certified", math.nan
        else:
            candidate = _solve_gain_sdp(self.M1 / self.scale1, self.M2 / self.scale2, solver)
            certificate.update(sdp_status=candidate.status, sdp_seconds=candidate.seconds)
            if candidate.status != "optimal":
                return _failed(name, provenance, solver, started, candidate.status,
                               f"solver status {candidate.status!r}", certificate)
            x, y = candidate.x * self.scale1, candidate.y * self.scale2
            objective = candidate.objective * math.sqrt(self.scale1 * self.scale2)
            certificate.update(sdp_objective=objective, sdp_x=x, sdp_y=y)
            if not (x > 0 and y > 0 and math.isfinite(objective)):
                return _failed(name, provenance, solver, started, candidate.status,
                               "the solver's primal has <G1,U> or <G2,U> <= 0: no dual weight to re-check",
                               certificate)
            a = 0.5 * math.sqrt(y / x)
            status = candidate.status
            if candidate.U is not None:
                vectors.append(self.lift(np.linalg.eigh(0.5 * (candidate.U + candidate.U.T))[1][:, -1]))
        value, b = self.support_upper(0.0, a)
        certificate.update(weight_a=a, weight_b=b, t=0.5 / a, lambda_max_upper=value)
        if solver != "eig":
            disagreement = _disagreement(objective, value, solver, certificate)
            if disagreement:
                return _failed(name, provenance, solver, started, status, disagreement, certificate)
        if polish:
            a_best = self.best_weight(0.0)
            polished, _ = self.support_upper(0.0, a_best)
            certificate.update(polished_weight_a=a_best, polished_lambda_max_upper=polished)
            if polished < value:
                value, a = polished, a_best
        vectors.append(self.top_vector(0.0, a))
        low = self.gain_lower(vectors)
        certificate["lower"] = low
        return _bracketed(name, provenance, solver, started, status, value, low, certificate)

    def _zero(self, name, provenance, solver, started) -> CertifiedValue:
        """A form vanishes (numerically): the product of the two norms is then the bound."""
        tops = [max(lambda_max_upper(G), 0.0) for G in (self.G1, self.G2)]
        value = upper(IV.sqrt(IV.mpf(tops[0]) * IV.mpf(tops[1])))
        return sdp_value(name, value, True, {"degenerate": "norm product", "lambda_max_upper": tops},
                              solver, time.perf_counter() - started, "certified", provenance, lower=0.0)

    # the coupled gain sup_K k_1 sqrt(base + slope k_2) ----------------------------------------
    @one_blas_thread
    def coupled_gain(self, base: float, slope: float, k1_max: float, k2_max: float, solver: str = "auto",
                     name: str = "coupled gain", provenance: str = "") -> CertifiedValue:
        r"""``sup_{k in K} k_1 sqrt(base + slope k_2)``, certified.

        ``k1_max`` and ``k2_max`` must be certified upper bounds of ``sup_K k_1`` and of
        ``lambda_max(G2)``.  The objective is increasing and log-concave, so its supremum over
        the convex set K equals the minimum over supporting half-planes
        ``k_1 + mu k_2 <= h(mu)`` of its supremum on the half-plane (intersected with the
        box ``[0, k1_max] x [0, k2_max]``); any ``(mu, a)`` gives a sound bound
        (:func:`_polygon_sup`).  The SDP

            max b sqrt(y + ell)  s.t.  b <= geo_mean(<G1,U>, <G2,U>), y = <G2,U>, U in the spectraplex

        supplies ``mu`` (the gradient of the objective at its solution) and ``a``.
        """
        started = time.perf_counter()
        solver = self.pick_solver(solver)
        for label, value in (("base", base), ("slope", slope), ("k1_max", k1_max), ("k2_max", k2_max)):
            if not (value >= 0 and math.isfinite(value)):
                raise SolverError(label, "a finite non-negative number", repr(value),
                                  "pass certified upper bounds")
        if self.degenerate or k1_max == 0.0:
            value = upper(IV.mpf(k1_max) * IV.sqrt(IV.mpf(base) + IV.mpf(slope) * IV.mpf(k2_max)))
            return sdp_value(name, value, True, {"degenerate": "box bound"}, solver,
                                  time.perf_counter() - started, "certified", provenance, lower=0.0)
        certificate: dict = {"reduced_dimension": self.rank, "base": base, "slope": slope,
                             "k1_max": k1_max, "k2_max": k2_max}
        if slope == 0.0 or solver == "eig":
            mu, a = self._coupled_search(base, slope, k1_max, k2_max)
            status, objective = "certified", math.nan
        else:
            ell = base / (slope * self.scale2)
            candidate = _solve_coupled_sdp(self.M1 / self.scale1, self.M2 / self.scale2, ell, solver)
            certificate.update(sdp_status=candidate.status, sdp_seconds=candidate.seconds)
            if candidate.status != "optimal":
                return _failed(name, provenance, solver, started, candidate.status,
                               f"solver status {candidate.status!r}", certificate)
            x, y = candidate.x * self.scale1, candidate.y * self.scale2
            k1 = min(candidate.b, math.sqrt(max(candidate.x * candidate.y, 0.0))) * math.sqrt(
                self.scale1 * self.scale2)
            objective = candidate.objective * math.sqrt(self.scale1 * self.scale2 * slope * self.scale2)
            certificate.update(sdp_objective=objective, sdp_x=x, sdp_y=y, sdp_k1=k1)
            if not (x > 0 and y > 0 and math.isfinite(objective)):
                return _failed(name, provenance, solver, started, candidate.status,
                               "the solver's primal has <G1,U> or <G2,U> <= 0: no dual weight to re-check",
                               certificate)
            mu = k1 * slope / (2.0 * (base + slope * y))
            a = 0.5 * math.sqrt(y / x)
            status = candidate.status
        H, b = self.support_upper(mu, a)
        value = _polygon_sup(H, mu, k1_max, k2_max, base, slope)
        certificate.update(mu=mu, weight_a=a, weight_b=b, support_upper=H)
        if not math.isnan(objective):  # a solver ran: its objective must agree with the certificate
            disagreement = _disagreement(objective, value, solver, certificate)
            if disagreement:
                return _failed(name, provenance, solver, started, status, disagreement, certificate)
        v = self.top_vector(mu, a)
        x_iv, y_iv = self.point(v)
        x_lo, y_lo = max(lower(x_iv), 0.0), max(lower(y_iv), 0.0)
        low = lower(IV.sqrt(IV.mpf(x_lo) * IV.mpf(y_lo)) * IV.sqrt(IV.mpf(base) + IV.mpf(slope) * y_lo)) \
            if base + slope > 0 else 0.0
        certificate["rank_one_lower"] = low
        return _bracketed(name, provenance, solver, started, status, value, low, certificate)

    def _coupled_search(self, base, slope, k1_max, k2_max) -> tuple[float, float]:
        """Numeric minimisation over mu of the half-plane bound (steers the certificate only)."""
        if slope == 0.0:
            return 0.0, self.best_weight(0.0)
        span = k1_max / max(k2_max, 1e-300)

        def bound(theta: float) -> float:
            mu = span * math.tan(theta)
            a = self.best_weight(mu)
            return _polygon_sup_numeric(self.support_numeric(mu, a), mu, k1_max, k2_max, base, slope)

        grid = np.linspace(0.0, 0.5 * math.pi - 1e-6, 33)
        values = [bound(theta) for theta in grid]
        best = int(np.argmin(values))
        lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
        theta = _golden_min(bound, lo, hi, iterations=40)
        if bound(theta) > values[best]:
            theta = grid[best]
        mu = span * math.tan(theta)
        return mu, self.best_weight(mu)



def _disagreement(objective: float, value: float, solver: str, certificate: dict) -> str:
    """Why a solver's objective and the re-checked certificate disagree ("" if they agree)."""
    tolerance = _TOLERANCE[solver]
    certificate["tolerance"] = tolerance
    if abs(objective - value) <= tolerance * value:
        return ""
    return (f"solver objective {objective:.10g} disagrees with the re-checked certificate {value:.10g} "
            f"(relative tolerance {tolerance:g})")

def _bracketed(name, provenance, solver, started, status, value, low, certificate) -> CertifiedValue:
    """The certified value, unless its certified lower bound contradicts it (then a failure)."""
    if low > value:
        return _failed(name, provenance, solver, started, status,
                       f"certified lower bound {low!r} exceeds the upper bound {value!r}", certificate)
    return sdp_value(name, value, True, certificate, solver, time.perf_counter() - started,
                          status, provenance, lower=low)


def _failed(name, provenance, solver, started, status, reason, certificate) -> CertifiedValue:
    return sdp_value(name, math.nan, False, certificate, solver, time.perf_counter() - started,
                          status, provenance, reason=reason)


def _polygon_sup_numeric(H, mu, k1_max, k2_max, base, slope, points: int = 4001) -> float:
    y = np.linspace(0.0, k2_max, points)
    k1 = np.minimum(k1_max, H - mu * y)
    return float(np.max(np.where(k1 > 0, k1, 0.0) * np.sqrt(base + slope * y)))


def _polygon_sup(H, mu, k1_max, k2_max, base, slope, cells: int = 2048, rounds: int = 3) -> float:
    r"""Certified ``sup k_1 sqrt(base + slope k_2)`` over
    ``{k_1 + mu k_2 <= H, 0 <= k_1 <= k1_max, 0 <= k_2 <= k2_max}``.

    On a cell ``[y_a, y_b]`` of ``k_2`` the objective is at most
    ``min(k1_max, H - mu y_a) * sqrt(base + slope y_b)`` (the first factor does not increase
    in ``k_2``, the second does not decrease), each factor rounded upward explicitly.  Cells
    whose bound is below the best value seen at a grid point are set aside (their bounds
    still enter the maximum); the others are split again, ``rounds`` times.
    """
    u = UNIT_ROUNDOFF

    def cell_bounds(left, right):
        if math.isinf(H):
            k1 = np.full_like(left, k1_max)
        else:
            drop = mu * left
            k1 = np.minimum(k1_max, (H - drop) + 4 * u * (abs(H) + drop))
        k1 = np.maximum(k1, 0.0)
        return k1 * (np.sqrt((base + slope * right) * (1 + 6 * u)) * (1 + 2 * u)) * (1 + 2 * u)

    def split(left, right):
        pieces = max(2, min(cells, (1 << 20) // max(len(left), 1)))
        fractions = np.linspace(0.0, 1.0, pieces + 1)
        edges = left[:, None] + (right - left)[:, None] * fractions[None, :]
        edges[:, 0], edges[:, -1] = left, right          # cells tile [left, right] exactly
        return edges[:, :-1].ravel(), edges[:, 1:].ravel()

    left, right = split(np.array([0.0]), np.array([float(k2_max)]))
    set_aside = 0.0
    for _ in range(rounds):
        bounds = cell_bounds(left, right)
        seen = float(np.max(np.minimum(k1_max, np.maximum(H - mu * left, 0.0)) * np.sqrt(base + slope * left)))
        keep = bounds >= seen * (1 - 1e-12)
        if np.any(~keep):
            set_aside = max(set_aside, float(np.max(bounds[~keep])))
        left, right = split(left[keep], right[keep])
    value = max(set_aside, float(np.max(cell_bounds(left, right))))
    return math.nextafter(value, math.inf)


# Public constants of a head -----------------------------------------------------------------------
@one_blas_thread
def joint_gain(G1, G2, solver: str = "auto", name: str = "joint gain",
               provenance: str = _PROVENANCE_GAMMA) -> CertifiedValue:
    """``max_{||u||=1} sqrt(u^T G1 u) sqrt(u^T G2 u)`` for PSD ``G1 = F1^T F1``, ``G2 = F2^T F2``,
    i.e. ``max ||F1 u|| ||F2 u||``, certified (see :class:`JointRange`)."""
    return JointRange(G1, G2).gain(solver=solver, name=name, provenance=provenance)


@one_blas_thread
def gamma_AV(head: Head, solver: str = "auto") -> CertifiedValue:
    r"""``gamma_{A,V} = max_{||u||=1} ||A u|| ||W_V^T u||`` for a dot-product head.

    Replaces ``||A|| ||W_V||`` in the query-gradient term: ``||Cov_p(e^T A x, W_V^T x)||
    = ||W_V^T Sigma A^T e|| <= R^2 gamma_{A,V} ||e||`` (module docstring).

    Parameters
    ----------
    head : Head
        ``W_Q, W_K`` of shape (d, d_k), ``W_V`` of shape (d, d_v); score "dot".
    solver : {"auto", "clarabel", "scs", "eig"}

    Returns
    -------
    CertifiedValue
        ``value`` = certified upper bound, ``lower`` = certified lower bound.
    """
    head = _check_head(head)
    return joint_gain(key_form(head), value_gram(head.W_V), solver=solver, name="gamma_{A,V}")


def _ball(head: Head, radius, center) -> tuple[float, np.ndarray]:
    try:
        radius = float(radius)
    except (TypeError, ValueError):
        raise AssumptionError("radius", "a positive finite number", repr(radius), "pass R > 0") from None
    if not (radius > 0 and math.isfinite(radius)):
        raise AssumptionError("radius", "a positive finite number", repr(radius), "pass R > 0")
    center = np.zeros(head.d) if center is None else np.asarray(center, dtype=float)
    if center.shape != (head.d,) or not np.all(np.isfinite(center)):
        raise AssumptionError("center", f"a finite vector of shape ({head.d},)",
                              f"shape {center.shape}", "pass the ball's centre (the LayerNorm bias) or None")
    return radius, center


def _layernorm_projector(gain: np.ndarray) -> Enclosure:
    """``diag(gain) P``, ``P = I - 1 1^T / d``, as an enclosure."""
    gain = np.asarray(gain, dtype=float).reshape(-1)
    d = gain.size
    P = Enclosure.exact(np.eye(d)) - Enclosure.exact(np.ones((d, d))).scale(Enclosure.scalar(1 / IV.mpf(d)))
    return Enclosure.exact(np.diag(gain)) @ P


def _check_gain(gain, d: int) -> np.ndarray:
    gain = np.asarray(gain, dtype=float)
    if gain.shape != (d,) or not np.all(np.isfinite(gain)):
        raise WeightsError("gain", f"a finite LayerNorm weight of shape ({d},)", f"shape {gain.shape}",
                           "pass the LayerNorm's weight (gamma) vector")
    return gain


@one_blas_thread
def layernorm_value_spread(W_V: np.ndarray, gain: np.ndarray) -> CertifiedValue:
    r"""``sup ||W_V^T diag(gain) z||`` over ``z`` orthogonal to 1 with ``||z|| = sqrt(d)``:
    exactly ``sqrt(d) ||W_V^T diag(gain) P||``, ``P = I - 1 1^T / d``.

    This is the value spread rho of the LayerNorm image ``x = gain * z + bias`` (about the
    LayerNorm bias), against ``||W_V|| ||gain||_inf sqrt(d)`` in the closed form.

    Parameters
    ----------
    W_V : ndarray, shape (d, d_v)
    gain : ndarray, shape (d,)
    """
    started = time.perf_counter()
    W_V = np.asarray(W_V, dtype=float)
    if W_V.ndim != 2:
        raise WeightsError("W_V", "a matrix of shape (d, d_v)", f"shape {W_V.shape}", "pass W_V = weight.T")
    d = W_V.shape[0]
    gain = _check_gain(gain, d)
    F = Enclosure.exact(W_V).T @ _layernorm_projector(gain)          # (d_v, d)
    G = (F @ F.T).sym()
    top = max(lambda_max_upper(G), 0.0)
    value = upper(IV.sqrt(IV.mpf(d) * IV.mpf(top)))
    # lower: the top right-singular vector, projected exactly (in enclosure arithmetic) onto 1-perp
    vector = np.linalg.svd(F.mid)[2][0]
    image = F @ Enclosure.exact(vector.reshape(-1, 1))
    projected = _layernorm_projector(np.ones(d)) @ Enclosure.exact(vector.reshape(-1, 1))
    num, den = (image.T @ image).interval(), (projected.T @ projected).interval()
    low = lower(IV.sqrt(IV.mpf(d) * IV.mpf(max(lower(num), 0.0)) / IV.mpf(upper(den)))) if upper(den) > 0 else 0.0
    naive = upper(IV.mpf(spectral_norm_upper(W_V)) * IV.mpf(float(np.max(np.abs(gain)))) * IV.sqrt(IV.mpf(d)))
    return sdp_value("rho (LayerNorm image)", value, True, {"lambda_max_upper": top, "naive": naive},
                          "eig", time.perf_counter() - started, "certified",
                          "sup over z orthogonal to 1, ||z|| = sqrt(d), of ||W_V^T diag(gain) z|| = "
                          "sqrt(d) ||W_V^T diag(gain) P||; lipbound.numeric.sdp.joint", lower=low)


@one_blas_thread
def layernorm_joint_gain(head: Head, gain: np.ndarray, solver: str = "auto") -> CertifiedValue:
    r"""``d * max_{u ⟂ 1, ||u|| = 1} ||A D u|| ||W_V^T D u||``, ``D = diag(gain)``: the bound on
    ``||Cov_p(e^T A x, W_V^T x)|| / ||e||`` for tokens on the LayerNorm image (it replaces
    ``R^2 gamma_{A,V}``), since ``Cov(x) = D Cov(z) D`` with ``tr Cov(z) <= d`` on ``1``-perp."""
    head = _check_head(head)
    gain = _check_gain(gain, head.d)
    DP = _layernorm_projector(gain)
    G1 = (DP.T @ key_form(head) @ DP).sym()
    G2 = (DP.T @ value_gram(head.W_V) @ DP).sym()
    inner = joint_gain(G1, G2, solver=solver, name="gamma (LayerNorm image)")
    if not inner.certified:
        return inner
    value = upper(IV.mpf(head.d) * IV.mpf(inner.value))
    low = lower(IV.mpf(head.d) * IV.mpf(inner.lower))
    return sdp_value("d * gamma (LayerNorm image)", value, True, {"gamma": inner}, inner.details["solver"],
                     inner.details["seconds"], inner.details["status"], inner.provenance + "; times tr Cov(z) <= d",
                     lower=low)
