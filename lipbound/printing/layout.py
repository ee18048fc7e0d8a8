r"""Widths and line breaking of displayed formulas, and score spreads named once.

:func:`visual_width` estimates the printed width of LaTeX in points; :func:`split_expression`
breaks a long expression at top-level ``+``/``-`` signs, inside the longest parenthesised sum of
a product (with ``\bigl(``...``\bigr)``, which may span lines) and between the arguments of
``\min``/``\max``.  :class:`SpreadNames` names a long score spread inside ``\kappa_n(\cdot)``
once (``\bar\omega``) and reuses the name.
"""

from __future__ import annotations

import re
from typing import final

import sympy as sp
from sympy.core.sorting import default_sort_key
from sympy.simplify.radsimp import fraction

from ..symbolic import symbols as S
from ..symbolic.record import Described
from .latex import LipboundLatexPrinter, latex, ordered_factors
from .style import PROOFS

__all__ = ["visual_width", "split_expression", "pack_lines", "SpreadNames", "POINTS", "CLAIM_WIDTH", "DISPLAY_WIDTH"]

#: Room for a claim (left side, relation, right side) in an ``align*`` row next to a justification
#: box of ``0.28\textwidth``, and for a displayed equation, in points, in the generated ``proofs/``
#: (other documents: :class:`~lipbound.printing.style.TexStyle`).
CLAIM_WIDTH = PROOFS.claim_width
DISPLAY_WIDTH = PROOFS.display_width

# --------------------------------------------------------------------------------------------
_COMMAND = re.compile(r"\\([A-Za-z]+|.)")
#: Commands that print nothing themselves (font switches, delimiter sizes, environments).
_ZERO_WIDTH = {"left", "right", "textstyle", "displaystyle", "limits", "nolimits", "mathbb", "mathcal",
               "boldsymbol", "mathbf", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr", "big", "Big", "bigg",
               "raggedright", "small", "begin", "end"}
#: Widths in points (11pt Computer Modern, display style), calibrated against TeX's own box widths
#: of the claims lipbound prints (median estimate/actual 0.94, 95% within 1.1).
POINTS = {"upper": 8.6, "lower": 5.6, "digit": 5.5, "bar": 5.5, "binop": 13.5, "relation": 15.5,
           "paren": 4.3, "tall-paren": 7.5, "comma": 4.8, "command": 6.8, "root": 10.0, "fraction": 2.0,
           "operator": 19.0, "top": 7.0, "quad": 11.0}
_OPERATOR_NAMES = {"sup", "inf", "max", "min", "lim", "log", "exp", "det"}
_RELATION_NAMES = {"le", "ge", "leq", "geq", "ne", "to", "simeq", "coloneqq", "sim", "in", "approx"}
_SCRIPT_SCALE = 0.7


def visual_width(tex: str) -> float:
    r"""Estimated printed width of a LaTeX math string, in points (11pt, display style).

    Fractions count their wider part, scripts 0.7 of their width, font switches and delimiter
    sizes nothing.  An estimate for line breaking, not typesetting: the test suite compiles the
    generated proofs to catch real overflow.
    """
    return _width(tex, 1.0)


def _group(tex: str, index: int) -> tuple[str, int]:
    """The brace group (or single token) starting at ``index``; returns (content, next index)."""
    while index < len(tex) and tex[index] == " ":
        index += 1
    if index >= len(tex):
        return "", index
    if tex[index] == "{":
        depth = 0
        for end in range(index, len(tex)):
            if tex[end] == "{":
                depth += 1
            elif tex[end] == "}":
                depth -= 1
                if depth == 0:
                    return tex[index + 1:end], end + 1
        return tex[index + 1:], len(tex)
    command = _COMMAND.match(tex, index)
    if command:
        return command.group(), command.end()
    return tex[index], index + 1


