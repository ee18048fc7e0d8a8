"""Registries: built-in variants by name.  Tested for completeness (every entry derives,
prints, and is covered by the soundness tests)."""

from __future__ import annotations

from typing import Callable, Final

from ..errors import AssumptionError
from .blocks import FeedForwardMap, NormalizationMap, NormResidual
from .scores import DotProduct, L2Distance, ScaledCosine
from .nonsoftmax import FeatureMapKernel, SigmoidAttention
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
