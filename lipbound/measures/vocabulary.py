"""The worst edit of a set: every candidate through the model in batches, the largest movement found.

A set of edits -- any vocabulary token at the chosen positions, or inserted at the chosen slots -- is
searched for the edit that moves the attention block outputs ``X + MHA(X)`` of each layer the most in
Wasserstein-1.  One position: every candidate is evaluated (the exact worst case, up to the screening
below).  Several positions: coordinate ascent -- each position in turn takes its best candidate with
the others fixed -- over a shortlist per position.

Screening runs the whole model in float32 on batches of candidates (:class:`ScreeningModel`: the one
float engine with float32 weights; BLAS in single precision is about twice as fast; GELU in its tanh
form, within 4.8e-4 of the erf form and a third of its cost) and scores each candidate by the cost of a
fixed coupling (an upper bound on W1).  The best candidates of every layer
are then evaluated again by the float64 forward pass of :mod:`lipbound.numeric.whole.chain` and their exact
W1 is computed (:func:`lipbound.measures.wasserstein.w1`): only these values are reported, so every
reported movement is a real edit's real movement (a witness).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..numeric.model import Embeddings, Model
from ..numeric.whole.chain import Step, chain_forward, layer_steps
from .empirical import EmpiricalMeasure
from .wasserstein import w1

__all__ = ["ScreeningModel", "EditSearch", "worst_edits", "coupling_cost"]


class ScreeningModel:
    """A model's forward pass in float32 on batches of sentences, returning every layer's input and
    attention block output (the output of its attention step, ``X + MHA(X)`` for a BERT), for
    screening candidates only: reported values come from float64.

    It runs the one float engine (:mod:`lipbound.numeric.whole.chain`) with ``dtype=float32``, the
    weights cast once; an erf GELU runs in its tanh form (Hendrycks and Gimpel 2016,
    ``|difference| < 4.8e-4``, a third of the cost): it only ranks candidates.
    """

    def __init__(self, model: Model, dtype=np.float32):
        if model.embeddings is None or not model.complete or not isinstance(model.embeddings, Embeddings):
            raise AssumptionError("model", "a full BERT-style checkpoint (embeddings with positions)",
                                  "an attention-only model or another embedding", "load the whole model")
        self.dtype = np.dtype(dtype)
        e = model.embeddings
        self.vocab_size = e.vocab_size
        self.word, self.position = e.word.astype(self.dtype), e.position.astype(self.dtype)
        self.type = self.dtype.type(0) if e.token_type is None else e.token_type[0].astype(self.dtype)
        self.offset, self.embedding_norm = e.position_offset, e.norm
        block = model.blocks[0]
        self.layers = [[_screening(step) for step in layer_steps(model.layer(index), block)]
                       for index in range(model.num_layers)]

    def block_outputs(self, ids: np.ndarray, last: int) -> list[np.ndarray]:
        """The attention block outputs of layers ``0..last`` for a batch of sentences ``ids`` (B, n)."""
        return self.forward(ids, last)[1]

    def forward(self, ids: np.ndarray, last: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The inputs ``X_l`` and the attention block outputs of layers ``0..last``."""
        n = ids.shape[1]
        X = self.embedding_norm(self.word[ids] + self.position[self.offset:self.offset + n] + self.type)
        inputs, outputs = [], []
        for index in range(last + 1):
            steps = self.layers[index]
            inputs.append(X)
            X = steps[0].linearize(X, None).F
            outputs.append(X)
            if index == last:
                break
            X, _ = chain_forward(steps[1:], X)
        return inputs, outputs


def _screening(step: Step) -> Step:
    """The step with an erf GELU in its tanh form (screening only)."""
    if step.kind == "ffn" and step.part.act == "gelu":
        return replace(step, part=replace(step.part, act="gelu_new"))
    return step


def coupling_cost(original: np.ndarray, edited: np.ndarray, pairs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``sum_k weights_k ||original[a_k] - edited[:, b_k]||`` for a batch of edited outputs (B, n', d): the cost
    of a fixed coupling with support ``pairs`` (an upper bound on W1)."""
    differences = original[pairs[:, 0]][None] - edited[:, pairs[:, 1]]
    return np.sqrt(np.einsum("bkd,bkd->bk", differences, differences)) @ weights


@final
@dataclass(frozen=True)
class EditSearch:
    """The worst edits found per layer: ``values[l]`` is the exact W1 movement of the attention block of
    layer l under the edit ``ids[l]``; ``evaluated`` counts the candidates screened."""

    values: dict
    ids: dict
    evaluated: int
    seconds: float
    exhaustive: bool


def worst_edits(model: Model, original_ids, make_ids, slots: list, candidates: list, layers, original_outputs,
                pairs: np.ndarray, weights: np.ndarray, *, start=None, sweeps: int = 2, top: int = 16,
                batch: int = 256, reference=None, exhaustive: bool = False, progress=None) -> EditSearch:
    """Search a set of edits for the largest W1 movement at each layer.

    Parameters
    ----------
    make_ids : callable
        ``make_ids(choice)`` -> the edited ids for a choice (one word id per slot).
    slots, candidates : list
        The edited slots and, per slot, the candidate word ids.
    layers : iterable of int
    original_outputs : list of ndarray
        The original sentence's attention block outputs (float64) per layer.
    pairs, weights : ndarray
        The screening coupling (support pairs and masses).
    start : tuple, optional
        A first choice (e.g. the drawn edit); default the first candidate of every slot.
    reference : callable
        ``reference(ids)`` -> float64 block outputs per layer (the standard forward pass).
    """
    began = time.perf_counter()
    layers = sorted(set(int(layer) for layer in layers))
    last = max(layers)
    screen = ScreeningModel(model)
    original32 = [np.asarray(o, dtype=np.float32) for o in original_outputs]
    choice = list(start) if start is not None else [int(c[0]) for c in candidates]
    scored: dict = {}   # choice tuple -> per-layer screening cost
    evaluated = 0
    for _sweep in range(1 if len(slots) == 1 else max(1, sweeps)):
        for position, options in enumerate(candidates):
            trial = []
            for word in options:
                option = list(choice)
                option[position] = int(word)
                trial.append(tuple(option))
            fresh = [t for t in trial if t not in scored]
            for begin in range(0, len(fresh), batch):
                chunk = fresh[begin:begin + batch]
                ids = np.array([make_ids(t) for t in chunk])
                outputs = screen.block_outputs(ids, last)
                costs = np.stack([coupling_cost(original32[l], outputs[l], pairs, weights) for l in layers], axis=1)
                for t, c in zip(chunk, costs):
                    scored[t] = c
                evaluated += len(chunk)
                if progress is not None:
                    progress(evaluated)
            best = max(trial, key=lambda t: scored[t][-1])
            choice = list(best)
    values, chosen, computed = {}, {}, {}
    keys = list(scored)
    table = np.array([scored[k] for k in keys])
    for column, layer in enumerate(layers):
        order = np.argsort(-table[:, column])[:top]
        best_value, best_ids = -math.inf, None
        for row in order:
            ids = tuple(int(i) for i in make_ids(keys[row]))
            if ids not in computed:
                computed[ids] = reference(list(ids))
            edited = computed[ids][layer]
            value = w1(EmpiricalMeasure.uniform(original_outputs[layer]), EmpiricalMeasure.uniform(edited))
            if value > best_value:
                best_value, best_ids = value, ids
        values[layer], chosen[layer] = best_value, best_ids
    return EditSearch(values, chosen, evaluated, time.perf_counter() - began, exhaustive)
