"""Checkers of the published claims of 2024-2026 (docs/claims.md, "Recent claims").

Each checker takes ``(claim, seed, budget, weights)`` like those of :mod:`lipbound.numeric.claims`
and returns a :class:`~lipbound.numeric.claim_result.CheckResult`; each can refute the claim it is
given (tests feed every one a deliberately wrong variant).  Verdicts are decided in exact rational
arithmetic or with outward-rounded intervals.

* :func:`check_softmax_inf_to_one` -- ``||J||_{inf -> 1} = theta(p) / tau`` against the operator
  norm computed by its definition (the cube's vertices), exactly on rational weights and enclosed
  on float logits; the theorem's consequences (``theta <= 1``, ``theta = 1`` iff an equal split)
  checked on the same weights by an independent subset-sum test.
* :func:`check_sigmoid_regularity` -- the sandwich ``witness <= Lip <= bound`` of the sigmoid map
  and of the softmax map of the same head on the same ball; an instance decides the claim only when
  one map's certified witness beats the other's certified bound.
* :func:`check_product` -- stated per-block constants composed by lipbound's rules against the
  stated total, or, when the source states the total only, the per-block budgets it allows.
* :func:`check_proximal` -- a proximal map of a convex potential is 1-Lipschitz (lipbound's
  theorem), the constant 1 is attained, and what an explicit step or a truncated solver keeps.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
import sympy as sp

from ..rigorous.compiler import compile_interval
from ..rigorous.functions import maximum
from ..rigorous.intervals import IV, Verdict, certify_le, interval, lower, upper
from ..symbolic import symbols as S
from ..symbolic.assumptions import Assumptions, Ball
from ..symbolic.claim_table import SCALAR_INSTANCE
from ..symbolic.claim_theorems import (
    explicit_step_slope,
    prox_slope,
    proximal_map,
    sigmoid_scalar_instance,
    softmax_inf_to_one,
)
from ..symbolic.claims import PublishedClaim, p_max, tau, theta
from ..symbolic.product_bounds import compose_constants, constrained_layer, uniform_budget
from ..symbolic.registry import variant
from .certify import head_bounds
from .claim_result import CheckResult
from .domains import TokenBall
from .evaluate import symbol_intervals
from .model import Head, load_default
from .recheck import directional_norm
from .sigmoid import certified_ratio, sigmoid_witness
from .softmax_jacobian import balanced_mass, column_sum_norm, equal_split, inf_to_one_norm, softmax_enclosure
from .witness import search_witness

__all__ = ["RECENT_CHECKERS", "check_softmax_inf_to_one", "check_sigmoid_regularity", "check_product",
           "check_proximal", "proximal_solver_slope"]


# emadi-softmax-inf1 -------------------------------------------------------------------------------
_SPECIAL = [(1, 1), (3, 2), (3, 2, 1), (1, 1, 1), (5, 2, 1), (4, 3, 2, 1), (7, 5, 3, 1), (1,) * 6]


def _weights(rng: np.random.Generator, count: int) -> list[list[Fraction]]:
    cases = [list(w) for w in _SPECIAL] + [list(rng.integers(1, 30, int(rng.integers(2, 11)))) for _ in range(count)]
    return [[Fraction(int(v), int(sum(w))) for v in w] for w in cases]


def _claimed_exact(statement: sp.Expr, values: dict) -> Fraction | None:
    value = statement.xreplace({symbol: sp.Rational(values[symbol].numerator, values[symbol].denominator)
                                for symbol in statement.free_symbols})
    return Fraction(int(value.p), int(value.q)) if value.is_Rational else None


def _claimed_interval(statement: sp.Expr, values: dict):
    symbols = sorted(statement.free_symbols, key=str)
    return compile_interval(statement, symbols)(*[values[s] for s in symbols])


def _enclosed(value):
    """An interval of a Fraction (exactly enclosed) or of an interval."""
    return interval(sp.Rational(value.numerator, value.denominator)) if isinstance(value, Fraction) else value


def _refuted_equality(item: PublishedClaim, witness: dict, true_value, claimed) -> CheckResult:
    true_value, claimed = _enclosed(true_value), _enclosed(claimed)
    return CheckResult(item.key, "REFUTED", item.provenance, float(upper(claimed)), float(lower(true_value)), witness,
                       notes="the claimed value differs from the operator norm computed from its definition (an "
                             "equality is refuted in either direction)")


def check_softmax_inf_to_one(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """The claimed value against ``max_x ||J x||_1`` over the cube's vertices (module docstring)."""
    rng = np.random.default_rng(seed)
    cases = _weights(rng, 120 if budget >= 5 else 30)
    temperatures = (Fraction(1), Fraction(1, 2), Fraction(3))
    splits = 0
    for p in cases:
        norm, mass = inf_to_one_norm(p), balanced_mass(p)
        biggest = max(p)
        if not (1 - biggest ** 2 <= mass <= 1 and column_sum_norm(p) <= mass and (mass == 1) == equal_split(p)):
            raise AssertionError(f"theta's consequences fail at p = {[str(v) for v in p]}: a bug in lipbound")
        splits += mass == 1
        for temperature in temperatures:
            values = {theta: mass, tau: temperature, p_max: biggest, S.n: Fraction(len(p))}
            claimed = _claimed_exact(item.statement, {s: values[s] for s in item.statement.free_symbols})
            true_value = norm / temperature
            if claimed is None:
                claimed = _claimed_interval(item.statement,
                                            {s: _enclosed(values[s]) for s in item.statement.free_symbols})
                if certify_le(claimed, _enclosed(true_value)) is not Verdict.FAILS and \
                        certify_le(_enclosed(true_value), claimed) is not Verdict.FAILS:
                    continue
            elif claimed == true_value:
                continue
            return _refuted_equality(item, {"p": [str(v) for v in p], "tau": str(temperature),
                                            "operator norm (cube vertices, exact)": str(true_value),
                                            "claimed value": str(claimed)}, true_value, claimed)
    logits_checked = 0
    for _ in range(40 if budget >= 5 else 10):
        logits = rng.standard_normal(int(rng.integers(2, 9))) * float(rng.choice([0.3, 1.0, 4.0]))
        spread = float(rng.choice([0.5, 1.0, 2.0]))     # the temperature, a float here
        p = softmax_enclosure(logits.tolist(), spread)
        true_value = inf_to_one_norm(p) / interval(spread)
        values = {theta: balanced_mass(p), tau: interval(spread), p_max: maximum(*p), S.n: interval(len(p))}
        claimed = _claimed_interval(item.statement, {s: values[s] for s in item.statement.free_symbols})
        logits_checked += 1
        if certify_le(claimed, true_value) is Verdict.FAILS or certify_le(true_value, claimed) is Verdict.FAILS:
            return _refuted_equality(item, {"logits u": logits.tolist(), "tau": spread,
                                            "operator norm enclosure": f"[{lower(true_value)}, {upper(true_value)}]",
                                            "claimed enclosure": f"[{lower(claimed)}, {upper(claimed)}]"},
                                     true_value, claimed)
    proved = sp.simplify(item.statement - softmax_inf_to_one().statement) == 0
    sizes = sorted(len(p) for p in cases)
    witness = {"rational weight vectors": f"{len(cases)} (n = {sizes[0]} to {sizes[-1]}) at tau in 1, 1/2, 3: "
                                          "claimed value = operator norm exactly",
               "float logits": f"{logits_checked} (n = 2 to 8): the enclosures of the two agree",
               "p = (1/2, 1/2)": "theta = 1 (an equal split), while ||J||_2 = ||J||_1 = 1/2 (softmax-half)",
               "p = (3/5, 2/5)": f"theta = {balanced_mass([Fraction(3, 5), Fraction(2, 5)])} < 1",
               "theta = 1 exactly at the equal splits": f"{splits} of {len(cases)} vectors (subset-sum test agrees)"}
    return CheckResult(item.key, "confirmed" if proved else "not refuted", item.provenance, None, None, witness,
                       notes=("proved by lipbound (`lipbound compare emadi-softmax-inf1`, proofs/claims.tex): "
                              "J = diag(p) - p p^T is "
                              "positive semidefinite, so max_{s,t} t^T J s = max_s s^T J s = 1 - min_s (p^T s)^2. "
                              "Deciding theta = 1 is the partition problem (NP-complete). l_inf -> l_1 is not an "
                              "induced l_p norm: theta up to 1 and softmax-half's 1/2 do not contradict."
                              if proved else "no rational weights or logits refute the statement"))


