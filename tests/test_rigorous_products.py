"""Midpoint-radius products, the two-pass outward rounding, the blockwise midpoint and radius, the BLAS
Frobenius bound and the large-matrix norm, each checked against mpmath at 200 bits on random operands
(every kind of factor: exact points, intervals, non-negative intervals, tiny and huge entries)."""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import NotCertifiedError
from lipbound.rigorous import arrays as A
from lipbound.rigorous.arrays import IntervalArray
from lipbound.rigorous.elementwise import all_finite, up_nonnegative
from lipbound.rigorous.functions import log10_upper_product
from lipbound.rigorous.linalg import (
    A_PRIORI_ROWS,
    Enclosure,
    RowGram,
    _fro_upper,
    _power_of_two_scale,
    _top_by_cholesky,
    lambda_max_upper,
    lambda_max_upper_large,
    spectral_norm_upper_large,
)
from lipbound.rigorous.rayleigh import row_gram_norm_lower, sandwich_top_bounds

#: Exponent ranges of the entries: ordinary, tiny (products underflow), large.
SCALES = st.sampled_from([0, -500, -1000, 300])


def _exact(x) -> mpmath.mpf:
    return mpmath.mpf(float(x))


def _inside(lo, hi, value) -> bool:
    return _exact(lo) <= value <= _exact(hi)


def _operand(rng, shape, kind: str, scale: int) -> IntervalArray:
    mid = rng.standard_normal(shape) * 2.0 ** scale
    if kind == "point":
        return IntervalArray(mid)
    width = np.abs(mid) * 1e-6 * rng.random(shape) + 2.0 ** scale * 1e-9
    if kind == "positive":
        mid = np.abs(mid) + width
    return IntervalArray(mid - width, mid + width)


def _samples(box: IntervalArray, rng, count: int = 3):
    """The two corners and random points of a box (float arrays inside it)."""
    yield box.lo
    yield box.hi
    for _ in range(count):
        yield box.lo + (box.hi - box.lo) * rng.random(box.shape)


@settings(max_examples=60)
@given(st.integers(-1074, 1023), st.integers(0, 2**52 - 1))
def test_two_pass_rounding_up_passes_the_next_float(exponent, mantissa):
    x = np.array([np.ldexp(1.0 + mantissa * 2.0 ** -52, exponent) if exponent > -1023
                  else mantissa * 2.0 ** -1074, 0.0, 5e-324])
    x = x[np.isfinite(x)]
    result = up_nonnegative(x)
    with mpmath.workprec(200):
        assert all(_exact(r) >= _exact(np.nextafter(v, np.inf)) for v, r in zip(x, result) if np.isfinite(r))
    assert np.all(result >= np.nextafter(x, np.inf))


@pytest.mark.parametrize("size", [1, 4, 1024, 1025, 5000])   # entry by entry up to 1024 entries, by the sum beyond
def test_all_finite_is_exact_also_when_the_sum_overflows(size):
    huge = np.full(size, 1.7e308)
    assert all_finite(huge) and all_finite(-huge.reshape(size, 1))   # the sum overflows; every entry is finite
    for bad in ([np.inf], [np.nan], [np.inf, -np.inf], [-np.inf]):
        for where in (0, size - 1):
            array = np.ones(max(size, len(bad)))
            array[where:where + len(bad)] = bad if where == 0 else bad[:1]
            assert not all_finite(array) and not all_finite(array.reshape(1, -1)), (size, bad, where)
    assert all_finite(np.ones(size)) and all_finite(2.5) and not all_finite(float("nan"))
    with pytest.raises(NotCertifiedError):
        IntervalArray(np.array([1.0, np.nan]))


@settings(max_examples=25)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["point", "interval", "positive"]),
       st.sampled_from(["point", "interval", "positive"]), SCALES, SCALES)
