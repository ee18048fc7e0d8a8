"""Certified arithmetic: every bound is checked against mpmath at high precision.

Exact references: singular values from ``mpmath.svd_r`` at 50 digits on the exact binary
values of the float entries; eigenvalues from ``mpmath.eigsy``; special functions from
mpmath at 50 digits.  Reference values of W_0 are those of
/work/shared/reference/published-bounds.md (Kim et al. 2021 section).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from mpmath import iv, mp

from lipbound.errors import AssumptionError, NotCertifiedError, WeightsError
from lipbound.rigorous.compiler import compile_interval
from lipbound.rigorous.intervals import Verdict, certify_le, interval, lower, upper, upper_product
from lipbound.rigorous.linalg import (
    Enclosure,
    is_psd_certified,
    product_norm_interval,
    product_norm_upper,
    psd_floor,
    spectral_norm_lower,
    spectral_norm_upper,
    vector_norm_lower,
    vector_norm_upper,
)
from lipbound.symbolic import symbols as S
from lipbound.symbolic.assumptions import Assumptions, Ball
from lipbound.symbolic.registry import variant

DIGITS = 50


def exact_matrix(M) -> mpmath.matrix:
    with mp.workdps(DIGITS):
        return mp.matrix([[mp.mpf(float(v)) for v in row] for row in np.atleast_2d(M)])


def exact_norm(M) -> mpmath.mpf:
    """||M||_2 from mpmath's SVD at 50 digits (floats converted exactly)."""
    M = np.atleast_2d(np.asarray(M, dtype=float))
    if not np.any(M):
        return mp.mpf(0)
    with mp.workdps(DIGITS):
        return max(mp.svd_r(exact_matrix(M), compute_uv=False))


def exact_vector_norm(v) -> mpmath.mpf:
    with mp.workdps(DIGITS):
        return mp.sqrt(mp.fsum(mp.mpf(float(x)) ** 2 for x in np.ravel(v)))


def assert_brackets(M, rel=1e-9):
    exact = exact_norm(M)
    hi, lo = spectral_norm_upper(M), spectral_norm_lower(M)
    assert mp.mpf(lo) <= exact <= mp.mpf(hi), (lo, exact, hi)
    if exact > 0:
        assert float((mp.mpf(hi) - exact) / exact) <= rel
        assert float((exact - mp.mpf(lo)) / exact) <= rel


# Spectral norms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 2), (5, 3), (3, 5), (8, 8), (7, 1), (1, 6), (10, 4)])
def test_spectral_norm_brackets_random_matrices(shape):
    rng = np.random.default_rng(sum(shape))
    assert_brackets(rng.standard_normal(shape))


def _hilbert(n):
    return np.array([[1.0 / (i + j + 1) for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("name, matrix", [
    ("hilbert", _hilbert(8)),
    ("rank one", np.outer(np.arange(1.0, 7.0), np.linspace(-1, 2, 5))),
    ("zero row and column", np.pad(np.random.default_rng(1).standard_normal((4, 4)), ((0, 1), (1, 0)))),
    ("clustered top singular values", 3.0 * np.linalg.qr(np.random.default_rng(2).standard_normal((6, 6)))[0]),
    ("graded", np.diag([1.0, 1e-6, 1e-12, 1e-300]) @ np.random.default_rng(3).standard_normal((4, 4))),
    ("tiny entries", 1e-300 * np.random.default_rng(4).standard_normal((5, 3))),
    ("huge entries", 1e300 * np.random.default_rng(5).standard_normal((3, 5))),
    ("subnormal entries", np.array([[5e-324, 1e-310], [2e-320, -3e-315]])),
    ("one entry", np.array([[-2.5]])),
])
def test_spectral_norm_brackets_ill_conditioned(name, matrix):
    assert_brackets(matrix, rel=1e-8)


def test_spectral_norm_of_zero_and_errors():
    assert spectral_norm_upper(np.zeros((3, 4))) == 0.0
    assert spectral_norm_lower(np.zeros((3, 4))) == 0.0
    with pytest.raises(WeightsError, match="finite entries"):
        spectral_norm_upper(np.array([[1.0, np.nan]]))
    with pytest.raises(WeightsError, match="2-d array"):
        spectral_norm_upper(np.ones(3))


def test_spectral_norm_of_a_real_sized_matrix_is_tight():
    """A 300 x 200 matrix: the certificate costs a relative 1e-10 at most."""
    rng = np.random.default_rng(7)
    M = rng.standard_normal((300, 200)) / 20
    hi, lo = spectral_norm_upper(M), spectral_norm_lower(M)
    estimate = np.linalg.norm(M, 2)
    assert lo <= estimate <= hi
    np.testing.assert_allclose([lo, hi], [estimate, estimate], rtol=1e-10)


finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 6)), elements=finite))
def test_property_spectral_norm_brackets_exact_value(M):
    exact = exact_norm(M)
    hi, lo = spectral_norm_upper(M), spectral_norm_lower(M)
    assert mp.mpf(lo) <= exact <= mp.mpf(hi)
    if exact > 1e-200:
        assert float((mp.mpf(hi) - exact) / exact) <= 1e-9


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.integers(1, 30), elements=st.floats(allow_nan=False, allow_infinity=False,
                                                                  min_value=-1e300, max_value=1e300)))
