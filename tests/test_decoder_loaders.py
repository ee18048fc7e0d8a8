"""The rotary decoders read into the one model description, checked against independent forward
passes of each architecture's published equations (tests/decoder_reference.py), on small random
checkpoints written here in every layout and on the real SmolLM2-135M-Instruct (GGUF, Q4_1).

Llama, Mistral, Qwen2, Qwen3, Gemma 2 and Gemma 3 are written as safetensors + config.json with
each family's options on (sliding windows, biases, QK-norm, sandwich norms with 1 + w gains,
soft-caps, query_pre_attn_scalar, two RoPE bases, grouped and multi-query attention); a Llama also
as GGUF with llama.cpp's permuted Q and K rows, read by the reference with RoPE on adjacent pairs
of the stored rows (llama.cpp's convention), by the loader with rotate-half on un-permuted rows.
"""

from __future__ import annotations

import json
import math

import cli_run
import decoder_reference as reference
import numpy as np
import pytest
from decoder_checkpoints import (
    LAYERS,
    SMOLLM,
    SMOLLM_GROUP,
    D,
    config_of,
    gguf_tensors,
    llama_metadata,
    random_weights,
    write_gguf,
    write_huggingface,
)

from lipbound.errors import WeightsError
from lipbound.numeric.kernels import QKNorm, Rotary
from lipbound.numeric.model import RMSNorm, load_weights
from lipbound.numeric.whole.chain import hidden_states, logits

FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma 2",
            "gemma3_text": "Gemma 3"}
IDS = [3, 17, 0, 39, 5, 5, 22, 8, 31]
TOL = 1e-10


def _compare(model, config, raw, ids, pairing="half", prefix="model."):
    states, expected_logits = reference.forward(config, raw, ids, pairing, prefix)
    got = hidden_states(model, ids)
    assert len(got) == len(states) == config["num_hidden_layers"] + 1
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(got, states))
    scale = max(float(np.max(np.abs(s))) for s in states)
    assert worst <= TOL * max(1.0, scale), worst
    out = logits(model, ids)
    assert out.shape == (len(ids), expected_logits.shape[1])
    np.testing.assert_allclose(out, expected_logits, rtol=0, atol=TOL * max(1.0, float(np.abs(expected_logits).max())))
    return worst, float(np.max(np.abs(out - expected_logits)))


# Every Hugging Face layout ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for seed, family in enumerate(FAMILIES):
        config = config_of(family)
        raw = random_weights(config, seed)
        out[family] = (write_huggingface(tmp_path_factory.mktemp(family), config, raw), config, raw)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_layout_matches_its_published_equations(checkpoints, family):
    directory, config, raw = checkpoints[family]
    model = load_weights(directory)
    assert model.layout == FAMILIES[family] and model.blocks == ("decoder",) and model.complete
    _compare(model, config, raw, IDS)


def test_the_families_facts_in_the_description(checkpoints):
    llama = load_weights(checkpoints["llama"][0])
    layer = llama.layer(0)
    assert layer.placement == "pre" and isinstance(layer.ln_in, RMSNorm) and layer.attention.groups == (0, 0, 1, 1)
    assert isinstance(layer.heads[0].kernel, Rotary) and layer.heads[0].kernel.base == 500.0
    assert layer.heads[0].causal and layer.heads[0].mask.window is None
    assert llama.lm_head is not llama.embeddings.word and not llama.metadata["tied_embeddings"]
    mistral = load_weights(checkpoints["mistral"][0])
    assert [mistral.layer(i).heads[0].mask.window for i in range(LAYERS)] == [3, 3, 3]
    qwen2 = load_weights(checkpoints["qwen2"][0])
    assert [qwen2.layer(i).heads[0].mask.window for i in range(LAYERS)] == [None, 2, 2]  # >= max_window_layers
    assert np.any(qwen2.layer(0).heads[0].b_Q) and not np.any(qwen2.layer(0).attention.b_O)
    assert qwen2.lm_head is qwen2.embeddings.word and qwen2.metadata["tied_embeddings"]
    qwen3 = load_weights(checkpoints["qwen3"][0])
    kernel = qwen3.layer(1).heads[0].kernel
    assert isinstance(kernel, QKNorm) and kernel.rotary.base == 1e6 and qwen3.layer(1).heads[0].d_k == 12
    gemma2 = load_weights(checkpoints["gemma2"][0])
    assert gemma2.layer(0).placement == "sandwich" and gemma2.metadata["norm_gain"] == "1 + w"
    assert [gemma2.layer(i).heads[0].mask.window for i in range(LAYERS)] == [2, None, 2]
    assert gemma2.layer(0).heads[0].mask.softcap == 2.0 and gemma2.logit_softcap == 3.0
    assert math.isclose(gemma2.layer(0).heads[0].kernel.scale, 6 ** -0.5)
    assert gemma2.embeddings.scale == math.sqrt(D)
    raw = checkpoints["gemma2"][2]
    np.testing.assert_array_equal(gemma2.layer(1).ln_in.gamma, 1.0 + raw["model.layers.1.input_layernorm.weight"])
    gemma3 = load_weights(checkpoints["gemma3_text"][0])
    bases = [gemma3.layer(i).heads[0].kernel.rotary.base for i in range(LAYERS)]
    assert bases == [100.0, 1e6, 100.0] and gemma3.layer(0).attention.groups == (0, 0, 0, 0)  # MQA
    assert [gemma3.layer(i).heads[0].mask.window for i in range(LAYERS)] == [2, None, 2]