def test_products_of_every_kind_of_factor_enclose_the_exact_products(seed, left, right, scale_a, scale_b):
    rng = np.random.default_rng(seed)
    a, b = _operand(rng, (3, 4), left, scale_a), _operand(rng, (3, 4), right, scale_b)
    product = a * b
    with mpmath.workprec(200):
        for x, y in zip(_samples(a, rng), _samples(b, rng)):
            for i, j in itertools.product(range(3), range(4)):
                assert _inside(product.lo[i, j], product.hi[i, j], _exact(x[i, j]) * _exact(y[i, j]))
    scalar = _operand(rng, (), right, scale_b)  # a 0-d factor on either side
    for result in (a * scalar, scalar * a):
        with mpmath.workprec(200):
            for x in _samples(a, rng):
                for s in (scalar.lo, scalar.hi):
                    for i, j in itertools.product(range(3), range(4)):
                        assert _inside(result.lo[i, j], result.hi[i, j], _exact(x[i, j]) * _exact(s))


@settings(max_examples=25)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["point", "interval"]), st.sampled_from(["point", "interval"]),
       SCALES, SCALES)
def test_matmul_bmm_and_einsum_enclose_the_exact_contraction(seed, left, right, scale_a, scale_b):
    rng = np.random.default_rng(seed)
    a, b = _operand(rng, (2, 3, 5), left, scale_a), _operand(rng, (2, 5, 4), right, scale_b)
    W = rng.standard_normal((5, 4)) * 2.0 ** scale_b
    results = {"bmm": a.bmm(b), "einsum": a.einsum("hik,hkj->hij", b)}
    by_weight = a.matmul(W)
    with mpmath.workprec(200):
        for x, y in zip(_samples(a, rng), _samples(b, rng)):
            for h, i, j in itertools.product(range(2), range(3), range(4)):
                exact = mpmath.fsum(_exact(x[h, i, k]) * _exact(y[h, k, j]) for k in range(5))
                for result in results.values():
                    assert _inside(result.lo[h, i, j], result.hi[h, i, j], exact)
                exact_w = mpmath.fsum(_exact(x[h, i, k]) * _exact(W[k, j]) for k in range(5))
                assert _inside(by_weight.lo[h, i, j], by_weight.hi[h, i, j], exact_w)
    if scale_a == scale_b == 0:  # ordinary entries: the radius is a few roundings, not more
        center = a.mid @ b.mid
        assert np.all(results["bmm"].hi - results["bmm"].lo <= 1e-12 * (np.abs(a.mid) @ np.abs(b.mid))
                      + 2 * (np.abs(a.mid) + a.rad) @ b.rad + 2 * a.rad @ np.abs(b.mid) + 1e-300)
        assert results["bmm"].contains(center)


@settings(max_examples=20)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(3, 4), (300, 300)]), st.booleans(), SCALES)
def test_midpoint_and_radius_cover_the_box_blockwise_or_not(seed, shape, transposed, scale):
    rng = np.random.default_rng(seed)
    box = _operand(rng, shape, "interval", scale)
    if transposed:  # a non-contiguous view takes the whole-array route
        box = box.swapaxes(0, 1)
    enclosure = box.to_enclosure()
    flat = np.flatnonzero(rng.random(box.lo.size) < (1.0 if box.lo.size < 100 else 0.002))
    with mpmath.workprec(200):
        for index in flat:
            i = np.unravel_index(index, box.shape)
            mid, rad = _exact(enclosure.mid[i]), _exact(enclosure.rad[i])
            assert mid - rad <= _exact(box.lo[i]) and _exact(box.hi[i]) <= mid + rad
    assert np.all(enclosure.rad <= (box.hi - box.lo) * (0.5 + 1e-15) + 4e-16 * np.abs(enclosure.mid) + 1e-300)


@settings(max_examples=20)
@given(st.integers(0, 2**31 - 1), st.booleans(), st.booleans(), SCALES)
def test_enclosure_products_contain_every_product_of_their_members(seed, left_exact, right_exact, scale):
    rng = np.random.default_rng(seed)
    X_mid, Y_mid = rng.standard_normal((3, 6)) * 2.0 ** scale, rng.standard_normal((6, 4))
    X = Enclosure.exact(X_mid) if left_exact else Enclosure(X_mid, np.abs(X_mid) * 1e-7)
    Y = Enclosure.exact(Y_mid) if right_exact else Enclosure(Y_mid, np.abs(Y_mid) * 1e-7)
    product = X @ Y
    with mpmath.workprec(200):
        for _ in range(4):
            x = X.mid + X.rad * rng.uniform(-1, 1, X.shape)
            y = Y.mid + Y.rad * rng.uniform(-1, 1, Y.shape)
            for i, j in itertools.product(range(3), range(4)):
                exact = mpmath.fsum(_exact(x[i, k]) * _exact(y[k, j]) for k in range(6))
                assert abs(exact - _exact(product.mid[i, j])) <= _exact(product.rad[i, j])


