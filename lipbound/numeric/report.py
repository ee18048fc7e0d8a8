"""The sandwich report: witness <= true constant <= certified bounds, per head and per layer.

A :class:`HeadReport` is one row -- a head (or a whole multi-head layer) of one stack, in one
kind (self, causal, cross-queries, cross-context, cross-joint; see
:mod:`lipbound.numeric.verification`), on the domain its inputs live on -- with

* the witness value and the file that lets ``lipbound recheck`` re-verify it in high precision
  against the same weights (sha256);
* every applicable upper bound, certified (closed forms, matrix-aware forms, the SDP relaxation
  when asked for) or listed for comparison (published claims, which never count as "best");
* the best certified upper bound, the gap ``best upper / witness``, and the bounds the witness
  refutes (a certified comparison; "not certified" where rounding could decide).

A :class:`ModelReport` holds the rows of a run with what they are about (the model file and its
sha256, the norm, n and m, the domain of every attention of every layer) and renders them as a
text table, JSON, CSV, Markdown and a LaTeX booktabs table, each with a ranking of the least
smooth heads and layers.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import final

from ..printing.document import comparison_table
from ..printing.plaintext import legend_lines
from ..printing.prose import escape_text
from ..rigorous.intervals import Verdict, certify_le, interval
from ..rigorous.value import CertifiedValue

__all__ = ["KINDS", "HeadReport", "ModelReport", "refutations", "RANK_TOP", "CSV_COLUMNS", "BOUND_MEANINGS"]

#: The kinds of attention map a row is about (see :mod:`lipbound.numeric.verification`).
KINDS = ("self", "causal", "cross-queries", "cross-context", "cross-joint")
#: The header of :meth:`ModelReport.csv`, its first line.
CSV_COLUMNS = ("model", "sha256", "norm", "block", "layer", "head", "kind", "n", "m", "domain", "witness",
               "witness_file", "bound", "value", "certified", "provenance", "best_upper", "gap", "refuted")
#: Rows shown in each ranking.
RANK_TOP = 10
#: Longer LaTeX tables are ``longtable`` s (they break across pages; ``\usepackage{longtable}``).
LONG_TABLE = 40
_ATTENTION = {"self": "self-attention", "causal": "causal self-attention", "cross": "cross-attention"}
#: The certified bounds a row lists (:func:`lipbound.numeric.certify.head_bounds`), for the legends.
BOUND_MEANINGS = {
    "derived": "the theorem the head's facts select (lipbound derive), evaluated on the weights in interval "
               "arithmetic; for a whole layer, the heads' theorems composed with the blocks of W_O",
    "matrix-aware": "the same theorem with products of norms replaced by joint constants of the matrices on the "
                    "true domain (for a layer: summed over the heads)",
    "joint": "the heads of a layer taken jointly with W_O (whole layers only)",
    "sdp": "the SDP relaxation (--sdp), counted only after its certificate is re-checked",
}


@final
@dataclass
class HeadReport:
    """One row of the sandwich: a head (``head`` is None for the whole layer) in one kind."""

    layer: int
    head: int | None
    domain: str
    n: int
    witness_value: float
    witness_file: str
    witness_method: str
    upper_bounds: list[CertifiedValue] = field(default_factory=list)
    refuted: list[str] = field(default_factory=list)
    not_certified: list[str] = field(default_factory=list)
    block: str = "encoder"
    kind: str = "self"
    m: int | None = None

    @property
    def best_upper(self) -> float:
        """The smallest certified bound that is also proven (claims do not count)."""
        certified = [b.value for b in self.upper_bounds if b.certified and b.proven]
        return min(certified) if certified else math.inf

    @property
    def gap(self) -> float:
        return self.best_upper / self.witness_value if self.witness_value > 0 else math.inf

    @property
    def who(self) -> str:
        return "all" if self.head is None else str(self.head)

    def to_json(self) -> dict:
        return {"block": self.block, "layer": self.layer, "head": self.head, "kind": self.kind, "n": self.n,
                "m": self.m, "domain": self.domain,
                "witness": {"value": self.witness_value, "file": self.witness_file, "method": self.witness_method},
                "upper_bounds": [{"name": b.name, "value": None if math.isnan(b.value) else b.value,
                                  "certified": b.certified, "provenance": b.provenance, "proven": b.proven}
                                 for b in self.upper_bounds],
                "best_upper": _finite(self.best_upper), "gap": _finite(self.gap), "refuted": list(self.refuted),
                "not_certified": list(self.not_certified)}


def _finite(value: float):
    return value if math.isfinite(value) else None


def refutations(row: HeadReport) -> None:
    """Fill ``row.refuted`` (a certified bound the witness beats, decided in interval arithmetic)
    and ``row.not_certified`` (too close for rounding to decide)."""
    for bound in row.upper_bounds:
        if not bound.certified:
            continue
        answer = certify_le(interval(row.witness_value * (1 - 1e-9)), interval(bound.value))
        if answer is Verdict.FAILS:
            row.refuted.append(bound.name)
        elif answer is Verdict.UNKNOWN:
            row.not_certified.append(bound.name)


@final
@dataclass
class ModelReport:
    """The rows of a run, with what they are about.

    Parameters
    ----------
    model, path, sha256 : str
        The weights run: their name, the file or directory read, its sha256.
    n : int
        Tokens (context tokens of cross-attention).
    norm : str
    domains : dict
        ``(block, layer, attention) -> description``, ``attention`` one of ``self``, ``causal``,
        ``cross`` (the three cross kinds share their domains).
    m : int or None
        Queries of cross-attention (None when no row is cross-attention).
    description : str
        The architecture (layout, stacks, heads, width).
    """

    model: str
    path: str
    sha256: str
    n: int
    norm: str
    domains: dict
    rows: list[HeadReport] = field(default_factory=list)
    planned: int = 0
    seconds: float = 0.0
    complete: bool = False
    m: int | None = None
    description: str = ""

    @property
    def refuted(self) -> bool:
        return any(row.refuted for row in self.rows)

    def status(self) -> str:
        return "complete" if self.complete else f"partial: {len(self.rows)} of {self.planned} rows finished"

    def _sizes(self) -> str:
        if self.m is None:
            return f"n = {self.n} tokens"
        return f"n = {self.n} tokens (context tokens of cross-attention), m = {self.m} queries of cross-attention"

    def header_lines(self) -> list[str]:
        named = "" if not self.model or self.model in self.path else f", named {self.model} in the file"
        lines = [f"model: {self.path or self.model} (sha256 {self.sha256 or 'not recorded'}){named}"]
        lines += [f"architecture: {self.description}"] if self.description else []
        lines.append(f"norm: {self.norm} on inputs and outputs; {self._sizes()}; {self.status()}")
        lines += [f"domain of {block} layer {layer} {_ATTENTION[attention]}: {text}"
                  for (block, layer, attention), text in self.domains.items()]
        return lines

    def ranking(self, top: int = RANK_TOP) -> tuple[list[HeadReport], list[HeadReport]]:
        """The least smooth heads and whole layers: the ``top`` rows of each with the largest
        witness (a certified lower bound on their constant), largest first."""
        def ordered(rows):
            return sorted(rows, key=lambda row: -row.witness_value)[:top]
        return (ordered(r for r in self.rows if r.head is not None), ordered(r for r in self.rows if r.head is None))

    def to_json(self) -> dict:
        heads, layers = self.ranking()
        position = {id(row): i for i, row in enumerate(self.rows)}
        return {"model": self.model, "path": self.path, "sha256": self.sha256, "architecture": self.description,
                "n": self.n, "m": self.m, "norm": self.norm,
                "domains": [{"block": b, "layer": l, "attention": a, "domain": text}
                            for (b, l, a), text in self.domains.items()],
                "complete": self.complete, "rows_planned": self.planned, "rows_finished": len(self.rows),
                "seconds": self.seconds, "rows": [row.to_json() for row in self.rows],
                "ranking": {"heads": [position[id(r)] for r in heads], "layers": [position[id(r)] for r in layers]}}

    # renderings -----------------------------------------------------------------------------------
    def _bound_names(self) -> list[str]:
        return list(dict.fromkeys(b.name for row in self.rows for b in row.upper_bounds))

    def table(self) -> str:
        names = self._bound_names()
        header = ["block", "layer", "head", "kind", "witness"] + names + ["best upper", "gap", "refuted"]
        lines = [header]
        for row in self.rows:
            values = {b.name: (f"{b.value:.4g}" if b.certified else "n.c.") for b in row.upper_bounds}
            lines.append([row.block, str(row.layer), row.who, row.kind, f"{row.witness_value:.4g}"]
                         + [values.get(name, "-") for name in names]
                         + [f"{row.best_upper:.4g}", f"{row.gap:.3g}",
                            ", ".join("REFUTED " + r for r in row.refuted) or "-"])
        return ("\n".join(self.header_lines()) + "\n" + _columns(lines) + "\n" + self._ranking_text() + "\n\n"
                + "\n".join(self.legend()))

    def legend(self) -> list[str]:
        """What the columns of :meth:`table` mean, one line each (the bound columns present only)."""
        entries = [("head", "h: the map X -> f^h(X) of head h alone, BEFORE its block W_O^h of the output projection "
                            "(not that head's share of the layer output: f^h W_O^h can exceed the row); all: the "
                            "whole multi-head layer X -> sum_h f^h(X) W_O^h, without the residual"),
                   ("witness", "a certified lower bound on L: the Jacobian norm at an input of the domain the search "
                               "found (saved; lipbound recheck FILE re-checks it)")]
        entries += [(name, BOUND_MEANINGS.get(name, "a published claim under the same assumptions (listed and "
                                                    "checked, never counted as best)")) for name in self._bound_names()]
        entries += [("best upper", "the smallest certified, proven bound: L lies in [witness, best upper]"),
                    ("gap", "best upper / witness (1: tight)"),
                    ("refuted", "the bounds the witness beats (exit status 3); n.c.: not certified (rounding could "
                                "decide); -: does not apply")]
        return legend_lines("columns (L: the Lipschitz constant in the Frobenius norm, ||f(X) - f(X')||_F <= "
                            "L ||X - X'||_F, output units per input unit):", entries)

    def _ranking_text(self) -> str:
        heads, layers = self.ranking()
        parts = []
        for title, rows in (("heads", heads), ("whole layers", layers)):
            if rows:
                lines = [["rank", "block", "layer", "head", "kind", "witness", "best upper"]]
                lines += [[str(i + 1), r.block, str(r.layer), r.who, r.kind, f"{r.witness_value:.4g}",
                           f"{r.best_upper:.4g}"] for i, r in enumerate(rows)]
                parts.append(f"\nleast smooth {title} (largest witness first; Lip lies in [witness, best upper]):\n"
                             + _columns(lines))
        return "\n".join(parts)

    def csv(self) -> str:
        """One line per row and bound, the header first (:data:`CSV_COLUMNS`); what the run was about beyond
        the model, its sha256 and the norm (the architecture, every domain, whether it is complete) is in
        :meth:`to_json`."""
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(CSV_COLUMNS)
        for row in self.rows:
            for bound in row.upper_bounds:
                writer.writerow([self.path or self.model, self.sha256, self.norm, row.block, row.layer,
                                 "" if row.head is None else row.head, row.kind, row.n, "" if row.m is None else row.m,
                                 row.domain, row.witness_value, row.witness_file, bound.name, bound.value,
                                 bound.certified, bound.provenance, row.best_upper, row.gap, ";".join(row.refuted)])
        return buffer.getvalue()

    def markdown(self) -> str:
        lines = [f"# Lipschitz sandwich for {self.model}", ""] + [f"- {line}" for line in self.header_lines()] + [
            "", "witness <= true constant <= certified bound", "",
            "| block | layer | head | kind | witness | best certified upper | gap | bounds | refuted |",
            "|---|---:|---:|---|---:|---:|---:|---|---|"]
        for row in self.rows:
            bounds = "; ".join(f"{b.name} {b.value:.4g}" + ("" if b.certified else " (n.c.)") for b in row.upper_bounds)
            lines.append(f"| {row.block} | {row.layer} | {row.who} | {row.kind} | {row.witness_value:.4g} | "
                         f"{row.best_upper:.4g} | {row.gap:.3g} | {bounds} | {', '.join(row.refuted) or '-'} |")
        heads, layers = self.ranking()
        for title, rows in (("heads", heads), ("whole layers", layers)):
            if rows:
                lines += ["", f"## Least smooth {title}", "",
                          "largest witness first; Lip lies in [witness, best upper]",
                          "", "| rank | block | layer | head | kind | witness | best upper |",
                          "|---:|---|---:|---:|---|---:|---:|"]
                lines += [f"| {i + 1} | {r.block} | {r.layer} | {r.who} | {r.kind} | {r.witness_value:.4g} | "
                          f"{r.best_upper:.4g} |" for i, r in enumerate(rows)]
        return "\n".join(lines) + "\n"

    def latex(self) -> str:
        """Booktabs tables (``\\usepackage{booktabs}``): every row, then the rankings, each with a
        caption naming the weights, the norm, n, m and the domains.  More than :data:`LONG_TABLE`
        rows make a ``longtable`` (``\\usepackage{longtable}``) that breaks across pages."""
        names = self._bound_names()
        columns = [("block", "block"), ("layer", "layer"), ("head", "head"), ("kind", "kind"),
                   ("witness", "witness")] + [(f"bound:{name}", name) for name in names] + \
            [("best", "best upper"), ("gap", "gap"), ("refuted", "refuted")]
        cells = []
        for row in self.rows:
            cell = {"block": row.block, "layer": row.layer, "head": row.who, "kind": row.kind,
                    "witness": row.witness_value, "best": row.best_upper, "gap": row.gap,
                    "refuted": ", ".join(row.refuted) or None}
            cell.update({f"bound:{b.name}": (b.value if b.certified else "n.c.") for b in row.upper_bounds})
            cells.append(cell)
        caption = (f"Witness $\\le \\mathrm{{Lip}} \\le$ certified bounds for {escape_text(self.model)} "
                   f"({escape_text(self.path)}, sha256 \\texttt{{{self.sha256[:16]}}}), "
                   f"{escape_text(self.norm)} norm, {escape_text(self._sizes())}"
                   + ("" if self.complete else f" ({escape_text(self.status())})") + ". Domains: "
                   + "; ".join(f"{escape_text(f'{b} layer {l} {_ATTENTION[a]}')}: {escape_text(text)}"
                               for (b, l, a), text in self.domains.items()) + ".")
        parts = [_float_table(comparison_table(cells, columns, booktabs=True), caption,
                              long=len(cells) > LONG_TABLE)]
        heads, layers = self.ranking()
        rank_columns = [("rank", "rank"), ("block", "block"), ("layer", "layer"), ("head", "head"), ("kind", "kind"),
                        ("witness", "witness"), ("best", "best upper")]
        for title, rows in (("heads", heads), ("whole layers", layers)):
            if rows:
                ranked = [{"rank": i + 1, "block": r.block, "layer": r.layer, "head": r.who, "kind": r.kind,
                           "witness": r.witness_value, "best": r.best_upper} for i, r in enumerate(rows)]
                parts.append(_float_table(comparison_table(ranked, rank_columns, booktabs=True),
                                          f"The least smooth {title} of {escape_text(self.model)}, largest witness "
                                          f"first; the constant lies between the witness and the best upper bound."))
        return "\n".join(parts)


def _columns(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)


def _float_table(tabular: str, caption: str, long: bool = False) -> str:
    """A ``tabular`` in a ``table`` float with its caption, or, ``long``, as a ``longtable``
    whose header repeats on every page."""
    if not long:
        return "\n".join([r"\begin{table}[t]", r"\centering", r"\small", tabular.rstrip("\n"),
                          r"\caption{" + caption + "}", r"\end{table}"]) + "\n"
    lines = tabular.rstrip("\n").splitlines()   # begin, top rule, header, mid rule, rows..., bottom rule, end
    head = [lines[0].replace("tabular", "longtable"), r"\caption{" + caption + r"}\\", *lines[1:4], r"\endhead"]
    return "\n".join([r"{\small", *head, *lines[4:-1], lines[-1].replace("tabular", "longtable"), "}"]) + "\n"
