"""Interventions on a copy of a model's weights: each is a small frozen description that builds a new
:class:`~lipbound.numeric.model.Model` (the loaded description is never changed).

=====================  ================================================================================
intervention           the edited weights (layer ``l``, head ``h``; tokens are rows)
=====================  ================================================================================
``temperature``        ``W_Q, b_Q`` times ``t``: every score of the head divided by the temperature ``1/t``
``spectral-cap``       the singular values of ``W_Q W_K^T`` clipped at ``cap``, by a map ``T`` of the key
                       space: ``W_K T``, ``b_K T`` (``W_Q`` and the query bias untouched)
``rotary-cap``         a rotary head: the singular values of ``W_Q`` clipped at ``cap / ||W_K||``, so that
                       every offset matrix ``A_Delta = W_Q R(Delta theta) W_K^T`` (``R`` orthogonal) has
                       ``||A_Delta|| <= ||W_Q'|| ||W_K|| <= cap``; the keys untouched (they are shared by
                       the query heads of a group)
``qk-norm``            every head's score of layer ``l`` becomes ``tau q.k / (N(q) N(k))``,
                       ``N(u) = sqrt(||u||^2 + eps)``: QK-norm with a scalar gain ``g``,
                       ``rms(u) = g u / sqrt(||u||^2/d_k + eps/d_k)``, is exactly this score with
                       ``tau = g^2 sqrt(d_k)`` (the cosine kernel, whose theorem lipbound has); ``tau``
                       is fitted to keep the logits' scale
``l2-tied``            every head of layer ``l`` scores ``-||q - k||^2 / sqrt(d_k)`` with ``W_K = W_Q``,
                       ``b_K = b_Q`` (L2 attention with tied weights, Kim et al. 2021)
``norm-eps``           every LayerNorm's or RMSNorm's ``eps`` raised to at least ``eps`` (the constant
                       ``||diag(gamma) P|| / sqrt(eps)`` of a norm falls as ``eps`` grows)
``remove-head``        the head's values replaced by their mean over the text (``W_V = 0``, ``b_V`` the
                       mean value): its output no longer depends on the input (mean ablation); in a layer
                       with grouped keys and values (whose heads share ``W_V``) the head's block ``W_O^h``
                       of the output projection is zeroed instead and ``m W_O^h`` added to ``b_O``
                       (``m`` the mean value; none given: zero ablation)
``embeddings``         the word embeddings of chosen tokens moved towards the mean embedding,
                       ``e_v <- mu + s (e_v - mu)``
``layer-temperature``  ``temperature`` on every head of the chosen layers (none chosen: of every layer)
``layer-rotary-cap``   ``rotary-cap`` on every head of the chosen layers (none: every layer) at the
                       ``q``-quantile of that layer's bounds ``||W_Q^h|| ||W_K^h||`` on its offset
                       matrices: the heads above it are capped to it, the others untouched
=====================  ================================================================================

A whole-model bound is a product over layers of residual rules ``1 + L_A L_N`` whose ``L_A`` sums
(or couples) the bounds of all the heads of the layer: an edit of one head moves it little, an edit of
every head of a layer (or of every layer) moves each factor.  The certified rotary bounds scale with
the offset matrices, so ``layer-temperature`` ``t`` multiplies each layer's score terms by ``t``.

The two new scores change every head of a layer: the one attention engine evaluates a layer's heads
together, with one kernel; they are refused on a layer with rotary (positional) scores, whose
positions they would drop.  Temperature is exact on a rotary head too (every offset matrix
``A_Delta`` is linear in ``W_Q``).  No retraining: the function of the edited weights is measured as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..errors import AssumptionError
from ..numeric.kernels import L2Distance, ScaledCosine
from ..numeric.model import Head, Model
from ..numeric.normalization import Normalization

__all__ = [
    "Intervention",
    "LayerRotaryCap",
    "LayerTemperature",
    "NormEpsilon",
    "QKNormGain",
    "RecentreEmbeddings",
    "RemoveHead",
    "RotaryCap",
    "SpectralCap",
    "Temperature",
    "TiedL2",
    "qk_spectrum",
    "rotary_bound",
    "with_head",
]


def _check_head(model: Model, layer: int, head: int) -> None:
    if layer not in model.layers:
        raise AssumptionError("layer", f"a layer of the model in 0..{model.num_layers - 1}", repr(layer), "pass e.g. 0")
    if not 0 <= head < model.num_heads:
        raise AssumptionError("head", f"a head in 0..{model.num_heads - 1}", repr(head), "pass e.g. 0")


def with_head(model: Model, layer: int, head: int, new: Head) -> Model:
    """A copy of ``model`` whose head ``head`` of layer ``layer`` is ``new``."""
    old = model.layers[layer]
    heads = tuple(new if i == head else h for i, h in enumerate(old.attention.heads))
    layers = dict(model.layers)
    layers[layer] = replace(old, attention=replace(old.attention, heads=heads))
    return replace(model, layers=layers, path="", sha256="", metadata=dict(model.metadata))


def qk_spectrum(head: Head) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(R, U, s)`` with ``W_Q = P R`` (QR) and ``R W_K^T = U diag(s) V^T``: the singular values ``s``
    of ``W_Q W_K^T = (P U) diag(s) V^T``."""
    _, R = np.linalg.qr(head.W_Q)
    U, s, _ = np.linalg.svd(R @ head.W_K.T, full_matrices=False)
    return R, U, s


