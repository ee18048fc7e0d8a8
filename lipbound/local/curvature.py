"""The second derivative of attention around a real input: how fast its Jacobian can change.

For a head or an attention layer F (each head's values in the output space, ``A_h = V^h W_O^h``; the
residual and the biases have no second derivative) and a direction e of the input, write

    zeta_ij(e) = ds_ij[e] - sum_l p_il ds_il[e],   ds_ij[e] = c (e_i W_Q k_j^T + q_i W_K^T e_j^T),

the centred change of the scores, and ``u_ij = v_j A_h - f_i``.  Differentiating
``DF[e]_i = sum_j p_ij e_j A_h + p_ij zeta_ij(e) u_ij`` once more (lemma ``softmax-derivative``; the sums
``sum_j p_ij zeta_ij = 0`` and ``sum_j p_ij u_ij = 0`` cancel the other terms) gives, per head,

    D^2F[e, f]_i = sum_j p_ij (zeta_ij(f) e_j + zeta_ij(e) f_j) A_h + sum_j p_ij zeta_ij(e) zeta_ij(f) u_ij
                   + c sum_j p_ij (e_i Qt_h f_j^T + f_i Qt_h e_j^T) u_ij,        Qt_h = W_Q^h W_K^h^T,

and for unit e, f (Frobenius) the three groups are at most (theorem ``local-attention-curvature``)

    chi_I   = 2 min( sum_h ||A_h|| ||Theta_h||,  a ||[Theta_1; ...; Theta_H]|| ),
       a = min( ||[A_1 ... A_H]||, ||[A_1; ...; A_H]|| ),
    chi_II  = || [omega_1 Omega_1; ...; omega_n Omega_n] ||,   omega_i >= ||Omega_i||,
    chi_III = 2 c min( max_i min( (sum_j (sum_h ||Qt_h|| p_ij ||u_ij||)^2)^(1/2),
                                  ||[Qt_1 ... Qt_H]|| (sum_{h,j} p_ij^2 ||u_ij||^2)^(1/2) ),
                       ||W_O|| max_i ||sum_h beta_hi^2 Qt_h Qt_h^T||^(1/2) ),
       beta_hi = ||diag(p_i) (V_h - 1 f_i^T)||_2 <= (sum_j p_ij^2 ||v_j - f_i||^2)^(1/2),

the last for a layer, with ``v_j - f_i`` in the values' space before ``W_O`` (the heads' terms are
``w_h = c e_i Qt_h F^T diag(p_i) (V_h - 1 f_i^T)`` times ``W_O^h``, so they add up as ``[w_1 ... w_H] W_O``, and
``||w_h|| <= c ||e_i Qt_h|| ||F||_2 beta_hi`` with ``||F||_2 <= ||F||_F``), and a third form for heads and layers,
``2 c max_i (sum_h gamma_hi)^(1/2) ||sum_h gamma_hi Qt_h Qt_h^T||^(1/2)``, ``gamma_hi = ||diag(p_i) U_hi||_2`` in the
output space (the heads by the triangle inequality, then Cauchy-Schwarz with weights gamma: lemma
``curvature-values-spectral``);
(the first group's half at query i is ``sum_h (b_hi^T E) A_h`` with ``b_hij = p_ij zeta_ij(f)``: a row ``[b_1i^T E ...
b_Hi^T E]`` of norm at most ``||E||_2 (sum_h ||b_hi||^2)^(1/2)`` times the stacked ``[A_1; ...; A_H]``, or the heads'
``E A_h`` side by side through ``[A_1 ... A_H]``: lemma ``curvature-values-stacked``), with ``Theta_h`` the matrix of
``f -> (p_ij zeta_ij(f))_ij`` ((n^2) x (n d)) and ``Omega_i`` that of
``e -> ((p_ij ||u_ij||)^(1/2) zeta_ij(e))_(h, j)`` ((H n) x (n d)).  On a product of token balls they are
evaluated in ball arithmetic: each matrix is its enclosure at X plus a deviation whose Frobenius norm
is bounded block by block from the weight ranges, key and query movements and value shifts of
:func:`~lipbound.local.bounds.attention_bounds`; the norms at X are computed once.  Since
``DF(Y) - DF(X) = int_0^1 D^2F(X + s (Y - X))[Y - X, .] ds`` and ``X + s (Y - X)`` lies in ``U(X, s eps)``,

    sup_{U(X, eps)} ||DF(Y) - DF(X)||_2 <= theta_U sum_k (eps_k - eps_{k-1}) (chi_I + chi_II + chi_III)(U(X, eps_k))

for radii ``0 = eps_0 < eps_1 < ... < eps_K = eps``, with ``||Y - X||_F <= theta_U eps`` on U (``theta_U = 1``
for the Frobenius and (2,1) balls, the square root of the number of moving tokens otherwise).  The
matrices have ``H n^3 d`` entries (:data:`CURVATURE_ENTRIES` caps them) and all their norms come from one
Gram matrix of their ``H n^2`` rows (:class:`~lipbound.rigorous.linalg.RowGram`), whose factorisations cost
about ``(H n^2)^3`` per radius: the bound is formed up to a number of tokens (:data:`CURVATURE_TOKENS` by default).

The deviations are bounded block by block: block m of row (h, i, j) changes by at most ``f + sum_t D_t x_t`` with
``x_t = ||y_t - x_t||`` (weights' changes ``delta`` and the queries' key directions ``||a_him||`` in f; the keys' and
queries' movements in ``D >= 0``; the keys' weighted centre moved by the weights at most the smaller of
``sum_l delta_il ||W_Q M_i (k~_l - kappa_i)||`` and ``||delta_i|| ||(K~ - 1 kappa_i^T) M_i^T W_Q^T||``).  On token balls
every ``x_t`` is the token's radius; where the set is known to lie in a Frobenius ball of radius t, the tokens share
it (lemma ``curvature-joint``): ``||s (zeta(Y) - zeta(X))||_F <= ||s f|| + t ||diag(s) D||_2`` for scales s >= 0 fixed
on U (Minkowski, then ``||x|| <= t``), and the smaller of the two bounds is taken
(:class:`~lipbound.local.zeta_changes.Changes`).  Where those parts are formed, ``chi_II`` and the rows of ``chi_I``
read at the weights' upper ends on U take ``zeta(Y) = z(Y) - m(Y)`` apart, ``z`` the score changes centred at X's
weights (its change is the movements' alone) and ``m`` the weights' part, the same for every key of a query (lemma
``curvature-covariance-centred``, :class:`~lipbound.local.centred.CentredRows`): ``chi_II <= ||[(omega_i + mu_i)
Omega_i]|| + ||[omega_i M_i]||`` with ``Omega_i`` z's rows and ``M_i`` m's rows of query i scaled by ``(p_ij
||u_ij||)^(1/2)``, where reading ``zeta``'s rows as one matrix also pays ``||M_i e|| ||M_i f||``.  z's change, a
bilinear form in the movement and the direction for dot-product heads, is also bounded with the heads' score maps
together (lemma ``curvature-centred-change``, :class:`~lipbound.local.centred_change.CentredChange`).

Longer inputs get the split bound instead (:mod:`~lipbound.local.split_rows`), which forms ``zeta`` one query at a
time; the integral over the radii is :class:`~lipbound.local.curvature_integral.CurvatureIntegral`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.batched import interval_spectral_norms_upper
from ..rigorous.intervals import upper
from ..rigorous.linalg import Enclosure, RowGram, product_norm_interval, spectral_norm_upper_large
from ..rigorous.rayleigh import row_gram_norm_lower
from ..symbolic import local as T
from .bounds import LocalBounds, attention_norms, evaluate_theorem, head_movement, simplex_box_max, value_space
from .centred import CentredRows, ValueSpread, weight_ratios, weighted_reach
from .centred_change import CentredChange
from .enclosed import EnclosedAttention, head_products
from .split_rows import SplitRows, query_rows
from .third_group import KRONECKER_ROWS, third_group_norm
from .zeta_changes import Changes, HeadsJoint, centred_parts

__all__ = ["AttentionCurvature", "CURVATURE_ENTRIES", "CURVATURE_TOKENS", "SPLIT_ENTRIES"]

#: Largest ``H n^3 d`` for which the curvature matrices are formed (memory: n <= 25 at MiniLM's width).
CURVATURE_ENTRIES = 80_000_000
#: Default largest number of tokens for the Gram route (CPU time per radius at MiniLM's width, four norms with the
#: centred forms: about 4 s at 16 tokens and 10 s at 20, growing as n^6); longer inputs take the split bound.
CURVATURE_TOKENS = 20
#: Largest ``H n^4`` for which the split bound is formed: n <= 64 with 12 heads (at n = 61 on MiniLM: about
#: 2 minutes to set up, 10 s per radius, 4 GB).
SPLIT_ENTRIES = 12 * 64 ** 4
#: Largest ``H n^3`` for which the change's parts are formed (:class:`~lipbound.local.zeta_changes.Changes`;
#: a few arrays of that size, as the deviations themselves)
JOINT_ENTRIES = 12 * 64 ** 3


class AttentionCurvature:
    """The curvature bound of a head or an attention layer at one input (module docstring).

    Parameters
    ----------
    E : EnclosedAttention
        The head or layer enclosed at X (n tokens).
    target : Head or Layer
        The same target (its ``output_block`` places each head in the output space).
    split : bool
        Bound the norms of ``zeta``'s scaled rows by the split bound instead of their Gram matrix
        (module docstring; for inputs the Gram route does not reach, see :meth:`route`).
    fold : IntervalArray (n, d_in, d), optional
        Per-token maps F_m on both arguments of the second derivative: the bound is then on
        ``sup ||D^2F[e F, f F]||`` over unit e, f (``(e F)_m = e_m F_m``; a norm's Jacobians at the centre, which
        a pre-norm attention reads through: :mod:`lipbound.local.front`).  Every matrix that acts on an
        argument is multiplied by them -- zeta's block m by ``F_m`` (``z_m F_m^T``), ``A_h`` read at token j as
        ``F_j A_h``, ``Qt_ij`` as ``F_i Qt_ij F_j^T`` -- and the deviations on the balls by ``||F_m||`` (the maps
        stay at the centre).  Gram route only.

    The matrices at X and their norms are built once; :meth:`chis` adds a neighbourhood's deviations and
    :meth:`piece` makes one term of the theorem's sum.
    """

    def __init__(self, E: EnclosedAttention, target, split: bool = False, fold: IntervalArray | None = None):
        engine = E.engine
        H, n, d = engine.H, E.n, engine.d
        self.E, self.H, self.n, self.split, self.fold = E, H, n, split, fold
        self.norms = attention_norms(engine)
        self.rotary = E.rotations is not None
        values, outputs, self.value_norms = value_space(E, target)
        products = head_products(engine)                                                # A_h, (H, d, d_out)
        d_out = products.shape[2]
        if fold is None:
            self.fold_norms = np.ones(n)
            self.pair_norms = np.broadcast_to(E.norms.g, (H, n, n))                    # ||W_Q R_ij W_K^T||
            # ||[A_1 ... A_H]|| or ||[A_1; ...; A_H]|| (lemma curvature-values-stacked), the smaller
            self.values_joint = min(_norm(products.swapaxes(0, 1).reshape(d, -1)), _norm(products.reshape(-1, d_out)))
        else:
            self.fold_norms = np.array([_norm(fold[m]) for m in range(n)])              # ||F_m||
            self.pair_norms = _folded_pair_norms(E, fold)                               # ||F_i Qt_ij F_j^T||
            joined = [fold[j].bmm(products.swapaxes(0, 1).reshape(d, -1)) for j in range(n)]
            self.values_joint = max(_norm(block) for block in joined)                   # max_j ||F_j [A_1 ... A_H]||
            self.value_norms = np.array([max(_norm(block[:, h * d_out:(h + 1) * d_out])
                                             for block in joined) for h in range(H)])   # max_j ||F_j A_h||
        self.output_norm, self.value_space_spread = None, None
        if not self.rotary and fold is None:  # the heads joined through one Qt_h each (one per offset if rotary)
            scores = IntervalArray.stack([IntervalArray.from_enclosure(Enclosure.exact(W_Q) @ Enclosure.exact(W_K.T))
                                          for W_Q, W_K in (engine.head_weights(h)[:2] for h in range(H))])
            self.scores_joint = _norm(scores.swapaxes(0, 1).reshape(d, -1))             # ||[Qt_1 ... Qt_H]||
            # chi_III through the values before W_O (a layer): ||W_O||, Qt_h Qt_h^T and ||v_j - f_i|| at X
            self.output_norm = None if engine.W_O is None else _norm(IntervalArray(engine.W_O))
            self.score_grams = scores.bmm(scores.swapaxes(1, 2))                          # Qt_h Qt_h^T, (H, d, d)
            if self.output_norm is not None:
                self.value_rho = (E.V.expand(1) - E.F.expand(2)).norm_upper()            # ||v_j - f_i||, (H, n, n)
                # ||diag(p_i) (V - 1 f_i^T)||_2 at X, (H, n): beta's spectral form (lemma curvature-values-spectral)
                self.value_spectral = interval_spectral_norms_upper(E.P.expand(-1) * (E.V.expand(1) - E.F.expand(2)))
                # the same rows' spread for the heads' movement in the values' space (lemma head-movement-spread)
                self.value_space_spread = ValueSpread(E.V.expand(1) - E.F.expand(2), self.norms["L_V"]) \
                    if H * n ** 3 <= JOINT_ENTRIES else None
        u = values.expand(1) - outputs.expand(2)                                       # u_ij at X, (H, n, n, d_out)
        self.value_gaps = (values.expand(1) - values.expand(2)).norm_upper()             # ||v_j - v_l|| at X, (H, n, n)
        self.rho = IntervalArray(u.norm_lower(), u.norm_upper())                        # ||u_ij|| at X
        self.output_spectral = interval_spectral_norms_upper(E.P.expand(-1) * u)        # ||diag(p_i) U_i||_2, (H, n)
        # chi_III's heads and F's tokens in one operator per query (lemma curvature-third-kronecker), at X: formed
        # at the first radius where it can win (:meth:`combined`; the curvature integral forms it only where it can
        # move the curve)
        self.kronecker = not self.rotary and fold is None and d * n <= KRONECKER_ROWS
        self.third_at_x: float | None = None
        self._output_rows = E.P.expand(-1) * u if self.kronecker else None
        # the weighted values' spread for chi_II's m term (lemma curvature-covariance-spread), where the centred forms
        # are formed (:meth:`_functional_deviation`)
        self.value_spread = ValueSpread(u, self.value_norms) if fold is None and H * n ** 3 <= JOINT_ENTRIES else None
        kappa = E.P.einsum("hil,hlk->hik", E.K)                                         # sum_l p_il k~_l
        spread = E.K.expand(1) - kappa.expand(2)                                        # k~_j - kappa_i, (H, n, n, d_k)
        if self.rotary:                                                                 # back to query i's position
            spread = spread.einsum("hijk,ilk->hijl", E.rotations)
        key_part = IntervalArray.stack([spread[h].matmul(engine.head_weights(h)[0].T) for h in range(H)])
        query_part = E.norms.w            # a_him = W_K M_m q~_i^T, (H, n(i), n(m) or 1, d)
        self.plain_key_norms = key_part.norm_upper()                                    # (H, n, n)
        self.key_spreads = interval_spectral_norms_upper(key_part)     # ||(K~ - 1 kappa_i^T) W_Q^T||
        self.heads_joint = None if self.rotary or fold is not None else HeadsJoint(E, spread, E.c)
        self.centred_change = None if self.rotary or fold is not None or H * n ** 3 > JOINT_ENTRIES \
            else CentredChange(E)
        if fold is not None:              # block m of a row acts on e_m F_m: z_m F_m^T
            key_part = key_part.einsum("hijd,ikd->hijk", fold)
            query_part = (query_part + IntervalArray(np.zeros((H, n, n, d)))).einsum("himd,mkd->himk", fold)
        self.key_norms = key_part.norm_upper()                                          # (H, n, n)
        self.query_norms = np.broadcast_to(query_part.norm_upper(), (H, n, n))         # ||a_him||, (H, n(i), n(m))
        # zeta_ij as a row: block m is c (delta_mj - p_im) W_K q_i + [m = i] c W_Q (k_j - kappa_i)
        coefficient = IntervalArray(np.eye(n)[None, None]) - E.P.expand(2)              # (H, n(i), n(j), n(m))
        self.coefficient = coefficient.magnitude                                        # |delta_mj - p_im| at X
        self.c = E.c.hi.item()
        self.zeta_rows = SplitRows(query_part, key_part, coefficient, E.c) if split \
            else self._gram(E, coefficient, query_part, key_part)
        # Theta at X (rows p_ij zeta_ij) and its norms; the neighbourhoods only add deviations
        p_at_x = E.P.magnitude                                                          # (H, n, n)
        self.G_norms = np.array([self.zeta_rows.norm_upper(p_at_x[h].ravel(), self._head_rows(h)) for h in range(H)])
        self.G_norm = self.zeta_rows.norm_upper(p_at_x.ravel())
        self.centred_rows = CentredRows(self.zeta_rows, [self._query_rows(i) for i in range(n)])

    @staticmethod
    def _gram(E: EnclosedAttention, coefficient, query_part, key_part) -> RowGram:
        """The Gram matrix of ``zeta``'s rows, formed from the rows themselves."""
        H, n, d = E.engine.H, E.n, E.engine.d
        zeta = IntervalArray.stack([query_rows(coefficient, query_part, key_part, E.c, i) for i in range(n)])
        # every matrix below is zeta's rows (h, i, j) scaled: one Gram matrix of the rows serves them all
        return RowGram(zeta.swapaxes(0, 1).reshape(H * n * n, n * d).to_enclosure())

    def _head_rows(self, h: int) -> np.ndarray:
        """Indices of head h's rows (i, j) among zeta's rows (h, i, j)."""
        return np.arange(h * self.n * self.n, (h + 1) * self.n * self.n)

    def _query_rows(self, i: int) -> np.ndarray:
        """Indices of query i's rows (h, j) among zeta's rows (h, i, j), in that order."""
        n = self.n
        return (np.arange(self.H)[:, None] * n * n + i * n + np.arange(n)[None, :]).ravel()

    @staticmethod
    def route(E: EnclosedAttention, tokens: int = CURVATURE_TOKENS, fold: bool = False) -> str | None:
        """``"gram"`` when X has at most ``tokens`` tokens and the matrices stay within
        :data:`CURVATURE_ENTRIES`, else ``"split"`` while ``H n^4`` stays within :data:`SPLIT_ENTRIES`, else None."""
        H, n = E.engine.H, E.n
        if n <= tokens and H * n ** 3 * E.engine.d <= CURVATURE_ENTRIES:
            return "gram"
        if fold:
            return None
        # the split bound factors zeta's rows through one W_K q_i per query: a dot-product score's
        return "split" if H * n ** 4 <= SPLIT_ENTRIES and E.rotations is None else None

    def _functional_deviation(self, facts: dict, r: np.ndarray, frobenius: float | None = None):
        """``(sup_U ||zeta_ijm||, changes, centred)`` per block m of each row, (H, n, n, n): the first an array, the
        second a :class:`~lipbound.local.zeta_changes.Changes` bounding ``||zeta_ijm(Y) - zeta_ijm(X)||`` block by block
        and, with ``frobenius`` (a bound on ``||Y - X||_F`` on U), their norms with the tokens sharing it (module
        docstring); the third the same change split at X's weights
        (:func:`~lipbound.local.zeta_changes.centred_parts`), None with folded maps or past :data:`JOINT_ENTRIES`."""
        g = IntervalArray(np.broadcast_to(self.E.norms.g, self.coefficient.shape[:3]))  # ||W_Q R_ij W_K^T||, (H, n, n)
        folds = IntervalArray(self.fold_norms)                                          # ||F_m|| (1 unfolded)
        delta, p_hi, c = IntervalArray(facts["delta"]), IntervalArray(facts["p_hi"]), IntervalArray(self.c)
        radii = IntervalArray(r)
        moved_a = g * radii[None, :, None] * folds[None, None, :]                       # a_him moves by g_im r_i
        w_plus = IntervalArray(self.query_norms) + moved_a                              # ||a_him|| on U, (H, n, n)
        # kappa_i moves by ||sum_l (p'_il - p_il) W_Q M_i (k~_l - kappa_i)|| + sum_l p'_il g_il r_l, the first at
        # most sum_l delta_il ||W_Q M_i (k~_l - kappa_i)|| and ||delta_i|| ||(K~ - 1 kappa_i^T) M_i^T W_Q^T||
        by_entries = (delta * IntervalArray(self.plain_key_norms)).sum(axis=-1)
        by_rows = IntervalArray(delta.norm_upper()) * IntervalArray(self.key_spreads)
        weights_kappa = IntervalArray(np.minimum(by_entries.hi, by_rows.hi))
        moved_kappa = weights_kappa + (p_hi * g * radii[None, None, :]).sum(axis=-1)
        key_change = (g * radii[None, None, :] + moved_kappa.expand(-1)) * folds[None, :, None]   # (H, n(i), n(j))
        coef, moved_p = IntervalArray(self.coefficient), delta.expand(2)                # (H, n, n, n), delta_im
        w = w_plus.expand(2)                                                            # (H, n(i), 1, n(m))
        change = c * (moved_p * w + coef * moved_a.expand(2))
        size = c * (coef + moved_p) * w
        change_hi, size_hi = change.hi.copy(), size.hi.copy()
        for i in range(self.n):
            change_hi[:, i, :, i] = (IntervalArray(change_hi[:, i, :, i]) + c * key_change[:, i]).hi
            size_hi[:, i, :, i] = (IntervalArray(size_hi[:, i, :, i])
                                   + c * (IntervalArray(self.key_norms[:, i]) + key_change[:, i])).hi
        if self.fold is not None or self.H * self.n ** 3 > JOINT_ENTRIES:
            return size_hi, Changes(change_hi), None
        # the same bounds with ||y_t - x_t|| for r_t: a part free of the movement plus one linear in it
        fixed = c * moved_p * IntervalArray(self.query_norms).expand(2)
        fixed_hi = fixed.hi.copy()
        for i in range(self.n):
            fixed_hi[:, i, :, i] = (IntervalArray(fixed_hi[:, i, :, i]) + c * weights_kappa[:, i].expand(-1)).hi
        spectral = None if self.heads_joint is None else self.heads_joint.at(delta, weights_kappa)
        centred = centred_parts(self.coefficient, delta, g, c, fixed_hi, r, frobenius, spectral, self.centred_change)
        return size_hi, Changes(change_hi, fixed_hi, self._linear_part(facts, g, c), r, frobenius, spectral), centred

    def _linear_part(self, facts: dict, g: IntervalArray, c: IntervalArray) -> tuple[np.ndarray, np.ndarray]:
        """``D >= 0`` with ``||zeta_ijm(Y) - zeta_ijm(X)||`` at most the movement-free part plus ``sum_t D_ijmt ||y_t -
        x_t||`` (unfolded): ``c (delta_im + |delta_mj - p_im|) g_im`` on token i, and on block m = i also ``c g_ij`` on
        token j and ``c p^+_il g_il`` on each token l (the keys' weighted centre).  As two arrays: ``single`` (H, n(i),
        n(j), n(m)), the blocks m != i (their one entry, on token i; 0 at m = i), and ``own`` (H, n(i), n(j), n(t)),
        the rows of the blocks m = i."""
        n = self.n
        delta, p_hi = IntervalArray(facts["delta"]), IntervalArray(facts["p_hi"])
        on_query = (c * (delta.expand(2) + IntervalArray(self.coefficient)) * g.expand(2)).hi  # (H, n(i), n(j), n(m))
        index = np.arange(n)
        single = on_query.copy()
        single[:, index, :, index] = 0.0
        centre = c * p_hi * g                                                                # (H, n(i), n(l))
        keys = (c * g).expand(-1) * IntervalArray(np.eye(n)[None, None])                     # c g_ij on token j
        on_own = np.zeros(on_query.shape)
        on_own[:, index, :, index] = on_query[:, index, :, index]                            # (t = i)
        own = (IntervalArray(on_own) + centre.expand(2) + keys).hi
        return single, own

    @staticmethod
    def _scale_moves(at_x: IntervalArray, on_u: IntervalArray, size: np.ndarray) -> np.ndarray:
        """``|s(Y) - s(X)| ||z(Y)||`` per block, for row scales s enclosed at X and on U (H, n, n): the first part of
        ``sup_U ||s(Y) z(Y) - s(X) z(X)|| <= |s(Y) - s(X)| ||z(Y)|| + |s(X)| ||z(Y) - z(X)||``, (H, n, n, n)."""
        moved = np.maximum(np.maximum((on_u - IntervalArray(at_x.lo)).hi, (IntervalArray(at_x.hi) - on_u).hi), 0.0)
        return (IntervalArray(moved[..., None]) * IntervalArray(size)).hi

    def chis(self, bounds: LocalBounds, r: np.ndarray, frobenius: float | None = None) -> tuple[float, float, float]:
        """``(chi_I, chi_II, chi_III)`` on the token balls with radii ``r``; ``bounds`` are those of
        :func:`~lipbound.local.bounds.attention_bounds` on the same balls (their ``facts``); ``frobenius`` bounds
        ``||Y - X||_F`` there where known (the tokens then share it: :class:`~lipbound.local.zeta_changes.Changes`).
        The Kronecker form is formed here where it can win (:meth:`parts` and :meth:`combined` leave that choice to
        the caller)."""
        return self.combined(self.parts(bounds, r, frobenius), form=True)

    def parts(self, bounds: LocalBounds, r: np.ndarray, frobenius: float | None = None) -> tuple:
        """``(chi_I, chi_II, chi_III', moved)`` on the balls of :meth:`chis`: ``chi_III'`` the third group without the
        Kronecker form, ``moved`` the form's change part on U (inf where the form cannot win there: :meth:`_kronecker`);
        :meth:`combined` joins them."""
        E, facts = self.E, bounds.facts
        n = self.n
        p_on_u = IntervalArray(facts["p_lo"], facts["p_hi"])
        size, change, centred = self._functional_deviation(facts, r, frobenius)
        moved_u = IntervalArray(facts["value_shift"][:, None, :]) + IntervalArray(facts["head_movement"][:, :, None])
        rho_on_u = IntervalArray(np.maximum((self.rho - moved_u).lo, 0.0), (self.rho + moved_u).hi)
        p_plus = IntervalArray(facts["p_hi"])
        # chi_I: Theta_h per head and all heads stacked, the rows scaled at X plus the scale's change, or
        # scaled by the scale's upper end on U, where only zeta changes
        scale_moves, at_x = self._scale_moves(E.P, p_on_u, size), E.P.magnitude
        per_head = IntervalArray(self.G_norms) + IntervalArray(change.norms(at_x, 0, scale_moves))
        stacked = IntervalArray(self.G_norm) + IntervalArray(change.norms(at_x, None, scale_moves))
        if centred is None:
            stacked_upper = IntervalArray(self.zeta_rows.norm_upper(p_plus.hi.ravel())) \
                + IntervalArray(change.norms(p_plus.hi))
        else:   # rows p_ij (z_ij - m_hi), centred at X's weights (lemma curvature-covariance-centred; on MiniLM's
            # first layer below the rows read as one at every radius of the curve, so that form is not formed)
            rows = self.centred_rows.rows(facts, p_plus.hi, *centred)
            # the variance form is at least the norm of its scaled rows at X: where a lower bound of that already
            # passes the centred rows' bound it cannot be the smaller and is not factorised (same floats; on MiniLM
            # 2.37 against 1.80 at 1e-5 R, n = 9: one factorisation of four per radius saved)
            variance = CentredRows.variance_scales(facts).ravel()
            if not (isinstance(self.zeta_rows, RowGram) and row_gram_norm_lower(self.zeta_rows, variance) >= rows):
                rows = min(rows, self.centred_rows.variance_rows(facts, centred[0]))
            stacked_upper = IntervalArray(rows)
        first = min((IntervalArray(self.value_norms) * per_head).sum(axis=0).hi.item(),
                    (IntervalArray(self.values_joint) * stacked).hi.item(),
                    (IntervalArray(self.values_joint) * stacked_upper).hi.item())
        chi_I = (IntervalArray(2.0) * IntervalArray(first)).hi.item()
        # chi_II: Omega_i, rows (h, j) of query i scaled by the upper end of (p_ij ||u_ij||)^(1/2) on U
        # (scaling at X and adding the scale's change never did better on the MiniLM layers)
        reach = IntervalArray(weighted_reach(facts, rho_on_u.hi, self.value_gaps))              # p_ij ||u_ij|| on U
        weight = reach.sqrt()
        if centred is None or self.value_spread is None:
            row_change = change.norms(weight.hi, 1)
            omega = self.centred_rows.rows_at_x(weight.hi)
            m = (IntervalArray(omega) + IntervalArray(row_change)).hi                          # omega_i
            scaled = (IntervalArray(m)[None, :, None] * weight).hi                             # (H, n, n)
            moved = min(change.norms(scaled), (IntervalArray(m) * IntervalArray(row_change)).norm_upper().item())
            chi_II = (IntervalArray(self.zeta_rows.norm_upper(scaled.ravel())) + IntervalArray(moved)).hi.item()
        else:   # centred at X's weights, the m term through the values' weighted spread (lemma
            # curvature-covariance-spread: on MiniLM's first layer below lemma curvature-covariance-centred's
            # ||[(omega_i + mu_i) Omega_i]|| + ||[omega_i M_i]|| at every radius measured, so that is not formed)
            sigma = self.value_spread.on(facts, frobenius)
            chi_II = self.centred_rows.spread_covariance(facts, weight.hi, sigma, centred[0])
        # chi_III: W_ij = sum_h ||Qt_h|| p_ij ||u_ij||, or the heads joined through ||[Qt_1 ... Qt_H]||
        W = (IntervalArray(self.pair_norms) * reach).sum(axis=0)
        joined = np.inf if self.rotary or self.fold is not None else (IntervalArray(self.scores_joint) * IntervalArray(
            reach.swapaxes(0, 1).reshape(n, -1).norm_upper())).hi
        third = min(float(np.max(np.minimum(W.norm_upper(), joined))), self._values_joined(facts, r),
                    self._heads_weighted(self.output_spreads(facts)))
        chi_III = (IntervalArray(2.0) * IntervalArray(self.c) * IntervalArray(third)).hi.item()
        return chi_I, chi_II, chi_III, self._kronecker_change(facts, third)

    def moved_heads(self, bounds: LocalBounds, frobenius: float | None = None) -> LocalBounds:
        """``bounds`` with each head's movement ``sup_U ||f_hi(Y) - f_hi(X)||`` (output space) also bounded through the
        weights' ratios and the values' weighted spread at X (lemma ``head-movement-spread``):

            kappa_hi ||diag(p+_hi)^(1/2) U_hi(X)||_2 + max sum_j p_ij Delta v_hj,

        the mean of the values' shifts at most over the weights' box on the simplex and, where ``frobenius`` bounds
        ``||Y - X||_F`` on U, at most ``(max_j p+_hij)^(1/2) ||A_h|| frobenius``; entrywise the smaller of that and the
        facts' own.  ``bounds`` unchanged without the values' spread (folded maps, past :data:`JOINT_ENTRIES`) or
        where kappa is not finite.  On MiniLM's layer 0 at 1e-2 R the weights' part is about 3/4 of ``sum_j delta_ij
        ||u_ij||``."""
        facts = bounds.facts
        if self.value_spread is None:
            return bounds
        moved = _moved_by_ratios(self.value_spread, facts, facts["value_shift"], frobenius)
        return replace(bounds, facts=facts | {"head_movement": np.minimum(facts["head_movement"], moved)})

    def combined(self, parts: tuple, form: bool) -> tuple[float, float, float]:
        """``(chi_I, chi_II, chi_III)`` from :meth:`parts`: ``chi_III`` the smaller of the other forms' and
        ``2 c (max_i ||K_i(X)|| + moved)`` (lemma ``curvature-third-kronecker``) where the form's part at X is formed,
        or where ``form`` asks to form it (one certified factorisation:
        :func:`~lipbound.local.third_group.third_group_norm`) and it can win."""
        chi_I, chi_II, chi_III, moved = parts
        if math.isinf(moved) or (self.third_at_x is None and not form):
            return chi_I, chi_II, chi_III
        if self.third_at_x is None:
            weights = [self.E.engine.head_weights(h)[:2] for h in range(self.H)]
            self.third_at_x = third_group_norm([w[0] for w in weights], [w[1] for w in weights], self._output_rows)
        third = IntervalArray(self.third_at_x) + IntervalArray(moved)
        return chi_I, chi_II, min(chi_III, (IntervalArray(2.0) * IntervalArray(self.c) * third).hi.item())

    def kronecker_room(self, parts: tuple) -> float:
        """A float bound on how much the Kronecker form can lower ``chi_III`` of :meth:`parts` (its part at X taken as
        0): 0 where it is formed already or cannot win; decides work only."""
        chi_III, moved = parts[2], parts[3]
        if self.third_at_x is not None or math.isinf(moved):
            return 0.0
        return max(chi_III - 2.0 * self.c * moved, 0.0)

    def _values_joined(self, facts: dict, r: np.ndarray) -> float:
        """``||W_O|| max_i ||sum_h beta_hi^2 Qt_h Qt_h^T||^(1/2)`` with ``beta_hi >= ||diag(p_i) (V - 1 f_i^T)||_2``
        on U in the values' space (a layer's heads add up through W_O): the smaller of the rows' Frobenius norm
        ``(sum_j p_ij^2 ||v_j - f_i||^2)^(1/2)`` and the spectral norm at X plus the rows' changes (lemma
        ``curvature-values-spectral``); inf for a single head.  The norm grows with
        each ``beta_hi^2`` (a sum of PSD matrices), so one norm at ``max_i beta_hi^2`` bounds every query's (MiniLM
        layer 0: 3-6% above the largest of the n norms, at a n-th of their cost)."""
        if self.output_norm is None:
            return np.inf
        beta = self.value_spreads(facts, r)
        weights = IntervalArray(np.max((IntervalArray(beta) * IntervalArray(beta)).hi, axis=1))
        top = _norm(weights.einsum("h,hab->ab", self.score_grams))
        return (IntervalArray(self.output_norm) * IntervalArray(top).sqrt()).hi.item()

    def _heads_weighted(self, gamma: np.ndarray) -> float:
        """``max_i (sum_h gamma_hi)^(1/2) ||sum_h gamma_hi Qt_h Qt_h^T||^(1/2)``, ``gamma_hi >= ||diag(p_i) U_i||_2``
        on U in the output space (lemma ``curvature-values-spectral``: the heads by the triangle inequality, then
        Cauchy-Schwarz with weights gamma), evaluated once at ``max_i gamma_hi`` (the norm grows with each weight);
        inf with rotations or folded maps (one ``Qt`` per pair)."""
        if self.rotary or self.fold is not None:
            return np.inf
        top = _norm(IntervalArray(np.max(gamma, axis=1)).einsum("h,hab->ab", self.score_grams))
        total = np.max(IntervalArray(gamma).sum(axis=0).hi)
        return (IntervalArray(total).sqrt() * IntervalArray(top).sqrt()).hi.item()

    def _kronecker_change(self, facts: dict, other: float) -> float:
        """The change part ``(sum_h delta_hi)^(1/2) ||sum_h delta_hi Qt_h Qt_h^T||^(1/2)`` of the Kronecker form ``max_i
        ||K_i(X)|| + that`` (lemma ``curvature-third-kronecker``, :mod:`~lipbound.local.third_group`), ``delta_hi >=
        ||D_hi(Y) - D_hi(X)||_2`` on U; inf where ``K_i`` is not formed, or where the change part alone reaches
        ``other`` (the other forms' best: the form cannot win there)."""
        if not self.kronecker:
            return np.inf
        drift = IntervalArray(facts["value_shift"][:, None, :]) + IntervalArray(facts["head_movement"][:, :, None])
        moved = self._heads_weighted(_changes((self.rho + drift).hi, drift, facts, self.E.P.hi))
        return np.inf if moved >= other else moved

    def output_spreads(self, facts: dict) -> np.ndarray:
        """``gamma_hi >= ||diag(p_i(Y)) U_i(Y)||_2`` for every Y where ``facts`` hold (those of
        :func:`~lipbound.local.bounds.attention_bounds`), ``U_i`` the rows ``u_ij`` in the output space, (H, n)."""
        drift = IntervalArray(facts["value_shift"][:, None, :]) + IntervalArray(facts["head_movement"][:, :, None])
        return _spreads(self.output_spectral, (self.rho + drift).hi, drift, facts, self.E.P.hi)

    def value_movement(self, facts: dict, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shift, moved)`` in the values' space on the token balls with radii ``r`` (a layer with W_O): each value's
        shift ``||V^h|| r_j`` (H, n) and each head's movement ``||f_hi(Y) - f_hi(X)||`` (H, n), the smaller of the
        weights' box bound and lemma ``head-movement-spread``."""
        shift = (IntervalArray(self.norms["L_V"][:, None]) * IntervalArray(r[None, :])).hi         # ||V^h|| r_j
        moved = head_movement(facts["p_lo"], facts["p_hi"], facts["delta"], self.value_rho, shift)
        if self.value_space_spread is not None:
            moved = np.minimum(moved, _moved_by_ratios(self.value_space_spread, facts, shift))
        return shift, moved

    def value_spreads(self, facts: dict, r: np.ndarray) -> np.ndarray:
        """``beta_hi >= ||diag(p_i(Y)) (V_h(Y) - 1 f_i(Y)^T)||_2`` for every Y on the token balls with radii ``r``
        (facts of :func:`~lipbound.local.bounds.attention_bounds` there), (H, n), values' space; a layer with W_O."""
        shift, moved = self.value_movement(facts, r)
        drift = IntervalArray(shift[:, None, :]) + IntervalArray(moved[:, :, None])   # ||u'_ij - u_ij|| on U
        return _spreads(self.value_spectral, (IntervalArray(self.value_rho) + drift).hi, drift, facts, self.E.P.hi)

    @staticmethod
    def piece(chis: tuple, width: float) -> float:
        """One term ``(eps_k - eps_{k-1}) (chi_I + chi_II + chi_III)`` of theorem local-attention-curvature,
        from :meth:`chis` on ``U(X, eps_k)`` and the width ``eps_k - eps_{k-1}`` (rounded up)."""
        chi_I, chi_II, chi_III = chis
        return evaluate_theorem(T.attention_curvature(), **{
            r"\chi_{I}": chi_I, r"\chi_{II}": chi_II, r"\chi_{III}": chi_III,
            r"\Delta\epsilon_k": width}).item()


