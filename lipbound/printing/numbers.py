r"""Numbers in papers and reports, rounded in the direction that keeps them true.

An upper bound is printed rounded up, a lower bound (a witness) rounded down, each to a few
significant digits, so that the printed number is still an upper (lower) bound:
``upper_latex(2116.41) == "2117"``, ``lower_latex(339.87) == "339.8"``.  The binary value of the
float is rounded exactly (:class:`decimal.Decimal`), never through a shorter decimal string.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from ..errors import AssumptionError

__all__ = ["directed", "upper_latex", "lower_latex"]

#: Fixed notation between these magnitudes, scientific outside.
_FIXED = (1e-3, 1e6)


def directed(value: float, up: bool, digits: int = 4) -> Decimal:
    """``value`` rounded to ``digits`` significant digits, up (``up=True``) or down."""
    if not math.isfinite(value):
        raise AssumptionError("value", "a finite number", repr(value), "print infinite bounds as text")
    if value == 0:
        return Decimal(0)
    exact = Decimal(value)  # the float's binary value, exactly
    exponent = exact.adjusted() - digits + 1
    return exact.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_CEILING if up else ROUND_FLOOR)


def _latex(number: Decimal) -> str:
    magnitude = abs(number)
    if number == 0 or _FIXED[0] <= magnitude < _FIXED[1]:
        text = format(number, "f")
        return text
    mantissa, exponent = format(number.normalize(), "e").split("e")
    return r"%s \times 10^{%d}" % (mantissa, int(exponent))


def upper_latex(value: float, digits: int = 4) -> str:
    """An upper bound, rounded up, as LaTeX math (``2117``, ``3.68 \\times 10^{5}``)."""
    return _latex(directed(value, True, digits))


def lower_latex(value: float, digits: int = 4) -> str:
    """A lower bound, rounded down, as LaTeX math."""
    return _latex(directed(value, False, digits))
