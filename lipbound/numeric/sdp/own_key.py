r"""A row's own key merged into its query part: the certified constants of step 8 of
:mod:`lipbound.numeric.sdp.rotary` (docs/mathematics.md, section 14, item 7).

**Why.**  Under a causal mask (or a window) row i reads key i, its own token, at offset 0.  The query part
``S_i`` and the key part ``cov_i`` of the row then both read ``e_i``: the score of the pair (i, i) moves by

    ds_ii = e_i . (A_0 x_i + h_0) + e_i . (A_0^T x_i + u_0) = e_i . ((A_0 + A_0^T) x_i + h_0 + u_0),

and the row split (steps 6 and 7) bounds the two summands apart, each at its own worst case, and adds them.
With no centre and no biases (``h_0 = u_0 = 0``) write ``Ahat_Delta = A_Delta`` for ``Delta != 0`` and ``Ahat_0 =
A_0 + A_0^T``.  Since the covariance is linear in its second argument,

    y^T (S_i + cov_i) = Cov_{p_i}(alpha, zeta') + Cov_{p_i}(delta, z'),
    zeta'_j = phi'_ij e_i . Ahat_{Delta_ij} x_j,   z'_j = phi'_ij e_j . g_ij for j != i,  z'_i = 0,

(positions are distinct, so ``Delta_ij = 0`` exactly when j = i).  The first is a query part with the matrices
``Ahat_Delta``: steps 1 and 1b hold for it unchanged (each key's score term is linear in that key), giving

    a' = max(max_{Delta != 0} sup_w ||Pi A_Delta M w||, sup_w ||Pi Ahat_0 M w||),     b'_1 = rho a',
    b'_1b = (r^2 / 2) max_Delta lambda_max(a M^T V V^T M + M^T Ahat_Delta^T Pi Ahat_Delta M / a),

``b' = min(b'_1, b'_1b)``.  The second is the key part of step 2 with ``z'_i = 0``: the bound ``Var z' <= 2 sum_j
p_j (1 - p_j) z'_j^2`` holds for every vector, so row i's key part reads the other keys only and the forms
``K_ij`` of steps 2b and 6 lose their diagonal ``j = i``.  Step 6 then gives

    ||S + cov||_F^2 <= max_j [(1 + t_j) b'^2 + lambda_max(sum_{i sees j, i != j} (1 + 1/t_i) K_ij)] ||E||^2.

Where ``A_0 + A_0^T`` is not much larger than the query gradients, this removes from column j the sum of a query
part and a key part of the same row at different worst cases.  For a whole layer the same holds head by head:
the layer's query term with the heads' gains ``a'_h`` (weighted Cauchy-Schwarz over heads), its key parts
without the diagonal.

**Computing.**  ``Pi Ahat_0 M w = sigma [Pi W_Q, Pi W_K] [W_K^T M w; W_Q^T M w]``, so ``sup_w ||Pi Ahat_0 M w|| = r
||[Pi W_Q, Pi W_K] sigma [W_K^T M; W_Q^T M]||`` (a product with inner dimension ``2 d_k``), and every form of
step 1b lives on the span of ``[M^T V, M^T W_K, M^T W_Q]`` (``d_v + 2 d_k`` columns): the offsets ``Delta != 0`` on
the ``W_K`` block (``R_Delta^T sigma^2 W_Q^T Pi W_Q R_Delta``), ``Ahat_0`` on the two blocks of ``W_K`` and ``W_Q``
(``sigma^2 [Pi W_Q, Pi W_K]^T [Pi W_Q, Pi W_K]``).  Each eigenvalue is certified from the basis's Gram matrix
(:func:`~lipbound.rigorous.linalg.gram_norm_upper`); the common ``a`` and the ``t_i`` are chosen in floats and
only steer.
"""

from __future__ import annotations

import math
import time
from typing import final

import numpy as np

from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, gram_norm_upper, product_norm_interval
from .joint import _golden_min
from .layer import coupled_rows, ridged_root, row_factors, split_rows

__all__ = ["OwnKeyTerms"]


def _placed(size: int, blocks: list[tuple[slice, Enclosure]]) -> Enclosure:
    """A ``size x size`` enclosure holding each block at its slice (zero elsewhere), lifted by a tiny ridge
    (only larger)."""
    mid, rad = np.zeros((size, size)), np.zeros((size, size))
    for where, block in blocks:
        mid[where, where] += block.mid
        rad[where, where] += block.rad
    mid[np.diag_indices(size)] += 1e-12 * float(np.max(np.abs(mid))) + 1e-300
    return Enclosure(mid, rad).sym()


