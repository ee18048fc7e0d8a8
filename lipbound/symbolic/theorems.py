"""General theorems: how kernel constants compose into Lipschitz bounds.

Each theorem states a bound in the kernel constants ``L_V, rho, alpha, beta``,
the column-sum constant ``kappa`` (a function of n and omega) and sizes, with
the steps of its proof.  The composition rules are written once, here; score
functions only supply constants (:mod:`lipbound.symbolic.scores`) and variants
only choose a theorem (:mod:`lipbound.symbolic.variants`).

Notation: ``f_i(X) = sum_j p_ij v(x_j)``, ``E`` a tangent direction,
``Df_i[E] = sum_j p_ij V^T e_j + Cov_{j~p_i}(ds_ij, v(x_j))`` (docs/mathematics.md, section 2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import final

import sympy as sp

from . import symbols as S
from .assumptions import Frobenius, Mixed2Inf, Mixed21, Norm
from .masks import Mask
from .record import Derivation, Described, le

__all__ = ["Theorem", "self_attention", "cross_attention", "multi_head", "compose_heads", "compose_groups",
           "head_constants", "block_norms", "group_block_norms", "residual", "vector_infinity", "w1_uniform",
           "w1_mean_field", "w1_cross", "component", "compose", "tokenwise", "norm_residual", "scaled"]

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


@functools.cache  # theorems are pure: build each once
def self_attention(norm: Norm, causal: bool = False, n=S.n, window=None, bias: str = "none") -> Theorem:
    """Single-head self-attention on a convex domain, from the kernel constants.

    ``window`` (w) and ``bias`` (``"relative"``, ``"alibi"``) state a sliding window and additive position
    biases: they change the column sums of P and the most queries a column has
    (:meth:`lipbound.symbolic.masks.Mask.column_sums`), nothing else.
    """
    mask = Mask(causal, window, bias)
    plain = window is None and bias == "none"
    K, Q = (_column_sum(n, causal), n) if plain else (None, None)
    cap = ("causal-cap" if causal else "weight-cap") if plain else None  # a mask's caps were recorded above
    tag = mask.tag
    proof = Derivation("Self-attention" + (" with causal masking" if causal and plain else "")
                       + ("" if plain else f" ({mask.title()})"))
    proof.hypothesis("the kernel constants L_V, rho, alpha, beta, omega hold on the (convex) domain")
    for text in mask.hypotheses():
        proof.hypothesis(text)
    proof.add(Described(r"Df_i[E] = \textstyle\sum_j p_{ij} V^\top e_j + "
                        r"\operatorname{Cov}_{j \sim p_i}(\mathrm{d}s_{ij}, v(x_j))"),
              "differentiate the softmax", "softmax-derivative")
    if not plain and not isinstance(norm, Mixed2Inf):  # the (2,inf) bound reads no column sum
        K, Q = mask.column_sums(n, omega, proof)
    if isinstance(norm, Mixed21):
        if K is None:  # set above: the plain column sum, or the mask's column sums
            raise AssertionError("self_attention: no column-sum bound K in the (2,1) norm: a bug in lipbound")
        proof.add(le(_MEAN, L_V * Described(r"\textstyle\sum_j p_{ij}\|e_j\|")), "triangle inequality")
        proof.add(le(_COV, rho * (alpha * Described(r"\|e_i\|")
                                  + 2 * beta * Described(r"\textstyle\sum_j p_{ij}\|e_j\|"))),
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
        K_cov = sp.Min(K, sp.Rational(3, 4) * Q)
        proof.add(le(_MEAN, L_V * _U), r"Jensen, with u_i = (sum_j p_ij ||e_j||^2)^(1/2)", "jensen")
        proof.add(le(_COV, Described(r"\tau_i") * (alpha * Described(r"\|e_i\|") + beta * _U)),
                  "covariance bound with tau_i^2 = tr Cov_{p_i}(v), then Minkowski on the two parts of ds_ij",
                  "cauchy-schwarz-cov")
        proof.add(le(Described(r"\tau_i^2"), rho ** 2 * sp.Min(1, 4 * (1 - Described(r"p_{ij}")))),
                  "tr Cov <= E||v - c||^2 <= rho^2, and tr Cov <= E||v - v(x_j)||^2 <= 4 rho^2 (1 - p_ij)",
                  "covariance-cap")
        proof.add(le(Described(r"\textstyle\sum_i u_i^2"), K * Described(r"\|E\|_F^2")),
                  "exchange the sums; every column of P sums to at most " + ("kappa" if plain else "the bound above"),
                  cap)
        proof.add(le(Described(r"\textstyle\sum_i \tau_i^2 u_i^2"), rho ** 2 * K_cov * Described(r"\|E\|_F^2")),
                  "p min(1, 4(1 - p)) <= min(p, 3/4) for every weight p_ij", "covariance-cap")
        statement = L_V * sp.sqrt(K) + rho * (alpha + beta * sp.sqrt(K_cov))
        proof.add(le(Described(r"\|Df[E]\|_F"), statement * Described(r"\|E\|_F")),
                  "Minkowski over i", "minkowski")
    proof.add(le(_LIP, statement), "mean value theorem on the convex domain", "mean-value")
    return Theorem(f"self-attention{tag}-{_suffix(norm)}",
                   "Self-attention" + (" (causal)" if causal and plain else "")
                   + ("" if plain else f" ({mask.title()})"),
                   statement, proof)


@functools.cache  # theorems are pure: build each once
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


def multi_head(head: Theorem, norm: Norm, heads=S.H, grouped: bool = False) -> Theorem:
    """H heads with the same per-head bound (maximum over heads), concatenated, then W_O.

    ``grouped``: grouped-query attention, the H query heads in G groups sharing ``W_K^g``, ``W_V^g``.  The
    per-head bound holds for each head whatever it shares, and the layer has H output blocks, so the
    statement keeps ``sqrt(H)``: sharing values does not make it ``sqrt(G)`` (lemma ``grouped-heads``).
    """
    W_O = S.MatrixNormSymbol("W_O")
    factor = heads if isinstance(norm, Mixed21) else sp.sqrt(heads)
    statement = W_O * factor * head.statement
    proof = Derivation(("Grouped-query " if grouped else "Multi-head ") + head.title.lower())
    proof.absorb(head.proof)
    proof.hypothesis("H heads; per-head constants are maxima over heads")
    if grouped:
        proof.hypothesis("grouped-query attention: the H query heads fall into G key/value groups; the heads of group "
                         "g share W_K^g, W_V^g (and b_K^g, b_V^g), so head h has "
                         "A_h = W_Q^h W_K^{g(h)T} / sqrt(d_k) and "
                         "values W_V^{g(h)}; the constants are maxima over the heads and the groups")
        proof.add(Described(r"F(X) = \textstyle\sum_{h=1}^{H} f^h(X) W_O^h,\ "
                            r"f^h \text{ reading } W_K^{g(h)}, W_V^{g(h)}"),
                  "each query head has its own output block W_O^h; the heads of a group read the same keys and "
                  "values, each with its own attention weights", "grouped-heads")
    proof.add(le(_LIP, statement), "per token, ||[u_1..u_H] W_O|| <= ||W_O|| (sum_h ||u_h||^2)^(1/2)"
              + (" <= ||W_O|| sum_h ||u_h||" if isinstance(norm, Mixed21) else "")
              + ("; H blocks, not G: with the heads of one group alike F = f (sum_h W_O^h), and "
                 "||sum_h W_O^h|| reaches sqrt(H) ||W_O||" if grouped else ""),
              "grouped-heads" if grouped else "multi-head")
    prefix = "grouped-" if grouped else ""
    title = ("Grouped-query " if grouped else "Multi-head ") + head.title.lower()
    return Theorem(f"{prefix}multi-head-{head.id}", title, statement, proof)


def head_constants(heads: int) -> list[sp.Symbol]:
    """``L_1, ..., L_H``: the constants of the heads of a layer."""
    return [S.KernelConstant(f"L_{h}") for h in range(1, heads + 1)]


def block_norms(heads: int) -> list[S.MatrixNormSymbol]:
    """``||W_O^1||, ..., ||W_O^H||``: the norms of the rows of ``W_O`` that read each head."""
    return [S.MatrixNormSymbol(f"W_O^{h}") for h in range(1, heads + 1)]


@functools.cache
def compose_heads(heads: int, norm_key: str) -> Theorem:
    """A layer ``F = sum_h f^h W_O^h`` of H heads with constants ``L_h`` (the composition rule).

    Per token ``||sum_h u_h W_O^h|| <= sum_h ||W_O^h|| ||u_h||``, summed or maximised over tokens:
    ``Lip(F) <= sum_h ||W_O^h|| L_h`` in every norm.  Concatenation gives
    ``||[u_1..u_H] W_O|| <= ||W_O|| (sum_h ||u_h||^2)^(1/2)``: ``||W_O|| (sum_h L_h^2)^(1/2)`` in the
    Frobenius and (2,inf) norms, ``||W_O|| sum_h L_h`` in the (2,1) norm and W1.  The smaller holds.
    """
    L, B = head_constants(heads), block_norms(heads)
    W_O = S.MatrixNormSymbol("W_O")
    split = sp.Add(*[b * l for b, l in zip(B, L)])
    if norm_key in ("fro", "2,inf"):
        concatenated = W_O * sp.sqrt(sp.Add(*[l ** 2 for l in L]))
    elif norm_key in ("2,1", "w1"):
        concatenated = W_O * sp.Add(*L)
    else:
        raise ValueError(f"no composition rule for the norm {norm_key!r}")
    statement = sp.Min(split, concatenated)
    proof = Derivation(f"A layer of {heads} heads")
    proof.hypothesis("head h is L_h-Lipschitz; W_O^h are the rows of W_O that read head h")
    proof.add(le(_LIP, split), "per token, ||sum_h u_h W_O^h|| <= sum_h ||W_O^h|| ||u_h||", "multi-head")
    proof.add(le(_LIP, concatenated), "per token, ||[u_1..u_H] W_O|| <= ||W_O|| (sum_h ||u_h||^2)^(1/2)", "multi-head")
    return Theorem(f"multi-head-composition-{_suffix(Mixed21() if norm_key == 'w1' else _NORM_OF[norm_key])}",
                   "Multi-head composition", statement, proof)


def group_block_norms(groups: int) -> list[S.MatrixNormSymbol]:
    """``||W_O^(1)||, ..., ||W_O^(G)||``: the norms of the rows of ``W_O`` that read each key/value group's heads."""
    return [S.MatrixNormSymbol(f"W_O^g{g}") for g in range(1, groups + 1)]


