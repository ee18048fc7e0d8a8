"""The curvature bound's rows with the score changes centred at X's weights (lemma ``curvature-covariance-centred``).

At a point Y of U write ``ds_ij`` the score changes at Y, ``zeta_ij = ds_ij - sum_l p_il(Y) ds_il`` (the centring of
theorem ``local-attention-curvature``) and ``z_ij = ds_ij - sum_l p_il(X) ds_il`` (centred with X's weights).  Then
``zeta_ij = z_ij - m_i`` with ``m_i = sum_l (p_il(Y) - p_il(X)) ds_il``, the same for every key j, and since
``sum_j p_ij u_ij = 0``

    sum_j p_ij zeta_ij(e) zeta_ij(f) u_ij = sum_j p_ij z_ij(e) z_ij(f) u_ij - m_i(f) V_i(e) - m_i(e) V_i(f),
    V_i(e) = sum_j p_ij z_ij(e) u_ij.

With ``w_hij >= (p_ij ||u_ij||)^(1/2)`` on U, ``Omega_i`` the rows ``w_hij z_hij`` and ``M_i`` the rows ``w_hij m_hi``
of query i (rows (h, j)), Cauchy-Schwarz over (h, j) bounds the query's second group by ``||Omega_i e|| ||Omega_i
f|| + ||M_i f|| ||Omega_i e|| + ||M_i e|| ||Omega_i f||``, hence (Minkowski over the queries)

    chi_II <= ||[(omega_i + mu_i) Omega_i]_i|| + ||[omega_i M_i]_i||,   omega_i >= ||Omega_i||, mu_i >= ||M_i||,

where reading ``Omega_i - M_i`` as one matrix also pays ``||M_i e|| ||M_i f||`` (each query's own bound is ``omega_i
(omega_i + 2 mu_i)``).  Lemma ``curvature-covariance-spread`` pays the m term through the values' weighted spread
instead (:class:`ValueSpread`, :meth:`CentredRows.spread_covariance`): one row-scaled norm of z, the whole output's
``chi_II`` where these forms are formed.  z's change on U is the keys' and
queries' movements alone and m is 0 at X (:func:`~lipbound.local.zeta_changes.centred_parts`).  ``m_hi`` is also a
row-scaled norm of z: ``|m_hi(f)| = |sum_l dp_hil z_hil(f)| <= (sum_l delta_hil^2 / p+_hil)^(1/2) (sum_l p+_hil
z_hil(f)^2)^(1/2)`` (Cauchy-Schwarz with the weights' upper ends p+).  The first group's rows ``p_ij zeta_ij``
split the same way, or without m through the weights' variance (lemma ``curvature-rows-variance``).  Every norm of
z's scaled rows at X comes from the Gram matrix the curvature bound already has.
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.batched import interval_spectral_norms_upper
from .zeta_changes import Changes

__all__ = ["CentredRows", "ValueSpread", "weight_ratios", "weighted_reach"]

#: Weights' upper ends below this are not divided by (:meth:`CentredRows.through`): ``delta^2 / p+`` stays finite.
_SMALLEST_DIVISOR = 1e-150


class CentredRows:
    """The forms of lemma ``curvature-covariance-centred`` (module docstring) over ``zeta_rows`` (the Gram matrix of
    zeta's rows (h, i, j) at X, :class:`~lipbound.rigorous.linalg.RowGram` or the split bound) and ``query_rows``, the
    indices of each query's rows (h, j)."""

    def __init__(self, zeta_rows, query_rows: list):
        self.zeta_rows, self.query_rows = zeta_rows, query_rows

    def rows_at_x(self, scales: np.ndarray) -> np.ndarray:
        """``||diag(s_i) zeta_i(X)||`` per query i (n,): query i's rows (h, j) of zeta at X scaled by ``scales`` (H, n,
        n), rounded up, from the Gram matrix of the rows."""
        return np.array([self.zeta_rows.norm_upper(scales[:, i].ravel(), rows)
                         for i, rows in enumerate(self.query_rows)])

    def rows(self, facts: dict, scales: np.ndarray, centred: Changes, weights: Changes) -> float:
        """``sup_U ||diag(s) zeta(Y)||`` for row scales s (H, n, n) fixed on U through ``zeta = z - m`` (lemma
        ``curvature-covariance-centred``): ``||diag(s) z(Y)||`` plus the rows ``s_hij m_hi``, the latter the smaller of
        their blocks' bound and the rows of z scaled by :meth:`through`."""
        rows = self._scaled(IntervalArray(scales), centred, IntervalArray(centred.norms(scales, 1)))
        moved = weights.norms(scales)
        through = self.through(facts, scales)
        if through is not None:
            moved = min(moved, self._scaled(IntervalArray(through), centred, IntervalArray(centred.norms(through, 1))))
        return (IntervalArray(rows) + IntervalArray(moved)).hi.item()

    def _scaled(self, scales: IntervalArray, centred: Changes, per_query: IntervalArray) -> float:
        """``sup_U ||diag(s) z(Y)||`` for row scales s (H, n, n): the rows at X plus their change, the latter over all
        rows or as the queries' changes ``per_query`` (n,) stacked."""
        s = scales.hi
        change = min(centred.norms(s), per_query.norm_upper().item())
        return (IntervalArray(self.zeta_rows.norm_upper(s.ravel())) + IntervalArray(change)).hi.item()

    @staticmethod
    def through(facts: dict, weight: np.ndarray) -> np.ndarray | None:
        """Row scales ``t_hil``, ``||M_i f|| <= ||diag(t_hi.) z_hi.(f)||`` on U (lemma curvature-covariance-centred):
        ``|m_hi(f)| = |sum_l dp_hil z_hil(f)| <= kappa_hi (sum_l p+_hil z_hil(f)^2)^(1/2)`` (:func:`weight_ratios`), and
        ``||M_i f||^2 = sum_h (sum_j w_hij^2) m_hi(f)^2``, so ``t_hil = (sum_j w_hij^2)^(1/2) kappa_hi (p+_hil)^(1/2)``;
        ``weight`` (H, n, n) bounds ``w``.  None where a weight's change exceeds its upper end (rounding only)."""
        kappa = weight_ratios(facts)
        if kappa is None:
            return None
        rows = IntervalArray(weight).square().sum(axis=-1).sqrt()                               # (sum_j w_hij^2)^(1/2)
        scales = ((rows * IntervalArray(kappa))[..., None] * IntervalArray(facts["p_hi"]).sqrt()).hi
        return scales if np.all(np.isfinite(scales)) else None

    @staticmethod
    def spread_scales(facts: dict, weight: np.ndarray, sigma: np.ndarray) -> np.ndarray | None:
        """Row scales ``s_hij = (w_hij^2 + 2 sigma_hi kappa_hi p+_hij)^(1/2)`` (H, n, n) of lemma
        ``curvature-covariance-spread``: query i's second group is at most ``||S_i z_i(e)|| ||S_i z_i(f)||`` on U;
        ``weight`` (H, n, n) bounds ``(p_ij ||u_ij||)^(1/2)`` on U, ``sigma`` (H, n) is :meth:`ValueSpread.on`, kappa
        :func:`weight_ratios` (None where it is not finite)."""
        kappa = weight_ratios(facts)
        if kappa is None:
            return None
        cross = IntervalArray(2.0) * IntervalArray(sigma) * IntervalArray(kappa)                # (H, n)
        return (IntervalArray(weight).square() + cross.expand(-1) * IntervalArray(facts["p_hi"])).sqrt().hi

    def spread_covariance(self, facts: dict, weight: np.ndarray, sigma: np.ndarray, centred: Changes) -> float:
        """``chi_II`` by lemma ``curvature-covariance-spread``: ``||[omega_i S_i z_i]_i||`` on U with the row scales of
        :meth:`spread_scales` and ``omega_i >= ||S_i z_i(Y)||`` on U (z's rows at X plus their change, ``centred``);
        inf where kappa is not finite."""
        scales = self.spread_scales(facts, weight, sigma)
        if scales is None:
            return np.inf
        moved = IntervalArray(centred.norms(scales, 1))
        omega = IntervalArray(self.rows_at_x(scales)) + moved
        return self._scaled(omega[None, :, None] * IntervalArray(scales), centred, omega * moved)

    @staticmethod
    def variance_scales(facts: dict) -> np.ndarray:
        """Row scales ``(max_l p+_hil p+_hij)^(1/2)`` (H, n, n) with ``||diag(p) zeta(Y)(f)|| <= ||diag(s)
        z(Y)(f)||`` on U (lemma ``curvature-rows-variance``)."""
        p_hi = IntervalArray(facts["p_hi"])
        return (p_hi * IntervalArray(np.max(facts["p_hi"], axis=-1, keepdims=True))).sqrt().hi

    def variance_rows(self, facts: dict, centred: Changes) -> float:
        """``sup_U ||diag(p(Y)) zeta(Y)||`` through the weights' variance (lemma ``curvature-rows-variance``): z's rows
        scaled by :meth:`variance_scales`, at X plus their change on U."""
        scales = self.variance_scales(facts)
        return self._scaled(IntervalArray(scales), centred, IntervalArray(centred.norms(scales, 1)))


def weight_ratios(facts: dict) -> np.ndarray | None:
    """``kappa_hi >= (sum_l dp_hil^2 / p+_hil)^(1/2)`` (H, n) on U, ``dp = p(Y) - p(X)``, so that ``|sum_l dp_hil
    x_l| <= kappa_hi (sum_l p+_hil x_l^2)^(1/2)`` for every x (Cauchy-Schwarz with the weights' upper ends p+;
    dp_hil = 0 where p+_hil = 0); None where a weight's change exceeds its upper end (rounding only:
    ``delta <= p+``)."""
    delta, p_plus = facts["delta"], facts["p_hi"]
    # delta^2 / p+ <= delta where delta <= p+ (a weight's change is at most its upper end): used where p+ is
    # too small to divide by (hidden keys, p+ = 0, and weights far below the float range's square root)
    divisible = p_plus >= _SMALLEST_DIVISOR
    ratio = (IntervalArray(delta).square() / IntervalArray(np.where(divisible, p_plus, 1.0))).hi
    ratio = np.where(divisible, ratio, np.where(delta <= p_plus, delta, np.inf))
    kappa = IntervalArray(ratio).sum(axis=-1).sqrt().hi
    return kappa if np.all(np.isfinite(kappa)) else None


class ValueSpread:
    """``sigma_hi >= sup_U ||diag(p_i(Y))^(1/2) U_hi(Y)||_2`` (lemma ``curvature-covariance-spread``), ``U_hi`` the rows
    ``u_ij = v_j - f_i`` of query i in the output space: the weighted values' largest standard deviation.  For
    every fixed c, ``||diag(p_i)^(1/2) U_hi||_2^2 = max_|x|=1 sum_j p_ij ((v_j - f_i) . x)^2 <= max_|x|=1 sum_j p_ij
    ((v_j - c) . x)^2`` (the weighted mean minimises the weighted second moment), and with c = f_i(X), p <= p+ and Weyl

        sigma_hi = ||diag(p+_hi)^(1/2) U_hi(X)||_2 + ||diag(p+_hi)^(1/2) dV_h||_F,

    the last at most ``(sum_j p+_hij Delta v_hj^2)^(1/2)`` and, on a Frobenius ball of radius t, ``(max_j p+_hij)^(1/2)
    ||A_h|| t``.  The first from the Gram matrices ``U_hi(X) U_hi(X)^T`` (H, n, n, n), formed once.

    Parameters
    ----------
    u : IntervalArray (H, n, n, d_out)
        ``u_ij`` at X, enclosed.
    value_norms : ndarray (H,)
        ``||A_h||``, the heads' value maps into the output space, certified.
    """

    def __init__(self, u: IntervalArray, value_norms: np.ndarray):
        self.gram, self.value_norms = u.einsum("hijd,hikd->hijk", u), value_norms
        # (facts, frobenius, sigma) last formed: the whole output's bound and the queries' ask for the same
        self._last: tuple | None = None
        self._spread: tuple | None = None     # (p_hi, ||diag(p_hi)^(1/2) U_hi(X)||_2) last formed

    def at_x(self, p_hi: np.ndarray) -> np.ndarray:
        """``||diag(p+_hi)^(1/2) U_hi(X)||_2`` bounded above (H, n), from the Gram matrices at X (the last formed is
        kept: the head movement's bound and sigma read the same ``p_hi``)."""
        if self._spread is None or self._spread[0] is not p_hi:
            root = IntervalArray(IntervalArray(p_hi).sqrt().hi)                                  # (p+)^(1/2), up
            scaled = root.expand(-1) * root.expand(-2) * self.gram                                # (H, n, n, n)
            self._spread = (p_hi, IntervalArray(interval_spectral_norms_upper(scaled)).sqrt().hi)
        return self._spread[1]

    def on(self, facts: dict, frobenius: float | None = None) -> np.ndarray:
        """``sigma`` (H, n) where ``facts`` (of :func:`~lipbound.local.bounds.attention_bounds`) hold; ``frobenius``
        bounds ``||Y - X||_F`` there where known."""
        if self._last is not None and self._last[0] is facts and self._last[1] == frobenius:
            return self._last[2]
        at_x = IntervalArray(self.at_x(facts["p_hi"]))
        shift = IntervalArray(facts["value_shift"])                                               # (H, n(j))
        moved = (IntervalArray(facts["p_hi"]) * shift.square().expand(1)).sum(axis=-1).sqrt().hi
        if frobenius is not None:
            tall = IntervalArray(np.max(facts["p_hi"], axis=-1)).sqrt() * IntervalArray(self.value_norms).expand(-1)
            moved = np.minimum(moved, (tall * IntervalArray(float(frobenius))).hi)
        sigma = (at_x + IntervalArray(moved)).hi
        self._last = (facts, frobenius, sigma)
        return sigma


def weighted_reach(facts: dict, rho: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """``p_ij(Y) ||u_ij(Y)||`` bounded on U (H, n, n) (lemma ``curvature-weight-reach``): the smaller of ``p+_ij
    rho_ij`` (``rho`` bounds ``||u_ij||`` on U) and ``max_(p in [p-_ij, p+_ij]) p (1 - p) D_hij``, since ``u_ij = v_j -
    f_i = sum_(l != j) p_il (v_j - v_l)`` has norm at most ``(1 - p_ij) D_hij``, ``D_hij = max_l (||v_j - v_l|| at X +
    Delta v_j + Delta v_l)`` (``gaps`` (H, n, n) the distances at X, ``facts["value_shift"]`` the shifts on U); the
    maximum of ``p (1 - p)`` on an interval is at its point nearest 1/2."""
    shift = IntervalArray(facts["value_shift"])                                              # (H, n)
    spans = (IntervalArray(gaps) + shift.expand(-1) + shift.expand(1)).hi.max(axis=-1)       # D_hj, (H, n(j))
    nearest = np.clip(0.5, facts["p_lo"], facts["p_hi"])                                     # (H, n(i), n(j))
    paired = IntervalArray(nearest) * (IntervalArray(1.0) - IntervalArray(nearest)) * IntervalArray(spans).expand(1)
    return np.minimum((IntervalArray(facts["p_hi"]) * IntervalArray(rho)).hi, paired.hi)