def test_property_vector_norm_brackets_exact_value(v):
    exact = exact_vector_norm(v)
    assert mp.mpf(vector_norm_lower(v)) <= exact <= mp.mpf(vector_norm_upper(v))
    if exact > 1e-300:  # subnormals carry fewer digits: only soundness is asked of them
        assert float((mp.mpf(vector_norm_upper(v)) - exact) / exact) <= 1e-13


def test_product_norm_upper_is_sound_and_sharper_than_the_product_of_norms():
    rng = np.random.default_rng(11)
    X, Y = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    with mp.workdps(DIGITS):
        exact = max(mp.svd_r(exact_matrix(X) * exact_matrix(Y).T, compute_uv=False))
    bound = product_norm_upper(X, Y.T)
    assert exact <= mp.mpf(bound)
    assert float((mp.mpf(bound) - exact) / exact) <= 1e-9
    assert bound < spectral_norm_upper(X) * spectral_norm_upper(Y)
    with pytest.raises(AssumptionError, match="at least one matrix"):
        product_norm_upper()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_low_rank_products_are_bracketed_without_forming_them(seed):
    """||X Y^T|| with X, Y of shape (9, 3): through the 3 x 3 Gram matrices (Weyl bound)."""
    rng = np.random.default_rng(seed)
    X, Y = rng.standard_normal((9, 3)), rng.standard_normal((9, 3)) * 10.0 ** rng.integers(-3, 3)
    with mp.workdps(DIGITS):
        exact = max(mp.svd_r(exact_matrix(X) * exact_matrix(Y).T, compute_uv=False))
    low_rank = product_norm_interval(X, Y.T)
    dense = (Enclosure.exact(X) @ Enclosure.exact(Y.T)).norm_interval()
    for enclosure in (low_rank, dense):
        with mp.workdps(DIGITS):
            assert enclosure.a <= exact <= enclosure.b
        assert upper(enclosure) - lower(enclosure) <= 1e-10 * float(exact)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([1e-200, 1.0, 1e150]))
def test_property_enclosure_contains_exact_products_sums_and_scalings(seed, scale):
    rng = np.random.default_rng(seed)
    A, B, C = (rng.standard_normal(shape) * scale for shape in ((3, 4), (4, 2), (3, 2)))
    enclosure = (Enclosure.exact(A) @ Enclosure.exact(B) - Enclosure.exact(C)).scale(
        iv.mpf(1) / 3)
    with mp.workdps(DIGITS):
        exact = (exact_matrix(A) * exact_matrix(B) - exact_matrix(C)) / 3
        for i in range(3):
            for j in range(2):
                assert abs(exact[i, j] - mp.mpf(enclosure.mid[i, j])) <= mp.mpf(enclosure.rad[i, j])
        norm = max(mp.svd_r(exact, compute_uv=False))
    assert enclosure.norm_lower() <= norm <= enclosure.norm_upper()


# Positive definiteness ----------------------------------------------------------------------------
def test_is_psd_certified_decides_clear_cases_and_never_passes_indefinite_ones():
    assert is_psd_certified(np.eye(4)) is True
    assert is_psd_certified(np.eye(4), margin=0.999) is True
    assert is_psd_certified(np.eye(4), margin=1.0) is False  # on the boundary: not provable
    assert is_psd_certified(np.diag([1.0, 0.0, 1.0])) is False  # singular: not certified
    assert is_psd_certified(np.array([[1.0, 2.0], [2.0, 1.0]])) is False
    # exactly representable, det = -2^-40 < 0: indefinite by a hair
    assert is_psd_certified(np.array([[1.0, 1.0], [1.0, 1.0 - 2.0 ** -40]])) is False
    # det = +2^-40: positive definite with lambda_min ~ 2^-41, far above the rounding level
    assert is_psd_certified(np.array([[1.0, 1.0], [1.0, 1.0 + 2.0 ** -40]])) is True
    with pytest.raises(AssumptionError, match="symmetric"):
        is_psd_certified(np.array([[1.0, 0.5], [0.0, 1.0]]))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 7), st.floats(-0.05, 0.05))
