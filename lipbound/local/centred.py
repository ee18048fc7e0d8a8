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

where reading ``Omega_i - M_i`` as one matrix also pays ``||M_i e|| ||M_i f||``.  z's change on U is the keys' and
queries' movements alone and m is 0 at X (:func:`~lipbound.local.zeta_changes.centred_parts`).  ``m_hi`` is also a
row-scaled norm of z: ``|m_hi(f)| = |sum_l dp_hil z_hil(f)| <= (sum_l delta_hil^2 / p+_hil)^(1/2) (sum_l p+_hil
z_hil(f)^2)^(1/2)`` (Cauchy-Schwarz with the weights' upper ends p+).  The first group's rows ``p_ij zeta_ij`` split
the same way.  Every norm of z's scaled rows at X comes from the Gram matrix the curvature bound already has.
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray
from .zeta_changes import Changes

__all__ = ["CentredRows"]

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

    def covariance(self, facts: dict, weight: np.ndarray, omega: np.ndarray, centred: Changes,
                   weights: Changes) -> float:
        """``chi_II`` with the score changes centred at X's weights (lemma ``curvature-covariance-centred``):
        ``||[(omega_i + mu_i) Omega_i]|| + ||[omega_i M_i]||``, ``Omega_i`` the rows ``w_hij z_hij`` and ``M_i`` the
        rows ``w_hij m_hi`` of query i (``w`` = ``weight``, the upper ends of ``(p_ij ||u_ij||)^(1/2)`` on U),
        ``omega_i >= ||Omega_i||`` and ``mu_i >= ||M_i||`` on U; ``omega`` holds ``||Omega_i(X)||``, ``centred`` and
        ``weights`` are :func:`~lipbound.local.zeta_changes.centred_parts`, ``facts`` those of
        :func:`~lipbound.local.bounds.attention_bounds` on U.  ``M_i`` is bounded by its blocks and through z's rows
        (:meth:`through`); the smaller bound counts."""
        through = self.through(facts, weight)                                                   # (H, n, n)
        moved = IntervalArray(centred.norms(weight, 1))
        own = weights.norms(weight, 1)
        spread = IntervalArray(omega) + moved                                                   # omega_i
        second = [weights.norms((spread[None, :, None] * IntervalArray(weight)).hi)]
        if through is not None:
            through_moved = IntervalArray(centred.norms(through, 1))
            by_rows = IntervalArray(self.rows_at_x(through)) + through_moved
            own = np.minimum(own, by_rows.hi)
            second.append(self._scaled(spread[None, :, None] * IntervalArray(through), centred, spread * through_moved))
        mu = IntervalArray(own)                                                                 # mu_i
        outer = spread + mu                                                                     # omega_i + mu_i
        first = self._scaled(outer[None, :, None] * IntervalArray(weight), centred, outer * moved)
        second.append((spread * mu).norm_upper().item())
        return (IntervalArray(first) + IntervalArray(min(second))).hi.item()

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
        ``|m_hi(f)| = |sum_l dp_hil z_hil(f)| <= (sum_l delta_hil^2 / p+_hil)^(1/2) (sum_l p+_hil z_hil(f)^2)^(1/2)``
        (Cauchy-Schwarz with weights p+, the upper ends of the weights on U; dp_hil = 0 where p+_hil = 0), and
        ``||M_i f||^2 = sum_h (sum_j w_hij^2) m_hi(f)^2``, so ``t_hil = (sum_j w_hij^2)^(1/2) (sum_l delta_hil^2 /
        p+_hil)^(1/2) (p+_hil)^(1/2)``; ``weight`` (H, n, n) bounds ``w``.  None where a weight's change exceeds its
        upper end (rounding only: ``delta <= p+``)."""
        delta, p_plus = facts["delta"], facts["p_hi"]
        # delta^2 / p+ <= delta where delta <= p+ (a weight's change is at most its upper end): used where p+ is
        # too small to divide by (hidden keys, p+ = 0, and weights far below the float range's square root)
        divisible = p_plus >= _SMALLEST_DIVISOR
        ratio = (IntervalArray(delta).square() / IntervalArray(np.where(divisible, p_plus, 1.0))).hi
        ratio = np.where(divisible, ratio, np.where(delta <= p_plus, delta, np.inf))
        kappa = IntervalArray(ratio).sum(axis=-1).sqrt()                                        # (H, n)
        rows = IntervalArray(weight).square().sum(axis=-1).sqrt()                               # (sum_j w_hij^2)^(1/2)
        scales = ((rows * kappa)[..., None] * IntervalArray(p_plus).sqrt()).hi
        return scales if np.all(np.isfinite(scales)) else None
