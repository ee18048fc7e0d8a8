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

    chi_I   = 2 min( sum_h ||A_h|| ||Theta_h||,  ||[A_1 ... A_H]|| ||[Theta_1; ...; Theta_H]|| ),
    chi_II  = || [omega_1 Omega_1; ...; omega_n Omega_n] ||,   omega_i >= ||Omega_i||,
    chi_III = 2 c min( max_i min( (sum_j (sum_h ||Qt_h|| p_ij ||u_ij||)^2)^(1/2),
                                  ||[Qt_1 ... Qt_H]|| (sum_{h,j} p_ij^2 ||u_ij||^2)^(1/2) ),
                       ||W_O|| max_i ||sum_h beta_hi^2 Qt_h Qt_h^T||^(1/2) ),
       beta_hi^2 = sum_j p_ij^2 ||v_j - f_i||^2,

the last for a layer, with ``v_j - f_i`` in the values' space before ``W_O`` (the heads' terms are
``w_h W_O^h``, so they add up as ``[w_1 ... w_H] W_O``, and ``||w_h|| <= c beta_hi ||e_i Qt_h|| ||f||``);
with ``Theta_h`` the matrix of ``f -> (p_ij zeta_ij(f))_ij`` ((n^2) x (n d)) and ``Omega_i`` that of
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

Longer inputs get the split bound instead, which forms ``zeta`` one query at a time.  With ``a_hi = W_K q_i``, row
(h, i, j) of ``zeta`` is its own block ``o_hij = c ((delta_ij - p_ii) a_hi + W_Q (k_j - kappa_i))`` on
``e_i`` plus ``c (delta_mj - p_im) a_hi`` on the other tokens' ``e_m``; for row scales s (Minkowski, then
Cauchy-Schwarz per (h, i))

    ||diag(s) zeta|| <= max_i ||diag(s_i) [o_hij]_(h,j)|| + c ||diag(nu) [a_hi]_(h,i)||,
    nu_hi = ||diag(s_hi) [delta_mj - p_im]_(j, m != i)||  (an n x (n - 1) matrix),

while the rows of one query i, ``H n`` of them, get their norms from their own Gram matrix.  It takes
one ``H n x d`` Gram matrix, 2 n of size ``H n`` and ``H n`` of size n (at a cost that no longer grows as n^6); its
deviation arrays have ``H n^4`` entries (:data:`SPLIT_ENTRIES` caps them).
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import Enclosure, RowGram, spectral_norm_upper_large
from ..symbolic import local as T
from .bounds import LocalBounds, attention_norms, evaluate_theorem, head_movement, value_space
from .enclosed import EnclosedAttention, head_products

__all__ = ["AttentionCurvature", "CURVATURE_ENTRIES", "CURVATURE_TOKENS", "SPLIT_ENTRIES"]

