"""Attention variants: which theorem applies, and the derivation written once.

A variant declares its structure (self- or cross-attention, heads, residual,
causal mask) and its score; :meth:`Variant.derive` is the single composition
rule: kernel constants of the score, a general theorem of
:mod:`lipbound.symbolic.theorems`, substitution, and the joined record.
"""

from __future__ import annotations

from typing import final

from ..errors import AssumptionError
from . import theorems as T
from .assumptions import Assumptions, Mixed2Inf, VecInf
from .bound import Bound, Result
from .facts import HeadFacts
from .record import Derivation, Described, le
from .scores import Score
from .unbounded import derive_unbounded

__all__ = ["Variant", "SelfAttention", "CrossAttention", "MultiHead", "Residual", "MeasureAttention",
           "per_token_norm", "to_vec_inf"]


class Variant:
    """An attention map whose Lipschitz constant lipbound derives.  Abstract."""

    title: str = ""

    @property
    def score(self) -> Score:
        raise NotImplementedError

    @property
    def head_facts(self) -> HeadFacts:
        """The facts of the heads this variant's theorem covers (see :meth:`HeadFacts.covers`)."""
        raise NotImplementedError

    #: The structure around the head, outermost first: ``"residual"``, ``"multi-head"``.
    wrappers: tuple[str, ...] = ()
    #: One attention head (what :class:`MultiHead` takes).
    single_head: bool = False

    def _facts(self, causal: bool = False, role: str = "self") -> HeadFacts:
        score = self.score
        return HeadFacts(score.kind, score.biased, score.tied, score.values_through_A, causal, role,
                         rotary=score.rotary, qk_norm=score.qk_norm, softcap=score.softcap)

    def _measure_valued(self) -> bool:
        return _is_measure(self)

    @property
    def norms(self) -> tuple[str, ...]:
        """The norms its theorems are stated in (keys of :data:`~lipbound.symbolic.assumptions.NORMS`)."""
        return ("w1",) if self._measure_valued() else ("fro", "2,1", "2,inf", "inf")

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        raise NotImplementedError

    def kernel_constants(self, assumptions: Assumptions):
        """The constants the theorem is stated in, derived for this variant's score (the softmax
        kernel constants unless the variant's weights need others)."""
        return self.score.kernel_constants(assumptions)

    def derive(self, assumptions: Assumptions, key: str = "") -> Result:
        """Derive ``Lip(self)`` under ``assumptions`` (a :class:`Bound` or a
        :class:`~lipbound.symbolic.bound.NotLipschitz`)."""
        if not isinstance(assumptions, Assumptions):
            raise AssumptionError("assumptions", "an Assumptions object", type(assumptions).__name__,
                                  "build one with lipbound.Assumptions(domain=..., norm=...)")
        key = key or self.title
        if not assumptions.domain.bounded:
            if self._measure_valued():
                raise AssumptionError("domain", "a bounded domain (lipbound derives W1 constants on balls and "
                                      "LayerNorm images only)", "Unbounded",
                                      "state Ball(radius=R) or LayerNormImage(); lipbound claims nothing here")
            return derive_unbounded(self, assumptions, key)
        if assumptions.norm.key not in self.norms:
            if self._measure_valued():
                raise AssumptionError("norm", "'w1' (measure variants are Lipschitz in Wasserstein-1)",
                                      repr(assumptions.norm.key), "state Assumptions(norm='w1')")
            raise AssumptionError("norm", "a norm on X (fro, 2,1, 2,inf, inf) for a token-level variant",
                                  repr(assumptions.norm.key),
                                  "use a measure variant (measure-w1, ...) for Wasserstein-1")
        constants = self.kernel_constants(assumptions)
        theorem = self.theorem(assumptions)
        expr = theorem.statement.xreplace(constants.as_substitution())
        record = Derivation(f"{self.title}: {assumptions.norm.title}, {assumptions.domain.key} domain")
        record.absorb(constants.record)
        record.absorb(theorem.proof)
        record.add(le(Described(r"\operatorname{Lip}(f)"), expr),
                   "substitute the kernel constants into the theorem")
        return Bound(variant=key, norm=assumptions.norm.key, domain=assumptions.domain.key, expr=expr,
                     generic=theorem.statement, constants=constants.as_substitution(),
                     assumptions=tuple(assumptions.describe() + record.hypotheses), record=record,
                     theorem=theorem.id, facts=self.head_facts, stated=assumptions)


def _is_measure(variant) -> bool:
    inner = getattr(variant, "inner", None)
    return isinstance(variant, MeasureAttention) or (inner is not None and _is_measure(inner))


def per_token_norm(assumptions: Assumptions):
    """l_inf on vec(X) is handled through the (2, inf) norm and norm equivalence."""
    return Mixed2Inf() if isinstance(assumptions.norm, VecInf) else assumptions.norm


def to_vec_inf(theorem: T.Theorem, assumptions: Assumptions) -> T.Theorem:
    return T.vector_infinity(theorem, assumptions.d) if isinstance(assumptions.norm, VecInf) else theorem


