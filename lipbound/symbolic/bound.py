"""Results of a derivation: a :class:`Bound`, or :class:`NotLipschitz` with a witness family.

A bound is a SymPy expression plus the assumptions it used plus its derivation
record.  It can be simplified, have numbers substituted, be expanded to leading
order, be compared with another bound, and be turned into numpy (fast) or
interval (rigorous) code with :meth:`Bound.lambdify`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import final

import sympy as sp

from ..errors import AssumptionError
from ..rigorous.compiler import compile_interval
from . import symbols as S
from .asymptotics import leading_term
from .facts import HeadFacts
from .prover import compare
from .record import Derivation
from .symbols import expand_special

__all__ = ["Result", "Bound", "NotLipschitz", "numeric_namespace"]


class Result:
    """Common interface of :class:`Bound` and :class:`NotLipschitz`.  Abstract."""

    variant: str
    norm: str
    domain: str
    assumptions: tuple[str, ...]
    record: Derivation
    lipschitz: bool


@final
@dataclass(frozen=True)
class Bound(Result):
    """``Lip(variant) <= expr`` under ``assumptions``.

    Attributes
    ----------
    variant, norm, domain : str
        Keys of the variant, the norm on X, and the domain.
    expr : sympy expression
        The bound in weight-norm symbols, sizes and radii.
    generic : sympy expression
        The same bound in the kernel constants (the theorem's statement).
    constants : dict
        Kernel constant symbol -> expression used to pass from ``generic`` to ``expr``.
    assumptions : tuple of str
        Human-readable assumptions.
    record : Derivation
        Every step, in order: the kernel constants, then the theorem.
    theorem : str
        Identifier of the general theorem (the name of its file in ``proofs/``).
    provenance : str
        ``"derived"`` for lipbound's own derivations, else a claim's tag.
    facts : HeadFacts or None
        The heads the theorem covers (score, biases, tying, values, mask, argument); the
        numeric layer evaluates the bound only on heads these facts cover.
    stated : Assumptions or None
        The assumptions object the bound was derived under (the printing layer writes it as a
        mathematical list).
    """

    variant: str
    norm: str
    domain: str
    expr: sp.Expr
    generic: sp.Expr
    constants: dict
    assumptions: tuple[str, ...]
    record: Derivation = field(repr=False, compare=False)
    theorem: str = ""
    provenance: str = "derived"
    facts: HeadFacts | None = None
    stated: object = field(default=None, repr=False, compare=False)
    lipschitz: bool = field(default=True, init=False)

    # working with the expression --------------------------------------------
    @property
    def free_symbols(self) -> set:
        return self.expr.free_symbols

    def subs(self, values: dict) -> Bound:
        """Substitute numbers or expressions for symbols (keys: symbols or their names)."""
        mapping = _mapping(self.expr, values)
        return replace(self, expr=self.expr.xreplace(mapping))

    def simplify(self) -> Bound:
        return replace(self, expr=sp.simplify(self.expr))

    def closed_form(self) -> sp.Expr:
        """The bound with kappa and Lambert levels written out."""
        return expand_special(self.expr)

    def evaluate(self, values: dict | None = None) -> float:
        """Float value after substitution (every symbol must be given)."""
        expr = expand_special(self.expr).xreplace(_mapping(self.expr, values or {}))
        if expr.free_symbols:
            raise AssumptionError("values", "a number for every symbol of the bound",
                                  f"missing {sorted(map(str, expr.free_symbols))}",
                                  "pass them in values={...}")
        return float(sp.N(expr, 30))

    def leading_order(self, variable: sp.Symbol, point=sp.oo) -> sp.Expr:
        """Leading term as ``variable -> point`` (``Theta`` behaviour), by SymPy limits.

        Returns ``c * g(variable)`` where ``bound / g -> c``, ``c`` finite and non-zero.
        """
        return leading_term(expand_special(self.expr), variable, point)

    def lambdify(self, backend: str = "numpy") -> tuple[list[sp.Symbol], Callable]:
        """Compile the bound.  ``backend``: ``"numpy"`` (fast), ``"mpmath"`` (high precision)
        or ``"interval"`` (``mpmath.iv``, outward rounding: use for certified values).

        Returns ``(symbols, function)``; call ``function(*values)`` in the order of ``symbols``.
        """
        if backend == "interval":  # kappa and Lambert levels have rigorous, tight interval forms
            symbols = sorted(self.expr.free_symbols, key=str)
            return symbols, compile_interval(self.expr, symbols)
        expr = expand_special(self.expr)
        symbols = sorted(expr.free_symbols, key=str)
        function = sp.lambdify(symbols, expr, modules=numeric_namespace(backend))
        function.__globals__["range"] = _integer_range  # sums over tokens: n may arrive as 8.0
        return symbols, function

    def compare(self, other: Bound, **kwargs):
        """Decide ``self <= other`` for all admissible values (see :func:`lipbound.symbolic.prover.compare`)."""
        return compare(self.expr, other.expr, **kwargs)




@final
@dataclass(frozen=True)
class NotLipschitz(Result):
    """The map is not Lipschitz on the domain: along ``family`` (a curve ``X_t``)
    the Jacobian norm is at least ``growth``, which tends to infinity.

    Attributes
    ----------
    family : sympy Matrix
        ``X_t``, rows are tokens, in the parameter :data:`lipbound.symbolic.symbols.t`.
    growth : sympy expression
        A lower bound on ``||Df(X_t)||`` (exact for the instance in ``instance``).
    instance : str
        The weights the family is computed for (e.g. ``"d = 1, W_Q = W_K = W_V = 1"``).
    stated : Assumptions or None
        The assumptions object of the derivation.
    """

    variant: str
    norm: str
    domain: str
    family: sp.Matrix
    growth: sp.Expr
    instance: str
    assumptions: tuple[str, ...]
    record: Derivation = field(repr=False, compare=False)
    theorem: str = ""
    stated: object = field(default=None, repr=False, compare=False)
    lipschitz: bool = field(default=False, init=False)

    @property
    def limit(self) -> sp.Expr:
        """``lim_{t -> oo} |growth|`` (infinite)."""
        return sp.Abs(sp.limit(self.growth, S.t, sp.oo))


def _mapping(expr: sp.Expr, values: dict) -> dict:
    by_name = {str(s): s for s in expr.free_symbols}
    mapping = {}
    for key, value in values.items():
        symbol = by_name.get(key) if isinstance(key, str) else key
        if symbol is not None:
            mapping[symbol] = sp.sympify(value)
    return mapping


def _integer_range(start, stop):
    """``range`` for sums over tokens whose bound arrives as a float or an mpf (``n = 8.0``)."""
    return range(int(start), int(stop))


def numeric_namespace(backend: str) -> list:
    """Modules for ``sympy.lambdify``: numpy or mpmath (the rigorous route is
    :func:`lipbound.rigorous.compiler.compile_interval`)."""
    import mpmath
    if backend == "numpy":
        import numpy as np
        lambertw = np.vectorize(lambda z: float(mpmath.lambertw(z).real), otypes=[float])
        digamma = np.vectorize(lambda z: float(mpmath.digamma(z)), otypes=[float])
        polygamma = np.vectorize(lambda k, z: float(mpmath.polygamma(int(k), z)), otypes=[float])
        return [{"LambertW": lambertw, "digamma": digamma, "polygamma": polygamma}, "numpy"]
    if backend == "mpmath":
        return [{"LambertW": mpmath.lambertw, "digamma": mpmath.digamma,
                 "polygamma": lambda k, z: mpmath.polygamma(int(k), z)}, "mpmath"]
    raise AssumptionError("backend", "'numpy', 'mpmath' or 'interval'", repr(backend),
                          "choose one of the three")
