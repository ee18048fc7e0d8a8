"""Local theorems of second order: the attention's curvature with its score changes centred at X's weights, the
feed-forward slopes' remainder taken jointly over the neurons, and how far each token moves through an attention
layer.

They refine theorems of :mod:`lipbound.symbolic.local` (``local-attention-curvature``, ``local-feedforward-curvature``)
and the reach of an attention layer over a ball ``U(X, eps)``; the numeric layer (:mod:`lipbound.local`) measures
their quantities on real weights in interval arithmetic.  Notation as there: a head maps ``f_i = sum_j p_ij v_j``,
``u_ij = v_j A_h - f_i`` with ``A_h = V^h W_O^h``, ``ds_ij(e)`` the score changes along e, row convention for
Jacobians.  The proofs in words are in docs/mathematics.md, section 10.
"""

from __future__ import annotations

import functools

import sympy as sp

from .record import Derivation, Described, le
from .record import quantity as q
from .theorems import Theorem

__all__ = ["curvature_centred", "curvature_spread", "curvature_spread_sigma", "curvature_rows_variance",
           "curvature_weight_reach", "curvature_centred_change", "curvature_third_kronecker", "slope_remainder_joint",
           "feedforward_curvature_joint",
           "feedforward_folded_reach", "attention_reach_remainder",
           "attention_token_reach", "attention_token_remainder", "block_reach_weighted", "SECOND_ORDER_THEOREMS"]


@functools.cache
def curvature_centred() -> Theorem:
    """``chi_II <= ||[(omega_i + mu_i) Omega_i]_i|| + ||[omega_i M_i]_i||``: the second group of
    ``local-attention-curvature`` with the score changes centred at X's weights, ``zeta_ij = z_ij - m_i``."""
    stacked = q(r"\|[(\omega_i + \mu_i)\,\Omega_i]_i\|")
    moved = q(r"\|[\omega_i M_i]_i\|")
    statement = stacked + moved
    proof = Derivation("Second group of the attention's curvature, score changes centred at X's weights")
    proof.hypothesis("Y in U; at Y, zeta_ij = ds_ij - sum_l p_il(Y) ds_il (the centring of local-attention-curvature), "
                     "z_ij = ds_ij - sum_l p_il(X) ds_il and m_i = sum_l (p_il(Y) - p_il(X)) ds_il, per head h; "
                     "w_hij >= (p_ij ||u_ij||)^(1/2) on U; Omega_i the matrix of e -> (w_hij z_hij(e)) over the pairs "
                     "(h, j) and M_i that of e -> (w_hij m_hi(e)); omega_i >= ||Omega_i|| and mu_i >= ||M_i|| on U")
    proof.add(Described(r"\zeta_{ij} = z_{ij} - m_i"),
              "the changes p_il(Y) - p_il(X) sum to 0, so m_i = sum_l (p_il(Y) - p_il(X)) z_il: one number "
              "for every key j of the query")
    proof.add(Described(r"\textstyle\sum_j p_{ij} \zeta_{ij}(e) \zeta_{ij}(f) u_{ij} = \sum_j p_{ij} z_{ij}(e) "
                        r"z_{ij}(f) u_{ij} - m_i(f) V_i(e) - m_i(e) V_i(f),\ V_i(e) = \sum_j p_{ij} z_{ij}(e) u_{ij}"),
              "expand the product; m_i(e) m_i(f) sum_j p_ij u_ij vanishes since sum_j p_ij u_ij = 0 at Y",
              "softmax-derivative")
    proof.add(le(Described(r"\|\textstyle\sum_{h,j} p_{ij} z_{hij}(e) z_{hij}(f) u_{hij}\|"),
                 Described(r"\|\Omega_i e\|\,\|\Omega_i f\|")),
              "Cauchy-Schwarz over (h, j) with the weights w_hij^2 >= p_ij ||u_ij||", "norm-calculus")
    proof.add(le(Described(r"\|\textstyle\sum_h m_{hi}(f) V_{hi}(e)\|"), Described(r"\|M_i f\|\,\|\Omega_i e\|")),
              "the sum over (h, j) of w_hij |m_hi(f)| w_hij |z_hij(e)|, then Cauchy-Schwarz over (h, j)",
              "norm-calculus")
    proof.add(le(Described(r"\|\textstyle\sum_{h,j} p_{ij} \zeta_{hij}(e) \zeta_{hij}(f) u_{hij}\|"),
                 Described(r"(\omega_i + \mu_i)\,\|\Omega_i e\| + \omega_i\,\|M_i e\|")),
              "for unit e, f: ||Omega_i f|| <= omega_i, ||M_i f|| <= mu_i (the symmetric term with e and f "
              "exchanged)", "norm-calculus")
    proof.add(le(q(r"\chi_{II}"), statement),
              "the per-query terms stacked: the norm of the vector of sums a_i + b_i is at most the sum of the "
              "norms of the vectors of a_i and of b_i",
              "minkowski")
    return Theorem("local-curvature-centred", "Attention curvature with the score changes centred at X's weights",
                   statement, proof)


