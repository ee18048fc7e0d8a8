"""Chains of components: a head, an attention layer, a transformer block, a stack of blocks.

A :class:`Component` is one map of a transformer layer -- ``"head"`` (one head), ``"attention"`` (the
layer's heads and W_O, with the residual in a post-norm layer), ``"norm"`` (a LayerNorm or an RMSNorm),
``"feedforward"`` (BERT's ``y + FFN(y)``), ``"gated"`` (a gated block, branch only), ``"scale"`` (a
LayerScale gain) or ``"sublayer"`` (a pre-norm or sandwich sub-layer ``x + a N_out(B(N_in(x)))``, a
:class:`Sublayer`: a branch of the others, with the residual's identity, or without it for a head read
through its norm) -- evaluated three ways: rigorously at a point
(:mod:`lipbound.local.enclosed`, :mod:`lipbound.local.gated`), on token balls (:mod:`lipbound.local.bounds`),
and in float64 with JVPs and VJPs for witnesses (a step of the one float engine,
:mod:`lipbound.numeric.whole.chain`).  :func:`chain_for` builds the chain a user names: ``head``,
``layer`` (the attention sub-layer with its residual), ``block`` (the whole layer) or ``stack`` (several
whole layers), for the post-norm placement of BERT::

    Z = X + Attn(X),   Y = LN_att(Z),   X' = LN_out(Y + FFN(Y))

-- the components attention, norm, feed-forward, norm -- and the pre-norm (Llama) and sandwich
(Gemma) placements, each sub-layer one residual step::

    Z = X + a * [N_out](Attn(N_in X)),   X' = Z + f * [N_ffo](FFN(N_ffn Z)).

A sub-layer's bounds compose its branch by the chain rule (theorem local-residual-step, and
local-chain for longer branches) and add the identity, which does not vary.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..numeric.model import GatedFeedForward, Head, Layer, Model
from ..numeric.whole.chain import Step, layer_steps
from ..rigorous.arrays import IntervalArray, as_interval_array
from ..rigorous.intervals import interval, upper
from ..rigorous.linalg import Enclosure, spectral_norm_upper_large, vector_norm_upper
from ..rigorous.panels import point_product_panels
from .balls import TokenBalls
from .bounds import LocalBounds, NormFold, attention_bounds, feedforward_bounds, norm_bounds
from .enclosed import EnclosedAttention, EnclosedFeedForward, EnclosedNorm
from .gated import EnclosedGatedFeedForward, gated_bounds

__all__ = ["Component", "Sublayer", "KINDS", "PER_TOKEN", "ChainStates", "chain_for", "chain_forward", "chain_jvp",
           "chain_vjp", "product_upper", "telescoped_variation", "right_product", "NormwiseProduct"]

#: what a user can ask a local constant of
KINDS = {"head": "one attention head (after the norm it reads, in a pre-norm layer)",
         "layer": "the attention sub-layer with its residual: X + MHA(X), or X + MHA(N(X)) in a pre-norm layer",
         "block": "the whole transformer layer: LN(Z + FFN(Z)), Z = LN(X + MHA(X)); or Z + FFN(N(Z)), "
                  "Z = X + MHA(N(X)) in a pre-norm layer",
         "stack": "several whole layers, one after the other"}
#: the components that act token by token (block-diagonal Jacobians)
PER_TOKEN = ("norm", "feedforward", "gated", "scale")


@final
@dataclass(frozen=True, eq=False)
class Component:
    """One map of a chain (module docstring)."""

    kind: str
    target: object
    name: str

    def enclose(self, X):
        if self.kind in ("head", "attention"):
            return EnclosedAttention(self.target, X)
        if self.kind == "norm":
            return EnclosedNorm(self.target, X)
        if self.kind == "feedforward":
            return EnclosedFeedForward(self.target, X)
        if self.kind == "gated":
            return EnclosedGatedFeedForward(self.target, X)
        if self.kind == "scale":
            return EnclosedScale(self.target, X)
        return EnclosedSublayer(self.target, X)

    def bounds(self, balls: TokenBalls, enclosed=None, want_blocks: bool = True) -> LocalBounds:
        if self.kind in ("head", "attention"):
            return attention_bounds(self.target, balls, enclosed, want_blocks=want_blocks)
        if self.kind == "norm":
            return norm_bounds(self.target, balls, enclosed)
        if self.kind == "feedforward":
            return feedforward_bounds(self.target, balls, enclosed, want_variation=want_blocks)
        if self.kind == "gated":
            return gated_bounds(self.target, balls, enclosed)
        if self.kind == "scale":
            return _scale_bounds(self.target, balls, enclosed or EnclosedScale(self.target, balls.center))
        return self.target.bounds(balls, enclosed or EnclosedSublayer(self.target, balls.center), want_blocks)

    def jacobian(self, enclosed) -> IntervalArray:
        """The dense Jacobian at the enclosed point, row convention ``(n d_in, n d_out)``."""
        if self.kind in ("head", "attention"):
            return enclosed.jacobian()
        if self.kind == "sublayer":
            J = IntervalArray.from_enclosure(self.target.branch_jacobian(enclosed))
            return J + IntervalArray(np.eye(J.shape[0])) if self.target.identity else J
        n, d = enclosed.output.shape
        lo, hi = np.zeros((n * d, n * d)), np.zeros((n * d, n * d))
        for i in range(n):
            block = enclosed.jacobian_block(i)
            lo[i * d:(i + 1) * d, i * d:(i + 1) * d] = block.lo
            hi[i * d:(i + 1) * d, i * d:(i + 1) * d] = block.hi
        return IntervalArray(lo, hi)

    def jacobian_enclosure(self, enclosed) -> Enclosure:
        """:meth:`jacobian` as midpoint and radius; an attention's formed token by token (no end-point pair of the
        whole matrix beside it)."""
        if self.kind in ("head", "attention"):
            return enclosed.jacobian_enclosure()
        return self.jacobian(enclosed).to_enclosure()

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
        if self.kind == "norm":
            return Step("norm", self.target, None, False, self.name)
        if self.kind == "sublayer":
            return self.target.step
        if self.kind in ("feedforward", "gated"):
            return Step("ffn", self.target, None, self.kind == "feedforward", self.name)
        raise AssumptionError("kind", "a component the float engine runs alone", repr(self.kind),
                              "run a LayerScale gain inside its residual step")

    def forward(self, X: np.ndarray) -> np.ndarray:
        return self.step.linearize(X, None).F


class EnclosedScale:
    """A LayerScale gain ``z -> a * z`` at tokens Z."""

    def __init__(self, gain: np.ndarray, Z):
        self.gain = np.asarray(gain, dtype=np.float64)
        self.output = as_interval_array(Z) * IntervalArray(self.gain)

    def jacobian_block(self, i: int) -> IntervalArray:
        return IntervalArray(np.diag(self.gain))


def _scale_bounds(gain: np.ndarray, balls: TokenBalls, enclosed: EnclosedScale) -> LocalBounds:
    top = float(np.max(np.abs(gain)))
    n = balls.n
    return LocalBounds((IntervalArray(top) * IntervalArray(balls.radii)).hi, top * np.eye(n), np.zeros((n, n)),
                       top * np.eye(n), enclosed.output, {})


@final
@dataclass(frozen=True, eq=False)
class Sublayer:
    """A pre-norm or sandwich sub-layer ``x -> x + a * N_out(B(N_in(x)))`` (module docstring), or its branch alone
    (``identity`` False: a head read through the norm before it).

    Attributes
    ----------
    step : Step
        The float engine's step (its norm, inner map, output norm, gain and residual).
    branch : tuple of Component
        The branch, in order: the norm, the attention (without residual) or the gated block, the output norm
        and the gain when the step has them.
    """

    step: Step
    branch: tuple

    @property
    def identity(self) -> bool:
        return self.step.residual

    @classmethod
    def of(cls, step: Step) -> Sublayer:
        if step.kind == "attention":
            inner = Component("head" if isinstance(step.part, Head) else "attention", step.part,
                              f"{step.name} (branch)")
        elif step.kind == "ffn" and isinstance(step.part, GatedFeedForward):
            inner = Component("gated", step.part, f"{step.name} (branch)")
        else:
            raise AssumptionError("kind", "a pre-norm or sandwich layer of self-attention and a gated feed-forward "
                                  "block (the local theorems' scope)", f"{step.name}: a {step.kind} step of "
                                  f"{type(step.part).__name__}", "use lipbound verify for this layer")
        branch = ([Component("norm", step.norm, f"{step.name} input norm")] if step.norm is not None else []) \
            + [inner] \
            + ([Component("norm", step.out_norm, f"{step.name} output norm")] if step.out_norm is not None else []) \
            + ([Component("scale", step.scale, f"{step.name} LayerScale")] if step.scale is not None else [])
        return cls(step, tuple(branch))

    def bounds(self, balls: TokenBalls, enclosed: EnclosedSublayer, want_blocks: bool = True) -> LocalBounds:
        """The branch's bounds composed (theorem local-residual-step / local-chain), plus the identity.  An
        attention read through a norm takes its score ranges and value shifts through the norm's Jacobians
        (theorem local-score-deviation-normalised)."""
        radii, M, V, N, before = balls.radii, [], [], [], []
        for k, (component, stage) in enumerate(zip(self.branch, enclosed.stages)):
            before.append(radii)
            inner = TokenBalls(stage.input_mid, radii)
            if k == 1 and component.kind in ("head", "attention") and self.branch[0].kind == "norm":
                overrides = enclosed.fold(component).overrides(stage.enclosed, before[0], np.diag(V[0]), radii)
                found = attention_bounds(component.target, inner, stage.enclosed, want_blocks=want_blocks, **overrides)
            else:
                found = component.bounds(inner, stage.enclosed, want_blocks=want_blocks)
            radii = found.movement
            M.append(found.blocks)
            V.append(found.variation)
            N.append(found.at_center)
        n = balls.n
        eye = IntervalArray(np.eye(n) if self.identity else np.zeros((n, n)))
        movement = (IntervalArray(balls.radii) + IntervalArray(radii)).hi if self.identity else radii
        if not want_blocks:
            return LocalBounds(movement, None, None, None, enclosed.output, {})
        blocks = (eye + IntervalArray(product_upper(*reversed(M)))).hi
        at_center = (eye + IntervalArray(product_upper(*reversed(N)))).hi
        variation = telescoped_variation(M, V, N, np.arange(n))
        movement = np.minimum(movement, IntervalArray(blocks).einsum("ij,j->i", IntervalArray(balls.radii)).hi)
        return LocalBounds(movement, blocks, variation, at_center, enclosed.output,
                           {"branch": (M, V, N), "radii": before})

    def branch_jacobian(self, enclosed: EnclosedSublayer):
        """The branch's dense Jacobian at the enclosed point, an Enclosure (n d, n d)."""
        product = None
        for component, stage in zip(self.branch, enclosed.stages):
            product = right_product(product, component, stage.enclosed)
        return product


