r"""LaTeX for lipbound's symbolic objects, written as a mathematician writes it.

One printer class, :class:`LipboundLatexPrinter`, subclasses SymPy's
:class:`~sympy.printing.latex.LatexPrinter` with one ``_print_<Class>`` method per
lipbound node (the norm symbols, the kernel constants, the column-sum functions
:math:`\kappa`, the Lambert-W level, the score atoms ``Inner``/``Norm``/``SoftNorm``,
described quantities) and always recurses through ``self._print``; everything
else (sums, products, fractions, ``Min``/``Max``) keeps SymPy's rules and SymPy's
deterministic ordering of terms and factors.

Notation (kept in every output, and stated in the generated proofs):

=====================================  =========================================
object                                 LaTeX
=====================================  =========================================
``MatrixNormSymbol("W_K*W_Q.T")``      ``\|W_K W_Q^\top\|_2`` (spectral norm)
``MatrixNormSymbol("gamma_{A,V}")``    ``\gamma_{A,V}`` (a named joint quantity)
``VectorNormSymbol("W_K*b_Q")``        ``\|W_K b_Q\|_2`` (Euclidean norm)
``InfNormSymbol("W_Q.T")``             ``\|W_Q^\top\|_\infty`` (max row sum)
``kappa(n, omega)``                    ``\kappa_{n}(\omega)``
``causal_kappa(n, omega)``             ``\kappa^{\mathrm{c}}_{n}(\omega)``
``lambert_level(n)``                   ``W_0\!\left(\frac{n - 1}{e}\right)``
``LambertW(z)``                        ``W_0\!\left(z\right)``
``Inner(u, v)``, ``Norm(u)``           ``\langle u, v\rangle``, ``\|u\|``
``SoftNorm(u, epsilon)``               ``N_{\varepsilon}(u)``, i.e. ``(\|u\|^2 + \varepsilon)^{1/2}``
``gamma_max``, ``epsilon``, ``d_k``    ``\gamma_{\max}``, ``\varepsilon``, ``d_k``
``eps``, ``sigma_min``, ``ell_phi``    ``\varepsilon``, ``\sigma_{\min}``, ``\ell_{\varphi}`` (blocks)
``MatrixNormSymbol("D_gamma*Pi")``     ``\|D_{\gamma} \Pi\|_2``
=====================================  =========================================
"""

from __future__ import annotations

import functools
import re
from typing import final

import sympy as sp
from sympy.printing.conventions import split_super_sub
from sympy.printing.latex import LatexPrinter, translate

from ..symbolic import symbols as S
from ..symbolic.calculus import Inner, Norm, SoftNorm
from ..symbolic.nonsoftmax import FeatureMap
from ..symbolic.record import Defines, Described, Sides

__all__ = ["LipboundLatexPrinter", "latex", "symbol_latex", "matrix_expression_latex", "ordered_factors"]

#: Greek names whose variant form reads better in analysis (epsilon is a small positive number).
_GREEK_VARIANTS = {"epsilon": r"\varepsilon", "phi": r"\varphi"}
#: Words that print as operators when they are a subscript (``gamma_max -> \gamma_{\max}``).
_SUBSCRIPT_WORDS = {"max": r"\max", "min": r"\min", "inf": r"\infty", "infty": r"\infty",
                    # the parts of a gated block, a soft cap, the norm after a branch: words, set upright
                    "gate": r"\mathrm{gate}", "up": r"\mathrm{up}", "down": r"\mathrm{down}", "cap": r"\mathrm{cap}",
                    "post": r"\mathrm{post}"}
#: A symbol name that is already LaTeX (``\|x - c\|``, ``s(x, y) \simeq ...``) prints verbatim.
_LATEX_NAME = re.compile(r"[\\{}()\[\] ,|]")
_BRACED_SUBSCRIPT = re.compile(r"^([A-Za-z]+)_\{([^{}]*)\}$")


def _base_latex(base: str) -> str:
    if base in _GREEK_VARIANTS:
        return _GREEK_VARIANTS[base]
    return translate(base)


def _subscript_latex(text: str) -> str:
    parts = [_SUBSCRIPT_WORDS.get(part, _base_latex(part)) for part in text.split(",")]
    return ",".join(parts)


def _script(mark: str, body: str) -> str:
    """``_k`` for a one-character script, ``_{ij}`` otherwise."""
    return f"{mark}{body}" if len(body) == 1 and body.isalnum() else f"{mark}{{{body}}}"


