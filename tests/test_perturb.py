"""Token edits of real sentences: the measured W1 movement against its certificates, per layer.

Rows carry exactly layer, k, positions, n, measured, measured_max_token, predicted_path, predicted_set,
worst_witness and global.  Independent routes: W1 by the assignment problem against POT's network
simplex (ot.emd2), block outputs by the measure form (empirical.self_attention_layer_measure) against
the token forward pass, the global prediction against the block constant composed from the per-head
constants, the set certificate against every edit of its (small) set evaluated by the forward pass.
Layers are counted from 0.
"""
from __future__ import annotations

import argparse
import json
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
from lipbound.measures.edits import clean_word_ids, draw_edits, drawable_ids, offensive_words, whole_word_ids
from lipbound.measures.perturb import block_constant, data_radius, perturb
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


ROW_KEYS = {"layer", "k", "positions", "n", "measured", "measured_max_token", "predicted_path", "predicted_set",
            "worst_witness", "global"}
SMALL = {"vocabulary": 24, "search": "all"}


@pytest.fixture(scope="module")
def fast_report(model):
    """One sentence (8 tokens), k = 1, 2 replacements at chosen positions, layer 0; a set of 26 tokens."""
    return perturb(sentences()[0], k=(1, 2), positions=(2, 4), layers=(0,), seed=0, model=model, **SMALL)


# Soundness on real text --------------------------------------------------------------------------------
def test_rows_hold_every_certificate(fast_report, model):
    report = fast_report
    assert report.violations == 0 and report.orderings_broken == 0
    for name, check in report.counts().items():
        assert check["violated"] == 0 and (check["not certified"] == 0 or name == "worst_witness <= predicted_set")
    # the first layer's enumerated bound of a one-slot set is its worst edit's identity cost: when the identity plan
    # is optimal the witness ties with it, which the float allowance cannot decide
    ties = [r for r in report.rows if r.verdict("worst_witness", "predicted_set") == "not certified"]
    assert all(r.k == 1 and r.layer == 0 and r.predicted_set <= r.worst_witness * (1 + 4e-6) for r in ties)
    for row in report.rows:
        assert row.measured <= row.predicted_path <= 2 * row.measured
        assert row.measured <= row.worst_witness <= row.predicted_set
        assert row.measured <= row.measured_max_token * (1 + 1e-12)  # W1 <= identity coupling <= max movement
        assert row.positions == (2, 4)[:row.k]
    payload = report.to_json()
    assert all(set(r) == ROW_KEYS for r in payload["rows"])
    assert payload["violations"] == 0 and payload["set"]["size"] == 26  # 24 drawn and the two edits


def test_global_prediction_is_the_block_constant_times_the_input_w1(fast_report, model):
    row = fast_report.rows[0]
    ids = model.encode(fast_report.sentence)
    X, X_new = model.hidden_states(ids)[0], model.hidden_states(list(fast_report.edits[1].ids))[0]
    input_w1 = w1(EmpiricalMeasure.uniform(X), EmpiricalMeasure.uniform(X_new))
    constant = min(block_constant(model, 0, row.n).value,
                   block_constant(model, 0, row.n, data_radius(model.layernorm_feeding(0).beta, X, X_new)).value)
    np.testing.assert_allclose(row.global_, constant * input_w1, rtol=1e-12)
    assert row.global_ > 1e3 * row.predicted_set  # the local certificates are orders of magnitude sharper


def test_measured_w1_by_independent_routes(fast_report, model):
    """The block output by the measure form equals the token forward pass, and W1 by the assignment
    problem equals POT's exact transport cost."""
    import ot
    row = next(r for r in fast_report.rows if r.k == 2)
    states = model.hidden_states(model.encode(fast_report.sentence))
    states_new = model.hidden_states(list(fast_report.edits[2].ids))
    layer = model.attention_layer(0)
    mu, mu_new = EmpiricalMeasure.uniform(states[0]), EmpiricalMeasure.uniform(states_new[0])
    out, out_new = self_attention_layer_measure(layer, mu), self_attention_layer_measure(layer, mu_new)
    np.testing.assert_allclose(out.points, model.attention_block(0, states[0]).pre_norm, rtol=1e-12, atol=1e-11)
    cost = np.linalg.norm(out.points[:, None, :] - out_new.points[None, :, :], axis=-1)
    np.testing.assert_allclose(row.measured, ot.emd2(out.weights, out_new.weights, cost), rtol=1e-9)


def test_set_certificate_covers_every_edit_of_its_set(fast_report, model):
    """k = 1: every token of the set at position 2, through the forward pass, moves layer 0 by at most
    predicted_set; and the search, which saw the whole set, found the largest movement."""
    from lipbound.measures.perturb import _set_ids
    ids = model.encode(fast_report.sentence)
    candidates, _ = _set_ids(model, 24, fast_report.edits, 0)
    block = model.attention_block(0, model.hidden_states(ids)[0]).pre_norm
    movements = []
    for word in candidates:
        edited = list(ids)
        edited[2] = int(word)
        Z = model.attention_block(0, model.hidden_states(edited)[0]).pre_norm
        movements.append(w1(EmpiricalMeasure.uniform(block), EmpiricalMeasure.uniform(Z)))
    row = next(r for r in fast_report.rows if r.k == 1)
    assert max(movements) <= row.predicted_set
    np.testing.assert_allclose(row.worst_witness, max(movements), rtol=1e-12)
    assert fast_report.search[1]["exhaustive"]


