"""Products of large enclosed matrices by panels of rows: the same midpoint-radius bounds as
:class:`~lipbound.rigorous.linalg.Enclosure`'s ``@``, without the whole product's radius or the operands' absolute
values held beside it (at n = 20 tokens of MiniLM each ``(n d)^2`` array is 0.47 GB)."""

from __future__ import annotations

import numpy as np

from ..errors import NotCertifiedError
from .elementwise import gamma_bound
from .intervals import IV, interval, upper
from .linalg import _ETA, Enclosure, _safe, vector_norm_upper

__all__ = ["PANEL_ROWS", "point_product_panels"]

#: rows of the left factor multiplied at a time
PANEL_ROWS = 512


def point_product_panels(P: np.ndarray, A: Enclosure, rows: int = PANEL_ROWS) -> tuple[np.ndarray, float]:
    """``(fl(P A_m), s)`` for a float matrix P (m, k) taken exactly and an enclosure ``A = A_m +- A_r`` (k, l):
    ``|P A' - fl(P A_m)| <= S`` entrywise for every ``A'`` in A, and ``s >= ||S||_F``.

    ``S = (|P| (gamma_k |A_m| + A_r)) (1 + gamma_(k+8)') + (k + 4) eta (2 + max|P| + max|A_m|)`` is the radius of
    ``Enclosure.exact(P) @ A`` (Rump 1999; ``gamma_k |A_m|`` alone where A is exact), formed for ``rows`` rows of P
    at a time: each row of the product reads only its own row of P.  ``s`` joins the panels' certified Frobenius
    norms, ``(sum_p s_p^2)^(1/2)`` in interval arithmetic, rounded up.

    Returns
    -------
    mid : ndarray (m, l)
        ``fl(P A_m)``, a new array.
    s : float
    """
    P = np.asarray(P, dtype=np.float64)
    k = P.shape[1]
    magnitude = np.abs(A.mid)
    largest = float(np.max(np.abs(P), initial=0.0)) + float(np.max(magnitude, initial=0.0))
    inner = np.multiply(magnitude, gamma_bound(k), out=magnitude)     # gamma_k |A_m| (+ A_r): the one whole operand
    if not A.is_exact:
        inner += A.rad
    mid = np.empty((P.shape[0], A.shape[1]))
    squares = interval(0)
    for start in range(0, P.shape[0], rows):
        panel = slice(start, start + rows)
        with np.errstate(over="ignore"):
            mid[panel] = P[panel] @ A.mid
            spread = np.abs(P[panel]) @ inner
            spread *= _safe(k)
            spread += (k + 4) * _ETA * (2.0 + largest)
        if not (np.all(np.isfinite(mid[panel])) and np.all(np.isfinite(spread))):
            raise NotCertifiedError("product", "finite floating-point entries", "an overflow",
                                    "rescale the factors; the product exceeds the float range")
        norm = interval(vector_norm_upper(spread))
        squares = squares + norm * norm
    return mid, upper(IV.sqrt(squares))
