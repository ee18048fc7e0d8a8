"""The command line as users call it: outputs, JSON fields, exit statuses, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lipbound.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lipbound.cli", *args], capture_output=True, text=True, timeout=900)


def test_list_names_variants_theorems_and_claims(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("dot-product", "l2-tied", "measure-w1", "self-attention-fro", "kim-l2-fro", "[unverified]"):
        assert word in out


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


@pytest.mark.parametrize("args,fragment", [
    (["derive", "no-such-variant"], "variant: expected one of"),
    (["derive", "dot-product", "--norm", "w1"], "norm: expected a norm on X"),
    (["compare", "no-such-claim"], "claim: expected one of"),
    (["derive", "dot-product", "--n", "0"], "n: expected a positive integer"),
    (["check", "no-such-claim"], "claim: expected one of"),
    (["verify", "/nonexistent/model.safetensors"], "/nonexistent/model.safetensors"),
])
def test_user_errors_are_one_line_with_exit_status_2(args, fragment):
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


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
    from lipbound.numeric import certify, report
    real = certify.head_constant

    def too_small(*args, **kwargs):
        value = real(*args, **kwargs)
        return certify.CertifiedConstant(1e-3, value.name, value.norm)

    monkeypatch.setattr(report, "head_constant", too_small)
    from lipbound.numeric.model import load_default
    path = tmp_path / "plain.npz"
    from lipbound.numeric.model import save_plain
    save_plain(load_default(layers=0), path)
    status = main(["verify", str(path), "--layer", "0", "--head", "3", "--budget", "1", "--radius", "layernorm",
                   "--witness-dir", str(tmp_path / "w"), "--json", str(tmp_path / "r.json")])
    assert status == 3
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["heads"][0]["refuted"] == ["derived"]