@functools.cache
def curvature_spread() -> Theorem:
    """``chi_II <= ||[omega_i S_i z_i]_i||``, ``s_hij = (w_hij^2 + 2 sigma_hi kappa_hi p+_hij)^(1/2)``: the second group
    of ``local-attention-curvature`` with the m term paid through the values' weighted spread (lemma
    ``curvature-covariance-spread``)."""
    statement = q(r"\|[\omega'_i\,S_i z_i]_i\|")
    proof = Derivation("Second group of the attention's curvature, the m term through the values' weighted spread")
    proof.hypothesis("Y in U; zeta_ij = z_ij - m_i per head h as in local-curvature-centred, m_hi = sum_l dp_hil "
                     "z_hil with dp = p(Y) - p(X); p+ the weights' upper ends and w_hij >= (p_ij ||u_ij||)^(1/2) on U; "
                     "kappa_hi >= (sum_l delta_hil^2 / p+_hil)^(1/2) with delta >= |dp| (dp_hil = 0 where p+_hil = 0); "
                     "sigma_hi >= ||diag(p_hi)^(1/2) U_hi||_2 on U, U_hi the rows u_hij; S_i the row scales s_hij = "
                     "(w_hij^2 + 2 sigma_hi kappa_hi p+_hij)^(1/2) of query i's rows (h, j) of z; omega'_i >= "
                     "||S_i z_i(Y)|| on U")
    proof.add(Described(r"\textstyle\sum_j p_{ij} \zeta_{ij}(e) \zeta_{ij}(f) u_{ij} = \sum_j p_{ij} z_{ij}(e) "
                        r"z_{ij}(f) u_{ij} - m_i(f) V_i(e) - m_i(e) V_i(f)"),
              "as in local-curvature-centred, V_i(e) = sum_j p_ij z_ij(e) u_ij", "softmax-derivative")
    proof.add(le(Described(r"\|V_{hi}(e)\|"), Described(r"\sigma_{hi}\,N_{hi}(e),\ N_{hi}(e)^2 = \textstyle\sum_j "
                                                        r"p^+_{hij} z_{hij}(e)^2")),
              "V_hi(e) = U_hi^T D^(1/2) (D^(1/2) z_hi(e)) with D = diag(p_hi), and p <= p+", "submultiplicative")
    proof.add(le(Described(r"|m_{hi}(f)|"), Described(r"\kappa_{hi}\,N_{hi}(f)")),
              "Cauchy-Schwarz with the weights p+ (m_hi = sum_l dp_hil z_hil)", "norm-calculus")
    proof.add(le(Described(r"\|\textstyle\sum_h m_{hi}(f) V_{hi}(e) + m_{hi}(e) V_{hi}(f)\|"),
                 Described(r"\textstyle\sum_h 2 \sigma_{hi} \kappa_{hi} N_{hi}(e) N_{hi}(f)")),
              "the two steps above, triangle inequality", "norm-calculus")
    proof.add(le(Described(r"\|\textstyle\sum_{h,j} p_{ij} \zeta_{hij}(e) \zeta_{hij}(f) u_{hij}\|"),
                 Described(r"\|S_i z_i(e)\|\,\|S_i z_i(f)\|")),
              "the pure term is at most sum_(h,j) w_hij^2 |z_hij(e)| |z_hij(f)|; Cauchy-Schwarz over the pairs (h, j) "
              "and the heads h together, whose squares add up to s_hij^2 z_hij^2", "norm-calculus")
    proof.add(le(q(r"\chi_{II}"), statement),
              "for unit e, f: ||S_i z_i(e)|| <= omega'_i, then the queries' rows stacked (the norm of the vector of "
              "the n products)", "submultiplicative")
    return Theorem("local-curvature-spread", "Attention curvature, the m term through the values' weighted spread",
                   statement, proof)


