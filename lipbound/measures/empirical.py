"""Attention on probability measures: empirical measures and their push-forwards.

Vuckovic, Baratin and Tachet des Combes (2020), "A Mathematical Theory of
Attention" (conference version: "On the Regularity of Attention",
arXiv:2102.05628), read a sequence as the empirical measure
``mu = sum_i w_i delta_{x_i}`` and attention as the nonlinear Markov kernel

    K_mu(x, dy) = exp(s(x, y)) mu(dy) / int exp(s(x, z)) mu(dz),

whose mean value ``Gamma_mu(x) = int v(y) K_mu(x, dy)`` is the output at ``x``.
On an empirical measure the kernel weights key ``y_j`` by its mass:

    p(x, y_j) = w_j exp(s(x, y_j)) / sum_k w_k exp(s(x, y_k)).

Self-attention maps ``mu`` to ``(Gamma_mu)_# mu``; cross-attention maps a query
measure ``nu`` to ``(Gamma_mu)_# nu``.  For uniform weights and distinct points
this is exactly token-level attention (:func:`lipbound.numeric.attention.self_forward`);
the measure form also makes sense for repeated points and unequal masses, and
it does not see the order of the tokens (so causal masking has no meaning here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import AssumptionError, WeightsError

# The scores are those of token-level attention, so that both forms evaluate the very same
# score (one definition, two readings).
from ..numeric.attention import head_scores
from ..numeric.kernels import AttentionMask, softmax
from ..numeric.model import Head, Layer

__all__ = [
    "EmpiricalMeasure",
    "attention_map",
    "self_attention_measure",
    "cross_attention_measure",
    "layer_map",
    "self_attention_layer_measure",
]

# Weights are probabilities: their sum may differ from 1 by rounding only.
_MASS_TOLERANCE = 1e-9


@final
@dataclass(frozen=True, eq=False)
class EmpiricalMeasure:
    """A finitely supported probability measure ``mu = sum_i w_i delta_{x_i}`` on R^d.

    Parameters
    ----------
    points : array_like, shape (k, d)
        The support points ``x_i`` (rows).  Repeated points are allowed: they add
        their masses.
    weights : array_like, shape (k,), optional
        Non-negative masses ``w_i`` summing to 1 (within 1e-9; they are then
        rescaled to sum to 1 exactly up to rounding).  Uniform ``1/k`` by default.

    Raises
    ------
    AssumptionError
        Non-finite points, wrong shapes, negative or non-finite weights, or a total
        mass other than 1.
    """

    points: np.ndarray
    weights: np.ndarray | None = None

    def __post_init__(self):
        points = np.array(self.points, dtype=float)
        if points.ndim == 1 and points.size > 0:
            points = points[:, None]  # a measure on the line, given as a flat list
        if points.ndim != 2 or points.shape[0] == 0 or points.shape[1] == 0:
            raise AssumptionError("points", "a non-empty 2-d array of shape (k, d), one point per row",
                                  f"shape {points.shape}", "stack the support points as rows")
        if not np.all(np.isfinite(points)):
            raise AssumptionError("points", "finite coordinates", "NaN or Inf",
                                  "remove or repair the non-finite points")
        k = points.shape[0]
        if self.weights is None:
            weights = np.full(k, 1.0 / k)
        else:
            weights = np.array(self.weights, dtype=float)
            if weights.shape != (k,):
                raise AssumptionError("weights", f"shape ({k},), one mass per point",
                                      f"shape {weights.shape}", "pass one weight per row of points")
            if not np.all(np.isfinite(weights)) or np.any(weights < 0):
                raise AssumptionError("weights", "finite non-negative masses",
                                      f"min {np.min(weights)!r}", "masses of a measure are >= 0")
            total = float(np.sum(weights))
            if abs(total - 1.0) > _MASS_TOLERANCE:
                raise AssumptionError("weights", "masses summing to 1 (a probability measure)",
                                      f"sum {total!r}", "divide the weights by their sum")
            weights = weights / total
        points.setflags(write=False)
        weights.setflags(write=False)
        object.__setattr__(self, "points", points)
        object.__setattr__(self, "weights", weights)

    @property
    def size(self) -> int:
        """Number of support points ``k`` (repeats counted)."""
        return self.points.shape[0]

    @property
    def dim(self) -> int:
        """Ambient dimension ``d``."""
        return self.points.shape[1]

    @property
    def is_uniform(self) -> bool:
        """Whether every point carries the same mass ``1/k`` (up to rounding)."""
        return bool(np.ptp(self.weights) <= 1e-12 * np.max(self.weights))

    def mean(self) -> np.ndarray:
        """Barycentre ``sum_i w_i x_i``, shape (d,)."""
        return self.weights @ self.points

    def radius(self, center: np.ndarray | None = None) -> float:
        """``max_{i: w_i > 0} ||x_i - c||`` (support radius about ``c``, the origin by default)."""
        c = np.zeros(self.dim) if center is None else np.asarray(center, dtype=float)
        support = self.points[self.weights > 0]
        return float(np.max(np.linalg.norm(support - c, axis=1)))

    def merged(self, decimals: int | None = None) -> EmpiricalMeasure:
        """The same measure with repeated points merged (their masses added).

        ``decimals`` rounds coordinates before comparing (exact comparison by default).
        Points of zero mass are dropped.  The order follows the first occurrence.
        """
        keys = self.points if decimals is None else np.round(self.points, decimals)
        keys = keys + 0.0  # -0.0 and 0.0 are the same point
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        masses = np.bincount(inverse.ravel(), weights=self.weights, minlength=first.size)
        order = np.argsort(first)
        points, masses = self.points[first[order]], masses[order]
        keep = masses > 0
        return EmpiricalMeasure(points[keep], masses[keep] / np.sum(masses[keep]))

    def push_forward(self, points: np.ndarray) -> EmpiricalMeasure:
        """``T_# mu`` given the images ``T(x_i)`` as rows (shape (k, d')); masses are kept."""
        points = np.asarray(points, dtype=float)
        if points.ndim != 2 or points.shape[0] != self.size:
            raise AssumptionError("points", f"shape ({self.size}, d'), one image per support point",
                                  f"shape {points.shape}", "map every support point once")
        return EmpiricalMeasure(points, self.weights)

    @classmethod
    def uniform(cls, points: np.ndarray) -> EmpiricalMeasure:
        """``(1/k) sum_i delta_{x_i}``: the measure of a sequence of k tokens (rows of ``points``)."""
        return cls(points)