@dataclass(frozen=True)
class Intervention:
    """Base: ``name`` (its kind), ``target`` (where), :meth:`apply` (the edited copy)."""

    kind: ClassVar[str] = ""

    @property
    def target(self) -> str:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return f"{self.kind} {self.parameter}".strip()

    @property
    def parameter(self) -> str:
        return ""

    @property
    def layers(self) -> tuple[int, ...] | None:
        """The layers whose weights change (None: every layer, or the embeddings)."""
        return (self.layer,) if hasattr(self, "layer") else None

    def apply(self, model: Model) -> Model:
        raise NotImplementedError


@dataclass(frozen=True)
class _HeadIntervention(Intervention):
    layer: int
    head: int

    @property
    def target(self) -> str:
        return f"layer {self.layer} head {self.head}"

    def apply(self, model: Model) -> Model:
        _check_head(model, self.layer, self.head)
        return with_head(model, self.layer, self.head, self.edit(model.layers[self.layer].heads[self.head]))

    def edit(self, head: Head) -> Head:
        raise NotImplementedError


@dataclass(frozen=True)
class Temperature(_HeadIntervention):
    """``W_Q, b_Q`` times ``factor`` (0 < factor)."""

    factor: float = 0.5
    kind: ClassVar[str] = "temperature"

    @property
    def parameter(self) -> str:
        return f"x{self.factor:g}"

    def edit(self, head: Head) -> Head:
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise AssumptionError("factor", "a positive finite factor of W_Q", repr(self.factor), "pass e.g. 0.5")
        return replace(head, W_Q=head.W_Q * self.factor, b_Q=head.b_Q * self.factor)


@dataclass(frozen=True)
class _Cap(_HeadIntervention):
    """A cap on a head's score matrices; :meth:`checked` refuses a cap that is not a positive number
    and a head of the other kind (rotary or not)."""

    cap: float = 1.0
    rotary: ClassVar[bool] = False

    @property
    def parameter(self) -> str:
        return f"{self.cap:.4g}"

    def checked(self, head: Head) -> Head:
        if not (math.isfinite(self.cap) and self.cap > 0):
            raise AssumptionError("cap", "a positive spectral norm of the score matrices", repr(self.cap),
                                  "pass e.g. 10")
        if head.kernel.positional != self.rotary:
            other = "rotary-cap" if head.kernel.positional else "spectral-cap"
            raise AssumptionError("head", f"a head {'with' if self.rotary else 'without'} a rotary score",
                                  head.kernel.describe(), f"use {other}")
        return head


@dataclass(frozen=True)
class SpectralCap(_Cap):
    """The singular values of ``W_Q W_K^T`` clipped at ``cap``, through the keys: ``W_K T``, ``b_K T`` with
    ``T = R^T U diag(min(s, cap) / s) U^T R^{-T}`` (:func:`qk_spectrum`), so that
    ``W_Q (W_K T)^T = P U diag(min(s, cap)) V^T``."""

    kind: ClassVar[str] = "spectral-cap"

    def edit(self, head: Head) -> Head:
        R, U, s = qk_spectrum(self.checked(head))
        if np.linalg.cond(R) > 1e8:
            raise AssumptionError("head", "a head whose W_Q has full column rank", f"cond(R) = {np.linalg.cond(R):.3g}",
                                  "cap another head")
        shrink = np.minimum(s, self.cap) / np.where(s > 0, s, 1.0)
        T = R.T @ (U * shrink) @ U.T @ np.linalg.inv(R).T
        return replace(head, W_K=head.W_K @ T, b_K=head.b_K @ T)


@dataclass(frozen=True)
class RotaryCap(_Cap):
    """``W_Q = U diag(s) V^T`` becomes ``U diag(min(s, cap / ||W_K||)) V^T`` (a head without query or
    key bias), so that every offset matrix ``W_Q R(Delta theta) W_K^T`` of the rotary score has spectral
    norm at most ``cap`` (in the units of ``W_Q W_K^T``, without the score's scale)."""

    kind: ClassVar[str] = "rotary-cap"
    rotary: ClassVar[bool] = True

    def edit(self, head: Head) -> Head:
        if self.checked(head).biased:
            raise AssumptionError("head", "a rotary head without query or key bias", "biases",
                                  "cap a head without biases")
        U, s, Vt = np.linalg.svd(head.W_Q, full_matrices=False)
        clip = self.cap / float(np.linalg.norm(head.W_K, 2))
        return replace(head, W_Q=(U * np.minimum(s, clip)) @ Vt)


