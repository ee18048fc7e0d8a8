"""Compile a SymPy expression into an interval function that encloses it, or refuse.

:func:`compile_interval` walks the expression tree once and builds a function of intervals.
Every node it accepts has a rigorous interval version (:mod:`lipbound.rigorous.functions`,
outward-rounded arithmetic of :data:`~lipbound.rigorous.intervals.IV`); a node it does not
know raises :class:`~lipbound.errors.NotCertifiedError` when compiling, so that nothing is
evaluated by a routine that might not enclose.

Accepted: numbers (integers and rationals enclosed exactly or outward, floats at their exact
binary value, ``pi``, ``E``, ``EulerGamma``), symbols, ``+``, ``*``, powers (integer powers,
square roots, and ``b^e = exp(e log b)`` for ``b > 0``), ``exp``, ``log``, ``Abs``, ``sin``,
``cos``, ``tanh``, ``Min``, ``Max``, ``erf``, ``LambertW`` (principal branch), ``digamma`` and
``polygamma(0, .)``, the functions named in :data:`NAMED_FUNCTIONS` (lipbound's ``kappa``,
``causal_kappa``, ``lambert_level``), and ``Piecewise`` whose conditions are comparisons
joined by ``And``/``Or``/``Not``: a branch whose condition is certainly false is skipped,
one whose condition is certainly true ends the search, and an undecided condition makes the
result the hull of that branch and the rest -- an enclosure whatever the branch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import final

import sympy as sp
from mpmath import libmp

from ..errors import NotCertifiedError
from . import functions as F
from .arrays import IntervalArray, as_interval_array
from .intervals import IV, Verdict, certify_le, hull, interval

__all__ = ["IntervalFunction", "compile_interval", "compile_array", "NAMED_FUNCTIONS"]

#: SymPy function class name -> interval implementation (for functions defined outside SymPy).
NAMED_FUNCTIONS: dict[str, Callable] = {
    "kappa": F.kappa, "causal_kappa": F.causal_kappa, "lambert_level": F.lambert_level,
}

_UNARY = {sp.exp: IV.exp, sp.log: F.log, sp.Abs: abs, sp.sin: IV.sin, sp.cos: IV.cos, sp.tanh: F.tanh, sp.erf: F.erf,
          sp.digamma: F.digamma}


@final
class IntervalFunction:
    """A compiled expression: call it with one interval (or exact number) per symbol.

    Attributes
    ----------
    symbols : tuple of sympy.Symbol
        The argument order.
    expr : sympy.Expr
    """

    def __init__(self, expr: sp.Expr, symbols: Sequence[sp.Symbol], evaluate: Callable):
        self.expr = expr
        self.symbols = tuple(symbols)
        self._evaluate = evaluate

    def __call__(self, *values):
        if len(values) != len(self.symbols):
            raise NotCertifiedError("arguments", f"{len(self.symbols)} values ({', '.join(map(str, self.symbols))})",
                                    f"{len(values)} values", "pass one interval per symbol, in order")
        return interval(self._evaluate(tuple(interval(v) for v in values)))


def compile_interval(expr, symbols: Sequence[sp.Symbol]) -> IntervalFunction:
    """Compile ``expr`` for interval arguments in the order of ``symbols``.

    Raises
    ------
    NotCertifiedError
        A node without a rigorous interval version, or a free symbol not in ``symbols``.
    """
    expr = sp.sympify(expr)
    return IntervalFunction(expr, symbols, _compile(expr, _positions(expr, symbols, "interval")))


def _refuse(node) -> NotCertifiedError:
    return NotCertifiedError(
        "expr", "an expression lipbound can enclose (numbers, +, *, powers, exp, log, Abs, sin, cos, tanh, Min, Max, "
        "erf, "
        "LambertW, digamma, kappa, causal_kappa, lambert_level, Piecewise of comparisons)",
        f"the node {type(node).__name__}: {node}",
        "rewrite the expression with supported functions, or evaluate it without certification (mpmath)")


def _compile(node, positions: dict) -> Callable:
    if node.is_Symbol:
        if node not in positions:
            raise _refuse(node)
        index = positions[node]
        return lambda args: args[index]
    if node.is_Number or isinstance(node, sp.NumberSymbol):
        value = _constant(node)
        return lambda args: value
    if isinstance(node, sp.Add):
        parts = [_compile(a, positions) for a in node.args]
        return lambda args: functools.reduce(lambda s, p: s + p(args), parts[1:], parts[0](args))
    if isinstance(node, sp.Mul):
        parts = [_compile(a, positions) for a in node.args]
        return lambda args: functools.reduce(lambda s, p: s * p(args), parts[1:], parts[0](args))
    if isinstance(node, sp.Pow):
        return _power(node, positions)
    if isinstance(node, (sp.Min, sp.Max)):
        parts = [_compile(a, positions) for a in node.args]
        pick = F.minimum if isinstance(node, sp.Min) else F.maximum
        return lambda args: pick(*[p(args) for p in parts])
    if isinstance(node, sp.Piecewise):
        return _piecewise(node, positions)
    if isinstance(node, sp.LambertW):
        if len(node.args) > 1 and node.args[1] != 0:
            raise _refuse(node)
        inner = _compile(node.args[0], positions)
        return lambda args: F.lambertw(inner(args))
    if isinstance(node, sp.polygamma):
        if node.args[0] != 0:
            raise _refuse(node)
        inner = _compile(node.args[1], positions)
        return lambda args: F.digamma(inner(args))
    for kind, function in _UNARY.items():
        if type(node) is kind:
            inner = _compile(node.args[0], positions)
            return lambda args, f=function: f(inner(args))
    if isinstance(node, sp.Function) and type(node).__name__ in NAMED_FUNCTIONS:
        function = NAMED_FUNCTIONS[type(node).__name__]
        parts = [_compile(a, positions) for a in node.args]
        return lambda args: function(*[p(args) for p in parts])
    raise _refuse(node)


@functools.lru_cache(maxsize=4096)
def _constant(node):
    if node.is_Integer:
        return IV.mpf(int(node))
    if node.is_Rational:
        return IV.mpf(int(node.p)) / IV.mpf(int(node.q))
    if node.is_Float:
        return interval(node)  # its exact binary value
    named = {sp.pi: IV.pi, sp.E: IV.e, sp.EulerGamma: IV.euler}
    if node in named:
        return interval(named[node])
    if node in (sp.oo, -sp.oo, sp.zoo, sp.nan) or not node.is_real:
        raise _refuse(node)
    raise _refuse(node)


def _power(node: sp.Pow, positions: dict) -> Callable:
    base, exponent = node.args
    inner = _compile(base, positions)
    if exponent.is_Integer:
        k = int(exponent)
        if k >= 0:
            return lambda args: inner(args) ** k
        return lambda args: 1 / (inner(args) ** (-k))
    if exponent == sp.Rational(1, 2):
        return lambda args: F.sqrt(inner(args))
    if exponent == -sp.Rational(1, 2):
        return lambda args: 1 / F.sqrt(inner(args))
    if exponent.is_Rational and exponent.q == 2:  # x^(p/2) = sqrt(x)^p
        p = int(exponent.p)
        return (lambda args: F.sqrt(inner(args)) ** p) if p > 0 else (lambda args: 1 / F.sqrt(inner(args)) ** (-p))
    if base == sp.E:
        power = _compile(exponent, positions)
        return lambda args: IV.exp(power(args))
    power = _compile(exponent, positions)

    def general(args):
        b = inner(args)
        if certify_le(b, 0) is not Verdict.FAILS:  # b^e = exp(e log b) needs b > 0 for certain
            raise NotCertifiedError("power base", "a positive number", f"the interval {b}",
                                    "only integer and half-integer powers of possibly non-positive bases are enclosed")
        return IV.exp(power(args) * F.log(b))

    return general


_COMPARISONS = (sp.StrictLessThan, sp.LessThan, sp.StrictGreaterThan, sp.GreaterThan)


def _condition(node, positions: dict) -> Callable:
    """A three-valued condition: ``Verdict`` of the relation on the interval arguments."""
    if node is sp.true:
        return lambda args: Verdict.HOLDS
    if node is sp.false:
        return lambda args: Verdict.FAILS
    if isinstance(node, _COMPARISONS):
        left, right = _compile(node.lhs, positions), _compile(node.rhs, positions)
        strict = isinstance(node, (sp.StrictLessThan, sp.StrictGreaterThan))
        flipped = isinstance(node, (sp.StrictGreaterThan, sp.GreaterThan))

        def compare(args):
            a, b = left(args), right(args)
            if flipped:
                a, b = b, a
            if not strict:  # a <= b
                return certify_le(a, b)
            if certify_le(b, a) is Verdict.HOLDS:  # a < b fails for certain when b <= a
                return Verdict.FAILS
            return Verdict.HOLDS if libmp.mpf_lt(a._mpi_[1], b._mpi_[0]) else Verdict.UNKNOWN

        return compare
    if isinstance(node, (sp.And, sp.Or)):
        parts = [_condition(a, positions) for a in node.args]
        decisive, other = (Verdict.FAILS, Verdict.HOLDS) if isinstance(node, sp.And) else (Verdict.HOLDS, Verdict.FAILS)

        def combine(args):
            verdicts = [p(args) for p in parts]
            if decisive in verdicts:
                return decisive
            return other if all(v is other for v in verdicts) else Verdict.UNKNOWN

        return combine
    if isinstance(node, sp.Not):
        inner = _condition(node.args[0], positions)
        swap = {Verdict.HOLDS: Verdict.FAILS, Verdict.FAILS: Verdict.HOLDS, Verdict.UNKNOWN: Verdict.UNKNOWN}
        return lambda args: swap[inner(args)]
    raise _refuse(node)


def _piecewise(node: sp.Piecewise, positions: dict) -> Callable:
    branches = [(_compile(e, positions), _condition(c, positions)) for e, c in node.args]

    def evaluate(args):
        possible = []
        for value, condition in branches:
            verdict = condition(args)
            if verdict is Verdict.FAILS:
                continue
            possible.append(value(args))
            if verdict is Verdict.HOLDS:
                return hull(*possible)
        if not possible:
            raise NotCertifiedError("Piecewise", "a branch for every argument", "no condition can hold",
                                    "add a final (expr, True) branch")
        raise NotCertifiedError("Piecewise", "a branch certain to apply", "only undecided conditions",
                                "add a final (expr, True) branch")

    return evaluate


def _positions(expr: sp.Expr, symbols: Sequence[sp.Symbol], value: str) -> dict:
    """Each symbol's argument position; every free symbol of ``expr`` must have one."""
    positions = {symbol: i for i, symbol in enumerate(symbols)}
    missing = expr.free_symbols - set(positions)
    if missing:
        raise NotCertifiedError("expr", "symbols that all have a value", f"free symbols {sorted(map(str, missing))}",
                                f"give a value ({value}) for every free symbol")
    return positions


