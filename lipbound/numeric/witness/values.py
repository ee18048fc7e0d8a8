"""Final witness values, recomputed from scratch with :mod:`lipbound.numeric.attention`."""

from __future__ import annotations

import numpy as np

from ..attention import (
    AttentionMap,
    jacobian_norm,
    layer_forward,
    layer_jvp,
    layer_vjp,
    self_forward,
    self_jvp,
    self_vjp,
)
from ..model import Head, Layer
from .record import INWARD_MARGIN, project_to_ball

__all__ = ["local_jacobian_norm", "jacobian_value", "jacobian_parts", "cross_value", "secant_value", "pull_inside",
           "reference_maps"]


def reference_maps(target: Head | Layer):
    if isinstance(target, Head):
        return (lambda X: self_forward(target, X), lambda X, E: self_jvp(target, X, E),
                lambda X, G: self_vjp(target, X, G))
    return (lambda X: layer_forward(target, X), lambda X, E: layer_jvp(target, X, E),
            lambda X, G: layer_vjp(target, X, G))


def local_jacobian_norm(target: Head | Layer, X: np.ndarray, iterations: int = 200,
                        start: np.ndarray | None = None, seed: int = 0) -> tuple[float, np.ndarray]:
    """``(||Df(X)[E]||_F, E)`` with ``||E||_F = 1`` after power iteration, computed with
    :func:`lipbound.numeric.attention.jacobian_norm` (float64, independent of the search engine)."""
    _, jvp, vjp = reference_maps(target)
    X = np.asarray(X, dtype=float)[None]
    sigma, E = jacobian_norm(jvp, vjp, X, iterations=iterations, seed=seed,
                             start=None if start is None else np.asarray(start, dtype=float)[None])
    E = E[0] / np.linalg.norm(E[0])
    _, dF = jvp(X, E[None])
    return float(np.linalg.norm(dF[0])), E


def jacobian_value(target: Head | Layer, X: np.ndarray, E: np.ndarray) -> float:
    """``||Df(X)[E]||_F / ||E||_F`` by :mod:`lipbound.numeric.attention` (float64)."""
    _, jvp, _ = reference_maps(target)
    return float(np.linalg.norm(jvp(X[None], E[None])[1]) / np.linalg.norm(E))


def jacobian_parts(target: Head | Layer, X: np.ndarray, E: np.ndarray) -> dict[str, np.ndarray]:
    """``Df(X)[E] / ||E||_F`` of self-attention split by how the tokens move, each (n, d_out): ``"query"`` (row i's
    scores through its query, ``S_i``), ``"key"`` (the scores of every row through the keys it sees, ``cov_i``),
    ``"value"`` (the mean part ``sum_j p_ij V^T e_j``); the residual's ``E`` is in none of them.  At a witness they
    say which of a bound's query, key and mean terms the witness reaches (float64, the plain engine)."""
    X, E = np.asarray(X, dtype=float), np.asarray(E, dtype=float)
    parts = AttentionMap(target).linearize(X[None]).jvp_parts(E[None])
    return {role: part[0] / np.linalg.norm(E) for role, part in parts.items()}


def cross_value(target: Head | Layer, Q: np.ndarray, X: np.ndarray, EQ: np.ndarray | None, EX: np.ndarray) -> float:
    """``||Df(Q, X)[EQ, EX]||_F / ||(EQ, EX)||_F`` for cross-attention (float64, the plain engine)."""
    lin = AttentionMap(target).linearize(np.asarray(X, dtype=float)[None], np.asarray(Q, dtype=float)[None])
    out = lin.jvp(np.asarray(EX, dtype=float)[None], None if EQ is None else np.asarray(EQ, dtype=float)[None])
    size = np.sqrt(np.sum(np.square(EX)) + (0.0 if EQ is None else np.sum(np.square(EQ))))
    return float(np.linalg.norm(out) / size)


def secant_value(target: Head | Layer, X: np.ndarray, Y: np.ndarray, norm: str) -> float:
    forward, _, _ = reference_maps(target)
    diff_out = forward(X[None])[0] - forward(Y[None])[0]
    diff_in = X - Y
    if norm == "fro":
        return float(np.linalg.norm(diff_out) / np.linalg.norm(diff_in))
    return float(np.sum(np.linalg.norm(diff_out, axis=1)) / np.sum(np.linalg.norm(diff_in, axis=1)))


def pull_inside(X: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    """Project into the ball with the inward margin; shrink again in the (never seen) case that
    rounding left a token outside."""
    X = project_to_ball(X, radius, center)
    margin = INWARD_MARGIN
    while not np.all(np.linalg.norm(X - center, axis=-1) <= radius * (1 - margin / 2)):
        margin *= 4
        X = project_to_ball(X, radius, center, margin=margin)
    return X


