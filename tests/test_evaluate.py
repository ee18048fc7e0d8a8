"""Rigorous evaluation of symbolic bounds on weights, checked three ways:

* against an independent high-precision evaluation (every norm recomputed with mpmath's
  SVD at 40 digits from the exact float entries, the closed form evaluated in mpmath);
* against witnesses: Jacobian norms of the real attention map at inputs in the domain
  (a certified upper bound must exceed every one of them);
* against the figures of DESIGN.md section 2 (all-MiniLM-L6-v2, layer 0, head 0, n = 8,
  R = 20.25: ||A|| ||W_V|| = 1.34 and ||W_V|| (sqrt(kappa) + ||A|| R^2 (1 + sqrt(kappa))) = 2116).
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy as sp
from mpmath import mp

from lipbound.rigorous.intervals import Verdict
from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, Unbounded
from lipbound.errors import AssumptionError, NotCertifiedError
from lipbound.numeric import attention
from lipbound.numeric.domains import LayerNormOutputs, TokenBall
from lipbound.numeric.evaluate import evaluate_bound, is_increasing, symbol_intervals
from lipbound.rigorous.intervals import certify_le, upper
from lipbound.numeric.model import Head, Layer, LayerNorm, TransformerLayer, load_default
from lipbound.symbolic import symbols as S
from lipbound.symbolic.registry import VARIANTS, variant

DIGITS = 40


@pytest.fixture(scope="module")
def minilm():
    return load_default()


def small_head(seed: int, tied: bool = False) -> Head:
    rng = np.random.default_rng(seed)
    W_Q = rng.standard_normal((6, 3)) / 2
    return Head(W_Q=W_Q, W_K=W_Q if tied else rng.standard_normal((6, 3)) / 2,
                          W_V=rng.standard_normal((6, 4)) / 2, b_Q=rng.standard_normal(3) / 4,
                          b_K=rng.standard_normal(3) / 4, b_V=rng.standard_normal(4) / 4)


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
    center = np.zeros(d) if domain.center is None else domain.center
    values = {}
    with mp.workdps(DIGITS):
        for symbol in expr.free_symbols:
            name = str(symbol)
            if name in sizes:
                values[symbol] = mp.mpf(sizes[name])
            elif name == "R":
                uses_c = any(S.c in S.NORM_OF.get(str(s), sp.ZeroMatrix(1, 1)).atoms(sp.MatrixSymbol)
                             for s in expr.free_symbols)
                values[symbol] = mp.mpf(domain.radius) + (0 if uses_c else _mp_norm(_mp(center)))
            elif name == "gamma_max":
                values[symbol] = mp.mpf(domain.gamma_max)
            elif name in ("tau", "epsilon"):
                values[symbol] = mp.mpf(heads[0].tau if name == "tau" else heads[0].eps)
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


CASES = [
    ("dot-product", Ball(), "ball", False, None),
    ("dot-product", LayerNormImage(), "layernorm", False, None),
    ("dot-product-nobias", Ball(), "ball-centred", False, None),
    ("causal", Ball(), "ball", False, None),
    ("cosine", Ball(), "ball", False, None),
    ("l2-tied", Ball(), "ball", True, None),
    ("l2-untied", LayerNormImage(), "layernorm", False, None),
    ("cross-joint", Ball(), "ball", False, 3),
]


@pytest.mark.parametrize("name, domain, numeric, tied, m", CASES)
def test_evaluation_encloses_the_high_precision_value(name, domain, numeric, tied, m):
    head = small_head(17, tied=tied)
    layer = small_layer(17)
    numeric_domain = {"ball": TokenBall(2.5),
                      "ball-centred": TokenBall(1.5, center=layer.ln_in.beta),
                      "layernorm": LayerNormOutputs(layer.ln_in)}[numeric]
    bound = variant(name).derive(Assumptions(domain=domain))
    evaluation = evaluate_bound(bound, head, numeric_domain, n=5, m=m)
    exact = reference_value(bound.expr, (head,), None, numeric_domain, 5, m)
    assert evaluation.certified
    with mp.workdps(DIGITS):
        assert mp.mpf(evaluation.interval[0]) <= exact <= mp.mpf(evaluation.upper)
    assert evaluation.upper >= evaluation.details["float_value"]
    np.testing.assert_allclose(evaluation.upper, float(exact), rtol=1e-9)


@pytest.mark.parametrize("name, domain", [("multi-head", Ball()), ("residual-multi-head", LayerNormImage())])
def test_multi_head_evaluation_takes_maxima_over_heads(name, domain):
    layer = small_layer(5)
    numeric_domain = (TokenBall(2.0) if isinstance(domain, Ball)
                      else LayerNormOutputs(layer.ln_in))
    bound = variant(name).derive(Assumptions(domain=domain))
    evaluation = evaluate_bound(bound, layer, numeric_domain, n=4)
    exact = reference_value(bound.expr, layer.heads, layer, numeric_domain, 4)
    with mp.workdps(DIGITS):
        assert mp.mpf(evaluation.interval[0]) <= exact <= mp.mpf(evaluation.upper)
    np.testing.assert_allclose(evaluation.upper, float(exact), rtol=1e-9)
    for name in ("A", "W_V", "W_K*b_Q"):
        if name in evaluation.symbols:
            per_head = [symbol_intervals(bound.expr, h, layer=layer, domain=numeric_domain, n=4)
                        for h in layer.heads]
            symbol = next(s for s in per_head[0] if str(s) == name)
            assert evaluation.symbols[name][1] == max(upper(p[symbol]) for p in per_head)


def test_every_built_in_bound_is_increasing_in_its_norm_symbols():
    """The maximum over heads is sound only for increasing bounds; check all built-ins."""
    for name in VARIANTS:
        for domain in (Ball(), LayerNormImage()):
            bound = variant(name).derive(Assumptions(domain=domain))
            for symbol in bound.expr.free_symbols:
                if isinstance(symbol, (S.MatrixNormSymbol, S.VectorNormSymbol)):
                    assert is_increasing(bound.expr, symbol) is Verdict.HOLDS, (name, domain.key, symbol)
    A, W_V = S.MatrixNormSymbol("A"), S.MatrixNormSymbol("W_V")
    assert is_increasing(1 / W_V, W_V) is Verdict.UNKNOWN
    assert is_increasing(W_V - A, A) is Verdict.UNKNOWN
    assert is_increasing(sp.exp(-A) * W_V, A) is Verdict.UNKNOWN


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
        assert mp.mpf(evaluation.interval[0]) <= exact <= mp.mpf(evaluation.upper)


# Real weights -------------------------------------------------------------------------------------
def test_design_figures_for_minilm_layer_zero_head_zero(minilm):
    """DESIGN.md section 2: ||A|| ||W_V|| = 1.34 and the covariance bound 2116 (n = 8, R = 20.25)."""
    head = minilm.layer(0).heads[0]
    A, W_V, R, n = S.MatrixNormSymbol("A"), S.MatrixNormSymbol("W_V"), S.R, S.n
    kappa = S.kappa(n, 2 * A * R ** 2)
    design = W_V * (sp.sqrt(kappa) + A * R ** 2 * (1 + sp.sqrt(kappa)))
    domain = TokenBall(20.25)
    evaluation = evaluate_bound(design, head, domain, n=8)
    assert evaluation.certified
    np.testing.assert_allclose(evaluation.upper, 2116, rtol=0.01)
    np.testing.assert_allclose(evaluation.symbols["A"][1] * evaluation.symbols["W_V"][1], 1.34, rtol=0.01)
    np.testing.assert_allclose(evaluation.symbols["A"], np.linalg.norm(head.A, 2), rtol=1e-10)
    # the derived bound follows DESIGN's route and is at most the DESIGN formula
    derived = evaluate_bound(variant("dot-product-nobias").derive(Assumptions(domain=Ball())), head, domain, n=8)
    assert certify_le(derived.interval, evaluation.interval) is Verdict.HOLDS
    assert derived.upper >= derived.details["float_value"]


def _witness(jvp, vjp, X) -> float:
    sigma, _ = attention.jacobian_norm(jvp, vjp, X, iterations=30, seed=1)
    return float(np.max(sigma))


def test_certified_bounds_exceed_jacobian_norms_of_the_real_model(minilm):
    """Witnesses: the Jacobian norm at any input in the domain is a lower bound on Lip."""
    layer = minilm.layer(5)
    ln = layer.ln_in
    rng = np.random.default_rng(0)
    X = ln.forward(rng.standard_normal((3, 6, 384)) * 2)
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
        assert single.certified and head_sigma <= single.upper
    multi = evaluate_bound(variant("multi-head").derive(Assumptions(domain=LayerNormImage())), layer,
                           around_beta, n=6)
    assert multi.certified and layer_sigma <= multi.upper
    assert multi.upper >= multi.details["float_value"]


def test_radius_about_the_origin_is_used_for_origin_balls(minilm):
    ln = minilm.layer(0).ln_in
    domain = LayerNormOutputs(ln)
    head = minilm.layer(0).heads[0]
    intervals = symbol_intervals(S.R * S.MatrixNormSymbol("W_V"), head, domain=domain, n=8)
    assert upper(intervals[S.R]) >= ln.radius_about_origin * (1 - 1e-12)  # R + ||beta||
    centred = symbol_intervals(S.R * S.VectorNormSymbol("W_Q.T*c"), head, domain=domain, n=8)
    assert upper(centred[S.R]) == domain.radius  # the expression is about c = beta


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
        assert mp.mpf(evaluation.interval[0]) <= exact <= mp.mpf(evaluation.upper)
    with pytest.raises(AssumptionError, match="values"):
        evaluate_bound(expr, head, TokenBall(1.0), n=2, values={"zeta": "two"})


def test_errors_name_what_is_missing():
    head, layer = small_head(4), small_layer(4)
    ball = TokenBall(1.0)
    multi = variant("multi-head").derive(Assumptions(domain=Ball()))
    with pytest.raises(AssumptionError, match="W_O"):
        evaluate_bound(multi, head, ball, n=3)
    with pytest.raises(AssumptionError, match="tied"):
        evaluate_bound(variant("l2-tied").derive(Assumptions(domain=Ball())), head, ball, n=3)
    with pytest.raises(AssumptionError, match="gamma_max"):
        evaluate_bound(variant("dot-product").derive(Assumptions(domain=LayerNormImage())), head, ball, n=3)
    with pytest.raises(AssumptionError, match="m"):
        evaluate_bound(variant("cross-joint").derive(Assumptions(domain=Ball())), head, ball, n=3)
    with pytest.raises(AssumptionError, match="positive int"):
        evaluate_bound(multi, layer, ball, n=0)
    with pytest.raises(AssumptionError, match="NotLipschitz"):
        evaluate_bound(variant("dot-product").derive(Assumptions(domain=Unbounded())), head, ball, n=3)
    with pytest.raises(AssumptionError, match="model width"):
        evaluate_bound(multi, layer, TokenBall(1.0, center=np.zeros(5)), n=3)
    with pytest.raises(AssumptionError, match="positive finite"):
        TokenBall(-1.0)
    with pytest.raises(AssumptionError, match="'origin' or 'center'"):
        NumericDomain.from_layernorm(layer.ln_in, about="left")
