"""The symbolic layer as a user sees it: assumptions, derivations, comparisons, asymptotics."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError
from lipbound.printing.export import result_json
from lipbound.rigorous.intervals import Verdict
from lipbound.symbolic import symbols as S
from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, NormAtLeast, Unbounded, norm_from_key
from lipbound.symbolic.asymptotics import dot_product_regimes, leading_term
from lipbound.symbolic.calculus import Inner, Norm
from lipbound.symbolic.claims import CLAIMS, TAGS
from lipbound.symbolic.lemmas import LEMMAS
from lipbound.symbolic.prover import compare
from lipbound.symbolic.registry import VARIANTS, variant
from lipbound.symbolic.scores import CustomScore, L2Distance
from lipbound.symbolic.variants import SelfAttention

#: The derivations are formed once per process (the theorems are cached): test_proofs regenerates them all,
#: test_symbolic and test_symbolic_modern form most of them again, so one xdist process runs the three modules.
pytestmark = pytest.mark.xdist_group("derivations")

A, W_V = S.MatrixNormSymbol("A"), S.MatrixNormSymbol("W_V")
#: Variants whose theorems need a bounded domain and claim nothing (no bound, no witness) beyond it.
BOUNDED_ONLY = ("sigmoid", "linear-elu")


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
            if (chosen.norms == ("w1",) or name in BOUNDED_ONLY) and not domain.bounded:
                with pytest.raises(AssumptionError, match="bounded domain"):  # lipbound claims nothing there
                    chosen.derive(Assumptions(domain=domain, norm=chosen.norms[0]), name)
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
    for _key, item in CLAIMS.items():
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


# ------------------------------------------------------------------------------------------------
# User-defined scores from text
# ------------------------------------------------------------------------------------------------
def test_a_score_from_text_is_the_score_built_from_classes():
    from lipbound.symbolic.custom import KEY, QUERY, custom_variant
    text_variant, facts = custom_variant("tau * Inner(q, k) / (Norm(q) * Norm(k))",
                                         ["Norm(q) >= m_Q", "m_K <= Norm(k)"])
    tau = [s for s in text_variant.score.expression().free_symbols if s.name == "tau"][0]
    by_hand = tau * Inner(QUERY, KEY) / (Norm(QUERY) * Norm(KEY))
    assert sp.simplify(text_variant.score.expression() - by_hand) == 0
    assert [fact.vector for fact in facts] == [QUERY, KEY]
    assert [str(fact.bound) for fact in facts] == ["m_Q", "m_K"]
    bound = text_variant.derive(Assumptions(domain=Ball(), facts=facts), "custom")
    reference = SelfAttention(CustomScore(by_hand)).derive(Assumptions(domain=Ball(), facts=facts), "custom")
    assert bound.expr == reference.expr


@pytest.mark.parametrize("text, fragment", [
    ("__import__('os').system('true')", "call __import__('os').system"),
    ("__import__('os')", "unknown function '__import__'"),
    ("Inner(q, k).__class__", "Attribute is not allowed"),
    ("(lambda: 1)()", "call"),
    ("[q for q in k]", "ListComp is not allowed"),
    ("Inner(q, k) if 1 else 0", "IfExp is not allowed"),
    ("q", "q is a vector"),
    ("Inner(q, k) + q", "adds a vector and a scalar"),
    ("Inner(q, k) ** q", "raises a vector"),
    ("Inner(q, k) ** 100", "exponent"),
    ("Inner(q, k) / foo", "unknown name 'foo'"),
    ("log(Inner(q, k))", "unknown function 'log'"),
    ("Norm(q)", "depends on both q and k"),
    ("Inner(q, k", "syntax error"),
    ("x" * 500, "at most 400 characters"),
])
def test_score_text_is_parsed_without_eval_and_errors_say_what_came(text, fragment):
    from lipbound.symbolic.custom import parse_score
    with pytest.raises(AssumptionError, match="score") as caught:
        parse_score(text)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_facts_from_text_and_the_missing_one_named():
    from lipbound.symbolic.custom import custom_variant, parse_fact
    assert parse_fact("Norm(q - k) >= 0.5").bound == sp.Rational(1, 2)
    for bad in ("Norm(q) >= 0", "q >= 1", "Norm(q) >= tau", "Norm(q) == m_Q", "Norm(q) >= m_Q >= 1"):
        with pytest.raises(AssumptionError, match="fact"):
            parse_fact(bad)
    chosen, facts = custom_variant("Inner(q, k) / Norm(q)")
    with pytest.raises(AssumptionError, match=r"lower bound on \|\|W_Q.T\*x\|\|"):
        chosen.derive(Assumptions(domain=Ball(), facts=facts))


# ------------------------------------------------------------------------------------------------
# Attention that is not a softmax: sigmoid attention and linear attention
# ------------------------------------------------------------------------------------------------
def _norm_values(expr, weights: dict, n: int, radius: float) -> dict:
    """Numbers for the symbols of a bound, computed here with numpy from the weights."""
    import numpy as np
    symbols = {name: sp.MatrixSymbol(name, *value.shape) for name, value in weights.items()}
    values = {}
    for symbol in expr.free_symbols:
        if isinstance(symbol, (S.MatrixNormSymbol, S.VectorNormSymbol)):
            if symbol.name == "A":
                matrix = weights["W_Q"] @ weights["W_K"].T / np.sqrt(weights["W_Q"].shape[1])
            else:
                parsed = sp.sympify(symbol.name, locals=symbols)
                matrix = np.array(parsed.subs({symbols[k]: sp.Matrix(v) for k, v in weights.items()})
                                  .doit().as_explicit(), dtype=float)
            values[symbol] = float(np.linalg.norm(matrix, 2))
        else:
            values[symbol] = {"n": n, "R": radius, "d_k": weights["W_Q"].shape[1], "d": weights["W_Q"].shape[0]}[
                symbol.name]
    return values


def _forward(kind: str, X, weights):
    """Sigmoid attention sigma(s - log n) with the biased dot-product score, or linear attention with
    phi = elu + 1 (Katharopoulos et al. 2020), written here independently of lipbound."""
    import numpy as np
    n, d_k = len(X), weights["W_Q"].shape[1]
    values = X @ weights["W_V"] + weights["b_V"].ravel()
    if kind == "sigmoid":
        scores = (X @ weights["W_Q"] + weights["b_Q"].ravel()) @ (X @ weights["W_K"] + weights["b_K"].ravel()).T
        return (1 / (1 + np.exp(-(scores / np.sqrt(d_k) - np.log(n))))) @ values
    phi = lambda u: np.where(u > 0, u + 1, np.exp(np.minimum(u, 0)))  # noqa: E731
    kernel = phi(X @ weights["W_Q"]) @ phi(X @ weights["W_K"]).T
    return (kernel / kernel.sum(axis=1, keepdims=True)) @ values


def _jacobian_norm(kind: str, X, weights, step: float = 1e-6) -> float:
    """Spectral norm of the Jacobian by central differences (the Frobenius-norm Lipschitz constant
    is its supremum over the domain)."""
    import numpy as np
    columns = []
    for index in range(X.size):
        E = np.zeros(X.size)
        E[index] = step
        E = E.reshape(X.shape)
        columns.append(((_forward(kind, X + E, weights) - _forward(kind, X - E, weights)) / (2 * step)).ravel())
    return float(np.linalg.norm(np.array(columns).T, 2))


@settings(max_examples=12)
@given(kind=st.sampled_from(["sigmoid", "linear-elu"]), n=st.integers(2, 4), d=st.integers(2, 4),
       d_k=st.integers(1, 3), scale=st.floats(0.2, 3.0), radius=st.floats(0.3, 3.0), seed=st.integers(0, 2 ** 16))
def test_sigmoid_and_linear_attention_bounds_hold_against_an_independent_jacobian(kind, n, d, d_k, scale, radius,
                                                                                   seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    weights = {"W_Q": rng.normal(size=(d, d_k)) * scale, "W_K": rng.normal(size=(d, d_k)) * scale,
               "W_V": rng.normal(size=(d, d)), "b_Q": rng.normal(size=(d_k, 1)), "b_K": rng.normal(size=(d_k, 1)),
               "b_V": rng.normal(size=(d, 1))}
    bound = variant(kind).derive(Assumptions(domain=Ball()), kind)
    expr = S.expand_special(bound.expr)
    value = float(sp.N(expr.xreplace(_norm_values(expr, weights, n, radius))))
    for _ in range(8):  # points with every token on the sphere of radius R, and inside
        X = rng.normal(size=(n, d))
        X *= radius * rng.uniform(0.6, 1.0, size=(n, 1)) / np.linalg.norm(X, axis=1, keepdims=True)
        assert _jacobian_norm(kind, X, weights) <= value


def test_no_theorem_is_claimed_for_sigmoid_or_linear_attention_off_bounded_domains():
    for name, theorem in (("sigmoid", "sigmoid-attention"), ("linear-elu", "self-attention")):
        assert variant(name).derive(Assumptions(domain=Ball()), name).theorem.startswith(theorem)
        with pytest.raises(AssumptionError, match="bounded domain"):
            variant(name).derive(Assumptions(domain=Unbounded()), name)
    facts = variant("sigmoid").head_facts
    assert facts.weights == "sigmoid" and not facts.covers(variant("dot-product").head_facts)
    assert not variant("dot-product").head_facts.covers(facts)


# ------------------------------------------------------------------------------------------------
# Notation and regimes
# ------------------------------------------------------------------------------------------------
def test_every_named_matrix_is_defined_before_it_is_used():
    """Regression: the proofs for dot-product attention used ||A|| without defining A."""
    from lipbound.symbolic.record import Defines
    for name in VARIANTS:
        chosen = variant(name)
        result = chosen.derive(Assumptions(domain=Ball(), norm=chosen.norms[0],
                                           tied=True if chosen.score.tied else None), name)
        if not result.lipschitz or S.MatrixNormSymbol("A") not in result.expr.free_symbols:
            continue
        steps = result.record.steps
        defined = next(i for i, step in enumerate(steps) if isinstance(step.claim, Defines)
                       and str(step.claim.lhs) == "A")
        used = next(i for i, step in enumerate(steps) if isinstance(step.claim, sp.Basic)
                    and S.MatrixNormSymbol("A") in step.claim.free_symbols)
        assert defined < used, name


def test_regimes_of_a_bound_agree_with_the_bound_written_by_hand():
    """docs/mathematics.md: without biases on B(0, R)^n the bound is
    ||W_V|| (sqrt(kappa) + ||A|| R^2 (1 + sqrt(min(kappa, 3n/4)))), kappa -> n as R -> oo and
    kappa -> 1 as R -> 0; so it grows like ||A|| ||W_V|| R^2 (1 + sqrt(3n/4)), tends to ||W_V||,
    and stays finite as n -> oo (kappa <= e^omega)."""
    from lipbound.symbolic.asymptotics import regimes
    expr = variant("dot-product-nobias").derive(Assumptions(domain=Ball()), "dot-product-nobias").expr
    large_radius, many_tokens, small_radius = regimes(expr)
    assert large_radius.exact and large_radius.exponent == 2
    assert sp.simplify(large_radius.leading - A * W_V * S.R ** 2 * (1 + sp.sqrt(3 * S.n / 4))) == 0
    assert many_tokens.exact and many_tokens.exponent == 0 and S.n not in many_tokens.leading.free_symbols
    assert small_radius.point == 0 and small_radius.leading == W_V
    biased = regimes(variant("dot-product").derive(Assumptions(domain=Ball()), "dot-product").expr)
    assert biased[0].exponent == 2 and not biased[0].exact  # a minimum SymPy cannot order: an upper regime