def test_property_psd_certificate_is_sound(seed, n, shift):
    """Whenever a (near-singular) matrix is certified, mpmath's eigenvalues agree."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((n, max(n - 1, 1)))
    A = G @ G.T + shift * np.eye(n)
    A = (A + A.T) / 2
    margin = float(rng.choice([0.0, 1e-3]))
    with mp.workdps(DIGITS):
        smallest = min(mp.eigsy(exact_matrix(A), eigvals_only=True))
    if is_psd_certified(A, margin):
        assert smallest >= margin
    if smallest > margin + 1e-6 * max(1.0, float(np.trace(A))):
        assert is_psd_certified(A, margin)  # clear cases are decided


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 9), st.floats(-0.05, 0.5), st.sampled_from([0.0, 1e-3]))
def test_property_psd_floor_is_below_the_smallest_eigenvalue(seed, n, shift, extra):
    """One factorisation and the a priori error: never above mpmath's lambda_min minus the stated
    perturbation; positive for clear cases; -inf when the factorisation breaks down."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((n, n))
    A = G @ G.T + shift * np.eye(n)
    A = (A + A.T) / 2
    radius = np.abs(A) * 1e-9
    floor = psd_floor(Enclosure(A, radius), extra=extra)
    with mp.workdps(DIGITS):
        for sign in (-1, 1):
            perturbed = exact_matrix(A) + sign * exact_matrix(radius)   # the enclosure's corners
            smallest = min(mp.eigsy(perturbed, eigvals_only=True))
            assert floor <= smallest - extra
        smallest = min(mp.eigsy(exact_matrix(A), eigvals_only=True))
    if smallest > 0.1 + 2 * extra:
        assert floor > 0
    if smallest < 0:
        assert floor < 0


def test_psd_floor_refuses_indefinite_matrices_and_counts_extra():
    assert psd_floor(np.array([[1.0, 2.0], [2.0, 1.0]])) == -math.inf
    assert 0 < psd_floor(np.eye(3)) <= 1.0
    assert psd_floor(np.eye(3), extra=0.25) <= 0.75
    assert psd_floor(np.eye(3), shift=2.0) == -math.inf            # asked above lambda_min: breaks down


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([1e-200, 1.0, 1e150]))
def test_property_hadamard_encloses_the_entrywise_product(seed, scale):
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((3, 4)) * scale, rng.standard_normal((3, 4))
    left = Enclosure(A, np.abs(A) * 1e-12)
    product = left.hadamard(Enclosure.exact(B))
    column = left.hadamard(Enclosure.exact(B[:, :1]))          # broadcast along the rows
    with mp.workdps(DIGITS):
        for i in range(3):
            for j in range(4):
                for corner in (-1, 1):
                    exact = (mp.mpf(A[i, j]) + corner * mp.mpf(left.rad[i, j])) * mp.mpf(B[i, j])
                    assert abs(exact - mp.mpf(product.mid[i, j])) <= mp.mpf(product.rad[i, j])
                    exact = (mp.mpf(A[i, j]) + corner * mp.mpf(left.rad[i, j])) * mp.mpf(B[i, 0])
                    assert abs(exact - mp.mpf(column.mid[i, j])) <= mp.mpf(column.rad[i, j])


# Interval evaluation -------------------------------------------------------------------------------
x, y = sp.symbols("x y", positive=True)


def _compiled(symbols, expr):
    return compile_interval(expr, symbols)


def test_rational_constants_become_exact_intervals():
    result = compile_interval(sp.Rational(1, 3) * x, [x])(1)
    with mp.workdps(DIGITS):
        third = mp.mpf(1) / 3
        assert third in result
    assert result.a != result.b  # 1/3 is not a double: the enclosure has width


def _reference(expr, point):
    function = sp.lambdify([x, y], expr, modules=[{"LambertW": lambda z: mp.lambertw(z).real}, "mpmath"])
    with mp.workdps(DIGITS):
        return function(*[mp.mpf(p) for p in point])


leaves = st.one_of(st.just(x), st.just(y),
                   st.builds(lambda p, q: sp.Rational(p, q), st.integers(-9, 9), st.integers(1, 7)))


