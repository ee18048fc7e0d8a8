r"""Witnesses for token-wise blocks: normalisations, feed-forward blocks and residual blocks.

A block f acts on each token, so ``Lip(f) >= ||Df(x) v|| / ||v||`` at any token x (inside the
domain, with ``x + t v`` in it for small t) and any direction v.  A :class:`BlockWitness` stores
``(x, v)`` and the value; :func:`recheck_block` recomputes ``||Df(x) v|| / ||v||`` from the stored
floats in interval and enclosure arithmetic (every rounding bounded; the activations through
:func:`lipbound.symbolic.activations.interval_maps`) and returns its certified lower end.

* :func:`norm_witness` -- LayerNorm / RMSNorm: the bound is attained (lemma
  ``normalization-sharpness``): ``v`` a top right singular vector of ``diag(gamma) P``; ``x = 0``
  on all of ``R^d`` (the centred token ``c -> 0``), and with a floor ``sigma_min`` a token of
  variance ``sigma_min^2`` whose centred part is orthogonal to v.
* :func:`ffn_witness` -- a batched ascent of ``sigma_max(W_2^T diag(phi'(x W_1 + b_1)) W_1^T)``
  over x from structured starts: a sign pattern of the slopes that maximises
  ``||W_1 diag(s) W_2||`` over ``s`` in ``{min phi', max phi'}^m`` (alternating maximisation), and
  the token whose pre-activations come closest (least squares) to the points where ``phi'`` takes
  those extremes; random tokens.  The gradient of ``sigma = u^T J v`` (top singular pair) is
  ``W_1 (phi''(z) * (v W_1) * (u W_2^T))`` (envelope theorem).
* :func:`residual_witness` -- ``x + F(N(x))`` (pre-LN) or ``N(x + F(x))`` (post-LN) at the inputs
  where N stretches most: a constant token (pre-LN) or the token whose ``x + F(x)`` is constant
  (post-LN, found by Newton's method), with the direction from a power iteration;
* :func:`gated_witness` -- a gated block (SwiGLU, GeGLU) on an ellipsoid ``{c + M w : ||w|| <= r}``
  (:mod:`lipbound.numeric.sdp.gated`): from random points of its boundary, first the exact maximiser
  over w of the lifted map with the slopes held (``w ~ M^T Phi^*(D B u) e``, the step that makes the
  relaxation's bound; ``u, e`` the top singular pair), then projected ascent of ``sigma_max(Df(x))``
  along its gradient (envelope theorem, with ``phi''``).  The witness stores its coordinates
  ``(w, nu)``, ``x = c + M w`` and ``v = M nu``; the re-check rebuilds both in enclosure arithmetic and
  proves ``||w|| < r``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ...errors import AssumptionError
from ...rigorous.arrays import IntervalArray, gelu, gelu_slope
from ...rigorous.elementwise import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF
from ...rigorous.intervals import IV, interval, lower, upper
from ...rigorous.linalg import Enclosure, vector_norm_upper
from ...symbolic.activations import interval_maps
from ..blocks.activations import activation_maps, check_activation, slope_range
from ..blocks.ffn import check_weights, forward, jacobian
from ..blocks.gated import check_gated, ellipsoid_of
from ..blocks.norms import check_floor, norm_jacobian, norm_kind
from ..sdp.gated import Ellipsoid

__all__ = ["BlockWitness", "norm_witness", "ffn_witness", "residual_witness", "gated_witness", "recheck_block",
           "recheck_gated", "ffn_jacobian_norms"]



@final
@dataclass(frozen=True)
class BlockWitness:
    """A token x and a direction v where a block stretches: ``value = ||Df(x) v|| / ||v||``.

    Attributes
    ----------
    block : str
        ``"layernorm"``, ``"rmsnorm"``, ``"feed-forward"``, ``"pre-norm-feed-forward"`` (``x + F(N(x))``),
        ``"post-norm-feed-forward"`` (``N(x + F(x))``), ``"gated-feed-forward"`` (on an ellipsoid).
    x, direction : ndarray, shape (d,)
    value : float
        Computed in float64.
    certified : float
        The certified lower end of the re-check (:func:`recheck_block`), NaN if not re-checked.
    sigma_min : float or None
        The variance floor the witness respects (normalisations).
    method : str
    details : dict
    """

    block: str
    x: np.ndarray
    direction: np.ndarray
    value: float
    certified: float = math.nan
    sigma_min: float | None = None
    method: str = ""
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"block": self.block, "value": self.value, "certified": None if math.isnan(self.certified)
                else self.certified, "sigma_min": self.sigma_min, "method": self.method,
                "x": self.x.tolist(), "direction": self.direction.tolist(), "details": self.details}


# Interval helpers ---------------------------------------------------------------------------------
def _column(values) -> Enclosure:
    return Enclosure.exact(np.asarray(values, dtype=np.float64).reshape(-1, 1))


def _intervals(enclosure: Enclosure) -> list:
    return [interval(m) + interval((-r, r)) for m, r in zip(enclosure.mid.ravel(), enclosure.rad.ravel())]


def _enclosure(values: list) -> Enclosure:
    """A column enclosing the given intervals (midpoint and radius rounded outward)."""
    lo = np.array([lower(v) for v in values])
    hi = np.array([upper(v) for v in values])
    mid = 0.5 * lo + 0.5 * hi
    rad = np.maximum(hi - mid, mid - lo) * (1 + 4 * UNIT_ROUNDOFF) + SMALLEST_SUBNORMAL
    return Enclosure(mid.reshape(-1, 1), rad.reshape(-1, 1))


def _scalar(enclosure: Enclosure):
    return Enclosure(enclosure.mid.reshape(()), enclosure.rad.reshape(())).interval()


def _entrywise(enclosure: Enclosure, factors: list) -> Enclosure:
    """The entrywise product of a column enclosure with intervals."""
    return _enclosure([a * b for a, b in zip(_intervals(enclosure), factors)])


def _norm_step(norm, x: Enclosure, v: Enclosure):
    """``(N(x), DN(x) v, variance)`` enclosed: ``c = Pi x``, ``s^2 = ||c||^2 / d + eps``,
    ``DN(x) v = gamma (Pi v - c (c . Pi v) / (d s^2)) / s``."""
    d = norm.d
    centre = norm_kind(norm) == "layernorm"
    mean_row = Enclosure.exact(np.full((1, d), 1.0)).scale(1 / IV.mpf(d))
    ones = Enclosure.exact(np.ones((d, 1)))
    c = x - ones @ (mean_row @ x) if centre else x
    pv = v - ones @ (mean_row @ v) if centre else v
    variance = _scalar(c.T @ c) / d
    s = IV.sqrt(variance + interval(norm.eps))
    inner = _scalar(c.T @ pv)
    direction = (pv - c.scale(inner / (d * s * s))).scale(1 / s)
    gain = Enclosure.exact(np.diag(norm.gamma))
    output = gain @ c.scale(1 / s)
    if centre:
        output = output + _column(norm.beta)
    return output, gain @ direction, variance


def _ffn_step(W_1, b_1, W_2, b_2, act: str, x: Enclosure, v: Enclosure):
    """``(F(x), DF(x) v)`` enclosed (columns); the erf GELU through the vectorised enclosures of
    :mod:`lipbound.rigorous.arrays`, any other activation one compiled interval map per unit."""
    name = check_activation(act)
    z_column = Enclosure.exact(W_1.T) @ x + _column(b_1)
    hidden = Enclosure.exact(W_1.T) @ v
    W_2T = Enclosure.exact(W_2.T)
    if name == "gelu":
        z = IntervalArray.from_enclosure(z_column)
        values, slopes = gelu(z).to_enclosure(), (IntervalArray.from_enclosure(hidden) * gelu_slope(z)).to_enclosure()
        return W_2T @ values + _column(b_2), W_2T @ slopes
    value_map, slope_map = interval_maps(name)
    z = _intervals(z_column)
    output = W_2T @ _enclosure([value_map(zk) for zk in z]) + _column(b_2)
    return output, W_2T @ _entrywise(hidden, [slope_map(zk) for zk in z])


# The re-check -----------------------------------------------------------------------------------
def recheck_block(witness: BlockWitness, *, norm=None, ffn=None, ellipsoid=None) -> float:
    """The certified lower end of ``||Df(x) v|| / ||v||`` for the witness's block.

    ``norm`` is the LayerNorm or RMSNorm, ``ffn`` the arrays ``{"W_1", "b_1", "W_2", "b_2",
    "act"}`` (both for residual blocks), or a GatedFeedForward with its ``ellipsoid``
    (:func:`recheck_gated`).  A witness of a normalisation with a floor must hold a token whose
    variance is certified above ``sigma_min^2`` (else NaN: nothing is claimed)."""
    if witness.block == "gated-feed-forward":
        if ffn is None or ellipsoid is None:
            raise AssumptionError("ffn, ellipsoid", "the gated block and the ellipsoid of the witness", "None",
                                  "pass ffn=layer.ffn, ellipsoid=ellipsoid_of(domain, d)")
        return recheck_gated(witness, ffn, ellipsoid)
    x, v = _column(witness.x), _column(witness.direction)
    length = interval(vector_norm_upper(witness.direction))
    if witness.block in ("layernorm", "rmsnorm"):
        if norm is None or norm_kind(norm) != witness.block:
            raise AssumptionError("norm", f"the {witness.block} of the witness", repr(norm), "pass norm=...")
        _, image, variance = _norm_step(norm, x, v)
        if witness.sigma_min is not None and not lower(variance) > upper(interval(witness.sigma_min) ** 2):
            return math.nan  # the token must lie strictly above the floor (then x + t v does, for small t)
    else:
        if ffn is None:
            raise AssumptionError("ffn", "the arrays of the feed-forward block", "None", "pass ffn=arrays(...)")
        W_1, W_2, b_1 = check_weights(ffn["W_1"], ffn["W_2"], ffn.get("b_1"))
        b_2 = np.zeros(W_2.shape[1]) if ffn.get("b_2") is None else np.asarray(ffn["b_2"], dtype=float)
        act = ffn["act"]
        if witness.block == "feed-forward":
            _, image = _ffn_step(W_1, b_1, W_2, b_2, act, x, v)
        elif witness.block == "pre-norm-feed-forward":
            inside, stretched, _ = _norm_step(norm, x, v)
            _, image = _ffn_step(W_1, b_1, W_2, b_2, act, inside, stretched)
            image = image + v
        elif witness.block == "post-norm-feed-forward":
            output, moved = _ffn_step(W_1, b_1, W_2, b_2, act, x, v)
            _, image, _ = _norm_step(norm, x + output, v + moved)
        else:
            raise AssumptionError("block", "a block with a witness", repr(witness.block), "see BlockWitness")
    return lower(interval(image.norm_lower()) / length)


# Normalisations ----------------------------------------------------------------------------------
def norm_witness(norm, sigma_min: float | None = None) -> BlockWitness:
    """The token and direction where a LayerNorm or RMSNorm attains its constant (module docstring),
    re-checked."""
    kind = norm_kind(norm)
    floor = check_floor(sigma_min)
    d = norm.d
    if kind == "layernorm":
        operator = norm.gamma[:, None] * (np.eye(d) - 1.0 / d)
        _, _, right = np.linalg.svd(operator)
        v, spare = right[0], right[1] if d > 2 else None
    else:
        k = int(np.argmax(np.abs(norm.gamma)))
        v = np.eye(d)[k]
        spare = np.eye(d)[(k + 1) % d] if d > 1 else None
    x = np.zeros(d)
    if floor is not None:
        if spare is None:
            raise AssumptionError("norm.d", "d >= 3 for a LayerNorm floor witness (d >= 2 for RMSNorm)", str(d),
                                  "a token of the floor orthogonal to v needs room")
        spare = spare - (spare @ v) * v
        if kind == "layernorm":
            spare = spare - spare.mean()
        x = spare / np.linalg.norm(spare) * math.sqrt(d) * floor * (1 + 1e-9)  # strictly inside the floor
    value = float(np.linalg.norm(norm_jacobian(norm, x) @ v) / np.linalg.norm(v))
    witness = BlockWitness(kind, x, v, value, sigma_min=floor,
                           method="top singular direction, " + ("x = 0" if floor is None else "variance at the floor"))
    return _certified(witness, norm=norm)


def _certified(witness: BlockWitness, **weights) -> BlockWitness:
    started = time.perf_counter()
    certified = recheck_block(witness, **weights)
    return BlockWitness(witness.block, witness.x, witness.direction, witness.value, certified, witness.sigma_min,
                        witness.method, {**witness.details, "recheck_seconds": time.perf_counter() - started})


# Feed-forward blocks -------------------------------------------------------------------------------
def ffn_jacobian_norms(X: np.ndarray, V: np.ndarray, W_1, b_1, W_2, act: str, power_steps: int = 20):
    """Top singular values of ``Df(x)`` for a batch of tokens X (b, d), by power iteration from the
    directions V (b, d).  Returns ``(sigma, V, U)``: V the right, U the (unit) left vectors."""
    slopes = activation_maps(act).slope(X @ W_1 + b_1)
    for _ in range(power_steps):
        U = ((V @ W_1) * slopes) @ W_2
        U /= np.maximum(np.linalg.norm(U, axis=1, keepdims=True), 1e-300)
        V = ((U @ W_2.T) * slopes) @ W_1.T
        V /= np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-300)
    image = ((V @ W_1) * slopes) @ W_2
    sigma = np.linalg.norm(image, axis=1)
    return sigma, V, image / np.maximum(sigma, 1e-300)[:, None]


def _pattern_starts(W_1, b_1, W_2, act: str, rng, count: int) -> np.ndarray:
    """Tokens whose pre-activations approach a slope pattern that maximises ``||W_1 diag(s) W_2||``."""
    slopes = slope_range(act)
    low, high = lower(slopes.minimum), upper(slopes.maximum)
    at_low = slopes.argmin if math.isfinite(slopes.argmin) else -1.0
    at_high = slopes.argmax if math.isfinite(slopes.argmax) else 1.0
    pseudo = np.linalg.pinv(W_1)                           # (m, d): least squares x W_1 = z - b_1
    starts = []
    for _ in range(count):
        v = rng.standard_normal(W_1.shape[0])
        pattern = np.full(W_1.shape[1], high)
        for _ in range(30):
            u = ((v @ W_1) * pattern) @ W_2
            u /= np.linalg.norm(u) or 1.0
            pattern = np.where((v @ W_1) * (u @ W_2.T) > 0, high, low)
            v = ((u @ W_2.T) * pattern) @ W_1.T
            v /= np.linalg.norm(v) or 1.0
        target = np.where(pattern == high, at_high, at_low)
        starts.append((target - b_1) @ pseudo)
    return np.array(starts)


def ffn_witness(W_1, b_1, W_2, act: str, *, b_2=None, seed: int = 0, starts: int = 24, steps: int = 300,
                learning_rate: float = 0.01, budget: float = 60.0) -> BlockWitness:
    """A token where the feed-forward block stretches most, by batched ascent (module docstring),
    re-checked.  Adam steps are ``learning_rate`` times the typical norm of a start, times 1/3,
    1 or 3 in turn across the batch (on real blocks small steps find the higher ridges);
    ``budget`` caps the seconds of the ascent."""
    started = time.perf_counter()
    W_1, W_2, b_1 = check_weights(W_1, W_2, b_1)
    act = check_activation(act)
    maps = activation_maps(act)
    rng = np.random.default_rng(seed)
    d = W_1.shape[0]
    scale = float(np.median(np.linalg.norm(W_1, axis=0))) or 1.0   # pre-activations of order |x| scale
    patterns = _pattern_starts(W_1, b_1, W_2, act, rng, max(1, starts // 3))
    randoms = rng.standard_normal((max(1, starts - 2 * len(patterns)), d)) * (2.0 / scale / math.sqrt(d))
    X = np.concatenate([patterns, 0.5 * patterns, randoms])
    V = rng.standard_normal(X.shape)
    first, second, moment = np.zeros_like(X), np.zeros_like(X), 0
    sigma, V, U = ffn_jacobian_norms(X, V, W_1, b_1, W_2, act, 30)
    best_x, best_sigma = X[np.argmax(sigma)].copy(), float(np.max(sigma))
    step_size = learning_rate * (float(np.median(np.linalg.norm(X, axis=1))) or 1.0) * \
        np.resize([1 / 3, 1.0, 3.0], len(X))[:, None]
    for iteration in range(steps):  # noqa: B007 - the steps taken are read after the loop
        if time.perf_counter() - started > budget:
            break
        Z = X @ W_1 + b_1
        gradient = (maps.curvature(Z) * (V @ W_1) * (U @ W_2.T)) @ W_1.T
        moment += 1
        first = 0.9 * first + 0.1 * gradient
        second = 0.999 * second + 0.001 * gradient ** 2
        X = X + step_size * (first / (1 - 0.9 ** moment)) / (np.sqrt(second / (1 - 0.999 ** moment)) + 1e-12)
        sigma, V, U = ffn_jacobian_norms(X, V, W_1, b_1, W_2, act, 3)
        if float(np.max(sigma)) > best_sigma:
            best_sigma, best_x = float(np.max(sigma)), X[np.argmax(sigma)].copy()
    sigma, V, _ = ffn_jacobian_norms(best_x[None], rng.standard_normal((1, d)), W_1, b_1, W_2, act, 200)
    witness = BlockWitness("feed-forward", best_x, V[0], float(sigma[0]),
                           method="slope-pattern and random starts, batched ascent of sigma_max(Df(x))",
                           details={"starts": len(X), "steps": iteration + 1 if steps else 0,
                                    "seconds": time.perf_counter() - started})
    b_2 = np.zeros(W_2.shape[1]) if b_2 is None else b_2
    return _certified(witness, ffn={"W_1": W_1, "b_1": b_1, "W_2": W_2, "b_2": b_2, "act": act})


# Residual blocks --------------------------------------------------------------------------------
def _block_jacobian(placement: str, norm, ffn: dict, x: np.ndarray) -> np.ndarray:
    if placement == "pre":
        return np.eye(norm.d) + jacobian(norm(x), ffn["W_1"], ffn["b_1"], ffn["W_2"], ffn["act"]) @ \
            norm_jacobian(norm, x)
    inner = x + forward(x, **ffn)
    return norm_jacobian(norm, inner) @ (np.eye(norm.d) + jacobian(x, ffn["W_1"], ffn["b_1"], ffn["W_2"], ffn["act"]))


def residual_witness(placement: str, norm, ffn: dict, *, seed: int = 0, candidates: int = 8,
                     starts: int = 3, newton_steps: int = 25) -> BlockWitness:
    """A witness for ``x + F(N(x))`` (``"pre"``) or ``N(x + F(x))`` (``"post"``), re-checked.

    Candidates: the tokens where N's input has the smallest variance (pre-LN: ``x = 0``; post-LN:
    damped Gauss-Newton on ``Pi (x + F(x)) = 0`` from ``starts`` points), and random tokens; the
    direction is the top right singular vector of the dense block Jacobian."""
    if placement not in ("pre", "post"):
        raise AssumptionError("placement", "'pre' or 'post'", repr(placement), "pick the residual placement")
    rng = np.random.default_rng(seed)
    d = norm.d
    centre = norm_kind(norm) == "layernorm"

    def residual(x):
        g = x + forward(x, **ffn)
        return g - g.mean() if centre else g

    points = [np.zeros(d)]
    if placement == "post":
        for start in range(starts):
            x = np.zeros(d) if start == 0 else rng.standard_normal(d) * start
            for _ in range(newton_steps):
                g = residual(x)
                J = np.eye(d) + jacobian(x, ffn["W_1"], ffn["b_1"], ffn["W_2"], ffn["act"])
                step = np.linalg.lstsq(J - J.mean(axis=0, keepdims=True) if centre else J, g, rcond=None)[0]
                size = 1.0
                while size > 1e-6 and np.linalg.norm(residual(x - size * step)) > (1 - 1e-4 * size) * np.linalg.norm(g):
                    size *= 0.5
                if size <= 1e-6:
                    break
                x = x - size * step
            points.append(x)
    points += list(rng.standard_normal((candidates, d)))
    best = None
    for x in points:
        _, values, right = np.linalg.svd(_block_jacobian(placement, norm, ffn, x))
        if best is None or values[0] > best[0]:
            best = (float(values[0]), x, right[0])
    value, x, v = best
    witness = BlockWitness(f"{placement}-norm-feed-forward", x, v, value,
                           method="the input where the norm's input has the least variance; random tokens")
    return _certified(witness, norm=norm, ffn=ffn)


# Gated blocks on an ellipsoid ------------------------------------------------------------------------
class _GatedPoint:
    """A gated block at a batch of tokens X (b, d): slopes, values and the top singular pairs of Df."""

    def __init__(self, ffn, maps, X, V, power_steps):
        self.ffn, self.maps = ffn, maps
        self.G = X @ ffn.W_gate + ffn.b_gate
        self.U = X @ ffn.W_up + ffn.b_up
        self.S, self.P = maps.slope(self.G), maps.forward(self.G)
        for _ in range(power_steps):
            left = self.jvp(V)
            left /= np.maximum(np.linalg.norm(left, axis=1, keepdims=True), 1e-300)
            V = self.vjp(left)
            V /= np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-300)
        image = self.jvp(V)
        self.sigma = np.linalg.norm(image, axis=1)
        self.V, self.left = V, image / np.maximum(self.sigma, 1e-300)[:, None]

    def jvp(self, V):
        f = self.ffn
        return ((V @ f.W_gate) * self.S * self.U + (V @ f.W_up) * self.P) @ f.W_down

    def vjp(self, L):
        f = self.ffn
        h = L @ f.W_down.T
        return (h * self.S * self.U) @ f.W_gate.T + (h * self.P) @ f.W_up.T

    def lifted_step(self) -> np.ndarray:
        """``Phi^*(D B u) e`` in x (rows): the maximiser's direction with the slopes and ``phi(g)/g`` held."""
        f = self.ffn
        h = self.left @ f.W_down.T
        ratio = np.where(np.abs(self.G) > 1e-12, self.P / np.where(self.G == 0, 1.0, self.G), 0.5)
        return (h * self.S * (self.V @ f.W_gate)) @ f.W_up.T + (h * ratio * (self.V @ f.W_up)) @ f.W_gate.T

    def gradient(self) -> np.ndarray:
        """``grad_x <u, Df(x) v>`` (rows): the gradient of sigma_max (envelope theorem)."""
        f = self.ffn
        h = self.left @ f.W_down.T
        Vg, Vu = self.V @ f.W_gate, self.V @ f.W_up
        return ((h * (self.maps.curvature(self.G) * self.U * Vg + self.S * Vu)) @ f.W_gate.T
                + (h * self.S * Vg) @ f.W_up.T)


