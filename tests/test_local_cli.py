"""``lipbound local`` and the figures of local certificates, through the command line, on the installed
all-MiniLM-L6-v2: L(eps) certified against its witness inside U(X, eps), edit rows at chosen positions,
JSON written atomically, figures drawn from the reports, and one-line errors before any work.
Layers, heads and positions are counted from 0.
"""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from lipbound.cli import main
from lipbound.local.curvature import CURVATURE_TOKENS
from lipbound.printing.figures import draw_edit_layers, draw_local_curve

ROW_KEYS = {"layer", "k", "positions", "n", "measured", "measured_max_token", "predicted_path", "predicted_set",
            "worst_witness", "global"}
PNG = b"\x89PNG\r\n\x1a\n"


#: The radii of the head's curve in :func:`head_report`; the curvature test reads the one at 1e-3.
HEAD_EPS = (0, 1e-4, 1e-3, 1e-2, 2)
#: The tests reading :func:`head_report` run in one process, which runs the command once.
HEAD_GROUP = pytest.mark.xdist_group("local-cli-head")


@pytest.fixture(scope="module")
def head_report(tmp_path_factory):
    """``lipbound local`` on head 3 of layer 0 with edit rows and both figures, run once for the tests reading it:
    its folder, exit status and printed output."""
    folder = tmp_path_factory.mktemp("local")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["local", "The cat sat on the mat.", "--map", "head", "--head", "3", "--eps",
                       ",".join(map(str, HEAD_EPS)), "--positions", "2", "--vocabulary", "12", "--search", "all",
                       "--per-candidate", "--recheck", "--json", str(folder / "local.json"), "--plot-curve",
                       str(folder / "curve.png"), "--plot", str(folder / "edits.png")])
    return folder, status, printed.getvalue()


@HEAD_GROUP
def test_local_curve_and_edit_rows_through_the_command_line(head_report, tmp_path):
    folder, status, out = head_report
    report, curve_png, edits_png = folder / "local.json", folder / "curve.png", folder / "edits.png"
    assert status == 0, out
    assert out.splitlines()[0] == "[CLS] the cat sat on the mat . [SEP]"
    payload = json.loads(report.read_text())
    curve = payload["curve"]
    assert curve["kind"] == "head" and curve["n"] == 9 and len(curve["points"]) == 5
    assert (curve["jacobian_bound"], curve["variation_bound"]) == ("dense", "curvature-gram")
    assert "second derivative's (Gram matrix)" in out and "(dense Jacobian)" in out
    certified = [p["certified"] for p in curve["points"]]
    witness = [p["witness"] for p in curve["points"]]
    assert all(p["verdict"] == "holds" for p in curve["points"])
    assert all(w <= c for w, c in zip(witness, certified))
    assert all(p["variation_witness"] <= p["variation"] for p in curve["points"])
    assert np.all(np.diff(certified) >= 0)  # U(X, eps) grows with eps
    # --recheck: every witness enclosed in high precision at a point of U, the enclosure under the certified value
    for p in curve["points"]:
        low, high = p["witness_rechecked"]
        assert low <= p["witness"] * (1 + 1e-9) and p["witness"] <= high * (1 + 1e-9) and high <= p["certified"]
    assert "rechecked" in out
    # eps -> 0: the certified value is the Jacobian norm at X, and the witness attains it
    assert certified[0] == pytest.approx(curve["jacobian_norm"], rel=1e-9)
    assert witness[0] == pytest.approx(curve["jacobian_norm"], rel=1e-6)
    # up to 1e-3 R the curvature bound keeps the certified value within 1.5 times the witness
    assert all(p["ratio"] <= 1.5 for p in curve["points"][:3])
    # at twice the LayerNorm radius the curve has met the global constant of the head
    assert certified[-1] == pytest.approx(curve["points"][-1]["global"], rel=1e-12)
    rows = payload["edits"]["rows"]
    assert [(r["layer"], r["k"], r["positions"]) for r in rows] == [(0, 1, [2])]
    assert all(set(r) == ROW_KEYS for r in rows) and payload["edits"]["violations"] == 0
    row = rows[0]
    assert row["measured"] <= row["predicted_path"] <= row["predicted_set"] < row["global"]
    assert row["worst_witness"] <= row["predicted_set"]
    # --per-candidate: the set certified edit by edit, within 1% of its worst edit (every one searched)
    assert payload["edits"]["set"]["routes"] == {"k=1, layer 0": "candidates"}
    assert row["predicted_set"] <= 1.01 * row["worst_witness"]
    assert curve_png.read_bytes()[:8] == PNG and edits_png.read_bytes()[:8] == PNG
    assert not list(folder.glob(".*partial"))
    # the same figures from the saved report
    for kind, out_name in (("curve", "again.pdf"), ("edits", "layers.svg"), ("perturb", "share.png")):
        assert main(["plot", kind, str(report), "-o", str(tmp_path / out_name)]) == 0
    assert (tmp_path / "again.pdf").read_bytes().startswith(b"%PDF")


