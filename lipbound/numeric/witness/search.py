"""The public searches: the structured search, naive ascent and Castin et al.'s input."""

from __future__ import annotations

import math
import time

import numpy as np

from ...errors import AssumptionError, WeightsError
from ..attention import heads_of, unit_rows
from ..blas import one_blas_thread
from ..domains import TokenBall, TokenDomain
from ..memory import available_bytes, require_memory
from ..model import Head, Layer
from .ascent import CONTINUATION_STAGES, GENERIC_FAMILIES, continuation, join, polish_best, rank_pool, take
from .clock import WORK_PER_SECOND, step_work
from .engine import engine_for
from .kernel_starts import head_ties, joint_ties, kernel_starts
from .layer_starts import layer_starts, scouted
from .problem import ROLES, SearchProblem
from .record import NORMS, Witness, project_to_ball
from .starts import castin_input
from .values import cross_value, jacobian_value, local_jacobian_norm, pull_inside, reference_maps, secant_value

__all__ = ["search_witness", "naive_ascent", "castin_adversarial"]

_NAIVE_LR = 0.003


def _check_domain(name: str, domain, d: int) -> None:
    if not isinstance(domain, TokenDomain):
        raise AssumptionError(name, "a TokenDomain (lipbound.numeric.domains)", type(domain).__name__,
                              "pass domain=TokenBall(R) or LayerNormOutputs(norm)")
    domain.check_width(d)
    domain.enclosing_ball()       # refuses unbounded domains


def _check_search_args(target, domain, n, budget_seconds, norm, m=None):
    """``(R, c, heads)``: the domain's enclosing ball and the heads; every argument checked."""
    heads = heads_of(target)[0]
    if isinstance(n, bool) or not (isinstance(n, (int, np.integer)) and n >= 1):
        raise AssumptionError("n", "an integer number of tokens >= 1", repr(n), "ask for `n` 8, say")
    if m is not None and (isinstance(m, bool) or not (isinstance(m, (int, np.integer)) and m >= 1)):
        raise AssumptionError("m", "an integer number of queries >= 1", repr(m), "ask for `m` 8, say")
    if not (isinstance(budget_seconds, (int, float)) and budget_seconds > 0):
        raise AssumptionError("budget_seconds", "a positive number of nominal seconds", repr(budget_seconds),
                              "give e.g. `budget_seconds` 10")
    if norm not in NORMS:
        raise AssumptionError("norm", f"one of {NORMS}", repr(norm), "use 'fro' or '2,1'")
    d = heads[0].d
    _check_domain("domain", domain, d)
    _check_memory(len(heads), int(n) + int(m or 0), d)
    radius, center = domain.enclosing_ball()
    return radius, np.zeros(d) if center is None else center, heads


#: Inputs the search holds at once (pool, polish, continuation) and n x n arrays per input and head.
_BATCH, _SQUARES = 32, 12


def _check_memory(heads: int, n: int, d: int) -> None:
    """The search keeps about ``_BATCH`` inputs with ``_SQUARES`` n x n float arrays per head each."""
    per_token_squared = _BATCH * _SQUARES * heads * 8
    needed = per_token_squared * n * n + _BATCH * 16 * n * d * 8
    largest = int((available_bytes() * 0.8 / per_token_squared) ** 0.5)
    require_memory(needed, "n", "witness search", largest)


#: Starts of one family whose values agree to this relative tolerance count as one (:func:`_distinct`).
_SAME_START = 1e-3


def _distinct(cands, order: list) -> list:
    """``order`` without the starts that repeat an earlier one of their family: a value within :data:`_SAME_START`
    of it.  Constructions that come in near copies (the rotary self-tied starts at n = 2, or whose later queries land
    on one point for two trade-offs, at the same value to 1e-5 or so) would otherwise take two of the polish's slots."""
    kept: list = []
    for i in order:
        if not any(cands.family[j] == cands.family[i]
                   and abs(cands.sigma[i] - cands.sigma[j]) <= _SAME_START * abs(cands.sigma[j]) for j in kept):
            kept.append(i)
    return kept


