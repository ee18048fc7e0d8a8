"""Whole-model bounds from the results of :mod:`.tasks`: components, layers, end-to-end maps.

Composition rules (docs/mathematics.md, section 12), every product and sum rounded upward in
interval arithmetic:

* post-LN layer ``LN_out(Y + F(Y))``, ``Y = LN_att(X + A(X))``:  ``L_out (1 + L_F) L_att (1 + L_A)``;
* pre-norm and sandwich layer: the product of its residual steps ``x + a * N'(F(N(x)))``, each the rule
  of :func:`lipbound.numeric.blocks.constants.residual_constant` computed by its task
  (``1 + lambda_max L_N' L_F L_N``; ``1 + L_A L_N`` without LayerScale and sandwich norm), the smallest
  certified one (for a feed-forward block also the rule with the norm's gain folded in), and
  ``1 + L_Q L_N'`` for a cross-attention in its queries;
* a stack: the product of its layers, times its final LayerNorm;
* a decoder in the encoder output ``C`` (fixed decoder input): ``K_0 = 0``,
  ``K_{l+1} = R_F^l (R_Q^l R_A^l K_l + L_C^l)`` with ``L_C^l`` the cross-attention's constant in
  its context, times the final LayerNorm.

The *compositional* bound takes every block on the domain the LayerNorm before it leaves it, with
its best certified method; the *naive product* multiplies per-layer bounds built from the textbook
constant of each block (the derived theorem of each attention, ``||W_2|| ell_phi ||W_1||`` of each
feed-forward block, the residual rule without folding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...printing.plaintext import legend_lines
from ...rigorous.functions import log10_upper_product
from ...rigorous.intervals import interval, upper, upper_product
from .tasks import layer_norms

__all__ = ["WholeReport", "LOOSE_GAP"]

#: A gap above this is called astronomically loose in the report, with its reason.
LOOSE_GAP = 1e3


def _plus_one_times(*values) -> float:
    return upper(interval(1.0) + interval(upper_product(*values)))


def _best(upper_list) -> dict:
    certified = [u for u in upper_list if u["certified"] and math.isfinite(u["value"])]
    if not certified:
        return {"name": "none", "value": math.inf, "certified": False}
    return min(certified, key=lambda u: u["value"])


def _shares(total: float, **parts) -> dict:
    """``log10(total)`` split between the named constants in proportion to their own log10 (a
    residual step ``1 + L_F L_N`` is shared between F and N); nothing for a step not certified."""
    if not all(math.isfinite(v) and v > 0 for v in (total, *parts.values())):
        return {}
    logs = {key: max(math.log10(value), 0.0) for key, value in parts.items()}
    whole = sum(logs.values())
    spread = max(math.log10(total), 0.0)
    return {key: spread * part / whole for key, part in logs.items()} if whole > 0 else {}


def _row(block, layer, component, part, uppers, witness) -> dict:
    best = _best(uppers)
    gap = best["value"] / witness if witness and witness > 0 else math.inf
    return {"block": block, "layer": layer, "component": component, "part": part, "upper": uppers,
            "best_upper": best["value"], "best_method": best["name"], "certified": best["certified"],
            "witness": witness, "gap": gap}


def _entry(name, value, certified=True) -> dict:
    return {"name": name, "value": float(value), "certified": bool(certified)}


def _kind(result: dict) -> str:
    return {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}.get(result.get("kind", "layernorm"), "norm")


def _branch(layer, inner: str, norm: str, after: str | None, scale) -> str:
    """``X + a * N'(inner(N(X)))`` in words, for the residual rows."""
    text = f"{inner}({norm}(X))"
    if after is not None:
        text = f"{after}({text})"
    return "X + " + ("a * " if scale is not None else "") + text


