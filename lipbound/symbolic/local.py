"""Local theorems: bounds on a neighbourhood of a real input, from facts measured on that input.

The global theorems (:mod:`lipbound.symbolic.theorems`) hold on a whole domain and pay for its
worst case.  These hold on a *product of token balls* ``U = {Y : ||y_j - x_j|| <= r_j}`` around a
concrete input X (or on a piece of a segment), and take as data what X and U make measurable:
the scores, attention weights, values, key and query norms at X, the radii r_j, the LayerNorm's
centred norm, the GELU slope ranges.  Each theorem's statement is a closed form in those
quantities; the numeric layer (:mod:`lipbound.local`) measures the quantities in interval
arithmetic and evaluates the statement with :func:`lipbound.rigorous.compiler.compile_array`.

Notation (docs/local.md): a head maps ``f_i = sum_j p_ij v_j`` with ``q_i = x_i W_Q + b_Q``,
``k_j = x_j W_K + b_K``, ``v_j = x_j V + b_V``, ``s_ij = c q_i . k_j`` (``c = 1/sqrt(d_k)``) and
``p_ij = m_j e^{s_ij} / sum_l m_l e^{s_il}`` (atom masses m_j; all 1 for a sentence).  Bars mark
values at X, ``J_ij = d f_i / d x_j`` (a d_v x d block), ``Pi_i`` the set of probability vectors
within the softmax ranges of row i, and ``E_i[z] = max_{p in Pi_i} sum_l p_l z_l``.
"""

from __future__ import annotations

import functools

import sympy as sp

from . import symbols as S
from .local_block_forms import (
    BLOCK_FORM_THEOREMS,
    centred_floor,
    feedforward_taylor_directed,
    feedforward_taylor_joint,
    feedforward_taylor_signed,
    token_form_nested,
    token_form_step,
)
from .local_jacobian import JACOBIAN_THEOREMS
from .local_second_order import SECOND_ORDER_THEOREMS, attention_token_reach, block_reach_weighted
from .record import Derivation, Described, le
from .record import quantity as q
from .theorems import Theorem

__all__ = ["LOCAL_THEOREMS", "score_deviation", "score_deviation_normalised", "softmax_upper", "softmax_lower",
           "attention_movement", "attention_reach", "attention_block", "attention_variation", "attention_curvature",
           "norm_lipschitz", "norm_movement", "norm_variation",
           "norm_lipschitz_floor", "norm_variation_floor", "feedforward_variation", "gated_variation",
           "residual_step", "SCORE_NAMES", "feedforward_curvature", "feedforward_front_variation",
           "attention_tail", "attention_tail_weighted", "attention_token_reach", "block_reach_weighted",
           "attention_front", "block_tail_variation", "jacobian_on_neighbourhood", "chain_variation",
           "normwise_product", "chain_prefix", "token_form_step", "token_form_nested", "feedforward_taylor_joint",
           "feedforward_taylor_signed", "feedforward_taylor_directed", "centred_floor", "path_certificate",
           "coupling_bound", "q"]


_LIP = Described(r"\operatorname{Lip}_U(f)")
c, r_i, r_j = q("c"), q("r_i"), q("r_j")
L_V = S.L_V
gamma_max = q(r"\|\gamma\|_\infty")


#: the per-pair quantities of the score-deviation theorem, by role (their LaTeX names)
SCORE_NAMES = {"a": r"\|W_Q R_{ij} \bar k_j^\top\|", "b": r"\|W_K R_{ij}^\top \bar q_i^\top\|",
               "g": r"\|W_Q R_{ij} W_K^\top\|"}


@functools.cache
def score_deviation() -> Theorem:
    """``|s_ij(Y) - s_ij(X)| <= c (a_ij r_i + b_ij r_j + g_ij r_i r_j)`` on U, for a dot-product score (``R_ij = I``)
    or a rotary one (``R_ij = R(p_i - p_j)``, the rotation between the two positions)."""
    a, b, g = (q(SCORE_NAMES[key]) for key in ("a", "b", "g"))
    statement = c * (a * r_i + b * r_j + g * r_i * r_j)
    proof = Derivation("Score deviation on a product of token balls")
    proof.hypothesis("Y in U: ||y_j - x_j|| <= r_j for every token j; s_ij = c (q_i M_i) . (k_j M_j) with M_p the "
                     "rotation of RoPE at position p (orthogonal; the identity for a dot-product score), so that "
                     "R_ij = M_i M_j^T = R(p_i - p_j) depends on the offset alone")
    proof.add(Described(r"s_{ij} = c\,q_i R_{ij} k_j^\top,\ R_{ij} = M_i M_j^\top"),
              "rotations by angles p theta_t in the same planes commute and compose by adding angles")
    proof.add(Described(r"s_{ij}(Y) - s_{ij}(X) = c\,(e_i W_Q R_{ij} \bar k_j^\top + \bar q_i R_{ij} W_K^\top e_j^\top "
                        r"+ e_i W_Q R_{ij} W_K^\top e_j^\top),\ e_j = y_j - x_j"), "expand the bilinear score")
    proof.add(le(Described(r"|s_{ij}(Y) - s_{ij}(X)|"), statement), "Cauchy-Schwarz on each term", "norm-calculus")
    return Theorem("local-score-deviation", "Score deviation on token balls (dot-product and rotary scores)",
                   statement, proof)


@functools.cache
def score_deviation_normalised() -> Theorem:
    """Scores read through a per-token norm (pre-norm): ``|s_ij(N(Y)) - s_ij(N(X))| <=
    c ((||J_i a_ij|| + nu_i a_ij) r_i + (||J_j w_ij|| + nu_j b_ij) r_j + g_ij rho_i rho_j)``, and the values move by
    ``(||J_j A_h|| + nu_j ||A_h||) r_j``."""
    fa, fb, nu_i, nu_j, rho_i, rho_j = (q(name) for name in (
        r"\|J_i a_{ij}\|", r"\|J_j w_{ij}\|", r"\nu_i", r"\nu_j", r"\rho_i", r"\rho_j"))
    a, b, g = (q(SCORE_NAMES[key]) for key in ("a", "b", "g"))
    statement = c * ((fa + nu_i * a) * r_i + (fb + nu_j * b) * r_j + g * rho_i * rho_j)
    proof = Derivation("Score deviation behind a norm")
    proof.hypothesis("the attention reads z = N(x) token by token; ||y_j - x_j|| <= r_j; "
                     "J_j = DN(x_j) (row convention), "
                     "nu_j >= sup ||DN(y) - J_j|| on the ball of token j, rho_j >= ||N(y_j) - N(x_j)||; "
                     "a_ij = W_Q R_ij "
                     "k_j^T and w_ij = W_K R_ij^T q_i^T at z = N(X) (local-score-deviation), A_h = V^h W_O^h")
    proof.add(Described(r"N(y_j) - N(x_j) = (y_j - x_j)\,\bar J_j,\ \|\bar J_j - J_j\| \le \nu_j"),
              "mean value theorem: Jbar_j the mean of DN on the segment", "mean-value")
    proof.add(le(Described(r"|s_{ij}(N(Y)) - s_{ij}(N(X))|"), statement),
              "local-score-deviation with e_j = (y_j - x_j) Jbar_j: |e_i a_ij| <= r_i (||J_i a_ij|| + nu_i a_ij), the "
              "second-order term by ||e_i|| <= rho_i; likewise the values: "
              "||e_j A_h|| <= r_j (||J_j A_h|| + nu_j ||A_h||)",
              "norm-calculus")
    return Theorem("local-score-deviation-normalised", "Score deviation behind a norm", statement, proof)


