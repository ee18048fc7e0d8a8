"""The feed-forward block of a block's per-token maps on the image of a token's ball through the first LayerNorm.

In a post-norm block the per-token map after the attention is ``LN_2 o (id + FFN) o LN_1``.  On token i's ball
``B(x, r)`` (the attention's output) the feed-forward input moves by ``e = y_2 - x_2 = (y - x) J_1(x) + e_1`` with
``||e_1|| <= delta = r V_1 + rho`` (the mean Jacobian of LN_1 on the segment, and the float centre's rounding), so
neuron k's pre-activation ``h_k + e.w_k`` moves by at most

    c_k = min(R ||w_k||, r ||J_1(x) w_k|| + delta ||w_k||)

(lemma feedforward-folded-reach), R the radius of the feed-forward ball the chain forms.  The first LayerNorm's
projection and scales do not line up with the columns ``w_k``: on MiniLM's first block ``c_k`` is about 0.37 of
``R ||w_k||``.  The slopes' ranges over ``h_k +- c_k`` then give the feed-forward Jacobian's supremum and change
(theorem local-feedforward-variation, with ``J_1(x) w_k`` for ``w_k`` in the change seen through the first
LayerNorm, theorem local-feedforward-folded-reach) on the set the token's ball reaches, where the chain pays the
whole ball of radius R per neuron.
"""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray, gelu_slope
from ..rigorous.linalg import spectral_norm_upper_large
from ..symbolic import local as T
from ..symbolic.local_second_order import feedforward_folded_reach
from .bounds import _column_norms, _slope_deviation, _split_norms, evaluate_theorem

__all__ = ["FoldedFeedForward"]


class FoldedFeedForward:
    """Token by token, the feed-forward block's bounds on the pre-activation intervals ``h_k +- c_k`` (module
    docstring).

    Parameters
    ----------
    ffn : EnclosedFeedForward
        The feed-forward block at the float centres ``x_2``.
    folded_weights : callable
        ``i -> J_1(x) W_1`` (d, d_ff) enclosed at token i (the first LayerNorm's Jacobian at the centre times
        ``W_1``; :class:`~lipbound.local.tail.BlockTail` forms it once per token).
    """

    def __init__(self, ffn, folded_weights):
        self.ffn, self.folded_weights = ffn, folded_weights
        self.columns = IntervalArray(_column_norms(ffn.ffn))                               # ||w_k||, rounded up
        self._folded: dict = {}

    def folded_columns(self, i: int) -> IntervalArray:
        """``||J_1(x) w_k||`` (d_ff,) at token i, rounded up, computed once."""
        if i not in self._folded:
            self._folded[i] = IntervalArray(self.folded_weights(i).norm_upper(axis=0))
        return self._folded[i]

    def reach(self, i: int, r: float, delta: float, radius: float) -> np.ndarray:
        """``c_k = min(radius ||w_k||, r ||J_1(x) w_k|| + delta ||w_k||)`` (d_ff,), rounded up (lemma
        feedforward-folded-reach): how far neuron k's pre-activation moves on the image of token i's ball of radius
        r, ``delta >= r V_1 + rho``, ``radius`` the feed-forward ball's."""
        folded = self.folded_columns(i) * IntervalArray(float(r)) + self.columns * IntervalArray(float(delta))
        return np.minimum((self.columns * IntervalArray(float(radius))).hi, folded.hi)

    def deviations(self, i: int, reach: np.ndarray) -> np.ndarray:
        """``s_k >= |GELU'(h_k + t) - GELU'(h_k)|`` over ``|t| <= c_k`` (d_ff,): the range of GELU' over the interval
        about its value at the centre."""
        return _slope_deviation(gelu_slope(self.ffn.h[i] + IntervalArray(-reach, reach)), self.ffn.slope[i])

    def bounds(self, i: int, r: float, delta: float, radius: float) -> dict:
        """Token i's certified ``lipschitz`` (``M_F >= sup ||J_F||``), ``variation`` (``V_F >= sup ||J_F - J_F(x_2)||``)
        and ``change`` (``K >= sup ||J_1(x) (J_F - J_F(x_2))||``) on the image of its ball (theorems
        local-feedforward-variation and local-feedforward-folded-reach on the intervals of :meth:`reach`)."""
        if not all(np.isfinite(v) for v in (r, delta, radius)):
            return {"lipschitz": np.inf, "variation": np.inf, "change": np.inf}
        spread = self.deviations(i, self.reach(i, r, delta, radius))
        right, left = _split_norms(self.ffn.ffn, spread)    # ||diag(s)^(1/2) W_2||, ||W_1 diag(s)^(1/2)||
        root = IntervalArray(spread).sqrt()                    # ||J_1 W_1 diag(s)^(1/2)||:
        front = spectral_norm_upper_large((self.folded_weights(i) * root.expand(0)).to_enclosure())
        names = (r"\|W_2^\top \operatorname{diag}(s)^{1/2}\|", r"\|\operatorname{diag}(s)^{1/2} W_1^\top\|")
        variation = float(evaluate_theorem(T.feedforward_variation(), **{names[0]: np.float64(right),
                                                                          names[1]: np.float64(left)}))
        change = float(evaluate_theorem(feedforward_folded_reach(), **{
            r"\|J_1(x) W_1 \operatorname{diag}(s)^{1/2}\|": np.float64(front),
            r"\|\operatorname{diag}(s)^{1/2} W_2\|": np.float64(right)}))
        at_centre = IntervalArray(float(self.ffn.jacobian_norms([i])[i]))
        lipschitz = (at_centre + IntervalArray(variation)).hi.item()
        return {"lipschitz": lipschitz, "variation": variation, "change": change}