# sigmoid-regularity -------------------------------------------------------------------------------
@functools.cache
def _sigmoid_theorem() -> sp.Expr:
    return variant("sigmoid").derive(Assumptions(domain=Ball()), "sigmoid").expr


def _sigmoid_bound(head: Head, radius: float, n: int) -> float:
    """lipbound's sigmoid theorem on the head's weights and the ball of radius ``radius`` about 0 (the
    head only carries the weights: its softmax facts are not the theorem's, so it is evaluated here,
    not through the dispatch)."""
    expr = _sigmoid_theorem()
    values = symbol_intervals(expr, head, domain=TokenBall(radius), n=n)
    symbols = sorted(expr.free_symbols, key=str)
    return upper(compile_interval(expr, symbols)(*[values[s] for s in symbols]))


def _softmax_sandwich(head: Head, radius: float, n: int, seed: int, budget: float, X=None, E=None):
    domain = TokenBall(radius)
    bound = min(b.value for b in head_bounds(head, domain, n) if b.certified)
    if X is None:
        found = search_witness(head, domain=domain, n=n, budget_seconds=budget, seed=seed)
        X, E = found.X, found.E
    return directional_norm(head, X, E)[0], bound


def _compare(sigmoid: tuple, softmax: tuple) -> tuple[str, str]:
    """The relation two certified sandwiches ``(witness, bound)`` decide, and a line that shows them."""
    (sig_low, sig_high), (soft_low, soft_high) = sigmoid, softmax
    if certify_le(sig_low, soft_high) is Verdict.FAILS:
        relation = "sigmoid less regular (certified)"
    elif certify_le(soft_low, sig_high) is Verdict.FAILS:
        relation = "sigmoid more regular (certified)"
    else:
        relation = "undecided"
    line = (f"sigmoid {sig_low:.4g} <= Lip <= {sig_high:.4g}; softmax {soft_low:.4g} <= Lip <= {soft_high:.4g}: "
            f"{relation}")
    return relation, line