def test_screening_forward_pass_follows_the_float64_one(model):
    """The float32 screening pass (tanh-form GELU) against the float64 forward pass, every layer's block
    outputs, on edited sentences: close enough to rank candidates (reported values never come from it)."""
    from lipbound.measures.vocabulary import ScreeningModel
    ids = model.encode(sentences()[0])
    batch = np.array([ids] + [[*ids[:2], word, *ids[3:]] for word in (1996, 4937, 29610)])
    screened = ScreeningModel(model.model).block_outputs(batch, model.num_layers - 1)
    for row, edited in enumerate(batch):
        states = model.hidden_states(list(edited))
        for layer in range(model.num_layers):
            exact = model.attention_block(layer, states[layer]).pre_norm
            scale = np.abs(exact).max()
            assert np.abs(screened[layer][row] - exact).max() <= 2e-3 * scale
            assert np.abs(screened[layer][row] - exact).max() > 0        # a separate, float32 route


# Insertions and deletions -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, sentence, positions", [
    ("insert", "Rain is expected tomorrow morning.", (5,)),
    pytest.param("delete", sentences()[5], None, marks=pytest.mark.slow)])  # the command-line test deletes too
def test_insert_and_delete_hold_their_certificates(model, mode, sentence, positions):
    import ot
    report = perturb(sentence, k=(1,), mode=mode, layers=(0,), seed=5, positions=positions, model=model, **SMALL)
    assert report.violations == 0
    row = report.rows[0]
    assert row.measured <= row.predicted_path <= 2 * row.measured
    assert row.measured <= row.worst_witness <= row.predicted_set
    if mode == "delete":  # a set of one edit: the worst found is the edit itself
        assert row.worst_witness == row.measured
    # the transport LP (HiGHS) against POT on the inputs of the insertion or deletion
    states = model.hidden_states(model.encode(sentence))[0]
    states_new = model.hidden_states(list(report.edits[1].ids))[0]
    cost = np.linalg.norm(states[:, None, :] - states_new[None, :, :], axis=-1)
    expected = ot.emd2(np.full(len(states), 1 / len(states)), np.full(len(states_new), 1 / len(states_new)), cost)
    np.testing.assert_allclose(w1(EmpiricalMeasure.uniform(states), EmpiricalMeasure.uniform(states_new)), expected,
                               rtol=1e-7)


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


def test_random_edits_never_draw_a_word_of_the_offensive_list(model):
    tokenizer = model.tokenizer
    banned = offensive_words()
    assert len(banned) >= 200 and {"nazi", "twisted"} & banned == {"nazi"}
    in_vocabulary = banned & {token.lower() for token in tokenizer.vocab}
    assert len(in_vocabulary) >= 100   # the list names words the model really has
    clean, drawable = clean_word_ids(tokenizer), drawable_ids(tokenizer)
    assert not {tokenizer.vocab[i].lower() for i in clean} & banned
    assert not {tokenizer.vocab[i].lower() for i in drawable} & banned
    whole = whole_word_ids(tokenizer)
    assert clean.size == whole.size - sum(tokenizer.vocab[i].lower() in banned for i in whole) > 0
    ids = model.encode(sentences()[0])
    for seed in range(50):   # the guarantee is the set check above; these draws check that edits draw from it
        for mode in ("replace", "insert"):
            words = draw_edits(model, ids, mode, (1, 2, 3), seed)[3].words
            assert not {w.lower() for w in words} & banned, (seed, mode, words)


def test_the_readme_perturb_example_draws_clean_words(model):
    """The README's example (seed 0) printed 'nazi' before the word list; it says what it draws now."""
    edits = draw_edits(model, model.encode("The cat sat on the mat."), "replace", (1, 2), 0)
    assert edits[1].words == ("twisted",) and edits[2].words == ("twisted", "hobbs")


def test_sampled_candidate_sets_skip_the_offensive_words_and_all_keeps_them(model):
    from lipbound.measures.perturb import _set_ids
    banned = offensive_words()
    edits = draw_edits(model, model.encode("The cat sat on the mat."), "replace", (1,), 0)
    sample, _ = _set_ids(model, 4096, edits, seed=0)
    assert not {model.tokenizer.vocab[i].lower() for i in sample} & banned
    everything, _ = _set_ids(model, "all", edits, seed=0)
    assert model.tokenizer.token_to_id("nazi") in everything