@functools.cache
def curvature_spread_sigma() -> Theorem:
    """``||diag(p_i(Y))^(1/2) U_hi(Y)||_2 <= ||diag(p+_hi)^(1/2) U_hi(X)||_2 + ||diag(p+_hi)^(1/2) dV_h||_F``: the
    values' weighted spread on U (lemma ``curvature-covariance-spread``)."""
    at_x, moved = q(r"\|\operatorname{diag}(p^+_{hi})^{1/2} U_{hi}(X)\|_2"), q(r"\|\operatorname{diag}(p^+_{hi})^{1/2}"
                                                                                 r"\,dV_h\|_F")
    statement = at_x + moved
    proof = Derivation("The values' weighted spread on a neighbourhood")
    proof.hypothesis("Y in U; u_ij(Y) = v_j(Y) - f_i(Y) with f_i = sum_j p_ij v_j, U_hi the matrix of rows u_ij; "
                     "p(Y) <= p+ entrywise; dV_h = V_h(Y) - V_h(X)")
    proof.add(Described(r"\|\operatorname{diag}(p)^{1/2} U\|_2^2 = \max_{\|x\| = 1} \textstyle\sum_j p_j ((v_j - f) "
                        r"\cdot x)^2"), "the top eigenvalue of U^T diag(p) U", "norm-calculus")
    proof.add(le(Described(r"\textstyle\sum_j p_j ((v_j - f) \cdot x)^2"),
                 Described(r"\textstyle\sum_j p_j ((v_j - c) \cdot x)^2")),
              "the weighted mean f minimises the weighted second moment (sum_j p_j = 1), for every fixed c; take c = "
              "f_i(X)", "cauchy-schwarz-cov")
    proof.add(le(Described(r"\|\operatorname{diag}(p(Y))^{1/2} U_{hi}(Y)\|_2"), statement),
              "p <= p+ (the form grows with each weight), then Weyl's inequality for V_h(Y) - 1 c^T = (V_h(X) - 1 c^T) "
              "+ dV_h and ||.||_2 <= ||.||_F", "norm-calculus")
    return Theorem("local-curvature-spread-sigma", "The values' weighted spread on a neighbourhood", statement, proof)


@functools.cache
def curvature_weight_reach() -> Theorem:
    """``p_ij ||u_ij|| <= max_(p in [p-, p+]) p (1 - p) D_hj``: a weight and its value's distance to the output together
    (lemma ``curvature-weight-reach``)."""
    statement = q(r"\max_{p \in [p^-_{ij}, p^+_{ij}]} p (1 - p)\,D_{hj}")
    proof = Derivation("A weight and its value's distance to the output together")
    proof.hypothesis("Y in U; p_ij(Y) in [p-_ij, p+_ij]; f_i = sum_l p_il v_l with sum_l p_il = 1; D_hj >= max_l "
                     "||v_j(Y) - v_l(Y)|| on U")
    proof.add(Described(r"u_{ij} = v_j - f_i = \textstyle\sum_{l \ne j} p_{il} (v_j - v_l)"),
              "the weights sum to 1", "norm-calculus")
    proof.add(le(Described(r"\|u_{ij}\|"), Described(r"(1 - p_{ij})\,D_{hj}")),
              "triangle inequality, sum_(l != j) p_il = 1 - p_ij", "norm-calculus")
    proof.add(le(Described(r"p_{ij} \|u_{ij}\|"), statement),
              "p (1 - p) over the weight's range on U", "norm-calculus")
    return Theorem("local-curvature-weight-reach", "A weight and its value's distance to the output together",
                   statement, proof)


@functools.cache
def curvature_rows_variance() -> Theorem:
    """``||diag(p(Y)) zeta(Y) f|| <= ||diag(s) z(Y) f||``, ``s_hij = (max_l p+_hil p+_hij)^(1/2)``: the first group's
    rows without m (lemma ``curvature-rows-variance``)."""
    statement = q(r"\|\operatorname{diag}(s)\,z(Y) f\|")
    proof = Derivation("The first group's rows through the weights' variance")
    proof.hypothesis("Y in U; zeta_ij = z_ij - m_i as in local-curvature-centred; p+ the weights' upper ends on U; "
                     "s_hij = (max_l p+_hil p+_hij)^(1/2)")
    proof.add(le(Described(r"\textstyle\sum_j p_{ij}^2 \zeta_{ij}(f)^2"),
                 Described(r"(\max_l p_{il}) \textstyle\sum_j p_{ij} \zeta_{ij}(f)^2")), "p_ij <= max_l p_il",
              "norm-calculus")
    proof.add(le(Described(r"\textstyle\sum_j p_{ij} \zeta_{ij}(f)^2"), Described(r"\textstyle\sum_j p_{ij} "
                                                                                    r"z_{ij}(f)^2")),
              "zeta_i(f) is z_i(f) less its weighted mean m_i(f), and the weighted mean minimises the weighted second "
              "moment", "cauchy-schwarz-cov")
    proof.add(le(Described(r"\|\operatorname{diag}(p(Y))\,\zeta(Y) f\|"), statement),
              "p <= p+ in both factors, summed over the heads and queries", "norm-calculus")
    return Theorem("local-curvature-rows-variance", "The first group's rows through the weights' variance", statement,
                   proof)


