r"""A certified floor under the layer's per-head candidate of rotary and masked heads, so that the candidate is
formed only where it could win.

A layer ``F = sum_h f^h W_O^h`` gets two candidates from :mod:`.rotary`: ``"matrix-aware"``, the sum over heads of
:func:`~.rotary.positional_bound` of ``f^h W_O^h`` (several certified forms per head, the smallest kept), and
``"joint"`` (:func:`~.rotary_layer.positional_layer_bound`).  Forming the first costs several times the second on real
decoders, where it is rarely the smaller.  This module gives, from constants the joint bound has already formed, a
certified lower bound on the first's value (never on the Lipschitz constant): when it lies above the joint bound, the
candidate cannot be the best and is not formed.  Skipping only ever drops a bound that another bound beats, so the
best certified bound is the same float.

**The floor.**  Without a centre and biases (every form by columns applies), each form of
:func:`~.rotary.positional_bound` (module docstring of :mod:`.rotary`, steps 5-9) is at least

    L kappa^(1/2) + rho r max_j lambda_max(K'_j)^(1/2),
    K'_j = sum_{i sees j, i != j} nu_i Pi A_{j-i}^T M M^T A_{j-i} Pi,

the mean term plus the key part of the columns without their diagonal (``nu_i`` the rows' ``max nu(p)``):

* Minkowski ``b + L kappa^(1/2) + k``: ``k`` is the smaller of ``rho beta kappa_cov^(1/2)`` and ``rho r max_j
  lambda_max(K_j)^(1/2)``; the second is at least the sum without the diagonal (the forms are PSD), and so is the
  first, since ``beta >= r ||Pi A_Delta^T M||`` for every offset and ``lambda_max`` of a sum is at most the sum.
* Row by row ``(b^2 + (alpha + (alpha^2 + beta'^2)^(1/2)) / 2)^(1/2) >= alpha^(1/2) >= n^(1/2) W``, ``W = L + rho beta
  nu_max^(1/2)``: ``n^(1/2) L >= L kappa^(1/2)`` (``kappa <= n``) and ``n^(1/2) rho beta nu_max^(1/2) >= rho beta
  (sum_{i sees j} nu_i)^(1/2)``, which is at least the key part above.
* The row splits (steps 6 and 7) and the merged own keys (step 8) are ``(max_j [...])^(1/2)`` plus the mean term,
  where the bracket holds the column's key form with factors ``1 + 1/t_i >= 1`` (with or without its diagonal) and a
  non-negative query part: at least ``lambda_max(K'_j)`` times ``rho^2 r^2``.
* The centred rows (step 9) are ``lambda_max`` of one form over all tokens plus the mean term; at a move of token j
  alone the form is at least its key part there, where row i charges ``(1/2)(1 - theta_i) >= (1/2)(1 - 1/N_i)``
  (``N_i`` the row's keys) in place of ``nu_i``.  So ``nu_i`` above is taken as ``min(nu_i, (1/2)(1 - 1/N_i))``.
  Step 10 (some rows' own keys merged) drops from row i only key i, which ``K'_j`` leaves out already.

Each ``lambda_max(K'_j) = ||X Y_j||^2`` (``X = Pi W_K``, ``Y_j Y_j^T`` the rotated query forms) is bounded from below by
a Rayleigh quotient at a float vector, evaluated in interval arithmetic: ``lambda_max(X T X^T) >= v^T G T G v / v^T G
v`` with ``G = X^T X``, for any ``v`` with ``G v != 0``.
"""

from __future__ import annotations

import math

import numpy as np

from ...rigorous.intervals import IV, interval, lower
from ...rigorous.linalg import Enclosure
from .rotary import PositionalHeadBounds

__all__ = ["candidate_floor", "layer_candidate_floor"]


def _rayleigh_floor(gram: Enclosure, form: Enclosure) -> float:
    """A certified lower bound on ``lambda_max(X T X^T)`` from ``G = X^T X`` and ``T`` (both ``k x k``): the Rayleigh
    quotient at ``z = X v``, ``v = G^(-1/2) u`` for the top eigenvector u of ``G^(1/2) T G^(1/2)`` in floats."""
    values, vectors = np.linalg.eigh(0.5 * (gram.mid + gram.mid.T))
    if values[-1] <= 0:
        return 0.0
    keep = values > values[-1] * 1e-12
    root = (vectors[:, keep] * np.sqrt(values[keep])) @ vectors[:, keep].T
    inverse_root = (vectors[:, keep] / np.sqrt(values[keep])) @ vectors[:, keep].T
    top = np.linalg.eigh(0.5 * (root @ form.mid @ root + (root @ form.mid @ root).T))[1][:, -1]
    v = Enclosure.exact((inverse_root @ top).reshape(-1, 1))
    image = gram @ v                                                          # G v, (k, 1)
    numerator = (image.T @ form @ image).interval()
    denominator = (v.T @ image).interval()
    if not lower(denominator) > 0:
        return 0.0
    return max(float(lower(numerator / denominator)), 0.0)


def candidate_floor(bounds: PositionalHeadBounds) -> float | None:
    """A certified lower bound on :func:`~.rotary.positional_bound`'s value for the head of ``bounds`` (module
    docstring; steps 5-9), or None where the floor does not apply (a centre, a query or key bias, no row with two keys,
    or a constant not certified)."""
    head, rows = bounds.head, bounds.rows
    if (np.any(bounds.region.center) or np.any(head.b_Q) or np.any(head.b_K) or not bounds.certified
            or not np.any(rows.key_counts >= 2)):
        return None
    kappa = rows.column_sum([IV.mpf(lower(bounds.weight_range(i)[1])) for i in range(rows.n)])
    mean = interval(lower(bounds.value_norm)) * IV.sqrt(interval(lower(kappa)))
    # step 9 charges a key alone (1/2)(1 - theta_i) >= (1/2)(1 - 1/N_i) in a row of N_i keys, the other forms nu_i
    nus = [min(float(lower(bounds.row_nu(i))), float(lower((1 - 1 / IV.mpf(int(rows.key_counts[i]))) / 2)))
           for i in range(rows.n)]
    queries, keys = bounds.gram("queries_shaped"), bounds.gram("key_left")
    largest = 0.0
    form: Enclosure | None
    for j in range(rows.n):
        seen = [i for i in range(rows.n) if rows.visible[i, j] and i != j and nus[i] > 0]
        if not seen:
            continue
        form = None
        for i in seen:
            rotation = bounds.rotations[j - i]
            part = (rotation.T @ queries @ rotation).scale(nus[i])
            form = part if form is None else form + part
        if form is not None:
            largest = max(largest, _rayleigh_floor(keys, form.sym()))
    key = interval(lower(bounds.spread)) * interval(lower(bounds.r)) * IV.sqrt(interval(largest))
    return float(lower(mean + key))


def layer_candidate_floor(heads: list[PositionalHeadBounds]) -> float | None:
    """A certified lower bound on the layer's ``"matrix-aware"`` candidate (the sum over heads of
    :func:`~.rotary.positional_bound` with each head's block of ``W_O``), or None where a head's floor does not
    apply."""
    floors = [candidate_floor(bounds) for bounds in heads]
    if any(f is None or not math.isfinite(f) for f in floors):
        return None
    return float(lower(sum((interval(f) for f in floors), interval(0.0))))
