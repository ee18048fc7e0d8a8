"""Local theorems on a block's per-token maps carried on affine forms: one map's step on a token's set (a linear
part on the form's generators, a ball for the rest), and the feed-forward block's second-order remainder jointly over
its neurons from the form's pre-activation generators.

A token's set before a map g is ``x~ + f(e) + z``: ``x~`` a float point, ``f`` affine in the ball's symbols ``e``
(``||e||_2 <= 1``), ``||z|| <= b``; ``r`` bounds ``||x - x~||`` on it.  The numeric layer
(:mod:`lipbound.local.relational_tail`) forms every quantity in outward-rounded arithmetic; the proofs in words are
in docs/local.md (lemmas token-form-step, token-form-nested, feedforward-taylor-joint and
feedforward-taylor-signed).
"""

from __future__ import annotations

import functools

import sympy as sp

from .record import Derivation, Described, le
from .record import quantity as q
from .theorems import Theorem

__all__ = ["token_form_step", "token_form_nested", "feedforward_taylor_joint", "feedforward_taylor_signed",
           "feedforward_taylor_directed", "centred_floor", "BLOCK_FORM_THEOREMS"]


@functools.cache
def token_form_step() -> Theorem:
    """``g(x) in g(x~) + f(e) M + B(0, b ||M|| + r (||J - M|| + V) + T)``: one per-token map on a token's set, M any
    float matrix (the midpoint of g's enclosed Jacobian J at x~), V the Jacobian's variation on the ball ``B(x~, r)``
    or T a bound on Taylor's remainder there, the other 0 (lemma ``token-form-step``)."""
    b, M, r, gap, V, rest = q("b"), q(r"\|M\|"), q("r"), q(r"\|J - M\|"), q("V"), q("T")
    statement = b * M + r * (gap + V) + rest
    proof = Derivation("A per-token map on an affine form and a ball")
    proof.hypothesis("g differentiable on the convex ball B(x~, r), which holds the set {x~ + f(e) + z : ||e|| <= 1, "
                     "||z|| <= b}; J = Dg(x~); either V >= sup ||Dg(y) - J|| on B(x~, r) and T = 0, or "
                     "T >= sup ||g(x) - g(x~) - (x - x~) J|| there and V = 0")
    proof.add(Described(r"g(x) = g(x~) + f(e) M + z M + (x - x~)(J - M) + \textstyle\int_0^1 (Dg(x~ + t (x - x~)) "
                        r"- J)(x - x~)\,dt"), "row convention, x - x~ = f(e) + z, the fundamental theorem of calculus",
              "mean-value")
    proof.add(le(Described(r"\|z M + (x - x~)(J - M)\|"), Described(r"b \|M\| + r \|J - M\|")), "submultiplicative",
              "submultiplicative")
    proof.add(le(Described(r"\|\int_0^1 (Dg(x~ + t (x - x~)) - J)(x - x~)\,dt\|"), Described(r"r V + T")),
              "the segment lies in the ball; each of the two bounds alone", "mean-value")
    proof.add(le(Described(r"\|g(x) - g(x~) - f(e) M\|"), statement), "triangle inequality", "norm-calculus")
    return Theorem("local-token-form-step", "A per-token map on an affine form and a ball", statement, proof)


@functools.cache
def token_form_nested() -> Theorem:
    """``sup ||g(x) - g(x~) - (x - x~) Dg(x~)|| <= r sum_k (t_k - t_(k-1)) V(t_k r)`` on ``B(x~, r)``: Taylor's
    remainder of a per-token map from its Jacobian's variation on nested balls (lemma ``token-form-nested``)."""
    r, nested = q("r"), q(r"\textstyle\sum_k (t_k - t_{k-1})\,V(t_k r)")
    statement = r * nested
    proof = Derivation("Taylor's remainder of a per-token map from its variation on nested balls")
    proof.hypothesis("g differentiable on B(x~, r), J = Dg(x~); 0 = t_0 < t_1 < ... < t_K = 1; V(rho) >= sup ||Dg(y) - "
                     "J|| over B(x~, rho) for rho = t_k r")
    proof.add(Described(r"g(x) - g(x~) - (x - x~) J = \textstyle\int_0^1 (Dg(x~ + t \delta) - J)\,\delta\,dt,\ "
                        r"\delta = x - x~"), "the fundamental theorem of calculus, row convention", "mean-value")
    proof.add(le(Described(r"\|g(x) - g(x~) - \delta J\|"), Described(r"\textstyle\int_0^{\|\delta\|} s(\rho)\,d\rho "
                                                                       r"\le \int_0^r s(\rho)\,d\rho")),
              "s(rho) = sup ||Dg(y) - J|| over B(x~, rho) is non-decreasing (nested balls) and x~ + t delta lies in "
              "B(x~, t ||delta||); substitute rho = t ||delta||", "norm-calculus")
    proof.add(le(Described(r"\textstyle\int_0^r s(\rho)\,d\rho"), statement),
              "on [t_(k-1) r, t_k r], s(rho) <= s(t_k r) <= V(t_k r)", "norm-calculus")
    return Theorem("local-token-form-nested", "Taylor's remainder of a per-token map on nested balls", statement,
                   proof)


