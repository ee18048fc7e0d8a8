"""``lipbound plot``: figures at paper column width, from real heads and from real reports.

Each figure is checked as a reader would: the file is written (atomically, in the format its name
asks for), 3.3 inches wide, with ink in it; the numbers behind it are the ones the command
prints.  Output paths are checked before any work.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lipbound.cli import main
from lipbound.numeric.model import DEFAULT_WEIGHTS
from lipbound.printing.figures import COLUMN_WIDTH, draw_perturbation, gap_grid_from_report

DPI = 300


def _image(path):
    from matplotlib.image import imread
    return imread(str(path))


def _check_png(path, min_ink: float = 0.02):
    pixels = _image(path)[..., :3]
    assert pixels.shape[1] == round(COLUMN_WIDTH * DPI), pixels.shape  # one column of a two-column paper
    assert float(np.mean(pixels.min(axis=-1) < 0.9)) > min_ink


def call(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as exit:
        return exit.code


def test_scaling_on_a_real_head_prints_the_slopes_it_draws(tmp_path, capsys):
    out = tmp_path / "scaling.png"
    assert main(["plot", "scaling", "--n-values", "2,4", "--budget", "0.05", "--head", "3", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "against n: bound slope" in printed and "against R: bound slope" in printed
    slopes = [float(word.rstrip(",")) for line in printed.splitlines() if line.startswith("against R")
              for word in line.split()[4::3]]
    assert slopes and 1.5 < slopes[0] < 2.5  # the bound grows like R^2 at large R
    _check_png(out)


def test_gaps_from_a_verify_report_of_real_weights(tmp_path):
    report = tmp_path / "report.json"
    assert main(["verify", str(DEFAULT_WEIGHTS), "--layer", "0", "--head", "1", "--budget", "0.2", "--n", "4",
                 "--witness-dir", str(tmp_path / "w"), "--json", str(report)]) == 0
    grid = gap_grid_from_report(json.loads(report.read_text()))
    assert grid.layers == (0,) and grid.heads == 2 and np.isnan(grid.gaps[0][0]) and grid.gaps[0][1] >= 1
    out = tmp_path / "gaps.pdf"
    assert main(["plot", "gaps", str(report), "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"%PDF")


def test_perturbation_curves_from_a_report(tmp_path):
    rows = [{"layer": layer, "k": k, "n": 9, "measured": 0.5 * k + layer, "predicted": 1e5 * k} for layer in (0, 3)
            for k in (1, 2, 3)]
    report = tmp_path / "edits.json"
    report.write_text(json.dumps({"mode": "replace", "rows": rows}))
    out = tmp_path / "edits.png"
    assert main(["plot", "perturb", str(report), "-o", str(out)]) == 0
    _check_png(out)
    with pytest.raises(Exception, match="perturb --json report"):
        draw_perturbation({"no rows": []}, tmp_path / "x.png")


@pytest.mark.parametrize("args, fragment", [
    (["plot", "scaling", "-o", "{tmp}/figure.xyz"], "argument -o/--output: expected a file ending in one of"),
    (["plot", "scaling", "-o", "/nonexistent/dir/figure.png"], "no folder /nonexistent/dir"),
    (["plot", "scaling", "--head", "12", "-o", "{tmp}/f.png"], "--head: expected an index in 0..11"),
    (["plot", "gaps", "{tmp}/missing.json", "-o", "{tmp}/f.png"], "report: expected a readable JSON report"),
    (["plot", "gaps", "{tmp}/bad.json", "-o", "{tmp}/f.png"], "a lipbound verify --json report with head rows"),
    (["plot", "perturb", "{tmp}/bad.json", "-o", "{tmp}/f.png"], "a lipbound perturb --json report"),
])
def test_plot_errors_are_one_line_before_any_work(args, fragment, tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps({"rows": "none"}))
    assert call([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "f.png").exists()


@pytest.mark.slow
def test_gaps_measured_on_every_head_of_the_default_model(tmp_path, capsys):
    out = tmp_path / "gaps.png"
    assert main(["plot", "gaps", "--budget", "0.1", "-o", str(out)]) == 0
    _check_png(out, min_ink=0.05)
