"""The facts of an attention head that decide which theorem bounds it.

A theorem of lipbound is derived for one kind of head: its score function, whether the
score has biases, whether query and key weights are tied, how values are formed, whether a
causal mask applies, and in which argument the constant is taken.  :class:`HeadFacts`
states these facts; a variant declares the facts its theorem covers
(:attr:`lipbound.symbolic.variants.Variant.head_facts`), and :meth:`HeadFacts.covers`
decides whether a theorem derived for one set of facts holds for a head with another.

The numeric layer reads a concrete head's facts from its weights and selects the variant
in one place (:mod:`lipbound.numeric.dispatch`); a head whose facts no theorem covers is
refused, never bound by another variant's theorem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from ..errors import AssumptionError

__all__ = ["HeadFacts", "SCORES", "ROLES", "WEIGHTS"]

#: Score functions with theorems: dot product, L2 distance, scaled cosine, a user-defined score,
#: and the kernel of linear attention (a positive feature map, normalised as a Markov kernel).
SCORES = ("dot", "l2", "cosine", "custom", "feature-map")
#: How scores become weights: a softmax over the keys (a Markov kernel), or a sigmoid of each score.
WEIGHTS = ("softmax", "sigmoid")
#: The argument a constant is taken in: self-attention, or cross-attention in the queries,
#: in the context, or jointly.
ROLES = ("self", "cross-queries", "cross-context", "cross-joint")


@final
@dataclass(frozen=True)
class HeadFacts:
    """What a theorem assumes about a head (or what a head is).

    Attributes
    ----------
    score : {"dot", "l2", "cosine", "custom"}
    biased : bool
        The score has query/key biases (``b_Q``, ``b_K``).  A theorem derived with biases
        covers heads without them (zero biases are a special case), not the reverse.
    tied : bool
        ``W_Q = W_K`` (L2 attention).  A theorem for untied weights covers tied heads.
    values_through_A : bool
        Kim et al.'s value map ``v(y) = W_V^T A y``; otherwise ``v(y) = W_V^T y + b_V``.
    causal : bool
        Token i attends to tokens 1..i.
    role : {"self", "cross-queries", "cross-context", "cross-joint"}
    weights : {"softmax", "sigmoid"}
        Softmax weights (every row sums to one) or sigmoid weights ``sigma(s_ij + b)``; a theorem
        for one never covers the other.
    """

    score: str
    biased: bool = True
    tied: bool = False
    values_through_A: bool = False
    causal: bool = False
    role: str = "self"
    weights: str = "softmax"

    def __post_init__(self):
        if self.score not in SCORES:
            raise AssumptionError("score", f"one of {SCORES}", repr(self.score), "pick a score with a theorem")
        if self.role not in ROLES:
            raise AssumptionError("role", f"one of {ROLES}", repr(self.role), "pick the argument of the constant")
        if self.weights not in WEIGHTS:
            raise AssumptionError("weights", f"one of {WEIGHTS}", repr(self.weights), "pick how scores become weights")
        if self.causal and self.role != "self":
            raise AssumptionError("causal", "False for cross-attention (masks apply to self-attention)", "True",
                                  "cross-attention heads attend to the whole context")

    def covers(self, head: "HeadFacts") -> bool:
        """Whether a theorem derived under these facts holds for a head with the facts ``head``."""
        return (self.score == head.score and self.role == head.role and self.causal == head.causal
                and self.weights == head.weights and self.values_through_A == head.values_through_A
                and (self.biased or not head.biased) and (head.tied or not self.tied))

    def describe(self) -> str:
        parts = [{"dot": "dot-product", "l2": "L2-distance", "cosine": "scaled-cosine", "custom": "user-defined",
                  "feature-map": "feature-map"}[self.score] + " score",
                 "with biases" if self.biased else "without biases"]
        if self.score == "l2":
            parts.append("tied W_Q = W_K" if self.tied else "untied W_Q, W_K")
        parts.append("values through A" if self.values_through_A else "values x W_V + b_V")
        parts.append("causal mask" if self.causal else "no mask")
        parts.append({"self": "self-attention", "cross-queries": "cross-attention in the queries",
                      "cross-context": "cross-attention in the context",
                      "cross-joint": "cross-attention jointly"}[self.role])
        return ", ".join(parts)
