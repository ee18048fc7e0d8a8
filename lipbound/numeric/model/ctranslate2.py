"""CTranslate2 ``model.bin`` files, read with numpy; and Whisper encoder-decoders from them.

The binary format (version 6)::

    u32 version | u16 length, spec name | u32 revision | u32 variable count
    per variable: u16 length, name | u8 rank | u32 shape[rank] | u8 dtype | u32 byte count | data
    u32 alias count | per alias: u16 length, alias | u16 length, target

(strings may end in a NUL byte; dtypes: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16,
5 bfloat16).  float16 and bfloat16 convert to float64 exactly.

A Whisper spec (``WhisperSpec``, e.g. whisper tiny.en) holds a pre-LN encoder
(``encoder/layer_i/self_attention`` with a fused QKV ``linear_0`` of shape (3d, d) and an output
``linear_1``; ``ffn``; a final ``encoder/layer_norm``) and a decoder whose layers add a causal mask
to their self-attention and a cross-attention ``attention`` (``linear_0`` the queries, ``linear_1``
the fused keys and values read from the encoder output, ``linear_2`` the output), each sub-block
behind its own ``layer_norm``.  Weights are stored as ``nn.Linear`` does, ``(out, in)``.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ..kernels import AttentionMask
from .components import FeedForward, Head, Layer, LayerNorm
from .files import sha256_of
from .huggingface import select_layers
from .transformer import Model, TransformerLayer

__all__ = ["read_ctranslate2", "load_whisper", "WHISPER_EPS"]

_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("i1"), 2: np.dtype("<i2"), 3: np.dtype("<i4"), 4: np.dtype("<f2")}
_BFLOAT16 = 5
#: LayerNorm epsilon of Whisper (torch's default, which the converted model keeps).
WHISPER_EPS = 1e-5
_ACTIVATIONS = {0: "relu", 1: "gelu_new", 3: "gelu"}  # CTranslate2's ActivationType codes


class _Reader:
    def __init__(self, path: Path):
        self.path, self.data, self.at = path, path.read_bytes(), 0

    def take(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise WeightsError(str(self.path), "a complete CTranslate2 model file", "a truncated file",
                               "re-download or re-convert the model")
        chunk = self.data[self.at:self.at + count]
        self.at += count
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def text(self) -> str:
        return self.take(self.u16()).decode("utf-8", errors="replace").rstrip("\x00")


def read_ctranslate2(path) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, {variable name: array})`` of a CTranslate2 ``model.bin``; aliases resolved."""
    reader = _Reader(Path(path))
    version = reader.u32()
    if version not in (5, 6):
        raise WeightsError(str(path), "a CTranslate2 model file of format version 5 or 6", f"version {version}",
                           "convert the model with a CTranslate2 release that writes version 6")
    spec = reader.text()
    reader.u32()  # revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(reader.u32()):
        name = reader.text()
        rank = reader.u8()
        shape = struct.unpack(f"<{rank}I", reader.take(4 * rank)) if rank else ()
        code = reader.u8()
        raw = reader.take(reader.u32())
        if code == _BFLOAT16:
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif code in _DTYPES:
            array = np.frombuffer(raw, dtype=_DTYPES[code])
        else:
            raise WeightsError(f"{path}:{name}", "a CTranslate2 dtype (float32, int8, int16, int32, float16, bfloat16)",
                               f"dtype code {code}", "re-convert the model without quantisation")
        variables[name] = array.reshape(shape)
    if reader.at < len(reader.data):
        for _ in range(reader.u32()):
            alias, target = reader.text(), reader.text()
            if target in variables:
                variables[alias] = variables[target]
    return spec, variables


def _get(variables: dict, path, name: str, shape: tuple | None = None) -> np.ndarray:
    if name not in variables:
        raise WeightsError(f"{path}:{name}", "a variable of the Whisper spec", "missing",
                           "use a complete CTranslate2 Whisper model")
    array = np.asarray(variables[name], dtype=np.float64)
    if shape is not None and array.shape != tuple(shape):
        raise WeightsError(f"{path}:{name}", f"shape {tuple(shape)}", f"shape {array.shape}",
                           "check that the file is a Whisper model")
    if not np.all(np.isfinite(array)):
        raise WeightsError(f"{path}:{name}", "finite entries", "NaN or Inf", "re-convert the model")
    return array


def _norm(variables, path, stem: str, d: int) -> LayerNorm:
    return LayerNorm(_get(variables, path, f"{stem}/gamma", (d,)), _get(variables, path, f"{stem}/beta", (d,)),
                     WHISPER_EPS)