@functools.cache
def compose_groups(group_sizes: tuple[int, ...], norm_key: str) -> Theorem:
    """A layer ``F = sum_h f^h W_O^h`` whose heads come in key/value groups (sizes ``group_sizes``, the heads
    numbered group by group), with head constants ``L_h`` (the composition rule of grouped-query attention).

    Besides the two rules of :func:`compose_heads`, concatenate within a group and add the groups:
    per token ``||sum_g [u_h]_{h in g} W_O^g|| <= sum_g ||W_O^g|| (sum_{h in g} ||u_h||^2)^(1/2)``, so
    ``Lip(F) <= sum_g ||W_O^g|| (sum_{h in g} L_h^2)^(1/2)`` (Frobenius, (2,inf); ``sum_{h in g} L_h`` in (2,1)).
    Sound whatever the groups share; the smallest of the three holds.
    """
    heads = sum(group_sizes)
    L, C = head_constants(heads), group_block_norms(len(group_sizes))
    base = compose_heads(heads, norm_key)
    starts = [sum(group_sizes[:g]) for g in range(len(group_sizes))]
    members = [L[start:start + size] for start, size in zip(starts, group_sizes)]
    if norm_key in ("fro", "2,inf"):
        grouped = sp.Add(*[c * sp.sqrt(sp.Add(*[head ** 2 for head in group])) for c, group in zip(C, members)])
    else:
        grouped = sp.Add(*[c * sp.Add(*group) for c, group in zip(C, members)])
    proof = Derivation(f"A layer of {heads} heads in {len(group_sizes)} key/value groups")
    proof.absorb(base.proof)
    proof.hypothesis("W_O^g are the rows of W_O that read the heads of group g")
    proof.add(le(_LIP, grouped), "per token, concatenate within each group and add the groups (triangle inequality), "
              "then Minkowski over the tokens", "grouped-heads")
    return Theorem(f"grouped-composition-{_suffix(Mixed21() if norm_key == 'w1' else _NORM_OF[norm_key])}",
                   "Grouped-query composition", sp.Min(*base.statement.args, grouped), proof)


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


