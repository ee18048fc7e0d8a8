"""The gated feed-forward block of a decoder at a point and on token balls (SwiGLU; Shazeer 2020).

``FFN(y) = (act(a) * b) W_down + b_down`` with gate pre-activations ``a = y W_gate + b_gate`` and up
projections ``b = y W_up + b_up`` (Llama, Mistral, Qwen: act = SiLU).  Its Jacobian at a token (row
convention) is

    J = W_gate diag(act'(a) b) W_down + W_up diag(act(a)) W_down = W_1 diag(s) W_2,
    W_1 = [W_gate  W_up] (d, 2 d_ff),   W_2 = [W_down; W_down] (2 d_ff, d),   s = (act'(a) b, act(a)),

a plain feed-forward Jacobian with the slope vector s.  On the ball ``B(y, R)`` each gate and up
pre-activation stays within ``||w_k|| R`` of its value at y (``w_k`` the columns of ``W_gate`` and
``W_up``), so each entry of s stays within its range over those intervals; with ``t_k`` the largest
deviation of ``s_k`` from its value at y (theorem local-gated-variation)

    sup ||J(y') - J(y)|| <= ||W_2^T diag(t)^(1/2)|| ||diag(t)^(1/2) W_1^T||,

and the movement of the block on the ball is at most ``(||J(y)|| + that) R`` (mean value theorem).  The
block is not globally Lipschitz (its Jacobian grows with ``b``), so there is no global fallback.

The activation is enclosed here: SiLU ``x sigma(x)`` and its slope ``sigma(x) (1 + x (1 - sigma(x)))``,
which increases on ``[-x*, x*]`` and decreases outside, ``x*`` (about 2.3994) the positive root of
``2 = x tanh(x / 2)``; the slope's range over an interval is the hull of its values at the ends and
at the critical points the interval reaches, ``max`` and ``1 - max`` (``silu'(x) + silu'(-x) = 1``)
from the certified slope range of :mod:`lipbound.symbolic.activations`.  The exact GELU uses
:mod:`lipbound.rigorous.arrays`.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import NotCertifiedError, WeightsError
from ..numeric.model import GatedFeedForward
from ..rigorous.arrays import IntervalArray, as_interval_array, gelu, gelu_slope
from ..rigorous.intervals import lower, upper
from ..rigorous.linalg import spectral_norm_upper_large
from ..symbolic import local as T
from ..symbolic.activations import slope_range
from .bounds import LocalBounds, evaluate_theorem

__all__ = ["EnclosedGatedFeedForward", "gated_bounds", "silu", "silu_slope", "ACTIVATION_ENCLOSURES"]


def _sigmoid_at(x: np.ndarray) -> IntervalArray:
    """``sigma(x)`` at float points, enclosed (``1 / (1 + e^-x)`` for x >= 0, ``e^x / (1 + e^x)`` below: no
    overflow)."""
    x = np.asarray(x, dtype=np.float64)
    negative = IntervalArray(-np.abs(x)).exp()                    # e^{-|x|} in (0, 1]
    upper_half = (IntervalArray(1.0) + negative).reciprocal()     # sigma(|x|)
    return IntervalArray(np.where(x >= 0, upper_half.lo, (IntervalArray(1.0) - upper_half).lo),
                         np.where(x >= 0, upper_half.hi, (IntervalArray(1.0) - upper_half).hi))


def _silu_slope_at(x: np.ndarray) -> IntervalArray:
    sigma = _sigmoid_at(x)
    point = IntervalArray(x)
    return sigma * (IntervalArray(1.0) + point * (IntervalArray(1.0) - sigma))


@functools.lru_cache(maxsize=1)
def _silu_extrema() -> tuple[float, float, float, float]:
    """``(x_lo, x_hi, top, bottom)``: the positive critical point of silu' lies in ``[x_lo, x_hi]`` (checked by
    the sign of ``2 - x tanh(x / 2)`` at both ends, which decreases on x > 0), ``top >= max silu'`` and
    ``bottom <= min silu' = 1 - max silu'``."""
    found = slope_range("silu")
    centre = found.argmax
    ends = np.array([centre - 1e-7, centre + 1e-7])
    sigma = _sigmoid_at(ends)
    sign = IntervalArray(2.0) - IntervalArray(ends) * (IntervalArray(2.0) * sigma - IntervalArray(1.0))
    if not (sign.lo[0] > 0 and sign.hi[1] < 0):
        raise NotCertifiedError("silu critical point", "a bracket [x_lo, x_hi] with a sign change of silu''",
                                f"no sign change about {centre}", "widen the bracket")
    return float(ends[0]), float(ends[1]), upper(found.maximum), lower(found.minimum)


def silu_slope(x: IntervalArray) -> IntervalArray:
    """The range of ``silu'`` over each interval (module docstring)."""
    x = as_interval_array(x)
    x_lo, x_hi, top, bottom = _silu_extrema()
    ends_lo = _silu_slope_at(x.lo)
    ends_hi = ends_lo if x.is_point else _silu_slope_at(x.hi)
    lo = np.minimum(ends_lo.lo, ends_hi.lo)
    hi = np.maximum(ends_lo.hi, ends_hi.hi)
    hi = np.where((x.lo <= x_hi) & (x.hi >= x_lo), np.maximum(hi, top), hi)
    lo = np.where((x.lo <= -x_lo) & (x.hi >= -x_hi), np.minimum(lo, bottom), lo)
    return IntervalArray(np.maximum(lo, bottom), np.minimum(hi, top))