@settings(max_examples=25)
@given(st.integers(0, 2**31 - 1), st.sampled_from([0, -420, -600, 420, -1070]), st.integers(1, 400))
def test_frobenius_bound_by_blas_or_by_scaling_is_above_the_exact_norm(seed, scale, size):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal(size) * 2.0 ** scale
    bound = _fro_upper(X)
    with mpmath.workprec(200):
        exact = mpmath.sqrt(mpmath.fsum(_exact(v) ** 2 for v in X))
        assert exact <= _exact(bound)
        assert _exact(bound) <= exact * (1 + 1e-12) + mpmath.sqrt(size) * mpmath.mpf(2) ** -537


@settings(max_examples=20)
@given(st.integers(0, 2**31 - 1), st.sampled_from([-3, 0, 5, -1060]))
def test_power_of_two_scaling_reports_exactly_whether_it_lost_bits(seed, exponent):
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((4, 4)) * 2.0 ** exponent
    M[0, 0] = 3.0 * 2.0 ** (exponent + 40)  # scaling down by the largest entry can push others below 2^-1022
    scaled, e, exact = _power_of_two_scale(M)
    assert 0.5 <= np.max(np.abs(scaled)) < 1
    assert exact == bool(np.array_equal(np.ldexp(scaled, e), M))


@settings(max_examples=8)
@given(st.integers(0, 2**31 - 1), st.booleans(), st.booleans())
def test_large_matrix_norm_is_above_the_exact_singular_value(seed, with_estimate, inexact):
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((7, 5)) + np.eye(7, 5) * 3
    rad = np.abs(M) * 1e-8 if inexact else np.zeros_like(M)
    with mpmath.workdps(60):
        exact = max(mpmath.svd_r(mpmath.matrix(M.tolist()), compute_uv=False))
        frobenius_rad = mpmath.sqrt(mpmath.fsum(_exact(r) ** 2 for r in rad.ravel()))
    estimate = float(np.linalg.norm(M, 2)) if with_estimate else None
    bound = spectral_norm_upper_large(Enclosure(M, rad), estimate)
    assert exact + frobenius_rad <= _exact(bound) if inexact else exact <= _exact(bound)
    assert bound <= float(exact) * (1 + 1e-5) + 2 * float(frobenius_rad)


def _scaled_rows(seed, shape, exponent, subset, inexact):
    """A row Gram of a random enclosure at scale ``2^exponent``, some of its rows and their scales (the first 0)."""
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal(shape) * 2.0 ** exponent
    rad = np.abs(Z) * 1e-7 if inexact else np.zeros_like(Z)
    rows = np.sort(rng.choice(shape[0], max(1, shape[0] // 2), replace=False)) if subset else np.arange(shape[0])
    scales = rng.uniform(0, 3, rows.size) * 2.0 ** -exponent
    scales[0] = 0.0
    return rng, Z, rad, RowGram(Enclosure(Z, rad)), rows, scales


@settings(max_examples=12)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(6, 4), (3, 9), (12, 5)]), st.sampled_from([-600, -30, 0, 40, 600]),
       st.booleans(), st.booleans())