@functools.cache
def feedforward_taylor_joint() -> Theorem:
    """``||FF(x) - FF(y) - (x - y) DFF(y)|| <= (1/2) P Q`` for ``x - y = e G + sum_p z_p N_p + u``, ``||e||, ||z_p||
    <= 1``, ``||u|| <= beta`` (lemma ``feedforward-taylor-joint``, with the carried balls ``z_p N_p`` of lemma
    ``token-form-carried``)."""
    P, Q = q("P"), q("Q")
    statement = P * Q / 2
    proof = Derivation("The feed-forward block's Taylor remainder on an affine form, jointly over the neurons")
    proof.hypothesis("FF(x) = x + act(x W_1 + b_1) W_2 + b_2, columns w_k of W_1, rows r_k of W_2; x - y = e G + sum_p "
                     "z_p N_p + u, ||e||, ||z_p|| <= 1, ||u|| <= beta; t_k = (x - y) . w_k with |t_k| <= dev_k; S_k >= "
                     "|2 phi_k(t) / t^2| for all |t| <= dev_k, which the largest |act''| on [h_k - dev_k, h_k + dev_k] "
                     "is; D = diag(S)^(1/2); A = G W_1; m_pk >= ||N_p w_k||; P >= lambda_max(D A^T A D)^(1/2) + sum_p "
                     "||N_p W_1 D|| + beta ||W_1 D||; Q >= the smaller of lambda_max(D (A^T A o W_2 W_2^T) D)^(1/2) + "
                     "sum_p q_p + beta q_0 and max_k D_k dev_k ||W_2||, q_p the smaller of ||diag(D m_p) W_2|| and "
                     "lambda_max(D ((N_p W_1)^T (N_p W_1) o W_2 W_2^T) D)^(1/2), q_0 the smaller of ||diag(D ||w||) "
                     "W_2|| and lambda_max(D (W_1^T W_1 o W_2 W_2^T) D)^(1/2)")
    proof.add(Described(r"FF(x) - FF(y) - (x - y) DFF(y) = \textstyle\sum_k \phi_k(t_k)\, r_k,\ "
                        r"|\phi_k(t)| \le S_k t^2 / 2"),
              "phi_k(t) = act(h_k + t) - act(h_k) - act'(h_k) t, whose quotient 2 phi_k(t) / t^2 is a weighted mean "
              "of act'' on the segment from h_k to h_k + t (Taylor with the integral remainder, weights 2 (1 - u))",
              "mean-value")
    proof.add(le(Described(r"|\textstyle\sum_k \phi_k(t_k)\, r_k \cdot v|"),
                 Described(r"\tfrac12 \|(S_k^{1/2} t_k)_k\|\, \|(S_k^{1/2} t_k\, r_k \cdot v)_k\|")),
              "triangle inequality over k, then Cauchy-Schwarz, for a unit v", "norm-calculus")
    proof.add(le(Described(r"\|(S_k^{1/2} t_k)_k\|"), P),
              "t = e A + sum_p z_p N_p W_1 + u W_1 and Minkowski's inequality: ||D A^T e^T|| <= lambda_max(D A^T A "
              "D)^(1/2), ||D (N_p W_1)^T z_p^T|| <= ||N_p W_1 D||",
              "minkowski")
    proof.add(le(Described(r"\|(S_k^{1/2} t_k\, r_k \cdot v)_k\|"), Q),
              "the linear part's squares sum_k S_k (e . a_k)^2 (r_k . v)^2 form the quadratic form of the Gram matrix "
              "of the vectors S_k^(1/2) a_k (x) r_k at e (x) v, and so do each carried ball's (the vectors S_k^(1/2) "
              "N_p w_k (x) r_k at z_p (x) v) and the ball's (S_k^(1/2) w_k (x) r_k at (u / beta) (x) v), or "
              "|z_p N_p . w_k| <= m_pk and |u . w_k| <= beta ||w_k||; Minkowski over the parts; or "
              "each S_k^(1/2) |t_k| at most its largest and sum_k (r_k . v)^2 <= ||W_2||^2", "minkowski")
    proof.add(le(Described(r"\|FF(x) - FF(y) - (x - y) DFF(y)\|"), statement), "the supremum over unit v",
              "norm-calculus")
    return Theorem("local-feedforward-taylor-joint", "The feed-forward block's Taylor remainder on an affine form",
                   statement, proof)