def silu(x: IntervalArray) -> IntervalArray:
    """``silu(x) = x sigma(x)`` on each interval, in mean-value form about the midpoint."""
    x = as_interval_array(x)
    mid = x.mid
    at_mid = IntervalArray(mid) * _sigmoid_at(mid)
    if not np.any(x.hi > x.lo):
        return at_mid
    return at_mid + silu_slope(x) * (x - IntervalArray(mid))


#: activation name -> (its enclosure on intervals, the range of its slope on intervals)
ACTIVATION_ENCLOSURES = {"silu": (silu, silu_slope), "swish": (silu, silu_slope), "gelu": (gelu, gelu_slope)}


class EnclosedGatedFeedForward:
    """The gated block (branch only: the residual step adds its input) at tokens Y (n, d).

    Attributes
    ----------
    gate, up : IntervalArray (n, d_ff)
        ``a`` and ``b``.
    act, act_slope : IntervalArray (n, d_ff)
        ``act(a)`` and ``act'(a)``.
    output : IntervalArray (n, d)
    """

    def __init__(self, ffn: GatedFeedForward, Y):
        if ffn.act not in ACTIVATION_ENCLOSURES:
            raise WeightsError("act", f"one of {', '.join(ACTIVATION_ENCLOSURES)} (enclosed rigorously)",
                               repr(ffn.act), "local certificates cover SwiGLU and the exact GELU")
        Y = as_interval_array(Y)
        self.ffn, self.Y = ffn, Y
        self.value_of, self.slope_of = ACTIVATION_ENCLOSURES[ffn.act]
        self.gate = Y.matmul(ffn.W_gate) + IntervalArray(ffn.b_gate)
        self.up = Y.matmul(ffn.W_up) + IntervalArray(ffn.b_up)
        self.act = self.value_of(self.gate)
        self.act_slope = self.slope_of(self.gate)
        self.output = (self.act * self.up).matmul(ffn.W_down) + IntervalArray(ffn.b_down)
        self._norms: dict = {}

    @property
    def slopes(self) -> IntervalArray:
        """``s = (act'(a) b, act(a))`` (n, 2 d_ff)."""
        first = self.act_slope * self.up
        return IntervalArray(np.concatenate([first.lo, self.act.lo], axis=1),
                             np.concatenate([first.hi, self.act.hi], axis=1))

    def jacobian_block(self, i: int) -> IntervalArray:
        """``J_i = (W_gate diag(act'(a_i) b_i) + W_up diag(act(a_i))) W_down`` (d, d)."""
        f = self.ffn
        left = IntervalArray(f.W_gate) * (self.act_slope[i] * self.up[i]).expand(0) \
            + IntervalArray(f.W_up) * self.act[i].expand(0)
        return left.einsum("ak,kb->ab", IntervalArray(f.W_down))

    def jacobian_norms(self, tokens=None) -> np.ndarray:
        """Certified ``||J_i||`` for the given tokens (all by default; 0 for the others), each computed once."""
        n = self.gate.shape[0]
        out = np.zeros(n)
        for i in (range(n) if tokens is None else tokens):
            if i not in self._norms:
                self._norms[i] = spectral_norm_upper_large(self.jacobian_block(i).to_enclosure())
            out[i] = self._norms[i]
        return out

    def deviations(self, R: np.ndarray) -> np.ndarray:
        """``t`` (n, 2 d_ff): how far each entry of s can move on the balls ``B(y_i, R_i)`` from its value at y
        (its range over the pre-activations' intervals, about the enclosure at y)."""
        f = self.ffn
        radii = IntervalArray(R)[:, None]
        reach_gate, reach_up = ((IntervalArray(IntervalArray(W).norm_upper(axis=0))[None] * radii).hi
                                for W in (f.W_gate, f.W_up))
        gate = self.gate + IntervalArray(-reach_gate, reach_gate)
        up = self.up + IntervalArray(-reach_up, reach_up)
        on_ball = self.slope_of(gate) * up, self.value_of(gate)
        at_centre = self.act_slope * self.up, self.act
        parts = [np.maximum((IntervalArray(moved.hi) - IntervalArray(centre.lo)).hi,
                            (IntervalArray(centre.hi) - IntervalArray(moved.lo)).hi)
                 for moved, centre in zip(on_ball, at_centre)]
        return np.maximum(np.concatenate(parts, axis=1), 0.0)

    def split_norms(self, t: np.ndarray) -> tuple[float, float]:
        """``(||W_2^T diag(t)^(1/2)||, ||diag(t)^(1/2) W_1^T||)`` for one token's deviations t, certified."""
        if not np.any(t):
            return 0.0, 0.0
        f = self.ffn
        d_ff = f.W_gate.shape[1]
        # W_2^T diag(t)^(1/2) = [W_down^T diag(t_1)^(1/2), W_down^T diag(t_2)^(1/2)] has the norm of
        # diag(t_1 + t_2)^(1/2) W_down
        left = IntervalArray(f.W_down) * (IntervalArray(t[:d_ff]) + IntervalArray(t[d_ff:])).sqrt()[:, None]
        right = IntervalArray(np.concatenate([f.W_gate, f.W_up], axis=1)) * IntervalArray(t).sqrt()[None, :]
        return spectral_norm_upper_large(left.to_enclosure()), spectral_norm_upper_large(right.to_enclosure())


