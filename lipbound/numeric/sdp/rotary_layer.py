r"""Certified constants of a whole layer of rotary or masked heads, seen jointly with ``W_O``
(:func:`positional_layer_bound`).  The per-head constants are :class:`~.rotary.PositionalHeadBounds`, and the steps
of :mod:`.rotary`'s module docstring that it cites hold head by head.

**The key term by columns** (step 7 of :func:`positional_layer_bound`; docs/mathematics.md, section 14).  No centre,
no query bias.  Row i's key part is ``sum_h cov^h_i``, ``y^T cov^h_i = Cov_{p^h_i}(z^h, delta^h)`` with
``z^h_j = phi' e_j . g^h_ij``, ``g^h_ij = A^hT_{j-i} M w_i``.  Step 2 bounds ``Var delta^h <= r^2 y^T N_h y``
and ``Var z^h <= c_i sum_j (z^h_j)^2`` (``c_i`` the row's coefficient, at least ``2 max p (1 - p)`` or the largest
weight of every head), and Cauchy-Schwarz over heads with weights ``lambda_h`` gives

    ||sum_h cov^h_i||^2 <= r^2 Lambda' c_i sum_{j in V_i} sum_h (e_j . g^h_ij)^2 / lambda_h,
    sum_h (e_j . g^h_ij)^2 / lambda_h = sum_h (w_i^T M^T A^h_{j-i} e_j)^2 / lambda_h <= r^2 e_j^T Phi_{j-i} e_j,

``Phi_Delta = sum_h F^h_Delta F^hT_Delta / lambda_h``, ``F^h_Delta = Pi A^hT_Delta M``.  The spectral condition ``r^2
lambda_max(Phi_Delta) <= 1`` (every offset) then bounds each ``r^2 e_j^T Phi e_j`` by ``||e_j||^2``, and the row split
(step 5) charges key j ``r^2 Lambda' sum_{i sees j} f_i``, ``f_i = (1 + 1/t_i) c_i``.  Summing over the rows first
instead,

    sum_i (1 + 1/t_i) ||sum_h cov^h_i||^2 <= r^2 Lambda' sum_j e_j^T (r^2 sum_{i sees j} f_i Phi_{j-i}) e_j,

so key j is charged ``r^2 Lambda' r^2 lambda_max(sum_{i sees j} f_i Phi_{j-i})``, never more than ``r^2 Lambda' sum_i
f_i`` (``lambda_max`` of a sum is at most the sum of the ``lambda_max``).  Every row reads key j at its own offset, so
the rotations turn the heads' worst key directions of different rows apart: step 2b of :mod:`.rotary` for all heads
at once.  The query parts of step 5 are unchanged.  Each ``lambda_max`` is certified as ``||B D^(1/2)||^2`` from the
Gram matrix of the groups' key projections ``B = [Pi W_K^1, ..., Pi W_K^G]`` (:class:`KeyColumns`), at the weights
for which the condition was certified; the ``t_i`` are chosen in floats.
"""

from __future__ import annotations

import math
import time
from typing import final

import numpy as np

from ...errors import AssumptionError
from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, gram_norm_upper, lambda_max_upper, lambda_min_lower, product_norm_interval
from ...rigorous.value import CertifiedValue
from .joint import sdp_value
from .layer import _factor, _joint_term, _stacked_form, _top, layer_splits, ridged_root, split_layer
from .own_key import OwnKeyTerms
from .region import Region
from .rotary import PositionalHeadBounds, _smaller_by_rows
from .rotary_joined import JoinedColumns

__all__ = ["positional_layer_bound"]