def _describe(target, domain: TokenDomain, origin, layer, head, block="encoder") -> dict:
    """What the witness is about: the map, its domain, and the weights (name, path, sha256)."""
    heads, _, _, residual = heads_of(target)
    return {"model": getattr(origin, "name", "") or "", "weights": getattr(origin, "path", "") or "",
            "sha256": getattr(origin, "sha256", "") or "", "layer": layer,
            "head": head if isinstance(target, Head) else None, "score": heads[0].kernel.name, "residual": residual,
            "domain": domain.describe(), "block": block}


def _domain_fields(domain: TokenDomain, prefix: str = "") -> dict:
    record = domain.record()
    fields = {f"{prefix}radius": float(record["radius"]), f"{prefix}center": record["center"]}
    if record["kind"] == "layernorm-image":
        fields[f"{prefix}gamma"] = record["gamma"]
    return fields


@one_blas_thread
def search_witness(target: Head | Layer, *, domain: TokenDomain, n: int, budget_seconds: float, seed: int = 0,
                   norm: str = "fro", origin=None, layer: int | None = None, head: int | None = None,
                   role: str = "self", m: int | None = None, query_domain: TokenDomain | None = None,
                   block: str = "encoder", polish_count: int = 12) -> Witness:
    """Find an input where ``target`` stretches as much as possible on its domain.

    Parameters
    ----------
    target : Head or Layer
        One head, or a multi-head layer with its output projection (causal heads: role "self").
    domain : TokenDomain
        Where the tokens live (self-attention), or the context (cross-attention).  A ball, or a
        LayerNorm image (an ellipsoid in a hyperplane: the search stays on it and its witness
        stores the exact coordinates that prove membership).
    n : int
        Number of tokens (of context tokens for cross-attention).
    budget_seconds : float
        Budget of the search in nominal seconds of work (:mod:`.clock`): a fixed number of steps
        and restarts for the shapes, about half that in CPU seconds on an idle core.  The search stops
        at the same step on any machine, so the seed alone fixes the witness.
    seed : int
    norm : {"fro", "2,1"}
        ``"fro"``: a jacobian witness; ``"2,1"``: a secant witness ``(X, Y)`` that moves one
        token, for ``||.||_{2,1}`` on inputs and outputs (self-attention only).
    origin : Model, optional
        The model the weights come from: its name, path and sha256 are recorded in the witness.
    layer, head : int
        Where the target sits in the model (counted from 0); ``block`` the stack.
    role : {"self", "cross-queries", "cross-context", "cross-joint"}
        The argument of the constant: self-attention, or cross-attention in the m queries (the
        context fixed), in the n context tokens, or in both.
    m : int, optional
        Queries of cross-attention (default n).
    query_domain : TokenDomain, optional
        Where the queries of cross-attention live (default: ``domain``).
    polish_count : int
        How many candidates are polished together.

    Returns
    -------
    Witness
        ``value`` recomputed with :mod:`lipbound.numeric.attention` at a point of the domain.

    Notes
    -----
    Candidates: structured alpha/beta inputs of every head (:func:`structured_starts`, dot-product
    self-attention; ties between far keys for cross-attention; for a rotary layer, its heads scouted alone through
    their blocks of ``W_O`` for 45% of the budget, :mod:`.layer_starts`), several heads tied at one input,
    Castin et al.'s adversarial input, random inputs with a continuation from a shrunk domain; the
    best (the two best of every constructed family among them) are polished together by an L-BFGS
    ascent of the local Jacobian norm in smooth coordinates of the domain, then the best alone, and,
    when it converges early, each other family's two best in turn (:func:`.ascent.polish_best`).  The
    starts are ranked in chunks, at least one; when that overruns the budget (a wide layer at a small budget), the
    continuation is left out where its share of the budget cannot pay its three stages, and the polish still gets
    half the budget.
    """
    if role not in ROLES:
        raise AssumptionError("role", f"one of {ROLES}", repr(role), "choose the argument of the constant")
    cross = role != "self"
    if cross:
        m = n if m is None else m
        if norm != "fro":
            raise AssumptionError("norm", "'fro' for cross-attention witnesses", repr(norm), "use norm='fro'")
    _check_search_args(target, domain, n, budget_seconds, norm, m if cross else None)
    query_domain = domain if query_domain is None else query_domain
    if cross:
        _check_domain("query_domain", query_domain, heads_of(target)[0][0].d)
    started, started_cpu = time.perf_counter(), time.process_time()
    problem = SearchProblem(target, role, domain, query_domain, n, m if cross else None)
    clock = problem.clock
    began = clock()
    deadline = began + budget_seconds * (0.9 if norm == "fro" else 0.75)
    rng = np.random.default_rng(seed)
    heads = problem.engine.heads
    # the cost of one input grows like n^2: fewer candidates for long inputs keep the budget
    work = max(1.0, (problem.rows / 64) ** 2)
    polish_count = max(2, int(polish_count / work))
    until = began + 0.25 * (deadline - began)
    pool = []
    scout = scouted(problem)
    if scout:                     # a rotary layer: its heads scouted alone, then tied together and combined
        pool += layer_starts(problem, rng, began + 0.45 * (deadline - began), work, kernel_starts, head_ties,
                             joint_ties)
    else:
        pool += kernel_starts(problem, rng, until, work)   # the structured starts of the head's kernel
    pool.append((problem.random(rng, max(2, int(8 / work)), 1 - 1e-6), "random"))
    # a few power steps rank the starts (the polish refines E); more would leave fewer starts ranked at all
    cands = rank_pool(problem, pool, rng, 8 if len(heads) == 1 else 6, max(1, int(32 / work)),
                      began + (0.6 if scout else 0.4) * (deadline - began))
    families = list(dict.fromkeys(cands.family))
    pooled = clock()
    # the first chunk is always ranked: on a wide layer at a small budget it may use the whole budget, and the
    # best start is then never polished (SmolLM2 block 0's layer at budget 4: 2932 as started, 3228 after one more
    # budget's polish); the continuation and the polish keep at least half the budget
    deadline = max(deadline, pooled + 0.5 * (deadline - began))
    # keep the two best of every constructed family (its best start is not always the one that climbs: the
    # polish gives the family's two a turn of their own), the best of the others, then the best overall
    order = _distinct(cands, list(np.argsort(-np.where(np.isfinite(cands.sigma), cands.sigma, -np.inf))))
    chosen = [i for family in families
              for i in [i for i in order if cands.family[i] == family][:1 if family in GENERIC_FAMILIES else 2]]
    chosen += [i for i in order if i not in chosen][:max(polish_count - len(chosen), 0)]
    cands = take(cands, chosen)
    # continuation from random inputs gets a sixth of the remaining time, if that pays for its three stages'
    # evaluations (30 power steps each); on a wide layer at a small budget it would take the polish's time
    now = clock()
    count = max(1, int(4 / work))
    stages_work = len(CONTINUATION_STAGES) * 33 * step_work(count, problem.work_per_input)
    if (deadline - now) / 6 >= stages_work / WORK_PER_SECOND:
        cands = join(cands, continuation(problem, rng, count, now + (deadline - now) / 6))
    cands = polish_best(problem, cands, deadline)
    polished = clock()
    best = int(np.argmax(np.where(np.isfinite(cands.sigma), cands.sigma, -np.inf)))
    # the final point, exactly in the domain, and a few more power steps there
    X, Y = problem.lift(cands.X[best][None])
    X, coordinates = domain.representable(X[0])
    if cross:
        Y, query_coordinates = query_domain.representable(Y[0])
        coordinates.update(_named("Q", query_coordinates))
    coordinates = {("X" if key == "z" else key): value for key, value in coordinates.items()}
    Z = problem.to_work(X[None], None if Y is None else Y[None])
    _, E, _ = problem.evaluate(Z, cands.E[best][None], 20)
    if not np.any(E * problem.mask):   # the map is constant in its argument (e.g. one key): any direction
        E = unit_rows(problem.mask[None] * np.ones_like(E))
    E_X, E_Y = problem.lift_directions(E)
    details = {"family": cands.family[best], "search_sigma": float(cands.sigma[best]),
               "candidates": len(cands.sigma), "pool_work": round(pooled - began, 6),
               "polish_work": round(polished - pooled, 6)}
    about = _describe(target, domain, origin, layer, head, block)
    fields = _domain_fields(domain)
    if cross:
        fields.update(_domain_fields(query_domain, "query_"))
        about["domain"] = f"queries: {query_domain.describe()}; context: {domain.describe()}"
        E_X, w = domain.representable_directions(E_X[0]) if role != "cross-queries" else (np.zeros_like(X), {})
        EQ, wq = query_domain.representable_directions(E_Y[0]) if role != "cross-context" else (None, {})
        coordinates.update(_named("E", w))
        coordinates.update(_named("EQ", wq))
        value = cross_value(target, Y, X, EQ, E_X)
        details.update(seconds=round(time.perf_counter() - started, 3),
                       cpu_seconds=round(time.process_time() - started_cpu, 3))
        return Witness(kind="jacobian", X=X, E=E_X, Q=Y, EQ=EQ, value=value, norm="fro", seed=seed, role=role,
                       method="structured+polish", details=details, coordinates=coordinates, **fields, **about)
    E, w = domain.representable_directions(E_X[0])
    coordinates.update(_named("E", w))
    value = jacobian_value(target, X, E)
    if norm == "fro":
        details.update(seconds=round(time.perf_counter() - started, 3),
                       cpu_seconds=round(time.process_time() - started_cpu, 3))
        return Witness(kind="jacobian", X=X, E=E, value=value, norm="fro", seed=seed, method="structured+polish",
                       details=details, coordinates=coordinates, **fields, **about)
    Y, ratio, token, y_coordinates = _secant_21(target, X, E, domain)
    coordinates.update(_named("Y", y_coordinates))
    details.update({"moved_token": token, "jacobian_value": value, "seconds": round(time.perf_counter() - started, 3),
                    "cpu_seconds": round(time.process_time() - started_cpu, 3)})
    return Witness(kind="secant", X=X, Y=Y, value=ratio, norm="2,1", seed=seed, method="structured+polish+secant",
                   details=details, coordinates=coordinates, **fields, **about)


