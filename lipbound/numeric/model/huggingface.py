"""Hugging Face BERT-family checkpoints (safetensors), read into a :class:`~.transformer.Model`.

Names (any common prefix such as ``bert.``)::

    embeddings.{word,position,token_type}_embeddings.weight, embeddings.LayerNorm.{weight,bias}
    encoder.layer.L.attention.self.{query,key,value}.{weight,bias}
    encoder.layer.L.attention.output.dense.{weight,bias}
    encoder.layer.L.attention.output.LayerNorm.{weight,bias}                  (ln_out)
    encoder.layer.L.intermediate.dense.{weight,bias}, encoder.layer.L.output.dense.{weight,bias}
    encoder.layer.L.output.LayerNorm.{weight,bias}                            (ffn_norm)

(``gamma``/``beta`` are accepted for old LayerNorm names).  An ``nn.Linear`` stores ``weight``
of shape (out, in), so ``W_Q = query.weight.T`` and head h is the column slice
``[:, h d_k:(h + 1) d_k]``; ``W_O = attention.output.dense.weight.T`` (H d_v, d).  The input of
layer L is ``embeddings.LayerNorm`` (L = 0) or ``encoder.layer.{L-1}.output.LayerNorm``.
Feed-forward blocks and embeddings are read when present; an attention-only extract loads too.
"""

from __future__ import annotations

import re

import numpy as np

from ...errors import WeightsError
from .components import FeedForward, Head, Layer, LayerNorm
from .files import TensorSource
from .transformer import Embeddings, Model, TransformerLayer

__all__ = ["is_bert", "load_bert"]

_QUERY = re.compile(r"^(.*?)encoder\.layer\.(\d+)\.attention\.self\.query\.weight$")
_EXPORT_FIX = ("export the full attention block (query, key, value, output dense) of each requested layer, "
               "or request other layers")


def is_bert(tensors: TensorSource) -> bool:
    return any(map(_QUERY.match, tensors.keys()))


def _layernorm(tensors: TensorSource, stem: str, d: int, eps: float) -> LayerNorm | None:
    for gain, bias in (("weight", "bias"), ("gamma", "beta")):
        g, b = f"{stem}.{gain}", f"{stem}.{bias}"
        if g in tensors.keys() or b in tensors.keys():
            tensors.require((g, b), f"the LayerNorm {stem}", "export both the gain and the bias")
            return LayerNorm(tensors.tensor(g, (d,)), tensors.tensor(b, (d,)), eps)
    return None


def select_layers(present: list[int], layers) -> list[int]:
    """The requested layer indices (all by default), checked against those in the file."""
    if layers is None:
        return present
    if isinstance(layers, int):
        layers = [layers]
    chosen = []
    for index in layers:
        if isinstance(index, bool) or not isinstance(index, int) or index not in present:
            raise WeightsError("layer", f"one of the layers in the file {present} (counted from 0)", repr(index),
                               f"pick from {present}")
        chosen.append(index)
    return sorted(set(chosen))


def num_heads_of(num_heads, config: dict, metadata: dict, path) -> int:
    """The head count: the argument, else ``num_attention_heads`` of config.json or the metadata."""
    for value, origin in ((num_heads, "--num-heads"), (config.get("num_attention_heads"), "config.json"),
                          (metadata.get("num_attention_heads"), "safetensors metadata")):
        if value is None:
            continue
        try:
            count = int(value)
        except (TypeError, ValueError):
            count = -1
        if count < 1 or isinstance(value, bool):
            raise WeightsError("--num-heads", f"a positive integer (from {origin})", repr(value),
                               "pass --num-heads 12 (for example)")
        return count
    raise WeightsError("--num-heads", "a head count: --num-heads, num_attention_heads in a config.json next to the "
                       "file, or in the safetensors metadata", f"none for {path}", "pass --num-heads N")


