"""Reading checkpoint files without ever unpickling: safetensors, plain ``.npz``, config.json.

A file's format is decided by its first bytes, not its name: ``PK\\x03\\x04`` is a zip (an
``.npz`` archive), ``GGUF`` a llama.cpp file (read by :mod:`.gguf`), a little-endian 8-byte
length followed by a JSON object is safetensors (bfloat16 tensors are widened to float32
exactly), the bytes of a pickle (``\\x80`` and a protocol number, or a zip holding ``data.pkl``) are refused
with a message saying so, and anything else is reported as unrecognised.  Every file read is
hashed (sha256), so reports and witnesses can name exactly the weights they used.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ...errors import WeightsError

__all__ = ["TensorSource", "open_checkpoint", "read_config", "sha256_of", "sniff_format", "PICKLE_SUFFIXES"]

PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".h5", ".msgpack"}
_CONVERT = ("convert it once, in a trusted environment: python -c \"import torch; "
            "from safetensors.torch import save_file; save_file(torch.load('pytorch_model.bin'), "
            "'model.safetensors')\"")


def sha256_of(paths: Iterable[Path]) -> str:
    """sha256 of one file, or of the sorted files' hashes joined (a model split in shards)."""
    digests = []
    for path in sorted(Path(p) for p in paths):
        h = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                h.update(chunk)
        digests.append(h.hexdigest())
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("".join(digests).encode()).hexdigest()


class TensorSource:
    """Read-only named tensors of one checkpoint, with the files they come from.  Abstract."""

    path: Path
    files: list[Path]
    metadata: dict
    kind: str

    def keys(self) -> set[str]:
        raise NotImplementedError

    def get(self, key: str) -> np.ndarray:
        raise NotImplementedError

    def shape(self, key: str) -> tuple:
        """The shape of tensor ``key`` (a format that stores it reads no data)."""
        return tuple(self.get(key).shape)

    @property
    def sha256(self) -> str:
        if not hasattr(self, "_sha256"):
            self._sha256 = sha256_of(self.files)
        return self._sha256

    def tensor(self, key: str, shape: tuple | None = None) -> np.ndarray:
        """The tensor ``key`` as float64, checked numeric, of ``shape`` (if given) and finite."""
        if key not in self.keys():
            raise WeightsError(f"{self.path}:{key}", "a tensor of this name", "missing",
                               "check that the checkpoint is complete and of the layout named in the message")
        array = self.get(key)
        if array.dtype.kind not in "fiu":
            raise WeightsError(f"{self.path}:{key}", "a numeric tensor", f"dtype {array.dtype}",
                               "store weights as float16, float32 or float64")
        if shape is not None and array.shape != tuple(shape):
            raise WeightsError(f"{self.path}:{key}", f"shape {tuple(shape)}", f"shape {array.shape}",
                               "check the head count and that the tensor belongs to this model")
        array = np.asarray(array, dtype=np.float64)
        if not np.all(np.isfinite(array)):
            raise WeightsError(f"{self.path}:{key}", "finite entries",
                               f"{int(np.sum(~np.isfinite(array)))} NaN or Inf entries",
                               "the checkpoint is corrupt or diverged; re-export it")
        return array

    def require(self, keys: Iterable[str], what: str, fix: str) -> None:
        missing = [k for k in keys if k not in self.keys()]
        if missing:
            shown = ", ".join(missing[:12]) + (f", ... ({len(missing)} in all)" if len(missing) > 12 else "")
            raise WeightsError(str(self.path), f"the tensors of {what}", f"missing keys: {shown}", fix)


class _Safetensors(TensorSource):
    kind = "safetensors"

    def __init__(self, files: list[Path], label: Path):
        from safetensors import safe_open

        self.path, self.files, self.metadata = label, list(files), {}
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
                                   "check that it is not truncated; re-export with safetensors.numpy.save_file"
                                   ) from None

    def keys(self) -> set[str]:
        return set(self._where)

    def shape(self, key: str) -> tuple:
        from safetensors import safe_open

        with safe_open(str(self._where[key]), framework="numpy") as handle:
            return tuple(handle.get_slice(key).get_shape())

    def get(self, key: str) -> np.ndarray:
        from safetensors import safe_open

        try:
            with safe_open(str(self._where[key]), framework="numpy") as handle:
                if handle.get_slice(key).get_dtype() == "BF16":
                    return _bfloat16(self._where[key], key)
                return handle.get_tensor(key)
        except WeightsError:
            raise
        except Exception as error:
            raise WeightsError(f"{self._where[key]}:{key}", "a float tensor (bfloat16, float16, float32, float64)",
                               f"{type(error).__name__}: {error}", "convert the checkpoint to float32") from None