def _secant_21(target, X: np.ndarray, E: np.ndarray, domain: TokenDomain):
    """Turn a point into a (2,1)-norm secant witness ``(X, Y)`` that moves one token.

    For each token j, the unit e maximising ``sum_i ||J_ij e||`` (a convex function of e) is
    approached by the monotone iteration ``e <- sum_i J_ij^T (J_ij e) / ||J_ij e||`` (all j in
    one batch), kept tangent to the domain; then a scan over step lengths ``t`` and both signs
    picks ``Y = X + t e_j`` (pulled into the domain) with the largest ratio
    ``||f(X) - f(Y)||_{2,1} / ||X - Y||_{2,1}``.  Returns ``(Y, ratio, j, coordinates of Y)``."""
    forward, jvp, vjp = reference_maps(target)
    n, d = X.shape
    diagonal = (np.arange(n), np.arange(n))
    around = np.broadcast_to(X, (n, n, d))
    tangent_of = domain.tangent_directions
    e = unit_rows(tangent_of(E + (np.linalg.norm(E, axis=1, keepdims=True) == 0) / math.sqrt(d)))
    for _ in range(30):
        tangent = np.zeros((n, n, d))
        tangent[diagonal] = e
        out = jvp(around, tangent)[1]
        rows = np.linalg.norm(out, axis=2, keepdims=True)
        back = tangent_of(vjp(around, out / np.where(rows > 0, rows, 1.0))[diagonal])
        e = np.where(np.linalg.norm(back, axis=1, keepdims=True) > 0, unit_rows(back), e)
    f_X = forward(X[None])[0]
    radius, _ = domain.enclosing_ball()
    lengths = radius * np.geomspace(1e-6, 0.3, 40)
    moves = np.concatenate([lengths, -lengths])
    best = (-1.0, None, -1)
    for j in range(n):
        Y = np.repeat(X[None], len(moves), axis=0)
        Y[:, j] = X[j] + moves[:, None] * e[j]
        Y = domain.retract(Y)
        moved_in = np.linalg.norm(X - Y, axis=2).sum(axis=1)
        moved_out = np.linalg.norm(f_X - forward(Y), axis=2).sum(axis=1)
        ratios = np.where(moved_in > 0, moved_out / np.where(moved_in > 0, moved_in, 1.0), -1.0)
        k = int(np.argmax(ratios))
        if ratios[k] > best[0]:
            best = (float(ratios[k]), Y[k], j)
    _, Y, j = best
    Y, coordinates = domain.representable(Y)
    return Y, secant_value(target, X, Y, "2,1"), j, coordinates