def load_bert(tensors: TensorSource, config: dict, num_heads=None, layers=None) -> Model:
    """Read a BERT-family checkpoint (see the module docstring)."""
    found = [(m.group(1), int(m.group(2))) for m in map(_QUERY.match, tensors.keys()) if m]
    prefixes = sorted({prefix for prefix, _ in found})
    if len(prefixes) > 1:
        raise WeightsError(str(tensors.path), "one model per file (a single name prefix)",
                           f"prefixes {prefixes}", "split the checkpoint, one model per file")
    prefix = prefixes[0]
    present = sorted({index for _, index in found})
    chosen = select_layers(present, layers)
    heads_count = num_heads_of(num_heads, config, tensors.metadata, tensors.path)
    position = config.get("position_embedding_type", "absolute")
    if position != "absolute":  # relative positions add terms to every score: another score function
        raise WeightsError(f"{tensors.path}: config.json position_embedding_type", "'absolute'", repr(position),
                           "lipbound's theorems cover attention whose scores depend on the tokens only; "
                           "relative position scores are not covered")
    eps = float(config.get("layer_norm_eps", tensors.metadata.get("layer_norm_eps", 1e-12)))
    first_key = f"{prefix}encoder.layer.{chosen[0]}.attention.self.query.weight"
    first = tensors.get(first_key)
    if first.ndim != 2:
        raise WeightsError(f"{tensors.path}:{first_key}", "a 2-d weight (out, in)", f"shape {first.shape}",
                           "check the checkpoint")
    width, d = first.shape
    if "hidden_size" in config and int(config["hidden_size"]) != d:
        raise WeightsError(str(tensors.path), f"hidden_size {config['hidden_size']} (config.json)",
                           f"query weights reading {d} features", "use the config.json of this checkpoint")
    if width % heads_count:
        raise WeightsError("--num-heads", f"a divisor of the attention width {width}", str(heads_count),
                           f"use the model's num_attention_heads ({width} = heads x head size)")
    size = width // heads_count
    act = str(config.get("hidden_act", "gelu"))

    def linear(stem: str, n_in: int, n_out: int):
        return tensors.tensor(f"{stem}.weight", (n_out, n_in)).T, tensors.tensor(f"{stem}.bias", (n_out,))

    loaded = {}
    for index in chosen:
        stem = f"{prefix}encoder.layer.{index}"
        att = f"{stem}.attention"
        names = [f"{att}.self.{p}.{t}" for p in ("query", "key", "value") for t in ("weight", "bias")]
        tensors.require(names + [f"{att}.output.dense.weight", f"{att}.output.dense.bias"], f"layer {index}",
                        _EXPORT_FIX)
        shapes = {part: tensors.get(f"{att}.self.{part}.weight").shape for part in ("query", "key", "value")}
        if len(set(shapes.values())) != 1:
            raise WeightsError(f"{tensors.path}:{att}.self", "query, key and value weights of one shape (out, in)",
                               ", ".join(f"{part} {shape}" for part, shape in shapes.items()),
                               "check the checkpoint: the three projections of a layer have the same shape")
        W, b = {}, {}
        for part in ("query", "key", "value"):
            W[part], b[part] = linear(f"{att}.self.{part}", d, width)
        heads = tuple(
            Head(W_Q=W["query"][:, cols], W_K=W["key"][:, cols], W_V=W["value"][:, cols],
                 b_Q=b["query"][cols], b_K=b["key"][cols], b_V=b["value"][cols], name=f"layer{index}.head{h}")
            for h in range(heads_count) for cols in [slice(h * size, (h + 1) * size)])
        W_O, b_O = linear(f"{att}.output.dense", width, d)
        feeding = f"{prefix}embeddings.LayerNorm" if index == 0 else f"{prefix}encoder.layer.{index - 1}.output.LayerNorm"
        ffn = None
        if f"{stem}.intermediate.dense.weight" in tensors.keys():
            d_ff = tensors.get(f"{stem}.intermediate.dense.weight").shape[0]
            if "intermediate_size" in config and int(config["intermediate_size"]) != d_ff:
                raise WeightsError(f"{tensors.path}:{stem}.intermediate.dense.weight",
                                   f"{config['intermediate_size']} rows (intermediate_size in config.json)",
                                   f"{d_ff} rows", "use the config.json of this checkpoint")
            W_1, b_1 = linear(f"{stem}.intermediate.dense", d, d_ff)
            W_2, b_2 = linear(f"{stem}.output.dense", d_ff, d)
            ffn = FeedForward(W_1, b_1, W_2, b_2, act)
        loaded[index] = TransformerLayer(index, Layer(heads, W_O, b_O), ln_in=_layernorm(tensors, feeding, d, eps),
                                         ln_out=_layernorm(tensors, f"{att}.output.LayerNorm", d, eps), ffn=ffn,
                                         ffn_norm=_layernorm(tensors, f"{stem}.output.LayerNorm", d, eps))
    embeddings = None
    word = f"{prefix}embeddings.word_embeddings.weight"
    if word in tensors.keys():
        vocab = tensors.get(word)
        positions = tensors.tensor(f"{prefix}embeddings.position_embeddings.weight")
        types = tensors.tensor(f"{prefix}embeddings.token_type_embeddings.weight")
        norm = _layernorm(tensors, f"{prefix}embeddings.LayerNorm", d, eps)
        if vocab.ndim != 2 or vocab.shape[1] != d or norm is None or not np.all(np.isfinite(vocab)):
            raise WeightsError(f"{tensors.path}:{word}", f"a (vocab, {d}) table and the embedding LayerNorm",
                               f"shape {vocab.shape} (finite: {bool(np.all(np.isfinite(vocab)))})",
                               "use a complete BERT checkpoint")
        # RoBERTa counts positions from padding_idx + 1
        offset = int(config.get("pad_token_id", 0)) + 1 if config.get("model_type") in ("roberta", "xlm-roberta") else 0
        embeddings = Embeddings(vocab, positions, types, norm, offset)  # the table keeps its stored precision
    metadata = tensors.metadata
    return Model(name=metadata.get("name") or config.get("_name_or_path") or tensors.path.stem, layers=loaded,
                 num_heads=heads_count, hidden=d, source=metadata.get("source") or str(tensors.path),
                 licence=metadata.get("licence") or metadata.get("license") or config.get("license") or "unknown",
                 path=str(tensors.path), sha256=tensors.sha256, embeddings=embeddings,
                 num_layers=int(config.get("num_hidden_layers", max(present) + 1)), metadata=dict(metadata))
