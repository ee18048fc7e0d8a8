"""The vectorised rigorous engine: every enclosure of lipbound.rigorous.arrays / elementwise checked against
mpmath at 200 bits, the array compiler against the scalar one, the large-matrix norm against numpy's SVD."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import NotCertifiedError
from lipbound.rigorous.arrays import (
    IntervalArray,
    gelu,
    gelu_curvature,
    gelu_curvature_magnitude,
    gelu_curvature_range,
    gelu_slope,
    gelu_third,
    gelu_third_magnitude,
    normal_cdf,
)
from lipbound.rigorous.compiler import compile_array, compile_interval
from lipbound.rigorous.elementwise import down, exp_bounds, normal_cdf_bounds, normal_pdf_bounds, up
from lipbound.rigorous.intervals import lower, upper
from lipbound.rigorous.linalg import Enclosure, spectral_norm_upper_large
from lipbound.symbolic.lemmas import LEMMAS
from lipbound.symbolic.local import LOCAL_THEOREMS, chain_prefix, normwise_product

HIGH = mpmath.mp.clone() if hasattr(mpmath.mp, "clone") else mpmath.mp


def _inside(lo, hi, exact) -> bool:
    return mpmath.mpf(float(lo)) <= exact <= mpmath.mpf(float(hi))


@settings(max_examples=40)
@given(st.lists(st.floats(-760, 709, allow_nan=False), min_size=1, max_size=30))
def test_exp_bounds_enclose_exp(values):
    x = np.array(values)
    lo, hi = exp_bounds(x)
    with mpmath.workprec(200):
        assert all(_inside(a, b, mpmath.exp(mpmath.mpf(v))) for v, a, b in zip(values, lo, hi))
    finite = (x > -700) & (x < 700)
    assert np.all(hi[finite] - lo[finite] <= 1e-12 * hi[finite])


def test_exp_refuses_overflow_and_nan():
    with pytest.raises(NotCertifiedError):
        exp_bounds(np.array([710.0]))
    with pytest.raises(NotCertifiedError):
        exp_bounds(np.array([math.nan]))


@settings(max_examples=40)
@given(st.lists(st.floats(-12, 12, allow_nan=False), min_size=1, max_size=30))
def test_normal_cdf_and_density_enclosures(values):
    x = np.array(values)
    (c_lo, c_hi), (d_lo, d_hi) = normal_cdf_bounds(x), normal_pdf_bounds(x)
    with mpmath.workprec(200):
        for v, a, b, e, f in zip(values, c_lo, c_hi, d_lo, d_hi):
            assert _inside(a, b, mpmath.ncdf(mpmath.mpf(v)))
            assert _inside(e, f, mpmath.npdf(mpmath.mpf(v)))
    assert np.all(c_hi - c_lo <= 1e-14)


@settings(max_examples=40)
@given(st.lists(st.one_of(st.floats(-38.6, 38.6, allow_nan=False), st.floats(-1e-150, 1e-150),
                          st.floats(1e3, 1e308)), min_size=1, max_size=30))
def test_the_density_from_one_exponential_encloses_it_where_the_exponent_rounds(values):
    """The density takes one exponential at the rounded exponent, widened by the exponent's rounding: enclosed at
    200 bits where ``x^2`` rounds (large arguments), underflows (tiny ones) or passes 1e300, and as narrow as
    the two-exponential form (relative width within 1e-12 while the density is a normal number)."""
    x = np.array(values)
    lo, hi = normal_pdf_bounds(x)
    with mpmath.workprec(200):
        assert all(_inside(a, b, mpmath.npdf(mpmath.mpf(v))) for v, a, b in zip(values, lo, hi))
    normal = hi > 1e-300
    assert np.all(hi[normal] - lo[normal] <= 1e-12 * hi[normal])


def test_the_density_covers_the_rounding_of_large_exponents():
    """Between 20 and 38 ``fl(x^2)`` is off by up to 1e-13 of the exponent, the largest rounding of the exponent
    before the range 1e300 takes over: every value still enclosed at 200 bits."""
    x = np.random.default_rng(5).uniform(20.0, 38.0, 400)
    lo, hi = normal_pdf_bounds(x)
    with mpmath.workprec(200):
        assert all(_inside(a, b, mpmath.npdf(mpmath.mpf(v))) for v, a, b in zip(x, lo, hi))


def test_gelu_and_its_slope_range_enclose_samples():
    edges = np.linspace(-9, 9, 181)
    ranges = gelu_slope(IntervalArray(edges[:-1], edges[1:]))
    values = gelu(IntervalArray(edges))
    with mpmath.workprec(120):
        for a, b, lo, hi in zip(edges[:-1], edges[1:], ranges.lo, ranges.hi):
            for t in np.linspace(a, b, 7):
                t = mpmath.mpf(t)
                assert lo <= mpmath.ncdf(t) + t * mpmath.npdf(t) <= hi
        for t, lo, hi in zip(edges, values.lo, values.hi):
            assert _inside(lo, hi, mpmath.mpf(t) * mpmath.ncdf(mpmath.mpf(t)))
    assert ranges.lo.min() == pytest.approx(-0.1289, abs=1e-4) and ranges.hi.max() == pytest.approx(1.1289, abs=1e-4)
    assert normal_cdf(IntervalArray(-50.0, 50.0)).contains(np.array([0.0, 1.0]))


@settings(max_examples=20, deadline=None)
@given(st.floats(-9.0, 9.0), st.floats(0.0, 6.0))
def test_gelu_curvature_and_third_over_an_interval_enclose_samples(start, width):
    """The range of GELU'' and the largest |GELU'''| over an interval hold GELU'' = phi (2 - x^2) and GELU''' = x phi
    (x^2 - 4) at 200 bits on a grid and at the critical points inside; without the critical points (the ends alone)
    the interval [-1, 1] (holding GELU'''s extremes +-0.7923 and GELU'''s maximum at 0) is not covered."""
    lo, hi = start, start + width
    x = IntervalArray(np.array([lo]), np.array([hi]))
    curvature, third = gelu_curvature_range(x), gelu_third_magnitude(x)
    critical = [c for c in (0.0, 2.0, -2.0, 0.7923, -0.7923, 2.5243, -2.5243) if lo <= c <= hi]
    with mpmath.workprec(200):
        for t in list(np.linspace(lo, hi, 41)) + critical:
            t = mpmath.mpf(t)
            second = mpmath.npdf(t) * (2 - t * t)
            assert curvature.lo[0] <= second <= curvature.hi[0]
            assert abs(t * mpmath.npdf(t) * (t * t - 4)) <= third[0]
            assert abs(second) <= gelu_curvature_magnitude(x)[0]
    # tight: within the grid's sampling of the factors' products
    assert third[0] <= np.max(gelu_third(x).magnitude) + 1e-12
    assert gelu_curvature_magnitude(x)[0] <= np.max(gelu_curvature(x).magnitude) + 1e-12


def test_gelu_curvature_and_third_need_their_critical_points(monkeypatch):
    """Mutation: with no critical points (the ends alone) [-1, 1] misses GELU'''s extremes at +-0.7923 and GELU'''s
    maximum 2 phi(0) at 0; as they are, both are held, and sup |GELU'''| is 0.7788 (its known value)."""
    from lipbound.rigorous import arrays
    x = IntervalArray(np.array([-1.0]), np.array([1.0]))
    assert gelu_third_magnitude(x)[0] == pytest.approx(0.778769635, abs=1e-8)
    assert gelu_curvature_range(x).hi[0] >= 2 / math.sqrt(2 * math.pi)
    original = arrays._range_over
    monkeypatch.setattr(arrays, "_range_over", lambda f, x, critical: original(f, x, ()))
    assert arrays.gelu_third_magnitude(x)[0] < 0.7787
    assert arrays.gelu_curvature_magnitude(x)[0] < 2 / math.sqrt(2 * math.pi) - 0.1


def test_outward_rounding_moves_past_the_neighbouring_float():
    x = np.array([1.0, -3.5, 0.0, 1e-310, 1e300])
    assert np.all(down(x) <= np.nextafter(x, -np.inf)) and np.all(up(x) >= np.nextafter(x, np.inf))


@settings(max_examples=30)
@given(st.integers(0, 2**31 - 1))
def test_interval_array_arithmetic_encloses_exact_results(seed):
    rng = np.random.default_rng(seed)
    a_mid, b_mid = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)) + 3.0
    a = IntervalArray(a_mid - 1e-3, a_mid + 1e-3)
    b = IntervalArray(b_mid - 1e-3 * rng.random((3, 4)), b_mid + 1e-3)
    with mpmath.workprec(200):
        for _pick in range(5):
            x = a.lo + (a.hi - a.lo) * rng.random((3, 4))
            y = b.lo + (b.hi - b.lo) * rng.random((3, 4))
            checks = ((a + b, lambda s, t: s + t), (a - b, lambda s, t: s - t), (a * b, lambda s, t: s * t),
                      (a / b, lambda s, t: s / t), (b.sqrt(), lambda s, t: mpmath.sqrt(t)),
                      (a.square(), lambda s, t: s * s), (a.exp(), lambda s, t: mpmath.exp(s)))
            for result, exact in checks:
                for i in range(3):
                    for j in range(4):
                        value = exact(mpmath.mpf(x[i, j]), mpmath.mpf(y[i, j]))
                        assert _inside(result.lo[i, j], result.hi[i, j], value)
            total = a.sum(axis=1)
            for i in range(3):
                assert _inside(total.lo[i], total.hi[i], mpmath.fsum(mpmath.mpf(v) for v in x[i]))
    W = rng.standard_normal((4, 5))
    exact = a.mid @ W
    assert a.matmul(W).contains(exact) and a.bmm(IntervalArray(W)).contains(exact)
    assert a.einsum("ij,jk->ik", IntervalArray(W)).contains(exact)
    assert np.all(a.norm_upper() >= np.linalg.norm(a.mid, axis=1))
    assert np.all(a.norm_lower() <= np.linalg.norm(a.mid, axis=1))


def test_division_by_an_interval_holding_zero_is_refused():
    with pytest.raises(NotCertifiedError):
        IntervalArray(1.0) / IntervalArray(-1.0, 1.0)


@settings(max_examples=15)
@given(st.integers(0, 2**31 - 1))
def test_array_compiler_agrees_with_the_scalar_compiler(seed):
    rng = np.random.default_rng(seed)
    x, y = sp.symbols("x y", positive=True)
    expr = sp.sqrt(x ** 2 + y) / (1 + x) + sp.Max(x, y) * sp.exp(-x) - sp.Min(x, 2) ** 3 + abs(x - y)
    values = rng.random(5) * 3, rng.random(5) * 3
    arrays = compile_array(expr, [x, y])(*values)
    scalar = compile_interval(expr, [x, y])
    for i in range(5):
        single = scalar(values[0][i], values[1][i])
        assert arrays.lo[i] <= upper(single) and lower(single) <= arrays.hi[i]
        assert arrays.hi[i] - arrays.lo[i] <= 1e-12


def test_spectral_norm_of_a_large_matrix_is_bounded_tightly():
    rng = np.random.default_rng(0)
    M = np.eye(300) + 0.05 * rng.standard_normal((300, 300))
    truth = np.linalg.norm(M, 2)
    bound = spectral_norm_upper_large(M)
    assert truth <= bound <= truth * (1 + 1e-3)
    enclosure = Enclosure(M, np.full(M.shape, 1e-9))
    assert spectral_norm_upper_large(enclosure) >= truth


def _theorem_value(theorem, values: dict) -> float:
    symbols = sorted(theorem.statement.free_symbols, key=str)
    return compile_array(theorem.statement, symbols)(*[np.array(values[str(s)]) for s in symbols]).hi


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.floats(1e-3, 1.0))
def test_prefix_chain_and_normwise_product_hold_on_random_chains(seed, size):
    """The two stack theorems on three random 6 x 6 blocks: the variation of a product of moved Jacobians about
    the centre's product, and a product of entrywise enclosures carried with one normwise radius."""
    rng = np.random.default_rng(seed)
    J = [rng.standard_normal((6, 6)) for _ in range(3)]
    A = [j + size * rng.standard_normal((6, 6)) for j in J]
    prefix = {f"L_{{{k + 1}}}": np.linalg.norm(A[k], 2) * (1 + 1e-12) for k in range(3)}
    prefix |= {f"V_{{{k + 1}}}": np.linalg.norm(A[k] - J[k], 2) * (1 + 1e-12) for k in range(3)}
    prefix |= {r"\pi_{1}": np.linalg.norm(J[0], 2) * (1 + 1e-12),
               r"\pi_{2}": np.linalg.norm(J[1] @ J[0], 2) * (1 + 1e-12)}
    moved = np.linalg.norm(A[2] @ A[1] @ A[0] - J[2] @ J[1] @ J[0], 2)
    assert moved <= _theorem_value(chain_prefix(3), prefix)
    # normwise: J_l within R_l of M_l entrywise; S_l covers |P_(l-1)| R_l and the rounding of P_(l-1) M_l
    R = [size * rng.random((6, 6)) for _ in range(3)]
    M = [a - R[k] * rng.uniform(-1, 1, (6, 6)) for k, a in enumerate(A)]
    P, r = M[0], np.linalg.norm(R[0])
    for k in (1, 2):
        S = np.abs(P) @ R[k] + 1e-9 * (np.abs(P) @ np.abs(M[k]) + 1)
        P, r = P @ M[k], r * np.linalg.norm(A[k], 2) * (1 + 1e-12) + np.linalg.norm(S)
    bound = _theorem_value(normwise_product(3), {r"\|P_{3}\|_2": np.linalg.norm(P, 2) * (1 + 1e-12), "r_{3}": r})
    assert np.linalg.norm(A[0] @ A[1] @ A[2], 2) <= bound


def test_every_local_theorem_cites_known_lemmas_and_has_a_statement():
    assert len(LOCAL_THEOREMS) >= 12
    for theorem in LOCAL_THEOREMS.values():
        assert theorem.statement.free_symbols, theorem.id
        assert all(step.lemma is None or step.lemma in LEMMAS for step in theorem.proof.steps), theorem.id
        compile_array(theorem.statement, sorted(theorem.statement.free_symbols, key=str))