def _spectral_key_weights(layer, region, heads: list[PositionalHeadBounds], output_factors: list[np.ndarray],
                          start: np.ndarray, iterations: int = 20):
    """Weights for the spectral condition of the key term (step 2 of :func:`positional_layer_bound`), in floats:
    minimise ``lambda_max(sum_h lambda_h N_h) C(lambda)^2`` with
    ``C = r max_Delta lambda_max(B D_Delta(lambda) B^T)^(1/2)`` by gradient steps on ``log lambda``, from ``start``.
    Returns ``(lambda scaled to C = 1 in floats, B's Gram enclosure, the per-offset per-head inner forms)``; only the
    certificate built from them counts."""
    groups = [layer.group_heads(g) for g in range(layer.num_groups)]
    keys = [region.project(Enclosure.exact(layer.heads[members[0]].W_K)) for members in groups]
    basis = Enclosure.concatenate(keys)
    gram = (basis.T @ basis).sym()
    root = ridged_root(gram.mid)
    d_k = layer.heads[0].d_k
    offsets = heads[0].rows.offsets
    inner = {delta: [(hb.rotations[delta].T @ hb.gram("queries_shaped") @ hb.rotations[delta]).sym() for hb in heads]
             for delta in offsets}
    owner = [layer.group_of(h) for h in range(len(heads))]
    r = float(upper(region.r))

    def constraint(weights):
        worst, gradient = -1.0, None
        for delta in offsets:
            D = np.zeros(gram.shape)
            for h, form in enumerate(inner[delta]):
                block = slice(owner[h] * d_k, (owner[h] + 1) * d_k)
                D[block, block] += form.mid / weights[h]
            values, vectors = np.linalg.eigh(root.T @ D @ root)
            if values[-1] > worst:
                z = root @ vectors[:, -1]
                worst = float(values[-1])
                gradient = np.array([-(z[owner[h] * d_k:(owner[h] + 1) * d_k] @ inner[delta][h].mid
                                       @ z[owner[h] * d_k:(owner[h] + 1) * d_k]) / weights[h] ** 2
                                     for h in range(len(heads))])
        return r * math.sqrt(max(worst, 0.0)), r * gradient / (2 * math.sqrt(max(worst, 1e-300)))

    log_w = np.log(np.asarray(start, dtype=float))
    best, best_w, v, step = math.inf, np.exp(log_w), None, 0.5
    for _ in range(iterations):
        w = np.exp(log_w)
        top, v = _top(output_factors, w, v)
        C, grad_C = constraint(w)
        value = top * C * C
        if value < best:
            best, best_w = value, w.copy()
        else:
            step *= 0.6
        grad_top = np.array([np.sum((T.T @ v) ** 2) for T in output_factors]) / max(top, 1e-300)
        gradient = w * (grad_top + 2 * grad_C / max(C, 1e-300))              # d log(value) / d log w
        log_w = np.log(best_w) - step * gradient / max(np.max(np.abs(gradient)), 1e-12)
    C, _ = constraint(best_w)
    return best_w * C * C, basis, gram, inner, owner


def _spectral_key_term(layer, region, heads, blocks, value_forms, start) -> tuple:
    """Certified ``Lambda^(1/2) = lambda_max(sum_h lambda_h N_h)^(1/2)`` for weights whose spectral condition
    ``r^2 max_Delta lambda_max(sum_h F^h_Delta F^hT_Delta / lambda_h) <= 1`` holds in interval arithmetic
    (``F^h_Delta = Pi A^h_Delta^T M``, all heads at one key sharing its offset), or ``(None, reason)``."""
    outputs = [O.mid.T @ _factor(S.mid) for O, S in zip(blocks, value_forms)]
    weights, basis, gram, inner, owner = _spectral_key_weights(layer, region, heads, outputs, start)
    d_k = layer.heads[0].d_k
    for inflate in (1e-9, 1e-6, 1e-3, 1e-1):
        lam = weights * (1 + inflate)
        worst = 0.0
        for forms in inner.values():
            size = gram.shape[0]
            mid, rad = np.zeros((size, size)), np.zeros((size, size))
            for h, form in enumerate(forms):
                block = slice(owner[h] * d_k, (owner[h] + 1) * d_k)
                scaled = form.scale(1 / interval(float(lam[h])))     # (the reciprocal enclosed)
                mid[block, block] += scaled.mid
                rad[block, block] += scaled.rad
            ridge = 1e-12 * float(np.max(np.abs(mid))) + 1e-300
            mid[np.diag_indices(size)] += ridge
            norm = gram_norm_upper(gram, Enclosure(mid, rad * (1 + 1e-15) + 1e-300).sym())
            worst = max(worst, norm)
        if upper(interval(region.r) * interval(worst)) <= 1.0:
            break
    else:
        return None, {"failed": "the spectral condition was not certified"}
    top = max(lambda_max_upper(_stacked_form([[(O.T, S)] for O, S in zip(blocks, value_forms)], lam)), 0.0)
    return IV.sqrt(IV.mpf(top)), {"weights": [float(w) for w in lam],
                                  "columns": KeyColumns(region.r, basis, gram, inner, owner, lam, d_k)}


