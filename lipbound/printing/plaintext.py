"""Plain-text mathematics for terminals: norms print as norms, functions with their definitions.

SymPy's own string printer writes a norm symbol by its name (``W_V`` for the spectral norm of
``W_V``) and ``kappa(n, omega)`` without saying what kappa is.  :func:`plain` writes
``||W_V||_2``, ``||W_K b_Q||_2``, ``||W_Q^T||_inf`` and ``kappa_n(omega)``; :func:`plain_legend`
gives one line per norm kind and function an expression contains, with its definition in ASCII
(the same definitions as :data:`lipbound.printing.legend.FUNCTION_MEANINGS` and docs/symbols.md);
:func:`legend_lines` writes the legend under a printed table, one line per column.
"""

from __future__ import annotations

import sympy as sp
from sympy.printing.str import StrPrinter

from ..symbolic import symbols as S

__all__ = ["plain", "plain_legend", "PLAIN_FUNCTION_MEANINGS", "legend_lines"]

#: Function classes -> (plain-text symbol, definition).
PLAIN_FUNCTION_MEANINGS: dict[type, tuple[str, str]] = {
    S.kappa: ("kappa_n(omega)", "n e^omega / (e^omega + n - 1) <= min(n, e^omega), a bound on every column sum of "
              "the attention matrix when the score spread is at most omega"),
    S.causal_kappa: ("kappa^c_n(omega)", "sum_{i=1..n} e^omega / (e^omega + i - 1), the same bound under a causal "
                     "mask"),
    S.lambert_level: ("W_0", "the principal branch of the Lambert W function"),
    sp.LambertW: ("W_0", "the principal branch of the Lambert W function"),
}
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "eta", "theta", "kappa", "lambda", "mu", "nu", "xi", "rho",
          "sigma", "tau", "phi", "chi", "psi", "omega"}


def _matrix_text(name: str) -> str:
    """``"W_K*W_Q.T"`` -> ``"W_K W_Q^T"``."""
    return name.replace(".T", "^T").replace("*", " ")


def _named_quantity(name: str) -> bool:
    """``gamma_{A,V}`` is a named joint quantity, printed without norm bars."""
    return name.split("_", 1)[0] in _GREEK


class _PlainPrinter(StrPrinter):
    def _print_MatrixNormSymbol(self, expr):
        return expr.name if _named_quantity(expr.name) else f"||{_matrix_text(expr.name)}||_2"

    def _print_VectorNormSymbol(self, expr):
        return f"||{_matrix_text(expr.name)}||_2"

    def _print_InfNormSymbol(self, expr):
        return f"||{_matrix_text(expr.name)}||_inf"

    def _print_kappa(self, expr):
        n, omega = expr.args
        return f"kappa_{self._subscript(n)}({self._print(omega)})"

    def _print_causal_kappa(self, expr):
        n, omega = expr.args
        return f"kappa^c_{self._subscript(n)}({self._print(omega)})"

    def _print_lambert_level(self, expr):
        return f"W_0(({self._print(expr.args[0] - 1)})/e)"

    def _print_LambertW(self, expr):
        return "W_0(" + ", ".join(self._print(arg) for arg in expr.args) + ")"

    def _subscript(self, expr) -> str:
        text = self._print(expr)
        return text if text.isalnum() else f"{{{text}}}"

    def _print_Min(self, expr):
        return "min(" + ", ".join(self._print(arg) for arg in expr.args) + ")"

    def _print_Max(self, expr):
        return "max(" + ", ".join(self._print(arg) for arg in expr.args) + ")"


def plain(expr) -> str:
    """``expr`` as plain text with norms as norms (module docstring)."""
    return _PlainPrinter({"order": None}).doprint(sp.sympify(expr))


def plain_legend(*exprs) -> list[str]:
    """One line per kind of norm and per special function in ``exprs``: ``"kappa_n(omega) = ..."``."""
    lines: dict[str, None] = {}
    for expr in exprs:
        if not isinstance(expr, sp.Basic):
            continue
        for node in sp.preorder_traversal(expr):
            if isinstance(node, S.InfNormSymbol):
                lines["||M||_inf: the largest absolute row sum of the matrix M"] = None
            elif isinstance(node, (S.MatrixNormSymbol, S.VectorNormSymbol)) and not _named_quantity(node.name):
                lines["||M||_2: the spectral norm of a matrix M (the Euclidean norm of a vector)"] = None
            elif type(node) in PLAIN_FUNCTION_MEANINGS:
                symbol, meaning = PLAIN_FUNCTION_MEANINGS[type(node)]
                lines[f"{symbol} = {meaning}"] = None
    return list(lines)


def legend_lines(title: str, entries: list[tuple[str, str]]) -> list[str]:
    """The legend under a printed table: ``title``, then one ``name  meaning`` line per column, names aligned."""
    width = max(len(name) for name, _ in entries)
    return [title] + [f"  {name:{width}s}  {meaning}" for name, meaning in entries]