@dataclass(frozen=True)
class _EveryHead(Intervention):
    """An edit of every head of the layers ``where`` (empty: every layer of the model)."""

    where: tuple = ()

    @property
    def target(self) -> str:
        if not self.where:
            return "every head of every layer"
        return f"every head of layer{'s' if len(self.where) > 1 else ''} {', '.join(map(str, self.where))}"

    @property
    def layers(self) -> tuple[int, ...] | None:
        return tuple(self.where) or None

    def apply(self, model: Model) -> Model:
        for layer in self.where or sorted(model.layers):
            _check_head(model, layer, 0)
            heads = model.layers[layer].heads
            for index, (head, new) in enumerate(zip(heads, self.edits(heads))):
                if new is not head:
                    model = with_head(model, layer, index, new)
        return model

    def edits(self, heads: tuple) -> list[Head]:
        """The edited heads of one layer (a head left as it is: the same object)."""
        raise NotImplementedError


@dataclass(frozen=True)
class LayerTemperature(_EveryHead):
    """:class:`Temperature` ``factor`` on every head of the layers ``where`` (empty: every layer)."""

    factor: float = 0.5
    kind: ClassVar[str] = "layer-temperature"

    @property
    def parameter(self) -> str:
        return f"x{self.factor:g}"

    def edits(self, heads: tuple) -> list[Head]:
        return [Temperature(0, index, self.factor).edit(head) for index, head in enumerate(heads)]


@dataclass(frozen=True)
class LayerRotaryCap(_EveryHead):
    """:class:`RotaryCap` on every rotary head of the layers ``where`` (empty: every layer) at the
    ``quantile`` of that layer's :func:`rotary_bound` over its heads: the heads above it are capped to it."""

    quantile: float = 0.5
    kind: ClassVar[str] = "layer-rotary-cap"

    @property
    def parameter(self) -> str:
        return f"q{self.quantile:g}"

    def edits(self, heads: tuple) -> list[Head]:
        if not 0 <= self.quantile <= 1:
            raise AssumptionError("quantile", "a quantile in [0, 1]", repr(self.quantile), "pass e.g. 0.5")
        bounds = [rotary_bound(head) for head in heads]
        cap = float(np.quantile(bounds, self.quantile))
        return [RotaryCap(0, index, cap).edit(head) if bound > cap else head
                for index, (head, bound) in enumerate(zip(heads, bounds))]


def rotary_bound(head: Head) -> float:
    """``||W_Q|| ||W_K||`` (float): the bound on every offset matrix ``W_Q R(Delta theta) W_K^T`` that
    :class:`RotaryCap` caps."""
    return float(np.linalg.norm(head.W_Q, 2) * np.linalg.norm(head.W_K, 2))


@dataclass(frozen=True)
class _LayerKernel(Intervention):
    """A new score for every head of layer ``layer`` (the one attention engine evaluates the heads of a
    layer together, so they share one kernel)."""

    layer: int

    @property
    def target(self) -> str:
        return f"layer {self.layer} (every head)"

    def apply(self, model: Model) -> Model:
        _check_head(model, self.layer, 0)
        positional = [h.kernel.describe() for h in model.layers[self.layer].heads if h.kernel.positional]
        if positional:
            raise AssumptionError("layer", "a layer whose scores have no positions (the new score would drop them)",
                                  f"layer {self.layer} with {positional[0]}", "edit a layer of an encoder")
        for head in range(model.num_heads):
            model = with_head(model, self.layer, head, self.edit(model.layers[self.layer].heads[head]))
        return model

    def edit(self, head: Head) -> Head:
        raise NotImplementedError


@dataclass(frozen=True)
class QKNormGain(_LayerKernel):
    """The cosine score ``tau q.k / (N(q) N(k))`` in place of the dot product (QK-norm with a scalar gain)."""

    tau: float = 1.0
    eps: float = 1.0
    kind: ClassVar[str] = "qk-norm"

    @property
    def parameter(self) -> str:
        return f"tau {self.tau:.4g}"

    def edit(self, head: Head) -> Head:
        return replace(head, kernel=ScaledCosine(tau=float(self.tau), eps=float(self.eps)))


@dataclass(frozen=True)
class TiedL2(_LayerKernel):
    """L2 attention with ``W_K = W_Q`` and ``b_K = b_Q``."""

    kind: ClassVar[str] = "l2-tied"

    def edit(self, head: Head) -> Head:
        return replace(head, W_K=head.W_Q.copy(), b_K=head.b_Q.copy(), kernel=L2Distance())


