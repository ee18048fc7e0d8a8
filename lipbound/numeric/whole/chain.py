"""A stack of transformer layers as a chain of steps with exact JVPs and VJPs (numpy, float64).

Each step maps the stream ``X`` (b, n, d), and reads the context ``C`` (b, n_c, d) when it is a
cross-attention; tokens are rows.  The steps, for one layer:

==========  ==============================================================================
placement   steps
==========  ==============================================================================
post-LN     ``X + Attn(X)``, ``LN_att``, ``Y + FFN(Y)``, ``LN_out`` (BERT, MiniLM)
pre-LN      ``X + Attn(LN_1 X)``, [``X + Cross(LN_2 X, C)``], ``X + FFN(LN_3 X)`` (Whisper)
==========  ==============================================================================

and a pre-LN stack ends with its final LayerNorm.  :func:`chain_jacobian_norm` estimates the
largest singular value of the Jacobian of the whole chain (or of one step) at a batch of inputs by
power iteration, in the stream, in the context, or in both; its value ``||J E||`` for the returned
unit tangent ``E`` is a lower bound on the Lipschitz constant on any domain holding the input as
an interior point of the set its tangents span.  The attention engine is
:class:`lipbound.numeric.attention.AttentionMap`; the normalisation and feed-forward maps are
those of :mod:`lipbound.numeric.model.components`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, final

import numpy as np

from ...errors import WeightsError
from ..attention import AttentionMap, unit_rows
from ..blocks.activations import activation_maps
from ..model import LayerNorm
from ..model.components import FeedForward
from ..model.transformer import Model, TransformerLayer

__all__ = ["Step", "layer_steps", "stack_steps", "chain_forward", "chain_jacobian_norm"]


class _NormLinear:
    """``LN`` at X: ``J e = gamma (P e - c (c . P e) / (d s^2)) / s`` per token, ``c = P x``."""

    def __init__(self, norm: LayerNorm, X: np.ndarray):
        self.gamma, d = norm.gamma, norm.d
        self.c = X - X.mean(axis=-1, keepdims=True)
        self.s2 = (self.c ** 2).mean(axis=-1, keepdims=True) + norm.eps
        self.s, self.d = np.sqrt(self.s2), d
        self.F = self.gamma * self.c / self.s + norm.beta

    def jvp(self, E):
        P = E - E.mean(axis=-1, keepdims=True)
        return self.gamma * (P - self.c * np.sum(self.c * P, axis=-1, keepdims=True) / (self.d * self.s2)) / self.s

    def vjp(self, G):
        h = self.gamma * G
        t = (h - self.c * np.sum(self.c * h, axis=-1, keepdims=True) / (self.d * self.s2)) / self.s
        return t - t.mean(axis=-1, keepdims=True)


class _FeedForwardLinear:
    """``phi(X W_1 + b_1) W_2 + b_2`` at X; derivative ``(phi'(z) o (E W_1)) W_2``."""

    def __init__(self, ffn: FeedForward, X: np.ndarray):
        maps = activation_maps(ffn.act)
        z = X @ ffn.W_1 + ffn.b_1
        self.W_1, self.W_2, self.slope = ffn.W_1, ffn.W_2, maps.slope(z)
        self.F = maps.forward(z) @ ffn.W_2 + ffn.b_2

    def jvp(self, E):
        return (self.slope * (E @ self.W_1)) @ self.W_2

    def vjp(self, G):
        return (self.slope * (G @ self.W_2.T)) @ self.W_1.T


@final
@dataclass(frozen=True)
class Step:
    """One step of a chain: ``kind`` in attention, cross, ffn, norm; ``norm`` the LayerNorm read
    before the inner map of a pre-LN residual step (None: post-LN or a plain norm step);
    ``residual`` whether the input is added back; ``name`` where it sits."""

    kind: str
    part: object
    norm: LayerNorm | None
    residual: bool
    name: str

    def linearize(self, X: np.ndarray, C: np.ndarray | None) -> "_StepLinear":
        return _StepLinear(self, X, C)


class _StepLinear:
    def __init__(self, step: Step, X, C):
        self.step = step
        self.norm = _NormLinear(step.norm, X) if step.norm is not None else None
        inner_in = self.norm.F if self.norm is not None else X
        if step.kind == "norm":
            self.inner = _NormLinear(step.part, inner_in)
        elif step.kind == "ffn":
            self.inner = _FeedForwardLinear(step.part, inner_in)
        elif step.kind == "attention":
            self.inner = AttentionMap(step.part).linearize(inner_in)
        else:
            self.inner = AttentionMap(step.part).linearize(C, inner_in)  # context C, queries from the stream
        self.F = self.inner.F + X if step.residual else self.inner.F

    def jvp(self, E, EC=None):
        inner_E = self.norm.jvp(E) if self.norm is not None else E
        if self.step.kind == "cross":
            out = self.inner.jvp(np.zeros_like(self.inner.X) if EC is None else EC, inner_E)
        else:
            out = self.inner.jvp(inner_E)
        return out + E if self.step.residual else out

    def vjp(self, G):
        """``(gX, gC)``: gC None unless the step reads the context."""
        gC = None
        if self.step.kind == "cross":
            g_inner, gC = self.inner.vjp(G)
        else:
            g_inner = self.inner.vjp(G)
        gX = self.norm.vjp(g_inner) if self.norm is not None else g_inner
        return (gX + G if self.step.residual else gX), gC


def layer_steps(layer: TransformerLayer, block: str) -> list[Step]:
    """The steps of one layer (module docstring); a layer without its feed-forward block and norms
    is refused."""
    where = f"{block} layer {layer.index}"
    if layer.ffn is None or layer.ffn_norm is None:
        raise WeightsError(where, "a layer with its feed-forward block and LayerNorms", "attention weights only",
                           "load the full checkpoint (not an attention extract)")
    attention = layer.as_layer(residual=False)
    if layer.placement == "post":
        if layer.ln_out is None or layer.cross is not None:
            raise WeightsError(where, "a post-LN encoder layer with its attention LayerNorm",
                               "a post-LN layer without it, or with cross-attention", "load the full checkpoint")
        return [Step("attention", attention, None, True, f"{where} attention"),
                Step("norm", layer.ln_out, None, False, f"{where} attention LayerNorm"),
                Step("ffn", layer.ffn, None, True, f"{where} feed-forward"),
                Step("norm", layer.ffn_norm, None, False, f"{where} output LayerNorm")]
    if layer.ln_in is None or (layer.cross is not None and layer.cross_norm is None):
        raise WeightsError(where, "a pre-LN layer with the LayerNorm before each sub-block", "a missing LayerNorm",
                           "load the full checkpoint")
    steps = [Step("attention", attention, layer.ln_in, True, f"{where} attention")]
    if layer.cross is not None:
        steps.append(Step("cross", layer.cross, layer.cross_norm, True, f"{where} cross-attention"))
    steps.append(Step("ffn", layer.ffn, layer.ffn_norm, True, f"{where} feed-forward"))
    return steps


def stack_steps(model: Model, block: str, layers=None) -> list[Step]:
    """Every step of a stack, from the input of its first layer to its last hidden state (the
    final LayerNorm of a pre-LN stack included when every layer is taken)."""
    stack = model.stack(block)
    indices = sorted(stack) if layers is None else list(layers)
    steps = [step for index in indices for step in layer_steps(stack[index], block)]
    final = model.final_norm_of(block)
    if final is not None and layers is None:
        steps.append(Step("norm", final, None, False, f"{block} final LayerNorm"))
    return steps


def chain_forward(steps: list[Step], X: np.ndarray, C: np.ndarray | None = None):
    """The outputs and the linearizations of every step at X (b, n, d)."""
    linear = []
    for step in steps:
        linear.append(step.linearize(X, C))
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