def _softmax(upper: bool) -> Theorem:
    m, s, Z = q("m_j"), q(r"s^{+}_{ij}" if upper else r"s^{-}_{ij}"), q(r"Z^{-}_{ij}" if upper else r"Z^{+}_{ij}")
    statement = m * sp.exp(s) / (m * sp.exp(s) + Z)
    side = "upper" if upper else "lower"
    proof = Derivation(f"Softmax range, {side} end")
    proof.hypothesis("every score of row i lies in [s^-_il, s^+_il]; m_l >= 0 (a key the mask hides from query i -- "
                     "causal: p_l > p_i; a window: |p_i - p_l| >= w -- has m_l = 0, and query i sees itself)")
    proof.add(Described(r"p_{ij} = \bigl(1 + \textstyle\sum_{l \ne j} \tfrac{m_l}{m_j} e^{s_{il} - s_{ij}}\bigr)^{-1}"),
              "divide by the j-th term")
    proof.add(le(Described(r"p_{ij}") if upper else statement, statement if upper else Described(r"p_{ij}")),
              "p_ij increases with s_ij and decreases with every s_il, l != j; Z^- = sum_{l != j} m_l e^{s^-_il}, "
              "Z^+ = sum_{l != j} m_l e^{s^+_il}", "softmax-monotone")
    return Theorem(f"local-softmax-{side}", f"Softmax range ({side})", statement, proof)


@functools.cache
def softmax_upper() -> Theorem:
    """``p_ij <= m_j e^{s+_ij} / (m_j e^{s+_ij} + Z-_ij)``."""
    return _softmax(True)


@functools.cache
def softmax_lower() -> Theorem:
    """``p_ij >= m_j e^{s-_ij} / (m_j e^{s-_ij} + Z+_ij)``."""
    return _softmax(False)


@functools.cache
def attention_movement() -> Theorem:
    """``||f_i(Y) - f_i(X)|| <= D_i + E_i[Delta v]`` with ``D_i = sum_j delta_ij ||v_j - f_i||`` (at X)."""
    D, E = q("D_i"), q(r"E_i[\Delta v]")
    statement = D + E
    proof = Derivation("Movement of a head's output on token balls")
    proof.hypothesis("the softmax ranges of row i hold on U; delta_ij = max(p^+_ij - p_ij, p_ij - p^-_ij); "
                     "||v_j(Y) - v_j(X)|| <= Delta v_j (e.g. ||V|| r_j, or a maximum over a finite set of inputs)")
    proof.add(Described(r"f_i(Y) - f_i(X) = \textstyle\sum_j p'_{ij} (v'_j - \bar v_j) + "
                        r"\sum_j (p'_{ij} - \bar p_{ij}) (\bar v_j - \bar f_i)"),
              "add and subtract; sum_j (p'_ij - p_ij) = 0 removes f_i", "shift-invariance")
    proof.add(le(Described(r"\|\textstyle\sum_j p'_{ij} (v'_j - \bar v_j)\|"), E),
              "triangle inequality and p'_i in Pi_i", "box-simplex")
    proof.add(le(Described(r"\|\textstyle\sum_j (p'_{ij} - \bar p_{ij}) (\bar v_j - \bar f_i)\|"), D),
              "triangle inequality", "norm-calculus")
    proof.add(le(Described(r"\|f_i(Y) - f_i(X)\|"), statement),
              "add the two parts; a layer's head h is read with values v W_O^h, and heads add up", "multi-head")
    return Theorem("local-attention-movement", "Movement of attention on token balls", statement, proof)


@functools.cache
def attention_reach() -> Theorem:
    """``||f_i(Y) - f_i(X)|| <= E_i[rho + Delta v]``: the output stays in the hull of the values."""
    statement = q(r"E_i[\rho + \Delta v]")
    proof = Derivation("Reach of a head's output on token balls")
    proof.hypothesis("the softmax ranges of row i hold on U; ||v_j(Y) - v_j(X)|| <= Delta v_j; "
                     "rho_ij = ||v_j(X) - f_i(X)||")
    proof.add(Described(r"f_i(Y) - f_i(X) = \textstyle\sum_j p'_{ij} (v'_j - \bar f_i)"), "the weights sum to one")
    proof.add(le(Described(r"\|f_i(Y) - f_i(X)\|"), statement),
              "||v'_j - f_i|| <= rho_ij + Delta v_j, and p'_i in Pi_i", "box-simplex")
    return Theorem("local-attention-reach", "Reach of attention on token balls", statement, proof)


def _block_symbols():
    return dict(p_plus=q(r"p^{+}_{ij}"), p_bar=q(r"\bar p_{ij}"), delta=q(r"\delta_{ij}"),
                u_plus=q(r"U^{+}_{ij}"), u_bar=q(r"\|\bar u_{ij}\|"), du=q(r"\Delta U_{ij}"),
                w_plus=q(r"w^{+}_{ij}"), dw=q(r"\Delta w_{ij}"), C_plus=q(r"C^{+}_i"), dC=q(r"\Delta C_i"),
                diagonal=q(r"[i = j]"), W_Q=S.matrix_norm(S.W_Q))


@functools.cache
def attention_block() -> Theorem:
    """``sup_U ||J_ij|| <= p+ L_V + c p+ U+ w+ + [i=j] c ||W_Q|| C+``."""
    s = _block_symbols()
    statement = (s["p_plus"] * L_V + c * s["p_plus"] * s["u_plus"] * s["w_plus"]
                 + s["diagonal"] * c * s["W_Q"] * s["C_plus"])
    proof = Derivation("Jacobian blocks of a head on token balls")
    proof.hypothesis("the softmax ranges hold on U (p_ij = 0 for a key the mask hides); scores c (q_i M_i) . (k_j M_j) "
                     "(local-score-deviation); u_ij = v_j - f_i, w_ij = W_K M_j M_i^T q_i^T, "
                     "C_i = sum_l p_il u_il (k_l M_l - kappa_i)^T for the fixed key kappa_i = sum_l p_il k_l M_l at X; "
                     "the heads of a key/value group read the same keys and values, each with its own queries")
    proof.add(Described(r"J_{ij} = p_{ij} V^\top + c\,p_{ij}\,u_{ij} w_{ij}^\top + [i = j]\,c\,C_i M_i^\top W_Q^\top"),
              "differentiate f_i = sum_l p_il v_l in x_j; sum_l p_il u_il = 0 lets kappa_i be any key",
              "softmax-derivative")
    proof.add(le(Described(r"\|u_{ij}\|"), s["u_plus"]),
              "U^+_ij = ||v_j - f_i||(X) + Delta v_j + mu_i, mu_i the movement bound of f_i", "norm-calculus")
    proof.add(le(Described(r"\|w_{ij}\|"), s["w_plus"]), "w^+_ij = ||w_ij||(X) + ||W_K R_ij^T W_Q^T|| r_i; ||M_i|| = 1",
              "norm-calculus")
    proof.add(le(Described(r"\|C_i\|"), s["C_plus"]),
              "C^+_i = E_i[U^+_il (||k_l - kappa_i||(X) + ||W_K|| r_l)]", "box-simplex")
    proof.add(le(Described(r"\sup_U \|J_{ij}\|"), statement), "triangle inequality", "norm-calculus")
    return Theorem("local-attention-block", "Jacobian blocks of attention on token balls", statement, proof)


@functools.cache
def attention_variation() -> Theorem:
    """``sup_U ||J_ij(Y) - J_ij(X)||``, each factor's change bounded in turn."""
    s = _block_symbols()
    statement = (s["delta"] * L_V + c * (s["delta"] * s["u_plus"] * s["w_plus"]
                 + s["p_bar"] * (s["du"] * s["w_plus"] + s["u_bar"] * s["dw"]))
                 + s["diagonal"] * c * s["W_Q"] * s["dC"])
    proof = Derivation("Variation of a head's Jacobian blocks on token balls")
    proof.absorb(attention_block().proof)
    proof.add(Described(r"p' u' w'^\top - \bar p \bar u \bar w^\top = (p' - \bar p) u' w'^\top + "
                        r"\bar p (u' - \bar u) w'^\top + \bar p \bar u (w' - \bar w)^\top"), "telescope the product")
    proof.add(le(Described(r"\|u'_{ij} - \bar u_{ij}\|"), s["du"]), "Delta U_ij = Delta v_j + mu_i", "norm-calculus")
    proof.add(le(Described(r"\|w'_{ij} - \bar w_{ij}\|"), s["dw"]), "Delta w_ij = ||W_K R_ij^T W_Q^T|| r_i",
              "norm-calculus")
    proof.add(le(Described(r"\|C'_i - \bar C_i\|"), s["dC"]),
              "the same telescoping under the sum over l: Delta C_i = sum_l delta_il U^+_il K^+_l + "
              "p_il (Delta U_il K^+_l + ||u_il|| ||W_K|| r_l), K^+_l = ||k_l - kappa_i|| + ||W_K|| r_l",
              "norm-calculus")
    proof.add(le(Described(r"\sup_U \|J_{ij}(Y) - J_{ij}(X)\|"), statement), "triangle inequality", "norm-calculus")
    return Theorem("local-attention-variation", "Variation of attention's Jacobian on token balls", statement, proof)