@functools.cache
def feedforward_taylor_signed() -> Theorem:
    """``||FF(x) - FF(y) - (x - y) DFF(y)|| <= c F / 2 + P_3 Q_3 / 2``: the quadratic part with the curvatures' signs at
    the centre, the cubic part jointly over the neurons (lemma ``feedforward-taylor-signed``)."""
    c, F, P_3, Q_3 = q("c"), q("F"), q("P_3"), q("Q_3")
    statement = c * F / 2 + P_3 * Q_3 / 2
    proof = Derivation("The feed-forward block's Taylor remainder with the curvatures' signs kept")
    proof.hypothesis("FF(x) = x + act(x W_1 + b_1) W_2 + b_2, columns w_k of W_1, rows r_k of W_2; x - y = e G + "
                     "sum_p z_p N_p + u, ||e||, ||z_p|| <= 1, ||u|| <= beta; t_k = (x - y) . w_k with |t_k| <= dev_k; "
                     "g_k and S_k >= 0 with |2 phi_k(t) / t^2 - g_k| <= S_k for all |t| <= dev_k: g_k = act''(h_k) "
                     "and S_k = T_k dev_k / 3 with T_k >= |act'''| on [h_k - dev_k, h_k + dev_k], or the midpoint "
                     "and half-width of an enclosure of those quotients; A = G W_1, K = "
                     "A^T A + sum_p (N_p W_1)^T (N_p W_1) + beta^2 W_1^T W_1; c the number of the parts e, z_p, u "
                     "present; F >= lambda_max(W_2^T diag(g) (K o K) diag(g) W_2)^(1/2); P_3, Q_3 the factors of "
                     "local-feedforward-taylor-joint with these S_k")
    proof.add(Described(r"\phi_k(t) = \tfrac12 g_k t^2 + \psi_k(t),\ |\psi_k(t)| \le S_k\, t^2 / 2"),
              "the hypothesis, |t_k| <= dev_k; with g_k = act''(h_k) the quotient less g_k is a weighted mean of "
              "act''(h_k + u t) - act''(h_k), at most T_k u |t|, whose weights 2 (1 - u) give T_k |t| / 3",
              "mean-value")
    proof.add(le(Described(r"|\textstyle\sum_k \psi_k(t_k)\, r_k \cdot v|"), Described(r"P_3 Q_3 / 2")),
              "local-feedforward-taylor-joint's steps with these S_k", "norm-calculus")
    proof.add(Described(r"\textstyle\sum_k g_k t_k^2\, r_k \cdot v = z\, \hat A \operatorname{diag}(g \circ W_2 v)"
                        r"\, \hat A^\top z^\top,\ z = (e, z_1, .., u / \beta),"
                        r"\ \hat a_k = (a_k, N_1 w_k, .., \beta w_k),\ \|z\|^2 \le c"),
              "t_k = z . a^_k (the parts absent dropped)", "norm-calculus")
    proof.add(le(Described(r"\|\hat A \operatorname{diag}(g \circ W_2 v)\, \hat A^\top\|_2^2"),
                 Described(r"v^\top W_2^\top \operatorname{diag}(g) (K \circ K) \operatorname{diag}(g)\, W_2 v "
                           r"\le F^2")),
              "the spectral norm at most the Frobenius norm, whose square is sum_(k,l) c_k c_l (a^_k . a^_l)^2 with "
              "c = g o W_2 v; v a unit vector", "norm-calculus")
    proof.add(le(Described(r"\|FF(x) - FF(y) - (x - y) DFF(y)\|"), statement),
              "triangle inequality, then the supremum over unit v", "norm-calculus")
    return Theorem("local-feedforward-taylor-signed", "The feed-forward block's Taylor remainder with signed "
                   "curvatures", statement, proof)


