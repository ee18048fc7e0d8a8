"""Leading-order behaviour of bounds, by SymPy limits.

``leading_term(expr, x)`` returns ``c x^k`` with ``expr / (c x^k) -> 1`` as
``x -> oo`` (or ``c`` alone when the limit is finite), after replacing every
``Min``/``Max`` by the argument that eventually wins.  ``dot_product_regimes``
shows the two regimes of the dot-product bound (docs/mathematics.md):
``Theta(sqrt(n))`` for large R, and independence of n as ``||A|| R^2 -> 0``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import final

import mpmath
import sympy as sp
from sympy.core.function import PoleError

from ..errors import AssumptionError
from . import symbols as S

__all__ = ["eventually", "point_limit", "growth_exponent", "leading_term", "Regimes", "dot_product_regimes",
           "Regime", "regime", "regimes"]


def eventually(expr: sp.Expr, variable: sp.Symbol, point=sp.oo) -> sp.Expr:
    """Replace each ``Min``/``Max`` by the argument that wins as ``variable -> point``."""

    def winner(node):
        args = list(node.args)
        best = args[0]
        for other in args[1:]:
            ratio = sp.limit(best / other, variable, point)
            if ratio == 1:
                difference = sp.limit(best - other, variable, point)
                keep_best = difference.is_nonpositive if isinstance(node, sp.Min) else difference.is_nonnegative
            else:
                keep_best = (ratio < 1) if isinstance(node, sp.Min) else (ratio > 1)
            if keep_best is None or keep_best not in (True, False, sp.true, sp.false):
                raise AssumptionError("expr", f"a decidable order of {node} as {variable} -> {point}",
                                      "an undecided comparison", "substitute values for the other symbols")
            best = best if bool(keep_best) else other
        return best

    expr = sp.sympify(expr)
    while expr.has(sp.Min, sp.Max):
        node = next(a for a in sp.preorder_traversal(expr) if isinstance(a, (sp.Min, sp.Max))
                    and not a.args[0].has(sp.Min, sp.Max) and not any(b.has(sp.Min, sp.Max) for b in a.args))
        expr = expr.xreplace({node: winner(node)})
    return expr


def point_limit(expr: sp.Expr, variable: sp.Symbol, point) -> sp.Expr:
    """``lim expr`` as ``variable -> point`` (finite), using continuity of ``Min``/``Max``:
    each is replaced by the ``Min``/``Max`` of its arguments' limits."""
    expr = sp.sympify(expr)
    frozen = {}
    while expr.has(sp.Min, sp.Max):
        node = next(a for a in sp.preorder_traversal(expr) if isinstance(a, (sp.Min, sp.Max))
                    and not any(b.has(sp.Min, sp.Max) for b in a.args))
        dummy = sp.Dummy("m", positive=True)
        frozen[dummy] = node.func(*[sp.limit(a, variable, point) for a in node.args])
        expr = expr.xreplace({node: dummy})
    result = sp.limit(expr, variable, point)
    for dummy, value in reversed(list(frozen.items())):  # a later Min may hold an earlier one's dummy
        result = result.xreplace({dummy: value})
    return result


def growth_exponent(expr: sp.Expr, variable: sp.Symbol, point=sp.oo) -> sp.Expr:
    """``k`` with ``expr = Theta(variable^k)`` as ``variable -> oo`` (``lim log expr / log variable``)."""
    expr = eventually(expr, variable, point)
    return sp.limit(sp.log(expr) / sp.log(variable), variable, point)


def leading_term(expr: sp.Expr, variable: sp.Symbol, point=sp.oo) -> sp.Expr:
    """``c * variable^k`` (``k`` from :func:`growth_exponent`, ``c = lim expr / variable^k``);
    at a finite point, the limit itself."""
    if point != sp.oo:
        return point_limit(expr, variable, point)
    expr = eventually(expr, variable, point)
    k = growth_exponent(expr, variable, point)
    c = sp.simplify(sp.limit(expr / variable ** k, variable, point))
    if c in (0, sp.oo, -sp.oo, sp.nan) or c.has(sp.oo):
        raise AssumptionError("expr", f"a term of pure power order in {variable}", f"limit {c}",
                              "substitute values for the symbols that decide the order")
    return c * variable ** k


@final
@dataclass(frozen=True)
class Regimes:
    """The dot-product bound's regimes, each a SymPy expression obtained by limits."""

    large_radius: sp.Expr          # leading term as R -> oo (order R^2)
    large_radius_in_n: sp.Expr     # its leading term in n: Theta(sqrt(n))
    n_exponent: sp.Expr            # 1/2
    small_scale: sp.Expr           # limit as ||A|| -> 0 (scores flat): no n left
    mean_field: sp.Expr            # limit as n -> oo at fixed R: finite (the mean-field regime)


def dot_product_regimes(bound_expr: sp.Expr) -> Regimes:
    """Regimes of the dot-product self-attention bound (no biases, Frobenius, ball)."""
    expr = S.expand_special(bound_expr)
    A = S.MatrixNormSymbol("A")
    large_R = leading_term(expr, S.R)
    in_n = leading_term(large_R, S.n)
    small = sp.simplify(point_limit(expr, A, 0))
    mean_field = sp.simplify(sp.limit(eventually(expr, S.n), S.n, sp.oo))
    return Regimes(large_R, in_n, growth_exponent(large_R, S.n), small, mean_field)


