"""The one float engine: a stack of transformer layers as a chain of steps with exact JVPs and VJPs
(numpy; float64, or float32 for screening).

Each step maps the stream ``X`` (b, n, d), and reads the context ``C`` (b, n_c, d) when it is a
cross-attention; tokens are rows, token i of a sequence sits at position i.  A step is

    X -> X + a * N_out(inner(N_in(X)))          (residual),    or    X -> N(X)    (a norm),

with ``inner`` a self-attention of any kernel and mask (grouped-query layers included), a
cross-attention, or a feed-forward block (plain or gated), ``N_in``/``N_out`` optional norms
(LayerNorm or RMSNorm) and ``a`` an optional LayerScale gain.  The steps of one layer:

==========  ==============================================================================
placement   steps
==========  ==============================================================================
post        ``X + a Attn(X)``, ``N_out``, ``Y + f FFN(Y)``, ``N_ffn`` (BERT, MiniLM)
pre         ``X + a Attn(N_in X)``, [``X + Cross(N_c X, C)``], ``X + f FFN(N_ffn X)`` (GPT-2, Whisper, Llama)
sandwich    ``X + a N_out(Attn(N_in X))``, ``X + f N_ffo(FFN(N_ffn X))`` (Gemma 2 and 3)
==========  ==============================================================================

and a pre-norm stack ends with its final norm.  :func:`chain_forward` runs the steps and keeps
their linearizations; :func:`chain_jacobian_norm` estimates the largest singular value of the
Jacobian of the whole chain (or of one step) at a batch of inputs by power iteration, in the
stream, in the context, or in both; its value ``||J E||`` for the returned unit tangent ``E`` is a
lower bound on the Lipschitz constant on any domain holding the input as an interior point of the
set its tangents span.  :func:`hidden_states` and :func:`logits` run whole models from token ids.
The attention engine is :class:`lipbound.numeric.attention.AttentionMap`, the norms
:mod:`lipbound.numeric.normalization`, the activations :mod:`lipbound.numeric.blocks.activations`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import numpy as np

from ...errors import WeightsError
from ..attention import AttentionMap, unit_rows
from ..blocks.activations import activation_maps
from ..model.components import FeedForward, GatedFeedForward, Normalization
from ..model.transformer import Model, TransformerLayer
from ..normalization import NormalizedPoint

__all__ = ["Step", "layer_steps", "stack_steps", "chain_forward", "chain_jacobian_norm", "hidden_states", "logits",
           "STEP_KINDS"]

#: what a step's inner map is
STEP_KINDS = ("attention", "cross", "ffn", "norm")


class _Norm:
    """A norm's parameters in one dtype (cast once)."""

    def __init__(self, norm: Normalization, dtype):
        self.gamma = norm.gamma.astype(dtype, copy=False)
        self.beta = None if not norm.centred else norm.center.astype(dtype, copy=False)
        self.eps, self.d, self.centred = norm.eps, norm.d, norm.centred

    def linearize(self, X) -> NormalizedPoint:
        return NormalizedPoint(X, self.gamma, self.eps, self.d, self.centred, self.beta)


class _FeedForward:
    """A plain or gated feed-forward block's weights in one dtype, linearised at X:
    plain ``phi(X W_1 + b_1) W_2 + b_2``; gated ``(phi(X W_g + b_g) * (X W_u + b_u)) W_d + b_d``."""

    def __init__(self, ffn: FeedForward | GatedFeedForward, dtype):
        self.maps = activation_maps(ffn.act)
        self.gated = isinstance(ffn, GatedFeedForward)
        names = ("W_gate", "b_gate", "W_down", "b_down", "W_up", "b_up") if self.gated else ("W_1", "b_1", "W_2", "b_2")
        self.W_1, self.b_1, self.W_2, self.b_2, *up = (getattr(ffn, name).astype(dtype, copy=False) for name in names)
        self.W_up, self.b_up = up if self.gated else (None, None)

    def linearize(self, X):
        return _FeedForwardPoint(self, X)


def _dense(X, W, b=None):
    """``X W (+ b)`` over the last axis as one matrix product."""
    out = X.reshape(-1, X.shape[-1]) @ W
    if b is not None:
        out += b
    return out.reshape(X.shape[:-1] + (W.shape[1],))