@functools.cache
def curvature_centred_change() -> Theorem:
    """``||diag(s_i) (z_i(Y) - z_i(X))||_2 <= c t (lambda_1i^(1/2) + lambda_2i^(1/2))``: z's change on a Frobenius ball
    with the heads' score maps together (lemma ``curvature-centred-change``)."""
    statement = q(r"c\,t\,(\lambda_{1i}^{1/2} + \lambda_{2i}^{1/2})")
    proof = Derivation("The centred score changes' change on a Frobenius ball, the heads' score maps together")
    proof.hypothesis("dot-product heads, Qt_h = W_Q^h W_K^h^T; ||Y - X||_F <= t, Delta = Y - X; z_hij(e) = ds_hij(e) - "
                     "sum_l p_hil(X) ds_hil(e) at Y; s >= 0 row scales of query i's rows (h, j); kappa_hi >= "
                     "||diag(s_hi) (I - 1 p_hi(X)^T)||_2^2; lambda_1i >= lambda_max(sum_h kappa_hi Qt_h Qt_h^T) and "
                     "lambda_2i >= lambda_max(sum_h kappa_hi Qt_h^T Qt_h)")
    proof.add(Described(r"z_{hij}(Y)(e) - z_{hij}(X)(e) = c\,(e_i \cdot Qt_h (\Delta_j - \tilde\Delta_{hi}) + (e_j - "
                        r"\tilde e_{hi}) \cdot Qt_h^T \Delta_i)"),
              "ds_ij(e) = c (e_i . Qt_h y_j + e_j . Qt_h^T y_i) plus terms free of Y; the centring with X's weights "
              "(tilde: sum_l p_hil(X) .) is the same at X and Y", "norm-calculus")
    proof.add(le(Described(r"\|(s_{hij} (e_j - \tilde e_{hi}) \cdot Qt_h^T \Delta_i)_{h,j}\|"),
                 Described(r"\lambda_{1i}^{1/2} \|\Delta_i\|\,\|e\|")),
              "for each h the rows are diag(s_hi) (I - 1 p_hi^T) times the one vector Qt_h^T Delta_i, of norm at most "
              "kappa_hi^(1/2) ||Qt_h^T Delta_i||; the squares summed over h are a quadratic form in Delta_i",
              "submultiplicative")
    proof.add(le(Described(r"\|(s_{hij}\, e_i \cdot Qt_h (\Delta_j - \tilde\Delta_{hi}))_{h,j}\|"),
                 Described(r"\lambda_{2i}^{1/2} \|\Delta\|_F\,\|e\|")),
              "the rows act on e_i alone; their Frobenius norm squared is sum_h tr(Qt_h Delta^T C_hi Delta Qt_h^T) "
              "with C_hi = (I - 1 p_hi^T)^T diag(s_hi^2) (I - 1 p_hi^T) <= kappa_hi I", "norm-calculus")
    proof.add(le(Described(r"\|\operatorname{diag}(s_i) (z_i(Y) - z_i(X))\|_2"), statement),
              "Minkowski's inequality for the two parts, ||Delta_i|| <= ||Delta||_F <= t", "minkowski")
    return Theorem("local-curvature-centred-change", "The centred score changes on a Frobenius ball, heads together",
                   statement, proof)


@functools.cache
def curvature_third_kronecker() -> Theorem:
    """``chi_III <= 2 c (kappa + (sum_h delta_h)^(1/2) lambda^(1/2))``: the third group of the attention's curvature
    with the heads and the direction's tokens in one Kronecker operator per query (lemma
    ``curvature-third-kronecker``)."""
    kappa, delta, lam, c = q(r"\kappa_X"), q(r"\textstyle\sum_h \delta_h"), q(r"\lambda_\delta"), q("c")
    statement = 2 * c * (kappa + sp.sqrt(delta) * sp.sqrt(lam))
    proof = Derivation("Third group of the attention's curvature, the heads and the direction's tokens together")
    proof.hypothesis("dot-product heads, Qt_h = W_Q^h W_K^h^T (d, d); D_hi = diag(p_hi) U_hi (n, d_out) with rows "
                     "p_hij u_hij at Y in U; K_i = sum_h Qt_h^T kron D_hi; "
                     "kappa_X^2 >= lambda_max(sum_i K_i(X) K_i(X)^T); "
                     "delta_hi >= ||D_hi(Y) - D_hi(X)||_2 on U, delta_h >= delta_hi for every i; lambda_delta >= "
                     "lambda_max(sum_h delta_h Qt_h Qt_h^T)")
    proof.add(Described(r"r_i(e, F) \cdot y = c \langle F, \textstyle\sum_h (D_{hi} y^T)(e_i Qt_h) \rangle"),
              "the third group's half at query i is c sum_(h, j) p_hij (e_i Qt_h f_j^T) u_hij; its value at a unit "
              "y is the Frobenius product of F with the n x d matrix sum_h (D_hi y^T)(e_i Qt_h)", "norm-calculus")
    proof.add(le(Described(r"\|\textstyle\sum_h (D_{hi} y^T)(e_i Qt_h)\|_F"),
                 Described(r"\|K_i\|_2\,\|e_i\|\,\|y\|")),
              "its entries are those of K_i (e_i^T kron y^T): (Qt_h^T e_i^T)_a (D_hi y^T)_j summed over h",
              "submultiplicative")
    proof.add(le(Described(r"\|K_i(X)\|_2"), kappa),
              "K_i K_i^T = sum_(h, g) (Qt_h^T Qt_g) kron (D_hi D_gi^T) is PSD for every i, so each is below their sum",
              "norm-calculus")
    proof.add(le(Described(r"\|K_i(Y) - K_i(X)\|_2"), sp.sqrt(delta) * sp.sqrt(lam)),
              "Qt_h^T kron Delta_hi = (I kron Delta_hi)(Qt_h^T kron I); the heads by the triangle inequality, then "
              "Cauchy-Schwarz with the weights delta_h: sum_h delta_h ||(Qt_h^T kron I) z|| <= (sum_h delta_h)^(1/2) "
              "(z^T (sum_h delta_h Qt_h Qt_h^T kron I) z)^(1/2)", "norm-calculus")
    proof.add(le(Described(r"\chi_{III}"), statement),
              "both halves of the third group (e and f swapped) are so bounded; ||r|| <= c max_i ||K_i|| ||e|| ||F||_F "
              "over the rows i, and ||K_i(Y)|| <= ||K_i(X)|| + ||K_i(Y) - K_i(X)||", "minkowski")
    return Theorem("local-curvature-third-kronecker", "The curvature's third group through one Kronecker operator",
                   statement, proof)