def _width(tex: str, scale: float) -> float:
    total = 0.0
    index = 0
    tall = False  # the next delimiter follows \left or \right
    while index < len(tex):
        char = tex[index]
        if char in "{} ":
            index += 1
            continue
        if char in "^_":
            body, index = _group(tex, index + 1)
            total += _width(body, scale * _SCRIPT_SCALE)
            continue
        if char == "\\":
            command = _COMMAND.match(tex, index)
            name = command.group(1)
            index = command.end()
            if name == "frac":
                top, index = _group(tex, index)
                bottom, index = _group(tex, index)
                total += max(_width(top, scale), _width(bottom, scale)) + POINTS["fraction"] * scale
            elif name == "sqrt":
                body, index = _group(tex, index)
                total += _width(body, scale) + POINTS["root"] * scale
            elif name in ("text", "mathrm", "operatorname"):
                body, index = _group(tex, index)
                total += (6.0 * len(body) + (3.0 if name == "operatorname" else 0.0)) * scale
            elif name == "phantom":
                body, index = _group(tex, index)
                total += _width(body, scale)
            elif name in ("left", "right"):
                tall = True
            elif name in _ZERO_WIDTH:
                pass
            elif name == "|":
                total += (POINTS["tall-paren"] if tall else POINTS["bar"]) * scale
                tall = False
            elif name == "sum":
                total += 12.0 * scale
            elif name in _OPERATOR_NAMES:
                total += POINTS["operator"] * scale
            elif name in _RELATION_NAMES:
                total += POINTS["relation"] * scale
            elif name in ("quad", "qquad"):
                total += POINTS["quad"] * (2 if name == "qquad" else 1) * scale
            elif name == ",":
                total += 1.8 * scale
            elif name == "!":
                total -= 1.8 * scale
            elif name in ("langle", "rangle"):
                total += POINTS["paren"] * scale
            else:
                total += (POINTS["top"] if name == "top" else POINTS["command"]) * scale
            continue
        if char.isupper():
            total += POINTS["upper"] * scale
        elif char.isdigit():
            total += POINTS["digit"] * scale
        elif char in "+-":
            total += POINTS["binop"] * scale
        elif char in "=<>":
            total += POINTS["relation"] * scale
        elif char in "()[]|.":
            total += (POINTS["tall-paren"] if tall else POINTS["paren"]) * scale
            tall = False
        elif char in ",;":
            total += POINTS["comma"] * scale
        else:
            total += POINTS["lower"] * scale
        index += 1
    return total


def _delimiters(content: str) -> tuple[str, str]:
    """Sized, breakable delimiters tall enough for the content."""
    if r"\frac" in content:
        return r"\biggl(", r"\biggr)"
    if r"\sqrt" in content or r"\sum" in content or r"\left" in content:
        return r"\Bigl(", r"\Bigr)"
    return r"\bigl(", r"\bigr)"


_BREAKABLE_FUNCTIONS = (sp.Min, sp.Max)
#: Functions whose argument may break across lines inside sized parentheses: ``\exp\Bigl( .. \Bigr)``.
_GROUP_FUNCTIONS = {sp.exp: r"\exp", sp.log: r"\log"}
#: The narrowest first line worth starting a broken expression on, in points.
_MIN_FIRST = 60.0
#: Room taken by a sized delimiter and the space around it, in points.
_DELIMITER = 12.0


def split_expression(expr, width: float, printer: LipboundLatexPrinter | None = None,
                     first: float | None = None) -> list[str]:
    r"""Break the LaTeX of ``expr`` into lines of at most about ``width`` points.

    Returns one string per line; the lines after the first continue the expression (a
    caller indents them).  ``first`` is the room on the first line (default ``width``).
    Breaks at top-level ``+``/``-``, inside the longest parenthesised sum (or
    ``\min``/``\max``) of a product with ``\bigl(``/``\bigr)`` delimiters, and after a
    leading ``\frac{c}{\cdot}`` factor; an expression with no break point stays on one line.
    """
    printer = printer or LipboundLatexPrinter()
    first = width if first is None else max(min(first, width), _MIN_FIRST)
    whole = printer.doprint(expr)
    if visual_width(whole) <= first or not isinstance(expr, sp.Basic):
        return [whole]
    if isinstance(expr, sp.Add):
        return _split_sum(expr, width, first, printer)
    if isinstance(expr, sp.Mul):
        return _split_product(expr, width, first, printer) or [whole]
    if isinstance(expr, _BREAKABLE_FUNCTIONS):
        return _split_extremum(expr, width, first, printer, "")
    if type(expr) in _GROUP_FUNCTIONS:
        return _split_function(expr, width, first, printer, "", "")
    if _is_group_power(expr):
        return _split_group(expr.base, width, first, printer, "", "", _power_tex(expr, printer))
    return [whole]