def gated_witness(ffn, domain, *, seed: int = 0, starts: int = 6, steps: int = 40,
                  learning_rate: float = 0.02) -> BlockWitness:
    """A token of ``domain`` (an ellipsoid, a bounded TokenDomain or the norm whose image the block reads)
    where the gated block ``ffn`` stretches most (module docstring), re-checked.  ``steps`` alternate:
    the first half lifted steps, the second half Adam steps of size ``learning_rate r`` (counted)."""
    ffn = check_gated(ffn)
    ellipsoid = domain if isinstance(domain, Ellipsoid) else ellipsoid_of(domain, ffn.d)
    maps = activation_maps(ffn.act)
    rng = np.random.default_rng(seed)
    d, M = ffn.d, ellipsoid.axes.mid
    inner = lower(interval(ellipsoid.radius)) * (1 - 1e-9)

    def onto_ball(W):
        norms = np.linalg.norm(W, axis=1, keepdims=True)
        return W * np.where(norms > inner, inner / np.maximum(norms, 1e-300), 1.0)

    def at_radius(W):
        return W * (inner / np.maximum(np.linalg.norm(W, axis=1, keepdims=True), 1e-300))

    W = at_radius(rng.standard_normal((starts, d)))
    V = rng.standard_normal((starts, d))
    best = (-1.0, None)
    first = second = np.zeros_like(W)
    for step in range(steps):
        point = _GatedPoint(ffn, maps, ellipsoid.points(W), V, 6 if step else 30)
        V = point.V
        top = int(np.argmax(point.sigma))
        if point.sigma[top] > best[0]:
            best = (float(point.sigma[top]), W[top].copy())
        if step < steps // 2:
            W = at_radius(point.lifted_step() @ M)
            continue
        gradient = point.gradient() @ M
        k = step - steps // 2 + 1
        first = 0.9 * first + 0.1 * gradient
        second = 0.999 * second + 0.001 * gradient ** 2
        W = onto_ball(W + learning_rate * inner * (first / (1 - 0.9 ** k)) / (np.sqrt(second / (1 - 0.999 ** k))
                                                                            + 1e-300))
    w = best[1]
    point = _GatedPoint(ffn, maps, ellipsoid.points(w[None]), rng.standard_normal((1, d)), 200)
    nu = np.linalg.lstsq(M, point.V[0], rcond=None)[0]
    witness = BlockWitness("gated-feed-forward", ellipsoid.points(w), M @ nu, float(point.sigma[0]),
                           method="lifted steps from random boundary points, then projected ascent of sigma_max(Df(x))",
                           details={"w": w, "nu": nu, "starts": starts, "steps": steps})
    return _certified_gated(witness, ffn, ellipsoid)


