"""The plain ``.npz`` format: every model lipbound reads, as plain arrays any numpy can read.

One array per key, read with ``allow_pickle=False`` (``{B}`` is a stack, ``encoder.`` or
``decoder.``)::

    format                        "lipbound-plain-v2"
    name, source, licence, layout 0-d strings (layout: the checkpoint layout it came from)
    source_sha256                 0-d string, optional: sha256 of the checkpoint it was converted from
    num_heads, hidden             0-d ints
    blocks                        0-d string: "encoder" (default), "decoder" (decoder-only) or "encoder,decoder"
    {B}layer{L}.head{h}.W_Q   (d, d_k)     {B}layer{L}.head{h}.b_Q   (d_k,)
    {B}layer{L}.head{h}.W_K   (d, d_k)     {B}layer{L}.head{h}.b_K   (d_k,)
    {B}layer{L}.head{h}.W_V   (d, d_v)     {B}layer{L}.head{h}.b_V   (d_v,)
    {B}layer{L}.head{h}.score        0-d string, optional: "dot" (default), "l2", "cosine"
    {B}layer{L}.head{h}.tau, .eps    0-d floats, optional (cosine; default 1)
    {B}layer{L}.head{h}.causal       0-d bool, optional (default False)
    {B}layer{L}.head{h}.kim_values   0-d bool, optional (L2 values through A; default False)
    {B}layer{L}.W_O           (H d_v, d)   {B}layer{L}.b_O           (d,)
    {B}layer{L}.placement     0-d string, optional: "post" (default) or "pre"
    {B}layer{L}.ln_in.gamma, .beta (d,), .eps 0-d   optional; likewise ln_out, ffn_norm, cross_norm
    {B}layer{L}.ffn.W_1 (d, d_ff), .b_1, .W_2 (d_ff, d), .b_2, .act (0-d string)   optional
    {B}layer{L}.cross.head{h}.*, {B}layer{L}.cross.W_O, .b_O   optional: cross-attention (as a layer's heads)
    {B}final_norm.gamma, .beta, .eps                             optional: the stack's final LayerNorm
    {B}num_layers             0-d int, optional: layers of the stack (the file may hold some of them)

Version 1 files (``"lipbound-plain-v1"``: no ``{B}`` prefix, one encoder stack, no cross-attention)
are read too.  Matrices are stored as the model applies them (``W = weight.T``, tokens as rows).
It is the escape hatch for layouts lipbound does not read: write the arrays with numpy and load
them; :func:`save_plain` (``lipbound convert``) writes it from any loaded model.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ...io import atomic_write
from .components import FeedForward, Head, Layer, LayerNorm
from .files import TensorSource
from .huggingface import select_layers
from .transformer import BLOCKS, Model, TransformerLayer

__all__ = ["PLAIN_FORMAT", "load_plain", "save_plain", "attention_arrays", "attention_from_arrays"]

PLAIN_FORMAT = "lipbound-plain-v2"
_FORMATS = ("lipbound-plain-v1", PLAIN_FORMAT)
_FIX = "write the file with lipbound.numeric.model.save_plain (or follow the plain format in docs/formats.md)"
_NORMS = ("ln_in", "ln_out", "ffn_norm", "cross_norm")
_HEAD_ARRAYS = ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")


def _scalar(tensors: TensorSource, key: str, kind: type, default=None):
    if key not in tensors.keys():
        if default is None:
            tensors.require([key], "the plain format header", _FIX)
        return default
    value = tensors.get(key)
    if value.shape != ():
        raise WeightsError(f"{tensors.path}:{key}", "a 0-d array (a scalar)", f"shape {value.shape}", _FIX)
    try:
        item = value.item()
        if kind is bool and not isinstance(item, (bool, np.bool_)):
            raise TypeError
        return kind(item)
    except (TypeError, ValueError):
        raise WeightsError(f"{tensors.path}:{key}", f"a {kind.__name__}", repr(value.item()), _FIX) from None


def _width(tensors: TensorSource, key: str, d: int) -> int:
    tensors.require([key], f"the projection {key}", _FIX)
    array = tensors.get(key)
    if array.ndim != 2 or array.shape[0] != d:
        raise WeightsError(f"{tensors.path}:{key}", f"a 2-d array of shape ({d}, k): {d} rows, the model width "
                           "stored in 'hidden'", f"shape {array.shape}",
                           "store W = weight.T, tokens as rows (save_plain does)")
    return array.shape[1]


def _norm(tensors: TensorSource, stem: str, d: int) -> LayerNorm | None:
    names = [f"{stem}.{k}" for k in ("gamma", "beta", "eps")]
    if not any(n in tensors.keys() for n in names):
        return None
    tensors.require(names, f"the LayerNorm {stem}", _FIX)
    return LayerNorm(tensors.tensor(names[0], (d,)), tensors.tensor(names[1], (d,)), _scalar(tensors, names[2], float))


def _head(tensors: TensorSource, key: str, d: int, where: str, name: str | None = None) -> Head:
    """The head ``{key}.W_Q``, ... (named ``name``, default ``key``)."""
    tensors.require([f"{key}.{k}" for k in _HEAD_ARRAYS], where,
                    "write every head of the layer (save_plain does), or request other layers")
    d_k, d_v = _width(tensors, f"{key}.W_Q", d), _width(tensors, f"{key}.W_V", d)
    if _width(tensors, f"{key}.W_K", d) != d_k:
        raise WeightsError(f"{tensors.path}:{key}.W_Q/W_K", "query and key projections of one width d_k",
                           f"W_Q of shape {tensors.get(key + '.W_Q').shape}, W_K of shape "
                           f"{tensors.get(key + '.W_K').shape}", "store both with the head's key width")
    return Head(W_Q=tensors.tensor(f"{key}.W_Q", (d, d_k)), W_K=tensors.tensor(f"{key}.W_K", (d, d_k)),
                W_V=tensors.tensor(f"{key}.W_V", (d, d_v)), b_Q=tensors.tensor(f"{key}.b_Q", (d_k,)),
                b_K=tensors.tensor(f"{key}.b_K", (d_k,)), b_V=tensors.tensor(f"{key}.b_V", (d_v,)),
                score=_scalar(tensors, f"{key}.score", str, default="dot"),
                tau=_scalar(tensors, f"{key}.tau", float, default=1.0),
                eps=_scalar(tensors, f"{key}.eps", float, default=1.0),
                causal=_scalar(tensors, f"{key}.causal", bool, default=False) is True,
                kim_values=_scalar(tensors, f"{key}.kim_values", bool, default=False) is True,
                name=key if name is None else name)


def _attention(tensors: TensorSource, stem: str, heads_count: int, d: int, where: str) -> Layer:
    """The heads ``{stem}.head{h}`` with ``{stem}.W_O`` and ``{stem}.b_O``."""
    heads = [_head(tensors, f"{stem}.head{h}", d, f"head {h} of {where}") for h in range(heads_count)]
    width = sum(h.d_v for h in heads)
    tensors.require([f"{stem}.W_O", f"{stem}.b_O"], where, _FIX)
    return Layer(tuple(heads), tensors.tensor(f"{stem}.W_O", (width, d)), tensors.tensor(f"{stem}.b_O", (d,)))


def _present(tensors: TensorSource, prefix: str) -> list[int]:
    """The layer indices of the stack whose keys start with ``prefix``."""
    pattern = re.compile(rf"^{re.escape(prefix)}layer(\d+)\.W_O$")
    return sorted(int(m.group(1)) for m in map(pattern.match, tensors.keys()) if m)


def _stack(tensors: TensorSource, prefix: str, heads_count: int, d: int, indices) -> dict:
    """``{index: TransformerLayer}`` for ``indices`` of the stack whose keys start with ``prefix``."""
    loaded = {}
    for index in indices:
        stem = f"{prefix}layer{index}"
        ffn = None
        if f"{stem}.ffn.W_1" in tensors.keys():
            ffn = FeedForward(tensors.tensor(f"{stem}.ffn.W_1"), tensors.tensor(f"{stem}.ffn.b_1"),
                              tensors.tensor(f"{stem}.ffn.W_2"), tensors.tensor(f"{stem}.ffn.b_2"),
                              _scalar(tensors, f"{stem}.ffn.act", str, default="gelu"))
        cross = _attention(tensors, f"{stem}.cross", heads_count, d, f"the cross-attention of {stem}") \
            if f"{stem}.cross.W_O" in tensors.keys() else None
        norms = {which: _norm(tensors, f"{stem}.{which}", d) for which in _NORMS}
        loaded[index] = TransformerLayer(index, _attention(tensors, stem, heads_count, d, stem), ffn=ffn, cross=cross,
                                         placement=_scalar(tensors, f"{stem}.placement", str, default="post"), **norms)
    return loaded


def load_plain(tensors: TensorSource, num_heads=None, layers=None) -> Model:
    fmt = _scalar(tensors, "format", str, default="")
    if fmt not in _FORMATS:
        raise WeightsError(f"{tensors.path}:format", f"one of {_FORMATS}", repr(fmt) if fmt else "no format key", _FIX)
    heads_count = _scalar(tensors, "num_heads", int)
    if num_heads is not None and int(num_heads) != heads_count:
        raise WeightsError("num_heads", f"{heads_count} (stored in the file)", repr(num_heads),
                           "omit `num_heads` for plain files")
    d = _scalar(tensors, "hidden", int)
    blocks = tuple(_scalar(tensors, "blocks", str, default="encoder").split(","))
    if blocks not in (("encoder",), ("decoder",), BLOCKS) or (fmt != PLAIN_FORMAT and blocks != ("encoder",)):
        raise WeightsError(f"{tensors.path}:blocks", "'encoder', 'decoder' or 'encoder,decoder' (format v2)",
                           repr(",".join(blocks)), _FIX)
    prefixes = {block: "" if fmt == _FORMATS[0] else f"{block}." for block in blocks}
    present = {block: _present(tensors, prefixes[block]) for block in blocks}
    if not any(present.values()):
        raise WeightsError(str(tensors.path), f"keys {prefixes[blocks[0]]}layer{{L}}.W_O, "
                           f"{prefixes[blocks[0]]}layer{{L}}.head{{h}}.W_Q, ...", "no layer", _FIX)
    wanted = set(select_layers(sorted(set().union(*present.values())), layers))  # each in some stack
    stacks = {block: (_stack(tensors, prefixes[block], heads_count, d, sorted(wanted & set(present[block]))),
                      _scalar(tensors, f"{prefixes[block]}num_layers", int,
                              default=present[block][-1] + 1 if present[block] else 0)) for block in blocks}
    first, second = stacks[blocks[0]], stacks.get("decoder") if len(blocks) == 2 else None
    final = {block: _norm(tensors, f"{prefixes[block]}final_norm", d) for block in blocks}
    metadata = {"format": fmt}
    if "source_sha256" in tensors.keys():
        metadata["source_sha256"] = _scalar(tensors, "source_sha256", str)
    return Model(name=_scalar(tensors, "name", str, default=tensors.path.stem), layers=first[0],
                 num_heads=heads_count, hidden=d, source=_scalar(tensors, "source", str, default=str(tensors.path)),
                 licence=_scalar(tensors, "licence", str, default="unknown"), path=str(tensors.path),
                 sha256=tensors.sha256, num_layers=first[1], metadata=metadata, final_norm=final[blocks[0]],
                 decoder={} if second is None else second[0], decoder_layers=0 if second is None else second[1],
                 decoder_final_norm=final.get("decoder") if second is not None else None,
                 decoder_only=blocks == ("decoder",), layout=_scalar(tensors, "layout", str, default="plain"))


def _put_norm(arrays: dict, stem: str, norm: LayerNorm | None) -> None:
    if norm is not None:
        arrays[f"{stem}.gamma"], arrays[f"{stem}.beta"] = norm.gamma, norm.beta
        arrays[f"{stem}.eps"] = np.array(norm.eps)


def _put_attention(arrays: dict, stem: str, attention: Layer, heads_count: int) -> None:
    if attention.num_heads != heads_count:
        raise WeightsError(stem, f"{heads_count} heads", str(attention.num_heads),
                           "the plain format stores one head count per file")
    for h, head in enumerate(attention.heads):
        _put_head(arrays, f"{stem}.head{h}", head)
    arrays[f"{stem}.W_O"], arrays[f"{stem}.b_O"] = attention.W_O, attention.b_O


def _put_head(arrays: dict, key: str, head: Head) -> None:
    for name in _HEAD_ARRAYS:
        arrays[f"{key}.{name}"] = getattr(head, name)
    arrays[f"{key}.score"] = np.array(head.score)
    arrays[f"{key}.tau"], arrays[f"{key}.eps"] = np.array(head.tau), np.array(head.eps)
    arrays[f"{key}.causal"], arrays[f"{key}.kim_values"] = np.array(head.causal), np.array(head.kim_values)


def save_plain(model: Model, path) -> Path:
    """Write ``model`` in the plain format (``.npz`` appended if missing), atomically.

    Every stack, cross-attention, LayerNorm (with its placement) and feed-forward block is kept;
    the checkpoint's sha256 is recorded as ``source_sha256``.  Returns the path written, readable
    back with :func:`~lipbound.numeric.model.load_weights`.
    """
    if not isinstance(model, Model):
        raise WeightsError("model", "a lipbound.numeric.model.Model", type(model).__name__,
                           "load one with load_weights")
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    arrays = {"format": np.array(PLAIN_FORMAT), "name": np.array(model.name), "source": np.array(model.source),
              "licence": np.array(model.licence), "layout": np.array(model.layout or "plain"),
              "num_heads": np.array(model.num_heads), "hidden": np.array(model.hidden),
              "blocks": np.array(",".join(model.blocks)),
              "source_sha256": np.array(model.metadata.get("source_sha256") or model.sha256)}
    for block in model.blocks:
        for index, layer in model.stack(block).items():
            stem = f"{block}.layer{index}"
            _put_attention(arrays, stem, layer.attention, model.num_heads)
            arrays[f"{stem}.placement"] = np.array(layer.placement)
            for which in _NORMS:
                _put_norm(arrays, f"{stem}.{which}", getattr(layer, which))
            if layer.cross is not None:
                _put_attention(arrays, f"{stem}.cross", layer.cross, model.num_heads)
            if layer.ffn is not None:
                for name in ("W_1", "b_1", "W_2", "b_2"):
                    arrays[f"{stem}.ffn.{name}"] = getattr(layer.ffn, name)
                arrays[f"{stem}.ffn.act"] = np.array(layer.ffn.act)
        _put_norm(arrays, f"{block}.final_norm", model.final_norm_of(block))
        arrays[f"{block}.num_layers"] = np.array(model.stack_size(block))
    with atomic_write(path, "path") as handle:
        np.savez(handle, **arrays)
    return path


# ---------------------------------------------------------------------------------------------
# One head or attention layer as plain arrays, to send to another process
# ---------------------------------------------------------------------------------------------
class _InMemory(TensorSource):
    kind = "arrays"

    def __init__(self, arrays: dict, label: str):
        self.arrays, self.path, self.files, self.metadata = arrays, Path(label), [], {}

    def keys(self) -> set[str]:
        return set(self.arrays)

    def get(self, key: str) -> np.ndarray:
        return np.asarray(self.arrays[key])


def attention_arrays(attention: Head | Layer) -> dict[str, np.ndarray]:
    """A head or a multi-head layer as a dict of numpy arrays, in the plain format's keys
    (``head{h}.W_Q``, ..., ``W_O``, ``b_O``; a lone head as ``head0.*``) with the heads' names:
    plain data that travels to a worker process, read back by :func:`attention_from_arrays`."""
    if isinstance(attention, Head):
        arrays = {"kind": np.array("head"), "names": np.array([attention.name])}
        _put_head(arrays, "head0", attention)
        return arrays
    if not isinstance(attention, Layer):
        raise WeightsError("attention", "a Head or a Layer", type(attention).__name__, "pass layer.attention")
    arrays = {"kind": np.array("layer"), "names": np.array([h.name for h in attention.heads]),
              "residual": np.array(attention.residual)}
    _put_attention(arrays, "layer", attention, attention.num_heads)
    return arrays


def attention_from_arrays(arrays: dict) -> Head | Layer:
    """The head or layer of :func:`attention_arrays`."""
    source = _InMemory(arrays, "attention")
    names = [str(name) for name in np.asarray(arrays["names"])]
    d = np.asarray(arrays["head0.W_Q" if str(arrays["kind"]) == "head" else "layer.head0.W_Q"]).shape[0]
    if str(arrays["kind"]) == "head":
        return _head(source, "head0", d, "the head", names[0])
    layer = _attention(source, "layer", len(names), d, "the layer")
    heads = tuple(replace(head, name=name) for head, name in zip(layer.heads, names))
    return Layer(heads, layer.W_O, layer.b_O, residual=bool(arrays["residual"]))