def test_row_gram_norms_cover_every_scaled_member_of_the_enclosure(seed, shape, exponent, subset, inexact):
    rng, Z, rad, gram, rows, scales = _scaled_rows(seed, shape, exponent, subset, inexact)
    bound = gram.norm_upper(scales, None if not subset else rows)
    with mpmath.workdps(60):
        norms = [max(mpmath.svd_r(mpmath.matrix([[_exact(s) * _exact(v) for v in member[r]]
                                                 for s, r in zip(scales, rows)]), compute_uv=False))
                 for member in (Z, Z + rad, Z - rad * rng.uniform(-1, 1, shape))]
        assert all(norm <= _exact(bound) for norm in norms)
    assert bound <= float(norms[0]) * (1 + 1e-4) + 2 * np.linalg.norm(scales[:, None] * rad[rows]) + 1e-150
    largest = float(np.max(rad))  # ||rad||_F without its squares underflowing
    assert gram.norm_upper(np.zeros(rows.size), rows) <= 2 * largest * np.linalg.norm(rad / (largest or 1))


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(6, 4), (3, 9), (40, 12)]), st.sampled_from([-600, -30, 0, 40, 600]),
       st.booleans(), st.booleans())
def test_row_gram_lower_norm_lies_below_the_exact_norm_and_the_upper_bound(seed, shape, exponent, subset, inexact):
    rng, Z, rad, gram, rows, scales = _scaled_rows(seed, shape, exponent, subset, inexact)
    below = row_gram_norm_lower(gram, scales, None if not subset else rows)
    with mpmath.workdps(60):
        exact = max(mpmath.svd_r(mpmath.matrix([[_exact(s) * _exact(v) for v in Z[r]] for s, r in zip(scales, rows)]),
                                 compute_uv=False))
    assert _exact(below) <= exact and below <= gram.norm_upper(scales, None if not subset else rows)
    assert below >= 0.5 * float(exact)        # twelve power steps from the rows' norms: no trivial bound
    assert row_gram_norm_lower(gram, np.zeros(rows.size), rows) == 0.0
    with pytest.raises(Exception, match="non-negative row scales"):
        row_gram_norm_lower(gram, -scales - 1.0, None if not subset else rows)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(3, 7), (8, 5), (12, 30)]), st.sampled_from([-300, 0, 200]),
       st.booleans())
def test_sandwich_lower_bound_lies_below_every_members_top_eigenvalue_and_the_upper_bound(seed, shape, exponent,
                                                                                         inexact):
    """``sandwich_top_bounds``: below ``lambda_max(S H S^T)`` (mpmath, 60 digits) at corners and random points of
    both enclosures and below the certified upper bound of the formed product; near the top for a Gram H."""
    rng = np.random.default_rng(seed)
    d, m = shape
    kind = "interval" if inexact else "point"
    S = _operand(rng, (d, m), kind, exponent // 2)
    root = rng.standard_normal((m, m + 2))
    H_mid = root @ root.T
    H = IntervalArray(H_mid - 1e-9 * np.abs(H_mid), H_mid + 1e-9 * np.abs(H_mid)) if inexact else IntervalArray(H_mid)
    below, estimate = sandwich_top_bounds(S, H)
    formed = lambda_max_upper(S.bmm(H).bmm(S.swapaxes(0, 1)).to_enclosure())
    assert below <= formed
    with mpmath.workdps(60):
        for s_point, h_point in zip(_samples(S, rng, 1), _samples(H, rng, 1)):
            h_point = (h_point + h_point.T) / 2 if inexact else h_point
            M = mpmath.matrix(s_point.tolist()) * mpmath.matrix(h_point.tolist()) * mpmath.matrix(s_point.T.tolist())
            top = max(mpmath.eigsy((M + M.T) / 2, eigvals_only=True))
            assert _exact(below) <= top
    assert below >= 0.5 * estimate > 0          # twelve power steps: no trivial bound


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(300, 300), (150, 600), (1, 70000)]),
       st.sampled_from(["same", "row", "column"]), st.sampled_from(["interval", "positive"]), SCALES)
