"""Real weights: loaders for Hugging Face BERT checkpoints, a plain per-head format, and the
embedded default model.

Conventions are those of :mod:`lipbound.numeric.attention`: tokens are rows,
``q = x W_Q + b_Q`` with ``W_Q`` of shape (d, d_k).  A Hugging Face ``nn.Linear``
stores ``weight`` with shape (out, in), so ``W_Q = query.weight.T`` and head h is the
column slice ``[:, h d_k:(h + 1) d_k]``; the output projection is
``W_O = attention.output.dense.weight.T`` of shape (H d_v, d), whose rows follow the
concatenated heads.

Formats read by :func:`load_weights`:

* a ``.safetensors`` file with Hugging Face BERT names (any common prefix such as
  ``bert.``)::

      encoder.layer.L.attention.self.{query,key,value}.{weight,bias}
      encoder.layer.L.attention.output.dense.{weight,bias}
      encoder.layer.L.attention.output.LayerNorm.{weight,bias}      (ln_out)
      embeddings.LayerNorm.{weight,bias}                            (ln_in of layer 0)
      encoder.layer.{L-1}.output.LayerNorm.{weight,bias}            (ln_in of layer L)

  (``gamma``/``beta`` are accepted for old LayerNorm names).  The head count comes from
  ``num_heads``, else ``num_attention_heads`` in a ``config.json`` next to the file, else
  the safetensors metadata;
* a Hugging Face model directory (``config.json`` plus one or more ``*.safetensors``);
* the plain ``.npz`` format written by :func:`save_plain` (read with
  ``allow_pickle=False``), one array per key::

      format                 "lipbound-plain-v1"
      name, source, licence  0-d strings
      num_heads, hidden      0-d ints
      layer{L}.head{h}.W_Q   (d, d_k)     layer{L}.head{h}.b_Q   (d_k,)
      layer{L}.head{h}.W_K   (d, d_k)     layer{L}.head{h}.b_K   (d_k,)
      layer{L}.head{h}.W_V   (d, d_v)     layer{L}.head{h}.b_V   (d_v,)
      layer{L}.head{h}.score 0-d string, optional ("dot" by default)
      layer{L}.W_O           (H d_v, d)   layer{L}.b_O           (d,)
      layer{L}.ln_in.gamma, .beta (d,), .eps 0-d     optional, likewise ln_out

* the embedded default (:func:`load_default`): layers 0 and 5 of
  sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0; see ``data/NOTICE``).

Pickle-based checkpoints (``.bin``, ``.pt``, ...) are refused: lipbound never unpickles.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, final

import numpy as np
from mpmath import iv

from ..errors import WeightsError
from . import attention
from .rigorous import interval, upper, vector_norm_upper

__all__ = ["LayerNormParams", "LayerWeights", "ModelWeights", "load_weights", "load_default",
           "save_plain", "DEFAULT_WEIGHTS", "DEFAULT_LAYERS", "PLAIN_FORMAT"]

DATA = Path(__file__).with_name("data")
DEFAULT_WEIGHTS = DATA / "minilm-l6-attention.safetensors"
DEFAULT_LAYERS = (0, 5)
PLAIN_FORMAT = "lipbound-plain-v1"
_PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".h5", ".msgpack"}
_CONVERT = ("convert it once, in a trusted environment: python -c \"import torch; "
            "from safetensors.torch import save_file; save_file(torch.load('pytorch_model.bin'), "
            "'model.safetensors')\"")


def _finite_vector(name: str, value, size: int | None = None) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 1 or (size is not None and array.shape != (size,)):
        expected = f"shape ({size},)" if size is not None else "a 1-d array"
        raise WeightsError(name, expected, f"shape {array.shape}", "pass one value per feature")
    if not np.all(np.isfinite(array)):
        raise WeightsError(name, "finite entries", "NaN or Inf", "check the checkpoint")
    return array


@final
@dataclass(frozen=True)
class LayerNormParams:
    """A LayerNorm ``LN(x) = gamma * (x - mean x) / sqrt(var x + eps) + beta`` (Ba et al. 2016).

    Its output is ``gamma * z + beta`` with ``z`` orthogonal to the all-ones vector and
    ``||z|| = sqrt(d) std / sqrt(std^2 + eps) < sqrt(d)``, so every output lies within
    ``max|gamma| sqrt(d)`` of ``beta``, and within ``max|gamma| sqrt(d) + ||beta||`` of 0.

    Parameters
    ----------
    gamma, beta : ndarray, shape (d,)
        Gain and bias (Hugging Face ``LayerNorm.weight`` and ``LayerNorm.bias``).
    eps : float
        The variance regulariser, > 0.
    """

    gamma: np.ndarray
    beta: np.ndarray
    eps: float = 1e-12

    def __post_init__(self):
        gamma = _finite_vector("gamma", self.gamma)
        beta = _finite_vector("beta", self.beta, gamma.size)
        eps = float(self.eps)
        if not (math.isfinite(eps) and eps > 0):
            raise WeightsError("eps", "a positive finite float", repr(self.eps),
                               "use the checkpoint's layer_norm_eps (1e-12 for BERT)")
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "eps", eps)

    @property
    def d(self) -> int:
        return self.gamma.size

    @property
    def gamma_max(self) -> float:
        """``||gamma||_inf`` (exact: one of the entries)."""
        return float(np.max(np.abs(self.gamma)))

    @property
    def center(self) -> np.ndarray:
        """The centre of the image, ``beta``."""
        return self.beta

    @property
    def radius_about_center(self) -> float:
        """``max|gamma| sqrt(d)``, rounded up: every output x has ``||x - beta|| <= it``."""
        return upper(interval(self.gamma_max) * iv.sqrt(self.d))

    @property
    def radius_about_origin(self) -> float:
        """``max|gamma| sqrt(d) + ||beta||``, rounded up: every output has ``||x|| <= it``."""
        return upper(interval(self.gamma_max) * iv.sqrt(self.d) + interval(vector_norm_upper(self.beta)))

    def forward(self, X: np.ndarray) -> np.ndarray:
        """Apply the LayerNorm to the rows of ``X`` (..., d)."""
        X = np.asarray(X, dtype=np.float64)
        if X.shape[-1] != self.d:
            raise WeightsError("X", f"tokens with {self.d} features (last axis)", f"shape {X.shape}",
                               "tokens are rows; the last axis is the model width")
        centred = X - X.mean(axis=-1, keepdims=True)
        return self.gamma * centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + self.eps) + self.beta


@final
@dataclass(frozen=True)
class LayerWeights:
    """The self-attention block of one transformer layer.

    Parameters
    ----------
    index : int
        The layer index in its model.
    heads : tuple of attention.Head
        Per-head projections, ``W_Q, W_K`` (d, d_k), ``W_V`` (d, d_v), with biases.
    W_O : ndarray, shape (H d_v, d)
        Output projection (Hugging Face ``attention.output.dense.weight.T``).
    b_O : ndarray, shape (d,)
    ln_in : LayerNormParams or None
        The LayerNorm whose output feeds the layer (``embeddings.LayerNorm`` for layer 0,
        ``encoder.layer.{L-1}.output.LayerNorm`` for layer L): it fixes the input domain.
    ln_out : LayerNormParams or None
        ``attention.output.LayerNorm``, applied after the residual connection.
    """

    index: int
    heads: tuple[attention.Head, ...]
    W_O: np.ndarray
    b_O: np.ndarray | None = None
    ln_in: LayerNormParams | None = None
    ln_out: LayerNormParams | None = None

    def __post_init__(self):
        heads = tuple(self.heads)
        if not heads or not all(isinstance(h, attention.Head) for h in heads):
            raise WeightsError("heads", "a non-empty tuple of attention.Head", repr(type(self.heads)),
                               "build the heads with attention.Head(W_Q, W_K, W_V, ...)")
        d = heads[0].d
        if any(h.d != d for h in heads):
            raise WeightsError("heads", f"heads reading {d} features each",
                               str([h.d for h in heads]), "all heads of a layer read the same tokens")
        layer = attention.Layer(heads, self.W_O, self.b_O)  # validates W_O and b_O
        if layer.W_O.shape[1] != d or layer.b_O.shape != (d,):
            raise WeightsError("W_O", f"shape ({layer.W_O.shape[0]}, {d}) and b_O of shape ({d},)",
                               f"W_O {layer.W_O.shape}, b_O {layer.b_O.shape}",
                               "the output projection maps back to the model width")
        for name in ("ln_in", "ln_out"):
            ln = getattr(self, name)
            if ln is not None and (not isinstance(ln, LayerNormParams) or ln.d != d):
                raise WeightsError(name, f"LayerNormParams over {d} features or None",
                                   repr(getattr(ln, "d", ln)), "pass the LayerNorm of this layer's width")
        object.__setattr__(self, "index", int(self.index))
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "W_O", layer.W_O)
        object.__setattr__(self, "b_O", layer.b_O)

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    @property
    def d(self) -> int:
        return self.heads[0].d

    def as_layer(self, residual: bool = False) -> attention.Layer:
        """The multi-head map ``F(X) = [f^1(X), ..., f^H(X)] W_O + b_O`` (plus X if residual)."""
        return attention.Layer(self.heads, self.W_O, self.b_O, residual=residual)


@final
@dataclass(frozen=True)
class ModelWeights:
    """Attention weights of several layers of one model, with provenance.

    Parameters
    ----------
    name : str
        Model name (e.g. ``sentence-transformers/all-MiniLM-L6-v2``).
    layers : dict of int to LayerWeights
    num_heads, hidden : int
    source : str
        Where the tensors came from (file, package and version).
    licence : str
    """

    name: str
    layers: dict
    num_heads: int
    hidden: int
    source: str = ""
    licence: str = "unknown"
    metadata: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if not self.layers:
            raise WeightsError("layers", "at least one layer", "none", "load at least one layer")
        for index, layer in self.layers.items():
            if not isinstance(layer, LayerWeights) or layer.index != index:
                raise WeightsError(f"layers[{index}]", f"LayerWeights with index {index}", repr(layer)[:60],
                                   "key the dict by layer index")
        object.__setattr__(self, "layers", dict(sorted(self.layers.items())))

    def layer(self, index: int) -> LayerWeights:
        """The layer ``index``; a :class:`WeightsError` lists the available ones."""
        try:
            return self.layers[index]
        except KeyError:
            raise WeightsError("layer", f"one of the loaded layers {list(self.layers)}", repr(index),
                               "load it with load_weights(path, layers=[...])") from None

    def head(self, layer: int, head: int) -> attention.Head:
        heads = self.layer(layer).heads
        if not 0 <= head < len(heads):
            raise WeightsError("head", f"an index in 0..{len(heads) - 1}", repr(head),
                               f"layer {layer} has {len(heads)} heads")
        return heads[head]


# Tensor sources -----------------------------------------------------------------------------
class _Tensors:
    """Read-only access to named tensors of one checkpoint.  Abstract."""

    path: Path
    metadata: dict

    def keys(self) -> set[str]:
        raise NotImplementedError

    def get(self, key: str) -> np.ndarray:
        raise NotImplementedError


@final
class _SafetensorsTensors(_Tensors):
    def __init__(self, files: list[Path], label: Path):
        from safetensors import safe_open

        self.path = label
        self.metadata = {}
        self._where: dict[str, Path] = {}
        for file in files:
            try:
                with safe_open(str(file), framework="numpy") as handle:
                    self.metadata.update(handle.metadata() or {})
                    for key in handle.keys():
                        self._where[key] = file
            except Exception as error:  # the library raises its own SafetensorError
                raise WeightsError(str(file), "a safetensors file (8-byte header length, JSON header, raw data)",
                                   f"an unreadable file ({type(error).__name__}: {error})",
                                   "check that it is not truncated or in another format; re-export with "
                                   "safetensors.numpy.save_file") from None

    def keys(self) -> set[str]:
        return set(self._where)

    def get(self, key: str) -> np.ndarray:
        from safetensors import safe_open

        try:
            with safe_open(str(self._where[key]), framework="numpy") as handle:
                return handle.get_tensor(key)
        except Exception as error:
            raise WeightsError(f"{self._where[key]}:{key}", "a tensor numpy can read (float16/32/64)",
                               f"{type(error).__name__}: {error}",
                               "convert the checkpoint to float32 (bfloat16 has no numpy type)") from None


@final
class _NpzTensors(_Tensors):
    def __init__(self, path: Path):
        self.path = path
        try:
            archive = np.load(path, allow_pickle=False)
        except ValueError as error:
            raise WeightsError(str(path), "a numpy .npz archive of plain arrays",
                               f"a file numpy could only read by unpickling ({error})",
                               "lipbound never unpickles; write the weights with save_plain") from None
        except Exception as error:
            raise WeightsError(str(path), "a numpy .npz archive", f"an unreadable file ({type(error).__name__}: {error})",
                               "write the weights with lipbound.numeric.weights.save_plain") from None
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise WeightsError(str(path), "an .npz archive (several named arrays)", "a single .npy array",
                               "write the weights with save_plain")
        self._archive = archive
        self.metadata = {}

    def keys(self) -> set[str]:
        return set(self._archive.files)

    def get(self, key: str) -> np.ndarray:
        try:
            return self._archive[key]
        except ValueError as error:
            raise WeightsError(f"{self.path}:{key}", "a plain numeric or string array",
                               f"an object array ({error})",
                               "lipbound never unpickles; store numbers and strings only (save_plain)") from None


def _open(path) -> tuple[_Tensors, dict, str]:
    """The tensor source, the config.json contents (or {}), and the format: 'hf' or 'plain'."""
    if not isinstance(path, (str, Path)):
        raise WeightsError("path", "a file or directory path (str or pathlib.Path)", type(path).__name__,
                           "pass the checkpoint's path")
    path = Path(path)
    if not path.exists():
        raise WeightsError(str(path), "an existing file or directory", "no such path",
                           "check the path, or call load_default() for the embedded model")
    if path.is_dir():
        config = _read_config(path / "config.json")
        files = sorted(path.glob("*.safetensors"))
        if files:
            return _SafetensorsTensors(files, path), config, "hf"
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        if pickles:
            raise WeightsError(str(path), "a model directory with *.safetensors weights",
                               f"only pickle-based weights ({', '.join(pickles)})", _CONVERT)
        raise WeightsError(str(path), "a model directory with *.safetensors weights", "no weight file",
                           "point to the directory holding model.safetensors")
    if path.suffix in _PICKLE_SUFFIXES:
        raise WeightsError(str(path), "a .safetensors file, a model directory or a plain .npz",
                           f"a pickle-based checkpoint ({path.suffix}); lipbound never unpickles", _CONVERT)
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as error:
        raise WeightsError(str(path), "a readable file", f"{type(error).__name__}: {error}",
                           "check the permissions") from None
    if path.suffix == ".npz" or head[:2] == b"PK":
        return _NpzTensors(path), {}, "plain"
    return _SafetensorsTensors([path], path), _read_config(path.with_name("config.json")), "hf"


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise WeightsError(str(path), "a JSON model configuration", f"unreadable JSON ({error})",
                           "fix or remove config.json") from None


def _check(tensors: _Tensors, key: str, shape: tuple) -> np.ndarray:
    array = tensors.get(key)
    if array.dtype.kind not in "fiu":
        raise WeightsError(f"{tensors.path}:{key}", "a numeric tensor", f"dtype {array.dtype}",
                           "store weights as float32 or float64")
    if array.shape != shape:
        raise WeightsError(f"{tensors.path}:{key}", f"shape {shape}", f"shape {array.shape}",
                           "check the head count and that the tensor belongs to this model")
    array = np.asarray(array, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise WeightsError(f"{tensors.path}:{key}", "finite entries",
                           f"{int(np.sum(~np.isfinite(array)))} NaN or Inf entries",
                           "the checkpoint is corrupt or diverged; re-export it")
    return array


_EXPORT_FIX = ("export the full attention block (query, key, value, output dense) of each requested layer, "
               "or request other layers")


def _require(tensors: _Tensors, keys: Iterable[str], what: str, fix: str = _EXPORT_FIX) -> None:
    missing = [k for k in keys if k not in tensors.keys()]
    if missing:
        shown = ", ".join(missing[:12]) + (f", ... ({len(missing)} in all)" if len(missing) > 12 else "")
        raise WeightsError(str(tensors.path), f"the tensors of {what}", f"missing keys: {shown}", fix)


def _select_layers(present: list[int], layers) -> list[int]:
    if layers is None:
        return present
    if isinstance(layers, (int, np.integer)):
        layers = [layers]
    chosen = []
    for index in layers:
        if not isinstance(index, (int, np.integer)) or int(index) not in present:
            raise WeightsError("layers", f"indices among the layers in the file {present}", repr(index),
                               f"pick from {present}")
        chosen.append(int(index))
    return sorted(set(chosen))


def _num_heads(num_heads, config: dict, metadata: dict, path: Path) -> int:
    for value, origin in ((num_heads, "num_heads"), (config.get("num_attention_heads"), "config.json"),
                          (metadata.get("num_attention_heads"), "safetensors metadata")):
        if value is None:
            continue
        try:
            count = int(value)
        except (TypeError, ValueError):
            count = -1
        if count < 1 or (origin == "num_heads" and isinstance(value, bool)):
            raise WeightsError("num_heads", f"a positive integer (from {origin})", repr(value),
                               "pass num_heads=12 (for example)")
        return count
    raise WeightsError("num_heads", "a head count: the num_heads argument, num_attention_heads in a "
                       "config.json next to the file, or in the safetensors metadata",
                       f"none for {path}", "pass num_heads=... to load_weights")


# Hugging Face names -------------------------------------------------------------------------
_QUERY = re.compile(r"^(.*?)encoder\.layer\.(\d+)\.attention\.self\.query\.weight$")


def _load_layernorm(tensors: _Tensors, stem: str, d: int, eps: float) -> LayerNormParams | None:
    for gain, bias in (("weight", "bias"), ("gamma", "beta")):
        g, b = f"{stem}.{gain}", f"{stem}.{bias}"
        keys = tensors.keys()
        if g in keys or b in keys:
            _require(tensors, (g, b), f"the LayerNorm {stem}")
            return LayerNormParams(_check(tensors, g, (d,)), _check(tensors, b, (d,)), eps)
    return None


def _load_hf(tensors: _Tensors, config: dict, num_heads, layers) -> ModelWeights:
    keys = tensors.keys()
    found = [(m.group(1), int(m.group(2))) for m in map(_QUERY.match, keys) if m]
    if not found:
        sample = ", ".join(sorted(keys)[:4])
        raise WeightsError(str(tensors.path), "Hugging Face BERT tensor names such as "
                           "'encoder.layer.0.attention.self.query.weight'",
                           f"{len(keys)} tensors, e.g. {sample or 'none'}",
                           "export a BERT-style checkpoint, or write the plain .npz format with save_plain")
    prefixes = sorted({prefix for prefix, _ in found})
    if len(prefixes) > 1:
        raise WeightsError(str(tensors.path), "one model per file (a single name prefix)",
                           f"prefixes {prefixes}", "split the checkpoint, one model per file")
    prefix = prefixes[0]
    present = sorted(index for _, index in found)
    chosen = _select_layers(present, layers)
    metadata = tensors.metadata
    heads_count = _num_heads(num_heads, config, metadata, tensors.path)
    eps = float(config.get("layer_norm_eps", metadata.get("layer_norm_eps", 1e-12)))

    first = tensors.get(f"{prefix}encoder.layer.{chosen[0]}.attention.self.query.weight")
    if first.ndim != 2:
        raise WeightsError(f"{tensors.path}:{prefix}encoder.layer.{chosen[0]}.attention.self.query.weight",
                           "a 2-d weight (out, in)", f"shape {first.shape}", "check the checkpoint")
    width, d = first.shape
    if "hidden_size" in config and int(config["hidden_size"]) != d:
        raise WeightsError(str(tensors.path), f"hidden_size {config['hidden_size']} (config.json)",
                           f"query weights reading {d} features", "use the config.json of this checkpoint")
    if width % heads_count:
        raise WeightsError("num_heads", f"a divisor of the attention width {width}", str(heads_count),
                           f"use the model's num_attention_heads ({width} = heads x head size)")
    size = width // heads_count

    loaded = {}
    for index in chosen:
        stem = f"{prefix}encoder.layer.{index}.attention"
        names = [f"{stem}.self.{p}.{t}" for p in ("query", "key", "value") for t in ("weight", "bias")]
        names += [f"{stem}.output.dense.weight", f"{stem}.output.dense.bias"]
        _require(tensors, names, f"layer {index}")
        W = {p: _check(tensors, f"{stem}.self.{p}.weight", (width, d)).T for p in ("query", "key", "value")}
        b = {p: _check(tensors, f"{stem}.self.{p}.bias", (width,)) for p in ("query", "key", "value")}
        heads = tuple(
            attention.Head(W_Q=W["query"][:, cols], W_K=W["key"][:, cols], W_V=W["value"][:, cols],
                           b_Q=b["query"][cols], b_K=b["key"][cols], b_V=b["value"][cols],
                           name=f"layer{index}.head{h}")
            for h in range(heads_count) for cols in [slice(h * size, (h + 1) * size)])
        W_O = _check(tensors, f"{stem}.output.dense.weight", (d, width)).T
        b_O = _check(tensors, f"{stem}.output.dense.bias", (d,))
        feeding = f"{prefix}embeddings.LayerNorm" if index == 0 else f"{prefix}encoder.layer.{index - 1}.output.LayerNorm"
        loaded[index] = LayerWeights(index, heads, W_O, b_O,
                                     ln_in=_load_layernorm(tensors, feeding, d, eps),
                                     ln_out=_load_layernorm(tensors, f"{stem}.output.LayerNorm", d, eps))
    name = metadata.get("name") or config.get("_name_or_path") or tensors.path.stem
    source = metadata.get("source") or str(tensors.path)
    licence = metadata.get("licence") or metadata.get("license") or config.get("license") or "unknown"
    return ModelWeights(name=name, layers=loaded, num_heads=heads_count, hidden=d, source=source,
                        licence=licence, metadata=dict(metadata))


# The plain format -----------------------------------------------------------------------------
_PLAIN_LAYER = re.compile(r"^layer(\d+)\.W_O$")


def _scalar(tensors: _Tensors, key: str, kind: type, default=None):
    if key not in tensors.keys():
        if default is None:
            _require(tensors, [key], "the plain format header", "write the file with save_plain")
        return default
    value = tensors.get(key)
    if value.shape != ():
        raise WeightsError(f"{tensors.path}:{key}", "a 0-d array (a scalar)", f"shape {value.shape}",
                           "write the file with save_plain")
    try:
        return kind(value.item())
    except (TypeError, ValueError):
        raise WeightsError(f"{tensors.path}:{key}", f"a {kind.__name__}", repr(value.item()),
                           "write the file with save_plain") from None


def _width(tensors: _Tensors, key: str, d: int) -> int:
    """The number of columns of a (d, k) projection stored under ``key``."""
    array = tensors.get(key)
    if array.ndim != 2 or array.shape[0] != d:
        raise WeightsError(f"{tensors.path}:{key}", f"a 2-d array of shape ({d}, k)", f"shape {array.shape}",
                           "store W = weight.T, tokens as rows (save_plain does)")
    return array.shape[1]


def _load_plain(tensors: _Tensors, num_heads, layers) -> ModelWeights:
    fmt = _scalar(tensors, "format", str, default="")
    if fmt != PLAIN_FORMAT:
        raise WeightsError(f"{tensors.path}:format", repr(PLAIN_FORMAT), repr(fmt) if fmt else "no format key",
                           "write the file with lipbound.numeric.weights.save_plain")
    heads_count = _scalar(tensors, "num_heads", int)
    if num_heads is not None and int(num_heads) != heads_count:
        raise WeightsError("num_heads", f"{heads_count} (stored in the file)", repr(num_heads),
                           "omit num_heads for plain files")
    d = _scalar(tensors, "hidden", int)
    present = sorted(int(m.group(1)) for m in map(_PLAIN_LAYER.match, tensors.keys()) if m)
    if not present:
        raise WeightsError(str(tensors.path), "keys layer{L}.W_O, layer{L}.head{h}.W_Q, ...",
                           "no layer", "write the file with save_plain")
    loaded = {}
    for index in _select_layers(present, layers):
        stem = f"layer{index}"
        names = [f"{stem}.head{h}.{k}" for h in range(heads_count) for k in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")]
        _require(tensors, names + [f"{stem}.W_O", f"{stem}.b_O"], f"layer {index}",
                 "write every head of the layer (save_plain does), or request other layers")
        heads = []
        for h in range(heads_count):
            key = f"{stem}.head{h}"
            d_k, d_v = (_width(tensors, f"{key}.{name}", d) for name in ("W_Q", "W_V"))
            heads.append(attention.Head(
                W_Q=_check(tensors, f"{key}.W_Q", (d, d_k)), W_K=_check(tensors, f"{key}.W_K", (d, d_k)),
                W_V=_check(tensors, f"{key}.W_V", (d, d_v)), b_Q=_check(tensors, f"{key}.b_Q", (d_k,)),
                b_K=_check(tensors, f"{key}.b_K", (d_k,)), b_V=_check(tensors, f"{key}.b_V", (d_v,)),
                score=_scalar(tensors, f"{key}.score", str, default="dot"), name=key))
        width = sum(h.d_v for h in heads)
        lns = {}
        for which in ("ln_in", "ln_out"):
            names = [f"{stem}.{which}.{k}" for k in ("gamma", "beta", "eps")]
            if any(n in tensors.keys() for n in names):
                _require(tensors, names, f"the LayerNorm {stem}.{which}")
                lns[which] = LayerNormParams(_check(tensors, names[0], (d,)), _check(tensors, names[1], (d,)),
                                             _scalar(tensors, names[2], float))
        loaded[index] = LayerWeights(index, tuple(heads), _check(tensors, f"{stem}.W_O", (width, d)),
                                     _check(tensors, f"{stem}.b_O", (d,)), **lns)
    return ModelWeights(name=_scalar(tensors, "name", str, default=tensors.path.stem), layers=loaded,
                        num_heads=heads_count, hidden=d,
                        source=_scalar(tensors, "source", str, default=str(tensors.path)),
                        licence=_scalar(tensors, "licence", str, default="unknown"))


# Public API -------------------------------------------------------------------------------------
def load_weights(path, num_heads: int | None = None, layers: Iterable[int] | int | None = None) -> ModelWeights:
    """Load attention weights from a checkpoint.

    Parameters
    ----------
    path : str or pathlib.Path
        A ``.safetensors`` file with Hugging Face BERT names, a Hugging Face model
        directory, or a plain ``.npz`` (see the module docstring for the formats).
    num_heads : int, optional
        Heads per layer; by default from ``config.json`` next to the file or the
        safetensors metadata (``num_attention_heads``).
    layers : iterable of int, optional
        Layer indices to load (default: every layer in the file).

    Returns
    -------
    ModelWeights
        Float64 copies of the tensors, ``W = weight.T`` sliced per head by columns, biases kept.

    Raises
    ------
    WeightsError
        Unreadable or missing file, not safetensors, a pickle-only checkpoint, missing keys
        (listed), wrong shapes, NaN/Inf, a head count that does not divide the width, or an
        unknown layer index; the message names the file and key and says how to fix it.
    """
    tensors, config, fmt = _open(path)
    if fmt == "plain":
        return _load_plain(tensors, num_heads, layers)
    return _load_hf(tensors, config, num_heads, layers)


def load_default(layers: Iterable[int] | int | None = None) -> ModelWeights:
    """The embedded default: layers 0 and 5 of sentence-transformers/all-MiniLM-L6-v2
    (a 6-layer BERT, hidden 384, 12 heads of size 32; Apache-2.0, see ``data/NOTICE``),
    with the LayerNorms feeding each layer (``embeddings.LayerNorm``, ``encoder.layer.4.output.LayerNorm``)."""
    if not DEFAULT_WEIGHTS.is_file():
        raise WeightsError(str(DEFAULT_WEIGHTS), "the embedded default weights", "no such file",
                           "regenerate it with python scripts/extract_default.py")
    return load_weights(DEFAULT_WEIGHTS, layers=layers)


def save_plain(model: ModelWeights, path) -> Path:
    """Write ``model`` in the plain per-head ``.npz`` format (see the module docstring).

    Returns the path written (``.npz`` is appended if missing).  Readable back with
    :func:`load_weights` and by any numpy with ``allow_pickle=False``.
    """
    if not isinstance(model, ModelWeights):
        raise WeightsError("model", "a ModelWeights", type(model).__name__, "load one with load_weights")
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
        arrays[f"layer{index}.W_O"] = layer.W_O
        arrays[f"layer{index}.b_O"] = layer.b_O
        for which in ("ln_in", "ln_out"):
            ln = getattr(layer, which)
            if ln is not None:
                arrays[f"layer{index}.{which}.gamma"] = ln.gamma
                arrays[f"layer{index}.{which}.beta"] = ln.beta
                arrays[f"layer{index}.{which}.eps"] = np.array(ln.eps)
    try:
        np.savez(path, **arrays)  # weights barely compress; plain zip is fast
    except OSError as error:
        raise WeightsError(str(path), "a writable location", f"{type(error).__name__}: {error}",
                           "choose another directory") from None
    return path