@final
class _Stage:
    __slots__ = ("enclosed", "input_mid")

    def __init__(self, enclosed, input_mid):
        self.enclosed, self.input_mid = enclosed, input_mid


class EnclosedSublayer:
    """A sub-layer at X: its branch's stages, each enclosed at the enclosure of the one before (so every stage
    holds the exact intermediate point), and ``output = X + branch(X)`` (the branch alone without identity)."""

    def __init__(self, sublayer: Sublayer, X):
        X = as_interval_array(X)
        self.X, self.stages, self._fold = X, [], None
        Z = X
        for component in sublayer.branch:
            enclosed = component.enclose(Z)
            self.stages.append(_Stage(enclosed, Z.mid))
            Z = enclosed.output
        self.output = X + Z if sublayer.identity else Z

    def fold(self, attention: Component) -> NormFold:
        """The norm's Jacobians at the centre against the attention's scores and values (computed once)."""
        if self._fold is None:
            self._fold = NormFold(self.stages[0].enclosed, self.stages[1].enclosed, attention.target)
        return self._fold

    def jacobian_block(self, i: int) -> IntervalArray:
        """``I + (the branch's blocks at token i multiplied)``, for a branch of per-token maps."""
        product = None
        for stage in self.stages:
            block = stage.enclosed.jacobian_block(i)
            product = block if product is None else product.einsum("ab,bc->ac", block)
        return product + IntervalArray(np.eye(product.shape[0]))


