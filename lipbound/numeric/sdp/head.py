r"""A relaxation of the local Lipschitz problem of one dot-product head.

We bound ``sup { ||Df(X)[E]||_F : X in B(c, R)^n, ||E||_F = 1 }``, which by the mean
value theorem on the convex set ``B(c, R)^n`` bounds ``Lip(f)`` in the Frobenius norm.
The attention weights and the per-query key distributions are relaxed to convex
sets (the column polytope of P, the spectraplex of covariances); what is left is a
supremum over those sets of quantities of the concrete matrices, computed by the SDPs
of :mod:`lipbound.numeric.sdp.joint` and certified there.

**Setting.**  ``f_i(X) = sum_j p_ij (W_V^T x_j + b_V)``, ``p_i = softmax_j(s_ij)``,
``s_ij = (W_Q^T x_i + b_Q).(W_K^T x_j + b_K) / sqrt(d_k)``.  The score is affine in the key:
``s(x_i, y) = g_i^T y + const_i`` with ``g_i = A^T x_i + u``, ``A = W_Q W_K^T / sqrt(d_k)``,
``u = W_K b_Q / sqrt(d_k)``.  Differentiating (docs/mathematics.md, section 2),

    Df_i[E] = T_i + S_i,   T_i = E_{p_i}[W_V^T e_j] + Cov_{p_i}(W_V^T x_j, g_i^T e_j),
                           S_i = W_V^T Sigma_i A^T e_i,     Sigma_i = Cov_{p_i}(x_j).

**Proof sketch (each step is an inequality valid at every X in the domain).**

1. *Query term.*  ``||S_i|| <= b_i ||e_i||`` with ``b_i = ||W_V^T Sigma_i A^T||``.
2. *Key term, one query.*  For a unit ``y``, ``y^T T_i = E_p[(W_V y + delta_j g_i)^T e_j]`` with
   ``delta_j = y^T W_V^T (x_j - x_bar_i)``, ``E_p delta_j = 0``.  Hence
   ``E_p ||W_V y + delta_j g_i||^2 = ||W_V y||^2 + ||g_i||^2 y^T W_V^T Sigma_i W_V y`` (the cross
   term vanishes), and Cauchy-Schwarz in ``L^2(p_i)`` gives
   ``||T_i||^2 <= (L^2 + ||g_i||^2 Y_i) u_i^2``, ``L = ||W_V||``, ``Y_i = ||W_V^T Sigma_i W_V||``,
   ``u_i^2 = sum_j p_ij ||e_j||^2``.  (The closed form adds ``L`` and ``||g|| sqrt(Y)``; this adds squares.)
3. *Variance caps.*  ``Y_i = max_y Var_{p_i}(y^T W_V^T x_j)``; that scalar lies in an interval of
   half-width ``h <= L R``.  A distribution on such an interval has variance ``<= h^2``, and
   ``<= 4 p (1 - p) h^2`` if one atom has mass ``p >= 1/2`` (law of total variance with the
   Bhatia-Davis inequality for the rest).  So ``Y_i <= L^2 R^2 cap(p_ij)`` for every j,
   ``cap(p) = 1`` for ``p <= 1/2``, ``4 p (1 - p)`` above; and ``||g_i|| <= beta``, the exact
   trust-region value (:func:`~.region.key_gradient_sup`).
4. *Coupling through Sigma_i.*  By :class:`~.joint.JointRange`, ``(b_i, Y_i) <= R^2 k`` for some
   ``k in K`` (``tr Sigma_i <= R^2``).  Hence ``b_i <= R^2 gamma_{A,V}`` and
   ``b_i sqrt(L^2 + beta^2 Y_i) <= c_hat := R^2 sup_{k in K} k_1 sqrt(L^2 + beta^2 R^2 k_2)``,
   one SDP over the concrete matrices: a query cannot spend the same covariance
   direction on the query term (which wants ``||A u|| ||W_V^T u||`` large) and on the key term
   (which wants ``||W_V^T u||`` large) unless they agree.
5. *Sum over queries.*  With ``eps_i = ||e_i||`` (``sum eps^2 = 1``) and ``a_ij^2 = L^2 + beta^2 L^2 R^2 cap(p_ij)``,

       ||Df[E]||^2 <= sum_i (b_i eps_i + ||T_i||)^2
                   <= b_hat^2 + sum_j eps_j^2 sum_i p_ij a_ij^2 + 2 c_hat sum_i eps_i u_i .

6. *Column polytope.*  Scores of one query differ by at most ``omega = 2 R beta``, so every weight
   of a row with N keys lies in ``[1 / (1 + (N - 1) e^omega), p_bar = 1 / (1 + (N - 1) e^-omega)]``;
   thus ``sum_i p_ij a_ij^2 <= Phi := sum_i max_p phi(p)`` over that range,
   ``phi(p) = p L^2 + L^2 R^2 beta^2 p cap(p)`` (``p cap(p)`` peaks at ``p = 2/3``).  A row with a
   single key has ``Sigma_i = 0``, so ``b_hat = 0`` when every row has one key (n = 1).
   For the cross term, with ``w_j = eps_j^2`` and P row-stochastic, ``u_i^2 = (P w)_i <= max_j w_j``
   gives ``sum_i eps_i u_i <= max_w (w + sqrt((n - 1) w (1 - w))) = (1 + sqrt n) / 2``, and
   Cauchy-Schwarz gives ``<= sqrt(kappa)``, ``kappa`` the largest column sum.
7. *Result.*  ``Lip(f) <= min( sqrt(b_hat^2 + Phi + 2 c_hat xi), b_hat + sqrt(Phi) )`` with
   ``xi = min((1 + sqrt n) / 2, sqrt(kappa))`` (the second form is Minkowski on step 5).
8. *Key term, mean and covariance apart.*  ``T_i = mean_i + cov_i`` with ``||mean_i|| <= L u_i`` (Jensen) and
   ``y^T cov_i = sum_j p_ij z_j delta_j``, ``z_j = g_i . e_j``.  Since ``sum_j p_ij delta_j = 0`` the sum is
   ``Cov_{p_i}(z, delta) <= Var(z)^(1/2) Var(delta)^(1/2)``, and
   ``Var(z) = 1/2 sum_{j,k} p_j p_k (z_j - z_k)^2 <= 2 sum_j p_j (1 - p_j) z_j^2`` (``(a - b)^2 <= 2 a^2 + 2 b^2``),
   while ``Var(delta) <= rho^2 cap(p_ij)`` for every j (step 3).  So ``||cov_i||^2 <= beta^2 rho^2
   sum_j nu(p_ij) ||e_j||^2`` with ``nu(p) = 2 p (1 - p) cap(p) <= 1/2`` (at p = 1/2), and Minkowski
   over i gives ``(sum_i ||T_i||^2)^(1/2) <= L sqrt(kappa) + rho beta sqrt(kappa_cov)``, ``kappa_cov = sum_i max nu``
   over the row's weight range (column polytope as in step 6).  Where moving one key is all a query
   sees (``p_ij = 2/3``), step 5 charges ``p cap(p) = 16/27`` per row, this ``nu(2/3) = 32/81``; in all,
   ``kappa_cov <= n / 2`` against ``sum_i max p cap(p) <= 16 n / 27``.  The Minkowski form of step 7 and the
   context terms of cross-attention use ``min(sqrt(Phi), L sqrt(kappa) + rho beta sqrt(kappa_cov))``.
9. *Row by row* (self-attention).  Steps 1 and 8 bound each row, ``||Df_i[E]|| <= b_hat eps_i + w_i`` with
   ``w_i = L u_i + rho beta (sum_j nu_ij eps_j^2)^(1/2)``.  In a row ``nu_ij <= c`` (the largest ``max nu``
   over the rows' weight ranges, at most 1/2) and ``sum_j nu_ij <= sum_j 2 p_ij (1 - p_ij) <= t = 2 (1 - 1/n)``,
   so ``sum_j nu_ij eps_j^2 <= c s`` with s the mass ``eps_j^2`` of the ``K = ceil(t / c)`` largest tokens,
   and ``u_i <= max_j eps_j <= s^(1/2)``: every ``w_i <= W s^(1/2)``, ``W = L + rho beta c^(1/2)``.  With
   ``sum_i eps_i <= (K s)^(1/2) + ((n - K)(1 - s))^(1/2)`` (Cauchy-Schwarz on the K largest and the rest),

       sum_i (b_hat eps_i + w_i)^2 <= b_hat^2 + n W^2 s + 2 b_hat W (K^(1/2) s + (n - K)^(1/2) (s (1 - s))^(1/2)),

   and ``max_s (alpha s + beta' (s (1 - s))^(1/2)) = (alpha + (alpha^2 + beta'^2)^(1/2)) / 2`` (put
   ``s = (1 + cos theta) / 2``): ``Lip(f)^2 <= b_hat^2 + (alpha + (alpha^2 + beta'^2)^(1/2)) / 2`` with
   ``alpha = n W^2 + 2 b_hat W K^(1/2)``, ``beta' = 2 b_hat W (n - K)^(1/2)``.  Minkowski charges the
   query term at every token the key term reaches; a query moved by ``eps_i`` reaches only its own row.
10. *Tokens that spread the values are weak queries* (self-attention).  In step 8, ``Var_{p_i}(delta)`` is at
   most a quarter of the squared range of ``y^T V^T M w_l`` over the tokens, so at most ``R^2`` with
   ``R = (v_(1) + v_(2)) / 2``, ``v_l = ||V^T M w_l||`` and ``v_(1) >= v_(2)`` the two largest; and ``||g_i||``
   is the query gain ``q_i = ||F w_i + g_0||`` of token i itself (``F = Pi A^T M``, ``g_0 = Pi (A^T c + u)``).
   So ``w_i <= (L + q_i R c'^(1/2)) s^(1/2) =: W_i s^(1/2)`` with ``c' = max 2 p (1 - p)`` over the weight
   ranges (``Var(z) <= 2 sum_j p_j (1 - p_j) z_j^2``, no cap), K from ``c'`` as in step 9.  The two tokens
   that give ``v_(1)``, ``v_(2)`` spend their chart budget on the values: for every ``mu >= 0``, a token with
   ``||V^T M w|| >= v`` has ``q^2 <= T(mu) - mu v^2``, ``T(mu) = r^2 lambda_max(F^T F + mu M^T V V^T M) +
   2 r ||F^T g_0|| + ||g_0||^2`` (add ``mu (||V^T M w||^2 - v^2) >= 0``); every other token has ``q <= beta``.
   Hence ``sum_i W_i^2 <= Q = sup (n - 2)(L + beta R c'^(1/2))^2 + sum_{v in {v_1, v_2}} (L + h(v) R c'^(1/2))^2``
   over ``0 <= v_2 <= v_1 <= rho``, ``h(v)^2 = min(beta^2, min_mu T(mu) - mu v^2)`` (decreasing in v),
   bounded on a grid of cells from their ends.  In the cross term ``2 sum_i b_i eps_i w_i``, ``b_i w_i <= b_hat L
   s^(1/2) + beta (c' s)^(1/2) b_i Var_i^(1/2)`` and ``(b_i, Var_i) <= r^2 k`` for some ``k in K`` (step 4), so
   ``b_i Var_i^(1/2) <= C = min(r^3 sup_K k_1 k_2^(1/2), b_hat rho)``.  Step 9's argument with ``n W^2`` replaced
   by Q and ``b_hat W`` by ``D = b_hat L + beta c'^(1/2) C`` gives ``Lip(f)^2 <= b_hat^2 + (alpha + (alpha^2 +
   beta'^2)^(1/2)) / 2`` with ``alpha = Q + 2 D K^(1/2)``, ``beta' = 2 D (n - K)^(1/2)``.
   Where the query directions ``F`` and the value directions ``V^T M`` of a head are nearly orthogonal (the
   embedded MiniLM heads), the two value-spreading tokens are nearly silent as queries (Q is close to
   ``(n - 2) (L + beta rho c'^(1/2))^2``, not n times it) and a row weighing a full spread has little query
   gain left (C well below ``b_hat rho``).

Every term is at most the corresponding closed-form term
(``gamma_{A,V} <= ||A|| ||W_V||``, trust-region beta ``<=`` the triangle bound,
``p cap(p) <= min(p, 3/4)``), so the result never exceeds
the symbolic closed form evaluated on the same head.  Causal masking changes only ``p_bar_i`` (row i has i keys)
and the column sums; cross-attention keeps step 1 for the queries and steps 2-6 for the
context, with m queries per column.
"""