def test_bfloat16_checkpoints_are_read_exactly(tmp_path):
    config = config_of("llama")
    raw = random_weights(config, 7)
    rounded = {k: ((v.astype(np.float32).view(np.uint32) >> 16) << 16).view(np.float32).astype(np.float64)
               for k, v in raw.items()}
    directory = tmp_path / "bf16"
    directory.mkdir()
    _write_bfloat16(directory / "model.safetensors", raw)
    (directory / "config.json").write_text(json.dumps(config))
    model = load_weights(directory)
    np.testing.assert_array_equal(model.embeddings.word, rounded["model.embed_tokens.weight"])
    _compare(model, config, rounded, IDS)


def _write_bfloat16(path, raw):
    """safetensors with BF16 tensors (truncated float32, as torch's bfloat16 keeps the top half)."""
    header, chunks, offset = {}, [], 0
    for name, value in raw.items():
        halves = (np.asarray(value, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + len(halves)]}
        chunks.append(halves)
        offset += len(halves)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(chunks))


# GGUF ---------------------------------------------------------------------------------------------------
def _gguf_model(tmp_path, rotary_dims=None, quantise=None, seed=3, **changes):
    config = {**config_of("llama"), **changes}
    raw = random_weights(config, seed)
    tensors = gguf_tensors(config, raw)
    if quantise is not None:
        from gguf.quants import quantize

        tensors = {k: (quantize(v.astype(np.float32), quantise), quantise) if v.ndim == 2 else v
                   for k, v in tensors.items()}
    extra = {} if rotary_dims is None else {"llama.rope.dimension_count": rotary_dims}
    return write_gguf(tmp_path / "model.gguf", llama_metadata(config, **extra), tensors)


def test_gguf_rows_are_unpermuted_and_match_llama_cpp(tmp_path):
    path = _gguf_model(tmp_path)
    model = load_weights(path)
    assert model.layout == "Llama (GGUF)" and model.metadata["rope_rows"].startswith("llama.cpp rows un-permuted")
    config, raw = reference.read_gguf(path)
    _compare(model, config, raw, IDS, pairing="interleaved")
    # un-permuted, the GGUF model is the Hugging Face one (float32-rounded) head for head
    hf = load_weights(write_huggingface(tmp_path / "hf", config_of("llama"),
                                        {k: v.astype(np.float32)
                                         for k, v in random_weights(config_of("llama"), 3).items()}))
    np.testing.assert_array_equal(model.layer(1).heads[2].W_Q, hf.layer(1).heads[2].W_Q)
    np.testing.assert_array_equal(model.layer(1).heads[2].W_K, hf.layer(1).heads[2].W_K)


