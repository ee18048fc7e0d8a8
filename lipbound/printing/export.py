"""Results as JSON, with their LaTeX: what ``lipbound derive --json`` prints.

A :class:`~lipbound.symbolic.bound.Bound` becomes its expression (``srepr``, which SymPy reads
back), its LaTeX, the generic statement in the kernel constants, the assumptions, every
derivation step with its justification and lemma, and the theorem it comes from; a
:class:`~lipbound.symbolic.bound.NotLipschitz` becomes its witness family and growth.
"""

from __future__ import annotations

import sympy as sp

from ..symbolic.bound import Result
from ..symbolic.record import Derivation
from .latex import latex

__all__ = ["result_json", "steps_json"]


def steps_json(record: Derivation) -> list[dict]:
    """Every step: its claim (LaTeX), justification and lemma."""
    return [{"claim": step.claim if isinstance(step.claim, str) else latex(step.claim),
             "justification": step.justification, "lemma": step.lemma} for step in record.steps]


def result_json(result: Result) -> dict:
    """The JSON object of a derived result (see the module docstring)."""
    common = {"variant": result.variant, "norm": result.norm, "domain": result.domain,
              "assumptions": list(result.assumptions), "steps": steps_json(result.record), "theorem": result.theorem}
    if result.lipschitz:
        return {**common, "bound": sp.srepr(result.expr), "latex": latex(result.expr),
                "generic": sp.srepr(result.generic), "generic_latex": latex(result.generic),
                "provenance": result.provenance, "lipschitz": True,
                "facts": None if result.facts is None else result.facts.describe()}
    return {**common, "bound": sp.srepr(sp.oo), "latex": r"\infty", "lipschitz": False,
            "family": sp.srepr(result.family), "family_latex": latex(result.family),
            "growth": sp.srepr(result.growth), "growth_latex": latex(result.growth), "instance": result.instance}
