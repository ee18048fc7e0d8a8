r"""Step 9 of :func:`~.rotary_layer.positional_layer_bound`: a rotary layer's query term on the shared tangent and its
key term by columns charged to each key column by one eigenvalue (docs/mathematics.md, section 14, the lemma "a
layer's query and key charges of one column together").

**Why.**  The row split (step 5) bounds ``||S + cov||_F^2 <= sum_i (1 + t_i) ||S_i||^2 + sum_i (1 + 1/t_i)
||cov_i||^2`` and then each part by its own largest eigenvalue: token j pays ``(1 + t_j) b^2 ||e_j||^2`` for its query
part and ``key2 r^2 lambda_max(sum_{i sees j} f_i Phi_{j-i}) ||e_j||^2`` for the keys it is (step 7), each at its own
worst direction of ``e_j``.  Both parts are quadratic forms in the same ``e_j``, and their worst directions differ.

**The bound.**  No centre, no query bias, no key bias (steps 7 and 8 apply).  For any weights ``lambda_h > 0`` step 8
gives ``||sum_h S^h_i||^2 <= r^2 Lambda r^2 e_i^T Q e_i`` with ``Q = sum_h Pi W_Q^h Kbar_h W_Q^hT Pi / lambda_h`` and
``Lambda = lambda_max(sum_h lambda_h N_h)``, so ``||S_i||^2 <= b^2 e_i^T Qhat e_i`` (``b^2 = r^2 Lambda``, ``Qhat =
r^2 Q``); for any ``lambda'_h > 0`` step 7 gives ``||sum_h cov^h_i||^2 <= key2 c_i sum_{j in V_i} e_j^T Phat_{j-i} e_j``
(``key2 = r^2 Lambda'``, ``Phat_Delta = r^2 Phi_Delta``).  Summing over the rows and exchanging the sums,

    ||S + cov||_F^2 <= sum_j e_j^T C_j e_j <= max_j lambda_max(C_j) ||E||_F^2,
    C_j = (1 + t_j) b^2 Qhat [row j has a query part] + key2 sum_{i sees j} (1 + 1/t_i) c_i Phat_{j-i},

so ``Lip(S + cov) <= max_j lambda_max(C_j)^(1/2)``, never above step 7's split at the same ``t_i`` (``lambda_max`` of
a sum is at most the sum of the ``lambda_max``, and step 8's condition ``r^2 lambda_max(Q) <= 1`` makes ``lambda_max(b^2
Qhat) <= b^2``).  The weights on the PSD forms ``Qhat`` and ``Phat_Delta`` are rounded up to floats, which only enlarges
``C_j``; each ``lambda_max(C_j)`` (``d x d``) is certified by one Cholesky factorisation
(:func:`~lipbound.rigorous.linalg.lambda_max_upper_large`).  The ``t_i`` are chosen in floats: from step 7's, the
columns' top eigenvectors give each column's Rayleigh quotients of the query form and of every row's key form, with
which step 5's scalar split (:func:`~.layer.split_rows`) is solved again; the best of a few rounds is certified.
"""

from __future__ import annotations

import math
from typing import final

import numpy as np
from scipy.sparse.linalg import ArpackNoConvergence, eigsh

from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, lambda_max_upper_large, weighted_sum
from .layer import split_rows

__all__ = ["JoinedColumns"]

#: widths up to which the float search decomposes each column's form densely (Lanczos above)
_DENSE = 64


