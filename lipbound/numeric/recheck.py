"""Re-check a witness independently, in high precision, with a rigorous enclosure.

The stored float64 inputs (``X``, ``E`` or ``Y``, the centre, the radius) and the float
weights are taken as exact binary numbers.  Everything linear is then computed *exactly*
in integer arithmetic (a float is ``m 2^e`` with an integer m, so ``X W + b`` is an exact
dyadic matrix); the nonlinear part (the scores' ``1/sqrt(d_k)``, ``exp``, the softmax
division, the cosine score's square roots) runs in ``mpmath.iv`` interval arithmetic at
:data:`RECHECK_DPS` digits with outward rounding; products of an interval matrix with an
exact one use midpoint-radius (ball) arithmetic: an exact centre times the exact matrix,
plus a radius bounded in float64 with its rounding error inflated (Higham 2002, eq. 3.13).
The result is an interval that contains the true value

* ``||Df(X)[E]||_F / ||E||_F``  (kind "jacobian", Frobenius norms), or
* ``N(f(X) - f(Y)) / N(X - Y)`` (kind "secant"; ``N`` Frobenius or ``||.||_{2,1}``),

of the very map the witness names, together with an exact test that every token lies in its
domain: the closed ball ``||x_i - c|| <= R``, or the LayerNorm image ``beta + gamma * z`` with ``z``
orthogonal to 1 and ``||z|| <= sqrt(d)``, decided on the stored coordinates z (the token used is
the exact ``beta + gamma * z``, and a direction must be ``gamma * w`` with ``sum w = 0``: tangent to
the image).  Cross-attention witnesses carry m queries ``Q`` (and a direction ``EQ`` when the
constant is taken in them), each in its own domain.  Nothing of :mod:`lipbound.numeric.attention`
or of the search is reused: the forward pass and the JVP are written again here.

A witness is *valid* when it lies in the domain and its stated value does not exceed the
enclosure's upper end by more than :data:`ROUNDING_TOLERANCE` (relative): the float64 search
may round, but not by more.  Its certified lower bound on the Lipschitz constant is then the
enclosure's lower end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import final

import mpmath
import numpy as np
from mpmath import libmp

from ..errors import AssumptionError, WeightsError
from ..rigorous.intervals import IV, lower, precision, upper
from ..rigorous.linalg import UNIT_ROUNDOFF
from .model import DEFAULT_WEIGHTS, Head, Layer, Model, load_weights
from .witness import Witness

__all__ = ["directional_norm", "Recheck", "recheck", "recheck_file", "RECHECK_DPS", "ROUNDING_TOLERANCE"]

#: Decimal digits of the interval arithmetic.
RECHECK_DPS = 50
#: How far (relative) a stated value may exceed the certified enclosure and still count as rounding.
ROUNDING_TOLERANCE = 1e-9


@final
@dataclass(frozen=True)
class Recheck:
    """The outcome of :func:`recheck`.

    Attributes
    ----------
    stated : float
        The value the witness claims.
    value : mpmath.mpf
        The high-precision value (midpoint of the enclosure).
    lower, upper : float
        The enclosure, rounded outward: the true value lies in ``[lower, upper]``.
    in_domain : bool
        Every token (of X, and of Y for a secant) satisfies ``||x_i - c|| <= R``, decided exactly.
    max_distance : float
        ``max_i ||x_i - c||`` rounded up (over X, Y and Q); on a LayerNorm image ``max_i ||z_i||``.
    valid : bool
        In the domain, and ``stated <= upper (1 + ROUNDING_TOLERANCE)``.
    relative_difference : float
        ``|stated - value| / value``.
    seconds : float
        Time the re-check took.
    target : str
        What was re-checked (model, layer, head, score).
    message : str
        One line for people.
    """

    stated: float
    value: mpmath.mpf
    lower: float
    upper: float
    in_domain: bool
    max_distance: float
    valid: bool
    relative_difference: float
    seconds: float
    target: str
    message: str
    weights: str = ""
    sha256: str = ""

    @property
    def certified_lower_bound(self) -> float | None:
        """A rigorous lower bound on the Lipschitz constant over the domain (None if the point
        is outside the domain)."""
        return self.lower if self.in_domain else None

    def as_dict(self) -> dict:
        return {"stated": self.stated, "value": mpmath.nstr(self.value, 20), "lower": self.lower,
                "upper": self.upper, "in_domain": self.in_domain, "max_distance": self.max_distance,
                "valid": self.valid, "relative_difference": self.relative_difference,
                "certified_lower_bound": self.certified_lower_bound, "seconds": self.seconds,
                "target": self.target, "message": self.message, "weights": self.weights, "sha256": self.sha256}


# ---------------------------------------------------------------------------------------------
# Exact dyadic matrices
# ---------------------------------------------------------------------------------------------
@final
class _Dyadic:
    """An exact real matrix ``m * 2**e``: ``m`` an object array of Python ints, ``e`` an int."""

    __slots__ = ("m", "e")

    def __init__(self, m: np.ndarray, e: int):
        self.m, self.e = m, int(e)

    @classmethod
    def of(cls, array) -> "_Dyadic":
        """The exact value of a float64 array."""
        array = np.asarray(array, dtype=np.float64)
        mantissa, exponent = np.frexp(array)
        ints = np.ldexp(mantissa, 53).astype(np.int64)           # exact: |mantissa| < 1
        exponent = exponent.astype(np.int64) - 53
        nonzero = ints != 0
        base = int(exponent[nonzero].min()) if np.any(nonzero) else 0
        shifts = np.where(nonzero, exponent - base, 0).astype(object)
        return cls(ints.astype(object) << shifts, base)

    @property
    def shape(self):
        return self.m.shape

    def _aligned(self, other: "_Dyadic"):
        e = min(self.e, other.e)
        return self.m << (self.e - e), other.m << (other.e - e), e

    def __add__(self, other: "_Dyadic") -> "_Dyadic":
        a, b, e = self._aligned(other)
        return _Dyadic(a + b, e)

    def __sub__(self, other: "_Dyadic") -> "_Dyadic":
        a, b, e = self._aligned(other)
        return _Dyadic(a - b, e)

    def __matmul__(self, other: "_Dyadic") -> "_Dyadic":
        return _Dyadic(self.m @ other.m, self.e + other.e)

    def __mul__(self, other: "_Dyadic") -> "_Dyadic":
        return _Dyadic(self.m * other.m, self.e + other.e)

    @property
    def T(self) -> "_Dyadic":
        return _Dyadic(self.m.T, self.e)

    def row_sums_of_squares(self) -> "_Dyadic":
        return _Dyadic(np.sum(self.m * self.m, axis=-1), 2 * self.e)

    def intervals(self) -> np.ndarray:
        """Exact (point) intervals, an object array of ``IV.mpf``."""
        out = np.empty(self.m.shape, dtype=object)
        for index, man in np.ndenumerate(self.m):
            raw = libmp.from_man_exp(int(man), self.e)       # no precision given: exact
            out[index] = IV.make_mpf((raw, raw))
        return out

    def abs_upper(self) -> np.ndarray:
        """``|value|`` elementwise as float64, rounded up."""
        out = np.empty(self.m.shape)
        for index, man in np.ndenumerate(self.m):
            raw = libmp.from_man_exp(abs(int(man)), self.e)
            out[index] = upper(IV.make_mpf((raw, raw)))
        return out

    def total(self) -> int:
        """Sum of all mantissas (for exact sums of squares, with exponent ``e``)."""
        return int(np.sum(self.m)) if self.m.size else 0


def _exact_sqrt(man: int, e: int):
    """``sqrt(man 2^e)`` as an interval."""
    raw = libmp.from_man_exp(int(man), int(e))
    return IV.sqrt(IV.make_mpf((raw, raw)))


def _concat(parts: list[_Dyadic], axis: int) -> _Dyadic:
    e = min(p.e for p in parts)
    return _Dyadic(np.concatenate([p.m << (p.e - e) for p in parts], axis=axis), e)


# ---------------------------------------------------------------------------------------------
# Balls: exact centre +- float radius
# ---------------------------------------------------------------------------------------------
def _inflate(array: np.ndarray, length: int) -> np.ndarray:
    """Upper bound on a non-negative float computation of ``length`` products summed: the
    computed value times ``1 + 2 (length + 2) u`` (doubled for safety), plus underflow slack,
    one ulp up (Higham 2002, eq. 3.13 with gamma_k <= 2 k u)."""
    factor = 1.0 + 4.0 * (length + 2) * UNIT_ROUNDOFF
    return np.nextafter(np.asarray(array, dtype=np.float64) * factor + (length + 2) * 2.0 ** -1074, np.inf)


@final
class _Ball:
    """Elementwise enclosure ``center +- radius`` of a matrix: ``center`` exact, ``radius`` float64
    (every entry an upper bound)."""

    __slots__ = ("center", "radius")

    def __init__(self, center: _Dyadic, radius: np.ndarray):
        self.center, self.radius = center, np.asarray(radius, dtype=np.float64)

    @classmethod
    def exact(cls, value: _Dyadic) -> "_Ball":
        return cls(value, np.zeros(value.shape))

    @classmethod
    def of_intervals(cls, values: np.ndarray) -> "_Ball":
        """An interval matrix ``[lo, hi]`` as ``lo +- (hi - lo)`` (centre exact, radius rounded up)."""
        mans = np.empty(values.shape, dtype=object)
        exps = np.zeros(values.shape, dtype=np.int64)
        radius = np.empty(values.shape)
        for index, x in np.ndenumerate(values):
            lo, hi = x._mpi_
            if any(raw in (libmp.fninf, libmp.finf, libmp.fnan) for raw in (lo, hi)):
                raise AssumptionError("witness", "finite intermediate values", "an infinite interval",
                                      "raise the working precision (dps) or check the weights")
            sign, man, exp, _ = lo
            mans[index], exps[index] = (-man if sign else man), exp
            width = libmp.mpf_sub(hi, lo)                     # exact (no precision given)
            radius[index] = upper(IV.make_mpf((width, width)))
        nonzero = np.array([m != 0 for m in mans.ravel()], dtype=bool).reshape(values.shape)
        base = int(exps[nonzero].min()) if np.any(nonzero) else 0
        shifts = np.where(nonzero, exps - base, 0).astype(object)
        return cls(_Dyadic(mans << shifts, base), radius)

    def __add__(self, other: "_Ball") -> "_Ball":
        return _Ball(self.center + other.center, _inflate(self.radius + other.radius, 1))

    def __sub__(self, other: "_Ball") -> "_Ball":
        return _Ball(self.center - other.center, _inflate(self.radius + other.radius, 1))

    def matmul_exact(self, matrix: _Dyadic) -> "_Ball":
        """``(c +- r) B = c B +- r |B|``."""
        radius = _inflate(self.radius @ matrix.abs_upper(), matrix.shape[0])
        return _Ball(self.center @ matrix, radius)

    def frobenius(self):
        """Interval enclosing ``||value||_F``."""
        c2 = self.center.row_sums_of_squares()
        centre = _exact_sqrt(c2.total(), c2.e)
        spread = upper(IV.sqrt(IV.mpf(float(_inflate(np.sum(self.radius ** 2), self.radius.size)))))
        return _widen(centre, spread)

    def max_abs(self):
        """Interval enclosing ``max_ij |value_ij|`` (the l_inf norm of vec)."""
        lo, hi = IV.mpf(0), IV.mpf(0)
        for (index, man), radius in zip(np.ndenumerate(self.center.m), self.radius.ravel()):
            raw = libmp.from_man_exp(abs(int(man)), self.center.e)
            entry = IV.make_mpf((raw, raw))
            lo = max(lo, entry - float(radius), key=lambda v: v.a)
            hi = max(hi, entry + float(radius), key=lambda v: v.b)
        return IV.make_mpf((lo._mpi_[0], hi._mpi_[1]))

    def mixed21(self):
        """Interval enclosing ``sum_i ||row_i||_2``."""
        c2 = self.center.row_sums_of_squares()
        total = IV.mpf(0)
        for man in c2.m:
            total += _exact_sqrt(man, c2.e)
        spread = float(_inflate(np.sum(np.sqrt(_inflate(np.sum(self.radius ** 2, axis=-1), self.radius.shape[-1]))),
                                self.radius.shape[0]))
        return _widen(total, math.nextafter(spread, math.inf))


def _widen(x, radius: float):
    """``x +- radius`` as an interval (outward)."""
    return x + IV.mpf([-radius, radius])


# ---------------------------------------------------------------------------------------------
# One head, again: scores, softmax, forward and JVP
# ---------------------------------------------------------------------------------------------
@final
class _HeadCheck:
    """Exact projections and interval attention weights of one head at one input."""

    def __init__(self, head: Head, X: _Dyadic, weights: dict, queries: _Dyadic | None = None):
        self.head = head
        self.n = X.shape[0]
        self.cross = queries is not None
        self.m = queries.shape[0] if self.cross else self.n
        W_Q, W_K, W_V = weights["W_Q"], weights["W_K"], weights["W_V"]
        b_Q, b_K, b_V = weights["b_Q"], weights["b_K"], weights["b_V"]
        self.weights = weights
        self.Q = (queries if self.cross else X) @ W_Q + _row(b_Q, self.m)
        self.K = X @ W_K + _row(b_K, self.n)
        self.V = X @ W_V + _row(b_V, self.n)
        self.rsqrt = 1 / IV.sqrt(IV.mpf(head.d_k))
        self.S = self._scores()
        self.P = self._softmax(self.S)

    # scores -----------------------------------------------------------------------------------
    def _scores(self) -> np.ndarray:
        head, Q, K = self.head, self.Q, self.K
        if head.score == "dot":
            return (Q @ K.T).intervals() * self.rsqrt
        if head.score == "l2":
            qq, kk = Q.row_sums_of_squares(), K.row_sums_of_squares()
            cross = (Q @ K.T).intervals()
            qi, ki = qq.intervals(), kk.intervals()
            return -(qi[:, None] - 2 * cross + ki[None, :]) * self.rsqrt
        self.nq, self.nk = self._softnorms(Q), self._softnorms(K)
        return (Q @ K.T).intervals() * IV.mpf(self.head.tau) / (self.nq[:, None] * self.nk[None, :])

    def _softnorms(self, M: _Dyadic) -> np.ndarray:
        squares = M.row_sums_of_squares().intervals()
        return np.array([IV.sqrt(s + IV.mpf(self.head.eps)) for s in squares], dtype=object)

    def _softmax(self, S: np.ndarray) -> np.ndarray:
        n = self.n
        P = np.empty((self.m, n), dtype=object)
        for i in range(self.m):
            keys = range(i + 1) if self.head.causal and not self.cross else range(n)
            shift = max((S[i, j] for j in keys), key=lambda x: x.mid).mid
            exps = {j: IV.exp(S[i, j] - shift) for j in keys}
            total = IV.fsum(exps.values())
            for j in range(n):
                P[i, j] = exps[j] / total if j in exps else IV.mpf(0)
        return P

    def score_jvp(self, E: _Dyadic, EQ: _Dyadic | None = None) -> tuple[np.ndarray, _Dyadic]:
        """``(dS, dV)``: the score derivative (intervals) and the value tangent ``E W_V`` (exact);
        ``EQ`` moves the queries of cross-attention (None: they stay)."""
        w = self.weights
        dK, dV = E @ w["W_K"], E @ w["W_V"]
        if not self.cross:
            dQ = E @ w["W_Q"]
        elif EQ is not None:
            dQ = EQ @ w["W_Q"]
        else:
            dQ = _Dyadic(np.zeros(self.Q.shape, dtype=object), 0)
        head, Q, K = self.head, self.Q, self.K
        if head.score == "dot":
            return (dQ @ K.T + Q @ dK.T).intervals() * self.rsqrt, dV
        if head.score == "l2":
            qdq = _Dyadic(np.sum(Q.m * dQ.m, axis=-1), Q.e + dQ.e).intervals()
            kdk = _Dyadic(np.sum(K.m * dK.m, axis=-1), K.e + dK.e).intervals()
            mixed = (Q @ dK.T + dQ @ K.T).intervals()
            return -2 * (qdq[:, None] - mixed + kdk[None, :]) * self.rsqrt, dV
        qk = (Q @ K.T).intervals()
        dqk = (dQ @ K.T + Q @ dK.T).intervals()
        qdq = _Dyadic(np.sum(Q.m * dQ.m, axis=-1), Q.e + dQ.e).intervals()
        kdk = _Dyadic(np.sum(K.m * dK.m, axis=-1), K.e + dK.e).intervals()
        nq, nk = self.nq[:, None], self.nk[None, :]
        tau = IV.mpf(head.tau)
        dS = (dqk / (nq * nk) - qk * (qdq[:, None] / (nq ** 3 * nk) + kdk[None, :] / (nq * nk ** 3))) * tau
        return dS, dV

    def forward(self) -> _Ball:
        """``f(X) = P V`` (n, d_v)."""
        return _Ball.of_intervals(self.P).matmul_exact(self.V)

    def jvp(self, E: _Dyadic, EQ: _Dyadic | None = None) -> _Ball:
        """``Df(X)[E] = dP V + P dV`` with ``dP = P o (dS - rowsum(P o dS))``."""
        dS, dV = self.score_jvp(E, EQ)
        P = self.P
        mean = np.array([IV.fsum(P[i, j] * dS[i, j] for j in range(self.n)) for i in range(self.m)], dtype=object)
        dP = P * (dS - mean[:, None])
        return _Ball.of_intervals(dP).matmul_exact(self.V) + _Ball.of_intervals(P).matmul_exact(dV)


def _row(bias: _Dyadic, n: int) -> _Dyadic:
    return _Dyadic(np.broadcast_to(bias.m, (n,) + bias.shape).copy(), bias.e)


def _exact_weights(head: Head) -> dict:
    """The head's floats as exact dyadics; ``W_V`` is the value matrix the head applies
    (:attr:`Head.V`, which goes through ``A`` for Kim et al.'s L2 values)."""
    weights = {key: _Dyadic.of(getattr(head, key)) for key in ("W_Q", "W_K", "b_Q", "b_K", "b_V")}
    weights["W_V"] = _Dyadic.of(head.V)
    return weights


@final
class _MapCheck:
    """The map named by a witness (one head, or a layer with ``W_O`` and maybe the residual)."""

    def __init__(self, target: Head | Layer):
        self.target = target
        if isinstance(target, Head):
            self.heads, self.W_O, self.residual = (target,), None, False
        else:
            self.heads, self.W_O, self.residual = tuple(target.heads), _Dyadic.of(target.W_O), bool(target.residual)
        self.weights = [_exact_weights(h) for h in self.heads]

    def _combine(self, parts: list[_Ball], identity: _Dyadic) -> _Ball:
        if self.W_O is None:
            return parts[0]
        merged = _Ball(_concat([p.center for p in parts], axis=1), np.concatenate([p.radius for p in parts], axis=1))
        out = merged.matmul_exact(self.W_O)
        return out + _Ball.exact(identity) if self.residual else out

    def forward_difference(self, X: _Dyadic, Y: _Dyadic) -> _Ball:
        """``F(X) - F(Y)``: the output bias cancels exactly."""
        parts = []
        for head, weights in zip(self.heads, self.weights):
            parts.append(_HeadCheck(head, X, weights).forward() - _HeadCheck(head, Y, weights).forward())
        return self._combine(parts, X - Y)

    def jvp(self, X: _Dyadic, E: _Dyadic, queries: _Dyadic | None = None, EQ: _Dyadic | None = None) -> _Ball:
        """``Df[E]`` (self-attention) or ``Df(Q, X)[EQ, E]`` (cross-attention: ``queries`` given)."""
        if queries is not None and self.residual:
            raise AssumptionError("head_or_layer", "a map without the residual for cross-attention", "residual=True",
                                  "re-check the cross-attention layer itself")
        parts = [_HeadCheck(head, X, weights, queries).jvp(E, EQ) for head, weights in zip(self.heads, self.weights)]
        return self._combine(parts, E)


# ---------------------------------------------------------------------------------------------
# The domain, exactly
# ---------------------------------------------------------------------------------------------
def _domain(points: list[np.ndarray], center: np.ndarray, radius: float) -> tuple[bool, float]:
    """Exact test ``||x_i - c||^2 <= R^2`` for every token; and ``max ||x_i - c||`` rounded up."""
    c = _Dyadic.of(center[None, :])
    R = _Dyadic.of(np.array([radius]))
    R2 = R * R
    inside, largest = True, 0.0
    for X in points:
        shifted = _Dyadic.of(X) - _Dyadic(np.broadcast_to(c.m, X.shape).copy(), c.e)
        squares = shifted.row_sums_of_squares()
        e = min(squares.e, R2.e)
        bound = int(R2.m[0]) << (R2.e - e)
        for man in squares.m:
            inside &= (int(man) << (squares.e - e)) <= bound
            largest = max(largest, upper(_exact_sqrt(man, squares.e)))
    return bool(inside), largest


def _image_tokens(z: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> tuple[_Dyadic, bool, float]:
    """The exact tokens ``beta + gamma * z`` of a LayerNorm image, whether every row of z is orthogonal
    to 1 with ``||z||^2 <= d`` (decided exactly), and ``max ||z||`` rounded up."""
    Z = _Dyadic.of(z)
    n, d = Z.shape
    tokens = _Dyadic.of(np.broadcast_to(gamma, z.shape)) * Z + _Dyadic.of(np.broadcast_to(beta, z.shape))
    inside = all(sum(int(v) for v in row) == 0 for row in Z.m)
    squares = Z.row_sums_of_squares()
    limit = d << max(-squares.e, 0) if squares.e <= 0 else None
    largest = 0.0
    for man in squares.m:
        inside &= (int(man) <= limit) if limit is not None else (int(man) << squares.e) <= d
        largest = max(largest, upper(_exact_sqrt(man, squares.e)))
    return tokens, bool(inside), largest


def _image_directions(w: np.ndarray, gamma: np.ndarray) -> tuple[_Dyadic, bool]:
    """The exact directions ``gamma * w`` and whether every row of w sums to exactly 0 (tangent)."""
    W = _Dyadic.of(w)
    return _Dyadic.of(np.broadcast_to(gamma, w.shape)) * W, all(sum(int(v) for v in row) == 0 for row in W.m)


def _points(witness: Witness, key: str, direction: bool = False):
    """The exact array ``key`` of the witness in its domain: ``(dyadic, in_domain, largest)``.  On a
    LayerNorm image the exact point comes from the stored coordinates (refused without them)."""
    query = key in ("Q", "EQ")
    gamma = witness.query_gamma if query else witness.gamma
    array = getattr(witness, key)
    if gamma is None:
        if direction:
            return _Dyadic.of(array), True, 0.0
        center = witness.query_center if query else witness.center
        inside, largest = _domain([array], center, witness.query_radius if query else witness.radius)
        return _Dyadic.of(array), inside, largest
    coordinates = witness.coordinates.get(key)
    if coordinates is None:
        if direction and not np.any(array):
            return _Dyadic.of(array), True, 0.0          # the zero direction moves nothing
        return _Dyadic.of(array), False, math.inf
    if direction:
        exact, tangent = _image_directions(coordinates, gamma)
        return exact, tangent, 0.0
    return _image_tokens(coordinates, gamma, witness.query_center if query else witness.center)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def _interval_digits(dps: int):
    """Interval arithmetic at ``dps`` decimal digits inside the block."""
    return precision(int(dps * 3.3219280948873626) + 8)


def _check_target(witness: Witness, target) -> None:
    if not isinstance(target, (Head, Layer)):
        raise WeightsError("head_or_layer", "a Head or a Layer", type(target).__name__,
                           "pass model.layer(L).heads[h] or model.layer(L).as_layer(residual=...)")
    heads = (target,) if isinstance(target, Head) else tuple(target.heads)
    if heads[0].d != witness.d:
        raise WeightsError("head_or_layer", f"a map of width d = {witness.d} (the witness's tokens)",
                           f"width {heads[0].d}", "pass the weights the witness was found for")
    if witness.head is not None and not isinstance(target, Head):
        raise AssumptionError("head_or_layer", f"a single Head (the witness is for head {witness.head})", "a Layer",
                              f"pass layer.heads[{witness.head}]")
    if witness.head is None and witness.layer is not None and not isinstance(target, Layer):
        raise AssumptionError("head_or_layer", "a Layer (the witness is for a whole layer)", "a Head",
                              "pass layer.as_layer(residual=...)")
    if isinstance(target, Layer) and bool(target.residual) != witness.residual:
        raise AssumptionError("head_or_layer", f"residual={witness.residual} as in the witness",
                              f"residual={bool(target.residual)}", f"pass as_layer(residual={witness.residual})")
    if witness.role != "self" and any(h.causal for h in heads):
        raise AssumptionError("head_or_layer", f"a head without a causal mask (the witness is {witness.role})",
                              "a causal head", "cross-attention heads are not masked")
    if any(h.score != witness.score for h in heads):
        raise AssumptionError("head_or_layer", f"score {witness.score!r} as in the witness",
                              f"scores {sorted({h.score for h in heads})}", "pass the map the witness was found for")


def recheck(witness: Witness, head_or_layer: Head | Layer, dps: int = RECHECK_DPS) -> Recheck:
    """Recompute a witness's value in high precision, with a rigorous enclosure.

    Parameters
    ----------
    witness : Witness
    head_or_layer : attention.Head or attention.Layer
        The map the witness is for (a Layer carries ``W_O`` and the residual flag).
    dps : int
        Decimal digits of the interval arithmetic.

    Returns
    -------
    Recheck
        ``valid`` is False when a token lies outside the ball or the stated value exceeds the
        enclosure by more than :data:`ROUNDING_TOLERANCE`.
    """
    if not isinstance(witness, Witness):
        raise WeightsError("witness", "a Witness", type(witness).__name__, "load one with Witness.load(path)")
    _check_target(witness, head_or_layer)
    began = time.perf_counter()
    with _interval_digits(dps), mpmath.workdps(dps):
        check = _MapCheck(head_or_layer)
        X, inside, largest = _points(witness, "X")
        domains = [(inside, largest, "X")]
        if witness.kind == "jacobian":
            E, tangent, _ = _points(witness, "E", direction=True)
            directions = [(tangent, "E")]
            squares = E.row_sums_of_squares()
            total = _Dyadic(np.array([squares.total()], dtype=object), squares.e)
            queries = EQ = None
            if witness.role != "self":
                queries, inside_q, largest_q = _points(witness, "Q")
                domains.append((inside_q, largest_q, "Q"))
                if witness.EQ is not None:
                    EQ, tangent_q, _ = _points(witness, "EQ", direction=True)
                    directions.append((tangent_q, "EQ"))
                    more = EQ.row_sums_of_squares()
                    total = _concat([total, _Dyadic(np.array([more.total()], dtype=object), more.e)], axis=0)
            out = check.jvp(X, E, queries, EQ)
            denominator = _exact_sqrt(total.total(), total.e)
            numerator = out.frobenius()
        else:
            Y, inside_y, largest_y = _points(witness, "Y")
            domains.append((inside_y, largest_y, "Y"))
            directions = []
            out = check.forward_difference(X, Y)
            diff = _Ball.exact(X - Y)
            numerator = out.frobenius() if witness.norm == "fro" else out.mixed21()
            denominator = diff.frobenius() if witness.norm == "fro" else diff.mixed21()
        if not lower(denominator) > 0:
            raise AssumptionError("witness", "a nonzero direction (E != 0, or X != Y)", "zero",
                                  "a witness needs a direction or two distinct inputs")
        enclosure = numerator / denominator
        low, high = lower(enclosure), upper(enclosure)
        value = mpmath.mp.make_mpf(enclosure.mid._mpi_[0])
    in_domain = all(ok for ok, _, _ in domains) and all(ok for ok, _ in directions)
    largest = max(size for _, size, _ in domains)
    stated = witness.value
    relative = float(abs(stated - value) / value) if value > 0 else (0.0 if stated == 0 else math.inf)
    valid = in_domain and stated <= high * (1 + ROUNDING_TOLERANCE)
    where = "the LayerNorm image" if witness.gamma is not None else f"the ball of radius {witness.radius:g}"
    if valid:
        message = (f"valid: Lip >= {low:.12g} on {where} (stated {stated:.12g}, relative difference {relative:.1e})")
    elif not in_domain:
        outside = [name for ok, _, name in domains if not ok] + [f"{name} (not tangent)" for ok, name in directions
                                                                   if not ok]
        message = (f"invalid: {', '.join(outside)} outside the domain (max ||x_i - c|| = {largest!r} > R = "
                   f"{witness.radius!r})" if witness.gamma is None and witness.role == "self" and "X" in outside
                   else f"invalid: {', '.join(outside)} outside the domain (decided exactly)")
    else:
        message = f"invalid: the value is at most {high:.12g}, below the stated {stated:.12g}"
    return Recheck(stated=stated, value=value, lower=low, upper=high, in_domain=in_domain, max_distance=largest,
                   valid=valid, relative_difference=relative, seconds=time.perf_counter() - began,
                   target=witness.target, message=message)


def directional_norm(target: Head | Layer, X: np.ndarray, E: np.ndarray, norm: str = "fro",
                     dps: int = RECHECK_DPS) -> tuple[float, float]:
    """A rigorous enclosure ``(lower, upper)`` of ``||Df(X)[E]|| / ||E||`` in the Frobenius norm
    (``norm="fro"``) or the l_inf norm of vec (``norm="inf"``): the lower end bounds the map's
    Lipschitz constant in that norm from below on any domain holding X."""
    if norm not in ("fro", "inf"):
        raise AssumptionError("norm", "'fro' or 'inf'", repr(norm), "choose the norm of the directional derivative")
    with _interval_digits(dps), mpmath.workdps(dps):
        out = _MapCheck(target).jvp(_Dyadic.of(X), _Dyadic.of(E))
        direction = _Ball.exact(_Dyadic.of(E))
        ratio = out.frobenius() / direction.frobenius() if norm == "fro" else out.max_abs() / direction.max_abs()
    return lower(ratio), upper(ratio)


def _weights_for(witness: Witness, weights):
    """The model a witness is re-checked against: ``weights`` (a path or a Model) if given, else the
    file the witness names; refused when its sha256 differs from the one the witness records."""
    if isinstance(weights, Model):
        model = weights
    else:
        path = weights if weights is not None else witness.weights
        if not path:
            if witness.model and witness.model != "sentence-transformers/all-MiniLM-L6-v2":
                raise WeightsError("weights", f"the checkpoint of {witness.model!r} (the witness records no file)",
                                   "nothing", "give as `weights` the file the witness was found on")
            path = DEFAULT_WEIGHTS
        if not Path(path).exists():
            raise WeightsError("weights", "the checkpoint the witness was found on",
                               f"{path} (recorded in the witness, no longer there)",
                               "give those weights as `weights`")
        model = load_weights(path, layers=None if witness.layer is None else [witness.layer])
    if witness.sha256 and model.sha256 and witness.sha256 != model.sha256:
        raise WeightsError("weights", f"weights with sha256 {witness.sha256[:16]}... (recorded in the witness, "
                           f"read from {witness.weights or 'an unnamed file'})",
                           f"{model.path or 'weights'} with sha256 {model.sha256[:16]}...",
                           "give as `weights` the exact file the witness was found on")
    return model


def recheck_file(path: str | Path, weights=None, dps: int = RECHECK_DPS) -> Recheck:
    """Load a witness file and re-check it against the weights it was found on.

    Parameters
    ----------
    path : str or Path
        A file written by :meth:`Witness.save`.
    weights : None, str, Path or Model
        ``None``: the file the witness records (its sha256 is checked); a path or a loaded
        model otherwise (refused when its sha256 differs from the witness's).

    Returns
    -------
    Recheck
        With ``weights`` and ``sha256`` naming the weights used.
    """
    witness = Witness.load(path)
    if witness.layer is None:
        raise WeightsError(str(path), "a witness that names its layer", "layer = None",
                           "re-check it in Python: recheck(witness, head_or_layer)")
    model = _weights_for(witness, weights)
    layer = model.layer(witness.layer, witness.block)
    attention = layer.attention
    if witness.role != "self":
        if layer.cross is None:
            raise WeightsError("witness role", "a layer with cross-attention", f"{witness.block} layer {witness.layer}",
                               "the witness does not belong to these weights")
        attention = layer.cross
    if witness.head is not None:
        if not 0 <= witness.head < len(attention.heads):
            raise WeightsError("witness head", f"a head index in [0, {len(attention.heads)})", str(witness.head),
                               "the witness does not belong to these weights")
        target = attention.heads[witness.head]
    elif witness.role == "self":
        target = layer.as_layer(residual=witness.residual)
    else:
        target = attention
    _check_domains(witness, model, layer)
    result = recheck(witness, target, dps=dps)
    return replace(result, weights=model.path, sha256=model.sha256)


def _check_domains(witness: Witness, model: Model, layer) -> None:
    """A witness on a LayerNorm image must name the LayerNorm that really feeds the attention: the
    layer's input norm (self-attention), its cross-attention norm (queries) and the encoder's
    final norm (context of cross-attention)."""
    if witness.role == "self":
        expected = [("gamma", layer.ln_in, "the LayerNorm feeding the layer")]
    else:
        expected = [("query_gamma", layer.cross_norm, "the LayerNorm feeding the cross-attention's queries"),
                    ("gamma", model.final_norm, "the encoder's final LayerNorm (the context)")]
    for key, norm, what in expected:
        gamma = getattr(witness, key)
        if gamma is None:
            continue
        center = witness.center if key == "gamma" else witness.query_center
        if norm is None or not (np.array_equal(gamma, norm.gamma) and np.array_equal(center, norm.beta)):
            raise WeightsError("witness domain", f"the image of {what}", "another LayerNorm's gain and bias",
                               "re-check the witness against the weights it was found on")
