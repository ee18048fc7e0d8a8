"""Independent forward passes of the rotary decoders, written here from each architecture's published
equations (the Hugging Face ``modeling_<type>.py`` files, eval mode), on the raw stored tensors.

Nothing here calls lipbound's loaders or forward passes: the tests compare those against this.
Conventions of the originals: ``nn.Linear`` ``y = x W^T + b`` with W (out, in); RMSNorm
``x / sqrt(mean(x^2) + eps) * w`` (Gemma: ``* (1 + w)``); RoPE on the query and key of each head,
rotate-half (``x cos + rotate_half(x) sin`` with the frequencies repeated over the two halves) or,
for llama.cpp's stored rows, on adjacent pairs (2t, 2t + 1); grouped-query attention by repeating
each key/value head over ``H / H_kv`` query heads; causal mask, sliding window
``i - j < window``; soft-caps ``c tanh(s / c)``.
"""

from __future__ import annotations

import math

import numpy as np

GEMMA = ("gemma2", "gemma3_text")
QK_NORM = ("qwen3", "gemma3_text")


def rms_norm(x, w, eps, gemma=False):
    x = np.asarray(x, dtype=np.float64)
    out = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return out * ((1.0 + w) if gemma else w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope(x, base, pairing="half", dims=None):
    """RoPE on x (n, heads, hd) at positions 0..n-1."""
    n, _, hd = x.shape
    dims = hd if dims is None else dims
    inv = 1.0 / base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    angles = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]  # (n, dims/2)
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    out = x.copy()
    if pairing == "half":
        first, second = x[..., :dims // 2], x[..., dims // 2:dims]
        out[..., :dims // 2] = first * cos - second * sin
        out[..., dims // 2:dims] = second * cos + first * sin
    else:  # llama.cpp's adjacent pairs
        even, odd = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2] = even * cos - odd * sin
        out[..., 1:dims:2] = odd * cos + even * sin
    return out


def attention(q, k, v, scale, window=None, softcap=None):
    """q (n, H, hd), k and v (n, H_kv, hd) -> (n, H hd)."""
    n, H, hd = q.shape
    repeat = H // k.shape[1]
    k, v = np.repeat(k, repeat, axis=1), np.repeat(v, repeat, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, k) * scale
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    visible = j <= i
    if window is not None:
        visible &= (i - j) < window
    scores = np.where(visible[None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, v).reshape(n, H * hd)


def _layer_kind(config, i):
    types = config.get("layer_types")
    if types is not None:
        return types[i]
    kind = config["model_type"]
    if kind == "mistral" and config.get("sliding_window") is not None:
        return "sliding_attention"
    if kind in ("qwen2", "qwen3") and config.get("use_sliding_window") and i >= config.get("max_window_layers", 28):
        return "sliding_attention"
    if kind == "gemma2":
        return "sliding_attention" if i % 2 == 0 else "full_attention"
    if kind == "gemma3_text":
        pattern = config.get("sliding_window_pattern", 6)
        return "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
    return "full_attention"


def forward(config: dict, raw: dict, ids, pairing="half", prefix="model."):
    """``(states, logits)``: the stream before every layer and after the last (raw, before the
    final norm), and the logits (n, vocab); ``raw`` maps Hugging Face tensor names to arrays."""
    kind = config["model_type"]
    gemma = kind in GEMMA
    get = lambda name: np.asarray(raw[name], dtype=np.float64)  # noqa: E731
    d, H = config["hidden_size"], config["num_attention_heads"]
    H_kv = config.get("num_key_value_heads") or H
    hd = config.get("head_dim") or d // H
    eps = config.get("rms_norm_eps", 1e-6)
    x = get(f"{prefix}embed_tokens.weight")[np.asarray(ids)]
    if gemma:
        x = x * math.sqrt(d)
    scale = config["query_pre_attn_scalar"] ** -0.5 if gemma else hd ** -0.5
    states = [x]
    for layer in range(config["num_hidden_layers"]):
        p = f"{prefix}layers.{layer}."
        sliding = _layer_kind(config, layer) == "sliding_attention"
        base = config.get("rope_local_base_freq", 10000.0) if kind == "gemma3_text" and sliding \
            else config.get("rope_theta", 10000.0)

        def proj(name, h):
            out = h @ get(f"{p}{name}.weight").T
            return out + get(f"{p}{name}.bias") if f"{p}{name}.bias" in raw else out

        h = rms_norm(x, get(p + "input_layernorm.weight"), eps, gemma)
        n = h.shape[0]
        q = proj("self_attn.q_proj", h).reshape(n, H, hd)
        k = proj("self_attn.k_proj", h).reshape(n, H_kv, hd)
        v = proj("self_attn.v_proj", h).reshape(n, H_kv, hd)
        if kind in QK_NORM:
            q = rms_norm(q, get(p + "self_attn.q_norm.weight"), eps, gemma)
            k = rms_norm(k, get(p + "self_attn.k_norm.weight"), eps, gemma)
        dims = config.get("rotary_dims")
        q, k = rope(q, base, pairing, dims), rope(k, base, pairing, dims)
        out = proj("self_attn.o_proj", attention(q, k, v, scale, config.get("sliding_window") if sliding else None,
                                                 config.get("attn_logit_softcapping") if gemma else None))
        act = gelu_tanh if gemma else silu
        if gemma:
            x = x + rms_norm(out, get(p + "post_attention_layernorm.weight"), eps, True)
            h = rms_norm(x, get(p + "pre_feedforward_layernorm.weight"), eps, True)
            mlp = proj("mlp.down_proj", act(proj("mlp.gate_proj", h)) * proj("mlp.up_proj", h))
            x = x + rms_norm(mlp, get(p + "post_feedforward_layernorm.weight"), eps, True)
        else:
            x = x + out
            h = rms_norm(x, get(p + "post_attention_layernorm.weight"), eps)
            x = x + proj("mlp.down_proj", act(proj("mlp.gate_proj", h)) * proj("mlp.up_proj", h))
        states.append(x)
    final = rms_norm(x, get(f"{prefix}norm.weight"), eps, gemma)
    head = get("lm_head.weight") if "lm_head.weight" in raw and not config.get("tie_word_embeddings") \
        else get(f"{prefix}embed_tokens.weight")
    logits = final @ head.T
    if gemma and config.get("final_logit_softcapping") is not None:
        c = config["final_logit_softcapping"]
        logits = c * np.tanh(logits / c)
    return states, logits


def perplexity(logits, ids) -> float:
    """exp of the mean negative log-likelihood of ids[1:] given the prefixes."""
    z = logits[:-1] - logits[:-1].max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), np.asarray(ids[1:])].mean()))


