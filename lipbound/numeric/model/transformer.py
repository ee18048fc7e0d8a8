"""A transformer as one description: stacks of layers in order -- an encoder (BERT, ViT), a
decoder (GPT-2, Llama: causal self-attention) or both (Whisper: the decoder's cross-attention reads
the encoder's output) -- each layer with its attention (self, causal, and cross when it has one),
the norms around it and where they sit, its feed-forward block; each stack's final norm; the
token embeddings and the language-model head; and the provenance of the weights.

Three placements of the norms (``N`` a LayerNorm or an RMSNorm; ``a``, ``f`` the LayerScale gains,
1 when absent):

* ``post`` (BERT, Devlin et al. 2019; Vaswani et al. 2017)::

      Y = N_out(X + a * Attn(X)),    X' = N_ffn(Y + f * FFN(Y));

  the attention reads the output of the norm before it (``embeddings.LayerNorm`` for layer 0,
  ``N_ffn`` of layer l - 1 otherwise);
* ``pre`` (GPT-2, ViT, Whisper, Llama, Qwen, Mistral)::

      Z = X + a * Attn(N_in X),   [Z' = Z + Cross(N_c Z, C)],   X' = Z' + f * FFN(N_ffn Z');

  a decoder's cross-attention reads ``N_c``'s output as queries and the context ``C`` (the
  encoder's output after its final norm) as keys and values;
* ``sandwich`` (Gemma 2 and 3: a norm on each branch's output before the residual sum)::

      Z = X + a * N_out(Attn(N_in X)),    X' = Z + f * N_ffo(FFN(N_ffn Z)).

In all three, :attr:`TransformerLayer.ln_in` is the norm whose output the self-attention reads:
it fixes the domain of the attention's inputs.  A checkpoint may hold attention only (the
embedded default model): then ``ffn`` is None and only the attention is available.  The forward
pass of whole layers and models, with JVPs and VJPs, is :mod:`lipbound.numeric.whole.chain`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ...errors import WeightsError
from ..checks import finite_array, positive_float
from .components import FeedForward, GatedFeedForward, Head, Layer, LayerNorm, Normalization

__all__ = ["TransformerLayer", "Embeddings", "TokenEmbeddings", "Model", "BLOCKS", "PLACEMENTS"]

#: The stacks a model may have, in order.
BLOCKS = ("encoder", "decoder")
#: Where a layer's norms sit (module docstring).
PLACEMENTS = ("post", "pre", "sandwich")
#: The norm slots of a layer.
NORM_SLOTS = ("ln_in", "ln_out", "ffn_norm", "ffn_out_norm", "cross_norm")


@final
@dataclass(frozen=True)
class TransformerLayer:
    """One transformer layer (module docstring).

    Parameters
    ----------
    index : int
        Its position in the model, from 0.
    attention : Layer
        The multi-head self-attention (``residual=False``; the residual is added by the chain).
    ln_in : LayerNorm, RMSNorm or None
        The norm whose output feeds the attention: it fixes the input domain.
    ln_out : LayerNorm, RMSNorm or None
        post: the norm after the attention's residual sum (BERT's ``attention.output.LayerNorm``);
        sandwich: the norm on the attention's output (Gemma's ``post_attention_layernorm``).
    ffn : FeedForward, GatedFeedForward or None
    ffn_norm : LayerNorm, RMSNorm or None
        post: the norm after the feed-forward residual sum (BERT's ``output.LayerNorm``);
        pre and sandwich: the norm the feed-forward block reads.
    ffn_out_norm : LayerNorm, RMSNorm or None
        sandwich: the norm on the feed-forward block's output (Gemma's ``post_feedforward_layernorm``).
    cross : Layer or None
        Cross-attention of a decoder layer (pre placement): its queries are this stream, its
        keys and values the context (the output of another stack).
    cross_norm : LayerNorm, RMSNorm or None
        The norm the cross-attention's queries are read through.
    placement : {"post", "pre", "sandwich"}
    attn_scale, ffn_scale : ndarray (d,) or None
        LayerScale (Touvron et al. 2021): diagonal gains of the attention and feed-forward
        branches before the residual sum (None: 1).
    """

    index: int
    attention: Layer
    ln_in: Normalization | None = None
    ln_out: Normalization | None = None
    ffn: FeedForward | GatedFeedForward | None = None
    ffn_norm: Normalization | None = None
    cross: Layer | None = None
    cross_norm: Normalization | None = None
    placement: str = "post"
    ffn_out_norm: Normalization | None = None
    attn_scale: np.ndarray | None = None
    ffn_scale: np.ndarray | None = None

    def __post_init__(self):
        if not isinstance(self.attention, Layer):
            raise WeightsError("attention", "a lipbound.numeric.model.Layer", type(self.attention).__name__,
                               "build it with Layer(heads, W_O, b_O)")
        d = self.attention.d
        if self.attention.W_O.shape[1] != d:
            raise WeightsError("W_O", f"shape ({self.attention.W_O.shape[0]}, {d})", f"shape {self.attention.W_O.shape}",
                               "the output projection maps back to the model width")
        if self.placement not in PLACEMENTS:
            raise WeightsError("placement", f"one of {PLACEMENTS}", repr(self.placement), "state where the norms sit")
        if self.cross is not None and (not isinstance(self.cross, Layer) or self.cross.d != d):
            raise WeightsError("cross", f"a Layer of width {d} or None", repr(type(self.cross).__name__),
                               "pass the cross-attention of this layer")
        if self.cross is not None and self.placement != "pre":
            raise WeightsError("cross", "cross-attention in a pre-norm layer (Whisper's decoder)",
                               f"a {self.placement} layer with cross-attention", "set placement='pre'")
        for name in NORM_SLOTS:
            norm = getattr(self, name)
            if norm is not None and (not isinstance(norm, Normalization) or norm.d != d):
                raise WeightsError(name, f"a LayerNorm or RMSNorm over {d} features or None",
                                   repr(getattr(norm, "d", norm)), "pass the norm of this layer's width")
        if self.ffn_out_norm is not None and self.placement != "sandwich":
            raise WeightsError("ffn_out_norm", "None outside the sandwich placement", "a norm",
                               "set placement='sandwich' (Gemma 2 and 3) or drop the norm")
        if self.ffn is not None and (not isinstance(self.ffn, (FeedForward, GatedFeedForward)) or self.ffn.d != d):
            raise WeightsError("ffn", f"a FeedForward or GatedFeedForward reading {d} features",
                               repr(getattr(self.ffn, "d", self.ffn)), "check the feed-forward weights")
        for name in ("attn_scale", "ffn_scale"):
            value = getattr(self, name)
            if value is not None:
                value = finite_array(name, value, 1)
                if value.shape != (d,):
                    raise WeightsError(name, f"shape ({d},) (a LayerScale gain per feature)", f"shape {value.shape}",
                                       "pass the layer_scale vector")
                object.__setattr__(self, name, value)
        object.__setattr__(self, "index", int(self.index))

    @property
    def heads(self) -> tuple[Head, ...]:
        return self.attention.heads

    @functools.cached_property
    def cache(self) -> dict:
        """Objects derived from this immutable layer, built once (the float engine's steps)."""
        return {}

    @property
    def W_O(self) -> np.ndarray:
        return self.attention.W_O

    @property
    def num_heads(self) -> int:
        return self.attention.num_heads

    @property
    def causal(self) -> bool:
        return self.attention.heads[0].causal

    @property
    def d(self) -> int:
        return self.attention.d

    @property
    def self_kind(self) -> str:
        """``"causal"`` when the self-attention is masked, else ``"self"``."""
        return "causal" if self.causal else "self"

    def as_layer(self, residual: bool = False) -> Layer:
        """The multi-head attention map, optionally with its residual ``X + Attn(X)``."""
        if residual == self.attention.residual:
            return self.attention
        return Layer(self.attention.heads, self.attention.W_O, self.attention.b_O, residual=residual,
                     groups=self.attention.groups)


def _check_ids(ids, vocab_size: int, limit: int | None) -> np.ndarray:
    """One sentence of token ids, in the vocabulary and within ``limit`` positions (None: any length)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise WeightsError("token ids", "a non-empty sequence of integer token ids",
                           f"{ids.dtype} of shape {ids.shape}", "tokenize one sentence")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise WeightsError("token ids", f"ids in [0, {vocab_size})", f"range [{ids.min()}, {ids.max()}]",
                           "use ids from this model's vocabulary")
    if limit is not None and ids.size > limit:
        raise WeightsError("sentence", f"at most {limit} tokens (the model's context)",
                           f"{ids.size} tokens", "shorten the text or split it into sentences")
    return ids


@final
@dataclass(frozen=True)
class Embeddings:
    """``X_0 = LN(E_word[ids] + E_pos[o..o+n-1] + E_type[types])`` (BERT: ``o = 0``; RoBERTa counts
    positions from ``o = padding_idx + 1``; DistilBERT has no token types: ``token_type`` None)."""

    word: np.ndarray
    position: np.ndarray
    token_type: np.ndarray | None
    norm: LayerNorm
    position_offset: int = 0

    @property
    def vocab_size(self) -> int:
        return self.word.shape[0]

    @property
    def max_positions(self) -> int:
        return self.position.shape[0] - self.position_offset

    def __call__(self, ids, token_type_ids=None) -> np.ndarray:
        ids = _check_ids(ids, self.vocab_size, self.max_positions)
        positions = self.position[self.position_offset:self.position_offset + ids.size]
        summed = self.word[ids].astype(np.float64) + positions
        if self.token_type is None:
            if token_type_ids is not None and np.any(token_type_ids):
                raise WeightsError("token_type_ids", "none (this model has no token-type embeddings)",
                                   "non-zero segment ids", "pass one sentence without segment ids")
            return self.norm(summed)
        types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
        if types.shape != ids.shape or types.min() < 0 or types.max() >= self.token_type.shape[0]:
            raise WeightsError("token_type_ids", f"shape {ids.shape} with values in [0, {self.token_type.shape[0]})",
                               f"shape {types.shape}", "pass one segment id per token (zeros for one sentence)")
        return self.norm(summed + self.token_type[types])


@final
@dataclass(frozen=True)
class TokenEmbeddings:
    """``X_0 = scale * E_word[ids]``: token embeddings without a position table (decoders with
    rotary positions; Gemma scales by ``sqrt(d)``)."""

    word: np.ndarray
    scale: float = 1.0

    def __post_init__(self):
        word = np.asarray(self.word)
        if word.ndim != 2 or not np.issubdtype(word.dtype, np.floating) or not np.all(np.isfinite(word)):
            raise WeightsError("word", "a finite (vocab, d) table", f"{word.dtype} of shape {word.shape}",
                               "pass the embedding matrix (embed_tokens.weight)")
        object.__setattr__(self, "word", word)   # the table keeps its stored precision
        scale = float(self.scale)
        if not np.isfinite(scale) or scale == 0:
            raise WeightsError("scale", "a finite non-zero float", repr(self.scale), "1.0, or sqrt(d) for Gemma")
        object.__setattr__(self, "scale", scale)

    @property
    def vocab_size(self) -> int:
        return self.word.shape[0]

    @property
    def max_positions(self) -> None:
        return None

    def __call__(self, ids, token_type_ids=None) -> np.ndarray:
        if token_type_ids is not None and np.any(token_type_ids):
            raise WeightsError("token_type_ids", "none (this model has no token-type embeddings)",
                               "non-zero segment ids", "pass one sentence without segment ids")
        ids = _check_ids(ids, self.vocab_size, None)
        return self.scale * self.word[ids].astype(np.float64)


@final
@dataclass(frozen=True)
class Model:
    """A transformer's weights with their provenance: one or two stacks of layers.

    An encoder (BERT, ViT) has the stack ``"encoder"``; a decoder-only model (GPT-2) the stack
    ``"decoder"`` (``decoder_only``); an encoder-decoder (Whisper) both, the decoder's layers
    reading the encoder's output through their cross-attention.

    Parameters
    ----------
    name : str
        What the weights are called: the name the file itself records (safetensors metadata,
        the plain format's ``name``), else the file or directory name -- never a base-model name
        a fine-tune inherited in its config.json.
    layers : dict of int to TransformerLayer
        The layers of the first stack that were loaded, by index (the encoder; the decoder of
        a decoder-only model).  Empty only when decoder layers alone were requested.
    num_heads, hidden : int
    source : str
        Where the tensors came from.
    licence : str
    path : str
        The file or directory read.
    sha256 : str
        Hash of the weight file(s) (of their concatenated hashes for several files).
    embeddings : Embeddings, TokenEmbeddings or None
        Present when the checkpoint holds token embeddings (BERT's with positions, types and their
        LayerNorm; a rotary decoder's table alone).
    num_layers : int
        Layers of the first stack (``layers`` may hold a subset).
    metadata : dict
    final_norm : LayerNorm, RMSNorm or None
        The norm after the last layer of a pre-norm first stack (GPT-2's ``ln_f``, ViT's
        ``layernorm``, Whisper's ``encoder/layer_norm``, Llama's ``model.norm``): the stack's
        output, and the context of a decoder's cross-attention.
    decoder : dict of int to TransformerLayer
        The decoder stack of an encoder-decoder (Whisper); empty otherwise.
    decoder_final_norm : LayerNorm, RMSNorm or None
    decoder_layers : int
    decoder_only : bool
        The first stack is a decoder (causal self-attention, no encoder): GPT-2.
    layout : str
        The checkpoint layout read (``"BERT"``, ``"RoBERTa"``, ``"DistilBERT"``, ``"ViT"``,
        ``"GPT-2"``, ``"Whisper (CTranslate2)"``, ``"Llama"``, ``"Qwen3"``, ``"Gemma 2"``, ``"plain"``), for
        reports.
    lm_head : ndarray (vocab, d) or None
        The language-model head of a decoder: ``logits = final_norm(X_L) lm_head^T``; the same
        array as ``embeddings.word`` when tied (``metadata["tied_embeddings"] = True``).
    max_positions : int or None
        The context length (None: unknown, or the position table's length).
    logit_softcap : float or None
        ``c`` of the soft-cap ``c tanh(z / c)`` of a decoder's logits (Gemma 2's
        ``final_logit_softcapping``; None: none).
    """

    name: str
    layers: dict
    num_heads: int
    hidden: int
    source: str = ""
    licence: str = "unknown"
    path: str = ""
    sha256: str = ""
    embeddings: Embeddings | TokenEmbeddings | None = None
    num_layers: int = 0
    metadata: dict = field(default_factory=dict, compare=False)
    final_norm: Normalization | None = None
    decoder: dict = field(default_factory=dict)
    decoder_final_norm: Normalization | None = None
    decoder_layers: int = 0
    decoder_only: bool = False
    layout: str = ""
    lm_head: np.ndarray | None = None
    max_positions: int | None = None
    logit_softcap: float | None = None

    def __post_init__(self):
        if not self.layers and not self.decoder:
            raise WeightsError("layers", "at least one layer", "none", "load at least one layer")
        if self.decoder_only and self.decoder:
            raise WeightsError("decoder", "no second stack in a decoder-only model", f"{len(self.decoder)} layers",
                               "put a decoder-only model's layers in `layers`")
        for which, stack in (("layers", self.layers), ("decoder", self.decoder)):
            for index, layer in stack.items():
                if not isinstance(layer, TransformerLayer) or layer.index != index:
                    raise WeightsError(f"{which}[{index}]", f"a TransformerLayer with index {index}", repr(layer)[:60],
                                       "key the dict by layer index")
        for which in ("final_norm", "decoder_final_norm"):
            norm = getattr(self, which)
            if norm is not None and (not isinstance(norm, Normalization) or norm.d != self.hidden):
                raise WeightsError(which, f"a LayerNorm or RMSNorm over {self.hidden} features or None",
                                   repr(getattr(norm, "d", norm)), "pass the stack's final norm")
        if self.lm_head is not None:
            head = np.asarray(self.lm_head)
            if head.ndim != 2 or head.shape[1] != self.hidden:
                raise WeightsError("lm_head", f"a (vocab, {self.hidden}) matrix", f"shape {head.shape}",
                                   "pass lm_head.weight (or the embedding table when tied)")
        if self.logit_softcap is not None:
            object.__setattr__(self, "logit_softcap", positive_float("logit_softcap", self.logit_softcap,
                                                                     "use the checkpoint's final_logit_softcapping"))
        if self.max_positions is None and self.embeddings is not None:
            object.__setattr__(self, "max_positions", self.embeddings.max_positions)
        object.__setattr__(self, "layers", dict(sorted(self.layers.items())))
        object.__setattr__(self, "decoder", dict(sorted(self.decoder.items())))
        object.__setattr__(self, "num_layers", max(self.num_layers, max(self.layers, default=-1) + 1))
        if self.decoder:
            object.__setattr__(self, "decoder_layers", max(self.decoder_layers, max(self.decoder) + 1))

    @property
    def blocks(self) -> tuple[str, ...]:
        """The stacks in order: ``("encoder",)``, ``("decoder",)`` or ``("encoder", "decoder")``."""
        if self.decoder_only:
            return ("decoder",)
        return BLOCKS if self.decoder else ("encoder",)

    def check_block(self, block: str | None) -> str:
        if block is None:
            return self.blocks[0]
        if block not in self.blocks:
            has = " and ".join(self.blocks)
            raise WeightsError("block", f"one of the stacks of this model: {', '.join(self.blocks)}", repr(block),
                               f"this model has {'only ' if len(self.blocks) == 1 else ''}the {has}"
                               + ("" if block in BLOCKS else "; pick a stack"))
        return block

    def stack(self, block: str | None = None) -> dict:
        """The loaded layers of a stack (default: the first), by index."""
        block = self.check_block(block)
        return self.layers if block == self.blocks[0] else self.decoder

    def stack_size(self, block: str | None = None) -> int:
        """How many layers the stack has (loaded or not)."""
        block = self.check_block(block)
        return self.num_layers if block == self.blocks[0] else self.decoder_layers

    def final_norm_of(self, block: str | None = None) -> Normalization | None:
        """The norm after the last layer of a pre-norm stack (None for post-LN stacks)."""
        block = self.check_block(block)
        return self.final_norm if block == self.blocks[0] else self.decoder_final_norm

    @property
    def context_norm(self) -> Normalization | None:
        """The LayerNorm whose outputs a cross-attention reads as keys and values: the encoder's
        final LayerNorm (pre-LN), else the last encoder layer's output LayerNorm (post-LN)."""
        if "encoder" not in self.blocks or not self.decoder:
            return None
        if self.final_norm is not None:
            return self.final_norm
        last = self.layers.get(self.num_layers - 1)
        return None if last is None or last.placement != "post" else last.ffn_norm

    def layer(self, index: int, block: str | None = None) -> TransformerLayer:
        """The layer ``index`` of a stack (default: the first); a :class:`WeightsError` lists the loaded ones."""
        layers = self.stack(block)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or int(index) not in layers:
            where = "" if len(self.blocks) == 1 else f" of the {self.check_block(block)}"
            raise WeightsError("layer", f"one of the loaded layers{where} {list(layers)} (counted from 0)", repr(index),
                               f"pick a layer in {list(layers)}")
        return layers[int(index)]

    def head(self, layer: int, head: int, block: str | None = None) -> Head:
        heads = self.layer(layer, block).heads
        if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 0 <= head < len(heads):
            raise WeightsError("head", f"an index in 0..{len(heads) - 1} (heads are counted from 0)", repr(head),
                               f"layer {layer} has {len(heads)} heads")
        return heads[int(head)]

    def describe(self) -> str:
        """One line: layout, stacks with their layer counts, heads, width."""
        stacks = " + ".join(f"{self.stack_size(b)} {b} layers" for b in self.blocks)
        return f"{self.layout or 'transformer'}: {stacks}, {self.num_heads} heads, width {self.hidden}"

    @property
    def complete(self) -> bool:
        """Embeddings and every layer with its feed-forward block: the whole forward pass runs."""
        return (self.embeddings is not None and sorted(self.layers) == list(range(self.num_layers))
                and all(layer.ffn is not None for layer in self.layers.values()))