def _check_measure(name: str, mu, d: int) -> EmpiricalMeasure:
    if not isinstance(mu, EmpiricalMeasure):
        raise AssumptionError(name, "an EmpiricalMeasure", type(mu).__name__,
                              "wrap the tokens: EmpiricalMeasure(points, weights)")
    if mu.dim != d:
        raise WeightsError(name, f"points of dimension {d} (the head's input width)",
                           f"dimension {mu.dim}", "use a head whose W_Q has as many rows as the points have columns")
    return mu


def _check_head(head) -> Head:
    if not isinstance(head, Head):
        raise WeightsError("head", "a lipbound.numeric.Head", type(head).__name__,
                           "build the head with Head(W_Q, W_K, W_V, ...)")
    if head.mask != AttentionMask() or head.kernel.positional:
        raise AssumptionError("head", "a head without positions or masks: a measure has no token order",
                              f"{head.kernel.describe()}, {head.mask.describe()}",
                              "use token-level attention for masks and positions")
    if not head.kernel.weights().normalised:
        raise AssumptionError("head.kernel", "a kernel whose weights are a Markov kernel (a measure's mass is "
                              "redistributed)", head.kernel.describe(), "use token-level attention")
    return head


def attention_map(head: Head, mu: EmpiricalMeasure, x: np.ndarray) -> np.ndarray:
    """``Gamma_mu(x) = int v(y) K_mu(x, dy)`` at query points ``x``.

    ``Gamma_mu(x) = sum_j w_j exp(s(x, y_j)) v(y_j) / sum_k w_k exp(s(x, y_k))`` with
    ``v(y) = y W_V + b_V`` (Vuckovic et al. 2020, Def. of the attention kernel).

    Parameters
    ----------
    head : Head
        Score ``s`` (dot, l2 or cosine) and value map; must not be causal.
    mu : EmpiricalMeasure
        The context measure (keys and values), points of dimension ``head.d``.
    x : ndarray, shape (m, d)
        Query points.

    Returns
    -------
    ndarray, shape (m, d_v)
    """
    head = _check_head(head)
    mu = _check_measure("mu", mu, head.d)
    x = np.asarray(x, dtype=float)
    if x.ndim != 2 or x.shape[1] != head.d:
        raise WeightsError("x", f"query points of shape (m, {head.d})", f"shape {x.shape}",
                           "pass the query points as rows")
    S = head_scores(head, x, mu.points)[0]
    # Masses enter as log-weights; zero mass means the point is absent (log 0 = -inf).
    positive = mu.weights > 0
    log_w = np.full(mu.size, -np.inf)
    log_w[positive] = np.log(mu.weights[positive])
    return softmax(S + log_w) @ (mu.points @ head.V + head.b_V)


def self_attention_measure(head: Head, mu: EmpiricalMeasure) -> EmpiricalMeasure:
    """Self-attention on measures: ``mu -> (Gamma_mu)_# mu``.

    Returns the measure with points ``Gamma_mu(x_i)`` (shape (k, d_v)) and the masses of ``mu``.
    """
    mu = _check_measure("mu", mu, _check_head(head).d)
    return mu.push_forward(attention_map(head, mu, mu.points))


def cross_attention_measure(head: Head, nu_queries: EmpiricalMeasure,
                            mu_context: EmpiricalMeasure) -> EmpiricalMeasure:
    """Cross-attention on measures: ``nu -> (Gamma_mu)_# nu``.

    Queries come from ``nu_queries`` (its masses are kept), keys and values from
    ``mu_context`` (its masses weight the kernel).  Returns points ``Gamma_mu(y_i)``, shape (m, d_v).
    """
    nu = _check_measure("nu_queries", nu_queries, _check_head(head).d)
    return nu.push_forward(attention_map(head, mu_context, nu.points))


def layer_map(layer: Layer, mu: EmpiricalMeasure, x: np.ndarray) -> np.ndarray:
    """Multi-head attention read on measures, at query points ``x`` (m, d).

    ``F_mu(x) = [Gamma^1_mu(x), ..., Gamma^H_mu(x)] W_O + b_O`` (+ ``x`` if ``layer.residual``).
    """
    if not isinstance(layer, Layer):
        raise WeightsError("layer", "a lipbound.numeric.Layer", type(layer).__name__,
                           "build it with Layer(heads, W_O, b_O)")
    x = np.asarray(x, dtype=float)
    if not layer.heads:
        raise WeightsError("layer.heads", "at least one head", "none", "add the heads of the layer")
    out = np.concatenate([attention_map(h, mu, x) for h in layer.heads], axis=-1) @ layer.W_O + layer.b_O
    return x + out if layer.residual else out


def self_attention_layer_measure(layer: Layer, mu: EmpiricalMeasure) -> EmpiricalMeasure:
    """``mu -> (F_mu)_# mu`` for a multi-head layer (see :func:`layer_map`)."""
    return mu.push_forward(layer_map(layer, mu, mu.points))
