r"""Figures at paper column width: bound and witness against n and R, gaps per head, token edits, L(eps).

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
  against the share of edited tokens, from a ``perturb --json`` report;
* :func:`draw_edit_layers` -- per layer: measured, worst witness, certified for the set, certified
  along the edit and the global prediction, from a ``perturb --json`` or ``local --json`` report;
* :func:`draw_local_curve` -- the certified local Lipschitz constant ``L(eps)`` and its witness,
  from a ``local --json`` report;
* :func:`draw_edit_scaling` -- measured and certified movements of many sentences against ``k / n``,
  with fitted power laws (``bench/bench_local.py --figure``).
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
           "draw_edit_layers", "draw_local_curve", "draw_edit_scaling", "EDIT_FIELDS", "figure_formats",
           "clipped_texts"]

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


def clipped_texts(figure) -> list[str]:
    """The texts of a drawn ``figure`` whose tight bounding box leaves the canvas (by more than half a
    pixel): none in any figure lipbound writes (tests/test_plot.py).  Tick labels count as their axis
    draws them (the ticks inside the view); every other visible text by its own extent."""
    from matplotlib.text import Text
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    width, height = figure.bbox.width, figure.bbox.height

    def outside(box) -> bool:
        return box is not None and (box.x0 < -0.5 or box.y0 < -0.5 or box.x1 > width + 0.5 or box.y1 > height + 0.5)

    clipped, ticks = [], set()
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update((id(tick.label1), id(tick.label2)))
            if outside(axis.get_tightbbox(renderer)):
                clipped.append(f"the {axis.axis_name} axis of {axes.get_title() or axes.get_label() or 'an axes'}")
    for text in figure.findobj(Text):
        if id(text) not in ticks and text.get_visible() and text.get_text().strip() and \
                outside(text.get_window_extent(renderer)):
            clipped.append(text.get_text())
    return clipped


def _save(figure, path, option: str) -> Path:
    path = Path(path)
    extension = path.suffix.lower().lstrip(".")
    if extension not in figure.canvas.get_supported_filetypes():
        raise AssumptionError(option, f"a file ending in one of .{', .'.join(figure_formats())}", str(path),
                              f"write e.g. `{option}` figure.pdf")
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
                                              (series.witnesses, _WITNESS, "o", "--", "certified witness")):
        axes.plot(values, data, style, color=colour, marker=marker, label=name)
        fit = np.exp(np.polyval(np.polyfit(np.log(values), np.log(np.asarray(data, float)), 1), np.log(values)))
        axes.plot(values, fit, ":", color=colour, linewidth=0.8)
    # the gap at both ends: the bound is certified at every point, so the curves can meet but never cross;
    # a steeper witness only closes the gap over this range (the slopes are fits, not laws)
    for index, align in ((0, "left"), (-1, "right")):
        low, high = float(series.witnesses[index]), float(series.bounds[index])
        axes.annotate("", xy=(values[index], low), xytext=(values[index], high),
                      arrowprops={"arrowstyle": "<->", "color": "0.45", "linewidth": 0.6, "shrinkA": 0, "shrinkB": 0})
        axes.annotate(r"$\times$%.2g" % (high / low), xy=(values[index], math.sqrt(low * high)),
                      xytext=(4 if align == "left" else -4, 0), textcoords="offset points", ha=align, va="center",
                      fontsize=6, color="0.3")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.xaxis.set_major_locator(FixedLocator(values))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xticks(values, labels=[f"{value:.3g}" for value in values])
    axes.text(0.98, 0.04, "fitted slopes: bound %.2f, witness %.2f" % (series.bound_slope, series.witness_slope),
              transform=axes.transAxes, ha="right", va="bottom", fontsize=6.5)
    axes.set_xlabel(label)
    axes.set_ylabel(r"$\mathrm{Lip}(f)$")
    axes.grid(True, which="major", linewidth=0.3, alpha=0.5)
    if legend:
        axes.legend(loc="upper left", frameon=False)


def _wrapped(text: str, characters: int = 52) -> str:
    """A title that fits the column: broken at spaces into lines of at most ``characters``."""
    import textwrap
    return "\n".join(textwrap.wrap(text, characters, break_on_hyphens=False)) or text


@_styled
def draw_scaling(data: ScalingFigure, path, option: str = "path") -> Path:
    """Bound and witness of one head against ``n`` on the ball of radius ``fixed_radius`` (top) and
    against ``R`` with ``n = fixed_n`` (bottom), log-log, slopes fitted by least squares (dotted), the gap
    marked at both ends of each panel; one legend and a note on what the slopes mean."""
    figure = _figure(4.6)
    top, bottom = figure.subplots(2, 1)
    _series_axes(top, data.n_series, r"number of tokens $n$ (radius $R = %.4g$)" % data.fixed_radius, legend=True)
    _series_axes(bottom, data.radius_series, r"radius $R$ of the token ball ($n = %d$)" % data.fixed_n, legend=False)
    top.set_title(_wrapped(data.head), fontsize=7)
    figure.text(0.5, 0.005, "Lip lies between the curves at every point. The slopes are fits\n"
                            "over this range: a steeper witness narrows the gap, never crosses.",
                ha="center", va="bottom", fontsize=6, color="0.3")
    figure.get_layout_engine().set(rect=(0, 0.06, 1, 0.94))
    return _save(figure, path, option)


@final
@dataclass(frozen=True)
class GapGrid:
    """Gaps (certified bound / witness) of the heads of a model: ``gaps[i][h]`` for ``layers[i]``;
    ``nan`` where a row is missing or has no finite gap.  ``columns`` names the columns (default the head
    numbers; a report's whole-layer rows add a column ``all``); ``status`` says when the rows are partial."""

    model: str
    layers: tuple[int, ...]
    heads: int
    gaps: tuple[tuple[float, ...], ...]
    n: int
    columns: tuple[str, ...] = ()
    status: str = ""

    @property
    def labels(self) -> tuple[str, ...]:
        return self.columns or tuple(str(h) for h in range(self.heads))


def gap_grid_from_report(report: dict, where: str = "report") -> GapGrid:
    """The rows of a ``lipbound verify --json`` report: one column per head, and a column ``all`` for the
    whole layers when the report has them; ``status`` is set when the report is partial."""
    try:
        rows = list(report["rows"])
        heads = 1 + max(int(row["head"]) for row in rows if row.get("head") is not None)
        layers = sorted({int(row["layer"]) for row in rows})
        whole = any(row.get("head") is None for row in rows)
        n = int(report.get("n", rows[0]["n"]))
        cells = [(layers.index(int(row["layer"])), heads if row.get("head") is None else int(row["head"]),
                  row.get("gap")) for row in rows]
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise AssumptionError(where, "a lipbound verify --json report with head rows", f"a file without them ({error})",
                              "write one with lipbound verify MODEL --json report.json") from None
    grid = np.full((len(layers), heads + int(whole)), np.nan)
    for layer, column, gap in cells:
        grid[layer, column] = np.nan if gap is None else float(gap)
    status = ""
    if report.get("complete") is False:
        status = f"partial: {report.get('rows_finished', len(rows))} of {report.get('rows_planned', '?')} rows"
    columns = tuple(str(h) for h in range(heads)) + (("all",) if whole else ())
    return GapGrid(str(report.get("model", "")), tuple(layers), heads, tuple(map(tuple, grid)), n, columns, status)


@_styled
def draw_gaps(grid: GapGrid, path, option: str = "path") -> Path:
    """A heatmap of the gap of every head (and whole layer), layers by heads, logarithmic colour scale, one
    colour bar; each cell is labelled with its gap; a partial report says so in the title."""
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import FuncFormatter
    values = np.asarray(grid.gaps, dtype=float)
    if not np.isfinite(values).any():
        raise AssumptionError(option, "a report with at least one finite gap", "no finite gap",
                              "verify a model whose bounds are finite")
    figure = _figure(max(2.0, 0.9 + 0.32 * len(grid.layers)))
    axes = figure.subplots()
    finite = values[np.isfinite(values)]
    image = axes.imshow(values, cmap="viridis", norm=LogNorm(vmin=max(finite.min(), 1.0), vmax=max(finite.max(), 1.01)),
                        aspect="auto")
    for (i, h), value in np.ndenumerate(values):
        text = "--" if not math.isfinite(value) else f"{value:.2g}"
        axes.text(h, i, text, ha="center", va="center", fontsize=5, color="white")
    labels = grid.labels
    axes.set_xticks(range(len(labels)), labels=labels)
    axes.set_yticks(range(len(grid.layers)), labels=[str(layer) for layer in grid.layers])
    if labels[-1] == "all":
        axes.axvline(len(labels) - 1.5, color="white", linewidth=1.5)
    axes.set_xlabel(r"head $h$" + (" (all: the whole layer)" if labels[-1] == "all" else ""))
    axes.set_ylabel(r"layer")
    title = f"{grid.model}, $n = {grid.n}$" if grid.model else f"$n = {grid.n}$"
    axes.set_title(_wrapped(title + (f" ({grid.status})" if grid.status else "")), fontsize=7)
    bar = figure.colorbar(image, ax=axes, pad=0.02)
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    bar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    bar.set_label("gap (bound / witness)")
    return _save(figure, path, option)


def _edit_rows(report: dict, option: str) -> tuple[str, list]:
    """The rows of a ``perturb --json`` report (or of the ``edits`` of a ``local --json`` one), with
    ``None`` (not computed) read as NaN."""
    fix = 'write one with lipbound perturb "A sentence." --json edits.json'
    try:
        report = report.get("edits", report) if isinstance(report.get("edits"), dict) else report
        rows = [{key: (math.nan if row[key] is None else float(row[key])) if key not in ("layer", "k", "positions")
                 else row[key] for key in EDIT_FIELDS} for row in report["rows"]]
        mode = str(report.get("mode", "replace"))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise AssumptionError(option, "a lipbound perturb --json report", f"a file without its rows ({error})",
                              fix) from None
    if not rows:
        raise AssumptionError(option, "a lipbound perturb --json report", "no rows", fix)
    return mode, rows


#: The fields of an edit row that the figures read (docs/formats.md).
EDIT_FIELDS = ("layer", "k", "positions", "n", "measured", "predicted_path", "predicted_set", "worst_witness",
               "global")


@_styled
def draw_perturbation(report: dict, path, option: str = "path") -> Path:
    """Measured Wasserstein-1 movement of each layer's attention block (solid) and its certificate
    along the edit, ``predicted_path`` (dashed), against the share ``k / n`` of edited tokens, log
    scale; one legend."""
    mode, rows = _edit_rows(report, "report")
    curves = {}
    for row in sorted(rows, key=lambda row: (int(row["layer"]), row["k"])):
        curves.setdefault(int(row["layer"]), []).append((row["k"] / row["n"], row["measured"], row["predicted_path"]))
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
    handles = [Line2D([], [], color=colour, marker="o", label=f"layer {layer}")
               for colour, layer in zip(colours, layers)]
    handles += [Line2D([], [], color="0.3", linestyle="-", label="measured"),
                Line2D([], [], color="0.3", linestyle="--", label="certified along the edit")]
    axes.legend(handles=handles, frameon=False, ncol=2, loc="best")
    axes.grid(True, which="major", linewidth=0.3, alpha=0.5)
    return _save(figure, path, option)


_EDIT_STYLES = (("measured", "-o", _WITNESS, "measured (this edit)"),
                ("worst_witness", "-v", "#4393c3", "worst edit found in the set"),
                ("predicted_set", "--s", _BOUND, "certified for the whole set"),
                ("predicted_path", "--^", "#f4a582", "certified along this edit"),
                ("global", ":x", "0.3", r"global constant $\times$ input $W_1$"))


@_styled
def draw_edit_layers(report: dict, path, option: str = "path") -> Path:
    """Per layer: measured, worst witness, ``predicted_set``, ``predicted_path`` and ``global``
    Wasserstein-1 movement of the attention block outputs on a log axis, one panel per edit size k
    (stacked), one legend."""
    mode, rows = _edit_rows(report, "report")
    ks = sorted({int(row["k"]) for row in rows})
    figure = _figure(0.4 + 1.9 * len(ks))
    panels = np.atleast_1d(figure.subplots(len(ks), 1, sharex=True))
    for axes, k in zip(panels, ks):
        chosen = sorted((row for row in rows if int(row["k"]) == k), key=lambda row: int(row["layer"]))
        layers = [int(row["layer"]) for row in chosen]
        for key, style, colour, label in _EDIT_STYLES:
            values = np.array([row[key] for row in chosen], dtype=float)
            if np.isfinite(values).any():
                axes.plot(layers, values, style, color=colour, label=label, markerfacecolor="none")
        axes.set_yscale("log")
        axes.set_ylabel(r"$W_1$ of the block output")
        axes.set_title(f"{mode} $k = {k}$ at positions {list(chosen[0]['positions'])}, $n = {int(chosen[0]['n'])}$",
                       fontsize=7)
        axes.grid(True, which="major", linewidth=0.3, alpha=0.5)
    panels[-1].set_xlabel("layer (counted from 0)")
    panels[-1].xaxis.get_major_locator().set_params(integer=True)
    panels[0].legend(frameon=False, fontsize=6, loc="best")
    return _save(figure, path, option)


def _curve(report: dict, option: str) -> dict:
    fix = 'write one with lipbound local "A sentence." --json local.json'
    try:
        curve = report.get("curve", report)
        points = [{key: math.inf if point[key] is None else float(point[key])
                   for key in ("eps", "certified", "witness", "global")} for point in curve["points"]]
        curve = {"points": points, "radius": float(curve["layernorm_radius"]),
                 "jacobian_norm": float(curve["jacobian_norm"]), "component": str(curve.get("component", "")),
                 "ball": str(curve.get("ball", "")), "norm": str(curve.get("norm", "")), "n": int(curve["n"])}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise AssumptionError(option, "a lipbound local --json report", f"a file without its curve ({error})",
                              fix) from None
    if not any(point["eps"] > 0 for point in points):
        raise AssumptionError(option, "a curve with a radius eps > 0", "only eps = 0", fix)
    return curve


@_styled
def draw_local_curve(report: dict, path, option: str = "path") -> Path:
    """The certified local Lipschitz constant ``L(eps)`` (solid) and its witness in ``U(X, eps)``
    (dashed) against ``eps / R`` on log axes, with ``||DF(X)||`` (the limit eps -> 0, dotted) and the
    global certified constant (dash-dotted); from a ``local --json`` report."""
    curve = _curve(report, "report")
    points = [point for point in curve["points"] if point["eps"] > 0]
    share = [point["eps"] / curve["radius"] for point in points]
    figure = _figure(2.6)
    axes = figure.subplots()
    axes.plot(share, [point["certified"] for point in points], "-s", color=_BOUND, label=r"certified $L(\varepsilon)$")
    axes.plot(share, [point["witness"] for point in points], "--o", color=_WITNESS,
              label=r"witness in $U(X, \varepsilon)$")
    axes.axhline(curve["jacobian_norm"], color="0.5", linestyle=":", linewidth=0.8, label=r"$\|DF(X)\|$")
    if math.isfinite(points[0]["global"]):
        axes.axhline(points[0]["global"], color="0.2", linestyle="-.", linewidth=0.8, label="global constant")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel(r"$\varepsilon / R$ ($R$: LayerNorm radius)")
    axes.set_ylabel(r"$\mathrm{Lip}(F|_{U(X, \varepsilon)})$ (%s)" % curve["norm"])
    axes.set_title(f"{curve['component']}, {curve['ball']} ball, $n = {curve['n']}$", fontsize=7)
    axes.legend(frameon=False, fontsize=6, loc="best")
    axes.grid(True, which="major", linewidth=0.3, alpha=0.5)
    return _save(figure, path, option)


@_styled
def draw_edit_scaling(rows: list, path, option: str = "path") -> Path:
    """Measured (filled) and path-certified (open) Wasserstein-1 movement of the attention block outputs
    against the edited share ``k / n``, one colour per layer, log-log, with the least-squares power law
    ``W1 ~ C (k / n)^c`` of each (solid: measured, dashed: certified) and its exponent in the legend.
    ``rows``: dicts with ``layer``, ``k``, ``n``, ``measured`` and ``predicted_path`` (many sentences)."""
    try:
        layers = sorted({int(row["layer"]) for row in rows})
        data = {layer: np.array([(row["k"] / row["n"], row["measured"], row["predicted_path"]) for row in rows
                                 if int(row["layer"]) == layer], dtype=float) for layer in layers}
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        raise AssumptionError("rows", "edit rows with layer, k, n, measured and predicted_path", str(error),
                              "pass the rows of perturb reports") from None
    figure = _figure(2.8)
    axes = figure.subplots()
    for index, layer in enumerate(layers):
        share, measured, certified = data[layer].T
        colour = f"C{index % 10}"
        grid = np.geomspace(share.min(), share.max(), 20)
        slopes = []
        for values, marker, style in ((measured, "o", "-"), (certified, "s", "--")):
            axes.plot(share, values, marker, color=colour, markersize=2.5,
                      markerfacecolor=colour if marker == "o" else "none", linestyle="none")
            slope, intercept = np.polyfit(np.log(share), np.log(values), 1)
            axes.plot(grid, np.exp(intercept) * grid ** slope, style, color=colour, linewidth=0.8)
            slopes.append(slope)
        axes.plot([], [], "-o", color=colour, markersize=2.5,
                  label=f"layer {layer}: $c = {slopes[0]:.2f}$ / ${slopes[1]:.2f}$")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel(r"edited share of tokens $k / n$")
    axes.set_ylabel(r"$W_1$ movement of the block output")
    axes.set_title("filled, solid: measured; open, dashed: certified", fontsize=7)
    from matplotlib.ticker import NullFormatter
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.legend(frameon=False, fontsize=5.5, loc="lower right", ncol=2)
    axes.grid(True, which="major", linewidth=0.3, alpha=0.5)
    return _save(figure, path, option)