@dataclass(frozen=True)
class RemoveHead(_HeadIntervention):
    """The head's values replaced by ``mean_value`` (d_v,): the head's output is constant."""

    mean_value: tuple = ()
    kind: ClassVar[str] = "remove-head"

    def apply(self, model: Model) -> Model:
        _check_head(model, self.layer, self.head)
        old = model.layers[self.layer]
        if old.attention.groups is None:
            return super().apply(model)
        rows = slice(sum(h.d_v for h in old.heads[:self.head]), sum(h.d_v for h in old.heads[:self.head + 1]))
        W_O = np.array(old.attention.W_O, dtype=float)
        b_O = old.attention.b_O + self.mean(old.heads[self.head]) @ W_O[rows]
        W_O[rows] = 0.0
        layers = dict(model.layers)
        layers[self.layer] = replace(old, attention=replace(old.attention, W_O=W_O, b_O=b_O))
        return replace(model, layers=layers, path="", sha256="", metadata=dict(model.metadata))

    def mean(self, head: Head) -> np.ndarray:
        """``mean_value`` as an array (zeros when empty: zero ablation), checked against the head."""
        mean = np.asarray(self.mean_value, dtype=float) if len(self.mean_value) else np.zeros(head.d_v)
        if mean.shape != (head.d_v,):
            raise AssumptionError("mean_value", f"{head.d_v} numbers", str(mean.shape), "pass the mean value vector")
        return mean

    def edit(self, head: Head) -> Head:
        return replace(head, W_V=np.zeros_like(head.W_V), b_V=self.mean(head))


def _norms(model: Model):
    """Every distinct norm object of the model (shared slots counted once)."""
    seen = {}
    for layer in model.layers.values():
        for slot in ("ln_in", "ln_out", "ffn_norm", "ffn_out_norm", "cross_norm"):
            norm = getattr(layer, slot)
            if norm is not None:
                seen[id(norm)] = norm
    for norm in (getattr(model.embeddings, "norm", None), model.final_norm):
        if norm is not None:
            seen[id(norm)] = norm
    return seen


@dataclass(frozen=True)
class NormEpsilon(Intervention):
    """Every LayerNorm's and RMSNorm's ``eps`` raised to ``max(eps, self.eps)`` (shared norms stay shared)."""

    eps: float = 1e-3
    kind: ClassVar[str] = "norm-eps"

    @property
    def target(self) -> str:
        return "every norm"

    @property
    def parameter(self) -> str:
        return f"{self.eps:g}"

    def apply(self, model: Model) -> Model:
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise AssumptionError("eps", "a positive finite norm epsilon", repr(self.eps), "pass e.g. 1e-3")
        new = {key: replace(norm, eps=max(float(norm.eps), float(self.eps))) if isinstance(norm, Normalization)
               else norm for key, norm in _norms(model).items()}

        def swap(norm):
            return None if norm is None else new[id(norm)]

        layers = {index: replace(layer, **{slot: swap(getattr(layer, slot)) for slot in
                                           ("ln_in", "ln_out", "ffn_norm", "ffn_out_norm", "cross_norm")})
                  for index, layer in model.layers.items()}
        embeddings = model.embeddings
        if getattr(embeddings, "norm", None) is not None:
            embeddings = replace(embeddings, norm=swap(embeddings.norm))
        return replace(model, layers=layers, embeddings=embeddings, final_norm=swap(model.final_norm), path="",
                       sha256="", metadata=dict(model.metadata))


@dataclass(frozen=True)
class RecentreEmbeddings(Intervention):
    """``e_v <- mu + scale (e_v - mu)`` for the word embeddings of ``tokens`` (``mu`` the mean row)."""

    tokens: tuple = ()
    scale: float = 0.5
    kind: ClassVar[str] = "embeddings"

    @property
    def target(self) -> str:
        return f"{len(self.tokens)} irregular tokens"

    @property
    def parameter(self) -> str:
        return f"x{self.scale:g} about the mean"

    @property
    def layers(self):
        return ()

    def apply(self, model: Model) -> Model:
        embeddings = model.embeddings
        if embeddings is None:
            raise AssumptionError("model", "a model with word embeddings", "none", "load the whole checkpoint")
        word = np.array(embeddings.word, dtype=float)
        tokens = np.asarray(self.tokens, dtype=int)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= word.shape[0]):
            raise AssumptionError("tokens", f"token ids in 0..{word.shape[0] - 1}", repr(self.tokens), "pass ids")
        mean = word.mean(axis=0)
        word[tokens] = mean + self.scale * (word[tokens] - mean)
        return replace(model, embeddings=replace(embeddings, word=word.astype(embeddings.word.dtype)), path="",
                       sha256="", metadata=dict(model.metadata))
