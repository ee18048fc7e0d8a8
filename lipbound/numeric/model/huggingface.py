"""Hugging Face checkpoints (safetensors), read into a :class:`~.transformer.Model` by their layout.

The layouts (BERT/RoBERTa, DistilBERT, ViT, GPT-2) are declared in :mod:`.layouts`; this module
reads any of them.  Projections become the row convention of :mod:`.components`:
``W = weight.T`` for ``nn.Linear`` (weight (out, in)), ``W = weight`` for GPT-2's ``Conv1D``
(weight (in, out)); head h is the column slice ``[:, h d_k:(h + 1) d_k]`` of each of ``W_Q``,
``W_K``, ``W_V`` (of the first, second and third thirds of a fused ``[Q | K | V]``), and
``W_O`` (H d_v, d) takes the concatenated heads.

The LayerNorm that feeds each attention fixes its input domain: post-LN (BERT, DistilBERT), the
embedding LayerNorm for layer 0 and the previous layer's output LayerNorm after; pre-LN (ViT,
GPT-2), the layer's own ``layernorm_before`` / ``ln_1``.  A pre-LN stack's final LayerNorm
(``layernorm``, ``ln_f``) is kept as :attr:`Model.final_norm`.  Feed-forward blocks and
embeddings are read when present; an attention-only extract loads too.
"""

from __future__ import annotations

import os

import numpy as np

from ...errors import WeightsError
from ..kernels import AttentionMask
from .components import FeedForward, Head, Layer, LayerNorm
from .files import TensorSource
from .layouts import BERT, LAYOUTS, Layout
from .transformer import Embeddings, Model, TransformerLayer

__all__ = ["layout_of", "load_huggingface", "select_layers", "num_heads_of"]

_EXPORT_FIX = ("export the full attention block (query, key, value, output projection) of each requested layer, "
               "or request other layers")
#: config.json model types that count positions from padding_idx + 1
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")
#: config.json model_type -> the name reports use (BERT-family checkpoints share one layout)
_FAMILY_NAMES = {"roberta": "RoBERTa", "xlm-roberta": "XLM-RoBERTa", "camembert": "CamemBERT", "bert": "BERT"}


def layout_of(tensors: TensorSource, config: dict | None = None) -> Layout | None:
    """The first layout whose marker tensor the checkpoint holds, or None; layouts sharing a
    marker (the rotary decoders) are told apart by config.json's ``model_type``.

    Raises
    ------
    WeightsError
        The tensors are those of a rotary decoder whose ``model_type`` no layout reads.
    """
    keys = tensors.keys()
    matching = [layout for layout in LAYOUTS if any(map(layout.match, keys))]
    if not matching or not matching[0].model_types:
        return matching[0] if matching else None
    model_type = str((config or {}).get("model_type", ""))
    chosen = next((layout for layout in matching if model_type in layout.model_types), None)
    if chosen is None:
        known = ", ".join(f"{t} ({layout.name})" for layout in matching for t in layout.model_types)
        where = "GGUF general.architecture" if tensors.kind == "gguf" else "config.json model_type"
        raise WeightsError(f"{tensors.path}: {where}", f"one of {known}", repr(model_type) if model_type else "none",
                           "lipbound reads these decoder families; put the checkpoint's config.json beside it, or "
                           "convert the model to one of them")
    return chosen


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


def num_heads_of(num_heads, config: dict, metadata: dict, path, keys: tuple = ("num_attention_heads",)) -> int:
    """The head count: the argument, else the config.json key (``keys``) or the metadata."""
    candidates = [(num_heads, "--num-heads")] + [(config.get(key), f"{key} in config.json") for key in keys]
    candidates.append((metadata.get("num_attention_heads"), "safetensors metadata"))
    for value, origin in candidates:
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
    raise WeightsError("--num-heads", f"a head count: --num-heads, {keys[0]} in a config.json next to the "
                       "file, or num_attention_heads in the safetensors metadata", f"none for {path}",
                       "pass --num-heads N")


def _check_config(layout: Layout, config: dict, path) -> None:
    """Refuse configurations whose attention is not the map the layout's heads describe."""
    position = config.get("position_embedding_type", "absolute")
    if position != "absolute":  # relative positions add terms to every score: another score function
        raise WeightsError(f"{path}: config.json position_embedding_type", "'absolute'", repr(position),
                           "lipbound's theorems cover attention whose scores depend on the tokens only; "
                           "relative position scores are not covered")
    if layout.orientation == "conv1d":
        if config.get("scale_attn_weights", True) is not True:
            raise WeightsError(f"{path}: config.json scale_attn_weights", "true (scores divided by sqrt(d_k))",
                               repr(config["scale_attn_weights"]),
                               "lipbound's dot-product heads divide by sqrt(d_k); rescale W_Q and write the plain "
                               ".npz format (docs/formats.md)")
        if config.get("scale_attn_by_inverse_layer_idx", False):
            raise WeightsError(f"{path}: config.json scale_attn_by_inverse_layer_idx", "false", "true",
                               "fold 1 / (layer + 1) into W_Q and b_Q and write the plain .npz format "
                               "(docs/formats.md)")


