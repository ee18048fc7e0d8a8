r"""A relaxation of the gated unit on a bounded domain that sees its matrices: LipSDP lifted to ``w e^T``.

The unit (SwiGLU, GeGLU; Shazeer 2020) is, per token and in columns,

    f(x) = W_d^T (phi(W_g^T x + b_g) * (W_u^T x + b_u)) + b_d,      W_g, W_u (d, m),  W_d (m, p),

on an ellipsoid ``E = {c + M w : ||w|| <= r}`` (a ball: ``M = I``; an RMSNorm image: ``c = 0``,
``M = diag(gamma)``, ``r = sqrt(d)``).  LipSDP (Fazlyab et al. 2019) covers ``W_2^T phi(W_1^T x)``
only; this module states and certifies a relaxation for the product of two branches.

**The Jacobian as a linear map of ``w e^T``.**  With ``g = W_g^T x + b_g``, ``u = W_u^T x + b_u``,

    Df(x) e = W_d^T (phi'(g) * u * (W_g^T e) + phi(g) * (W_u^T e)).

Every activation lipbound knows is ``phi(t) = t m(t)`` with ``m`` in ``[0, 1]`` (the logistic function,
the normal CDF, ``(1 + tanh)/2``, the step): write ``s = phi'(g)``, in the certified slope range
``[alpha, beta]``, and ``mu = m(g)`` in ``[0, 1]``, so ``phi(g) = mu * g``.  At ``x = c + M w`` put
``g = W_g^T M w + g_c``, ``u = W_u^T M w + u_c`` (``g_c = W_g^T c + b_g``, ``u_c = W_u^T c + b_u``) and
append ``tau`` to w (``w^ = (w, tau)``, ``||w^||^2 <= r^2 + tau^2``; ``tau = 0`` when ``g_c = u_c = 0``).  Then

    Df(x) e = B^T D Phi(w^ e^T),     B = [W_d; W_d] (2m, p),   D = diag(s, mu),
    Phi(X)_i = a_i^T X b_i,  a_i = (M^T W_u[:, i], u_c,i / tau),  b_i = W_g[:, i]          (i <= m),
    Phi(X)_{m+i} = a'_i^T X b'_i,  a'_i = (M^T W_g[:, i], g_c,i / tau),  b'_i = W_u[:, i],

linear in the lifted input ``X = w^ e^T``, with ``||X||_F = ||w^|| ||e||``.  So ``Lip_E(f) <= sqrt(r^2 +
tau^2) sup_{D in box} ||B^T D Phi||``, with ``||.||`` the norm from the Frobenius norm of X: the point
enters through the box alone, the matrices through ``Phi``, whose Gram matrix ``H = Phi Phi^*`` is
(2m, 2m):

    H = [[K_1, K_2], [K_2^T, K_3]],   K_1 = (A_u^T A_u) o (W_g^T W_g),   K_2 = (A_u^T A_g) o (W_g^T W_u),
                                      K_3 = (A_g^T A_g) o (W_u^T W_u),

``A_u``, ``A_g`` the columns ``a_i``, ``a'_i`` and ``o`` the entrywise product (PSD by Schur's product theorem).

**The LMI.**  For ``y = Phi(X)`` and ``z = D y``, each coordinate satisfies ``(z_k - alpha_k y_k)(beta_k y_k -
z_k) >= 0``; with multipliers ``lam > 0``, ``c_k = (alpha_k + beta_k)/2``, ``r_k = (beta_k - alpha_k)/2``, the
S-procedure gives ``||B^T z||^2 <= rho ||X||_F^2`` as soon as

    rho ||X||^2 - y^T Lam_{r^2} y + v^T Lam v - ||B^T v + B^T D_c y||^2 >= 0       (v = z - D_c y).

*Certificate* (checked here in enclosure arithmetic, :func:`certify_lift`): with ``G = I - B^T Lam^{-1} B``,

    Z = [[rho H - H Lam_{r^2} H,  -H D_c B], [-B^T D_c H,  G]]  >= 0   (size 2m + p).

*Proof.*  (i) For every v and s = B^T v + h, completing the square in ``Lam^{1/2} v - Lam^{-1/2} B s``,
``v^T Lam v >= 2 s^T B^T v - s^T B^T Lam^{-1} B s``, so ``v^T Lam v - ||s||^2 >= s^T G s - 2 s^T h``.
(ii) ``y`` lies in the range of ``Phi``, which is that of H: ``y = H t``, and the smallest ``||X||^2`` with
``Phi(X) = y`` is ``y^T H^+ y = t^T H t``.  (iii) With ``h = B^T D_c y`` the left side above is at least
``(t, -s) Z (t, -s)^T >= 0``.  No inverse of H is formed, and G need not be invertible.

Hence ``Lip_E(f) <= sqrt((r^2 + tau^2) rho)``, for any multipliers that pass.  On ``R^d`` the unit is not
Lipschitz (its Jacobian grows linearly: :mod:`lipbound.symbolic.gated`); this bound grows with r.

**Solving.**  For fixed multipliers the smallest rho is ``lambda_max(N^{1/2} H N^{1/2})``,
``N = Lam_{r^2} + D_c B G^{-1} B^T D_c`` (Schur complement and Woodbury, as in
:mod:`lipbound.numeric.sdp.ffn_multipliers`), a convex function of ``lam``; it is evaluated by Lanczos
on ``L^T N L`` (``H = L L^T`` a float Cholesky factor) and minimised over one multiplier per branch
(``lam_s`` for the s coordinates, ``lam_mu`` for the mu ones: a family within a few per cent of the
best per-neuron multipliers on SmolLM2's blocks) by Nelder-Mead, counted in evaluations.  ``tau`` is
fixed where the two parts of the lifted map balance (``tau^2 = r ||Psi|| / ||Phi_0||``, Cauchy-Schwarz).
The value reported is the certificate's: ``Z`` built from the weights in enclosure arithmetic and
``lambda_min(Z) >= 0`` proved (:func:`lipbound.rigorous.linalg.psd_floor`); whatever fails is
"not certified".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import final

import numpy as np

from ...errors import AssumptionError, SolverError
from ...rigorous.elementwise import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, gamma_bound
from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, psd_floor, vector_norm_upper
from ...rigorous.value import CertifiedValue
from ..blas import one_blas_thread
from ..blocks.activations import check_activation, slope_range
from ..blocks.ffn import lift as tokenwise
from .joint import sdp_value

__all__ = ["Ellipsoid", "GatedLift", "lifted_unit", "gated_sdp", "certify_lift", "SECTOR_ACTIVATIONS"]

#: Activations with ``phi(t) = t m(t)``, ``m`` in ``[0, 1]`` (module docstring): the lift needs it.
SECTOR_ACTIVATIONS = frozenset({"silu", "gelu", "gelu_new", "quick_gelu", "relu"})
#: Up to this size of H the objective takes a dense eigendecomposition (Lanczos above).
_DENSE = 256
_PROVENANCE = ("LipSDP lifted to w e^T for the gated unit (slopes in the certified range, phi(t)/t in [0, 1]); "
               "Z certified PSD in enclosure arithmetic; lipbound.numeric.sdp.gated")


@final
@dataclass(frozen=True)
class Ellipsoid:
    """Tokens ``c + M w`` with ``||w|| <= r``.

    Attributes
    ----------
    center : ndarray (d,) or None
        ``c`` (None: the origin).
    axes : Enclosure (d, d)
        ``M``.
    radius : mpmath interval
        ``r``.
    """

    center: np.ndarray | None
    axes: Enclosure
    radius: object

    @property
    def d(self) -> int:
        return self.axes.shape[0]

    @property
    def outer_radius(self) -> float:
        """``r ||M|| + ||c||`` rounded up: every token has at most this norm."""
        value = interval(self.radius) * self.axes.norm_interval()
        if self.center is not None:
            value = value + interval(vector_norm_upper(self.center))
        return upper(value)

    def points(self, w: np.ndarray) -> np.ndarray:
        """``c + M w`` in floats for coordinates w (..., d)."""
        return (0.0 if self.center is None else self.center) + np.asarray(w, dtype=float) @ self.axes.mid.T


@final
@dataclass(frozen=True)
class GatedLift:
    """The lifted unit of the module docstring: ``H`` (enclosed), ``B`` and the box of ``D``.

    Attributes
    ----------
    gram : Enclosure (2m, 2m)
        ``H = Phi Phi^*``.
    W_down : ndarray (m, p)
    centers, radii2 : tuple of two intervals
        ``c`` and ``r^2`` of the s coordinates and of the mu coordinates.
    lifted_radius2 : interval
        ``r^2 + tau^2``.
    tau : float
    d : int
        The width of the tokens.
    """

    gram: Enclosure
    W_down: np.ndarray
    centers: tuple
    radii2: tuple
    lifted_radius2: object
    tau: float
    d: int

    @property
    def m(self) -> int:
        return self.W_down.shape[0]

    def coordinate(self, pair) -> np.ndarray:
        """One number per coordinate of D (2m,) from ``(for s, for mu)`` intervals, as midpoint floats."""
        return np.concatenate([np.full(self.m, float(interval(pair[0]).mid)), np.full(self.m,
                                                                                      float(interval(pair[1]).mid))])


def _gram_pair(left: Enclosure, right: Enclosure) -> Enclosure:
    return left.T @ right


def lifted_unit(W_gate, W_up, W_down, act: str, ellipsoid: Ellipsoid, b_gate=None, b_up=None,
                fold: bool = False) -> GatedLift:
    """The lifted Gram matrix and box of the gated unit on ``ellipsoid`` (module docstring), enclosed.

    ``fold``: the constant of ``w -> f(c + M w)`` on ``||w|| <= r`` instead (directions through M too:
    ``b_i = M^T W_g[:, i]``, ``b'_i = M^T W_u[:, i]``), the map a pre-norm block composes with the radial
    part of its norm."""
    act = check_activation(act)
    name = slope_range(act).name
    if name not in SECTOR_ACTIVATIONS:
        raise AssumptionError("act", f"an activation phi(t) = t m(t) with m in [0, 1] ({sorted(SECTOR_ACTIVATIONS)})",
                              repr(act), "use one of these activations")
    W_gate, W_up, W_down = (np.asarray(W, dtype=np.float64) for W in (W_gate, W_up, W_down))
    d, m = W_gate.shape
    if W_up.shape != (d, m) or W_down.shape[0] != m or ellipsoid.d != d:
        raise AssumptionError("W_gate, W_up, W_down", f"(d, m), (d, m), (m, p) on tokens of {ellipsoid.d} features",
                              f"{W_gate.shape}, {W_up.shape}, {W_down.shape}", "tokens are rows: pass weight.T")
    M_T = ellipsoid.axes.T
    gate, up = Enclosure.exact(W_gate), Enclosure.exact(W_up)
    A_u, A_g = M_T @ up, M_T @ gate                                     # (d, m): M^T W_u, M^T W_g
    shifts = []
    for W, b in ((up, b_up), (gate, b_gate)):                          # u_c, g_c as (1, m) rows
        shift = Enclosure.exact(np.zeros((1, m)))
        if ellipsoid.center is not None:
            shift = Enclosure.exact(ellipsoid.center[None, :]) @ W
        if b is not None:
            shift = shift + Enclosure.exact(np.asarray(b, dtype=np.float64)[None, :])
        shifts.append(shift)
    r2 = interval(ellipsoid.radius) ** 2
    tau = 0.0
    if any(np.any(s.mid) or np.any(s.rad) for s in shifts):
        # balance the two parts: tau^2 = r ||Psi|| / ||Phi_0|| with rough float norms (any tau > 0 is sound)
        phi_norm = float(np.linalg.norm(A_u.mid, 2) * np.max(np.linalg.norm(W_gate, axis=0))
                         + np.linalg.norm(A_g.mid, 2) * np.max(np.linalg.norm(W_up, axis=0))) or 1.0
        psi_norm = float(np.max(np.abs(shifts[0].mid)) * np.linalg.norm(W_gate, 2)
                         + np.max(np.abs(shifts[1].mid)) * np.linalg.norm(W_up, 2)) or 1.0
        tau = math.sqrt(float(interval(ellipsoid.radius).mid) * psi_norm / phi_norm)
        A_u = _stack(A_u, shifts[0].scale(1.0 / IV.mpf(tau)))
        A_g = _stack(A_g, shifts[1].scale(1.0 / IV.mpf(tau)))
        r2 = r2 + interval(tau) ** 2
    if fold:
        gate, up = M_T @ gate, M_T @ up
    K1 = _gram_pair(A_u, A_u).hadamard(_gram_pair(gate, gate))
    K2 = _gram_pair(A_u, A_g).hadamard(_gram_pair(gate, up))
    K3 = _gram_pair(A_g, A_g).hadamard(_gram_pair(up, up))
    gram = Enclosure(np.block([[K1.mid, K2.mid], [K2.mid.T, K3.mid]]),
                     np.block([[K1.rad, K2.rad], [K2.rad.T, K3.rad]])).sym()
    slopes = slope_range(act)
    alpha, beta = interval(slopes.alpha), interval(slopes.beta)
    half = interval(0.5)
    return GatedLift(gram, W_down, ((alpha + beta) / 2, half), (((beta - alpha) / 2) ** 2, half ** 2), r2, tau, d)


def _stack(top: Enclosure, row: Enclosure) -> Enclosure:
    return Enclosure(np.vstack([top.mid, row.mid]), np.vstack([top.rad, row.rad]))


# The float problem: rho(lam) by Lanczos ------------------------------------------------------------
class _Objective:
    """``rho(lam) = lambda_max(L^T N(lam) L)`` for one multiplier per branch (module docstring)."""

    def __init__(self, lift: GatedLift):
        H = lift.gram.mid
        jitter = 0.0
        for _ in range(8):
            try:
                self.L = np.linalg.cholesky(H + jitter * np.eye(H.shape[0]))
                break
            except np.linalg.LinAlgError:
                jitter = max(1e-14 * float(np.trace(H)) / H.shape[0], 10 * jitter)
        else:
            raise SolverError("gated lift", "a Cholesky factor of H", "none", "the lifted Gram matrix is degenerate")
        self.L32 = self.L.astype(np.float32)   # the search's matrix-vector products: float32 halves the reads
        self.m = lift.m
        self.c = lift.coordinate(lift.centers)
        self.r2 = lift.coordinate(lift.radii2)
        omega, Q = np.linalg.eigh(lift.W_down.T @ lift.W_down)          # W_d^T W_d = Q diag(omega) Q^T
        self.omega, self.top = np.maximum(omega, 0.0), float(max(omega.max(), 1e-300))
        WQ = lift.W_down @ Q
        self.CQ = np.vstack([self.c[0] * WQ, self.c[-1] * WQ])          # D_c B Q
        self.CQ32 = self.CQ.astype(np.float32)
        self.start = np.ones(self.L.shape[0]) / math.sqrt(self.L.shape[0])
        self.evaluations = 0

    def multipliers(self, theta) -> np.ndarray:
        return np.concatenate([np.full(self.m, math.exp(theta[0])), np.full(self.m, math.exp(theta[1]))])

    def __call__(self, theta) -> float:
        from scipy.sparse.linalg import LinearOperator, eigsh
        self.evaluations += 1
        if not all(math.isfinite(t) and abs(t) < 700 for t in theta):
            return math.inf
        lam = self.multipliers(theta)
        total = 1.0 / lam[0] + 1.0 / lam[-1]                            # B^T Lam^{-1} B = total W_d^T W_d
        if total * self.top >= 1.0:
            return math.inf                                             # G not positive definite
        inverse = 1.0 / (1.0 - total * self.omega)
        weights = lam * self.r2

        size = self.L.shape[0]
        if size <= _DENSE:
            L, CQ = self.L, self.CQ
            dense = L.T @ ((weights[:, None] * L) + CQ @ (inverse[:, None] * (CQ.T @ L)))
            return float(np.linalg.eigvalsh(0.5 * (dense + dense.T))[-1])
        weights32, inverse32 = weights.astype(np.float32), inverse.astype(np.float32)

        def apply(v):
            y = self.L32 @ v.astype(np.float32)
            return (self.L32.T @ (weights32 * y + self.CQ32 @ (inverse32 * (self.CQ32.T @ y)))).astype(np.float64)

        operator = LinearOperator((size, size), matvec=apply, dtype=np.float64)
        value, vector = eigsh(operator, k=1, which="LA", v0=self.start, tol=1e-6, ncv=8)
        self.start = vector[:, 0]           # the next evaluation starts here: a deterministic sequence
        return float(value[0])


def _minimise(objective: _Objective, effort: int) -> tuple[np.ndarray, float]:
    """Nelder-Mead over ``(log lam_s, log lam_mu)`` from ``lam = 3 ||W_d||^2`` (G = I / 3), ``effort`` evaluations."""
    from scipy.optimize import minimize
    start = math.log(3.0 * objective.top)
    found = minimize(objective, np.array([start, start]), method="Nelder-Mead",
                     options={"maxfev": max(effort, 8), "xatol": 1e-3, "fatol": 1e-6, "initial_simplex":
                              np.array([[start, start], [start + 0.5, start], [start, start + 0.5]])})
    return np.asarray(found.x, dtype=float), float(found.fun)


# The certificate -----------------------------------------------------------------------------------
def _vector(lift: GatedLift, pair) -> Enclosure:
    """A (2m,) vector enclosure: the first interval on the s coordinates, the second on the mu ones."""
    parts = [Enclosure.scalar(value) for value in pair]
    m = lift.m
    return Enclosure(np.concatenate([np.full(m, float(p.mid)) for p in parts])[:, None],
                     np.concatenate([np.full(m, float(p.rad)) for p in parts])[:, None])


def certify_lift(lift: GatedLift, roots: np.ndarray, rho: float) -> float:
    """``lambda_min(Z)`` (module docstring) certified from below for ``rho`` and the multipliers
    ``lam_k = t_k^2 / r_k^2`` given by their ``roots`` t (2m,) (positive floats: ``Lam_{r^2} = T^2`` exactly).

    ``Z`` is built at the midpoint ``H_m`` of H's enclosure.  Its first block is ``fl(fl(rho H_m) - fl(Y Y^T))``,
    ``Y = fl(H_m T)``, with the two outer roundings enclosed entrywise (``u |.|`` each) and the inner ones
    bounded in the Frobenius norm: ``|Y - H_m T| <= u |Y|`` and ``|fl(Y Y^T) - Y Y^T| <= gamma_k |Y||Y|^T``
    give ``||H_m T^2 H_m - fl(Y Y^T)||_F <= (gamma_k + 2u + u^2) ||Y||_F^2`` (plus ``eta`` terms); the other
    blocks are enclosures.  What H's radius ``E`` moves is bounded in the spectral norm: ``rho ||E|| +
    2 ||T^2|| ||H_m|| ||E|| + ||T^2|| ||E||^2`` in the first block and ``||E|| ||D_c B||`` off the diagonal.
    Both are subtracted (Weyl) from the floor of one Cholesky factorisation
    (:func:`lipbound.rigorous.linalg.psd_floor`)."""
    t = np.asarray(roots, dtype=np.float64)
    if t.shape != (2 * lift.m,) or not np.all(np.isfinite(t)) or np.any(t <= 0) or not rho > 0:
        return -math.inf
    H_m = lift.gram.mid
    k, p = H_m.shape[0], lift.W_down.shape[1]
    Y = H_m * t[None, :]
    product = Y @ Y.T                                                                # symmetric (one syrk)
    if not np.array_equal(product, product.T):
        product = np.triu(product) + np.triu(product, 1).T
    mid, rad = np.empty((k + p, k + p)), np.empty((k + p, k + p))
    top, spread = mid[:k, :k], rad[:k, :k]
    np.multiply(H_m, float(rho), out=top)
    np.abs(top, out=spread)
    top -= product
    spread += np.abs(top)
    spread *= UNIT_ROUNDOFF * (1 + 2 * UNIT_ROUNDOFF)
    spread += 2 * SMALLEST_SUBNORMAL
    square_Y = interval(vector_norm_upper(Y)) ** 2
    eta = interval(SMALLEST_SUBNORMAL)
    e_Y = interval(UNIT_ROUNDOFF) * IV.sqrt(square_Y) + interval(k) * eta
    rounding = (interval(gamma_bound(k)) * square_Y + interval(k) ** 2 * interval(k) * eta
                + 2 * e_Y * IV.sqrt(square_Y) + e_Y * e_Y)
    DcB = Enclosure.exact(np.vstack([lift.W_down, lift.W_down])).hadamard(_vector(lift, lift.centers))
    side = -(Enclosure.exact(H_m) @ DcB)
    square_t = t * t
    inverse = Enclosure(1.0 / square_t, np.abs(1.0 / square_t) * 2.0 ** -51)[:, None].hadamard(
        _vector(lift, lift.radii2))[:, 0]                                            # 1/lam = r^2 / t^2
    inverse = inverse[:lift.m] + inverse[lift.m:]                                   # B^T Lam^{-1} B = W_d^T (.) W_d
    W_d = Enclosure.exact(lift.W_down)
    G = (Enclosure.exact(np.eye(p)) - W_d.T @ W_d.hadamard(Enclosure(inverse.mid[:, None],
                                                                      inverse.rad[:, None]))).sym()
    mid[:k, k:], rad[:k, k:] = side.mid, side.rad
    mid[k:, :k], rad[k:, :k] = side.mid.T, side.rad.T
    mid[k:, k:], rad[k:, k:] = G.mid, G.rad
    E = interval(vector_norm_upper(lift.gram.rad))
    heaviest = interval(float(np.max(square_t))) * interval(1 + 2 * UNIT_ROUNDOFF)
    moved = interval(float(rho)) * E + 2 * heaviest * interval(vector_norm_upper(H_m)) * E + heaviest * E * E
    coupled = E * interval(vector_norm_upper(np.abs(DcB.mid) + DcB.rad))
    # Z >= 0 iff S Z S >= 0 for S = diag(2^-e_i) ~ diag(Z)^(-1/2): exact scaling, and the cheap floor's loss
    # (gamma_n tr) falls from rho tr(H) to n; the perturbations known in norm scale by the block maxima
    exponents = np.clip(np.round(0.5 * np.log2(np.maximum(np.abs(np.diag(mid)), 2.0 ** -600))), -300, 300)
    scale = np.ldexp(1.0, -exponents.astype(int))
    mid *= scale[:, None]
    mid *= scale[None, :]
    rad *= scale[:, None]
    rad *= scale[None, :]
    rad += SMALLEST_SUBNORMAL   # an entry scaled into the subnormals rounds by at most this
    if not (np.all(np.isfinite(mid)) and np.all(np.isfinite(rad))):
        return -math.inf
    top_scale, G_scale = interval(float(np.max(scale[:k]))), interval(float(np.max(scale[k:])))
    extra = top_scale * top_scale * (moved + rounding) + top_scale * G_scale * coupled
    return psd_floor(Enclosure(mid, rad), extra=upper(extra))


@one_blas_thread
def gated_sdp(W_gate, W_up, W_down, act: str, ellipsoid: Ellipsoid, *, b_gate=None, b_up=None, norm: str = "fro",
              fold: bool = False, effort: int = 16, slacks=(1e-2, 1e-1), require: bool = False) -> CertifiedValue:
    """A certified Lipschitz constant of the gated unit on ``ellipsoid`` (module docstring).

    Parameters
    ----------
    W_gate, W_up : ndarray (d, m)
    W_down : ndarray (m, p)
        Rows are tokens (Hugging Face ``weight.T``); ``b_down`` does not enter.
    act : str
        The activation (``"silu"``: SwiGLU; ``"gelu_pytorch_tanh"``: Gemma's GeGLU).
    ellipsoid : Ellipsoid
        Where the tokens lie (:func:`lipbound.numeric.blocks.gated.ellipsoid_of`).
    b_gate, b_up : ndarray (m,), optional
    fold : bool
        Bound ``w -> f(c + M w)`` on ``||w|| <= r`` instead (:func:`lifted_unit`).
    norm : {"fro", "2,1", "2,inf", "inf"}
        The norm on X (the first three: the per-token constant; l_inf on vec(X): times sqrt(d)).
    effort : int
        Evaluations of ``rho`` by the minimiser.
    slacks : tuple of float
        Relative margins tried, in order, until the certificate passes.
    require : bool
        Raise :class:`~lipbound.errors.SolverError` instead of returning a value not certified.

    Returns
    -------
    CertifiedValue
        ``sqrt((r^2 + tau^2) rho')`` rounded up, from the re-checked certificate.
    """
    started = time.perf_counter()
    lift = lifted_unit(W_gate, W_up, W_down, act, ellipsoid, b_gate=b_gate, b_up=b_up, fold=fold)
    objective = _Objective(lift)
    theta, rho = _minimise(objective, effort)
    certificate = {"lam_s": math.exp(theta[0]), "lam_mu": math.exp(theta[1]), "tau": lift.tau,
                   "evaluations": objective.evaluations, "objective": math.sqrt(max(rho, 0.0) *
                                                                             float(lift.lifted_radius2.mid))}
    reason = f"rho {rho!r} at the minimiser"
    if math.isfinite(rho) and rho > 0:
        attempts = []
        for slack in slacks:
            lam = objective.multipliers(theta) * (1 + slack)
            trial = objective(np.log(lam[[0, -1]]))
            if not math.isfinite(trial):
                attempts.append(f"slack {slack:g}: G not positive definite")
                continue
            trial = trial * (1 + slack)
            floor = certify_lift(lift, np.sqrt(lam * objective.r2), trial)
            if floor >= 0.0:
                value = upper(IV.sqrt(interval(trial) * lift.lifted_radius2))
                certificate.update(slack=slack, rho=trial, min_eig_lower=floor, solver_seconds=time.perf_counter()
                                   - started)
                return _result(value, certificate, started, "", norm, lift, require)
            attempts.append(f"slack {slack:g}: lambda_min lower bound {floor:.3g}")
        reason = "Z not certified PSD: " + "; ".join(attempts)
    return _result(math.nan, certificate, started, reason, norm, lift, require)


def _result(value, certificate, started, reason, norm, lift, require) -> CertifiedValue:
    result = sdp_value("lifted SDP", value, math.isfinite(value), certificate, "lanczos + nelder-mead",
                       time.perf_counter() - started, "certified" if math.isfinite(value) else "not certified",
                       _PROVENANCE, reason=reason)
    if require and not result.certified:
        raise SolverError("lifted SDP", "a certified bound", f"not certified ({result.reason})",
                          "raise effort or check the weights")
    return tokenwise(result, norm, lift.d)