def _bfloat16(file: Path, key: str) -> np.ndarray:
    """A bfloat16 tensor of a safetensors file as float32, exactly (bfloat16 is the top half of a
    float32; numpy has no bfloat16 type, so the bytes are read from the header's offsets)."""
    with open(file, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        entry = json.loads(handle.read(length))[key]
    begin, end = entry["data_offsets"]
    halves = np.fromfile(file, dtype="<u2", count=(end - begin) // 2, offset=8 + length + begin)
    return (halves.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


class _Npz(TensorSource):
    kind = "npz"

    def __init__(self, path: Path):
        self.path, self.files, self.metadata = path, [path], {}
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except zipfile.BadZipFile as error:
            raise WeightsError(str(path), "an .npz archive (a zip of .npy arrays)", f"a damaged zip file ({error})",
                               "re-write the weights with lipbound.numeric.model.save_plain") from None
        if any(name.endswith(".pkl") for name in names) or not all(name.endswith(".npy") for name in names):
            raise WeightsError(str(path), "an .npz archive of .npy arrays",
                               f"a zip holding {', '.join(sorted(names)[:4])}"
                               + (" (a pickled torch checkpoint)" if any(n.endswith(".pkl") for n in names) else ""),
                               "lipbound never unpickles; " + _CONVERT)
        try:
            self._archive = np.load(path, allow_pickle=False)
        except Exception as error:
            raise WeightsError(str(path), "an .npz archive of plain arrays", f"{type(error).__name__}: {error}",
                               "re-write the weights with lipbound.numeric.model.save_plain") from None

    def keys(self) -> set[str]:
        return set(self._archive.files)

    def get(self, key: str) -> np.ndarray:
        try:
            return self._archive[key]
        except ValueError as error:
            raise WeightsError(f"{self.path}:{key}", "a plain numeric or string array",
                               f"an object array ({error})",
                               "lipbound never unpickles; store numbers and strings only (save_plain)") from None


def sniff_format(path: Path) -> str:
    """``"zip"``, ``"safetensors"``, ``"gguf"``, ``"pickle"``, ``"ctranslate2"`` or ``"unknown"`` from
    the first bytes."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
            size = path.stat().st_size
    except OSError as error:
        raise WeightsError(str(path), "a readable file", f"{type(error).__name__}: {error}",
                           "check the path and its permissions") from None
    if head[:4] == b"PK\x03\x04":
        return "zip"
    if head[:4] == b"GGUF":
        return "gguf"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if len(head) >= 9:
        (length,) = struct.unpack("<Q", head[:8])
        if 2 <= length <= size - 8 and head[8:9] == b"{":
            return "safetensors"
    if len(head) >= 4 and struct.unpack("<I", head[:4])[0] in (5, 6) and path.name == "model.bin":
        return "ctranslate2"
    return "unknown"


def open_checkpoint(path) -> tuple[TensorSource | Path, dict]:
    """The tensor source of a file or model directory and its config.json contents ({} if none).

    A CTranslate2 ``model.bin`` and a GGUF file are returned as their paths (each read by its own
    loader; :func:`sniff_format` tells them apart).
    """
    if not isinstance(path, (str, Path)):
        raise WeightsError("path", "a file or directory path", type(path).__name__, "pass the checkpoint's path")
    path = Path(path)
    if not path.exists():
        raise WeightsError(str(path), "an existing file or directory", "no such path",
                           "check the path")
    if path.is_dir():
        config = read_config(path / "config.json")
        files = sorted(path.glob("*.safetensors"))
        if files:
            return _Safetensors(files, path), config
        if (path / "model.bin").is_file() and sniff_format(path / "model.bin") == "ctranslate2":
            return path / "model.bin", config
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise WeightsError(str(path), "a model directory with *.safetensors weights",
                               f"only pickle-based weights ({', '.join(pickles)})", _CONVERT)
        raise WeightsError(str(path), "a model directory with *.safetensors weights (or a CTranslate2 model.bin)",
                           "no weight file", "point to the directory holding model.safetensors")
    kind = sniff_format(path)
    if kind == "zip":
        return _Npz(path), {}
    if kind == "safetensors":
        return _Safetensors([path], path), read_config(path.with_name("config.json"))
    if kind == "ctranslate2":
        return path, read_config(path.with_name("config.json"))
    if kind == "gguf":
        return path, {}
    if kind == "pickle" or path.suffix in PICKLE_SUFFIXES:
        raise WeightsError(str(path), "a .safetensors file, a model directory or a plain .npz",
                           "a pickle-based checkpoint; lipbound never unpickles", _CONVERT)
    raise WeightsError(str(path), "a .safetensors file, a GGUF file, a plain .npz archive, a CTranslate2 model.bin "
                       "or a model directory",
                       "a file in none of these formats (its first bytes match no known header)",
                       "check that the file is a checkpoint and not truncated or corrupted")


def read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise WeightsError(str(path), "a JSON model configuration", f"unreadable JSON ({error})",
                           "fix or remove config.json") from None
    if not isinstance(config, dict):
        raise WeightsError(str(path), "a JSON object", type(config).__name__, "fix or remove config.json")
    return config
