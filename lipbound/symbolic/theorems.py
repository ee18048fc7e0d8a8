"""General theorems: how kernel constants compose into Lipschitz bounds.

Each theorem states a bound in the kernel constants ``L_V, rho, alpha, beta``,
the column-sum constant ``kappa`` (a function of n and omega) and sizes, with
the steps of its proof.  The composition rules are written once, here; score
functions only supply constants (:mod:`lipbound.symbolic.scores`) and variants
only choose a theorem (:mod:`lipbound.symbolic.variants`).

Notation: ``f_i(X) = sum_j p_ij v(x_j)``, ``E`` a tangent direction,
``Df_i[E] = sum_j p_ij V^T e_j + Cov_{j~p_i}(ds_ij, v(x_j))`` (DESIGN.md section 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import sympy as sp

from ..assumptions import Frobenius, Mixed21, Mixed2Inf, Norm, VecInf
from . import symbols as S
from .record import Derivation, Described, le

__all__ = ["Theorem", "self_attention", "cross_attention", "multi_head", "residual",
           "vector_infinity"]

L_V, rho, alpha, beta, omega = S.L_V, S.rho, S.alpha, S.beta, S.omega

_DF = Described(r"\|Df(X)[E]\|")
_DFI = Described(r"\|Df_i(X)[E]\|")
_COV = Described(r"\|\operatorname{Cov}_{j \sim p_i}(\mathrm{d}s_{ij}, v(x_j))\|")
_MEAN = Described(r"\|\textstyle\sum_j p_{ij} V^\top e_j\|")
_U = Described(r"u_i")
_LIP = Described(r"\operatorname{Lip}(f)")


@final
@dataclass
class Theorem:
    """A general theorem: ``Lip(f) <= statement`` under ``hypotheses``, with its proof."""

    id: str
    title: str
    statement: sp.Expr
    proof: Derivation = field(repr=False)

    @property
    def hypotheses(self) -> list[str]:
        return self.proof.hypotheses


def _column_sum(size, causal: bool) -> sp.Expr:
    return S.causal_kappa(size, omega) if causal else S.kappa(size, omega)


def self_attention(norm: Norm, causal: bool = False, n=S.n) -> Theorem:
    """Single-head self-attention on a convex domain, from the kernel constants."""
    K = _column_sum(n, causal)
    cap = "causal-cap" if causal else "weight-cap"
    tag = "-causal" if causal else ""
    proof = Derivation("Self-attention" + (" with causal masking" if causal else ""))
    proof.hypothesis("the kernel constants L_V, rho, alpha, beta, omega hold on the (convex) domain")
    if causal:
        proof.hypothesis("causal mask: token i attends to tokens 1..i")
    proof.add(Described(r"Df_i[E] = \textstyle\sum_j p_{ij} V^\top e_j + "
                        r"\operatorname{Cov}_{j \sim p_i}(\mathrm{d}s_{ij}, v(x_j))"),
              "differentiate the softmax", "softmax-derivative")
    if isinstance(norm, Mixed21):
        proof.add(le(_MEAN, L_V * Described(r"\textstyle\sum_j p_{ij}\|e_j\|")), "triangle inequality")
        proof.add(le(_COV, rho * (alpha * Described(r"\|e_i\|") + 2 * beta * Described(r"\textstyle\sum_j p_{ij}\|e_j\|"))),
                  "covariance in mean absolute deviation; alpha bounds std of the query term, "
                  "|grad_y s . e_j| <= beta ||e_j||", "mean-abs-cov")
        proof.add(le(Described(r"\max_j \textstyle\sum_i p_{ij}"), K), "column sums", cap)
        statement = (L_V + 2 * rho * beta) * K + rho * alpha
        proof.add(le(Described(r"\textstyle\sum_i \|Df_i[E]\|"), statement * Described(r"\|E\|_{2,1}")),
                  "sum over i and exchange the sums")
    elif isinstance(norm, Mixed2Inf):
        proof.add(le(_MEAN, L_V * Described(r"\max_j \|e_j\|")), "Jensen", "jensen")
        proof.add(le(_COV, rho * (alpha + beta) * Described(r"\max_j \|e_j\|")),
                  "covariance bound and Minkowski", "cauchy-schwarz-cov")
        statement = L_V + rho * (alpha + beta)
        proof.add(le(Described(r"\max_i \|Df_i[E]\|"), statement * Described(r"\|E\|_{2,\infty}")),
                  "maximum over i: no sum over tokens appears")
    else:
        proof.add(le(_MEAN, L_V * _U), r"Jensen, with u_i = (sum_j p_ij ||e_j||^2)^(1/2)", "jensen")
        proof.add(le(_COV, rho * (alpha * Described(r"\|e_i\|") + beta * _U)),
                  "covariance bound, then Minkowski on the two parts of ds_ij", "cauchy-schwarz-cov")
        proof.add(le(Described(r"\textstyle\sum_i u_i^2"), K * Described(r"\|E\|_F^2")),
                  "exchange the sums; every column of P sums to at most kappa", cap)
        statement = L_V * sp.sqrt(K) + rho * (alpha + beta * sp.sqrt(K))
        proof.add(le(Described(r"\|Df[E]\|_F"), statement * Described(r"\|E\|_F")),
                  "Minkowski over i", "minkowski")
    proof.add(le(_LIP, statement), "mean value theorem on the convex domain", "mean-value")
    return Theorem(f"self-attention{tag}-{_suffix(norm)}",
                   "Self-attention" + (" (causal)" if causal else ""), statement, proof)


def cross_attention(norm: Norm, argument: str, n=S.n, m=S.m) -> Theorem:
    """Cross-attention: m queries Y attend to a context X of n tokens; Lipschitz in
    ``argument`` = ``"queries"``, ``"context"`` or ``"joint"``."""
    K = m / n * S.kappa(n, omega)  # column sums run over the m queries
    proof = Derivation(f"Cross-attention in the {argument}")
    proof.hypothesis("queries y_1..y_m in the query domain, context x_1..x_n in the key domain")
    proof.hypothesis("the kernel constants hold for queries in the query domain and keys in the key domain")
    query_part = rho * alpha
    if isinstance(norm, Mixed21):
        context_part = (L_V + 2 * rho * beta) * K
    elif isinstance(norm, Mixed2Inf):
        context_part = L_V + rho * beta
    else:
        context_part = (L_V + rho * beta) * sp.sqrt(K)
    if argument in ("queries", "joint"):
        proof.add(le(Described(r"\|D_Y f_i[E_Y]\|"), query_part * Described(r"\|e_i\|")),
                  "only the query-gradient covariance term survives", "cross-queries")
    if argument in ("context", "joint"):
        proof.add(le(Described(r"\max_j \textstyle\sum_{i=1}^{m} p_{ij}"), K),
                  "each weight is at most e^omega/(e^omega + n - 1); m queries per column", "weight-cap")
        proof.add(le(Described(r"\|D_X f[E_X]\|"), context_part * Described(r"\|E_X\|")),
                  "as for self-attention, without the query term", "softmax-derivative")
    if argument == "queries":
        statement = query_part
    elif argument == "context":
        statement = context_part
    elif isinstance(norm, Mixed21):
        statement = sp.Max(query_part, context_part)
        proof.add(le(_LIP, statement), "||(E_Y, E_X)||_{2,1} = ||E_Y||_{2,1} + ||E_X||_{2,1}")
    elif isinstance(norm, Mixed2Inf):
        statement = query_part + context_part
        proof.add(le(_LIP, statement), "triangle inequality")
    else:
        statement = sp.sqrt(query_part ** 2 + context_part ** 2)
        proof.add(le(_LIP, statement), "Cauchy-Schwarz on the two arguments")
    proof.add(le(_LIP, statement), "mean value theorem", "mean-value")
    return Theorem(f"cross-attention-{argument}-{_suffix(norm)}", f"Cross-attention in the {argument}",
                   statement, proof)


def multi_head(head: Theorem, norm: Norm, heads=S.H) -> Theorem:
    """H heads with the same per-head bound (maximum over heads), concatenated, then W_O."""
    W_O = S.MatrixNormSymbol("W_O")
    factor = heads if isinstance(norm, Mixed21) else sp.sqrt(heads)
    statement = W_O * factor * head.statement
    proof = Derivation(f"Multi-head {head.title.lower()}")
    proof.absorb(head.proof)
    proof.hypothesis("H heads; per-head constants are maxima over heads")
    proof.add(le(_LIP, statement), "per token, ||[u_1..u_H] W_O|| <= ||W_O|| (sum_h ||u_h||^2)^(1/2)"
              + (" <= ||W_O|| sum_h ||u_h||" if isinstance(norm, Mixed21) else ""), "multi-head")
    return Theorem(f"multi-head-{head.id}", f"Multi-head {head.title.lower()}", statement, proof)


def vector_infinity(inner: Theorem, d=S.d) -> Theorem:
    """From the (2,inf) bound to l_inf on vec(X): ``||E||_{2,inf} <= sqrt(d) ||vec E||_inf``."""
    statement = sp.sqrt(d) * inner.statement
    proof = Derivation(inner.proof.title + r" in l_inf on vec(X)")
    proof.absorb(inner.proof)
    proof.add(le(_LIP, statement), "||vec Y||_inf <= ||Y||_{2,inf} and ||X||_{2,inf} <= sqrt(d) ||vec X||_inf",
              "norm-equivalence")
    return Theorem(inner.id.replace("2inf", "inf"), inner.title, statement, proof)


def residual(inner: Theorem) -> Theorem:
    """``x + f(x)``: ``Lip <= 1 + Lip(f)`` in every norm."""
    statement = 1 + inner.statement
    proof = Derivation(f"Residual {inner.title.lower()}")
    proof.absorb(inner.proof)
    proof.add(le(Described(r"\operatorname{Lip}(\mathrm{id} + f)"), statement), "triangle inequality",
              "residual")
    return Theorem(f"residual-{inner.id}", f"Residual {inner.title.lower()}", statement, proof)


def _suffix(norm: Norm) -> str:
    return {"fro": "fro", "2,1": "21", "2,inf": "2inf", "inf": "2inf"}[norm.key]


_ = (Frobenius, VecInf)
