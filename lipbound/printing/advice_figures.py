"""Figures of ``lipbound advise``, from plain data, in the style of :mod:`.figures` (one column wide).

* :func:`draw_pareto` -- each certified intervention's functional cost (``1 - min cosine`` for an
  encoder, ``1 - next-token agreement`` for a decoder) against log10 of the certified whole-model
  bound after it, with the Pareto front (no other intervention is both cheaper and more regular)
  joined;
* :func:`draw_mismatch` -- per substitution at a position, the mismatch ratio at the last layer against
  the norm of the candidate's word embedding, coloured by its alignment with the top singular
  directions of the first layer's ``W_Q W_K^T``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import AssumptionError
from .figures import _BOUND, _WITNESS, _figure, _save, _styled

__all__ = ["draw_mismatch", "draw_pareto", "pareto_front"]

#: where an intervention of no measurable cost is drawn (1 - cosine below it)
_COST_FLOOR = 1e-7


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points ``(cost, bound)`` no other point beats in both (cheaper and lower), by cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


@_styled
def draw_pareto(rows: list[dict], log10_before: float, path, option: str = "--plot",
                cost_label: str = r"functional cost $1 - \min\,\cos$") -> Path:
    """``rows``: dicts with ``name``, ``cost`` (1 - the function metric) and ``reduction`` (orders of
    magnitude); ``log10_before`` the log10 of the certified bound before (finite where the bound
    overflows a float)."""
    figure = _figure(2.6)
    axes = figure.subplots()
    if not rows:
        axes.text(0.5, 0.5, "no certified intervention", ha="center", va="center", transform=axes.transAxes)
        return _save(figure, path, option)
    if any(not {"name", "cost", "reduction"} <= set(r) for r in rows):
        raise AssumptionError("rows", "dicts with name, cost and reduction", repr(rows[0])[:60], "pass advice.pareto()")
    cost = np.array([max(r["cost"], _COST_FLOOR) for r in rows])
    after = np.array([log10_before - r["reduction"] for r in rows])
    axes.scatter(cost, after, color=_WITNESS, s=12, zorder=3)
    front = pareto_front(list(zip(cost, after)))
    for number, (c, a, r) in enumerate(zip(cost, after, rows)):  # full names where the bound falls an order or more
        label = r["name"] if r["reduction"] >= 1 else r["name"].split()[0]
        axes.annotate(label, (c, a), textcoords="offset points", xytext=(3, 3 if number % 2 else -8), fontsize=6)
    axes.plot(cost[front], after[front], "-", color=_BOUND, linewidth=0.8, label="Pareto front")
    axes.axhline(log10_before, color="0.5", linestyle=":", linewidth=0.8, label="original")
    axes.set_xscale("log")
    axes.set_xlabel(cost_label)
    axes.set_ylabel(r"$\log_{10}$ certified bound")
    axes.grid(True, linewidth=0.3, alpha=0.5)
    axes.legend(loc="best", frameon=False)
    return _save(figure, path, option)


@_styled
def draw_mismatch(groups: list[list[dict]], path, option: str = "--output") -> Path:
    """``groups``: per position, the rows of :meth:`lipbound.advise.mismatch.Mismatch.rows` (``ratio``,
    ``embedding_norm``, ``alignment``, ``token``); the five largest ratios are labelled."""
    figure = _figure(2.6)
    axes = figure.subplots()
    scatter = None
    for rows in groups:
        if not rows:
            continue
        ratio = np.array([r["ratio"] for r in rows])
        norm = np.array([r["embedding_norm"] for r in rows])
        scatter = axes.scatter(norm, ratio, c=[r["alignment"] for r in rows], s=4, cmap="viridis")
        for r in sorted(rows, key=lambda r: -r["ratio"])[:5]:
            axes.annotate(r["token"], (r["embedding_norm"], r["ratio"]), fontsize=5, xytext=(2, 1),
                          textcoords="offset points")
    if scatter is not None:
        figure.colorbar(scatter, ax=axes, label=r"alignment with $W_Q W_K^\top$")
    axes.set_xlabel(r"$\|e_v\|$ (word embedding)")
    axes.set_ylabel(r"$\|\Delta X_L\| / \|\Delta X_0\|$")
    axes.grid(True, linewidth=0.3, alpha=0.5)
    return _save(figure, path, option)