@final
class OwnKeyTerms:
    """The query part of every row with the row's own key merged into it (module docstring).

    Parameters
    ----------
    bounds : PositionalHeadBounds
        The head's constants (:class:`lipbound.numeric.sdp.rotary.PositionalHeadBounds`); with its value map
        ``V W_O^h`` when built for a layer.
    coupled : bool
        Also the coupled form ``b'_1b`` (eigenvalues in ``d_v + 2 d_k`` dimensions, about 0.15 CPU-s per head on
        SmolLM2); without it ``b' = rho a'`` until :meth:`refine`.

    Attributes
    ----------
    applies : bool
        No centre, no query or key bias, and every row sees its own key.
    gain : interval or None
        ``a'``.
    query_term : interval or None
        ``b' = min(rho a', b'_1b)``.
    """

    def __init__(self, bounds, coupled: bool = True):
        self.bounds = bounds
        head, rows = bounds.head, bounds.rows
        self.applies = bool(bounds.centred(head.W_K, head.b_K) is None and bounds.centred(head.W_Q, head.b_Q) is None
                            and np.all(np.diag(rows.visible)))
        self.gain = self.query_term = None
        self.seconds = 0.0
        self.refined = False
        self._estimated: tuple = ()   # (the float guess,) once formed: steps 8 and 10 both read it
        if not self.applies:
            return
        started = time.perf_counter()
        both = Enclosure.concatenate([bounds.query_left, bounds.key_left])          # [Pi W_Q, Pi W_K]
        stacked = Enclosure.concatenate([bounds.keys_scaled, bounds.queries_shaped], axis=0)
        own = bounds.r * product_norm_interval(both, stacked)                            # sup ||Pi Ahat_0 M w||
        per_offset = bounds.query_gain.details.get("per_offset", {}) if bounds.query_gain.details else {}
        others = [IV.mpf(v) for key, v in per_offset.items() if int(key) != 0]
        self.gain = max([own, *others], key=upper)
        self.query_term = bounds.spread * self.gain
        if coupled:
            self.refine()
        self.seconds = time.perf_counter() - started

    def refine(self) -> None:
        """Take ``b'_1b`` into ``query_term`` where it is smaller (certified); formed once."""
        if self.refined:
            return
        self.refined = True
        better = self._coupled()
        if better is not None and upper(better) < upper(self.query_term):
            self.query_term = better

    def estimate(self) -> float | None:
        """``b'_1b`` in floats at the ``a`` of step 1b (a guess that only decides whether :meth:`refine` is worth its
        cost; None without that a); formed once."""
        if not self._estimated:
            self._estimated = (self._coupled(estimate=True),)
        return self._estimated[0]

    def _coupled(self, estimate: bool = False):
        """``b'_1b`` (module docstring), an interval, or None when not certified; with ``estimate`` a float at step
        1b's a, never a bound."""
        bounds, head, region = self.bounds, self.bounds.head, self.bounds.region
        d_v, d_k = head.d_v, head.d_k
        values = region.times_shape(Enclosure.exact(head.W_V.T)).T                     # M^T V, (d, d_v)
        # coordinates (W_K^T M w, sigma W_Q^T M w): Pi Ahat_0 M w = [sigma Pi W_Q, Pi W_K] (those coordinates)
        basis = Enclosure.concatenate([values, bounds.keys_shaped.T, bounds.queries_shaped.T])
        gram = (basis.T @ basis).sym()
        outputs = bounds.value_outputs
        sigma = Enclosure.scalar(bounds.scale)
        queries = bounds.gram("query_left").scale(bounds.scale ** 2)                  # sigma^2 W_Q^T Pi W_Q
        inner = {delta: (R.T @ queries @ R).sym() for delta, R in bounds.rotations.items() if delta != 0}
        pair = Enclosure.concatenate([bounds.query_left.scale(sigma), bounds.key_left])
        merged = (pair.T @ pair).sym()
        size = d_v + 2 * d_k
        values_at, keys_at, pair_at = slice(0, d_v), slice(d_v, d_v + d_k), slice(d_v, d_v + 2 * d_k)
        forms = [(keys_at, form) for form in inner.values()] + [(pair_at, merged)]

        def middle(a: float, where: slice, form: Enclosure) -> Enclosure:
            # a and 1/a enclosed together: AM-GM needs their product to be exactly 1
            return _placed(size, [(values_at, outputs.scale(interval(a))), (where, form.scale(1 / interval(a)))])

        root = ridged_root(gram.mid)
        values_part = root[values_at].T @ outputs.mid @ root[values_at]
        parts = [root[where].T @ form.mid @ root[where] for where, form in forms]

        def largest(log_a: float) -> float:
            a = math.exp(log_a)
            return max(float(np.linalg.eigvalsh(a * values_part + part / a)[-1]) for part in parts)

        # near the a of steps 1b (only the offset-0 form changes), else about the balance of the traces
        known = bounds.query_coupled.details.get("a") if bounds.query_coupled is not None else None
        if estimate:
            return None if not known else float(upper(bounds.r ** 2)) / 2 * largest(math.log(known))
        if known:
            a = math.exp(_golden_min(largest, math.log(known) - 2.0, math.log(known) + 2.0, iterations=10))
        else:
            centre = 0.5 * math.log(max(float(np.trace(merged.mid)), 1e-300) / max(float(np.trace(outputs.mid)),
                                                                                       1e-300))
            a = math.exp(_golden_min(largest, centre - 6.0, centre + 6.0, iterations=16))
        tops = [gram_norm_upper(gram, middle(a, where, form)) for where, form in forms]
        if not all(math.isfinite(t) for t in tops):
            return None
        return IV.mpf(upper(bounds.r ** 2 / 2 * IV.mpf(max(tops)) ** 2))

    def head_rows(self, b=None):
        """``||S + cov||`` of the head by step 6 with the merged query parts (``b``, default ``query_term``) and the key
        forms without their diagonal (module docstring), an interval; None when the key forms by columns do not
        apply."""
        bounds = self.bounds
        if not self.applies or bounds.column_key is None:
            return None
        rows, n = bounds.rows, bounds.rows.n
        has_query = rows.key_counts >= 2
        nus = np.array([float(upper(bounds.row_nu(i))) for i in range(n)])
        rho2, r2 = bounds.spread ** 2, float(upper(bounds.r ** 2))
        gains = bounds.offset_gains()
        proxy = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                if rows.visible[i, j] and i != j:
                    proxy[i, j] = float(upper(rho2)) * nus[i] * r2 * gains[j - i] ** 2
        b = self.query_term if b is None else b
        t = split_rows(np.where(has_query, float(upper(b ** 2)), 0.0), proxy)
        norms = bounds.column_norms(row_factors(t), own=False)
        if norms is None:
            return None
        return coupled_rows(b, has_query, t, [rho2 * (bounds.r * interval(v)) ** 2 for v in norms])