# llama.cpp's GGUF ``llama`` files, read with the gguf package and renamed -------------------------
GGUF_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
GGUF_LAYER_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                    "ffn_down": "mlp.down_proj"}


def read_gguf(path):
    """``(config, raw)``: a llama GGUF file's dequantised tensors under Hugging Face names, rows as
    stored (llama.cpp's order), and its hyper-parameters as config.json keys."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    raw = {}
    for tensor in reader.tensors:
        name = tensor.name
        if name in GGUF_NAMES:
            name = GGUF_NAMES[name]
        else:
            _, layer, part, suffix = name.split(".")
            name = f"model.layers.{layer}.{GGUF_LAYER_NAMES[part]}.{suffix}"
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        raw[name] = values.reshape([int(n) for n in reversed(tensor.shape.tolist())])
    config = {"model_type": "llama", "hidden_size": field("llama.embedding_length"),
              "num_attention_heads": field("llama.attention.head_count"),
              "num_key_value_heads": field("llama.attention.head_count_kv"),
              "num_hidden_layers": field("llama.block_count"),
              "rms_norm_eps": field("llama.attention.layer_norm_rms_epsilon"),
              "rope_theta": field("llama.rope.freq_base"), "tie_word_embeddings": "lm_head.weight" not in raw}
    if "llama.rope.dimension_count" in reader.fields:
        config["rotary_dims"] = field("llama.rope.dimension_count")
    return config, raw
