"""Diagnostics of the key term of rotary heads and layers at their witnesses, for ``bench_decoders.py --stacked``
(docs/mathematics.md, section 14): the key part of the Jacobian at a witness as one operator against its rows (and a
layer's heads and key/value groups apart), the key gradient a query reaches with a non-positive own score, and a row's
query and key parts bounded through one second moment; and at the worst move of a head's centred row split, what any
input gives (``--worst-move``).  Floats throughout: diagnostics, never bounds."""

from __future__ import annotations

import numpy as np


def key_operator(target, X: np.ndarray, output=None) -> np.ndarray:
    """The key part of ``Df(X)`` (the tokens moved only as keys) as one matrix, (n d_out, n d), in floats: column
    ``(t, k)`` is the key part of the move of token t along coordinate k (one batched JVP per token), seen through
    ``output`` (a head's block of ``W_O``) when given."""
    from lipbound.numeric.attention import AttentionMap

    n, d = X.shape
    linear = AttentionMap(target).linearize(np.repeat(X[None], d, 0))
    columns = []
    for token in range(n):
        moves = np.zeros((d, n, d))
        moves[np.arange(d), token, np.arange(d)] = 1.0
        part = linear.jvp_parts(moves)["key"]                                     # (d, n, d_out)
        columns.append((part if output is None else part @ output).reshape(d, -1))
    return np.concatenate(columns).T


def _top_singular(J: np.ndarray) -> float:
    """``||J||_2`` by Lanczos (a dense SVD of the 4608-wide operators of SmolLM2 at n = 8 takes about a CPU minute)."""
    from scipy.sparse.linalg import svds

    if not np.any(J):
        return 0.0
    if min(J.shape) < 3:
        return float(np.linalg.norm(J, 2))
    return float(svds(J, k=1, return_singular_vectors=False, random_state=0)[0])


def stacked_key_parts(model, report) -> dict:
    """Per row ``(layer, head)``, at its witness X: the norm of the key part of ``Df(X)`` as one operator over all
    rows (what every key-term bound bounds from above at that X) against the square root of the sum of its rows'
    squared norms (what the row-by-row bounds add up); for a layer also each head's key part through its block of
    ``W_O``, their sum of norms, and each key/value group's heads together.  Floats, a diagnostic."""
    from lipbound.numeric.witness import Witness

    out = {}
    for row in report.rows:
        attention = model.layer(row.layer, row.block).attention
        target = attention if row.head is None else attention.heads[row.head]
        X = Witness.load(row.witness_file).X
        J = key_operator(target, X)
        d_out = J.shape[0] // X.shape[0]
        rows = [_top_singular(J[i * d_out:(i + 1) * d_out]) for i in range(X.shape[0])]
        found = {"stacked": _top_singular(J), "rows": float(np.sqrt(np.sum(np.square(rows))))}
        if row.head is None:
            parts = [key_operator(head, X, attention.output_block(h)) for h, head in enumerate(attention.heads)]
            found["heads"] = float(sum(_top_singular(P) for P in parts))
            found["groups"] = [_top_singular(sum(parts[h] for h in attention.group_heads(g)))
                               for g in range(attention.num_groups)]
        out[(row.layer, row.head)] = found
    return out


