"""Chains of components: a head, an attention layer, a transformer block, a stack of blocks.

A :class:`Component` is one map of a post-LN BERT layer (Devlin et al. 2019)::

    Z = X + Attn(X),   Y = LN_att(Z),   X' = LN_out(Y + FFN(Y))

-- ``"head"`` (one head), ``"attention"`` (the layer's heads and W_O with the residual),
``"layernorm"``, ``"feedforward"`` (``y + FFN(y)``) -- evaluated three ways: rigorously at a point
(:mod:`lipbound.local.enclosed`), on token balls (:mod:`lipbound.local.bounds`), and in float64
with JVPs and VJPs for witnesses (a step of the one float engine, :mod:`lipbound.numeric.whole.chain`).
:func:`chain_for` builds the chain a user names: ``head``, ``layer`` (attention with residual),
``block`` (the whole layer) or ``stack`` (several whole layers).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import final

import numpy as np
from ..errors import AssumptionError
from ..numeric.model import Layer, Model
from ..numeric.whole.chain import Step
from ..rigorous.arrays import IntervalArray
from .balls import TokenBalls
from .bounds import LocalBounds, attention_bounds, feedforward_bounds, layernorm_bounds
from .enclosed import EnclosedAttention, EnclosedFeedForward, EnclosedLayerNorm

__all__ = ["Component", "KINDS", "chain_for", "chain_forward", "chain_jvp", "chain_vjp", "product_upper",
           "telescoped_variation"]

#: what a user can ask a local constant of
KINDS = {"head": "one attention head", "layer": "the attention layer with its residual, X + MHA(X)",
         "block": "the whole transformer layer: LN(Z + FFN(Z)), Z = LN(X + MHA(X))",
         "stack": "several whole layers, one after the other"}


@final
@dataclass(frozen=True, eq=False)
class Component:
    """One map of a chain: ``kind`` in {"head", "attention", "layernorm", "feedforward"}."""

    kind: str
    target: object
    name: str

    def enclose(self, X):
        if self.kind in ("head", "attention"):
            return EnclosedAttention(self.target, X)
        if self.kind == "layernorm":
            return EnclosedLayerNorm(self.target, X)
        return EnclosedFeedForward(self.target, X)

    def bounds(self, balls: TokenBalls, enclosed=None, want_blocks: bool = True) -> LocalBounds:
        if self.kind in ("head", "attention"):
            return attention_bounds(self.target, balls, enclosed, want_blocks=want_blocks)
        if self.kind == "layernorm":
            return layernorm_bounds(self.target, balls, enclosed)
        return feedforward_bounds(self.target, balls, enclosed, want_variation=want_blocks)

    def jacobian(self, enclosed) -> IntervalArray:
        """The dense Jacobian at the enclosed point, row convention ``(n d_in, n d_out)``."""
        if self.kind in ("head", "attention"):
            return enclosed.jacobian()
        n, d = enclosed.output.shape
        lo, hi = np.zeros((n * d, n * d)), np.zeros((n * d, n * d))
        for i in range(n):
            block = enclosed.jacobian_block(i)
            lo[i * d:(i + 1) * d, i * d:(i + 1) * d] = block.lo
            hi[i * d:(i + 1) * d, i * d:(i + 1) * d] = block.hi
        return IntervalArray(lo, hi)

    # float64, batched (b, n, d): the one float engine ------------------------------------------------
    @functools.cached_property
    def step(self) -> Step:
        """This map as a step of :mod:`lipbound.numeric.whole.chain` (a residual attention layer and
        ``y + FFN(y)`` as residual steps)."""
        if self.kind == "head":
            return Step("attention", self.target, None, False, self.name)
        if self.kind == "attention":
            layer = self.target
            inner = Layer(layer.heads, layer.W_O, layer.b_O, groups=layer.groups)
            return Step("attention", inner, None, bool(layer.residual), self.name)
        if self.kind == "layernorm":
            return Step("norm", self.target, None, False, self.name)
        return Step("ffn", self.target, None, True, self.name)

    def forward(self, X: np.ndarray) -> np.ndarray:
        return self.step.linearize(X, None).F

    def jvp(self, X: np.ndarray, E: np.ndarray) -> np.ndarray:
        return self.step.linearize(X, None).jvp(E)

    def vjp(self, X: np.ndarray, G: np.ndarray) -> np.ndarray:
        return self.step.linearize(X, None).vjp(G)[0]


def chain_for(model: Model, kind: str, layer: int, head: int | None = None, last: int | None = None) -> list[Component]:
    """The chain a user names (layers and heads counted from 0).

    ``head``: head ``head`` of ``layer``; ``layer``: the attention layer with its residual;
    ``block``: the whole layer; ``stack``: whole layers ``layer..last``.
    """
    if kind not in KINDS:
        raise AssumptionError("--kind", f"one of {', '.join(KINDS)}", repr(kind), "e.g. --kind layer")
    if kind == "head":
        if head is None:
            raise AssumptionError("--head", "a head index (counted from 0) for --kind head", "none", "pass --head 0")
        return [Component("head", model.head(layer, head), f"layer {layer} head {head}")]
    if kind == "layer":
        return [Component("attention", model.layer(layer).as_layer(residual=True), f"layer {layer} attention")]
    last = layer if kind == "block" or last is None else last
    if last < layer:
        raise AssumptionError("--last", f"a layer at least {layer}", repr(last), f"pass --last {layer} or more")
    chain = []
    for index in range(layer, last + 1):
        item = model.layer(index)
        if item.ffn is None or item.ln_out is None or item.ffn_norm is None or item.placement != "post":
            raise AssumptionError("--kind", "a post-LN layer with its feed-forward block (a full BERT checkpoint)",
                                  f"layer {index} without them", "load the full model, or use --kind layer")
        chain += [Component("attention", item.as_layer(residual=True), f"layer {index} attention"),
                  Component("layernorm", item.ln_out, f"layer {index} attention LayerNorm"),
                  Component("feedforward", item.ffn, f"layer {index} feed-forward"),
                  Component("layernorm", item.ffn_norm, f"layer {index} output LayerNorm")]
    return chain


def chain_forward(chain: list[Component], X: np.ndarray) -> list[np.ndarray]:
    """``[X_1 = X, X_2, ..., X_{m+1}]`` (float, batched)."""
    states = [X]
    for component in chain:
        states.append(component.forward(states[-1]))
    return states


def chain_jvp(chain: list[Component], states: list[np.ndarray], E: np.ndarray) -> np.ndarray:
    for component, X in zip(chain, states):
        E = component.jvp(X, E)
    return E


def chain_vjp(chain: list[Component], states: list[np.ndarray], G: np.ndarray) -> np.ndarray:
    for component, X in zip(reversed(chain), reversed(states[:len(chain)])):
        G = component.vjp(X, G)
    return G


def product_upper(*matrices: np.ndarray) -> np.ndarray:
    """Upper bound on the product of non-negative matrices (each rounding covered)."""
    out = matrices[0]
    for M in matrices[1:]:
        out = IntervalArray(out).einsum("ij,jk->ik", IntervalArray(M)).hi
    return out


def telescoped_variation(M: list, V: list, N: list, columns: np.ndarray) -> np.ndarray:
    """``sum_k (M_m ... M_{k+1}) V_k (N_{k-1} ... N_1)`` for matrices of per-token block norms (theorem
    local-chain), the first map's inputs restricted to ``columns``: an upper bound, entry by entry, on the
    block norms of ``DF(Y) - DF(X)`` over the balls the bounds M, V hold on."""
    n = V[0].shape[0]
    total = np.zeros((n, columns.size))
    for k in range(len(V)):
        right = product_upper(*reversed(N[:k]))[:, columns] if k else np.eye(n)[:, columns]
        left = product_upper(*reversed(M[k + 1:])) if k + 1 < len(V) else np.eye(n)
        total = (IntervalArray(total) + IntervalArray(product_upper(left, V[k], right))).hi
    return total
