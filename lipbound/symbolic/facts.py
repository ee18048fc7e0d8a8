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

__all__ = ["HeadFacts", "SCORES", "ROLES", "WEIGHTS", "POSITION_BIASES"]

#: Score functions with theorems: dot product, L2 distance, scaled cosine, a user-defined score,
#: and the kernel of linear attention (a positive feature map, normalised as a Markov kernel).
SCORES = ("dot", "l2", "cosine", "custom", "feature-map")
#: How scores become weights: a softmax over the keys (a Markov kernel), or a sigmoid of each score.
WEIGHTS = ("softmax", "sigmoid")
#: The argument a constant is taken in: self-attention, or cross-attention in the queries,
#: in the context, or jointly.
ROLES = ("self", "cross-queries", "cross-context", "cross-joint")
#: Additive position biases constant in the tokens: none, any relative bias (T5's buckets; the theorem is
#: stated in their spread over a row), or ALiBi's linear bias ``-m_A |i - j|`` (its own column sums).
POSITION_BIASES = ("none", "relative", "alibi")


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
    rotary : bool
        Rotary position embedding: ``s_ij = q_i^T R_Delta k_j / sqrt(d_k)``, ``Delta = p_j - p_i``; the theorem
        is stated in ``a = max_Delta ||A_Delta||`` over the offsets that occur.
    qk_norm : bool
        Per-head RMSNorm on queries and keys before the score (QK-norm), with gains ``gamma_q``, ``gamma_k``.
    window : bool
        Sliding-window mask: a query attends to keys fewer than ``w`` positions away (causal: itself and the
        ``w - 1`` before it); the theorem is stated in ``w``.  A theorem for full attention does not cover a
        windowed head (rows with fewer keys have larger weights), nor the reverse.
    position_bias : {"none", "relative", "alibi"}
        Additive position biases.  A theorem for ``"relative"`` (stated in their spread ``Delta_b``) covers
        every head whose biases are constant in the tokens; one for ``"alibi"`` only ALiBi heads.
    softcap : bool
        Logit soft-capping ``c tanh(s / c)`` (Gemma 2); the capped theorem covers capped heads only.
    """

    score: str
    biased: bool = True
    tied: bool = False
    values_through_A: bool = False
    causal: bool = False
    role: str = "self"
    weights: str = "softmax"
    rotary: bool = False
    qk_norm: bool = False
    window: bool = False
    position_bias: str = "none"
    softcap: bool = False

    def __post_init__(self):
        if self.score not in SCORES:
            raise AssumptionError("score", f"one of {SCORES}", repr(self.score), "pick a score with a theorem")
        if self.role not in ROLES:
            raise AssumptionError("role", f"one of {ROLES}", repr(self.role), "pick the argument of the constant")
        if self.weights not in WEIGHTS:
            raise AssumptionError("weights", f"one of {WEIGHTS}", repr(self.weights), "pick how scores become weights")
        if self.position_bias not in POSITION_BIASES:
            raise AssumptionError("position_bias", f"one of {POSITION_BIASES}", repr(self.position_bias),
                                  "pick the kind of additive position bias")
        if self.causal and self.role != "self":
            raise AssumptionError("causal", "False for cross-attention (masks apply to self-attention)", "True",
                                  "cross-attention heads attend to the whole context")
        for mask, value in (("window", self.window), ("position_bias", self.position_bias)):
            if value not in (False, "none") and self.role != "self":
                raise AssumptionError(mask, "no window or position bias for cross-attention (they apply to "
                                      "self-attention)", repr(value),
                                      "cross-attention heads attend to the whole context")

    def covers(self, head: HeadFacts) -> bool:
        """Whether a theorem derived under these facts holds for a head with the facts ``head``."""
        return (self.score == head.score and self.role == head.role and self.causal == head.causal
                and self.weights == head.weights and self.values_through_A == head.values_through_A
                and (self.biased or not head.biased) and (head.tied or not self.tied)
                and (self.rotary, self.qk_norm, self.window, self.softcap)
                == (head.rotary, head.qk_norm, head.window, head.softcap)
                and self.position_bias in (head.position_bias, "relative"))

    def describe(self) -> str:
        parts = [{"dot": "dot-product", "l2": "L2-distance", "cosine": "scaled-cosine", "custom": "user-defined",
                  "feature-map": "feature-map"}[self.score] + " score",
                 "with biases" if self.biased else "without biases"]
        if self.score == "l2":
            parts.append("tied W_Q = W_K" if self.tied else "untied W_Q, W_K")
        parts += [what for what, present in (("QK-norm", self.qk_norm), ("rotary positions", self.rotary),
                                              ("soft-capped logits", self.softcap)) if present]
        parts.append("values through A" if self.values_through_A else "values x W_V + b_V")
        parts.append(("causal " if self.causal else "") + ("sliding-window mask" if self.window else "mask")
                     if self.causal or self.window else "no mask")
        if self.position_bias != "none":
            parts.append({"relative": "relative position biases", "alibi": "ALiBi biases"}[self.position_bias])
        parts.append({"self": "self-attention", "cross-queries": "cross-attention in the queries",
                      "cross-context": "cross-attention in the context",
                      "cross-joint": "cross-attention jointly"}[self.role])
        return ", ".join(parts)
