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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import final

__all__ = ["Layout", "LAYOUTS", "BERT", "DISTILBERT", "VIT", "GPT2", "supported_layouts"]


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

#: Every Hugging Face layout, in the order they are tried.
LAYOUTS = (BERT, DISTILBERT, VIT, GPT2)


def supported_layouts() -> str:
    """One phrase listing every layout lipbound reads, with the tensor name that marks each."""
    def example(layout: Layout) -> str:
        return layout.marker.strip("^$").replace("(.*?)", "").replace(r"(\d+)", "N").replace("\\.", ".")
    return ", ".join(f"{layout.label or layout.name} ({example(layout)})" for layout in LAYOUTS) + \
        ", CTranslate2 Whisper (model.bin), the plain lipbound .npz"
