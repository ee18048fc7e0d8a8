"""The sandwich report: witness <= true constant <= certified bounds, per head and per layer.

For each head (and each whole multi-head layer) of a model, on the domain its inputs live on:

* a witness from :func:`~lipbound.numeric.witness.search_witness`, saved to a file that
  ``lipbound recheck`` re-verifies in high precision against the same weights (sha256);
* every applicable upper bound, evaluated rigorously: the theorem that covers the head
  (:mod:`lipbound.numeric.dispatch`), the SDP relaxation when asked for, and the published claims
  whose hypotheses the head meets, each with its provenance (claims never count as "best");
* the best certified upper bound, the gap ``best upper / witness``, and the bounds the witness
  refutes (a certified comparison; "not certified" where rounding could decide).

:class:`Verification` runs the rows one by one and hands each finished row to a callback, so a
long run can write a partial report after every row and keep what finished when interrupted.
"""

from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, final

import numpy as np

from ..errors import AssumptionError
from ..rigorous.intervals import Verdict, certify_le, interval
from ..rigorous.value import CertifiedValue
from ..symbolic.claims import CLAIMS
from ..symbolic.registry import variant
from .certify import head_constant, layer_constant
from .dispatch import head_facts
from .domains import DomainSpec, TokenBall, TokenDomain
from .evaluate import evaluate_bound
from .model import Head, Model
from .sdp import relax
from .witness import search_witness

__all__ = ["HeadReport", "ModelReport", "Verification", "verify_model"]


@final
@dataclass
class HeadReport:
    """One row of the sandwich: a head (``head`` is None for the whole layer)."""

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


@final
@dataclass
class ModelReport:
    """The rows of a run, with what they are about: the model file and its sha256, the norm,
    the token count, the domain of each layer, and whether the run finished."""

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

    @property
    def refuted(self) -> bool:
        return any(row.refuted for row in self.rows)

    def status(self) -> str:
        return "complete" if self.complete else f"partial: {len(self.rows)} of {self.planned} rows finished"

    def header_lines(self) -> list[str]:
        lines = [f"model: {self.model} ({self.path}, sha256 {self.sha256 or 'not recorded'})",
                 f"norm: {self.norm}; n = {self.n} tokens; {self.status()}"]
        lines += [f"domain of layer {layer}: {text}" for layer, text in sorted(self.domains.items())]
        return lines

    def to_json(self) -> dict:
        return {"model": self.model, "path": self.path, "sha256": self.sha256, "n": self.n, "norm": self.norm,
                "domains": {str(k): v for k, v in sorted(self.domains.items())}, "complete": self.complete,
                "rows_planned": self.planned, "rows_finished": len(self.rows), "seconds": self.seconds,
                "rows": [row.to_json() for row in self.rows]}

    def table(self) -> str:
        names = list(dict.fromkeys(b.name for row in self.rows for b in row.upper_bounds))
        header = ["layer", "head", "witness"] + names + ["best upper", "gap", "refuted"]
        lines = [header]
        for row in self.rows:
            values = {b.name: (f"{b.value:.4g}" if b.certified else "n.c.") for b in row.upper_bounds}
            lines.append([str(row.layer), "all" if row.head is None else str(row.head), f"{row.witness_value:.4g}"]
                         + [values.get(name, "-") for name in names]
                         + [f"{row.best_upper:.4g}", f"{row.gap:.3g}",
                            ", ".join("REFUTED " + r for r in row.refuted) or "-"])
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        body = "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)
        return "\n".join(self.header_lines()) + "\n" + body

    def csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["# " + line for line in self.header_lines()])
        writer.writerow(["block", "layer", "head", "kind", "n", "domain", "witness", "witness_file", "bound", "value",
                         "certified", "provenance", "best_upper", "gap", "refuted"])
        for row in self.rows:
            for bound in row.upper_bounds:
                writer.writerow([row.block, row.layer, "" if row.head is None else row.head, row.kind, row.n,
                                 row.domain, row.witness_value, row.witness_file, bound.name, bound.value,
                                 bound.certified, bound.provenance, row.best_upper, row.gap, ";".join(row.refuted)])
        return buffer.getvalue()

    def latex(self) -> str:
        return _latex(self)

    def markdown(self) -> str:
        lines = [f"# Lipschitz sandwich for {self.model}", ""] + [f"- {line}" for line in self.header_lines()] + [
            "", "witness <= true constant <= certified bound", "",
            "| layer | head | witness | best certified upper | gap | bounds | refuted |",
            "|---:|---:|---:|---:|---:|---|---|"]
        for row in self.rows:
            bounds = "; ".join(f"{b.name} {b.value:.4g}" + ("" if b.certified else " (n.c.)") for b in row.upper_bounds)
            lines.append(f"| {row.layer} | {'all' if row.head is None else row.head} | {row.witness_value:.4g} | "
                         f"{row.best_upper:.4g} | {row.gap:.3g} | {bounds} | {', '.join(row.refuted) or '-'} |")
        return "\n".join(lines) + "\n"


