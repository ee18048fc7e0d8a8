"""How large the attention's second-order term is on U, against the certified Taylor remainders a block starts from.

A block's per-token sets (``lipbound/local/relational_tail.py``) start from ``A(Y) = A(X) + (Y - X) DA(X) + r`` with
``||r_i|| <= rest_i`` (lemmas attention-reach-remainder and curvature-per-query).  For one sentence, layer and radius of
all-MiniLM-L6-v2 this prints per output token i:

* ``rest_i``: the certified remainder (the block's attention curve, ``want_reach``);
* ``ascent``: the largest ``||r_i||`` found by projected gradient ascent on the sphere ``||Y - X||_F = eps`` (the
  gradient of ``||r_i||`` is ``(DA(Y) - DA(X))^T r_i / ||r_i||``), and at that point its even part ``(A(X + E) + A(X -
  E) - 2 A(X)) / 2`` (the second-order term plus fourth-order ones) and its odd part ``(A(X + E) - A(X - E)) / 2 -
  DA(X) E`` (third order and up);
* float estimates of a second-order form carried head by head in score space.  With ``L``, ``N`` the linear and
  quadratic parts of head h's score change in row i, ``p`` the weights at X, ``J = diag(p) - p p^T`` and
  ``u_hj = (v_hj - o_hi) W_O,h``: the quadratic term ``sum_(h,j) c_hj u_hj + sum_(h,j) (J L)_hj e_j W_V,h W_O,h``
  with ``c = J N + (1/2) H[L, L]``; ``quadratic``: the joint budget ``sum_(h,j) |c_hj| <= lambda_max(M_i) eps^2``
  (``M_i`` the sum over heads of ``Lm^T J Lm`` and the AM-GM forms of ``|(J N)_j|``) times ``max ||u_hj||``;
  ``bilinear``: ``||[W_VO,h]_h|| ||(J_h Lm_h)_h|| eps^2``; ``third``: the softmax's third-order remainder per head,
  ``sum_l |r_l| <= (7/48) w^3`` (w the largest spread of the score change on U), plus the products of second- and
  first-order parts, summed over heads; ``third (weighted)`` the same with ``w^3`` replaced by
  ``w (2 s^2 + 3 s^3 / w)``, s^2 the weights' variance bound ``m (1 - m) w^2`` from the mass ``m`` off the largest
  weight at X (optimistic: certified, m would be its supremum on U).  ``spread``: per head the largest score spread
  on U against the weighted one ``||J^(1/2) Lm|| eps``.

Run: ``python bench/bench_attention_quadratic.py [--text "The cat sat on the mat."] [--layer 0] [--fraction 1e-2]``
(about 80 CPU s at n = 9).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import scipy.sparse.linalg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ascent(step, X: np.ndarray, eps: float, i: int, rng, starts: int = 3, rounds: int = 60) -> np.ndarray:
    """A direction E with ``||E||_F = eps`` where token i's Taylor remainder is large (projected gradient ascent)."""
    at_x = step.linearize(X[None], None)

    def remainder(E):
        return step.linearize((X + E)[None], None).F[0] - at_x.F[0] - at_x.jvp(E[None])[0]

    def on_sphere(E):
        return E / np.linalg.norm(E) * eps
    best, best_value = None, -1.0
    for _ in range(starts):
        E = on_sphere(rng.standard_normal(X.shape))
        for _ in range(rounds):
            r = remainder(E)
            G = np.zeros_like(X)
            G[i] = r[i] / max(np.linalg.norm(r[i]), 1e-300)
            g = step.linearize((X + E)[None], None).vjp(G[None])[0][0] - at_x.vjp(G[None])[0][0]
            g = g - (g * E).sum() / eps ** 2 * E
            E = on_sphere(E + eps * g / max(np.linalg.norm(g), 1e-300))
        value = np.linalg.norm(remainder(E)[i])
        if value > best_value:
            best, best_value = E, value
    return best


def parts(step, X: np.ndarray, E: np.ndarray, i: int) -> tuple:
    """``(||r_i||, ||even_i||, ||odd_i||)`` at E (module docstring)."""
    F = [step.linearize(Z[None], None).F[0] for Z in (X, X + E, X - E)]
    linear = step.linearize(X[None], None).jvp(E[None])[0]
    r, even, odd = F[1] - F[0] - linear, (F[1] + F[2] - 2 * F[0]) / 2, (F[1] - F[2]) / 2 - linear
    return tuple(float(np.linalg.norm(v[i])) for v in (r, even, odd))