def _is_group_power(expr) -> bool:
    """``(a + b)^k`` or ``sqrt(a + b)``: a sum that can break inside sized parentheses."""
    return isinstance(expr, sp.Pow) and isinstance(expr.base, sp.Add) and (
        (expr.exp.is_Integer and expr.exp > 1) or expr.exp == sp.Rational(1, 2))


def _is_extremum_root(expr) -> bool:
    r"""``sqrt(min(a, b))``: written ``\min(a, b)^{1/2}`` when it must break."""
    return isinstance(expr, sp.Pow) and isinstance(expr.base, _BREAKABLE_FUNCTIONS) and expr.exp == sp.Rational(1, 2)


def _power_tex(expr: sp.Pow, printer) -> str:
    return "^{1/2}" if expr.exp == sp.Rational(1, 2) else "^{%s}" % printer._print(expr.exp)


def _split_sum(expr: sp.Add, width: float, first: float, printer) -> list[str]:
    pieces: list[list[str]] = []
    for position, term in enumerate(printer._as_ordered_terms(expr)):
        negative = term.could_extract_minus_sign()
        body = -term if negative else term
        sign = "- " if negative else ("+ " if position else "")
        room = width - (POINTS["binop"] if sign else 0.0)
        lines = split_expression(body, room, printer, first=(first if position == 0 else width) - (
            POINTS["binop"] if sign else 0.0))
        if sign:
            lines = [("{}" if position else "") + sign + lines[0]] + lines[1:]
        pieces.append(lines)
    return pack_lines(pieces, width, first)


def pack_lines(pieces: list[list[str]], width: float, first: float) -> list[str]:
    """Greedy filling: single-line pieces join the current line while it has room."""
    lines: list[str] = []
    current = ""
    for piece in pieces:
        room = first if not lines else width
        if len(piece) == 1 and (not current or visual_width(current + " " + piece[0]) <= room):
            joined = piece[0][2:] if current and piece[0].startswith("{}") else piece[0]
            current = (current + " " + joined).strip()  # "{}" (binary spacing) only starts a line
            continue
        if current:
            lines.append(current)
        lines.extend(piece[:-1])
        current = piece[-1]
    if current:
        lines.append(current)
    return lines


def _factor_tex(factor, printer) -> str:
    tex = printer._print(factor)
    if isinstance(factor, sp.Add):
        return r"\left(" + tex + r"\right)"
    return tex


def _split_product(expr: sp.Mul, width: float, first: float, printer) -> list[str] | None:
    sign = ""
    if expr.could_extract_minus_sign():
        sign, expr = "- ", -expr
    numerator, denominator = fraction(expr, exact=True)
    if denominator != 1:
        # c X / D is written (c / D) X so that X can break across lines
        coefficient, rest = numerator.as_coeff_Mul()
        if not (coefficient.is_Rational and coefficient > 0):
            coefficient, rest = sp.Integer(1), numerator
        top = sp.Integer(coefficient.p)
        bottom = denominator * coefficient.q
        prefix = sign + r"\frac{%s}{%s}" % (printer._print(top), printer._print(bottom))
        if isinstance(rest, sp.Add):
            return _split_group(rest, width, first, printer, prefix, "")
        lines = split_expression(rest, width, printer, first=first - visual_width(prefix))
        if len(lines) == 1:
            return None
        return [prefix + " " + lines[0]] + lines[1:]
    factors = ordered_factors(expr)
    candidates = [i for i, f in enumerate(factors) if _breakable(f, printer)]
    if not candidates:
        return None
    wide = [i for i in candidates if visual_width(_factor_tex(factors[i], printer)) > width / 3]
    if len(wide) > 1:  # several long factors: each breaks in turn, the product continues with \cdot
        return _split_factors(sign, factors, width, first, printer)
    chosen = max(candidates, key=lambda i: (visual_width(printer._print(factors[i])), -i))
    return _split_chosen(sign, factors, chosen, width, first, printer)