def right_product(product, component: Component, enclosed, in_place: bool = False):
    """``product @ DJ`` (an Enclosure; ``product`` None: DJ itself) for a component's Jacobian at the
    enclosed point, the per-token ones block by block (no dense block-diagonal matrix).  ``in_place``: a
    per-token component's product is written over ``product`` (its column panel i is read only for the
    result's panel i), so that no second ``(n d)^2`` pair is formed; the same floats."""
    if component.kind not in PER_TOKEN:
        J = component.jacobian_enclosure(enclosed)
        return J if product is None else product @ J
    n, d = enclosed.output.shape
    blocks = [enclosed.jacobian_block(i).to_enclosure() for i in range(n)]
    if product is None:
        mid, rad = np.zeros((n * d, n * d)), np.zeros((n * d, n * d))
        for i, block in enumerate(blocks):
            mid[i * d:(i + 1) * d, i * d:(i + 1) * d] = block.mid
            rad[i * d:(i + 1) * d, i * d:(i + 1) * d] = block.rad
        return Enclosure._trusted(mid, rad)   # (no copy of the radius: non-negative by construction)
    width = product.shape[1] // n
    if in_place and width == d:
        mid, rad = product.mid, product.rad
    else:
        mid, rad = np.empty((product.shape[0], n * d)), np.empty((product.shape[0], n * d))
    for i, block in enumerate(blocks):
        part = product[:, i * width:(i + 1) * width] @ block
        mid[:, i * d:(i + 1) * d], rad[:, i * d:(i + 1) * d] = part.mid, part.rad
    return Enclosure._trusted(mid, rad)