def own_score_reach(head, domain, n: int) -> list[float] | None:
    """Per causal offset ``Delta = -(n - 1) .. -1``, the largest key gradient ``||Pi A_Delta^T M w||`` of a query
    ``M w`` (``||w|| <= r``) whose own score ``w^T M^T A_0 M w`` is at most 0, as a fraction of the largest over all
    queries (``beta`` at that offset): ``min_{mu >= 0} lambda_max(G - mu H)``, ``G = M^T A_Delta Pi A_Delta^T M``, ``H``
    the symmetric part of ``M^T A_0 M`` (exact: the joint range of two quadratic forms on the sphere is convex).  A
    query with a larger gradient scores itself above zero, and the keys it weighs must outscore it out of their own
    ball.  Floats, a diagnostic; None outside a rotary or dot-product head on a region about 0."""
    from scipy.optimize import minimize_scalar

    from lipbound.numeric.sdp.rotary import PositionalHeadBounds, positional_scope

    if not positional_scope(head):
        return None
    bounds = PositionalHeadBounds(head, domain, n)
    if np.any(bounds.region.center):
        return None
    queries, keys = bounds.queries_shaped.mid, bounds.keys_shaped.mid            # sigma W_Q^T M, W_K^T M
    own = queries.T @ bounds.rotations[0].mid @ keys
    H = 0.5 * (own + own.T)
    top = max(float(np.linalg.eigvalsh(H)[-1]), 1e-300)
    out = []
    for delta in range(-(n - 1), 0):
        F = bounds.key_left.mid @ bounds.rotations[delta].mid.T @ queries         # Pi A_Delta^T M
        G = F.T @ F
        beta2 = max(float(np.linalg.eigvalsh(G)[-1]), 1e-300)
        found = minimize_scalar(lambda mu: float(np.linalg.eigvalsh(G - mu * H)[-1]), bounds=(0.0, 10 * beta2 / top),
                                method="bounded")
        out.append(float(np.sqrt(max(min(found.fun, beta2), 0.0) / beta2)))
    return out


def row_joint_estimate(head, domain, n: int) -> float | None:
    """A row's query and key parts through one second moment (docs/mathematics.md, section 14), in floats: step 6's
    split with ``(1 + t_j) b_j^2`` replaced by ``c(theta_j)^2 / theta_j`` and ``(1 + 1/t_i) rho^2`` by ``c(theta_i)^2 /
    (1 - theta_i)``, ``c(theta) = (r^2 / 2) min_a max_Delta [lambda_max(a M^T V V^T M + theta M^T A_Delta^T Pi A_Delta M
    / a) + (1 - theta) / (r^2 a)]``, the ``theta_i`` from a grid by coordinate descent, plus the mean term.  None where
    step 1b or the key forms by columns do not apply (a centre or biases).  A diagnostic, never a bound."""
    from scipy.optimize import minimize_scalar

    from lipbound.numeric.sdp.rotary import PositionalHeadBounds, positional_scope
    from lipbound.rigorous.intervals import upper
    from lipbound.rigorous.linalg import Enclosure

    if not positional_scope(head):
        return None
    bounds = PositionalHeadBounds(head, domain, n)
    if np.any(bounds.region.center) or np.any(head.b_Q) or np.any(head.b_K):
        return None
    r, rows = float(bounds.r), bounds.rows
    values = bounds.region.times_shape(Enclosure.exact(head.W_V.T)).mid.T                # M^T V, (d, d_v)
    scores = {delta: (bounds.query_left.mid @ R.mid @ bounds.keys_scaled.mid) for delta, R in bounds.rotations.items()}
    basis = np.linalg.qr(np.concatenate([values, bounds.keys_shaped.mid.T], axis=1))[0]     # span [M^T V, M^T W_K]
    G2 = basis.T @ values @ values.T @ basis
    G1 = [basis.T @ F.T @ F @ basis for F in scores.values()]

    def c(theta: float) -> float:
        def top(log_a: float) -> float:
            a = np.exp(log_a)
            return max(float(np.linalg.eigvalsh(a * G2 + theta * G / a)[-1]) for G in G1) + (1 - theta) / (r * r * a)
        return r * r / 2 * minimize_scalar(top, bounds=(-30.0, 30.0), method="bounded").fun

    thetas = 1 / (1 + np.exp(np.linspace(-4.0, 16.0, 41)))
    cs = np.array([c(theta) for theta in thetas])
    nus = np.array([float(upper(bounds.row_nu(i, with_cap=False))) for i in range(n)])
    root = np.linalg.qr(bounds.key_left.mid)[1]                                   # Pi W_K = Q root
    forms = {(i, j): nus[i] * r * r * (Y := root @ bounds.rotations[j - i].mid.T @ bounds.queries_shaped.mid) @ Y.T
             for i in range(n) for j in range(n) if rows.visible[i, j] and nus[i] > 0}

    def value(index: list[int]) -> float:
        worst = 0.0
        for j in range(n):
            query = cs[index[j]] ** 2 / thetas[index[j]] if rows.key_counts[j] >= 2 else 0.0
            keys = sum((cs[index[i]] ** 2 / (1 - thetas[index[i]]) * forms[(i, j)]
                        for i in range(n) if (i, j) in forms), np.zeros((root.shape[0],) * 2))
            worst = max(worst, query + float(np.linalg.eigvalsh(keys)[-1]))
        return float(np.sqrt(worst))

    best, index = min((value([k] * n), [k] * n) for k in range(len(thetas)))
    for _ in range(2):
        for i in range(n):
            for k in range(len(thetas)):
                trial = index[:i] + [k] + index[i + 1:]
                found = value(trial)
                if found < best:
                    best, index = found, trial
    mean = float(upper(bounds.value_norm)) * float(np.sqrt(float(upper(bounds.terms()["kappa"]))))
    return best + mean