@functools.cache
def attention_curvature() -> Theorem:
    """``sup_U ||DF(Y) - DF(X)|| <= theta_U sum_k (eps_k - eps_{k-1}) (chi_I + chi_II + chi_III)(U(X, eps_k))`` for
    a head or an attention layer; the statement is one term of the sum."""
    width = q(r"\Delta\epsilon_k")
    chi_I, chi_II, chi_III = q(r"\chi_{I}"), q(r"\chi_{II}"), q(r"\chi_{III}")
    statement = width * (chi_I + chi_II + chi_III)
    proof = Derivation("Second derivative of attention on token balls")
    proof.hypothesis("radii 0 = eps_0 < eps_1 < ... < eps_K = eps, Delta eps_k = eps_k - eps_{k-1}; ||Y - X||_F <= "
                     "theta_U eps on U(X, eps) (theta_U = 1 for the Frobenius and (2,1) balls, the square root of the "
                     "number of moving tokens otherwise); zeta_ij(e) = ds_ij[e] - sum_l p_il ds_il[e] with "
                     "ds_ij[e] = c (e_i W_Q k_j^T + q_i W_K^T e_j^T); u_ij = v_j A_h - f_i, A_h = V^h W_O^h; "
                     "Theta_h the matrix of f -> (p_ij zeta_ij(f))_ij, Omega_i that of "
                     "e -> ((p_ij ||u_ij||)^(1/2) zeta_ij(e))_(h,j), omega_i >= ||Omega_i||, Qt_h = W_Q^h W_K^h^T; "
                     "chi_I, chi_II, chi_III (docs/local.md) bounded on U(X, eps_k)")
    proof.add(Described(r"D^2F[e, f]_i = \textstyle\sum_h \sum_j p_{ij} (\zeta_{ij}(f) e_j + \zeta_{ij}(e) f_j) A_h "
                        r"+ p_{ij} \zeta_{ij}(e) \zeta_{ij}(f) u_{ij} "
                        r"+ c\,p_{ij} (e_i \tilde Q_h f_j^\top + f_i \tilde Q_h e_j^\top) u_{ij}"),
              "differentiate DF[e]_i = sum_j p_ij e_j A_h + p_ij zeta_ij(e) u_ij again; "
              "sum_j p_ij zeta_ij = 0 and sum_j p_ij u_ij = 0 remove the other terms", "softmax-derivative")
    proof.add(le(Described(r"\|\textstyle\sum_h \Theta_h(f)\,E\,A_h\|_F"), chi_I / 2),
              "||T E A||_F <= ||T||_2 ||E||_F ||A|| and ||Theta_h(f)||_2 <= ||Theta_h f|| per head (also with p_ij "
              "raised to its upper end on U, the Frobenius norm being monotone in |entries|); jointly, "
              "sum_h t_h e_j A_h = e_j [A_1 ... A_H] (t (x) I) gives ||[A_1 ... A_H]|| ||[Theta_1; ...; Theta_H] f||",
              "norm-calculus")
    proof.add(le(Described(r"\|(\textstyle\sum_{h,j} p_{ij} \zeta_{ij}(e) \zeta_{ij}(f) u_{ij})_i\|_F"), chi_II),
              "Cauchy-Schwarz in (h, j) with weights p_ij ||u_ij||: each token's term is at most "
              "||Omega_i e|| ||Omega_i f|| (also with p_ij ||u_ij|| raised to its upper end on U); "
              "then ||Omega_i f|| <= omega_i",
              "norm-calculus")
    proof.add(le(Described(r"\|(c \textstyle\sum_{h,j} p_{ij} d^2 s_{ij}[e, f]\,u_{ij})_i\|_F"), chi_III),
              "|e_i Qt f_j^T| <= ||Qt|| ||e_i|| ||f_j|| and sum_i x_i y_i (W z)_i <= max_i ||W_i|| for unit "
              "non-negative x, y, z; or, heads joined, sum_{h,j} w_hj e_i Qt_h f_j^T = e_i [Qt_1 ... Qt_H] (F^T w_h)_h "
              "with ||F^T w_h|| <= ||w_h||; per token the smaller", "norm-calculus")
    proof.add(le(Described(r"\|DF(Y) - DF(X)\|_2"),
                 Described(r"\theta_U \textstyle\int_0^\epsilon \sup_{U(X, t)} \|D^2F\|\,dt")),
              "DF(Y) - DF(X) = int_0^1 D^2F(X + s (Y - X))[Y - X, .] ds and X + s (Y - X) lies in U(X, s eps)",
              "mean-value")
    proof.add(le(Described(r"\sup_U \|DF(Y) - DF(X)\|_2"), Described(r"\theta_U \textstyle\sum_k") * statement),
              "on [eps_{k-1}, eps_k] the supremum over U(X, t) is at most its bound on U(X, eps_k)", "norm-calculus")
    return Theorem("local-attention-curvature", "Second derivative of attention on token balls", statement, proof)


def _layernorm_symbols():
    return dict(nu=q(r"\nu"), R=q("R"), delta=q(r"\delta"), d=S.d)


#: the two normalisations, by kind: what P is, how the map is written, its theorems' ids and titles
_NORMS = {"layernorm": ("the centring projection", r"\mathrm{LN}",
                        "LN(z) = gamma * sqrt(d) P z / sqrt(||P z||^2 + delta) + beta, P the centring projection",
                        "layernorm", "LayerNorm"),
          "rmsnorm": ("the identity", r"\mathrm{N}",
                      "N(z) = gamma * z / sqrt(||z||^2 / d + eps) = gamma * sqrt(d) P z / sqrt(||P z||^2 + delta) with "
                      "P = I (an RMSNorm: no centring, Zhang and Sennrich 2019)", "rmsnorm", "RMSNorm")}


@functools.cache
def norm_lipschitz(kind: str = "layernorm") -> Theorem:
    """``sup ||J_N|| <= ||gamma||_inf sqrt(d) / sqrt(max(nu - R, 0)^2 + delta)`` on the ball ``B(z, R)``, for a
    LayerNorm or an RMSNorm (``kind``)."""
    projection, symbol, definition, key, title = _NORMS[kind]
    s = _layernorm_symbols()
    low = sp.Max(s["nu"] - s["R"], 0)
    statement = gamma_max * sp.sqrt(s["d"]) / sp.sqrt(low ** 2 + s["delta"])
    proof = Derivation(f"{title} on a ball")
    proof.hypothesis(f"{definition}; delta = d eps; nu = ||P z|| at the centre, ||z' - z|| <= R")
    proof.add(le(Described(rf"\|D\,{symbol}(z')\|"),
                 gamma_max * sp.sqrt(s["d"]) / Described(r"\sqrt{\|P z'\|^2 + \delta}")),
              f"D N = diag(gamma) sqrt(d) (P - g g^T) / n(u), g = u / n(u), n(u) = sqrt(||u||^2 + delta), u = P z, P "
              f"{projection}, and 0 <= P - g g^T <= I", "layernorm-jacobian")
    proof.add(le(Described(r"\|P z'\|"), s["nu"] + s["R"]), f"P is an orthogonal projection ({projection})")
    proof.add(le(Described(rf"\sup \|D\,{symbol}\|"), statement), "||P z'|| >= nu - R", "norm-calculus")
    return Theorem(f"local-{key}-lipschitz", f"{title} on a ball (Lipschitz)", statement, proof)