@final
class KeyColumns:
    """The key forms ``Phi_Delta = sum_h F^h_Delta F^hT_Delta / lambda_h`` of the spectral condition at its certified
    weights, for charging a key through the offsets at which the rows read it (step 7 of
    :func:`positional_layer_bound`; the ``columns`` of :func:`~.layer.split_layer`).

    Parameters
    ----------
    radius : interval
        ``r``.
    basis : Enclosure (d, G d_k)
        ``B = [Pi W_K^1, ..., Pi W_K^G]``.
    gram : Enclosure (G d_k, G d_k)
        ``B^T B`` of the key projections ``B = [Pi W_K^1, ..., Pi W_K^G]`` of the G key/value groups.
    inner : dict
        Per offset, per head the ``d_k x d_k`` form ``R_Delta^T sigma^2 W_Q^hT M M^T W_Q^h R_Delta`` (so that
        ``F^h_Delta F^hT_Delta = Pi W_K^g (that form) W_K^gT Pi``).
    owner : list of int
        The key/value group of each head.
    weights : ndarray (H,)
        The ``lambda_h`` at which the spectral condition was certified.
    d_k : int

    Attributes
    ----------
    shares : dict
        Per offset ``r^2 lambda_max(Phi_Delta)`` in floats (at most about 1 by the condition; steers the row split).
    """

    def __init__(self, radius, basis: Enclosure, gram: Enclosure, inner: dict, owner: list[int], weights: np.ndarray,
                 d_k: int):
        self.radius, self.basis, self.gram, self.inner, self.owner, self.d_k = radius, basis, gram, inner, owner, d_k
        self.weights = [interval(float(w)) for w in weights]
        root = ridged_root(gram.mid)
        r2 = float(upper(radius ** 2))
        self.shares = {delta: r2 * max(float(np.linalg.eigvalsh(root.T @ self._form({delta: 1.0}).mid @ root)[-1]),
                                       0.0) for delta in inner}

    def _form(self, shares: dict) -> Enclosure:
        """``sum_Delta shares_Delta sum_h (the head's inner form) / lambda_h`` placed in the group blocks, lifted by a
        tiny ridge (only larger)."""
        size = self.gram.shape[0]
        mid, rad = np.zeros((size, size)), np.zeros((size, size))
        for delta, share in shares.items():
            for h, form in enumerate(self.inner[delta]):
                block = slice(self.owner[h] * self.d_k, (self.owner[h] + 1) * self.d_k)
                scaled = form.scale(interval(share) / self.weights[h])
                mid[block, block] += scaled.mid
                rad[block, block] += scaled.rad
        mid[np.diag_indices(size)] += 1e-12 * float(np.max(np.abs(mid))) + 1e-300
        return Enclosure(mid, rad).sym()

    def column(self, shares: dict) -> float | None:
        """A certified upper bound on ``r^2 lambda_max(sum_Delta shares_Delta Phi_Delta)`` (``shares`` offset -> a
        float >= 0), as ``r^2 ||B D^(1/2)||^2`` from the Gram matrix ``B^T B``; None when not certified."""
        norm = gram_norm_upper(self.gram, self._form(shares))
        if not math.isfinite(norm):
            return None
        return float(upper(self.radius ** 2 * interval(norm) ** 2))

    def forms(self) -> dict:
        """Per offset ``r^2 Phi_Delta = r^2 B D_Delta B^T`` as a ``d x d`` enclosure (PSD; step 9 of
        :func:`positional_layer_bound`)."""
        r2 = self.radius ** 2
        return {delta: (self.basis @ self._form({delta: 1.0}) @ self.basis.T).sym().scale(r2) for delta in self.inner}


def _psd_part(S: np.ndarray) -> np.ndarray:
    """The positive semidefinite part of a symmetric float matrix (its negative eigenvalues set to 0)."""
    values, vectors = np.linalg.eigh(0.5 * (S + S.T))
    return (vectors * np.maximum(values, 0.0)) @ vectors.T


