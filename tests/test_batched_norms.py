"""Certified spectral norms of stacks of float matrices (lipbound.rigorous.batched) against numpy's SVD."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.rigorous.batched import spectral_norms_upper


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10 ** 6), st.integers(1, 12), st.integers(1, 12), st.sampled_from([1e-150, 1e-3, 1.0, 1e140]))
def test_every_bound_covers_the_norm_and_is_within_a_percent(seed, rows, columns, scale):
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((6, rows, columns)) * scale
    F[1] = np.outer(rng.standard_normal(rows), rng.standard_normal(columns)) * scale     # rank one
    F[2] = 0.0
    F[3, :min(rows, columns), :min(rows, columns)] = np.eye(min(rows, columns)) * scale  # a flat spectrum
    bounds = spectral_norms_upper(F)
    exact = np.linalg.norm(F, 2, axis=(1, 2))
    assert np.all(bounds >= exact * (1 - 1e-14))   # numpy's SVD is itself within a few ulps
    nonzero = exact > 0
    np.testing.assert_array_less(bounds[nonzero], exact[nonzero] * 1.01)
    assert bounds[2] < 1e-150   # the zero matrix: the underflow allowance only


def test_a_bound_below_the_norm_would_be_caught():
    """The certificate is not the estimate: a matrix whose power estimate starts far below its norm (the top singular
    vector orthogonal to the start) still gets a bound above the norm."""
    F = np.diag([1.0, 2.0, 50.0])[None]
    F[0, 2, 2] = 50.0
    start = np.ones(3) + 0.01 * np.arange(3)
    F = F @ np.linalg.qr(np.stack([start, [1.0, -1.0, 0.0], [1.0, 1.0, -2.04]], axis=1))[0].T
    bound = spectral_norms_upper(F, steps=1)[0]
    assert bound >= np.linalg.norm(F[0], 2) * (1 - 1e-14)
    assert bound <= 50.0 * 1.01