def component(name: str, what: str) -> Theorem:
    """A map known only by its constant: ``what`` is ``name``-Lipschitz (``L_F``, ``L_N``), the
    placeholder through which the numeric layer composes certified constants."""
    constant = S.KernelConstant(name)
    proof = Derivation(what)
    proof.hypothesis(f"{what} is {name}-Lipschitz on its domain")
    return Theorem(f"component-{name}", what, constant, proof)


def compose(outer: Theorem, inner: Theorem, id: str = "", title: str = "", why: str = "") -> Theorem:
    """``g o f``: ``Lip <= Lip(g) Lip(f)``, g's constant holding on the image of f (``why`` says why)."""
    statement = outer.statement * inner.statement
    proof = Derivation(title or f"{outer.title} after {inner.title.lower()}")
    proof.absorb(inner.proof)
    proof.absorb(outer.proof)
    proof.add(le(Described(r"\operatorname{Lip}(g \circ f)"), statement),
              "the constants of a composition multiply" + (f"; {why}" if why else ""), "composition")
    return Theorem(id or f"{outer.id}-after-{inner.id}", proof.title, statement, proof)


def tokenwise(per_token: Theorem, norm: Norm, d=S.d) -> Theorem:
    """A map applied to each token with constant L: ``L`` in the Frobenius, (2,1) and (2,inf)
    norms on X, ``sqrt(d) L`` in l_inf on vec(X) (through (2,inf))."""
    proof = Derivation(per_token.proof.title)
    proof.absorb(per_token.proof)
    proof.add(le(Described(r"\|F(X) - F(Y)\|_{2,p}"), per_token.statement * Described(r"\|X - Y\|_{2,p}")),
              "F acts token by token; p = 2 (Frobenius), 1 or infinity", "tokenwise")
    theorem = Theorem(per_token.id, per_token.title, per_token.statement, proof)
    return vector_infinity(Theorem(f"{per_token.id}-2inf", per_token.title, per_token.statement, proof), d) \
        if norm.key == "inf" else theorem


