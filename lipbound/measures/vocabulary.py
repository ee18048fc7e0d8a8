"""The worst edit of a set: every candidate through the model in batches, the largest movement found.

A set of edits -- any vocabulary token at the chosen positions, or inserted at the chosen slots -- is
searched for the edit that moves the attention block outputs ``X + MHA(X)`` of each layer the most in
Wasserstein-1.  One position: every candidate is evaluated (the exact worst case, up to the screening
below).  Several positions: coordinate ascent -- each position in turn takes its best candidate with
the others fixed -- over a shortlist per position.

Screening runs the whole model in float32 on batches of candidates (:class:`ScreeningModel`, a
float32 copy of the weights; BLAS in single precision is about twice as fast; GELU in its tanh form,
within 4.8e-4 of the erf form and a third of its cost) and scores each candidate by the cost of a
fixed coupling (an upper bound on W1).  The best candidates of every layer
are then evaluated again by the float64 forward pass of :mod:`lipbound.numeric.forward` and their exact
W1 is computed (:func:`lipbound.measures.wasserstein.w1`): only these values are reported, so every
reported movement is a real edit's real movement (a witness).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..numeric.model import Model
from .empirical import EmpiricalMeasure
from .wasserstein import w1

__all__ = ["ScreeningModel", "EditSearch", "worst_edits", "coupling_cost"]


class ScreeningModel:
    """A float32 copy of a BERT's weights with a batched forward pass that returns the attention block
    outputs of every layer (for screening candidates only; reported values come from float64)."""

    def __init__(self, model: Model):
        if model.embeddings is None or not model.complete:
            raise AssumptionError("model", "a full checkpoint", "an attention-only model", "load the whole model")
        f = np.float32
        e = model.embeddings
        self.word, self.position, self.type = e.word.astype(f), e.position.astype(f), e.token_type[0].astype(f)
        self.offset = e.position_offset
        self.embedding_norm = (e.norm.gamma.astype(f), e.norm.beta.astype(f), f(e.norm.eps))
        self.layers = []
        for index in range(model.num_layers):
            item = model.layer(index)
            heads = item.heads
            W = np.concatenate([h.W_Q for h in heads] + [h.W_K for h in heads] + [h.V for h in heads], axis=1).astype(f)
            b = np.concatenate([h.b_Q for h in heads] + [h.b_K for h in heads] + [h.b_V for h in heads]).astype(f)
            self.layers.append(dict(
                W=W, b=b, H=len(heads), dk=heads[0].d_k, dv=heads[0].d_v, W_O=item.W_O.astype(f),
                b_O=item.attention.b_O.astype(f), ln_out=(item.ln_out.gamma.astype(f), item.ln_out.beta.astype(f),
                                                          f(item.ln_out.eps)),
                W_1=item.ffn.W_1.astype(f), b_1=item.ffn.b_1.astype(f), W_2=item.ffn.W_2.astype(f),
                b_2=item.ffn.b_2.astype(f), ffn_norm=(item.ffn_norm.gamma.astype(f), item.ffn_norm.beta.astype(f),
                                                      f(item.ffn_norm.eps))))

    @staticmethod
    def _dense(X, W, b):
        """``X W + b`` over the last axis as one matrix product (numpy loops over leading axes otherwise)."""
        return (X.reshape(-1, X.shape[-1]) @ W + b).reshape(X.shape[:-1] + (W.shape[1],))

    @staticmethod
    def _norm(X, parameters):
        gamma, beta, eps = parameters
        centred = X - X.mean(axis=-1, keepdims=True)
        return gamma * centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps) + beta

    @staticmethod
    def _gelu(h):
        """``h Phi(h)`` in the tanh form ``h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))) / 2`` (Hendrycks &
        Gimpel 2016), ``|difference| < 4.8e-4``: it only ranks candidates.  The model description's
        ``gelu_new`` is the same formula, but its numpy float64 constants turn float32 batches into
        float64 and it makes five temporaries: about three times the cost on this hot path."""
        inner = h * h
        inner *= np.float32(0.044715)
        inner += np.float32(1.0)
        inner *= h
        inner *= np.float32(math.sqrt(2 / math.pi))
        np.tanh(inner, out=inner)
        inner += np.float32(1.0)
        inner *= np.float32(0.5)
        return inner * h

    def block_outputs(self, ids: np.ndarray, last: int) -> list[np.ndarray]:
        """``X_l + MHA_l(X_l)`` for layers ``0..last`` of a batch of sentences ``ids`` (B, n)."""
        return self.forward(ids, last)[1]

    def forward(self, ids: np.ndarray, last: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The inputs ``X_l`` and the attention block outputs ``X_l + MHA_l(X_l)`` of layers ``0..last``."""
        B, n = ids.shape
        X = self._norm(self.word[ids] + self.position[self.offset:self.offset + n] + self.type, self.embedding_norm)
        inputs, outputs = [], []
        for index in range(last + 1):
            p = self.layers[index]
            H, dk, dv = p["H"], p["dk"], p["dv"]
            Z = self._dense(X, p["W"], p["b"])
            Q = Z[..., :H * dk].reshape(B, n, H, dk).transpose(0, 2, 1, 3)
            K = Z[..., H * dk:2 * H * dk].reshape(B, n, H, dk).transpose(0, 2, 1, 3)
            V = Z[..., 2 * H * dk:].reshape(B, n, H, dv).transpose(0, 2, 1, 3)
            S = Q @ K.transpose(0, 1, 3, 2) * np.float32(1 / math.sqrt(dk))
            S = np.exp(S - S.max(axis=-1, keepdims=True))
            S /= S.sum(axis=-1, keepdims=True)
            F = (S @ V).transpose(0, 2, 1, 3).reshape(B, n, H * dv)
            block = X + self._dense(F, p["W_O"], p["b_O"])
            inputs.append(X)
            outputs.append(block)
            if index == last:
                break
            Y = self._norm(block, p["ln_out"])
            h = self._dense(Y, p["W_1"], p["b_1"])
            X = self._norm(Y + self._dense(self._gelu(h), p["W_2"], p["b_2"]), p["ffn_norm"])
        return inputs, outputs


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
    for sweep in range(1 if len(slots) == 1 else max(1, sweeps)):
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