#: Largest ``H n^3 d`` for which the curvature matrices are formed (memory: n <= 25 at MiniLM's width).
CURVATURE_ENTRIES = 80_000_000
#: Default largest number of tokens for the Gram route (time per radius at MiniLM's width: about
#: 2.5 s at 16 tokens, 9 s at 20, 25 s at 24, growing as n^6); longer inputs take the split bound.
CURVATURE_TOKENS = 20
#: Largest ``H n^4`` for which the split bound is formed: n <= 64 with 12 heads (at n = 61 on MiniLM: about
#: 2 minutes to set up, 10 s per radius, 4 GB).
SPLIT_ENTRIES = 12 * 64 ** 4


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

    The matrices at X and their norms are built once; :meth:`chis` adds a neighbourhood's deviations and
    :meth:`piece` makes one term of the theorem's sum.
    """

    def __init__(self, E: EnclosedAttention, target, split: bool = False):
        engine = E.engine
        H, n, d = engine.H, E.n, engine.d
        self.E, self.H, self.n, self.split = E, H, n, split
        self.norms = attention_norms(engine)
        values, outputs, self.value_norms = value_space(E, target)
        products = head_products(engine)                                                # A_h, (H, d, d_out)
        self.values_joint = _norm(products.swapaxes(0, 1).reshape(d, -1))               # ||[A_1 ... A_H]||
        scores = IntervalArray.stack([IntervalArray.from_enclosure(Enclosure.exact(W_Q) @ Enclosure.exact(W_K.T))
                         for W_Q, W_K in (engine.head_weights(h)[:2] for h in range(H))])
        self.scores_joint = _norm(scores.swapaxes(0, 1).reshape(d, -1))                 # ||[Qt_1 ... Qt_H]||
        # chi_III through the values before W_O (a layer): ||W_O||, Qt_h Qt_h^T and ||v_j - f_i|| at X
        self.output_norm = None if engine.W_O is None else _norm(IntervalArray(engine.W_O))
        if self.output_norm is not None:
            self.score_grams = scores.bmm(scores.swapaxes(1, 2))                          # (H, d, d)
            self.value_rho = (E.V.expand(1) - E.F.expand(2)).norm_upper()                # ||v_j - f_i||, (H, n, n)
        u = values.expand(1) - outputs.expand(2)                                       # u_ij at X, (H, n, n, d_out)
        self.rho = IntervalArray(u.norm_lower(), u.norm_upper())                        # ||u_ij|| at X
        kappa = E.P.einsum("hil,hlk->hik", E.K)                                         # sum_l p_il k_l
        spread = E.K.expand(1) - kappa.expand(2)                                        # k_j - kappa_i, (H, n, n, d_k)
        key_part, query_part = [], []
        for h in range(H):
            W_Q, W_K = engine.head_weights(h)[:2]
            key_part.append(spread[h].matmul(W_Q.T))                                   # W_Q (k_j - kappa_i), (n, n, d)
            query_part.append(E.Q[h].matmul(W_K.T))                                    # W_K q_i, (n, d)
        key_part, query_part = IntervalArray.stack(key_part), IntervalArray.stack(query_part)
        self.key_norms = key_part.norm_upper()                                          # (H, n, n)
        self.query_norms = query_part.norm_upper()                                      # (H, n)
        # zeta_ij as a row: block m is c (delta_mj - p_im) W_K q_i + [m = i] c W_Q (k_j - kappa_i)
        coefficient = IntervalArray(np.eye(n)[None, None]) - E.P.expand(2)              # (H, n(i), n(j), n(m))
        self.coefficient = coefficient.magnitude                                        # |delta_mj - p_im| at X
        self.c = E.c.hi.item()
        self.zeta_rows = _SplitRows(query_part, key_part, coefficient, E.c) if split \
            else self._gram(E, coefficient, query_part, key_part)
        # Theta at X (rows p_ij zeta_ij) and its norms; the neighbourhoods only add deviations
        p_at_x = E.P.magnitude                                                          # (H, n, n)
        self.G_norms = np.array([self.zeta_rows.norm_upper(p_at_x[h].ravel(), self._head_rows(h)) for h in range(H)])
        self.G_norm = self.zeta_rows.norm_upper(p_at_x.ravel())

    @staticmethod
    def _gram(E: EnclosedAttention, coefficient, query_part, key_part) -> RowGram:
        """The Gram matrix of ``zeta``'s rows, formed from the rows themselves."""
        H, n, d = E.engine.H, E.n, E.engine.d
        zeta = IntervalArray.stack([_query_rows(coefficient, query_part, key_part, E.c, i) for i in range(n)])
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
    def route(E: EnclosedAttention, tokens: int = CURVATURE_TOKENS) -> str | None:
        """``"gram"`` when X has at most ``tokens`` tokens and the matrices stay within
        :data:`CURVATURE_ENTRIES`, else ``"split"`` while ``H n^4`` stays within :data:`SPLIT_ENTRIES`, else None."""
        H, n = E.engine.H, E.n
        if n <= tokens and H * n ** 3 * E.engine.d <= CURVATURE_ENTRIES:
            return "gram"
        return "split" if H * n ** 4 <= SPLIT_ENTRIES else None

    def _functional_deviation(self, facts: dict, r: np.ndarray):
        """``(sup_U ||zeta_ijm||, sup_U ||zeta_ijm(Y) - zeta_ijm(X)||)`` per block m of each row, (H, n, n, n)."""
        QK = IntervalArray(self.norms["QK"][:, None])                                   # ||W_Q W_K^T||, (H, 1)
        delta, p_hi, c = IntervalArray(facts["delta"]), IntervalArray(facts["p_hi"]), IntervalArray(self.c)
        radii = IntervalArray(r)
        w_plus = IntervalArray(self.query_norms) + QK * radii[None, :]                 # ||W_K q_i|| on U, (H, n)
        # kappa_i moves by sum_l delta_il ||W_Q (k_l - kappa_i)|| + ||Qt|| sum_l p_il r_l
        moved_kappa = (delta * IntervalArray(self.key_norms)).sum(axis=-1) \
            + QK * (p_hi * radii[None, None, :]).sum(axis=-1)
        key_change = QK.expand(-1) * radii[None, None, :] + moved_kappa.expand(-1)     # (H, n(i), n(j))
        coef, moved_p = IntervalArray(self.coefficient), delta.expand(2)                # (H, n, n, n), delta_im
        w = w_plus[:, :, None, None]
        change = c * (moved_p * w + coef * (QK * radii[None, :])[:, :, None, None])
        size = c * (coef + moved_p) * w
        change_hi, size_hi = change.hi.copy(), size.hi.copy()
        for i in range(self.n):
            change_hi[:, i, :, i] = (IntervalArray(change_hi[:, i, :, i]) + c * key_change[:, i]).hi
            size_hi[:, i, :, i] = (IntervalArray(size_hi[:, i, :, i])
                                   + c * (IntervalArray(self.key_norms[:, i]) + key_change[:, i])).hi
        return size_hi, change_hi

    @staticmethod
    def _scaled_deviation(at_x: IntervalArray, on_u: IntervalArray, size: np.ndarray, change: np.ndarray) -> np.ndarray:
        """``sup_U ||s(Y) z(Y) - s(X) z(X)|| <= |s(Y) - s(X)| ||z(Y)|| + |s(X)| ||z(Y) - z(X)||`` per block,
        for row scales s enclosed at X and on U, shape (H, n, n)."""
        moved = np.maximum(np.maximum((on_u - IntervalArray(at_x.lo)).hi, (IntervalArray(at_x.hi) - on_u).hi), 0.0)
        return (IntervalArray(moved[..., None]) * IntervalArray(size)
                + IntervalArray(at_x.magnitude[..., None]) * IntervalArray(change)).hi

    def chis(self, bounds: LocalBounds, r: np.ndarray) -> tuple[float, float, float]:
        """``(chi_I, chi_II, chi_III)`` on the token balls with radii ``r``; ``bounds`` are those of
        :func:`~lipbound.local.bounds.attention_bounds` on the same balls (their ``facts``)."""
        E, facts = self.E, bounds.facts
        H, n = self.H, self.n
        p_on_u = IntervalArray(facts["p_lo"], facts["p_hi"])
        size, change = self._functional_deviation(facts, r)
        moved_u = IntervalArray(facts["value_shift"][:, None, :]) + IntervalArray(facts["head_movement"][:, :, None])
        rho_on_u = IntervalArray(np.maximum((self.rho - moved_u).lo, 0.0), (self.rho + moved_u).hi)
        p_plus = IntervalArray(facts["p_hi"])
        # chi_I: Theta_h per head and all heads stacked, the rows scaled at X plus the scale's change, or
        # scaled by the scale's upper end on U, where only zeta changes
        G_change = self._scaled_deviation(E.P, p_on_u, size, change)                  # (H, n, n, n)
        per_head = IntervalArray(self.G_norms) + IntervalArray(IntervalArray(G_change.reshape(H, -1)).norm_upper())
        stacked = IntervalArray(self.G_norm) + IntervalArray(IntervalArray(G_change.ravel()).norm_upper())
        stacked_upper = IntervalArray(self.zeta_rows.norm_upper(p_plus.hi.ravel())) \
            + IntervalArray((p_plus.expand(-1) * IntervalArray(change)).reshape(-1).norm_upper())
        first = min((IntervalArray(self.value_norms) * per_head).sum(axis=0).hi.item(),
                    (IntervalArray(self.values_joint) * stacked).hi.item(),
                    (IntervalArray(self.values_joint) * stacked_upper).hi.item())
        chi_I = (IntervalArray(2.0) * IntervalArray(first)).hi.item()
        # chi_II: Omega_i, rows (h, j) of query i scaled by the upper end of (p_ij ||u_ij||)^(1/2) on U
        # (scaling at X and adding the scale's change never did better on the MiniLM layers)
        weight = (p_plus * IntervalArray(rho_on_u.hi)).sqrt()
        row_change = (weight.expand(-1) * IntervalArray(change)).swapaxes(0, 1).reshape(n, -1).norm_upper()
        omega = [self.zeta_rows.norm_upper(weight.hi[:, i].ravel(), self._query_rows(i)) for i in range(n)]
        m = (IntervalArray(omega) + IntervalArray(row_change)).hi                              # omega_i
        scaled = (IntervalArray(m)[None, :, None] * weight).hi                                 # (H, n, n)
        chi_II = (IntervalArray(self.zeta_rows.norm_upper(scaled.ravel()))
                  + IntervalArray((IntervalArray(m) * IntervalArray(row_change)).norm_upper())).hi.item()
        # chi_III: W_ij = sum_h ||Qt_h|| p_ij ||u_ij||, or the heads joined through ||[Qt_1 ... Qt_H]||
        reach = p_plus * IntervalArray(rho_on_u.hi)                                             # (H, n, n)
        W = (IntervalArray(self.norms["QK"][:, None, None]) * reach).sum(axis=0)
        joined = IntervalArray(self.scores_joint) * IntervalArray(
            reach.swapaxes(0, 1).reshape(n, -1).norm_upper())
        third = min(float(np.max(np.minimum(W.norm_upper(), joined.hi))), self._values_joined(facts, r))
        chi_III = (IntervalArray(2.0) * IntervalArray(self.c) * IntervalArray(third)).hi.item()
        return chi_I, chi_II, chi_III

    def _values_joined(self, facts: dict, r: np.ndarray) -> float:
        """``||W_O|| max_i ||sum_h beta_hi^2 Qt_h Qt_h^T||^(1/2)`` with ``beta_hi^2 >= sum_j p_ij^2 ||v_j - f_i||^2``
        on U in the values' space (a layer's heads add up through W_O); inf for a single head."""
        if self.output_norm is None:
            return np.inf
        shift = (IntervalArray(self.norms["L_V"][:, None]) * IntervalArray(r[None, :])).hi         # ||V^h|| r_j
        moved = head_movement(facts["p_lo"], facts["p_hi"], facts["delta"], self.value_rho, shift)
        gap = IntervalArray(self.value_rho) + IntervalArray(shift[:, None, :]) + IntervalArray(moved[:, :, None])
        beta = (IntervalArray(facts["p_hi"]) * gap).norm_upper()                                     # (H, n)
        weights = IntervalArray(beta) * IntervalArray(beta)
        top = max(_norm(weights[:, i].einsum("h,hab->ab", self.score_grams)) for i in range(self.n))
        return (IntervalArray(self.output_norm) * IntervalArray(top).sqrt()).hi.item()

    @staticmethod
    def piece(chis: tuple, width: float) -> float:
        """One term ``(eps_k - eps_{k-1}) (chi_I + chi_II + chi_III)`` of theorem local-attention-curvature,
        from :meth:`chis` on ``U(X, eps_k)`` and the width ``eps_k - eps_{k-1}`` (rounded up)."""
        chi_I, chi_II, chi_III = chis
        return evaluate_theorem(T.attention_curvature(), **{
            r"\chi_{I}": chi_I, r"\chi_{II}": chi_II, r"\chi_{III}": chi_III,
            r"\Delta\epsilon_k": width}).item()


