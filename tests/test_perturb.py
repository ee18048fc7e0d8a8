"""Token-level perturbations of real sentences: measured W1 movement never exceeds the certified prediction.

For uniform measures of n atoms, W1((Gamma_mu)_# mu, (Gamma_mu')_# mu') <= L_W1 W1(mu, mu') with L_W1
the (2,1) constant of the residual block (theorem measure-w1-uniform; Vuckovic, Baratin, Tachet des
Combes 2020).  Independent routes: W1 by the assignment problem against POT's network simplex
(ot.emd2), block outputs by the measure form (empirical.self_attention_layer_measure) against the
token forward pass, the cached layer constant against the per-head constants of
lipbound.numeric.certify.head_constant composed with numpy's spectral norms of the W_O blocks.
Layers are counted from 0: row.layer = l compares the inputs hidden_states[l] of layer l.
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

from lipbound.cli import main
from lipbound.cli.parsing import int_list
from lipbound.errors import AssumptionError
from lipbound.measures import EmpiricalMeasure, self_attention_layer_measure, w1
from lipbound.measures.bert import load_text_model
from lipbound.measures.edits import draw_edits, whole_word_ids
from lipbound.measures.perturb import FLOAT_ALLOWANCE, block_constant, data_radius, perturb
from lipbound.numeric import attention
from lipbound.numeric.certify import head_constant
from lipbound.numeric.domains import LayerNormOutputs

SENTENCES_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "lipbound", "measures", "data", "sentences.txt")


def sentences() -> list[str]:
    with open(SENTENCES_PATH, encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


@pytest.fixture(scope="module")
def model():
    return load_text_model()


@pytest.fixture(scope="module")
def fast_reports(model):
    """Two sentences (8 and 19 tokens), k = 1..3 replacements, the first and last layers (0 and 5)."""
    chosen = [sentences()[0], sentences()[4]]
    return [perturb(s, k=(1, 2, 3), layers=(0, 5), seed=0, model=model) for s in chosen]


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
    """W1 <= (1/n) sum ||x_i - x'_i|| (identity coupling) at every layer, and at layer 0 exactly k
    rows of the embedding differ, so W1 <= (k/n) max_i ||x_i - x'_i||."""
    for report in fast_reports:
        for row in report.rows:
            assert row.input_w1 <= row.coupling_bound * (1 + 1e-12)
            assert row.input_w1 <= row.k / row.n * row.input_movement * (1 + 1e-12) or row.layer != 0
        assert {row.layer for row in report.rows} == {0, 5}
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
    import ot
    report = fast_reports[1]
    row = next(r for r in report.rows if r.layer == 5 and r.k == 3)
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
    import ot
    sentence = sentences()[index]
    report = perturb(sentence, k=(1, 2), mode=mode, layers=(0,), seed=index, model=model)
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
def test_block_constant_composes_the_head_constants(model):
    """The block constant is 1 + sum_h ||W_O^h||_2 L_h (residual, W1 on uniform measures), with L_h
    the certified per-head measure-w1 constants and ||W_O^h||_2 here by numpy's SVD."""
    layernorm = model.layernorm_feeding(3)
    block = block_constant(model, 3, 12)
    assert block.certified and "residual" in block.provenance
    value = block.value
    per_head = [head_constant(h, "w1", LayerNormOutputs(layernorm), 12) for h in model.heads(3)]
    assert all(h.certified for h in per_head)
    np.testing.assert_allclose(block.details["per_head"], [h.value for h in per_head], rtol=1e-12)
    attention_layer = model.attention_layer(3)
    blocks = [np.linalg.norm(attention_layer.output_block(h), 2) for h in range(attention_layer.num_heads)]
    np.testing.assert_allclose(block.details["W_O_blocks"], blocks, rtol=1e-12)
    composed = 1 + sum(b * h.value for b, h in zip(blocks, per_head))
    assert value >= composed
    np.testing.assert_allclose(value, composed, rtol=1e-12)
    assert block_constant(model, 3, 12) is block  # computed once per model, layer and size
    # the ball about beta with the LayerNorm radius is the same set of assumptions
    radius = layernorm.radius_about_center
    np.testing.assert_allclose(block_constant(model, 3, 12, radius).value, value, rtol=1e-9)
    # smaller balls and fewer atoms give smaller constants; more atoms larger
    assert block_constant(model, 3, 12, radius / 2).value < value
    assert block_constant(model, 3, 6).value < value < block_constant(model, 3, 24).value


