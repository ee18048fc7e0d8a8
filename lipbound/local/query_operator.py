"""How much output token i's row of an attention layer's second derivative can change over a neighbourhood U of X
(lemma ``curvature-row-change``): the half of the operator route that carries a bound at X over U.

Row i is ``D^2A(Y)[e, f]_i = I_i + II_i + III_i`` (theorem ``local-attention-curvature``, lemma
``curvature-per-query``), each group exact at every Y with Y's weights ``p_ij``, score changes ``zeta_ij`` and rows
``u_ij``.  With ``w_ij = p_ij u_ij``, ``dw_ij = ||w_ij(Y) - w_ij(X)|| <= delta_ij ||u_ij(Y)|| + p_ij(X) ||u_ij(Y) -
u_ij(X)||`` and ``Theta_i`` the rows ``p_ij zeta_ij`` of query i, for unit e, f (Frobenius),

    ||D^2A(Y)[e, f]_i - D^2A(X)[e, f]_i|| <= kappa_I,i + kappa_II,i + kappa_III,i,
    kappa_I,i   = 2 a sup_U ||Theta_i(Y) - Theta_i(X)||,
    kappa_II,i  = sup_U ||diag(dw_i)^(1/2) zeta_i(Y)||^2
                  + sup_U ||diag(||w_i(X)||)^(1/2) (zeta_i(Y) - zeta_i(X))||
                    (sup_U ||diag(||w_i(X)||)^(1/2) zeta_i(Y)|| + ||diag(||w_i(X)||)^(1/2) zeta_i(X)||),
    kappa_III,i = 2 c min(||(sum_h ||Qt_h|| dw_hij)_j||, ||[Qt_1 ... Qt_H]|| ||(dw_hij)_(h,j)||).

Proof.  The first group is linear in ``Theta_i`` (``sum_h (b_hi^T E) A_h`` and its mirror, ``b_hij = p_ij
zeta_ij(f)``), so its change is the same map of ``Theta_i(Y) - Theta_i(X)``, at most ``2 a`` times its norm.  The
second group's change is ``sum_t (w_t(Y) - w_t(X)) zeta_t(Y)(e) zeta_t(Y)(f) + sum_t w_t(X) (zeta_t(Y)(e) zeta_t(Y)(f)
- zeta_t(X)(e) zeta_t(X)(f))`` over the rows t = (h, j); for weights ``c_t >= 0`` and functionals ``alpha_t, beta_t``,
``||sum_t v_t alpha_t beta_t|| <= sum_t ||v_t|| |alpha_t| |beta_t| <= ||diag(c)^(1/2) alpha|| ||diag(c)^(1/2) beta||``
with ``c_t = ||v_t||`` (Cauchy-Schwarz), and ``ab - a'b' = (a - a') b + a' (b - b')``.  The third group is linear in
``w``; its change is the group's form with ``dw`` for ``p ||u||`` (as lemma curvature-per-query bounds it).  Each
change of ``zeta``'s rows is that of :class:`~lipbound.local.zeta_changes.Changes`, the same bounds the curvature bound
adds to its rows at X.
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray
from .query_curvature import _on_u

__all__ = ["change_groups", "query_changes"]


def query_changes(curvature, bounds, r: np.ndarray, frobenius: float | None = None) -> np.ndarray:
    """``kappa_i >= sup_U ||D^2A(Y)[e, f]_i - D^2A(X)[e, f]_i||`` over unit e, f, per output token i (n,), rounded up
    (module docstring); arguments as :func:`~lipbound.local.query_curvature.query_groups` (an unfolded
    :class:`~lipbound.local.curvature.AttentionCurvature`, the bounds of
    :func:`~lipbound.local.bounds.attention_bounds` on the token balls of radii ``r``, ``frobenius`` a bound on ``||Y -
    X||_F`` there where known)."""
    first, second, third = change_groups(curvature, bounds, r, frobenius)
    return (first + second + third).hi


def change_groups(curvature, bounds, r: np.ndarray, frobenius: float | None = None) -> tuple:
    """``(kappa_I,i, kappa_II,i, kappa_III,i)`` of :func:`query_changes`, three (n,) interval arrays, each bounding
    its group's change alone (module docstring)."""
    if curvature.fold is not None:
        raise ValueError("query_changes reads an unfolded curvature bound")
    facts, n = bounds.facts, curvature.n
    size, change, _ = curvature._functional_deviation(facts, r, frobenius)
    p_x = curvature.E.P.magnitude                                                       # p_ij(X), (H, n, n)
    drift = IntervalArray(facts["value_shift"][:, None, :]) + IntervalArray(facts["head_movement"][:, :, None])
    rho_u = IntervalArray((curvature.rho + drift).hi)                                   # ||u_ij(Y)||
    moved_w = (IntervalArray(facts["delta"]) * rho_u + IntervalArray(p_x) * drift).hi   # dw_ij
    # kappa_I: Theta's rows' change, the weights' moves with zeta(Y) and X's weights with zeta's change
    scale_moves = curvature._scale_moves(curvature.E.P, IntervalArray(facts["p_lo"], facts["p_hi"]), size)
    first = IntervalArray(2.0) * IntervalArray(curvature.values_joint) \
        * IntervalArray(change.norms(p_x, 1, scale_moves))
    # kappa_II: the weights' change on zeta(Y) twice, X's weights on zeta's change and both ends
    root_moved = IntervalArray(moved_w).sqrt().hi
    on_moved = _on_u(curvature, change, root_moved)
    root_x = (IntervalArray(p_x) * IntervalArray(curvature.rho.hi)).sqrt().hi
    both_ends = _on_u(curvature, change, root_x) + IntervalArray(curvature.centred_rows.rows_at_x(root_x))
    second = on_moved * on_moved + IntervalArray(change.norms(root_x, 1)) * both_ends
    # kappa_III: the third group's per-query form with the rows' change for p ||u||
    spread = (IntervalArray(curvature.pair_norms) * IntervalArray(moved_w)).sum(axis=0).norm_upper()   # (n,)
    if not curvature.rotary:
        joined = (IntervalArray(curvature.scores_joint)
                  * IntervalArray(IntervalArray(moved_w).swapaxes(0, 1).reshape(n, -1).norm_upper())).hi
        spread = np.minimum(spread, joined)
    third = IntervalArray(2.0) * IntervalArray(curvature.c) * IntervalArray(spread)
    return first, second, third