def _first_mean(score: float, largest: float, turn: float, r: float) -> float:
    """The least ``m`` in ``[0, r]`` with ``largest m + turn (r^2 - m^2)^(1/2) >= score`` (0 when ``m = 0`` already
    satisfies it): the shortest mean of the keys a row can have when its mean score is at least ``score``, its keys'
    gradients are at most ``largest`` long and at most ``turn`` from one common vector (own_score_ceiling)."""
    if score <= turn * r:
        return 0.0
    total = largest * largest + turn * turn
    root = turn * turn * (total * r * r - score * score)
    return r if root < 0 else min(r, (score * largest - np.sqrt(root)) / total)


def own_score_ceiling(head, domain, n: int, mus: int = 41) -> list[tuple[float, float]] | None:
    """How much of a row's key gradient a bound through the query's own score could remove: per causal offset ``Delta
    = -(n - 1) .. -1``, ``(sup_w f(w) ||F w||^2)^(1/2) / beta_Delta`` with ``F = Pi A_Delta^T M``, in two forms of f.

    Row i sees its own key (causal mask), so with ``N`` keys ``E_p s_ij >= s_ii - log N`` (``log sum_j exp s_ij =
    E_p s + H(p) >= s_ii`` and ``H(p) <= log N``), and the keys' value spread is at most ``|t|^2 tr Cov_p(w) <= |t|^2
    (r^2 - m^2)`` with ``m = ||E_p w||`` (chart coordinates).  With one key gradient g for every key (a dot product)
    ``E_p s = g . E_p w``, so ``m >= (s_ii - log N)_+ / |g|`` and the row's key part carries the factor ``f = 1 - m^2 /
    r^2`` on ``rho^2``: the first number (ideal: rotations ignored, a ceiling of what the coupling can give).  With
    rotations key j is scored through ``g_j = C_{Delta_j}^T w_i``; ``E_p s <= gamma m + delta (r^2 - m^2)^(1/2)`` with
    ``gamma = max_j |g_j|`` and ``delta = max_j |g_j - gbar|`` (``gbar`` the mean offsets' form at ``w_i``): the second
    number (what a bound that sees the rotations only through these two lengths could use).  Both are lower estimates
    of the supremum (``w`` over ``r`` times the top eigenvectors of ``F^T F - mu H``, ``mu`` on a grid, on the span of
    ``M W_Q`` and ``M W_K`` where everything lives), so ``1 -`` each is at least the share such a bound removes from
    ``beta``.  Floats, a diagnostic; None outside a causal rotary or dot-product head on a region about 0."""
    from lipbound.numeric.sdp.rotary import PositionalHeadBounds, positional_scope

    if not positional_scope(head) or not head.mask.causal:
        return None
    bounds = PositionalHeadBounds(head, domain, n)
    if np.any(bounds.region.center) or np.any(head.b_Q) or np.any(head.b_K):
        return None
    r = float(bounds.r)
    queries, keys = bounds.queries_shaped.mid, bounds.keys_shaped.mid            # sigma W_Q^T M, W_K^T M
    span = np.linalg.qr(np.concatenate([queries.T, keys.T], axis=1))[0]          # (d, 2 d_k)
    # span^T C_Delta, C_Delta = M^T A_Delta M the chart's scores (w_i^T C_Delta w_j): the key gradient is C_Delta^T w_i
    forms = {delta: span.T @ queries.T @ R.mid @ keys for delta, R in bounds.rotations.items()}
    mean_form = sum(forms.values()) / len(forms)
    own = forms[0] @ span
    H = 0.5 * (own + own.T)
    top_own = max(float(np.linalg.eigvalsh(H)[-1]), 1e-300)
    out = []
    for delta in range(-(n - 1), 0):
        F = bounds.key_left.mid @ bounds.rotations[delta].mid.T @ queries @ span   # Pi A_Delta^T M on the span
        G = F.T @ F
        beta2 = max(float(np.linalg.eigvalsh(G)[-1]), 1e-300) * r * r
        ideal = turned = 0.0
        for mu in np.linspace(0.0, 4 * beta2 / (r * r * top_own), mus):
            for y in np.linalg.eigh(G - mu * H)[1][:, -3:].T:
                w = r * y                                                         # span coordinates, ||w|| = r
                score = float(w @ H @ w) - np.log(n)
                gradients = {d: C.T @ w for d, C in forms.items()}               # C_Delta^T w (chart)
                own_gradient = np.linalg.norm(gradients[0])
                reach = float(np.linalg.norm(F @ w)) ** 2
                m = max(score, 0.0) / max(own_gradient, 1e-300)
                ideal = max(ideal, (1 - min(m / r, 1.0) ** 2) * reach)
                centre = mean_form.T @ w
                largest = max(float(np.linalg.norm(g)) for g in gradients.values())
                turn = max(float(np.linalg.norm(g - centre)) for g in gradients.values())
                m = _first_mean(score, largest, turn, r)
                turned = max(turned, (1 - (m / r) ** 2) * reach)
        out.append((float(np.sqrt(ideal / beta2)), float(np.sqrt(turned / beta2))))
    return out