def gated_bounds(ffn: GatedFeedForward, balls, enclosed: EnclosedGatedFeedForward | None = None):
    """Bounds of the gated block (branch only) on token balls (module docstring): movement, Jacobian blocks
    on the balls, their variation and their norms at the centre (diagonal matrices)."""
    E = enclosed or EnclosedGatedFeedForward(ffn, balls.center)
    R = balls.radii
    n = R.shape[0]
    t = E.deviations(R)
    factors = np.zeros((2, n))
    for i in np.flatnonzero(R > 0):
        factors[:, i] = E.split_norms(t[i])
    names = (r"\|W_2^\top \operatorname{diag}(t)^{1/2}\|", r"\|\operatorname{diag}(t)^{1/2} W_1^\top\|")
    variation = evaluate_theorem(T.gated_variation(), **{names[0]: factors[0], names[1]: factors[1]})
    at_center = E.jacobian_norms()
    lipschitz = evaluate_theorem(T.jacobian_on_neighbourhood(), **{r"\|Df(X)\|": at_center,
                                                                   r"\sup_U \|Df(Y) - Df(X)\|": variation})
    movement = (IntervalArray(lipschitz) * IntervalArray(R)).hi
    return LocalBounds(movement, np.diag(lipschitz), np.diag(variation), np.diag(at_center), E.output,
                       {"deviations": t})