def check_sigmoid_regularity(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Certified sandwiches of the sigmoid and softmax maps of the same heads on the same balls."""
    found: dict = {}
    # each softmax search's share of the budget
    count = 3 if budget >= 10 else 1
    per = max(0.5, budget / (6 * count))
    # the scalar instance: its witness is exact (claim_theorems.sigmoid_scalar_instance)
    n, radius = SCALAR_INSTANCE[0], float(SCALAR_INSTANCE[1])
    one = Head(np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)), name="scalar")
    X, E = np.full((n, 1), radius), np.ones((n, 1))
    closed = compile_interval(sigmoid_scalar_instance().statement, [S.n, S.R])(n, radius)
    relation, line = _compare((certified_ratio(one, X, E)[0], _sigmoid_bound(one, radius, n)),
                              _softmax_sandwich(one, radius, n, seed, per))
    found[f"d = 1, W_Q = W_K = W_V = 1, no biases, n = {n}, R = {radius}"] = (
        line + f" (the sigmoid witness at X = R 1 equals n (sigma + 2 sigma' R^2) = {lower(closed):.6g})")
    relations, spreads = [relation], []
    model = weights or load_default(layers=0)
    layer = model.layers[min(model.layers)]
    ln_radius = layer.ln_in.radius_about_origin if layer.ln_in is not None else 1.0
    n = 8
    for index, head in enumerate(layer.heads[:count]):
        # the same weights without a mask (the sigmoid map is defined for every dot-product head)
        kept = Head(head.W_Q, head.W_K, head.W_V, head.b_Q, head.b_K, head.b_V, kernel=head.kernel,
                    name=head.name)
        plain = Head(head.W_Q, head.W_K, head.W_V, kernel=head.kernel, name=f"{head.name} without biases")
        for label, target, R in (("biases kept", kept, 0.1), ("biases kept", kept, ln_radius),
                                 ("biases dropped", plain, 0.05)):
            _, X, E = sigmoid_witness(target, R, n, seed=seed, steps=int(20 + 10 * per))
            sigmoid = (certified_ratio(target, X, E)[0], _sigmoid_bound(target, R, n))
            softmax = _softmax_sandwich(target, R, n, seed, per)
            relation, line = _compare(sigmoid, softmax)
            relations.append(relation)
            if R == ln_radius:
                spreads.append(softmax[0] / sigmoid[0])
            found[f"layer {min(model.layers)} head {index}, {label}, R = {R:.4g}, n = {n}"] = line
    refuted = any(r == "sigmoid less regular (certified)" for r in relations)
    confirmed = sum(r == "sigmoid more regular (certified)" for r in relations)
    notes = ("refuted as read (pointwise in the weights, b = -log n, the same ball): on the instances marked "
             "'sigmoid less regular' a certified witness of the sigmoid map beats lipbound's certified bound on "
             "the softmax map. " if refuted else "no instance refutes the reading. ") + (
        f"{confirmed} instance(s) confirm it (the sigmoid bound is below the softmax witness); elsewhere lipbound "
        f"cannot decide. At the LayerNorm radius the softmax witnesses are {min(spreads):.3g} to {max(spreads):.3g} "
        "times the sigmoid witnesses (an indication of the claim there, not a proof). The abstract does not say in "
        "which sense regularity improves.")
    return CheckResult(item.key, "REFUTED" if refuted else "not refuted", item.provenance, None, None, found,
                       notes=notes)


# newhouse-* (products of per-block constants) ----------------------------------------------------
def check_product(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Stated per-block constants composed by lipbound's rules against the stated total."""
    total = item.statement
    if item.blocks:
        composition = compose_constants(list(item.blocks))
        answer = composition.against(total)
        verdict = {Verdict.FAILS: "REFUTED", Verdict.HOLDS: "confirmed"}.get(answer, "not certified")
        return CheckResult(item.key, verdict, item.provenance, upper(interval(total)), lower(composition.value),
                           {"composition": str(composition.theorem.statement), "blocks": len(item.blocks)},
                           notes="the stated per-block constants compose (lipbound's rules) to "
                                 + ("more than" if verdict == "REFUTED" else "at most") + " the stated total")
    found = {}
    for blocks in (6, 12, 24, 48):
        plain, branch = uniform_budget(total, blocks), uniform_budget(total, blocks, residual=True)
        found[f"{blocks} blocks"] = (f"each block at most {lower(plain):.6g}, or each residual branch x + f(x) "
                                     f"with Lip(f) at most {lower(branch):.6g}")
    layer = constrained_layer(heads=4, n=256, score_norm=Fraction(1, 64))
    allowed = IV.log(interval(total)) / IV.log(layer.layer)
    found["reference layer (lipbound's, not the paper's)"] = (
        f"4 heads, n = 256, score q.k/64 (||A|| <= 1/64), tokens of norm <= 1, ||W_V||, ||W_O||, ||W_1||, ||W_2|| "
        f"<= 1, a 1-Lipschitz activation, unit residual branches: attention {upper(layer.attention):.5g}, "
        f"feed-forward {upper(layer.feed_forward):.5g}, layer {upper(layer.layer):.5g}; the total allows "
        f"{math.floor(lower(allowed))} such layers")
    return CheckResult(item.key, "not refuted", item.provenance, upper(interval(total)), None, found,
                       notes="the abstract states the total only (no depth, no per-block constants): nothing to "
                             "refute. `lipbound compare product-bound --blocks ... --claimed B` composes stated "
                             "constants with lipbound's rules")


# lipattn-1-lipschitz ------------------------------------------------------------------------------
def proximal_solver_slope(h: Fraction, eta: Fraction, steps: int) -> Fraction:
    """The eigenvalue of ``D_X Y_K`` on ``1^perp`` at X = 0 for the log-sum-exp potential (Hessian
    eigenvalue h there): ``j_{k+1} = (1 - eta - eta h) j_k + eta``, ``j_0 = 1`` (exact)."""
    slope = Fraction(1)
    for _ in range(steps):
        slope = (1 - eta - eta * h) * slope + eta
    return slope


def check_proximal(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """The proximal reading: lipbound's theorem, the attained constant, an explicit step and a truncated
    solver on ``phi(y) = tau log sum_j e^{q y_j / tau}`` (n = 2, q = 10, tau = 1), all exact."""
    q, temperature, n = 10, 1, 2
    h = Fraction(q * q, n * temperature)                       # Hessian eigenvalue on 1^perp at y = 0
    L_phi = Fraction(q * q, 2 * temperature)                   # sup ||hess phi||: ||diag p - p p^T|| <= 1/2
    claimed = interval(item.statement)
    translation = 1  # prox(X + t 1) = prox(X) + t 1 exactly: phi(y + t 1) = phi(y) + q t
    explicit = explicit_step_slope(sp.Integer(q), sp.Integer(temperature), n)
    safe = Fraction(2) / (2 + L_phi)
    slopes = {f"eta = 1, K = {k}": proximal_solver_slope(h, Fraction(1), k) for k in (1, 3)}
    slopes.update({f"eta = 2/(2 + L_phi) = {safe}, K = {k}": proximal_solver_slope(h, safe, k) for k in (3, 30)})
    explicit_head = Head(np.ones((1, 1)), np.ones((1, 1)), 2 * np.ones((1, 1)), name="explicit")
    explicit_low = directional_norm(explicit_head, np.zeros((2, 1)), np.ones((2, 1)))[0]
    found = {"potential": f"phi(y) = tau log sum_j exp(q y_j / tau), q = {q}, tau = {temperature}, n = {n}: "
                          f"hess phi(0) has the eigenvalue {h} on 1^perp, L_phi = sup ||hess phi|| = {L_phi}",
             "exact prox at 0": f"Jacobian eigenvalues 1 (on 1: a translation of every token, exactly) and "
                                f"{prox_slope(sp.Integer(q), sp.Integer(temperature), n)} on 1^perp: the constant 1 "
                                "is attained",
             "explicit step y - grad phi(y) at 0": f"eigenvalue {explicit} on 1^perp: constant >= {abs(explicit)}, "
                                                   "growing with q^2 / tau",
             **{f"solver Y <- Y - eta (Y + grad phi(Y) - X), {key}": f"eigenvalue {float(value):.6g} on 1^perp: "
                f"constant >= {max(1.0, abs(float(value))):.6g}" for key, value in slopes.items()},
             "explicit softmax attention, W_V = 2 (d = 1, X = 0)": f"Lip >= {explicit_low:.6g} (certified)"}
    if certify_le(translation, claimed) is Verdict.FAILS:
        return CheckResult(item.key, "REFUTED", item.provenance, upper(claimed), float(translation), found,
                           notes="a proximal map of this convex potential moves with every translation of all tokens: "
                                 "its constant is exactly 1, more than claimed")
    proved = item.lipschitz and certify_le(1, claimed) is Verdict.HOLDS and proximal_map().statement == 1
    return CheckResult(item.key, "confirmed" if proved else "not refuted", item.provenance, upper(claimed), 1.0, found,
                       notes="confirmed for the proximal reading by lipbound's theorem (claim_theorems.proximal_map: "
                             "firm non-expansiveness, any n, any parameters); the paper's potential and solver are not "
                             "in the abstract. The constant holds for the exact prox: an explicit step, or a truncated "
                             "solver whose step exceeds 2/(2 + L_phi), stretches with the parameters (rows above).")


RECENT_CHECKERS = {
    "emadi-softmax-inf1": check_softmax_inf_to_one, "sigmoid-regularity": check_sigmoid_regularity,
    "newhouse-2-lipschitz": check_product, "newhouse-10-lipschitz": check_product, "newhouse-nanogpt": check_product,
    "lipattn-1-lipschitz": check_proximal,
}