@functools.cache
def norm_lipschitz_floor(kind: str = "layernorm") -> Theorem:
    """``sup ||J_N|| <= ||gamma||_inf sqrt(d) / sqrt(max(nu - R, ell, 0)^2 + delta)`` on the points of a set inside
    ``B(z, R)`` where ``||P z'|| >= ell`` (lemma centred-floor gives ell)."""
    projection, symbol, definition, key, title = _NORMS[kind]
    s, ell = _layernorm_symbols(), q(r"\ell")
    low = sp.Max(s["nu"] - s["R"], ell, 0)
    statement = gamma_max * sp.sqrt(s["d"]) / sp.sqrt(low ** 2 + s["delta"])
    proof = Derivation(f"{title} on a set with a floor of its centred norm")
    proof.hypothesis(f"{definition}; delta = d eps; nu = ||P z|| at the centre; z' in a set inside B(z, R) on which "
                     f"||P z'|| >= ell")
    proof.add(le(Described(rf"\|D\,{symbol}(z')\|"),
                 gamma_max * sp.sqrt(s["d"]) / Described(r"\sqrt{\|P z'\|^2 + \delta}")),
              f"local-{key}-lipschitz's first step", "layernorm-jacobian")
    proof.add(le(Described(rf"\sup \|D\,{symbol}\|"), statement),
              "||P z'|| >= nu - R (P an orthogonal projection) and ||P z'|| >= ell", "norm-calculus")
    return Theorem(f"local-{key}-lipschitz-floor", f"{title} on a set with a floor (Lipschitz)", statement, proof)


@functools.cache
def norm_variation_floor(kind: str = "layernorm") -> Theorem:
    """Theorem local-layernorm-variation with ``nu - R`` replaced by ``max(nu - R, ell)`` on a set where ``||P z'|| >=
    ell``."""
    projection, symbol, definition, key, title = _NORMS[kind]
    s, G, ell = _layernorm_symbols(), q("G"), q(r"\ell")
    n_c = sp.sqrt(s["nu"] ** 2 + s["delta"])
    n_low = sp.sqrt(sp.Max(s["nu"] - s["R"], ell, 0) ** 2 + s["delta"])
    n_high = sp.sqrt((s["nu"] + s["R"]) ** 2 + s["delta"])
    statement = gamma_max * sp.sqrt(s["d"]) * (sp.Max(1 / n_low - 1 / n_c, 1 / n_c - 1 / n_high) + 2 * G / n_c)
    proof = Derivation(f"Variation of the {title} Jacobian on a set with a floor of its centred norm")
    proof.hypothesis(f"{definition}; z' in a set inside B(z, R) on which ||P z'|| >= ell; G as in "
                     f"local-{key}-variation")
    proof.add(le(Described(rf"\sup \|D\,{symbol}(z') - D\,{symbol}(z)\|"), statement),
              f"local-{key}-variation's steps; n(u') lies between n(max(nu - R, ell)) and n(nu + R)",
              "layernorm-jacobian")
    return Theorem(f"local-{key}-variation-floor", f"Variation of the {title} Jacobian on a set with a floor",
                   statement, proof)


def _lam(t, delta):
    return t / sp.sqrt(t ** 2 + delta)


@functools.cache
def norm_movement(kind: str = "layernorm") -> Theorem:
    """``||N(z') - N(z)|| <= ||gamma||_inf sqrt(d) G`` for ``||z' - z|| <= R < nu``, with G the normalised
    movement: the chord of the cone the ball subtends, plus the change of the scale."""
    projection, symbol, definition, key, title = _NORMS[kind]
    s = _layernorm_symbols()
    ratio = s["R"] / s["nu"]
    chord = ratio * sp.sqrt(2 / (1 + sp.sqrt(1 - ratio ** 2)))
    G = chord + _lam(s["nu"], s["delta"]) - _lam(s["nu"] - s["R"], s["delta"])
    statement = gamma_max * sp.sqrt(s["d"]) * G
    proof = Derivation(f"{title} movement on a ball")
    proof.hypothesis(f"{definition}; ||z' - z|| <= R < nu = ||P z||")
    proof.add(Described(r"g(u) = \hat u \, \lambda(\|u\|),\ \lambda(t) = t / \sqrt{t^2 + \delta}"),
              f"normalised output, u = P z (P {projection})")
    proof.add(le(Described(r"\|\hat u' - \hat u\|"), chord),
              "u' lies in B(u, R), which subtends a cone of half-angle arcsin(R / nu): "
              "chord 2 sin(theta / 2) = sqrt(2 - 2 sqrt(1 - R^2 / nu^2))", "cap-chord")
    proof.add(le(Described(r"|\lambda(\|u'\|) - \lambda(\nu)|"),
                 _lam(s["nu"], s["delta"]) - _lam(s["nu"] - s["R"], s["delta"])),
              "lambda is increasing and concave on t > 0 and ||u'|| in [nu - R, nu + R]")
    proof.add(le(Described(rf"\|{symbol}(z') - {symbol}(z)\|"), statement),
              "||gamma * w|| <= ||gamma||_inf ||w|| and the triangle inequality", "norm-calculus")
    return Theorem(f"local-{key}-movement", f"{title} movement on a ball", statement, proof)


@functools.cache
def norm_variation(kind: str = "layernorm") -> Theorem:
    """``sup ||J_N(z') - J_N(z)|| <= ||gamma|| sqrt(d) (|1/n' - 1/n| + 2 G / n)``."""
    projection, symbol, definition, key, title = _NORMS[kind]
    s = _layernorm_symbols()
    G = q("G")
    n_c = sp.sqrt(s["nu"] ** 2 + s["delta"])
    n_low = sp.sqrt(sp.Max(s["nu"] - s["R"], 0) ** 2 + s["delta"])
    n_high = sp.sqrt((s["nu"] + s["R"]) ** 2 + s["delta"])
    statement = gamma_max * sp.sqrt(s["d"]) * (sp.Max(1 / n_low - 1 / n_c, 1 / n_c - 1 / n_high) + 2 * G / n_c)
    proof = Derivation(f"Variation of the {title} Jacobian on a ball")
    proof.hypothesis(f"{definition}; ||z' - z|| <= R; "
                     "G bounds ||g(u') - g(u)|| (the movement theorem, or R / n(nu - R))")
    proof.add(Described(r"B(u') - B(u) = \sqrt d\,(\tfrac1{n'} - \tfrac1n)(P - g' g'^\top) - "
                        r"\tfrac{\sqrt d}{n} (g' g'^\top - g g^\top)"), f"write D N = diag(gamma) B(u), P {projection}")
    proof.add(le(Described(r"\|g' g'^\top - g g^\top\|"), 2 * G), "||a a^T - b b^T|| <= ||a - b|| (||a|| + ||b||), "
              "||g|| < 1", "norm-calculus")
    proof.add(le(Described(rf"\sup \|D\,{symbol}(z') - D\,{symbol}(z)\|"), statement),
              "n(u') lies between n(nu - R) and n(nu + R)", "layernorm-jacobian")
    return Theorem(f"local-{key}-variation", f"Variation of the {title} Jacobian", statement, proof)


def _split(spread: str):
    return (q(rf"\|W_2^\top \operatorname{{diag}}({spread})^{{1/2}}\|"),
            q(rf"\|\operatorname{{diag}}({spread})^{{1/2}} W_1^\top\|"))