from __future__ import annotations

import math
import time
from typing import final

import numpy as np

from ...errors import AssumptionError, WeightsError
from ...rigorous.arrays import IntervalArray
from ...rigorous.intervals import IV, lower, upper
from ...rigorous.linalg import Enclosure, lambda_max_upper, vector_norm_upper
from ...rigorous.value import CertifiedValue
from ..attention import Head
from ..blas import one_blas_thread
from .joint import SOLVERS, JointRange, _check_head, key_form, sdp_value, value_gram
from .region import Region, key_gradient, trust_region_sup

__all__ = ["HeadBounds", "self_attention_bound", "cross_attention_bound", "measure_attention_bound",
           "matrix_aware_closed_form"]

_PROVENANCE = ("per-query moment relaxation over the column polytope of P and the spectraplex of key "
               "covariances (lipbound.numeric.sdp.head, module docstring), constants certified by "
               "lipbound.numeric.sdp.joint")


# Certified constants ----------------------------------------------------------------------------
@final
class HeadBounds:
    """Certified matrix-aware constants of one dot-product head on its regions, computed once.

    The keys (context) lie in ``D = {c + M w : ||w|| <= r}`` and the queries in ``D_Q`` (the same
    set for self-attention); ``Pi``, ``Pi_Q`` project onto the directions they move in
    (:class:`~.region.Region`: a ball has ``M = Pi = I``, ``r = R``).

    Parameters
    ----------
    head : Head
        Dot-product head, ``W_Q, W_K`` (d, d_k), ``W_V`` (d, d_v).
    radius, center :
        The keys' region: a :class:`~lipbound.numeric.domains.TokenDomain` (a ball or a LayerNorm
        image), a :class:`~.region.Region`, or the radius R of the ball ``B(c, R)`` (``center`` of
        shape (d,), default 0).
    query_radius, query_center :
        The queries' region in the same forms (cross-attention); default: the keys' region.
    value : ndarray or Enclosure, shape (d, d_out), optional
        The value map actually applied (e.g. ``W_V W_O^h`` for a head followed by its
        block of the output projection); default ``head.W_V``.
    solver : {"auto", "clarabel", "scs", "eig"}

    Attributes
    ----------
    value_norm2 : CertifiedValue
        ``L^2 = ||Pi V||^2``, the squared Lipschitz constant of the values along the keys' directions.
    spread2 : CertifiedValue
        ``rho^2 = r^2 ||V^T M||^2``: every value lies within rho of ``v(c)``.
    gamma : CertifiedValue
        ``gamma = max_{||a|| = 1} ||Pi_Q A M a|| ||V^T M a||`` (the query-gradient term is at most
        ``r^2 gamma``).
    beta : CertifiedValue
        ``sup_{x in D_Q} ||Pi (A^T x + u)||`` (key gradient along the keys' directions).
    score_gain : CertifiedValue
        ``sup_{x in D_Q} ||M^T (A^T x + u)||``; the scores of one query spread by at most
        ``omega = 2 r score_gain``.
    """

    @one_blas_thread
    def __init__(self, head: Head, radius, center=None, *, query_radius=None, query_center=None,
                 value=None, solver: str = "auto"):
        self.head = _check_head(head)
        self.keys = Region.of(radius, center, head.d)
        self.queries = self.keys if query_radius is None else Region.of(query_radius, query_center, head.d)
        for region in (self.keys, self.queries):
            if region.d != head.d:
                raise AssumptionError("domain", f"a domain in R^{head.d} (the width of the head)",
                                      f"a domain in R^{region.d}", "take the domain from the LayerNorm that feeds it")
        self.r = self.keys.r
        self.R, self.c = self.keys.R, self.keys.center
        self.R_query, self.c_query = self.queries.R, self.queries.center
        if solver not in SOLVERS:
            raise AssumptionError("solver", f"one of {SOLVERS}", repr(solver),
                                  "choose 'auto', 'clarabel', 'scs' or 'eig'")
        self.solver = solver
        own_values = value is None
        if value is None:
            value = Enclosure.exact(head.W_V)
        elif not isinstance(value, Enclosure):
            value = np.asarray(value, dtype=float)
            if value.ndim != 2 or value.shape[0] != head.d:
                raise WeightsError("value", f"a matrix of shape ({head.d}, d_out)", f"shape {value.shape}",
                                   "pass the value map as it acts on tokens, e.g. W_V @ W_O_block")
            value = Enclosure.exact(value)
        self.own_values, self.value = own_values, value
        started = time.perf_counter()
        keys, queries = self.keys, self.queries
        moving = keys.project(value)                                   # Pi V
        top = max(lambda_max_upper(value_gram(moving)), 0.0)
        self.value_norm2 = sdp_value("||W_V||^2", top, True, {"lambda_max_upper": top}, "eig",
                                     time.perf_counter() - started, "certified",
                                     "lambda_max(V^T Pi V), Cholesky residual certificate")
        shaped = keys.times_shape(value.T)                             # V^T M, (d_out, d)
        G2 = value_gram(shaped.T)                                      # M^T V V^T M
        top2 = max(lambda_max_upper(G2), 0.0)
        self.shaped_norm2, self._value_form = top2, G2
        spread2 = upper(IV.mpf(top2) * keys.r ** 2)
        self.spread2 = sdp_value("rho^2", spread2, True, {"lambda_max_upper": top2}, "eig", 0.0, "certified",
                                 "r^2 lambda_max(M^T V V^T M): values within rho of v(c)")
        scale = Enclosure.scalar(1 / IV.sqrt(IV.mpf(head.d_k)))
        W_Q, W_K = Enclosure.exact(head.W_Q), Enclosure.exact(head.W_K)
        if keys.is_ball and queries.is_ball:
            G1 = key_form(head)
        else:
            F1 = queries.project(W_Q) @ keys.times_shape(W_K.T).scale(scale)    # Pi_Q A M, (d, d)
            G1 = (F1.T @ F1).sym()
        self.range = JointRange(G1, G2)
        self.solver = self.range.pick_solver(solver)      # "auto" resolved by the reduced dimension
        self.gamma = self.range.gain(solver=self.solver, name="gamma_{A,V}")
        # the key gradient A^T x + u at x = c_Q + M_Q w: (A^T M_Q) w + (A^T c_Q + u)
        self.beta = trust_region_sup(*key_gradient(head, queries, keys, "project"), queries.r, "beta", _BETA)
        if keys.is_ball:
            self.score_gain = self.beta
        else:
            self.score_gain = trust_region_sup(*key_gradient(head, queries, keys, "shape"), queries.r, "score gain",
                                               _SCORE_GAIN)
        self._coupled: CertifiedValue | None = None
        self._query_caps: list | None = None
        self._value_coupling: CertifiedValue | None = None

    @property
    def coupled(self) -> CertifiedValue:
        """``c_hat / r^2 = sup_{k in K} k_1 sqrt(L^2 + beta^2 r^2 k_2)`` (step 4 of the module docstring)."""
        if self._coupled is None:
            failed = _first_failure(self.gamma, self.beta)
            if failed is not None:
                self._coupled = failed
            else:
                slope = upper(IV.mpf(self.beta.value) ** 2 * self.r ** 2)
                self._coupled = self.range.coupled_gain(
                    self.value_norm2.value, slope, self.gamma.value, self.shaped_norm2,
                    solver=self.solver, name="coupled gain",
                    provenance="sup over K of k_1 sqrt(L^2 + beta^2 r^2 k_2); lipbound.numeric.sdp.joint")
        return self._coupled

    def matches(self, head: Head, radius, center, query_radius=None, query_center=None) -> bool:
        """Whether these constants were computed for ``head`` on these regions."""
        keys = Region.of(radius, center, head.d)
        queries = keys if query_radius is None else Region.of(query_radius, query_center, head.d)
        return self.head is head and self.keys.same_as(keys) and self.queries.same_as(queries)

    # scalar assembly, in outward-rounded interval arithmetic -------------------------------
    @property
    def omega(self):
        """``2 r sup ||M^T g||``: the largest score spread of one query."""
        return 2 * self.r * IV.mpf(self.score_gain.value)

    def weight_range(self, keys: int):
        """All weights of a row with ``keys`` keys lie in ``[p_lo, p_hi]``,
        ``p_hi = 1 / (1 + (keys - 1) e^-omega)``, ``p_lo = 1 / (1 + (keys - 1) e^omega)``."""
        omega = self.omega
        return lower(1 / (1 + (keys - 1) * IV.exp(omega))), 1 / (1 + (keys - 1) * IV.exp(-omega))

    def _phi_max(self, keys: int):
        """``max phi(p)`` over the weights ``p in [p_lo, p_hi]`` of a row with ``keys`` keys:
        ``<= p_hi L^2 + beta^2 rho^2 max psi``, where ``psi(p) = p cap(p)`` increases on
        ``[0, 2/3]`` (to 16/27) and decreases after."""
        p_lo, p_bar = self.weight_range(keys)
        psi = max_on_weights(p_lo, p_bar, lambda p: p * _cap(p), IV.mpf(2) / 3)
        L2 = IV.mpf(self.value_norm2.value)
        return IV.mpf(upper(p_bar)) * L2 + IV.mpf(self.spread2.value) * IV.mpf(self.beta.value) ** 2 * psi

    def nu_max(self, keys: int, with_cap: bool = True):
        """``max nu(p)`` over the weights ``p in [p_lo, p_hi]`` of a row with ``keys`` keys, where
        ``nu(p) = 2 p (1 - p) cap(p)`` (step 8 of the module docstring; ``2 p (1 - p)`` without the cap)
        rises on ``[0, 1/2]`` to 1/2 and falls after."""
        factor = _cap if with_cap else (lambda p: 1)
        return max_on_weights(*self.weight_range(keys), lambda p: 2 * p * (1 - p) * factor(p), IV.mpf(1) / 2)

    def _largest_nu(self, n: int, causal: bool, with_cap: bool = True):
        """The largest ``max nu`` over the rows with two keys or more (steps 9 and 10)."""
        return max((self.nu_max(k, with_cap) for k in (range(2, n + 1) if causal else (n,))), key=upper)

    def terms(self, n: int, *, m: int | None = None, causal: bool = False) -> dict:
        """``b_hat, Phi, kappa, kappa_cov`` as intervals for n keys (and m queries in cross-attention);
        ``row_cap`` is 0 when every row has a single key (then ``Sigma_i = 0``), else 1."""
        r2 = self.r ** 2
        if m is None and causal:
            keys = list(range(1, n + 1))
        else:
            keys = [n] * (n if m is None else m)
        Phi = sum((self._phi_max(k) for k in keys), IV.mpf(0))
        kappa = sum((IV.mpf(upper(self.weight_range(k)[1])) for k in keys), IV.mpf(0))
        kappa_cov = sum((self.nu_max(k) for k in keys), IV.mpf(0))
        row_cap = 1 if max(keys) >= 2 else 0
        b_hat = r2 * IV.mpf(self.gamma.value) * row_cap
        return {"b_hat": b_hat, "Phi": Phi, "kappa": kappa, "kappa_cov": kappa_cov, "row_cap": IV.mpf(row_cap)}

    def split_key_term(self, terms: dict, column=None):
        """``L sqrt(kappa) + rho beta sqrt(column)`` (mean and covariance apart, step 8 of the module
        docstring), the covariance column ``kappa_cov`` unless another valid one is given."""
        column = terms["kappa_cov"] if column is None else column
        L = IV.sqrt(IV.mpf(self.value_norm2.value))
        rho_beta = IV.sqrt(IV.mpf(self.spread2.value)) * IV.mpf(self.beta.value)
        return L * IV.sqrt(terms["kappa"]) + rho_beta * IV.sqrt(column) * terms["row_cap"]

    def row_form(self, n: int, causal: bool, b_hat):
        """The self-attention bound of step 9 of the module docstring, row by row (None for n = 1)."""
        if n < 2:
            return None
        cap = self._largest_nu(n, causal)
        if upper(cap) <= 0:
            return None
        W = IV.sqrt(IV.mpf(self.value_norm2.value)) + IV.sqrt(IV.mpf(self.spread2.value)) * IV.mpf(
            self.beta.value) * IV.sqrt(cap)
        return largest_over_shares(b_hat, n, top_count(n, cap), n * W ** 2, b_hat * W)

    @property
    def value_coupling(self) -> CertifiedValue:
        """``sup_{k in K} k_1 sqrt(k_2)``: a row's query gain ``b_i <= r^2 k_1`` and the spread of the values it
        weighs, ``Var_i <= r^2 k_2``, come from the same covariance (step 10 of the module docstring)."""
        if self._value_coupling is None:
            failed = _first_failure(self.gamma)
            self._value_coupling = failed if failed is not None else self.range.coupled_gain(
                0.0, 1.0, self.gamma.value, self.shaped_norm2, solver=self.solver, name="value coupling",
                provenance="sup over K of k_1 sqrt(k_2); lipbound.numeric.sdp.joint")
        return self._value_coupling

    def query_caps(self) -> list[tuple[float, object]]:
        """Pairs ``(mu, T)`` with ``||Pi (A^T x + u)||^2 <= T - mu v^2`` for every token ``x = c + M w`` of the
        region whose values ``||V^T M w|| >= v`` (step 10 of the module docstring): with ``F = Pi A^T M``,
        ``g_0 = Pi (A^T c + u)``, ``T = r^2 lambda_max(F^T F + mu M^T V V^T M) + 2 r ||F^T g_0|| + ||g_0||^2``."""
        if self._query_caps is None:
            (W_K, right), shift = key_gradient(self.head, self.queries, self.keys, "project")
            F = W_K @ right                                                 # (d, d) in chart coordinates
            G1 = (F.T @ F).sym()
            cross = F.T @ shift
            linear = vector_norm_upper(np.abs(cross.mid) + cross.rad)
            offset = vector_norm_upper(np.abs(shift.mid) + shift.rad)
            ratio = max(float(np.linalg.eigvalsh(0.5 * (G1.mid + G1.mid.T))[-1]), 0.0) / max(self.shaped_norm2, 1e-300)
            r = self.r
            self._query_caps = []
            for factor in (0.0, 0.03, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 10.0, 30.0, 100.0):
                mu = factor * ratio
                top = max(lambda_max_upper((G1 + self._value_form.scale(mu)).sym()), 0.0)
                T = r ** 2 * IV.mpf(top) + 2 * r * IV.mpf(linear) + IV.mpf(offset) ** 2
                self._query_caps.append((mu, IV.mpf(upper(T))))
        return self._query_caps

    def spread_form(self, n: int, causal: bool, b_hat, cells: int = 256):
        """The self-attention bound of step 10 of the module docstring (None for n = 1 or cross-attention)."""
        if n < 2 or not self.keys.same_as(self.queries):
            return None
        cap = self._largest_nu(n, causal, with_cap=False)
        if upper(cap) <= 0:
            return None
        L, beta = IV.sqrt(IV.mpf(self.value_norm2.value)), IV.mpf(self.beta.value)
        rho, root = IV.sqrt(IV.mpf(self.spread2.value)), IV.sqrt(cap)
        # Q: the largest sum over rows of (L + q_i R sqrt(c))^2, on cells of the two largest value spreads
        edges = np.linspace(0.0, upper(rho), cells + 1)
        v = IntervalArray(edges[:-1])
        capped = IntervalArray(np.full(cells, upper(beta ** 2)))
        for mu, T in self.query_caps():
            capped = capped.minimum(IntervalArray(np.full(cells, upper(T))) - v.square() * IntervalArray(mu))
        h = IntervalArray(np.maximum(capped.lo, 0.0), np.maximum(capped.hi, 0.0)).sqrt()       # (cells,)
        top = IntervalArray(edges[1:])
        R = (top.expand(1) + top.expand(0)) * IntervalArray(0.5)                                # (cells, cells)
        gain = R * IntervalArray.constant(root)
        L_iv, beta_iv = IntervalArray.constant(L), IntervalArray.constant(beta)
        rows = ((L_iv + beta_iv * gain).square() * IntervalArray(float(max(n - 2, 0)))
                + (L_iv + h.expand(1) * gain).square() + (L_iv + h.expand(0) * gain).square())
        Q = IV.mpf(float(np.max(rows.hi)))
        # the cross term: b_i (L u_i + beta sqrt(X_i) sqrt(Var_i)) with (b_i, Var_i) <= r^2 k, k in K
        spread_gain = b_hat * rho
        coupling = self.value_coupling
        if coupling.certified and upper(self.r ** 3 * IV.mpf(coupling.value)) < upper(spread_gain):
            spread_gain = self.r ** 3 * IV.mpf(coupling.value)
        return largest_over_shares(b_hat, n, top_count(n, cap), Q, b_hat * L + beta * root * spread_gain)

    def key_term(self, terms: dict):
        """``sqrt(sum_i ||T_i||^2) / ||E_X||`` bounded two ways (steps 6 and 8 of the module docstring):
        ``min(sqrt(Phi), L sqrt(kappa) + rho beta sqrt(kappa_cov))``."""
        split = self.split_key_term(terms)
        whole = IV.sqrt(terms["Phi"])
        return whole if upper(whole) <= upper(split) else split


