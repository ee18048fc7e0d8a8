"""Derived bounds against published claims on the same assumptions: a table, and a report each for
the claims that are not a closed-form bound on a variant.

For every claim with a closed-form statement, lipbound derives its own bound for the
same variant, norm and domain and decides symbolically which is smaller
(:func:`lipbound.symbolic.prover.compare`).  Each row carries the claim's provenance
tag, so an ``unverified`` transcription is never shown as a theorem.  :func:`claim_report`
relates the other claims to lipbound's theorems (:mod:`lipbound.symbolic.claim_theorems`) and
composition rules (:mod:`lipbound.symbolic.product_bounds`), in interval arithmetic where a
number decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import sympy as sp

from ..errors import AssumptionError
from ..rigorous.compiler import compile_interval
from ..rigorous.intervals import Verdict, certify_le, lower, upper
from . import symbols as S
from .assumptions import Assumptions, Ball, LayerNormImage, Unbounded, norm_from_key
from .claim_theorems import (
    bias_free_forms,
    bound_regions,
    explicit_step_slope,
    proximal_map,
    reduced_score,
    sigmoid_scalar_instance,
    softmax_inf_to_one,
)
from .claims import CLAIMS, PublishedClaim, tau
from .product_bounds import compose_constants, parse_constant, uniform_budget
from .prover import compare
from .registry import variant

__all__ = ["ComparisonRow", "comparison_rows", "claim_report", "scalar_instance_numbers", "PRODUCT_BOUND", "REPORTED",
           "SCALAR_INSTANCE"]

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
        missing = derived.expr.atoms(S.WeightQuantity) - item.statement.atoms(S.WeightQuantity)
        if missing:  # e.g. the offsets' maximum a of rotary heads, where the claim has the unrotated ||A||
            rows.append(ComparisonRow(item, derived.expr, item.statement, "the derived bound reads weight quantities "
                                      f"the claim has not ({', '.join(sorted(map(str, missing)))}): compared on "
                                      "weights only", ()))
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


# Claims that are not a closed-form upper bound on a variant: a report each -----------------------
#: The name ``lipbound compare`` takes for stated per-block constants that no claim names.
PRODUCT_BOUND = "product-bound"
_SIZES = (2, 8, 64, 1024)


def _interval_text(value) -> str:
    return f"[{lower(value):.6g}, {upper(value):.6g}]"


def _proof_lines(theorem) -> list[str]:
    return [f"    {step.justification}" + (f"  [{step.lemma}]" if step.lemma else "")
            for step in theorem.proof.steps]


def _exact_report(item: PublishedClaim) -> list[str]:
    theorem = softmax_inf_to_one()
    relation = "the claim is the theorem" if sp.simplify(item.statement - theorem.statement) == 0 else \
        "the claim differs from the theorem: run `lipbound check` for a refuting weight vector"
    return [f"  theorem: ||D_u softmax(u/tau)||_(inf->1) = {theorem.statement}, theta(p) = 1 - min_s (p^T s)^2 "
            f"({relation})", "  proof:", *_proof_lines(theorem),
            "  consequences: 1 - p_max^2 <= theta <= 1; theta = 1 iff the weights split into two halves of equal mass "
            "(the partition problem: NP-complete, so no formula in p decides it in general)",
            "  against softmax-half: every induced l_q -> l_q norm of J is at most 1/2 and at most theta; "
            "l_inf -> l_1 is not an induced l_q norm (p = (1/2, 1/2): ||J||_2 = 1/2, theta = 1): no contradiction"]


#: The scalar instance on which the two maps are compared exactly: n tokens in [-R, R], all weights 1.
SCALAR_INSTANCE = (16, sp.Rational(7, 4))


def scalar_instance_numbers() -> tuple[object, object, bool]:
    """``(witness, bound, refuted)`` on :data:`SCALAR_INSTANCE`: an interval below the sigmoid map's
    constant (its exact Jacobian norm at ``X = R 1``), one above the softmax map's (lipbound's
    theorem at ``||A|| = ||W_V|| = 1``), and whether the first certainly exceeds the second."""
    n, radius = SCALAR_INSTANCE
    witness = compile_interval(sigmoid_scalar_instance().statement, [S.n, S.R])(n, radius)
    bound = compile_interval(bias_free_forms()[1].xreplace({S.n: n}), [reduced_score])(radius ** 2)
    return witness, bound, certify_le(witness, bound) is Verdict.FAILS


def _comparison_report(item: PublishedClaim) -> tuple[list[str], bool]:
    sigmoid, softmax = bias_free_forms()
    n, radius = SCALAR_INSTANCE
    witness, bound, refuted = scalar_instance_numbers()
    lines = ["  lipbound's bounds for bias-free heads, divided by ||W_V||, in x = ||A|| R^2 "
             "(c = ||W_Q|| ||W_K|| / (sqrt(d_k) ||A||) >= 1):",
             f"    sigmoid <= {sigmoid}", f"    softmax <= {softmax}",
             "  limits (c = 1): x -> 0: sigmoid n/(n + 1), softmax 1 (sigmoid smaller); n -> infinity at fixed x > 0: "
             "sigmoid e^x (1 + 2x), softmax e^x + x (1 + e^x) (sigmoid larger by x (e^x - 1)); x -> infinity at fixed "
             "n: sigmoid ~ n x / 2, softmax ~ (1 + sqrt(3n)/2) x (sigmoid smaller iff n <= 6)",
             "  where the sigmoid bound is smaller (c = 1, proved on each piece by interval arithmetic):"]
    for size in _SIZES:
        pieces = [f"{relation} on [{a:.4g}, {b:.4g}]" for a, b, relation in bound_regions(size)]
        lines.append(f"    n = {size}: " + "; ".join(pieces))
    lines += ["  c > 1 raises the sigmoid bound only: its region shrinks. These compare bounds, not the maps.",
              f"  the maps on one instance (d = 1, all weights 1, no biases, n = {n}, R = {radius}): "
              f"Lip(sigmoid) >= n (sigma + 2 sigma' R^2) = {_interval_text(witness)} (exact Jacobian norm at X = R 1), "
              f"Lip(softmax) <= {_interval_text(bound)} (lipbound's theorem): "
              + ("the sigmoid map is less regular there: the pointwise reading is refuted" if refuted
                 else "undecided"),
              "  on real heads: `lipbound check sigmoid-regularity` (certified witnesses of both maps)"]
    return lines, refuted


def _product_report(total, blocks=(), residual: bool = False, layers: int = 1, weight="1") -> tuple[list[str], bool]:
    lines, refuted = [], False
    if total is not None:
        lines.append(f"  claimed total: {upper(parse_constant('claimed', total)):.6g}")
        for count in (len(blocks) * layers,) if blocks else (6, 12, 24, 48):
            plain, branch = uniform_budget(total, count), uniform_budget(total, count, residual=True)
            lines.append(f"    {count} equal blocks: each at most {lower(plain):.6g}, or residual branches x + f(x) "
                         f"with Lip(f) at most {lower(branch):.6g}")
    if blocks:
        composition = compose_constants(list(blocks), residual=residual, layers=layers, weight=weight)
        form = (f"residual blocks x + w f_i(x), w = {weight}: Lip <= prod_i (1 + w c_i)" if residual
                else "blocks one after another: Lip <= prod_i c_i")
        lines.append(f"  {composition.blocks} {form} (lipbound's composition and residual rules)")
        lines.append(f"  composed (lipbound's rules, interval arithmetic): {_interval_text(composition.value)}")
        if total is not None:
            answer = composition.against(total)
            refuted = answer is Verdict.FAILS
            lines.append("  verdict: " + {Verdict.HOLDS: "consistent: the claimed total follows from these constants",
                                          Verdict.FAILS: "REFUTED: these constants compose to more than the total"}
                         .get(answer, "not certified (rounding could decide)"))
    elif total is not None:
        lines.append("  no per-block constants stated: nothing to compose (pass --blocks)")
    return lines, refuted


def _proximal_report(item: PublishedClaim) -> list[str]:
    theorem = proximal_map()
    return [f"  theorem (the proximal reading): Lip(prox_phi) <= {theorem.statement} for every convex phi, "
            "every n, every parameter", "  proof:", *_proof_lines(theorem),
            "  what the abstract leaves open: the potential, and whether the solver meets the step condition; "
            "an explicit step y - grad phi(y) of the log-sum-exp potential phi(y) = tau log sum_j e^(q y_j / tau) has "
            f"the slope {str(explicit_step_slope(sp.Symbol('q'), tau)).replace('**', '^')} on 1^perp at 0 (n = 2): "
            "it grows with q^2 / tau",
            "  explicit softmax attention is not 1-Lipschitz independent of the parameters: at X = 0 its Jacobian is "
            "E -> mean(E) W_V, so Lip >= ||W_V||"]


def claim_report(key: str, *, blocks=(), residual: bool = False, layers: int = 1, weight="1",
                 claimed=None) -> tuple[list[str], bool]:
    """``(lines, refuted)``: lipbound's comparison for a claim that is not a closed-form upper bound on a
    variant (kinds ``exact``, ``comparison``, ``product`` and the proximal property), or for stated
    per-block constants (``key = "product-bound"``, total ``claimed``).  ``refuted`` is True only when
    the comparison refutes the claim with certainty."""
    if key == PRODUCT_BOUND:
        return _product_report(claimed, blocks, residual, layers, weight)
    item = CLAIMS[key]
    head = [f"{item.key} {item.provenance}", f"  claim: {item.title}"] + (
        [f"  reading: {item.reading}"] if item.reading else [])
    if item.kind == "exact":
        return head + _exact_report(item), False
    if item.kind == "comparison":
        lines, refuted = _comparison_report(item)
        return head + lines, refuted
    if item.kind == "product":
        lines, refuted = _product_report(item.statement, blocks or item.blocks, residual, layers, weight)
        return head + lines, refuted
    if key == "lipattn-1-lipschitz":
        return head + _proximal_report(item), False
    raise AssumptionError("claim", "a claim without a closed-form bound on a variant (see `lipbound list`)",
                          repr(key), "use comparison_rows for upper-bound claims")


#: Claims :func:`claim_report` describes.
REPORTED = tuple(key for key, item in CLAIMS.items()
                 if item.kind in ("exact", "comparison", "product") or key == "lipattn-1-lipschitz")