@functools.cache
def feedforward_variation() -> Theorem:
    """``sup ||W_2^T (D' - D) W_1^T|| <= ||W_2^T diag(t)^(1/2)|| ||diag(t)^(1/2) W_1^T||``, t the slope deviations."""
    a, b = _split("s")
    statement = a * b
    proof = Derivation("Variation of the feed-forward Jacobian on a ball")
    proof.hypothesis("x -> x + act(x W_1 + b_1) W_2 + b_2, D(x + FFN(x)) = I + W_2^T diag(act'(h)) W_1^T; on the ball "
                     "|act'(h'_k) - act'(h_k)| <= s_k (the range of GELU' over the interval of h_k, about its value "
                     "at the centre)")
    proof.add(le(Described(r"\|W_2^\top E W_1^\top\|"), statement),
              "|E| <= diag(s): E = diag(s)^{1/2} E' diag(s)^{1/2} with ||E'|| <= 1, and submultiplicativity",
              "submultiplicative")
    proof.add(le(Described(r"\|x' + \mathrm{FFN}(x') - x - \mathrm{FFN}(x)\|"),
                 (q(r"\|D(x + \mathrm{FFN})(x)\|") + statement) * q("R")),
              "mean value theorem on the ball; the secant slope of GELU lies in the range of GELU'", "secant-slope")
    return Theorem("local-feedforward-variation", "Variation of the feed-forward Jacobian", statement, proof)


@functools.cache
def gated_variation() -> Theorem:
    """``sup ||J(y') - J(y)|| <= ||W_2^T diag(t)^(1/2)|| ||diag(t)^(1/2) W_1^T||`` for the gated block
    ``(act(y W_gate + b_gate) * (y W_up + b_up)) W_down + b_down`` on a ball, t the deviations of its slopes."""
    a, b = _split("t")
    statement = a * b
    proof = Derivation("Variation of the gated feed-forward Jacobian on a ball")
    proof.hypothesis("y -> (act(a) * b) W_down + b_down with a = y W_gate + b_gate, b = y W_up + b_up "
                     "(SwiGLU: act = SiLU); "
                     "W_1 = [W_gate W_up], W_2 = [W_down; W_down]; on B(y, R) every a_k stays within ||w_k^gate|| R "
                     "and every b_k within ||w_k^up|| R of its value at y; t_k >= |s_k(y') - s_k(y)| for the slopes "
                     "s = (act'(a) * b, act(a)), from their ranges over those intervals")
    proof.add(Described(r"J(y) = W_{\mathrm{gate}} \operatorname{diag}(\operatorname{act}'(a) \odot b) "
                        r"W_{\mathrm{down}} "
                        r"+ W_{\mathrm{up}} \operatorname{diag}(\operatorname{act}(a)) W_{\mathrm{down}} "
                        r"= W_1 \operatorname{diag}(s) W_2"),
              "differentiate the product act(a) * b (row convention)", "norm-calculus")
    proof.add(le(Described(r"\|W_1 \operatorname{diag}(s' - s) W_2\|"), statement),
              "|s' - s| <= t: diag(s' - s) = diag(t)^{1/2} E diag(t)^{1/2} with ||E|| <= 1, and submultiplicativity",
              "submultiplicative")
    proof.add(le(Described(r"\|\mathrm{FFN}(y') - \mathrm{FFN}(y)\|"), (q(r"\|J(y)\|") + statement) * q("R")),
              "mean value theorem on the ball", "mean-value")
    return Theorem("local-gated-variation", "Variation of the gated feed-forward Jacobian", statement, proof)


@functools.cache
def residual_step() -> Theorem:
    """For a residual step ``F(X) = X + G(X)`` whose branch ``G = B o N`` reads a per-token norm N (pre-norm
    placement), blockwise on U: ``sup ||DF_ij|| <= [i = j] + M^B_ij M^N_j`` and
    ``sup ||DF_ij(Y) - DF_ij(X)|| <= V^B_ij N^N_j + M^B_ij V^N_j``; the statement is the variation."""
    MB, VB, MN, VN, NN = (q(name) for name in ("M^B_{ij}", "V^B_{ij}", "M^N_j", "V^N_j", "N^N_j"))
    statement = VB * NN + MB * VN
    proof = Derivation("A residual step around a normalised branch (pre-norm placement)")
    proof.hypothesis("F(X) = X + B(N(X)), N acting token by token with Jacobian blocks J^N_j; "
                     "on U: M^N_j >= ||J^N_j||, "
                     "V^N_j >= ||J^N_j(y_j) - J^N_j(x_j)||, N^N_j >= ||J^N_j(x_j)||; on token balls holding N(U): "
                     "M^B_ij >= ||D_j B_i||, V^B_ij >= ||D_j B_i(N(Y)) - D_j B_i(N(X))|| (B an attention layer, a "
                     "feed-forward block, or either followed by a norm or a LayerScale gain)")
    proof.add(Described(r"D_j F_i(Y) = [i = j]\,I + J^N_j(y_j)\, D_j B_i(N(Y))"),
              "chain rule; the residual's identity does not vary", "telescoping")
    proof.add(Described(r"D_j F_i(Y) - D_j F_i(X) = J^N_j(x_j) (D_j B_i(N(Y)) - D_j B_i(N(X))) "
                        r"+ (J^N_j(y_j) - J^N_j(x_j)) D_j B_i(N(Y))"), "add and subtract", "telescoping")
    proof.add(le(Described(r"\sup_U \|D_j F_i(Y) - D_j F_i(X)\|"), statement), "submultiplicativity",
              "submultiplicative")
    return Theorem("local-residual-step", "A residual step around a normalised branch", statement, proof)


@functools.cache
def feedforward_curvature() -> Theorem:
    """``sup ||D(x') - D(x)|| <= R Lambda^(1/2) + ||W_2^T diag(t)^(1/2)|| ||diag(t)^(1/2) W_1^T||`` on ``B(x, R)``:
    the second derivative at the centre, and per neuron the change of GELU'' over its interval."""
    a, b = _split("t")
    root = q(r"\Lambda^{1/2}")
    statement = q("R") * root + a * b
    proof = Derivation("Variation of the feed-forward Jacobian through its second derivative")
    proof.hypothesis("x -> x + act(x W_1 + b_1) W_2 + b_2 with w_k the columns of W_1 and r_k the rows of W_2; "
                     "x' in B(x, R), e = x' - x, h_k = x w_k + b_k; g_k = act''(h_k); "
                     "delta_k >= |act''(y) - g_k| for y within R ||w_k|| of h_k, or delta_k >= S_k ||w_k|| R / 2 with "
                     "S_k >= |act^(3)| there; t_k = delta_k ||w_k|| R; "
                     "Lambda the smaller of lambda_max(W_1 diag(g) (G_1 o G_2) diag(g) W_1^T) and "
                     "lambda_max(W_2^T diag(g) (G_1 o G_1) diag(g) W_2), G_1 = W_1^T W_1, G_2 = W_2 W_2^T")
    proof.add(Described(r"\operatorname{act}'(h_k + e w_k) - \operatorname{act}'(h_k) = (e w_k)(g_k + \Delta_k),"
                        r"\ |\Delta_k| \le \delta_k"),
              "mean value theorem for act' on the interval of h_k: g_k + Delta_k is the mean of act'' over the "
              "segment, so |Delta_k| <= delta_k, and <= S_k |e w_k| / 2 (act'' is S_k-Lipschitz there)", "mean-value")
    proof.add(Described(r"u^\top (D(x') - D(x)) v = \textstyle\sum_k g_k (u \cdot r_k)(e \cdot w_k)(v \cdot w_k)"
                        r" + \sum_k \Delta_k (e \cdot w_k) (u \cdot r_k)(v \cdot w_k)"),
              "expand the change of the slopes", "norm-calculus")
    proof.add(le(Described(r"|\textstyle\sum_k g_k (u \cdot r_k)(e \cdot w_k)(v \cdot w_k)|"),
                 q("R") * root),
              "the sum is v^T M (u (x) e) and u^T M' (e (x) v), the Kronecker products unit vectors of R^(d^2), "
              "with M M^T = W_1 diag(g) (G_1 o G_2) diag(g) W_1^T and M' M'^T = W_2^T diag(g) (G_1 o G_1) diag(g) W_2",
              "submultiplicative")
    proof.add(le(Described(r"\sup \|D(x') - D(x)\|"), statement),
              "|Delta_k (e w_k)| <= t_k, then as in local-feedforward-variation", "submultiplicative")
    return Theorem("local-feedforward-curvature", "Variation of the feed-forward Jacobian, second-derivative form",
                   statement, proof)