@one_blas_thread
def _named(key: str, found: dict) -> dict:
    """The coordinate array a domain's chart gives (at most one) under ``key``; empty when it gives none."""
    if len(found) > 1:
        raise ValueError(f"one coordinate array expected, got {sorted(found)}")
    return {key: next(iter(found.values()))} if found else {}


def naive_ascent(target: Head | Layer, *, domain: TokenDomain, n: int, budget_seconds: float, seed: int = 0,
                 norm: str = "fro", batch: int = 32, origin=None, layer: int | None = None,
                 head: int | None = None) -> Witness:
    """The baseline: gradient ascent (Adam) of the secant ratio ``||f(X) - f(Y)|| / ||X - Y||``
    from random starts, projected onto the domain's enclosing ball (the witness records that ball),
    for ``budget_seconds``.

    Starts: tokens uniform on the sphere ``||x - c|| = R`` (in all d coordinates) and
    ``Y = X + 0.05 R g / sqrt(d)`` with g standard normal; ``batch`` restarts run together and new
    ones replace them every 300 steps.  Adam's step decays linearly from ``0.003 R`` (the best of
    0.0003 R .. 0.03 R on all-MiniLM-L6-v2 layer 0 head 0, n = 8), so the baseline is a tuned
    one.  Returns the best pair as a secant witness (value recomputed with
    :mod:`lipbound.numeric.attention`).
    """
    radius, center, heads = _check_search_args(target, domain, n, budget_seconds, norm)
    began = time.perf_counter()
    deadline = began + budget_seconds
    rng = np.random.default_rng(seed)
    engine = engine_for(target, center, reduce=False)
    d = engine.d_in
    best = (-1.0, None, None)
    rounds = 0
    while rounds == 0 or time.perf_counter() < deadline:
        rounds += 1
        X = radius * unit_rows(rng.standard_normal((batch * n, d))).reshape(batch, n, d)
        Y = project_to_ball(X + 0.05 * radius * rng.standard_normal(X.shape) / math.sqrt(d), radius, 0.0)
        state = [np.zeros_like(X), np.zeros_like(X), np.zeros_like(Y), np.zeros_like(Y)]
        lr0 = _NAIVE_LR * radius
        for step in range(1, 301):
            if time.perf_counter() >= deadline and best[1] is not None:
                break
            ratio, gX, gY = _secant_grad(engine, X, Y, norm)
            top = int(np.argmax(ratio))
            if ratio[top] > best[0]:
                best = (float(ratio[top]), X[top].copy(), Y[top].copy())
            lr = lr0 * (1 - step / 301) + 1e-4 * radius
            X, state[0], state[1] = _adam(X, gX, state[0], state[1], step, lr)
            Y, state[2], state[3] = _adam(Y, gY, state[2], state[3], step, lr)
            X, Y = project_to_ball(X, radius, 0.0), project_to_ball(Y, radius, 0.0)
    X = pull_inside(engine.from_work(best[1]), center, radius)
    Y = pull_inside(engine.from_work(best[2]), center, radius)
    value = secant_value(target, X, Y, norm)
    details = {"rounds": rounds, "batch": batch, "search_ratio": best[0],
               "seconds": round(time.perf_counter() - began, 3)}
    return Witness(kind="secant", X=X, Y=Y, value=value, norm=norm, radius=radius, center=center, seed=seed,
                   method="naive-ascent", details=details,
                   **_describe(target, TokenBall(radius, center), origin, layer, head))


