r"""Self-attention with a sliding window, position biases or soft-capped logits.

* :class:`PositionalAttention` -- softmax self-attention whose mask (causal, a sliding window of width
  w) and additive position biases (T5's relative buckets, ALiBi) change the column sums of P
  (:class:`~lipbound.symbolic.masks.Mask`); the kernel constants are the score's.
* :class:`SoftCapped` -- a score with logit soft-capping ``c tanh(s / c)`` (Gemma 2).  ``tanh`` is
  1-Lipschitz with ``0 < tanh' <= 1`` and ``|c tanh| < c``: ``beta`` stays, ``omega <= min(omega, 2c)``,
  and ``alpha`` needs the route that survives a factor in ``[0, 1]`` on each key's query gradient
  (:meth:`lipbound.symbolic.scores.Score.factor_alpha`: the dot product's mean-value ``R ||A||`` gains half
  the centre term ``||W_Q (W_K^T c + b_K)|| / sqrt(d_k)``; rotary and QK-norm constants stay as they are).
* :func:`positioned` -- a registry variant with a mask, biases or a cap added (the CLI's
  ``--causal``, ``--window``, ``--bias``, ``--softcap``).

These variants live outside :mod:`lipbound.symbolic.variants` on purpose: the SDP relaxations are keyed
by the classes of that module and model plain dot-product heads, so a windowed, biased or capped head
never reaches them.
"""

from __future__ import annotations

from typing import final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from . import theorems as T
from .assumptions import Assumptions
from .facts import HeadFacts
from .masks import Mask
from .record import Derivation, Described, eq, le
from .scores import KernelConstants, Score
from .variants import CrossAttention, MultiHead, Residual, SelfAttention, Variant, per_token_norm, to_vec_inf

__all__ = ["SoftCapped", "PositionalAttention", "positioned", "BIAS_OPTIONS"]

#: ``--bias`` values -> the bias kind of :class:`~lipbound.symbolic.masks.Mask`.
BIAS_OPTIONS = {"t5": "relative", "relative": "relative", "alibi": "alibi"}


@final
class SoftCapped(Score):
    """``c tanh(s / c)`` of a dot-product-type score (plain, rotary or QK-norm); constants: module docstring."""

    softcap = True

    def __init__(self, inner: Score):
        if inner.kind != "dot" or isinstance(inner, SoftCapped):
            raise AssumptionError("score", "a dot-product, rotary or QK-norm score (capped once)", inner.title,
                                  "soft-cap a dot-product-type score")
        self.inner = inner
        self.name = f"{inner.name}-softcap"
        self.title = f"soft-capped {inner.title}"
        self.kind, self.rotary, self.qk_norm = inner.kind, inner.rotary, inner.qk_norm

    @property
    def biased(self) -> bool:
        return self.inner.biased

    def expression(self) -> sp.Expr:
        return S.c_cap * sp.tanh(self.inner.expression() / S.c_cap)

    def hypotheses(self) -> list[str]:
        return self.inner.hypotheses() + ["logit soft-capping: the score is c_cap tanh(s / c_cap) with c_cap > 0"]

    def witness_note(self) -> str:
        return self.inner.witness_note()

    def _derive_constants(self, assumptions) -> KernelConstants:
        inner = self.inner.kernel_constants(assumptions)
        record = Derivation(f"Kernel constants of the {self.title}")
        record.absorb(inner.record)
        record.hypothesis("logit soft-capping: the score is c_cap tanh(s / c_cap) with c_cap > 0")
        record.add(eq(Described(r"\tilde s(x, y)"), self.expression()), "soft-capping the score s above", "soft-cap")
        record.add(le(Described(r"|\tilde s(x, y) - \tilde s(x, y')|"),
                      sp.Min(Described(r"|s(x, y) - s(x, y')|"), 2 * S.c_cap)),
                   "tanh is 1-Lipschitz and |c_cap tanh| < c_cap", "soft-cap")
        omega = sp.Min(inner.omega, 2 * S.c_cap)
        record.add(le(S.omega, omega), "the spread of a row, capped", "soft-cap")
        record.add(le(S.beta, inner.beta), "the key gradient of the capped score is tanh'(s / c_cap) grad_y s, "
                   "with 0 < tanh' <= 1", "soft-cap")
        alpha = self.inner.factor_alpha(assumptions, record)
        record.add(le(S.alpha, alpha), "the query gradient of the capped score is tanh'(s / c_cap) grad_x s: a "
                   "factor in (0, 1] that differs from key to key, so only a route that survives such factors applies",
                   "soft-cap")
        return KernelConstants(L_V=inner.L_V, rho=inner.rho, alpha=alpha, beta=inner.beta, omega=omega, record=record)

    def factor_alpha(self, assumptions, record: Derivation) -> sp.Expr:
        """A second factor in ``[0, 1]`` multiplies the first: the capped ``alpha`` survives it."""
        return self.kernel_constants(assumptions).alpha