def top_count(n: int, cap) -> int:
    """K = ceil(t / cap) with ``t = 2 (1 - 1/n)`` (at most n): a row's weights ``nu_ij <= cap`` summing to at
    most t reach at most ``cap`` times the share of the K largest token moves (steps 9 and 10)."""
    return min(n, math.ceil(upper(2 * (1 - IV.mpf(1) / n) / cap)))


def largest_over_shares(b_hat, n: int, K: int, rows, cross):
    """``sqrt(b_hat^2 + (alpha + (alpha^2 + beta'^2)^(1/2)) / 2)``, ``alpha = rows + 2 cross K^(1/2)``,
    ``beta' = 2 cross (n - K)^(1/2)``: the largest over the share s of ``b_hat^2 + rows s + 2 cross (K^(1/2) s +
    (n - K)^(1/2) (s (1 - s))^(1/2))`` (steps 9 and 10 of the module docstring)."""
    alpha = rows + 2 * cross * IV.sqrt(IV.mpf(K))
    slant = 2 * cross * IV.sqrt(IV.mpf(n - K))
    return IV.sqrt(b_hat ** 2 + (alpha + IV.sqrt(alpha ** 2 + slant ** 2)) / 2)


def _cap(p):
    """``cap(p)``: 1 for ``p <= 1/2``, else ``4 p (1 - p)`` (step 3 of the module docstring)."""
    return 1 if upper(p) <= 0.5 else 4 * p * (1 - p)


