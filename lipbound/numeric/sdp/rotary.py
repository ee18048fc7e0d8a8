r"""Certified constants of heads whose scores depend on positions: rotary (RoPE) heads, and heads
with windows, position biases or soft-capped logits.

**Setting.**  Token i sits at position ``p_i`` (0..n-1), keys and queries in the region
``D = {c + M w : ||w|| <= r}`` (:class:`~.region.Region`; ``Pi`` projects onto the directions the tokens
move in).  The head scores, before its mask,

    s_ij = sigma q_i^T R_{Delta_ij} k_j,    q_i = W_Q^T x_i + b_Q,  k_j = W_K^T x_j + b_K,  Delta_ij = p_j - p_i,

``R_Delta`` the rotation by ``Delta theta_t`` in each rotated pair (:mod:`lipbound.numeric.kernels.rotary`;
``R_Delta = I`` for a dot product), ``sigma`` the kernel's scale.  The mask caps ``phi(s) = C tanh(s / C)``
(or leaves s), adds a bias ``b_ij`` constant in the tokens and hides keys: row i sees the keys ``V_i``
(``N_i`` of them).  Write ``A_Delta = sigma W_Q R_Delta W_K^T``, ``u_Delta = sigma W_K R_Delta^T b_Q`` and
``h_Delta = sigma W_Q R_Delta b_K``.  Then for a tangent E (rows ``e_i = Pi e_i``)

    ds_ij = e_i . (A_Delta x_j + h_Delta) + e_j . g_ij,      g_ij = A_Delta^T x_i + u_Delta,   Delta = Delta_ij,
    Df_i[E] = mean_i + S_i + cov_i,     mean_i = sum_j p_ij V^T e_j,
    S_i = Cov_{p_i}(V^T x_j, phi'_ij e_i . (A_Delta x_j + h_Delta)),     cov_i = Cov_{p_i}(V^T x_j, phi'_ij e_j . g_ij),

with ``phi'_ij in (0, 1]``.  Every key is seen through its own offset's matrix: the query term is not
``V^T Sigma_i A^T e_i`` of one covariance and one matrix, and the key gradient ``g_ij`` changes with the key,
so steps 1, 2 and 4 of :mod:`.head` (the joint range of ``A`` and ``V``, the vanishing cross term) do not
carry over.  What does (each step holds at every X of ``D^n``):

1. *Query term.*  For unit y, ``y^T S_i = Cov(alpha, zeta)`` with ``alpha_j = y . V^T x_j`` and ``zeta_j =
   phi'_ij e_i . (A_Delta x_j + h_Delta)``.  ``alpha_j`` lies in an interval of half-width ``r ||M^T V y|| <=
   rho = r ||V^T M||``, so ``Var alpha <= rho^2``; ``|zeta_j| <= ||e_i|| a``, ``a = max_Delta sup_{w} ||Pi (A_Delta
   (c + M w) + h_Delta)||`` (the query gradient, a trust-region value per offset), so ``Var zeta <= ||e_i||^2
   a^2``.  By Cauchy-Schwarz ``||S_i|| <= b ||e_i||``, ``b = rho a``.  A row with one key has ``S_i = 0``.
2. *Key term* (step 8 of :mod:`.head`, unchanged).  ``y^T cov_i = Cov(z, delta)`` with ``z_j = phi'_ij e_j . g_ij``
   and ``delta_j = y^T V^T (x_j - xbar_i)`` (``sum_j p_ij delta_j = 0``); ``Var z <= 2 sum_j p_ij (1 - p_ij) z_j^2``,
   ``|z_j| <= beta ||e_j||`` with ``beta = max_Delta sup_{x in D} ||Pi (A_Delta^T x + u_Delta)||``, and ``Var delta <=
   rho^2 cap(p_ij)`` for every j (step 3 of :mod:`.head`).  So ``||cov_i||^2 <= rho^2 beta^2 sum_j nu(p_ij)
   ||e_j||^2``, ``nu(p) = 2 p (1 - p) cap(p) <= 1/2``.
3. *Mean term.*  ``||mean_i|| <= L u_i``, ``u_i^2 = sum_j p_ij ||e_j||^2``, ``L = ||Pi V||`` (Jensen).
4. *Weight ranges.*  With x_i fixed, ``s_ij = (M^T g_ij) . w_j + sigma q_i^T R_Delta k_c`` (``k_c = W_K^T c +
   b_K``), so the scores of a row spread by at most ``2 r max_Delta sup_x ||M^T (A_Delta^T x + u_Delta)|| +
   max_{Delta, Delta'} sup_x sigma |q(x)^T (R_Delta - R_Delta') k_c|``; a soft-cap keeps them within ``2 C``, and a
   position bias adds its spread over the row.  With a spread omega_i every weight of row i lies in
   ``[1 / (1 + (N_i - 1) e^omega_i), 1 / (1 + (N_i - 1) e^-omega_i)]`` (step 6 of :mod:`.head`).
5. *Sums.*  ``||Df_i[E]|| <= b_i eps_i + L u_i + rho beta (sum_j nu_ij eps_j^2)^(1/2)`` (``eps_i = ||e_i||``,
   ``b_i = 0`` for a row with one key).  Summed over rows by Minkowski, with column sums ``kappa = max_j
   sum_{i: j in V_i} pbar_i`` and ``kappa_cov = max_j sum_{i : j in V_i} max nu_i``:
   ``Lip(f) <= b + L kappa^(1/2) + rho beta kappa_cov^(1/2)``; row by row (step 9 of :mod:`.head`, whose
   argument uses only the bound of each row): ``Lip(f)^2 <= b^2 + (alpha + (alpha^2 + beta'^2)^(1/2)) / 2``.

On a dot product without a window, bias or soft-cap the joint constants of :mod:`.head` are sharper and are
used there; this module serves the heads they do not cover.  Every constant is computed in outward-rounded
arithmetic: the rotations are enclosed from ``cos`` and ``sin`` of the exact angles ``Delta base^(-2t/D)``,
and each trust-region value is certified by an S-lemma check in the ``d_k``-dimensional span the weights
see (:func:`reduced_sup`).
"""