# Arrays ------------------------------------------------------------------------------------------
def compile_array(expr, symbols: Sequence[sp.Symbol]) -> Callable:
    """Compile ``expr`` for :class:`~lipbound.rigorous.arrays.IntervalArray` arguments (broadcast
    together), in the order of ``symbols``: the vectorised twin of :func:`compile_interval`, for a
    closed form evaluated on many data-dependent values at once.

    Accepted: numbers, symbols, ``+``, ``*``, integer powers, square roots and their reciprocals,
    ``exp``, ``Abs``, ``Min``, ``Max``.  Anything else raises :class:`NotCertifiedError` at compile time.
    """
    expr = sp.sympify(expr)
    positions = _positions(expr, symbols, "array")

    def build(node) -> Callable:
        if node.is_Symbol:
            index = positions[node]
            return lambda args: args[index]
        if node.is_Number or isinstance(node, sp.NumberSymbol):
            value = IntervalArray.constant(_constant(node))
            return lambda args: value
        if isinstance(node, (sp.Add, sp.Mul)):
            parts = [build(a) for a in node.args]
            join = (lambda a, b: a + b) if isinstance(node, sp.Add) else (lambda a, b: a * b)
            return lambda args: functools.reduce(lambda s, p: join(s, p(args)), parts[1:], parts[0](args))
        if isinstance(node, sp.Pow):
            base, exponent = node.args
            inner = build(base)
            if exponent.is_Integer and int(exponent) >= 0:
                k = int(exponent)
                if k == 2:
                    return lambda args: inner(args).square()
                return lambda args: functools.reduce(lambda s, _: s * inner(args), range(k - 1), inner(args))
            if exponent.is_Integer:
                positive = build(sp.Pow(base, -exponent))
                return lambda args: positive(args).reciprocal()
            if exponent == sp.Rational(1, 2):
                return lambda args: inner(args).sqrt()
            if exponent == -sp.Rational(1, 2):
                return lambda args: inner(args).sqrt().reciprocal()
            if base == sp.E:
                power = build(exponent)
                return lambda args: power(args).exp()
            raise _refuse(node)
        if isinstance(node, (sp.Min, sp.Max)):
            parts = [build(a) for a in node.args]
            pick = (lambda a, b: a.minimum(b)) if isinstance(node, sp.Min) else (lambda a, b: a.maximum(b))
            return lambda args: functools.reduce(lambda s, p: pick(s, p(args)), parts[1:], parts[0](args))
        if type(node) is sp.Abs:
            inner = build(node.args[0])
            return lambda args: inner(args).abs()
        if type(node) is sp.exp:
            inner = build(node.args[0])
            return lambda args: inner(args).exp()
        raise _refuse(node)

    evaluate = build(expr)

    def call(*values):
        if len(values) != len(symbols):
            raise NotCertifiedError("arguments", f"{len(symbols)} arrays ({', '.join(map(str, symbols))})",
                                    f"{len(values)} arrays", "pass one array per symbol, in order")
        return evaluate(tuple(as_interval_array(v) for v in values))

    return call