def _split_factors(sign: str, factors: list, width: float, first: float, printer) -> list[str]:
    r"""A product packed greedily: factors join the line while they fit; a factor that does not fit
    starts a new line after ``\cdot``, broken inside its own delimiters when it can be."""
    lines: list[str] = []
    current, room = sign.strip(), first
    for factor in factors:
        tex = _factor_tex(factor, printer)
        joined = (current + " " + tex).strip()
        if visual_width(joined) <= room:
            current = joined
            continue
        if current and visual_width(current) > room / 2:  # start the factor on a line of its own
            lines.append(current)
            current, room = r"{}\cdot", width
        if _breakable(factor, printer):
            pieces = _split_chosen(current + " " if current else "", [factor], 0, width, room, printer)
        else:
            pieces = [(current + " " + tex).strip()]
        lines.extend(pieces[:-1])
        current, room = pieces[-1], width
    if current:
        lines.append(current)
    return lines


def _breakable(factor, printer) -> bool:
    """A factor of a product that can break across lines."""
    grouped = type(factor) in _GROUP_FUNCTIONS or _is_extremum_root(factor)
    return isinstance(factor, (sp.Add,) + _BREAKABLE_FUNCTIONS) or _is_group_power(factor) or (
        grouped and visual_width(printer._print(factor)) > _MIN_FIRST)


def _split_chosen(sign: str, factors: list, chosen: int, width: float, first: float, printer) -> list[str]:
    """The product of ``factors`` broken inside ``factors[chosen]``."""
    before = " ".join(_factor_tex(f, printer) for f in factors[:chosen])
    after = " ".join(_factor_tex(f, printer) for f in factors[chosen + 1:])
    prefix = (sign + before).strip()
    target = factors[chosen]
    if isinstance(target, sp.Add):
        return _split_group(target, width, first, printer, prefix, after)
    if _is_group_power(target):
        return _split_group(target.base, width, first, printer, prefix, after, _power_tex(target, printer))
    if type(target) in _GROUP_FUNCTIONS:
        return _split_function(target, width, first, printer, prefix, after)
    power = ""
    if _is_extremum_root(target):
        target, power = target.base, "^{1/2}"
    lines = _split_extremum(target, width, first, printer, prefix)
    lines[-1] += power
    if after:
        lines[-1] += " " + after
    return lines


def _split_group(target: sp.Add, width: float, first: float, printer, prefix: str, after: str,
                 power: str = "") -> list[str]:
    r"""``prefix \bigl( target \bigr)^{power} after`` with the sum broken inside the delimiters.

    The prefix goes on a line of its own when it leaves too little room; a sum that fits on one
    line is still broken if the factors after it would overflow that line; factors that do not
    fit after the closing delimiter continue the product on a new line (``\cdot``).
    """
    room = first - visual_width(prefix) - 2 * _DELIMITER
    alone = room < _MIN_FIRST
    if alone:
        room = width - _DELIMITER
    lines = _split_sum(target, width - _DELIMITER, room, printer)
    if len(lines) == 1 and visual_width(lines[0] + after) > room:
        lines = _split_sum(target, width - _DELIMITER, room - visual_width(after), printer)
    opening, closing = _delimiters(" ".join(lines))
    lines = list(lines)
    lines[-1] += closing + power
    tail: list[str] = []
    if after and visual_width(lines[-1] + " " + after) > width:
        tail = [r"{}\cdot " + after]
    elif after:
        lines[-1] += " " + after
    if alone and prefix:
        return [prefix + " " + opening] + lines + tail
    lines[0] = (prefix + " " + opening).strip() + " " + lines[0]
    return lines + tail


