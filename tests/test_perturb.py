"""Token-level perturbations of real sentences: measured W1 movement never exceeds the certified prediction.

For uniform measures of n atoms, W1((Gamma_mu)_# mu, (Gamma_mu')_# mu') <= L_W1 W1(mu, mu') with L_W1
the (2,1) constant of the residual block (theorem measure-w1-uniform; Vuckovic, Baratin, Tachet des
Combes 2020).  Independent routes: W1 by the assignment problem against POT's network simplex
(ot.emd2), block outputs by the measure form (empirical.self_attention_layer_measure) against the
token forward pass, the cached layer constant against lipbound.numeric.certify.layer_constant.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError
from lipbound.measures import EmpiricalMeasure, self_attention_layer_measure, w1
from lipbound.measures.perturb import (FLOAT_ALLOWANCE, BlockW1Constant, add_perturb_parser, block_constant,
                                       draw_edits, layernorm_feeding, load_model, parse_range, perturb,
                                       whole_word_ids)
from lipbound.numeric import attention
from lipbound.numeric.certify import layer_constant
from lipbound.numeric.domains import LayerNormOutputs, TokenBall

SENTENCES_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "lipbound", "measures", "data", "sentences.txt")


def sentences() -> list[str]:
    with open(SENTENCES_PATH, encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


@pytest.fixture(scope="module")
def model():
    return load_model()


@pytest.fixture(scope="module")
def fast_reports(model):
    """Two sentences (8 and 19 tokens), k = 1..3 replacements, layers 1 and 6."""
    chosen = [sentences()[0], sentences()[4]]
    return [perturb(s, k=(1, 2, 3), layers=(1, 6), seed=0, model=model) for s in chosen]


def _ratio_summary(reports) -> str:
    lines = []
    for layer in sorted({row.layer for r in reports for row in r.rows}):
        ratios = np.array([row.ratio for r in reports for row in r.rows if row.layer == layer])
        lines.append(f"layer {layer}: {ratios.size} rows, measured/predicted min {ratios.min():.3g}, "
                     f"median {np.median(ratios):.3g}, max {ratios.max():.3g}")
    return "\n".join(lines)


# Soundness on real text --------------------------------------------------------------------------------
def test_replacements_never_exceed_the_prediction(fast_reports):
    for report in fast_reports:
        assert len(report.rows) == 6
        assert report.violations == 0 and report.not_certified == 0
        for row in report.rows:
            assert row.verdict == "holds"
            assert row.measured <= row.predicted * (1 - FLOAT_ALLOWANCE)
            np.testing.assert_allclose(row.predicted, min(row.constant_data, row.constant_layernorm) * row.input_w1,
                                       rtol=1e-15)
            assert row.constant_data <= row.constant_layernorm
            assert 0 < row.radius_data <= row.radius_layernorm
            assert row.atoms == row.n == row.n_perturbed  # replacement keeps the size
            assert row.amplification <= row.constant_data  # a stretch seen is a lower bound on the constant
    print("\n" + _ratio_summary(fast_reports))


def test_input_w1_obeys_the_replacement_bound(fast_reports, model):
    """W1 <= (1/n) sum ||x_i - x'_i|| (identity coupling) at every layer, and at layer 1 exactly k
    rows of the embedding differ, so W1 <= (k/n) max_i ||x_i - x'_i||."""
    for report in fast_reports:
        for row in report.rows:
            assert row.input_w1 <= row.coupling_bound * (1 + 1e-12)
            assert row.input_w1 <= row.k / row.n * row.input_movement * (1 + 1e-12) or row.layer != 1
        edit = report.edits[2]
        X = model.hidden_states(model.encode(report.sentence))[0]
        X_new = model.hidden_states(list(edit.ids))[0]
        changed = np.flatnonzero(np.linalg.norm(X - X_new, axis=1) > 0)
        np.testing.assert_array_equal(changed, np.sort(edit.positions))