def test_gguf_partial_rotary_keeps_the_interleaved_rows(tmp_path):
    path = _gguf_model(tmp_path, rotary_dims=2)
    model = load_weights(path)
    kernel = model.layer(0).heads[0].kernel
    assert (kernel.pairing, kernel.dims) == ("interleaved", 2)
    assert model.metadata["rope_rows"] == "llama.cpp rows kept, RoPE on interleaved pairs"
    config, raw = reference.read_gguf(path)
    assert config["rotary_dims"] == 2
    _compare(model, config, raw, IDS, pairing="interleaved")
    _, whole = reference.forward({**config, "rotary_dims": None}, raw, IDS, "interleaved")
    assert np.max(np.abs(logits(model, IDS) - whole)) > 1e-3  # the rotated width matters


def test_quantised_gguf_is_its_dequantised_weights(tmp_path):
    import gguf

    # rows of 32 and 64 weights: whole Q8_0 blocks
    path = _gguf_model(tmp_path, quantise=gguf.GGMLQuantizationType.Q8_0, hidden_size=32, intermediate_size=64)
    model = load_weights(path)
    assert model.metadata["quantisation"] == "Q8_0"
    config, raw = reference.read_gguf(path)
    _compare(model, config, raw, IDS, pairing="interleaved")


# SmolLM2-135M-Instruct ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm(smollm2):
    return smollm2.model


@pytest.fixture(scope="module")
def smollm_tokenizer(smollm2):
    return smollm2.tokenizer


@pytest.fixture(scope="module")
def smollm_reference():
    """``(config, raw)``: the file read by the reference, rows as llama.cpp stores them."""
    return reference.read_gguf(SMOLLM)


@SMOLLM_GROUP
def test_smollm_is_the_described_architecture(smollm):
    assert smollm.layout == "Llama (GGUF)" and smollm.blocks == ("decoder",) and smollm.complete
    assert (smollm.num_layers, smollm.hidden, smollm.num_heads, smollm.max_positions) == (30, 576, 9, 8192)
    layer = smollm.layer(0)
    assert layer.attention.groups == (0, 0, 0, 1, 1, 1, 2, 2, 2) and layer.heads[0].d_k == 64
    kernel = layer.heads[0].kernel
    assert isinstance(kernel, Rotary) and (kernel.base, kernel.pairing, kernel.rotated(64)) == (1e5, "half", 64)
    assert layer.ffn.W_gate.shape == (576, 1536) and layer.ffn.act == "silu"
    assert isinstance(layer.ln_in, RMSNorm) and layer.ln_in.eps == float(np.float32(1e-5))
    assert smollm.lm_head is smollm.embeddings.word and smollm.embeddings.word.shape == (49152, 576)
    assert smollm.metadata["quantisation"] == "Q4_1" and smollm.metadata["tied_embeddings"]


@SMOLLM_GROUP
def test_smollm_matches_llama_cpp_conventions(smollm, smollm_tokenizer, smollm_reference):
    config, raw = smollm_reference
    ids = smollm_tokenizer.encode("The capital of France is")
    _compare(smollm, config, raw, ids, pairing="interleaved")


@SMOLLM_GROUP
def test_smollm_greedy_decoding_names_paris(smollm, smollm_tokenizer):
    ids = smollm_tokenizer.encode("The capital of France is")
    for _ in range(2):
        ids.append(int(np.argmax(logits(smollm, ids)[-1])))
    assert smollm_tokenizer.decode(ids).startswith("The capital of France is Paris")


PARAGRAPH = ("The old lighthouse stood at the edge of the cliff, its white paint peeling in the salt wind. "
             "Every evening the keeper climbed the narrow stairs to light the lamp, and every morning he wrote "
             "a few lines in the logbook about the weather and the ships that had passed during the night.")


@SMOLLM_GROUP
def test_smollm_perplexity_and_the_wrong_rope_convention(smollm, smollm_tokenizer, smollm_reference):
    ids = smollm_tokenizer.encode(PARAGRAPH)
    right = reference.perplexity(logits(smollm, ids), ids)
    config, raw = smollm_reference
    _, wrong_logits = reference.forward(config, raw, ids, "half")  # rotate-half on llama.cpp's rows
    wrong = reference.perplexity(wrong_logits, ids)
    assert right < 40  # measured 27.3 over 58 tokens; a broken reader gives thousands
    assert wrong > 2 * right  # measured 81.7: the wrong convention triples it here


# Bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, argument, fragment", [
    ({"num_attention_heads": 2, "head_dim": 4}, "self_attn.q_proj.weight", "num_attention_heads 2"),
    ({"num_key_value_heads": 4}, "self_attn.k_proj.weight", "num_key_value_heads 4"),
    ({"head_dim": 6}, "self_attn.q_proj.weight", "head_dim 6"),
    ({"hidden_size": 12}, "embed_tokens.weight", "hidden_size"),
    ({"intermediate_size": 20}, "mlp.gate_proj.weight", "intermediate_size 20"),
    ({"vocab_size": 41}, "embed_tokens.weight", "vocab_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads", "divisor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling", "plain frequencies"),
    ({"model_type": "phi3"}, "model_type", "qwen3"),
    ({"tie_word_embeddings": False}, "lm_head.weight", "output projection"),
    ({"num_hidden_layers": 2}, "num_hidden_layers", "3 layers"),
    ({"layer_types": ["full_attention"]}, "layer_types", "3 entries"),
])
def test_a_config_that_disagrees_with_the_tensors_is_refused(tmp_path, change, argument, fragment):
    family = "qwen2"
    config = {**config_of(family), **change}
    directory = write_huggingface(tmp_path / "bad", config, random_weights(config_of(family), 0))
    with pytest.raises(WeightsError) as caught:
        load_weights(directory)
    message = str(caught.value)
    assert "\n" not in message and argument in caught.value.argument and fragment in message


def test_biases_the_config_does_not_declare_are_refused(tmp_path):
    config = config_of("llama")
    raw = random_weights({**config, "attention_bias": True}, 0)
    with pytest.raises(WeightsError) as caught:
        load_weights(write_huggingface(tmp_path / "biased", config, raw))
    assert caught.value.argument.endswith("self_attn.q_proj.bias") \
        and "attention_bias is false" in caught.value.expected
    model = load_weights(write_huggingface(tmp_path / "declared", {**config, "attention_bias": True}, raw))
    assert np.any(model.layer(0).attention.b_O) and np.any(model.layer(0).heads[3].b_K)
    _compare(model, {**config, "attention_bias": True}, raw, IDS)


def test_a_decoder_without_config_is_refused(tmp_path):
    directory = write_huggingface(tmp_path / "bare", config_of("llama"), random_weights(config_of("llama"), 0))
    (directory / "config.json").unlink()
    with pytest.raises(WeightsError) as caught:
        load_weights(directory)
    assert "model_type" in caught.value.argument and caught.value.got == "none"


def test_a_tied_head_that_differs_from_the_embeddings_is_refused(tmp_path):
    config = config_of("qwen2")
    raw = random_weights(config, 0)
    raw["lm_head.weight"] = raw["model.embed_tokens.weight"] + 1.0
    with pytest.raises(WeightsError) as caught:
        load_weights(write_huggingface(tmp_path / "tied", config, raw))
    assert "lm_head" in caught.value.argument and "tie_word_embeddings" in caught.value.fix


def test_a_sequence_longer_than_the_context_is_refused(checkpoints):
    model = load_weights(checkpoints["llama"][0])
    with pytest.raises(WeightsError) as caught:
        logits(model, [1] * 65)
    assert "64" in caught.value.expected and "65 tokens" in caught.value.got


@pytest.mark.parametrize("kind", ["architecture", "quantisation", "config"])
def test_the_cli_refuses_bad_checkpoints_in_one_line(tmp_path, kind):
    if kind == "architecture":
        bad = write_gguf(tmp_path / "phi.gguf", {"phi2.block_count": 1}, {"blk.0.attn_q.weight": np.ones((8, 8))},
                         arch="phi2")
    elif kind == "quantisation":
        import gguf

        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
        bad = write_gguf(tmp_path / "q81.gguf", llama_metadata(config_of("llama")),
                         {"blk.0.attn_q.weight": (np.zeros((16, size), np.uint8), gguf.GGMLQuantizationType.Q8_1)})
    else:
        config = {**config_of("llama"), "num_attention_heads": 8}
        bad = write_huggingface(tmp_path / "llama", config, random_weights(config_of("llama"), 0))
    out = tmp_path / "out.npz"
    result = cli_run.run("convert", str(bad), str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    assert len(lines) == 1 and not out.exists()
