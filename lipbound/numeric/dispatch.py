"""A head's facts select its theorem, here and nowhere else.

:func:`head_facts` reads what matters about a concrete head -- the facts its attention kernel
reports (:meth:`lipbound.numeric.kernels.AttentionKernel.facts`: the score, how scores become
weights, the scale), whether its score has biases, whether ``W_Q = W_K``, its value convention,
its mask (causal, sliding window, position bias, soft-cap) -- and the argument the constant is
taken in.  :func:`head_variant` maps those facts to the one symbolic variant whose theorem covers
them, and :func:`derive_for` derives that theorem on a domain (cached).  A head no theorem covers is
refused with an :class:`~lipbound.errors.AssumptionError` that names the facts; it is never bound by
another variant's theorem.  The theorems cover, under a softmax with the standard scale
``1/sqrt(d_k)``: dot-product, L2-distance and scaled-cosine scores; rotary positions (RoPE) and
QK-norm (with or without rotary positions after the norm); causal masks, sliding windows, ALiBi and
relative (T5) position biases, soft-capped logits (not with a position bias).  Sigmoid and linear
attention and user-defined numeric scores are refused.

:func:`check_covers` is the guard that :func:`~lipbound.numeric.evaluate.evaluate_bound` applies to
any bound and head it is given; :func:`check_layer` refuses layers no composition covers;
:func:`dot_product_scope` says whether a head or layer lies in the scope of the constructions
written for softmax dot-product attention without positions (the joint constants of
:mod:`lipbound.numeric.sdp.head`, the SDP relaxations, the local theorems, the published claims);
:func:`positional_scope` the scope of :mod:`lipbound.numeric.sdp.rotary` (rotary heads and
dot-product heads with any mask).
"""

from __future__ import annotations

import functools

from ..errors import AssumptionError
from ..symbolic import symbols as S
from ..symbolic.assumptions import Assumptions, Domain
from ..symbolic.bound import Bound
from ..symbolic.facts import ROLES, HeadFacts
from ..symbolic.masks import Mask
from ..symbolic.positional import PositionalAttention, SoftCapped
from ..symbolic.qknorm import QKNormScore
from ..symbolic.rotary import RotaryScore
from ..symbolic.scores import DotProduct, L2Distance, ScaledCosine
from ..symbolic.variants import CrossAttention, MeasureAttention, SelfAttention, Variant
from .kernels import ALiBi
from .model.components import Head, Layer

__all__ = ["head_facts", "head_variant", "derive_for", "check_covers", "check_layer", "dot_product_scope",
           "positional_scope", "ROLES"]

#: HeadFacts score key -> the symbolic score of its theorem (biases, ties, values, positions from the facts)
_SCORES = {
    "dot": lambda facts: (QKNormScore(rotary=facts.rotary) if facts.qk_norm else
                          RotaryScore(biases=facts.biased) if facts.rotary else DotProduct(biases=facts.biased)),
    "l2": lambda facts: L2Distance(tied=facts.tied, kim_values=facts.values_through_A, biases=facts.biased),
    "cosine": lambda facts: ScaledCosine(biases=facts.biased),
}
#: KernelFacts score key -> (HeadFacts score key, rotary, QK-norm); the kernel says whether QK-norm rotates
_KERNEL_SCORES = {"dot": ("dot", False, False), "l2": ("l2", False, False), "cosine": ("cosine", False, False),
                  "rope": ("dot", True, False), "qk-norm": ("dot", None, True)}


def _refuse(head: Head, what: str, why: str) -> AssumptionError:
    return AssumptionError("head", "a head whose facts a lipbound theorem covers", f"{head.name or 'a head'}: {what}",
                           f"no theorem applies ({why}); lipbound refuses rather than use another variant's bound")