from __future__ import annotations

import math
import time
from functools import cached_property
from typing import final

import numpy as np

from ...errors import AssumptionError
from ...rigorous.intervals import IV, interval, lower, upper
from ...rigorous.linalg import Enclosure, lambda_min_lower, product_norm_interval
from ...rigorous.value import CertifiedValue
from ..kernels import DotProduct, Rotary
from ..model import Head
from .head import largest_over_shares, max_on_weights, top_count
from .joint import sdp_value
from .region import Region, trust_region_sup

__all__ = ["HeadRows", "rotation_enclosure", "reduced_sup", "PositionalHeadBounds", "positional_scope",
           "positional_bound"]

_PROVENANCE = ("rotary and masked heads: per-row query, mean and key terms with every position-dependent "
               "constant a maximum over the offsets that occur (lipbound.numeric.sdp.rotary, module docstring)")


def positional_scope(head: Head) -> bool:
    """A softmax head with a rotary or dot-product score (any scale), any mask: what this module bounds."""
    return isinstance(head, Head) and isinstance(head.kernel, (Rotary, DotProduct)) and not head.kim_values


def _scale(head: Head) -> float:
    scale = head.kernel.scale
    return 1.0 / math.sqrt(head.d_k) if scale is None else float(scale)


def _scale_interval(head: Head):
    scale = head.kernel.scale
    return 1 / IV.sqrt(IV.mpf(head.d_k)) if scale is None else interval(float(scale))


@final
class HeadRows:
    """The rows of a head of self-attention at positions ``0..n-1``: the keys each query sees, the
    offsets ``p_j - p_i`` that occur, and the spread of the position bias over each row.

    Attributes
    ----------
    visible : ndarray (n, n) of bool
    key_counts : ndarray (n,) of int
    offsets : tuple of int
        Every offset ``p_j - p_i`` of a visible pair, increasing.
    bias_spread : ndarray (n,)
        ``max - min`` of the position bias over the keys of each row (0 without a bias).
    softcap : float or None
    """

    def __init__(self, head: Head, n: int):
        positions = np.arange(int(n))
        visible = head.mask.visible(positions, positions)
        self.visible = np.ones((n, n), dtype=bool) if visible is None else visible
        self.key_counts = self.visible.sum(axis=1)
        delta = positions[None, :] - positions[:, None]
        self.offsets = tuple(sorted({int(v) for v in delta[self.visible]}))
        bias = head.mask.bias
        if bias is None:
            self.bias_spread = np.zeros(n)
        else:
            table = bias.matrix(positions, positions)
            self.bias_spread = np.array([np.ptp(table[i, self.visible[i]]) for i in range(n)], dtype=float)
        self.softcap = head.mask.softcap
        self.n = int(n)

    def column_sum(self, per_row) -> object:
        """``max_j sum_{i: j in V_i} per_row[i]`` (intervals), a column sum of any per-row bound."""
        return max((sum((per_row[i] for i in range(self.n) if self.visible[i, j]), IV.mpf(0)) for j in range(self.n)),
                   key=upper)


