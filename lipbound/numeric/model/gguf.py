"""GGUF files (llama.cpp's format), read with the ``gguf`` package into named float tensors.

A GGUF file holds typed metadata (``general.architecture``, ``llama.block_count``, the
tokenizer's vocabulary and merges, ...) and tensors, each stored as plain floats (F32, F16, BF16,
F64) or in one of llama.cpp's block quantisations (Q4_1: blocks of 32 weights ``w = d q + m``
with a float16 scale ``d``, a float16 minimum ``m`` and 4-bit ``q``; Q8_0, the K-quants, the
IQ types, ...).  Every tensor is dequantised by ``gguf.quants.dequantize`` -- the reference
dequantisation of ggml, in float32 -- and widened to float64 exactly: those numbers ARE the
model lipbound describes, so a bound holds for the quantised model, not for the float model it
was made from.  A tensor type the ``gguf`` package cannot dequantise (integer tensors, Q8_1,
Q8_K, ...) is refused when the file is opened, before anything is read.

Shapes follow the row-major convention of the reader: a matrix with ``ne = (in, out)`` in ggml
comes as (out, in), as ``torch.nn.Linear`` stores its weight; the token embeddings as (vocab, d).

:func:`gguf_config` turns the metadata of a supported architecture into the keys of a Hugging
Face ``config.json`` (``hidden_size``, ``num_attention_heads``, ``rope_theta``, ...), so that one
decoder reader serves both formats (:mod:`.decoders`).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections import Counter
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from .files import TensorSource

__all__ = ["GGUFSource", "dequantise", "gguf_config", "gguf_fields", "dequantisable_types", "GGUF_ARCHITECTURES"]

#: general.architecture values lipbound reads (llama.cpp's ``llama``: Llama, Mistral, SmolLM, ...).
GGUF_ARCHITECTURES = ("llama",)
_PLAIN = ("F32", "F64", "F16")
_INSTALL = "pip install 'lipbound[numeric]' (it brings the gguf package)"


def _gguf():
    try:
        import gguf
    except ImportError:
        raise WeightsError("gguf", "the gguf package to read GGUF files", "not installed", _INSTALL) from None
    return gguf


@functools.lru_cache(maxsize=1)
def dequantisable_types() -> tuple[str, ...]:
    """The GGUF tensor types lipbound reads: plain floats and every quantisation the installed
    ``gguf`` package dequantises."""
    _gguf()
    from gguf.quants import _type_traits  # the package's own table of dequantisers

    return tuple(sorted(set(_PLAIN) | {kind.name for kind in _type_traits}))


@functools.lru_cache(maxsize=1)
def _reader_class():
    """``gguf.GGUFReader`` with its slices taken from a plain ndarray view of the mapped file.

    The package's reader slices its ``np.memmap`` once per metadata item, and each memmap slice pays for
    memmap bookkeeping: on a tokenizer of 49152 strings and 48900 merges that is two thirds of opening the file
    (4.3 -> 1.5 CPU-s on SmolLM2).  The view reads the same mapped bytes, so every field and tensor is the
    same; a ``gguf`` release whose reader does not slice through ``_get(offset, dtype, count,
    override_order)`` keeps the package's class.
    """
    gguf = _gguf()
    reader = gguf.GGUFReader
    try:
        parameters = list(inspect.signature(reader._get).parameters)
    except (AttributeError, TypeError, ValueError):
        return reader
    if parameters != ["self", "offset", "dtype", "count", "override_order"]:
        return reader

    class PlainSliceReader(reader):
        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            count = int(count)
            array = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            order = self.byte_order if override_order is None else override_order
            return array.view(array.dtype.newbyteorder(order))

    return PlainSliceReader


@functools.lru_cache(maxsize=2)
def _parsed(path: str, stamp: tuple):
    """``(reader, fields)`` of one file per (path, size, mtime): the weights and the tokenizer
    share one parse (the reader maps the file; nothing is copied)."""
    try:
        reader = _reader_class()(path)
    except Exception as error:  # the reader raises ValueError, struct errors, ... on damaged files
        raise WeightsError(path, "a GGUF file (magic GGUF, version 2 or 3, metadata, tensor infos, data)",
                           f"an unreadable file ({type(error).__name__}: {error})",
                           "check that the download is complete; re-convert it with llama.cpp") from None
    fields = {}
    for key, field in reader.fields.items():
        try:
            fields[key] = field.contents()
        except Exception:  # a field the package cannot decode is not one lipbound reads
            continue
    return reader, fields


def _read(path: Path):
    stat = os.stat(path)
    return _parsed(str(path), (stat.st_size, stat.st_mtime_ns))


def gguf_fields(path) -> dict:
    """Every metadata key of a GGUF file with its value (strings, numbers, lists)."""
    return _read(Path(path))[1]


class GGUFSource(TensorSource):
    """The tensors and metadata of one GGUF file.

    Parameters
    ----------
    path : pathlib.Path

    Attributes
    ----------
    fields : dict
        Every metadata key with its value (strings, numbers, lists), read once.
    metadata : dict
        What a :class:`~.transformer.Model` records: ``name``, ``licence``, ``architecture``,
        ``quantisation`` (the type of most weight matrices, e.g. ``"Q4_1"``) and
        ``tensor_types`` (every type with its count, e.g. ``"F32: 61, Q4_1: 210, Q8_0: 1"``).
    """

    kind = "gguf"

    def __init__(self, path: Path):
        self.path, self.files = Path(path), [Path(path)]
        reader, self.fields = _read(self.path)
        self._tensors = {tensor.name: tensor for tensor in reader.tensors}
        supported = dequantisable_types()
        refused = sorted({(t.tensor_type.name, name) for name, t in self._tensors.items()
                          if t.tensor_type.name not in supported})
        if refused:
            kinds = sorted({kind for kind, _ in refused})
            raise WeightsError(str(self.path),
                               f"tensors of types the gguf package dequantises ({', '.join(supported)})",
                               f"{len(refused)} tensors of type {', '.join(kinds)} (e.g. {refused[0][1]})",
                               "re-quantise the model with llama.cpp to one of these types (Q8_0, Q4_K, ...)")
        counts = Counter(t.tensor_type.name for t in self._tensors.values())
        matrices = Counter(t.tensor_type.name for t in self._tensors.values() if len(t.shape) >= 2)
        self.metadata = {
            "name": str(self.fields.get("general.name") or self.path.name),
            "licence": str(self.fields.get("general.license") or "unknown"),
            "architecture": str(self.fields.get("general.architecture", "")),
            "quantisation": matrices.most_common(1)[0][0] if matrices else "F32",
            "tensor_types": ", ".join(f"{kind}: {count}" for kind, count in sorted(counts.items())),
        }

    def keys(self) -> set[str]:
        return set(self._tensors)

    def shape(self, key: str) -> tuple:
        tensor = self._tensors[key]
        return tuple(int(n) for n in reversed(tensor.shape.tolist()))

    def get(self, key: str) -> np.ndarray:
        tensor = self._tensors[key]
        return dequantise(tensor.data, tensor.tensor_type).reshape(self.shape(key))


def dequantise(data: np.ndarray, kind) -> np.ndarray:
    """The floats of a GGUF tensor's stored rows: F32 and F64 as stored, anything else by
    ``gguf.quants.dequantize`` (float32; e.g. Q4_1 blocks ``d q + m``, Q8_0 blocks ``d q``)."""
    if kind.name in ("F32", "F64"):
        return np.asarray(data)
    return _gguf().quants.dequantize(data, kind)


#: GGUF metadata key (after ``{architecture}.``) -> the config.json key it becomes.
_CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "rope.dimension_count": "rotary_dims",
    "vocab_size": "vocab_size",
}


def gguf_config(source: GGUFSource) -> dict:
    """The metadata of a supported GGUF architecture as config.json keys (``model_type`` is the
    architecture), with ``tie_word_embeddings`` true when the file has no ``output.weight``.

    Raises
    ------
    WeightsError
        Another architecture, a mixture of experts, RoPE scaling, a missing required key.
    """
    fields, path = source.fields, str(source.path)
    arch = str(fields.get("general.architecture", ""))
    if arch not in GGUF_ARCHITECTURES:
        raise WeightsError(f"{path}: general.architecture", f"one of {', '.join(GGUF_ARCHITECTURES)}", repr(arch),
                           "lipbound reads GGUF files of these architectures; convert the Hugging Face checkpoint "
                           "to safetensors for the others (docs/formats.md)")
    config = {"model_type": arch}
    for key, name in _CONFIG_KEYS.items():
        value = fields.get(f"{arch}.{key}")
        if value is not None:
            config[name] = value.item() if isinstance(value, np.generic) else value
    for key in ("block_count", "embedding_length", "attention.head_count"):
        if f"{arch}.{key}" not in fields:
            raise WeightsError(f"{path}: {arch}.{key}", "a metadata value", "missing",
                               "re-convert the model with a current llama.cpp")
    experts = int(fields.get(f"{arch}.expert_count", 0) or 0)
    if experts > 0 or any(".ffn_gate_inp." in key for key in source.keys()):
        raise WeightsError(f"{path}: {arch}.expert_count", "a dense model (no mixture of experts)",
                           f"{experts} experts",
                           "lipbound describes dense decoders; a mixture of experts is not supported")
    scaling = str(fields.get(f"{arch}.rope.scaling.type", "none") or "none")
    if scaling != "none" or "rope_freqs.weight" in source.keys():
        raise WeightsError(f"{path}: {arch}.rope.scaling.type", "no RoPE scaling (plain rotary frequencies)",
                           repr(scaling) if scaling != "none" else "per-frequency factors (rope_freqs.weight)",
                           "RoPE scaling is not implemented; use a model without it")
    config["tie_word_embeddings"] = "output.weight" not in source.keys()
    return config