@dataclass
class WholeReport:
    """The whole-model report: per-component rows, per-layer rows, end-to-end bounds."""

    model: str
    path: str
    sha256: str
    n: int
    m: int | None
    blocks: tuple
    planned: int
    seconds: float = 0.0
    complete: bool = False
    components: list = field(default_factory=list)
    model_bounds: list = field(default_factory=list)
    image_input: dict = field(default_factory=dict)  # stack -> its input is a LayerNorm image (post-LN)

    @classmethod
    def build(cls, model, tasks, results, n, m, seconds=0.0) -> WholeReport:
        report = cls(model.name, model.path, getattr(model, "sha256", ""), n, m, model.blocks, len(tasks), seconds,
                     complete=len(results) == len(tasks) and all(r is not None for r in results))
        done = {(t[0], t[2], t[3], t[4]): r for t, r in zip(tasks, results) if r is not None}
        report.image_input = {block: model.stack(block)[min(model.stack(block))].placement == "post"
                              for block in model.blocks}
        for block in model.blocks:
            layers = []
            for index in sorted(model.stack(block)):
                layer = report._layer(model.stack(block)[index], block, index, done)
                if layer is None:
                    break
                layers.append(layer)
            final = done.get(("norm", block, -1, "final"))
            if final is not None:
                report.components.append(_row(block, None, "norm", f"final norm ({_kind(final)})", final["upper"],
                                                  final["witness"]))
            if len(layers) == len(model.stack(block)) and (final is not None or model.final_norm_of(block) is None):
                report._stack_bounds(block, layers, final, done)
        return report

    # one layer ---------------------------------------------------------------------------------
    def _layer(self, layer, block, index, done):
        keys = [("attention", block, index, layer.self_kind), ("ffn", block, index, ""), ("layer", block, index, "")]
        if layer.cross is not None:
            keys += [("attention", block, index, "cross-queries"), ("attention", block, index, "cross-context")]
        norms = layer_norms(layer)
        keys += [("norm", block, index, name) for name in norms]
        if any(key not in done for key in keys):
            return None
        kinds = {name: _kind(done[("norm", block, index, name)]) for name in norms}
        rows = self.components
        att = done[keys[0]]
        rows.append(_row(block, index, "attention", f"{layer.self_kind} attention", att["upper"], att["witness"]))
        L_A, T_A = _best(att["upper"])["value"], att["upper"][0]["value"]
        norm = {name: _best(done[("norm", block, index, name)]["upper"])["value"] for name in norms}
        for name in norms:
            result = done[("norm", block, index, name)]
            rows.append(_row(block, index, "norm", f"{name} ({kinds[name]})", result["upper"], result["witness"]))
        ffn = done[("ffn", block, index, "")]
        rows.append(_row(block, index, "ffn", "feed-forward", ffn["upper"], ffn["witness"]))
        L_F = _best(ffn["upper"])["value"]
        T_F = next(u["value"] for u in ffn["upper"] if u["name"] == "closed form")
        certified = all(r["certified"] for r in rows[-(len(norms) + 2):])
        if layer.placement == "post":
            R_A, R_F = _plus_one_times(L_A), _plus_one_times(L_F)
            rows.append(_row(block, index, "residual", "X + attention(X)", [_entry("1 + L_A", R_A)],
                             att["residual_witness"]))
            rows.append(_row(block, index, "residual", "Y + feed-forward(Y)", [_entry("1 + L_F", R_F)],
                             ffn["residual_witness"]))
            factors = [_shares(R_A, attention=R_A), _shares(R_F, ffn=R_F),
                       _shares(norm["ln_out"], norm=norm["ln_out"]), _shares(norm["ffn_norm"], norm=norm["ffn_norm"])]
            best = upper_product(norm["ln_out"], R_A, norm["ffn_norm"], R_F)
            naive = upper_product(norm["ln_out"], _plus_one_times(T_A), norm["ffn_norm"], _plus_one_times(T_F))
            cross = None
        else:
            sandwich = layer.placement == "sandwich"
            rows.append(_row(block, index, "residual", _branch(layer, "attention", kinds["ln_in"],
                                                               kinds["ln_out"] if sandwich else None, layer.attn_scale),
                             att["residual_upper"], att["residual_witness"]))
            R_A = _best(att["residual_upper"])["value"]
            rows.append(_row(block, index, "residual", _branch(layer, "feed-forward", kinds["ffn_norm"],
                                                               kinds["ffn_out_norm"] if sandwich else None,
                                                               layer.ffn_scale),
                             ffn["residual_upper"], ffn["residual_witness"]))
            R_F = _best(ffn["residual_upper"])["value"]
            norm_A = upper_product(norm["ln_in"], norm["ln_out"]) if sandwich else norm["ln_in"]
            norm_F = upper_product(norm["ffn_norm"], norm["ffn_out_norm"]) if sandwich else norm["ffn_norm"]
            factors = [_shares(R_A, attention=L_A, norm=norm_A), _shares(R_F, ffn=L_F, norm=norm_F)]
            certified = certified and all(r["certified"] for r in rows[-2:])
            best_factors = [R_A, R_F]
            naive_factors = [_best(att["residual_textbook"])["value"], _best(ffn["residual_textbook"])["value"]]
            cross = None
            if layer.cross is not None:
                queries, context = done[keys[3]], done[keys[4]]
                rows.append(_row(block, index, "attention", "cross-attention in its queries", queries["upper"],
                                 queries["witness"]))
                rows.append(_row(block, index, "attention", "cross-attention in its context", context["upper"],
                                 context["witness"]))
                R_Q = _plus_one_times(_best(queries["upper"])["value"], norm["cross_norm"])
                rows.append(_row(block, index, "residual", "X + cross-attention(LN(X), C)",
                                 [_entry("1 + L_Q L_N", R_Q)], queries["residual_witness"]))
                factors.append(_shares(R_Q, attention=_best(queries["upper"])["value"], norm=norm["cross_norm"]))
                best_factors.insert(1, R_Q)
                naive_factors.insert(1, _plus_one_times(queries["upper"][0]["value"], norm["cross_norm"]))
                certified = certified and all(r["certified"] for r in rows[-3:])
                cross = {"R_A": R_A, "R_Q": R_Q, "R_F": R_F, "L_C": _best(context["upper"])["value"],
                         "naive": naive_factors, "T_C": context["upper"][0]["value"]}
            best, naive = upper_product(*best_factors), upper_product(*naive_factors)
        logs = {key: sum(part.get(key, 0.0) for part in factors) for key in ("attention", "ffn", "norm")}
        dominant = max(logs, key=logs.get) if any(logs.values()) else "none (not certified)"
        layer_row = _row(block, index, "layer", f"{layer.placement}-norm layer, {dominant} dominates",
                         [_entry("compositional", best, certified), _entry("textbook product", naive, certified)],
                         done[("layer", block, index, "")]["witness"])
        layer_row["dominant"] = dominant
        rows.append(layer_row)
        return {"best": best, "naive": naive, "certified": certified, "factors": factors, "cross": cross,
                "row": layer_row}

    # end to end --------------------------------------------------------------------------------
    def _stack_bounds(self, block, layers, final, done):
        L_final = _best(final["upper"])["value"] if final is not None else 1.0
        refused = [layer["row"]["layer"] for layer in layers if not layer["certified"]]
        certified = all(layer["certified"] for layer in layers) and (final is None or final["upper"][0]["certified"])
        output = f"the last hidden state of the {block}" + (" (after its final LayerNorm)" if final else "")
        stream = done.get(("model", block, -1, "stream"))
        value = [*(layer["best"] for layer in layers), L_final]
        naive = [*(layer["naive"] for layer in layers), L_final]
        factors = [_shares(L_final, norm=L_final)] + [part for layer in layers for part in layer["factors"]]
        eps = sorted({r["eps"] for key, r in done.items() if key[0] == "norm" and key[1] == block})
        what = "decoder input" if block == "decoder" else f"input of the first {block} layer"
        where = " (on the image of the LayerNorm before it)" if self.image_input.get(block) else " (all of R^(n x d))"
        self.model_bounds.append(self._bound(block, "stream", value, certified, f"the {what}{where}", output, naive,
                                             stream["witness"] if stream else None, factors, eps, refused))
        context = done.get(("model", block, -1, "context"))
        if layers[0]["cross"] is not None:
            K = K_naive = 0.0
            for layer in layers:
                c = layer["cross"]
                K = upper_product(c["R_F"], upper(interval(upper_product(c["R_Q"], c["R_A"], K)) + interval(c["L_C"])))
                naive_f = c["naive"]
                K_naive = upper_product(naive_f[2], upper(interval(upper_product(naive_f[1], naive_f[0], K_naive))
                                                     + interval(c["T_C"])))
            self.model_bounds.append(self._bound(
                block, "context", [K, L_final], certified,
                "the encoder output (the context; decoder input fixed)", output, [K_naive, L_final],
                context["witness"] if context else None, factors, eps, refused))

    def _bound(self, block, argument, value_factors, certified, source, output, naive_factors, witness, factors,
               eps, refused=()) -> dict:
        """The end-to-end entry of the product of ``value_factors`` (and of the textbook ``naive_factors``);
        ``log10_value`` stays finite when a deep model's product overflows a float (``value`` is then inf)."""
        value, naive = upper_product(*value_factors), upper_product(*naive_factors)
        log10_value = log10_upper_product(*value_factors)
        gap = value / witness if witness else math.inf
        log10_gap = log10_value - math.log10(witness) if witness else math.inf
        logs = {key: sum(part.get(key, 0.0) for part in factors) for key in ("attention", "ffn", "norm")}
        total = sum(logs.values()) or 1.0
        shares = {key: round(part / total, 4) for key, part in logs.items()}
        dominant = max(shares, key=shares.get)
        bound = {"value": value, "certified": certified, "input": source, "output": output, "norm": "fro",
                 "n": self.m if block == "decoder" and argument == "stream" and self.m else self.n,
                 "log10_value": log10_value, "witness": witness, "gap": gap, "log10_gap": log10_gap,
                 "naive_product": naive, "log10_naive_product": log10_upper_product(*naive_factors),
                 "block": block, "argument": argument,
                 "log_shares": shares, "dominant": dominant, "eps": eps, "not_certified_layers": list(refused)}
        if refused:
            bound["reasons"] = self._reasons(block)
        bound["statement"] = _statement(bound, factors)
        return bound

    def _reasons(self, block) -> list[str]:
        """Why components of a stack have no certified bound (one line per distinct reason)."""
        reasons = {u.get("reason", "") for r in self.components if r["block"] == block and not r["certified"]
                   for u in r["upper"] if not u["certified"]}
        return sorted(r for r in reasons if r)

    # output ------------------------------------------------------------------------------------
    @property
    def model_bound(self) -> dict | None:
        """The default end-to-end map: the last stack in its own input (a decoder's: the decoder
        input, the encoder output fixed anywhere in its domain)."""
        streams = [b for b in self.model_bounds if b["argument"] == "stream"]
        return streams[-1] if streams else None

    def to_json(self) -> dict:
        return {"model": self.model, "path": self.path, "sha256": self.sha256, "n": self.n, "m": self.m,
                "complete": self.complete, "planned": self.planned, "seconds": round(self.seconds, 2),
                "model_bound": _plain(self.model_bound), "model_bounds": _plain(self.model_bounds),
                "components": _plain(self.components)}

    def csv(self) -> str:
        lines = ["block,layer,component,part,best_upper,best_method,certified,witness,gap"]
        for r in self.components:
            lines.append(f"{r['block']},{'' if r['layer'] is None else r['layer']},{r['component']},\"{r['part']}\","
                         f"{r['best_upper']!r},{r['best_method']},{r['certified']},{r['witness']!r},{r['gap']!r}")
        return "\n".join(lines) + "\n"

    def markdown(self) -> str:
        return "```\n" + self.table() + "\n```\n"

    def table(self) -> str:
        """The breakdown and the end-to-end bounds as text."""
        out = [f"{'block':8s} {'layer':>5s} {'component':10s} {'part':34s} {'bound':>11s} {'method':18s} "
               f"{'witness':>11s} {'gap':>10s}"]
        for r in self.components:
            layer = "final" if r["layer"] is None else str(r["layer"])
            out.append(f"{r['block']:8s} {layer:>5s} {r['component']:10s} {r['part'][:34]:34s} {r['best_upper']:11.4g} "
                       f"{r['best_method'][:18]:18s} {_num(r['witness']):>11s} {_num(r['gap']):>10s}")
        for b in self.model_bounds:
            out.append("")
            out.append(f"end to end, {b['block']} in {b['input']} -> {b['output']} (n = {b['n']}, Frobenius):")
            ratio = b["log10_naive_product"] - b["log10_value"]
            out.append(f"  certified bound {_big(b['value'], b['log10_value'])}"
                       f"{'' if b['certified'] else ' (NOT certified)'}; witness {_num(b['witness'])}; "
                       f"gap {_big(b['gap'], b['log10_gap'])}; naive product "
                       f"{_big(b['naive_product'], b['log10_naive_product'])} "
                       f"(x{_big(10.0 ** ratio if ratio < 300 else None, ratio)} the compositional bound)")
            out.append("  share of log10(bound): " + ", ".join(f"{k} {v:.0%}" for k, v in b["log_shares"].items())
                       + f"; dominant: {b['dominant']}")
            out.append("  " + b["statement"])
        return "\n".join(out + [""] + self.legend())

    def legend(self) -> list[str]:
        """What the columns of :meth:`table` mean, one line each."""
        return legend_lines(
            "columns (Lipschitz constants in the Frobenius norm of the n tokens, output units per input unit):",
            [("layer", "counted from 0; final: the stack's final LayerNorm"),
             ("component", "attention (the multi-head map without its residual), norm (a LayerNorm), ffn (a "
                           "feed-forward block), residual (a residual step), layer (the whole layer, composed)"),
             ("part", "which one: the LayerNorm by its place, the residual step as a formula, which kind of "
                      "component dominates a layer's bound"),
             ("bound", "the best certified upper bound on the component's constant"),
             ("method", "the method that gave it: derived, matrix-aware, joint (attention; see lipbound verify "
                        "--help), closed form ||W_2|| ell_phi ||W_1||, midpoint form or LipSDP-Neuron (feed-forward), "
                        "1 + L (a residual step), compositional (a layer: the product of its steps)"),
             ("witness", "a lower bound on the constant: the largest Jacobian norm found by counted power iterations "
                         "(the same --seed gives the same value); '-': none"),
             ("gap", "bound / witness (1: tight)")])


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def _big(value: float | None, exponent: float) -> str:
    """``value``, or where it overflowed a float, ``1e+412.3`` from its decimal exponent (rounded up)."""
    if value is not None and math.isfinite(value):
        return _num(value)
    if not math.isfinite(exponent):
        return "inf" if exponent > 0 else "nan"
    return f"1e+{math.ceil(exponent * 10) / 10:.1f}"