def test_data_radius_covers_every_token(model):
    layernorm = model.layernorm_feeding(0)
    X = model.hidden_states(model.encode(sentences()[3]))[0]
    Z = model.hidden_states(model.encode(sentences()[8]))[0]
    radius = data_radius(layernorm.beta, X, Z)
    distances = np.linalg.norm(np.vstack([X, Z]) - layernorm.beta, axis=1)
    assert radius >= distances.max()
    np.testing.assert_allclose(radius, distances.max(), rtol=1e-13)
    assert radius <= layernorm.radius_about_center


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
    ({"layers": (-1, 0)}, "--layers"),  # layers are counted from 0
    ({"layers": range(0, 7)}, "--layers"),  # 6 layers: 0..5
    ({"layers": ()}, "--layers"),
    ({"mode": "swap"}, "mode"),
    ({"model": "/nonexistent/bert-dir"}, "--model"),
])
def test_bad_input_is_refused_with_a_four_part_message(model, kwargs, argument):
    arguments = {"sentence": "The cat slept all afternoon.", "model": model, "layers": (0,)}
    arguments.update(kwargs)
    sentence = arguments.pop("sentence")
    with pytest.raises(AssumptionError) as info:
        perturb(sentence, **arguments)
    assert info.value.argument == argument
    assert info.value.expected and info.value.got and info.value.fix
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize("text, expected", [("3", (3,)), ("0", (0,)), ("1..3", (1, 2, 3)), ("1,4,6", (1, 4, 6)),
                                            ("1..2,5", (1, 2, 5))])
def test_int_list(text, expected):
    assert int_list("--layers")(text) == expected


@pytest.mark.parametrize("text", ["", "a", "3..1", "1-3", "-1"])
def test_int_list_refuses_nonsense(text):
    with pytest.raises(argparse.ArgumentTypeError) as info:
        int_list("--layers")(text)
    assert repr(text) in str(info.value) and "Fix: write e.g. --layers" in str(info.value)


# Command line --------------------------------------------------------------------------------------------
def test_cli_prints_the_table_and_writes_json_and_plot(tmp_path, capsys):
    json_path, plot_path = tmp_path / "report.json", tmp_path / "plot.png"
    status = main(["perturb", "The cat slept all afternoon.", "--replace", "1..2", "--layers", "0",
                   "--json", str(json_path), "--plot", str(plot_path)])
    output = capsys.readouterr().out.strip().splitlines()
    assert status == 0
    assert output[-1] == "violations: 0"
    header = next(line for line in output if line.lstrip().startswith("layer"))
    for column in ("k/n", "input W1", "measured", "predicted", "ratio"):
        assert column in header
    payload = json.loads(json_path.read_text())
    assert payload["sentence"] == "The cat slept all afternoon." and payload["n"] == 8
    assert [(r["layer"], r["k"]) for r in payload["rows"]] == [(0, 1), (0, 2)]
    for row in payload["rows"]:
        assert isinstance(row["measured"], float) and isinstance(row["predicted"], float)
        assert row["measured"] <= row["predicted"]
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_delete_and_errors(capsys):
    assert main(["perturb", "Rain is expected tomorrow morning.", "--delete", "1", "--layers", "1"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "violations: 0"
    assert main(["perturb", "Rain is expected tomorrow morning.", "--insert", "8", "--layers", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lipbound: error: --replace/--insert/--delete: expected 1 <= k <= 6 (the word tokens of the sentence; "
        "[CLS] and [SEP] are never edited), got 8. Fix: choose a smaller k or a longer sentence")
    assert main(["perturb", "Rain is expected.", "--layers", "0..9"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("lipbound: error: --layers: expected layer numbers between 0 and 5 (counted from 0)")
    assert len(error.splitlines()) == 1 and "Fix:" in error
    for bad in ("1-3", "-1"):  # refused by the option's converter, exit status 2, one line
        with pytest.raises(SystemExit) as info:
            main(["perturb", "Rain is expected.", "--layers", bad])
        assert info.value.code == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("lipbound: error: argument --layers: expected") and len(error.splitlines()) == 1


def test_registered_cli_command(capsys):
    """Through ``lipbound`` itself: perturb is a registered subcommand, also as ``python -m lipbound.cli``."""
    from lipbound.cli import build_parser
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "perturb" in subcommands.choices
    assert main(["perturb", "The cat slept all afternoon.", "--layers", "0"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "violations: 0"
    assert main(["perturb", "", "--layers", "0"]) == 2
    assert capsys.readouterr().err.startswith("lipbound: error: sentence: expected a non-empty sentence")


def test_cli_refuses_a_sentence_longer_than_the_model(capsys):
    """all-MiniLM-L6-v2 has 512 positions: a longer sentence is a user error naming the sentence."""
    assert main(["perturb", "word " * 600, "--layers", "0"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("lipbound: error: sentence: expected at most 512 tokens")
    assert "602 tokens" in error and "ids" not in error and len(error.splitlines()) == 1


def test_module_entry_point(tmp_path):
    import subprocess
    import sys
    json_path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "lipbound.cli", "perturb", "The cat slept all afternoon.",
                           "--layers", "5", "--json", str(json_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "violations: 0"
    payload = json.loads(json_path.read_text())
    assert [row["layer"] for row in payload["rows"]] == [5] and payload["violations"] == 0


# The full sweep -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_sweep_twenty_sentences_six_layers(model):
    """All 20 sentences of sentences.txt, k = 1..3 replacements, all 6 layers (0..5): zero violations."""
    reports = [perturb(s, k=(1, 2, 3), layers=range(6), seed=0, model=model) for s in sentences()]
    rows = [row for r in reports for row in r.rows]
    assert len(rows) == 20 * 3 * 6
    assert sum(r.violations for r in reports) == 0 and sum(r.not_certified for r in reports) == 0
    assert all(row.measured <= row.predicted for row in rows)
    print("\n" + _ratio_summary(reports))
