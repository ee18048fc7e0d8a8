"""Independent forward passes of the rotary decoders, written here from each architecture's published
equations (the Hugging Face ``modeling_<type>.py`` files, eval mode), on the raw stored tensors.

Nothing here calls lipbound's loaders or forward passes: the tests compare those against this.
Conventions of the originals: ``nn.Linear`` ``y = x W^T + b`` with W (out, in); RMSNorm
``x / sqrt(mean(x^2) + eps) * w`` (Gemma: ``* (1 + w)``); RoPE on the query and key of each head,
rotate-half (``x cos + rotate_half(x) sin`` with the frequencies repeated over the two halves) or,
for llama.cpp's stored rows, on adjacent pairs (2t, 2t + 1); grouped-query attention by repeating
each key/value head over ``H / H_kv`` query heads; causal mask, sliding window
``i - j < window`` (``|i - j| < window`` on a bidirectional head); soft-caps ``c tanh(s / c)``.

This is the one reference forward of the tests: the checkpoint loaders' tests call :func:`forward` on
Hugging Face and GGUF tensors, tests/test_decoders.py and tests/test_local_decoders.py call
:func:`layer` and :func:`attention_block` on tiny random layers, and tests/test_decoder_heads.py builds
one head from :func:`rms_norm`, :func:`rope` and :func:`attention` (with the position biases and
bidirectional masks of encoder heads).
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


def rope(x, base, pairing="half", dims=None, positions=None):
    """RoPE on x (n, ..., hd) at ``positions`` (0..n-1 unless given): rotate-half, or adjacent pairs
    (2t, 2t + 1) for any other ``pairing``; only the first ``dims`` features rotate."""
    n, hd = x.shape[0], x.shape[-1]
    dims = hd if dims is None else dims
    positions = np.arange(n, dtype=np.float64) if positions is None else np.asarray(positions, dtype=np.float64)
    inv = 1.0 / base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    angles = (positions[:, None] * inv[None, :]).reshape((n,) + (1,) * (x.ndim - 2) + (-1,))
    cos, sin = np.cos(angles), np.sin(angles)
    out = np.array(x, dtype=np.float64)
    if pairing == "half":
        first, second = x[..., :dims // 2], x[..., dims // 2:dims]
        out[..., :dims // 2] = first * cos - second * sin
        out[..., dims // 2:dims] = second * cos + first * sin
    else:  # llama.cpp's adjacent pairs
        even, odd = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2] = even * cos - odd * sin
        out[..., 1:dims:2] = odd * cos + even * sin
    return out


def attention(q, k, v, scale, window=None, softcap=None, causal=True, bias=None):
    """q (n, H, hd), k and v (n, H_kv, hd) -> (n, H hd): scores ``scale q k^T``, soft-cap, an additive
    position bias (n, n), the mask (causal and/or ``|i - j| < window``), softmax, values."""
    n, H, hd = q.shape
    repeat = H // k.shape[1]
    k, v = np.repeat(k, repeat, axis=1), np.repeat(v, repeat, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, k) * scale
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    visible = j <= i if causal else np.ones((n, n), dtype=bool)
    if window is not None:
        visible &= np.abs(i - j) < window
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


def _get(raw, name):
    return np.asarray(raw[name], dtype=np.float64)


def _proj(raw, name, h):
    """``nn.Linear``: ``h W^T + b``."""
    out = h @ _get(raw, f"{name}.weight").T
    return out + _get(raw, f"{name}.bias") if f"{name}.bias" in raw else out


def attention_block(config: dict, raw: dict, index: int, h, pairing="half", prefix="model."):
    """The attention of layer ``index`` on its normalised input h (n, d), after ``o_proj`` (n, d)."""
    kind = config["model_type"]
    gemma = kind in GEMMA
    p = f"{prefix}layers.{index}.self_attn."
    d, H = config["hidden_size"], config["num_attention_heads"]
    H_kv = config.get("num_key_value_heads") or H
    hd = config.get("head_dim") or d // H
    eps = config.get("rms_norm_eps", 1e-6)
    sliding = _layer_kind(config, index) == "sliding_attention"
    base = config.get("rope_local_base_freq", 10000.0) if kind == "gemma3_text" and sliding \
        else config.get("rope_theta", 10000.0)
    scale = config["query_pre_attn_scalar"] ** -0.5 if gemma else hd ** -0.5
    n = h.shape[0]
    q = _proj(raw, p + "q_proj", h).reshape(n, H, hd)
    k = _proj(raw, p + "k_proj", h).reshape(n, H_kv, hd)
    v = _proj(raw, p + "v_proj", h).reshape(n, H_kv, hd)
    if kind in QK_NORM:
        q = rms_norm(q, _get(raw, p + "q_norm.weight"), eps, gemma)
        k = rms_norm(k, _get(raw, p + "k_norm.weight"), eps, gemma)
    dims = config.get("rotary_dims")
    q, k = rope(q, base, pairing, dims), rope(k, base, pairing, dims)
    out = attention(q, k, v, scale, config.get("sliding_window") if sliding else None,
                    config.get("attn_logit_softcapping") if gemma else None)
    return _proj(raw, p + "o_proj", out)


def layer(config: dict, raw: dict, index: int, x, pairing="half", prefix="model."):
    """Decoder layer ``index`` on the stream x (n, d): pre-norm (Llama, Mistral, Qwen) or with Gemma's
    sandwich norms; SwiGLU, or GeGLU (tanh) for Gemma."""
    gemma = config["model_type"] in GEMMA
    eps = config.get("rms_norm_eps", 1e-6)
    p = f"{prefix}layers.{index}."
    norm = lambda name, u: rms_norm(u, _get(raw, p + name + ".weight"), eps, gemma)  # noqa: E731
    act = gelu_tanh if gemma else silu
    out = attention_block(config, raw, index, norm("input_layernorm", x), pairing, prefix)
    mlp = lambda u: _proj(raw, p + "mlp.down_proj", act(_proj(raw, p + "mlp.gate_proj", u))  # noqa: E731
                          * _proj(raw, p + "mlp.up_proj", u))
    if gemma:
        x = x + norm("post_attention_layernorm", out)
        return x + norm("post_feedforward_layernorm", mlp(norm("pre_feedforward_layernorm", x)))
    x = x + out
    return x + mlp(norm("post_attention_layernorm", x))


def forward(config: dict, raw: dict, ids, pairing="half", prefix="model."):
    """``(states, logits)``: the stream before every layer and after the last (raw, before the
    final norm), and the logits (n, vocab); ``raw`` maps Hugging Face tensor names to arrays."""
    gemma = config["model_type"] in GEMMA
    eps = config.get("rms_norm_eps", 1e-6)
    x = _get(raw, f"{prefix}embed_tokens.weight")[np.asarray(ids)]
    if gemma:
        x = x * math.sqrt(config["hidden_size"])
    states = [x]
    for index in range(config["num_hidden_layers"]):
        x = layer(config, raw, index, x, pairing, prefix)
        states.append(x)
    final = rms_norm(x, _get(raw, f"{prefix}norm.weight"), eps, gemma)
    head = _get(raw, "lm_head.weight") if "lm_head.weight" in raw and not config.get("tie_word_embeddings") \
        else _get(raw, f"{prefix}embed_tokens.weight")
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