@final
class NormwiseProduct:
    """The product ``A_1 A_2 ... A_m`` of enclosed matrices (row convention: each factor on the right) kept as a
    float matrix ``P`` and one radius ``r`` with ``||A_1 ... A_k - P_k||_2 <= r_k`` (lemma normwise-product,
    docs/mathematics.md): with ``|A_k - M_k| <= R_k`` entrywise and ``fl(P_(k-1) M_k) +- S_k`` the midpoint-radius
    product of the point ``P_(k-1)`` and the enclosure of ``A_k``,

        r_1 = ||R_1||_F,   r_k = r_(k-1) a_k + ||S_k||_F,   ||A_1 ... A_m||_2 <= ||P_m||_2 + r_m,

    ``a_k >= ||A_k||_2`` certified.  An entrywise radius carried through the product instead grows with the
    absolute values ``|M_k|`` of every factor (1.8e7 against a norm of 8.55 through the 24 maps of six MiniLM
    layers); here only the factors' norms multiply the radius.
    """

    def __init__(self):
        self.mid: np.ndarray | None = None
        self.radius = 0.0
        self._step: float | None = None   # ||S_k||_F of a factor whose norm is not given yet

    def multiply(self, factor: Enclosure, factor_norm: float | None) -> None:
        """``P <- P A`` for ``A`` enclosed by ``factor``, ``factor_norm`` a certified upper bound on ``||A||_2``, or
        None: given by :meth:`settle` before the next factor (so that the factor can go before its norm is known).
        The product is formed by panels of rows (:func:`~lipbound.rigorous.panels.point_product_panels`)."""
        if self._step is not None:
            raise AssumptionError("factor_norm", "the last factor's norm settled", "none", "call settle first")
        if self.mid is None:
            self.mid, self.radius = factor.mid, vector_norm_upper(factor.rad)
            return
        self.mid, self._step = point_product_panels(self.mid, factor)   # encloses P_(k-1) A_k entrywise
        if factor_norm is not None:
            self.settle(factor_norm)

    def settle(self, factor_norm: float) -> None:
        """``r_k = r_(k-1) a_k + ||S_k||_F`` with ``a_k = factor_norm >= ||A_k||_2`` of the last factor (nothing for a
        first factor)."""
        if self._step is not None:
            self.radius = upper(interval(self.radius) * interval(factor_norm) + interval(self._step))
            self._step = None

    def norm_upper(self, estimate: float | None = None) -> float:
        """A certified upper bound on ``||A_1 ... A_m||_2``: ``||P_m||_2`` (one Gram product and one Cholesky
        factorisation, ``estimate`` its float value if known) plus ``r_m``."""
        if self.mid is None or self._step is not None:
            raise AssumptionError("factors", "at least one factor, each norm settled", "none",
                                  "multiply by a factor first, and settle its norm")
        return upper(interval(spectral_norm_upper_large(self.mid, estimate)) + interval(self.radius))


