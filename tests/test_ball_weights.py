"""Attention weights on a Frobenius ball with each row's scores moving together (lipbound/local/ball_weights.py),
against a forward pass written in the tests (test_relational._layer_forward):

* every weight at sampled points of the ball (boundary included) and at points found by ascent (descent) on the
  weight whose upper (lower) end is least tight lies in the enclosure (hypothesis: token counts, radii, weight scales);
* the bound is tighter than lipbound's softmax ranges on the scores' box somewhere on a generated layer, gives
  the trivial ends where its exponents leave the float range, and is refused where it does not apply.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_relational import _ascend_on_ball, _ball_points, _layer, _layer_forward

from lipbound.local.ball_weights import BallWeights
from lipbound.local.enclosed import EnclosedAttention
from lipbound.local.relational import frobenius_scores, weights_on


def _ascend(target, X, eps, h, i, j, rng, sign=1.0):
    """A point of the ball about X where ``p_ij`` of head h is large (``sign`` 1) or small (-1)."""
    return _ascend_on_ball(X, eps, lambda Y: sign * np.log(_layer_forward(target, Y)[1][h, i, j]), rng, 8, rate=0.5)


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 5), st.floats(1e-3, 1.0), st.floats(0.3, 2.0))
def test_weights_on_the_ball_enclose_sampled_and_ascended_points(seed, n, eps, scale):
    target, rng = _layer(seed, scale=scale)
    X = rng.standard_normal((n, 6))
    E = EnclosedAttention(target, X)
    ranges = BallWeights.of(E).weights(eps)
    P_x = _layer_forward(target, X)[1]
    assert np.all(ranges.lo <= P_x) and np.all(P_x <= ranges.hi) and np.all(ranges.hi <= 1.0)
    high = np.unravel_index(np.argmin(ranges.hi - P_x + (ranges.hi >= 1.0)), P_x.shape)
    low = np.unravel_index(np.argmin(P_x - ranges.lo + (ranges.lo <= 0.0)), P_x.shape)
    points = _ball_points(rng, X, eps, 30) + [_ascend(target, X, eps, *high, rng),
                                              _ascend(target, X, eps, *low, rng, sign=-1.0)]
    for Y in points:
        P = _layer_forward(target, Y)[1]
        assert np.all(ranges.lo <= P + 1e-12) and np.all(P <= ranges.hi + 1e-12)


def test_rows_moving_together_beat_the_box_and_scope():
    target, rng = _layer(3, scale=1.0)
    X = rng.standard_normal((5, 6))
    E = EnclosedAttention(target, X)
    eps = 0.3
    ball, box = BallWeights.of(E).weights(eps), weights_on(frobenius_scores(E, eps))
    gain = box.hi - np.minimum(ball.hi, box.hi)
    assert np.max(gain) > 0.05 and np.median(gain) > 0.0
    assert BallWeights.of(EnclosedAttention(target, X, masses=np.full(5, 2.0))) is None
    far = BallWeights.of(E).weights(1e4)          # exponents past the float range: the trivial ends, no overflow
    np.testing.assert_array_equal(far.hi, 1.0)
    np.testing.assert_array_equal(far.lo, 0.0)