def max_on_weights(p_lo: float, p_bar, function, top):
    """Upper bound of ``max function(p)`` over ``p in [p_lo, p_hi]`` (``p_hi`` the upper end of the interval
    ``p_bar``) for a function that rises on ``[0, top]`` and falls on ``[top, 1]`` (``top`` an interval
    holding the peak's place): the value at ``p_hi`` when ``p_hi`` lies below ``top``, at ``p_lo`` when
    ``p_lo`` lies above it (both rounded outward: a larger ``p_hi``, a smaller ``p_lo``), else at ``top``."""
    p_hi = IV.mpf(upper(p_bar))
    if upper(p_hi) < lower(top):
        point = p_hi
    elif p_lo > upper(top):
        point = IV.mpf(p_lo)
    else:
        point = top
    return IV.mpf(upper(function(point)))


_BETA = ("beta = sup over the queries' region of ||Pi (A^T x + u)||: trust-region secular equation certified by "
         "an S-lemma PSD check; lipbound.numeric.sdp.region")
_SCORE_GAIN = ("sup over the queries' region of ||M^T (A^T x + u)|| (score spread omega = 2 r times it): "
               "trust-region secular equation, S-lemma certificate; lipbound.numeric.sdp.region")


def _first_failure(*bounds: CertifiedValue) -> CertifiedValue | None:
    """The first bound that is not certified, if any."""
    return next((bound for bound in bounds if not bound.certified), None)