def head_form(layer, X: np.ndarray, eps: float, i: int, tau: float = 1.0) -> dict:
    """Float estimates of the head-by-head second-order form's terms for output token i (module docstring)."""
    n, d = X.shape
    dk = layer.heads[0].W_Q.shape[1]
    c = 1.0 / np.sqrt(dk)
    M = np.zeros((n * d, n * d))
    rows, stacked, u_max, third, weighted, spreads = [], 0.0, 0.0, 0.0, 0.0, []
    for h, head in enumerate(layer.heads):
        Q, K, V = (X @ W + b for W, b in ((head.W_Q, head.b_Q), (head.W_K, head.b_K), (head.W_V, head.b_V)))
        s = c * Q[i] @ K.T
        p = np.exp(s - s.max())
        p /= p.sum()
        W_O = layer.W_O[h * dk:(h + 1) * dk]
        W_VO = head.W_V @ W_O
        stacked = stacked + W_VO.T @ W_VO
        J = np.diag(p) - np.outer(p, p)
        w, U = np.linalg.eigh(J)
        root = (U * np.sqrt(np.maximum(w, 0.0))) @ U.T
        Lm = np.zeros((n, n * d))                      # L_k = c (e_i W_Q k_k + q_i W_K^T e_k)
        Lm[:, i * d:(i + 1) * d] += c * (head.W_Q @ K.T).T
        for k in range(n):
            Lm[k, k * d:(k + 1) * d] += c * (head.W_K @ Q[i])
        JL = root @ Lm
        M += JL.T @ JL                                  # sum_j p_j ((L_j - mu)^2 + sigma^2) / 2 = sigma^2
        M[i * d:(i + 1) * d, i * d:(i + 1) * d] += (c * tau / 2) * head.W_Q @ head.W_Q.T
        M += (c / (2 * tau)) * np.kron(J, head.W_K @ head.W_K.T)
        rows.append(J @ Lm)
        u = np.linalg.norm((V - p @ V) @ W_O, axis=1).max()
        u_max = max(u_max, u)
        w_L = max(np.linalg.norm(Lm[j] - Lm[k]) for j in range(n) for k in range(j + 1, n)) * eps
        w_N = 2 * c * np.linalg.norm(head.W_Q @ head.W_K.T, 2) * eps ** 2
        spreads.append((w_L, np.linalg.norm(JL, 2) * eps))
        width, vo = w_L + w_N, np.linalg.norm(W_VO, 2) * eps
        third += (w_L * w_N / 2 + w_N ** 2 / 4 + 7 * width ** 3 / 48) * u + (w_N + width ** 2 / 4) * vo
        m = 1.0 - p.max()
        variance = min(width ** 2 / 4, m * (1 - m) * width ** 2)
        cubic = (2 * width * variance + 3 * variance ** 1.5) / 6
        weighted += (w_L * w_N / 2 + w_N ** 2 / 4 + cubic) * u + (w_N + min(width ** 2 / 4, variance)) * vo
    top = scipy.sparse.linalg.eigsh(M, k=1, which="LA", return_eigenvectors=False)[0]
    quadratic = top * eps ** 2 * u_max
    bilinear = np.sqrt(np.linalg.eigvalsh(stacked)[-1]) * np.linalg.norm(np.concatenate(rows), 2) * eps ** 2
    return {"quadratic": quadratic, "bilinear": bilinear, "third": third, "third (weighted)": weighted,
            "spreads": spreads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="The cat sat on the mat.")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--fraction", type=float, default=1e-2)
    args = parser.parse_args()
    from lipbound.local import curve as curve_module
    from lipbound.local.chains import chain_for
    from lipbound.local.curvature import CURVATURE_TOKENS
    from lipbound.measures.bert import load_text_model
    bert = load_text_model(None)
    X = bert.hidden_states(bert.encode(args.text))[args.layer]
    eps = args.fraction * bert.layernorm_feeding(args.layer).radius_about_center
    component = chain_for(bert.model, "layer", args.layer)[0]
    began = time.process_time()
    point = curve_module._curve(bert.model, X, "layer", args.layer, None, None, "fro", "fro", (), [eps], 0, 0,
                                CURVATURE_TOKENS, None, want_reach=True).points[0]
    certified = time.process_time() - began
    rests = np.minimum(point.remainder, point.token_remainders) if point.token_remainders else \
        np.full(X.shape[0], point.remainder)
    print(f"{args.text!r} layer {args.layer}, {args.fraction:g} R (eps = {eps:.4g}); certified remainders "
          f"{certified:.1f} CPU s")
    print("token  rest_i  ascent  even   odd      | head form (float): quadratic bilinear third third(weighted)")
    rng = np.random.default_rng(0)
    began = time.process_time()
    for i in range(X.shape[0]):
        found = parts(component.step, X, ascent(component.step, X, eps, i, rng), i)
        form = head_form(component.target, X, eps, i)
        print(f"{i:5d}  {rests[i]:.4f}  {found[0]:.4f}  {found[1]:.4f} {found[2]:.2e} | {form['quadratic']:.4f} "
              f"{form['bilinear']:.4f} {form['third']:.4g} {form['third (weighted)']:.4g}", flush=True)
        if i == 0:
            print("       spread per head (largest / weighted): "
                  + " ".join(f"{a:.2f}/{b:.2f}" for a, b in form["spreads"]))
    print(f"ascent and head forms: {time.process_time() - began:.1f} CPU s")


if __name__ == "__main__":
    main()
