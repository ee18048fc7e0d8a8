r"""A certified constant of a whole multi-head layer that sees its heads jointly with ``W_O``.

The layer is ``F = sum_h f^h W_O^h``: head h with the value map ``M_h = V_h W_O^h`` (d, d_out).
Keys lie in ``D = {c + M w : ||w|| <= r}``, queries in ``D_Q`` (the same for self-attention), and
``Pi``, ``Pi_Q`` project onto the directions they move in (:class:`~.region.Region`).  With
``N_h = M_h^T M M^T M_h`` (d_out, d_out), per query i (docs/mathematics.md, "whole layers"):

    DF_i[E] = Q_i + mean_i + key_i,
    Q_i    = sum_h M_h^T Sigma^h_i A_h^T e^Q_i,                 Sigma^h_i = Cov_{p^h_i}(x_j) = M C^h_i M^T,
    mean_i = sum_h sum_j p^h_ij M_h^T e_j,
    key_i  = sum_h Cov_{p^h_i}(M_h^T x_j, g^h_i . e_j),          g^h_i = A_h^T x_i + u_h.

1. *Query term.*  ``y^T Q_i = sum_h t_h^T C^h_i q_h`` with ``t_h = M^T M_h y``, ``q_h = M^T A_h^T Pi_Q e``.  For
   ``C >= 0``, ``t^T C q = tr(C (q t^T + t q^T) / 2) <= tr C (||t|| ||q|| + t . q) / 2`` (the largest
   eigenvalue of the symmetric rank-two matrix), and ``tr C^h_i <= r^2``, so ``y^T Q_i <= r^2 (sum_h ||t_h||
   ||q_h|| + y^T X e) / 2`` with ``X = sum_h M_h^T M M^T A_h^T Pi_Q`` (d_out, d).  For weights ``lambda_h > 0``
   with ``lambda_max(sum_h Pi_Q A_h M M^T A_h^T Pi_Q / lambda_h) <= 1``, Cauchy-Schwarz gives ``sum_h ||t_h||
   ||q_h|| <= Lambda(alpha)^(1/2) ||e||``, ``Lambda(alpha) = lambda_max(sum_h lambda_h N_h)``, hence ``||Q_i|| <=
   r^2 (Lambda(alpha)^(1/2) + ||X||) / 2 ||e_i||``.  Where the heads' query and value directions are nearly
   orthogonal, ``||X||`` is small and this is about half of ``r^2 Lambda(alpha)^(1/2)``.  Also ``||Q_i|| <= r^2
   sum_h gamma_h ||e_i||`` (the per-head joint gains); the smaller is used.
2. *Key term.*  ``y^T key_i = sum_j e_j^T sum_h c^h_ij Pi g^h_i`` with ``c^h_ij = p^h_ij delta^h_ij``, ``delta^h_ij
   = y^T M_h^T (x_j - xbar^h_i)``.  For weights such that the matrix with columns ``Pi g^h(x) / lambda_h^(1/2)`` has
   norm at most 1 for every query ``x in D_Q``: ``||sum_h c_h Pi g^h|| <= (sum_h lambda_h c_h^2)^(1/2)``.  With ``x
   = c_Q + M_Q w``, ``Pi g^h(x) = F_h w + k_h`` (``k_h = Pi (A_h^T c_Q + u_h)``), and ``F_h w + k_h = [F_h,
   sigma^(1/2) k_h] (w; sigma^(-1/2))``, so the condition holds when ``(r_Q^2 + 1 / sigma) lambda_max(sum_h (F_h
   F_h^T + sigma k_h k_h^T) / lambda_h) <= 1`` for some ``sigma > 0`` (at the best sigma never weaker than ``r_Q
   ||[F_h / lambda_h^(1/2)]|| + ||[k_h / lambda_h^(1/2)]||``, which is also tried), or when ``sum_h beta_h^2 /
   lambda_h <= 1``, ``beta_h = sup_{x in D_Q} ||Pi g^h(x)||``.  With ``w_ij = max_h p^h_ij`` (so ``p^h_ij / w_ij <=
   1``), Cauchy-Schwarz over j gives ``y^T key_i <= (sum_j w_ij ||e_j||^2)^(1/2) (sum_h lambda_h Var_{p^h_i}(y^T
   M_h^T x))^(1/2)`` and ``Var <= r^2 ||M^T M_h y||^2``: ``||key_i|| <= r Lambda(beta)^(1/2) (sum_j w_ij
   ||e_j||^2)^(1/2)``.  Summing over i, ``||key||_F <= r Lambda(beta)^(1/2) kappa_max^(1/2) ||E_X||``, ``kappa_max =
   sum_i max_h pbar^h_i`` the column sums of the largest weights, ``pbar^h_i = 1 / (1 + (N_i - 1) e^{-omega_h})``
   (``N_i`` keys in row i, ``omega_h`` the head's score spread).  *Covariance form.*  Since ``sum_j p^h_ij
   delta^h_ij = 0``, ``y^T key_i = sum_h Cov_{p^h_i}(zeta_h, delta^h)`` with ``zeta_jh = Pi g^h_i . e_j``, at most
   ``sum_h Var(zeta_h)^(1/2) Var(delta^h)^(1/2) <= (sum_h Var(zeta_h) / lambda_h)^(1/2) (sum_h lambda_h
   Var(delta^h))^(1/2)``; ``Var_p(zeta) <= 2 sum_j p_j (1 - p_j) zeta_j^2`` and ``sum_h zeta_jh^2 / lambda_h <=
   ||e_j||^2`` under either condition on the weights, so ``||key_i||^2 <= r^2 Lambda 2 sum_j q_ij ||e_j||^2`` with
   ``q_ij = max_h p^h_ij (1 - p^h_ij) <= 1/4``: the column sums ``kappa_max`` may be replaced by ``2 sum_i max_h max
   p (1 - p)`` over the rows' weight ranges (at most n / 2); the smaller is used.
3. *Mean term.*  Per head (Jensen): ``||mean^h||_F <= L_h kappa_h^(1/2) ||E_X||``, ``L_h = ||Pi M_h||``;
   at n = 1 every weight is 1 and ``mean_i = (sum_h M_h)^T e_i``: ``||(sum_h M_h)^T Pi||`` exactly.
4. *Sum.*  Minkowski over tokens: self-attention ``Lip(F) <= b + m + k``; cross-attention in the
   queries ``b``, in the context ``m + k``, jointly ``(b^2 + (m + k)^2)^(1/2)`` (Cauchy-Schwarz on
   ``||E_Q||^2 + ||E_X||^2 = 1``).  Rows with a single key have ``Sigma = 0`` and no key term.
5. *Row by row* (self-attention).  Row i has ``||DF_i[E]|| <= b eps_i + ||mean_i|| + ||key_i||``.  Per head
   ``||sum_j p^h_ij M_h^T e_j|| <= L_h max_j eps_j``.  In step 2's covariance form ``sum_h Var(zeta_h) /
   lambda_h <= sum_j nu_ij eps_j^2`` with ``nu_ij = sum_h pi_h 2 p^h_ij (1 - p^h_ij)``, ``pi_h = ||Pi g^h_i||^2 /
   lambda_h`` summing to at most 1; so ``nu_ij <= c = 2 max_h max p (1 - p)`` and ``sum_j nu_ij <= 2 (1 - 1/n)``.
   This is the row of the one-head relaxation's step 9 (:mod:`.head`) with ``L = sum_h L_h`` and ``rho beta =
   r Lambda(beta)^(1/2)``: ``Lip(F)^2 <= b^2 + (alpha + (alpha^2 + beta'^2)^(1/2)) / 2``, ``alpha = n W^2 + 2 b W
   K^(1/2)``, ``beta' = 2 b W (n - K)^(1/2)``, ``W = sum_h L_h + r (Lambda c)^(1/2)``, ``K = ceil(2 (1 - 1/n) / c)``;
   the smaller of this and step 4 is reported.

6. *Query and key parts split row by row* (self-attention; the same step for one rotary head is step 6 of
   :mod:`.rotary`).  Row i's query part depends on ``e_i`` alone (0 for a row with one key), its key part squared is
   at most ``r^2 Lambda c_i sum_{j in V_i} ||e_j||^2``, ``c_i`` the smaller of the row's largest weight ``max_h
   pbar^h_i`` and ``max_h 2 max p (1 - p)`` (step 2's two forms, each a bound of the row).  With ``(x + y)^2 <= (1 +
   t_i) x^2 + (1 + 1/t_i) y^2`` per row and the sums exchanged, ``||Q + key||_F^2 <= max_j [(1 + t_j) b_j^2 + r^2
   Lambda sum_{i: j in V_i} (1 + 1/t_i) c_i] ||E||^2`` for any ``t_i > 0`` (``b_j = b`` for a row with two keys or
   more), and the mean term adds by Minkowski.  Equal rows and columns (no mask) give back ``b + k``; under a causal
   mask key 0 is read by every row and row 0 has no query part, and the smaller value is reported.

The weights only steer: any weights whose condition holds in interval arithmetic give a certified bound,
with ``lambda_max`` bounded rigorously; they are found by gradient descent on ``log lambda``
(:func:`stacked_weights`).  When the heads' outputs ``N_h`` are orthogonal and their key gradients too,
``Lambda`` is the largest head's; when the key gradients share a direction, the l2 combination
``sum_h beta_h^2 ||N_h||``; when everything coincides, the triangle inequality.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ...errors import AssumptionError
from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, is_psd_certified, lambda_max_upper, spectral_norm_upper
from ...rigorous.value import CertifiedValue
from ..blas import one_blas_thread
from ..model import Layer
from .head import HeadBounds, largest_over_shares, top_count
from .joint import _golden_min, sdp_value
from .region import Region, key_gradient

__all__ = ["coupled_rows", "layer_joint_bound", "layer_head_bounds", "row_factors", "split_layer", "split_rows",
           "stacked_weights"]

_PROVENANCE = ("whole layer, heads seen jointly with W_O: per-token weighted Cauchy-Schwarz over heads "
               "(lipbound.numeric.sdp.layer, module docstring)")


def _top(factors: list[np.ndarray], weights: np.ndarray, start: np.ndarray | None = None):
    """``(lambda_max, v)`` of ``sum_h weights_h Z_h Z_h^T`` (factors Z_h (p, k_h)), by Lanczos."""
    from scipy.sparse.linalg import LinearOperator, eigsh
    size = factors[0].shape[0]

    def apply(x):
        x = np.asarray(x).reshape(-1)
        return sum(w * (Z @ (Z.T @ x)) for w, Z in zip(weights, factors))

    operator = LinearOperator((size, size), matvec=apply, dtype=float)
    if start is None:   # ARPACK's own random start depends on the calls the process made before
        start = np.random.default_rng(0).standard_normal(size)
    try:
        values, vectors = eigsh(operator, k=1, which="LA", v0=start, tol=1e-8, maxiter=5000)
        return float(values[0]), vectors[:, 0]
    except Exception:            # no convergence: a dense eigendecomposition
        dense = sum(w * (Z @ Z.T) for w, Z in zip(weights, factors))
        values, vectors = np.linalg.eigh(0.5 * (dense + dense.T))
        return float(values[-1]), vectors[:, -1]


def stacked_weights(outputs: list[np.ndarray], inputs: list[np.ndarray], offsets: np.ndarray, radius: float,
                    iterations: int = 40) -> np.ndarray:
    """Weights ``lambda_h`` that (nearly) minimise ``lambda_max(sum_h lambda_h T_h T_h^T) C(lambda)^2`` with
    ``C(lambda) = r lambda_max(sum_h Z_h Z_h^T / lambda_h)^(1/2) + (sum_h k_h^2 / lambda_h)^(1/2)`` (both are
    homogeneous, so the weights are then scaled to ``C = 1``): gradient descent in ``log lambda``.
    Floats; only the certificate built from them counts."""
    H = len(outputs)
    log_w = np.zeros(H)
    best, best_w = math.inf, np.ones(H)
    v = z = None
    step = 0.5
    for _ in range(iterations):
        w = np.exp(log_w)
        top_out, v = _top(outputs, w, v)
        top_in, z = _top(inputs, 1 / w, z) if radius > 0 else (0.0, None)
        spread = float(np.sum(offsets ** 2 / w))
        C = radius * math.sqrt(max(top_in, 0.0)) + math.sqrt(spread)
        value = top_out * C * C
        if value < best:
            best, best_w = value, w.copy()
        else:
            step *= 0.6
        grad_out = w * np.array([np.sum((T.T @ v) ** 2) for T in outputs]) / max(top_out, 1e-300)
        grad_in = -(radius / (2 * math.sqrt(max(top_in, 1e-300)))) * np.array(
            [np.sum((Z.T @ z) ** 2) for Z in inputs]) / w if radius > 0 else np.zeros(H)
        grad_spread = -(offsets ** 2 / w) / (2 * math.sqrt(max(spread, 1e-300))) if spread > 0 else np.zeros(H)
        gradient = grad_out + 2 * (grad_in + grad_spread) / max(C, 1e-300)
        log_w = np.log(best_w) - step * gradient / max(np.max(np.abs(gradient)), 1e-12)
    w = best_w
    top_in = _top(inputs, 1 / w, None)[0] if radius > 0 else 0.0
    C = radius * math.sqrt(max(top_in, 0.0)) + math.sqrt(float(np.sum(offsets ** 2 / w)))
    return w * C * C


def _factor(gram: np.ndarray) -> np.ndarray:
    """``L`` with ``L L^T = gram`` (PSD, float; a search aid only)."""
    values, vectors = np.linalg.eigh(0.5 * (gram + gram.T))
    return vectors * np.sqrt(np.maximum(values, 0.0))


def ridged_root(gram: np.ndarray) -> np.ndarray:
    """The Cholesky factor of ``gram + 1e-12 trace(gram) I`` (float, positive semidefinite ``gram``): the root through
    which the rotary relaxations steer their factors in floats (a search aid only)."""
    return np.linalg.cholesky(gram + 1e-12 * np.trace(gram) * np.eye(gram.shape[0]))


def gram_factor(gram: Enclosure) -> np.ndarray | None:
    """A float lower-triangular L with ``L L^T >= gram`` certified (a Cholesky factor of the midpoint lifted by a
    small ridge, raised until the check passes), or None."""
    size = gram.shape[0]
    ridge = 1e-12 * max(float(np.trace(gram.mid)), 1e-300) + float(np.max(gram.rad, initial=0.0))
    for _attempt in range(6):
        try:
            L = np.linalg.cholesky(gram.mid + ridge * np.eye(size))
        except np.linalg.LinAlgError:
            L = None
        if L is not None and is_psd_certified((Enclosure.exact(L) @ Enclosure.exact(L.T)).sym() - gram):
            return L
        ridge *= 100
    return None


def _stacked_form(terms: list[list[tuple[Enclosure, Enclosure]]], weights) -> Enclosure:
    """``sum_h weights_h sum_k B_hk S_hk B_hk^T`` as an enclosure (per head, pairs ``B`` (p, k), ``S`` (k, k); a
    weight a float or an interval)."""
    total = None
    for pairs, w in zip(terms, weights):
        for B, S in pairs:
            term = B @ S.scale(w) @ B.T
            total = term if total is None else total + term
    return total.sym()


def _float_factors(terms) -> list[np.ndarray]:
    """Per head ``Z_h`` with ``Z_h Z_h^T = sum_k B_hk S_hk B_hk^T`` (floats, a search aid)."""
    return [np.hstack([B.mid @ _factor(S.mid) for B, S in pairs]) for pairs in terms]


def _joint_term(outputs, output_middles, inputs, offsets, radius, name, weights=None):
    """Certified ``sqrt(lambda_max(sum_h lambda_h N_h))`` for weights with ``C(lambda) <= 1`` (checked in
    interval arithmetic), ``N_h = O_h^T S_h O_h``, ``C`` as in :func:`stacked_weights` with the input Gram
    ``P_h = sum_k B_hk S_hk B_hk^T`` (``inputs``: per head its pairs); returns ``(value, info)``."""
    offsets_up = np.array([upper(x) for x in offsets]) if offsets is not None else np.zeros(len(outputs))
    if weights is None:
        weights = stacked_weights([O.mid.T @ _factor(S.mid) for O, S in zip(outputs, output_middles)],
                                  _float_factors(inputs), offsets_up, float(upper(radius)) if inputs else 0.0)
    for inflate in (1e-9, 1e-6, 1e-3, 1e-1):
        lam = weights * (1 + inflate)
        # (the reciprocals enclosed: a weight rounded below 1 / lambda_h would shrink the constraint)
        top_in = lambda_max_upper(_stacked_form(inputs, [1 / interval(float(w)) for w in lam])) if inputs else 0.0
        constraint = (radius * IV.sqrt(IV.mpf(max(top_in, 0.0)))
                      + IV.sqrt(sum((IV.mpf(k) ** 2 / IV.mpf(w) for k, w in zip(offsets_up, lam)), IV.mpf(0))))
        if upper(constraint) <= 1.0:
            break
    else:
        return None, {"failed": f"{name}: the weights' constraint was not certified"}
    top = max(lambda_max_upper(_stacked_form([[(O.T, S)] for O, S in zip(outputs, output_middles)], lam)), 0.0)
    return IV.sqrt(IV.mpf(top)), {"weights": [float(w) for w in lam], "constraint": upper(constraint)}


def _key_term(outputs, output_middles, grams, shifts, radius, name):
    """The key term's joint value with the query offsets ``k_h`` inside the condition (step 2): the columns
    ``F_h w + k_h = [F_h, k_h sigma^(1/2)] (w; sigma^(-1/2))`` with ``||(w; sigma^(-1/2))|| <= (r^2 + 1 /
    sigma)^(1/2)``, so ``C = (r^2 + 1 / sigma)^(1/2) lambda_max(sum_h (F_h F_h^T + sigma k_h k_h^T) /
    lambda_h)^(1/2)``, never above the triangle form ``r ||F|| + ||K||`` at the best sigma.  The triangle form
    and a few ``sigma`` about ``||F|| / (r ||K||)`` are compared in floats; the best is certified."""
    float_out = [O.mid.T @ _factor(S.mid) for O, S in zip(outputs, output_middles)]
    float_in = _float_factors(grams)
    offsets = [IV.sqrt(IV.mpf(max(upper((k.T @ k).interval()), 0.0))) for k in shifts]
    r = float(upper(radius))
    weights = stacked_weights(float_out, float_in, np.array([upper(x) for x in offsets]), r)
    best = (_top(float_out, weights)[0], grams, offsets, radius, weights, None)
    K = np.hstack([k.mid for k in shifts])
    gain = math.sqrt(max(_top(float_in, np.ones(len(grams)))[0], 0.0))
    if gain > 0 and np.linalg.norm(K, 2) > 0:
        middle = r * np.linalg.norm(K, 2) / gain                          # tau^2 of the aligned case
        for factor in (0.12, 0.25, 0.5, 1.0):
            sigma = 1.0 / (factor * middle)
            widened = [np.hstack([Z, math.sqrt(sigma) * k.mid]) for Z, k in zip(float_in, shifts)]
            weights = stacked_weights(float_out, widened, np.zeros(len(grams)), math.sqrt(r * r + 1 / sigma))
            value = _top(float_out, weights)[0]
            if value < best[0]:
                pairs = [list(g) + [(k, Enclosure.exact(np.array([[sigma]])))] for g, k in zip(grams, shifts)]
                best = (value, pairs, None, IV.sqrt(radius ** 2 + 1 / IV.mpf(sigma)), weights, sigma)
    _, inputs, offsets, widened_radius, weights, sigma = best
    value, info = _joint_term(outputs, output_middles, inputs, offsets, widened_radius, name, weights=weights)
    info["offset_scale"] = sigma
    return value, info


def split_rows(query: np.ndarray, proxy: np.ndarray, sweeps: int = 4) -> np.ndarray:
    """Per-row splits ``t_i > 0`` that (nearly) minimise ``max_j [(1 + t_j) query_j + sum_i (1 + 1/t_i) proxy_ij]``
    (step 6), by golden sections on each ``log t_i`` in turn from the uniform optimum.
    Floats: any ``t > 0`` gives a bound, these only make it small."""
    n = len(query)
    factor = np.asarray(proxy, dtype=float)

    def value(t):
        return float(np.max((1 + t) * query + (1 + 1 / t) @ factor))

    key = max(float(np.max(factor.sum(axis=0))), 1e-300)
    t = np.full(n, math.sqrt(key / max(float(np.max(query)), 1e-300)))
    for _ in range(sweeps):
        for i in range(n):
            if query[i] == 0 and not np.any(factor[i]):
                continue
            trial = t.copy()

            def at(log_t, i=i, trial=trial):
                trial[i] = math.exp(log_t)
                return value(trial)

            before = value(t)
            best = math.exp(_golden_min(at, math.log(t[i]) - 6.0, math.log(t[i]) + 6.0, iterations=30))
            trial[i] = best
            if value(trial) <= before:
                t = trial
    return t


def coupled_rows(b, has_query: np.ndarray, t: np.ndarray, key_columns) -> object:
    """``(max_j [(1 + t_j) b_j^2 + c_j])^(1/2)`` in interval arithmetic (step 6): ``b_j = b`` for a row with a query
    term, else 0; ``key_columns`` the certified ``c_j`` for the row factors
    :func:`row_factors` of ``t``."""
    largest = max(((1 + interval(float(t[j]))) * b ** 2 * (1 if has_query[j] else 0) + key_columns[j]
                   for j in range(len(t))), key=upper)
    return IV.sqrt(largest)


def row_factors(t: np.ndarray) -> np.ndarray:
    """``1 + 1 / t_i`` rounded up (the key part's weight of each row)."""
    return np.array([upper(1 + 1 / interval(float(x))) for x in t])


def layer_splits(b, key2, coefficients: list, visible: np.ndarray, has_query: np.ndarray, columns=None) -> np.ndarray:
    """The splits ``t_i`` of :func:`split_layer` (floats): step 5's scalar split with row i's key charge per key
    ``key2 c_i`` (times ``columns.shares`` of the offset with ``columns``)."""
    n = len(coefficients)
    has_query = np.asarray(has_query, dtype=bool)
    scale = [key2 * (coefficients[i] if has_query[i] else IV.mpf(0)) for i in range(n)]
    share = (lambda offset: 1.0) if columns is None else (lambda offset: columns.shares[offset])
    proxy = np.array([[float(upper(scale[i])) * share(j - i) if visible[i, j] else 0.0 for j in range(n)]
                      for i in range(n)])
    return split_rows(np.where(has_query, float(upper(b ** 2)), 0.0), proxy)


def split_layer(b, key2, coefficients: list, visible: np.ndarray, has_query: np.ndarray, columns=None):
    """``Lip(S + key)`` of a layer with its rows' query and key parts split (step 6): row i's query part at most ``b
    ||e_i||`` (when ``has_query[i]``), its key part squared at most ``key2 c_i sum_{j in V_i} ||e_j||^2`` (``c_i``
    from ``coefficients``, intervals; ``V_i`` the row of ``visible``); an interval.

    ``columns``, optional, charges each key through the offsets at which the rows read it (step 7 of
    :func:`lipbound.numeric.sdp.rotary_layer.positional_layer_bound`): an object with ``shares`` (offset ->
    float estimate of ``r^2 lambda_max(Phi_Delta)``, which steers the split) and ``column(weights)`` (``{offset:
    f}`` -> a certified upper bound on ``r^2 lambda_max(sum_Delta f_Delta Phi_Delta)``, or None); key j is then
    charged ``key2`` times the smaller of that and ``sum_i f_i``, ``f_i = c_i (1 + 1/t_i)``."""
    n = len(coefficients)
    has_query = np.asarray(has_query, dtype=bool)
    t = layer_splits(b, key2, coefficients, visible, has_query, columns)
    factors = row_factors(t)
    out = []
    for j in range(n):
        seen = [i for i in range(n) if visible[i, j] and has_query[i]]
        weights = {i: coefficients[i] * interval(float(factors[i])) for i in seen}
        plain = sum(weights.values(), IV.mpf(0))
        if columns is not None and seen:
            charged = columns.column({j - i: float(upper(w)) for i, w in weights.items()})
            if charged is not None and charged < upper(plain):
                plain = interval(charged)
        out.append(key2 * plain)
    return coupled_rows(b, has_query, t, out)


def layer_head_bounds(layer: Layer, domain, query_domain=None, solver: str = "eig") -> list[HeadBounds]:
    """The constants of every head ``f^h W_O^h`` of a layer (value maps ``W_V^h W_O^h``) on the keys'
    region ``domain`` (and the queries' ``query_domain`` for cross-attention)."""
    return [HeadBounds(h, domain, query_radius=query_domain, solver=solver,
                       value=Enclosure.exact(h.W_V) @ Enclosure.exact(layer.output_block(i)))
            for i, h in enumerate(layer.heads)]


@one_blas_thread
def layer_joint_bound(layer: Layer, domain, *, n: int, role: str = "self", m: int | None = None,
                      query_domain=None, solver: str = "eig", heads: list[HeadBounds] | None = None) -> CertifiedValue:
    """Certified Frobenius Lipschitz constant of the multi-head layer ``sum_h f^h W_O^h`` (no residual),
    heads seen jointly (module docstring).

    Parameters
    ----------
    layer : Layer
        Dot-product heads and ``W_O``.
    domain, query_domain :
        The keys' (context) and queries' regions: TokenDomain, Region, or a ball's radius.
    n, m : int
        Keys (context tokens) and queries (cross-attention).
    role : {"self", "cross-queries", "cross-context", "cross-joint"}
    solver : str
        For the per-head joint gains (:class:`HeadBounds`).
    heads : list of HeadBounds, optional
        Per-head constants with the value maps ``V_h W_O^h`` (computed when absent).
    """
    started = time.perf_counter()
    if layer.residual:
        raise AssumptionError("layer.residual", "False (the attention map without X)", "True",
                              "bound the layer without the residual and add 1")
    cross = role != "self"
    if role not in ("self", "cross-queries", "cross-context", "cross-joint"):
        raise AssumptionError("role", "self, cross-queries, cross-context or cross-joint", repr(role),
                              "choose the argument of the constant")
    d = layer.d
    keys = Region.of(domain, None, d)
    queries = keys if query_domain is None else Region.of(query_domain, None, d)
    if heads is None:
        heads = layer_head_bounds(layer, keys, queries if cross else None, solver)
    failed = next((piece for hb in heads for piece in (hb.value_norm2, hb.gamma, hb.beta, hb.score_gain)
                   if not piece.certified), None)
    if failed is not None:
        return sdp_value("Lip(layer, joint)", math.nan, False, {}, solver, time.perf_counter() - started,
                         "not certified", _PROVENANCE, reason=f"a head: {failed.name}: {failed.reason}")
    causal = any(h.causal for h in layer.heads) and not cross
    rows = m if cross else n
    key_counts = list(range(1, n + 1)) if causal else [n] * rows
    several = max(key_counts) >= 2
    r = keys.r
    certificate: dict = {"n": n, "m": m, "role": role, "heads": len(heads)}
    # N_h = W_O^h^T (V_h^T M M^T V_h) W_O^h: the heads' outputs, seen through the keys' shape
    blocks = [Enclosure.exact(layer.output_block(i)) for i in range(len(heads))]
    value_forms, value_shapes = [], []
    for h, block in zip(layer.heads, blocks):
        shaped = keys.times_shape(Enclosure.exact(h.W_V.T))            # V_h^T M, (d_v, d)
        value_forms.append((shaped @ shaped.T).sym())
        value_shapes.append(block.T @ shaped)                          # M_h^T M, (d_out, d)
    scales = [Enclosure.scalar(1 / IV.mpf(h.d_k)) for h in layer.heads]
    # 1. query term: P^alpha_h = Pi_Q W_Q^h (W_K^h^T M M^T W_K^h / d_k) W_Q^h^T Pi_Q
    b = IV.mpf(0)
    if several and role != "cross-context":
        grams, aligned = [], None
        for h, s, shape in zip(layer.heads, scales, value_shapes):
            shaped = keys.times_shape(Enclosure.exact(h.W_K.T))
            W_Q = queries.project(Enclosure.exact(h.W_Q))
            grams.append([(W_Q, (shaped @ shaped.T).sym().scale(s))])
            term = (shape @ shaped.T) @ W_Q.T.scale(Enclosure.scalar(1 / IV.sqrt(IV.mpf(h.d_k))))
            aligned = term if aligned is None else aligned + term       # X = sum_h M_h^T M M^T A_h^T Pi_Q
        joint, info = _joint_term(blocks, value_forms, grams, None, interval(1), "query term")
        summed = r ** 2 * sum((IV.mpf(hb.gamma.value) for hb in heads), IV.mpf(0))
        b = summed
        if joint is not None:
            # step 1: y^T Q_i <= r^2 sum_h (||t_h|| ||q_h|| + t_h . q_h) / 2 <= r^2 (Lambda^(1/2) + ||X||) / 2
            halved = r ** 2 * (joint + IV.mpf(spectral_norm_upper(aligned))) / 2
            b = halved if upper(halved) < upper(summed) else summed
            certificate.update(query_joint=upper(r ** 2 * joint), query_halved=upper(halved))
        certificate.update(query_summed=upper(summed), query_weights=info)
    # 2. key term: P^beta_h = Pi W_K^h (W_Q^h^T M_Q M_Q^T W_Q^h / d_k) W_K^h^T Pi, offsets ||Pi (A_h^T c_Q + u_h)||
    k = IV.mpf(0)
    if several and role != "cross-queries":
        kappa_max = sum((IV.mpf(max((upper(hb.weight_range(count)[1]) for hb in heads), default=1.0))
                         for count in key_counts), IV.mpf(0))
        # 2 max_h max p (1 - p) over the weights of a row with that many keys (step 2, covariance form)
        largest = {count: max((hb.nu_max(count, with_cap=False) for hb in heads), key=upper)
                   for count in set(key_counts)}
        spread = sum((largest[count] for count in key_counts), IV.mpf(0))
        pair = max((value for count, value in largest.items() if count >= 2), key=upper, default=IV.mpf(0))
        column = kappa_max if upper(kappa_max) <= upper(spread) else spread
        grams, shifts = [], []
        for h, s in zip(layer.heads, scales):
            shaped = queries.times_shape(Enclosure.exact(h.W_Q.T))
            grams.append([(keys.project(Enclosure.exact(h.W_K)), (shaped @ shaped.T).sym().scale(s))])
            shifts.append(key_gradient(h, queries, keys)[1])               # Pi (A_h^T c_Q + u_h), (d, 1)
        spectral, info = _key_term(blocks, value_forms, grams, shifts, queries.r, "key term")
        plain, plain_info = _joint_term(blocks, value_forms, [], [IV.mpf(hb.beta.value) for hb in heads],
                                        interval(0), "key term (Cauchy-Schwarz)")
        options = [t for t in (spectral, plain) if t is not None]
        if not options:
            return sdp_value("Lip(layer, joint)", math.nan, False, certificate, solver,
                             time.perf_counter() - started, "not certified", _PROVENANCE,
                             reason="no weights certified for the key term")
        best = min(options, key=upper)
        k = r * best * IV.sqrt(column)
        key_row = r * best * IV.sqrt(pair)        # step 5: a row's key part per unit share of its top K moves
        certificate.update(key=upper(k), kappa_max=upper(kappa_max), key_column=upper(column),
                           key_covariance_column=upper(spread), key_weights=info, key_plain_weights=plain_info,
                           key_spectral=None if spectral is None else upper(r * spectral * IV.sqrt(column)),
                           key_plain=None if plain is None else upper(r * plain * IV.sqrt(column)))
    # 3. mean term
    mean = IV.mpf(0)
    if role != "cross-queries":
        if not several:
            total = heads[0].value
            for hb in heads[1:]:
                total = total + hb.value
            # one key per row: every weight is 1, mean_i = (sum_h M_h)^T e_1 for each of the rows
            mean = IV.mpf(spectral_norm_upper(keys.project(total))) * (IV.sqrt(IV.mpf(rows)) if cross else 1)
        else:
            for hb in heads:
                kappa_h = sum((IV.mpf(upper(hb.weight_range(c)[1])) for c in key_counts), IV.mpf(0))
                mean += IV.sqrt(IV.mpf(hb.value_norm2.value) * kappa_h)
        certificate["mean"] = upper(mean)
    certificate["query"] = upper(b)
    if role == "self":
        total_iv = b + mean + k
        if several and upper(pair) > 0:
            # step 5, row by row: ||DF_i|| <= b eps_i + W s^(1/2), W = sum_h L_h + r Lambda^(1/2) c^(1/2)
            W = sum((IV.sqrt(IV.mpf(hb.value_norm2.value)) for hb in heads), IV.mpf(0)) + key_row
            by_rows = largest_over_shares(b, n, top_count(n, pair), n * W ** 2, b * W)
            certificate["row_form"] = upper(by_rows)
            if upper(by_rows) < upper(total_iv):
                total_iv = by_rows
        if several and causal:
            # step 6: the rows' query and key parts split (no gain without a mask: every row and column alike)
            coefficients = [min(IV.mpf(max(upper(hb.weight_range(count)[1]) for hb in heads)), largest[count],
                                key=upper) for count in key_counts]
            visible = np.tril(np.ones((n, n), dtype=bool))
            coupled = split_layer(b, (r * best) ** 2, coefficients, visible, np.array(key_counts) >= 2) + mean
            certificate["coupled_rows"] = upper(coupled)
            if upper(coupled) < upper(total_iv):
                total_iv = coupled
    elif role == "cross-queries":
        total_iv = b
    elif role == "cross-context":
        total_iv = mean + k
    else:
        total_iv = IV.sqrt(b ** 2 + (mean + k) ** 2)
    return sdp_value("Lip(layer, joint)", upper(total_iv), True, certificate, solver, time.perf_counter() - started,
                     "certified", _PROVENANCE)