def _moved_by_ratios(spread: ValueSpread, facts: dict, shift: np.ndarray, frobenius: float | None = None) -> np.ndarray:
    """``kappa_hi ||diag(p+_hi)^(1/2) U_hi(X)||_2 + max sum_j p_ij Delta v_hj`` (H, n) (lemma ``head-movement-spread``):
    each head's movement on U where ``facts`` hold, ``spread`` the rows ``u_ij`` of its space at X and the value maps'
    norms, ``shift`` (H, n) the values' shifts there; the mean shift over the weights' box on the simplex and, where
    ``frobenius`` bounds ``||Y - X||_F``, at most ``(max_j p+_hij)^(1/2) ||A_h|| frobenius``; inf where the weights'
    ratios are not finite."""
    kappa = weight_ratios(facts)
    if kappa is None:
        return np.full(shift.shape[:1] + facts["p_hi"].shape[1:2], np.inf)
    p_lo, p_hi = facts["p_lo"], facts["p_hi"]
    mean_shift = simplex_box_max(p_lo, p_hi, np.broadcast_to(shift[:, None, :], p_lo.shape))        # (H, n)
    if frobenius is not None:
        tall = IntervalArray(np.max(p_hi, axis=-1)).sqrt() * IntervalArray(spread.value_norms).expand(-1)
        mean_shift = np.minimum(mean_shift, (tall * IntervalArray(float(frobenius))).hi)
    return (IntervalArray(kappa) * IntervalArray(spread.at_x(p_hi)) + IntervalArray(mean_shift)).hi