def _check_size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise AssumptionError(name, "a positive integer", repr(value), f"pass {name} >= 1 tokens")
    return int(value)


def _check_argument(argument: str) -> str:
    if argument not in ("queries", "context", "joint"):
        raise AssumptionError("argument", "'queries', 'context' or 'joint'", repr(argument),
                              "choose the input the constant is taken in")
    return argument


def _result(name, bounds: HeadBounds, pieces, value_iv, certificate, started, require) -> CertifiedValue:
    failed = _first_failure(*pieces)
    certificate.update({piece.name: piece for piece in pieces})
    if failed is not None:
        result = sdp_value(name, math.nan, False, certificate, bounds.solver, time.perf_counter() - started,
                                failed.details["status"], _PROVENANCE, reason=f"{failed.name}: {failed.reason}")
        if require:
            result.require()
        return result
    return sdp_value(name, upper(value_iv), True, certificate, bounds.solver, time.perf_counter() - started,
                          "certified", _PROVENANCE)


def _reuse(bounds: HeadBounds | None, head: Head, radius, center, value, query_radius=None,
           query_center=None) -> HeadBounds | None:
    """The precomputed constants, checked to belong to this head, its regions and value map."""
    if bounds is None:
        return None
    if not isinstance(bounds, HeadBounds) or not bounds.matches(head, radius, center, query_radius, query_center) or \
            (value is not None) == bounds.own_values:
        raise AssumptionError("bounds", "HeadBounds computed for this head, ball and value map",
                              "constants of another head, ball or value map",
                              "build HeadBounds(head, radius, center, value=...) with the same arguments")
    return bounds


