"""`verify --whole` for decoders: RMSNorm, gated feed-forward blocks, sandwich norms, LayerScale.

Two kinds of model.  Hypothesis-generated pre-norm and sandwich decoders with causal dot-product
heads, RMSNorm, SwiGLU or GeGLU and LayerScale (plain format), whose every component has a theorem:
the layer is written again here (RMSNorm, gated unit, causal softmax attention) and differentiated by
central differences, and every certified bound -- per component, per layer, end to end -- must hold
at random inputs, near 0 and at the norms' steepest scales.  And the tiny Hugging Face checkpoints of
each decoder family the loaders read (Llama, Qwen3 with QK-norm, Gemma 2 with sandwich norms): their
attention rows take whatever verdict the theorem dispatch gives -- a certified bound, which must hold
against the witness, or a refusal with its reason, after which the end-to-end bound says it is not
certified -- and the feed-forward and norm rows are certified and hold against their witnesses.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import cli_run
import numpy as np
import pytest
from decoder_checkpoints import config_of, random_weights, write_huggingface
from hypothesis import given, settings
from hypothesis import strategies as st
from test_whole import fd_jacobian

from lipbound.errors import AssumptionError
from lipbound.numeric.kernels import AttentionMask
from lipbound.numeric.model import (
    GatedFeedForward,
    Head,
    Layer,
    Model,
    RMSNorm,
    TransformerLayer,
    load_weights,
    save_plain,
)
from lipbound.numeric.whole import verify_whole
from lipbound.numeric.whole.activations import stream_norms

D, DK, H, DFF = 6, 2, 2, 8


def rms(norm: RMSNorm, X):
    return norm.gamma * X / np.sqrt((X * X).mean(axis=-1, keepdims=True) + norm.eps)


def act(name: str, z):
    if name == "silu":
        return z / (1 + np.exp(-z))
    return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def gated(block: GatedFeedForward, X):
    return (act(block.act, X @ block.W_gate + block.b_gate) * (X @ block.W_up + block.b_up)) @ block.W_down \
        + block.b_down


def causal_attention(layer: Layer, X):
    outs = []
    for head in layer.heads:
        q, k, v = X @ head.W_Q + head.b_Q, X @ head.W_K + head.b_K, X @ head.W_V + head.b_V
        s = np.where(np.tril(np.ones((len(X), len(X)), dtype=bool)), q @ k.T / math.sqrt(head.W_Q.shape[1]), -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        outs.append(p / p.sum(axis=1, keepdims=True) @ v)
    return np.concatenate(outs, axis=1) @ layer.W_O + layer.b_O


def layer_forward(layer: TransformerLayer, X):
    a = 1.0 if layer.attn_scale is None else layer.attn_scale
    f = 1.0 if layer.ffn_scale is None else layer.ffn_scale
    branch = causal_attention(layer.attention, rms(layer.ln_in, X))
    X = X + a * (rms(layer.ln_out, branch) if layer.placement == "sandwich" else branch)
    branch = gated(layer.ffn, rms(layer.ffn_norm, X))
    return X + f * (rms(layer.ffn_out_norm, branch) if layer.placement == "sandwich" else branch)


def model_forward(model: Model, X):
    for index in sorted(model.layers):
        X = layer_forward(model.layers[index], X)
    return rms(model.final_norm, X)


def generated(placement: str, act_name: str, layerscale: bool, seed: int = 0, layers: int = 2) -> Model:
    rng = np.random.default_rng(seed)

    def norm():
        return RMSNorm(rng.uniform(0.5, 1.5, D), eps=1e-2)

    stack = {}
    for i in range(layers):
        heads = tuple(Head(*(rng.standard_normal((D, DK)) / 2 for _ in range(3)), mask=AttentionMask(causal=True))
                      for _ in range(H))
        ffn = GatedFeedForward(rng.standard_normal((D, DFF)) / 2, rng.standard_normal((D, DFF)) / 2,
                               rng.standard_normal((DFF, D)) / 2, act_name)
        sandwich = placement == "sandwich"
        stack[i] = TransformerLayer(i, Layer(heads, rng.standard_normal((H * DK, D)) / 2), ln_in=norm(), ffn=ffn,
                                    ffn_norm=norm(), placement=placement, ln_out=norm() if sandwich else None,
                                    ffn_out_norm=norm() if sandwich else None,
                                    attn_scale=rng.uniform(-0.6, 0.6, D) if layerscale else None,
                                    ffn_scale=rng.uniform(-0.6, 0.6, D) if layerscale else None)
    return Model(f"decoder-{placement}-{act_name}", stack, H, D, final_norm=norm(), decoder_only=True)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from(["pre", "sandwich"]), st.sampled_from(["silu", "gelu_pytorch_tanh"]), st.booleans(),
       st.integers(0, 2 ** 16))
def test_every_decoder_bound_holds_against_the_jacobian(placement, act_name, layerscale, seed):
    with tempfile.TemporaryDirectory() as folder:
        save_plain(generated(placement, act_name, layerscale, seed=seed), Path(folder) / "m.npz")
        model = load_weights(Path(folder) / "m.npz")
        report = verify_whole(model, n=3, effort=8, restarts=2, iterations=8, seed=seed)
    assert report.complete
    parts = {row["part"] for row in report.components}
    assert "ln_in (RMSNorm)" in parts and any("feed-forward(RMSNorm(X))" in p for p in parts)
    if placement == "sandwich":
        assert any(p.startswith("X + " + ("a * " if layerscale else "") + "RMSNorm(feed-forward") for p in parts)
    for row in report.components:
        assert row["certified"] and row["witness"] <= row["best_upper"] * (1 + 1e-9), row
    ffn_rows = [r for r in report.components if r["component"] == "ffn"]
    assert all({u["name"] for u in r["upper"]} == {"closed form", "lifted SDP"} for r in ffn_rows)
    bound = report.model_bound
    assert bound["certified"] and bound["witness"] <= bound["value"] <= bound["naive_product"] * (1 + 1e-12)
    # the decimal exponent that stands in for the bound of a model too deep for a float agrees with it
    assert math.log10(bound["value"]) <= bound["log10_value"] <= math.log10(bound["value"]) + 1e-12
    rng = np.random.default_rng(seed + 1)
    layer = model.layers[0]
    layer_bound = next(r["best_upper"] for r in report.components if r["component"] == "layer" and r["layer"] == 0)
    ffn_step = next(r["best_upper"] for r in report.components
                    if r["component"] == "residual" and r["layer"] == 0 and "feed-forward" in r["part"])
    f = 1.0 if layer.ffn_scale is None else layer.ffn_scale

    def step(y):
        branch = gated(layer.ffn, rms(layer.ffn_norm, y))
        return y + f * (rms(layer.ffn_out_norm, branch) if placement == "sandwich" else branch)

    for scale in (1e-3, 0.05, 0.3, 1.0, 5.0):      # 0.05-0.3: the norms' steepest scales for eps = 1e-2
        X = rng.standard_normal((3, D)) * scale
        assert np.linalg.norm(fd_jacobian(lambda Z: model_forward(model, Z), X), 2) <= bound["value"]
        assert np.linalg.norm(fd_jacobian(lambda Z: layer_forward(layer, Z), X), 2) <= layer_bound
        for x in X:
            assert np.linalg.norm(fd_jacobian(step, x), 2) <= ffn_step


def test_a_gated_block_after_a_post_norm_is_refused_before_any_work(tmp_path):
    model = generated("pre", "silu", False, layers=1)
    layer = model.layers[0]
    post = TransformerLayer(0, layer.attention, ln_out=layer.ln_in, ffn=layer.ffn, ffn_norm=layer.ffn_norm,
                            placement="post")
    save_plain(Model("post-gated", {0: post}, H, D, decoder_only=True), tmp_path / "m.npz")
    with pytest.raises(AssumptionError, match="layer 0.*post-norm"):
        verify_whole(load_weights(tmp_path / "m.npz"), n=3, effort=8, restarts=2, iterations=4)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2"])
def test_decoder_checkpoints_report_what_is_not_certified(family, tmp_path):
    config = {**config_of(family), "num_hidden_layers": 2}
    path = write_huggingface(tmp_path / family, config, random_weights(config, seed=3))
    model = load_weights(path)
    report = verify_whole(model, n=3, effort=8, restarts=2, iterations=6)
    assert report.complete
    attention = [r for r in report.components if r["component"] == "attention"]
    ffn = [r for r in report.components if r["component"] == "ffn"]
    norms = [r for r in report.components if r["component"] == "norm"]
    assert ffn and all(r["certified"] and r["witness"] <= r["best_upper"] for r in ffn)
    assert norms and all(r["certified"] and "RMSNorm" in r["part"] for r in norms)
    assert all(r["witness"] <= r["best_upper"] * (1 + 1e-9) for r in report.components if r["certified"])
    assert attention and all(r["witness"] <= r["best_upper"] * (1 + 1e-9) for r in attention if r["certified"])
    for r in attention:                                 # the dispatch's verdict: certified, or refused with why
        assert r["certified"] or all(u["reason"] for u in r["upper"] if not u["certified"])
    bound = report.model_bound
    if all(r["certified"] for r in report.components):
        assert bound["certified"] and bound["witness"] <= bound["value"]
    else:                                               # something refused: nothing is claimed end to end
        assert not bound["certified"] and bound["statement"].startswith("NOT CERTIFIED") and bound["reasons"]
    if family == "gemma2":
        assert any(r["part"].startswith("X + RMSNorm(feed-forward(RMSNorm") for r in report.components)
    json.dumps(report.to_json())                        # plain data, NaN and inf as strings


def test_massive_activations_reach_the_local_constants(tmp_path):
    config = {**config_of("llama"), "num_hidden_layers": 2}
    path = write_huggingface(tmp_path / "llama", config, random_weights(config, seed=5))
    model = load_weights(path)
    rows = stream_norms(model, np.array([1, 7, 3, 9]))
    assert [r["layer"] for r in rows] == [0, 0, 1, 1, 2]
    for row in rows:
        local, norms = np.array(row["local"]), np.array(row["token_norms"])
        assert np.all(local <= row["global"] * (1 + 1e-12))
        gamma = np.max(np.abs((model.final_norm if row["layer"] == 2 else model.layers[row["layer"]].ln_in).gamma))
        if row["step"].endswith("attention"):
            np.testing.assert_allclose(local, gamma / np.sqrt(norms ** 2 / model.hidden + model.layers[0].ln_in.eps),
                                       rtol=1e-9)


def test_cli_whole_on_a_decoder_checkpoint(tmp_path):
    config = {**config_of("llama"), "num_hidden_layers": 1}
    path = write_huggingface(tmp_path / "llama", config, random_weights(config, seed=2))
    out = tmp_path / "whole.json"
    run = cli_run.run("verify", str(path), "--whole", "--n", "3", "--effort", "8", "--restarts", "2", "--iterations",
                      "5", "--json", str(out))
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert data["complete"] and data["model_bound"]["statement"]
    assert {c["component"] for c in data["components"]} == {"attention", "ffn", "norm", "residual", "layer"}
    assert "NOT CERTIFIED" in run.stdout or data["model_bound"]["certified"]
