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

   1b. *Coupled through the keys' second moments* (no centre term: ``A_Delta c + h_Delta = 0``).  With ``x_j = c +
   M w_j``, ``t = M^T V y`` and ``q_Delta = M^T A_Delta^T Pi e_i / ||e_i||``: ``Var alpha <= sum_j p_ij (t . w_j)^2 =
   sum_Delta t^T U_Delta t`` and ``Var zeta <= E zeta^2 <= sum_Delta q_Delta^T U_Delta q_Delta`` (``|phi'| <= 1``), with
   ``U_Delta = sum_{j: Delta_ij = Delta} p_ij w_j w_j^T >= 0`` and ``sum_Delta tr U_Delta <= r^2``.  For any ``a > 0``,
   ``(Var alpha Var zeta)^(1/2) <= (a Var alpha + Var zeta / a) / 2 <= (1/2) sum_Delta tr U_Delta lambda_max(a t t^T +
   q_Delta q_Delta^T / a)``, and ``sup_{||y|| = ||e|| = 1}`` of the last is at most ``lambda_max(a M^T V V^T M + M^T
   A_Delta^T Pi A_Delta M / a)``.  So ``b <= (r^2 / 2) max_Delta lambda_max(a M^T V V^T M + M^T A_Delta^T Pi A_Delta M /
   a)`` for one a shared by the offsets (a key of any offset may carry the mass).  With one offset (a dot product)
   the minimum over a is ``r^2 max_u ||A M u|| ||V^T M u||``, the joint gain of :mod:`.joint`; with rotations it
   keeps the alignment of the value and score directions that step 1 gives up, at the price of one a for all
   offsets.  Both matrices live on ``span [M^T V, M^T W_K]`` (``d_v + d_k`` columns), where the eigenvalue is
   certified.  The smaller of ``rho a`` and this is ``b``.
2. *Key term* (step 8 of :mod:`.head`, unchanged).  ``y^T cov_i = Cov(z, delta)`` with ``z_j = phi'_ij e_j . g_ij``
   and ``delta_j = y^T V^T (x_j - xbar_i)`` (``sum_j p_ij delta_j = 0``); ``Var z <= 2 sum_j p_ij (1 - p_ij) z_j^2``,
   ``|z_j| <= beta ||e_j||`` with ``beta = max_Delta sup_{x in D} ||Pi (A_Delta^T x + u_Delta)||``, and ``Var delta <=
   rho^2 cap(p_ij)`` for every j (step 3 of :mod:`.head`).  So ``||cov_i||^2 <= rho^2 beta^2 sum_j nu(p_ij)
   ||e_j||^2``, ``nu(p) = 2 p (1 - p) cap(p) <= 1/2``.

   2b. *Key term by columns* (no centre, no query bias: ``g_ij = A_Delta^T M w_i``).  Keep ``z_j`` in the row bound,
   ``||cov_i||^2 <= rho^2 sum_j nu_i (e_j . g_ij)^2`` (``nu_i`` the largest ``nu(p)`` over row i's weight range), and
   bound ``(e_j . g_ij)^2 = (w_i . M^T A_Delta Pi e_j)^2 <= r^2 e_j^T Pi A_Delta^T M M^T A_Delta Pi e_j``.  Summed over
   the rows, ``sum_i ||cov_i||^2 <= rho^2 r^2 sum_j e_j^T K_j e_j``, ``K_j = sum_{i: j in V_i} nu_i Pi A_{j-i}^T M M^T
   A_{j-i} Pi``: a key is read by every row at that row's own offset, and the rotations spread the rows' worst
   directions apart.  So the key term is at most ``rho r max_j lambda_max(K_j)^(1/2)``, never above step 2's
   ``rho beta kappa_cov^(1/2)`` (``lambda_max`` of a sum is at most the sum of the ``lambda_max``).  ``lambda_max(K_j) =
   ||X Y||^2`` with ``X = Pi W_K`` and ``Y Y^T = sigma^2 sum_i nu_i R_Delta^T W_Q^T M M^T W_Q R_Delta``, certified from
   the two ``d_k x d_k`` Gram matrices.
3. *Mean term.*  ``||mean_i|| <= L u_i``, ``u_i^2 = sum_j p_ij ||e_j||^2``, ``L = ||Pi V||`` (Jensen).
4. *Weight ranges.*  With x_i fixed, ``s_ij = (M^T g_ij) . w_j + sigma q_i^T R_Delta k_c`` (``k_c = W_K^T c +
   b_K``), so the scores of a row spread by at most ``2 r max_Delta sup_x ||M^T (A_Delta^T x + u_Delta)|| +
   max_{Delta, Delta'} sup_x sigma |q(x)^T (R_Delta - R_Delta') k_c|``; a soft-cap keeps them within ``2 C``, and a
   position bias adds its spread over the row.  With a spread omega_i every weight of row i lies in
   ``[1 / (1 + (N_i - 1) e^omega_i), 1 / (1 + (N_i - 1) e^-omega_i)]`` (step 6 of :mod:`.head`).
5. *Sums.*  ``||Df_i[E]|| <= b_i eps_i + L u_i + rho beta (sum_j nu_ij eps_j^2)^(1/2)`` (``eps_i = ||e_i||``,
   ``b_i = 0`` for a row with one key).  Summed over rows by Minkowski, with column sums ``kappa = max_j
   sum_{i: j in V_i} pbar_i`` and ``kappa_cov = max_j sum_{i : j in V_i} max nu_i``:
   ``Lip(f) <= b + L kappa^(1/2) + k``, ``k`` the smaller of ``rho beta kappa_cov^(1/2)`` and step 2b's
   ``rho r max_j lambda_max(K_j)^(1/2)`` (Minkowski needs only the norm of the vector of the rows' key parts,
   which each bounds); row by row (step 9 of :mod:`.head`, whose
   argument uses only the bound of each row): ``Lip(f)^2 <= b^2 + (alpha + (alpha^2 + beta'^2)^(1/2)) / 2``.
6. *Query and key parts split row by row.*  Row i's query part depends on ``e_i`` alone and is 0 for a row with one
   key; its key part on the keys it sees.  With ``||S_i|| <= b_i eps_i`` (``b_i = b``, or 0 for one key) and
   ``||cov_i||^2 <= sum_j e_j^T K_ij e_j`` (``K_ij = rho^2 r^2 nu_i Pi A_{j-i}^T M M^T A_{j-i} Pi`` by step 2b, or
   ``rho^2 beta^2 nu_i I`` by step 2), ``(x + y)^2 <= (1 + t_i) x^2 + (1 + 1/t_i) y^2`` for any ``t_i > 0`` gives

       ||S + cov||_F^2 <= sum_j [(1 + t_j) b_j^2 eps_j^2 + e_j^T (sum_{i: j in V_i} (1 + 1/t_i) K_ij) e_j]
                       <= max_j [(1 + t_j) b_j^2 + lambda_max(sum_{i: j in V_i} (1 + 1/t_i) K_ij)] ||E||^2,

   and ``Lip(f) <= (that max)^(1/2) + L kappa^(1/2)`` by Minkowski with the mean term.  With equal ``t_i`` and equal
   columns this is step 5's ``b + k``; it is smaller where rows and columns differ: under a causal mask key 0 is
   read by every row but row 0 has no query part, and the last key is read by one row only.  The ``t_i`` are
   found in floats (:func:`split_rows`); the bound is evaluated at them in interval arithmetic.
7. *The two parts read different directions of the moves.*  ``S_i`` depends on ``e_i`` only through ``W_Q^T e_i``
   (``e_i . (A_Delta x_j + h_Delta) = (W_Q^T e_i) . sigma R_Delta (W_K^T x_j + b_K)``), so ``S_i(e_i) = S_i(P_Q e_i)``
   with ``P_Q`` the orthogonal projector onto ``range(Pi W_Q)`` (tangent), and ``||S_i|| <= b_i ||P_Q e_i||``; and
   ``||P_Q e||^2 = e^T Z (Z^T Z)^-1 Z^T e <= e^T Z C Z^T e`` for ``Z = Pi W_Q`` and any ``C >= (Z^T Z)^-1``, which holds
   when ``[[C, I], [I, Z^T Z]] >= 0`` (Schur complement; checked in interval arithmetic).  The forms ``K_ij`` of step
   6 (by columns) are ``X (.) X^T`` with ``X = Pi W_K``.  Step 6's sum becomes

       ||S + cov||_F^2 <= max_j lambda_max((1 + t_j) b_j^2 Z C Z^T + sum_{i: j in V_i} (1 + 1/t_i) K_ij) ||E||^2,

   at most a hair above step 6 (``Z C Z^T <= (1 + 1e-9) I`` when C is the enlarged float inverse; the smaller of the two
   is used), and down to ``b^2 + k^2`` in place
   of ``(b + k)^2`` when the query and key projections see orthogonal directions: a token moved along the query
   directions does not move as a key.  The eigenvalue is certified as ``||F D^(1/2)||^2`` with ``F = [Z, X]`` (two
   ``d_k``-wide blocks) from the Gram matrix ``F^T F``; the ``t_i`` are step 6's times one factor found in floats.

8. *A row's own key inside its query part* (:mod:`.own_key`).  Key i of row i is read at offset 0 and ``ds_ii = e_i .
   (A_0 + A_0^T) x_i``: with ``Ahat_0 = A_0 + A_0^T`` in place of ``A_0`` in steps 1 and 1b (gain ``a'``, query term
   ``b'``) and the key forms of step 6 without their diagonal ``j = i``, step 6 holds with ``b'``; the smaller of this
   and steps 6-7 is used.  For a layer the same with the heads' ``a'_h`` (:func:`positional_layer_bound`).
9. *A row's key part centred over its keys* (:mod:`.rotary_centred`).  ``Var_p(z) <= (1/2) sum_j (z_j - zbar)^2`` for
   every p (``zbar`` the plain mean over the row's keys), so row i's key form of step 2b becomes ``rho^2 r^2 (1/2)
   sum_{j, l} (delta_jl - 1/N_i) e_j^T Pi A_{j-i}^T M M^T A_{l-i} Pi e_l``: step 7's sum is then one eigenvalue over all
   tokens' moves (``n 2 d_k`` coordinates), at most step 7's at the same ``t_i``; where it applies step 7 is not formed.
10. *Step 9 with some rows' own keys merged* (:func:`_centred_merged`).  Step 8's identity holds row by row: for a row
   i in a chosen set, ``y^T (S_i + cov_i) = Cov(alpha, zeta') + Cov(delta, z')`` with ``z'_i = 0``, so its key form of
   step 9 loses the own key's rows and columns (a principal part of a PSD form that majorises ``Var z'``, since the
   variance inequality holds for every vector), and its query part is ``b' ||P_F e_i||``: ``zeta'`` reads ``e_i``
   through ``W_Q^T e_i`` and, by ``A_0^T``, ``W_K^T e_i``, so only through the projector ``P_F`` onto ``range [Pi W_Q,
   Pi W_K]``, with ``||P_F e||^2 <= e^T F C_F F^T e`` for ``C_F >= (F^T F)^-1`` (step 7's check on ``F^T F``).  The
   other rows keep step 9.  Where ``b'`` is at most 1.2 ``b``, every row with two keys is merged, or else the first
   such row alone, the first whose float estimate is 0.5% below step 9, and that form is certified.

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
from ...rigorous.linalg import Enclosure, gram_norm_upper, product_norm_interval
from ...rigorous.value import CertifiedValue
from ..kernels import DotProduct, Rotary
from ..model import Head
from ..offsets import HeadRows, rotation_enclosure
from .head import largest_over_shares, max_on_weights, top_count
from .joint import _golden_min, sdp_value
from .layer import gram_factor, ridged_root
from .own_key import OwnKeyTerms
from .region import Region, trust_region_sup
from .rotary_centred import centred_head_rows
from .rotary_rows import split_head_rows

__all__ = ["PositionalHeadBounds", "positional_bound", "positional_scope", "reduced_sup"]

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


def reduced_sup(left: Enclosure, right: Enclosure, shift: Enclosure | None, radius, name: str,
                provenance: str) -> CertifiedValue:
    """Certified ``sup_{||w|| <= r} ||left right w + shift||`` for ``left`` (p, k), ``right`` (k, q) with a small
    inner dimension k: ``{right w}`` lies in ``{C v : ||v|| <= r}`` for any C with ``C C^T >= right right^T``
    (checked in interval arithmetic), so the k-dimensional trust region of ``left C`` bounds it; without a
    shift the value is ``r ||left right||``."""
    if shift is None:
        started = time.perf_counter()
        value = interval(radius) * product_norm_interval(left, right)
        return sdp_value(name, upper(value), True, {"lower": lower(value)}, "norm", time.perf_counter() - started,
                         "certified", provenance, lower=lower(value))
    C = gram_factor((right @ right.T).sym())
    if C is not None:
        return trust_region_sup(left @ Enclosure.exact(C), shift, radius, name, provenance)
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
    output : ndarray (d_v, d_out), optional
        The block ``W_O^h`` of the output projection that reads the head: the value map is ``V = W_V W_O^h``
        (default ``W_V``).

    Attributes
    ----------
    value_norm : interval
        ``L = ||Pi V||``.
    spread : interval
        ``rho = r ||V^T M||``.
    query_gain, key_gain, score_gain : CertifiedValue
        ``a``, ``beta`` and the score gain ``max_Delta sup ||M^T (A_Delta^T x + u_Delta)||`` (module docstring).
    query_left, key_left : Enclosure (d, d_k)
        ``Pi W_Q`` and ``Pi W_K``, the projections onto the region's span.
    queries_shaped, keys_shaped, keys_scaled : Enclosure (d_k, d)
        ``sigma W_Q^T M``, ``W_K^T M`` and ``sigma W_K^T M`` (``M`` the region's shape, ``sigma`` the score scale).

    Notes
    -----
    Without biases and with the region about 0 each gain is ``r`` times a norm ``||X R_Delta Y||`` with
    ``d_k``-wide factors, computed from the ``d_k x d_k`` Gram matrices of X (once) and of ``R_Delta Y``
    (:func:`~lipbound.rigorous.linalg.gram_norm_interval`).
    """

    def __init__(self, head: Head, domain, n: int, output=None):
        if not positional_scope(head):
            raise AssumptionError("head", "a softmax head with a rotary or dot-product score", head.kernel.describe(),
                                  "use the constants of the head's own kernel")
        self.head, self.n = head, int(n)
        self.region = region = Region.of(domain, None, head.d)
        self.rows = HeadRows(head, self.n)
        self.r = region.r
        self._grams: dict[str, Enclosure] = {}  # _gram's cache, one per instance (dropped with it)
        self.splits: dict = {}                  # row_splits' cache: query term's upper end -> (has_query, t)
        started = time.perf_counter()
        W_V = Enclosure.exact(head.W_V)
        shaped_values = region.times_shape(W_V.T)                                  # V^T M, (d_v, d)
        # value_outputs: the value map's output form in value coordinates, W_O^h W_O^hT (I without a block)
        if output is None:
            self.value_norm = region.project(W_V).norm_interval()
            self.spread = self.r * shaped_values.norm_interval()
            self.value_outputs = Enclosure.exact(np.eye(head.d_v))
        else:
            block = Enclosure.exact(np.asarray(output, dtype=float))
            self.value_norm = product_norm_interval(region.project(W_V), block)
            self.spread = self.r * product_norm_interval(block.T, shaped_values)
            self.value_outputs = (block @ block.T).sym()
        self.rotations = {delta: rotation_enclosure(head.kernel, head.d_k, delta) for delta in self.rows.offsets}
        self.scale = _scale_interval(head)                                         # sigma, an interval
        scale = Enclosure.scalar(self.scale)
        W_Q, W_K = Enclosure.exact(head.W_Q), Enclosure.exact(head.W_K)
        self.queries_shaped = region.times_shape(W_Q.T).scale(scale)              # sigma W_Q^T M, (d_k, d)
        self.keys_shaped = region.times_shape(W_K.T)                              # W_K^T M, (d_k, d)
        self.keys_scaled = self.keys_shaped.scale(scale)
        self.query_left, self.key_left = region.project(W_Q), region.project(W_K)
        self.query_gain = self._largest("query gain", self._query_gradient)
        self.query_coupled = self._coupled_query_term()
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

    def centred(self, W: np.ndarray, bias: np.ndarray) -> Enclosure | None:
        """``W^T c + b`` of the region's centre (None when it is exactly 0)."""
        center = self.region.center
        if not np.any(center) and not np.any(bias):
            return None
        return Enclosure.exact(W.T) @ Enclosure.exact(center.reshape(-1, 1)) + Enclosure.exact(bias.reshape(-1, 1))

    def gram(self, which: str) -> Enclosure:
        """The Gram matrices of the fixed factors, d_k x d_k (2 d_k x 2 d_k for ``[Z, X]``, "query_and_key_left"),
        each computed once per instance."""
        gram = self._grams.get(which)
        if gram is None:
            gram = self._grams[which] = self._gram_of(which)
        return gram

    def _gram_of(self, which: str) -> Enclosure:
        if which == "query_and_key_left":   # F = [Z, X] of the row splits apart and centred (steps 7 and 9)
            both = Enclosure.concatenate([self.query_left, self.key_left])
            return (both.T @ both).sym()
        factor = {"query_left": self.query_left, "key_left": self.key_left,
                  "keys_shaped": self.keys_shaped.T}.get(which)
        if factor is not None:
            return (factor.T @ factor).sym()                                       # X^T X
        factor = {"queries_shaped": self.queries_shaped, "keys_scaled": self.keys_scaled}[which]
        return (factor @ factor.T).sym()                                           # Y Y^T

    def _sup(self, left: Enclosure, left_gram: str, R: Enclosure, right: Enclosure, right_gram: str,
             shift: Enclosure | None, name: str, provenance: str) -> CertifiedValue:
        """``sup_{||w|| <= r} ||left R right w + shift||`` (the Gram route without a shift)."""
        if shift is None:
            started = time.perf_counter()
            norm = gram_norm_upper(self.gram(left_gram), (R @ self.gram(right_gram) @ R.T).sym())
            if math.isfinite(norm):
                value = upper(interval(self.r) * interval(norm))
                return sdp_value(name, value, True, {}, "norm", time.perf_counter() - started, "certified", provenance)
        return reduced_sup(left, R @ right, shift, self.r, name, provenance)

    def _query_gradient(self, delta: int, name: str) -> CertifiedValue:
        """``sup_w ||Pi (A_Delta (c + M w) + h_Delta)||``: ``Pi W_Q`` times ``R_Delta`` times ``sigma W_K^T M``."""
        head, R = self.head, self.rotations[delta]
        key_centre = self.centred(head.W_K, head.b_K)
        scale = Enclosure.scalar(self.scale)
        shift = None if key_centre is None else self.query_left @ (R @ key_centre).scale(scale)
        return self._sup(self.query_left, "query_left", R, self.keys_scaled, "keys_scaled", shift, name,
                         "sup over the region of the query gradient")

    def _key_gradient(self, delta: int, name: str, side: str) -> CertifiedValue:
        """``sup_x ||K (A_Delta^T x + u_Delta)||``, K the projector (``side="project"``) or ``M^T`` ("shape")."""
        head, R = self.head, self.rotations[delta].T
        left, left_gram = (self.key_left, "key_left") if side == "project" else (self.keys_shaped.T, "keys_shaped")
        query_centre = self.centred(head.W_Q, head.b_Q)
        scale = Enclosure.scalar(self.scale)
        shift = None if query_centre is None else left @ (R @ query_centre).scale(scale)
        return self._sup(left, left_gram, R, self.queries_shaped, "queries_shaped", shift, name,
                         "sup over the region of the key gradient")

    def _coupled_query_term(self) -> CertifiedValue | None:
        """The query term coupled through the keys' second moments (step 1b of the module docstring):
        ``b <= (r^2 / 2) max_Delta lambda_max(a M^T V V^T M + M^T A_Delta^T Pi A_Delta M / a)`` at one ``a > 0`` for
        every offset; None when the query gradient has a constant part (a centre or a key bias)."""
        head, region = self.head, self.region
        if self.centred(head.W_K, head.b_K) is not None:
            return None
        started = time.perf_counter()
        W_V = Enclosure.exact(head.W_V)
        shaped = region.times_shape(W_V.T).T                                       # M^T V, (d, d_v)
        basis = Enclosure.concatenate([shaped, self.keys_shaped.T])                # [M^T V, M^T W_K]
        gram = (basis.T @ basis).sym()
        d_v, d_k = head.d_v, head.d_k
        outputs = self.value_outputs
        queries = self.gram("query_left").scale(self.scale ** 2)                # sigma^2 W_Q^T Pi W_Q
        inner = {delta: (R.T @ queries @ R).sym() for delta, R in self.rotations.items()}

        def middle(a: float, delta: int) -> Enclosure:
            mid, rad = np.zeros((d_v + d_k, d_v + d_k)), np.zeros((d_v + d_k, d_v + d_k))
            top, bottom = outputs.scale(a), inner[delta].scale(1 / interval(a))     # (1 / a enclosed)
            mid[:d_v, :d_v], rad[:d_v, :d_v] = top.mid, top.rad
            mid[d_v:, d_v:], rad[d_v:, d_v:] = bottom.mid, bottom.rad
            ridge = 1e-12 * float(np.max(np.abs(mid))) + 1e-300
            mid[np.diag_indices(d_v + d_k)] += ridge         # C + ridge I >= C: the bound only grows
            return Enclosure(mid, rad)

        # the common a that makes the largest over the offsets smallest, in floats (golden section on log a);
        # only the certificate at that a counts
        root = ridged_root(gram.mid)
        values_part = root[:d_v].T @ outputs.mid @ root[:d_v]
        scores_part = {delta: root[d_v:].T @ block.mid @ root[d_v:] for delta, block in inner.items()}

        def largest(log_a: float) -> float:
            a = math.exp(log_a)
            return max(float(np.linalg.eigvalsh(a * values_part + part / a)[-1]) for part in scores_part.values())

        scale = 0.5 * math.log(max(float(np.trace(inner[self.rows.offsets[0]].mid)), 1e-300)
                               / max(float(np.trace(outputs.mid)), 1e-300))
        best = math.exp(_golden_min(largest, scale - 6.0, scale + 6.0, iterations=16))
        tops = [gram_norm_upper(gram, middle(best, delta).sym()) for delta in inner]
        if not all(math.isfinite(t) for t in tops):
            return None
        value = upper(self.r ** 2 / 2 * IV.mpf(max(tops)) ** 2)
        return sdp_value("coupled query term", value, True, {"a": best}, "eig", time.perf_counter() - started,
                         "certified", "(r^2/2) max over the offsets of lambda_max(a M^T V V^T M + M^T A^T Pi A M / a)")

    def _centre_spread(self):
        """``max_{Delta, Delta'} sup_x sigma |q(x)^T (R_Delta - R_Delta') k_c|`` (step 4; 0 when ``k_c = 0``)."""
        head, region = self.head, self.region
        k_c = head.W_K.T @ region.center + head.b_K
        if not np.any(k_c) or len(self.rows.offsets) < 2:
            return IV.mpf(0)
        k_c = Enclosure.exact(head.W_K.T) @ Enclosure.exact(region.center.reshape(-1, 1)) + Enclosure.exact(
            head.b_K.reshape(-1, 1))
        scale = Enclosure.scalar(self.scale)
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

    def column_norms(self, factors=None, own: bool = True) -> list[float] | None:
        """Per key j a certified upper bound on ``lambda_max(sum_{i: j in V_i} f_i nu_i Pi A_{j-i}^T M M^T A_{j-i}
        Pi)^(1/2)`` (step 2b of the module docstring with row factors ``f_i``, default 1), from ``d_k x d_k`` Gram
        matrices (0 for a key no row with two keys sees); without the row ``i = j`` when not ``own`` (step 8); None
        with a centre or a query bias, or when a norm was not certified."""
        head = self.head
        if self.centred(head.W_Q, head.b_Q) is not None:
            return None
        rows, queries = self.rows, self.gram("queries_shaped")
        factors = np.ones(rows.n) if factors is None else np.asarray(factors, dtype=float)
        nus = [float(upper(self.row_nu(i) * interval(float(factors[i])))) for i in range(rows.n)]
        norms = []
        for j in range(rows.n):
            seen = [i for i in range(rows.n) if rows.visible[i, j] and nus[i] > 0 and (own or i != j)]
            if not seen:
                norms.append(0.0)
                continue
            total = None
            for i in seen:
                form = (self.rotations[j - i].T @ queries @ self.rotations[j - i]).scale(nus[i])
                total = form if total is None else total + form
            norms.append(gram_norm_upper(self.gram("key_left"), total.sym()))
        return norms if all(math.isfinite(v) for v in norms) else None

    def offset_gains(self) -> dict[int, float]:
        """``lambda_max(Pi A_Delta^T M M^T A_Delta Pi)^(1/2)`` per offset, in floats (a search aid of step 6)."""
        gram_x, gram_y = self.gram("key_left").mid, self.gram("queries_shaped").mid
        values, vectors = np.linalg.eigh(0.5 * (gram_x + gram_x.T))
        root = vectors * np.sqrt(np.maximum(values, 0.0))
        return {delta: math.sqrt(max(float(np.linalg.eigvalsh(root.T @ R.mid.T @ gram_y @ R.mid @ root)[-1]), 0.0))
                for delta, R in self.rotations.items()}

    @cached_property
    def column_key(self) -> CertifiedValue | None:
        """``r max_j lambda_max(K_j)^(1/2)``, ``K_j = sum_{i: j in V_i} nu_i Pi A_{j-i}^T M M^T A_{j-i} Pi`` (step 2b of
        the module docstring), certified from ``d_k x d_k`` Gram matrices; None with a centre or a query bias."""
        started = time.perf_counter()
        norms = self.column_norms()
        if norms is None:
            return None
        value = upper(interval(self.r) * interval(max(norms)))
        return sdp_value("column key gain", value, True, {}, "norm", time.perf_counter() - started, "certified",
                         "r max_j lambda_max(sum_i nu_i Pi A_{j-i}^T M M^T A_{j-i} Pi)^(1/2), i the rows seeing key j")

    @property
    def key_term(self):
        """The key term of the Minkowski sum: the smaller of ``rho beta kappa_cov^(1/2)`` (step 2) and ``rho`` times
        the column key gain (step 2b), an interval."""
        rows = self.rows
        plain = self.spread * IV.mpf(self.key_gain.value) * IV.sqrt(rows.column_sum([self.row_nu(i)
                                                                                      for i in range(rows.n)]))
        column = self.column_key
        if column is not None and column.certified:
            coupled = self.spread * IV.mpf(column.value)
            if upper(coupled) < upper(plain):
                return coupled
        return plain

    @property
    def certified(self) -> bool:
        return all(v.certified for v in (self.query_gain, self.key_gain, self.score_gain))

    @property
    def failure(self) -> CertifiedValue | None:
        return next((v for v in (self.query_gain, self.key_gain, self.score_gain) if not v.certified), None)

    @property
    def query_term(self):
        """``b``: the smaller of ``rho a`` (step 1) and the coupled form (step 1b), an interval."""
        b = self.spread * IV.mpf(self.query_gain.value)
        if self.query_coupled is not None and self.query_coupled.certified and self.query_coupled.value < upper(b):
            b = IV.mpf(self.query_coupled.value)
        return b

    def coupled_rows(self, b, apart: bool = True):
        """``||S + cov||`` with the rows' query and key parts split (steps 6 and 7 of the module docstring), an
        interval: :func:`~.rotary_rows.split_head_rows`."""
        return split_head_rows(self, b, apart)

    def terms(self) -> dict:
        """``b, L, rho beta, kappa, kappa_cov`` and the row constants as intervals."""
        rows = self.rows
        several = bool(np.any(rows.key_counts >= 2))
        b = self.query_term
        b = b * (1 if several else 0)
        kappa = rows.column_sum([IV.mpf(upper(self.weight_range(i)[1])) for i in range(rows.n)])
        nus = [self.row_nu(i) for i in range(rows.n)]
        return {"b": b, "L": self.value_norm, "rho_beta": self.spread * IV.mpf(self.key_gain.value),
                "kappa": kappa, "kappa_cov": rows.column_sum(nus), "nu_max": max(nus, key=upper), "several": several,
                "key": self.key_term}


def positional_bound(head: Head, domain, n: int, *, output=None, bounds: PositionalHeadBounds | None = None,
                     name: str = "matrix-aware") -> CertifiedValue:
    """Certified Frobenius Lipschitz constant of a rotary or masked head of self-attention on ``domain^n``:
    the smaller of the Minkowski and the row-by-row forms of the module docstring (step 5)."""
    started = time.perf_counter()
    bounds = bounds or PositionalHeadBounds(head, domain, n, output=output)
    certificate: dict = {"n": n, "offsets": list(bounds.rows.offsets)}
    if not bounds.certified:
        failed = bounds.failure
        return sdp_value(name, math.nan, False, certificate, "eig", time.perf_counter() - started, "not certified",
                         _PROVENANCE, reason=f"{failed.name}: {failed.reason}")
    terms = bounds.terms()
    b, L, rho_beta = terms["b"], terms["L"], terms["rho_beta"]
    minkowski = b + L * IV.sqrt(terms["kappa"]) + terms["key"]
    total = minkowski
    certificate.update(b=upper(b), L=upper(L), rho_beta=upper(rho_beta), kappa=upper(terms["kappa"]),
                       kappa_cov=upper(terms["kappa_cov"]), key=upper(terms["key"]), minkowski=upper(minkowski),
                       query_gain=bounds.query_gain.value, key_gain=bounds.key_gain.value,
                       score_gain=bounds.score_gain.value, omega=upper(max(bounds.omegas, key=upper)))
    cap = terms["nu_max"]
    if n >= 2 and upper(cap) > 0:
        total = _smaller_by_rows(total, b, n, cap, L + rho_beta * IV.sqrt(cap), certificate, "row_by_row")
    if terms["several"]:
        # step 9 applies where step 7 does and is at most step 7 at the same splits: then step 7 is not formed
        centred = centred_head_rows(bounds, b)
        coupled = bounds.coupled_rows(b, apart=centred is None) + L * IV.sqrt(terms["kappa"])
        certificate["coupled_rows"] = upper(coupled)
        total = coupled if upper(coupled) < upper(total) else total
        own = OwnKeyTerms(bounds, coupled=False)           # steps 8 and 10 share b' (certified at most once)
        if centred is not None:
            merged = _centred_merged(bounds, b, centred, own)
            centred = centred + L * IV.sqrt(terms["kappa"])
            certificate["centred_rows"] = upper(centred)
            total = centred if upper(centred) < upper(total) else total
            if merged is not None:
                merged = merged + L * IV.sqrt(terms["kappa"])
                certificate["centred_merged_rows"] = upper(merged)
                total = merged if upper(merged) < upper(total) else total
        merged = _own_key_head(own, L * IV.sqrt(terms["kappa"]), total)
        if merged is not None:
            certificate.update(own_key_rows=upper(merged))
            total = merged if upper(merged) < upper(total) else total
    return sdp_value(name, upper(total), True, certificate, "eig", time.perf_counter() - started, "certified",
                     _PROVENANCE)


def _centred_merged(bounds: PositionalHeadBounds, b, centred, own: OwnKeyTerms):
    """Step 10 of the module docstring: ``||S + cov||`` by step 9 with the own key of every row with two keys merged
    into its query part, else of the first such row alone (step 8; ``own`` the head's :class:`~.own_key.OwnKeyTerms`),
    an interval, or None where the merge does not apply, ``b'`` (a float guess) exceeds 1.2 ``b`` (then every merged
    row's query part rises more than its own key's part falls), or neither float estimate at that guess is 0.5% below
    ``centred``; only then is ``b'`` certified and the form bounded."""
    if not own.applies:
        return None
    guess = own.estimate()
    guess = float(upper(own.query_term)) if guess is None else min(guess, float(upper(own.query_term)))
    with_query = [i for i in range(bounds.rows.n) if bounds.rows.key_counts[i] >= 2]
    if guess > 1.2 * float(upper(b)) or not with_query:
        return None
    for rows in (frozenset(with_query), frozenset(with_query[:1])):
        estimate = centred_head_rows(bounds, b, merged=rows, b_merged=IV.mpf(guess), estimate=True)
        if estimate is not None and estimate < 0.995 * float(upper(centred)):
            own.refine()
            return centred_head_rows(bounds, b, merged=rows, b_merged=own.query_term)
    return None


def _own_key_head(own: OwnKeyTerms, mean, total):
    """Step 8 of the module docstring for one head: the merged row split plus the mean term ``mean``, an interval, or
    None when the merge does not apply or its float guess (``b'_1b`` at step 1b's a, which the search for a can lower
    by a few per cent) leaves it 5% above ``total`` (then the certificate of ``b'_1b``, the costly part, is not
    formed)."""
    if not own.applies:
        return None
    guess = own.estimate()
    trial = own.head_rows(IV.mpf(guess) if guess is not None and guess < upper(own.query_term) else None)
    if trial is None or upper(trial + mean) >= 1.05 * upper(total):
        return None
    own.refine()
    merged = own.head_rows()
    return None if merged is None else merged + mean


def _smaller_by_rows(total, b, n: int, cap, W, certificate: dict, key: str):
    """The smaller of ``total`` and the row-by-row form (step 5: query term ``b``, at most ``top_count(n, cap)``
    rows with a covariance part, each row at most ``W``); records the row-by-row value under ``key``."""
    rows = largest_over_shares(b, n, top_count(n, cap), n * W ** 2, b * W)
    certificate[key] = upper(rows)
    return rows if upper(rows) < upper(total) else total