@functools.cache
def feedforward_taylor_directed() -> Theorem:
    """``|<w, FF(x) - FF(y) - (x - y) DFF(y)>| <= (c / 2) (F_w + Lambda_w) + s ||w||`` for one fixed vector w (lemma
    ``feedforward-taylor-directed``)."""
    c, F, lam, sep, size = q("c"), q("F_w"), q(r"\Lambda_w"), q("s"), q(r"\|w\|")
    statement = c * (F + lam) / 2 + sep * size
    proof = Derivation("The feed-forward block's Taylor remainder along one direction")
    proof.hypothesis("local-feedforward-taylor-signed's hypotheses with the outlier neurons O apart (g_k = S_k = 0 "
                     "there); w a fixed vector, x_w = g o W_2 w, y_w = S o |W_2 w|; F_w^2 >= x_w^T (K o K) x_w; "
                     "Lambda_w >= lambda_max(diag(y_w)^(1/2) K diag(y_w)^(1/2)); s >= sum_(k in O) sup_(|t| <= dev_k) "
                     "|phi_k(t)| ||r_k||")
    proof.add(Described(r"\langle w, \textstyle\sum_k \phi_k(t_k) r_k\rangle = \sum_k (\tfrac12 g_k t_k^2 + "
                        r"\psi_k(t_k))\, r_k \cdot w"), "local-feedforward-taylor-signed's first step", "mean-value")
    proof.add(le(Described(r"|\textstyle\sum_k g_k t_k^2\, r_k \cdot w|"), c * F),
              "the sum is z A^ diag(x_w) A^^T z^T with ||z||^2 <= c, at most c times the Frobenius norm of that "
              "matrix, whose square is x_w^T (K o K) x_w", "norm-calculus")
    proof.add(le(Described(r"|\textstyle\sum_k \psi_k(t_k)\, r_k \cdot w|"), c * lam / 2),
              "|psi_k(t_k) r_k . w| <= y_wk t_k^2 / 2 and sum_k y_wk t_k^2 = z A^ diag(y_w) A^^T z^T <= c times its "
              "top eigenvalue, that of diag(y_w)^(1/2) K diag(y_w)^(1/2) (the same non-zero eigenvalues)",
              "norm-calculus")
    proof.add(le(Described(r"|\langle w, \textstyle\sum_{k \in O} \phi_k(t_k) r_k\rangle|"), sep * size),
              "Cauchy-Schwarz", "norm-calculus")
    return Theorem("local-feedforward-taylor-directed", "The feed-forward block's Taylor remainder along a direction",
                   statement, proof)


@functools.cache
def centred_floor() -> Theorem:
    """``||P z'|| >= max(L - f_w - c_w - b_0 ||w|| - T_w - sigma rho / sqrt(d), 0) / ||w||`` on a token's set (lemma
    ``centred-floor``)."""
    L, f, c, b_0, size, T_w = q(r"\langle \tilde x, w\rangle"), q("f_w"), q("c_w"), q("b_0"), q(r"\|w\|"), q("T_w")
    sigma, rho, d = q(r"\sigma"), q(r"\rho"), q("d")
    statement = sp.Max(L - f - c - b_0 * size - T_w - sigma * rho / sp.sqrt(d), 0) / size
    proof = Derivation("A floor of the centred norm on a token's set")
    proof.hypothesis("z' = x~ + f(e) + sum_p s_p(z_p) + z + q in R^d, ||e||, ||z_p|| <= 1, ||z|| <= b_0, q the "
                     "feed-forward remainder; P the centring projection; w a fixed non-zero vector; L <= <x~, w>; "
                     "f_w >= sup |<f(e), w>|, c_w >= sum_p sup |<s_p(z_p), w>|, T_w >= |<q, w>|; sigma >= |sum_j "
                     "w_j|; rho >= ||z'||, and the same bounds at the segments from x~ to the set (f_w, c_w count "
                     "the forms' centres too)")
    proof.add(le(Described(r"\langle P z', w\rangle"), Described(r"\|P z'\|\, \|w\|")), "Cauchy-Schwarz",
              "norm-calculus")
    proof.add(Described(r"\langle P z', w\rangle = \langle z', w\rangle - \tfrac1d \langle z', 1\rangle "
                        r"\textstyle\sum_j w_j \ge \langle z', w\rangle - \sigma \rho / \sqrt d"),
              "P z' = z' - mean(z') 1 and |<z', 1>| <= sqrt(d) ||z'||", "norm-calculus")
    proof.add(le(Described(r"L - f_w - c_w - b_0 \|w\| - T_w"), Described(r"\langle z', w\rangle")),
              "the parts of z' one by one, Cauchy-Schwarz for z", "norm-calculus")
    proof.add(le(statement, Described(r"\|P z'\|")), "the three steps, and ||P z'|| >= 0", "norm-calculus")
    return Theorem("local-centred-floor", "A floor of the centred norm on a token's set", statement, proof)


#: the theorems of this module, by id (part of :data:`lipbound.symbolic.local.LOCAL_THEOREMS`)
BLOCK_FORM_THEOREMS = {t.id: t for t in (token_form_step(), token_form_nested(), feedforward_taylor_joint(),
                                          feedforward_taylor_signed(), feedforward_taylor_directed(),
                                          centred_floor())}