def _slope_hypotheses(proof: Derivation) -> None:
    proof.hypothesis("x -> act(x W_1 + b_1) W_2 with w_k the columns of W_1, h_k = x w_k + b_k, g_k = act''(h_k); "
                     "e = x' - x with ||e|| <= R; rho_k = act'(h_k + e w_k) - act'(h_k) - g_k (e w_k); S_k >= "
                     "|act^(3)| on [h_k - ||w_k|| R, h_k + ||w_k|| R] (for GELU at most a certified cap of its "
                     "third derivative's magnitude)")


@functools.cache
def slope_remainder_joint() -> Theorem:
    """``||A diag(rho) B|| <= (R^2 / 2) (lambda_A lambda_B)^(1/2)``: the slopes' second-order remainder, jointly over
    the neurons (lemma ``slope-remainder-quadratic``), for any A with columns ``a_k`` and B with rows ``b_k``."""
    R, lam_a, lam_b = q("R"), q(r"\lambda_A"), q(r"\lambda_B")
    statement = R**2 / 2 * sp.sqrt(lam_a * lam_b)
    proof = Derivation("The remainder of the feed-forward slopes, jointly over the neurons")
    _slope_hypotheses(proof)
    proof.hypothesis("A with columns a_k, B with rows b_k; lambda_A = lambda_max(diag(S)^(1/2) (W_1^T W_1 o A^T A) "
                     "diag(S)^(1/2)) and lambda_B the same with B B^T, o the entrywise product")
    proof.add(le(Described(r"|\rho_k|"), Described(r"S_k (e \cdot w_k)^2 / 2")),
              "Taylor's theorem for act' on the segment from h_k to h_k + e w_k, with Lagrange's remainder",
              "mean-value")
    proof.add(le(Described(r"|u^\top A \operatorname{diag}(\rho) B v|"), Described(r"\tfrac12\,\sigma_a \sigma_b")),
              "the triangle inequality over k, then Cauchy-Schwarz over k, with sigma_a and sigma_b below",
              "norm-calculus")
    proof.add(Described(r"\sigma_a = (\textstyle\sum_k S_k (e \cdot w_k)^2 (u \cdot a_k)^2)^{1/2},\ "
                        r"\sigma_b = (\textstyle\sum_k S_k (e \cdot w_k)^2 (b_k \cdot v)^2)^{1/2}"),
              "the two factors")
    proof.add(Described(r"\sigma_a^2 = \|M^\top (e \otimes u)\|^2,\ "
                        r"M^\top M = \operatorname{diag}(S)^{1/2} (W_1^\top W_1 \circ A^\top A) "
                        r"\operatorname{diag}(S)^{1/2}"),
              "M the matrix of columns S_k^(1/2) w_k (x) a_k; (w_k (x) a_k) . (w_l (x) a_l) = (w_k . w_l)(a_k . a_l)",
              "norm-calculus")
    proof.add(le(Described(r"\|A \operatorname{diag}(\rho) B\|"), statement),
              "||e (x) u|| = ||e|| ||u|| <= R for unit u, so the first factor is at most R lambda_A^(1/2); the second "
              "the same with b_k", "submultiplicative")
    return Theorem("local-slope-remainder-joint", "The remainder of the slopes of a feed-forward block, jointly over "
                   "its neurons", statement, proof)