@functools.cache
def symbol_latex(name: str) -> str:
    r"""LaTeX of a symbol name: ``d_k -> d_k``, ``gamma_max -> \gamma_{\max}``, ``epsilon ->
    \varepsilon``, ``gamma_{A,V} -> \gamma_{A,V}``, ``W_Q -> W_Q``.

    A name that already contains LaTeX (a backslash, braces other than one braced
    subscript, brackets or spaces) is returned unchanged.
    """
    braced = _BRACED_SUBSCRIPT.match(name)
    if braced:
        base, subscript = braced.groups()
        return _base_latex(base) + "_{" + _subscript_latex(subscript) + "}"
    if _LATEX_NAME.search(name):
        return name
    base, supers, subs = split_super_sub(name)
    tex = _base_latex(base)
    for sup in supers:
        tex += _script("^", _subscript_latex(sup))
    if subs:
        tex += _script("_", ",".join(_subscript_latex(sub) for sub in subs))
    return tex


def _is_named_quantity(name: str) -> bool:
    """``gamma_{A,V}`` names a joint quantity (no norm bars); ``A``, ``W_K*W_Q.T`` name matrices."""
    base = _BRACED_SUBSCRIPT.match(name)
    head = base.group(1) if base else split_super_sub(name)[0]
    return translate(head) != head or head in _GREEK_VARIANTS


def _matrix_namespace() -> dict:
    """The weight matrices, biases and tokens of :mod:`lipbound.symbolic.symbols`, by name
    (a fixed set: the printed form of a name must not depend on what was derived before)."""
    return {value.name: value for value in vars(S).values() if isinstance(value, sp.MatrixSymbol)}


@functools.cache
def _parse_matrix(name: str):
    """The matrix expression named by a norm symbol (``"W_K*W_Q.T"``), or None if it does not parse.

    Parsed from the name itself (not looked up in the mutable ``NORM_OF`` registry) so that
    the printed form never depends on what was derived earlier in the process.
    """
    try:
        parsed = sp.sympify(name, locals=_matrix_namespace())
    except (sp.SympifyError, SyntaxError, TypeError, ValueError, AttributeError, sp.ShapeError):
        return None
    return parsed


def matrix_expression_latex(name: str, printer: LipboundLatexPrinter | None = None) -> str:
    r"""LaTeX of the matrix or vector expression a norm symbol is named by:
    ``"W_K*W_Q.T" -> W_K W_Q^\top``; a name that does not parse prints as a symbol name."""
    if printer is None or printer._settings == _default_settings():
        return _matrix_expression_latex_default(name)
    return _matrix_expression_latex(name, printer)


@functools.lru_cache(maxsize=1)
def _default_settings() -> dict:
    return LipboundLatexPrinter()._settings


@functools.cache
def _matrix_expression_latex_default(name: str) -> str:
    """Memoised: the same norm symbols are printed thousands of times in the proofs."""
    return _matrix_expression_latex(name, LipboundLatexPrinter())


def _matrix_expression_latex(name: str, printer: LipboundLatexPrinter) -> str:
    parsed = _parse_matrix(name)
    if isinstance(parsed, sp.MatrixExpr):
        return printer._print(parsed)
    if re.fullmatch(r"[A-Za-z0-9_.*+\- ]+", name):  # "W_h*W_K.T" of matrices we do not know
        product = re.sub(r"\s*\*\s*", " ", name)
        return re.sub(r"([A-Za-z][A-Za-z0-9_]*)(\.T)?",
                      lambda match: symbol_latex(match.group(1)) + (r"^\top" if match.group(2) else ""), product)
    return symbol_latex(name)


def _delimited(tex: str) -> str:
    r"""``(tex)``, or ``\left(tex\right)`` when tex is tall (a fraction, a root, a sum)."""
    if any(tall in tex for tall in (r"\frac", r"\sqrt", r"\left", r"\sum", r"\begin")):
        return r"\left(" + tex + r"\right)"
    return "(" + tex + ")"


def _with_power(tex: str, exp: str | None) -> str:
    return tex if exp is None else f"{tex}^{{{exp}}}"


_NORM_SYMBOLS = (S.MatrixNormSymbol, S.VectorNormSymbol, getattr(S, "InfNormSymbol", S.MatrixNormSymbol))