def test_large_products_by_panels_are_the_same_floats_as_the_hull_of_the_ends(seed, shape, broadcast, kind, scale):
    """A large matrix times an interval matrix of its shape, a row or a column (formed by panels of rows) has the
    ends of the hull of the four products of the ends, each rounded outward as :func:`elementwise.down` and
    ``up`` round (written here from the definition), both ways round; zeros and ends of both signs included."""
    from lipbound.rigorous.elementwise import down, up
    rng = np.random.default_rng(seed)
    x = _operand(rng, shape, "interval", scale)
    other = {"same": shape, "row": (1, shape[1]), "column": (shape[0], 1)}[broadcast]
    y = _operand(rng, other, kind, -scale // 2)
    for end in (x.lo, x.hi):   # exact zeros
        end.reshape(-1)[::5] = 0.0
    ends = [x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi]
    low, high = down(np.minimum.reduce(ends)), up(np.maximum.reduce(ends))
    for product in (x * y, y * x):
        assert np.array_equal(product.lo, low) and np.array_equal(product.hi, high)


@pytest.mark.parametrize("rows", [250, 400])
def test_row_gram_of_many_rows_places_its_level_by_eigenvalues_or_lanczos(rows):
    rng = np.random.default_rng(4)
    Z = rng.standard_normal((rows, 6)) * rng.uniform(0.2, 2, (rows, 1))
    scales = rng.uniform(0, 1, rows)
    exact = np.linalg.norm(scales[:, None] * Z, 2)
    bound = RowGram(Z).norm_upper(scales)
    assert exact * (1 - 1e-12) <= bound <= exact * (1 + 1e-4)
    with pytest.raises(Exception, match="non-negative row scales"):
        RowGram(Z).norm_upper(-scales)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 40), st.sampled_from([-900, 0, 900]))
def test_the_factorisations_a_priori_residual_bounds_the_top_eigenvalue_as_the_formed_product_does(seed, k, exponent):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((k, k + 3)) * 2.0 ** (exponent / 2)
    S = A @ A.T
    S = np.triu(S) + np.triu(S, 1).T
    top = float(np.linalg.eigvalsh(S)[-1])
    formed = _top_by_cholesky(S.copy(), top, 1e-5)
    a_priori = _top_by_cholesky(S.copy(), top, 1e-5, a_priori=True)
    with mpmath.workdps(80):
        exact = max(mpmath.eigsy(mpmath.matrix(S.tolist()), eigvals_only=True))
    assert exact <= a_priori.a and exact <= formed.a
    assert abs(float(a_priori.b) - float(formed.b)) <= 1e-11 * top


def test_row_gram_of_more_rows_than_a_priori_rows_covers_the_norm_without_the_product():
    rows = A_PRIORI_ROWS + 16
    rng = np.random.default_rng(5)
    Z = rng.standard_normal((rows, 8)) * rng.uniform(0.2, 2, (rows, 1))
    scales = rng.uniform(0, 1, rows)
    exact = np.linalg.norm(scales[:, None] * Z, 2)
    assert exact * (1 - 1e-12) <= RowGram(Z).norm_upper(scales) <= exact * (1 + 1e-4)


def test_row_gram_estimates_start_from_the_last_ritz_vector_of_alike_factors_with_the_same_bounds(monkeypatch):
    """Warm starts (RowGram._estimate): factors near earlier ones of the same rows start their Lanczos steps from that
    estimate's Ritz vector and stop when it settles; the certified norms cover the exact ones and match the bounds of
    the estimates from the fixed random start (the estimate places the level only)."""
    from lipbound.rigorous import linalg
    rng = np.random.default_rng(7)
    rows = 700
    Z = rng.standard_normal((rows, 90)) @ rng.standard_normal((90, 120)) * rng.uniform(0.2, 2, (rows, 1))
    base = rng.uniform(0.1, 1, rows)
    alike = [base * (1 + 0.01 * k * rng.uniform(0, 1, rows)) for k in range(4)]
    other = rng.uniform(0.1, 1, rows)                       # far from the others: cold
    starts = []
    ritz = linalg._top_ritz
    monkeypatch.setattr(linalg, "_top_ritz", lambda S, steps, start, settled=0.0: (
        starts.append((steps, settled)), ritz(S, steps, start, settled))[1])
    gram = RowGram(Z)
    warm = [gram.norm_upper(s) for s in alike + [other]]
    assert [steps for steps, _ in starts] == [60, linalg.WARM_STEPS, linalg.WARM_STEPS, linalg.WARM_STEPS, 60]
    monkeypatch.setattr(linalg, "WARM_STEPS", 0)
    cold = [RowGram(Z).norm_upper(s) for s in alike + [other]]
    for s, w, c in zip(alike + [other], warm, cold):
        exact = np.linalg.norm(s[:, None] * Z, 2)
        assert exact * (1 - 1e-12) <= w <= exact * (1 + 2e-5)
        assert abs(w - c) <= 1e-12 * c