def _spreads(at_x: np.ndarray, rho: np.ndarray, drift: IntervalArray, facts: dict, p_at_x: np.ndarray) -> np.ndarray:
    """``sup_U ||diag(p_i) U_i||_2`` per head and query (H, n), ``U_i`` the rows ``u_ij = v_j - f_i``: the rows'
    Frobenius norm ``||(p+_ij ||u_ij||)_j||`` or the spectral norm at X (``at_x``) plus the rows' changes,
    ``||p'_ij u'_ij - p_ij u_ij|| <= delta_ij ||u'_ij|| + p_ij ||u'_ij - u_ij||`` (Weyl, then Frobenius); ``rho`` bounds
    ``||u'_ij||`` and ``drift`` ``||u'_ij - u_ij||`` on U (H, n, n), ``facts`` those of
    :func:`~lipbound.local.bounds.attention_bounds` there (lemma curvature-values-spectral)."""
    return np.minimum((IntervalArray(facts["p_hi"]) * IntervalArray(rho)).norm_upper(),
                      (IntervalArray(at_x) + IntervalArray(_changes(rho, drift, facts, p_at_x))).hi)


def _changes(rho: np.ndarray, drift: IntervalArray, facts: dict, p_at_x: np.ndarray) -> np.ndarray:
    """``||diag(p_i(Y)) U_i(Y) - diag(p_i) U_i||_F`` at most, per head and query (H, n):
    ``||p'_ij u'_ij - p_ij u_ij|| <= delta_ij ||u'_ij|| + p_ij ||u'_ij - u_ij||`` (arguments as :func:`_spreads`)."""
    change = IntervalArray(facts["delta"]) * IntervalArray(rho) + IntervalArray(p_at_x) * drift
    return change.norm_upper()