def test_per_token_movement_is_reported_for_one_replacement(fast_reports):
    """W1 <= (1/n) sum_i ||y_i - y'_i|| <= max_i ||y_i - y'_i||, and the edited token moves most."""
    for report in fast_reports:
        for row in (r for r in report.rows if r.k == 1):
            assert row.token_movement is not None and row.context_movement is not None
            assert row.measured <= row.token_movement * (1 + 1e-12)
            assert 0 < row.context_movement <= row.token_movement
        payload = report.to_json()
        assert all("token_movement" in r for r in payload["rows"])


def test_measured_w1_by_independent_routes(fast_reports, model):
    """The block output by the measure form equals the token forward pass, and W1 by the assignment
    problem equals POT's exact transport cost."""
    ot = pytest.importorskip("ot")
    report = fast_reports[1]
    row = next(r for r in report.rows if r.layer == 6 and r.k == 3)
    states = model.hidden_states(model.encode(report.sentence))
    states_new = model.hidden_states(list(report.edits[3].ids))
    layer = model.attention_layer(5)
    mu, mu_new = EmpiricalMeasure.uniform(states[5]), EmpiricalMeasure.uniform(states_new[5])
    out, out_new = self_attention_layer_measure(layer, mu), self_attention_layer_measure(layer, mu_new)
    np.testing.assert_allclose(out.points, model.attention_block(5, states[5]).pre_norm, rtol=1e-12, atol=1e-11)
    cost = np.linalg.norm(out.points[:, None, :] - out_new.points[None, :, :], axis=-1)
    pot_value = ot.emd2(out.weights, out_new.weights, cost)
    np.testing.assert_allclose(row.measured, pot_value, rtol=1e-9)
    np.testing.assert_allclose(row.input_w1, w1(mu, mu_new), rtol=1e-14)


# Insertions and deletions -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, index", [("insert", 1), ("delete", 5), ("insert", 11), ("delete", 13)])
def test_insert_and_delete_never_exceed_the_prediction(model, mode, index):
    ot = pytest.importorskip("ot")
    sentence = sentences()[index]
    report = perturb(sentence, k=(1, 2), mode=mode, layers=(1,), seed=index, model=model)
    assert report.violations == 0 and report.not_certified == 0
    for row in report.rows:
        assert row.n_perturbed == row.n + (row.k if mode == "insert" else -row.k)
        assert row.atoms == math.lcm(row.n, row.n_perturbed)
        assert row.measured <= row.predicted
        assert row.token_movement is None  # positions do not match after a change of size
    # the transport LP (HiGHS) against POT on the insertion/deletion of two tokens
    states = model.hidden_states(model.encode(sentence))[0]
    states_new = model.hidden_states(list(report.edits[2].ids))[0]
    cost = np.linalg.norm(states[:, None, :] - states_new[None, :, :], axis=-1)
    expected = ot.emd2(np.full(len(states), 1 / len(states)), np.full(len(states_new), 1 / len(states_new)), cost)
    np.testing.assert_allclose(report.rows[1].input_w1, expected, rtol=1e-7)


def test_repeated_atoms_are_token_attention_on_repeated_tokens(model):
    """The step behind insertions: a uniform measure of n atoms is one of N = r n atoms (each atom
    repeated r times); the residual block on the repeated tokens gives the repeated outputs, so the
    output measure is the same and so is every W1."""
    X = model.hidden_states(model.encode(sentences()[1]))[2]
    layer = model.attention_layer(2)
    repeated = np.repeat(X, 3, axis=0)
    np.testing.assert_allclose(attention.layer_forward(layer, repeated)[0],
                               np.repeat(attention.layer_forward(layer, X)[0], 3, axis=0), rtol=1e-12, atol=1e-11)
    Z = model.hidden_states(model.encode(sentences()[0]))[2]
    np.testing.assert_allclose(w1(EmpiricalMeasure.uniform(repeated), EmpiricalMeasure.uniform(Z)),
                               w1(EmpiricalMeasure.uniform(X), EmpiricalMeasure.uniform(Z)), rtol=1e-7)


