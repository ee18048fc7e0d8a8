"""The advice: diagnosis, mismatch and interventions with both prices, ranked; text, JSON, LaTeX.

An intervention's **certified reduction** is ``log10(B_before / B_after)`` of the certified
whole-model bound (orders of magnitude) in interval arithmetic, rounded down; where a bound
overflows a float (a deep decoder's), its ``log10`` is the report's ``log10_value`` (the rounded-up
log10 of the product of its factors: the bound is ``10^log10_value``); its
**functional cost** is ``1 - min cosine`` of the sentence embeddings to the original model's over
the text for an encoder, ``1 - next-token agreement`` for a decoder (with the perplexity before and
after beside it). The ranking sorts by reduction per unit of cost (``reduction / max(cost, 1e-6)``).
An intervention whose bound after is not certified is listed with the reason and never ranked. No
retraining is claimed: the cost is that of the edited weights as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..numeric.whole.report import _big
from ..printing.document import comparison_table
from ..rigorous.functions import log
from ..rigorous.intervals import interval, lower
from .diagnosis import local_product

__all__ = ["COST_FLOOR", "LEGEND", "Advice", "InterventionResult"]

#: the smallest cost the ranking divides by (an edit that changes nothing measurable)
COST_FLOOR = 1e-6

LEGEND = """Legend: bound = certified upper bound on the Frobenius Lipschitz constant of the whole stack (an encoder:
input of layer 0 on the image of the embedding LayerNorm -> last hidden state; a decoder: its input, all of R^(n x d) ->
the last hidden state after the final norm; n tokens), output units per input unit (1e+N.N: 10^N.N);
witness = a point where the map attains at least that much (a lower bound); orders = log10(bound before / bound
after), the certified reduction (a lower bound on it, rounded down); head, layer = the certified constant of the
edited head (verify's row) and of its whole attention layer; min cos = smallest cosine of a sentence embedding
(mean of the last hidden states) to the original model's over the text; rho = Spearman correlation of the
pairs' similarities, original vs edited; for a decoder, agree = fraction of positions whose most likely next token
is the original's, ppl x = perplexity of the text after / before; orders/cost = orders / max(1 - min cos (a decoder:
1 - agree), 1e-6), the ranking key.
NOT CERTIFIED rows are never ranked.  No retraining: the cost is that of the edited weights as they are."""


def _num(value, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "inf"
    return format(value, spec)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _plain(value.item())
    return value


@dataclass
class InterventionResult:
    """One intervention: its checkpoint, certified bounds before and after, witnesses, cost."""

    intervention: object
    checkpoint: str | None
    cost: object = None
    whole_before: object = None
    whole_after: object = None
    layer: int = 0
    head_before: dict | None = None
    head_after: dict | None = None
    local_before: dict | None = None
    local_after: dict | None = None
    mismatch_after: list | None = None
    error: str | None = None

    @property
    def certified(self) -> bool:
        return self.error is None and self.whole_after is not None and bool(self.whole_after.bound["certified"])

    @property
    def reduction(self) -> float | None:
        """``log10(B_before / B_after)``, rounded down in interval arithmetic (None: not certified)."""
        if not self.certified:
            return None
        return float(lower(_log10(self.whole_before) - _log10(self.whole_after)))

    @property
    def score(self) -> float | None:
        reduction = self.reduction
        if reduction is None or self.cost is None:
            return None
        return reduction / max(self.cost.cost, COST_FLOOR)

    def _side(self, whole, head, local, which: str) -> dict:
        """``{"model", "layer", "head", "local"}``: the certified bounds (``which = "certified"``, with
        ``model_log10``) or the witnesses (``"witness"``) of one side of the edit."""
        bound = None if whole is None else whole.bound
        row = None if whole is None else whole.layer_row(self.layer)
        model_key, row_key, head_key = ("value", "best_upper", "bound") if which == "certified" else ("witness",) * 3
        out = {"model": None if not bound else bound[model_key], "layer": None if row is None else row[row_key],
               "head": None if head is None else head[head_key], "local": None if local is None else local.get(which)}
        if which == "certified":
            out["model_log10"] = None if not bound else bound["log10_value"]
        return out

    def to_json(self) -> dict:
        iv = self.intervention
        before, after = self.whole_before, self.whole_after
        out = {"name": iv.name, "kind": iv.kind, "target": iv.target, "certified": self.certified,
               "error": self.error, "checkpoint": self.checkpoint,
               "bound_before": self._side(before, self.head_before, self.local_before, "certified"),
               "bound_after": self._side(after, self.head_after, self.local_after, "certified"),
               "witness_before": self._side(before, self.head_before, self.local_before, "witness"),
               "witness_after": self._side(after, self.head_after, self.local_after, "witness"),
               "layer": self.layer, "reduction_orders": self.reduction, "score": self.score,
               "function_metric": None if self.cost is None else self.cost.metric,
               "function_value": None if self.cost is None else self.cost.value,
               "function": None if self.cost is None else self.cost.to_json(),
               "tasks_rerun": None if after is None else after.rerun,
               "tasks_core_reused": None if after is None else after.cores_reused,
               "local_eps_fraction": None if self.local_before is None else self.local_before["eps_fraction"]}
        if self.mismatch_after is not None:
            out["mismatch_after"] = self.mismatch_after
        return _plain(out)


@dataclass
class Advice:
    """Everything :func:`lipbound.advise.run.advise` found."""

    model: object
    folder: str
    sentences: int
    n: int
    whole: object
    shares: list
    heads: list
    local: list
    movement: object
    mismatch: list
    interventions: list
    function_floor: float
    eps_fraction: float
    seconds: float = 0.0
    stages: dict = field(default_factory=dict)
    ranked: list = field(default_factory=list)

    def __post_init__(self):
        certified = [r for r in self.interventions if r.score is not None]
        self.ranked = sorted(certified, key=lambda r: r.score, reverse=True)

    # components ------------------------------------------------------------------------------
    def components(self) -> list[dict]:
        """Per layer and component kind: certified constant, witness, share of log10 of the bound,
        local constant of the layer, share of the measured movement."""
        rows = []
        movement = {}
        for step in self.movement.steps:
            key = (step["layer"], step["component"])
            movement.setdefault(key, []).append(step)
        product = local_product(self.local)
        local_shares = {} if product is None else {r["layer"]: r["share"] for r in product["shares"]}
        for share in self.shares:
            key = (share["layer"], share["component"])
            steps = movement.get(key, [])
            local = next((r for r in self.local if r["layer"] == share["layer"]), None)
            rows.append({"layer": share["layer"], "component": share["component"], "part": share["part"],
                         "bound": share["bound"], "witness": share["witness"], "log10_share": share["share"],
                         "local_layer_certified": None if local is None else local["certified"],
                         "local_layer_witness": None if local is None else local["witness"],
                         "local_layer_share": local_shares.get(share["layer"]),
                         "movement_amplification": [s["amplification"] for s in steps],
                         "movement_share": sum(s["share"] for s in steps) if steps else None})
        for head in self.heads:
            rows.append({"layer": head["layer"], "component": "head", "part": f"head {head['head']}",
                         "bound": head["bound"], "witness": head["witness"], "log10_share": None,
                         "method": head["method"], "certified": head["certified"]})
        return rows

    def dominant(self) -> dict:
        """The component with the largest share of log10 of the bound, per layer and overall."""
        per_layer = {}
        for share in self.shares:
            key = "final" if share["layer"] is None else str(share["layer"])
            if key not in per_layer or share["share"] > per_layer[key]["share"]:
                per_layer[key] = share
        kinds = {}
        for share in self.shares:
            kinds[share["component"]] = kinds.get(share["component"], 0.0) + share["share"]
        overall = max(kinds, key=kinds.get)
        return {"per_layer": {k: f"{v['part']} ({v['share']:.0%})" for k, v in per_layer.items()},
                "overall": overall, "kind_shares": kinds}

    # outputs ---------------------------------------------------------------------------------
    @property
    def labels(self) -> dict:
        """Names of the function columns: ``value`` and ``secondary`` of the cost, short (table) and long
        (LaTeX, plot)."""
        if self.model.decoder_only:
            return {"value": "agree", "secondary": "ppl x", "value_tex": "Next-token agreement",
                    "secondary_tex": "Perplexity ratio", "cost": r"$1 - $ next-token agreement",
                    "caption": "fraction of the text's positions whose most likely next token is the original "
                               "model's; perplexity of the text after over before"}
        return {"value": "min cos", "secondary": "rho", "value_tex": "Min. cosine", "secondary_tex": "Spearman",
                "cost": r"functional cost $1 - \min\,\cos$",
                "caption": "smallest cosine of a sentence embedding to the original model's; Spearman "
                           "correlation of pair similarities"}

    def table(self) -> str:
        bound = self.whole.bound
        dominant = self.dominant()
        labels = self.labels
        lines = [f"{self.model.name}: certified whole-model bound {_big(bound['value'], bound['log10_value'])}, "
                 f"witness {bound['witness']:.4g} "
                 f"(n = {self.n}); share of log10(bound): " +
                 ", ".join(f"{k} {v:.0%}" for k, v in dominant["kind_shares"].items()) +
                 f"; dominant: {dominant['overall']}",
                 "per layer, the largest factor: " + "; ".join(f"{k}: {v}" for k, v in dominant["per_layer"].items())]
        top = sorted((h for h in self.heads if h["certified"]), key=lambda h: -h["bound"])[:3]
        lines.append("least regular heads: " + "; ".join(f"layer {h['layer']} head {h['head']} {h['bound']:.4g} "
                                                          f"(witness {h['witness']:.4g})" for h in top))
        if self.local:
            lines.append(f"local constants at {self.eps_fraction:g} R (median over {self.local[0]['sentences']} "
                         "sentence(s)): " + ", ".join(f"layer {r['layer']} {r['certified']:.4g}" for r in self.local))
            product = local_product(self.local)
            if product is not None:
                lines.append(f"local whole-model certificate (the certified product over layers): "
                             f"{product['value']:.4g}; share of its log10: " +
                             ", ".join(f"layer {r['layer']} {r['share']:.0%}" for r in product["shares"]))
        worst = max(self.movement.steps, key=lambda s: s["share"])
        lines.append(f"measured movement of {self.movement.edits} one-word edits (W1 of the token measures): total "
                     f"amplification {self.movement.total:.3g}; largest share: layer {worst['layer']} "
                     f"{worst['component']} ({worst['share']:.0%}); median W1 at the input and after each layer: "
                     + ", ".join(f"{v:.3g}" for v in self.movement.w1_per_layer))
        for m in self.mismatch:
            s = m.summary()
            rows = m.rows(5)
            lines.append(f"mismatch at position {s['position']} ('{s['original']}'): "
                         f"median ratio {s['median_ratio']:.3g}, "
                         f"max {s['max_ratio']:.3g}; most irregular: " +
                         ", ".join(f"{r['token']} {r['ratio']:.3g}" for r in rows) +
                         "; Spearman with embedding norm {:.2f}, with W_Q W_K^T alignment {:.2f}, with frequency "
                         "in the text {}".format(s["correlations"]["embedding_norm"],
                                                 s["correlations"]["alignment_with_qk"],
                                                 _num(s["correlations"]["frequency"], ".2f")))
        lines.append("")
        lines.append(f"{'rank':>4s} {'intervention':24s} {'target':24s} {'bound after':>11s} {'orders':>7s} "
                     f"{'head before':>11s} {'head after':>11s} {'witness after':>13s} {labels['value']:>8s} "
                     f"{labels['secondary']:>6s} "
                     f"{'orders/cost':>11s}")
        ranked = self.ranked + [r for r in self.interventions if r.score is None]
        for number, r in enumerate(ranked, 1):
            data = r.to_json()
            rank = str(number) if r.score is not None else "-"
            after = _big(r.whole_after.bound["value"], r.whole_after.log10) if r.certified else "NOT CERTIFIED"
            cos = _num(data["function_value"], ".5f")
            rho = "-" if r.cost is None else f"{r.cost.secondary:.3f}"
            lines.append(f"{rank:>4s} {r.intervention.name[:24]:24s} {r.intervention.target[:24]:24s} {after:>11s} "
                         f"{_num(r.reduction, '.1f'):>7s} {_num(data['bound_before']['head']):>11s} "
                         f"{_num(data['bound_after']['head']):>11s} {_num(data['witness_after']['model']):>13s} "
                         f"{cos:>8s} {rho:>6s} {_num(r.score, '.3g'):>11s}")
            if r.error:
                lines.append(f"     {r.error}")
        lines.append("")
        lines.append(LEGEND)
        return "\n".join(lines)

    def to_json(self) -> dict:
        return _plain({"model": self.model.name, "path": self.folder, "sha256": self.model.sha256, "n": self.n,
                       "sentences": self.sentences, "seconds": round(self.seconds, 1),
                       "stages": {k: {t: round(v, 2) for t, v in row.items()} for k, row in self.stages.items()},
                       "model_bound": self.whole.bound, "dominant": self.dominant(),
                       "components": self.components(), "local": self.local,
                       "local_whole": local_product(self.local), "movement": self.movement.to_json(),
                       "mismatch": [row for m in self.mismatch for row in m.rows()],
                       "mismatch_summary": [m.summary() for m in self.mismatch],
                       "interventions": [r.to_json() for r in self.ranked] +
                                        [r.to_json() for r in self.interventions if r.score is None],
                       "function_metric": self.labels["caption"], "function_floor": self.function_floor,
                       "local_eps_fraction": self.eps_fraction})

    def latex(self) -> str:
        """A booktabs table of the interventions (ranked, then those not certified), in a ``table``."""
        rows = []
        for r in self.ranked + [r for r in self.interventions if r.score is None]:
            rows.append({"name": r.intervention.name, "target": r.intervention.target,
                         "after": _bound_cell(r.whole_after) if r.certified else "not certified",
                         "orders": None if r.reduction is None else f"{r.reduction:.1f}",
                         "cosine": None if r.cost is None else f"{r.cost.value:.5f}",
                         "rho": None if r.cost is None else f"{r.cost.secondary:.3f}"})
        labels = self.labels
        columns = [("name", "Intervention"), ("target", "Target"), ("after", "Bound after"),
                   ("orders", "Orders"), ("cosine", labels["value_tex"]), ("rho", labels["secondary_tex"])]
        caption = (f"Interventions on {_tex(self.model.name)}: the certified whole-model Lipschitz bound after "
                   f"the edit (before: {_tex_bound(self.whole)}), its reduction in orders of magnitude, and the "
                   f"functional cost on the text ({labels['caption']}). No retraining.")
        return ("\\begin{table}\n\\centering\n" + comparison_table(rows, columns, booktabs=True)
                + f"\\caption{{{caption}}}\n\\label{{tab:advise}}\n\\end{{table}}\n")

    def pareto(self) -> list[dict]:
        """Plain data of the Pareto plot: per certified intervention, cost and certified reduction."""
        return [{"name": r.intervention.name, "target": r.intervention.target, "cost": r.cost.cost,
                 "reduction": r.reduction} for r in self.interventions if r.score is not None]


def _log10(whole):
    """An interval holding ``log10`` of the certified whole-model bound (module docstring)."""
    value = whole.bound["value"]
    if math.isfinite(value):
        return log(interval(value)) / log(interval(10.0))
    return interval(whole.log10)


def _scientific(whole) -> tuple[float, int]:
    """``(m, e)`` with the certified whole-model bound ``<= m 10^e``, ``m`` of three digits rounded up
    (from the bound's log10, which stays finite when the bound overflows a float)."""
    exponent = math.floor(whole.log10)
    mantissa = math.ceil(10 ** (whole.log10 - exponent + 2)) / 100
    return (1.0, exponent + 1) if mantissa >= 10 else (mantissa, exponent)


def _bound_cell(whole):
    """The bound for :func:`comparison_table`: a float, or where it overflows ``m 10^e`` (SymPy, math mode)."""
    if math.isfinite(whole.bound["value"]):
        return float(whole.bound["value"])
    import sympy
    mantissa, exponent = _scientific(whole)
    return sympy.Mul(sympy.Float(mantissa, 3), sympy.Pow(10, exponent, evaluate=False), evaluate=False)


def _tex_bound(whole) -> str:
    """The certified whole-model bound as ``$m \\times 10^{e}$`` (see :func:`_scientific`)."""
    mantissa, exponent = _scientific(whole)
    return f"${mantissa:.3g} \\times 10^{{{exponent}}}$" if exponent else f"${mantissa:.3g}$"


def _tex(text: str) -> str:
    return str(text).replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("&", r"\&").replace("%", r"\%") \
        .replace("#", r"\#")