def dominating_key_form(hb: PositionalHeadBounds) -> Enclosure | None:
    """A certified ``d_k x d_k`` form ``Kbar >= R_Delta G R_Delta^T`` for every offset Delta of the head's rows,
    ``G = sigma^2 W_K^T M M^T W_K`` (step 8 of :func:`positional_layer_bound`), or None when not certified.

    Built in floats from the farthest offset inwards: ``K <- K + (R_Delta G R_Delta^T - K)_+`` (the positive part)
    dominates the form of Delta and keeps every form dominated before (it only grows); then a ridge, and each
    ``Kbar - R_Delta G R_Delta^T >= 0`` is checked in interval arithmetic (the smallest eigenvalue from below)."""
    G = hb.gram("keys_scaled")
    rotated = {delta: (R @ G @ R.T).sym() for delta, R in hb.rotations.items()}
    order = sorted(rotated, key=abs, reverse=True)
    K = rotated[order[-1]].mid.copy()
    for delta in order:
        K = K + _psd_part(rotated[delta].mid - K)
    K = 0.5 * (K + K.T)
    scale = max(float(np.max(np.abs(K))), 1e-300)
    for ridge in (1e-9, 1e-6, 1e-3):
        Kbar = Enclosure.exact(K + ridge * scale * np.eye(K.shape[0]))
        if all(lambda_min_lower((Kbar - form).sym()) >= 0.0 for form in rotated.values()):
            return Kbar
    return None


def _shared_query_term(heads: list[PositionalHeadBounds], blocks, value_forms, r):
    """Step 8 of :func:`positional_layer_bound`: the layer's query term with the heads' query gradients bounded
    together on the shared tangent ``e_i`` through one dominating key form per head, ``r Lambda^(1/2)`` under
    ``r^2 lambda_max(sum_h Pi W_Q^h Kbar_h W_Q^hT Pi / lambda_h) <= 1``; ``(interval or None, details)``, the details
    with ``form``, ``r^2 sum_h Pi W_Q^h Kbar_h W_Q^hT Pi / lambda_h`` at the certified weights (for step 9)."""
    if any(hb.centred(hb.head.W_K, hb.head.b_K) is not None for hb in heads):
        return None, {"skipped": "the query gradients have a constant part (a centre or a key bias)"}
    forms = [dominating_key_form(hb) for hb in heads]
    if any(form is None for form in forms):
        return None, {"failed": "a dominating key form was not certified"}
    inputs = [[(hb.query_left, form)] for hb, form in zip(heads, forms)]
    joint, info = _joint_term(blocks, value_forms, inputs, None, r, "shared query term")
    if joint is None:
        return None, info
    info["form"] = _stacked_form(inputs, [1 / interval(w) for w in info["weights"]]).scale(r ** 2)
    return r * joint, info


def _own_key_layer(heads: list[PositionalHeadBounds], blocks, value_forms, r, key2, coefficients, has_query):
    """Step 6 of :func:`positional_layer_bound` with every row's own key merged into its query part (step 8 of
    :mod:`.rotary`, :mod:`.own_key`): the layer's query term from the heads' gains ``a'_h`` (their sum of ``rho_h
    a'_h``, or the weighted Cauchy-Schwarz over heads), the rows' key parts without the diagonal; an interval, or None
    when the merge does not apply."""
    own = [OwnKeyTerms(hb, coupled=False) for hb in heads]
    if not all(o.applies for o in own):
        return None
    summed = sum((o.query_term for o in own), IV.mpf(0))
    joint, _ = _joint_term(blocks, value_forms, [], [o.gain for o in own], interval(0), "query term")
    b = summed if joint is None or upper(summed) <= upper(r * joint) else r * joint
    rows = heads[0].rows
    return split_layer(b, key2, coefficients, rows.visible & ~np.eye(rows.n, dtype=bool), has_query)


_LAYER_PROVENANCE = ("whole layer of rotary or masked heads, seen jointly with W_O: weighted Cauchy-Schwarz over "
                     "heads for the query and key terms, the mean term per key/value group "
                     "(lipbound.numeric.sdp.rotary, positional_layer_bound)")