@pytest.mark.parametrize("args, fragment", [
    (["--eps", "1e-3,x"], "argument --eps: expected non-negative numbers separated by commas"),
    (["--map", "head"], "--head: expected a head index (counted from 0) for --map head"),
    (["--map", "stack", "--layer", "3", "--last", "1"], "--last: expected a layer at least 3"),
    (["--ball", "tokens"], "--positions: expected the tokens that move"),
    (["--layer", "6"], "--layer: expected"),
    (["--plot-curve", "/nonexistent/dir/c.png"], "no folder /nonexistent/dir"),
    (["--curvature-tokens", "0"], "argument --curvature-tokens: expected a positive integer, got '0'"),
    (["--kind", "head"], "argument --kind: expected --map head (this option is now called --map; verify's --kind"),
    (["--norm", "2,1", "--recheck"], "--recheck: expected maps the high-precision re-check covers, in the Frobenius"),
])
def test_local_errors_are_one_line(args, fragment, capsys):
    try:
        status = main(["local", "Rain is expected.", "--eps", "0", *args])
    except SystemExit as stop:
        status = stop.code
    assert status == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and fragment in error[0] and "Fix:" in error[0], error


@HEAD_GROUP
def test_curvature_tokens_choose_the_gram_route_or_the_looser_split_bound(head_report, tmp_path, capsys):
    # the sentence has 9 tokens: the default (at least 9) takes the Gram route in head_report's curve, whose
    # values at 0 and 1e-3 are those of a curve at these two radii alone (a point's certified value is its own)
    assert CURVATURE_TOKENS >= 9
    gram = json.loads((head_report[0] / "local.json").read_text())["curve"]
    assert gram["variation_bound"] == "curvature-gram"
    gram = [gram["points"][HEAD_EPS.index(eps)] for eps in (0, 1e-3)]
    path = tmp_path / "8.json"
    assert main(["local", "The cat sat on the mat.", "--map", "head", "--head", "3", "--eps", "0,1e-3",
                 "--curvature-tokens", "8", "--json", str(path)]) == 0
    report = json.loads(path.read_text())["curve"]
    assert report["variation_bound"] == "curvature-split"
    split = report["points"]
    assert gram[0]["certified"] == pytest.approx(split[0]["certified"], rel=1e-9)
    assert gram[1]["witness"] <= gram[1]["certified"] < split[1]["certified"]
    with pytest.raises(SystemExit):
        main(["local", "--help"])
    assert f"(default {CURVATURE_TOKENS};" in " ".join(capsys.readouterr().out.split())


def test_figures_refuse_reports_of_the_wrong_kind(tmp_path):
    edits = {"mode": "replace", "rows": [{"layer": layer, "k": 1, "positions": [2], "n": 9, "measured": 1.0 + layer,
                                          "measured_max_token": 3.0, "predicted_path": 1.2 + layer,
                                          "predicted_set": None, "worst_witness": 1.5 + layer, "global": 1e5}
                                         for layer in range(3)]}
    draw_edit_layers(edits, tmp_path / "edits.png")  # predicted_set not computed: drawn without it
    assert (tmp_path / "edits.png").read_bytes()[:8] == PNG
    with pytest.raises(Exception, match="a lipbound local --json report"):
        draw_local_curve(edits, tmp_path / "curve.png")
    with pytest.raises(Exception, match="a lipbound perturb --json report"):
        draw_edit_layers({"rows": [{"layer": 0}]}, tmp_path / "edits.png")
    assert not (tmp_path / "curve.png").exists()