class _FeedForwardPoint:
    """The block at X; its output and the activation's slope are computed when first read (a JVP
    alone does not pay for the output, a forward pass alone not for the slope)."""

    def __init__(self, ffn: _FeedForward, X):
        self.ffn, self.dtype = ffn, X.dtype
        self.z = _dense(X, ffn.W_1, ffn.b_1)
        self.up = _dense(X, ffn.W_up, ffn.b_up) if ffn.gated else None
        self._gate = self._slope = self._F = None

    @property
    def gate(self):
        if self._gate is None:
            self._gate = self.ffn.maps.forward(self.z).astype(self.dtype, copy=False)
        return self._gate

    @property
    def F(self):
        if self._F is None:
            hidden = self.gate * self.up if self.ffn.gated else self.gate
            self._F = _dense(hidden, self.ffn.W_2, self.ffn.b_2)
        return self._F

    @property
    def slope(self):
        if self._slope is None:
            self._slope = self.ffn.maps.slope(self.z).astype(self.dtype, copy=False)
        return self._slope

    def jvp(self, E):
        f = self.ffn
        dz = self.slope * _dense(E, f.W_1)
        if f.gated:
            dz = dz * self.up + self.gate * _dense(E, f.W_up)
        return _dense(dz, f.W_2)

    def vjp(self, G):
        f = self.ffn
        gh = _dense(G, f.W_2.T)
        if not f.gated:
            return _dense(self.slope * gh, f.W_1.T)
        return _dense(gh * self.up * self.slope, f.W_1.T) + _dense(gh * self.gate, f.W_up.T)


@final
@dataclass(frozen=True, eq=False)
class Step:
    """One step of a chain (module docstring).

    Attributes
    ----------
    kind : {"attention", "cross", "ffn", "norm"}
    part : Layer, FeedForward, GatedFeedForward or a norm
    norm : LayerNorm or RMSNorm or None
        The norm the inner map reads (pre and sandwich placements).
    residual : bool
        The input is added back.
    name : str
        Where it sits.
    out_norm : LayerNorm or RMSNorm or None
        The norm on the inner map's output (sandwich placement).
    scale : ndarray (d,) or None
        The LayerScale gain of the branch.
    """

    kind: str
    part: object
    norm: Normalization | None
    residual: bool
    name: str
    out_norm: Normalization | None = None
    scale: np.ndarray | None = None

    def __post_init__(self):
        if self.kind not in STEP_KINDS:
            raise WeightsError("kind", f"one of {STEP_KINDS}", repr(self.kind), "build the steps with layer_steps")

    def prepared(self, dtype) -> tuple:
        """``(inner, norm, out_norm, scale)`` with every weight cast to ``dtype`` (once per step and dtype)."""
        dtype = np.dtype(dtype)
        cache = self.__dict__.setdefault("_prepared", {})
        if dtype not in cache:
            cache[dtype] = self._prepare(dtype)
        return cache[dtype]

    def _prepare(self, dtype) -> tuple:
        if self.kind in ("attention", "cross"):
            inner = AttentionMap(self.part, dtype=dtype)
        elif self.kind == "ffn":
            inner = _FeedForward(self.part, dtype)
        else:
            inner = _Norm(self.part, dtype)
        norm = None if self.norm is None else _Norm(self.norm, dtype)
        out_norm = None if self.out_norm is None else _Norm(self.out_norm, dtype)
        return inner, norm, out_norm, None if self.scale is None else self.scale.astype(dtype, copy=False)

    def linearize(self, X: np.ndarray, C: np.ndarray | None, positions=None) -> _StepLinear:
        return _StepLinear(self, X, C, positions)


class _StepLinear:
    def __init__(self, step: Step, X, C, positions):
        self.step, self.X = step, X
        inner, norm, out_norm, self.scale = step.prepared(X.dtype)
        self.norm = norm.linearize(X) if norm is not None else None
        inner_in = self.norm.F if self.norm is not None else X
        if step.kind == "attention":
            self.inner = inner.linearize(inner_in, positions=positions)
        elif step.kind == "cross":
            self.inner = inner.linearize(C, inner_in, query_positions=positions)  # context C, queries from the stream
        else:
            self.inner = inner.linearize(inner_in)
        self.out_norm = out_norm.linearize(self.inner.F) if out_norm is not None else None
        self._F = None

    @property
    def F(self):
        """The step's output (computed when first read)."""
        if self._F is None:
            branch = self.out_norm.F if self.out_norm is not None else self.inner.F
            if self.scale is not None:
                branch = branch * self.scale
            self._F = branch + self.X if self.step.residual else branch
        return self._F

    def jvp(self, E, EC=None):
        inner_E = self.norm.jvp(E) if self.norm is not None else E
        if self.step.kind == "cross":
            out = self.inner.jvp(np.zeros_like(self.inner.X) if EC is None else EC, inner_E)
        else:
            out = self.inner.jvp(inner_E)
        if self.out_norm is not None:
            out = self.out_norm.jvp(out)
        if self.scale is not None:
            out = out * self.scale
        return out + E if self.step.residual else out

    def vjp(self, G):
        """``(gX, gC)``: gC None unless the step reads the context."""
        gC = None
        branch = G * self.scale if self.scale is not None else G
        if self.out_norm is not None:
            branch = self.out_norm.vjp(branch)
        if self.step.kind == "cross":
            g_inner, gC = self.inner.vjp(branch)
        else:
            g_inner = self.inner.vjp(branch)
        gX = self.norm.vjp(g_inner) if self.norm is not None else g_inner
        return (gX + G if self.step.residual else gX), gC


