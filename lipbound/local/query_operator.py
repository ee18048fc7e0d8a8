"""Output token i's row of an attention layer's second derivative as one operator: its bound at X
(:func:`operator_tops`, lemma ``curvature-row-operator``) and how much the row can change over a neighbourhood U of X
(:func:`query_changes`, lemma ``curvature-row-change``), the half that carries the bound at X over U.

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
from ..rigorous.linalg import Enclosure, lambda_max_upper_large
from .query_curvature import _on_u

__all__ = ["change_groups", "operator_tops", "query_changes"]


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


def _exact_products(left: list, right: list) -> IntervalArray:
    """``L_a^T R_b`` for every pair of heads (H, H, d_k, d_k), enclosed, from the weights' blocks (d, d_k) each."""
    def product(a, b):
        return IntervalArray.from_enclosure(Enclosure.exact(a.T) @ Enclosure.exact(b))
    return IntervalArray.stack([IntervalArray.stack([product(a, b) for b in right]) for a in left])


def operator_tops(E, target) -> np.ndarray:
    """``lambda_max(G_i(X))^(1/2) >= sup ||D^2A(X)[e, f]_i||`` over unit e, f, per output token i (n,), rounded up
    (lemma ``curvature-row-operator``), for an attention layer ``target`` of dot-product heads enclosed at X by ``E``
    (every key visible, unit masses); inf where that does not hold.

    Row i's second derivative is ``e^T H_i(w) f`` against a unit output direction w, ``H_i(w)`` the Hessian of ``w .
    A(X)_i``; ``||D^2A[e, f]_i|| = sup_w e^T H_i(w) f <= sup_w ||H_i(w)||_F = lambda_max(G_i)^(1/2)``, where ``w^T G_i
    w = ||H_i(w)||_F^2``.  Over the terms ``t = (h, j)`` (T = H n) with ``zeta_t`` query i's rows of zeta (blocks
    ``[m]`` of length d), ``Gz = [zeta_t . zeta_s]``, ``pp = [p_t p_s]``, ``[j_t = j_s]`` the same key, ``A_h = V^h
    W_O^h``, ``Qt_h = W_Q^h W_K^h^T``, ``u_t`` the rows ``v_j - f_i`` in the output space and ``c`` the score scale,

        G_i = 2 sum_(t,s) pp Gz [j_t = j_s] A_(h_t)^T A_(h_s) + 2 sym sum_(t,s) pp a_ts a_st^T + U^T K U
              + 4 sym sum_(t,s) pp A_(h_t)^T b_ts u_s^T,

    ``a_ts = A_(h_s)^T zeta_t[j_s]``, ``K = pp (Gz^2 + 2 c (q_ts + q_st) + 2 c^2 [j_t = j_s] (<Qt_(h_t), Qt_(h_s)> +
    [j_t = i] tr(Qt_(h_t) Qt_(h_s))))``, ``q_ts = zeta_s[i] . Qt_(h_t) zeta_s[j_t]``, ``b_ts = Gz_st zeta_s[j_t] + c
    [j_t = i] Qt_(h_s) zeta_t[j_s] + c [j_t = j_s] Qt_(h_s)^T zeta_t[i]`` (sym S = S + S^T): the first two terms are
    the first group's ``||C Z^T + Z C^T||_F^2``, the third the second and third groups', the last their cross terms.
    Every factor is enclosed at X; ``zeta_hj[m] = c ((delta_jm - p_hm) W_K q_i + delta_mi W_Q (k_j - kappa_hi))``.
    Through the heads' coordinates: ``A_h = V^h W_O^h`` and ``u_t = W_O^(h_t)^T u~_t`` (the rows in the value space)
    give ``G_i = W_O^T M_i W_O`` with ``M_i`` (H d_k x H d_k) the same four terms with ``V^h^T zeta_t[m]`` for ``A_h^T
    zeta_t[m]`` and ``u~`` for ``u``; ``q_ts = (W_Q^(h_t)^T zeta_s[i]) . (W_K^(h_t)^T zeta_s[j_t])``, ``V^(h_t)^T
    Qt_(h_s) = (V^(h_t)^T W_Q^(h_s)) W_K^(h_s)^T`` and its mirror.  Cost about ``T^2 d_k (d + H d_k)`` interval
    products a query (2.9 CPU s for MiniLM's layer 0 at n = 9, where the Hessians' ``T^2 d^2`` took 44)."""
    engine = E.engine
    if E.rotations is not None or engine.W_O is None or E.visible is not None or np.any(E.masses != 1.0):
        return np.full(E.n, np.inf)
    H, n, d = engine.H, E.n, engine.d
    T, c = H * n, E.c
    weights = [engine.head_weights(h)[:3] for h in range(H)]
    W_Q, W_K, W_V = ([w[k] for w in weights] for k in range(3))
    k = W_Q[0].shape[1]
    if any(w.shape[1] != k for w in W_V):
        return np.full(n, np.inf)
    VV, VQ, VK = (_exact_products(W_V, other) for other in (W_V, W_Q, W_K))         # (H, H, k, k)
    joined = {name: np.concatenate(blocks, axis=1) for name, blocks in (("V", W_V), ("Q", W_Q), ("K", W_K))}
    Qt = IntervalArray.stack([IntervalArray.from_enclosure(Enclosure.exact(q) @ Enclosure.exact(key.T))
                              for q, key in zip(W_Q, W_K)])                          # (H, d, d)
    inner, traces = Qt.einsum("hab,gab->hg", Qt), Qt.einsum("hab,gba->hg", Qt)
    O = np.concatenate([target.output_block(h) for h in range(H)])                 # W_O, (H k, d_out)
    hh, jj = np.repeat(np.arange(H), n), np.tile(np.arange(n), H)
    same = IntervalArray((jj[:, None] == jj[None, :]) * 1.0)
    index = np.arange(n)
    tops = np.empty(n)
    for i in range(n):
        p = E.P[:, i, :].reshape(T)
        pp = p.expand(1) * p.expand(0)
        U = (E.V - E.F[:, i:i + 1, :]).reshape(T, k)                                   # u~_t
        beta = E.norms.w[:, i, 0, :]                                                   # W_K q_i, (H, d)
        alpha = E.norms.key_vectors[:, 0, :, :]                                        # W_Q k_j, (H, n, d)
        centred = alpha - E.P[:, i, :].einsum("hj,hjd->hd", alpha).expand(1)
        spread = IntervalArray(np.eye(n)).expand(0) - E.P[:, i, :].expand(1)           # delta_jm - p_m, (H, j, m)
        Z = spread.expand(-1) * beta.expand(1).expand(1)
        lo, hi = Z.lo.copy(), Z.hi.copy()
        own = Z[:, :, i, :] + centred
        lo[:, :, i, :], hi[:, :, i, :] = own.lo, own.hi
        Z = (c * IntervalArray(lo, hi)).reshape(T, n, d)                               # zeta_t[m]
        flat = Z.reshape(T, n * d)
        Gz = flat.einsum("tm,sm->ts", flat)
        ZV, ZK = (Z.reshape(T * n, d).matmul(joined[name]).reshape(T, n, H, k) for name in ("V", "K"))
        ZQ = Z[:, i, :].matmul(joined["Q"]).reshape(T, H, k)                          # W_Q^g^T zeta_t[i]
        # the first group: 2 sum_(a,b) W_ab V^a^T V^b, W_ab = sum_j (pp Gz)[(a, j), (b, j)]
        paired = (pp * Gz).reshape(H, n, H, n)
        W = IntervalArray(paired.lo[:, index, :, index], paired.hi[:, index, :, index]).sum(axis=0)   # (H, H)
        M = (IntervalArray(2.0) * W.expand(-1).expand(-1) * VV).swapaxes(1, 2).reshape(H * k, H * k)
        # pairs: block (h_s, h_t) sum pp_ts v_ts v_st^T, v_ts = V^(h_s)^T zeta_t[j_s]
        v = ZV[:, jj, hh, :]                                                           # (t, s, k)
        left = (pp.expand(-1) * v).reshape(H, n, H, n, k)
        right = v.swapaxes(0, 1).reshape(H, n, H, n, k)
        pairs = left.einsum("anbmk,anbml->bkal", right).reshape(H * k, H * k)
        M = M + pairs + pairs.swapaxes(0, 1)
        # the second and third groups: block (h_t, h_s) sum K_ts u~_t u~_s^T
        q = (ZQ[:, hh, :] * ZK[:, jj, hh, :]).sum(axis=-1).swapaxes(0, 1)              # q_ts
        kinds = inner[hh][:, hh] + IntervalArray((jj[:, None] == i) * 1.0) * traces[hh][:, hh]
        K = pp * (Gz * Gz + IntervalArray(2.0) * c * (q + q.swapaxes(0, 1))
                  + IntervalArray(2.0) * c * c * same * kinds)
        weighted = K.reshape(H, n, H, n).einsum("anbm,bml->anbl", U.reshape(H, n, k))   # sum_(s in b) K_ts u~_s
        M = M + U.reshape(H, n, k).einsum("ank,anbl->akbl", weighted).reshape(H * k, H * k)
        # the cross terms: block (h_t, h_s) sum pp_ts V^(h_t)^T b_ts u~_s^T
        b = ZV[:, jj, hh, :].swapaxes(0, 1) * Gz.swapaxes(0, 1).expand(-1)            # Gz_st V^(h_t)^T zeta_s[j_t]
        rows = np.flatnonzero(jj == i)
        keyed = ZK[rows][:, jj, hh, :]                                                 # W_K^(h_s)^T zeta_t[j_s]
        lifted = VQ[hh[rows]][:, hh].einsum("tskl,tsl->tsk", keyed)                   # V^(h_t)^T Qt_(h_s) zeta_t[j_s]
        lo, hi = b.lo.copy(), b.hi.copy()
        extra = b[rows] + c * lifted
        lo[rows], hi[rows] = extra.lo, extra.hi
        b = IntervalArray(lo, hi)
        turned = VK[hh].einsum("tgkl,tgl->tgk", ZQ)                                    # V^(h_t)^T Qt_g^T zeta_t[i]
        b = b + c * same.expand(-1) * turned[:, hh, :]
        cross = (pp.expand(-1) * b).reshape(H, n, H, n, k).einsum("anbmk,bml->akbl", U.reshape(H, n, k))
        cross = cross.reshape(H * k, H * k)
        M = M + IntervalArray(2.0) * (cross + cross.swapaxes(0, 1))
        G = M.lmatmul(O.T).matmul(O)
        G = (G + G.swapaxes(0, 1)) * IntervalArray(0.5)
        tops[i] = IntervalArray(max(lambda_max_upper_large(G.to_enclosure()), 0.0)).sqrt().hi.item()
    return tops