@functools.cache
def attention_tail() -> Theorem:
    """``sup_U ||DF(Y) - DF(X)|| <= tau var_U(A) + omega Lip_U(A)`` for ``F = T o A``, T per token."""
    tau, var, omega, lip = q(r"\tau"), q(r"\operatorname{var}_U(A)"), q(r"\omega"), q(r"\operatorname{Lip}_U(A)")
    statement = tau * var + omega * lip
    proof = Derivation("Variation of an attention layer followed by per-token maps")
    proof.hypothesis("F = T o A on a convex U; T acts token by token with Jacobian blocks T_i; "
                     "tau >= max_i ||T_i(A(X))||, omega >= max_i sup ||T_i(z) - T_i(A(X)_i)|| over token balls "
                     "holding A(U); var_U(A) >= sup_U ||DA(Y) - DA(X)||, Lip_U(A) >= sup_U ||DA(Y)||")
    proof.add(Described(r"DF(Y) - DF(X) = \operatorname{diag}(T_i(A(X)))\,(DA(Y) - DA(X)) "
                        r"+ \operatorname{diag}(T_i(A(Y)) - T_i(A(X)))\,DA(Y)"),
              "chain rule, add and subtract diag(T_i(A(X))) DA(Y)", "telescoping")
    proof.add(le(Described(r"\sup_U \|DF(Y) - DF(X)\|"), statement),
              "a block-diagonal matrix has the norm of its largest block; submultiplicativity", "submultiplicative")
    return Theorem("local-attention-tail", "Variation of an attention layer and the maps after it", statement, proof)


@functools.cache
def attention_tail_weighted() -> Theorem:
    """``sup_U ||DF(Y) - DF(X)|| <= tau var_U(A) + ||Omega DA(X)|| + omega var_U(A)`` for ``F = T o A``, T per token,
    ``Omega = diag(omega_i I)``: theorem local-attention-tail with each output token's change of ``T_i`` meeting only
    its own rows of DA."""
    tau, var, omega = q(r"\tau"), q(r"\operatorname{var}_U(A)"), q(r"\omega")
    weighted = q(r"\|\Omega\,DA(X)\|")
    statement = tau * var + weighted + omega * var
    proof = Derivation("Variation of an attention layer followed by per-token maps, token by token")
    proof.hypothesis("F = T o A on a convex U; T acts token by token with Jacobian blocks T_i; "
                     "tau >= max_i ||T_i(A(X))||; omega_i >= sup ||T_i(z) - T_i(a_i)|| over a ball holding the i-th "
                     "tokens of A(U), a_i the i-th token of A(X), omega >= max_i omega_i and Omega = diag(omega_i I); "
                     "var_U(A) >= sup_U ||DA(Y) - DA(X)||")
    proof.add(Described(r"DF(Y) - DF(X) = \operatorname{diag}(T_i(A(X)))\,(DA(Y) - DA(X)) + \Delta(Y)\,DA(Y)"),
              "chain rule, add and subtract diag(T_i(A(X))) DA(Y); Delta(Y) = diag(T_i(A(Y)) - T_i(A(X)))",
              "telescoping")
    proof.add(Described(r"\Delta(Y) = \Theta(Y)\,\Omega,\quad \|\Theta(Y)\| \le 1"),
              "block i of Delta(Y) has norm at most omega_i: divide it by omega_i (a zero block where omega_i = 0)",
              "block-diagonal")
    proof.add(le(Described(r"\|\Delta(Y)\,DA(Y)\|"),
                 Described(r"\|\Omega\,DA(X)\| + \omega\,\operatorname{var}_U(A)")),
              "submultiplicativity, then DA(Y) = DA(X) + (DA(Y) - DA(X)) and ||Omega|| = max_i omega_i",
              "submultiplicative")
    proof.add(le(Described(r"\sup_U \|DF(Y) - DF(X)\|"), statement),
              "the first term as in theorem local-attention-tail; triangle inequality", "norm-calculus")
    return Theorem("local-attention-tail-weighted",
                   "Variation of an attention layer and the maps after it, token by token", statement, proof)


@functools.cache
def attention_front() -> Theorem:
    """``sup_U ||DF(Y) - DF(X)|| <= nu_P Lip(A) M_Q + W M_Q + n_P ||DA(Z)|| omega_Q`` for ``F = Q o A o P``, P and Q
    per token (a pre-norm branch: P the norm, A the attention, Q a sandwich's output norm and gain, or
    nothing), W bounding ``sup ||P(X) (DA(P(Y)) - DA(P(X)))||``: ``n_P var(A)``, or the second derivative with
    P's Jacobians folded into both arguments."""
    nu, n_p, lip, W, m_q, omega, at = (q(name) for name in (
        r"\nu_P", r"n_P", r"\operatorname{Lip}_{P(U)}(A)", r"W_P", r"M_Q", r"\omega_Q", r"\|DA(\bar Z)\|"))
    statement = nu * lip * m_q + W * m_q + n_p * at * omega
    proof = Derivation("Variation of a normalised attention branch, split at the attention's input")
    proof.hypothesis("F = Q o A o P on a convex U with ||Y - X||_F <= theta; P and Q act token by token with "
                     "Jacobian blocks P_j and Q_i; Z = P(X); nu_P >= max_j sup ||P_j(y_j) - P_j(x_j)||, n_P >= "
                     "max_j ||P_j(x_j)||; P(U) lies in the product of token balls of radii rho_j, on which var(A) >= "
                     "sup ||DA(Z') - DA(Z)|| and Lip(A) >= sup ||DA(Z')||; M_Q >= max_i sup ||Q_i||, omega_Q >= "
                     "max_i sup ||Q_i(A(Z')) - Q_i(A(Z))|| there; chi(S) and chi^P(S) bound sup_S ||D^2 A[u, v]|| and "
                     "sup_S ||D^2 A[u P, v P]|| over unit u, v (local-attention-curvature, the second with P's "
                     "Jacobians at X folded into both arguments); W_P = n_P var(A), or "
                     "theta sum_k (s_k - s_{k-1}) (chi^P + nu_P n_P chi)(P(s_k rho))")
    proof.add(Described(r"DF(Y) - DF(X) = (P' - P)\,A'\,Q' + P\,(A' - A)\,Q' + P\,A\,(Q' - Q)"),
              "chain rule in row convention (first map's Jacobian first), primes at Y; telescope", "telescoping")
    proof.add(Described(r"v P (A' - A) = \textstyle\int_0^1 D^2A(Z_s)[(Y - X) \bar P, v P]\,ds,\ "
                        r"Z_s = Z + s (P(Y) - Z)"),
              "P(Y) - P(X) = (Y - X) Pbar with Pbar the mean of P's Jacobians on the segment (mean value theorem); "
              "Z_s lies in the product of token balls of radii s rho_j", "mean-value")
    proof.add(le(Described(r"\|P (A' - A)\|"), W),
              "Pbar = P + (Pbar - P) with ||Pbar - P|| <= nu_P; the upper Riemann sum over s_k as in "
              "local-attention-curvature; or submultiplicativity", "submultiplicative")
    proof.add(le(Described(r"\sup_U \|DF(Y) - DF(X)\|"), statement),
              "a block-diagonal matrix has the norm of its largest block; submultiplicativity", "submultiplicative")
    return Theorem("local-attention-front", "Variation of a normalised attention branch", statement, proof)


