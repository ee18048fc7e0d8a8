"""A chain at its centre X: the float points, their rounding radii, the enclosures and Jacobians every radius of a
curve shares, and how far the chain moves the image of X (its reach on U, and the float chain's own rounding)."""

from __future__ import annotations

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.intervals import upper_product
from .balls import Neighbourhood, TokenBalls
from .chains import Component, right_product

__all__ = ["ChainCentre", "frobenius_factor", "reach", "rounding_reach"]


class ChainCentre:
    """The chain at the centre: exact float points X_k, their rounding radii, enclosures, Jacobians.

    ``prefix_jacobian`` holds the products of the first ``k`` components' dense Jacobians for the ``k`` in
    ``keep`` (the same products ``jacobian`` is built through), so that the curves nested in this one (a
    block's attention, a stack's first block) read them with the enclosures: :meth:`part`.  With ``whole``
    False only those prefixes are formed and ``jacobian`` stays None (a stack multiplies its blocks' Jacobians
    itself, :class:`~lipbound.local.chains.NormwiseProduct`)."""

    def __init__(self, chain: list[Component], X: np.ndarray, dense: bool, keep=(), whole: bool = True):
        self.points, self.rounding, self.enclosed = [np.asarray(X, dtype=np.float64)], [np.zeros(X.shape[0])], []
        for component in chain:
            enclosed = component.enclose(self.points[-1])
            self.enclosed.append(enclosed)
            mid = enclosed.output.mid
            self.points.append(mid)
            self.rounding.append((enclosed.output - IntervalArray(mid)).norm_upper())
        self.jacobian, self.prefix_jacobian = None, {}
        if dense:
            product = self._product(chain if whole else chain[:max(keep, default=0)], keep)
            self.jacobian = product if whole else None

    def _product(self, chain, keep=()):
        product = None
        for k, (component, enclosed) in enumerate(zip(chain, self.enclosed)):
            product = right_product(product, component, enclosed, in_place=k not in keep)   # a kept prefix stays
            if k + 1 in keep:
                self.prefix_jacobian[k + 1] = product
        return product

    def part(self, chain: list[Component], start: int, stop: int, dense: bool) -> ChainCentre:
        """The centre of ``chain[start:stop]`` at ``X~_start`` taken exactly: the same enclosures (and the
        caches they hold), the rounding radius 0 at its start, its dense Jacobian if ``dense``."""
        out = object.__new__(ChainCentre)
        out.points, out.enclosed = self.points[start:stop + 1], self.enclosed[start:stop]
        out.rounding = [np.zeros(self.points[start].shape[0])] + self.rounding[start + 1:stop + 1]
        out.jacobian = None
        # a part from the start keeps the prefixes it contains (a stack's first block: its attention's Jacobian)
        out.prefix_jacobian = {k: v for k, v in self.prefix_jacobian.items() if k <= stop} if start == 0 else {}
        if dense:
            out.jacobian = self.prefix_jacobian[stop] if start == 0 and stop in self.prefix_jacobian \
                else out._product(chain[start:stop], keep=(1,))
        return out


def rounding_reach(components, centre: ChainCentre, start: int) -> float:
    """A bound on ``||g(X~_start) - X~_end||_F`` for the components g from ``start`` on: the float chain's
    rounding, each step's ball pushed through the next component's movement bound."""
    radii = np.zeros(centre.points[start].shape[0])
    for offset, component in enumerate(components):
        k = start + offset
        bounds = component.bounds(TokenBalls(centre.points[k], radii), centre.enclosed[k], want_blocks=False)
        radii = (IntervalArray(bounds.movement) + IntervalArray(centre.rounding[k + 1])).hi
    return float(IntervalArray(radii).norm_upper(axis=0))


def reach(constant: float, hood: Neighbourhood, n: int) -> float:
    """``Lip_U theta_U eps``, rounded up: how far a map with constant ``Lip_U`` on U moves the image of X
    (inf when the constant is)."""
    return upper_product(constant, frobenius_factor(hood, n).hi.item(), hood.eps)


def frobenius_factor(hood: Neighbourhood, n: int) -> IntervalArray:
    """``theta_U`` with ``||Y - X||_F <= theta_U eps`` on U: 1 for the Frobenius and (2,1) balls, the square
    root of the number of moving tokens otherwise."""
    return IntervalArray(1.0) if hood.ball in ("fro", "2,1") else IntervalArray(float(hood.moving(n).sum())).sqrt()
