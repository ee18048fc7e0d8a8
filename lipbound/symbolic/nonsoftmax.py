r"""Attention whose weights are not a softmax of the score: sigmoid attention and linear attention.

**Sigmoid attention** (Ramapuram et al. 2024, arXiv:2409.04431) weighs each pair on its own,

    f_i(X) = sum_j sigma(s(x_i, x_j) + b) v(x_j),    sigma(t) = 1 / (1 + e^{-t}),    b = -log n.

No row is normalised, so the softmax theorems (:mod:`lipbound.symbolic.theorems`, which rest on
the covariance of a probability vector and on column sums of a Markov matrix) do not apply.
Differentiating, ``Df_i[E] = sum_j sigma_ij V^T e_j + sum_j sigma'_ij ds_ij v(x_j)``, and with the
constants ``L_V = ||V||``, ``nu >= sup ||v(y)||`` (the value bias counts: nothing is centred),
``eta >= sup ||grad_x s||``, ``beta >= sup ||grad_y s||`` and ``s_max >= sup s`` of the *full* score
(no term drops out: a sigmoid is not shift invariant),

    Lip(f) <= n sigma(s_max + b) L_V + n min(1/4, sigma(s_max + b)) nu (eta + beta)

in the Frobenius, (2,1) and (2,inf) norms (row and column sums of the weight matrix, Schur's
test), and ``sqrt(d)`` times the (2,inf) bound for l_inf on vec(X).  With ``b = -log n``,
``n sigma(s_max - log n) = n / (1 + n e^{-s_max}) = n kappa_{n+1}(s_max) / (n + 1) <= min(n, e^{s_max})``,
the column-sum constant of softmax attention over ``n + 1`` keys.  On an unbounded domain
``s_max`` is infinite: lipbound claims nothing there.

**Linear attention** (Katharopoulos et al. 2020, arXiv:2006.16236) with the positive feature map
``phi = elu + 1`` normalises ``K(x, y) = phi(q) . phi(k)`` over the keys,
``p_ij = K(x_i, x_j) / sum_l K(x_i, x_l)``: a Markov kernel, equal to the softmax of the score
``s = log K``.  The softmax theorems apply unchanged; :class:`FeatureMapKernel` derives their
kernel constants from three facts of ``phi``: ``e^{-|t|} <= phi(t) <= 1 + |t|`` and
``0 < phi' <= 1``.  On a ball ``||q|| <= r_Q``, ``||k|| <= r_K``:

    ||phi(q)|| <= sqrt(d_k) + r_Q = Phi_Q,     K >= d_k e^{-(r_Q + r_K)/sqrt(d_k)} = K_min   (Jensen),
    beta <= ||W_K|| Phi_Q / K_min,   alpha <= ||W_Q|| Phi_K / K_min,   omega <= log(Phi_Q Phi_K / K_min),

and ``log(Phi_Q Phi_K / K_min) = log(1 + r_Q/sqrt(d_k)) + log(1 + r_K/sqrt(d_k)) + (r_Q + r_K)/sqrt(d_k)``.

On an unbounded domain ``K_min`` vanishes and no theorem of lipbound applies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from . import theorems as T
from .assumptions import Assumptions, Mixed2Inf, Mixed21, Norm, VecInf
from .calculus import Inner, Region, constant_sign, gradient, name_norms, upper_abs, upper_norm_terms, upper_norm_vec
from .custom import KEY, QUERY
from .facts import HeadFacts
from .record import Derivation, Described, eq, le
from .scores import KernelConstants, Score, define_names, smaller
from .variants import Variant

__all__ = ["FeatureMap", "FeatureMapKernel", "SigmoidConstants", "sigmoid_constants", "sigmoid_attention",
           "SigmoidAttention", "nu", "eta", "s_max"]

#: Constants of sigmoid attention: the value magnitude, the query sensitivity, the largest score.
nu = S.KernelConstant("nu")
eta = S.KernelConstant("eta")
s_max = S.KernelConstant("s_max")

_LIP = Described(r"\operatorname{Lip}(f)")


class FeatureMap(sp.Function):
    r"""``phi(u) = elu(u) + 1`` applied to each coordinate of a vector u (printed :math:`\phi(u)`)."""

    nargs = 1
    is_commutative = True


def _balls(assumptions: Assumptions, record: Derivation):
    key_ball = assumptions.domain.enclosing_ball(record)
    query_ball = key_ball if assumptions.query_domain is None else assumptions.query_domain.enclosing_ball(record)
    region = Region({S.x: (query_ball.center, query_ball.radius), S.y: (key_ball.center, key_ball.radius)},
                    floors=assumptions.lower_bound)
    return key_ball, region


@final
class FeatureMapKernel(Score):
    r"""The score ``s = log(phi(q) . phi(k))`` of linear attention with ``phi = elu + 1``,
    ``q = W_Q^T x``, ``k = W_K^T y`` (Katharopoulos et al. 2020): its softmax is the normalised
    feature-map kernel.  Kernel constants in the module docstring."""

    name = "linear-elu"
    title = "feature-map kernel phi(q) . phi(k), phi = elu + 1"
    kind = "feature-map"
    biased = False
    global_witnesses = False

    def expression(self) -> sp.Expr:
        return sp.log(Inner(FeatureMap(QUERY), FeatureMap(KEY)))

    def hypotheses(self) -> list[str]:
        return ["phi = elu + 1 coordinatewise: e^{-|t|} <= phi(t) <= 1 + |t| and 0 < phi'(t) <= 1"]

    def _derive_constants(self, assumptions) -> KernelConstants:
        record = Derivation(f"Kernel constants of the {self.title}")
        for text in self.hypotheses():
            record.hypothesis(text)
        key_ball, region = _balls(assumptions, record)
        radius = key_ball.radius
        record.add(eq(Described("s(x, y)"), self.expression()),
                   "p_ij = K(x_i, x_j) / sum_l K(x_i, x_l) is the softmax of s = log K", "feature-map")
        r_q, r_k = upper_norm_vec(QUERY, region), upper_norm_vec(KEY, region)
        root = sp.sqrt(S.d_k)
        phi_q, phi_k = root + r_q, root + r_k
        growth = sp.exp((r_q + r_k) / root)  # d_k / K_min
        L_V = upper_norm_vec((S.W_V.T * S.y).doit(), Region({S.y: (None, 1)}))
        rho = upper_norm_vec((S.W_V.T * S.y).doit(), Region({S.y: (None, radius)}))
        beta = S.matrix_norm(S.W_K) * phi_q * growth / S.d_k
        alpha = S.matrix_norm(S.W_Q) * phi_k * growth / S.d_k
        # log(Phi_Q Phi_K / d_k) written as a sum of logs of 1 + r / sqrt(d_k) >= 1: visibly non-negative
        omega = smaller(2 * radius * beta, sp.log(1 + r_q / root) + sp.log(1 + r_k / root) + (r_q + r_k) / root)
        record.add(eq(S.L_V, L_V), "L_V is the operator norm of the linear part of v", "value-lipschitz")
        record.add(le(S.rho, rho), "rho = sup_y ||V^T (y - c)|| <= ||V|| R on the key domain", "value-spread")
        record.add(le(Described(r"\|\phi(W_Q^\top x)\|"), phi_q),
                   "phi(t) <= 1 + |t| and the triangle inequality, ||W_Q^T x|| bounded on the domain", "feature-map")
        record.add(le(Described(r"\|\phi(W_K^\top y)\|"), phi_k), "likewise for the keys", "feature-map")
        record.add(le(S.d_k / growth, Described(r"\phi(W_Q^\top x) \cdot \phi(W_K^\top y)")),
                   "phi(t) >= e^{-|t|}, Jensen on the mean of e^{-|q_i| - |k_i|}, ||u||_1 <= sqrt(d_k) ||u||",
                   "feature-map")
        record.add(le(S.beta, beta), "grad_y s = W_K (phi'(k) * phi(q)) / K with 0 < phi' <= 1", "feature-map")
        record.add(le(S.alpha, alpha), "a standard deviation is at most sup |grad_x s . e|; grad_x s as grad_y s",
                   "feature-map")
        record.add(le(S.omega, omega), "|log K - log K'| <= log(K_max / K_min), K_max <= ||phi(q)|| ||phi(k)||; "
                   "or 2 R beta by the mean value theorem", "score-range")
        return KernelConstants(L_V=L_V, rho=rho, alpha=alpha, beta=beta, omega=omega, record=record)


@final
@dataclass(frozen=True)
class SigmoidConstants:
    """``L_V, nu, eta, beta, s_max`` of a score under sigmoid weights, with their derivation."""

    L_V: sp.Expr
    nu: sp.Expr
    eta: sp.Expr
    beta: sp.Expr
    s_max: sp.Expr
    record: Derivation = field(compare=False)

    def as_substitution(self) -> dict:
        return {S.L_V: self.L_V, nu: self.nu, eta: self.eta, S.beta: self.beta, s_max: self.s_max}


_SIGMOID_CACHE: dict = {}


def sigmoid_constants(score: Score, assumptions: Assumptions) -> SigmoidConstants:
    """The constants of sigmoid attention for ``score`` on the assumptions' domain (cached), from
    the full score (no shift invariance) by the calculus of :mod:`lipbound.symbolic.calculus`."""
    score.check(assumptions)
    key = (type(score).__name__, tuple(sorted(vars(score).items())), assumptions.domain,
           assumptions.query_domain, assumptions.facts)
    if key in _SIGMOID_CACHE:
        return _SIGMOID_CACHE[key]
    record = Derivation(f"Constants of sigmoid attention with the {score.title}")
    for text in score.hypotheses():
        record.hypothesis(text)
    key_ball, region = _balls(assumptions, record)
    expression = score.expression()
    record.add(eq(Described("s(x, y)"), expression), "definition of the score (sigmoid weights: no term drops out)")
    value = score.value_matrix()
    L_V = upper_norm_vec((value.T * S.y).doit(), Region({S.y: (None, 1)}))
    magnitude = upper_norm_vec((value.T * S.y + S.b_V).doit(), Region({S.y: (key_ball.center, key_ball.radius)}))
    query_gradient = upper_norm_terms(gradient(expression, S.x, (S.x, S.y)), region)
    key_gradient = upper_norm_terms(gradient(expression, S.y, (S.x, S.y)), region)
    top = sp.Integer(0) if constant_sign(expression) < 0 else upper_abs(expression, region)
    values = [sp.factor_terms(sp.expand(e)) for e in (L_V, magnitude, query_gradient, key_gradient, top)]
    define_names(record, *values)
    L_V, magnitude, query_gradient, key_gradient, top = (name_norms(e) for e in values)
    record.add(eq(S.L_V, L_V), "L_V is the operator norm of the linear part of v", "value-lipschitz")
    record.add(le(nu, magnitude), "nu = sup_y ||V^T y + b_V||: the value bias counts, nothing is centred",
               "value-magnitude")
    record.add(le(eta, query_gradient), "eta = sup ||grad_x s||: differentiation, triangle inequality, "
               "Cauchy-Schwarz, submultiplicativity, the domain", "norm-calculus")
    record.add(le(S.beta, key_gradient), "beta = sup ||grad_y s||, likewise", "norm-calculus")
    record.add(le(s_max, top), "the score is at most 0" if top == 0 else "s <= sup |s|", "norm-calculus")
    constants = SigmoidConstants(L_V, magnitude, query_gradient, key_gradient, top, record)
    _SIGMOID_CACHE[key] = constants
    return constants


def _sigmoid(t: sp.Expr) -> sp.Expr:
    return 1 / (1 + sp.exp(-t))


@functools.cache  # theorems are pure: build each once
def sigmoid_attention(norm: Norm, n=S.n) -> T.Theorem:
    """Sigmoid self-attention ``sum_j sigma(s_ij - log n) v(x_j)`` in a per-token norm (Frobenius,
    (2,1), (2,inf)); :func:`lipbound.symbolic.theorems.vector_infinity` gives l_inf on vec(X)."""
    # n sigma(s_max - log n) = n / (1 + n e^{-s_max}) = n kappa_{n+1}(s_max) / (n + 1): increasing in s_max
    weight = n / (n + 1) * S.kappa(n + 1, s_max)
    slope = sp.Min(n / 4, weight)
    statement = weight * S.L_V + slope * nu * (eta + S.beta)
    proof = Derivation("Sigmoid self-attention")
    proof.hypothesis("the constants L_V, nu, eta, beta, s_max hold on the (convex) domain")
    proof.hypothesis("weights sigma(s_ij + b) with b = -log n")
    proof.add(Described(r"Df_i[E] = \textstyle\sum_j \sigma_{ij} V^\top e_j + "
                        r"\sum_j \sigma'_{ij} \, \mathrm{d}s_{ij} \, v(x_j)"),
              "differentiate sigma(s_ij + b) v(x_j)", "sigmoid-derivative")
    proof.add(le(Described(r"n \max_{ij} \sigma_{ij}"), weight), "sigma is increasing and s_ij <= s_max",
              "sigmoid-weights")
    proof.add(le(Described(r"n \max_{ij} \sigma'_{ij}"), slope), "sigma' = sigma (1 - sigma) <= min(1/4, sigma)",
              "sigmoid-weights")
    if isinstance(norm, Mixed21):
        why, lemma = "exchange the sums: every row and column of (sigma_ij) sums to at most n max sigma_ij", \
            "sigmoid-weights"
    elif isinstance(norm, Mixed2Inf):
        why, lemma = "per token: sum_j sigma_ij ||e_j|| <= n max sigma_ij max_j ||e_j||", "sigmoid-weights"
    else:
        why, lemma = ("Schur's test: a non-negative matrix has spectral norm at most the geometric mean of its "
                      "largest row and column sums; Minkowski over i"), "schur-test"
    proof.add(le(Described(r"\|Df[E]\|"), statement * Described(r"\|E\|")),
              "|ds_ij| <= eta ||e_i|| + beta ||e_j|| and ||v(x_j)|| <= nu; " + why, lemma)
    proof.add(le(_LIP, statement), "mean value theorem on the convex domain", "mean-value")
    return T.Theorem(f"sigmoid-attention-{T._suffix(norm)}", "Sigmoid self-attention", statement, proof)


@final
class SigmoidAttention(Variant):
    r"""Sigmoid self-attention ``f_i(X) = sum_j sigma(s(x_i, x_j) - log n) v(x_j)`` (Ramapuram et al.
    2024), for any score.  Its theorem is :func:`sigmoid_attention`, stated in the constants of
    :func:`sigmoid_constants`; the softmax theorems do not apply (rows are not normalised)."""

    def __init__(self, score: Score):
        self._score = score
        self.title = f"sigmoid self-attention ({score.name})"

    @property
    def score(self) -> Score:
        return self._score

    @property
    def head_facts(self) -> HeadFacts:
        score = self.score
        return HeadFacts(score.kind, score.biased, score.tied, score.values_through_A, False, "self", "sigmoid")

    def kernel_constants(self, assumptions: Assumptions) -> SigmoidConstants:
        return sigmoid_constants(self.score, assumptions)

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        per_token = Mixed2Inf() if isinstance(assumptions.norm, VecInf) else assumptions.norm
        inner = sigmoid_attention(per_token, assumptions.n)
        return T.vector_infinity(inner, assumptions.d) if isinstance(assumptions.norm, VecInf) else inner

    def derive(self, assumptions: Assumptions, key: str = ""):
        if isinstance(assumptions, Assumptions) and not assumptions.domain.bounded:
            raise AssumptionError(
                "domain", "a bounded domain (the sigmoid-attention theorem needs sup s < infinity; the softmax "
                "theorems do not apply to unnormalised weights)", "Unbounded",
                "state Ball(radius=R) or LayerNormImage(); lipbound claims nothing for sigmoid attention on R^d")
        return super().derive(assumptions, key)
