"""``L(eps)`` on real text: the local Lipschitz constant around a sentence's hidden states, and its table.

:func:`local_curve` tokenizes a sentence, runs it through the model, and asks
:func:`lipbound.local.curve.lipschitz_curve` for the certified constant and the witness of a head, an
attention layer, a block or a stack of blocks on ``U(X, eps)`` around the hidden states ``X`` that
enter the chosen layer, for radii given as fractions of the norm radius ``R = max|gamma| sqrt(d)``
of the LayerNorm or RMSNorm feeding that layer.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import AssumptionError
from ..local.curvature import CURVATURE_TOKENS
from ..local.curve import LipschitzCurve, lipschitz_curve
from ..printing.plaintext import legend_lines
from .bert import load_text_model

__all__ = ["DEFAULT_EPS", "local_curve", "curve_table", "CURVE_LEGEND"]

#: Default radii, as fractions of the LayerNorm radius.
DEFAULT_EPS = (0.0, 1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 2.0)


def local_curve(sentence: str, *, layer: int = 0, kind: str = "layer", head: int | None = None,
                last: int | None = None, norm: str = "fro", ball: str = "fro", positions=(), eps=DEFAULT_EPS,
                curvature_tokens: int = CURVATURE_TOKENS, model=None, progress=None,
                recheck: bool = False) -> tuple[LipschitzCurve, list]:
    """``L(eps)`` of a component at the hidden states of ``sentence`` entering ``layer``.

    ``eps`` are fractions of the LayerNorm radius of the layer (module docstring).  Returns the curve and
    the sentence's tokens.  ``recheck``: each witness re-checked in high precision (Frobenius norm; the maps
    :func:`~lipbound.local.witness_check.recheckable` covers; :func:`~lipbound.local.curve.lipschitz_curve`).
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise AssumptionError("sentence", "a non-empty sentence", repr(sentence),
                              'pass some text, e.g. "The cat slept."')
    bert = load_text_model(model)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < bert.num_layers:
        raise AssumptionError("layer", f"a layer in 0..{bert.num_layers - 1} (counted from 0)", repr(layer),
                              "choose e.g. `layer` 0")
    if isinstance(curvature_tokens, bool) or not isinstance(curvature_tokens, (int, np.integer)) \
            or curvature_tokens < 1:
        raise AssumptionError("curvature_tokens", "a positive number of tokens", repr(curvature_tokens),
                              "choose e.g. `curvature_tokens` 16")
    fractions = tuple(float(e) for e in eps)
    if not fractions or any(not (math.isfinite(e) and e >= 0) for e in fractions):
        raise AssumptionError("eps", "non-negative fractions of the LayerNorm radius", repr(eps),
                              "give e.g. `eps` 0, 1e-4, 1e-3, 1e-2")
    ids = bert.encode(sentence)
    X = bert.hidden_states(ids)[layer]
    radius = bert.layernorm_feeding(layer).radius_about_center
    curve = lipschitz_curve(bert.model, X, kind=kind, layer=layer, head=head, last=last, norm=norm, ball=ball,
                            positions=positions, eps=[f * radius for f in fractions],
                            curvature_tokens=int(curvature_tokens), progress=progress, recheck=bool(recheck))
    return curve, bert.tokenizer.tokens(ids)


_JACOBIAN_BOUNDS = {"dense": "dense Jacobian",
                    "grouped": "blocks between groups of tokens",
                    "blockwise": "products of per-token block norms",
                    "block-products": "the blocks' dense Jacobians multiplied with a normwise radius"}
_VARIATION_BOUNDS = {"blockwise": "blockwise bound",
                     "curvature-gram": "the smaller of the blockwise bound and the second derivative's (Gram matrix)",
                     "curvature-split": "the smaller of the blockwise bound and the second derivative's (split bound)",
                     "attention-tail": "the smaller of the blockwise bound and the split at the attention's output "
                                       "(the attention's own variation, then the per-token maps')",
                     "attention-front": "the smaller of the blockwise bound and the split at the attention's input "
                                        "(the norm's variation, then the attention's own: blockwise or through its "
                                        "second derivative)",
                     "stack-blocks": "the smaller of the blockwise bound and the blocks' own curves, composed"}