def _intervals_to_floats(terms: dict) -> dict:
    return {key: upper(value) for key, value in terms.items()}


@one_blas_thread
def self_attention_bound(head: Head, radius: float, center=None, *, n: int, causal: bool | None = None,
                         solver: str = "auto", value=None, require: bool = False,
                         bounds: HeadBounds | None = None) -> CertifiedValue:
    r"""Certified ``Lip(f)`` of dot-product self-attention on ``B(c, R)^n`` (Frobenius norm).

    ``min( sqrt(b_hat^2 + Phi + 2 c_hat xi), b_hat + sqrt(Phi) )`` (module docstring, step 7) and the row
    by row forms of steps 9 and 10.

    Parameters
    ----------
    head : Head
        ``W_Q, W_K`` (d, d_k), ``W_V`` (d, d_v); score ``"dot"``.
    radius : float
        R > 0.
    center : ndarray of shape (d,), optional
        c (default 0).
    n : int
        Number of tokens.
    causal : bool, optional
        Causal mask (default ``head.causal``).
    solver : {"auto", "clarabel", "scs", "eig"}
    value : ndarray (d, d_out), optional
        Value map replacing ``W_V`` (multi-head split through ``W_O``).
    require : bool
        Raise :class:`~lipbound.errors.SolverError` instead of returning an uncertified result.
    bounds : HeadBounds, optional
        Precomputed constants (reused across n).

    Returns
    -------
    CertifiedValue
        The certificate holds the sub-certificates, the terms and the closed form.
    """
    started = time.perf_counter()
    n = _check_size("n", n)
    causal = _causal(head, causal)
    bounds = _reuse(bounds, head, radius, center, value) or HeadBounds(head, radius, center, value=value,
                                                                       solver=solver)
    pieces = [bounds.value_norm2, bounds.gamma, bounds.beta, bounds.score_gain]
    certificate: dict = {"n": n, "causal": causal, "radius": bounds.R}
    if _first_failure(*pieces) is None:
        pieces.append(bounds.coupled)
    if _first_failure(*pieces) is not None:
        return _result("Lip(self-attention)", bounds, pieces, None, certificate, started, require)
    terms = bounds.terms(n, causal=causal)
    c_hat = bounds.r ** 2 * IV.mpf(bounds.coupled.value) * terms["row_cap"]
    xi = IV.sqrt(terms["kappa"])
    star = (1 + IV.sqrt(IV.mpf(n))) / 2
    if upper(star) < lower(xi):
        xi = star
    b_hat, Phi = terms["b_hat"], terms["Phi"]
    pythagorean = IV.sqrt(b_hat ** 2 + Phi + 2 * c_hat * xi)
    minkowski = b_hat + bounds.key_term(terms)
    rows = bounds.row_form(n, causal, b_hat)
    spread = bounds.spread_form(n, causal, b_hat)
    total = min((form for form in (pythagorean, minkowski, rows, spread) if form is not None), key=upper)
    certificate.update(_intervals_to_floats(terms), c_hat=upper(c_hat), xi=upper(xi),
                       pythagorean=upper(pythagorean), minkowski=upper(minkowski),
                       row_by_row=None if rows is None else upper(rows),
                       spread_tokens=None if spread is None else upper(spread))
    return _result("Lip(self-attention)", bounds, pieces, total, certificate, started, require)


