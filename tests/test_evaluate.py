"""Rigorous evaluation of symbolic bounds on weights, checked three ways:

* against an independent high-precision evaluation (every norm recomputed with mpmath's
  SVD at 40 digits from the exact float entries, the closed form evaluated in mpmath);
* against witnesses: Jacobian norms of the real attention map at inputs in the domain
  (a certified upper bound must exceed every one of them);
* against figures computed independently on all-MiniLM-L6-v2, layer 0, head 0 (n = 8,
  R = 20.25): ||A|| ||W_V|| = 1.34 computed by numpy's SVD on the embedded weights, and the
  covariance bound ||W_V|| (sqrt(kappa) + ||A|| R^2 (1 + sqrt(kappa))) = 2116 evaluated in double
  precision at those norms.

A bound is evaluated only on heads its theorem covers: each variant is checked on a head of its
own kind, and a head of another kind is refused.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy as sp
from mpmath import mp

from lipbound.errors import AssumptionError, NotCertifiedError
from lipbound.numeric import attention
from lipbound.numeric.dispatch import head_facts
from lipbound.numeric.domains import DomainSpec, LayerNormOutputs, TokenBall
from lipbound.numeric.evaluate import evaluate_bound, symbol_intervals
from lipbound.numeric.kernels import KERNELS, AttentionMask
from lipbound.numeric.model import Head, Layer, LayerNorm, TransformerLayer, load_default
from lipbound.rigorous.intervals import Verdict, certify_le, upper
from lipbound.symbolic import symbols as S
from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, Unbounded
from lipbound.symbolic.monotone import is_nondecreasing
from lipbound.symbolic.registry import VARIANTS, variant

DIGITS = 40


@pytest.fixture(scope="module")
def minilm():
    return load_default()


def small_head(seed: int, tied: bool = False, *, score: str = "dot", score_biases: bool = True,
               causal: bool = False, kim_values: bool = False, tau: float = 1.0, eps: float = 1.0) -> Head:
    """A random head of the given kind (the same draws for every kind: only the kind differs).

    ``score_biases=False`` drops the query and key biases (the score's biases); the value bias stays.
    """
    rng = np.random.default_rng(seed)
    W_Q = rng.standard_normal((6, 3)) / 2
    W_K = W_Q if tied else rng.standard_normal((6, 3)) / 2
    W_V, b_Q = rng.standard_normal((6, 4)) / 2, rng.standard_normal(3) / 4
    b_K, b_V = rng.standard_normal(3) / 4, rng.standard_normal(4) / 4
    if not score_biases:
        b_Q = b_K = None
    kernel = KERNELS[score](tau=tau, eps=eps) if score == "cosine" else KERNELS[score]()
    return Head(W_Q=W_Q, W_K=W_K, W_V=W_V, b_Q=b_Q, b_K=b_K, b_V=b_V, kernel=kernel,
                mask=AttentionMask(causal=causal), kim_values=kim_values)


def small_layer(seed: int) -> TransformerLayer:
    rng = np.random.default_rng(seed)
    heads = (small_head(seed), small_head(seed + 1))
    return TransformerLayer(0, Layer(heads, rng.standard_normal((8, 6)) / 3, rng.standard_normal(6)),
                            ln_in=LayerNorm(1 + rng.uniform(-0.5, 0.5, 6), rng.standard_normal(6) / 3))


# An independent high-precision reference ----------------------------------------------------------
def _mp(array) -> mpmath.matrix:
    array = np.asarray(array, dtype=float)
    return mp.matrix([[mp.mpf(float(v)) for v in np.atleast_1d(row)] for row in np.atleast_2d(array)]) \
        if array.ndim == 2 else mp.matrix([mp.mpf(float(v)) for v in array])


def _mp_expr(expr, env):
    if isinstance(expr, sp.MatrixSymbol):
        return env[expr.name]
    if isinstance(expr, sp.Transpose):
        return _mp_expr(expr.arg, env).T
    if isinstance(expr, sp.MatAdd):
        parts = [_mp_expr(a, env) for a in expr.args]
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total
    if isinstance(expr, sp.MatMul):
        scalar = sp.Mul(*[a for a in expr.args if not a.is_Matrix])
        product = None
        for factor in (a for a in expr.args if a.is_Matrix):
            value = _mp_expr(factor, env)
            product = value if product is None else product * value
        return mp.mpf(sp.N(scalar, DIGITS + 10)) * product
    raise TypeError(expr)


def _mp_norm(M) -> mpmath.mpf:
    if M.cols == 1 or M.rows == 1:
        return mp.sqrt(mp.fsum(v ** 2 for v in M))
    return max(mp.svd_r(M, compute_uv=False))


def reference_value(expr, heads, layer, domain, n, m=None):
    """The bound at the exact norms (maximum over heads per symbol), in mpmath at 40 digits."""
    d, d_k, d_v = heads[0].d, heads[0].d_k, heads[0].d_v
    sizes = {"n": n, "m": m, "d": d, "d_k": d_k, "d_v": d_v, "H": len(heads)}
    radius, center = domain.enclosing_ball()
    center = np.zeros(d) if center is None else center
    values = {}
    with mp.workdps(DIGITS):
        for symbol in expr.free_symbols:
            name = str(symbol)
            if name in sizes:
                values[symbol] = mp.mpf(sizes[name])
            elif name == "R":
                uses_c = any(S.c in S.NORM_OF.get(str(s), sp.ZeroMatrix(1, 1)).atoms(sp.MatrixSymbol)
                             for s in expr.free_symbols)
                values[symbol] = mp.mpf(radius) + (0 if uses_c else _mp_norm(_mp(center)))
            elif name == "gamma_max":
                values[symbol] = mp.mpf(domain.norm.gamma_max)
            elif name in ("tau", "epsilon"):
                values[symbol] = mp.mpf(heads[0].kernel.symbol_values()[name])
            else:
                named = [(k, s) for k, (label, s) in S.NAMED_MATRICES.items() if label == name and "W*" not in k]
                key, scalar = named[0] if named else (name, sp.Integer(1))
                matrix = S.NORM_OF[key]
                scalar = mp.mpf(sp.N(scalar.subs({S.d_k: d_k}), DIGITS + 10))
                norms = []
                for head in heads:
                    env = {"W_Q": _mp(head.W_Q), "W_K": _mp(head.W_K), "W_V": _mp(head.W_V), "W": _mp(head.W_Q),
                           "b_Q": _mp(head.b_Q), "b_K": _mp(head.b_K), "b_V": _mp(head.b_V), "c": _mp(center)}
                    if layer is not None:
                        env["W_O"] = _mp(layer.W_O)
                    norms.append(_mp_norm(_mp_expr(matrix, env)))
                values[symbol] = scalar * max(norms)
        symbols = sorted(values, key=str)
        function = sp.lambdify(symbols, expr, modules=[{
            "kappa": lambda size, w: size * mp.exp(w) / (mp.exp(w) + size - 1),
            "causal_kappa": lambda size, w: mp.fsum(mp.exp(w) / (mp.exp(w) + i) for i in range(int(size))),
            "LambertW": lambda z: mp.lambertw(z).real}, "mpmath"])
        return function(*[values[s] for s in symbols])


# Each variant on a head its theorem covers (keyword arguments of small_head).
DOT, NO_SCORE_BIASES = {}, {"score_biases": False}
CASES = [
    ("dot-product", Ball(), "ball", DOT, None),
    ("dot-product", LayerNormImage(), "layernorm", DOT, None),
    ("dot-product-nobias", Ball(), "ball-centred", NO_SCORE_BIASES, None),
    ("causal", Ball(), "ball", {"causal": True}, None),
    ("cosine", Ball(), "ball", {"score": "cosine", "score_biases": False, "tau": 2.0, "eps": 0.5}, None),
    ("l2-tied", Ball(), "ball", {"score": "l2", "tied": True, "kim_values": True, "score_biases": False}, None),
    ("l2-untied", LayerNormImage(), "layernorm", {"score": "l2", "score_biases": False}, None),
    ("cross-joint", Ball(), "ball", DOT, 3),
    ("cross-queries", Ball(), "ball", DOT, 3),
    ("cross-context", LayerNormImage(), "layernorm", DOT, 3),
    ("residual", Ball(), "ball", DOT, None),
    ("l2-tied-plain-values", Ball(), "ball", {"score": "l2", "tied": True, "score_biases": False}, None),
]


@pytest.mark.parametrize("name, domain, numeric, kind, m", CASES)
def test_evaluation_encloses_the_high_precision_value(name, domain, numeric, kind, m):
    head = small_head(17, **kind)
    layer = small_layer(17)
    numeric_domain = {"ball": TokenBall(2.5),
                      "ball-centred": TokenBall(1.5, center=layer.ln_in.beta),
                      "layernorm": LayerNormOutputs(layer.ln_in)}[numeric]
    bound = variant(name).derive(Assumptions(domain=domain))
    evaluation = evaluate_bound(bound, head, numeric_domain, n=5, m=m)
    exact = reference_value(bound.expr, (head,), None, numeric_domain, 5, m)
    assert evaluation.certified
    lo, hi = evaluation.details["interval"]
    assert hi == evaluation.value
    with mp.workdps(DIGITS):
        assert mp.mpf(lo) <= exact <= mp.mpf(evaluation.value)
    assert evaluation.value >= evaluation.details["float_value"]
    np.testing.assert_allclose(evaluation.value, float(exact), rtol=1e-9)


COVERED = {name: kind for name, _, _, kind, _ in CASES}

# (variant, kind of a head its theorem does not cover, what the refusal names)
MISMATCHES = [
    ("dot-product-nobias", DOT, "without biases"),
    ("causal", DOT, "causal mask"),
    ("dot-product", {"causal": True}, "no mask"),
    ("dot-product", {"score": "cosine", "score_biases": False}, "dot-product score"),
    ("cosine", NO_SCORE_BIASES, "scaled-cosine score"),
    ("l2-tied", {"score": "l2", "kim_values": True, "score_biases": False}, "tied W_Q = W_K"),
    ("l2-tied", {"score": "l2", "tied": True, "score_biases": False}, "values through A"),
    ("l2-untied", {"score": "l2", "tied": True, "kim_values": True, "score_biases": False}, "values x W_V"),
]


@pytest.mark.parametrize("name, kind, named", MISMATCHES)
def test_a_head_the_theorem_does_not_cover_is_refused(name, kind, named):
    """A theorem holds for the heads it was derived for; any other head is refused, with a
    message stating the facts the theorem covers and the facts of the head."""
    head = small_head(17, **kind)
    bound = variant(name).derive(Assumptions(domain=Ball()))
    with pytest.raises(AssumptionError) as caught:
        evaluate_bound(bound, head, TokenBall(2.5), n=5)
    message = str(caught.value)
    assert caught.value.argument == "head"
    assert f"covers ({bound.facts.describe()})" in message
    assert bound.facts.describe() != head_facts(head).describe()
    assert head_facts(head).describe() in message
    assert named in message
    # in a layer, beside a head the theorem covers, the head is refused as well
    covered = small_head(18, **COVERED[name])
    evaluate_bound(bound, covered, TokenBall(2.5), n=5)
    with pytest.raises(AssumptionError) as caught:
        evaluate_bound(bound, Layer((covered, head), np.eye(8, 6)), TokenBall(2.5), n=5)
    assert head_facts(head).describe() in str(caught.value)


def test_a_theorem_with_biases_covers_heads_without_them():
    """Zero score biases are a special case of biases: the biased bound holds (and evaluates)."""
    bound = variant("dot-product").derive(Assumptions(domain=Ball()))
    head = small_head(17, score_biases=False)
    evaluation = evaluate_bound(bound, head, TokenBall(2.5), n=5)
    exact = reference_value(bound.expr, (head,), None, TokenBall(2.5), 5)
    assert evaluation.certified
    with mp.workdps(DIGITS):
        assert mp.mpf(evaluation.details["interval"][0]) <= exact <= mp.mpf(evaluation.value)


@pytest.mark.parametrize("name, domain", [("multi-head", Ball()), ("residual-multi-head", LayerNormImage())])
def test_multi_head_evaluation_takes_maxima_over_heads(name, domain):
    layer = small_layer(5)
    numeric_domain = (TokenBall(2.0) if isinstance(domain, Ball)
                      else LayerNormOutputs(layer.ln_in))
    bound = variant(name).derive(Assumptions(domain=domain))
    evaluation = evaluate_bound(bound, layer, numeric_domain, n=4)
    exact = reference_value(bound.expr, layer.heads, layer, numeric_domain, 4)
    with mp.workdps(DIGITS):
        assert mp.mpf(evaluation.details["interval"][0]) <= exact <= mp.mpf(evaluation.value)
    np.testing.assert_allclose(evaluation.value, float(exact), rtol=1e-9)
    symbols = evaluation.details["symbols"]
    for name in ("A", "W_V", "W_K*b_Q"):
        if name in symbols:
            per_head = [symbol_intervals(bound.expr, h, layer=layer, domain=numeric_domain, n=4)
                        for h in layer.heads]
            symbol = next(s for s in per_head[0] if str(s) == name)
            assert symbols[name][1] == max(upper(p[symbol]) for p in per_head)


def test_every_built_in_bound_is_increasing_in_its_norm_symbols():
    """The maximum over heads is sound only for increasing bounds; check all built-ins, in every
    norm each states its theorems in (Wasserstein-1 for the measure variants)."""
    for name in VARIANTS:
        norms = variant(name).norms
        assert norms, name
        for norm in norms:
            for domain in (Ball(), LayerNormImage()):
                bound = variant(name).derive(Assumptions(domain=domain, norm=norm))
                for symbol in bound.expr.free_symbols:
                    if isinstance(symbol, (S.MatrixNormSymbol, S.VectorNormSymbol)):
                        assert is_nondecreasing(bound.expr, symbol), (name, norm, domain.key, symbol)
    A, W_V = S.MatrixNormSymbol("A"), S.MatrixNormSymbol("W_V")
    assert not is_nondecreasing(1 / W_V, W_V)
    assert not is_nondecreasing(W_V - A, A)
    assert not is_nondecreasing(sp.exp(-A) * W_V, A)
    # kappa(n, omega) decreases in n when omega < 0: 2 / (1 + e) < 1
    size, negative = sp.Symbol("N", positive=True), sp.Symbol("w", negative=True)
    assert not is_nondecreasing(S.kappa(size, negative), size)
    assert is_nondecreasing(S.kappa(size, A), size)


def test_non_monotone_expressions_need_a_single_head():
    layer = small_layer(9)
    A, W_V = S.MatrixNormSymbol("A"), S.MatrixNormSymbol("W_V")
    expr = W_V / (1 + A)
    with pytest.raises(NotCertifiedError, match="increasing in the per-head symbol"):
        evaluate_bound(expr, layer, TokenBall(1.0), n=3)
    head = layer.heads[1]
    evaluation = evaluate_bound(expr, head, TokenBall(1.0), n=3)  # two-sided enclosures
    exact = reference_value(expr, (head,), None, TokenBall(1.0), 3)
    with mp.workdps(DIGITS):
        assert mp.mpf(evaluation.details["interval"][0]) <= exact <= mp.mpf(evaluation.value)


# Real weights -------------------------------------------------------------------------------------
def test_covariance_bound_figures_for_minilm_layer_zero_head_zero(minilm):
    """all-MiniLM-L6-v2, layer 0, head 0, n = 8, R = 20.25: ||A|| ||W_V|| = 1.34 (computed by numpy's
    SVD on the embedded weights) and the covariance bound
    ||W_V|| (sqrt(kappa) + ||A|| R^2 (1 + sqrt(kappa))), kappa = kappa(n, 2 ||A|| R^2), = 2116
    (evaluated in double precision at those norms)."""
    head = minilm.layer(0).heads[0]
    A, W_V, R, n = S.MatrixNormSymbol("A"), S.MatrixNormSymbol("W_V"), S.R, S.n
    kappa = S.kappa(n, 2 * A * R ** 2)
    covariance = W_V * (sp.sqrt(kappa) + A * R ** 2 * (1 + sp.sqrt(kappa)))
    domain = TokenBall(20.25)
    evaluation = evaluate_bound(covariance, head, domain, n=8)
    assert evaluation.certified
    symbols = evaluation.details["symbols"]
    np.testing.assert_allclose(evaluation.value, 2116, rtol=0.01)
    np.testing.assert_allclose(symbols["A"][1] * symbols["W_V"][1], 1.34, rtol=0.01)
    np.testing.assert_allclose(symbols["A"], np.linalg.norm(head.A, 2), rtol=1e-10)
    # the same figures from numpy alone
    norm_A, norm_V = np.linalg.norm(head.A, 2), np.linalg.norm(head.W_V, 2)
    np.testing.assert_allclose(norm_A * norm_V, 1.34, rtol=0.01)
    kappa_float = 8 / (1 + 7 * np.exp(-2 * norm_A * 20.25 ** 2))
    covariance_float = norm_V * (np.sqrt(kappa_float) + norm_A * 20.25 ** 2 * (1 + np.sqrt(kappa_float)))
    np.testing.assert_allclose(covariance_float, 2116, rtol=0.01)
    np.testing.assert_allclose(evaluation.value, covariance_float, rtol=1e-9)
    # the covariance bound is stated for a score without biases: on the head with its query and key
    # biases dropped (A and W_V unchanged), the derived bound is at most the covariance bound
    plain = Head(head.W_Q, head.W_K, head.W_V, b_V=head.b_V)
    derived = evaluate_bound(variant("dot-product-nobias").derive(Assumptions(domain=Ball())), plain, domain, n=8)
    assert derived.certified
    assert certify_le(derived.details["interval"], evaluation.details["interval"]) is Verdict.HOLDS
    assert derived.value >= derived.details["float_value"]


def _witness(jvp, vjp, X) -> float:
    sigma, _ = attention.jacobian_norm(jvp, vjp, X, iterations=30, seed=1)
    return float(np.max(sigma))


def test_certified_bounds_exceed_jacobian_norms_of_the_real_model(minilm):
    """Witnesses: the Jacobian norm at any input in the domain is a lower bound on Lip."""
    layer = minilm.layer(5)
    ln = layer.ln_in
    rng = np.random.default_rng(0)
    X = ln(rng.standard_normal((3, 6, 384)) * 2)
    head = layer.heads[4]
    head_sigma = _witness(lambda X, E: attention.self_jvp(head, X, E),
                          lambda X, G: attention.self_vjp(head, X, G), X)
    layer_map = layer.as_layer()
    layer_sigma = _witness(lambda X, E: attention.layer_jvp(layer_map, X, E),
                           lambda X, G: attention.layer_vjp(layer_map, X, G), X)
    around_zero = TokenBall(ln.radius_about_origin)
    around_beta = LayerNormOutputs(ln)
    for domain, numeric in ((Ball(), around_zero), (LayerNormImage(), around_beta)):
        single = evaluate_bound(variant("dot-product").derive(Assumptions(domain=domain)), head, numeric, n=6)
        assert single.certified and head_sigma <= single.value
    multi = evaluate_bound(variant("multi-head").derive(Assumptions(domain=LayerNormImage())), layer,
                           around_beta, n=6)
    assert multi.certified and layer_sigma <= multi.value
    assert multi.value >= multi.details["float_value"]


def test_radius_about_the_origin_is_used_for_origin_balls(minilm):
    ln = minilm.layer(0).ln_in
    domain = LayerNormOutputs(ln)
    head = minilm.layer(0).heads[0]
    intervals = symbol_intervals(S.R * S.MatrixNormSymbol("W_V"), head, domain=domain, n=8)
    assert upper(intervals[S.R]) >= ln.radius_about_origin * (1 - 1e-12)  # R + ||beta||
    centred = symbol_intervals(S.R * S.VectorNormSymbol("W_Q.T*c"), head, domain=domain, n=8)
    assert upper(centred[S.R]) == domain.enclosing_ball()[0]  # the expression is about c = beta


# Errors -------------------------------------------------------------------------------------------
def test_unknown_symbols_and_given_values():
    head = small_head(3)
    zeta = sp.Symbol("zeta", positive=True)
    expr = zeta * S.MatrixNormSymbol("W_V")
    with pytest.raises(AssumptionError) as caught:
        evaluate_bound(expr, head, TokenBall(1.0), n=2)
    assert "zeta" in str(caught.value) and "values=" in caught.value.fix
    evaluation = evaluate_bound(expr, head, TokenBall(1.0), n=2, values={"zeta": 2})
    with mp.workdps(DIGITS):
        exact = 2 * max(mp.svd_r(_mp(head.W_V), compute_uv=False))
        assert mp.mpf(evaluation.details["interval"][0]) <= exact <= mp.mpf(evaluation.value)
    with pytest.raises(AssumptionError, match="values"):
        evaluate_bound(expr, head, TokenBall(1.0), n=2, values={"zeta": "two"})


def test_errors_name_what_is_missing():
    head, layer = small_head(4), small_layer(4)
    ball = TokenBall(1.0)
    multi = variant("multi-head").derive(Assumptions(domain=Ball()))
    with pytest.raises(AssumptionError, match="W_O"):
        evaluate_bound(multi, head, ball, n=3)
    l2_tied = variant("l2-tied").derive(Assumptions(domain=Ball()))
    untied_l2 = small_head(4, score="l2", kim_values=True, score_biases=False)
    with pytest.raises(AssumptionError, match="tied"):  # the theorem does not cover the untied head
        evaluate_bound(l2_tied, untied_l2, ball, n=3)
    with pytest.raises(AssumptionError, match="tied weights W_Q = W_K"):  # its bare expression needs W
        evaluate_bound(l2_tied.expr, untied_l2, ball, n=3)
    with pytest.raises(AssumptionError, match="gamma_max"):
        evaluate_bound(variant("dot-product").derive(Assumptions(domain=LayerNormImage())), head, ball, n=3)
    with pytest.raises(AssumptionError, match="a value for m"):
        evaluate_bound(variant("cross-joint").derive(Assumptions(domain=Ball())), head, ball, n=3)
    with pytest.raises(AssumptionError, match="positive int"):
        evaluate_bound(multi, layer, ball, n=0)
    with pytest.raises(AssumptionError, match="NotLipschitz"):
        evaluate_bound(variant("dot-product").derive(Assumptions(domain=Unbounded())), head, ball, n=3)
    with pytest.raises(AssumptionError, match=r"a domain in R\^6 \(the width of .*centre of shape \(5,\)"):
        evaluate_bound(multi, layer, TokenBall(1.0, center=np.zeros(5)), n=3)
    with pytest.raises(AssumptionError, match="positive finite"):
        TokenBall(-1.0)
    with pytest.raises(AssumptionError, match="layernorm, layernorm-image"):
        DomainSpec.parse("left")
    with pytest.raises(AssumptionError, match="a LayerNorm"):
        LayerNormOutputs("left")
