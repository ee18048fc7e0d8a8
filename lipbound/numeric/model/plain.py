"""The plain per-head ``.npz`` format: every head kind lipbound knows, readable by any numpy.

One array per key, read with ``allow_pickle=False``::

    format                 "lipbound-plain-v1"
    name, source, licence  0-d strings
    num_heads, hidden      0-d ints
    layer{L}.head{h}.W_Q   (d, d_k)     layer{L}.head{h}.b_Q   (d_k,)
    layer{L}.head{h}.W_K   (d, d_k)     layer{L}.head{h}.b_K   (d_k,)
    layer{L}.head{h}.W_V   (d, d_v)     layer{L}.head{h}.b_V   (d_v,)
    layer{L}.head{h}.score        0-d string, optional: "dot" (default), "l2", "cosine"
    layer{L}.head{h}.tau, .eps    0-d floats, optional (cosine; default 1)
    layer{L}.head{h}.causal       0-d bool, optional (default False)
    layer{L}.head{h}.kim_values   0-d bool, optional (L2 values through A; default False)
    layer{L}.W_O           (H d_v, d)   layer{L}.b_O           (d,)
    layer{L}.ln_in.gamma, .beta (d,), .eps 0-d     optional; likewise ln_out and ffn_norm
    layer{L}.ffn.W_1 (d, d_ff), .b_1, .W_2 (d_ff, d), .b_2, .act (0-d string)   optional

Matrices are stored as the model applies them (``W = weight.T``, tokens as rows).  It is the
escape hatch for layouts lipbound does not read: write the arrays with numpy and load them.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ...io import atomic_write
from .components import FeedForward, Head, Layer, LayerNorm
from .files import TensorSource
from .huggingface import select_layers
from .transformer import Model, TransformerLayer

__all__ = ["PLAIN_FORMAT", "load_plain", "save_plain"]

PLAIN_FORMAT = "lipbound-plain-v1"
_LAYER = re.compile(r"^layer(\d+)\.W_O$")
_FIX = "write the file with lipbound.numeric.model.save_plain (or follow the plain format in docs/)"


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


def load_plain(tensors: TensorSource, num_heads=None, layers=None) -> Model:
    fmt = _scalar(tensors, "format", str, default="")
    if fmt != PLAIN_FORMAT:
        raise WeightsError(f"{tensors.path}:format", repr(PLAIN_FORMAT), repr(fmt) if fmt else "no format key", _FIX)
    heads_count = _scalar(tensors, "num_heads", int)
    if num_heads is not None and int(num_heads) != heads_count:
        raise WeightsError("--num-heads", f"{heads_count} (stored in the file)", repr(num_heads),
                           "omit --num-heads for plain files")
    d = _scalar(tensors, "hidden", int)
    present = sorted(int(m.group(1)) for m in map(_LAYER.match, tensors.keys()) if m)
    if not present:
        raise WeightsError(str(tensors.path), "keys layer{L}.W_O, layer{L}.head{h}.W_Q, ...", "no layer", _FIX)
    loaded = {}
    for index in select_layers(present, layers):
        stem = f"layer{index}"
        heads = []
        for h in range(heads_count):
            key = f"{stem}.head{h}"
            tensors.require([f"{key}.{k}" for k in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")], f"head {h} of layer {index}",
                            "write every head of the layer (save_plain does), or request other layers")
            d_k, d_v = _width(tensors, f"{key}.W_Q", d), _width(tensors, f"{key}.W_V", d)
            if _width(tensors, f"{key}.W_K", d) != d_k:
                raise WeightsError(f"{tensors.path}:{key}.W_Q/W_K", "query and key projections of one width d_k",
                                   f"W_Q of shape {tensors.get(key + '.W_Q').shape}, W_K of shape "
                                   f"{tensors.get(key + '.W_K').shape}", "store both with the head's key width")
            heads.append(Head(
                W_Q=tensors.tensor(f"{key}.W_Q", (d, d_k)), W_K=tensors.tensor(f"{key}.W_K", (d, d_k)),
                W_V=tensors.tensor(f"{key}.W_V", (d, d_v)), b_Q=tensors.tensor(f"{key}.b_Q", (d_k,)),
                b_K=tensors.tensor(f"{key}.b_K", (d_k,)), b_V=tensors.tensor(f"{key}.b_V", (d_v,)),
                score=_scalar(tensors, f"{key}.score", str, default="dot"),
                tau=_scalar(tensors, f"{key}.tau", float, default=1.0),
                eps=_scalar(tensors, f"{key}.eps", float, default=1.0),
                causal=_scalar(tensors, f"{key}.causal", bool, default=False) is True,
                kim_values=_scalar(tensors, f"{key}.kim_values", bool, default=False) is True, name=key))
        width = sum(h.d_v for h in heads)
        tensors.require([f"{stem}.W_O", f"{stem}.b_O"], f"layer {index}", _FIX)
        ffn = None
        if f"{stem}.ffn.W_1" in tensors.keys():
            W_1 = tensors.tensor(f"{stem}.ffn.W_1")
            ffn = FeedForward(W_1, tensors.tensor(f"{stem}.ffn.b_1"), tensors.tensor(f"{stem}.ffn.W_2"),
                              tensors.tensor(f"{stem}.ffn.b_2"), _scalar(tensors, f"{stem}.ffn.act", str, default="gelu"))
        loaded[index] = TransformerLayer(
            index, Layer(tuple(heads), tensors.tensor(f"{stem}.W_O", (width, d)), tensors.tensor(f"{stem}.b_O", (d,))),
            ln_in=_norm(tensors, f"{stem}.ln_in", d), ln_out=_norm(tensors, f"{stem}.ln_out", d), ffn=ffn,
            ffn_norm=_norm(tensors, f"{stem}.ffn_norm", d))
    return Model(name=_scalar(tensors, "name", str, default=tensors.path.stem), layers=loaded,
                 num_heads=heads_count, hidden=d, source=_scalar(tensors, "source", str, default=str(tensors.path)),
                 licence=_scalar(tensors, "licence", str, default="unknown"), path=str(tensors.path),
                 sha256=tensors.sha256)


def save_plain(model: Model, path) -> Path:
    """Write ``model`` in the plain format (``.npz`` appended if missing), atomically.

    Returns the path written; readable back with :func:`~lipbound.numeric.model.load_weights`.
    """
    if not isinstance(model, Model):
        raise WeightsError("model", "a lipbound.numeric.model.Model", type(model).__name__, "load one with load_weights")
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    arrays = {"format": np.array(PLAIN_FORMAT), "name": np.array(model.name), "source": np.array(model.source),
              "licence": np.array(model.licence), "num_heads": np.array(model.num_heads),
              "hidden": np.array(model.hidden)}
    for index, layer in model.layers.items():
        if layer.num_heads != model.num_heads:
            raise WeightsError(f"layers[{index}]", f"{model.num_heads} heads", str(layer.num_heads),
                               "the plain format stores one head count per file")
        for h, head in enumerate(layer.heads):
            key = f"layer{index}.head{h}"
            for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
                arrays[f"{key}.{name}"] = getattr(head, name)
            arrays[f"{key}.score"] = np.array(head.score)
            arrays[f"{key}.tau"], arrays[f"{key}.eps"] = np.array(head.tau), np.array(head.eps)
            arrays[f"{key}.causal"], arrays[f"{key}.kim_values"] = np.array(head.causal), np.array(head.kim_values)
        arrays[f"layer{index}.W_O"] = layer.attention.W_O
        arrays[f"layer{index}.b_O"] = layer.attention.b_O
        for which in ("ln_in", "ln_out", "ffn_norm"):
            norm = getattr(layer, which)
            if norm is not None:
                arrays[f"layer{index}.{which}.gamma"] = norm.gamma
                arrays[f"layer{index}.{which}.beta"] = norm.beta
                arrays[f"layer{index}.{which}.eps"] = np.array(norm.eps)
        if layer.ffn is not None:
            for name in ("W_1", "b_1", "W_2", "b_2"):
                arrays[f"layer{index}.ffn.{name}"] = getattr(layer.ffn, name)
            arrays[f"layer{index}.ffn.act"] = np.array(layer.ffn.act)
    with atomic_write(path, "--output") as handle:
        np.savez(handle, **arrays)
    return path