def _causal(head: Head, causal: bool | None) -> bool:
    if causal is None:
        return bool(head.causal)
    if bool(causal) != bool(head.causal):
        raise AssumptionError("causal", f"the head's own mask (head.causal={head.causal})", repr(causal),
                              "build the Head with mask=AttentionMask(causal=True) for a masked variant")
    return bool(causal)


@one_blas_thread
def cross_attention_bound(head: Head, radius: float, center=None, *, n: int, m: int, argument: str = "joint",
                          query_radius=None, query_center=None, solver: str = "auto", value=None,
                          require: bool = False, bounds: HeadBounds | None = None) -> CertifiedValue:
    r"""Certified ``Lip`` of dot-product cross-attention (Frobenius): m queries in the query ball
    attend to n context tokens in ``B(c, R)``.

    * queries: ``b_hat = R^2 gamma_{A,V}`` (no n appears);
    * context: ``sqrt(Phi)`` with m queries per column;
    * joint: ``min( sqrt(b_hat^2 + Phi), sqrt(lambda_max([[b_hat^2, c_hat sqrt(kappa)],
      [c_hat sqrt(kappa), Phi]])) )``, since ``sum_i eps^Y_i u_i <= ||E_Y|| ||E_X|| sqrt(kappa)``.

    Parameters as in :func:`self_attention_bound`; ``m`` queries, ``argument`` in
    ``{"queries", "context", "joint"}``, ``query_radius``/``query_center`` the query ball.
    """
    started = time.perf_counter()
    n, m = _check_size("n", n), _check_size("m", m)
    argument = _check_argument(argument)
    if head.causal:
        raise AssumptionError("head.causal", "False for cross-attention", "True",
                              "causal masking applies to self-attention only")
    bounds = _reuse(bounds, head, radius, center, value, query_radius, query_center) or HeadBounds(
        head, radius, center, query_radius=query_radius, query_center=query_center, value=value, solver=solver)
    pieces = [bounds.value_norm2, bounds.gamma, bounds.beta, bounds.score_gain]
    certificate: dict = {"n": n, "m": m, "argument": argument, "radius": bounds.R, "query_radius": bounds.R_query}
    if argument == "joint" and _first_failure(*pieces) is None:
        pieces.append(bounds.coupled)
    if _first_failure(*pieces) is not None:
        return _result(f"Lip(cross-attention, {argument})", bounds, pieces, None, certificate, started, require)
    terms = bounds.terms(n, m=m)
    b_hat, Phi, kappa = terms["b_hat"], terms["Phi"], terms["kappa"]
    if argument == "queries":
        total = b_hat
    elif argument == "context":
        total = bounds.key_term(terms)
    else:
        c_hat = bounds.r ** 2 * IV.mpf(bounds.coupled.value) * terms["row_cap"]
        off = c_hat * IV.sqrt(kappa)
        coupled = IV.sqrt((b_hat ** 2 + Phi) / 2 + IV.sqrt(((b_hat ** 2 - Phi) / 2) ** 2 + off ** 2))
        plain = IV.sqrt(b_hat ** 2 + bounds.key_term(terms) ** 2)
        total = coupled if upper(coupled) <= upper(plain) else plain
        certificate.update(c_hat=upper(c_hat), coupled=upper(coupled), plain=upper(plain))
    certificate.update(_intervals_to_floats(terms))
    return _result(f"Lip(cross-attention, {argument})", bounds, pieces, total, certificate, started, require)


@one_blas_thread
def matrix_aware_closed_form(head: Head, radius, center=None, *, n: int, causal: bool | None = None,
                             solver: str = "auto", bounds: HeadBounds | None = None, m: int | None = None,
                             argument: str | None = None, query_radius=None, query_center=None,
                             value=None) -> CertifiedValue:
    r"""The closed form of the self- and cross-attention theorems with the norm products replaced by the
    certified joint constants of :class:`HeadBounds` (on a ball or an ellipsoid such as a LayerNorm image):

        self:     L sqrt(kappa) + r^2 gamma + rho beta sqrt(min(kappa, 3 n / 4, kappa_cov)),
        queries:  r^2 gamma,      context: L sqrt(K) + rho beta sqrt(min(K, 3 m / 4, kappa_cov)),
        joint:    (queries^2 + context^2)^(1/2),

    and for self-attention the row-by-row form of step 9 of the module docstring where smaller (step 10, which
    needs a second coupled gain, is the relaxation's).
    ``kappa`` (K: m queries per column) from the score spread ``omega = 2 r sup ||M^T g||``, ``kappa_cov``
    the column sum of ``2 p (1 - p) cap(p)`` (step 8 of the module docstring); the
    covariance terms vanish when every row has one key (n = 1).  Each replacement is proved in
    docs/mathematics.md ("the LayerNorm image"); the theorems are
    :func:`lipbound.symbolic.theorems.self_attention` and :func:`~lipbound.symbolic.theorems.cross_attention`.
    """
    started = time.perf_counter()
    n = _check_size("n", n)
    cross = argument is not None
    if cross:
        m = _check_size("m", m)
        argument = _check_argument(argument)
        if head.causal:
            raise AssumptionError("head.causal", "False for cross-attention", "True",
                                  "causal masking applies to self-attention only")
        causal = False
    else:
        causal = _causal(head, causal)
    bounds = _reuse(bounds, head, radius, center, value, query_radius, query_center) or HeadBounds(
        head, radius, center, query_radius=query_radius, query_center=query_center, value=value, solver=solver)
    pieces = [bounds.value_norm2, bounds.gamma, bounds.beta, bounds.score_gain]
    name = "Lip(cross-attention, matrix-aware closed form)" if cross else \
        "Lip(self-attention), matrix-aware closed form"
    certificate: dict = {"n": n, "m": m, "causal": causal, "argument": argument or "self"}
    if _first_failure(*pieces) is not None:
        return _result(name, bounds, pieces, None, certificate, started, False)
    terms = bounds.terms(n, m=m if cross else None, causal=causal)
    kappa = terms["kappa"]
    column = min((kappa, IV.mpf(3) * (m if cross else n) / 4, terms["kappa_cov"]), key=upper)
    queries = terms["b_hat"]
    context = bounds.split_key_term(terms, column)
    if not cross:
        value_iv = queries + context
        rows = bounds.row_form(n, causal, queries)
        if rows is not None and upper(rows) < upper(value_iv):
            value_iv = rows
        certificate["row_by_row"] = None if rows is None else upper(rows)
    else:
        value_iv = {"queries": queries, "context": context, "joint": IV.sqrt(queries ** 2 + context ** 2)}[argument]
    certificate.update(kappa=upper(kappa), kappa_cov=upper(terms["kappa_cov"]), b_hat=upper(queries),
                       context=upper(context))
    return _result(name, bounds, pieces, value_iv, certificate, started, False)