def _extend(children):
    unary = st.sampled_from([
        lambda e: sp.sqrt(sp.Abs(e)), lambda e: sp.exp(sp.Min(e, 4)), lambda e: sp.log(1 + sp.Abs(e)),
        lambda e: sp.LambertW(sp.Abs(e)), lambda e: sp.digamma(1 + sp.Abs(e)), lambda e: sp.Abs(e)])
    binary = st.sampled_from([lambda a, b: a + b, lambda a, b: a * b, lambda a, b: sp.Min(a, b),
                              lambda a, b: sp.Max(a, b), lambda a, b: a - b])
    return st.one_of(st.builds(lambda f, e: f(e), unary, children),
                     st.builds(lambda f, a, b: f(a, b), binary, children, children))


expressions = st.recursive(leaves, _extend, max_leaves=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions, st.sampled_from(["0.37", "1.5", "3", "12.25"]), st.sampled_from(["0.01", "2", "7.5"]))
def test_property_compiled_intervals_enclose_high_precision_values(expr, px, py):
    result = compile_interval(expr, [x, y])(px, py)
    reference = _reference(expr, (px, py))
    with mp.workdps(DIGITS):
        assert result.a <= reference <= result.b, (expr, result, reference)


@pytest.mark.parametrize("argument, value", [
    (sp.exp(-1), "0.278464542761"), (2 * sp.exp(-1), "0.463055513366"),
    (7 * sp.exp(-1), "0.973138752867"), (8 * sp.exp(-1), "1.04011258224"),
    (999 * sp.exp(-1), "4.42050160394"),
])
def test_lambertw_encloses_published_values(argument, value):
    """W_0 values quoted in reference/published-bounds.md (Kim et al. 2021)."""
    result = _compiled([], sp.LambertW(argument))()
    with mp.workdps(DIGITS):
        exact = mp.lambertw(mp.mpf(sp.N(argument, 60))).real
        assert result.a <= exact <= result.b
    np.testing.assert_allclose(float(exact), float(value), rtol=1e-11)
    assert upper(result) - lower(result) < 1e-13


def test_lambertw_at_the_branch_point_and_digamma_values():
    z = sp.Symbol("z", real=True)
    at_branch = _compiled([z], sp.LambertW(z))(-iv.exp(-1))  # an enclosure of -1/e
    assert at_branch.a <= -1 <= at_branch.b and upper(at_branch) < -0.99
    with pytest.raises(NotCertifiedError, match="-1/e"):
        _compiled([z], sp.LambertW(z))(iv.mpf(-1))
    for argument, exact in ((1, -mp.euler), (sp.Rational(1, 2), -mp.euler - 2 * mp.log(2))):
        result = _compiled([], sp.digamma(argument))()
        with mp.workdps(DIGITS):
            assert result.a <= exact <= result.b
    big = _compiled([x], sp.digamma(x))(iv.mpf(10) ** 10)  # SymPy would expand psi(10^10) exactly
    with mp.workdps(DIGITS):
        assert big.a <= mp.digamma(mp.mpf(10) ** 10) <= big.b
    with pytest.raises(NotCertifiedError, match="digamma"):
        _compiled([x], sp.digamma(x))(iv.mpf([-1, 1]))


@pytest.mark.parametrize("n, omega", [(5, "0.5"), (8, "712.5"), (5000, "3"), (10 ** 6, "60")])
def test_kappa_and_causal_kappa_enclose_their_sums(n, omega):
    kappa = _compiled([S.omega], S.kappa(n, S.omega))(iv.mpf(omega))
    causal = _compiled([S.omega], S.causal_kappa(n, S.omega))(iv.mpf(omega))
    with mp.workdps(DIGITS):
        w = mp.mpf(omega)
        exact_kappa = n * mp.exp(w) / (mp.exp(w) + n - 1)
        assert kappa.a <= exact_kappa <= kappa.b
    # the digamma form cancels catastrophically (psi(e^w + n) - psi(e^w) ~ n e^-w): sum the
    # terms directly when there are few, else use 400 digits (enough for e^w ~ 1e26)
    with mp.workdps(400):
        w = mp.mpf(omega)
        if n <= 5000:
            exact_causal = mp.fsum(1 / (1 + i * mp.exp(-w)) for i in range(n))
        else:
            exact_causal = mp.exp(w) * (mp.digamma(mp.exp(w) + n) - mp.digamma(mp.exp(w)))
        assert causal.a <= exact_causal <= causal.b
    assert upper(causal) - lower(causal) <= 1e-9 * upper(causal)


def test_functions_without_interval_versions_are_refused_when_compiling():
    """A node the compiler cannot enclose is refused before anything is evaluated."""
    for expr in (sp.gamma(x) + 1, sp.tan(x), sp.floor(x), sp.Symbol("z") + x):
        with pytest.raises(NotCertifiedError, match="enclose|symbols that all have a value"):
            compile_interval(expr, [x])