@final
class PositionalAttention(Variant):
    """Softmax self-attention under a :class:`~lipbound.symbolic.masks.Mask` (causal, sliding window,
    position biases).  Its theorem is :func:`lipbound.symbolic.theorems.self_attention` with the mask."""

    single_head = True

    def __init__(self, score: Score, mask: Mask):
        if score.kind != "dot":
            raise AssumptionError("score", "a dot-product, rotary or QK-norm score (windows and position biases are "
                                  "derived for those)", score.title, "use a dot-product-type variant")
        self._score = score
        self.mask = mask
        self.causal = mask.causal
        self.title = f"self-attention ({score.name}; {mask.title()})"

    @property
    def score(self) -> Score:
        return self._score

    @property
    def head_facts(self) -> HeadFacts:
        facts = self._facts(self.mask.causal)
        return HeadFacts(**{**vars(facts), "window": self.mask.window is not None, "position_bias": self.mask.bias})

    def derive(self, assumptions: Assumptions, key: str = ""):
        if isinstance(assumptions, Assumptions) and not assumptions.domain.bounded and self.mask.window == 1:
            raise AssumptionError("window", "a width of at least 2 on an unbounded domain", "1",
                                  "with w = 1 every token attends to itself alone and f is affine (Lip = ||W_V||); "
                                  "derive on a bounded domain")
        return super().derive(assumptions, key)

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        inner = T.self_attention(per_token_norm(assumptions), self.mask.causal, assumptions.n, self.mask.window,
                                 self.mask.bias)
        return to_vec_inf(inner, assumptions)


def positioned(chosen: Variant, causal: bool = False, window=None, bias: str | None = None,
               softcap: bool = False) -> Variant:
    """``chosen`` with a causal mask, a sliding window, position biases (``"relative"``/``"t5"``,
    ``"alibi"``) or soft-capped logits added; ``chosen`` itself when nothing is asked.

    Self-attention variants, their multi-head layers and residual maps take them; a window or a bias
    needs a dot-product-type score, a cap too.
    """
    if not (causal or window is not None or bias or softcap):
        return chosen
    if isinstance(chosen, Residual):
        return Residual(positioned(chosen.inner, causal, window, bias, softcap))
    if isinstance(chosen, MultiHead):
        return MultiHead(positioned(chosen.head, causal, window, bias, softcap), grouped=chosen.grouped)
    if isinstance(chosen, CrossAttention) or not isinstance(chosen, (SelfAttention, PositionalAttention)):
        asked = "window" if window is not None else "bias" if bias else "causal" if causal else "softcap"
        raise AssumptionError(asked, "a softmax self-attention variant (single-head, multi-head or residual)",
                              chosen.title, "masks, position biases and soft-capping apply to self-attention")
    if chosen.score.kind != "dot":
        asked = "window" if window is not None else "bias" if bias else "softcap" if softcap else "causal"
        if asked != "causal":
            raise AssumptionError(asked, "a dot-product, rotary or QK-norm variant (windows, position biases and soft "
                                  "caps are derived for those)", chosen.score.title, "pick a dot-product-type variant")
    mask = chosen.mask if isinstance(chosen, PositionalAttention) else Mask(chosen.causal)
    if bias is not None and bias not in BIAS_OPTIONS:
        raise AssumptionError("bias", f"one of {sorted(BIAS_OPTIONS)}", repr(bias),
                              "pick t5 (any relative bias) or alibi")
    mask = Mask(mask.causal or causal, window if window is not None else mask.window,
                BIAS_OPTIONS[bias] if bias else mask.bias)
    score = SoftCapped(chosen.score) if softcap and not chosen.score.softcap else chosen.score
    if score.softcap and mask.bias != "none":
        raise AssumptionError("bias", "no position bias with soft-capped logits (no model caps biased scores; "
                              "lipbound has no theorem for the combination)",
                              f"bias {bias or mask.bias} with soft-capped logits",
                              "drop `softcap` or `bias`")
    if mask.window is None and mask.bias == "none":
        return SelfAttention(score, causal=mask.causal)
    return PositionalAttention(score, mask)