@functools.cache
def feedforward_curvature_joint() -> Theorem:
    """``sup ||D(x') - D(x)|| <= R Lambda^(1/2) + (R^2 / 2) (lambda_1 lambda_2)^(1/2)`` on ``B(x, R)``: theorem
    ``local-feedforward-curvature`` with the per-neuron split replaced by ``local-slope-remainder-joint`` at
    ``A = W_1``, ``B = W_2`` (lemma ``feedforward-remainder-joint``)."""
    R, root, lam_1, lam_2 = q("R"), q(r"\Lambda^{1/2}"), q(r"\lambda_1"), q(r"\lambda_2")
    statement = R * root + R**2 / 2 * sp.sqrt(lam_1 * lam_2)
    proof = Derivation("Variation of the feed-forward Jacobian, its remainder jointly over the neurons")
    _slope_hypotheses(proof)
    proof.hypothesis("D(x) = W_1 diag(act'(h)) W_2 the Jacobian of x -> x + act(x W_1 + b_1) W_2 + b_2 less the "
                     "identity; Lambda as in local-feedforward-curvature; G_1 = W_1^T W_1, G_2 = W_2 W_2^T, lambda_1 = "
                     "lambda_max(diag(S)^(1/2) (G_1 o G_1) diag(S)^(1/2)), lambda_2 the same with G_1 o G_2")
    proof.add(Described(r"D(x') - D(x) = W_1 \operatorname{diag}(g \odot (e W_1)) W_2 + W_1 \operatorname{diag}(\rho) "
                        r"W_2"), "act'(h_k + e w_k) - act'(h_k) = g_k (e w_k) + rho_k", "norm-calculus")
    proof.add(le(Described(r"\|W_1 \operatorname{diag}(g \odot (e W_1)) W_2\|"), R * root),
              "the second derivative at the centre, as in local-feedforward-curvature", "submultiplicative")
    proof.add(le(Described(r"\|W_1 \operatorname{diag}(\rho) W_2\|"), R**2 / 2 * sp.sqrt(lam_1 * lam_2)),
              "local-slope-remainder-joint with A = W_1 (W_1^T W_1 o A^T A = G_1 o G_1) and B = W_2 (G_1 o G_2)",
              "submultiplicative")
    proof.add(le(Described(r"\sup \|D(x') - D(x)\|"), statement), "triangle inequality", "norm-calculus")
    return Theorem("local-feedforward-curvature-joint", "Variation of the feed-forward Jacobian, its remainder jointly "
                   "over the neurons", statement, proof)


@functools.cache
def feedforward_folded_reach() -> Theorem:
    """``sup ||J_1(x) (J_F(y_2) - J_F(x_2))|| <= ||J_1(x) W_1 diag(s)^(1/2)|| ||diag(s)^(1/2) W_2||`` on the image of a
    token's ball through the first LayerNorm, ``s`` the slopes' deviations over the folded reach ``c_k`` (lemma
    ``feedforward-folded-reach``)."""
    a, b = q(r"\|J_1(x) W_1 \operatorname{diag}(s)^{1/2}\|"), q(r"\|\operatorname{diag}(s)^{1/2} W_2\|")
    statement = a * b
    proof = Derivation("The feed-forward block on the image of a ball through the LayerNorm before it")
    proof.hypothesis("y in B(x, r), y_2 = LN_1(y), x_2 within rho of LN_1(x) and ||y_2 - x_2|| <= R; V_1 >= the "
                     "variation of J_1 on B(x, r), delta >= r V_1 + rho; w_k the columns of W_1, h_k = x_2 w_k + b_k; "
                     "c_k = min(R ||w_k||, r ||J_1(x) w_k|| + delta ||w_k||); s_k >= |act'(h_k + t) - act'(h_k)| for "
                     "|t| <= c_k; J_F = I + W_1 diag(act'(y_2 W_1 + b_1)) W_2")
    proof.add(Described(r"y_2 - x_2 = (y - x) J_1(x) + e_1,\ \|e_1\| \le r V_1 + \rho"),
              "mean value theorem for LN_1 on the segment from x to y (its mean Jacobian within V_1 of J_1(x)), and "
              "the centre's rounding", "mean-value")
    proof.add(le(Described(r"|(y_2 - x_2) \cdot w_k|"), Described(r"c_k")),
              "Cauchy-Schwarz on (y - x) . (J_1(x) w_k) and on e_1 . w_k; and on (y_2 - x_2) . w_k with ||y_2 - x_2|| "
              "<= R", "norm-calculus")
    proof.add(Described(r"J_1(x) (J_F(y_2) - J_F(x_2)) = (J_1(x) W_1) \operatorname{diag}(\Delta) W_2,\ "
                        r"|\Delta_k| \le s_k"),
              "neuron k's slope moves from act'(h_k) to act'(h_k + (y_2 - x_2) . w_k)", "norm-calculus")
    proof.add(le(Described(r"\sup \|J_1(x) (J_F(y_2) - J_F(x_2))\|"), statement),
              "|Delta| <= diag(s): diag(Delta) = diag(s)^(1/2) E diag(s)^(1/2) with ||E|| <= 1, then "
              "submultiplicativity (as local-feedforward-variation, whose bounds on J_F hold on the same set)",
              "submultiplicative")
    return Theorem("local-feedforward-folded-reach", "The feed-forward block behind a LayerNorm on the image of a "
                   "ball", statement, proof)


