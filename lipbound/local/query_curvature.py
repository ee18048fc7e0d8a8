"""The curvature bound of an attention layer read output token by output token (lemma ``curvature-per-query``).

Theorem ``local-attention-curvature`` writes ``D^2A[e, f]_i``, output token i's row of the second derivative, as three
groups that read only query i's weights, score changes and value spreads: the first ``sum_h (b_hi^T E) A_h`` (plus the
same with e and f exchanged) with ``b_hij = p_ij zeta_ij(f)``, the second ``sum_(h,j) p_ij zeta_ij(e) zeta_ij(f)
u_ij``, the third ``c sum_(h,j) p_ij (e_i Qt_h f_j^T + f_i Qt_h e_j^T) u_ij``.  For unit e, f (Frobenius) and every
Y where the facts of the neighbourhood hold,

    ||D^2A(Y)[e, f]_i|| <= chi_I,i + chi_II,i + chi_III,i,
    chi_I,i   = 2 a sup_U ||Theta^(i)||                    (a = min(||[A_1 ... A_H]||, ||[A_1; ...; A_H]||)),
    chi_II,i  = sup_U ||Omega_i||^2, or with the changes centred at X's weights omega_i (omega_i + 2 mu_i) and
                omega'_i^2 (lemma curvature-covariance-spread), the smaller,
    chi_III,i = 2 c min(||(sum_h ||Qt_h|| p+_ij ||u_ij||)_j||, the heads joined, the values' and heads' spectral
                        forms at query i's own spreads),

``Theta^(i)`` the rows ``p_ij zeta_ij`` of query i (rows (h, j)) and ``Omega_i``, ``M_i``, ``omega_i``, ``mu_i`` as in
lemma ``curvature-covariance-centred`` (the rows ``p_ij zeta_ij`` also as in lemma ``curvature-rows-variance``):
each is the query's own term of the theorem's groups before they are summed
over the queries (the whole output's bound is at least the largest of them).  Taylor's remainder of output token i
then follows as in lemma ``attention-reach-remainder`` with ``chi_i`` for ``chi``
(:meth:`~lipbound.local.curvature.CurvatureIntegral.query_integral`), so each token's reach after the attention pays
its own remainder (lemma ``attention-token-reach``) instead of the whole output's.
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import spectral_norm_upper_large
from .centred import weighted_reach

__all__ = ["query_groups", "row_chis"]


def row_chis(groups: np.ndarray, whole: tuple) -> np.ndarray:
    """``chi_i = min(chi_I,i, chi_I) + min(chi_II,i, chi_II) + min(chi_III,i, chi_III)`` per output token i (n,),
    rounded up: ``groups`` (3, n) the upper ends of :func:`query_groups`, ``whole`` the whole output's ``(chi_I, chi_II,
    chi_III)`` where the same facts hold (:meth:`~lipbound.local.curvature.AttentionCurvature.chis`).

    Lemma ``curvature-row-whole``: each group of the second derivative is a map ``(e, f) -> (g_1, ..., g_n)`` into the
    output's rows, and ``||g_i|| <= (sum_k ||g_k||^2)^(1/2)``, so a bound on a group's whole output bounds each of its
    rows.  The whole output's third group has the Kronecker form over all queries (lemma curvature-third-kronecker),
    which the queries' own forms do not: on MiniLM's layer 0 around "The cat sat on the mat." at X it is 2.64 where the
    queries' own are 3.40-4.88."""
    totals = IntervalArray(np.zeros(groups.shape[1]))
    for own, other in zip(groups, whole):
        totals = totals + IntervalArray(np.minimum(own, other))
    return totals.hi