def _require(where: str, what: str, *parts) -> None:
    if any(part is None for part in parts):
        raise WeightsError(where, what, "a missing part", "load the full checkpoint (not an attention extract)")


def layer_steps(layer: TransformerLayer, block: str) -> list[Step]:
    """The steps of one layer (module docstring); a layer without its feed-forward block or the
    norms its placement states is refused."""
    where = f"{block} layer {layer.index}"
    attention = layer.as_layer(residual=False)
    a, f = layer.attn_scale, layer.ffn_scale
    if layer.placement == "post":
        _require(where, "a post-norm layer with its feed-forward block and both norms", layer.ffn, layer.ln_out,
                 layer.ffn_norm)
        return [Step("attention", attention, None, True, f"{where} attention", scale=a),
                Step("norm", layer.ln_out, None, False, f"{where} attention norm"),
                Step("ffn", layer.ffn, None, True, f"{where} feed-forward", scale=f),
                Step("norm", layer.ffn_norm, None, False, f"{where} output norm")]
    if layer.placement == "pre":
        _require(where, "a pre-norm layer with its feed-forward block and the norm before each sub-block", layer.ffn,
                 layer.ln_in, layer.ffn_norm, *((layer.cross_norm,) if layer.cross is not None else ()))
        steps = [Step("attention", attention, layer.ln_in, True, f"{where} attention", scale=a)]
        if layer.cross is not None:
            steps.append(Step("cross", layer.cross, layer.cross_norm, True, f"{where} cross-attention"))
        steps.append(Step("ffn", layer.ffn, layer.ffn_norm, True, f"{where} feed-forward", scale=f))
        return steps
    _require(where, "a sandwich layer with its feed-forward block and its four norms", layer.ffn, layer.ln_in,
             layer.ln_out, layer.ffn_norm, layer.ffn_out_norm)
    return [Step("attention", attention, layer.ln_in, True, f"{where} attention", out_norm=layer.ln_out, scale=a),
            Step("ffn", layer.ffn, layer.ffn_norm, True, f"{where} feed-forward", out_norm=layer.ffn_out_norm, scale=f)]


def _layer_steps_cached(layer: TransformerLayer, block: str) -> tuple[Step, ...]:
    """The steps of a layer, built once per layer (their prepared weights are reused)."""
    steps = layer.cache.get(("steps", block))
    if steps is None:
        steps = layer.cache[("steps", block)] = tuple(layer_steps(layer, block))
    return steps


def stack_steps(model: Model, block: str, layers=None) -> list[Step]:
    """Every step of a stack, from the input of its first layer to its last hidden state (the
    final norm of a pre-norm stack included when every layer is taken)."""
    stack = model.stack(block)
    indices = sorted(stack) if layers is None else list(layers)
    steps = [step for index in indices for step in _layer_steps_cached(stack[index], block)]
    final = model.final_norm_of(block)
    if final is not None and layers is None:
        steps.append(Step("norm", final, None, False, f"{block} final norm"))
    return steps


def chain_forward(steps: list[Step], X: np.ndarray, C: np.ndarray | None = None, positions=None):
    """The outputs and the linearizations of every step at X (b, n, d) (``positions`` of the
    stream's tokens: default 0..n-1)."""
    X = np.asarray(X)
    if steps and (X.ndim != 3 or X.shape[-1] != steps[0].part.d):
        raise WeightsError("X", f"tokens of shape (batch, n, {steps[0].part.d})", f"shape {X.shape}",
                           "tokens are rows; the last axis is the model width")
    linear = []
    for step in steps:
        linear.append(step.linearize(X, C, positions))
        X = linear[-1].F
    return X, linear