@final
class SelfAttention(Variant):
    """Single-head self-attention ``f_i(X) = sum_j softmax_j s(x_i, x_j) v(x_j)``.

    Parameters
    ----------
    score : Score
    causal : bool
        Token i attends only to tokens 1..i.
    """

    single_head = True

    def __init__(self, score: Score, causal: bool = False):
        self._score = score
        self.causal = causal
        self.title = ("causal " if causal else "") + f"self-attention ({score.name})"

    @property
    def score(self) -> Score:
        return self._score

    @property
    def head_facts(self) -> HeadFacts:
        return self._facts(self.causal)

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        inner = T.self_attention(per_token_norm(assumptions), self.causal, assumptions.n)
        return to_vec_inf(inner, assumptions)


@final
class CrossAttention(Variant):
    """Cross-attention: m queries Y attend to a context X of n tokens.

    Parameters
    ----------
    score : Score
    argument : {"queries", "context", "joint"}
        Lipschitz in the queries (context fixed), in the context, or in both.
    """

    ARGUMENTS = ("queries", "context", "joint")
    single_head = True

    def __init__(self, score: Score, argument: str = "joint"):
        if argument not in self.ARGUMENTS:
            raise AssumptionError("argument", f"one of {self.ARGUMENTS}", repr(argument),
                                  "choose the input the constant is taken in")
        self._score = score
        self.argument = argument
        self.title = f"cross-attention in the {argument} ({score.name})"

    @property
    def score(self) -> Score:
        return self._score

    @property
    def head_facts(self) -> HeadFacts:
        return self._facts(role=f"cross-{self.argument}")

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        inner = T.cross_attention(per_token_norm(assumptions), self.argument, assumptions.n, assumptions.m)
        return to_vec_inf(inner, assumptions)


@final
class MeasureAttention(Variant):
    """Attention acting on probability measures (Vuckovic, Baratin, Tachet des Combes 2020),
    Lipschitz in Wasserstein-1.

    Parameters
    ----------
    score : Score
    regime : {"uniform", "mean-field"}
        ``"uniform"``: self-attention on uniform empirical measures of n atoms (the
        (2,1) route); ``"mean-field"``: any measures, a constant independent of n.
    argument : {"self", "queries", "context", "joint"}
        Self-attention, or cross-attention ``(Gamma_mu)_# nu`` in one or both measures.
    """

    REGIMES = ("uniform", "mean-field")
    ARGUMENTS = ("self", "queries", "context", "joint")

    def __init__(self, score: Score, regime: str = "uniform", argument: str = "self"):
        if regime not in self.REGIMES:
            raise AssumptionError("regime", f"one of {self.REGIMES}", repr(regime), "pick a regime")
        if argument not in self.ARGUMENTS:
            raise AssumptionError("argument", f"one of {self.ARGUMENTS}", repr(argument), "pick an argument")
        if argument != "self" and regime == "uniform":
            raise AssumptionError("regime", "'mean-field' for cross-attention on measures", repr(regime),
                                  "use regime='mean-field' (measures of any size)")
        self._score = score
        self.regime = regime
        self.argument = argument
        what = "self-attention" if argument == "self" else f"cross-attention in the {argument}"
        self.title = f"{what} on measures, {regime} W1 ({score.name})"

    @property
    def score(self) -> Score:
        return self._score

    @property
    def head_facts(self) -> HeadFacts:
        return self._facts(role="self" if self.argument == "self" else f"cross-{self.argument}")

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        if self.argument != "self":
            return T.w1_cross(self.argument)
        return T.w1_uniform(assumptions.n) if self.regime == "uniform" else T.w1_mean_field()


@final
class MultiHead(Variant):
    """H heads of the same kind (per-head constants are maxima over heads), then ``W_O``.

    ``grouped``: grouped-query attention, the H query heads in G key/value groups sharing ``W_K``, ``W_V``
    (G = 1: multi-query attention); :func:`lipbound.symbolic.theorems.multi_head` states what sharing
    changes.
    """

    def __init__(self, head: Variant, grouped: bool = False):
        if not getattr(head, "single_head", False):
            raise AssumptionError("head", "a single-head attention variant (SelfAttention, CrossAttention, ...)",
                                  type(head).__name__, "wrap a single-head variant")
        self.head = head
        self.grouped = grouped
        self.title = ("grouped-query " if grouped else "") + f"multi-head {head.title}"
        self.wrappers = ("multi-head",) + head.wrappers

    @property
    def score(self) -> Score:
        return self.head.score

    @property
    def head_facts(self) -> HeadFacts:
        return self.head.head_facts

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        per_token = per_token_norm(assumptions)
        inner = self.head.theorem(assumptions.with_(norm=per_token))
        return to_vec_inf(T.multi_head(inner, per_token, assumptions.H, self.grouped), assumptions)


@final
class Residual(Variant):
    """The residual map ``X -> X + f(X)``."""

    def __init__(self, inner: Variant):
        if isinstance(inner, Residual):
            raise AssumptionError("inner", "a non-residual variant", "Residual",
                                  "wrap the attention map once")
        self.inner = inner
        self.title = f"residual {inner.title}"
        self.wrappers = ("residual",) + inner.wrappers

    @property
    def score(self) -> Score:
        return self.inner.score

    @property
    def head_facts(self) -> HeadFacts:
        return self.inner.head_facts

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        return T.residual(self.inner.theorem(assumptions))