def test_a_warm_estimate_that_misses_the_top_gives_the_fixed_starts_bound(monkeypatch):
    """Where the warm-started estimate's level does not factorise (its Ritz value below the top: a crossing of
    eigenvalues between the radii), the level of the estimate from the fixed start is tried, on S as it came: the
    same bound as without warm starts, not a level raised by factors of 4."""
    from lipbound.rigorous import linalg
    rng = np.random.default_rng(8)
    rows = 600
    Z = rng.standard_normal((rows, 80)) * rng.uniform(0.2, 2, (rows, 1))
    scales = [rng.uniform(0.5, 1, rows), None]
    scales[1] = scales[0] * (1 + 0.001 * rng.uniform(0, 1, rows))
    ritz = linalg._top_ritz

    def missing(S, steps, start, settled=0.0):
        value, vector = ritz(S, steps, start, settled)
        return (value * 0.9 if settled else value), vector    # the warm ones 10% low
    monkeypatch.setattr(linalg, "_top_ritz", missing)
    gram = RowGram(Z)
    warm = [gram.norm_upper(s) for s in scales]
    monkeypatch.setattr(linalg, "WARM_STEPS", 0)
    cold = [RowGram(Z).norm_upper(s) for s in scales]
    assert warm == cold


def test_large_matrix_norm_from_a_priori_columns_on_covers_the_norm_without_the_product():
    rng = np.random.default_rng(6)
    M = rng.standard_normal((A_PRIORI_ROWS + 40, A_PRIORI_ROWS + 8)) * rng.uniform(0.2, 2, (1, A_PRIORI_ROWS + 8))
    exact = np.linalg.norm(M, 2)
    assert exact * (1 - 1e-12) <= spectral_norm_upper_large(M) <= exact * (1 + 1e-4)


def test_row_gram_counts_the_bits_its_scaling_loses():
    Z = np.array([[3.0 * 2.0 ** 40, 0.0], [(1 + 2.0 ** -52) * 2.0 ** -1000, 3.0 * 2.0 ** -1030]])  # bits lost
    assert not _power_of_two_scale(Z)[2]
    gram = RowGram(Z)
    with mpmath.workdps(60):
        for scales in ([0.0, 1.0], [1.0, 1.0]):
            scaled = mpmath.matrix([[_exact(s) * _exact(v) for v in row] for s, row in zip(scales, Z)])
            assert max(mpmath.svd_r(scaled, compute_uv=False)) <= _exact(gram.norm_upper(np.array(scales)))


def test_an_operand_used_many_times_is_prepared_once():
    values = IntervalArray(np.ones((2, 3)), np.ones((2, 3)) + 1e-9)
    first = values._as_operand()
    weights = IntervalArray(np.full((4, 2), 0.5))
    weights.einsum("ih,hv->iv", values)
    assert values._as_operand() is first
    assert A._BLOCK >= 1024


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e300, allow_nan=False), min_size=1, max_size=40))
def test_the_decimal_exponent_of_a_product_is_above_the_exact_one_even_past_the_float_range(factors):
    exponent = log10_upper_product(*factors)
    with mpmath.workprec(400):
        exact = mpmath.log10(mpmath.fprod(mpmath.mpf(f) for f in factors))
    assert mpmath.mpf(exponent) >= exact and exponent - exact < 1e-9
    assert log10_upper_product(*factors, float("inf")) == float("inf")


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2 ** 31), st.sampled_from([1, 7, 384, 1536]), st.sampled_from(["point", "interval"]),
       st.sampled_from([0, -200, 200]))
