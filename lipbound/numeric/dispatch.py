"""A head's facts select its theorem, here and nowhere else.

:func:`head_facts` reads what matters about a concrete head -- its score, whether its score
has biases, whether ``W_Q = W_K``, its value convention, its mask -- and the argument the
constant is taken in.  :func:`head_variant` maps those facts to the one symbolic variant whose
theorem covers them, and :func:`derive_for` derives that theorem on a domain (cached).  A head
no theorem covers is refused with an :class:`~lipbound.errors.AssumptionError` that names the
facts; it is never bound by another variant's theorem.  :func:`check_covers` is the guard that
:func:`~lipbound.numeric.evaluate.evaluate_bound` applies to any bound and head it is given.
"""

from __future__ import annotations

import functools

from ..errors import AssumptionError
from ..symbolic.assumptions import Assumptions, Domain
from ..symbolic.bound import Bound
from ..symbolic.facts import ROLES, HeadFacts
from ..symbolic.scores import DotProduct, L2Distance, ScaledCosine
from ..symbolic.variants import CrossAttention, MeasureAttention, SelfAttention, Variant
from .model.components import Head

__all__ = ["head_facts", "head_variant", "derive_for", "check_covers", "ROLES"]


def head_facts(head: Head, role: str = "self") -> HeadFacts:
    """The facts of ``head`` when its constant is taken in ``role`` (see :data:`ROLES`)."""
    if not isinstance(head, Head):
        raise AssumptionError("head", "a lipbound.numeric.model.Head", type(head).__name__,
                              "pass one head of a layer (layer.heads[h])")
    if role not in ROLES:
        raise AssumptionError("role", f"one of {ROLES}", repr(role), "choose the argument of the constant")
    if head.causal and role != "self":
        raise AssumptionError("role", "'self' for a causal head (masks apply to self-attention)", repr(role),
                              "use `kind` causal for masked heads; cross-attention heads are not masked")
    return HeadFacts(score=head.score, biased=head.biased, tied=head.score == "l2" and head.tied,
                     values_through_A=head.kim_values, causal=head.causal, role=role)


def head_variant(facts: HeadFacts, measure: bool = False) -> Variant:
    """The variant whose theorem covers heads with these facts, or :class:`AssumptionError`.

    ``measure=True``: attention on uniform empirical measures (Wasserstein-1), self-attention only.
    """
    if facts.score == "dot":
        score = DotProduct(biases=facts.biased)
    elif facts.score == "l2":
        score = L2Distance(tied=facts.tied, kim_values=facts.values_through_A, biases=facts.biased)
    elif facts.score == "cosine":
        score = ScaledCosine(biases=facts.biased)
    else:
        raise _uncovered(facts, "user-defined scores are derived symbolically (lipbound derive custom); "
                                "a numeric head has a built-in score")
    if facts.values_through_A and facts.score != "l2":
        raise _uncovered(facts, "values through A belong to L2 attention")
    if measure:
        if facts.role != "self" or facts.causal or facts.score != "dot":
            raise _uncovered(facts, "the Wasserstein-1 theorem covers non-causal dot-product self-attention")
        return MeasureAttention(score, "uniform")
    if facts.role == "self":
        return SelfAttention(score, causal=facts.causal)
    return CrossAttention(score, facts.role.split("-", 1)[1])


def _uncovered(facts: HeadFacts, why: str) -> AssumptionError:
    return AssumptionError("head", "a head whose facts a lipbound theorem covers", facts.describe(),
                           f"no theorem applies ({why}); lipbound refuses rather than use another variant's bound")


@functools.lru_cache(maxsize=256)
def _derive(facts: HeadFacts, measure: bool, domain: Domain, norm: str) -> Bound:
    variant = head_variant(facts, measure)
    tied = True if facts.tied else None
    result = variant.derive(Assumptions(domain=domain, norm="w1" if measure else norm, tied=tied))
    if not result.lipschitz:  # a bounded domain always gives a bound; guard against misuse
        raise AssumptionError("domain", "a bounded domain", domain.key, "state a ball or a LayerNorm image")
    return result


def derive_for(head: Head, domain: Domain, norm: str = "fro", role: str = "self", measure: bool = False) -> Bound:
    """The bound of the theorem that covers ``head`` (in ``role``), derived on ``domain`` in ``norm``."""
    return _derive(head_facts(head, role), measure, domain, norm)


def check_covers(bound: Bound, head: Head, role: str = "self") -> None:
    """Refuse to evaluate ``bound`` on ``head`` unless the bound's theorem covers the head."""
    facts = getattr(bound, "facts", None)
    if facts is None:
        raise AssumptionError("bound", "a bound that states the heads its theorem covers (Bound.facts)",
                              "a bound without facts", "derive it with a variant (lipbound.symbolic.registry.variant)")
    head_kind = head_facts(head, facts.role if role == "self" and facts.role != "self" else role)
    if not facts.covers(head_kind):
        raise AssumptionError("head",
                              f"a head the theorem {bound.theorem or bound.variant} covers ({facts.describe()})",
                              f"{head.name or 'a head'}: {head_kind.describe()}",
                              "derive the bound of the head's own variant (lipbound.numeric.dispatch.derive_for)")