def _tex(text: str) -> str:
    """Plain text for a LaTeX table cell."""
    for char, escaped in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#"),
                          ("$", r"\$"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        text = text.replace(char, escaped)
    return text


def _latex(report: ModelReport) -> str:
    """A booktabs table (needs ``\\usepackage{booktabs}``) with a caption naming the weights."""
    names = list(dict.fromkeys(b.name for row in report.rows for b in row.upper_bounds))
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{rr" + "r" * (1 + len(names)) + "rr}", r"\toprule",
             " & ".join(["layer", "head", "witness"] + [_tex(n) for n in names] + ["best upper", "gap"]) + r" \\",
             r"\midrule"]
    for row in report.rows:
        values = {b.name: (f"{b.value:.4g}" if b.certified else "n.c.") for b in row.upper_bounds}
        cells = [str(row.layer), "all" if row.head is None else str(row.head), f"{row.witness_value:.4g}"]
        cells += [values.get(name, "--") for name in names] + [f"{row.best_upper:.4g}", f"{row.gap:.3g}"]
        lines.append(" & ".join(cells) + r" \\")
    caption = (f"Witness $\\le \\operatorname{{Lip}} \\le$ certified bounds, {_tex(report.model)}, "
               f"$n = {report.n}$, {_tex(report.norm)} norm; weights {_tex(report.path)} "
               f"(sha256 \\texttt{{{report.sha256[:16]}}}); "
               + "; ".join(f"layer {k}: {_tex(v)}" for k, v in sorted(report.domains.items()))
               + ("" if report.complete else f" ({_tex(report.status())})") + ".")
    lines += [r"\bottomrule", r"\end{tabular}", r"\caption{" + caption + "}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def _refutations(row: HeadReport) -> None:
    for bound in row.upper_bounds:
        if not bound.certified:
            continue
        answer = certify_le(interval(row.witness_value * (1 - 1e-9)), interval(bound.value))
        if answer is Verdict.FAILS:
            row.refuted.append(bound.name)
        elif answer is Verdict.UNKNOWN:
            row.not_certified.append(bound.name)


def _claims(head: Head, domain: TokenDomain, n: int) -> list[CertifiedValue]:
    """Published claims whose hypotheses the head meets, evaluated for comparison (never a best bound)."""
    facts = head_facts(head)
    if not (isinstance(domain, TokenBall) and domain.center is None and facts.score == "dot"
            and not np.any(head.b_Q) and not facts.causal):
        return []  # the claims state dot-product attention without query bias on a ball about 0
    claim = CLAIMS["castin-theorem"]
    value = evaluate_bound(claim.statement, head, domain, n, name=claim.key)
    return [value.renamed(claim.key, provenance=claim.provenance, proven=claim.is_theorem)]


def _sdp_bounds(target, domain: TokenDomain, n: int) -> list[CertifiedValue]:
    """The SDP relaxation of the local Lipschitz problem (registry entry of the variant);
    an uncertified solve is listed as such and never counts as a bound."""
    name = "dot-product" if isinstance(target, Head) else "multi-head"
    if any(h.score != "dot" for h in getattr(target, "heads", (target,))):
        return []  # the relaxations model dot-product scores only
    return [relax(variant(name), target, domain, n=n).renamed("sdp")]


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name) or "model"


