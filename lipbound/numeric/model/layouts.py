"""The Hugging Face checkpoint layouts lipbound reads, each declared once as data.

A :class:`Layout` names the tensors of one layer (relative to the layer's stem, e.g.
``encoder.layer.3``), how projections are stored, where the LayerNorms sit and which
config.json keys hold the head count, the width, the LayerNorm epsilon and the activation.
:mod:`.huggingface` reads any of them into the one model description.

Orientation of a stored projection with input x (a row) and output y:

* ``"linear"`` (``torch.nn.Linear``): ``weight`` has shape (out, in) and ``y = x weight^T + bias``;
* ``"conv1d"`` (GPT-2's ``Conv1D``): ``weight`` has shape (in, out) and ``y = x weight + bias``.

=============  =========================================  ========  ======  ==========================
layout         per-layer stem                             norms     mask    projections
=============  =========================================  ========  ======  ==========================
BERT family    ``encoder.layer.N.attention.self.query``   post-LN   none    linear, separate Q, K, V
DistilBERT     ``transformer.layer.N.attention.q_lin``    post-LN   none    linear, separate Q, K, V
ViT            ``encoder.layer.N.attention.attention``    pre-LN    none    linear, separate Q, K, V
GPT-2          ``h.N.attn.c_attn``                        pre-LN    causal  conv1d, fused [Q | K | V]
=============  =========================================  ========  ======  ==========================

(any common prefix, e.g. ``bert.``, ``roberta.``, ``distilbert.``, ``vit.``, ``transformer.``).

Decoders with rotary positions (``positions="rotary"``, read by :mod:`.decoders`) share one
per-layer stem, ``model.layers.N``; config.json's ``model_type`` tells them apart (a GGUF file's
``general.architecture``).  Every one is causal, with RMSNorm and a gated feed-forward block
``act(x W_gate) * (x W_up) W_down``:

============  ==========  ===========================================================================
layout        placement   what differs (Hugging Face ``modeling_<type>.py``)
============  ==========  ===========================================================================
Llama         pre         SwiGLU; optional biases (``attention_bias``, ``mlp_bias``)
Mistral       pre         as Llama, ``sliding_window`` on every layer
Qwen2         pre         biases on Q, K, V (none on the output); sliding window on layers
                          ``>= max_window_layers`` when ``use_sliding_window``
Qwen3         pre         as Qwen2 without the biases, and QK-norm (RMSNorm of each head's q and k)
Gemma 2       sandwich    gains ``1 + w``; embeddings times ``sqrt(d)``; GeGLU; scores scaled by
                          ``query_pre_attn_scalar^-1/2`` and soft-capped; sliding window on even
                          layers; final logits soft-capped
Gemma 3       sandwich    as Gemma 2 with QK-norm and no soft-caps; one layer in
                          ``sliding_window_pattern`` global, the others local with their own
                          RoPE base (``rope_local_base_freq``)
Llama (GGUF)  pre         llama.cpp's names (``blk.N.attn_q``, ...); its Q and K rows permuted
                          for RoPE on interleaved pairs (``rope_rows="llama.cpp"``)
============  ==========  ===========================================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import final

__all__ = ["Layout", "LAYOUTS", "BERT", "DISTILBERT", "VIT", "GPT2", "LLAMA", "MISTRAL", "QWEN2", "QWEN3", "GEMMA2",
           "GEMMA3", "LLAMA_GGUF", "supported_layouts"]


@final
@dataclass(frozen=True)
class Layout:
    """The tensor names and conventions of one checkpoint layout.

    Parameters
    ----------
    name : str
    marker : str
        A regular expression matching one tensor per layer; group 1 is the prefix, group 2
        the layer index.  It identifies the layout.
    stem : str
        The stem of layer N, relative to the prefix (``{index}`` is replaced).
    block : {"encoder", "decoder"}
        The stack the layers form (a decoder-only model's is ``"decoder"``).
    placement : {"post", "pre"}
    orientation : {"linear", "conv1d"}
    query, key, value : str or None
        Stems of the separate projections (relative to the layer stem).
    fused : str or None
        Stem of a fused ``[Q | K | V]`` projection (output width 3 d).
    output : str
        Stem of the output projection ``W_O``.
    attention_norm : str or None
        pre-LN: the LayerNorm the attention reads; post-LN: the one after its residual sum.
    ffn_in, ffn_out : str
        Stems of the feed-forward projections.
    ffn_norm : str
        pre-LN: the LayerNorm the feed-forward block reads; post-LN: the one after its residual
        sum (which feeds the next layer's attention).
    embedding_norm : str or None
        post-LN: the LayerNorm feeding layer 0 (relative to the prefix).
    final_norm : str or None
        pre-LN: the LayerNorm after the last layer (relative to the prefix).
    causal : bool
    heads_keys, width_keys, eps_keys, act_keys : tuple of str
        config.json keys, first found wins.
    eps_default : float
    act_default : str
    embeddings : dict or None
        Token embeddings read into :class:`~.transformer.Embeddings` (stems relative to the prefix).
    label : str
        How error messages name the family (default: ``name``).

    The decoders with rotary positions add:

    positions : {"absolute", "rotary"}
        ``"rotary"``: RoPE in the scores, no position table (read by :mod:`.decoders`).
    model_types : tuple of str
        The config.json ``model_type`` values (GGUF: ``general.architecture``) this layout reads;
        layouts sharing a marker are told apart by them.
    norm : {"layernorm", "rmsnorm"}
    norm_gain : {"w", "1 + w"}
        How a stored RMSNorm weight w becomes the gain (Gemma stores ``gamma - 1``).
    ffn_gate : str or None
        Stem of the gate of a gated feed-forward block; ``ffn_in`` is then its up projection.
    attention_out_norm, ffn_out_norm : str or None
        The sandwich norms on the attention's and the feed-forward block's outputs.
    query_norm, key_norm : str or None
        QK-norm: the RMSNorms over each head's query and key.
    lm_head : str or None
        The output projection to the vocabulary, relative to the checkpoint's root (absent when
        the embeddings are tied).
    rope_rows : {"half", "llama.cpp"}
        ``"llama.cpp"``: the Q and K rows of each head are stored permuted so that RoPE on pairs
        (2t, 2t + 1) equals Hugging Face's rotate-half on the original rows.
    windows : {"none", "all", "qwen", "alternate", "pattern"}
        Which layers attend through a sliding window when config.json has no ``layer_types``:
        none; all (Mistral); those ``>= max_window_layers`` with ``use_sliding_window`` (Qwen);
        the even ones (Gemma 2); all but every ``sliding_window_pattern``-th (Gemma 3).
    qkv_bias : {"config", "always"}
        Biases on Q, K, V (and the output): as config.json's ``attention_bias`` says, or always
        on Q, K, V and never on the output (Qwen2).
    embedding_scale : {"1", "sqrt(d)"}
    local_rope_key : str or None
        config.json key of the RoPE base of sliding-window layers (Gemma 3).
    defaults : tuple of (str, value)
        The defaults of the family's configuration class, for keys a config.json leaves out.
    """

    name: str
    marker: str
    stem: str
    block: str
    placement: str
    orientation: str
    output: str
    ffn_in: str
    ffn_out: str
    ffn_norm: str
    query: str | None = None
    key: str | None = None
    value: str | None = None
    fused: str | None = None
    attention_norm: str | None = None
    embedding_norm: str | None = None
    final_norm: str | None = None
    causal: bool = False
    heads_keys: tuple = ("num_attention_heads",)
    width_keys: tuple = ("hidden_size",)
    eps_keys: tuple = ("layer_norm_eps",)
    eps_default: float = 1e-12
    act_keys: tuple = ("hidden_act",)
    act_default: str = "gelu"
    embeddings: dict | None = None
    label: str = ""
    positions: str = "absolute"
    model_types: tuple = ()
    norm: str = "layernorm"
    norm_gain: str = "w"
    ffn_gate: str | None = None
    attention_out_norm: str | None = None
    ffn_out_norm: str | None = None
    query_norm: str | None = None
    key_norm: str | None = None
    lm_head: str | None = None
    rope_rows: str = "half"
    windows: str = "none"
    qkv_bias: str = "config"
    embedding_scale: str = "1"
    local_rope_key: str | None = None
    defaults: tuple = ()

    def match(self, key: str):
        return re.match(self.marker, key)

    def layer_stem(self, prefix: str, index: int) -> str:
        return prefix + self.stem.format(index=index)

    def config_value(self, config: dict, keys: tuple, default=None):
        """The first of ``keys`` present in ``config`` (``(value, key)``), else ``(default, None)``."""
        for key in keys:
            if config.get(key) is not None:
                return config[key], key
        return default, None


BERT = Layout(
    name="BERT", marker=r"^(.*?)encoder\.layer\.(\d+)\.attention\.self\.query\.weight$", stem="encoder.layer.{index}",
    block="encoder", placement="post", orientation="linear", query="attention.self.query",
    key="attention.self.key", value="attention.self.value", output="attention.output.dense",
    attention_norm="attention.output.LayerNorm", ffn_in="intermediate.dense", ffn_out="output.dense",
    ffn_norm="output.LayerNorm", embedding_norm="embeddings.LayerNorm", label="BERT/RoBERTa",
    embeddings={"word": "embeddings.word_embeddings", "position": "embeddings.position_embeddings",
                "token_type": "embeddings.token_type_embeddings", "norm": "embeddings.LayerNorm"})

DISTILBERT = Layout(
    name="DistilBERT", marker=r"^(.*?)transformer\.layer\.(\d+)\.attention\.q_lin\.weight$",
    stem="transformer.layer.{index}", block="encoder", placement="post", orientation="linear",
    query="attention.q_lin", key="attention.k_lin", value="attention.v_lin", output="attention.out_lin",
    attention_norm="sa_layer_norm", ffn_in="ffn.lin1", ffn_out="ffn.lin2", ffn_norm="output_layer_norm",
    embedding_norm="embeddings.LayerNorm", heads_keys=("n_heads",), width_keys=("dim",), eps_keys=(),
    act_keys=("activation",),
    embeddings={"word": "embeddings.word_embeddings", "position": "embeddings.position_embeddings",
                "token_type": None, "norm": "embeddings.LayerNorm"})

VIT = Layout(
    name="ViT", marker=r"^(.*?)encoder\.layer\.(\d+)\.attention\.attention\.query\.weight$",
    stem="encoder.layer.{index}", block="encoder", placement="pre", orientation="linear",
    query="attention.attention.query", key="attention.attention.key", value="attention.attention.value",
    output="attention.output.dense", attention_norm="layernorm_before", ffn_in="intermediate.dense",
    ffn_out="output.dense", ffn_norm="layernorm_after", final_norm="layernorm")

GPT2 = Layout(
    name="GPT-2", marker=r"^(.*?)h\.(\d+)\.attn\.c_attn\.weight$", stem="h.{index}", block="decoder",
    placement="pre", orientation="conv1d", fused="attn.c_attn", output="attn.c_proj", attention_norm="ln_1",
    ffn_in="mlp.c_fc", ffn_out="mlp.c_proj", ffn_norm="ln_2", final_norm="ln_f", causal=True,
    heads_keys=("n_head", "num_attention_heads"), width_keys=("n_embd", "hidden_size"),
    eps_keys=("layer_norm_epsilon",), eps_default=1e-5, act_keys=("activation_function",), act_default="gelu_new")

_DECODER = dict(
    marker=r"^(.*?)layers\.(\d+)\.self_attn\.q_proj\.weight$", stem="layers.{index}", block="decoder",
    placement="pre", orientation="linear", positions="rotary", causal=True, norm="rmsnorm",
    query="self_attn.q_proj", key="self_attn.k_proj", value="self_attn.v_proj", output="self_attn.o_proj",
    attention_norm="input_layernorm", ffn_norm="post_attention_layernorm", ffn_gate="mlp.gate_proj",
    ffn_in="mlp.up_proj", ffn_out="mlp.down_proj", final_norm="norm", embeddings={"word": "embed_tokens"},
    lm_head="lm_head", eps_keys=("rms_norm_eps",), eps_default=1e-6, act_default="silu")
_GEMMA = dict(_DECODER, placement="sandwich", norm_gain="1 + w", attention_out_norm="post_attention_layernorm",
              ffn_norm="pre_feedforward_layernorm", ffn_out_norm="post_feedforward_layernorm",
              embedding_scale="sqrt(d)", act_keys=("hidden_activation", "hidden_act"), act_default="gelu_pytorch_tanh")

_QWEN_DEFAULTS = (("rope_theta", 10000.0), ("tie_word_embeddings", False), ("use_sliding_window", False),
                  ("sliding_window", 4096), ("max_window_layers", 28))
LLAMA = Layout(name="Llama", model_types=("llama",), **_DECODER,
               defaults=(("rope_theta", 10000.0), ("tie_word_embeddings", False)))
MISTRAL = Layout(name="Mistral", model_types=("mistral",), windows="all", **_DECODER,
                 defaults=(("rope_theta", 10000.0), ("tie_word_embeddings", False), ("sliding_window", 4096)))
QWEN2 = Layout(name="Qwen2", model_types=("qwen2",), windows="qwen", qkv_bias="always", **_DECODER,
               defaults=_QWEN_DEFAULTS)
QWEN3 = Layout(name="Qwen3", model_types=("qwen3",), windows="qwen", query_norm="self_attn.q_norm",
               key_norm="self_attn.k_norm", **_DECODER, defaults=_QWEN_DEFAULTS)
GEMMA2 = Layout(name="Gemma 2", model_types=("gemma2",), windows="alternate", **_GEMMA,
                defaults=(("rope_theta", 10000.0), ("tie_word_embeddings", True), ("sliding_window", 4096),
                          ("query_pre_attn_scalar", 256), ("attn_logit_softcapping", 50.0),
                          ("final_logit_softcapping", 30.0)))
GEMMA3 = Layout(name="Gemma 3", model_types=("gemma3_text",), windows="pattern", query_norm="self_attn.q_norm",
                key_norm="self_attn.k_norm", local_rope_key="rope_local_base_freq", **_GEMMA,
                defaults=(("rope_theta", 1e6), ("rope_local_base_freq", 10000.0), ("tie_word_embeddings", True),
                          ("sliding_window", 4096), ("sliding_window_pattern", 6), ("query_pre_attn_scalar", 256)))
LLAMA_GGUF = Layout(
    name="Llama (GGUF)", model_types=("llama",), marker=r"^()blk\.(\d+)\.attn_q\.weight$", stem="blk.{index}",
    block="decoder", placement="pre", orientation="linear", positions="rotary", causal=True, norm="rmsnorm",
    query="attn_q", key="attn_k", value="attn_v", output="attn_output", attention_norm="attn_norm",
    ffn_norm="ffn_norm", ffn_gate="ffn_gate", ffn_in="ffn_up", ffn_out="ffn_down", final_norm="output_norm",
    embeddings={"word": "token_embd"}, lm_head="output", rope_rows="llama.cpp", eps_keys=("rms_norm_eps",),
    eps_default=1e-5, act_default="silu", label="GGUF llama", defaults=(("rope_theta", 10000.0),))

#: Every layout, in the order they are tried (layouts sharing a marker are chosen by model_type).
LAYOUTS = (BERT, DISTILBERT, VIT, GPT2, LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA2, GEMMA3, LLAMA_GGUF)


def supported_layouts() -> str:
    """One phrase listing every layout lipbound reads, with the tensor name that marks each."""
    def example(layout: Layout) -> str:
        return (layout.marker.strip("^$").replace("(.*?)", "").replace("()", "").replace(r"(\d+)", "N")
                .replace("\\.", "."))
    return ", ".join(f"{layout.label or layout.name} ({example(layout)}"
                     + (f", model_type {'/'.join(layout.model_types)}" if layout.model_types else "") + ")"
                     for layout in LAYOUTS) + ", CTranslate2 Whisper (model.bin), the plain lipbound .npz"
