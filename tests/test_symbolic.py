"""The symbolic layer as a user sees it: assumptions, derivations, comparisons, asymptotics."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sympy as sp

from lipbound.rigorous.intervals import Verdict
from lipbound.printing.export import result_json
from lipbound.symbolic.assumptions import (Assumptions, Ball, LayerNormImage, NormAtLeast, Unbounded, norm_from_key)
from lipbound.errors import AssumptionError
from lipbound.symbolic import symbols as S
from lipbound.symbolic.asymptotics import dot_product_regimes, leading_term
from lipbound.symbolic.calculus import Inner, Norm
from lipbound.symbolic.claims import CLAIMS, TAGS
from lipbound.symbolic.prover import compare
from lipbound.symbolic.lemmas import LEMMAS
from lipbound.symbolic.registry import VARIANTS, variant
from lipbound.symbolic.scores import CustomScore, L2Distance
from lipbound.symbolic.variants import SelfAttention

A, W_V = S.MatrixNormSymbol("A"), S.MatrixNormSymbol("W_V")


def covariance_route_bound():
    """The plain covariance-route bound of docs/mathematics.md section 2, with every kernel constant
    at its crude value: ||W_V|| (sqrt(kappa) + ||A|| R^2 (1 + sqrt(kappa))), omega = 2 ||A|| R^2."""
    k = S.kappa(S.n, 2 * A * S.R ** 2)
    return W_V * (sp.sqrt(k) + A * S.R ** 2 * (1 + sp.sqrt(k)))


def test_importing_the_symbolic_layer_does_not_import_cvxpy_or_scipy():
    code = ("import sys, lipbound.symbolic.registry, lipbound.symbolic.claims, lipbound.symbolic.prover, "
            "lipbound.printing.latex; bad = [m for m in ('cvxpy', 'scipy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_three_valued_assumptions_never_pass_an_unknown():
    unknown = Assumptions()
    assert unknown.ask("tied") is Verdict.UNKNOWN
    with pytest.raises(TypeError):
        bool(unknown.ask("tied"))
    with pytest.raises(AssumptionError, match="tied: expected known true"):
        unknown.require("tied", "the global L2 theorem")
    assert Assumptions(tied=True).ask("tied") is Verdict.HOLDS
    with pytest.raises(AssumptionError, match="radius"):
        Ball(radius=-1)
    with pytest.raises(AssumptionError, match="norm"):
        norm_from_key("l7")
    with pytest.raises(AssumptionError, match="n: expected a positive integer"):
        Assumptions(n=sp.Rational(1, 2))


def test_every_registry_variant_derives_on_every_domain_with_a_complete_record():
    for name in VARIANTS:
        for domain in (Ball(), LayerNormImage(), Unbounded()):
            chosen = variant(name)
            if chosen.norms == ("w1",) and not domain.bounded:
                with pytest.raises(AssumptionError, match="bounded domain"):  # no W1 claim off bounded domains
                    chosen.derive(Assumptions(domain=domain, norm="w1"), name)
                continue
            result = chosen.derive(Assumptions(domain=domain, norm=chosen.norms[0]), name)
            assert result.record.steps, name
            for step in result.record.steps:
                assert step.justification
                assert step.lemma is None or step.lemma in LEMMAS, (name, step.lemma)
            if result.lipschitz:
                assert result.expr.free_symbols and result.expr.is_positive is not False


def test_a_norm_a_variant_does_not_use_is_refused_not_ignored():
    """Regression: `derive measure-w1 --norm fro` silently answered in W1."""
    with pytest.raises(AssumptionError, match="norm: expected 'w1'"):
        variant("measure-w1").derive(Assumptions(domain=Ball(), norm="fro"))
    with pytest.raises(AssumptionError, match="norm: expected a norm on X"):
        variant("dot-product").derive(Assumptions(domain=Ball(), norm="w1"))


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(AssumptionError, match="variant: expected one of .*Fix: run `lipbound list`"):
        variant("softmax-of-doom")


def test_dot_product_bound_is_no_looser_than_the_plain_covariance_route():
    derived = variant("dot-product-nobias").derive(Assumptions(domain=Ball()), "x")
    result = compare(derived.expr, covariance_route_bound())
    assert result.verdict == "proved", result
    assert compare(covariance_route_bound(), derived.expr).verdict != "proved"  # strictly tighter somewhere


def test_dot_product_bound_is_strictly_tighter_than_recalled_castin():
    derived = variant("dot-product-nobias").derive(Assumptions(domain=Ball()), "x")
    castin = CLAIMS["castin-theorem"].statement
    result = compare(derived.expr, castin)
    assert result.verdict == "proved" and result.strict, result
    ratio = sp.limit(leading_term(derived.closed_form(), S.R) / leading_term(castin, S.R), S.n, sp.oo)
    assert ratio == sp.Rational(1, 4), "for large R and n, ours / Castin -> (sqrt(3)/2) / (2 sqrt(3)) = 1/4"


def test_compare_finds_where_an_order_fails():
    result = compare(S.n, sp.sqrt(S.n) * S.R)
    assert result.verdict == "refuted" and result.counterexample


def test_dot_product_regimes_by_sympy_limits():
    derived = variant("dot-product-nobias").derive(Assumptions(domain=Ball()), "x")
    regimes = dot_product_regimes(derived.expr)
    assert regimes.n_exponent == sp.Rational(1, 2)                      # Theta(sqrt n) for large R
    assert sp.simplify(regimes.large_radius_in_n - sp.sqrt(3) / 2 * A * W_V * S.R ** 2 * sp.sqrt(S.n)) == 0
    assert regimes.small_scale == W_V and S.n not in regimes.small_scale.free_symbols   # ||A|| R^2 -> 0
    assert S.n not in regimes.mean_field.free_symbols                   # n -> oo at fixed R: finite


def test_unbounded_domain_dot_product_is_not_lipschitz_with_family():
    result = variant("dot-product").derive(Assumptions(domain=Unbounded()), "dot-product")
    assert result.lipschitz is False
    assert result.limit == sp.oo
    assert result_json(result)["lipschitz"] is False


def test_tied_l2_has_a_global_bound_and_untied_does_not():
    tied = variant("l2-tied").derive(Assumptions(domain=Unbounded(), tied=True), "l2-tied")
    assert tied.lipschitz and S.R not in tied.expr.free_symbols
    assert tied.expr.has(S.lambert_level)
    untied = variant("l2-untied").derive(Assumptions(domain=Unbounded()), "l2-untied")
    assert untied.lipschitz is False
    plain = variant("l2-tied-plain-values").derive(Assumptions(domain=Unbounded()), "x")
    assert plain.lipschitz is False and sp.limit(plain.growth, S.t, sp.oo) == sp.oo
    with pytest.raises(AssumptionError, match="tied"):
        SelfAttention(L2Distance(tied=True)).derive(Assumptions(domain=Unbounded(), tied=False))


def test_user_defined_cosine_score_needs_and_uses_a_norm_floor():
    q, k = S.W_Q.T * S.x, S.W_K.T * S.y
    tau = S.RadiusSymbol("tau")
    score = CustomScore(tau * Inner(q, k) / (Norm(q) * Norm(k)), name="cosine-exact")
    with pytest.raises(AssumptionError, match=r"positive lower bound on \|\|W_[QK].T\*[xy]\|\|"):
        SelfAttention(score).derive(Assumptions(domain=Ball()))
    m_Q, m_K = S.LowerBoundSymbol("m_Q"), S.LowerBoundSymbol("m_K")
    facts = (NormAtLeast(q, m_Q), NormAtLeast(k, m_K))
    bound = SelfAttention(score).derive(Assumptions(domain=Ball(), facts=facts))
    assert {m_Q, m_K} <= bound.expr.free_symbols
    constants = score.kernel_constants(Assumptions(domain=Ball(), facts=facts))
    assert 2 * tau in constants.omega.args     # |cos| <= 1: the calculus finds the range 2 tau
    assert constants.beta == 2 * tau * S.MatrixNormSymbol("W_K") / m_K


def test_user_defined_polynomial_score():
    M = sp.MatrixSymbol("M", S.d, S.d)
    score = CustomScore(Inner(S.x, M * S.y) ** 2, name="polynomial")
    constants = score.kernel_constants(Assumptions(domain=Ball()))
    norm_M = S.MatrixNormSymbol("M")
    assert constants.beta == 2 * norm_M ** 2 * S.R ** 3
    assert constants.omega == norm_M ** 2 * S.R ** 4   # a square: range at most sup |s|
    bound = SelfAttention(score).derive(Assumptions(domain=Ball()))
    assert bound.lipschitz and norm_M in bound.expr.free_symbols


def test_bound_api_subs_evaluate_lambdify():
    bound = variant("dot-product-nobias").derive(Assumptions(domain=Ball()), "x")
    values = {"A": 0.869, "W_V": 1.547, "R": 20.25, "n": 8}
    value = bound.evaluate(values)
    symbols, function = bound.lambdify("numpy")
    assert abs(function(*[values[str(s)] for s in symbols]) - value) < 1e-9 * value
    symbols, function = bound.lambdify("mpmath")
    assert abs(float(function(*[values[str(s)] for s in symbols])) - value) < 1e-9 * value
    with pytest.raises(AssumptionError, match="missing"):
        bound.evaluate({"A": 1})


def test_claims_carry_provenance():
    for key, item in CLAIMS.items():
        assert item.tag in TAGS
        assert item.provenance.startswith(f"[{item.tag}]")
        assert item.source
    assert not CLAIMS["castin-theorem"].is_theorem and CLAIMS["castin-code"].is_theorem
    # both Lambert W readings of Kim et al. are carried, and differ
    a, b = CLAIMS["kim-l2-fro"].statement, CLAIMS["kim-l2-fro-wn"].statement
    point = {s: 1 for s in a.free_symbols}
    point[S.n] = 8
    assert float(b.xreplace(point)) > float(a.xreplace(point))


def test_lambert_levels_match_the_reference_values():
    expected = {2: 0.278464542761, 8: 0.973138752867, 32: 1.82978741244, 1000: 4.42050160394}
    for n, value in expected.items():
        assert abs(float(sp.N(S.lambert_level(sp.Integer(n)), 20)) - value) < 1e-11
