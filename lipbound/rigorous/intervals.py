"""Intervals with outward rounding, and the three-valued verdict of every certified decision.

Every interval of lipbound lives in one private :class:`mpmath.ctx_iv.MPIntervalContext`,
:data:`IV`, at 53 bits by default.  Precision is raised only inside :func:`precision`
blocks, and only for that context: importing lipbound changes no process-wide setting
(``mpmath.iv.prec`` is left alone).

:func:`interval` turns any exact number (int, float taken exactly, SymPy rational,
decimal string enclosed outward, a pair ``(lo, hi)``) into an interval; :func:`upper` and
:func:`lower` give its ends as floats rounded outward; :func:`certify_le` decides
``a <= b`` with :class:`Verdict` -- ``UNKNOWN`` whenever rounding could decide it.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math

from mpmath import libmp
from mpmath.ctx_iv import MPIntervalContext

from ..errors import AssumptionError, NotCertifiedError

__all__ = ["IV", "Verdict", "interval", "point", "hull", "lower", "upper", "upper_product", "certify_le",
           "precision", "is_interval"]

#: The interval context of lipbound (outward rounding; 53 bits unless raised by :func:`precision`).
IV = MPIntervalContext()
IV.prec = 53


class Verdict(enum.Enum):
    """The three-valued answer of every certified decision and assumption query.

    ``HOLDS``: proved (an assumption stated true, an inequality certified, a claim confirmed);
    ``FAILS``: disproved with certainty (a claim refuted); ``UNKNOWN``: not decided -- an
    assumption not stated, or a comparison that rounding could flip ("not certified").
    An unknown is never a pass: ``bool(verdict)`` raises.
    """

    HOLDS = "holds"
    FAILS = "fails"
    UNKNOWN = "unknown"

    def __bool__(self):
        raise TypeError("Verdict is three-valued: compare with Verdict.HOLDS explicitly")

    @classmethod
    def of(cls, value: bool | None) -> Verdict:
        """``None`` -> UNKNOWN, ``True`` -> HOLDS, ``False`` -> FAILS."""
        return cls.UNKNOWN if value is None else (cls.HOLDS if value else cls.FAILS)


def is_interval(value) -> bool:
    return hasattr(value, "_mpi_")


def _raw(x) -> tuple:
    """The raw endpoints ``(lo, hi)`` (mpmath's mpf tuples) of an interval."""
    return x._mpi_


def point(raw):
    """The point interval of a raw mpf tuple."""
    return IV.make_mpf((raw, raw))


def interval(value):
    """An interval of :data:`IV` enclosing ``value``.

    Accepts an interval (of any mpmath interval context), an int, a float (taken exactly), an
    ``mpmath.mpf`` or SymPy ``Float`` (its exact binary value), a SymPy ``Rational`` (enclosed
    outward), a decimal string (enclosed outward), or a pair ``(lo, hi)``.
    """
    if hasattr(value, "_mpi_"):
        return IV.make_mpf(value._mpi_)
    if hasattr(value, "_mpf_"):
        raw = value._mpf_
        return IV.make_mpf((raw, raw))
    if hasattr(value, "p") and hasattr(value, "q") and isinstance(value.q, int):
        return IV.mpf(int(value.p)) / IV.mpf(int(value.q))
    if isinstance(value, (tuple, list)) and len(value) == 2:
        lo_raw, hi_raw = _raw(interval(value[0]))[0], _raw(interval(value[1]))[1]
        if libmp.mpf_gt(lo_raw, hi_raw):
            raise AssumptionError("interval", "lo <= hi", f"({value[0]}, {value[1]})", "swap the endpoints")
        return IV.make_mpf((lo_raw, hi_raw))
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise AssumptionError("value", "a number", repr(value), "pass an int, a float or an interval")
    if type(value).__module__ == "numpy":  # numpy scalars, without importing numpy here
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        raise NotCertifiedError("value", "a number", "NaN", "the computation that produced it failed; check its inputs")
    if isinstance(value, (int, float, str)):
        return IV.mpf(value)
    raise AssumptionError("value", "a number or an interval", type(value).__name__,
                          "pass an int, a float, a fraction or an interval")


def hull(*values):
    """The smallest interval containing every argument."""
    raws = [_raw(interval(v)) for v in values]
    key = functools.cmp_to_key(libmp.mpf_cmp)
    return IV.make_mpf((min((r[0] for r in raws), key=key), max((r[1] for r in raws), key=key)))


def _to_float(raw, upward: bool) -> float:
    if raw == libmp.fnan:
        raise NotCertifiedError("interval endpoint", "a number", "NaN", "check the inputs of the evaluation")
    value = libmp.to_float(raw)  # nearest; corrected below
    exact = libmp.from_float(value)
    if upward and libmp.mpf_lt(exact, raw):
        value = math.nextafter(value, math.inf)
    elif not upward and libmp.mpf_gt(exact, raw):
        value = math.nextafter(value, -math.inf)
    return value


def upper(x) -> float:
    """The upper end of ``interval(x)`` as a float rounded up."""
    return _to_float(_raw(interval(x))[1], upward=True)


def upper_product(*values) -> float:
    """An upper bound, rounded up, on the product of the arguments (the Lipschitz constant of a composition
    from its factors'); 1 for none."""
    total = interval(1.0)
    for value in values:
        total = total * interval(value)
    return upper(total)


def lower(x) -> float:
    """The lower end of ``interval(x)`` as a float rounded down."""
    return _to_float(_raw(interval(x))[0], upward=False)


def certify_le(a, b) -> Verdict:
    """Decide ``a <= b`` for intervals or exact numbers.

    ``HOLDS`` if ``sup a <= inf b``, ``FAILS`` if ``inf a > sup b``, otherwise ``UNKNOWN``
    (the enclosures overlap: rounding could decide either way).
    """
    a_lo, a_hi = _raw(interval(a))
    b_lo, b_hi = _raw(interval(b))
    if libmp.mpf_le(a_hi, b_lo):
        return Verdict.HOLDS
    if libmp.mpf_gt(a_lo, b_hi):
        return Verdict.FAILS
    return Verdict.UNKNOWN


@contextlib.contextmanager
def precision(bits: int):
    """Raise the precision of :data:`IV` to ``bits`` inside the block (never lowers it)."""
    before = IV.prec
    IV.prec = max(before, int(bits))
    try:
        yield IV
    finally:
        IV.prec = before