@final
class Verification:
    """The sandwich for every selected head (and each whole layer) of a model, row by row.

    Parameters
    ----------
    model : Model
    layers, heads : list of int, optional
        Layers and heads to verify (counted from 0; default all).  The whole layer is verified
        when every head is (``whole_layers``).
    n : int
        Tokens.
    domain : DomainSpec or str
        ``"layernorm"``, ``"layernorm-image"`` or a radius, resolved per layer.
    sdp : bool
        Add the SDP relaxations.
    budget : float
        Wall-clock seconds of each head's witness search (twice that for a whole layer).
    drop_query_bias : bool
        Verify the heads without their query bias, the setting of published claims about plain
        dot-product attention (which are then listed and checked).
    """

    def __init__(self, model: Model, *, layers=None, heads=None, n: int = 8, domain="layernorm", sdp: bool = False,
                 budget: float = 10.0, seed: int = 0, witness_dir: str | Path = "witnesses",
                 whole_layers: bool = True, drop_query_bias: bool = False):
        if not isinstance(model, Model):
            raise AssumptionError("model", "a lipbound.numeric.model.Model", type(model).__name__,
                                  "load one with load_weights(path)")
        self.model = model
        self.layers = sorted(model.layers) if layers is None else [model.layer(i).index for i in layers]
        self.heads = None if heads is None else list(heads)
        for index in self.layers:
            for h in self.heads or ():
                model.head(index, h)  # a clear error before any work
        self.n, self.sdp, self.budget, self.seed = n, sdp, budget, seed
        self.spec = DomainSpec.parse(domain)
        self.witness_dir = Path(witness_dir)
        self.whole_layers = whole_layers and heads is None
        self.drop_query_bias = drop_query_bias
        self.domains = {i: self.spec.resolve(model.layer(i).ln_in, f"layer {i}") for i in self.layers}
        self.jobs = [(i, h) for i in self.layers
                     for h in (range(model.layer(i).num_heads) if self.heads is None else self.heads)]
        self.jobs += [(i, None) for i in self.layers] if self.whole_layers else []
        self.jobs.sort(key=lambda job: (job[0], job[1] is None, job[1] or 0))
        self.report = ModelReport(model.name, model.path, model.sha256, n, "fro",
                                  {i: d.describe() for i, d in self.domains.items()}, planned=len(self.jobs))

    def run(self, on_row: Callable[[ModelReport, HeadReport], None] | None = None) -> ModelReport:
        """Verify every job in order; ``on_row(report, row)`` after each finished row."""
        began = time.perf_counter()
        self.witness_dir.mkdir(parents=True, exist_ok=True)
        for layer_index, h in self.jobs:
            row = self._row(layer_index, h)
            _refutations(row)
            self.report.rows.append(row)
            self.report.seconds = time.perf_counter() - began
            if on_row is not None:
                on_row(self.report, row)
        self.report.complete = True
        self.report.seconds = time.perf_counter() - began
        return self.report

    def _row(self, layer_index: int, h: int | None) -> HeadReport:
        model, n, domain = self.model, self.n, self.domains[layer_index]
        layer = model.layer(layer_index)
        if h is None:
            target, budget, name, bounds = layer.as_layer(), 2 * self.budget, "all", None
        else:
            target = layer.heads[h]
            if self.drop_query_bias:
                target = replace(target, b_Q=np.zeros(target.d_k))
            budget, name = self.budget, f"H{h}"
        witness = search_witness(target, domain=domain, n=n, budget_seconds=budget, seed=self.seed, origin=model,
                                 layer=layer_index, head=h)
        path = witness.save(self.witness_dir / f"{_slug(model.name)}-L{layer_index}-{name}-n{n}.npz")
        if h is None:
            bounds = [layer_constant(layer, "fro", domain, n)]
        else:
            bounds = [head_constant(target, "fro", domain, n)] + _claims(target, domain, n)
        if self.sdp:
            bounds += _sdp_bounds(target, domain, n)
        return HeadReport(layer_index, h, domain.describe(), n, witness.value, str(path), witness.method, bounds)


def verify_model(model: Model, **options) -> ModelReport:
    """Run a :class:`Verification` to the end (``progress`` is called with each finished row)."""
    progress = options.pop("progress", None)
    return Verification(model, **options).run(None if progress is None else (lambda report, row: progress(row)))
