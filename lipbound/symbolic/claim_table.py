"""Derived bounds against published claims on the same assumptions: a table.

For every claim with a closed-form statement, lipbound derives its own bound for the
same variant, norm and domain and decides symbolically which is smaller
(:func:`lipbound.symbolic.prover.compare`).  Each row carries the claim's provenance
tag, so an ``unverified`` transcription is never shown as a theorem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import sympy as sp

from .assumptions import Assumptions, Ball, LayerNormImage, Unbounded, norm_from_key
from . import symbols as S
from .claims import CLAIMS, PublishedClaim
from .prover import compare
from .registry import variant

__all__ = ["ComparisonRow", "comparison_rows"]

_DOMAINS = {"ball": Ball, "layernorm": LayerNormImage, "unbounded": Unbounded}


@final
@dataclass(frozen=True)
class ComparisonRow:
    """One claim next to lipbound's derived bound under the same assumptions.

    ``relation`` is ``"derived <= claim (proved)"``, ``"derived < claim (proved)"``,
    ``"claim <= derived (proved)"``, ``"neither (refuted both ways)"`` or the verdict of
    the numeric fallback.
    """

    claim: PublishedClaim
    derived: sp.Expr
    published: sp.Expr
    relation: str
    steps: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"claim": self.claim.key, "tag": self.claim.tag, "source": self.claim.source,
                "variant": self.claim.variant, "norm": self.claim.norm, "domain": self.claim.domain,
                "derived": self.derived, "published": self.published, "relation": self.relation}


def _derived_for(item: PublishedClaim):
    tied = True if item.variant.startswith(("l2-tied", "multi-head-l2")) else None
    assumptions = Assumptions(domain=_DOMAINS[item.domain](), norm=norm_from_key(item.norm), tied=tied)
    return variant(item.variant).derive(assumptions, item.variant)


def comparison_rows(keys=None) -> list[ComparisonRow]:
    """A row per claim with a closed-form upper bound on an attention variant lipbound derives."""
    rows = []
    for key, item in CLAIMS.items():
        if keys is not None and key not in keys:
            continue
        if item.kind != "upper-bound" or item.statement is None:
            continue
        derived = _derived_for(item)
        if not derived.lipschitz:
            rows.append(ComparisonRow(item, sp.oo, item.statement,
                                      "the variant is not Lipschitz on this domain: the claim is false", ()))
            continue
        if item.statement.atoms(S.InfNormSymbol) and not derived.expr.atoms(S.InfNormSymbol):
            rows.append(ComparisonRow(item, derived.expr, item.statement,
                                      "different weight norms (l_inf vs spectral): compared on weights only", ()))
            continue
        forward = compare(derived.expr, item.statement)
        if forward.verdict == "proved":
            relation = "derived < claim (proved)" if forward.strict else "derived <= claim (proved)"
            steps = forward.steps
        else:
            backward = compare(item.statement, derived.expr)
            if backward.verdict == "proved":
                relation, steps = "claim <= derived (proved)", backward.steps
            elif forward.verdict == "refuted" and backward.verdict == "refuted":
                relation = "neither is smaller everywhere (both orders refuted)"
                steps = (f"derived > claim at {forward.counterexample}",
                         f"claim > derived at {backward.counterexample}")
            else:
                relation, steps = f"derived <= claim: {forward.verdict}", forward.steps
        rows.append(ComparisonRow(item, derived.expr, item.statement, relation, tuple(steps)))
    return rows
