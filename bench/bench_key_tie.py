"""What two sharper forms of a rotary head's key term could give, measured in floats before building them.

A rotary head's key term (docs/mathematics.md, section 14, steps 2b and 9 of :mod:`lipbound.numeric.sdp.rotary`)
pays row i's key part ``||cov_i||^2 <= Var_p(alpha) Var_p(z)`` with the values' spread ``Var_p(alpha) <= rho^2`` and the
score changes' spread ``Var_p(z) <= (1/2) sum_j (z_j - zbar)^2``.  Printed per head of the chosen SmolLM2 blocks:

* *The tie between keys* (the lemma "the keys that carry weight tie" of section 14).  For every real lambda,
  ``Cov_p(alpha, z) = Cov_p(alpha - lambda s, z) + lambda Cov_p(s, z)`` with s the row's scores, ``Var_p(s) <= c_N`` for
  ``p = softmax(s)`` over N keys, and ``alpha_j - lambda s_j = (t - lambda m_j) . w_j`` (chart coordinates, ``m_j`` key
  j's score gradient ``M^T A_{j-i}^T M w_i``), so the row's value factor ``rho`` becomes ``F(w_i) = sup_y min_lambda
  (r max_Delta ||t - lambda m_Delta|| + |lambda| c_N^(1/2))``.  Per row i (offsets ``-i .. 0``) the per-row key gain
  ``sup_{w_i} max_Delta ||Pi A_Delta^T M w_i|| F(w_i)`` is printed as a fraction of the plain one ``r rho max_Delta
  ||Pi A_Delta^T M||``, twice: ``low`` evaluates ``min_lambda`` exactly at a few output directions y and ``w_i`` on r
  times the top right singular vectors of ``Pi A_Delta^T M`` and their random mixtures (every step gives a value at or
  below the lemma's supremum, so the lemma cannot remove more than ``1 - low``), ``up`` takes ``lambda = y . l`` with
  ``l`` the regression on the offsets' mean gradient (an estimate of a form that could be certified).
* *Each row's key part by the range of its score changes.*  ``sup_p Var_p(z) = (max_j z_j - min_j z_j)^2 / 4`` exactly,
  so ``(r^2 / 4) max_{a, b} ||c_a - c_b||^2`` (``c_j = M^T A_{j-i} Pi e_j``) is the supremum of ``Var_p(z)`` over the
  row's weights and its query, the smallest charge any bound of the row's key part by ``rho`` can use; step 9's centred
  form ``(r^2 / 2) sum_j ||c_j - cbar||^2`` majorises it.  The centred split's top eigenvalue (step 9's matrix in
  floats, the one factor of the ``t_i`` on a grid) is printed beside a local maximum of the same split with each
  row charged by its largest pair (alternating: the pairs at the move, the top eigenvector of their matrix; eight
  starts), a lower estimate of what a row-wise sharper key form could reach;
  and how the centred split's worst move is shared among the tokens.

Floats throughout: diagnostics, never bounds.  Run: ``python bench/bench_key_tie.py [--layers 0,15,29] [--heads 0,1]
[--n 8] [--samples 16]`` (about 30 CPU s per SmolLM2 head, most of it the split by pairs).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np


def softmax_score_variance(keys: int) -> float:
    """``c_N``: ``Var_p(s) <= c_N`` for ``p = softmax(s)`` over N keys, ``c_N = D (D - 2)`` with ``D > 2`` the root of
    ``D - 2 = 2 (N - 1) e^(-D)`` (docs/mathematics.md, section 14, the lemma "the keys that carry weight tie"); floats
    (bisection, the upper end kept)."""
    if keys < 2:
        return 0.0
    low, high = 2.0, 2.0 + 2.0 * keys
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (low, middle) if middle - 2 >= 2 * (keys - 1) * math.exp(-middle) else (middle, high)
    return high * (high - 2)


def _value_factor(values: np.ndarray, gradients: list[np.ndarray], ys: list[np.ndarray], r: float,
                  root_c: float) -> tuple[float, float]:
    """``(low, up)`` estimates of ``F(w) = sup_y min_lambda (r max_Delta ||V y - lambda m_Delta|| + |lambda| c^(1/2))``
    (``values`` = ``M^T V``, ``gradients`` the row's ``m_Delta``): low at the output directions ``ys`` with lambda
    optimal, up with ``lambda = y . l`` (l the regression on the mean gradient), sup over y; both capped at ``rho``."""
    from scipy.optimize import minimize_scalar

    rho = r * float(np.linalg.norm(values, 2))
    low = 0.0
    for y in ys:
        t = values @ y

        def cost(lam: float, t=t) -> float:
            return r * max(float(np.linalg.norm(t - lam * m)) for m in gradients) + abs(lam) * root_c

        scale = float(np.linalg.norm(t)) / max(min(float(np.linalg.norm(m)) for m in gradients), 1e-300)
        low = max(low, min(cost(0.0), float(minimize_scalar(cost, bounds=(-4 * scale, 4 * scale),
                                                             method="bounded").fun)))
    mean = np.mean(gradients, axis=0)
    regression = values.T @ mean / max(float(mean @ mean), 1e-300)
    up = r * max(float(np.linalg.norm(values - np.outer(m, regression), 2)) for m in gradients)
    up += float(np.linalg.norm(regression)) * root_c
    return min(low, rho), min(up, rho)


def tie_ratios(bounds, rows: list[int], samples: int, seed: int = 0) -> dict[int, tuple[float, float]]:
    """Per row i: ``(low, up)`` of the tied key gain over the plain per-row key gain (module docstring)."""
    rng = np.random.default_rng(seed)
    r = float(bounds.r)
    queries = bounds.queries_shaped.mid                                          # sigma W_Q^T M, (d_k, d)
    keys = bounds.keys_shaped.mid                                                # W_K^T M, (d_k, d)
    values = bounds.region.times_shape(_exact(bounds.head.W_V.T)).mid.T         # M^T V, (d, d_v)
    rho = r * float(np.linalg.norm(values, 2))
    gradient = {delta: bounds.key_left.mid @ R.mid.T @ queries for delta, R in bounds.rotations.items()}  # Pi A^T M
    scores = {delta: keys.T @ R.mid.T @ queries for delta, R in bounds.rotations.items()}                 # M^T A^T M
    top_values = list(np.linalg.svd(values, full_matrices=False)[2][:3])
    out = {}
    for i in rows:
        offsets = list(range(-i, 1))
        root_c = math.sqrt(softmax_score_variance(i + 1))
        plain = r * rho * max(float(np.linalg.norm(gradient[delta], 2)) for delta in offsets)
        low_best = up_best = 0.0
        for delta in offsets:
            right = np.linalg.svd(gradient[delta], full_matrices=False)[2]
            starts = [right[k] for k in range(4)] + [right[:8].T @ rng.standard_normal(8) for _ in range(samples)]
            for w in starts:
                w = r * w / np.linalg.norm(w)
                reach = max(float(np.linalg.norm(gradient[other] @ w)) for other in offsets)
                ms = [scores[other] @ w for other in offsets]
                mean = np.mean(ms, axis=0)
                off = values - np.outer(mean, values.T @ mean) / max(float(mean @ mean), 1e-300)
                ys = top_values + [np.linalg.svd(off, full_matrices=False)[2][0]]
                low, up = _value_factor(values, ms, ys, r, root_c)
                low_best, up_best = max(low_best, reach * low), max(up_best, reach * up)
        out[i] = (low_best / plain, up_best / plain)
    return out


def _exact(matrix):
    from lipbound.rigorous.linalg import Enclosure

    return Enclosure.exact(np.asarray(matrix, dtype=float))


def range_rows(bounds, b) -> dict:
    """Step 9's centred split against the split with each row charged by its largest pair (module docstring), floats:
    ``{"centred", "pairs", "tokens"}`` (the two square roots of the top eigenvalues and the share of each token in the
    centred split's top eigenvector); None where step 9 does not apply (a centre, a query bias, a soft-cap)."""
    from lipbound.numeric.sdp.layer import gram_factor
    from lipbound.numeric.sdp.rotary_rows import query_inverse, row_splits
    from lipbound.rigorous.intervals import upper

    head, rows, n = bounds.head, bounds.rows, bounds.rows.n
    if rows.softcap is not None or bounds.centred(head.W_Q, head.b_Q) is not None:
        return None
    C, L = query_inverse(bounds.gram("query_left")), gram_factor(bounds.gram("query_and_key_left"))
    if C is None or L is None:
        return None
    k = C.shape[0]
    size = 2 * k
    has_query, t_start = row_splits(bounds, b, bounds.offset_gains())
    top = L[:k].T @ C.mid @ L[:k]
    Q = bounds.gram("queries_shaped").mid
    values, vectors = np.linalg.eigh(0.5 * (Q + Q.T))
    half = (vectors * np.sqrt(np.maximum(values, 0.0))).T                           # half^T half = Q
    seen = {delta: half @ R.mid @ L[k:] for delta, R in bounds.rotations.items()}   # c_j in the metric of Q
    scale2, b2 = float(upper(bounds.spread ** 2 * bounds.r ** 2)), float(upper(b ** 2))
    keys_of = {i: [j for j in range(n) if rows.visible[i, j]] for i in range(n)}
    keys_of = {i: keys for i, keys in keys_of.items() if len(keys) >= 2 and float(upper(bounds.row_nu(i))) >= 0.5}

    def matrix(t: np.ndarray, forms: dict) -> np.ndarray:
        out = np.zeros((size * n, size * n))
        for j in range(n):
            if has_query[j]:
                out[j * size:(j + 1) * size, j * size:(j + 1) * size] += (1 + t[j]) * b2 * top
        for i, coefficients in forms.items():
            weight = (1 + 1 / t[i]) * scale2
            for (j, l), c in coefficients.items():
                out[j * size:(j + 1) * size, l * size:(l + 1) * size] += weight * c * (seen[j - i].T @ seen[l - i])
        return out

    centred = {i: {(j, l): 0.5 * ((j == l) - 1 / len(keys)) for j in keys for l in keys} for i, keys in keys_of.items()}
    value, t = min(((float(np.linalg.eigvalsh(matrix(t_start * math.exp(s), centred))[-1]), t_start * math.exp(s))
                    for s in np.linspace(-2.0, 2.0, 21)), key=lambda found: found[0])
    vectors = np.linalg.eigh(matrix(t, centred))[1]

    def pairs(x: np.ndarray) -> dict:
        forms = {}
        for i, keys in keys_of.items():
            moved = {j: seen[j - i] @ x[j * size:(j + 1) * size] for j in keys}
            a, c = max(((a, c) for a in keys for c in keys if a < c),
                       key=lambda pair: float(np.sum((moved[pair[0]] - moved[pair[1]]) ** 2)))
            forms[i] = {(a, a): 0.25, (c, c): 0.25, (a, c): -0.25, (c, a): -0.25}
        return forms

    found = 0.0
    rng = np.random.default_rng(0)
    for x in [vectors[:, -1 - q] for q in range(4)] + [rng.standard_normal(size * n) for _ in range(4)]:
        for _ in range(12):
            levels, x_all = np.linalg.eigh(matrix(t, pairs(x)))
            x = x_all[:, -1]
        found = max(found, float(levels[-1]))
    x = vectors[:, -1]
    return {"centred": math.sqrt(value), "pairs": math.sqrt(found),
            "tokens": [float(np.sum(x[j * size:(j + 1) * size] ** 2)) for j in range(n)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="0,15,29")
    parser.add_argument("--heads", default=None, help="comma-separated heads (default: all)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--samples", type=int, default=16, help="random query mixtures per offset and row")
    parser.add_argument("--rows", default="1,4,7", help="rows whose tied key gain is printed")
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from bench_decoders import smollm2

    from lipbound.numeric.model import load_weights
    from lipbound.numeric.sdp.rotary import PositionalHeadBounds
    from lipbound.numeric.verification import Verification

    layers = [int(x) for x in args.layers.split(",")]
    rows = [int(x) for x in args.rows.split(",")]
    model = load_weights(smollm2(), layers=layers)
    verification = Verification(model, layers=layers, n=args.n, budget=1, seed=0)
    print("c_N (Var_p(s) under p = softmax(s), N keys): " + ", ".join(
        f"{keys} {softmax_score_variance(keys):.3f}" for keys in range(2, args.n + 1)))
    for block in layers:
        job = next(job for job in verification.jobs if job.layer == block)
        domain = verification.domains_of(job)[0]
        attention = model.layer(block, job.block).attention
        chosen = range(len(attention.heads)) if args.heads is None else [int(x) for x in args.heads.split(",")]
        for h in chosen:
            began = time.process_time()
            bounds = PositionalHeadBounds(attention.heads[h], domain, args.n)
            ratios = tie_ratios(bounds, rows, args.samples)
            found = range_rows(bounds, bounds.query_term)
            tie = ", ".join(f"row {i} {low:.3f}-{up:.3f}" for i, (low, up) in ratios.items())
            ranged = ("--" if found is None else f"centred {found['centred']:.1f}, by pairs {found['pairs']:.1f} "
                      f"({found['pairs'] / found['centred']:.3f}), worst move on tokens "
                      + " ".join(f"{v:.2f}" for v in found["tokens"]))
            print(f"block {block} head {h}: tied key gain / plain {tie}; split {ranged}; "
                  f"{time.process_time() - began:.1f} CPU s", flush=True)


if __name__ == "__main__":
    main()