def _first_layernorm_mean(proof: Derivation, displacement: str) -> None:
    """The step shared by the block's per-token theorems: the feed-forward input's change through the mean
    Jacobian of the first LayerNorm on the segment."""
    proof.add(Described(displacement + r",\ \|\bar J_1 - J_1(x)\| \le V_1"),
              "mean value theorem for LN_1 (the mean Jacobian on the segment)", "mean-value")


@functools.cache
def feedforward_front_variation() -> Theorem:
    """``sup ||J_1(x) (J_F(y_2) - J_F(x_2))||`` with the first LayerNorm's Jacobian at the centre folded into the
    feed-forward block's second derivative."""
    V1, r, rho = q("V_1"), q("r"), q(r"\rho")
    full, mixed = q(r"\Lambda_{10}^{1/2}"), q(r"\Lambda_{00}^{1/2}")
    a, b = q(r"\|\operatorname{diag}(t)^{1/2} (J_1 W_1)^\top\|"), q(r"\|\operatorname{diag}(t)^{1/2} W_2\|")
    statement = r * full + (r * V1 + rho) * mixed + a * b
    proof = Derivation("Variation of the feed-forward Jacobian seen through the LayerNorm before it")
    proof.hypothesis("y_2 = LN_1(y), x_2 within rho of LN_1(x), ||y - x|| <= r, V_1 the variation of J_1 on the ball "
                     "of y; w_k the columns of W_1, r_k the rows of W_2, g = act''(h) at x_2, t as in "
                     "local-feedforward-curvature on the ball of y_2; Lambda_10 and Lambda_00 the bounds of "
                     "local-feedforward-curvature for the form with a-side J_1 w_k, b-side r_k and e-side J_1 w_k, "
                     "resp. w_k (the latter at most ||J_1(x)|| times its Lambda^(1/2))")
    proof.add(Described(r"J_1(x) (J_F(y_2) - J_F(x_2)) = \textstyle\sum_k (e \cdot w_k)(g_k + \Delta_k)\, "
                        r"(J_1(x) w_k)\, r_k,\ e = y_2 - x_2"),
              "the change of the slopes (local-feedforward-curvature), J_1(x) taken into the columns", "norm-calculus")
    _first_layernorm_mean(proof, r"e = (y - x) J_1(x) + (y - x)(\bar J_1 - J_1(x)) + (LN_1(x) - x_2)")
    proof.add(le(Described(r"\sup \|J_1(x) (J_F(y_2) - J_F(x_2))\|"), statement),
              "the second derivative's bound with e-side J_1 w_k for the first part of e and w_k for the rest; "
              "|Delta_k (e w_k)| <= t_k, then as in local-feedforward-variation", "submultiplicative")
    return Theorem("local-feedforward-front", "Variation of the feed-forward Jacobian behind a LayerNorm",
                   statement, proof)


@functools.cache
def block_tail_variation() -> Theorem:
    """``sup ||T(y) - T(x)||`` for ``T = J_1 J_F J_2`` (LayerNorm, feed-forward block, LayerNorm) on a ball,
    with both LayerNorms' Jacobians at the centre folded into the feed-forward block's second derivative."""
    V1, V2, K = q("V_1"), q("V_2"), q(r"\sup \|J_1 \Delta J_F\|")
    M2, MF, C = q("M_2"), q("M_F"), q(r"\|J_1 J_F\|")
    r, rho = q("r"), q(r"\rho")
    full, mixed = q(r"\Lambda_{11}^{1/2}"), q(r"\Lambda_{1}^{1/2}")
    a, b = q(r"\|\operatorname{diag}(t)^{1/2} (J_1 W_1)^\top\|"), q(r"\|\operatorname{diag}(t)^{1/2} W_2 J_2\|")
    statement = V1 * MF * M2 + r * full + (r * V1 + rho) * mixed + a * b + K * V2 + C * V2
    proof = Derivation("Variation of the per-token maps of a block, the LayerNorms folded in")
    proof.hypothesis("T(y) = J_1(y) J_F(y_2) J_2(y_3) in row convention along the chain y -> y_2 = LN_1(y) -> "
                     "y_3 = y_2 + FFN(y_2); x, x_2, x_3 the centres (x_2 within rho of LN_1(x)); ||y - x|| <= r; "
                     "V, M, N the variations, suprema and centre values of the three Jacobians on their balls; "
                     "w_k the columns of W_1, r_k the rows of W_2, g = act''(h) at x_2; Lambda_11 and Lambda_1 "
                     "the bounds of local-feedforward-curvature for the form with a- and b-sides (J_1 w_k, r_k J_2) "
                     "and e-side J_1 w_k, resp. w_k; t as there, on the ball of y_2; K >= sup ||J_1(x) Delta J_F|| "
                     "(N_1 V_F, or local-feedforward-front); the ball of y_3 of radius at most "
                     "r (||J_1 J_F|| + V_1 M_F + K) + rho_3, rho_3 >= ||G(x) - x_3|| for G = (id + FFN) o LN_1")
    proof.add(Described(r"T(y) - T(x) = \Delta J_1\, J_F(y_2) J_2(y_3) + J_1(x)\, \Delta J_F\, J_2(x_3) "
                        r"+ J_1(x)\, \Delta J_F\, \Delta J_2 + J_1(x) J_F(x_2)\, \Delta J_2"),
              "telescope the product, then split J_2(y_3) = J_2(x_3) + Delta J_2", "telescoping")
    _first_layernorm_mean(proof, r"y_2 - x_2 = (y - x) \bar J_1 + (LN_1(x) - x_2)")
    proof.add(le(Described(r"\|y_3 - x_3\|"), r * (C + V1 * MF + K) + q(r"\rho_3")),
              "mean value theorem for the first two maps: their mean Jacobian on the segment is within "
              "V_1 M_F + K of J_1(x) J_F(x_2)", "mean-value")
    proof.add(le(Described(r"\|J_1(x)\, \Delta J_F\, J_2(x_3)\|"),
                 r * full + (r * V1 + rho) * mixed + a * b),
              "the second derivative of local-feedforward-curvature in the direction y_2 - x_2, its a- and b-sides "
              "multiplied by J_1(x) and J_2(x_3); the slopes' remainder split as there", "submultiplicative")
    proof.add(le(Described(r"\sup \|T(y) - T(x)\|"), statement), "submultiplicativity on the other terms",
              "submultiplicative")
    return Theorem("local-block-tail", "Variation of a block's per-token maps", statement, proof)


@functools.cache
def jacobian_on_neighbourhood() -> Theorem:
    """``Lip_U(f) <= ||Df(X)|| + sup_U ||Df(Y) - Df(X)||`` on a convex U."""
    N, V = q(r"\|Df(X)\|"), q(r"\sup_U \|Df(Y) - Df(X)\|")
    statement = N + V
    proof = Derivation("Local Lipschitz constant from the Jacobian at X")
    proof.hypothesis("U convex, X in U")
    proof.add(le(Described(r"\|Df(Y)\|"), statement), "triangle inequality", "norm-calculus")
    proof.add(le(_LIP, statement), "mean value theorem on U", "mean-value")
    return Theorem("local-lipschitz", "Local Lipschitz constant", statement, proof)


@functools.cache
def chain_variation(steps: int) -> Theorem:
    """For ``F = g_m o ... o g_1`` on U with ``U_{k+1}`` holding ``g_k(U_k)``:
    ``sup ||DF(Y) - DF(X)|| <= sum_k (prod_{l>k} M_l) V_k (prod_{l<k} N_l)``."""
    M = [q(rf"M_{{{k}}}") for k in range(1, steps + 1)]
    V = [q(rf"V_{{{k}}}") for k in range(1, steps + 1)]
    N = [q(rf"N_{{{k}}}") for k in range(1, steps + 1)]
    statement = sp.Add(*[sp.Mul(*M[k + 1:]) * V[k] * sp.Mul(*N[:k]) for k in range(steps)])
    proof = Derivation(f"Variation of the Jacobian of a chain of {steps} maps")
    proof.hypothesis("g_k maps U_k into U_{k+1}; M_l = sup_{U_l} ||Dg_l||, V_k = sup_{U_k} ||Dg_k(Y) - Dg_k(X_k)||, "
                     "N_l = ||Dg_l(X_l)||; blockwise, with the matrices of per-token block norms multiplied")
    proof.add(Described(r"DF(Y) - DF(X) = \textstyle\sum_k A_m \cdots A_{k+1} (A_k - B_k) B_{k-1} \cdots B_1,\ "
                        r"A_l = Dg_l(Y_l),\ B_l = Dg_l(X_l)"),
              "telescope the chain rule", "telescoping")
    proof.add(le(Described(r"\sup_U \|DF(Y) - DF(X)\|"), statement), "submultiplicativity", "submultiplicative")
    return Theorem(f"local-chain-{steps}", "Variation along a chain", statement, proof)