def rotation_enclosure(kernel, d_k: int, offset: int) -> Enclosure:
    """``R_Delta`` (d_k, d_k) with ``q^T R_Delta k`` the rotary score of a query and a key ``Delta = offset``
    positions apart, enclosed: the angles ``Delta base^(-2t/D)`` and their cosines and sines in interval
    arithmetic.  The identity for a dot product."""
    if not isinstance(kernel, Rotary) or offset == 0:
        return Enclosure.exact(np.eye(d_k))
    D = kernel.rotated(d_k)
    half = D // 2
    mid, rad = np.eye(d_k), np.zeros((d_k, d_k))
    log_base = IV.log(IV.mpf(kernel.base))
    for t in range(half):
        angle = IV.mpf(offset) * IV.exp(-IV.mpf(2 * t) / D * log_base)
        cos, sin = IV.cos(angle), IV.sin(angle)
        a, b = (t, t + half) if kernel.pairing == "half" else (2 * t, 2 * t + 1)
        # rotated coordinates: u'_a = u_a cos - u_b sin, u'_b = u_b cos + u_a sin; R maps k to R k
        for (row, col), value in (((a, a), cos), ((b, b), cos), ((a, b), -sin), ((b, a), sin)):
            centre = float(value.mid)
            mid[row, col] = centre
            rad[row, col] = max(upper(value - centre), upper(centre - value))
    return Enclosure(mid, rad)


def reduced_sup(left: Enclosure, right: Enclosure, shift: Enclosure | None, radius, name: str,
                provenance: str) -> CertifiedValue:
    """Certified ``sup_{||w|| <= r} ||left right w + shift||`` for ``left`` (p, k), ``right`` (k, q) with a small
    inner dimension k: ``{right w}`` lies in ``{C v : ||v|| <= r}`` for any C with ``C C^T >= right right^T``
    (checked in interval arithmetic), so the k-dimensional trust region of ``left C`` bounds it; without a
    shift the value is ``r ||left right||``."""
    if shift is None or not np.any(shift.mid) and not np.any(shift.rad):
        started = time.perf_counter()
        value = interval(radius) * product_norm_interval(left, right)
        return sdp_value(name, upper(value), True, {"lower": lower(value)}, "norm", time.perf_counter() - started,
                         "certified", provenance, lower=lower(value))
    gram = (right @ right.T).sym()
    k = gram.shape[0]
    slack = 1e-12 * max(float(np.max(np.abs(gram.mid))), 1e-300) + float(np.max(gram.rad))
    for attempt in range(6):
        try:
            C = np.linalg.cholesky(gram.mid + slack * np.eye(k))
        except np.linalg.LinAlgError:
            C = None
        if C is not None and lambda_min_lower((Enclosure.exact(C) @ Enclosure.exact(C.T)) - gram) >= 0.0:
            return trust_region_sup(left @ Enclosure.exact(C), shift, radius, name, provenance)
        slack *= 100
    return trust_region_sup((left, right), shift, radius, name, provenance)