def _reach_hypotheses(proof: Derivation) -> None:
    proof.hypothesis("A an attention layer, U(X, eps) a ball of one of local's kinds (homogeneous: X + s (Y - X) "
                     "lies in U(X, s eps) for Y in U(X, eps) and 0 <= s <= 1), ||Y - X||_F <= theta_U eps on it; "
                     "kappa(r) >= "
                     "sup ||D^2 A|| over U(X, r), non-decreasing in r (local-attention-curvature: chi_I + chi_II + "
                     "chi_III); 0 = t_0 < t_1 < ... < t_K = eps")


@functools.cache
def attention_reach_remainder() -> Theorem:
    """``sup_U ||A(Y) - A(X)||_F <= ||DA(X)|| theta_U eps + theta_U^2 sum_k (t_k - t_{k-1}) (eps - (t_{k-1} +
    t_k) / 2) kappa(t_k)``: how far an attention layer moves a ball, through Taylor's remainder (lemma
    ``attention-reach-remainder``)."""
    jac, theta, eps = q(r"\|DA(X)\|"), q(r"\theta_U"), q(r"\epsilon")
    rest = q(r"\textstyle\sum_k (t_k - t_{k-1}) (\epsilon - \frac{t_{k-1} + t_k}{2})\,\kappa(t_k)")
    statement = jac * theta * eps + theta**2 * rest
    proof = Derivation("How far an attention layer moves a ball")
    _reach_hypotheses(proof)
    proof.add(Described(r"A(Y) - A(X) - DA(X)\,\delta = \textstyle\int_0^1 \int_0^t D^2A(X + s \delta)[\delta, \delta]"
                        r"\,ds\,dt,\ \delta = Y - X"), "Taylor's theorem with the integral remainder", "mean-value")
    proof.add(le(Described(r"\|A(Y) - A(X) - DA(X)\,\delta\|_F"),
                 Described(r"\theta_U^2 \textstyle\int_0^\epsilon (\epsilon - r)\,\kappa(r)\,dr")),
              "X + s delta lies in U(X, s eps) and ||delta||_F <= theta_U eps; substitute r = s eps",
              "norm-calculus")
    proof.add(le(Described(r"\textstyle\int_0^\epsilon (\epsilon - r)\,\kappa(r)\,dr"), rest),
              "on [t_(k-1), t_k], kappa(r) <= kappa(t_k) and eps - r >= 0 integrates to (t_k - t_(k-1)) "
              "(eps - (t_(k-1) + t_k) / 2)", "norm-calculus")
    proof.add(le(Described(r"\sup_U \|A(Y) - A(X)\|_F"), statement),
              "triangle inequality with ||DA(X) delta||_F <= ||DA(X)|| theta_U eps", "submultiplicative")
    return Theorem("local-attention-reach-remainder", "How far an attention layer moves a ball", statement, proof)


@functools.cache
def attention_token_reach() -> Theorem:
    """``||A(Y)_i - A(X)_i|| <= c_i theta_U eps + rest_i`` on U: each output token's own reach (lemma
    ``attention-token-reach``), ``c_i`` the norm of output token i's column block of DA(X)."""
    c_i, theta, eps, rest = q("c_i"), q(r"\theta_U"), q(r"\epsilon"), q(r"\operatorname{rest}_i")
    statement = c_i * theta * eps + rest
    proof = Derivation("How far each token moves through an attention layer")
    _reach_hypotheses(proof)
    proof.hypothesis("c_i >= ||DA(X)_(:, i)||_2, the d columns of output token i (row convention: the rows are the "
                     "moving tokens' inputs); rest_i >= sup_U ||r(Y)_i|| for the remainder r(Y) = A(Y) - A(X) - "
                     "(Y - X) DA(X), e.g. the Frobenius bound of local-attention-reach-remainder")
    proof.add(Described(r"A(Y)_i - A(X)_i = (Y - X)\,DA(X)_{:, i} + r(Y)_i"), "token i's rows of Taylor's expansion",
              "mean-value")
    proof.add(le(Described(r"\|(Y - X)\,DA(X)_{:, i}\|"), c_i * theta * eps),
              "||Y - X||_F <= theta_U eps", "submultiplicative")
    proof.add(le(Described(r"\|A(Y)_i - A(X)_i\|"), statement), "triangle inequality", "norm-calculus")
    return Theorem("local-attention-token-reach", "How far each token moves through an attention layer", statement,
                   proof)


