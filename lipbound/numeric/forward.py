"""Whole transformer layers and models on one sentence (n, d): thin calls of the one float engine,
:mod:`lipbound.numeric.whole.chain`, which handles every norm placement, kernel and block kind.

``hidden_states`` returns ``[X_0, ..., X_L]``, ``X_0`` the embeddings (after the embedding
LayerNorm of a BERT: Hugging Face's ``output_hidden_states``); ``attention_block`` the attention
sub-block of a post-norm layer, ``Z = X + Attn(X)`` and ``N_out(Z)``.
"""

from __future__ import annotations

import numpy as np

from ..errors import WeightsError
from .model.transformer import Model, TransformerLayer
from .whole import chain

__all__ = ["attention_block", "transformer_layer", "hidden_states"]


def _block(layer: TransformerLayer) -> str:
    return "decoder" if layer.causal else "encoder"


def attention_block(layer: TransformerLayer, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Z, N_out(Z))`` with ``Z = X + a * Attn(X)`` (a post-norm layer), for one sentence ``X`` (n, d)."""
    if layer.placement != "post" or layer.ln_out is None:
        raise WeightsError(f"layer {layer.index}", "a post-norm layer with its attention norm (BERT)",
                           f"a {layer.placement}-norm layer", "run the whole layer with transformer_layer")
    first = chain.Step("attention", layer.as_layer(), None, True, f"layer {layer.index} attention",
                       scale=layer.attn_scale)
    summed, _ = chain.chain_forward([first], np.asarray(X, dtype=np.float64)[None])
    return summed[0], layer.ln_out(summed[0])


def transformer_layer(layer: TransformerLayer, X: np.ndarray) -> np.ndarray:
    """The whole layer ``X -> X'`` (needs the feed-forward block), whatever its placement."""
    out, _ = chain.chain_forward(chain.layer_steps(layer, _block(layer)), np.asarray(X, dtype=np.float64)[None])
    return out[0]


def hidden_states(model: Model, ids) -> list[np.ndarray]:
    """``[X_0, X_1, ..., X_L]`` for the token ids of one sentence, each of shape (n, d)."""
    return chain.hidden_states(model, ids)