@functools.cache
def normwise_product(steps: int) -> Theorem:
    """``||J_1 ... J_m||_2 <= ||P_m||_2 + r_m`` for a float product ``P_m`` carried with one normwise radius
    ``r_l = r_{l-1} a_l + ||S_l||_F`` (docs/mathematics.md, lemma normwise-product)."""
    P_m, r_m = q(rf"\|P_{{{steps}}}\|_2"), q(rf"r_{{{steps}}}")
    statement = P_m + r_m
    proof = Derivation(f"Product of {steps} enclosed matrices with one normwise radius")
    proof.hypothesis("|J_l - M_l| <= R_l entrywise; a_l >= ||J_l||_2; P_1 = M_1, r_1 = ||R_1||_F; "
                     "P_l = fl(P_{l-1} M_l) and S_l >= 0 with |P_{l-1} J_l - P_l| <= S_l entrywise for every such "
                     "J_l (a midpoint-radius product: its rounding and |P_{l-1}| R_l); r_l = r_{l-1} a_l + ||S_l||_F")
    proof.add(Described(r"J_1 \cdots J_l - P_l = (J_1 \cdots J_{l-1} - P_{l-1}) J_l + (P_{l-1} J_l - P_l)"),
              "add and subtract P_{l-1} J_l", None)
    proof.add(le(Described(r"\|J_1 \cdots J_l - P_l\|_2"), Described(r"r_{l-1} a_l + \|S_l\|_F = r_l")),
              "by induction, submultiplicativity, and ||B||_2 <= ||B||_F <= ||S_l||_F for |B| <= S_l",
              "submultiplicative")
    proof.add(le(Described(rf"\|J_1 \cdots J_{{{steps}}}\|_2"), statement), "triangle inequality (Weyl)",
              "norm-calculus")
    return Theorem(f"local-normwise-product-{steps}", "Product of enclosed Jacobians, normwise", statement, proof)


@functools.cache
def chain_prefix(steps: int) -> Theorem:
    """For ``F = B_m o ... o B_1`` on U: ``sup_U ||DF(Y) - J_m ... J_1|| <= sum_l (L_m ... L_{l+1}) V_l pi_{l-1}``
    with ``pi_l >= ||J_l ... J_1||_2`` the certified norm of the product at the centre (lemma prefix-chain)."""
    L = [q(rf"L_{{{k}}}") for k in range(1, steps + 1)]
    V = [q(rf"V_{{{k}}}") for k in range(1, steps + 1)]
    pi = [sp.Integer(1)] + [q(rf"\pi_{{{k}}}") for k in range(1, steps)]
    statement = sp.Add(*[sp.Mul(*L[k + 1:]) * V[k] * pi[k] for k in range(steps)])
    proof = Derivation(f"Variation along a chain of {steps} blocks through the prefix products")
    proof.hypothesis("B_l maps U_l into U_{l+1}, U_1 = U; J_l = DB_l(X_l) at the centres; L_l >= sup_{U_l} ||DB_l||, "
                     "V_l >= sup_{U_l} ||DB_l(Y_l) - J_l||; pi_0 = 1, pi_l >= ||J_l ... J_1||_2 (lemma "
                     "normwise-product)")
    proof.add(Described(r"DF(Y) - J_m \cdots J_1 = \textstyle\sum_l A_m \cdots A_{l+1} (A_l - J_l) "
                        r"J_{l-1} \cdots J_1,\ A_l = DB_l(Y_l)"),
              "telescope the chain rule, keeping the centre's product whole", "telescoping")
    proof.add(le(Described(r"\sup_U \|DF(Y) - J_m \cdots J_1\|"), statement),
              "submultiplicativity, ||A_l|| <= L_l and ||A_l - J_l|| <= V_l on U_l", "submultiplicative")
    return Theorem(f"local-prefix-chain-{steps}", "Variation along a chain, through the prefix products", statement,
                   proof)


@functools.cache
def path_certificate() -> Theorem:
    """``||F_i(X') - F_i(X)|| <= ||sum_k w_k F'_i(t_k)|| + sum_k w_k e_ik``."""
    main, rest = q(r"\|\textstyle\sum_k w_k F'_i(t_k)\|"), q(r"\textstyle\sum_k w_k e_{ik}")
    statement = main + rest
    proof = Derivation("Movement along a segment, subdivided")
    proof.hypothesis("X(t) = (1 - t) X + t X'; [0, 1] cut into pieces I_k of length w_k with midpoints t_k; "
                     "e_ik >= sup_{t in I_k} ||F'_i(t) - F'_i(t_k)||, F'(t) = DF(X(t)) (X' - X)")
    proof.add(Described(r"F(X') - F(X) = \textstyle\sum_k \int_{I_k} F'(t)\,dt = "
                        r"\sum_k w_k F'(t_k) + \sum_k \int_{I_k} (F'(t) - F'(t_k))\,dt"),
              "fundamental theorem of calculus", "midpoint-integral")
    proof.add(le(Described(r"\|F_i(X') - F_i(X)\|"), statement), "triangle inequality", "norm-calculus")
    return Theorem("local-path", "Path certificate", statement, proof)


@functools.cache
def coupling_bound() -> Theorem:
    """``W1(mu, mu') <= sum_{a,i} pi_ai (||z_a - c_i|| + r_i)`` for atoms ``z'_i`` in ``B(c_i, r_i)``."""
    statement = q(r"\textstyle\sum_{a,i} \pi_{ai} (\|z_a - c_i\| + r_i)")
    proof = Derivation("Wasserstein-1 through a coupling")
    proof.hypothesis("mu = sum_a mu_a delta_{z_a}, mu' = sum_i mu'_i delta_{z'_i} with ||z'_i - c_i|| <= r_i; "
                     "pi a coupling of the masses")
    proof.add(le(Described(r"W_1(\mu, \mu')"), Described(r"\textstyle\sum_{a,i} \pi_{ai} \|z_a - z'_i\|")),
              "any coupling bounds the optimal one", "kantorovich")
    proof.add(le(Described(r"W_1(\mu, \mu')"), statement), "triangle inequality", "norm-calculus")
    return Theorem("local-coupling", "Wasserstein-1 through a coupling", statement, proof)


#: every local theorem, by id (tested for completeness and for its lemmas)
LOCAL_THEOREMS = {t.id: t for t in (score_deviation(), score_deviation_normalised(), softmax_upper(), softmax_lower(),
                                    attention_movement(),
                                    attention_reach(),
                                    attention_block(), attention_variation(), attention_curvature(),
                                    *(theorem(kind) for kind in _NORMS
                                      for theorem in (norm_lipschitz, norm_movement, norm_variation,
                                                      norm_lipschitz_floor, norm_variation_floor)),
                                    feedforward_variation(), gated_variation(), residual_step(),
                                    feedforward_curvature(), feedforward_front_variation(), attention_tail(),
                                    attention_tail_weighted(),
                                    attention_front(),
                                    block_tail_variation(),
                                    jacobian_on_neighbourhood(), chain_variation(2), normwise_product(3),
                                    chain_prefix(3), path_certificate(),
                                    coupling_bound())} | SECOND_ORDER_THEOREMS | JACOBIAN_THEOREMS \
    | BLOCK_FORM_THEOREMS