@final
class JoinedColumns:
    """The forms of step 9 of :func:`~.rotary_layer.positional_layer_bound`: ``||S_i||^2 <= b^2 e_i^T Qhat e_i`` and
    ``||cov_i||^2 <= key2 c_i sum_{j in V_i} e_j^T Phat_{j-i} e_j`` (module docstring).

    Parameters
    ----------
    query_form : Enclosure (d, d)
        ``Qhat = r^2 sum_h Pi W_Q^h Kbar_h W_Q^hT Pi / lambda_h`` (PSD).
    key_forms : dict
        Offset Delta -> ``Phat_Delta = r^2 Phi_Delta`` (d, d) (PSD).

    Attributes
    ----------
    splits : ndarray or None
        The ``t_i`` at which :meth:`bound` certified its value.
    """

    def __init__(self, query_form: Enclosure, key_forms: dict):
        self.query_form, self.key_forms = query_form, key_forms
        self.splits: np.ndarray | None = None

    def _columns(self, b2: float, key2: float, coefficients: np.ndarray, visible: np.ndarray, has_query: np.ndarray,
                 t: np.ndarray, starts: list):
        """Floats: per column ``(lambda_max(C_j), its eigenvector)`` at the splits ``t`` (None for an empty column)."""
        n = len(t)
        out = []
        for j in range(n):
            total = (1 + t[j]) * b2 * self.query_form.mid if has_query[j] else None
            for i in range(n):
                if visible[i, j] and has_query[i]:
                    part = (key2 * coefficients[i] * (1 + 1 / t[i])) * self.key_forms[j - i].mid
                    total = part if total is None else total + part
            if total is None:
                out.append(None)
                continue
            if total.shape[0] > _DENSE:
                try:
                    values, vectors = eigsh(total, k=1, which="LA", tol=1e-8, v0=starts[j])
                    starts[j] = vectors[:, 0]
                    out.append((float(values[0]), vectors[:, 0]))
                    continue
                except ArpackNoConvergence:      # a dense eigendecomposition instead
                    pass
            values, vectors = np.linalg.eigh(total)
            out.append((float(values[-1]), vectors[:, -1]))
        return out

    def bound(self, b, key2, coefficients: list, visible: np.ndarray, has_query: np.ndarray, t_start: np.ndarray,
              rounds: int = 2):
        """A certified upper bound on ``Lip(S + cov)`` of the layer (module docstring), an interval; None when an
        eigenvalue was not certified.  ``b``, ``key2``: intervals; ``coefficients`` the rows' ``c_i`` (intervals);
        ``t_start`` step 7's splits."""
        n = len(coefficients)
        has_query = np.asarray(has_query, dtype=bool)
        b2, key2_float = float(upper(b ** 2)), float(upper(key2))
        c = np.array([float(upper(x)) for x in coefficients])
        starts = [np.ones(self.query_form.shape[0]) for _ in range(n)]
        t = np.asarray(t_start, dtype=float).copy()
        best, best_t, best_columns = math.inf, t, None
        for _round in range(rounds + 1):
            columns = self._columns(b2, key2_float, c, visible, has_query, t, starts)
            value = max((col[0] for col in columns if col is not None), default=0.0)
            if value < best:
                best, best_t, best_columns = value, t.copy(), columns
            if _round == rounds:
                break
            # each column's Rayleigh quotients at its top eigenvector: step 5's scalar split solved again with them
            query = np.zeros(n)
            proxy = np.zeros((n, n))
            for j, col in enumerate(columns):
                if col is None:
                    continue
                v = col[1]
                if has_query[j]:
                    query[j] = b2 * float(v @ self.query_form.mid @ v)
                for i in range(n):
                    if visible[i, j] and has_query[i]:
                        proxy[i, j] = key2_float * c[i] * float(v @ self.key_forms[j - i].mid @ v)
            t = split_rows(query, proxy)
        # certified at best_t: the weights rounded up (the forms are PSD, so C_j only grows)
        self.splits = best_t
        tops = []
        for j in range(n):
            weights, mids, rads = [], [], []
            if has_query[j]:
                weights.append(float(upper((1 + interval(float(best_t[j]))) * b ** 2)))
                mids.append(self.query_form.mid)
                rads.append(self.query_form.rad)
            for i in range(n):
                if visible[i, j] and has_query[i]:
                    form = self.key_forms[j - i]
                    weights.append(float(upper(key2 * coefficients[i] * (1 + 1 / interval(float(best_t[i]))))))
                    mids.append(form.mid)
                    rads.append(form.rad)
            if not weights:
                continue
            total = weighted_sum(weights, np.stack(mids), np.stack(rads)).sym()
            estimate = best_columns[j][0] if best_columns is not None and best_columns[j] is not None else None
            top = lambda_max_upper_large(total, estimate=estimate)
            if not math.isfinite(top):
                return None
            tops.append(max(top, 0.0))
        return IV.sqrt(interval(max(tops, default=0.0)))