# The certified constant ----------------------------------------------------------------------------------
def test_block_constant_agrees_with_layer_constant(model):
    """The cached per-head evaluation composes like certify.layer_constant (two heads, to stay fast)."""
    full = model.attention_layer(3)
    heads = full.heads[:2]
    sub = attention.Layer(heads, full.W_O[:sum(h.d_v for h in heads)], full.b_O, residual=True)
    layernorm = layernorm_feeding(model, 3)
    reference = layer_constant(sub, "w1", LayerNormOutputs(layernorm), 12, residual=True)
    block = BlockW1Constant(sub, layernorm)
    value = block.on_layernorm_image(12).value
    assert value >= reference.value
    np.testing.assert_allclose(value, reference.value, rtol=1e-12)
    np.testing.assert_allclose(block.on_layernorm_image(12).per_head, reference.per_head, rtol=1e-12)
    # the ball about beta with the LayerNorm radius is the same set of assumptions
    np.testing.assert_allclose(block.on_ball(12, block.layernorm_radius).value, value, rtol=1e-9)
    # smaller balls and fewer atoms give smaller constants; more atoms larger
    assert block.on_ball(12, block.layernorm_radius / 2).value < value
    assert block.on_layernorm_image(6).value < value < block.on_layernorm_image(24).value


def test_data_radius_covers_every_token(model):
    block = block_constant(model, 0)
    X = model.hidden_states(model.encode(sentences()[3]))[0]
    Z = model.hidden_states(model.encode(sentences()[8]))[0]
    radius = block.data_radius(X, Z)
    distances = np.linalg.norm(np.vstack([X, Z]) - block.layernorm.beta, axis=1)
    assert radius >= distances.max()
    np.testing.assert_allclose(radius, distances.max(), rtol=1e-13)
    assert radius <= block.layernorm_radius


# Edits -----------------------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), mode=st.sampled_from(["replace", "insert", "delete"]))
def test_edits_are_whole_words_and_never_touch_special_tokens(model, seed, mode):
    tokenizer = model.tokenizer
    ids = model.encode(sentences()[7])
    n = len(ids)
    edits = draw_edits(model, ids, mode, (1, 2, 3), seed)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    for k, edit in edits.items():
        assert edit.ids[0] == cls_id and edit.ids[-1] == sep_id
        assert cls_id not in edit.ids[1:-1] and sep_id not in edit.ids[1:-1]
        assert len(edit.ids) == {"replace": n, "insert": n + k, "delete": n - k}[mode]
        assert all(1 <= p <= n - 2 for p in edit.positions) or mode == "insert"
        if mode != "delete":
            assert all(w.isascii() and w.isalpha() and tokenizer.token_to_id(w) != tokenizer.token_to_id("[UNK]")
                       for w in edit.words)
        if mode == "replace":
            changed = [i for i in range(n) if edit.ids[i] != ids[i]]
            assert sorted(changed) == sorted(edit.positions)  # a substitute always changes the token
    # nested and deterministic by seed
    assert edits[3].positions[:2] == edits[2].positions and edits[3].words[:2] == edits[2].words
    assert draw_edits(model, ids, mode, (3,), seed)[3] == edits[3]


def test_whole_word_vocabulary(model):
    ids = whole_word_ids(model.tokenizer)
    words = [model.tokenizer.vocab[i] for i in ids]
    assert "cat" in words and "[CLS]" not in words and "[MASK]" not in words
    assert not any(w.startswith("##") or not w.isalpha() for w in words)
    assert len(words) > 15000