@one_blas_thread
def measure_attention_bound(head: Head, radius: float, center=None, *, n: int | None = None,
                            regime: str = "uniform", argument: str = "self", query_radius=None, query_center=None,
                            solver: str = "auto", require: bool = False) -> CertifiedValue:
    r"""Certified Wasserstein-1 constant of attention on measures (Vuckovic, Baratin, Tachet des
    Combes 2020), with the matrix-aware constants of :mod:`lipbound.numeric.sdp.joint`.

    * ``regime="uniform"`` (uniform empirical measures of n atoms): the (2,1) constant, which
      :func:`lipbound.symbolic.theorems.w1_uniform` shows is a W1 constant.  Per query,
      ``||S_i|| <= R^2 gamma_{A,V} ||e_i||`` and, bounding the covariance by the mean absolute
      deviation, ``||Cov_{p_i}(W_V^T x, g_i^T e)|| <= rho E|a - a_bar| <= 2 rho beta sum_j p_ij (1 - p_ij) ||e_j||``
      (``|a_j - a_bar| <= sum_k p_k |a_j - a_k|``), so

          Lip <= R^2 gamma_{A,V} + n max_p p (L + 2 rho beta (1 - p))

      over the weight range of a row (module docstring, step 6); the closed form has
      ``rho alpha + (L + 2 rho beta) kappa``.
    * ``regime="mean-field"``: :func:`lipbound.symbolic.theorems.w1_mean_field`,
      ``rho alpha + e^omega (L + 2 rho beta)``, with ``rho alpha -> R^2 gamma_{A,V}`` (``D Gamma_mu(x)[e] =
      W_V^T Sigma A^T e``) and the trust-region beta, ``omega = 2 R beta``.
    * ``argument`` in ``{"queries", "context", "joint"}``: cross-attention on measures
      (:func:`lipbound.symbolic.theorems.w1_cross`), ``R^2 gamma``, ``e^omega (L + 2 rho beta)``, their sum.

    Parameters
    ----------
    head : Head
    radius, center :
        The support ball of the (context) measures.
    n : int
        Atoms per measure (``regime="uniform"`` only).
    regime : {"uniform", "mean-field"}
    argument : {"self", "queries", "context", "joint"}
    query_radius, query_center :
        Support ball of the query measure (cross-attention); default the same ball.
    solver : {"auto", "clarabel", "scs", "eig"}
    require : bool
    """
    started = time.perf_counter()
    if regime not in ("uniform", "mean-field"):
        raise AssumptionError("regime", "'uniform' or 'mean-field'", repr(regime), "pick a regime")
    if argument not in ("self", "queries", "context", "joint"):
        raise AssumptionError("argument", "'self', 'queries', 'context' or 'joint'", repr(argument),
                              "pick the measure the constant is taken in")
    if regime == "uniform":
        if argument != "self":
            raise AssumptionError("regime", "'mean-field' for cross-attention on measures", repr(regime),
                                  "use regime='mean-field'")
        n = _check_size("n", n)
    bounds = HeadBounds(head, radius, center, query_radius=query_radius, query_center=query_center, solver=solver)
    pieces = [bounds.value_norm2, bounds.gamma, bounds.beta]
    name = f"Lip_W1(measure attention, {regime}, {argument})"
    certificate: dict = {"regime": regime, "argument": argument, "n": n}
    if _first_failure(*pieces) is not None:
        return _result(name, bounds, pieces, None, certificate, started, require)
    L = IV.sqrt(IV.mpf(bounds.value_norm2.value))
    beta = IV.mpf(bounds.beta.value)
    rho_beta = IV.sqrt(IV.mpf(bounds.spread2.value)) * beta
    query_part = bounds.r ** 2 * IV.mpf(bounds.gamma.value)
    if regime == "uniform":
        p_lo, p_bar = bounds.weight_range(n)
        spread = max_on_weights(p_lo, p_bar, lambda p: p * (1 - p), IV.mpf(1) / 2)
        column = n * (IV.mpf(upper(p_bar)) * L + 2 * rho_beta * spread)
        total = query_part * (1 if n >= 2 else 0) + column
        certificate.update(query_part=upper(query_part), column=upper(column))
    else:
        context_part = IV.exp(bounds.omega) * (L + 2 * rho_beta)
        total = {"self": query_part + context_part, "queries": query_part, "context": context_part,
                 "joint": query_part + context_part}[argument]
        certificate.update(query_part=upper(query_part), context_part=upper(context_part))
    return _result(name, bounds, pieces, total, certificate, started, require)
