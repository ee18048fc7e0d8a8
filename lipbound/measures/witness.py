"""Witnesses on measures: pairs of measures that attention pulls apart in Wasserstein-1.

A pair of uniform empirical measures ``mu, nu`` (n atoms each) with
``W1(F(mu), F(nu)) / W1(mu, nu)`` large is a certified lower bound on the W1-Lipschitz
constant of self-attention on measures supported in the ball.  The search starts from
the (2,1) secant witnesses of :func:`lipbound.numeric.witness.search_witness` (one token
moved a little: then ``W1(mu, nu) = ||x_j - y_j|| / n`` and the outputs move by the
(2,1) norm of the Jacobian column), and every ratio is recomputed with *exact* W1 on
both sides (:func:`lipbound.measures.wasserstein.w1`), so the witness does not rely on
the identity coupling being optimal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from ..numeric.domains import TokenDomain
from ..numeric.model import Head
from ..numeric.witness import project_to_ball, search_witness
from .empirical import EmpiricalMeasure, self_attention_measure
from .wasserstein import w1

__all__ = ["MeasureWitness", "measure_witness"]


@final
@dataclass(frozen=True)
class MeasureWitness:
    """``ratio = W1(F(mu), F(nu)) / W1(mu, nu)`` with both W1 exact.

    Attributes
    ----------
    mu, nu : EmpiricalMeasure
        Uniform measures of n atoms in the ball ``||x - center|| <= radius``.
    w1_in, w1_out : float
        Exact Wasserstein-1 distances of the inputs and of the outputs.
    ratio : float
    scale : float
        The displacement of the moved token, relative to the witness search's.
    """

    mu: EmpiricalMeasure
    nu: EmpiricalMeasure
    w1_in: float
    w1_out: float
    ratio: float
    scale: float
    method: str


def _ratio(head: Head, mu: EmpiricalMeasure, nu: EmpiricalMeasure) -> tuple[float, float, float]:
    moved_in = w1(mu, nu)
    moved_out = w1(self_attention_measure(head, mu), self_attention_measure(head, nu))
    return moved_in, moved_out, moved_out / moved_in


def measure_witness(head: Head, *, domain: TokenDomain, n: int, budget_seconds: float = 5.0,
                    seed: int = 0) -> MeasureWitness:
    """The best W1 ratio found for ``head`` on uniform measures of ``n`` atoms in the domain's ball.

    Starts from the (2,1) secant witness (one token moved), then tries larger and smaller
    displacements of the moved token along the same direction (kept inside the ball),
    keeping the best exact ratio.
    """
    secant = search_witness(head, domain=domain, n=n, budget_seconds=budget_seconds, seed=seed, norm="2,1")
    radius, center = secant.radius, secant.center
    X, Y = secant.X, secant.Y
    best = None
    for scale in (1.0, 0.1, 10.0, 100.0, 1e3):
        Z = project_to_ball(X + scale * (Y - X), radius, center)
        if np.array_equal(Z, X):
            continue
        mu, nu = EmpiricalMeasure(X), EmpiricalMeasure(Z)
        w_in, w_out, ratio = _ratio(head, mu, nu)
        if best is None or ratio > best.ratio:
            best = MeasureWitness(mu, nu, w_in, w_out, ratio, scale, f"{secant.method}, scale {scale:g}")
    return best