def chain_for(model: Model, kind: str, layer: int, head: int | None = None, last: int | None = None) -> list[Component]:
    """The chain a user names (layers and heads counted from 0; module docstring).

    ``head``: head ``head`` of ``layer`` (after the norm it reads, in a pre-norm or sandwich layer);
    ``layer``: the attention sub-layer with its residual; ``block``: the whole layer; ``stack``: whole
    layers ``layer..last``.
    """
    if kind not in KINDS:
        raise AssumptionError("kind", f"one of {', '.join(KINDS)}", repr(kind), "e.g. `kind` layer")
    item = model.layer(layer)
    if kind == "head":
        if head is None:
            raise AssumptionError("head", "a head index (counted from 0) for `kind` head", "none",
                                  "name one, e.g. `head` 0")
        chosen = model.head(layer, head)
        if item.placement == "post":
            return [Component("head", chosen, f"layer {layer} head {head}")]
        step = Step("attention", chosen, item.ln_in, False, f"layer {layer} head {head}")
        return [_sublayer_component(step)]
    if kind == "layer":
        if item.placement == "post":
            return [Component("attention", item.as_layer(residual=True), f"layer {layer} attention")]
        return [_sublayer_component(_steps(model, item)[0])]
    last = layer if kind == "block" or last is None else last
    if last < layer:
        raise AssumptionError("last", f"a layer at least {layer}", repr(last), f"choose `last` {layer} or more")
    chain = []
    for index in range(layer, last + 1):
        item = model.layer(index)
        if item.placement != "post":
            chain += [_sublayer_component(step) for step in _steps(model, item)]
            continue
        if item.ffn is None or item.ln_out is None or item.ffn_norm is None:
            raise AssumptionError("kind", "a post-LN layer with its feed-forward block (a full BERT checkpoint)",
                                  f"layer {index} without them", "load the full model, or use `kind` layer")
        chain += [Component("attention", item.as_layer(residual=True), f"layer {index} attention"),
                  Component("norm", item.ln_out, f"layer {index} attention LayerNorm"),
                  Component("feedforward", item.ffn, f"layer {index} feed-forward"),
                  Component("norm", item.ffn_norm, f"layer {index} output LayerNorm")]
    return chain


def _steps(model: Model, item) -> list[Step]:
    """The float engine's steps of a pre-norm or sandwich layer (refused without its feed-forward block)."""
    if item.cross is not None:
        raise AssumptionError("layer", "a layer without cross-attention (the local theorems' scope)",
                              f"layer {item.index} of an encoder-decoder", "use lipbound verify for this layer")
    return layer_steps(item, model.blocks[0])


def _sublayer_component(step: Step) -> Component:
    return Component("sublayer", Sublayer.of(step), step.name)


class ChainStates(list):
    """``[X_1 = X, X_2, ..., X_{m+1}]`` with each component's linearization at its input (``linear``), which
    every JVP and VJP at these states reuses: power iteration calls them dozens of times at one point."""

    def __init__(self, states, linear):
        super().__init__(states)
        self.linear = linear


def chain_forward(chain: list[Component], X: np.ndarray) -> ChainStates:
    """``[X_1 = X, X_2, ..., X_{m+1}]`` (float, batched), with the linearizations (:class:`ChainStates`)."""
    states, linear = [X], []
    for component in chain:
        linear.append(component.step.linearize(states[-1], None))
        states.append(linear[-1].F)
    return ChainStates(states, linear)


def chain_jvp(states: ChainStates, E: np.ndarray) -> np.ndarray:
    """The chain's JVP at ``states`` (of :func:`chain_forward`) along E (batched)."""
    for linear in states.linear:
        E = linear.jvp(E)
    return E


def chain_vjp(states: ChainStates, G: np.ndarray) -> np.ndarray:
    """The chain's VJP at ``states`` (of :func:`chain_forward`) of G (batched)."""
    for linear in reversed(states.linear):
        G = linear.vjp(G)[0]
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
