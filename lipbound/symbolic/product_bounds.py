r"""Whole-model bounds as products of per-block constants, recomputed with lipbound's rules.

A claim that a model is B-Lipschitz because its blocks are ``c_1, ..., c_k``-Lipschitz is a
composition.  lipbound rebuilds it with the rules of :mod:`lipbound.symbolic.theorems`: each block
is a component known by its constant (:func:`~lipbound.symbolic.theorems.component`), a residual
block ``x + w f(x)`` has the constant ``1 + w c`` (:func:`~lipbound.symbolic.theorems.residual` after
the scaling by w), and blocks applied one after another multiply
(:func:`~lipbound.symbolic.theorems.compose`).  The statement is evaluated in interval arithmetic
(:mod:`lipbound.rigorous`), so "the stated constants compose to at most B" is decided with
outward rounding, and "not certified" when rounding could decide.

* :func:`compose_constants` -- the composed bound of stated per-block constants;
* :func:`uniform_budget` -- the largest constant that k equal blocks (or residual branches) may
  have for the product to stay at most B: ``B^{1/k}`` (``B^{1/k} - 1`` for branches);
* :func:`constrained_layer` -- what lipbound's own theorems give for a layer under stated weight
  constraints: multi-head dot-product attention without biases on tokens of norm at most R with
  ``||A|| <= a`` per head, ``||W_V|| <= v``, ``||W_O|| <= o``, and a feed-forward block with
  ``||W_1||, ||W_2|| <= 1`` and an activation of slope at most ``ell``, each in a residual branch of
  weight w.  The attention theorem needs its domain: without a normalisation in front, the tokens
  a layer reads are not bounded by the previous layer, so the radius is an assumption of the
  caller (a layer reading unit-norm tokens: R = 1).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import final

import sympy as sp

from ..errors import AssumptionError, LipboundError
from ..rigorous.compiler import compile_interval
from ..rigorous.intervals import IV, Verdict, certify_le, interval, lower, upper
from . import symbols as S
from . import theorems as T
from .assumptions import Assumptions, Ball, Frobenius, Unbounded
from .bound import Bound
from .registry import variant

__all__ = ["Composition", "ConstrainedLayer", "compose_constants", "uniform_budget", "constrained_layer",
           "parse_constant"]


def parse_constant(name: str, text) -> object:
    """An interval enclosing a non-negative constant written as a decimal (``"1.5"``, ``"1e264"``) or
    an exact number (int, Fraction, SymPy rational); :class:`AssumptionError` naming ``name`` otherwise."""
    if isinstance(text, Fraction):
        text = sp.Rational(text.numerator, text.denominator)
    try:
        value = interval(text.strip() if isinstance(text, str) else text)
    except (LipboundError, ValueError, TypeError):
        value = None
    if value is None or not (math.isfinite(lower(value)) and math.isfinite(upper(value))):
        raise AssumptionError(name, "a finite non-negative number such as 1.5 or 1e264", repr(text),
                              "write the constant as a decimal number")
    if certify_le(0, value) is not Verdict.HOLDS:
        raise AssumptionError(name, "a non-negative constant", repr(text), "a Lipschitz constant is at least 0")
    return value


@final
@dataclass(frozen=True)
class Composition:
    """Stated per-block constants composed by lipbound's rules.

    Attributes
    ----------
    theorem : Theorem
        The composed statement in the symbols ``c_1, ..., c_k`` (and ``w``), with its proof.
    value : mpmath interval
        The statement at the stated constants, enclosed with outward rounding.
    blocks : int
        Blocks composed (after repeating the list ``layers`` times).
    residual : bool
        Whether each block was a residual branch ``x + w f(x)``.
    """

    theorem: T.Theorem
    value: object
    blocks: int
    residual: bool

    def against(self, claimed) -> Verdict:
        """``HOLDS``: the composition is at most ``claimed`` (the claimed total follows from the stated
        constants); ``FAILS``: it exceeds it; ``UNKNOWN``: rounding could decide."""
        return certify_le(self.value, interval(claimed))


def _branch(inner: T.Theorem) -> T.Theorem:
    """``x + w f(x)``: the residual rule after the scaling by w."""
    weight = T.component("w", "the scaling y -> w y of a residual branch")
    return T.residual(T.compose(weight, inner, title=f"w times {inner.title.lower()}"))


@functools.lru_cache(maxsize=64)
def _composed(count: int, residual: bool) -> tuple[T.Theorem, tuple[sp.Symbol, ...]]:
    chain: T.Theorem | None = None
    symbols = []
    for index in range(1, count + 1):
        block = T.component(f"c_{index}", f"block {index}")
        symbols.append(block.statement)
        if residual:
            block = _branch(block)
        chain = block if chain is None else T.compose(block, chain, title=f"blocks 1 to {index}")
    if residual:
        symbols.append(S.KernelConstant("w"))
    if chain is None:
        raise AssumptionError("constants", "at least one per-block constant", "none", "list the blocks' constants")
    return chain, tuple(symbols)


def compose_constants(constants, *, residual: bool = False, layers: int = 1, weight=1) -> Composition:
    """Compose stated per-block constants (``layers`` repetitions of the list): a plain chain
    ``prod c_i``, or residual branches ``x + w f_i(x)``: ``prod (1 + w c_i)``.

    Parameters
    ----------
    constants : sequence of str or numbers
        Per-block constants (upper bounds on each block's Lipschitz constant), in order.
    residual : bool
        Each constant is the branch f of a residual block ``x + w f(x)``.
    layers : int
        Repeat the list this many times (a list per layer).
    weight : str or number
        The branch weight w (residual blocks only).
    """
    values = [parse_constant("constants", c) for c in constants]
    if not values:
        raise AssumptionError("constants", "at least one per-block constant", "none", "list the blocks' constants")
    if not isinstance(layers, int) or layers < 1:
        raise AssumptionError("layers", "a positive integer", repr(layers), "repeat the list at least once")
    values = values * layers
    theorem, symbols = _composed(len(values), residual)
    arguments = values + ([parse_constant("weight", weight)] if residual else [])
    value = compile_interval(theorem.statement, symbols)(*arguments)
    return Composition(theorem, value, len(values), residual)


def uniform_budget(total, blocks: int, residual: bool = False):
    """The largest constant c that each of ``blocks`` equal blocks may have for the composition to stay
    at most ``total``: ``total^{1/k}``, or ``total^{1/k} - 1`` for residual branches of weight 1
    (an interval; 0 when even identity branches exceed the total)."""
    if not isinstance(blocks, int) or blocks < 1:
        raise AssumptionError("blocks", "a positive integer", repr(blocks), "count the blocks")
    root = IV.exp(IV.log(parse_constant("total", total)) / blocks)
    return IV.mpf([0, 0]) if residual and certify_le(root, 1) is Verdict.HOLDS else (root - 1 if residual else root)


@final
@dataclass(frozen=True)
class ConstrainedLayer:
    """A layer's certified constants under stated weight constraints (intervals), with the theorems."""

    attention: object
    feed_forward: object
    layer: object
    theorem: T.Theorem


def _derived(name: str, assumptions: Assumptions) -> Bound:
    """The built-in variant ``name`` derived under ``assumptions``, which must give a bound."""
    result = variant(name).derive(assumptions, name)
    if not isinstance(result, Bound):
        raise AssumptionError(name, "a Bound", f"{type(result).__name__}: the map is not Lipschitz on its domain",
                              "this is a bug: constrained_layer derives on domains where the theorems hold")
    return result


def constrained_layer(*, heads: int, n: int, score_norm, radius=1, value_norm=1, output_norm=1, slope=1,
                      weight=1) -> ConstrainedLayer:
    """lipbound's constant of one layer ``x -> (x + w MHA(x)) -> (. + w FFN(.))`` under the constraints
    of the module docstring, in the Frobenius norm, each block from its own theorem."""
    head = _derived("dot-product-nobias", Assumptions(domain=Ball(), norm=Frobenius()))
    attention = T.multi_head(T.Theorem(head.theorem, "Self-attention", head.expr, head.record), Frobenius())
    ffn = _derived("feed-forward", Assumptions(domain=Unbounded()))
    ffn_theorem = T.Theorem(ffn.theorem, "Feed-forward block", ffn.expr, ffn.record)
    layer = T.compose(_branch(ffn_theorem), _branch(attention), title="A layer with residual branches")
    values = {"A": score_norm, "W_V": value_norm, "W_O": output_norm, "R": radius, "n": n, "H": heads,
              "W_1": 1, "W_2": 1, "ell_phi": slope, "w": weight}

    def evaluate(expr):
        symbols = sorted(expr.free_symbols, key=str)
        missing = [str(s) for s in symbols if str(s) not in values]
        if missing:
            raise AssumptionError("constraints", "a value for every symbol of the layer's theorem",
                                  f"none for {missing}",
                                  "this is a bug: the theorems gained a symbol constrained_layer does not set")
        return compile_interval(expr, symbols)(*[parse_constant(str(s), values[str(s)]) for s in symbols])

    return ConstrainedLayer(evaluate(attention.statement), evaluate(ffn_theorem.statement),
                            evaluate(layer.statement), layer)