def positional_layer_bound(layer, domain, n: int, *, heads: list[PositionalHeadBounds] | None = None,
                           name: str = "joint") -> CertifiedValue:
    r"""Certified Frobenius Lipschitz constant of a multi-head layer ``F = sum_h f^h W_O^h`` of rotary or masked
    heads (self-attention, no residual), heads seen jointly.

    Head h has the value map ``M_h = V_{g(h)} W_O^h`` (``g(h)`` its key/value group) and ``N_h = M_h^T M M^T M_h``.
    Per query i, ``DF_i[E] = sum_h (S^h_i + mean^h_i + cov^h_i)`` (:mod:`.rotary`'s module docstring, each head with its
    own weights).

    1. *Query term.*  ``y^T S^h_i = Cov_{p^h_i}(y . M_h^T x_j, zeta^h_j) <= Var_h^(1/2) a_h ||e_i||`` with
       ``Var_h <= r^2 y^T N_h y``; for weights ``lambda_h > 0`` with ``sum_h a_h^2 / lambda_h <= 1``,
       Cauchy-Schwarz over heads gives ``||sum_h S^h_i|| <= r Lambda^(1/2) ||e_i||``,
       ``Lambda = lambda_max(sum_h lambda_h N_h)`` (also ``<= sum_h b_h``).
    2. *Key term* (step 2 of :mod:`.layer`, covariance form): ``||sum_h cov^h_i||^2 <= r^2 Lambda' 2 sum_j q_ij
       ||e_j||^2``, ``q_ij = max_h p^h_ij (1 - p^h_ij)``, for weights with ``sum_h beta_h^2 / lambda_h <= 1`` (the key
       gradients of all heads at one key share its offset, and each is at most ``beta_h``); or with the column sums
       of ``max_h p^h_ij``.
    3. *Mean term.*  ``mean_i = sum_h sum_j p^h_ij M_h^T e_j``.  Per head (Jensen) ``L_h kappa_h^(1/2)``; per group, the
       heads of group g share ``u_j = V_g^T e_j``: ``||sum_{h in g} sum_j p^h_ij W_O^hT u_j|| <= ||W_O^g|| (sum_{h in g}
       sum_j p^h_ij ||u_j||^2)^(1/2)`` (``W_O^g`` the rows of ``W_O`` that read the group), so the group adds at most
       ``||W_O^g|| ||Pi V_g|| (sum_{h in g} kappa_h)^(1/2)``; the smaller per group is used.
    4. *Sum* by Minkowski over tokens, and row by row as step 5 of :mod:`.layer` with ``W`` the mean part of a row
       (``min(sum_h L_h, sum_g ||W_O^g|| ||Pi V_g|| |g|^(1/2))``) plus the key part.  With one key per row the map is
       linear: ``||(sum_h M_h)^T Pi||``.
    5. *Query and key parts split row by row* (step 6 of :mod:`.rotary`): row i's key part is at most
       ``r Lambda'^(1/2) (c_i sum_{j in V_i} ||e_j||^2)^(1/2)`` with ``c_i`` the smaller of its largest weight
       ``max_h pbar^h_i`` and ``max_h 2 max p (1 - p)`` (step 2's two forms, each a bound of the row), its query
       part at most ``b ||e_i||``; so ``Lip(F) <= max_j [(1 + t_j) b_j^2 + r^2 Lambda' sum_{i: j in V_i} (1 + 1/t_i)
       c_i]^(1/2) + mean``.
    6. *Own keys* (step 8 of :mod:`.rotary`): step 5 with the query term from the heads' own-key gains ``a'_h``
       and the key parts without the diagonal, when smaller.
    7. *The key term by columns* (this module's docstring): step 5 under the spectral condition's weights with key j
       charged ``r^2 Lambda' r^2 lambda_max(sum_{i sees j} (1 + 1/t_i) c_i Phi_{j-i})``, when smaller.
    8. *The query term on the shared tangent* (no centre, no key bias).  Every head's query part of row i reads the
       same ``e_i``: ``zeta^h_j = e_i . Pi A^h_{Delta_ij} M w_j`` (a soft-cap's factor in (0, 1] only shrinks it), so
       ``Var zeta^h <= max_j (zeta^h_j)^2 <= r^2 e_i^T Pi W_Q^h Kbar_h W_Q^hT Pi e_i`` for any ``Kbar_h >= R_Delta
       G_h R_Delta^T`` at every offset of the rows (``G_h = sigma^2 W_K^T M M^T W_K``; :func:`dominating_key_form`).
       Cauchy-Schwarz over heads as in step 1 with ``sum_h Var zeta^h / lambda_h <= r^2 lambda_max(sum_h Pi W_Q^h
       Kbar_h W_Q^hT Pi / lambda_h) ||e_i||^2`` gives ``||sum_h S^h_i|| <= r Lambda^(1/2) ||e_i||`` for weights with
       ``r^2 lambda_max(...) <= 1`` (checked in interval arithmetic): one eigenvalue over the heads' query directions
       in place of step 1's ``sum_h a_h^2 / lambda_h``, each head's worst tangent taken apart.  Used as step 1's
       query term when smaller.
    9. *Query and key charges of a column in one eigenvalue* (:mod:`.rotary_joined`; when step 8's query term is the
       one used and step 7 applies): ``||S_i||^2 <= b^2 e_i^T (r^2 Q) e_i`` by step 8 and ``||cov_i||^2 <= r^2 Lambda'
       c_i sum_{j in V_i} e_j^T (r^2 Phi_{j-i}) e_j`` by step 7, so step 5's split gives ``Lip(S + cov)^2 <= max_j
       lambda_max((1 + t_j) b^2 r^2 Q + r^2 Lambda' sum_{i sees j} (1 + 1/t_i) c_i r^2 Phi_{j-i})``: one eigenvalue per
       key column in place of the sum of the two parts' own, when smaller.
    """
    started = time.perf_counter()
    if layer.residual:
        raise AssumptionError("layer.residual", "False (the attention map without X)", "True",
                              "bound the layer without the residual and add 1")
    region = Region.of(domain, None, layer.d)
    blocks = [Enclosure.exact(layer.output_block(h)) for h in range(layer.num_heads)]
    if heads is None:
        heads = [PositionalHeadBounds(head, region, n, output=layer.output_block(h))
                 for h, head in enumerate(layer.heads)]
    certificate: dict = {"n": n, "heads": len(heads)}
    failed = next((hb.failure for hb in heads if not hb.certified), None)
    if failed is not None:
        return sdp_value(name, math.nan, False, certificate, "eig", time.perf_counter() - started, "not certified",
                         _LAYER_PROVENANCE, reason=f"a head: {failed.name}: {failed.reason}")
    rows = heads[0].rows
    r = region.r
    several = bool(np.any(rows.key_counts >= 2))
    # the heads' outputs seen through the region's shape: N_h = W_O^hT (V_h^T M M^T V_h) W_O^h
    value_forms = []
    for head in layer.heads:
        shaped = region.times_shape(Enclosure.exact(head.W_V.T))
        value_forms.append((shaped @ shaped.T).sym())
    groups = [layer.group_heads(g) for g in range(layer.num_groups)]
    # 3. mean term
    kappas = [rows.column_sum([IV.mpf(upper(hb.weight_range(i)[1])) for i in range(rows.n)]) for hb in heads]
    if not several:
        values = Enclosure.exact(np.concatenate([head.W_V for head in layer.heads], axis=1))   # [V_1 .. V_H]
        mean = product_norm_interval(region.project(values), Enclosure.exact(layer.W_O))       # ||(sum_h M_h)^T Pi||
        row_mean = mean
    else:
        mean, row_mean = IV.mpf(0), IV.mpf(0)
        for members in groups:
            per_head = sum((hb.value_norm * IV.sqrt(kappas[h]) for h, hb in
                            ((h, heads[h]) for h in members)), IV.mpf(0))
            start = sum(layer.heads[h].d_v for h in range(members[0]))
            stop = start + sum(layer.heads[h].d_v for h in members)
            shared = Enclosure.exact(layer.W_O[start:stop]).norm_interval() * region.project(
                Enclosure.exact(layer.heads[members[0]].W_V)).norm_interval()
            grouped = shared * IV.sqrt(sum((kappas[h] for h in members), IV.mpf(0)))
            mean += min(per_head, grouped, key=upper)
            row_mean += min(sum((heads[h].value_norm for h in members), IV.mpf(0)),
                            shared * IV.sqrt(IV.mpf(len(members))), key=upper)
    certificate["mean"] = upper(mean)
    b = k = key_row = IV.mpf(0)
    if several:
        # 1. query term
        summed = sum((hb.query_term for hb in heads), IV.mpf(0))
        joint, _ = _joint_term(blocks, value_forms, [], [IV.mpf(hb.query_gain.value) for hb in heads],
                               interval(0), "query term")
        b = summed if joint is None or upper(summed) <= upper(r * joint) else r * joint
        shared, shared_info = _shared_query_term(heads, blocks, value_forms, r)
        shared_form = shared_info.pop("form", None)
        b = shared if shared is not None and upper(shared) < upper(b) else b
        certificate.update(query_summed=upper(summed), query_joint=None if joint is None else upper(r * joint),
                           query_shared=None if shared is None else upper(shared))
        # 2. key term
        kappa_max = rows.column_sum([IV.mpf(max(upper(hb.weight_range(i)[1]) for hb in heads)) for i in range(rows.n)])
        largest = [max((hb.row_nu(i, with_cap=False) for hb in heads), key=upper) for i in range(rows.n)]
        spread = rows.column_sum(largest)
        column = kappa_max if upper(kappa_max) <= upper(spread) else spread
        plain, plain_info = _joint_term(blocks, value_forms, [], [IV.mpf(hb.key_gain.value) for hb in heads],
                                        interval(0), "key term")
        spectral, spectral_info = (None, {})
        if region.center is not None and not np.any(region.center) and not any(np.any(h.b_Q) for h in layer.heads):
            start = np.array(plain_info.get("weights", [1.0] * len(heads)))
            spectral, spectral_info = _spectral_key_term(layer, region, heads, blocks, value_forms, start)
        key_columns = spectral_info.pop("columns", None)
        options = [t for t in (plain, spectral) if t is not None]
        if not options:
            return sdp_value(name, math.nan, False, certificate, "eig", time.perf_counter() - started,
                             "not certified", _LAYER_PROVENANCE, reason="no weights certified for the key term")
        joint_key = min(options, key=upper)
        k = r * joint_key * IV.sqrt(column)
        key_row = r * joint_key * IV.sqrt(max(largest, key=upper))      # step 5 of sdp.layer: c = 2 max p (1 - p)
        certificate.update(query=upper(b), key=upper(k), key_column=upper(column), key_weights=plain_info,
                           key_plain=None if plain is None else upper(r * plain * IV.sqrt(column)),
                           key_spectral=None if spectral is None else upper(r * spectral * IV.sqrt(column)),
                           key_spectral_weights=spectral_info)
    total_iv = b + mean + k
    certificate["minkowski"] = upper(total_iv)
    cap = max((hb.row_nu(i, with_cap=False) for hb in heads for i in range(rows.n)), key=upper)
    if several and upper(cap) > 0:
        total_iv = _smaller_by_rows(total_iv, b, n, cap, row_mean + key_row, certificate, "row_form")
    if several:
        # step 5 of this docstring: each row's key part with the smaller of its two coefficients (largest weight, or
        # 2 max p (1 - p))
        has_query = rows.key_counts >= 2
        coefficients = [min(IV.mpf(max(upper(hb.weight_range(i)[1]) for hb in heads)), largest[i], key=upper)
                        for i in range(rows.n)]
        coupled = split_layer(b, (r * joint_key) ** 2, coefficients, rows.visible, has_query) + mean
        certificate["coupled_rows"] = upper(coupled)
        total_iv = coupled if upper(coupled) < upper(total_iv) else total_iv
        merged = _own_key_layer(heads, blocks, value_forms, r, (r * joint_key) ** 2, coefficients, has_query)
        if merged is not None:
            merged = merged + mean
            certificate["own_key_rows"] = upper(merged)
            total_iv = merged if upper(merged) < upper(total_iv) else total_iv
        if key_columns is not None:
            # step 7: each key charged through the offsets of the rows that read it (the spectral weights only)
            columns = split_layer(b, (r * spectral) ** 2, coefficients, rows.visible, has_query,
                                  columns=key_columns) + mean
            certificate["key_columns_rows"] = upper(columns)
            total_iv = columns if upper(columns) < upper(total_iv) else total_iv
            if shared_form is not None and b is shared:
                # step 9: the query term on the shared tangent and the key charges of each column in one eigenvalue
                t = layer_splits(b, (r * spectral) ** 2, coefficients, rows.visible, has_query, columns=key_columns)
                joined = JoinedColumns(shared_form, key_columns.forms()).bound(
                    b, (r * spectral) ** 2, coefficients, rows.visible, has_query, t)
                if joined is not None:
                    joined = joined + mean
                    certificate["joined_columns_rows"] = upper(joined)
                    total_iv = joined if upper(joined) < upper(total_iv) else total_iv
    return sdp_value(name, upper(total_iv), True, certificate, "eig", time.perf_counter() - started, "certified",
                     _LAYER_PROVENANCE)