def query_groups(curvature, bounds, r: np.ndarray, frobenius: float | None = None) -> tuple:
    """``(chi_I,i, chi_II,i, chi_III,i)``, three (n,) interval arrays (the module docstring's groups, each enclosed):
    their sum bounds ``sup ||D^2A(Y)[e, f]_i||`` over unit e, f and the Y where ``bounds.facts`` hold, per output token
    i.  ``curvature`` an unfolded :class:`~lipbound.local.curvature.AttentionCurvature`, ``bounds`` those of
    :func:`~lipbound.local.bounds.attention_bounds` on the token balls of radii ``r``, ``frobenius`` a bound on ``||Y -
    X||_F`` there where known (as :meth:`~lipbound.local.curvature.AttentionCurvature.chis`)."""
    if curvature.fold is not None:
        raise ValueError("query_groups reads an unfolded curvature bound")
    facts, n = bounds.facts, curvature.n
    size, change, centred = curvature._functional_deviation(facts, r, frobenius)
    p_plus = IntervalArray(facts["p_hi"])
    drift = IntervalArray(facts["value_shift"][:, None, :]) + IntervalArray(facts["head_movement"][:, :, None])
    rho_hi = IntervalArray((curvature.rho + drift).hi)                               # ||u_ij|| on U
    reach = IntervalArray(weighted_reach(facts, rho_hi.hi, curvature.value_gaps))    # p_ij ||u_ij|| on U (H, n, n)
    weight = reach.sqrt().hi                                                         # (p_ij ||u_ij||)^(1/2) on U
    at_x = curvature.E.P.magnitude
    # chi_I: query i's rows of Theta, scaled at X plus the scales' change, or at their upper ends on U
    scale_moves = curvature._scale_moves(curvature.E.P, IntervalArray(facts["p_lo"], facts["p_hi"]), size)
    by_x = _on_u(curvature, change, at_x, scale_moves)
    if centred is None:
        by_upper = _on_u(curvature, change, p_plus.hi)
        omega = _on_u(curvature, change, weight)
        second = omega * omega
    else:   # zeta = z - m (lemma curvature-covariance-centred), z's and m's rows of the query apart
        z, m = _centred_parts(curvature, facts, p_plus.hi, *centred)
        variance = _on_u(curvature, centred[0], curvature.centred_rows.variance_scales(facts))
        by_upper = IntervalArray(np.minimum((z + m).hi, variance.hi))      # (lemma curvature-rows-variance)
        omega, mu = _centred_parts(curvature, facts, weight, *centred)
        second = omega * (omega + IntervalArray(2.0) * mu)
        if curvature.value_spread is not None:   # the m term through the values' weighted spread
            sigma = curvature.value_spread.on(facts, frobenius)
            scales = curvature.centred_rows.spread_scales(facts, weight, sigma)
            if scales is not None:   # omega'_i^2, omega'_i >= ||S_i z_i(Y)|| on U
                joint = _on_u(curvature, centred[0], scales)
                second = IntervalArray(np.minimum(second.hi, (joint * joint).hi))
    rows = IntervalArray(np.minimum(by_x.hi, by_upper.hi))
    first = IntervalArray(2.0) * IntervalArray(curvature.values_joint) * rows
    # chi_III: the theorem's per-query forms before their largest is taken
    spread = (IntervalArray(curvature.pair_norms) * reach).sum(axis=0).norm_upper()  # (n,)
    if not curvature.rotary:
        joined = (IntervalArray(curvature.scores_joint)
                  * IntervalArray(reach.swapaxes(0, 1).reshape(n, -1).norm_upper())).hi
        spread = np.minimum(spread, joined)
    gamma = curvature.output_spreads(facts)
    values, heads = curvature._values_joined(facts, r), curvature._heads_weighted(gamma)
    uniform = min(values, heads)
    spread = np.minimum(spread, uniform)
    # the form in use at query i's own spreads, where the largest over the queries is the one in use (the other form
    # at query i is not formed: a choice of work, one d x d norm per query)
    own = np.flatnonzero(spread >= uniform)
    if own.size:
        spread[own] = np.minimum(spread[own], _own_spectral_forms(curvature, facts, r, gamma, own,
                                                                  ("values",) if values <= heads else ("heads",)))
    third = IntervalArray(2.0) * IntervalArray(curvature.c) * IntervalArray(spread)
    return first, second, third


def _own_spectral_forms(curvature, facts: dict, r: np.ndarray, gamma: np.ndarray, queries: np.ndarray,
                        forms=("values", "heads")) -> np.ndarray:
    """Per query i in ``queries``, the smaller of ``||W_O|| ||sum_h beta_hi^2 Qt_h Qt_h^T||^(1/2)`` ("values") and
    ``(sum_h gamma_hi)^(1/2) ||sum_h gamma_hi Qt_h Qt_h^T||^(1/2)`` ("heads") among ``forms`` (lemma
    curvature-values-spectral at query i; ``beta``, ``gamma`` (H, n) the values' and outputs' spreads on U,
    :meth:`~lipbound.local.curvature.AttentionCurvature.value_spreads` and ``output_spreads``), rounded up; inf where
    no form applies (a single head, rotations)."""
    values = np.full(len(queries), np.inf)
    heads = np.full(len(queries), np.inf)
    grams = curvature.score_grams
    if curvature.output_norm is not None and "values" in forms:
        beta = IntervalArray(curvature.value_spreads(facts, r))
        squares = (beta * beta).hi
        for k, i in enumerate(queries):
            top = spectral_norm_upper_large(IntervalArray(squares[:, i]).einsum("h,hab->ab", grams).to_enclosure())
            values[k] = (IntervalArray(curvature.output_norm) * IntervalArray(top).sqrt()).hi.item()
    if not (curvature.rotary or curvature.fold is not None) and "heads" in forms:
        totals = IntervalArray(gamma).sum(axis=0).hi
        for k, i in enumerate(queries):
            top = spectral_norm_upper_large(IntervalArray(gamma[:, i]).einsum("h,hab->ab", grams).to_enclosure())
            heads[k] = (IntervalArray(totals[i]).sqrt() * IntervalArray(top).sqrt()).hi.item()
    return np.minimum(values, heads)


def _on_u(curvature, change, scales: np.ndarray, *moves) -> IntervalArray:
    """``sup_U ||diag(s_i) zeta_i(Y)||`` per query i (n,): query i's scaled rows at X (the curvature bound's Gram
    matrix) plus their change on U as ``change`` bounds it (:class:`~lipbound.local.zeta_changes.Changes`, with the
    scales' own ``moves`` where given)."""
    return IntervalArray(curvature.centred_rows.rows_at_x(scales)) + IntervalArray(change.norms(scales, 1, *moves))


def _centred_parts(curvature, facts: dict, scales: np.ndarray, centred, weights) -> tuple:
    """``(sup_U ||diag(s_i) z_i(Y)||, sup_U ||diag(s_i) m_i(Y)||)`` per query i (two (n,) interval arrays) with the
    score changes centred at X's weights (lemma curvature-covariance-centred): z's rows at X plus their change, and m's
    rows the smaller of their blocks' bound and the rows of z scaled by
    :meth:`~lipbound.local.centred.CentredRows.through`."""
    z = _on_u(curvature, centred, scales)
    m = weights.norms(scales, 1)
    through = curvature.centred_rows.through(facts, scales)
    if through is not None:
        m = np.minimum(m, _on_u(curvature, centred, through).hi)
    return z, IntervalArray(m)
