"""The sandwich report: witness <= true constant <= certified bounds, per head and per layer.

For each head (and each whole multi-head layer) of a model, on a ball domain:

* a witness from :func:`~lipbound.numeric.witness.search_witness`, saved to a file
  that ``lipbound recheck`` re-verifies in high precision;
* every applicable upper bound, evaluated rigorously: the derived closed form, the
  DESIGN.md route (norm products only), the SDP relaxations when asked for, and the
  published claims whose hypotheses the head meets, each with its provenance;
* the best certified upper bound, the gap ``best upper / witness``, and the names of
  the bounds the witness refutes (certified comparison; "not certified" otherwise).
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import final

import numpy as np

from ..assumptions import Truth
from . import attention
from .certify import head_constant, layer_constant
from .evaluate import NumericDomain, evaluate_bound
from .rigorous import certify_le, interval

__all__ = ["UpperBound", "HeadReport", "ModelReport", "verify_model", "resolve_domain"]


@final
@dataclass(frozen=True)
class UpperBound:
    """One upper bound of a row.  ``certified``: its value is a rigorous upper end of the
    expression; ``proven``: the expression is a theorem (lipbound's derivations and SDP
    certificates), not a published claim whose transcription may be wrong."""

    name: str
    value: float
    certified: bool
    provenance: str
    proven: bool = True


@final
@dataclass
class HeadReport:
    """One row of the sandwich: a head (``head`` is None for the whole layer)."""

    layer: int
    head: int | None
    radius: float
    witness_value: float
    witness_file: str
    witness_method: str
    upper_bounds: list[UpperBound] = field(default_factory=list)
    refuted: list[str] = field(default_factory=list)
    not_certified: list[str] = field(default_factory=list)

    @property
    def best_upper(self) -> float:
        """The smallest certified bound that is also proven (claims do not count)."""
        certified = [b.value for b in self.upper_bounds if b.certified and b.proven]
        return min(certified) if certified else float("inf")

    @property
    def gap(self) -> float:
        return self.best_upper / self.witness_value if self.witness_value > 0 else float("inf")

    def to_json(self) -> dict:
        return {"layer": self.layer, "head": self.head, "radius": self.radius,
                "witness": {"value": self.witness_value, "file": self.witness_file, "method": self.witness_method},
                "upper_bounds": [asdict(b) for b in self.upper_bounds], "best_upper": self.best_upper,
                "gap": self.gap, "refuted": list(self.refuted), "not_certified": list(self.not_certified)}


@final
@dataclass
class ModelReport:
    model: str
    n: int
    domain: str
    heads: list[HeadReport]
    seconds: float

    @property
    def refuted(self) -> bool:
        return any(row.refuted for row in self.heads)

    def to_json(self) -> dict:
        return {"model": self.model, "n": self.n, "domain": self.domain, "seconds": self.seconds,
                "heads": [row.to_json() for row in self.heads]}

    def table(self) -> str:
        names = sorted({b.name for row in self.heads for b in row.upper_bounds})
        header = ["layer", "head", "R", "witness"] + names + ["best upper", "gap", "refuted"]
        lines = [header]
        for row in self.heads:
            values = {b.name: (f"{b.value:.4g}" if b.certified else "n.c.") for b in row.upper_bounds}
            lines.append([str(row.layer), "all" if row.head is None else str(row.head), f"{row.radius:.4g}",
                          f"{row.witness_value:.4g}"] + [values.get(name, "-") for name in names]
                         + [f"{row.best_upper:.4g}", f"{row.gap:.3g}",
                            ", ".join("REFUTED " + r for r in row.refuted) or "-"])
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)

    def csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["layer", "head", "radius", "witness", "witness_file", "bound", "value", "certified",
                         "provenance", "best_upper", "gap", "refuted"])
        for row in self.heads:
            for bound in row.upper_bounds:
                writer.writerow([row.layer, "" if row.head is None else row.head, row.radius, row.witness_value,
                                 row.witness_file, bound.name, bound.value, bound.certified, bound.provenance,
                                 row.best_upper, row.gap, ";".join(row.refuted)])
        return buffer.getvalue()

    def markdown(self) -> str:
        lines = [f"# Lipschitz sandwich for {self.model}", "",
                 f"n = {self.n} tokens, domain: {self.domain}; witness <= true constant <= certified bound.", "",
                 "| layer | head | witness | best certified upper | gap | bounds | refuted |",
                 "|---:|---:|---:|---:|---:|---|---|"]
        for row in self.heads:
            bounds = "; ".join(f"{b.name} {b.value:.4g}" + ("" if b.certified else " (n.c.)") for b in row.upper_bounds)
            lines.append(f"| {row.layer} | {'all' if row.head is None else row.head} | {row.witness_value:.4g} | "
                         f"{row.best_upper:.4g} | {row.gap:.3g} | {bounds} | {', '.join(row.refuted) or '-'} |")
        return "\n".join(lines) + "\n"


def resolve_domain(layer_weights, radius) -> tuple[NumericDomain, str]:
    """``radius``: a number (ball about 0), ``"layernorm"`` (ball about 0 holding the output of
    the LayerNorm that feeds the layer, DESIGN.md's LayerNorm radius) or ``"layernorm-image"``
    (ball about the LayerNorm bias, the hull of the LayerNorm image)."""
    from ..errors import AssumptionError
    if radius in ("layernorm", "layernorm-image"):
        if layer_weights.ln_in is None:
            raise AssumptionError("--radius", "a number, since this layer has no LayerNorm feeding it",
                                  repr(radius), "pass --radius R")
        about = "origin" if radius == "layernorm" else "center"
        domain = NumericDomain.from_layernorm(layer_weights.ln_in, about=about)
        return domain, f"{radius} (R = {domain.radius:.6g})"
    value = float(radius)
    return NumericDomain.ball(value), f"ball R = {value:.6g}"


def _refutations(row: HeadReport) -> None:
    for bound in row.upper_bounds:
        answer = certify_le(interval(row.witness_value * (1 - 1e-9)), interval(bound.value))
        if answer is Truth.FALSE:
            row.refuted.append(bound.name)
        elif answer is Truth.UNKNOWN:
            row.not_certified.append(bound.name)


def _head_bounds(head: attention.Head, domain: NumericDomain, n: int, sdp: bool) -> list[UpperBound]:
    bounds = []
    derived = head_constant(head, "fro", domain, n)
    bounds.append(UpperBound("derived", derived.value, True, "derived (lipbound theorem self-attention-fro)"))
    if domain.gamma_max is None and domain.center is None and not np.any(head.b_Q):
        # without a query bias the claims about plain dot-product attention on B_R apply too
        from ..assumptions import Assumptions, Ball
        from ..symbolic.claims import CLAIMS
        from ..symbolic.registry import variant
        plain = variant("dot-product-nobias").derive(Assumptions(domain=Ball()), "dot-product-nobias")
        bounds.append(UpperBound("derived-nobias", evaluate_bound(plain, head, domain, n).upper, True,
                                 "derived (lipbound theorem self-attention-fro, no query bias)"))
        claim = CLAIMS["castin-theorem"]
        bounds.append(UpperBound(claim.key, evaluate_bound(claim.statement, head, domain, n).upper, True,
                                 claim.provenance, proven=claim.is_theorem))
    if sdp:
        bounds.extend(_sdp_bounds(head, domain, n))
    return bounds


def _sdp_bounds(target, domain: NumericDomain, n: int) -> list[UpperBound]:
    """The SDP relaxation of the local Lipschitz problem (registry entry of the variant);
    an uncertified solve is listed as such and never counts as a bound."""
    from ..symbolic.registry import variant
    from .sdp import relax
    name = "dot-product" if isinstance(target, attention.Head) else "multi-head"
    result = relax(variant(name), target, domain.radius, domain.center, n=n)
    return [UpperBound("sdp", result.value if result.certified else float("inf"), result.certified,
                       result.provenance + ("" if result.certified else f" (not certified: {result.reason})"))]


def verify_model(model, *, layers=None, heads=None, n: int = 8, radius="layernorm", sdp: bool = False,
                 budget: float = 10.0, seed: int = 0, witness_dir: str | Path = "witnesses",
                 whole_layers: bool = True, drop_query_bias: bool = False, progress=None) -> ModelReport:
    """The sandwich for every selected head (and each whole layer) of ``model`` (ModelWeights).

    ``drop_query_bias``: verify the heads without their query bias (key and value biases
    never change a Lipschitz constant), the setting of published claims about plain
    dot-product attention, which are then listed (with their provenance) and checked.
    """
    from .witness import search_witness
    began = time.perf_counter()
    witness_dir = Path(witness_dir)
    witness_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    chosen_layers = sorted(model.layers) if layers is None else list(layers)
    description = ""
    for layer_index in chosen_layers:
        layer = model.layer(layer_index)
        domain, description = resolve_domain(layer, radius)
        chosen_heads = range(len(layer.heads)) if heads is None else list(heads)
        for h in chosen_heads:
            head = layer.heads[h]
            if drop_query_bias:
                head = replace(head, b_Q=np.zeros(head.d_k))
            witness = search_witness(head, radius=domain.radius, center=domain.center, n=n, budget_seconds=budget,
                                     seed=seed, model=model.name, layer=layer_index, head=h)
            path = witness.save(witness_dir / f"{_slug(model.name)}-L{layer_index}-H{h}-n{n}.npz")
            row = HeadReport(layer_index, h, domain.radius, witness.value, str(path), witness.method,
                             _head_bounds(head, domain, n, sdp))
            _refutations(row)
            rows.append(row)
            if progress:
                progress(row)
        if whole_layers and heads is None:
            target = layer.as_layer()
            witness = search_witness(target, radius=domain.radius, center=domain.center, n=n,
                                     budget_seconds=budget * 2, seed=seed, model=model.name, layer=layer_index)
            path = witness.save(witness_dir / f"{_slug(model.name)}-L{layer_index}-all-n{n}.npz")
            constant = layer_constant(layer, "fro", domain, n)
            bounds = [UpperBound("derived", constant.value, True,
                                 "derived (per-head bounds composed with the W_O blocks)")]
            if sdp:
                bounds.extend(_sdp_bounds(target, domain, n))
            row = HeadReport(layer_index, None, domain.radius, witness.value, str(path), witness.method, bounds)
            _refutations(row)
            rows.append(row)
            if progress:
                progress(row)
    return ModelReport(model.name, n, description, rows, time.perf_counter() - began)


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name) or "model"

