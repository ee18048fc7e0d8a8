"""L(eps) with and without the relational routes (lipbound/local/relational.py, jacobian_forms.py), side by side.

For each sentence (the shortest of lipbound/measures/data/sentences.txt first), kind and radius: the
certified L(eps), the witness (projected ascent inside U, as `local` finds it), their ratio before (the
per-token routes alone), without the Jacobian enclosed over U (``--without-jacobian``: the relational scores
and curvature integral only) and after (every route), the route that gave the certified value and the CPU
seconds of each curve and radius (time.process_time: the machine is shared, wall time is not a measure).

    python bench/bench_relational.py --sentences 3 --kinds layer --fractions 1e-3,1e-2,1e-1 --without-jacobian
    python bench/bench_relational.py --sentences 2 --kinds block,stack --fractions 1e-4,1e-3,1e-2
    python bench/bench_relational.py --sentences 20 --fractions 1e-4,1e-3,1e-2,1e-1 --after-only --table
    python bench/bench_relational.py --text "The cat sat on the mat." --fractions 1e-4,1e-3,1e-2,1e-1 --without-joint
    python bench/bench_relational.py --sentences 3 --fractions 1e-1 --without-covering

``--recheck`` re-checks every witness of the head and layer curves in high precision (lipbound/local/witness_check.py)
and takes the ratios against the re-checked lower bounds.  ``--table`` ends with the ratios' median and worst over
the sentences per radius, and the CPU seconds per radius
(median, largest); ``--without-covering`` compares with the heads joined through the keys' and values' Gram forms
(lemma jacobian-heads-covering replaces them); ``--text`` runs one sentence of your own instead of the bundled
ones.  ``--second-derivative`` prints instead, per sentence, the curvature bound's groups at X (chi_I, chi_II,
chi_III) beside a float lower estimate of each group's ``sup ||D^2A(X)[e, f]||`` over unit e, f (alternating top
singular vectors of the dense ``(n d) x (n d)`` matrix of ``e -> D^2A(X)[e, f]``; about a minute per group at
n = 9, never a bound):

    python bench/bench_relational.py --text "The cat sat on the mat." --second-derivative [--queries]

``--queries`` prints instead each query's groups and the whole second derivative's row found by ascent, beside the
certified groups of each query, the whole output's and each token's ``chi_i`` (about 15 CPU minutes at n = 9);
``--matricized`` adds per query ``sup_w ||H_i(w)||_F`` over unit w, ``H_i(w)`` the Hessian of ``w . A(X)_i``: the
row's norm with the output on one side and (e, f) on the other, an upper bound on the row's norm, with
``||H_i(w)||_2`` at the w found (float estimates).

``--basins N`` climbs N times with short projected steps from random points of U's boundary at each radius, beside
the curve's own witness search, re-checks the best point in high precision and prints per head how far a row's two
largest keys are from a tie on the ball; ``--integrand`` prints the relational curvature integral radius by radius
and the curve with parts of U's facts put back to X (measurements, not bounds):

    python bench/bench_relational.py --text "The cat sat on the mat." --fractions 1e-3,1e-2 --basins 12
    python bench/bench_relational.py --sentences 3 --fractions 1e-2 --integrand

``--paths`` prints, at each radius where the joined heads are formed (lemma jacobian-heads-joint), what they pay:
every head's value, query and key terms ``gamma (||S|| ||T||)^(1/2)`` with the tokens' movement and without it
(eps set to 0 in the forms, the weights' ranges kept), each path and each head joined alone, and all of them
joined.  ``--without-widened`` compares with the witness search without the widened pair starts and the short
uphill steps (lipbound/local/pair_starts.py, witness_search.py):

    python bench/bench_relational.py --text "The cat sat on the mat." --fractions 1e-2,1e-1 --paths
    python bench/bench_relational.py --sentences 6 --fractions 1e-1 --without-widened --recheck --table
"""

from __future__ import annotations

import argparse
import os
import time
from unittest import mock

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def sentences(count: int) -> list[str]:
    from importlib import resources
    text = resources.files("lipbound.measures").joinpath("data/sentences.txt").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return sorted(lines, key=len)[:count]


