"""Token balls and the neighbourhoods a user names.

Every local certificate holds on a product of token balls

    U = {Y in R^{n x d} : ||y_j - x_j||_2 <= r_j for every token j},

convex, centred at a concrete input X (exact floats).  A neighbourhood ``U(X, eps)`` in a norm
is enclosed in one: the Frobenius, (2,1) and (2,inf) balls of radius eps all lie in the product
with ``r_j = eps`` (each token moves at most eps), and "the tokens P move, the rest stay" is the
product with ``r_j = eps`` on P and 0 elsewhere.  Masses ``m_j`` (positive, exact) weight the
tokens as keys: a sentence has all masses 1; a measure with repeated atoms, or the support of a
coupling of two sentences, carries their masses (:mod:`lipbound.local.path`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import AssumptionError

__all__ = ["TokenBalls", "Neighbourhood", "BALLS", "LIPSCHITZ_NORMS"]

#: the neighbourhoods: ball kinds of U(X, eps)
BALLS = {"fro": "Frobenius ball ||Y - X||_F <= eps", "2,1": "(2,1) ball sum_j ||y_j - x_j|| <= eps",
         "2,inf": "(2,inf) ball max_j ||y_j - x_j|| <= eps",
         "tokens": "the chosen tokens move by at most eps, the rest stay"}
#: the norms a local Lipschitz constant is measured in (on inputs and outputs)
LIPSCHITZ_NORMS = {"fro": "Frobenius", "2,1": "(2,1)", "2,inf": "(2,inf)"}


@final
@dataclass(frozen=True, eq=False)
class TokenBalls:
    """``{Y : ||y_j - center_j|| <= radii_j}``, with key masses.

    Parameters
    ----------
    center : ndarray, shape (n, d)
        Exact floats.
    radii : ndarray, shape (n,)
        Non-negative; upper bounds (rounded up by whoever computed them).
    masses : ndarray, shape (n,), optional
        Positive key masses (default 1).
    floors : ndarray, shape (n,), optional
        Certified lower bounds of the centred norm ``||P y_j||`` at the points that matter (the token's set, lemma
        centred-floor), which a LayerNorm's bounds read besides ``nu - R``; None: only the balls.
    """

    center: np.ndarray
    radii: np.ndarray
    masses: np.ndarray | None = None
    floors: np.ndarray | None = None

    def __post_init__(self):
        center = np.asarray(self.center, dtype=np.float64)
        if center.ndim != 2 or not np.all(np.isfinite(center)):
            raise AssumptionError("X", "a finite array of tokens (n, d)", f"shape {center.shape}",
                                  "pass one sentence's hidden states, tokens as rows")
        radii = np.broadcast_to(np.asarray(self.radii, dtype=np.float64), (center.shape[0],)).copy()
        if np.any(~np.isfinite(radii)) or np.any(radii < 0):
            raise AssumptionError("eps", "non-negative finite radii", repr(radii[:4]), "pass eps >= 0")
        masses = np.ones(center.shape[0]) if self.masses is None else np.asarray(self.masses, dtype=np.float64)
        if masses.shape != (center.shape[0],) or np.any(~(masses > 0)) or not np.all(np.isfinite(masses)):
            raise AssumptionError("masses", "one positive mass per token", repr(masses[:4]), "pass positive masses")
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "radii", radii)
        object.__setattr__(self, "masses", masses)
        if self.floors is not None:
            floors = np.asarray(self.floors, dtype=np.float64)
            if floors.shape != (center.shape[0],) or not np.all(floors >= 0) or not np.all(np.isfinite(floors)):
                raise AssumptionError("floors", "one finite non-negative floor per token", repr(floors[:4]),
                                      "pass the centred norms' lower bounds, 0 where none is known")
            object.__setattr__(self, "floors", floors)

    @property
    def n(self) -> int:
        return self.center.shape[0]

    @property
    def d(self) -> int:
        return self.center.shape[1]

    def contains(self, Y) -> bool:
        """Float check (tests and witnesses): every token within its radius."""
        distances = np.linalg.norm(np.asarray(Y, dtype=float) - self.center, axis=-1)
        return bool(np.all(distances <= self.radii * (1 + 1e-12)))

    def project(self, Y) -> np.ndarray:
        """The nearest point of U to Y (each token pulled into its ball), a little inside."""
        Y = np.asarray(Y, dtype=float)
        offset = Y - self.center
        size = np.linalg.norm(offset, axis=-1, keepdims=True)
        scale = np.minimum(1.0, self.radii[:, None] * (1 - 1e-9) / np.where(size > 0, size, 1.0))
        return self.center + offset * scale


@final
@dataclass(frozen=True)
class Neighbourhood:
    """``U(X, eps)`` as a user names it.

    Parameters
    ----------
    ball : {"fro", "2,1", "2,inf", "tokens"}
    eps : float
        Its radius, >= 0.
    positions : tuple of int
        The tokens that move (``ball="tokens"``; ignored otherwise).
    """

    ball: str
    eps: float
    positions: tuple = ()

    def __post_init__(self):
        if self.ball not in BALLS:
            raise AssumptionError("ball", f"one of {', '.join(BALLS)}", repr(self.ball), "e.g. `ball` fro")
        eps = float(self.eps)
        if not (math.isfinite(eps) and eps >= 0):
            raise AssumptionError("eps", "non-negative radii", repr(self.eps), "e.g. `eps` 1e-3, 1e-2, 1e-1")
        object.__setattr__(self, "eps", eps)
        object.__setattr__(self, "positions", tuple(int(p) for p in self.positions))
        if self.ball == "tokens" and not self.positions:
            raise AssumptionError("positions", "the tokens that move (counted from 0)", "none",
                                  "name them, e.g. `positions` 3,7 with `ball` tokens")

    def moving(self, n: int) -> np.ndarray:
        """Boolean mask of the tokens that may move."""
        if self.ball != "tokens":
            return np.ones(n, dtype=bool)
        bad = [p for p in self.positions if not 0 <= p < n]
        if bad:
            raise AssumptionError("positions", f"token positions in 0..{n - 1} (counted from 0)", repr(bad),
                                  "pick positions of this sentence's tokens")
        mask = np.zeros(n, dtype=bool)
        mask[list(self.positions)] = True
        return mask

    def balls(self, X: np.ndarray, masses=None) -> TokenBalls:
        """The product of token balls enclosing ``U(X, eps)``."""
        X = np.asarray(X, dtype=np.float64)
        return TokenBalls(X, np.where(self.moving(X.shape[0]), self.eps, 0.0), masses)

    def describe(self) -> str:
        where = f" (tokens {','.join(map(str, self.positions))})" if self.ball == "tokens" else ""
        return f"{BALLS[self.ball]}{where}, eps = {self.eps:.4g}"