def _linear(variables, path, stem: str, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """``(W, b)`` with ``W = weight.T`` of shape (n_in, n_out); a missing bias is zero."""
    weight = _get(variables, path, f"{stem}/weight", (n_out, n_in)).T
    bias = _get(variables, path, f"{stem}/bias", (n_out,)) if f"{stem}/bias" in variables else np.zeros(n_out)
    return weight, bias


def _heads(W_Q, b_Q, W_K, b_K, W_V, b_V, count: int, causal: bool, where: str) -> tuple[Head, ...]:
    size = W_Q.shape[1] // count
    return tuple(Head(W_Q[:, cols], W_K[:, cols], W_V[:, cols], b_Q[cols], b_K[cols], b_V[cols],
                      mask=AttentionMask(causal=causal),
                      name=f"{where}.head{h}")
                 for h in range(count) for cols in [slice(h * size, (h + 1) * size)])


def _layer(variables, path, block: str, index: int, d: int, heads: int, act: str) -> TransformerLayer:
    stem = f"{block}/layer_{index}"
    where = f"{block}.layer{index}"
    fused, fused_bias = _linear(variables, path, f"{stem}/self_attention/linear_0", d, 3 * d)
    W_O, b_O = _linear(variables, path, f"{stem}/self_attention/linear_1", d, d)
    attention = Layer(_heads(fused[:, :d], fused_bias[:d], fused[:, d:2 * d], fused_bias[d:2 * d], fused[:, 2 * d:],
                             fused_bias[2 * d:], heads, block == "decoder", where), W_O, b_O)
    cross = cross_norm = None
    if block == "decoder":
        W_Q, b_Q = _linear(variables, path, f"{stem}/attention/linear_0", d, d)
        kv, kv_bias = _linear(variables, path, f"{stem}/attention/linear_1", d, 2 * d)
        W_C, b_C = _linear(variables, path, f"{stem}/attention/linear_2", d, d)
        cross = Layer(_heads(W_Q, b_Q, kv[:, :d], kv_bias[:d], kv[:, d:], kv_bias[d:], heads, False, where + ".cross"),
                      W_C, b_C)
        cross_norm = _norm(variables, path, f"{stem}/attention/layer_norm", d)
    W_1, b_1 = _linear(variables, path, f"{stem}/ffn/linear_0", d, variables[f"{stem}/ffn/linear_0/weight"].shape[0])
    W_2, b_2 = _linear(variables, path, f"{stem}/ffn/linear_1", W_1.shape[1], d)
    return TransformerLayer(index, attention, ln_in=_norm(variables, path, f"{stem}/self_attention/layer_norm", d),
                            ffn=FeedForward(W_1, b_1, W_2, b_2, act),
                            ffn_norm=_norm(variables, path, f"{stem}/ffn/layer_norm", d),
                            cross=cross, cross_norm=cross_norm, placement="pre")


def _layers_present(variables: dict, block: str) -> list[int]:
    prefix = f"{block}/layer_"
    return sorted({int(name[len(prefix):].split("/")[0]) for name in variables
                   if name.startswith(prefix) and name[len(prefix):].split("/")[0].isdigit()})


def load_whisper(path, layers=None, num_heads: int | None = None, config: dict | None = None) -> Model:
    """A Whisper encoder-decoder from a CTranslate2 ``model.bin`` (or the directory holding it).

    ``layers`` selects layers of both stacks (counted from 0; default all; an index need only
    exist in one stack).  ``layers`` of the returned model is the encoder, ``decoder`` the
    decoder; ``final_norm`` is the encoder's final LayerNorm (the context of every
    cross-attention), ``decoder_final_norm`` the decoder's.
    """
    path = Path(path)
    file = path / "model.bin" if path.is_dir() else path
    spec, variables = read_ctranslate2(file)
    if spec != "WhisperSpec":
        raise WeightsError(str(file), "a CTranslate2 Whisper model (spec WhisperSpec)", f"spec {spec!r}",
                           "convert the model to the plain .npz format (docs/formats.md)")
    d = variables["encoder/layer_norm/gamma"].shape[0] if "encoder/layer_norm/gamma" in variables else None
    if d is None:
        raise WeightsError(f"{file}:encoder/layer_norm/gamma", "the encoder's final LayerNorm", "missing",
                           "use a complete CTranslate2 Whisper model")
    present = {block: _layers_present(variables, block) for block in ("encoder", "decoder")}
    wanted = set(select_layers(sorted(set(present["encoder"]) | set(present["decoder"])), layers))  # each in a stack
    stacks = {}
    for block in ("encoder", "decoder"):
        count = int(np.asarray(variables.get(f"{block}/num_heads", num_heads or 0)).item())
        if count < 1 or d % count:
            raise WeightsError("num_heads", f"a divisor of the width {d} (from {block}/num_heads)", str(count),
                               "give the head count as `num_heads`")
        act = _ACTIVATIONS.get(int(np.asarray(variables.get(f"{block}/activation", 3)).item()), "gelu")
        stacks[block] = ({i: _layer(variables, file, block, i, d, count, act) for i in present[block] if i in wanted},
                         len(present[block]), count)
    encoder, encoder_layers, heads = stacks["encoder"]
    decoder, decoder_layers, _ = stacks["decoder"]
    return Model(name=file.parent.name or file.name, layers=encoder, num_heads=heads, hidden=d, source=str(file),
                 licence=(config or {}).get("license", "unknown"), path=str(file), sha256=sha256_of([file]),
                 num_layers=encoder_layers, metadata={"spec": spec, "format": "ctranslate2"},
                 final_norm=_norm(variables, file, "encoder/layer_norm", d), decoder=decoder,
                 decoder_final_norm=_norm(variables, file, "decoder/layer_norm", d), decoder_layers=decoder_layers,
                 layout="Whisper (CTranslate2)")
