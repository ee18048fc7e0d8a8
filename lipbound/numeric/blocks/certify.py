"""Certified constants of blocks: a theorem of :mod:`lipbound.symbolic.blocks`, evaluated rigorously.

:func:`derive_block` derives the theorem of a registry block (``layernorm``, ``feed-forward``,
...) in a norm, with or without a variance floor; :func:`evaluate_block` gives every symbol of its
statement an interval (certified spectral norms, the slope bound, the epsilon as the float the
model uses) and evaluates it with :func:`lipbound.rigorous.compiler.compile_interval`.  The upper
end is the certified constant, returned as a :class:`~lipbound.rigorous.value.CertifiedValue`.
"""

from __future__ import annotations

import math

from ...errors import AssumptionError
from ...rigorous.compiler import compile_interval
from ...rigorous.intervals import Verdict, interval, lower, upper
from ...rigorous.value import CertifiedValue, not_certified
from ...symbolic.assumptions import Assumptions, Unbounded
from ...symbolic.bound import Bound
from ...symbolic.registry import BLOCKS, variant

__all__ = ["derive_block", "evaluate_block", "enclose", "best", "NORMS"]

NORMS = ("fro", "2,1", "2,inf", "inf")


def derive_block(name: str, norm: str = "fro", floor: bool = False, domain=None) -> Bound:
    """The theorem of the registry block ``name`` in ``norm`` on all of ``R^d`` (with the block's
    variance floor stated when ``floor``), or on ``domain`` (a symbolic domain: ``Ball()`` for a
    gated block, which is Lipschitz on bounded sets only)."""
    if name not in BLOCKS:
        raise AssumptionError("block", f"one of {', '.join(BLOCKS)}", repr(name), "see `lipbound list`")
    if norm not in NORMS:
        raise AssumptionError("norm", f"one of {', '.join(NORMS)}", repr(norm), "e.g. norm='fro'")
    block = variant(name)
    facts = ()
    if floor:
        fact = block.floor_fact()
        if fact is None:
            raise AssumptionError("sigma_min", f"no variance floor for {name} (its norm does not read the input)",
                                  "a floor", "drop sigma_min")
        facts = (fact,)
    return block.derive(Assumptions(domain=domain or Unbounded(), norm=norm, facts=facts), name)


def enclose(expr, values: dict):
    """An interval holding ``expr`` with one interval (or exact number) per free symbol, by name."""
    symbols = sorted(expr.free_symbols, key=str)
    missing = [str(s) for s in symbols if str(s) not in values]
    if missing:
        raise AssumptionError("values", "an interval for every symbol of the statement", f"missing {missing}",
                              "pass them by name")
    return compile_interval(expr, symbols)(*[interval(values[str(s)]) for s in symbols])


def evaluate_block(bound: Bound, values: dict, name: str = "derived") -> CertifiedValue:
    """Evaluate ``bound`` with one interval (or exact number) per free symbol, by symbol name.

    The result's ``details`` hold the enclosure and the symbols' intervals."""
    result = enclose(bound.expr, values)
    details = {"interval": (lower(result), upper(result)), "theorem": bound.theorem, "norm": bound.norm,
               "symbols": {str(s): (lower(interval(values[str(s)])), upper(interval(values[str(s)])))
                           for s in sorted(bound.expr.free_symbols, key=str)}}
    provenance = f"lipbound theorem {bound.theorem} ({bound.variant}, norm {bound.norm})"
    if not math.isfinite(upper(result)):
        return not_certified(name, provenance, "the interval evaluation overflowed", **details)
    return CertifiedValue(name, upper(result), Verdict.HOLDS, provenance, details=details)


def best(values: list[CertifiedValue]) -> CertifiedValue | None:
    """The smallest certified value (None if none is certified)."""
    certified = [v for v in values if v.certified and v.proven]
    return min(certified, key=lambda v: v.value) if certified else None
