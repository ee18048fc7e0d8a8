"""A local curve's witness re-checked in high precision: the point is in U exactly, the value enclosed.

A witness of ``L(eps)`` is a float point Y and a direction E with ``||DF(Y) E||_F / ||E||_F`` found by power
iteration in float64.  Taken as exact binary numbers, Y is tested against ``U(X, eps)`` in integer arithmetic
(the ball's norm of ``Y - X`` against eps, and the tokens that may not move equal to X's), and the directional
derivative is enclosed by :func:`lipbound.numeric.recheck.directional_norm`, which writes the map's forward
pass and JVP again in exact and outward-rounded interval arithmetic.  Its lower end is then a certified lower
bound on ``L(eps)``: ``L(eps) >= ||DF(Y) E|| / ||E||`` for any Y in U and any E moving the tokens that may
move.  One attention map (a head, or an attention layer with ``W_O`` and its residual) is enclosed by
:func:`lipbound.numeric.recheck.directional_norm` at 50 digits; a block or a stack (attention layers,
LayerNorms, feed-forward blocks) by :func:`lipbound.numeric.recheck.chains.chain_directional_norm`, which covers
softmax dot-product heads without masks and the exact GELU.  Frobenius norm only.
"""

from __future__ import annotations

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from ..numeric.recheck import directional_norm
from ..numeric.recheck.chains import chain_directional_norm, chain_gaps
from ..numeric.recheck.exact import Dyadic, exact_sqrt
from ..rigorous.intervals import IV, upper
from .balls import Neighbourhood

__all__ = ["recheckable", "witness_enclosure", "inside"]


def recheckable(chain, norm: str) -> str:
    """Why the witnesses of this curve cannot be re-checked ('' when they can)."""
    if norm != "fro":
        return f"the {norm} norm (a re-check encloses a Frobenius directional derivative)"
    if len(chain) == 1 and chain[0].kind in ("head", "attention"):
        return ""
    return chain_gaps([(component.kind, component.target) for component in chain])


def inside(X: np.ndarray, Y: np.ndarray, hood: Neighbourhood) -> bool:
    """Whether the float point Y lies in ``U(X, eps)``, decided exactly (an undecided sum of square roots counts as
    outside)."""
    moving = hood.moving(X.shape[0])
    offset = Dyadic.of(Y) - Dyadic.of(X)
    if any(int(value) != 0 for value in offset.m[~moving].ravel()):
        return False
    squares = offset.row_sums_of_squares()                    # exact, exponent squares.e
    rows, bound = squares.beside_square(hood.eps)
    if hood.ball == "fro":
        return sum(rows) <= bound
    if hood.ball in ("2,inf", "tokens"):
        return all(row <= bound for row in rows)
    total = IV.fsum([exact_sqrt(man, squares.e) for man in squares.m])    # (2,1): the row norms' sum, enclosed
    return upper(total) <= hood.eps


def witness_enclosure(chain, X: np.ndarray, Y: np.ndarray, E: np.ndarray, hood: Neighbourhood) \
        -> tuple[float, float] | None:
    """``(lower, upper)`` enclosing ``||DF(Y) E||_F / ||E||_F`` when Y lies in ``U(X, eps)`` and E moves only the
    tokens that may move, both decided exactly; None when they do not, or when a chain's enclosure stays too wide
    (the float witness is then not re-checked)."""
    missing = recheckable(chain, "fro")
    if missing:
        raise AssumptionError("chain", "maps the re-check covers", missing, "re-check Frobenius curves of such maps")
    moving = hood.moving(X.shape[0])
    if not inside(X, Y, hood) or np.any(E[~moving] != 0) or not np.any(E):
        return None
    if len(chain) == 1:
        return directional_norm(chain[0].target, Y, E)
    try:
        return chain_directional_norm([(component.kind, component.target) for component in chain], Y, E)
    except NotCertifiedError:   # too wide at the highest precision tried: not re-checked
        return None