@final
class LipboundLatexPrinter(LatexPrinter):
    r"""SymPy's LaTeX printer with one ``_print_<Class>`` method per lipbound node.

    Settings are SymPy's (``LatexPrinter._default_settings``).  Relations print with
    ``\le``/``\ge``, transposes with ``^\top``.
    """

    # symbols ---------------------------------------------------------------
    def _print_Symbol(self, expr, style="plain"):
        name = self._settings["symbol_names"].get(expr)
        return name if name is not None else symbol_latex(expr.name)

    def _print_Described(self, expr: Described, style="plain"):
        # a described quantity's name is its LaTeX
        return expr.name

    def _print_SizeSymbol(self, expr, style="plain"):
        return symbol_latex(expr.name)

    def _print_RadiusSymbol(self, expr, style="plain"):
        return symbol_latex(expr.name)

    def _print_KernelConstant(self, expr, style="plain"):
        return symbol_latex(expr.name)

    def _print_WeightQuantity(self, expr, style="plain"):
        return symbol_latex(expr.name)

    def _print_LowerBoundSymbol(self, expr, style="plain"):
        return symbol_latex(expr.name)

    def _print_BlockParameter(self, expr, style="plain"):
        r"""A block's scalar: the normalisation's ``eps`` prints as ``\varepsilon`` (as prose writes
        epsilon), ``sigma_min`` as ``\sigma_{\min}``, ``ell_phi`` as ``\ell_{\varphi}``."""
        return symbol_latex("epsilon" if expr.name == "eps" else expr.name)

    def _print_MatrixNormSymbol(self, expr, style="plain"):
        r"""Spectral norm ``\|M\|_2``; a Greek-named joint quantity (``gamma_{A,V}``) prints bare."""
        if _is_named_quantity(expr.name):
            return symbol_latex(expr.name)
        return r"\|" + matrix_expression_latex(expr.name, self) + r"\|_2"

    def _print_VectorNormSymbol(self, expr, style="plain"):
        return r"\|" + matrix_expression_latex(expr.name, self) + r"\|_2"

    def _print_InfNormSymbol(self, expr, style="plain"):
        return r"\|" + matrix_expression_latex(expr.name, self) + r"\|_\infty"

    # matrices --------------------------------------------------------------
    def _print_MatrixSymbol(self, expr, style="plain"):
        return symbol_latex(expr.name)

    def _print_Transpose(self, expr):
        inner = expr.arg
        if isinstance(inner, sp.MatrixSymbol):
            return self._print(inner) + r"^\top"
        return r"\left(" + self._print(inner) + r"\right)^\top"

    def _print_Mul(self, expr):
        r"""Products as SymPy orders them, except that described quantities (``\|e_i\|``, ``u_i``)
        come last: ``L_V u_i``, ``\kappa_{n}(\omega) \|E\|_F^2``."""
        described, others = _split_described(expr)
        if not described or not others:
            return super()._print_Mul(expr)
        rest = sp.Mul(*others)
        tex = self._print(rest)
        if isinstance(rest, sp.Add):
            tex = r"\left(" + tex + r"\right)"
        return tex + " " + " ".join(self._print(factor) for factor in described)

    def _print_MatAdd(self, expr):
        r"""A sum of matrices, a positive term first: ``\|W_Q^\top x - W_K^\top y\|``."""
        terms = list(self._as_ordered_terms(expr, order=None))
        positive = [term for term in terms if not term.could_extract_minus_sign()]
        if positive and terms[0].could_extract_minus_sign():
            terms.remove(positive[0])
            terms.insert(0, positive[0])
        tex = self._print(terms[0])
        for term in terms[1:]:
            if term.could_extract_minus_sign():
                tex += " - " + self._print(-term)
            else:
                tex += " + " + self._print(term)
        return tex

    def _print_Sides(self, expr: Sides):
        return f"{self._print(expr.lhs)} {expr.relation} {self._print(expr.rhs)}"

    def _print_Defines(self, expr: Defines):
        return self._print_Sides(expr)

    def _print_FeatureMap(self, expr: FeatureMap, exp=None):
        return _with_power(r"\phi(%s)" % self._print(expr.args[0]), exp)

    def _print_Simeq(self, expr):
        return self._print_Sides(expr)

    def _print_VectorSum(self, expr):
        r"""``sum_t c_t v_t``: a coefficient that is a sum is parenthesised, and so is a vector sum
        that has a coefficient (``\left(2 R\right) \left(W_K^\top x + b_K\right)``)."""
        parts = []
        for coefficient, vector in expr.terms:
            if coefficient == 1:
                factor = ""
            elif coefficient.is_Atom or isinstance(coefficient, sp.Mul):
                factor = self._print(coefficient) + " "
            else:
                factor = r"\left(" + self._print(coefficient) + r"\right) "
            tex = self._print(vector)
            if factor and isinstance(vector, sp.MatAdd):
                tex = r"\left(" + tex + r"\right)"
            parts.append(factor + tex)
        if not parts:
            return "0"
        return parts[0] + "".join((" " + part) if part.startswith("- ") else (" + " + part) for part in parts[1:])

    # powers: a norm's bars already delimit it, so no parentheses before an exponent
    def _print_Pow(self, expr):
        base, exponent = expr.args
        if isinstance(base, SoftNorm):
            return self._print_SoftNorm_power(base, exponent)
        rootlike = exponent.is_Rational and abs(exponent.p) == 1 and exponent.q != 1
        if isinstance(base, _NORM_SYMBOLS) and not rootlike and not exponent.is_negative:
            return f"{self._print(base)}^{{{self._print(exponent)}}}"
        return super()._print_Pow(expr)

    # relations -------------------------------------------------------------
    def _print_Relational(self, expr):
        symbol = {"==": "=", "<=": r"\le", ">=": r"\ge", "<": "<", ">": ">", "!=": r"\ne"}[expr.rel_op]
        return f"{self._print(expr.lhs)} {symbol} {self._print(expr.rhs)}"

    # column sums and the Lambert-W level --------------------------------------
    def _print_kappa(self, expr, exp=None):
        size, spread = expr.args
        tex = r"\kappa_{%s}%s" % (self._print(size), _delimited(self._print(spread)))
        return _with_power(tex, exp)

    def _print_causal_kappa(self, expr, exp=None):
        size, spread = expr.args
        tex = r"\kappa^{\mathrm{c}}_{%s}%s" % (self._print(size), _delimited(self._print(spread)))
        return _with_power(tex, exp)

    def _print_LambertW(self, expr, exp=None):
        argument = expr.args[0]
        # W_0(1/e) as in the lemmas, rather than W_0(e^{-1})
        inner = r"\frac{1}{e}" if argument == sp.exp(-1) else self._print(argument)
        branch = "0" if len(expr.args) == 1 else self._print(expr.args[1])
        return _with_power(r"W_{%s}\!\left(%s\right)" % (branch, inner) if len(branch) > 1 else
                           r"W_%s\!\left(%s\right)" % (branch, inner), exp)

    def _print_lambert_level(self, expr, exp=None):
        (size,) = expr.args
        return self._print_LambertW(sp.LambertW((size - 1) / sp.E, evaluate=False), exp)

    # score atoms -------------------------------------------------------------
    def _print_Inner(self, expr: Inner, exp=None):
        left, right = (self._print(arg) for arg in expr.args)
        return _with_power(r"\langle %s, %s\rangle" % (left, right), exp)

    def _print_Norm(self, expr: Norm, exp=None):
        return _with_power(r"\|%s\|" % self._print(expr.args[0]), exp)

    def _print_SoftNorm(self, expr: SoftNorm, exp=None):
        r"""``N_\varepsilon(u) = (\|u\|^2 + \varepsilon)^{1/2}``, the regularised norm, by its name (the
        legend and the lemmas define it): a fraction of two of them still fits on a line."""
        vector, epsilon = expr.args
        return _with_power(r"N_{%s}(%s)" % (self._print(epsilon), self._print(vector)), exp)

    def _print_SoftNorm_power(self, base: SoftNorm, exponent) -> str:
        if exponent.is_negative or (exponent.is_Rational and abs(exponent.p) == 1 and exponent.q != 1):
            return super()._print_Pow(sp.Pow(base, exponent, evaluate=False))
        return self._print_SoftNorm(base, self._print(exponent))


def _is_described(factor) -> bool:
    base = factor.base if isinstance(factor, sp.Pow) and factor.exp.is_positive else factor
    return isinstance(base, Described)


def _split_described(expr) -> tuple[list, list]:
    """(described factors in SymPy's order, other factors) of a commutative product."""
    factors = list(expr.as_ordered_factors()) if isinstance(expr, sp.Mul) else [expr]
    described = [factor for factor in factors if _is_described(factor)]
    return described, [factor for factor in factors if not _is_described(factor)]


def ordered_factors(expr) -> list:
    """The factors of a product in printing order: SymPy's, with described quantities last."""
    described, others = _split_described(expr)
    return others + described


def latex(expr, **settings) -> str:
    r"""LaTeX of a SymPy expression (or relation) with lipbound's notation.

    Parameters
    ----------
    expr : sympy expression, relation, matrix, or number
    **settings
        Any setting of :class:`sympy.printing.latex.LatexPrinter` (e.g. ``mode="inline"``).

    Examples
    --------
    >>> from lipbound.symbolic import symbols as S
    >>> latex(S.MatrixNormSymbol("W_V") * S.R)
    '\\|W_V\\|_2 R'
    """
    return LipboundLatexPrinter(settings).doprint(expr)
