"""Leading-order behaviour of bounds, by SymPy limits.

``leading_term(expr, x)`` returns ``c x^k`` with ``expr / (c x^k) -> 1`` as
``x -> oo`` (or ``c`` alone when the limit is finite), after replacing every
``Min``/``Max`` by the argument that eventually wins.  ``dot_product_regimes``
shows the two regimes of the dot-product bound (docs/mathematics.md):
``Theta(sqrt(n))`` for large R, and independence of n as ``||A|| R^2 -> 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S

__all__ = ["eventually", "point_limit", "growth_exponent", "leading_term", "Regimes", "dot_product_regimes"]


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
    return sp.limit(expr, variable, point).xreplace(frozen)


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