class _RowsOfProblem:
    """A head's :class:`~lipbound.numeric.witness.problem.SearchProblem` whose objective is ``||P (Df(X)[E])||`` for a
    fixed unit E, P keeping the output rows ``rows``: what :func:`~lipbound.numeric.witness.ascent.polish` climbs
    with ``power_steps=0`` when the rows of one output are to be reached apart."""

    def __init__(self, problem, rows: list[int]):
        self.problem = problem
        self.keep = np.zeros((1, problem.rows, 1))
        self.keep[0, rows] = 1.0

    def __getattr__(self, name: str):
        return getattr(self.problem, name)

    def evaluate(self, Z: np.ndarray, E: np.ndarray, steps: int):
        from lipbound.numeric.attention import unit_rows

        problem = self.problem
        problem.clock.charge_steps(len(Z), 3, problem.work_per_input)
        linear = problem.linearize(Z)
        E = unit_rows(E)
        JE = linear.jvp(E[..., :problem.context.width]) * self.keep
        sigma = np.sqrt(np.einsum("bij,bij->b", JE, JE))
        return sigma, E, linear.curvature(E, JE / np.maximum(sigma, 1e-300)[:, None, None])


def worst_move_reach(head, domain, n: int, budget: float = 4.0, seed: int = 0) -> dict | None:
    """At the worst move E of step 9's form (the centred row split, :func:`~lipbound.numeric.sdp.rotary_centred.
    centred_head_rows` with ``move=True``: the move where the bound is attained, unmerged rows), how much any input
    gives: ``coupled`` the largest ``||Df(X)[E]||`` found (L-BFGS over X with E held, from the head's kernel starts
    and random inputs, ``budget`` nominal seconds), ``rows`` the largest ``||row i of Df(X)[E]||`` found for each row
    alone (a fifth of the budget each, X free per row), ``free`` the largest ``||Df(X)||`` after a polish of the
    coupled ascent's inputs with E free (``budget`` again): a start of the witness search from the bound's own worst
    move.  ``parts`` each row's query and key parts at the input where that row was largest, ``charges`` what step 9
    charges each row at E for them (:func:`_row_charges`).  ``form`` the float value of the form at E (the mean term
    left out), ``shares`` the tokens' shares of ``||E||^2``.  None where step 9 does not apply.  Floats: lower
    estimates of each supremum, never bounds."""
    from lipbound.numeric.sdp.rotary import PositionalHeadBounds, positional_scope
    from lipbound.numeric.sdp.rotary_centred import centred_head_rows
    from lipbound.numeric.witness.ascent import Candidates, polish
    from lipbound.numeric.witness.kernel_starts import kernel_starts
    from lipbound.numeric.witness.problem import SearchProblem
    from lipbound.numeric.witness.values import jacobian_parts

    if not positional_scope(head):
        return None
    bounds = PositionalHeadBounds(head, domain, n)
    if not bounds.certified or not bounds.terms()["several"]:
        return None
    found = centred_head_rows(bounds, bounds.terms()["b"], estimate=True, move=True)
    if found is None:
        return None
    form, E, _ = found
    problem = SearchProblem(head, "self", domain, None, n, None)
    basis = problem.engine.basis
    moves = E if basis is None else E @ basis
    rng = np.random.default_rng(seed)
    pool = kernel_starts(problem, rng, problem.clock() + budget / 4) + [(problem.random(rng, 8, 1 - 1e-6), "random")]
    Z = np.concatenate([inputs for inputs, _ in pool])
    starts = Candidates(Z, np.repeat(moves[None], len(Z), 0), np.full(len(Z), -np.inf),
                        [family for inputs, family in pool for _ in inputs])
    coupled = polish(problem, starts, problem.clock() + budget, power_steps=0)
    reached = [polish(_RowsOfProblem(problem, [i]), starts, problem.clock() + budget / 5, power_steps=0)
               for i in range(n)]
    rows, parts = [], []
    for i, found_i in enumerate(reached):
        best = int(np.argmax(found_i.sigma))
        rows.append(float(found_i.sigma[best]))
        X = problem.lift(found_i.X[best][None])[0][0]
        split = jacobian_parts(head, X, E)
        parts.append((float(np.linalg.norm(split["query"][i])), float(np.linalg.norm(split["key"][i]))))
    free = polish(problem, coupled, problem.clock() + budget)
    return {"form": form, "shares": (E ** 2).sum(axis=1).tolist(), "coupled": float(np.max(coupled.sigma)),
            "rows": rows, "parts": parts, "charges": _row_charges(bounds, E), "free": float(np.max(free.sigma))}