def head_facts(head: Head, role: str = "self") -> HeadFacts:
    """The facts of ``head`` when its constant is taken in ``role`` (see :data:`ROLES`); refused
    (AssumptionError) when no theorem of lipbound covers the head's kernel or mask."""
    if not isinstance(head, Head):
        raise AssumptionError("head", "a lipbound.numeric.model.Head", type(head).__name__,
                              "pass one head of a layer (layer.heads[h])")
    if role not in ROLES:
        raise AssumptionError("role", f"one of {ROLES}", repr(role), "choose the argument of the constant")
    if head.causal and role != "self":
        raise AssumptionError("role", "'self' for a causal head (masks apply to self-attention)", repr(role),
                              "use `kind` causal for masked heads; cross-attention heads are not masked")
    kernel = head.kernel.facts(head.d_k)
    if kernel.score not in _KERNEL_SCORES:
        raise _refuse(head, kernel.describe, f"the kernel '{head.kernel.name}' has no dispatched theorem yet")
    if kernel.weights != "softmax":
        raise _refuse(head, kernel.describe, f"{kernel.weights} weights have no dispatched theorem yet")
    if not kernel.standard_scale:
        raise _refuse(head, kernel.describe, "the theorems state the score scale 1/sqrt(d_k)")
    score, rotary, qk_norm = _KERNEL_SCORES[kernel.score]
    if rotary is None:
        rotary = head.kernel.positional
    mask = head.mask
    if (mask.window is not None or mask.bias is not None or mask.softcap is not None) and score != "dot":
        raise _refuse(head, f"{kernel.describe}; {mask.describe()}",
                      "windows, position biases and soft-caps are derived for dot-product-type scores")
    if mask.softcap is not None and mask.bias is not None:
        raise _refuse(head, mask.describe(), "no theorem combines soft-capped logits with position biases")
    bias = "none" if mask.bias is None else "alibi" if isinstance(mask.bias, ALiBi) else "relative"
    return HeadFacts(score=score, biased=head.biased, tied=score == "l2" and head.tied,
                     values_through_A=head.kim_values, causal=head.causal, role=role, rotary=rotary, qk_norm=qk_norm,
                     window=mask.window is not None, position_bias=bias, softcap=mask.softcap is not None)


def check_layer(layer) -> None:
    """Refuse a layer (a Layer or a TransformerLayer; None passes) no composition theorem covers.
    Grouped-query layers are covered: each query head is a map of the tokens whatever it shares, and
    the layer has one block of ``W_O`` per query head (lemma ``grouped-heads``)."""
    layer = getattr(layer, "attention", layer)
    if isinstance(layer, Layer):
        for head in layer.heads:
            head_facts(head)


def dot_product_scope(target) -> bool:
    """Every head of ``target`` (a Head or a Layer) is a softmax dot-product head without positions that a
    theorem covers (a causal mask at most, no GQA): the scope of the constructions written for dot-product
    attention."""
    heads = (target,) if isinstance(target, Head) else tuple(target.heads)
    if isinstance(target, Layer) and target.groups is not None:
        return False
    for head in heads:
        try:
            facts = head_facts(head)
        except AssumptionError:
            return False
        if facts.score != "dot" or facts.rotary or facts.qk_norm or not head.mask.plain:
            return False
    return True


def positional_scope(target) -> bool:
    """Every head of ``target`` is a softmax head with a rotary or dot-product score (standard scale, no QK-norm)
    that a theorem covers, under any mask: the scope of :mod:`lipbound.numeric.sdp.rotary`."""
    heads = (target,) if isinstance(target, Head) else tuple(target.heads)
    for head in heads:
        try:
            facts = head_facts(head)
        except AssumptionError:
            return False
        if facts.score != "dot" or facts.qk_norm or head.kim_values:
            return False
    return True


def head_variant(facts: HeadFacts, measure: bool = False) -> Variant:
    """The variant whose theorem covers heads with these facts, or :class:`AssumptionError`.

    ``measure=True``: attention on uniform empirical measures (Wasserstein-1), self-attention only.
    """
    if facts.score not in _SCORES:
        raise _uncovered(facts, "user-defined scores are derived symbolically (lipbound derive custom); "
                                "a numeric head has a built-in score")
    score = _SCORES[facts.score](facts)
    if facts.values_through_A and facts.score != "l2":
        raise _uncovered(facts, "values through A belong to L2 attention")
    if measure:
        if facts.role != "self" or facts.causal or facts.score != "dot" or facts.rotary or facts.qk_norm \
                or facts.window or facts.position_bias != "none" or facts.softcap:
            raise _uncovered(facts, "the Wasserstein-1 theorem covers non-causal dot-product self-attention")
        return MeasureAttention(score, "uniform")
    if facts.softcap:
        score = SoftCapped(score)
    if facts.role == "self":
        if facts.window or facts.position_bias != "none":
            return PositionalAttention(score, Mask(facts.causal, S.w if facts.window else None, facts.position_bias))
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
