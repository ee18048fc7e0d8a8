"""Local theorems on an attention layer's Jacobian over a whole ball: its supremum path by path, the heads joined
through quadratic forms, and the covering forms of the keys' and values' spreads.

``F(Y) = Y + sum_h softmax(c Y W_Q^h (Y W_K^h)^T) Y W_V^h W_O^h`` (biases folded into the projections) on the
Frobenius ball ``U = U(X, eps)``; ``L(eps) <= sup_U ||DF(Y)||_2`` by the mean value theorem.  The numeric layer
(:mod:`lipbound.local.jacobian_forms`, :mod:`lipbound.local.joint_heads`) forms every quantity in outward-rounded
arithmetic.  Notation (docs/mathematics.md, section 10): ``a_j = W_Q k_j^T``, ``u_j = v_j W_O^h``, ``b_i = W_K
q_i^T`` at X, ``G = W_Q W_K^T``, ``A = W_V W_O^h``, primes for values at Y; the proofs in words are there.
"""

from __future__ import annotations

import functools

import sympy as sp

from .record import Derivation, Described, le
from .record import quantity as q
from .theorems import Theorem

__all__ = ["attention_jacobian", "heads_joint", "heads_covering", "JACOBIAN_THEOREMS"]


def _layer_hypotheses(proof: Derivation) -> None:
    proof.hypothesis("F(Y) = Y + sum_h P_h(Y) Y W_V^h W_O^h, P_h(Y) = softmax(c Y W_Q^h (Y W_K^h)^T) row by row; "
                     "U = {Y : ||Y - X||_F <= eps}, convex; p'_ij the weights at a point Y of U")


@functools.cache
def attention_jacobian() -> Theorem:
    """``sup_U ||DF(Y)||_2 <= 1 + sum_h (nu_h + kappa^Q_h + kappa^K_h)``: the layer's Jacobian over U, each head's
    value, query and key path bounded for any weights (theorem ``local-attention-jacobian``, the supremum; the
    spread ``sup_U ||DF(Y) - DF(X)||`` follows the same steps with the paths' changes)."""
    paths = q(r"\textstyle\sum_h (\nu_h + \kappa^Q_h + \kappa^K_h)")
    statement = 1 + paths
    proof = Derivation("The Jacobian of an attention layer over a ball")
    _layer_hypotheses(proof)
    proof.hypothesis("nu_h >= (max_j sum_i p'_ij)^(1/2) ||W_V^h W_O^h||, kappa^Q_h >= c max_i ||W_Q K'^T J'_i V' "
                     "W_O^h|| and kappa^K_h >= c (max_j sum_i p'_ij ||b'_i||^2)^(1/2) D_u / 2 on U, with J'_i = "
                     "diag(p'_i) - p'_i p'_i^T and D_u >= max_(j,l) ||u'_j - u'_l|| on U")
    proof.add(Described(r"DF(Y)[E] = E + \textstyle\sum_h (D^V_h + D^Q_h + D^K_h)(E)"),
              "the derivative of softmax rows (ds_ij = c (e_i W_Q k_j^T + e_j b_i)), per head the value path D^V_h(E) "
              "= P' E A, the query path with rows c e_i W_Q K'^T J'_i V' W_O^h and the key path with rows c b'_i^T "
              "E^T J'_i V' W_O^h", "softmax-derivative")
    proof.add(le(Described(r"\|D^V_h(E)\|_F"), Described(r"\nu_h \|E\|_F")),
              "||P'||_2^2 <= ||P'||_1 ||P'||_inf, the rows summing to 1", "submultiplicative")
    proof.add(le(Described(r"\|D^Q_h(E)\|_F"), Described(r"\kappa^Q_h \|E\|_F")),
              "a map E -> (e_i M_i)_i has norm max_i ||M_i||", "block-diagonal")
    proof.add(le(Described(r"\|D^K_h(E)\|_F^2"), Described(r"(\kappa^K_h)^2 \|E\|_F^2")),
              "row i read along a unit w is c Cov_(p'_i)(e_j . b'_i, w . u'_j), at most (sum_j p'_ij (e_j . b'_i)^2)"
              "^(1/2) times w . u'_j's standard deviation, at most D_u / 2; then sum_(i,j) p'_ij (e_j . b'_i)^2 <= "
              "||E||_F^2 max_j sum_i p'_ij ||b'_i||^2", "popoviciu")
    proof.add(le(q(r"\sup_U \|DF(Y)\|_2"), statement),
              "triangle inequality over the heads and paths, the identity of the residual of norm 1", "norm-calculus")
    return Theorem("local-attention-jacobian", "The Jacobian of an attention layer over a ball, path by path",
                   statement, proof)