# Errors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, argument", [
    ({"sentence": ""}, "sentence"),
    ({"sentence": "   "}, "sentence"),
    ({"k": 8}, "k"),           # "The cat slept all afternoon." has n = 8 tokens
    ({"k": 7}, "k"),           # only 6 word tokens can be edited
    ({"k": 0}, "k"),
    ({"k": (1, 9)}, "k"),
    ({"layers": (0, 1)}, "layers"),
    ({"layers": range(1, 8)}, "layers"),
    ({"mode": "swap"}, "mode"),
    ({"model": "/nonexistent/bert-dir"}, "model"),
])
def test_bad_input_is_refused_with_a_four_part_message(model, kwargs, argument):
    arguments = {"sentence": "The cat slept all afternoon.", "model": model, "layers": (1,)}
    arguments.update(kwargs)
    sentence = arguments.pop("sentence")
    with pytest.raises(AssumptionError) as info:
        perturb(sentence, **arguments)
    assert info.value.argument == argument
    assert info.value.expected and info.value.got and info.value.fix
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize("text, expected", [("3", (3,)), ("1..3", (1, 2, 3)), ("1,4,6", (1, 4, 6)),
                                            ("1..2,5", (1, 2, 5))])
def test_parse_range(text, expected):
    assert parse_range(text, "--layers") == expected


@pytest.mark.parametrize("text", ["", "a", "3..1", "1-3"])
def test_parse_range_refuses_nonsense(text):
    with pytest.raises(AssumptionError) as info:
        parse_range(text, "--layers")
    assert info.value.argument == "--layers"


# Command line --------------------------------------------------------------------------------------------
def _run_cli(argv):
    parser = argparse.ArgumentParser(prog="lipbound")
    add_perturb_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_cli_prints_the_table_and_writes_json_and_plot(tmp_path, capsys):
    json_path, plot_path = tmp_path / "report.json", tmp_path / "plot.png"
    status = _run_cli(["perturb", "The cat slept all afternoon.", "--replace", "1..2", "--layers", "1",
                       "--json", str(json_path), "--plot", str(plot_path)])
    output = capsys.readouterr().out.strip().splitlines()
    assert status == 0
    assert output[-1] == "violations: 0"
    header = next(line for line in output if line.lstrip().startswith("layer"))
    for column in ("k/n", "input W1", "measured", "predicted", "ratio"):
        assert column in header
    payload = json.loads(json_path.read_text())
    assert payload["sentence"] == "The cat slept all afternoon." and payload["n"] == 8
    assert [(r["layer"], r["k"]) for r in payload["rows"]] == [(1, 1), (1, 2)]
    for row in payload["rows"]:
        assert isinstance(row["measured"], float) and isinstance(row["predicted"], float)
        assert row["measured"] <= row["predicted"]
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_delete_and_errors(capsys):
    assert _run_cli(["perturb", "Rain is expected tomorrow morning.", "--delete", "1", "--layers", "2"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "violations: 0"
    with pytest.raises(AssumptionError) as info:
        _run_cli(["perturb", "Rain is expected tomorrow morning.", "--insert", "8", "--layers", "1"])
    assert info.value.argument == "k"
    with pytest.raises(AssumptionError) as info:
        _run_cli(["perturb", "Rain is expected.", "--layers", "1..9"])
    assert info.value.argument == "layers"


def test_registered_cli_command(capsys):
    """Through ``lipbound`` itself, once lipbound.commands registers the command."""
    pytest.importorskip("lipbound.commands")
    from lipbound.cli import build_parser, main
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    if "perturb" not in subcommands.choices:
        pytest.skip("perturb is not registered in lipbound.commands")
    assert main(["perturb", "The cat slept all afternoon.", "--layers", "1"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "violations: 0"
    assert main(["perturb", "", "--layers", "1"]) == 2


# The full sweep -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_sweep_twenty_sentences_six_layers(model):
    """All 20 sentences of sentences.txt, k = 1..3 replacements, all 6 layers: zero violations."""
    reports = [perturb(s, k=(1, 2, 3), layers=range(1, 7), seed=0, model=model) for s in sentences()]
    rows = [row for r in reports for row in r.rows]
    assert len(rows) == 20 * 3 * 6
    assert sum(r.violations for r in reports) == 0 and sum(r.not_certified for r in reports) == 0
    assert all(row.measured <= row.predicted for row in rows)
    print("\n" + _ratio_summary(reports))