def run(text, kind, layer, fractions, model, mode: str, recheck: bool = False):
    """One curve: ``mode`` "before" (no relational route), "relational" (no Jacobian enclosed over U), "summed" (the
    Jacobian over U with the heads summed only, no heads-joint route), "unwidened" (the witness without the widened
    pair starts and the short uphill steps) or "after"."""
    import contextlib
    import math

    from lipbound.local import curve as curve_module
    from lipbound.local import joint_heads, pair_starts, witness_search
    from lipbound.measures.curves import local_curve
    top = layer + 1 if kind == "stack" else None
    began = time.process_time()
    patch = mock.patch.object(curve_module.RelationalRoute, "of", return_value=None) if mode == "before" else \
        mock.patch.object(curve_module.RelationalRoute, "jacobian", return_value=(math.inf, math.inf)) \
        if mode == "relational" else \
        mock.patch.object(curve_module.RelationalRoute, "joint_supremum", return_value=math.inf) \
        if mode == "summed" else \
        mock.patch.object(joint_heads, "_covering", lambda rows: joint_heads._gram(rows).scale(0.5)) \
        if mode == "gram" else contextlib.nullcontext()
    if mode == "unwidened":
        patch = contextlib.ExitStack()
        patch.enter_context(mock.patch.object(pair_starts, "_widened", return_value=[]))
        patch.enter_context(mock.patch.object(witness_search, "UPHILL_STEPS", 0))
    with patch:
        found, _ = local_curve(text, layer=layer, kind=kind, last=top, eps=fractions, model=model,
                               recheck=recheck and mode == "after")
    return found, time.process_time() - began