@final
@dataclass(frozen=True)
class Regime:
    """How a bound behaves as one variable tends to a point, the others fixed.

    ``leading`` is ``c variable^k`` (``point = oo``; ``exponent = k``) or the finite limit
    (``point = 0``, or a bound that stays finite).  ``exact``: the bound is asymptotically equal to
    ``leading``; otherwise a ``Min`` whose winner SymPy could not decide was replaced by one of its
    arguments, so ``bound <= leading (1 + o(1))`` only.
    """

    variable: sp.Symbol
    point: sp.Expr
    leading: sp.Expr
    exponent: sp.Expr | None
    exact: bool


def _decided(expr: sp.Expr, variable: sp.Symbol, point) -> tuple[sp.Expr, bool]:
    """``expr`` with every ``Min``/``Max`` replaced by its eventual winner.  An undecided ``Min``
    (its winner depends on the other symbols) is replaced by its argument of smallest growth and an
    undecided ``Max`` by the sum of its arguments, both upper bounds: the second value is then False."""
    exact = True
    while True:
        try:
            return eventually(expr, variable, point), exact
        except AssumptionError:
            exact = False
        node = next((a for a in sp.preorder_traversal(expr) if isinstance(a, (sp.Min, sp.Max))
                     and not any(b.has(sp.Min, sp.Max) for b in a.args) and not _decidable(a, variable, point)),
                    None)
        if node is None:
            raise AssumptionError("expr", f"a decidable order as {variable} -> {point}", "an undecided comparison",
                                  "substitute values for the other symbols")
        if isinstance(node, sp.Max):
            expr = expr.xreplace({node: sp.Add(*node.args)})
        else:
            expr = expr.xreplace({node: min(node.args, key=lambda a: (_order(a, variable), sp.count_ops(a)))})


def _decidable(node, variable, point) -> bool:
    try:
        eventually(node, variable, point)
        return True
    except AssumptionError:
        return False


def _order(expr: sp.Expr, variable: sp.Symbol):
    """The growth exponent of a small expression, as a number (oo when SymPy cannot tell)."""
    try:
        order = growth_exponent(expr, variable)
    except (AssumptionError, NotImplementedError, ValueError):
        return sp.oo
    return order if order.is_comparable else sp.oo


#: A guessed exponent above this is exponential growth.
_LARGEST_ORDER = 40


def _guessed_exponent(expr: sp.Expr, variable: sp.Symbol) -> sp.Expr | None:
    """A cheap guess of the growth exponent: the slope of ``log expr`` against ``log variable`` at
    ``10^30`` and ``10^60`` (50 digits, the other symbols set to 1), rounded to a quarter.  Only a
    guess: :func:`regime` keeps it when ``expr / variable^k`` has a finite, non-zero limit."""
    others = {symbol: sp.Integer(1) for symbol in sp.sympify(expr).free_symbols - {variable}}
    try:
        function = sp.lambdify(variable, expr.xreplace(others), modules="mpmath")
        with mpmath.workdps(50):
            low, high = (mpmath.log(abs(function(mpmath.mpf(10) ** e))) for e in (30, 60))
            slope = (high - low) / (30 * mpmath.log(10))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, NameError):
        return None
    if not mpmath.isfinite(slope):
        return None
    if slope > _LARGEST_ORDER:  # exponential growth: no power order to state
        return sp.oo
    return sp.Rational(int(mpmath.nint(4 * slope)), 4)


def regime(expr: sp.Expr, variable: sp.Symbol, point=sp.oo) -> Regime:
    """The behaviour of a bound as ``variable -> point`` (see :class:`Regime`)."""
    expr = S.expand_special(expr)
    if point != sp.oo:
        return Regime(variable, point, sp.simplify(point_limit(expr, variable, point)), None, True)
    decided, exact = _decided(expr, variable, point)
    guess = _guessed_exponent(decided, variable)
    if guess == sp.oo:
        raise AssumptionError("expr", f"a bound of power order in {variable}", "faster growth",
                              "state the regime for fixed values of the other symbols")
    for k in (guess, None):
        if k is None:
            k = growth_exponent(decided, variable, point)
        coefficient = sp.simplify(sp.limit(decided / variable ** k, variable, point))
        if coefficient not in (0, sp.oo, -sp.oo, sp.nan) and not coefficient.has(sp.oo):
            return Regime(variable, point, coefficient * variable ** k, k, exact)
    raise AssumptionError("expr", f"a term of pure power order in {variable}", f"limit {coefficient}",
                          "substitute values for the symbols that decide the order")


@functools.lru_cache(maxsize=128)
def regimes(expr: sp.Expr, radius: sp.Symbol = S.R, size: sp.Symbol = S.n) -> tuple[Regime, ...]:
    """The regimes a paper states for a bound: large radius, many tokens, small radius (when the
    variable occurs); a regime SymPy cannot decide is left out."""
    found = []
    for variable, point in ((radius, sp.oo), (size, sp.oo), (radius, sp.Integer(0))):
        if variable not in sp.sympify(expr).free_symbols:
            continue
        try:
            found.append(regime(expr, variable, point))
        except (AssumptionError, NotImplementedError, ValueError, TypeError, ArithmeticError, PoleError):
            continue  # SymPy could not decide this limit: the regime is not stated
    return tuple(found)
