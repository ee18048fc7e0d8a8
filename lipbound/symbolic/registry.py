"""Registries: built-in variants by name.  Tested for completeness (every entry derives,
prints, and is covered by the soundness tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ..errors import AssumptionError
from . import symbols as S
from .blocks import FeedForwardMap, GatedFeedForwardMap, NormalizationMap, NormResidual
from .masks import Mask
from .nonsoftmax import FeatureMapKernel, SigmoidAttention
from .positional import PositionalAttention, SoftCapped
from .qknorm import QKNormScore
from .rotary import RotaryScore
from .scores import DotProduct, L2Distance, ScaledCosine
from .variants import CrossAttention, MeasureAttention, MultiHead, Residual, SelfAttention, Variant

__all__ = ["VARIANTS", "BLOCKS", "variant", "variant_names"]

#: name -> (factory, one-line description)
VARIANTS: Final[dict[str, tuple[Callable[[], Variant], str]]] = {
    "dot-product": (lambda: SelfAttention(DotProduct()), "dot-product self-attention with biases"),
    "dot-product-nobias": (lambda: SelfAttention(DotProduct(biases=False)),
                           "dot-product self-attention without biases"),
    "causal": (lambda: SelfAttention(DotProduct(), causal=True), "causal (masked) dot-product self-attention"),
    "l2-tied": (lambda: SelfAttention(L2Distance(tied=True)),
                "L2 self-attention, tied W_Q = W_K, values through A (Kim et al. 2021)"),
    "l2-untied": (lambda: SelfAttention(L2Distance(tied=False)), "L2 self-attention with untied W_Q, W_K"),
    "l2-tied-plain-values": (lambda: SelfAttention(L2Distance(tied=True, kim_values=False)),
                             "tied L2 scores with plain values v(y) = W_V^T y"),
    "cosine": (lambda: SelfAttention(ScaledCosine()), "scaled cosine self-attention (LipsFormer-style)"),
    "cross-queries": (lambda: CrossAttention(DotProduct(), "queries"), "dot-product cross-attention, in the queries"),
    "cross-context": (lambda: CrossAttention(DotProduct(), "context"), "dot-product cross-attention, in the context"),
    "cross-joint": (lambda: CrossAttention(DotProduct(), "joint"), "dot-product cross-attention, jointly"),
    "multi-head": (lambda: MultiHead(SelfAttention(DotProduct())), "multi-head dot-product self-attention with W_O"),
    "multi-head-l2": (lambda: MultiHead(SelfAttention(L2Distance(tied=True))),
                      "multi-head tied L2 self-attention with W_O (Kim et al. 2021)"),
    "residual": (lambda: Residual(SelfAttention(DotProduct())), "X + Att(X), dot-product self-attention"),
    "residual-multi-head": (lambda: Residual(MultiHead(SelfAttention(DotProduct()))),
                            "X + MHA(X), multi-head dot-product self-attention"),
    "measure-w1": (lambda: MeasureAttention(DotProduct(), "uniform"),
                   "self-attention on uniform empirical measures of n tokens, Wasserstein-1"),
    "measure-w1-mean-field": (lambda: MeasureAttention(DotProduct(), "mean-field"),
                              "self-attention on measures of any size (mean-field), Wasserstein-1"),
    "measure-w1-residual": (lambda: Residual(MeasureAttention(DotProduct(), "uniform")),
                            "x + Gamma_mu(x) pushed forward, uniform measures, Wasserstein-1"),
    "measure-cross-queries": (lambda: MeasureAttention(DotProduct(), "mean-field", "queries"),
                              "cross-attention on measures, in the query measure, Wasserstein-1"),
    "measure-cross-context": (lambda: MeasureAttention(DotProduct(), "mean-field", "context"),
                              "cross-attention on measures, in the context measure, Wasserstein-1"),
    "sigmoid": (lambda: SigmoidAttention(DotProduct()),
                "sigmoid self-attention sigma(s + b), b = -log n, dot-product score with biases (no softmax)"),
    "linear-elu": (lambda: SelfAttention(FeatureMapKernel()),
                   "linear attention: feature map elu + 1, normalised as a Markov kernel"),
    "rope": (lambda: SelfAttention(RotaryScore()),
             "rotary (RoPE) self-attention with biases: ||A|| becomes a = max over the offsets of ||A_Delta||"),
    "rope-nobias": (lambda: SelfAttention(RotaryScore(biases=False)),
                    "RoPE self-attention without biases: on a ball about 0, the dot product's bound with ||A|| -> a"),
    "rope-causal": (lambda: SelfAttention(RotaryScore(), causal=True),
                    "causal RoPE self-attention (a decoder head: Llama, Mistral, Qwen)"),
    "rope-multi-head": (lambda: MultiHead(SelfAttention(RotaryScore())), "multi-head RoPE self-attention with W_O"),
    "rope-residual": (lambda: Residual(SelfAttention(RotaryScore())), "X + Att(X), RoPE self-attention"),
    "rope-cross-joint": (lambda: CrossAttention(RotaryScore(), "joint"),
                         "RoPE cross-attention, jointly (offsets j - i of m queries and n keys)"),
    "qk-norm": (lambda: SelfAttention(QKNormScore()),
                "QK-norm self-attention: an RMSNorm on each head's query and key (OLMo 2)"),
    "qk-norm-rope": (lambda: SelfAttention(QKNormScore(rotary=True)),
                     "QK-norm, then RoPE (Qwen3, Gemma 3): logits bounded by tau d_k gamma_q gamma_k"),
    "gqa": (lambda: MultiHead(SelfAttention(DotProduct()), grouped=True),
            "grouped-query multi-head attention: H query heads in G key/value groups (G = 1: multi-query)"),
    "sliding-window": (lambda: PositionalAttention(DotProduct(), Mask(causal=True, window=S.w)),
                       "causal sliding-window self-attention of width w (Mistral; Gemma 2/3 local layers)"),
    "sliding-window-bidirectional": (lambda: PositionalAttention(DotProduct(), Mask(window=S.w)),
                                     "bidirectional sliding window |i - j| < w (Longformer, ModernBERT local layers)"),
    "alibi": (lambda: PositionalAttention(DotProduct(), Mask(causal=True, bias="alibi")),
              "causal self-attention with ALiBi biases of slope m_A (BLOOM, MPT)"),
    "t5-bias": (lambda: PositionalAttention(DotProduct(), Mask(bias="relative")),
                "self-attention with relative position biases spreading by Delta_b over a row (T5)"),
    "softcap": (lambda: SelfAttention(SoftCapped(DotProduct())),
                "self-attention with soft-capped logits c_cap tanh(s / c_cap) (Gemma 2)"),
}


#: Token-wise blocks around attention (lipbound.symbolic.blocks): name -> (factory, description)
BLOCKS: Final[dict[str, tuple[Callable[[], Variant], str]]] = {
    "layernorm": (lambda: NormalizationMap("layernorm"),
                  "LayerNorm gamma * (x - mean(x)) / sqrt(var(x) + epsilon) + beta"),
    "rmsnorm": (lambda: NormalizationMap("rmsnorm"), "RMSNorm gamma * x / sqrt(||x||^2 / d + epsilon)"),
    "feed-forward": (lambda: FeedForwardMap(), "feed-forward block W_2^T phi(W_1^T x + b_1) + b_2"),
    "pre-norm-residual": (lambda: NormResidual("pre"), "x + F(N(x)) from the constants L_F and L_N"),
    "post-norm-residual": (lambda: NormResidual("post"), "N(x + F(x)) from the constants L_F and L_N"),
    "pre-ln-feed-forward": (lambda: NormResidual("pre", FeedForwardMap(), NormalizationMap()),
                            "x + FFN(LN(x)), pre-LN (GPT-2, Whisper)"),
    "post-ln-feed-forward": (lambda: NormResidual("post", FeedForwardMap(), NormalizationMap()),
                             "LN(x + FFN(x)), post-LN (BERT)"),
    "swiglu": (lambda: GatedFeedForwardMap("swiglu"),
               "gated feed-forward block W_down^T (silu(W_gate^T x) * W_up^T x) (Llama, Mistral, Qwen)"),
    "geglu": (lambda: GatedFeedForwardMap("geglu"), "gated feed-forward block with the erf GELU"),
    "geglu-tanh": (lambda: GatedFeedForwardMap("geglu-tanh"), "gated feed-forward block with the tanh GELU (Gemma)"),
    "pre-rmsnorm-swiglu": (lambda: NormResidual("pre", GatedFeedForwardMap("swiglu"), NormalizationMap("rmsnorm")),
                           "x + SwiGLU(RMSNorm(x)), Llama's feed-forward block: Lipschitz on all of R^d"),
    "layerscale-residual": (lambda: NormResidual("pre", layerscale=True),
                            "x + diag(lambda) F(N(x)), LayerScale (CaiT, DINOv2)"),
    "sandwich-residual": (lambda: NormResidual("pre", sandwich=True),
                          "x + N_2(F(N(x))), sandwich norms (Gemma 2/3)"),
    "sandwich-geglu": (lambda: NormResidual("pre", GatedFeedForwardMap("geglu-tanh"), NormalizationMap("rmsnorm"),
                                            sandwich=True, after=NormalizationMap("rmsnorm")),
                       "x + RMSNorm(GeGLU(RMSNorm(x))), Gemma 2/3's feed-forward block"),
}


def variant_names() -> list[str]:
    return list(VARIANTS) + list(BLOCKS)


def variant(name: str) -> Variant:
    """The built-in variant or block called ``name`` (see :data:`VARIANTS` and :data:`BLOCKS`)."""
    try:
        factory, _ = VARIANTS[name] if name in VARIANTS else BLOCKS[name]
    except KeyError:
        raise AssumptionError("variant", f"one of {', '.join(variant_names())}", repr(name),
                              "run `lipbound list` to see the variants") from None
    return factory()