@final
class PositionalHeadBounds:
    """Certified constants of one rotary or masked head of self-attention at n tokens (module docstring).

    Parameters
    ----------
    head : Head
        A rotary or dot-product head (``positional_scope``).
    domain :
        The tokens' region: a :class:`~lipbound.numeric.domains.TokenDomain`, a :class:`~.region.Region`, or
        a ball's radius.
    n : int
    value : ndarray or Enclosure (d, d_out), optional
        The value map applied (``W_V W_O^h`` in a layer); default ``head.W_V``.

    Attributes
    ----------
    value_norm : interval
        ``L = ||Pi V||``.
    spread : interval
        ``rho = r ||V^T M||``.
    query_gain, key_gain, score_gain : CertifiedValue
        ``a``, ``beta`` and the score gain ``max_Delta sup ||M^T (A_Delta^T x + u_Delta)||`` (module docstring).
    """

    def __init__(self, head: Head, domain, n: int, value=None):
        if not positional_scope(head):
            raise AssumptionError("head", "a softmax head with a rotary or dot-product score", head.kernel.describe(),
                                  "use the constants of the head's own kernel")
        self.head, self.n = head, int(n)
        self.region = Region.of(domain, None, head.d)
        self.rows = HeadRows(head, self.n)
        self.r = self.region.r
        started = time.perf_counter()
        self.value = Enclosure.exact(head.W_V) if value is None else (
            value if isinstance(value, Enclosure) else Enclosure.exact(np.asarray(value, dtype=float)))
        region = self.region
        self.value_norm = region.project(self.value).norm_interval()
        self.spread = self.r * product_norm_interval(self.value.T, region.shape) if region.shape is not None \
            else self.r * self.value.norm_interval()
        self.rotations = {delta: rotation_enclosure(head.kernel, head.d_k, delta) for delta in self.rows.offsets}
        self.query_gain = self._largest("query gain", self._query_gradient)
        self.key_gain = self._largest("beta", self._key_gradient, side="project")
        self.score_gain = self.key_gain if region.is_ball else self._largest("score gain", self._key_gradient,
                                                                             side="shape")
        self.centre_spread = self._centre_spread()
        self.seconds = time.perf_counter() - started

    # constants ----------------------------------------------------------------------------------
    def _largest(self, name: str, gradient, **options) -> CertifiedValue:
        values = [gradient(delta, name, **options) for delta in self.rows.offsets]
        failed = next((v for v in values if not v.certified), None)
        if failed is not None:
            return failed
        best = max(values, key=lambda v: v.value)
        return CertifiedValue(name, best.value, best.verdict, f"max over the offsets {self.rows.offsets} of {name}",
                              lower=best.lower, details={"per_offset": {str(d): v.value for d, v in
                                                                        zip(self.rows.offsets, values)}})

    def _query_gradient(self, delta: int, name: str) -> CertifiedValue:
        """``sup_w ||Pi (A_Delta (c + M w) + h_Delta)||``: left ``Pi W_Q``, right ``sigma R_Delta W_K^T M``."""
        head, region, scale = self.head, self.region, Enclosure.scalar(_scale_interval(self.head))
        R = self.rotations[delta]
        left = region.project(Enclosure.exact(head.W_Q))
        right = (R @ region.times_shape(Enclosure.exact(head.W_K.T))).scale(scale)
        key_centre = Enclosure.exact(head.W_K.T) @ Enclosure.exact(region.center.reshape(-1, 1)) + Enclosure.exact(
            head.b_K.reshape(-1, 1))
        shift = left @ (R @ key_centre).scale(scale)
        return reduced_sup(left, right, shift, self.r, name, "sup over the region of the query gradient")

    def _key_gradient(self, delta: int, name: str, side: str) -> CertifiedValue:
        """``sup_x ||K (A_Delta^T x + u_Delta)||``, K the projector (``side="project"``) or ``M^T`` ("shape")."""
        head, region, scale = self.head, self.region, Enclosure.scalar(_scale_interval(self.head))
        R = self.rotations[delta]
        W_K = Enclosure.exact(head.W_K)
        left = region.project(W_K) if side == "project" else region.times_shape(W_K.T).T
        right = (R.T @ region.times_shape(Enclosure.exact(head.W_Q.T))).scale(scale)
        query_centre = Enclosure.exact(head.W_Q.T) @ Enclosure.exact(region.center.reshape(-1, 1)) + Enclosure.exact(
            head.b_Q.reshape(-1, 1))
        shift = left @ (R.T @ query_centre).scale(scale)
        return reduced_sup(left, right, shift, self.r, name, "sup over the region of the key gradient")

    def _centre_spread(self):
        """``max_{Delta, Delta'} sup_x sigma |q(x)^T (R_Delta - R_Delta') k_c|`` (step 4; 0 when ``k_c = 0``)."""
        head, region = self.head, self.region
        k_c = head.W_K.T @ region.center + head.b_K
        if not np.any(k_c) or len(self.rows.offsets) < 2:
            return IV.mpf(0)
        k_c = Enclosure.exact(head.W_K.T) @ Enclosure.exact(region.center.reshape(-1, 1)) + Enclosure.exact(
            head.b_K.reshape(-1, 1))
        scale = Enclosure.scalar(_scale_interval(head))
        W_Q = Enclosure.exact(head.W_Q)
        q_c = Enclosure.exact(head.W_Q.T) @ Enclosure.exact(region.center.reshape(-1, 1)) + Enclosure.exact(
            head.b_Q.reshape(-1, 1))
        rotated = {delta: (R @ k_c).scale(scale) for delta, R in self.rotations.items()}
        largest = IV.mpf(0)
        offsets = self.rows.offsets
        for i, first in enumerate(offsets):
            for second in offsets[i + 1:]:
                difference = rotated[first] - rotated[second]                 # (d_k, 1)
                linear = region.times_shape(W_Q.T).T @ difference           # M^T W_Q (...)
                constant = (q_c.T @ difference).interval()
                bound = self.r * linear.norm_interval() + abs(constant)
                largest = max(largest, IV.mpf(upper(bound)), key=upper)
        return largest

    # weights of the rows ------------------------------------------------------------------------
    @cached_property
    def omegas(self) -> list:
        """The score spread of each row (module docstring, step 4), as intervals."""
        base = 2 * self.r * IV.mpf(self.score_gain.value) + self.centre_spread
        cap = self.rows.softcap
        if cap is not None and upper(base) > 2 * cap:
            base = 2 * interval(cap)
        return [base + interval(float(spread)) for spread in self.rows.bias_spread]

    def weight_range(self, i: int):
        """``(p_lo, p_hi)`` of row i (p_hi an interval)."""
        keys, omega = int(self.rows.key_counts[i]), self.omegas[i]
        return lower(1 / (1 + (keys - 1) * IV.exp(omega))), 1 / (1 + (keys - 1) * IV.exp(-omega))

    def row_nu(self, i: int, with_cap: bool = True):
        """``max nu(p)`` over the weights of row i (0 for a row with one key)."""
        if self.rows.key_counts[i] < 2:
            return IV.mpf(0)
        cap = (lambda p: 1 if upper(p) <= 0.5 else 4 * p * (1 - p)) if with_cap else (lambda p: 1)
        return max_on_weights(*self.weight_range(i), lambda p: 2 * p * (1 - p) * cap(p), IV.mpf(1) / 2)

    @property
    def certified(self) -> bool:
        return all(v.certified for v in (self.query_gain, self.key_gain, self.score_gain))

    @property
    def failure(self) -> CertifiedValue | None:
        return next((v for v in (self.query_gain, self.key_gain, self.score_gain) if not v.certified), None)

    def terms(self) -> dict:
        """``b, L, rho beta, kappa, kappa_cov`` and the row constants as intervals."""
        rows = self.rows
        several = bool(np.any(rows.key_counts >= 2))
        b = self.spread * IV.mpf(self.query_gain.value) * (1 if several else 0)
        kappa = rows.column_sum([IV.mpf(upper(self.weight_range(i)[1])) for i in range(rows.n)])
        nus = [self.row_nu(i) for i in range(rows.n)]
        return {"b": b, "L": self.value_norm, "rho_beta": self.spread * IV.mpf(self.key_gain.value),
                "kappa": kappa, "kappa_cov": rows.column_sum(nus), "nu_max": max(nus, key=upper), "several": several}


