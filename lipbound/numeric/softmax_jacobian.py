r"""The softmax Jacobian's l_inf -> l_1 norm, computed without the theorem that gives it.

For a probability vector p, ``J = diag(p) - p p^T`` is the Jacobian of the softmax at logits whose
softmax is p (the temperature divides it).  Three computations that do not use each other:

* :func:`inf_to_one_norm` -- the operator norm by its definition: the l_inf unit ball is the
  cube ``[-1, 1]^n`` and ``x -> ||J x||_1`` is convex, so the maximum is over the ``2^n`` vertices
  x, where ``(J x)_i = p_i (x_i - p^T x)``: ``max_x sum_i p_i |x_i - p^T x|``;
* :func:`balanced_mass` -- the closed form lipbound proves
  (:func:`lipbound.symbolic.claim_theorems.softmax_inf_to_one`): ``1 - min_s (p^T s)^2`` over sign
  vectors s;
* :func:`equal_split` -- whether the weights split into two halves of equal mass, by dynamic
  programming over subset sums (the partition problem), without signs or norms.

Each takes exact rationals (:class:`fractions.Fraction`; verdicts on them are exact) or intervals
of :data:`~lipbound.rigorous.intervals.IV` (weights enclosed from float logits by
:func:`softmax_enclosure`).  A vertex and its negative give the same value, so the enumerations
fix the first sign: ``2^(n-1)`` vertices, practical up to n = 20 or so.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from fractions import Fraction

from ..errors import AssumptionError
from ..rigorous.functions import maximum, minimum
from ..rigorous.intervals import IV, interval

__all__ = ["MAX_WEIGHTS", "inf_to_one_norm", "balanced_mass", "equal_split", "softmax_enclosure",
           "column_sum_norm"]

#: The enumerations visit 2^(n - 1) sign vectors: refuse longer weight vectors.
MAX_WEIGHTS = 20


def _checked(p: Sequence, exact_only: bool = False) -> list:
    p = list(p)
    if not 1 <= len(p) <= MAX_WEIGHTS:
        raise AssumptionError("p", f"between 1 and {MAX_WEIGHTS} weights (2^(n-1) sign vectors are visited)",
                              f"{len(p)} weights", "check a shorter probability vector")
    if exact_only and not all(isinstance(v, (int, Fraction)) for v in p):
        raise AssumptionError("p", "exact weights (int or fractions.Fraction)", type(p[0]).__name__,
                              "pass Fractions; equal splits of float weights are not decidable")
    if all(isinstance(v, (int, Fraction)) for v in p) and (any(v <= 0 for v in p) or sum(p) != 1):
        raise AssumptionError("p", "positive weights summing to 1 (a softmax output)", repr([str(v) for v in p]),
                              "normalise the weights")
    return p


def _signs(n: int):
    for rest in itertools.product((1, -1), repeat=n - 1):
        yield (1, *rest)


def _best(values, exact: bool, largest: bool):
    values = list(values)
    if exact:
        return max(values) if largest else min(values)
    return maximum(*values) if largest else minimum(*values)


def inf_to_one_norm(p: Sequence):
    """``max_{||x||_inf <= 1} ||(diag(p) - p p^T) x||_1`` by enumerating the cube's vertices: exact for
    rational weights, an enclosure for intervals."""
    p = _checked(p)
    exact = all(isinstance(v, (int, Fraction)) for v in p)

    def value(x):
        mean = sum((w * s for w, s in zip(p, x)), Fraction(0) if exact else IV.mpf(0))
        return sum((abs(w * (s - mean)) for w, s in zip(p, x)), Fraction(0) if exact else IV.mpf(0))

    return _best((value(x) for x in _signs(len(p))), exact, largest=True)


def balanced_mass(p: Sequence):
    """``theta(p) = 1 - min_s (p^T s)^2`` over sign vectors s (exact, or an enclosure)."""
    p = _checked(p)
    exact = all(isinstance(v, (int, Fraction)) for v in p)
    zero = Fraction(0) if exact else IV.mpf(0)
    imbalance = _best((sum((w * s for w, s in zip(p, signs)), zero) ** 2 for signs in _signs(len(p))), exact,
                      largest=False)
    return 1 - imbalance


def equal_split(p: Sequence[Fraction]) -> bool:
    """Whether some subset of the weights has mass exactly 1/2 (subset sums on the common denominator)."""
    p = _checked(p, exact_only=True)
    denominator = 1
    for w in p:
        denominator = denominator * Fraction(w).denominator // _gcd(denominator, Fraction(w).denominator)
    integers = [int(Fraction(w) * denominator) for w in p]
    if denominator % 2:
        return False
    reachable = {0}
    for w in integers:
        reachable |= {r + w for r in reachable if r + w <= denominator // 2}
    return denominator // 2 in reachable


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def column_sum_norm(p: Sequence):
    """``||J||_{1 -> 1} = ||J||_{inf -> inf} = max_i 2 p_i (1 - p_i)`` (J symmetric; row i of ``|J|``
    sums to ``p_i (1 - p_i) + p_i (1 - p_i)``)."""
    p = _checked(p)
    exact = all(isinstance(v, (int, Fraction)) for v in p)
    return _best((2 * w * (1 - w) for w in p), exact, largest=True)


def softmax_enclosure(logits: Sequence[float], temperature: float = 1.0) -> list:
    """Intervals enclosing ``softmax(u / tau)`` for float logits u (taken exactly) and temperature."""
    values = [interval(float(u)) / interval(temperature) for u in logits]
    top = maximum(*values)
    exps = [IV.exp(v - top) for v in values]
    total = sum(exps, IV.mpf(0))
    return [e / total for e in exps]