def _adam(x, g, m, v, step, lr):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    update = (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-12)
    return x + lr * update, m, v


def _secant_grad(engine, X, Y, norm):
    """Ratio ``r = N(f(X) - f(Y)) / N(X - Y)`` and its gradients in X and Y (batched)."""
    lx, ly = engine.linearize(X), engine.linearize(Y)
    diff_out, diff_in = lx.F - ly.F, X - Y
    if norm == "fro":
        top = np.sqrt(np.sum(diff_out ** 2, axis=(1, 2)))
        bottom = np.sqrt(np.sum(diff_in ** 2, axis=(1, 2)))
        g_top = diff_out / np.maximum(top, 1e-300)[:, None, None]
        g_bottom = diff_in / np.maximum(bottom, 1e-300)[:, None, None]
    else:
        rows_out = np.linalg.norm(diff_out, axis=2, keepdims=True)
        rows_in = np.linalg.norm(diff_in, axis=2, keepdims=True)
        top, bottom = rows_out.sum(axis=(1, 2)), rows_in.sum(axis=(1, 2))
        g_top = diff_out / np.maximum(rows_out, 1e-300)
        g_bottom = diff_in / np.maximum(rows_in, 1e-300)
    bottom = np.maximum(bottom, 1e-300)
    ratio = top / bottom
    gX = (lx.vjp(g_top) - ratio[:, None, None] * g_bottom) / bottom[:, None, None]
    gY = (-ly.vjp(g_top) + ratio[:, None, None] * g_bottom) / bottom[:, None, None]
    return ratio, gX, gY