# Errors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, argument", [
    ({"sentence": ""}, "sentence"),
    ({"sentence": "   "}, "sentence"),
    ({"k": 8}, "k"),           # "The cat slept all afternoon." has n = 8 tokens
    ({"k": 7}, "k"),           # only 6 word tokens can be edited
    ({"k": 0}, "k"),
    ({"k": (1, 9)}, "k"),
    ({"layers": (-1, 0)}, "layers"),  # layers are counted from 0
    ({"layers": range(0, 7)}, "layers"),  # 6 layers: 0..5
    ({"layers": ()}, "layers"),
    ({"mode": "swap"}, "mode"),
    ({"model": "/nonexistent/bert-dir"}, "model"),
    ({"positions": (0,)}, "positions"),       # [CLS] is never edited
    ({"positions": (7,)}, "positions"),       # nor [SEP]
    ({"positions": (2, 2)}, "positions"),
    ({"k": 2, "positions": (3,)}, "positions"),
    ({"vocabulary": 0}, "vocabulary"),
    ({"search": "some"}, "search"),
    ({"path_tolerance": 2.0}, "path_tolerance"),
])
def test_bad_input_is_refused_with_a_four_part_message(model, kwargs, argument):
    arguments = {"sentence": "The cat slept all afternoon.", "model": model, "layers": (0,), **SMALL}
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
CLI_SMALL = ["--vocabulary", "16", "--search", "16"]


def test_cli_prints_the_table_and_writes_json_and_plot(tmp_path, capsys):
    json_path, plot_path = tmp_path / "report.json", tmp_path / "plot.png"
    status = main(["perturb", "The cat slept all afternoon.", "--positions", "3", "--layers", "0", *CLI_SMALL,
                   "--json", str(json_path), "--plot", str(plot_path)])
    output = capsys.readouterr().out.strip().splitlines()
    assert status == 0
    assert "violations: 0" in output
    header = next(line for line in output if line.lstrip().startswith("layer"))
    legend = output[output.index(next(line for line in output if line.startswith("columns (W1"))):]
    for column in ("measured", "path", "set", "worst", "global"):
        assert column in header and any(line.split()[0] == column for line in legend[1:]), column
    assert "in the units of the hidden states" in legend[0]
    payload = json.loads(json_path.read_text())
    assert payload["sentence"] == "The cat slept all afternoon." and payload["n"] == 8
    assert [(r["layer"], r["k"], r["positions"]) for r in payload["rows"]] == [(0, 1, [3])]
    assert all(set(r) == ROW_KEYS for r in payload["rows"])
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*partial"))  # written atomically


def test_cli_delete_and_errors(capsys):
    assert main(["perturb", "Rain is expected tomorrow morning.", "--delete", "1", "--positions", "5",
                 "--layers", "0"]) == 0
    assert "violations: 0" in capsys.readouterr().out.strip().splitlines()
    assert main(["perturb", "Rain is expected tomorrow morning.", "--insert", "8", "--layers", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "lipbound: error: --replace/--insert/--delete: expected 1 <= k <= 6 (the word tokens of the sentence; "
        "[CLS] and [SEP] are never edited), got 8. Fix: choose a smaller k or a longer sentence")
    assert main(["perturb", "Rain is expected.", "--layers", "0..9"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("lipbound: error: --layers: expected layer numbers between 0 and 5 (counted from 0)")
    assert len(error.splitlines()) == 1 and "Fix:" in error
    assert main(["perturb", "Rain is expected.", "--positions", "9", "--layers", "0"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("lipbound: error: --positions: expected distinct token positions in 1..4")
    assert len(error.splitlines()) == 1 and "Fix:" in error
    for option, bad in (("--layers", "1-3"), ("--layers", "-1"), ("--vocabulary", "0"), ("--search", "x")):
        with pytest.raises(SystemExit) as info:
            main(["perturb", "Rain is expected.", option, bad])
        assert info.value.code == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"lipbound: error: argument {option}: expected") and len(error.splitlines()) == 1


def test_output_paths_are_checked_before_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["perturb", "Rain is expected.", "--json", str(tmp_path / "missing" / "r.json")])
    assert info.value.code == 2
    assert "--json" in capsys.readouterr().err


def test_registered_cli_command(capsys):
    """Through ``lipbound`` itself: perturb and local are registered subcommands."""
    from lipbound.cli import build_parser
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"perturb", "local"} <= set(subcommands.choices)
    assert main(["perturb", "", "--layers", "0"]) == 2
    assert capsys.readouterr().err.startswith("lipbound: error: sentence: expected a non-empty sentence")


def test_cli_refuses_a_sentence_longer_than_the_model(capsys):
    """all-MiniLM-L6-v2 has 512 positions: a longer sentence is a user error naming the sentence."""
    assert main(["perturb", "word " * 600, "--layers", "0"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("lipbound: error: sentence: expected at most 512 tokens")
    assert "602 tokens" in error and "ids" not in error


# The full sweep -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_sweep_twenty_sentences(model):
    """All 20 sentences of sentences.txt, k = 1..3 replacements, layers 0 and 5: zero violations of any
    certificate, predicted_path within a factor 2 of the measured movement."""
    reports = [perturb(s, k=(1, 2, 3), layers=(0, 5), seed=0, model=model, vocabulary=64, search=64)
               for s in sentences()]
    rows = [row for r in reports for row in r.rows]
    assert len(rows) == 20 * 3 * 2
    assert sum(r.violations for r in reports) == 0
    assert all(row.predicted_path <= 2 * row.measured for row in rows)