def test_piecewise_encloses_every_branch_that_may_apply():
    """Regression: Piecewise((x, x > 1), (10 x, True)) on [0.5, 2] was [5, 20], missing x = 1.5."""
    function = compile_interval(sp.Piecewise((x, x > 1), (10 * x, True)), [x])
    enclosure = function((0.5, 2))
    for value in (0.5, 1.0, 1.5, 2.0):
        exact = value if value > 1 else 10 * value
        assert enclosure.a <= exact <= enclosure.b
    assert function(2).a == 2 and function((3, 4)).b == 4  # certainly above 1: the first branch only
    assert function((0.1, 0.5)).a == 1  # certainly below: the second
    with pytest.raises(NotCertifiedError, match="Piecewise"):  # no branch certain to apply
        compile_interval(sp.Piecewise((x, x > 1)), [x])((0.5, 2))


def test_bound_lambdify_interval_refuses_what_it_cannot_enclose():
    """Regression: Bound.lambdify("interval") compiled expressions the interval path refused."""
    from dataclasses import replace
    bound = variant("dot-product").derive(Assumptions(domain=Ball()))
    crooked = replace(bound, expr=sp.gamma(bound.expr))
    with pytest.raises(NotCertifiedError, match="enclose"):
        crooked.lambdify("interval")


def test_bound_lambdify_interval_backend_encloses_the_mpmath_value():
    """The symbolic layer's own interval backend goes through this namespace."""
    bound = variant("causal").derive(Assumptions(domain=Ball()))
    symbols, function = bound.lambdify("interval")
    point = {"A": "0.87", "R": "3.5", "W_K": "1.3", "W_K*b_Q": "0.4", "W_Q": "1.1", "W_V": "1.55",
             "b_Q": "0.2", "d_k": "32", "n": "8"}
    missing = {str(s) for s in symbols} - set(point)
    assert not missing, missing
    result = function(*[iv.mpf(point[str(s)]) for s in symbols])
    reference_symbols, reference = bound.lambdify("mpmath")
    with mp.workdps(DIGITS):
        exact = reference(*[mp.mpf(point[str(s)]) for s in reference_symbols])
        assert result.a <= exact <= result.b
    assert upper(result) - lower(result) <= 1e-10 * upper(result)


# Decisions ------------------------------------------------------------------------------------------
def test_certify_le_is_three_valued():
    assert certify_le(iv.mpf([1, 2]), iv.mpf([2, 3])) is Verdict.HOLDS  # touching: sup a = inf b
    assert certify_le(iv.mpf([3, 4]), iv.mpf([1, 2])) is Verdict.FAILS
    assert certify_le(iv.mpf([1, 2]), iv.mpf([1.5, 3])) is Verdict.UNKNOWN
    assert certify_le(iv.mpf([1, 3]), 2.0) is Verdict.UNKNOWN
    assert certify_le(1, 2) is Verdict.HOLDS and certify_le(2.0, 1) is Verdict.FAILS
    third = iv.mpf(1) / 3
    assert certify_le(third, third) is Verdict.UNKNOWN  # an interval of width > 0 against itself


def test_interval_conversions_round_outward():
    third = iv.mpf(1) / 3
    assert lower(third) < upper(third)
    assert mp.mpf(lower(third)) <= mp.mpf(1) / 3 <= mp.mpf(upper(third))
    huge = iv.mpf(10) ** 400
    assert upper(huge) == math.inf and lower(huge) == np.finfo(float).max
    assert interval((1, 2)).a == 1 and interval(sp.Rational(1, 3)).b >= third.b
    with pytest.raises(AssumptionError, match="lo <= hi"):
        interval((2, 1))


def test_upper_product_rounds_up_every_factor_and_the_product():
    factors = (0.1, 0.2, 0.3, 1e-3, 7.0 / 3.0)
    with mp.workdps(60):   # the floats' product, exactly
        exact = mp.mpf(1)
        for value in factors:
            exact *= mp.mpf(value)
        assert exact <= mp.mpf(upper_product(*factors)) <= exact * (1 + mp.mpf(1e-15))
    assert upper_product() == 1.0 and upper_product(3.0, 1e300, 1e10) == math.inf


def test_importing_lipbound_changes_no_process_wide_precision():
    """The interval context is lipbound's own: mpmath.iv keeps the precision its user set."""
    import subprocess
    import sys
    code = ("import mpmath; mpmath.iv.prec = 80; import lipbound.numeric.report, lipbound.numeric.sdp, "
            "lipbound.numeric.recheck; from lipbound.rigorous import precision\n"
            "with precision(300): pass\nprint(mpmath.iv.prec)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "80"