def second_derivative(layer, X, f, groups):
    """The matrix of ``e -> D^2A(X)[e, f]`` (n d_out, n d) of an attention layer, summed over the chosen groups of its
    closed form (lipbound/local/curvature.py: I the weights' change on the values, II the covariance of two score
    changes, III the scores' second derivative), written here in floats."""
    import numpy as np
    n, d = X.shape
    eye, total = np.eye(n), 0.0
    for k, head in enumerate(layer.heads):
        W_Q, W_K, A = head.W_Q, head.W_K, head.V @ layer.output_block(k)
        c = 1 / np.sqrt(W_Q.shape[1])
        q, key, v = X @ W_Q + head.b_Q, X @ W_K + head.b_K, X @ A + head.b_V @ layer.output_block(k)
        S = c * q @ key.T
        P = np.exp(S - S.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        u = v[None] - (P @ v)[:, None]                                        # u_ij, (i, j, o)
        a, b = key @ W_Q.T, q @ W_K.T                                          # W_Q k_j, W_K q_i, (n, d)
        # zeta_ij's derivative in e_(m, a): c [i = m] (W_Q (k_j - kappa_i))_a + c ([j = m] - p_im) (W_K q_i)_a
        Z = c * (eye[:, None, :, None] * (a[None, :, None, :] - (P @ a)[:, None, None, :])
                 + (eye[None, :, :, None] - P[:, None, :, None]) * b[:, None, None, :]).reshape(n, n, n * d)
        zf = Z @ f.ravel()                                                    # zeta_ij(f)
        out = np.zeros((n, A.shape[1], n, d))
        if "I" in groups:
            out += (P * zf)[:, None, :, None] * A.T[None, :, None, :]
            out += np.matmul((P[..., None] * (f @ A)[None]).transpose(0, 2, 1), Z).reshape(out.shape)
        if "II" in groups:
            out += np.matmul(((P * zf)[..., None] * u).transpose(0, 2, 1), Z).reshape(out.shape)
        if "III" in groups:
            Qt = W_Q @ W_K.T
            own = np.einsum("ij,ja,ijo->ioa", P, f @ Qt.T, u)
            out[np.arange(n), :, np.arange(n), :] += c * own
            out += c * np.einsum("im,ia,imo->ioma", P, f @ Qt, u)
        total = total + out
    return total.reshape(-1, n * d)


def largest_second_derivative(layer, X, groups, starts=2, steps=6, seed=0) -> float:
    """A float lower estimate of ``sup ||D^2A(X)[e, f]||_F`` over unit e, f (the form is symmetric: the top right
    singular vector for the current f is the next f)."""
    import numpy as np
    from scipy.sparse.linalg import svds
    rng, best = np.random.default_rng(seed), 0.0
    for _ in range(starts):
        f, last = rng.standard_normal(X.shape), 0.0
        f /= np.linalg.norm(f)
        for _ in range(steps):
            _, value, right = svds(second_derivative(layer, X, f, groups), k=1)
            f = right[0].reshape(X.shape)
            if abs(value[0] - last) < 1e-6 * value[0]:
                break
            last = value[0]
        best = max(best, float(value[0]))
    return best


def query_second_derivative(layer, X, f, i, groups):
    """The matrix of ``e -> D^2A(X)[e, f]_i`` (d_out, n d): output token i's row of :func:`second_derivative`, formed
    for that query alone (n times less work)."""
    import numpy as np
    n, d = X.shape
    total = 0.0
    for A, c, p, u, Z, Qt in _query_heads(layer, X, i):
        zf = Z @ f.ravel()
        out = np.zeros((A.shape[1], n, d))
        if "I" in groups:
            out += (p * zf)[None, :, None] * A.T[:, None, :]
            out += ((p[:, None] * (f @ A)).T @ Z).reshape(out.shape)
        if "II" in groups:
            out += (((p * zf)[:, None] * u).T @ Z).reshape(out.shape)
        if "III" in groups:
            out[:, i, :] += c * ((u * p[:, None]).T @ (f @ Qt.T))
            out += c * (p[:, None] * u).T[:, :, None] * (f @ Qt)[i][None, None, :]
        total = total + out
    return total.reshape(-1, n * d)


def largest_rows(layer, X, queries, groups, starts=2, steps=15, seed=0) -> float:
    """A float lower estimate of ``sup ||(D^2A(X)[e, f]_i)_(i in queries)||`` over unit e, f: alternating top singular
    vectors of the rows' matrix (each by 30 power steps: the form is symmetric, the top right vector for f is the next
    f)."""
    import numpy as np
    rng, best = np.random.default_rng(seed), 0.0
    for _ in range(starts):
        f, last = rng.standard_normal(X.shape), 0.0
        f /= np.linalg.norm(f)
        for _ in range(steps):
            N = np.concatenate([query_second_derivative(layer, X, f, i, groups) for i in queries])
            g = f.ravel()
            for _ in range(30):
                g = N.T @ (N @ g)
                g /= np.linalg.norm(g)
            value = float(np.linalg.norm(N @ g))
            f = g.reshape(X.shape)
            if abs(value - last) < 1e-7 * value:
                break
            last = value
        best = max(best, value)
    return best


def _query_heads(layer, X, i):
    """Per head ``(A_h, c, p_i, U_i, Z_i, Qt_h)`` at X for query i: the values in the output space, the score scale,
    the weights, the rows ``u_ij``, zeta's rows (n, n d) and ``W_Q W_K^T``."""
    import numpy as np
    n, d = X.shape
    eye, heads = np.eye(n), []
    for k, head in enumerate(layer.heads):
        W_Q, W_K, A = head.W_Q, head.W_K, head.V @ layer.output_block(k)
        c = 1 / np.sqrt(W_Q.shape[1])
        q, key, v = X @ W_Q + head.b_Q, X @ W_K + head.b_K, X @ A + head.b_V @ layer.output_block(k)
        s = c * q[i] @ key.T
        p = np.exp(s - s.max())
        p /= p.sum()
        a, b = key @ W_Q.T, q[i] @ W_K.T                                       # W_Q k_j (n, d), W_K q_i (d,)
        # zeta_ij's derivative in e_(m, a): c [i = m] (W_Q (k_j - kappa_i))_a + c ([j = m] - p_m) (W_K q_i)_a
        Z = (eye[:, :, None] - p[None, :, None]) * b[None, None, :]
        Z[:, i, :] += a - p @ a
        heads.append((A, c, p, v - p @ v, c * Z.reshape(n, n * d), W_Q @ W_K.T))
    return heads


def query_hessian(heads, X, w, i):
    """``H_i(w)``, the (n d x n d) Hessian of ``w . A(X)_i`` (the bilinear form ``w . D^2A(X)[e, f]_i``; on generated
    layers ``e^T H_i(w) f`` equals ``w`` against the tests' closed form of row i)."""
    import numpy as np
    n, d = X.shape
    H = np.zeros((n * d, n * d))
    for A, c, p, u, Z, Qt in heads:
        columns = np.zeros((n, d, n))
        columns[np.arange(n), :, np.arange(n)] = p[:, None] * (A @ w)[None, :]     # p_j (A_h w) at token j
        first = columns.reshape(n * d, n) @ Z
        s = p * (u @ w)
        third = np.zeros((n * d, n * d))
        third[i * d:(i + 1) * d] = c * np.concatenate([s_j * Qt for s_j in s], axis=1)
        H += first + first.T + (Z.T * s) @ Z + third + third.T
    return H


def matricized_gram(heads, X, i):
    """``G_i`` (d_out x d_out) with ``w^T G_i w = ||H_i(w)||_F^2`` (:func:`query_hessian`), in closed form over the
    terms ``t = (h, j)`` (``T = H n``): with ``zeta_t`` query i's rows, ``Gz = [zeta_t . zeta_s]``, ``pp = [p_t p_s]``,
    ``[j_t = j_s]`` the same key,

        G_i = 2 sum_(t,s) pp Gz [j_t = j_s] A_(h_t)^T A_(h_s) + 2 sym sum_(t,s) pp a_ts a_st^T + U^T K U
              + 4 sym sum_(t,s) pp A_(h_t)^T b_ts u_s^T,

    ``a_ts = A_(h_s)^T zeta_t[j_s]``, ``K = pp (Gz^2 + 2 c (q_ts + q_st) + 2 c^2 [j_t = j_s] (<Qt_(h_t), Qt_(h_s)>
    + [j_t = i] tr(Qt_(h_t) Qt_(h_s))))``, ``q_ts = zeta_s[i] . Qt_(h_t) zeta_s[j_t]``, ``b_ts = Gz_st zeta_s[j_t] + c
    [j_t = i] Qt_(h_s) zeta_t[j_s] + c [j_t = j_s] Qt_(h_s)^T zeta_t[i]`` (blocks ``[m]`` of length d; the first two
    terms are the first group's ``||C Z^T + Z C^T||_F^2``, the third the second and third groups', the last their cross
    terms)."""
    import numpy as np
    n, d = X.shape
    H, c = len(heads), heads[0][1]
    A = np.stack([head[0] for head in heads])
    p, U = np.concatenate([head[2] for head in heads]), np.concatenate([head[3] for head in heads])
    Z, Qt = np.concatenate([head[4] for head in heads]), np.stack([head[5] for head in heads])
    hh, jj = np.repeat(np.arange(H), n), np.tile(np.arange(n), H)
    Gz, blocks, pp = Z @ Z.T, Z.reshape(H * n, n, d), np.outer(p, p)
    same = jj[:, None] == jj[None, :]
    heads_weight = np.zeros((H, H))
    np.add.at(heads_weight, (hh[:, None], hh[None, :]), Gz * pp * same)
    G = 2 * np.einsum("ab,ado,bdq->oq", heads_weight, A, A, optimize=True)
    at = blocks[:, jj, :]                                                   # zeta_t[j_s], (t, s, d)
    a = np.einsum("sdo,tsd->tso", A[hh], at, optimize=True)
    pairs = np.einsum("ts,tso,stq->oq", pp, a, a, optimize=True)
    G += pairs + pairs.T
    q = np.einsum("sa,tab,stb->ts", blocks[:, i, :], Qt[hh], at, optimize=True)
    inner, traces = np.einsum("hab,gab->hg", Qt, Qt), np.einsum("hab,gba->hg", Qt, Qt)
    traces = inner[hh][:, hh] + (jj[:, None] == i) * traces[hh][:, hh]
    K = pp * (Gz ** 2 + 2 * c * (q + q.T) + 2 * c * c * same * traces)
    G += U.T @ K @ U
    b = at.swapaxes(0, 1) * Gz.T[:, :, None]                                 # Gz_st zeta_s[j_t]
    b += c * (jj[:, None, None] == i) * np.einsum("sab,tsb->tsa", Qt[hh], at, optimize=True)
    b += c * same[:, :, None] * np.einsum("sba,tb->tsa", Qt[hh], blocks[:, i, :], optimize=True)
    per_head = np.zeros((H, d, U.shape[1]))
    np.add.at(per_head, hh, np.einsum("ts,tsd,sq->tdq", pp, b, U, optimize=True))
    cross = np.einsum("hdo,hdq->oq", A, per_head, optimize=True)
    return G + 2 * (cross + cross.T)


def matricized_row(layer, X, i) -> tuple[float, float]:
    """``(sup_w ||H_i(w)||_F, ||H_i(w)||_2 at that w)`` over unit w (:func:`matricized_gram`'s top eigenpair): the norm
    of row i's second derivative matricized with the output on one side and (e, f) on the other, which bounds the
    row's norm (float estimates)."""
    import numpy as np
    heads = _query_heads(layer, X, i)
    values, vectors = np.linalg.eigh(matricized_gram(heads, X, i))
    H = query_hessian(heads, X, vectors[:, -1], i)
    return float(np.sqrt(max(values[-1], 0.0))), float(np.linalg.norm(H, 2))


def query_groups_at_x(text: str, layer_index: int, model, matricized: bool = False) -> None:
    """Per query and for the whole output at X (``--second-derivative --queries``): each group's and the whole second
    derivative's norm found by ascent (float lower estimates), beside the certified groups of each query
    (``query_groups``), the whole output's, and each token's ``chi_i`` as the remainders read it (``row_chis``)."""
    import numpy as np

    from lipbound.local.balls import Neighbourhood, TokenBalls
    from lipbound.local.bounds import attention_bounds
    from lipbound.local.centre import ChainCentre
    from lipbound.local.curve import _CurvatureRoute
    from lipbound.local.query_curvature import query_groups, row_chis
    X, chain, _ = _centre(text, layer_index, model)
    n, layer = X.shape[0], chain[0].target
    route = _CurvatureRoute.of(chain, ChainCentre(chain, X, dense=False), X, [Neighbourhood("fro", 1.0)],
                               per_query=True)
    curvature, radii = route.curvature, np.zeros(n)
    whole = route.integral.chis(radii, {"frobenius": 0.0})
    balls = TokenBalls(X, radii)
    bounds = curvature.moved_heads(attention_bounds(layer, balls, curvature.E), 0.0)
    certified = np.stack([group.hi for group in query_groups(curvature, bounds, balls.radii, 0.0)])
    chi = row_chis(certified, whole)
    print(f"{text!r} layer {layer_index}, n = {n}, at X: per query i (found: float lower estimates; certified: bounds)")
    names = (("I",), ("II",), ("III",), ("I", "II", "III"))
    found = {group: [largest_rows(layer, X, [i], group) for i in range(n)] for group in names}
    for k, group in enumerate(names[:3]):
        print(f"  group {group[0]:3s} found     " + " ".join(f"{v:6.3f}" for v in found[group]))
        print(f"  group {group[0]:3s} certified " + " ".join(f"{v:6.3f}" for v in certified[k])
              + f"   (whole output: {whole[k]:.4g})")
    print("  all      found     " + " ".join(f"{v:6.3f}" for v in found[names[3]]))
    print("  own sum  certified " + " ".join(f"{v:6.3f}" for v in certified.sum(axis=0)))
    print("  chi_i    certified " + " ".join(f"{v:6.3f}" for v in chi))
    if matricized:
        values = [matricized_row(layer, X, i) for i in range(n)]
        print("  matricized ||H_i(w)||_F " + " ".join(f"{v:6.3f}" for v, _ in values))
        print("  at its w   ||H_i(w)||_2 " + " ".join(f"{v:6.3f}" for _, v in values))
    totals = [largest_rows(layer, X, range(n), group) for group in names]
    print("  whole output found: " + ", ".join(f"{'+'.join(g)} {v:.4g}" for g, v in zip(names, totals))
          + f"; certified {', '.join(f'{v:.4g}' for v in whole)} (sum {sum(whole):.4g})")


def _centre(text: str, layer_index: int, model):
    """The sentence's hidden states entering the layer, the layer's chain and the LayerNorm radius R."""
    from lipbound.local.chains import chain_for
    from lipbound.measures.bert import load_text_model
    bert = load_text_model(model)
    X = bert.hidden_states(bert.encode(text))[layer_index]
    return X, chain_for(bert.model, "layer", layer_index), bert.layernorm_feeding(layer_index).radius_about_center


def centre_groups(text: str, layer_index: int, model) -> None:
    """The curvature bound's groups at X against the ascent's estimates of the true groups (``--second-derivative``)."""
    import numpy as np

    from lipbound.local.balls import Neighbourhood
    from lipbound.local.centre import ChainCentre
    from lipbound.local.curve import _CurvatureRoute
    X, chain, _ = _centre(text, layer_index, model)
    route = _CurvatureRoute.of(chain, ChainCentre(chain, X, dense=False), X, [Neighbourhood("fro", 1.0)])
    chis = route.integral.chis(np.zeros(X.shape[0]), {"frobenius": 0.0})
    found = [largest_second_derivative(chain[0].target, X, (group,)) for group in ("I", "II", "III")]
    print(f"{text!r} layer {layer_index}, n = {X.shape[0]}: curvature bound at X (chi_I, chi_II, chi_III) = "
          + ", ".join(f"{chi:.4g}" for chi in chis) + f" (sum {sum(chis):.4g}); largest found by ascent "
          + ", ".join(f"{value:.4g}" for value in found) + " (float lower estimates)")


def joined_paths(text: str, layer_index: int, fractions, model) -> None:
    """What the joined heads pay at each radius (``--paths``): per head and path ``gamma (||S|| ||T||)^(1/2)`` (float
    estimates of the norms) with and without the tokens' movement, each path and each head joined alone (certified
    tops, as the route joins them), and all joined."""
    import numpy as np

    from lipbound.local import joint_heads
    from lipbound.measures.curves import local_curve
    seen = []
    supremum = joint_heads.JointHeads.supremum

    def recording(self, eps, weights):
        with mock.patch.object(joint_heads, "_balanced", lambda first, second, eps2: first):   # no movement
            still = self.terms(eps, weights)
        seen.append((eps, self.terms(eps, weights), still))
        return supremum(self, eps, weights)

    with mock.patch.object(joint_heads.JointHeads, "supremum", recording):
        curve, _ = local_curve(text, layer=layer_index, kind="layer", eps=fractions, model=model)
    for eps, terms, still in seen:
        point = next(p for p in curve.points if p.eps == eps)
        print(f"{text!r} eps {eps / curve.radius:7.0e} R: joined heads {joint_heads.JointHeads.join(terms):.4g} "
              f"(without the movement {joint_heads.JointHeads.join(still):.4g}); certified {point.certified:.4g} "
              f"({point.route}), witness {point.witness:.4g}")
        heads = sorted({head for _, head, *_ in terms})
        for path in ("value", "query", "key"):
            size = [gamma * np.sqrt(joint_heads._estimate(S) * joint_heads._estimate(T))
                    for name, _, gamma, S, T in terms if name == path]
            quiet = [gamma * np.sqrt(joint_heads._estimate(S) * joint_heads._estimate(T))
                     for name, _, gamma, S, T in still if name == path]
            print(f"  {path:5s} per head " + " ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(size, quiet))
                  + f"; sum {sum(size):.1f}/{sum(quiet):.1f}; joined alone "
                  f"{joint_heads.JointHeads.join([t for t in terms if t[0] == path]):.4g}"
                  f"/{joint_heads.JointHeads.join([t for t in still if t[0] == path]):.4g}  (with/without movement)")
        alone = [joint_heads.JointHeads.join([t for t in terms if t[1] == h]) for h in heads]
        print("  heads joined alone " + " ".join(f"{value:.1f}" for value in alone))
        largest = int(np.argmax(alone))
        print(f"  head {heads[largest]} alone {alone[largest]:.4g}, the other heads joined "
              f"{joint_heads.JointHeads.join([t for t in terms if t[1] != heads[largest]]):.4g}")


def tie_reach(layer, X, eps) -> list:
    """Per head, the smallest ``gap / reach`` over its rows i and the keys l ranked second and third: ``gap = s_ij -
    s_il`` (j the row's top key) and ``reach = eps ||grad (s_ij - s_il)|| + c ||W_Q W_K^T|| eps^2`` over every token
    moving (the score difference's largest change on the Frobenius ball of radius eps); above 1, no point of the ball
    ties the row's two keys (floats)."""
    import numpy as np

    from lipbound.local.scores import score_scale
    from lipbound.numeric.attention import AttentionMap
    engine = AttentionMap(layer)
    c = float(score_scale(engine).hi)
    at = engine.linearize(engine.to_work(X)[None])
    out = []
    for h in range(engine.H):
        W_Q, W_K = engine.head_weights(h)[:2]
        S, Q, K = at.S[0, h], at.Q[0, h], at.K[0, h]
        g, least = np.linalg.norm(W_Q @ W_K.T, 2), np.inf
        for i in range(X.shape[0]):
            order = np.argsort(-S[i])
            for l in order[1:3]:
                G = np.zeros_like(X)
                G[i] += c * (W_Q @ (K[order[0]] - K[l]))
                G[order[0]] += c * (W_K @ Q[i])
                G[l] -= c * (W_K @ Q[i])
                least = min(least, (S[i, order[0]] - S[i, l]) / (eps * np.linalg.norm(G) + c * g * eps ** 2))
        out.append(least)
    return out


def witness_basins(text: str, layer_index: int, fractions, model, count: int) -> None:
    """``--basins N``: the curve's witness search at each radius against N climbs of short projected steps
    (``witness_search.uphill``, up to 150 steps from a tenth of eps) from random points of U's boundary (every token
    moving, one, two, in turn) and from the search's own point; the best re-checked in high precision, and per head
    :func:`tie_reach` (floats)."""
    import numpy as np

    from lipbound.local.balls import Neighbourhood
    from lipbound.local.pair_starts import pair_starts
    from lipbound.local.witness_check import witness_enclosure
    from lipbound.local.witness_search import ascent, larger, uphill, witness_value
    X, chain, radius = _centre(text, layer_index, model)
    moving = np.ones(X.shape[0], dtype=bool)
    at_x, direction = witness_value(chain, X, moving, "fro", 0)
    for fraction in fractions:
        eps, began = fraction * radius, time.process_time()
        hood = Neighbourhood("fro", eps)
        found = ascent(chain, X, hood, moving, "fro", at_x, direction, 12, 0,
                       starts=pair_starts(chain[0].target, X, eps))
        searched = time.process_time() - began
        rng, values = np.random.default_rng(5), []
        best = uphill(chain, X, hood, moving, found[1], 0, steps=150, share=0.1, largest=1.0)
        for k in range(count):
            offset = rng.standard_normal(X.shape)
            if k % 3:
                offset *= np.isin(np.arange(X.shape[0]), rng.choice(X.shape[0], k % 3, replace=False))[:, None]
            climbed = uphill(chain, X, hood, moving, X + offset * (eps / np.linalg.norm(offset)), 0, steps=150,
                             share=0.1, largest=1.0)
            values.append(climbed[0])
            best = larger(best, climbed)
        checked = witness_enclosure(chain, X, best[1], best[2], hood)
        values = np.array(values)
        print(f"{text!r} n = {X.shape[0]}, eps {fraction:.0e} R: search {found[0]:.10g} ({searched:.1f} CPU s); "
              f"{count} climbs from the boundary: largest {values.max():.10g}, smallest {values.min():.10g}, "
              f"{int(np.sum(values >= best[0] * (1 - 1e-9)))} within 1e-9 of the best {best[0]:.10g}"
              + (f" (re-checked >= {checked[0]:.10g})" if checked else "") + "; the best point moves the tokens by "
              + ", ".join(f"{v:.2f}" for v in np.linalg.norm(best[1] - X, axis=1) / eps) + " eps; CPU s "
              f"{time.process_time() - began:.1f}")
        print("  per head, least gap / reach of a row's top key over its second and third: "
              + ", ".join(f"{v:.3g}" for v in tie_reach(chain[0].target, X, eps)))


def integrand(text: str, layer_index: int, fraction: float, model) -> None:
    """``--integrand``: the relational curvature integral at one radius, radius by radius ``(chi_I, chi_II,
    chi_III)`` on ``U(X, t)`` and each group's share of the sum; then the same curve with parts of the facts on U
    put back to their values at X (the weights' ranges, the values' shift and the heads' movement, the tokens'
    movement in the score changes), which are not bounds: they measure what each part costs."""
    import numpy as np

    from lipbound.local import curvature_integral
    from lipbound.local.bounds import LocalBounds
    from lipbound.measures.curves import local_curve
    seen: dict = {}
    parts = curvature_integral.CurvatureIntegral._parts

    def recording(self, radii, overrides=None, key=None):
        found = parts(self, radii, overrides, key)
        if isinstance(key, tuple) and key and key[0] == "known":
            seen[key[1]] = found
        return found

    with mock.patch.object(curvature_integral.CurvatureIntegral, "_parts", recording):
        curve, _ = local_curve(text, layer=layer_index, kind="layer", eps=[fraction], model=model)
    point, eps = curve.points[0], max(seen)
    print(f"{text!r} n = {curve.n}, eps {fraction:.0e} R = {eps:.4g}: certified {point.certified:.5g} = ||DF(X)|| "
          f"{curve.jacobian_norm:.5g} + variation {point.variation:.5g} ({point.route}); witness {point.witness:.5g}")
    shares = np.zeros(3)
    for t in sorted(seen):
        chis = seen[t]
        shares += np.array(chis[:3]) * eps / len(seen)
        print(f"  t = {t / eps:.4f} eps: chi_I {chis[0]:.4g}, chi_II {chis[1]:.4g}, chi_III {chis[2]:.4g} (the "
              f"Kronecker form's change part {chis[3]:.4g})")
    print("  the groups' terms of the sum (chi_III without the Kronecker form): " + ", ".join(
        f"{name} {value:.4g}" for name, value in zip(("I", "II", "III"), shares)) + f"; total {shares.sum():.4g}")
    bounds = curvature_integral.attention_bounds

    def at_x(kept: str):
        def facts_at_x(target, balls, enclosed=None, **known):
            found = bounds(target, balls, enclosed, **known)
            facts = dict(found.facts)
            if "weights" in kept:
                P = enclosed.P
                facts.update(p_hi=P.hi, p_lo=P.lo, delta=np.zeros_like(facts["delta"]))
            if "values" in kept:
                facts.update(value_shift=np.zeros_like(facts["value_shift"]),
                             head_movement=np.zeros_like(facts["head_movement"]))
            return LocalBounds(found.movement, found.blocks, found.variation, found.at_center, found.output, facts)
        return facts_at_x

    chis = curvature_integral.AttentionCurvature.parts

    def unmoved(self, bounds, r, frobenius=None):
        return chis(self, bounds, np.zeros_like(r), None if frobenius is None else 0.0)

    for kept in ("weights", "values", "movement", "weights+values+movement"):
        with mock.patch.object(curvature_integral, "attention_bounds", at_x(kept)), \
                mock.patch.object(curvature_integral.AttentionCurvature, "parts",
                                  unmoved if "movement" in kept else chis):
            moved, _ = local_curve(text, layer=layer_index, kind="layer", eps=[fraction], model=model)
        print(f"  with {kept} at X (not a bound): certified {moved.points[0].certified:.5g}, variation "
              f"{moved.points[0].variation:.5g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1, help="how many of the shortest sentences")
    parser.add_argument("--skip", type=int, default=0, help="leave out this many of the shortest first")
    parser.add_argument("--kinds", default="layer")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--fractions", default="1e-3,1e-2,1e-1")
    parser.add_argument("--after-only", action="store_true", help="skip the runs without the relational routes")
    parser.add_argument("--table", action="store_true", help="end with the median and worst ratio per radius")
    parser.add_argument("--recheck", action="store_true",
                        help="re-check the witnesses in high precision (heads and layers): the ratios are then "
                             "certified / the re-checked lower bound")
    parser.add_argument("--text", help="this sentence instead of the bundled ones")
    parser.add_argument("--without-jacobian", action="store_true",
                        help="also run with the relational route but without the Jacobian enclosed over U")
    parser.add_argument("--without-joint", action="store_true",
                        help="compare with the run whose Jacobian supremum sums the heads (no jacobian-heads-joint)")
    parser.add_argument("--without-covering", action="store_true",
                        help="compare with the run whose joined heads read the keys' and values' Gram forms")
    parser.add_argument("--paths", action="store_true",
                        help="what the joined heads pay per head and path, with and without the tokens' movement")
    parser.add_argument("--without-widened", action="store_true",
                        help="compare with the witness search without the widened pair starts and uphill steps")
    parser.add_argument("--second-derivative", action="store_true",
                        help="the curvature bound's groups at X against ascent on the true second derivative")
    parser.add_argument("--queries", action="store_true",
                        help="with --second-derivative: per query and all groups together, found and certified")
    parser.add_argument("--matricized", action="store_true",
                        help="with --queries: each row's second derivative matricized (output against (e, f))")
    parser.add_argument("--basins", type=int, default=0,
                        help="N climbs from random points of U against the witness search, per radius")
    parser.add_argument("--integrand", action="store_true",
                        help="the relational curvature integral radius by radius, and what each part of U costs")
    args = parser.parse_args()
    from lipbound.measures.bert import load_text_model
    model = load_text_model()
    fractions = tuple(float(f) for f in args.fractions.split(","))
    texts = [args.text] if args.text else sentences(args.skip + args.sentences)[args.skip:]
    if args.second_derivative:
        for text in texts:
            if args.queries:
                query_groups_at_x(text, args.layer, model, args.matricized)
            else:
                centre_groups(text, args.layer, model)
        return
    if args.paths:
        for text in texts:
            joined_paths(text, args.layer, fractions, model)
        return
    if args.basins:
        for text in texts:
            witness_basins(text, args.layer, fractions, model, args.basins)
        return
    if args.integrand:
        for text in texts:
            for fraction in fractions:
                integrand(text, args.layer, fraction, model)
        return
    table: dict = {}
    for text in texts:
        for kind in args.kinds.split(","):
            modes = ("gram", "after") if args.without_covering else ("summed", "after") if args.without_joint \
                else ("unwidened", "after") if args.without_widened \
                else ("after",) if args.after_only else \
                ("before", "relational", "after") if args.without_jacobian else ("before", "after")
            runs = {mode: run(text, kind, args.layer, fractions, model, mode, args.recheck and kind != "block")
                    for mode in modes}
            after, seconds = runs["after"]
            print(f"{text!r} {kind} layer {args.layer}, n = {after.n}, ||DF(X)|| {after.jacobian_norm:.4g}, "
                  f"variation {after.variation_bound}, relational {after.relational}; CPU s: "
                  + ", ".join(f"{mode} {s:.0f}" for mode, (_, s) in runs.items()))
            for index, point in enumerate(after.points):
                ratio = point.certified / point.witness_rechecked[0] if point.witness_rechecked else point.ratio
                table.setdefault((kind, fractions[index]), []).append((ratio, point.cpu_seconds))
                before = runs["before"][0].points[index] if "before" in runs else None
                middle = runs["relational"][0].points[index] if "relational" in runs else None
                summed = runs["summed"][0].points[index] if "summed" in runs else None
                gram = runs["gram"][0].points[index] if "gram" in runs else None
                unwidened = runs["unwidened"][0].points[index] if "unwidened" in runs else None
                print(f"  eps {point.eps / after.radius:7.0e} R: certified {point.certified:10.4g} witness "
                      f"{point.witness:8.4g} ratio {point.ratio:8.3g}"
                      + (f" (re-checked: witness >= {point.witness_rechecked[0]:.10g}, ratio {ratio:8.3g})"
                         if point.witness_rechecked else "")
                      + (f" (before {before.certified:10.4g}, ratio {before.ratio:8.3g})" if before else "")
                      + (f" (without the Jacobian route {middle.certified:10.4g}, ratio {middle.ratio:8.3g})"
                         if middle else "")
                      + (f" (heads summed {summed.certified:10.4g}, ratio {summed.ratio:8.3g}, CPU s "
                         f"{summed.cpu_seconds:.1f})" if summed else "")
                      + (f" (Gram forms {gram.certified:10.4g}, ratio {gram.ratio:8.3g}, CPU s {gram.cpu_seconds:.1f})"
                         if gram else "")
                      + (f" (without the widened starts: witness {unwidened.witness:8.4g}, ratio "
                         f"{unwidened.ratio:8.3g}, CPU s {unwidened.cpu_seconds:.1f})" if unwidened else "")
                      + f"; variation {point.variation:9.4g} (found {point.variation_witness:.3g}); "
                        f"route: {point.route}; CPU s {point.cpu_seconds:.1f}; {point.verdict}")

    if args.table:
        import numpy as np
        for (kind, fraction), rows in table.items():
            ratios, seconds = np.array(rows).T
            print(f"{kind} eps {fraction:7.0e} R over {len(rows)} sentences: ratio median {np.median(ratios):.3g} "
                  f"worst {np.max(ratios):.3g} (best {np.min(ratios):.3g}); CPU s per radius median "
                  f"{np.median(seconds):.1f}, largest {np.max(seconds):.1f}")


if __name__ == "__main__":
    main()