def _widths(tensors: TensorSource, layout: Layout, stem: str) -> tuple[int, int]:
    """``(inputs, outputs)`` of the stored projection ``stem``."""
    shape = tensors.get(f"{stem}.weight").shape
    if len(shape) != 2:
        raise WeightsError(f"{tensors.path}:{stem}.weight", "a 2-d weight", f"shape {shape}", "check the checkpoint")
    return (shape[0], shape[1]) if layout.orientation == "conv1d" else (shape[1], shape[0])


class _Reader:
    """Reads the tensors of one layout and prefix, in the row convention."""

    def __init__(self, tensors: TensorSource, layout: Layout, prefix: str, d: int, eps: float):
        self.tensors, self.layout, self.prefix, self.d, self.eps = tensors, layout, prefix, d, eps

    def projection(self, stem: str, n_in: int, n_out: int, bias: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` with ``y = x W + b``, ``W`` of shape (n_in, n_out); ``b = 0`` when ``bias`` is False."""
        b = self.tensors.tensor(f"{stem}.bias", (n_out,)) if bias else np.zeros(n_out)
        if self.layout.orientation == "conv1d":
            return self.tensors.tensor(f"{stem}.weight", (n_in, n_out)), b
        return self.tensors.tensor(f"{stem}.weight", (n_out, n_in)).T, b

    def norm(self, stem: str | None) -> LayerNorm | None:
        return None if stem is None else _layernorm(self.tensors, stem, self.d, self.eps)

    def qkv(self, stem: str, width: int, bias: bool = True) -> dict:
        """``{"query": (W, b), "key": ..., "value": ...}`` of a layer (zero biases unless ``bias``)."""
        layout, tensors = self.layout, self.tensors
        if layout.fused is not None:
            fused = f"{stem}.{layout.fused}"
            W, b = self.projection(fused, self.d, 3 * width, bias)
            return {part: (W[:, i * width:(i + 1) * width], b[i * width:(i + 1) * width])
                    for i, part in enumerate(("query", "key", "value"))}
        stems = {part: f"{stem}.{getattr(layout, part)}" for part in ("query", "key", "value")}
        shapes = {part: tensors.get(f"{s}.weight").shape for part, s in stems.items()}
        if len(set(shapes.values())) != 1:
            common = os.path.commonprefix(list(stems.values())).rstrip(".")
            raise WeightsError(f"{tensors.path}:{common}", "query, key and value weights of one shape",
                               ", ".join(f"{part} {shape}" for part, shape in shapes.items()),
                               "check the checkpoint: the three projections of a layer have the same shape")
        return {part: self.projection(s, self.d, width, bias) for part, s in stems.items()}

    def ffn(self, stem: str, act: str, config: dict) -> FeedForward | None:
        first = f"{stem}.{self.layout.ffn_in}"
        if f"{first}.weight" not in self.tensors.keys():
            return None
        d_ff = _widths(self.tensors, self.layout, first)[1]
        for key in ("intermediate_size", "hidden_dim", "n_inner"):
            if config.get(key) is not None and int(config[key]) != d_ff:
                raise WeightsError(f"{self.tensors.path}:{first}.weight", f"{config[key]} outputs ({key} in config.json)",
                                   f"{d_ff} outputs", "use the config.json of this checkpoint")
        W_1, b_1 = self.projection(first, self.d, d_ff)
        W_2, b_2 = self.projection(f"{stem}.{self.layout.ffn_out}", d_ff, self.d)
        return FeedForward(W_1, b_1, W_2, b_2, act)

    def embeddings(self, config: dict, model_type: str) -> Embeddings | None:
        names = self.layout.embeddings
        if names is None or f"{self.prefix}{names['word']}.weight" not in self.tensors.keys():
            return None
        word_key = f"{self.prefix}{names['word']}.weight"
        vocab = self.tensors.get(word_key)
        positions = self.tensors.tensor(f"{self.prefix}{names['position']}.weight")
        types = None if names["token_type"] is None else \
            self.tensors.tensor(f"{self.prefix}{names['token_type']}.weight")
        norm = self.norm(f"{self.prefix}{names['norm']}")
        if vocab.ndim != 2 or vocab.shape[1] != self.d or norm is None or not np.all(np.isfinite(vocab)):
            raise WeightsError(f"{self.tensors.path}:{word_key}", f"a (vocab, {self.d}) table and the embedding "
                               "LayerNorm", f"shape {vocab.shape} (finite: {bool(np.all(np.isfinite(vocab)))})",
                               "use a complete checkpoint")
        offset = int(config.get("pad_token_id", 0)) + 1 if model_type in _OFFSET_POSITIONS else 0
        return Embeddings(vocab, positions, types, norm, offset)  # the table keeps its stored precision


def load_huggingface(tensors: TensorSource, config: dict, num_heads=None, layers=None,
                     layout: Layout | None = None) -> Model:
    """Read a checkpoint of one of the layouts of :mod:`.layouts` (see the module docstring)."""
    layout = layout or layout_of(tensors, config)
    if layout is None:
        raise WeightsError(str(tensors.path), "a Hugging Face layout", "none recognised", "see docs/formats.md")
    found = [(m.group(1), int(m.group(2))) for m in map(layout.match, tensors.keys()) if m]
    prefixes = sorted({prefix for prefix, _ in found})
    if len(prefixes) > 1:
        raise WeightsError(str(tensors.path), "one model per file (a single name prefix)",
                           f"prefixes {prefixes}", "split the checkpoint, one model per file")
    prefix = prefixes[0]
    present = sorted({index for _, index in found})
    chosen = select_layers(present, layers)
    heads_count = num_heads_of(num_heads, config, tensors.metadata, tensors.path, layout.heads_keys)
    _check_config(layout, config, tensors.path)
    eps_value, _ = layout.config_value(config, layout.eps_keys, tensors.metadata.get("layer_norm_eps",
                                                                                     layout.eps_default))
    act = str(layout.config_value(config, layout.act_keys, layout.act_default)[0])
    # the width d and the attention width, from the first layer's query projection
    d, width = _widths(tensors, layout, f"{layout.layer_stem(prefix, chosen[0])}.{layout.fused or layout.query}")
    width //= 3 if layout.fused else 1
    stated, key = layout.config_value(config, layout.width_keys)
    if stated is not None and int(stated) != d:
        raise WeightsError(str(tensors.path), f"{key} {stated} (config.json)", f"projections reading {d} features",
                           "use the config.json of this checkpoint")
    if width % heads_count:
        raise WeightsError("--num-heads", f"a divisor of the attention width {width}", str(heads_count),
                           f"use the model's head count ({width} = heads x head size)")
    size = width // heads_count
    reader = _Reader(tensors, layout, prefix, d, float(eps_value))
    qkv_bias = config.get("qkv_bias", True) is not False  # ViT's option: projections without bias
    loaded = {}
    for index in chosen:
        stem = layout.layer_stem(prefix, index)
        parts = [layout.fused] if layout.fused else [layout.query, layout.key, layout.value]
        tensors.require([f"{stem}.{part}.weight" for part in parts + [layout.output]]
                        + [f"{stem}.{part}.bias" for part in parts if qkv_bias] + [f"{stem}.{layout.output}.bias"],
                        f"layer {index}", _EXPORT_FIX)
        projections = reader.qkv(stem, width, qkv_bias)
        (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (projections[p] for p in ("query", "key", "value"))
        heads = tuple(Head(W_Q=W_Q[:, cols], W_K=W_K[:, cols], W_V=W_V[:, cols], b_Q=b_Q[cols], b_K=b_K[cols],
                           b_V=b_V[cols], mask=AttentionMask(causal=layout.causal), name=f"layer{index}.head{h}")
                      for h in range(heads_count) for cols in [slice(h * size, (h + 1) * size)])
        W_O, b_O = reader.projection(f"{stem}.{layout.output}", width, d)
        if layout.placement == "pre":
            ln_in, ln_out = reader.norm(f"{stem}.{layout.attention_norm}"), None
        else:
            feeding = f"{prefix}{layout.embedding_norm}" if index == 0 else \
                f"{layout.layer_stem(prefix, index - 1)}.{layout.ffn_norm}"
            ln_in, ln_out = reader.norm(feeding), reader.norm(f"{stem}.{layout.attention_norm}")
        loaded[index] = TransformerLayer(index, Layer(heads, W_O, b_O), ln_in=ln_in, ln_out=ln_out,
                                         ffn=reader.ffn(stem, act, config),
                                         ffn_norm=reader.norm(f"{stem}.{layout.ffn_norm}"),
                                         placement=layout.placement)
    model_type = str(config.get("model_type", ""))
    name = _FAMILY_NAMES.get(model_type, layout.name) if layout is BERT else layout.name
    metadata = dict(tensors.metadata)
    if config.get("_name_or_path"):
        metadata["config_name_or_path"] = str(config["_name_or_path"])  # the base model, for information
    return Model(name=metadata.get("name") or tensors.path.name, layers=loaded, num_heads=heads_count, hidden=d,
                 source=metadata.get("source") or str(tensors.path),
                 licence=metadata.get("licence") or metadata.get("license") or config.get("license") or "unknown",
                 path=str(tensors.path), sha256=tensors.sha256, embeddings=reader.embeddings(config, model_type),
                 num_layers=int(layout.config_value(config, ("num_hidden_layers", "n_layer", "n_layers"),
                                                    max(present) + 1)[0]),
                 metadata=metadata, final_norm=None if layout.final_norm is None else
                 reader.norm(f"{prefix}{layout.final_norm}"), decoder_only=layout.block == "decoder", layout=name)
