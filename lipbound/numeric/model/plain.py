"""The plain ``.npz`` format: every model lipbound reads, as plain arrays any numpy can read.

One array per key, read with ``allow_pickle=False`` (``{B}`` is a stack, ``encoder.`` or
``decoder.``; ``{H}`` a head, ``{B}layer{L}.head{h}``)::

    format                        "lipbound-plain-v3"
    name, source, licence, layout 0-d strings (layout: the checkpoint layout it came from)
    source_sha256                 0-d string, optional: sha256 of the checkpoint it was converted from
    num_heads, hidden             0-d ints
    blocks                        0-d string: "encoder" (default), "decoder" (decoder-only) or "encoder,decoder"
    {H}.W_Q (d, d_k), .W_K (d, d_k), .W_V (d, d_v), .b_Q (d_k,), .b_K (d_k,), .b_V (d_v,)
    {H}.kernel                    0-d string, optional: a registered kernel ("dot" default, "l2", "cosine",
                                  "rope", "qk-norm", "sigmoid", "linear", "custom")
    {H}.kernel.<parameter>        its parameters (0-d numbers and strings, arrays such as
                                  kernel.gamma_q; a nested kernel as kernel.rotary.kernel, kernel.rotary.base, ...)
    {H}.mask.causal               0-d bool, optional (default False); .mask.window 0-d int, .mask.softcap 0-d float,
    {H}.mask.bias                 "alibi" (with .mask.bias.slope) or "t5" (.mask.bias.table, .num_buckets,
                                  .max_distance, .bidirectional), all optional
    {H}.kim_values                0-d bool, optional (L2 values through A; default False)
    {B}layer{L}.W_O (H d_v, d), .b_O (d,)
    {B}layer{L}.groups            (H,) ints, optional: the key/value group of each head (grouped-query attention)
    {B}layer{L}.placement         0-d string, optional: "post" (default), "pre" or "sandwich"
    {B}layer{L}.attn_scale, .ffn_scale (d,)   optional: LayerScale gains
    {B}layer{L}.<norm>.kind       0-d string, optional: "layernorm" (default) or "rmsnorm", for <norm> in
                                  ln_in, ln_out, ffn_norm, ffn_out_norm, cross_norm; with .gamma (d,), .eps 0-d
                                  and, for a LayerNorm, .beta (d,)
    {B}layer{L}.ffn.W_1 (d, d_ff), .b_1, .W_2 (d_ff, d), .b_2, .act (0-d string)   optional: a feed-forward block
    {B}layer{L}.ffn.W_gate, .W_up (d, d_ff), .W_down (d_ff, d), .b_gate, .b_up, .b_down, .act   or a gated one
    {B}layer{L}.cross.head{h}.*, {B}layer{L}.cross.W_O, .b_O   optional: cross-attention (as a layer's heads)
    {B}final_norm.kind, .gamma, .beta, .eps                    optional: the stack's final norm
    {B}num_layers                 0-d int, optional: layers of the stack (the file may hold some of them)
    embeddings.kind               optional: "bert" (.word, .position, .token_type (optional), .norm.*,
                                  .position_offset) or "token" (.word, .scale)
    lm_head (vocab, d)            optional; lm_head_tied 0-d bool: the head is embeddings.word
    max_positions                 0-d int, optional: the context length
    logit_softcap                 0-d float, optional: c of the logits' soft-cap c tanh(z / c)

Version 2 files (the score as ``{H}.score`` "dot", "l2" or "cosine" with ``.tau``, ``.eps``, and
``{H}.causal``) and version 1 files (no ``{B}`` prefix, one encoder stack, no cross-attention)
are read too.  Matrices are stored as the model applies them (``W = weight.T``, tokens as rows).
It is the escape hatch for layouts lipbound does not read: write the arrays with numpy and load
them; :func:`save_plain` (``lipbound convert``) writes it from any loaded model.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ...io import atomic_write
from ..kernels import KERNELS, AttentionMask, kernel_from_arrays
from .components import FeedForward, GatedFeedForward, Head, Layer, LayerNorm, RMSNorm
from .files import TensorSource
from .huggingface import select_layers
from .transformer import BLOCKS, NORM_SLOTS, Embeddings, Model, TokenEmbeddings, TransformerLayer

__all__ = ["PLAIN_FORMAT", "load_plain", "save_plain", "attention_arrays", "attention_from_arrays"]

PLAIN_FORMAT = "lipbound-plain-v3"
_FORMATS = ("lipbound-plain-v1", "lipbound-plain-v2", PLAIN_FORMAT)
_FIX = "write the file with lipbound.numeric.model.save_plain (or follow the plain format in docs/formats.md)"
_HEAD_ARRAYS = ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")
_GATED = ("W_gate", "W_up", "W_down", "b_gate", "b_up", "b_down")
#: the scores a version 2 file could state (registry names; the cosine's tau and eps stored beside)
_VERSION_2_SCORES = ("dot", "l2", "cosine")


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


def _under(tensors: TensorSource, stem: str) -> dict:
    """``{rest: array}`` for every key ``stem.rest`` (a bisection in the sorted keys, kept on the source)."""
    keys = getattr(tensors, "_sorted_keys", None)
    if keys is None:
        keys = sorted(tensors.keys())
        tensors._sorted_keys = keys
    prefix = stem + "."
    start = bisect.bisect_left(keys, prefix)
    end = bisect.bisect_left(keys, prefix[:-1] + chr(ord(prefix[-1]) + 1))
    return {key[len(prefix):]: tensors.get(key) for key in keys[start:end]}


def _norm(tensors: TensorSource, stem: str, d: int) -> LayerNorm | RMSNorm | None:
    names = [f"{stem}.{k}" for k in ("gamma", "eps")]
    if not any(n in tensors.keys() for n in names + [f"{stem}.beta", f"{stem}.kind"]):
        return None
    kind = _scalar(tensors, f"{stem}.kind", str, default="layernorm")
    if kind == "rmsnorm":
        tensors.require(names, f"the RMSNorm {stem}", _FIX)
        return RMSNorm(tensors.tensor(names[0], (d,)), _scalar(tensors, names[1], float))
    if kind != "layernorm":
        raise WeightsError(f"{tensors.path}:{stem}.kind", "'layernorm' or 'rmsnorm'", repr(kind), _FIX)
    tensors.require(names + [f"{stem}.beta"], f"the LayerNorm {stem}", _FIX)
    return LayerNorm(tensors.tensor(names[0], (d,)), tensors.tensor(f"{stem}.beta", (d,)),
                     _scalar(tensors, names[1], float))


def _kernel_and_mask(tensors: TensorSource, key: str):
    """The kernel and mask of the head ``key``; version 2 files state ``score``, ``tau``, ``eps``, ``causal``."""
    if any(f"{key}.{legacy}" in tensors.keys() for legacy in ("score", "tau", "eps", "causal")):
        score = _scalar(tensors, f"{key}.score", str, default="dot")
        if score not in _VERSION_2_SCORES:
            raise WeightsError(f"{tensors.path}:{key}.score", f"one of {_VERSION_2_SCORES}", repr(score), _FIX)
        stored = {name: _scalar(tensors, f"{key}.{name}", float) for name in ("tau", "eps")
                  if f"{key}.{name}" in tensors.keys()}
        kernel = KERNELS[score].from_arrays({name: value for name, value in stored.items()
                                             if name in {f.name for f in fields(KERNELS[score])}})
        mask = AttentionMask(causal=_scalar(tensors, f"{key}.causal", bool, default=False) is True)
        return kernel, mask
    kernel = KERNELS["dot"]()
    if f"{key}.kernel" in tensors.keys():
        kernel = kernel_from_arrays({"kernel": tensors.get(f"{key}.kernel"), **_under(tensors, f"{key}.kernel")},
                                    f"{tensors.path}:{key}.kernel")
    return kernel, AttentionMask.from_arrays(_under(tensors, f"{key}.mask"))


def _head(tensors: TensorSource, key: str, d: int, where: str, name: str | None = None) -> Head:
    """The head ``{key}.W_Q``, ... (named ``name``, default ``key``)."""
    tensors.require([f"{key}.{k}" for k in _HEAD_ARRAYS], where,
                    "write every head of the layer (save_plain does), or request other layers")
    d_k, d_v = _width(tensors, f"{key}.W_Q", d), _width(tensors, f"{key}.W_V", d)
    if _width(tensors, f"{key}.W_K", d) != d_k:
        raise WeightsError(f"{tensors.path}:{key}.W_Q/W_K", "query and key projections of one width d_k",
                           f"W_Q of shape {tensors.get(key + '.W_Q').shape}, W_K of shape "
                           f"{tensors.get(key + '.W_K').shape}", "store both with the head's key width")
    kernel, mask = _kernel_and_mask(tensors, key)
    return Head(W_Q=tensors.tensor(f"{key}.W_Q", (d, d_k)), W_K=tensors.tensor(f"{key}.W_K", (d, d_k)),
                W_V=tensors.tensor(f"{key}.W_V", (d, d_v)), b_Q=tensors.tensor(f"{key}.b_Q", (d_k,)),
                b_K=tensors.tensor(f"{key}.b_K", (d_k,)), b_V=tensors.tensor(f"{key}.b_V", (d_v,)),
                kernel=kernel, mask=mask, kim_values=_scalar(tensors, f"{key}.kim_values", bool, default=False) is True,
                name=key if name is None else name)


def _attention(tensors: TensorSource, stem: str, heads_count: int, d: int, where: str) -> Layer:
    """The heads ``{stem}.head{h}`` with ``{stem}.W_O``, ``{stem}.b_O`` and ``{stem}.groups``."""
    heads = [_head(tensors, f"{stem}.head{h}", d, f"head {h} of {where}") for h in range(heads_count)]
    width = sum(h.d_v for h in heads)
    tensors.require([f"{stem}.W_O", f"{stem}.b_O"], where, _FIX)
    groups = tuple(int(g) for g in tensors.get(f"{stem}.groups")) if f"{stem}.groups" in tensors.keys() else None
    return Layer(tuple(heads), tensors.tensor(f"{stem}.W_O", (width, d)), tensors.tensor(f"{stem}.b_O", (d,)),
                 groups=groups)


def _feed_forward(tensors: TensorSource, stem: str) -> FeedForward | GatedFeedForward | None:
    act = _scalar(tensors, f"{stem}.act", str, default=None) if f"{stem}.act" in tensors.keys() else None
    if f"{stem}.W_gate" in tensors.keys():
        tensors.require([f"{stem}.{k}" for k in _GATED], f"the gated feed-forward block {stem}", _FIX)
        return GatedFeedForward(*(tensors.tensor(f"{stem}.{k}") for k in _GATED[:3]), act or "silu",
                                *(tensors.tensor(f"{stem}.{k}") for k in _GATED[3:]))
    if f"{stem}.W_1" in tensors.keys():
        return FeedForward(tensors.tensor(f"{stem}.W_1"), tensors.tensor(f"{stem}.b_1"),
                           tensors.tensor(f"{stem}.W_2"), tensors.tensor(f"{stem}.b_2"), act or "gelu")
    return None


def _present(tensors: TensorSource, prefix: str) -> list[int]:
    """The layer indices of the stack whose keys start with ``prefix``."""
    pattern = re.compile(rf"^{re.escape(prefix)}layer(\d+)\.W_O$")
    return sorted(int(m.group(1)) for m in map(pattern.match, tensors.keys()) if m)


def _stack(tensors: TensorSource, prefix: str, heads_count: int, d: int, indices) -> dict:
    """``{index: TransformerLayer}`` for ``indices`` of the stack whose keys start with ``prefix``."""
    loaded = {}
    for index in indices:
        stem = f"{prefix}layer{index}"
        cross = _attention(tensors, f"{stem}.cross", heads_count, d, f"the cross-attention of {stem}") \
            if f"{stem}.cross.W_O" in tensors.keys() else None
        norms = {which: _norm(tensors, f"{stem}.{which}", d) for which in NORM_SLOTS}
        scales = {which: tensors.tensor(f"{stem}.{which}", (d,)) if f"{stem}.{which}" in tensors.keys() else None
                  for which in ("attn_scale", "ffn_scale")}
        loaded[index] = TransformerLayer(index, _attention(tensors, stem, heads_count, d, stem),
                                         ffn=_feed_forward(tensors, f"{stem}.ffn"), cross=cross,
                                         placement=_scalar(tensors, f"{stem}.placement", str, default="post"),
                                         **norms, **scales)
    return loaded


def _embeddings(tensors: TensorSource, d: int):
    kind = _scalar(tensors, "embeddings.kind", str, default="") if "embeddings.kind" in tensors.keys() else ""
    if kind == "token":
        return TokenEmbeddings(tensors.get("embeddings.word"), _scalar(tensors, "embeddings.scale", float, default=1.0))
    if kind == "bert":
        types = tensors.tensor("embeddings.token_type") if "embeddings.token_type" in tensors.keys() else None
        return Embeddings(tensors.get("embeddings.word"), tensors.tensor("embeddings.position"), types,
                          _norm(tensors, "embeddings.norm", d),
                          _scalar(tensors, "embeddings.position_offset", int, default=0))
    if kind:
        raise WeightsError(f"{tensors.path}:embeddings.kind", "'bert' or 'token'", repr(kind), _FIX)
    return None


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
    if blocks not in (("encoder",), ("decoder",), BLOCKS) or (fmt == _FORMATS[0] and blocks != ("encoder",)):
        raise WeightsError(f"{tensors.path}:blocks", "'encoder', 'decoder' or 'encoder,decoder' (format v2 and later)",
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
    embeddings = _embeddings(tensors, d)
    lm_head = None
    if "lm_head" in tensors.keys():
        lm_head = tensors.get("lm_head")
    elif _scalar(tensors, "lm_head_tied", bool, default=False) is True and embeddings is not None:
        lm_head, metadata["tied_embeddings"] = embeddings.word, True
    return Model(name=_scalar(tensors, "name", str, default=tensors.path.stem), layers=first[0],
                 num_heads=heads_count, hidden=d, source=_scalar(tensors, "source", str, default=str(tensors.path)),
                 licence=_scalar(tensors, "licence", str, default="unknown"), path=str(tensors.path),
                 sha256=tensors.sha256, num_layers=first[1], metadata=metadata, final_norm=final[blocks[0]],
                 decoder={} if second is None else second[0], decoder_layers=0 if second is None else second[1],
                 decoder_final_norm=final.get("decoder") if second is not None else None,
                 decoder_only=blocks == ("decoder",), layout=_scalar(tensors, "layout", str, default="plain"),
                 embeddings=embeddings, lm_head=lm_head,
                 max_positions=_scalar(tensors, "max_positions", int, default=0) or None,
                 logit_softcap=_scalar(tensors, "logit_softcap", float, default=0.0) or None)


def _put_norm(arrays: dict, stem: str, norm) -> None:
    if norm is not None:
        arrays[f"{stem}.kind"], arrays[f"{stem}.gamma"], arrays[f"{stem}.eps"] = \
            np.array(norm.kind), norm.gamma, np.array(norm.eps)
        if isinstance(norm, LayerNorm):
            arrays[f"{stem}.beta"] = norm.beta


def _put_attention(arrays: dict, stem: str, attention: Layer, heads_count: int) -> None:
    if attention.num_heads != heads_count:
        raise WeightsError(stem, f"{heads_count} heads", str(attention.num_heads),
                           "the plain format stores one head count per file")
    for h, head in enumerate(attention.heads):
        _put_head(arrays, f"{stem}.head{h}", head)
    arrays[f"{stem}.W_O"], arrays[f"{stem}.b_O"] = attention.W_O, attention.b_O
    if attention.groups is not None:
        arrays[f"{stem}.groups"] = np.array(attention.groups)


def _put_head(arrays: dict, key: str, head: Head) -> None:
    for name in _HEAD_ARRAYS:
        arrays[f"{key}.{name}"] = getattr(head, name)
    for name, value in head.kernel.to_arrays().items():
        arrays[f"{key}.kernel" if name == "kernel" else f"{key}.kernel.{name}"] = value
    arrays.update({f"{key}.mask.{name}": value for name, value in head.mask.to_arrays().items()})
    arrays[f"{key}.kim_values"] = np.array(head.kim_values)


def _put_feed_forward(arrays: dict, stem: str, ffn) -> None:
    names = _GATED if isinstance(ffn, GatedFeedForward) else ("W_1", "b_1", "W_2", "b_2")
    for name in names:
        arrays[f"{stem}.{name}"] = getattr(ffn, name)
    arrays[f"{stem}.act"] = np.array(ffn.act)


def _put_model_parts(arrays: dict, model: Model) -> None:
    """Embeddings, the language-model head and the context length."""
    embeddings = model.embeddings
    if isinstance(embeddings, TokenEmbeddings):
        arrays.update({"embeddings.kind": np.array("token"), "embeddings.word": embeddings.word,
                       "embeddings.scale": np.array(embeddings.scale)})
    elif isinstance(embeddings, Embeddings):
        arrays.update({"embeddings.kind": np.array("bert"), "embeddings.word": embeddings.word,
                       "embeddings.position": embeddings.position,
                       "embeddings.position_offset": np.array(embeddings.position_offset)})
        if embeddings.token_type is not None:
            arrays["embeddings.token_type"] = embeddings.token_type
        _put_norm(arrays, "embeddings.norm", embeddings.norm)
    if model.lm_head is not None:
        if embeddings is not None and model.lm_head is embeddings.word:
            arrays["lm_head_tied"] = np.array(True)
        else:
            arrays["lm_head"] = model.lm_head
    if model.max_positions is not None:
        arrays["max_positions"] = np.array(model.max_positions)
    if model.logit_softcap is not None:
        arrays["logit_softcap"] = np.array(model.logit_softcap)


def save_plain(model: Model, path) -> Path:
    """Write ``model`` in the plain format (``.npz`` appended if missing), atomically.

    Every stack, cross-attention, norm (with its placement), feed-forward block, kernel, mask,
    key/value group, LayerScale gain, the embeddings and the language-model head are kept; the
    checkpoint's sha256 is recorded as ``source_sha256``.  Returns the path written, readable back
    with :func:`~lipbound.numeric.model.load_weights`.
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
            for which in NORM_SLOTS:
                _put_norm(arrays, f"{stem}.{which}", getattr(layer, which))
            for which in ("attn_scale", "ffn_scale"):
                if getattr(layer, which) is not None:
                    arrays[f"{stem}.{which}"] = getattr(layer, which)
            if layer.cross is not None:
                _put_attention(arrays, f"{stem}.cross", layer.cross, model.num_heads)
            if layer.ffn is not None:
                _put_feed_forward(arrays, f"{stem}.ffn", layer.ffn)
        _put_norm(arrays, f"{block}.final_norm", model.final_norm_of(block))
        arrays[f"{block}.num_layers"] = np.array(model.stack_size(block))
    _put_model_parts(arrays, model)
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
    return Layer(heads, layer.W_O, layer.b_O, residual=bool(arrays["residual"]), groups=layer.groups)