def _plain(value):
    """JSON-safe copy: infinities as strings."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    return value


def _statement(bound: dict, factors: dict) -> str:
    """The plain statement under an end-to-end bound: loose or not, and why."""
    gap = bound["gap"]
    if bound.get("not_certified_layers"):
        layers = bound["not_certified_layers"]
        return (f"NOT CERTIFIED: {len(layers)} layer(s) ({', '.join(map(str, layers[:6]))}"
                f"{', ...' if len(layers) > 6 else ''}) have a component without a certified bound: "
                + "; ".join(bound.get("reasons", [])[:2]) + ".  The witness is a lower bound; no upper bound is "
                "claimed.")
    if bound["witness"] is None:
        return "no witness yet."
    if gap <= LOOSE_GAP:
        return f"the bound is within a factor {gap:.3g} of a point where the map attains it."
    orders = bound["log10_gap"]
    norm_share = bound["log_shares"].get("norm", 0.0)
    dominant = bound["dominant"]
    why = (f"the {dominant} constants weigh most ({bound['log_shares'][dominant]:.0%} of log10 of the bound); each "
           "is a worst case over its whole domain, and the product over the layers assumes the worst case of every "
           "block at once, along aligned directions")
    if norm_share > 0.2:
        why += (f"; the norm constants ||diag(gamma) P|| / sqrt(eps) ({norm_share:.0%}: 1/sqrt(eps) = "
                + ", ".join(f"{e ** -0.5:.3g}" for e in bound["eps"]) + " per norm, eps = "
                + ", ".join(f"{e:g}" for e in bound["eps"]) + ") are attained only at tokens of (nearly) zero "
                "variance or mean square, which the residual stream of a trained model never is, and nothing "
                "certifies a floor for what a norm reads inside the model")
    # rounded down, as the printed gap (1e+...) is rounded up: the two never contradict each other
    return (f"ASTRONOMICALLY LOOSE: the certified bound is more than {math.floor(orders * 10) / 10:.1f} orders of "
            "magnitude above the witness; "
            f"{why}.  The truth lies between the witness and the bound.")
