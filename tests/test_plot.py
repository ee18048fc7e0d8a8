"""``lipbound plot``: figures at paper column width, from real heads and from real reports.

Each figure is checked as a reader would: the file is written (atomically, in the format its name
asks for), 3.3 inches wide, with ink in it; the numbers behind it are the ones the command
prints.  Output paths are checked before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

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
    rows = [{"layer": layer, "k": k, "positions": list(range(2, 2 + k)), "n": 9, "measured": 0.5 * k + layer,
             "predicted_path": 0.6 * k + layer, "predicted_set": 3.0 * k + layer, "worst_witness": 0.9 * k + layer,
             "global": 1e5 * k} for layer in (0, 3) for k in (1, 2, 3)]
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


# Every kind of figure, drawn from the data its command writes: no text leaves the canvas ---------------------
def _scaling_data():
    from lipbound.printing.paper import ScalingFigure, Series
    n = (2.0, 4.0, 8.0, 16.0, 32.0)
    radii = (1.266, 2.532, 5.064, 10.13, 20.25)
    return ScalingFigure(head="sentence-transformers/all-MiniLM-L6-v2, layer 0, head 0", theorem="self-attention-fro",
                         domain="ball of radius 20.25 about 0",
                         n_series=Series("n", n, (1247.0, 1510.0, 1939.0, 2500.0, 3300.0), (350.0, 580.0, 963.0,
                                                                                             1450.0, 2100.0)),
                         radius_series=Series("R", radii, (13.7, 38.4, 133.0, 500.0, 1939.0), (3.2, 14.3, 61.0,
                                                                                                240.0, 963.0)),
                         fixed_n=8, fixed_radius=20.2546)


def _edit_rows(ks=(1, 2), layers=range(6)):
    return [{"layer": layer, "k": k, "positions": [2, 4][:k], "n": 9, "measured": 0.4 * k + 0.1 * layer,
             "predicted_path": 0.5 * k + 0.1 * layer, "predicted_set": 3.0 * k + layer, "worst_witness": 0.9 * k,
             "global": 2e4 * k * (layer + 1)} for layer in layers for k in ks]


def _figures_of_every_kind(tmp_path, monkeypatch, kinds: tuple[str, ...] | None = None) -> dict:
    """The figures of every kind (or of ``kinds``) drawn into ``tmp_path``: name -> the matplotlib Figure."""
    from lipbound.printing import figures
    drawn = {}
    original = figures._save

    def keep(figure, path, option):
        drawn[Path(path).stem] = figure
        return original(figure, path, option)
    monkeypatch.setattr(figures, "_save", keep)
    report = {"model": "sentence-transformers/all-MiniLM-L6-v2", "n": 8, "complete": False, "rows_finished": 25,
              "rows_planned": 26,
              "rows": [{"layer": layer, "head": head, "n": 8, "gap": 1.3 + 0.01 * (head or 20)}
                       for layer in (0, 5) for head in list(range(12)) + [None]][:25]}
    points = [{"eps": e, "certified": 3.9 + 1e3 * e, "witness": 3.88 + 10 * e, "global": None if e == 0 else 9.7e3}
              for e in (0.0, 1.8e-4, 1.8e-3, 1.8e-2, 0.18, 1.8, 18.0)]
    draws = {
        "scaling": lambda: figures.draw_scaling(_scaling_data(), tmp_path / "scaling.png"),
        "gaps": lambda: figures.draw_gaps(figures.gap_grid_from_report(report), tmp_path / "gaps.png"),
        "perturb": lambda: figures.draw_perturbation({"mode": "replace", "rows": _edit_rows((1, 2, 3))},
                                                     tmp_path / "perturb.png"),
        "edits": lambda: figures.draw_edit_layers({"mode": "insert", "rows": _edit_rows()}, tmp_path / "edits.png"),
        "curve": lambda: figures.draw_local_curve(
            {"curve": {"points": points, "layernorm_radius": 17.98, "jacobian_norm": 3.88,
                       "component": "layer 0 attention", "ball": "fro", "norm": "fro", "n": 9}},
            tmp_path / "curve.png"),
        "scaling-of-edits": lambda: figures.draw_edit_scaling(_edit_rows((1, 2, 3), (0, 2, 5)),
                                                              tmp_path / "scaling-of-edits.png"),
    }
    for name, draw in draws.items():
        if kinds is None or name in kinds:
            draw()
    return drawn


@pytest.fixture(scope="module")
def every_figure(tmp_path_factory) -> tuple[Path, dict]:
    """The figures of every kind, drawn once for the tests that only read them (a few CPU seconds a drawing)."""
    folder = tmp_path_factory.mktemp("figures")
    with pytest.MonkeyPatch.context() as monkeypatch:
        return folder, _figures_of_every_kind(folder, monkeypatch)


def test_every_figure_keeps_every_text_on_the_canvas(every_figure):
    from lipbound.printing.figures import clipped_texts
    folder, drawn = every_figure
    assert sorted(drawn) == ["curve", "edits", "gaps", "perturb", "scaling", "scaling-of-edits"]
    for name, figure in drawn.items():
        assert clipped_texts(figure) == [], name
        assert figure.get_figwidth() == COLUMN_WIDTH
        _check_png(folder / f"{name}.png")


def test_the_depth_figure_keeps_every_text_on_the_canvas(tmp_path, monkeypatch):
    """``depth --plot`` draws its own figure (lipbound.measures.depth): checked the same way."""
    from matplotlib.figure import Figure

    from lipbound.measures.depth import depth_experiment
    from lipbound.printing.figures import clipped_texts
    drawn, save = [], Figure.savefig

    def keep(figure, *args, **kwargs):
        drawn.append(figure)
        return save(figure, *args, **kwargs)
    monkeypatch.setattr(Figure, "savefig", keep)
    depth_experiment(0.5, steps=20).plot(tmp_path / "depth.png")
    assert len(drawn) == 1 and clipped_texts(drawn[0]) == []
    assert float(np.mean(_image(tmp_path / "depth.png")[..., :3].min(axis=-1) < 0.9)) > 0.02


def test_the_clipping_check_sees_a_clipped_label(tmp_path, monkeypatch):
    """The check itself: a colour-bar label longer than the figure is reported."""
    from lipbound.printing.figures import clipped_texts
    figure = _figures_of_every_kind(tmp_path, monkeypatch, ("gaps",))["gaps"]   # its own: the label is changed
    figure.axes[-1].set_ylabel("a colour-bar label far longer than the figure is tall " * 3)
    assert clipped_texts(figure)


def test_the_gap_figure_keeps_the_whole_layers_and_says_when_a_report_is_partial(every_figure):
    _, drawn = every_figure
    axes = drawn["gaps"].axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()][-1] == "all"
    assert "partial: 25 of 26 rows" in axes.get_title()
    scaling = drawn["scaling"].axes[0]
    assert "R = 20.25" in scaling.get_xlabel() and "\n" in scaling.get_title()   # the radius stated, the title wrapped