@one_blas_thread
def castin_adversarial(head: Head, *, domain: TokenDomain, n: int, origin=None, layer: int | None = None,
                       head_index: int | None = None, iterations: int = 300) -> Witness:
    """Castin, Ablin, Peyre (ICML 2024) adversarial input and its local Jacobian norm.

    From the real eigenpairs of their ``A = K^T Q / sqrt(d_k)`` (our ``A^T``; eigenvalues as
    ``numpy.linalg.eig`` returns them, no symmetrisation, as in their released code): if
    ``lambda_max > -8 lambda_min`` the top eigenvector u gives ``x_1 = R u``,
    ``x_2 = .. = x_n = R u / 2``; else the bottom one gives ``x_1 = -R u``, ``x_2 = .. = x_n = R u``
    (tokens about ``center``).  The value is ``||Df(X)[E]||`` of this head after power iteration
    (their code evaluates the whole self-attention block, all heads, at the input built from one head).
    """
    if not isinstance(head, Head):
        raise WeightsError("head", "a single Head (the construction uses one matrix A)", type(head).__name__,
                           "pass layer.heads[h]")
    radius, center, _ = _check_search_args(head, domain, n, 1.0, "fro")
    X = pull_inside(castin_input(head.W_Q, head.W_K, radius, n) + center, center, radius)
    value, E = local_jacobian_norm(head, X, iterations=iterations)
    return Witness(kind="jacobian", X=X, E=E, value=value, norm="fro", radius=radius, center=center, seed=0,
                   method="castin-adversarial", **_describe(head, TokenBall(radius, center), origin, layer, head_index))

