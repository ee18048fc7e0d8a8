"""Small generated BERT-style models for the local certificates' exhaustive tests (no real weights)."""

from __future__ import annotations

import numpy as np
from scipy.special import erf

from lipbound.numeric.model import FeedForward, Head, Layer, LayerNorm
from lipbound.numeric.model.transformer import Embeddings, Model, TransformerLayer


def norm(rng, d: int, scale: float = 1.0) -> LayerNorm:
    return LayerNorm(scale * (0.5 + rng.random(d)), 0.3 * rng.standard_normal(d), eps=1e-5)


def layer(rng, d: int = 6, heads: int = 2, d_k: int = 3, d_ff: int = 10, index: int = 0, scale: float = 1.0,
          ln_in: LayerNorm | None = None) -> TransformerLayer:
    """A post-LN layer with biases everywhere; ``scale`` multiplies the query and key weights (sharper softmax)."""
    made = [Head(scale * rng.standard_normal((d, d_k)), scale * rng.standard_normal((d, d_k)),
                 rng.standard_normal((d, d_k)) / np.sqrt(d), 0.3 * rng.standard_normal(d_k),
                 0.3 * rng.standard_normal(d_k), 0.3 * rng.standard_normal(d_k), name=f"layer{index}.head{h}")
            for h in range(heads)]
    attention = Layer(tuple(made), rng.standard_normal((heads * d_k, d)) / np.sqrt(d), 0.2 * rng.standard_normal(d))
    ffn = FeedForward(rng.standard_normal((d, d_ff)) / np.sqrt(d), 0.3 * rng.standard_normal(d_ff),
                      rng.standard_normal((d_ff, d)) / np.sqrt(d_ff), 0.2 * rng.standard_normal(d))
    return TransformerLayer(index, attention, ln_in=ln_in or norm(rng, d), ln_out=norm(rng, d), ffn=ffn,
                            ffn_norm=norm(rng, d))


def model(seed: int = 0, d: int = 6, layers: int = 2, vocab: int = 12, positions: int = 16,
          scale: float = 1.0) -> Model:
    """A complete model: embeddings of ``vocab`` tokens and ``layers`` post-LN layers, the input LayerNorm of
    each layer being the output LayerNorm of the one before (as in BERT)."""
    rng = np.random.default_rng(seed)
    embeddings = Embeddings(rng.standard_normal((vocab, d)), 0.5 * rng.standard_normal((positions, d)),
                            0.1 * rng.standard_normal((2, d)), norm(rng, d))
    made, feeding = {}, embeddings.norm
    for index in range(layers):
        made[index] = layer(rng, d=d, index=index, scale=scale, ln_in=feeding)
        feeding = made[index].ffn_norm
    return Model("generated", made, num_heads=2, hidden=d, embeddings=embeddings, num_layers=layers)


def _layernorm(norm, x):
    centred = x - x.mean(axis=-1, keepdims=True)
    return norm.gamma * centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + norm.eps) + norm.beta


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layer(item, X):
    """BERT's post-norm layer ``LN_2(Y + FFN(Y))``, ``Y = LN_1(X + MHA(X))``, from its formulas."""
    attention, heads = item.attention, []
    for head in attention.heads:
        q, k, v = X @ head.W_Q + head.b_Q, X @ head.W_K + head.b_K, X @ head.W_V + head.b_V
        heads.append(_softmax(q @ k.T / np.sqrt(head.W_Q.shape[1])) @ v)
    Y = _layernorm(item.ln_out, X + np.concatenate(heads, axis=-1) @ attention.W_O + attention.b_O)
    h = Y @ item.ffn.W_1 + item.ffn.b_1
    return _layernorm(item.ffn_norm, Y + (0.5 * h * (1 + erf(h / np.sqrt(2)))) @ item.ffn.W_2 + item.ffn.b_2)


def stack_jacobian(model, X, blocks, h=1e-6):
    """Row convention ``(n d, n d)`` Jacobian of layers 0..blocks-1 at X by central differences."""
    def forward(Z):
        for index in range(blocks):
            Z = _layer(model.layer(index), Z)
        return Z.ravel()
    x = X.ravel()
    return np.stack([(forward((x + h * e).reshape(X.shape)) - forward((x - h * e).reshape(X.shape))) / (2 * h)
                     for e in np.eye(x.size)])
