"""GGUF files: metadata, dequantisation of every tensor type the gguf package supports, the real
SmolLM2-135M-Instruct file, and the files lipbound refuses.

Block formats are checked on hand-made blocks against ggml's definitions (Q8_0: ``w = d q``, q
int8; Q4_1: ``w = d q + m``, q the low then the high nibbles of 16 bytes), and every other type
against ``gguf.quants.dequantize`` on the same bytes (the definition lipbound adopts).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from decoder_checkpoints import SMOLLM, SMOLLM_GROUP, write_gguf
from gguf.quants import _type_traits, quantize

from lipbound.errors import WeightsError
from lipbound.numeric.model.gguf import GGUFSource, _reader_class, dequantisable_types, dequantise, gguf_config

Q = gguf.GGMLQuantizationType


# The real file -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm():
    return GGUFSource(SMOLLM)


@SMOLLM_GROUP
def test_smollm_metadata_as_config(smollm):
    config = gguf_config(smollm)
    assert config == {"model_type": "llama", "num_hidden_layers": 30, "max_position_embeddings": 8192,
                      "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                      "num_key_value_heads": 3, "rms_norm_eps": float(np.float32(1e-5)), "rope_theta": 1e5,
                      "rotary_dims": 64, "vocab_size": 49152, "tie_word_embeddings": True}
    assert smollm.metadata["quantisation"] == "Q4_1" and smollm.metadata["licence"] == "apache-2.0"
    assert smollm.metadata["tensor_types"] == "F32: 61, Q4_1: 210, Q8_0: 1"


@SMOLLM_GROUP
def test_smollm_tensors_dequantised_in_torch_orientation(smollm):
    assert smollm.shape("token_embd.weight") == (49152, 576)
    assert smollm.shape("blk.0.attn_k.weight") == (192, 576)  # (out, in): 3 KV heads of 64
    assert smollm.shape("blk.0.ffn_down.weight") == (576, 1536)
    norm = smollm.tensor("blk.0.attn_norm.weight", (576,))
    assert norm.dtype == np.float64 and np.all(np.isfinite(norm))
    embeddings = smollm.tensor("token_embd.weight")
    # Q8_0: every block of 32 is d times integers in [-127, 127]
    blocks = embeddings.reshape(-1, 32)
    scale = np.abs(blocks).max(axis=1, keepdims=True)
    steps = np.where(scale > 0, blocks / np.where(scale > 0, scale, 1) * 127, 0)
    assert np.max(np.abs(steps - np.round(steps))) < 1e-3
    # Q4_1: every block of 32 holds at most 16 values, evenly spaced
    block = smollm.tensor("blk.0.attn_q.weight").reshape(-1, 32)[0]
    values = np.unique(block)
    assert len(values) <= 16
    spacing = np.diff(values)
    np.testing.assert_allclose(spacing / spacing.min(), np.round(spacing / spacing.min()), atol=1e-4)


# Block formats by hand -------------------------------------------------------------------------------
def test_q8_0_block_is_scale_times_int8():
    d, q = np.float16(0.0371), np.arange(-16, 16, dtype=np.int8)
    block = np.concatenate([np.frombuffer(d.tobytes(), np.uint8), q.view(np.uint8)])[None, :]
    values = dequantise(block, Q.Q8_0)
    np.testing.assert_array_equal(values, (np.float32(d) * q.astype(np.float32))[None, :])


def test_q4_1_block_is_scale_times_nibble_plus_minimum():
    d, m = np.float16(0.125), np.float16(-0.8125)
    nibbles = np.array([(3 * j) % 16 for j in range(32)], dtype=np.uint8)
    packed = nibbles[:16] | (nibbles[16:] << 4)  # element j in the low nibble of byte j, j + 16 in the high
    block = np.concatenate([np.frombuffer(d.tobytes(), np.uint8), np.frombuffer(m.tobytes(), np.uint8), packed])
    values = dequantise(block[None, :], Q.Q4_1)
    np.testing.assert_array_equal(values[0], 0.125 * nibbles - 0.8125)  # exact: few bits


# Every type the package dequantises ------------------------------------------------------------------
def _block_bytes(kind, rng, rows=2):
    block, size = gguf.GGML_QUANT_SIZES[kind]
    cols = block * max(1, 256 // block)
    data = rng.normal(0, 1, (rows, cols)).astype(np.float32)
    try:
        return quantize(data, kind), data
    except NotImplementedError:  # no quantiser in the package: random blocks whose values are finite
        for _ in range(200):
            raw = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
            with np.errstate(all="ignore"):
                if np.all(np.isfinite(gguf.quants.dequantize(raw, kind))):
                    return raw, None
    raise AssertionError(f"no finite random block of {kind.name}")


def test_every_type_the_package_dequantises(tmp_path):
    rng = np.random.default_rng(0)
    kinds = sorted(_type_traits, key=lambda k: k.name)
    assert {k.name for k in kinds} | {"F32", "F16", "F64"} == set(dequantisable_types())
    assert {"Q4_1", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "BF16"} <= set(dequantisable_types())
    tensors, originals = {}, {}
    for kind in kinds:
        raw, original = _block_bytes(kind, rng)
        tensors[f"t.{kind.name}"] = (raw, kind)
        originals[kind.name] = original
    plain = rng.normal(0, 1, (3, 32))
    tensors["t.F16"] = (plain.astype(np.float16), Q.F16)
    tensors["t.F64"] = (plain.astype(np.float64), Q.F64)
    source = GGUFSource(write_gguf(tmp_path / "types.gguf", {}, tensors, arch="llama"))
    for kind in kinds:
        raw, _ = tensors[f"t.{kind.name}"]
        got = source.tensor(f"t.{kind.name}")
        assert got.dtype == np.float64 and got.shape == source.shape(f"t.{kind.name}")
        np.testing.assert_array_equal(got, gguf.quants.dequantize(raw, kind).astype(np.float64))
        if originals[kind.name] is not None:  # the quantisation is the data, roughly
            assert np.max(np.abs(got - originals[kind.name])) < 2.0
    np.testing.assert_array_equal(source.tensor("t.F16"), plain.astype(np.float16).astype(np.float64))
    np.testing.assert_array_equal(source.tensor("t.F64"), plain)


def test_the_plain_slice_reader_reads_what_the_packages_reader_reads(tmp_path):
    rng = np.random.default_rng(2)
    words = [f"tok{i}\u0120\u00e9" * (i % 3 + 1) for i in range(300)]
    metadata = {"tokenizer.ggml.tokens": words, "tokenizer.ggml.scores": [float(i) / 7 for i in range(300)],
                "tokenizer.ggml.merges": [f"{a} {b}" for a, b in zip(words, words[1:])],
                "llama.block_count": 2, "llama.rope.freq_base": 1e4, "general.name": "plain", "x.flag": True}
    quantised = quantize(rng.normal(0, 1, (2, 32)).astype(np.float32), Q.Q8_0)
    tensors = {"t.F32": rng.normal(0, 1, (3, 32)), "t.Q8_0": (quantised, Q.Q8_0)}
    path = str(write_gguf(tmp_path / "plain.gguf", metadata, tensors))
    ours, theirs = _reader_class()(path), gguf.GGUFReader(path)
    assert type(ours) is not gguf.GGUFReader  # this gguf release slices through the plain view
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data)
        assert [p.tobytes() for p in mine.parts] == [p.tobytes() for p in field.parts]
        assert str(mine.contents()) == str(field.contents())
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, tensor in zip(ours.tensors, theirs.tensors):
        assert mine.tensor_type == tensor.tensor_type and mine.data_offset == tensor.data_offset
        np.testing.assert_array_equal(mine.data, tensor.data)


# Refusals ---------------------------------------------------------------------------------------------
def _one_line(error: WeightsError) -> str:
    message = str(error)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("kind", ["Q8_1", "I32"])
def test_tensor_types_without_dequantiser_are_refused_at_open(tmp_path, kind):
    rng = np.random.default_rng(1)
    if kind == "I32":
        tensors = {"t.ok": rng.normal(0, 1, (2, 32)), "t.bad": (np.arange(64, dtype=np.int32).reshape(2, 32), Q.I32)}
    else:
        block, size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
        tensors = {"t.ok": rng.normal(0, 1, (2, 32)),
                   "t.bad": (rng.integers(0, 256, (2, size), dtype=np.uint8), Q.Q8_1)}
    with pytest.raises(WeightsError) as caught:
        GGUFSource(write_gguf(tmp_path / "bad.gguf", {}, tensors))
    message = _one_line(caught.value)
    assert kind in caught.value.got and "t.bad" in caught.value.got and "Q4_K" in caught.value.expected
    assert "re-quantise" in message


@pytest.mark.parametrize("change, argument, fragment", [
    ({"arch": "qwen2"}, "general.architecture", "'qwen2'"),
    ({"llama.expert_count": 8}, "llama.expert_count", "8 experts"),
    ({"llama.rope.scaling.type": "linear"}, "llama.rope.scaling.type", "'linear'"),
    ({"drop": "llama.attention.head_count"}, "llama.attention.head_count", "missing"),
])
def test_metadata_lipbound_cannot_read_is_refused(tmp_path, change, argument, fragment):
    metadata = {"llama.block_count": 1, "llama.embedding_length": 8, "llama.attention.head_count": 2}
    arch = change.get("arch", "llama")
    if arch != "llama":
        metadata = {k.replace("llama.", f"{arch}."): v for k, v in metadata.items()}
    metadata.update({k: v for k, v in change.items() if k not in ("arch", "drop")})
    metadata.pop(change.get("drop"), None)
    source = GGUFSource(write_gguf(tmp_path / "model.gguf", metadata, {"blk.0.attn_q.weight": np.ones((8, 8))},
                                   arch=arch))
    with pytest.raises(WeightsError) as caught:
        gguf_config(source)
    _one_line(caught.value)
    assert caught.value.argument.endswith(argument) and fragment in caught.value.got


def test_per_frequency_rope_factors_are_refused(tmp_path):
    metadata = {"llama.block_count": 1, "llama.embedding_length": 8, "llama.attention.head_count": 2}
    source = GGUFSource(write_gguf(tmp_path / "model.gguf", metadata, {"rope_freqs.weight": np.ones(2)}))
    with pytest.raises(WeightsError) as caught:
        gguf_config(source)
    assert "rope_freqs.weight" in caught.value.got


def test_a_truncated_file_is_refused(tmp_path):
    whole = SMOLLM.read_bytes()[:1 << 16]
    (tmp_path / "cut.gguf").write_bytes(whole)
    with pytest.raises(WeightsError) as caught:
        GGUFSource(tmp_path / "cut.gguf")
    assert "GGUF file" in caught.value.expected and "download" in _one_line(caught.value)