@functools.cache
def attention_token_remainder() -> Theorem:
    """``||(A(Y) - A(X) - DA(X) delta)_i|| <= theta_U^2 sum_k (t_k - t_{k-1}) (eps - (t_{k-1} + t_k) / 2)
    chi_i(t_k)``: Taylor's remainder of output token i from query i's own curvature groups (lemma
    ``curvature-per-query``)."""
    theta = q(r"\theta_U")
    rest = q(r"\textstyle\sum_k (t_k - t_{k-1}) (\epsilon - \frac{t_{k-1} + t_k}{2})\,\chi_i(t_k)")
    statement = theta**2 * rest
    proof = Derivation("Taylor's remainder of an attention layer, output token by output token")
    _reach_hypotheses(proof)
    proof.hypothesis("chi_i(r) >= sup ||D^2 A[e, f]_i|| over U(X, r) and unit e, f: query i's own terms of the three "
                     "groups of local-attention-curvature (its rows p_ij zeta_ij, its Omega_i and M_i of "
                     "local-curvature-centred, its value spreads), non-decreasing in r")
    proof.add(Described(r"D^2A[e, f]_i = \textstyle\sum_h \sum_j (\ldots)_{hij}"),
              "differentiating row i of the attention twice reads only query i's weights, score changes and value "
              "spreads (the first display of local-attention-curvature's proof)", "softmax-derivative")
    proof.add(le(Described(r"\|(A(Y) - A(X) - DA(X)\,\delta)_i\|"), statement),
              "as in local-attention-reach-remainder, token i's rows of the integral remainder with chi_i for kappa",
              "mean-value")
    return Theorem("local-attention-token-remainder", "Taylor's remainder of an attention layer, token by token",
                   statement, proof)


@functools.cache
def block_reach_weighted() -> Theorem:
    """``||F(Y) - F(X)||_F <= ||DA(X) D_w|| theta_U eps + min(max_i w_i rest, (sum_i w_i^2 rest_i^2)^(1/2))`` for a
    block ``F = T o A``, ``w_i = tau_i + omega_i`` (lemma ``block-reach-weighted``)."""
    weighted, theta, eps = q(r"\|DA(X)\,D_w\|"), q(r"\theta_U"), q(r"\epsilon")
    whole, tokens = q(r"\max_i w_i\,\operatorname{rest}"), q(r"\|(w_i \operatorname{rest}_i)_i\|")
    statement = weighted * theta * eps + sp.Min(whole, tokens)
    proof = Derivation("How far a block moves a ball, token by token")
    _reach_hypotheses(proof)
    proof.hypothesis("F = T o A with T acting token by token; w_i >= tau_i + omega_i >= sup ||DT_i|| over a convex "
                     "ball of token i holding A(U) (local-attention-tail); D_w = diag(w_i I); rest >= sup_U ||r(Y)||_F "
                     "(local-attention-reach-remainder) and rest_i >= sup_U ||r(Y)_i|| "
                     "(local-attention-token-remainder) for r(Y) = A(Y) - A(X) - (Y - X) DA(X)")
    proof.add(le(Described(r"\|F(Y)_i - F(X)_i\|"), Described(r"w_i\,\|A(Y)_i - A(X)_i\|")),
              "mean value theorem for T_i on its convex ball", "mean-value")
    proof.add(Described(r"(w_i (A(Y)_i - A(X)_i))_i = (Y - X)\,DA(X)\,D_w + (w_i r(Y)_i)_i"),
              "Taylor's expansion, row convention: D_w scales output token i's columns", "norm-calculus")
    proof.add(le(Described(r"\|(w_i r(Y)_i)_i\|_F"), sp.Min(whole, tokens)),
              "sum_i w_i^2 ||r_i||^2 is at most max_i w_i^2 ||r||_F^2 and at most sum_i w_i^2 rest_i^2",
              "norm-calculus")
    proof.add(le(Described(r"\|F(Y) - F(X)\|_F"), statement),
              "Minkowski's inequality over the tokens; ||(Y - X) DA(X) D_w||_F <= ||DA(X) D_w|| theta_U eps",
              "minkowski")
    return Theorem("local-block-reach-weighted", "How far a block moves a ball, token by token", statement, proof)


#: the theorems of this module, by id (part of :data:`lipbound.symbolic.local.LOCAL_THEOREMS`)
SECOND_ORDER_THEOREMS = {t.id: t for t in (curvature_centred(), curvature_spread(), curvature_spread_sigma(),
                                           curvature_rows_variance(), curvature_weight_reach(),
                                           curvature_centred_change(), curvature_third_kronecker(),
                                           slope_remainder_joint(), feedforward_curvature_joint(),
                                           feedforward_folded_reach(), attention_reach_remainder(),
                                           attention_token_reach(), attention_token_remainder(),
                                           block_reach_weighted())}