def test_exactly_summed_products_enclose_the_exact_product_within_a_few_ulps(seed, k, kind, scale):
    """``matmul(W, exact_sums=True)`` against the exact product (fractions) at the interval's ends: an
    enclosure; for a point and long sums a hundredth of the plain product's width (``k u |x| |W|``) or less;
    float32 weights (the checkpoints' own) as well as float64, columns of entries spread over e^+-4."""
    from fractions import Fraction
    rng = np.random.default_rng(seed)
    x = _operand(rng, (3, k), kind, scale)
    W = (rng.standard_normal((k, 4)) * 0.05 * np.exp(rng.uniform(-4, 4, (k, 1)))).astype(
        np.float32 if seed % 2 else np.float64)
    product = x.matmul(W, exact_sums=True)
    exact_W = [[Fraction(float(w)) for w in column] for column in np.asarray(W, dtype=np.float64).T]
    for i, j in itertools.product(range(3), range(4)):
        for row in (x.lo[i], x.hi[i]) if kind == "interval" else (x.lo[i],):
            value = sum(Fraction(float(a)) * b for a, b in zip(row, exact_W[j]))
            assert Fraction(float(product.lo[i, j])) <= value <= Fraction(float(product.hi[i, j]))
    if kind == "point" and k >= 384:
        plain = x.matmul(W)
        assert np.all(product.hi - product.lo <= 1e-2 * (plain.hi - plain.lo))


def test_exactly_summed_products_refuse_rows_too_small_to_split():
    with pytest.raises(NotCertifiedError, match="product"):
        IntervalArray(np.full((2, 3), 1e-200)).matmul(np.ones((3, 2)), exact_sums=True)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2 ** 31), st.sampled_from([2, 9, 384, 1536]), st.sampled_from(["point", "interval"]),
       st.sampled_from([0, -200, 200]))
def test_exact_sums_enclose_the_exact_sum_within_a_few_ulps(seed, k, kind, scale):
    """``sum(exact_sums=True)`` against the exact sum (fractions) of each end, on rows that cancel to a small
    fraction of their entries: an enclosure, a few ulps of the sum wide for a point where the plain sum's
    width is ``k u sum |x|``, the axis and keepdims as the plain sum's."""
    from fractions import Fraction
    rng = np.random.default_rng(seed)
    x = _operand(rng, (3, k), kind, scale)
    lo, hi = x.lo.copy(), x.hi.copy()
    lo[:, -1] -= np.sum(lo[:, :-1], axis=-1) * (1 - 1e-6)      # near cancellation
    hi[:, -1] = np.maximum(hi[:, -1] - np.sum(hi[:, :-1], axis=-1) * (1 - 1e-6), lo[:, -1])
    x = IntervalArray(lo, hi) if kind == "interval" else IntervalArray(lo)
    total = x.sum(axis=-1, exact_sums=True)
    for i in range(3):
        for end in (x.lo[i], x.hi[i]):
            exact = sum(Fraction(float(a)) for a in end)
            assert Fraction(float(total.lo[i])) <= exact <= Fraction(float(total.hi[i]))
    if kind == "point":
        spacing = np.spacing(np.abs(total.mid)) + np.spacing(np.max(np.abs(x.lo), axis=-1)) * 2.0 ** -20
        assert np.all(total.hi - total.lo <= 8 * spacing)
        assert np.all(total.hi - total.lo <= x.sum(axis=-1).hi - x.sum(axis=-1).lo)
    kept = x.sum(axis=0, keepdims=True, exact_sums=True)
    assert kept.shape == (1, k) and np.all(kept.lo <= x.sum(axis=0, keepdims=True).hi)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.sampled_from([5, 60, 320]), spread=st.sampled_from([0.0, 1e-6]))
def test_top_eigenvalue_from_one_factorisation_holds(seed, size, spread):
    """The one-factorisation bound on ``lambda_max`` is above the top eigenvalue of every sampled member of the
    enclosure and within 1e-5 of the midpoint's (the level sits 1e-6 above the estimate)."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((size, size // 2 + 1))
    mid = G @ G.T
    bound = lambda_max_upper_large(Enclosure(mid, np.full_like(mid, spread)))
    top = np.linalg.eigvalsh(mid)[-1]
    assert top <= bound <= top * (1 + 1e-5) + size * spread
    for _ in range(3):
        noise = rng.uniform(-spread, spread, (size, size))
        assert np.linalg.eigvalsh(mid + (noise + noise.T) / 2)[-1] <= bound