@functools.cache
def heads_joint() -> Theorem:
    """``sup_U ||DF(Y)||_2 <= 1 + lambda_S^(1/2) lambda_T^(1/2)``: every path of every head as a bilinear form
    ``gamma_k (tr E S_k E^T)^(1/2) (tr F T_k F^T)^(1/2)``, joined by Cauchy-Schwarz (lemma ``jacobian-heads-joint``)."""
    lam_s, lam_t = q(r"\lambda_S"), q(r"\lambda_T")
    statement = 1 + sp.sqrt(lam_s) * sp.sqrt(lam_t)
    proof = Derivation("An attention layer's Jacobian over a ball with its heads joined")
    _layer_hypotheses(proof)
    proof.hypothesis("D_k (k over the value, query and key paths of every head) the paths' linear maps of E at Y, "
                     "gamma_k >= 0 and PSD S_k, T_k (d x d), the same for every Y in U, with |<F, D_k(E)>| <= gamma_k "
                     "(tr E S_k E^T)^(1/2) (tr F T_k F^T)^(1/2) for all E, F (the forms of lemma jacobian-heads-joint, "
                     "the spreads' through local-jacobian-heads-covering); t_k > 0, a_k b_k >= gamma_k^2; lambda_S >= "
                     "||sum_k t_k a_k S_k||, lambda_T >= ||sum_k b_k T_k / t_k||")
    proof.add(le(Described(r"\gamma_k\,x\,y"), Described(r"(t_k a_k x^2)^{1/2} (b_k y^2 / t_k)^{1/2}")),
              "a_k b_k >= gamma_k^2, for x, y >= 0", "norm-calculus")
    proof.add(le(Described(r"|\langle F, \textstyle\sum_k D_k(E)\rangle|"),
                 Described(r"(\operatorname{tr} E (\textstyle\sum_k t_k a_k S_k) E^\top)^{1/2} "
                           r"(\operatorname{tr} F (\textstyle\sum_k b_k T_k / t_k) F^\top)^{1/2}")),
              "the paths' forms, then Cauchy-Schwarz over k", "norm-calculus")
    proof.add(le(Described(r"\operatorname{tr} E S E^\top"), Described(r"\|S\|\,\|E\|_F^2")),
              "S PSD: each row of E contributes at most ||S|| times its squared norm", "norm-calculus")
    proof.add(le(q(r"\sup_U \|DF(Y)\|_2"), statement),
              "over unit E and F: ||DF(Y) - I||_2 = sup <F, sum_k D_k(E)>, and the residual's identity",
              "norm-calculus")
    return Theorem("local-jacobian-heads-joint", "An attention layer's Jacobian over a ball with its heads joined",
                   statement, proof)


@functools.cache
def heads_covering() -> Theorem:
    """``max_(j,l) (x . (r_j - r_l))^2 / 4 <= mu x C^T M C x^T``: a quadratic form covering every pair of points,
    its top eigenvalue near the widest pair's square over 4 (lemma ``jacobian-heads-covering``)."""
    mu, form = q(r"\mu"), q(r"x C^\top M C x^\top")
    statement = mu * form
    proof = Derivation("A quadratic form covering the spread of a few points")
    proof.hypothesis("points r_1, ..., r_n in R^d, C (n x d) their rows less any fixed centre; lambda > 0, N = C C^T "
                     "+ lambda I; M symmetric positive definite with M N M - s^2 M PSD (s > 0); mu >= max_(j<l) "
                     "(||r_j - r_l||^2 + 2 lambda) / (4 s^2); x in R^d any direction")
    proof.add(Described(r"x \cdot (r_j - r_l) = d^\top z,\ z = C x,\ d = e_j - e_l"), "the centre cancels in a "
              "difference", "norm-calculus")
    proof.add(le(Described(r"(d^\top z)^2"), Described(r"(d^\top N d)\,(z^\top N^{-1} z)")),
              "Cauchy-Schwarz in the inner product of N^(-1) (N positive definite)", "norm-calculus")
    proof.add(Described(r"d^\top N d = \|r_j - r_l\|^2 + 2 \lambda"), "d^T C C^T d = ||C^T d||^2", "norm-calculus")
    proof.add(le(Described(r"N^{-1}"), Described(r"M / s^2")),
              "M N M >= s^2 M and M > 0 give N >= s^2 M^(-1) (congruence by M^(-1)), and inversion reverses the order "
              "of positive definite matrices", "norm-calculus")
    proof.add(le(Described(r"\max_{j,l} (x \cdot (r_j - r_l))^2 / 4"), statement),
              "the three steps above, the largest pair's d^T N d at most 4 s^2 mu", "norm-calculus")
    proof.add(le(Described(r"\operatorname{Var}_p(x \cdot r_j)"), statement),
              "for every probability vector p: a variable in an interval of length l has variance at most l^2 / 4",
              "popoviciu")
    return Theorem("local-jacobian-heads-covering", "A quadratic form covering the spread of a few points", statement,
                   proof)


#: the theorems of this module, by id (part of :data:`lipbound.symbolic.local.LOCAL_THEOREMS`)
JACOBIAN_THEOREMS = {t.id: t for t in (attention_jacobian(), heads_joint(), heads_covering())}
