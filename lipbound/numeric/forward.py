"""The forward pass of whole transformer layers and models (numpy, float64).

A post-LN BERT layer (Devlin et al. 2019; Vaswani et al. 2017)::

    Z = X + Attn(X),   Y = LN_att(Z),   X' = LN_out(Y + FFN(Y)),

with ``Attn`` the multi-head attention of :mod:`lipbound.numeric.attention` and the norms and
MLP of :mod:`lipbound.numeric.model.components`.  ``hidden_states`` returns
``[X_0, ..., X_L]``, ``X_0`` the output of the embedding LayerNorm (Hugging Face's
``output_hidden_states``).
"""

from __future__ import annotations

import numpy as np

from ..errors import WeightsError
from .attention import layer_forward
from .model.transformer import Model, TransformerLayer

__all__ = ["attention_block", "transformer_layer", "hidden_states"]


def attention_block(layer: TransformerLayer, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Z, LN_att(Z))`` with ``Z = X + Attn(X)``, for one sentence ``X`` (n, d)."""
    summed = layer_forward(layer.as_layer(residual=True), X)[0]
    return summed, summed if layer.ln_out is None else layer.ln_out(summed)


def transformer_layer(layer: TransformerLayer, X: np.ndarray) -> np.ndarray:
    """The whole layer ``X -> X'`` (needs the feed-forward block)."""
    if layer.ffn is None or layer.ffn_norm is None:
        raise WeightsError(f"layer {layer.index}", "a layer with its feed-forward block and norms",
                           "attention weights only", "load the full checkpoint (not the attention extract)")
    Y = attention_block(layer, X)[1]
    return layer.ffn_norm(Y + layer.ffn(Y))


def hidden_states(model: Model, ids) -> list[np.ndarray]:
    """``[X_0, X_1, ..., X_L]`` for the token ids of one sentence, each of shape (n, d)."""
    if not model.complete:
        raise WeightsError(model.path or model.name, "a full checkpoint (embeddings, every layer, FFN blocks)",
                           "an attention-only or partial checkpoint", "load the whole model directory")
    states = [model.embeddings(ids)]
    for index in range(model.num_layers):
        states.append(transformer_layer(model.layers[index], states[-1]))
    return states