def positional_bound(head: Head, domain, n: int, *, value=None, bounds: PositionalHeadBounds | None = None,
                     name: str = "matrix-aware") -> CertifiedValue:
    """Certified Frobenius Lipschitz constant of a rotary or masked head of self-attention on ``domain^n``:
    the smaller of the Minkowski and the row-by-row forms of the module docstring (step 5)."""
    started = time.perf_counter()
    bounds = bounds or PositionalHeadBounds(head, domain, n, value=value)
    certificate: dict = {"n": n, "offsets": list(bounds.rows.offsets)}
    if not bounds.certified:
        failed = bounds.failure
        return sdp_value(name, math.nan, False, certificate, "eig", time.perf_counter() - started, "not certified",
                         _PROVENANCE, reason=f"{failed.name}: {failed.reason}")
    terms = bounds.terms()
    b, L, rho_beta = terms["b"], terms["L"], terms["rho_beta"]
    minkowski = b + L * IV.sqrt(terms["kappa"]) + rho_beta * IV.sqrt(terms["kappa_cov"])
    total = minkowski
    certificate.update(b=upper(b), L=upper(L), rho_beta=upper(rho_beta), kappa=upper(terms["kappa"]),
                       kappa_cov=upper(terms["kappa_cov"]), minkowski=upper(minkowski),
                       query_gain=bounds.query_gain.value, key_gain=bounds.key_gain.value,
                       score_gain=bounds.score_gain.value, omega=upper(max(bounds.omegas, key=upper)))
    cap = terms["nu_max"]
    if n >= 2 and upper(cap) > 0:
        W = L + rho_beta * IV.sqrt(cap)
        rows = largest_over_shares(b, n, top_count(n, cap), n * W ** 2, b * W)
        certificate["row_by_row"] = upper(rows)
        if upper(rows) < upper(total):
            total = rows
    return sdp_value(name, upper(total), True, certificate, "eig", time.perf_counter() - started, "certified",
                     _PROVENANCE)
