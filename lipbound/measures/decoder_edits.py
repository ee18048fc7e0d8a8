"""Edit rows of :func:`~lipbound.measures.perturb.perturb` for a decoder (pre-norm or sandwich layers with
causal, position-dependent attention).

A decoder's attention reads each token at its position, so a sentence is not a measure of exchangeable
atoms: only replacements keep every other token at its position (insertions and deletions shift every later
one; they are refused).  A replacement of the tokens at some positions gives inputs X, X' of layer l with
the same n tokens; the compared outputs are those of the attention sub-layer ``F(X) = X + a MHA(N(X))``
(:func:`~lipbound.local.chains.chain_for`, kind ``layer``), and the identity coupling of the uniform
measures on ``F(X)`` and ``F(X')`` gives

    W1(F_# mu, F_# mu') <= (1/n) sum_i ||F(X')_i - F(X)_i|| <= (1/n) sum_i m_i,

with ``m_i`` the certified movement of token i of F on the token balls ``||y_j - x_j|| <= ||x'_j - x_j||``
(theorems local-residual-step and local-score-deviation-normalised: the norm's movement, then the attention's
on the norm's image).  That is ``predicted_path``.  The set certificate from the embeddings
(:mod:`lipbound.local.propagate`) and the global constant are BERT's (learned position tables, post-norm
layers): for a decoder ``predicted_set`` is not computed (NaN) and ``global`` is inf (``verify --whole``
bounds a decoder's layers globally).  ``worst_witness`` is the largest measured W1 over the searched
replacements (every edited slot set to one candidate of the set).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import AssumptionError
from ..local.balls import TokenBalls
from ..local.chains import chain_for
from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import vector_norm_upper
from .edit_report import EditRow
from .empirical import EmpiricalMeasure
from .wasserstein import w1

__all__ = ["check_decoder_mode", "decoder_rows", "is_decoder"]


def is_decoder(model) -> bool:
    """Whether the text model's layers are pre-norm or sandwich (a decoder's): :func:`decoder_rows` applies."""
    return any(model.model.layer(l).placement != "post" for l in range(model.num_layers))


def check_decoder_mode(mode: str) -> None:
    if mode != "replace":
        raise AssumptionError("mode", "replace for a decoder (an insertion or a deletion moves every later token to "
                              "another position)", repr(mode), "edit a decoder's text by replacing tokens")


def _sublayers(model, layers):
    return {layer: chain_for(model, "layer", layer)[0] for layer in range(max(layers) + 1)}


def decoder_rows(text, ids, edits: dict, candidates, search: int | None, seed: int, layers, say) -> tuple[list, dict]:
    """``(rows, search_info)``: one :class:`~lipbound.measures.edit_report.EditRow` per (layer, k) of the
    replacements ``edits`` (module docstring)."""
    n = len(ids)
    sublayers = _sublayers(text.model, layers)
    original = text.hidden_states(ids)

    def outputs(states):
        return {layer: sublayers[layer].forward(states[layer][None])[0] for layer in layers}

    at_x = outputs(original)
    rows, info = [], {}
    for k, edit in edits.items():
        states = text.hidden_states(list(edit.ids))
        moved_outputs = outputs(states)
        worst = _worst(text, edit, candidates, search, seed, outputs, at_x, layers)
        info[k] = {"description": f"{worst[1]} replacements (each edited slot set to one candidate)",
                   "evaluated": worst[1], "exhaustive": candidates is not None and worst[1] >= len(candidates)}
        for layer in layers:
            say(f"k = {k}, layer {layer}: token-ball certificate")
            X, X_new = original[layer], states[layer]
            Y, Y_new = at_x[layer], moved_outputs[layer]
            measured = w1(EmpiricalMeasure.uniform(Y), EmpiricalMeasure.uniform(Y_new))
            moved = float(np.max(np.linalg.norm(Y - Y_new, axis=1)))
            radii = np.array([vector_norm_upper(row) if np.any(row) else 0.0 for row in X_new - X])
            component = sublayers[layer]
            bounds = component.bounds(TokenBalls(X, radii), component.enclose(X), want_blocks=False)
            predicted = (IntervalArray(bounds.movement).sum() / IntervalArray(float(n))).hi.item()
            rows.append(EditRow(layer, k, tuple(edit.positions), n, measured, moved, predicted, math.nan,
                                max(worst[0].get(layer, measured), measured), math.inf))
    return rows, info


def _worst(text, edit, candidates, search, seed: int, outputs, at_x: dict, layers) -> tuple[dict, int]:
    """The largest measured W1 per layer over up to ``search`` candidates put at every edited slot."""
    if not search or candidates is None:
        return {}, 1
    count = len(candidates) if search == "all" else min(int(search), len(candidates))
    chosen = np.random.default_rng(seed + 104729).choice(candidates, size=count, replace=False)
    best: dict = {}
    for candidate in chosen:
        ids = list(edit.ids)
        for position in edit.positions:
            ids[position] = int(candidate)
        found = outputs(text.hidden_states(ids))
        for layer in layers:
            value = w1(EmpiricalMeasure.uniform(at_x[layer]), EmpiricalMeasure.uniform(found[layer]))
            best[layer] = max(best.get(layer, 0.0), value)
    return best, count
