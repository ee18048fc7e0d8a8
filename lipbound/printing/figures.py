r"""Figures at paper column width: bound and witness against n and R, gaps per head, token edits.

Each function draws from plain data (no numeric code is imported here) onto a matplotlib
:class:`~matplotlib.figure.Figure` 3.3 inches wide -- one column of a two-column paper -- with
8-point text, mathtext labels on every axis and one legend (or one colour bar) per figure, and
writes it atomically (:func:`lipbound.io.atomic_write`) in the format the file name's extension
names (any format matplotlib writes: png, pdf, svg, eps, ...).

* :func:`draw_scaling` -- a :class:`~lipbound.printing.paper.ScalingFigure`: certified bound and
  witness of one head against the number of tokens and against the radius, log-log, with the
  fitted slopes;
* :func:`draw_gaps` -- a :class:`GapGrid`: the gap (certified bound / witness) of every head of a
  model, layers by heads, read from a ``verify --json`` report (:func:`gap_grid_from_report`);
* :func:`draw_perturbation` -- the measured and certified Wasserstein-1 movement of each layer
  against the share of edited tokens, from a ``perturb --json`` report.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..io import atomic_write
from .paper import ScalingFigure, Series

__all__ = ["COLUMN_WIDTH", "draw_scaling", "GapGrid", "gap_grid_from_report", "draw_gaps", "draw_perturbation",
           "figure_formats"]

#: One column of a two-column paper, in inches.
COLUMN_WIDTH = 3.3
_STYLE = {"font.size": 8, "axes.labelsize": 8, "axes.titlesize": 8, "legend.fontsize": 7, "xtick.labelsize": 7,
          "ytick.labelsize": 7, "mathtext.fontset": "cm", "axes.linewidth": 0.6, "lines.linewidth": 1.2,
          "lines.markersize": 3.5}
_BOUND, _WITNESS = "#b2182b", "#2166ac"


def figure_formats() -> list[str]:
    """File extensions matplotlib can write."""
    from matplotlib.figure import Figure
    return sorted(Figure().canvas.get_supported_filetypes())


def _figure(height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: no global backend change
    from matplotlib.figure import Figure
    figure = Figure(figsize=(COLUMN_WIDTH, height), constrained_layout=True)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path, option: str) -> Path:
    path = Path(path)
    extension = path.suffix.lower().lstrip(".")
    if extension not in figure.canvas.get_supported_filetypes():
        raise AssumptionError(option, f"a file ending in one of .{', .'.join(figure_formats())}", str(path),
                              f"write e.g. {option} figure.pdf")
    buffer = io.BytesIO()
    figure.savefig(buffer, format=extension, dpi=300)
    with atomic_write(path, option) as handle:
        handle.write(buffer.getvalue())
    return path


def _styled(function):
    """Draw and save inside lipbound's figure style (8-point text, Computer Modern mathtext)."""
    def wrapped(*args, **kwargs):
        import matplotlib
        with matplotlib.rc_context(_STYLE):
            return function(*args, **kwargs)
    wrapped.__doc__, wrapped.__name__ = function.__doc__, function.__name__
    return wrapped


def _series_axes(axes, series: Series, label: str, legend: bool) -> None:
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator
    values = np.asarray(series.values, dtype=float)
    for data, colour, marker, style, name in ((series.bounds, _BOUND, "s", "-", "certified bound"),
                                              (series.witnesses, _WITNESS, "o", "--", "witness")):
        axes.plot(values, data, style, color=colour, marker=marker, label=name)
        fit = np.exp(np.polyval(np.polyfit(np.log(values), np.log(np.asarray(data, float)), 1), np.log(values)))
        axes.plot(values, fit, ":", color=colour, linewidth=0.8)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.xaxis.set_major_locator(FixedLocator(values))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xticks(values, labels=[f"{value:.3g}" for value in values])
    axes.text(0.98, 0.04, "fitted slopes: bound %.2f, witness %.2f" % (series.bound_slope, series.witness_slope),
              transform=axes.transAxes, ha="right", va="bottom", fontsize=7)
    axes.set_xlabel(label)
    axes.set_ylabel(r"$\mathrm{Lip}(f)$")
    axes.grid(True, which="major", linewidth=0.3, alpha=0.5)
    if legend:
        axes.legend(loc="upper left", frameon=False)


@_styled
def draw_scaling(data: ScalingFigure, path, option: str = "--output") -> Path:
    """Bound and witness of one head against ``n`` (top) and ``R`` (bottom), log-log, slopes fitted
    by least squares (dotted); one legend."""
    figure = _figure(4.2)
    top, bottom = figure.subplots(2, 1)
    _series_axes(top, data.n_series, r"number of tokens $n$", legend=True)
    _series_axes(bottom, data.radius_series, r"radius $R$ of the token ball ($n = %d$)" % data.fixed_n, legend=False)
    top.set_title(data.head, fontsize=7)
    return _save(figure, path, option)