def scaled(inner: Theorem, gain: sp.Expr, what: str = "LayerScale") -> Theorem:
    """``diag(lambda) g``: ``Lip <= lambda_max Lip(g)`` (``gain`` bounds ``|lambda_k|``), in every norm on X."""
    statement = gain * inner.statement
    proof = Derivation(f"{what} after {inner.title.lower()}")
    proof.absorb(inner.proof)
    proof.add(le(Described(r"\operatorname{Lip}(\operatorname{diag}(\lambda)\, g)"), statement),
              "||diag(lambda) u|| <= max_k |lambda_k| ||u|| token by token", "layerscale")
    return Theorem(f"scaled-{inner.id}", proof.title, statement, proof)


def norm_residual(placement: str, inner: Theorem, norm: Theorem, image: str = "", after: Theorem | None = None,
                  scale: sp.Expr | None = None) -> Theorem:
    """A residual block with a normalisation N around an inner map F, written with the rules above.

    ``"pre"``: ``x + F(N(x))``, ``Lip <= 1 + Lip(F) Lip(N)``, F taken on the image of N (``image``
    describes it; bounded for a LayerNorm, so every block after a norm has a bounded domain).
    ``after`` (sandwich norms, ``x + N'(F(N(x)))``): ``Lip(N')`` multiplies, N' taken on all of ``R^d``
    (F's output has no variance floor).  ``scale`` (LayerScale, ``x + diag(lambda) F(N(x))``): ``lambda_max``
    multiplies.
    ``"post"``: ``N(x + F(x))``, ``Lip <= Lip(N) (1 + Lip(F))``, N taken on all of R^d (its input
    has no known variance floor); the output lies in the image of N whatever came in.
    """
    if placement == "pre":
        inside = compose(inner, norm, why=f"F reads the outputs of N{f' ({image})' if image else ''}")
        if after is not None:
            inside = compose(after, inside, why="N' is taken on all of R^d: F's output has no variance floor")
        if scale is not None:
            inside = scaled(inside, scale)
        return residual(inside)
    if after is not None or scale is not None:
        raise ValueError("sandwich norms and LayerScale belong to pre-norm blocks")
    if placement == "post":
        theorem = compose(norm, residual(inner), why="N is taken on all of R^d")
        theorem.proof.add(Described(r"N(x + F(x)) \in N(\mathbb{R}^d)"),
                          "the output is in the image of N whatever came in (the next block's domain)",
                          "layernorm-ball")
        return theorem
    raise ValueError(f"no residual placement {placement!r}: 'pre' or 'post'")


@functools.cache  # theorems are pure: build each once
def w1_uniform(n=S.n) -> Theorem:
    """Self-attention on uniform empirical measures of n atoms, in Wasserstein-1.

    ``W_1(mu, nu) = min_sigma ||X - P_sigma Y||_{2,1} / n`` and attention is permutation
    equivariant, so the (2,1) constant is a W1 constant.
    """
    inner = self_attention(Mixed21(), n=n)
    proof = Derivation("Self-attention on uniform measures in Wasserstein-1")
    proof.hypothesis("mu, nu uniform empirical measures of n atoms each, all atoms in the (convex) domain")
    proof.absorb(inner.proof)
    proof.add(le(Described(r"W_1(f_\# \mu, f_\# \nu)"),
                 Described(r"\tfrac1n \|f(X) - f(P_\sigma Y)\|_{2,1}")),
              "couple the outputs by the optimal permutation of the inputs", "permutation-coupling")
    proof.add(le(Described(r"\operatorname{Lip}_{W_1}(f)"), inner.statement),
              "the (2,1) bound applied to X and P_sigma Y", "permutation-coupling")
    return Theorem("measure-w1-uniform", "Self-attention on uniform measures (W1)", inner.statement, proof)