def curve_table(curve: LipschitzCurve) -> str:
    lines = [f"{curve.description}: L(eps) in the {curve.norm} norm on the {curve.ball} ball"
             + (f" (tokens {list(curve.positions)})" if curve.ball == "tokens" else "")
             + f", n = {curve.n}, norm radius R = {curve.radius:.4g}",
             f"||DF(X)||: certified {curve.jacobian_norm:.6g} ({_JACOBIAN_BOUNDS[curve.jacobian_bound]}), "
             f"witness {curve.jacobian_witness:.6g}; "
             f"variation: {_VARIATION_BOUNDS[curve.variation_bound]}"
             + (", with the attention's relational enclosure on U" if curve.relational else ""),
             f"{'eps/R':>9s} {'eps':>10s} {'certified':>11s} {'witness':>10s} {'ratio':>8s} {'variation':>10s} "
             f"{'var. found':>10s} {'global':>10s} {'CPU s':>7s}  verdict"]
    checked = any(p.witness_rechecked for p in curve.points)
    if checked:
        lines[-1] = lines[-1].replace(f"{'ratio':>8s}", f"{'rechecked':>14s} {'ratio':>8s}")
    for p in curve.points:
        global_text = f"{p.global_constant:10.4g}" if math.isfinite(p.global_constant) else f"{'-':>10s}"
        recheck_text = "" if not checked else \
            f" {p.witness_rechecked[0]:14.10g}" if p.witness_rechecked else f" {'-':>14s}"
        lines.append(f"{p.eps / curve.radius:9.2g} {p.eps:10.4g} {p.certified:11.5g} {p.witness:10.5g}{recheck_text} "
                     f"{_ratio_text(p.ratio)} {p.variation:10.4g} {p.variation_witness:10.4g} {global_text} "
                     f"{p.cpu_seconds:7.1f}  {p.verdict}")
    for block in curve.blocks:   # a stack, block by block: L_l and V_l on U_l, and U_l's radius
        lines.append(f"  layer {block['layer']}: ||DF(X_l)|| {block['jacobian_norm']:.5g}; per eps: "
                     + ", ".join(f"L {c:.4g} V {v:.4g} on radius {r:.3g}"
                                 for c, v, r in zip(block["certified"], block["variation"], block["radius"])))
    lines.append(f"set-up shared by the radii: {curve.setup_cpu_seconds:.1f} CPU s "
                 f"(total {curve.setup_cpu_seconds + sum(p.cpu_seconds for p in curve.points):.1f} CPU s)")
    return "\n".join(lines + [""] + legend_lines(
        f"columns (L(eps): the Lipschitz constant of the component on U(X, eps), the inputs within eps of the "
        f"sentence's hidden states X in the {curve.ball} {'ball' if curve.ball != 'tokens' else 'ball of the tokens'}; "
        f"distances in the units of the hidden states, constants output units per input unit, {curve.norm} norm):",
        [entry for entry in CURVE_LEGEND if checked or entry[0] != "rechecked"]))


def _ratio_text(ratio: float) -> str:
    """Eight characters: three decimals, or a mantissa and exponent for a ratio too wide for them."""
    return f"{ratio:8.3f}" if ratio < 1e4 else f"{ratio:8.2e}"


#: The columns of :func:`curve_table`, for its legend.
CURVE_LEGEND = [
    ("eps/R", "the radius eps as a fraction of the LayerNorm radius R"),
    ("eps", "the radius of U(X, eps)"),
    ("certified", "a certified upper bound on L(eps): the smallest of ||DF(X)|| + variation, the product of the "
                  "components' bounds on U and global"),
    ("witness", "the Jacobian norm ||DF(Y)|| at a point Y of U(X, eps) found by ascent (a lower bound on L(eps))"),
    ("rechecked", "with --recheck: a certified lower bound on L(eps), the witness's value enclosed in high precision "
                  "at its point, which lies in U exactly ('-': not re-checked: outside U, or no enclosure narrow "
                  "enough)"),
    ("ratio", "certified / witness (1: tight)"),
    ("variation", "a certified bound on sup over U of ||DF(Y) - DF(X)||"),
    ("var. found", "the largest ||DF(Y) - DF(X)|| found in U (at most variation)"),
    ("global", "the certified global constant on a ball holding U ('-' at eps = 0, where U is X alone)"),
    ("CPU s", "CPU seconds of this radius's own work (its bounds and witnesses); the set-up line gives the work "
              "every radius shares (the centre's enclosures, ||DF(X)||, nested curves' set-up)"),
    ("verdict", "holds: witness <= certified and var. found <= variation, decided in interval arithmetic; "
                "violated would refute a bound (exit status 3); not certified: rounding could decide"),
]