@final
@dataclass(frozen=True)
class GapGrid:
    """Gaps (certified bound / witness) of the heads of a model: ``gaps[i][h]`` for ``layers[i]``;
    ``nan`` where a row is missing or has no finite gap."""

    model: str
    layers: tuple[int, ...]
    heads: int
    gaps: tuple[tuple[float, ...], ...]
    n: int


def gap_grid_from_report(report: dict, where: str = "report") -> GapGrid:
    """The head rows of a ``lipbound verify --json`` report (whole-layer rows are skipped)."""
    try:
        rows = [row for row in report["rows"] if row.get("head") is not None]
        layers = sorted({int(row["layer"]) for row in rows})
        heads = 1 + max(int(row["head"]) for row in rows)
        n = int(report.get("n", rows[0]["n"]))
        cells = [(layers.index(int(row["layer"])), int(row["head"]), row.get("gap")) for row in rows]
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise AssumptionError(where, "a lipbound verify --json report with head rows", f"a file without them ({error})",
                              "write one with lipbound verify MODEL --json report.json") from None
    grid = np.full((len(layers), heads), np.nan)
    for layer, head, gap in cells:
        grid[layer, head] = np.nan if gap is None else float(gap)
    return GapGrid(str(report.get("model", "")), tuple(layers), heads, tuple(map(tuple, grid)), n)


@_styled
def draw_gaps(grid: GapGrid, path, option: str = "--output") -> Path:
    """A heatmap of the gap of every head, layers by heads, logarithmic colour scale, one colour bar;
    each cell is labelled with its gap."""
    from matplotlib.colors import LogNorm
    values = np.asarray(grid.gaps, dtype=float)
    if not np.isfinite(values).any():
        raise AssumptionError(option, "a report with at least one finite gap", "no finite gap",
                              "verify a model whose bounds are finite")
    figure = _figure(0.5 + 0.32 * len(grid.layers) + 0.6)
    axes = figure.subplots()
    finite = values[np.isfinite(values)]
    image = axes.imshow(values, cmap="viridis", norm=LogNorm(vmin=max(finite.min(), 1.0), vmax=max(finite.max(), 1.01)),
                        aspect="auto")
    for (i, h), value in np.ndenumerate(values):
        text = "--" if not math.isfinite(value) else f"{value:.2g}"
        axes.text(h, i, text, ha="center", va="center", fontsize=5, color="white")
    axes.set_xticks(range(grid.heads))
    axes.set_yticks(range(len(grid.layers)), labels=[str(layer) for layer in grid.layers])
    axes.set_xlabel(r"head $h$")
    axes.set_ylabel(r"layer")
    axes.set_title(f"{grid.model}, $n = {grid.n}$" if grid.model else f"$n = {grid.n}$", fontsize=7)
    from matplotlib.ticker import FuncFormatter
    bar = figure.colorbar(image, ax=axes, pad=0.02)
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    bar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    bar.set_label(r"gap $= \overline{L} / \underline{L}$ (bound / witness)")
    return _save(figure, path, option)


@_styled
def draw_perturbation(report: dict, path, option: str = "--output") -> Path:
    """Measured Wasserstein-1 movement of each layer's attention block (solid) and its certified
    prediction (dashed) against the share ``k / n`` of edited tokens, log scale; one legend."""
    try:
        mode = str(report.get("mode", "replace"))
        curves = {}
        for row in sorted(report["rows"], key=lambda row: (int(row["layer"]), row["k"])):
            curves.setdefault(int(row["layer"]), []).append(
                (row["k"] / row["n"], float(row["measured"]), float(row["predicted"])))
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as error:
        raise AssumptionError("report", "a lipbound perturb --json report", f"a file without its rows ({error})",
                              'write one with lipbound perturb "A sentence." --json edits.json') from None
    if not curves:
        raise AssumptionError("report", "a lipbound perturb --json report", "no rows",
                              'write one with lipbound perturb "A sentence." --json edits.json')
    from matplotlib.lines import Line2D
    figure = _figure(2.6)
    axes = figure.subplots()
    layers = sorted(curves)
    colours = [f"C{i % 10}" for i in range(len(layers))]
    for colour, layer in zip(colours, layers):
        share, measured, predicted = zip(*curves[layer])
        axes.plot(share, measured, "-o", color=colour)
        axes.plot(share, predicted, "--s", color=colour, markerfacecolor="none")
    axes.set_yscale("log")
    axes.set_xlabel(r"edited share of tokens $k / n$ (%s)" % mode)
    axes.set_ylabel(r"$W_1$ movement of the block output")
    handles = [Line2D([], [], color=colour, marker="o", label=f"layer {layer}") for colour, layer in zip(colours, layers)]
    handles += [Line2D([], [], color="0.3", linestyle="-", label="measured"),
                Line2D([], [], color="0.3", linestyle="--", label=r"certified: $L \cdot W_1(\mathrm{inputs})$")]
    axes.legend(handles=handles, frameon=False, ncol=2, loc="best")
    axes.grid(True, which="major", linewidth=0.3, alpha=0.5)
    return _save(figure, path, option)