@functools.cache  # theorems are pure: build each once
def w1_mean_field() -> Theorem:
    """Self-attention on probability measures of any size and weights (mean-field), in W1.

    ``F(mu) = (Gamma_mu)_# mu``; ``Lip(Gamma_mu) <= rho alpha`` and
    ``sup_x ||Gamma_mu(x) - Gamma_nu(x)|| <= e^omega (L_V + 2 rho beta) W_1(mu, nu)``.
    No size appears: the constant holds uniformly in n (the mean-field regime).
    """
    statement = rho * alpha + sp.exp(omega) * (L_V + 2 * rho * beta)
    proof = Derivation("Self-attention on measures in Wasserstein-1 (mean-field)")
    proof.hypothesis("mu, nu probability measures supported in the (convex) domain")
    proof.add(le(Described(r"W_1(F(\mu), F(\nu))"),
                 Described(r"W_1((\Gamma_\mu)_\# \mu, (\Gamma_\mu)_\# \nu) + "
                           r"\sup_x \|\Gamma_\mu(x) - \Gamma_\nu(x)\|")),
              "triangle inequality; couple the push-forwards of nu by Gamma_mu and by Gamma_nu through nu")
    proof.add(le(Described(r"\|D\Gamma_\mu(x)\|"), rho * alpha),
              "D Gamma_mu(x)[e] = Cov_{y ~ K_mu(x, .)}(grad_x s(x, y) . e, v(y))", "cauchy-schwarz-cov")
    proof.add(le(Described(r"\tfrac{e^{s(x, y)}}{\int e^{s(x, z)} \, d\mu_t(z)}"), sp.exp(omega)),
              "the score spread is at most omega on the domain", "weight-cap")
    proof.add(le(Described(r"\|\Gamma_\mu(x) - \Gamma_\nu(x)\|"),
                 sp.exp(omega) * (L_V + 2 * rho * beta) * Described(r"W_1(\mu, \nu)")),
              "differentiate along mu_t = (1 - t) mu + t nu; the integrand (v(y) - Gamma(x)) e^{s(x,y)} / Z_t "
              "is Lipschitz in y with constant e^omega (L_V + 2 rho beta)", "kantorovich")
    proof.add(le(Described(r"\operatorname{Lip}_{W_1}(F)"), statement), "add the two parts", "kantorovich")
    return Theorem("measure-w1-mean-field", "Self-attention on measures, mean-field (W1)", statement, proof)


@functools.cache  # theorems are pure: build each once
def w1_cross(argument: str) -> Theorem:
    """Cross-attention ``(Gamma_mu)_# nu`` in W1: in the queries nu, in the context mu, or jointly."""
    query_part = rho * alpha
    context_part = sp.exp(omega) * (L_V + 2 * rho * beta)
    statement = {"queries": query_part, "context": context_part, "joint": query_part + context_part}[argument]
    proof = Derivation(f"Cross-attention on measures in the {argument} (W1)")
    proof.hypothesis("query measure and context measure supported in their (convex) domains")
    if argument in ("queries", "joint"):
        proof.add(le(Described(r"W_1((\Gamma_\mu)_\# \nu, (\Gamma_\mu)_\# \nu')"),
                     query_part * Described(r"W_1(\nu, \nu')")), "Gamma_mu is rho alpha-Lipschitz", "kantorovich")
    if argument in ("context", "joint"):
        proof.add(le(Described(r"W_1((\Gamma_\mu)_\# \nu, (\Gamma_{\mu'})_\# \nu)"),
                     context_part * Described(r"W_1(\mu, \mu')")),
                  "sup_x ||Gamma_mu(x) - Gamma_mu'(x)|| as in the mean-field theorem", "kantorovich")
    proof.add(le(Described(r"\operatorname{Lip}_{W_1}"), statement), "triangle inequality")
    return Theorem(f"measure-w1-cross-{argument}", f"Cross-attention on measures in the {argument} (W1)",
                   statement, proof)


_NORM_OF = {"fro": Frobenius(), "2,1": Mixed21(), "2,inf": Mixed2Inf()}


def _suffix(norm: Norm) -> str:
    return {"fro": "fro", "2,1": "21", "2,inf": "2inf", "inf": "2inf"}[norm.key]