def _split_function(expr, width: float, first: float, printer, prefix: str, after: str) -> list[str]:
    r"""``prefix \exp\Bigl( argument \Bigr) after`` (or ``\log``) with the argument broken inside."""
    opening_tex = (prefix + " " + _GROUP_FUNCTIONS[type(expr)]).strip()
    argument = expr.args[0]
    if isinstance(argument, sp.Add):
        return _split_group(argument, width, first, printer, opening_tex, after)
    room = first - visual_width(opening_tex) - 2 * _DELIMITER
    lines = split_expression(argument, width - _DELIMITER, printer, first=max(room, _MIN_FIRST))
    opening, closing = _delimiters(" ".join(lines))
    lines = _wrap(lines, opening_tex + opening, closing)
    if after and visual_width(lines[-1] + " " + after) > width:
        return lines + [r"{}\cdot " + after]
    if after:
        lines[-1] += " " + after
    return lines


def _split_extremum(expr, width: float, first: float, printer, prefix: str) -> list[str]:
    name = r"\min" if isinstance(expr, sp.Min) else r"\max"
    arguments = sorted(expr.args, key=default_sort_key)  # SymPy's order for Min/Max
    opening_room = visual_width(prefix + name) + _DELIMITER
    lines: list[str] = []
    for position, argument in enumerate(arguments):
        room = (first - opening_room) if position == 0 else width - _DELIMITER
        piece = split_expression(argument, width - _DELIMITER, printer, first=room)
        if position < len(arguments) - 1:
            piece[-1] += ","
        lines.extend(piece)
    opening, closing = _delimiters(" ".join(lines))
    return _wrap(lines, (prefix + " " + name + opening).strip(), closing)


def _wrap(lines: list[str], opening: str, closing: str) -> list[str]:
    lines = list(lines)
    lines[0] = opening + " " + lines[0]
    lines[-1] = lines[-1] + closing
    return lines


# --------------------------------------------------------------------------------------------
# Spreads named once
# --------------------------------------------------------------------------------------------
_KAPPAS = (S.kappa, S.causal_kappa)
#: A spread shorter than this (e.g. ``2 \|A\|_2 R^{2}``) stays inline, in points.
_SPREAD_INLINE_WIDTH = 100.0


def _spread_sites(expr) -> list:
    r"""Where a score spread appears in a bound: the second argument of :math:`\kappa_n`,
    :math:`\kappa^{\mathrm{c}}_n`, and exponents :math:`e^{\omega}`."""
    sites = []
    for node in sp.preorder_traversal(expr):
        if isinstance(node, _KAPPAS):
            sites.append(node.args[1])
        elif isinstance(node, sp.exp):
            sites.append(node.args[0])
    return sites


@final
class SpreadNames:
    r"""Long score spreads (inside :math:`\kappa_n(\cdot)` or :math:`e^{(\cdot)}`), named
    :math:`\bar\omega, \bar\omega_2, \ldots` in order of first definition."""

    def __init__(self):
        self.names: dict = {}
        #: spreads that some claim uses (see :meth:`expect`)
        self.pending: set = set()

    def expect(self, claims) -> None:
        """Note the long spreads that the claims use, so that their definitions get named."""
        for claim in claims:
            if isinstance(claim, sp.core.relational.Relational):
                self.pending |= self.wanted(claim.rhs) | self.wanted(claim.lhs)
            else:
                self.pending |= self.wanted(claim)

    def wanted(self, expr) -> set:
        """Long spreads that occur in ``expr`` where a score spread goes."""
        if not isinstance(expr, sp.Basic):
            return set()
        return {spread for spread in _spread_sites(expr)
                if not spread.is_Atom and visual_width(latex(spread)) > _SPREAD_INLINE_WIDTH}

    def name(self, spread) -> Described:
        if spread not in self.names:
            index = len(self.names) + 1
            self.names[spread] = Described(r"\bar{\omega}" if index == 1 else r"\bar{\omega}_{%d}" % index)
        return self.names[spread]

    def apply(self, expr):
        """``expr`` with every named spread written by its name."""
        if not self.names or not isinstance(expr, sp.Basic):
            return expr
        return expr.xreplace(self.names)