def _certified_gated(witness: BlockWitness, ffn, ellipsoid) -> BlockWitness:
    started = time.perf_counter()
    certified = recheck_gated(witness, ffn, ellipsoid)
    return BlockWitness(witness.block, witness.x, witness.direction, witness.value, certified, None, witness.method,
                        {**witness.details, "recheck_seconds": time.perf_counter() - started})


def recheck_gated(witness: BlockWitness, ffn, ellipsoid) -> float:
    """The certified lower end of ``||Df(x) v|| / ||v||`` at ``x = c + M w``, ``v = M nu`` (the witness's
    coordinates), NaN unless ``||w|| < r`` is proved (then x is a point of the ellipsoid)."""
    w, nu = np.asarray(witness.details["w"], dtype=float), np.asarray(witness.details["nu"], dtype=float)
    if not upper(interval(vector_norm_upper(w))) < lower(interval(ellipsoid.radius)):
        return math.nan
    M = ellipsoid.axes
    x = M @ _column(w)
    if ellipsoid.center is not None:
        x = x + _column(ellipsoid.center)
    v = M @ _column(nu)
    value_map, slope_map = interval_maps(check_activation(ffn.act))
    g = _intervals(Enclosure.exact(ffn.W_gate.T) @ x + _column(ffn.b_gate))
    u = _intervals(Enclosure.exact(ffn.W_up.T) @ x + _column(ffn.b_up))
    through_gate = _entrywise(Enclosure.exact(ffn.W_gate.T) @ v, [slope_map(gk) * uk for gk, uk in zip(g, u)])
    through_up = _entrywise(Enclosure.exact(ffn.W_up.T) @ v, [value_map(gk) for gk in g])
    image = Enclosure.exact(ffn.W_down.T) @ (through_gate + through_up)
    length = interval(v.norm_upper())
    return lower(interval(image.norm_lower()) / length)