def _query_rows(coefficient: IntervalArray, query_part: IntervalArray, key_part: IntervalArray, c: IntervalArray,
                i: int) -> IntervalArray:
    """``zeta``'s rows ``(h, j)`` of query i, block m of each being ``c (delta_mj - p_im) W_K q_i + [m = i] c W_Q
    (k_j - kappa_i)``: shape (H, n(j), n(m), d)."""
    block = coefficient[:, i].expand(-1) * query_part[:, i].expand(1).expand(1)
    lo, hi = block.lo.copy(), block.hi.copy()
    own = IntervalArray(lo[:, :, i], hi[:, :, i]) + key_part[:, i]
    lo[:, :, i], hi[:, :, i] = own.lo, own.hi
    return IntervalArray(lo, hi) * c


class _SplitRows:
    """Certified ``||diag(s) zeta_R||`` by the split bound (module docstring), with the interface of
    :class:`~lipbound.rigorous.linalg.RowGram`: scales on the rows ``R`` (all by default) of ``zeta``'s
    rows ``(h, i, j)``, the others zero.  The rows of one query have a Gram matrix of their own (``H n``
    rows), which gives their norms without the split."""

    def __init__(self, query_part: IntervalArray, key_part: IntervalArray, coefficient: IntervalArray,
                 c: IntervalArray):
        H, n, d = query_part.shape
        self.shape, self.c = (H, n, n), c
        self.own, self.per_query = [], []
        for i in range(n):
            rows = _query_rows(coefficient, query_part, key_part, c, i)                   # (H, n(j), n(m), d)
            self.per_query.append(RowGram(rows.reshape(H * n, n * d).to_enclosure()))
            self.own.append(RowGram(rows[:, :, i].reshape(H * n, d).to_enclosure()))      # its own blocks o_hij
        self.queries = RowGram(query_part.reshape(H * n, d).to_enclosure())                # rows a_hi, (h, i)
        others = [np.arange(n) != i for i in range(n)]
        # (delta_mj - p_im)_{j, m != i}
        self.others = [[RowGram(coefficient[h, i][:, others[i]].to_enclosure()) for i in range(n)] for h in range(H)]

    def norm_upper(self, scales, rows=None) -> float:
        s = np.zeros(int(np.prod(self.shape)))
        s[slice(None) if rows is None else rows] = scales
        s = s.reshape(self.shape)
        queries = np.flatnonzero(np.any(s > 0, axis=(0, 2)))
        if queries.size == 0:
            return 0.0
        moving = [np.flatnonzero(s[:, i].ravel()) for i in queries]
        if queries.size == 1:
            return self.per_query[queries[0]].norm_upper(s[:, queries[0]].ravel()[moving[0]], moving[0])
        own = max(self.own[i].norm_upper(s[:, i].ravel()[rows_i], rows_i) for i, rows_i in zip(queries, moving))
        nu = np.array([[self.others[h][i].norm_upper(s[h, i]) if np.any(s[h, i]) else 0.0
                        for i in range(self.shape[1])] for h in range(self.shape[0])]).ravel()   # (H n)
        active = np.flatnonzero(nu)
        other = self.queries.norm_upper(nu[active], active) if active.size else 0.0
        return (IntervalArray(own) + self.c * IntervalArray(other)).hi.item()


def _norm(matrix: IntervalArray) -> float:
    """Certified spectral norm of an interval matrix (midpoint's norm plus the radius's Frobenius norm)."""
    return spectral_norm_upper_large(matrix.to_enclosure())