def chain_jacobian_norm(steps: list[Step], X: np.ndarray, C: np.ndarray | None = None, *, argument: str = "stream",
                        tangent: Callable | None = None, iterations: int = 30, seed: int = 0):
    """Largest singular value of the Jacobian of the chain at each input of a batch.

    Parameters
    ----------
    steps : list of Step
    X, C : ndarray
        The stream (b, n, d) and the context (b, n_c, d) of cross-attention steps (or None).
    argument : {"stream", "context"}
        Which input moves.
    tangent : callable, optional
        The orthogonal projector onto the input's tangent directions (e.g. the tangent space of a
        LayerNorm image, :meth:`lipbound.numeric.domains.TokenDomain.tangent_directions`).
    iterations, seed : int
        Power iterations on ``J^T J`` and the seed of the start (a fixed number of steps: the same
        numbers every run).

    Returns
    -------
    (sigma, E)
        ``sigma_b = ||J E_b||`` exactly for the unit tangent ``E_b`` returned.
    """
    _, linear = chain_forward(steps, X, C)
    project = tangent or (lambda E: E)
    moving = X if argument == "stream" else C

    def jvp(E):
        dX = np.zeros_like(X) if argument == "context" else E
        EC = E if argument == "context" else None
        for lin in linear:
            dX = lin.jvp(dX, EC)
        return dX

    def vjp(G):
        gC = np.zeros_like(C) if argument == "context" else None
        for lin in reversed(linear):
            G, g = lin.vjp(G)
            if gC is not None and g is not None:
                gC = gC + g
        return gC if argument == "context" else G

    rng = np.random.default_rng(seed)
    E = unit_rows(project(rng.standard_normal(moving.shape)))
    for _ in range(iterations):
        E = unit_rows(project(vjp(jvp(E))))
    dF = jvp(E)
    return np.sqrt(np.sum(dF * dF, axis=(1, 2))), E


# Whole models from token ids ------------------------------------------------------------------------
def _check_complete(model: Model) -> None:
    if not model.complete:
        raise WeightsError(model.path or model.name, "a full checkpoint (embeddings, every layer, feed-forward blocks)",
                           "an attention-only or partial checkpoint", "load the whole model directory")
    if model.decoder:
        raise WeightsError(model.path or model.name, "an encoder or a decoder-only model",
                           "an encoder-decoder (its decoder reads the encoder's output)",
                           "run the stacks with chain_forward(stack_steps(model, block), X, C)")


def hidden_states(model: Model, ids, dtype=np.float64) -> list[np.ndarray]:
    """``[X_0, X_1, ..., X_L]`` for the token ids of one sentence, each of shape (n, d): ``X_0`` the
    embeddings (after the embedding LayerNorm of a BERT), ``X_l`` the output of layer l (before
    a pre-norm stack's final norm)."""
    _check_complete(model)
    X0 = model.embeddings(ids)
    if model.max_positions is not None and X0.shape[0] > model.max_positions:
        raise WeightsError("sentence", f"at most {model.max_positions} tokens (the model's context)",
                           f"{X0.shape[0]} tokens", "shorten the text or split it into sentences")
    X = X0.astype(dtype, copy=False)[None]
    states = [X[0]]
    block = model.blocks[0]
    for index in range(model.num_layers):
        X, _ = chain_forward(list(_layer_steps_cached(model.layers[index], block)), X)
        states.append(X[0])
    return states


def logits(model: Model, ids, dtype=np.float64) -> np.ndarray:
    """The next-token logits (n, vocab) of a decoder: ``final_norm(X_L) lm_head^T``, soft-capped
    ``c tanh(z / c)`` when the model has ``logit_softcap`` c (Gemma 2)."""
    if model.lm_head is None:
        raise WeightsError(model.path or model.name, "a decoder with its language-model head (lm_head)",
                           "no lm_head", "load the whole checkpoint, or tie the head to the embeddings")
    X = hidden_states(model, ids, dtype)[-1]
    final = model.final_norm_of(model.blocks[0])
    if final is not None:
        X = _Norm(final, X.dtype).linearize(X).F
    out = X @ np.asarray(model.lm_head).astype(X.dtype, copy=False).T
    cap = model.logit_softcap
    return out if cap is None else cap * np.tanh(out / cap)
