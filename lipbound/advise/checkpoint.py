"""Edited checkpoints on disk, written atomically, read back by the one loader.

A BERT-style encoder whose heads are all plain dot-product heads and whose LayerNorms share one
``eps`` is written in its own Hugging Face layout: a folder with ``model.safetensors`` (every tensor
of the original file, the edited ones replaced, in the original's dtype), ``config.json`` (with the
new ``layer_norm_eps``) and the original's tokenizer files -- ``lipbound verify FOLDER`` reads it as
it reads the original. A Llama-family decoder (a Hugging Face folder or llama.cpp's GGUF ``llama``:
pre-norm RMSNorm layers with one ``eps``, SwiGLU, causal rotary heads on rotate-half pairs of the
whole head, grouped keys and values, no biases but the output projection's -- a mean-ablated head
leaves one, written with Llama's ``attention_bias`` and zero query, key and value biases) is written
as a Hugging Face Llama folder (:func:`write_llama`): ``model.safetensors`` under Llama's tensor
names, each array in float32 when float32 holds it exactly (a dequantised GGUF's weights do) and in
float64 otherwise, so that the model read back has the very arrays written; ``config.json``
(``model_type`` llama) and the tokenizer as ``tokenizer.json`` (a GGUF's own, built from its
metadata). A head with another score (the cosine score of QK-norm, L2 attention) has no place in
these layouts; such a model is written in lipbound's plain ``.npz`` format
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
from ..numeric.kernels import AttentionMask, DotProduct, Rotary
from ..numeric.model import LayerNorm, Model, RMSNorm, load_tokenizer, load_weights, save_plain
from ..numeric.model.components import GatedFeedForward

__all__ = ["TOKENIZER_FILES", "llama_writable", "write_and_reload", "write_checkpoint", "write_llama"]

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


def _rotary_bases(model: Model) -> set:
    return {h.kernel.base for layer in model.layers.values() for h in layer.heads if isinstance(h.kernel, Rotary)}


def llama_writable(model: Model) -> bool:
    """``model`` has exactly the parts of a Hugging Face Llama (module docstring)."""
    layers = model.layers
    if not (model.decoder_only and sorted(layers) == list(range(len(layers))) and model.embeddings is not None
            and getattr(model.embeddings, "scale", 1.0) == 1.0 and isinstance(model.final_norm, RMSNorm)
            and model.lm_head is not None and len(_rotary_bases(model)) == 1):
        return False
    norms = [model.final_norm] + [n for layer in layers.values() for n in (layer.ln_in, layer.ffn_norm)]
    if not all(isinstance(n, RMSNorm) and not np.any(n.center) for n in norms) \
            or len({float(n.eps) for n in norms}) != 1:
        return False
    for layer in layers.values():
        ffn = layer.ffn
        if (layer.placement != "pre" or layer.ln_out is not None or layer.ffn_out_norm is not None
                or layer.cross is not None or layer.attn_scale is not None or layer.ffn_scale is not None
                or not isinstance(ffn, GatedFeedForward) or ffn.act != "silu"
                or any(np.any(b) for b in (ffn.b_gate, ffn.b_up, ffn.b_down))):
            return False
        for h in layer.heads:
            if not (type(h.kernel) is Rotary and h.kernel.pairing == "half" and h.kernel.dims in (None, h.d_k)
                    and h.kernel.scale is None and h.mask == AttentionMask(causal=True) and not h.kim_values
                    and not (h.biased or np.any(h.b_V))):
                return False
    return True


def _exact_dtype(array: np.ndarray) -> np.ndarray:
    """float32 when it holds every entry exactly, else float64."""
    array = np.asarray(array, dtype=np.float64)
    single = array.astype(np.float32)
    return np.ascontiguousarray(single if np.array_equal(single, array) else array)


def write_llama(model: Model, original: str | Path, path: str | Path) -> Path:
    """Write the decoder ``model`` (:func:`llama_writable`) as a Hugging Face Llama folder at ``path``
    with the tokenizer of the checkpoint ``original`` (module docstring); returns ``path``."""
    from safetensors.numpy import save

    path = Path(path)
    first = model.layers[0]
    H, H_kv, d_k = model.num_heads, first.attention.num_groups, first.heads[0].d_k
    tensors = {"model.embed_tokens.weight": model.embeddings.word, "model.norm.weight": model.final_norm.gamma}
    biased = any(np.any(layer.attention.b_O) for layer in model.layers.values())
    tied = model.lm_head is model.embeddings.word or np.array_equal(model.lm_head, model.embeddings.word)
    if not tied:
        tensors["lm_head.weight"] = model.lm_head
    for index, layer in model.layers.items():
        stem, heads, attention = f"model.layers.{index}.", layer.heads, layer.attention
        keys = [heads[attention.group_heads(g)[0]] for g in range(attention.num_groups)]
        tensors.update({
            stem + "self_attn.q_proj.weight": np.concatenate([h.W_Q for h in heads], axis=1).T,
            stem + "self_attn.k_proj.weight": np.concatenate([h.W_K for h in keys], axis=1).T,
            stem + "self_attn.v_proj.weight": np.concatenate([h.W_V for h in keys], axis=1).T,
            stem + "self_attn.o_proj.weight": attention.W_O.T,
            stem + "mlp.gate_proj.weight": layer.ffn.W_gate.T, stem + "mlp.up_proj.weight": layer.ffn.W_up.T,
            stem + "mlp.down_proj.weight": layer.ffn.W_down.T, stem + "input_layernorm.weight": layer.ln_in.gamma,
            stem + "post_attention_layernorm.weight": layer.ffn_norm.gamma})
        if biased:
            tensors.update({stem + "self_attn.q_proj.bias": np.zeros(H * d_k),
                            stem + "self_attn.k_proj.bias": np.zeros(H_kv * d_k),
                            stem + "self_attn.v_proj.bias": np.zeros(H_kv * heads[0].d_v),
                            stem + "self_attn.o_proj.bias": attention.b_O})
    tokenizer = load_tokenizer(original)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": model.hidden,
              "num_attention_heads": H, "num_key_value_heads": H_kv, "head_dim": d_k,
              "intermediate_size": first.ffn.W_gate.shape[1], "num_hidden_layers": len(model.layers),
              "vocab_size": model.embeddings.word.shape[0], "rms_norm_eps": float(model.final_norm.eps),
              "max_position_embeddings": int(model.max_positions), "hidden_act": "silu",
              "rope_theta": float(_rotary_bases(model).pop()), "tie_word_embeddings": bool(tied),
              "attention_bias": bool(biased), "mlp_bias": False, "torch_dtype": "float32",
              **{f"{role}_token_id": tokenizer.special_id(role) for role in ("bos", "eos", "pad")
                 if tokenizer.special_id(role) is not None}}
    path.mkdir(parents=True, exist_ok=True)
    with atomic_write(path / "model.safetensors", "--output") as handle:
        handle.write(save({k: _exact_dtype(v) for k, v in tensors.items()},
                          metadata={"format": "pt", "edited_by": "lipbound advise"}))
    write_text(path / "config.json", json.dumps(config, indent=2) + "\n", "--output")
    write_text(path / "tokenizer.json", tokenizer.to_json(), "--output")
    specials = {f"{role}_token": tokenizer.vocab[i] for role, i in tokenizer.specials.items()}
    write_text(path / "tokenizer_config.json", json.dumps(specials, indent=2) + "\n", "--output")
    return path


def write_checkpoint(model: Model, original: str | Path, path: str | Path) -> Path:
    """Write ``model`` (an edit of the checkpoint folder ``original``) at ``path`` (module docstring).

    Returns the path ``lipbound verify`` reads: the folder ``path`` (Hugging Face layout) or
    ``path.npz`` (plain format).
    """
    from safetensors import safe_open
    from safetensors.numpy import save

    original, path = Path(original), Path(path)
    if llama_writable(model):
        return write_llama(model, original, path)
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