def _folded_pair_norms(E: EnclosedAttention, fold: IntervalArray) -> np.ndarray:
    """``||F_i W_Q R_ij W_K^T F_j^T||`` per head and visible pair (0 for hidden pairs), certified."""
    engine = E.engine
    H, n = engine.H, E.n
    out = np.zeros((H, n, n))
    visible = np.ones((H, n, n), dtype=bool) if E.visible is None else E.visible
    folds = [fold[m].to_enclosure() for m in range(n)]
    for h in range(H):
        W_Q, W_K = engine.head_weights(h)[:2]
        queries = [F @ Enclosure.exact(W_Q) for F in folds]                             # F_i W_Q, (d, d_k)
        keys = [(F @ Enclosure.exact(W_K)).T for F in folds]                            # W_K^T F_j^T, (d_k, d)
        for i in range(n):
            for j in range(n):
                if visible[h, i, j]:
                    left = queries[i] if E.rotations is None else \
                        queries[i] @ E.rotations[i].to_enclosure() @ E.rotations[j].to_enclosure().T
                    out[h, i, j] = upper(product_norm_interval(left, keys[j]))
    return out


def _norm(matrix: IntervalArray) -> float:
    """Certified spectral norm of an interval matrix (midpoint's norm plus the radius's Frobenius norm)."""
    return spectral_norm_upper_large(matrix.to_enclosure())
