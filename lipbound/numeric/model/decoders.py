"""Decoders with rotary positions -- Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, and llama.cpp's
GGUF ``llama`` -- read into the one model description.

The layouts are declared in :mod:`.layouts` (tensor names, placement, norm gains, gating, QK-norm,
which layers slide, how Q and K rows are stored); a checkpoint's numbers come from its config.json
(a GGUF file's metadata, renamed by :func:`.gguf.gguf_config`) with the defaults of the family's
configuration class, checked against the tensors: :func:`decoder_architecture` returns them as a
plain :class:`DecoderArchitecture`.  The equations are those of the Hugging Face
``modeling_<type>.py`` of each family (Touvron et al. 2023; Jiang et al. 2023; Qwen team 2024,
2025; Gemma team 2024, 2025), in the row convention of :mod:`.components`:

* pre-norm layer: ``Z = X + Attn(N_in X)``, ``X' = Z + FFN(N_ffn Z)``; sandwich (Gemma):
  ``Z = X + N_out Attn(N_in X)``, ``X' = Z + N_ffn,out FFN(N_ffn Z)``;
* RMSNorm ``N(x) = gamma * x / sqrt(||x||^2 / d + eps)``, gamma = w (Gemma: 1 + w);
* gated feed-forward ``(act(x W_gate) * (x W_up)) W_down``, act SiLU (Llama, Mistral, Qwen) or
  GELU with tanh (Gemma);
* attention: query head h reads key/value group ``h // (H / H_kv)``; scores
  ``scale * (R(p_i) q_i) . (R(p_j) k_j)`` (``scale = head_dim^-1/2``; Gemma
  ``query_pre_attn_scalar^-1/2``) after QK-norm when the family has it, soft-capped
  ``c tanh(s / c)`` (Gemma 2), causal, through a sliding window ``p_i - p_j < w`` on local
  layers; RoPE pairs dimension t with t + head_dim / 2 (rotate-half) at frequencies
  ``base^(-2t / dims)``;
* the stream starts at ``E[ids]`` (Gemma: times ``sqrt(d)``) and ends at the final RMSNorm; the
  logits are ``N_final(X) E_out^T`` (Gemma 2: soft-capped), ``E_out`` the embeddings when tied.

llama.cpp stores the rows of each head's query and key projections permuted, so that RoPE on
adjacent pairs (2t, 2t + 1) of the stored rows equals rotate-half on the original rows;
:func:`unpermute_rows` undoes it (then the GGUF model is head for head the Hugging Face one).
Mixing the two conventions still gives a working-looking model whose perplexity is about twice
as large -- the tests measure it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import numpy as np

from ...errors import WeightsError
from ..kernels import AttentionMask, QKNorm, Rotary
from .components import GatedFeedForward, Head, Layer, RMSNorm
from .files import TensorSource
from .huggingface import select_layers
from .layouts import Layout
from .transformer import Model, TokenEmbeddings, TransformerLayer

__all__ = ["DecoderArchitecture", "decoder_architecture", "load_decoder", "unpermute_rows", "ROPE_TYPES"]

#: RoPE variants implemented: plain frequencies only (scaled variants are refused).
ROPE_TYPES = ("default",)
_CONFIG_FIX = "use the config.json that belongs to these weights"


@final
@dataclass(frozen=True)
class DecoderArchitecture:
    """The numbers of one rotary decoder, checked against its tensors.

    Parameters
    ----------
    family : str
        The layout's name (``"Llama"``, ``"Gemma 2"``, ``"Llama (GGUF)"``, ...).
    num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, vocab_size : int
    max_positions : int
        The context length (``max_position_embeddings``; GGUF ``context_length``).
    norm_eps : float
    activation : str
        Of the gated feed-forward block (``"silu"``, ``"gelu_pytorch_tanh"``).
    rope_dims : int
        Rotated dimensions per head (even, <= head_dim).
    rope_bases : tuple of float
        RoPE base of each layer (Gemma 3: local layers have their own).
    windows : tuple of (int or None)
        Sliding window of each layer (None: the whole causal prefix).
    score_scale : float
        Factor of the scores.
    attn_softcap, final_softcap : float or None
        Soft-caps ``c tanh(s / c)`` of the scores and of the logits (Gemma 2).
    qkv_bias, output_bias, mlp_bias : bool
    embedding_scale : float
        Factor of the token embeddings (Gemma: sqrt(hidden)).
    tied : bool
        The output projection is the embedding table.
    unpermute : bool
        The Q and K rows are stored in llama.cpp's order and are un-permuted on reading.
    rope_pairing : {"half", "interleaved"}
        How RoPE pairs the dimensions of the rows as read: rotate-half, or adjacent pairs
        (llama.cpp's rows with partial rotary dimensions, which are not un-permuted).
    """

    family: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab_size: int
    max_positions: int
    norm_eps: float
    activation: str
    rope_dims: int
    rope_bases: tuple
    windows: tuple
    score_scale: float
    attn_softcap: float | None
    final_softcap: float | None
    qkv_bias: bool
    output_bias: bool
    mlp_bias: bool
    embedding_scale: float
    tied: bool
    unpermute: bool
    rope_pairing: str

    @property
    def groups(self) -> tuple[int, ...]:
        """The key/value group each query head reads: ``h // (H / H_kv)``."""
        per_group = self.num_heads // self.num_kv_heads
        return tuple(h // per_group for h in range(self.num_heads))


def unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """The Hugging Face row order of a query or key projection stored by llama.cpp.

    llama.cpp's converter maps row ``h hd + j hd/2 + t`` (head h, half j, index t) to row
    ``h hd + 2 t + j``; this is its inverse.  ``weight`` (heads hd, ...) -- a weight (out, in)
    or a bias (out,).
    """
    size = weight.shape[0] // heads
    return weight.reshape(heads, size // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _setting(config: dict, key: str, default=None):
    """config[key], or ``default`` when it is absent or null."""
    value = config.get(key)
    return default if value is None else value


def _positive_int(config: dict, key: str, where: str, default=None) -> int:
    value = _setting(config, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise WeightsError(f"{where}: {key}", "a positive integer", repr(value), _CONFIG_FIX)
    return int(value)


def _positive_float(config: dict, key: str, where: str, default=None) -> float:
    value = _setting(config, key, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not (math.isfinite(number) and number > 0):
        raise WeightsError(f"{where}: {key}", "a positive number", repr(value), _CONFIG_FIX)
    return number


def _rope(config: dict, layout: Layout, where: str) -> tuple[float, float]:
    """``(base of global layers, base of local layers)``; scaled RoPE variants are refused.

    Reads ``rope_theta``, ``rope_scaling`` and the local base (transformers 4), or
    ``rope_parameters`` (transformers 5: one dict, or one per layer type).
    """
    parameters = config.get("rope_parameters") or {}
    if not isinstance(parameters, dict):
        raise WeightsError(f"{where}: rope_parameters", "a JSON object", repr(parameters)[:60], _CONFIG_FIX)
    nested = "full_attention" in parameters or "sliding_attention" in parameters
    full = parameters.get("full_attention", {}) if nested else parameters
    local = parameters.get("sliding_attention", {}) if nested else {}
    for origin, scaling in (("rope_scaling", config.get("rope_scaling")), ("rope_parameters", full),
                            ("rope_parameters", local)):
        if not scaling:
            continue
        kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else scaling
        if kind not in ROPE_TYPES:
            raise WeightsError(f"{where}: {origin}", f"RoPE of type {' or '.join(ROPE_TYPES)} (plain frequencies)",
                               f"type {kind!r}", "scaled RoPE variants are not implemented; use a model without them")
    factor = config.get("partial_rotary_factor", 1.0)
    if factor not in (None, 1, 1.0):
        raise WeightsError(f"{where}: partial_rotary_factor", "1 (every dimension rotated)", repr(factor),
                           "partial rotary embeddings are not implemented for this family")
    base = _positive_float(config, "rope_theta", where, full.get("rope_theta"))
    if layout.local_rope_key is None:
        return base, base
    return base, _positive_float(config, layout.local_rope_key, where, local.get("rope_theta"))


def _sliding(config: dict, layout: Layout, layers: int, where: str) -> tuple:
    """The sliding window of each layer, from ``layer_types`` or the layout's rule."""
    kinds = config.get("layer_types")
    if kinds is None:
        if layout.windows == "all":
            kinds = ["sliding_attention"] * layers
        elif layout.windows == "qwen":
            on = bool(config.get("use_sliding_window"))
            first = int(config.get("max_window_layers", layers))
            kinds = ["sliding_attention" if on and i >= first else "full_attention" for i in range(layers)]
        elif layout.windows == "alternate":
            kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        elif layout.windows == "pattern":
            period = _positive_int(config, "sliding_window_pattern", where)
            kinds = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers)]
        else:
            kinds = ["full_attention"] * layers
    if not isinstance(kinds, (list, tuple)) or len(kinds) != layers or \
            not set(kinds) <= {"full_attention", "sliding_attention"}:
        raise WeightsError(f"{where}: layer_types", f"{layers} entries, each full_attention or sliding_attention",
                           repr(kinds)[:80], _CONFIG_FIX)
    window = config.get("sliding_window")
    if "sliding_attention" in kinds and window is not None:
        window = _positive_int(config, "sliding_window", where)
    return tuple(window if kind == "sliding_attention" else None for kind in kinds)


def _expect_shape(tensors: TensorSource, key: str, shape: tuple, because: str) -> None:
    if key not in tensors.keys():
        raise WeightsError(f"{tensors.path}:{key}", "a tensor of this name", "missing",
                           "check that the checkpoint is complete and of the layout named in the message")
    found = tensors.shape(key)
    if tuple(found) != tuple(shape):
        raise WeightsError(f"{tensors.path}:{key}", f"shape {tuple(shape)} ({because})", f"shape {tuple(found)}",
                           _CONFIG_FIX)


def decoder_architecture(layout: Layout, config: dict, tensors: TensorSource, prefix: str,
                         first_layer: int) -> DecoderArchitecture:
    """The numbers of a rotary decoder from its configuration, checked against the tensors of the
    embedding table and of layer ``first_layer``.

    Raises
    ------
    WeightsError
        A required key missing, a value of the wrong kind, a RoPE variant or option not
        implemented, a tensor whose shape disagrees with the configuration (named with both).
    """
    where = f"{tensors.path} (config.json)" if tensors.kind != "gguf" else f"{tensors.path} (GGUF metadata)"
    config = {**dict(layout.defaults), **config}
    if config.get("use_bidirectional_attention"):
        raise WeightsError(f"{where}: use_bidirectional_attention", "false (a causal decoder)", "true",
                           "bidirectional Gemma encoders are not read as decoders")
    num_layers = _positive_int(config, "num_hidden_layers", where)
    hidden = _positive_int(config, "hidden_size", where)
    word = f"{prefix}{layout.embeddings['word']}.weight"
    if word not in tensors.keys():
        raise WeightsError(f"{tensors.path}:{word}", "the token embeddings", "missing", "use a complete checkpoint")
    vocab, width = tensors.shape(word)
    if width != hidden:
        raise WeightsError(f"{tensors.path}:{word}", f"width {hidden} (hidden_size)", f"shape {(vocab, width)}",
                           _CONFIG_FIX)
    stated_vocab = config.get("vocab_size")
    if stated_vocab is not None and int(stated_vocab) != vocab:
        raise WeightsError(f"{tensors.path}:{word}", f"{stated_vocab} rows (vocab_size)", f"{vocab} rows", _CONFIG_FIX)
    heads = _positive_int(config, "num_attention_heads", where)
    kv_heads = _positive_int(config, "num_key_value_heads", where, heads)
    if heads % kv_heads:
        raise WeightsError(f"{where}: num_key_value_heads", f"a divisor of num_attention_heads {heads}", str(kv_heads),
                           _CONFIG_FIX)
    head_dim = _positive_int(config, "head_dim", where, hidden // heads)
    rope_dims = _positive_int(config, "rotary_dims", where, head_dim)
    if rope_dims > head_dim or rope_dims % 2:
        raise WeightsError(f"{where}: rope dimension count", f"an even number <= head_dim {head_dim}", str(rope_dims),
                           _CONFIG_FIX)
    llama_rows = layout.rope_rows == "llama.cpp"
    if rope_dims != head_dim and not llama_rows:
        raise WeightsError(f"{where}: head_dim", "rotary embeddings over the whole head", f"{rope_dims} of {head_dim}",
                           "partial rotary embeddings are not implemented for this family")
    base, local = _rope(config, layout, where)
    windows = _sliding(config, layout, num_layers, where)
    eps, _ = layout.config_value(config, layout.eps_keys, layout.eps_default)
    act = str(layout.config_value(config, layout.act_keys, layout.act_default)[0])
    stem = f"{prefix}{layout.stem.format(index=first_layer)}"
    heads_because = f"num_attention_heads {heads} x head_dim {head_dim}, hidden_size {hidden}"
    kv_because = f"num_key_value_heads {kv_heads} x head_dim {head_dim}, hidden_size {hidden}"
    _expect_shape(tensors, f"{stem}.{layout.query}.weight", (heads * head_dim, hidden), heads_because)
    _expect_shape(tensors, f"{stem}.{layout.key}.weight", (kv_heads * head_dim, hidden), kv_because)
    _expect_shape(tensors, f"{stem}.{layout.value}.weight", (kv_heads * head_dim, hidden), kv_because)
    _expect_shape(tensors, f"{stem}.{layout.output}.weight", (hidden, heads * head_dim), heads_because)
    up = f"{stem}.{layout.ffn_in}.weight"
    intermediate = _positive_int(config, "intermediate_size", where,
                                 tensors.shape(up)[0] if up in tensors.keys() else None)
    for part in (layout.ffn_gate, layout.ffn_in):
        _expect_shape(tensors, f"{stem}.{part}.weight", (intermediate, hidden), f"intermediate_size {intermediate}")
    _expect_shape(tensors, f"{stem}.{layout.ffn_out}.weight", (hidden, intermediate),
                  f"intermediate_size {intermediate}")
    if layout.qkv_bias == "always":
        qkv_bias, output_bias = True, False
    else:
        qkv_bias = output_bias = bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    for part, expected, key in ((layout.query, qkv_bias, "attention_bias"),
                                (layout.output, output_bias, "attention_bias"),
                                (layout.ffn_gate, mlp_bias, "mlp_bias")):
        if f"{stem}.{part}.bias" in tensors.keys() and not expected:
            raise WeightsError(f"{tensors.path}:{stem}.{part}.bias", f"no bias ({key} is false for {layout.name})",
                               "a bias tensor", "use the config.json that belongs to these weights")
    head = f"{layout.lm_head}.weight" if layout.lm_head else None
    tied = bool(config.get("tie_word_embeddings", head not in tensors.keys()))
    if not tied and head not in tensors.keys():
        raise WeightsError(f"{tensors.path}:{head}", "the output projection (tie_word_embeddings is false)", "missing",
                           "use a complete checkpoint, or the config.json that belongs to it")
    scale_key = "query_pre_attn_scalar"
    scale = 1.0 / math.sqrt(_positive_float(config, scale_key, where) if config.get(scale_key) is not None
                            else head_dim)
    caps = [None if config.get(key) is None else _positive_float(config, key, where)
            for key in ("attn_logit_softcapping", "final_logit_softcapping")]
    max_positions = _positive_int(config, "max_position_embeddings", where)
    return DecoderArchitecture(
        family=layout.name, num_layers=num_layers, hidden=hidden, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate=intermediate, vocab_size=vocab, max_positions=max_positions,
        norm_eps=float(eps), activation=act, rope_dims=rope_dims,
        rope_bases=tuple(local if window is not None else base for window in windows), windows=windows,
        score_scale=scale, attn_softcap=caps[0], final_softcap=caps[1], qkv_bias=qkv_bias, output_bias=output_bias,
        mlp_bias=mlp_bias, embedding_scale=math.sqrt(hidden)
        if layout.embedding_scale == "sqrt(d)" else 1.0, tied=tied, unpermute=llama_rows and rope_dims == head_dim,
        rope_pairing="interleaved" if llama_rows and rope_dims < head_dim else "half")


class _DecoderReader:
    """The tensors of one rotary decoder as the model description's arrays (row convention)."""

    def __init__(self, tensors: TensorSource, layout: Layout, prefix: str, arch: DecoderArchitecture):
        self.tensors, self.layout, self.prefix, self.arch = tensors, layout, prefix, arch

    def matrix(self, stem: str, n_out: int, n_in: int, rows: int | None = None) -> np.ndarray:
        """``W`` (n_in, n_out) with ``y = x W`` from the stored (n_out, n_in); ``rows``: heads whose
        llama.cpp row order is undone."""
        stored = self.tensors.tensor(f"{stem}.weight", (n_out, n_in))
        return (unpermute_rows(stored, rows) if rows and self.arch.unpermute else stored).T

    def bias(self, stem: str, size: int, present: bool, rows: int | None = None) -> np.ndarray | None:
        if not present:
            return None
        stored = self.tensors.tensor(f"{stem}.bias", (size,))
        return unpermute_rows(stored, rows) if rows and self.arch.unpermute else stored

    def gain(self, stem: str, size: int) -> np.ndarray:
        """An RMSNorm's gain: the stored weight w, or 1 + w (Gemma)."""
        w = self.tensors.tensor(f"{stem}.weight", (size,))
        return 1.0 + w if self.layout.norm_gain == "1 + w" else w

    def norm(self, stem: str | None) -> RMSNorm | None:
        return None if stem is None else RMSNorm(self.gain(stem, self.arch.hidden), self.arch.norm_eps)

    def kernel(self, stem: str, index: int):
        arch, layout = self.arch, self.layout
        default = 1.0 / math.sqrt(arch.head_dim)
        scale = None if arch.score_scale == default else arch.score_scale
        rotary = Rotary(base=arch.rope_bases[index], dims=None if arch.rope_dims == arch.head_dim else arch.rope_dims,
                        pairing=arch.rope_pairing, scale=None if layout.query_norm else scale)
        if layout.query_norm is None:
            return rotary
        return QKNorm(self.gain(f"{stem}.{layout.query_norm}", arch.head_dim),
                      self.gain(f"{stem}.{layout.key_norm}", arch.head_dim), arch.norm_eps, rotary=rotary, scale=scale)

    def layer(self, index: int) -> TransformerLayer:
        arch, layout = self.arch, self.layout
        stem = f"{self.prefix}{layout.stem.format(index=index)}"
        d, hd, H, H_kv = arch.hidden, arch.head_dim, arch.num_heads, arch.num_kv_heads
        W_Q = self.matrix(f"{stem}.{layout.query}", H * hd, d, rows=H)
        W_K = self.matrix(f"{stem}.{layout.key}", H_kv * hd, d, rows=H_kv)
        W_V = self.matrix(f"{stem}.{layout.value}", H_kv * hd, d)
        b_Q = self.bias(f"{stem}.{layout.query}", H * hd, arch.qkv_bias, rows=H)
        b_K = self.bias(f"{stem}.{layout.key}", H_kv * hd, arch.qkv_bias, rows=H_kv)
        b_V = self.bias(f"{stem}.{layout.value}", H_kv * hd, arch.qkv_bias)
        kernel = self.kernel(stem, index)
        mask = AttentionMask(causal=True, window=arch.windows[index], softcap=arch.attn_softcap)
        heads = []
        for h, g in enumerate(arch.groups):
            q, kv = slice(h * hd, (h + 1) * hd), slice(g * hd, (g + 1) * hd)
            heads.append(Head(W_Q[:, q], W_K[:, kv], W_V[:, kv], None if b_Q is None else b_Q[q],
                              None if b_K is None else b_K[kv], None if b_V is None else b_V[kv], kernel=kernel,
                              mask=mask, name=f"layer{index}.head{h}"))
        attention = Layer(tuple(heads), self.matrix(f"{stem}.{layout.output}", d, H * hd),
                          self.bias(f"{stem}.{layout.output}", d, arch.output_bias), groups=arch.groups)
        ff = arch.intermediate
        ffn = GatedFeedForward(self.matrix(f"{stem}.{layout.ffn_gate}", ff, d),
                               self.matrix(f"{stem}.{layout.ffn_in}", ff, d),
                               self.matrix(f"{stem}.{layout.ffn_out}", d, ff), act=arch.activation,
                               b_gate=self.bias(f"{stem}.{layout.ffn_gate}", ff, arch.mlp_bias),
                               b_up=self.bias(f"{stem}.{layout.ffn_in}", ff, arch.mlp_bias),
                               b_down=self.bias(f"{stem}.{layout.ffn_out}", d, arch.mlp_bias))
        return TransformerLayer(index, attention, ln_in=self.norm(f"{stem}.{layout.attention_norm}"),
                                ln_out=self.norm(layout.attention_out_norm and f"{stem}.{layout.attention_out_norm}"),
                                ffn=ffn, ffn_norm=self.norm(f"{stem}.{layout.ffn_norm}"),
                                ffn_out_norm=self.norm(layout.ffn_out_norm and f"{stem}.{layout.ffn_out_norm}"),
                                placement=layout.placement)

    def output(self, word: np.ndarray) -> np.ndarray:
        """The language-model head (vocab, d): the embedding table itself when tied."""
        key = f"{self.layout.lm_head}.weight"
        if not self.arch.tied:
            return self.tensors.tensor(key, (self.arch.vocab_size, self.arch.hidden))
        if key in self.tensors.keys() and not np.array_equal(self.tensors.get(key), word):
            raise WeightsError(f"{self.tensors.path}:{key}", "the embedding table (tie_word_embeddings is true)",
                               "a different matrix", "set tie_word_embeddings false in config.json, or drop lm_head")
        return word


def load_decoder(tensors: TensorSource, config: dict, layers=None, layout: Layout | None = None) -> Model:
    """Read a rotary decoder of one of the layouts of :mod:`.layouts` (see the module docstring).

    The model records ``metadata``: ``quantisation`` (GGUF: the bound is for the dequantised
    weights), ``tensor_types``, ``norm_gain`` (``"1 + w"`` for Gemma), ``tied_embeddings``,
    ``rope_rows`` (how llama.cpp's Q and K rows were read); Gemma 2's final logit soft-cap is
    ``Model.logit_softcap``.
    """
    found = [(m.group(1), int(m.group(2))) for m in map(layout.match, tensors.keys()) if m]
    prefixes = sorted({prefix for prefix, _ in found})
    if len(prefixes) > 1:
        raise WeightsError(str(tensors.path), "one model per file (a single name prefix)", f"prefixes {prefixes}",
                           "split the checkpoint, one model per file")
    prefix = prefixes[0]
    present = sorted({index for _, index in found})
    chosen = select_layers(present, layers)
    arch = decoder_architecture(layout, config, tensors, prefix, chosen[0])
    if max(present) >= arch.num_layers:
        raise WeightsError(f"{tensors.path}: num_hidden_layers", f"at least {max(present) + 1} layers (the tensors)",
                           str(arch.num_layers), _CONFIG_FIX)
    reader = _DecoderReader(tensors, layout, prefix, arch)
    word = tensors.tensor(f"{prefix}{layout.embeddings['word']}.weight", (arch.vocab_size, arch.hidden))
    loaded = {index: reader.layer(index) for index in chosen}
    metadata = dict(tensors.metadata)
    metadata.update({"norm_gain": layout.norm_gain, "tied_embeddings": arch.tied,
                     "head_dim": arch.head_dim, "num_key_value_heads": arch.num_kv_heads})
    if layout.rope_rows == "llama.cpp":
        metadata["rope_rows"] = "llama.cpp rows un-permuted to rotate-half" if arch.unpermute else \
            "llama.cpp rows kept, RoPE on interleaved pairs"
    if config.get("_name_or_path"):
        metadata["config_name_or_path"] = str(config["_name_or_path"])
    return Model(name=metadata.get("name") or tensors.path.name, layers=loaded, num_heads=arch.num_heads,
                 hidden=arch.hidden, source=metadata.get("source") or str(tensors.path),
                 licence=metadata.get("licence") or metadata.get("license") or config.get("license") or "unknown",
                 path=str(tensors.path), sha256=tensors.sha256,
                 embeddings=TokenEmbeddings(word, arch.embedding_scale), num_layers=arch.num_layers,
                 metadata=metadata, final_norm=reader.norm(f"{prefix}{layout.final_norm}"), decoder_only=True,
                 layout=layout.name, lm_head=reader.output(word), max_positions=arch.max_positions,
                 logit_softcap=arch.final_softcap)
