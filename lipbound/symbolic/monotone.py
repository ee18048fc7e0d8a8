"""Monotonicity by structure: when a bound is non-decreasing in one of its symbols.

One sound, incomplete test used wherever a replacement ``u -> w`` with ``u <= w`` must not lower a
bound: by the prover (monotone replacement) and by the numeric evaluation (a norm symbol replaced
by a rigorous upper bound of the norm).
"""

from __future__ import annotations

import sympy as sp

from . import symbols as S

__all__ = ["is_nondecreasing"]


def is_nondecreasing(expr: sp.Expr, symbol: sp.Symbol) -> bool:
    """Whether ``expr`` is non-decreasing in ``symbol`` over the symbols' assumed ranges.

    True when ``expr`` is built from ``symbol`` and constants by sums, products of non-negative
    factors, powers ``b^e`` (``e > 0`` constant and ``b >= 0``, or ``b >= 1`` constant), ``exp``,
    ``log``, ``LambertW`` (principal branch), ``Min``, ``Max``, ``|u|`` of ``u >= 0``, lipbound's
    level function and ``kappa(n, omega) = n / (1 + (n - 1) e^{-omega})``, increasing in both
    arguments when ``omega >= 0`` (``d kappa / d n = (1 - e^{-omega}) / (1 + (n - 1) e^{-omega})^2``).
    False means "not shown", never "decreasing".
    """
    expr = sp.sympify(expr)
    if symbol not in expr.free_symbols or expr == symbol:
        return True
    if isinstance(expr, (sp.Add, sp.Min, sp.Max)):
        return all(is_nondecreasing(a, symbol) for a in expr.args)
    if isinstance(expr, sp.Mul):
        return all(f.is_nonnegative is True and is_nondecreasing(f, symbol) for f in expr.args)
    if isinstance(expr, sp.Pow):
        base, exponent = expr.args
        if symbol not in exponent.free_symbols:
            return exponent.is_positive is True and base.is_nonnegative is True and is_nondecreasing(base, symbol)
        return symbol not in base.free_symbols and (base - 1).is_nonnegative is True \
            and is_nondecreasing(exponent, symbol)
    if isinstance(expr, (sp.exp, sp.log, S.lambert_level)) or (isinstance(expr, sp.LambertW) and len(expr.args) == 1):
        return is_nondecreasing(expr.args[0], symbol)
    if isinstance(expr, (S.kappa, S.causal_kappa)):
        return expr.args[1].is_nonnegative is True and all(is_nondecreasing(a, symbol) for a in expr.args)
    if isinstance(expr, sp.Abs):
        return expr.args[0].is_nonnegative is True and is_nondecreasing(expr.args[0], symbol)
    return False
