"""Edited checkpoints on disk, written atomically, read back by the one loader.

A BERT-style encoder whose heads are all plain dot-product heads and whose LayerNorms share one
``eps`` is written in its own Hugging Face layout: a folder with ``model.safetensors`` (every tensor
of the original file, the edited ones replaced, in the original's dtype), ``config.json`` (with the
new ``layer_norm_eps``) and the original's tokenizer files -- ``lipbound verify FOLDER`` reads it as
it reads the original.  A head with another score (the cosine score of QK-norm, L2 attention) has
no place in that layout; such a model is written in lipbound's plain ``.npz`` format
(:func:`lipbound.numeric.model.save_plain`), which ``lipbound verify`` reads too.

Every number advise reports about an edited model is computed on the model read back from the
written file (:func:`write_and_reload`), so ``verify`` on the file reproduces it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import WeightsError
from ..io import atomic_write, write_text
from ..numeric.kernels import DotProduct
from ..numeric.model import LayerNorm, Model, load_weights, save_plain

__all__ = ["TOKENIZER_FILES", "write_and_reload", "write_checkpoint"]

#: files copied beside an edited Hugging Face checkpoint
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def _layernorms(model: Model) -> list:
    norms = [getattr(layer, slot) for layer in model.layers.values() for slot in ("ln_in", "ln_out", "ffn_norm")]
    return [n for n in norms + [getattr(model.embeddings, "norm", None)] if n is not None]


def _bert_writable(model: Model) -> bool:
    heads = [h for layer in model.layers.values() for h in layer.heads]
    norms = _layernorms(model)
    return (model.layout in ("BERT", "RoBERTa") and not model.decoder and all(layer.placement == "post"
            for layer in model.layers.values())
            and all(type(h.kernel) is DotProduct and h.kernel.scale is None and h.mask.plain and not h.kim_values
                    for h in heads)
            and all(isinstance(n, LayerNorm) for n in norms) and len({float(n.eps) for n in norms}) == 1)


def _bert_tensors(model: Model) -> dict[str, np.ndarray]:
    """The model's arrays under the BERT layout's tensor names (``weight = W^T``)."""
    out = {}
    for index, layer in model.layers.items():
        stem = f"encoder.layer.{index}."
        heads = layer.heads
        for name, attr, bias in (("query", "W_Q", "b_Q"), ("key", "W_K", "b_K"), ("value", "W_V", "b_V")):
            out[f"{stem}attention.self.{name}.weight"] = np.concatenate([getattr(h, attr) for h in heads], axis=1).T
            out[f"{stem}attention.self.{name}.bias"] = np.concatenate([getattr(h, bias) for h in heads])
        out[f"{stem}attention.output.dense.weight"] = layer.attention.W_O.T
        out[f"{stem}attention.output.dense.bias"] = layer.attention.b_O
        for name, norm in (("attention.output.LayerNorm", layer.ln_out), ("output.LayerNorm", layer.ffn_norm)):
            out[f"{stem}{name}.weight"], out[f"{stem}{name}.bias"] = norm.gamma, norm.beta
        out[f"{stem}intermediate.dense.weight"], out[f"{stem}intermediate.dense.bias"] = layer.ffn.W_1.T, layer.ffn.b_1
        out[f"{stem}output.dense.weight"], out[f"{stem}output.dense.bias"] = layer.ffn.W_2.T, layer.ffn.b_2
    e = model.embeddings
    out["embeddings.word_embeddings.weight"] = e.word
    out["embeddings.position_embeddings.weight"] = e.position
    if e.token_type is not None:
        out["embeddings.token_type_embeddings.weight"] = e.token_type
    out["embeddings.LayerNorm.weight"], out["embeddings.LayerNorm.bias"] = e.norm.gamma, e.norm.beta
    return out


def write_checkpoint(model: Model, original: str | Path, path: str | Path) -> Path:
    """Write ``model`` (an edit of the checkpoint folder ``original``) at ``path`` (module docstring).

    Returns the path ``lipbound verify`` reads: the folder ``path`` (Hugging Face layout) or
    ``path.npz`` (plain format).
    """
    from safetensors import safe_open
    from safetensors.numpy import save

    original, path = Path(original), Path(path)
    if not _bert_writable(model):
        return save_plain(model, path.with_name(path.name + ".npz"))
    files = sorted(original.glob("*.safetensors"))
    if len(files) != 1 or not (original / "config.json").is_file():
        raise WeightsError(str(original), "a folder with one model.safetensors and config.json", "another layout",
                           "advise edits Hugging Face BERT folders; convert the model with lipbound convert")
    tensors = {}
    with safe_open(str(files[0]), "np") as handle:
        names = list(handle.keys())
        prefix = next((k[: -len("embeddings.word_embeddings.weight")] for k in names
                       if k.endswith("embeddings.word_embeddings.weight")), "")
        for key in names:
            tensors[key] = handle.get_tensor(key)
    for key, value in _bert_tensors(model).items():
        full = prefix + key
        if full not in tensors:
            raise WeightsError(str(files[0]), f"a tensor {full}", "missing", "edit a complete BERT checkpoint")
        tensors[full] = np.ascontiguousarray(value, dtype=tensors[full].dtype)
    path.mkdir(parents=True, exist_ok=True)
    with atomic_write(path / files[0].name, "--output") as handle:
        handle.write(save(tensors, metadata={"format": "pt", "edited_by": "lipbound advise"}))
    config = json.loads((original / "config.json").read_text())
    config["layer_norm_eps"] = float(_layernorms(model)[0].eps)
    write_text(path / "config.json", json.dumps(config, indent=2) + "\n", "--output")
    for name in TOKENIZER_FILES:
        if (original / name).is_file():
            with atomic_write(path / name, "--output") as handle:
                handle.write((original / name).read_bytes())
    return path


def write_and_reload(model: Model, original: str | Path, path: str | Path) -> Model:
    """Write ``model`` with :func:`write_checkpoint` and read it back with the one loader."""
    written = write_checkpoint(model, original, path)
    reloaded = load_weights(str(written))
    if reloaded.num_layers != model.num_layers:
        raise WeightsError(str(written), f"{model.num_layers} layers", str(reloaded.num_layers), "report this")
    return reloaded