def _row_charges(bounds, E: np.ndarray) -> list[tuple[float, float]]:
    """Per row i, step 9's two charges at the move E before the split: the query part ``b ||P_Q e_i||`` (0 for a row
    of one key) and the key part ``rho r ((1/2) sum_j ||c_j - cbar||^2)^(1/2)`` over the row's keys (``nu_i rho^2 r^2
    sum_j ||c_j||^2`` for a row whose weights are confined), ``c_j = sigma M^T W_Q R_{j-i} W_K^T Pi e_j``."""
    from lipbound.rigorous.intervals import upper

    rows, n = bounds.rows, bounds.rows.n
    b, spread, r = (float(upper(value)) for value in (bounds.terms()["b"], bounds.spread, bounds.r))
    basis = np.linalg.qr(bounds.query_left.mid)[0]
    charges = []
    for i in range(n):
        keys = [j for j in range(n) if rows.visible[i, j]]
        query = b * float(np.linalg.norm(basis.T @ E[i])) if len(keys) >= 2 else 0.0
        c = np.array([bounds.queries_shaped.mid.T @ bounds.rotations[j - i].mid @ bounds.key_left.mid.T @ E[j]
                      for j in keys])
        nu = float(upper(bounds.row_nu(i)))
        spread2 = 0.5 * float(np.sum((c - c.mean(axis=0)) ** 2)) if nu >= 0.5 else nu * float(np.sum(c ** 2))
        charges.append((query, spread * r * float(np.sqrt(spread2)) if len(keys) >= 2 else 0.0))
    return charges
