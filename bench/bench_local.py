"""Local certificates on real text: how close the certified movements come to the measured ones.

On all-MiniLM-L6-v2 and the 20 sentences of lipbound/measures/data/sentences.txt (layers counted from 0):

* ``path``  -- predicted_path / measured per layer, replace / insert / delete, k = 1..3 (nested edits,
  seed 0); target <= 2 at every layer; every row's chain checked (violations must be 0);
* ``set``   -- predicted_set / worst_witness for k = 1 over the whole vocabulary (every one of the 30522
  tokens through the model: the worst edit is exact), every layer; targets <= 3 at layer 0 and <= 10
  at layer 5; the wall time of the first sentence is the ``time`` figure (target < 120 s for 6 layers);
* ``curve`` -- L(eps) certified / witness of the attention layer (with its residual) for eps up to 1% of
  the LayerNorm radius (target <= 1.5), and whether the certified curve meets the global constant at
  eps = 2 R, with each curve's wall time; on the two shortest sentences, or on sentences of the token
  counts ``--curve-lengths`` (e.g. 8,14,16,20,24,37) with the curvature bound's Gram route up to
  ``--curvature-tokens`` and its split bound beyond, and on any ``--curve-text`` (longer inputs: the
  Jacobian at X by groups of tokens beyond 42 tokens); each line names how ``||DF(X)||`` and the
  variation were bounded; ``--curve-kinds block stack`` for whole layers and stacks (``--stack-depth`` layers,
  each stack followed by its per-block breakdown), ``--fractions`` for the radii;
* ``time``  -- the CPU seconds of issue 29's time figures (``--time-kinds``): the attention layer's curve at four
  radii (n = 9, target <= 30 s), the whole layer's per radius (n = 9, <= 60 s), the six-layer stack's curve (n = 20,
  < 5 minutes, within 8 GB), each split into the set-up every radius shares and each radius's own work, with the
  process's peak resident memory so far (run the stack under ``ulimit -v``), and the stack's per block;
* ``zchange`` -- z's change on the Frobenius ball (the score changes centred at X's weights; lemmas curvature-joint
  and curvature-centred-change) on layer 0 at ``--zchange-text`` and ``--zchange-fraction`` of R, per query with the
  first group's variance scales: the blockwise bound, the heads together, and the largest change an alternating
  ascent finds (z's change is bilinear in the movement and the direction; a float lower estimate, never a bound);
* ``fits``  -- from the ``path`` rows: least-squares exponents of ``W1 ~ C k^a n^b`` for the measured and
  the certified movements per layer (a = -b is a law in k / n), and of ``W1 ~ C (k / n)^c``.

Run: ``python bench/bench_local.py [--parts path set curve fits time] [--sentences 20] [--figure F.png]``
(the whole run takes hours on two cores; ``--sentences N`` takes the N shortest).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sentences(count: int) -> list[str]:
    path = os.path.join(os.path.dirname(__file__), os.pardir, "lipbound", "measures", "data", "sentences.txt")
    with open(path, encoding="utf-8") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    return sorted(lines, key=len)[:count]


def _quartiles(values) -> str:
    values = np.asarray(values, dtype=float)
    if not values.size:
        return "--"
    return "min %.3g  median %.3g  max %.3g" % (values.min(), np.median(values), values.max())


def path_part(model, texts, modes, ks, layers):
    from lipbound.measures.perturb import perturb
    rows, violations = [], 0
    for mode in modes:
        began = time.perf_counter()
        for text in texts:
            report = perturb(text, k=ks, mode=mode, layers=layers, seed=0, model=model, set_certificate=False, search=0)
            violations += report.violations
            rows += [(mode, row) for row in report.rows]
        chosen = [row for m, row in rows if m == mode]
        print(f"path, {mode}: {len(chosen)} rows in {time.perf_counter() - began:.0f} s")
        for layer in layers:
            ratios = [row.predicted_path / row.measured for row in chosen if row.layer == layer]
            global_ratio = np.median([r.global_ / r.measured for r in chosen if r.layer == layer])
            print(f"  layer {layer}: predicted_path / measured {_quartiles(ratios)}  "
                  f"(global / measured median {global_ratio:.3g})")
    worst = max(row.predicted_path / row.measured for _, row in rows)
    print(f"path: largest predicted_path / measured {worst:.3g} (target <= 2: {'met' if worst <= 2 else 'NOT met'}); "
          f"violations {violations}")
    return rows


def set_part(model, texts, layers):
    """k = 1 over the whole vocabulary; the first sentence's wall time is the ``time`` figure."""
    from lipbound.measures.perturb import perturb
    for index, text in enumerate(texts):
        began = time.perf_counter()
        report = perturb(text, k=1, layers=layers, seed=0, model=model, vocabulary="all", search="all")
        seconds = time.perf_counter() - began
        cells = ", ".join(f"layer {row.layer}: {row.predicted_set / row.worst_witness:.3g}" for row in report.rows)
        print(f"set, n = {report.n}, {report.edit_set['size']} tokens, {report.search[1]['description']}: "
              f"predicted_set / worst_witness {cells}; violations {report.violations}; {seconds:.0f} s"
              + (f" (time target < 120 s for {len(layers)} layers: {'met' if seconds < 120 else 'NOT met'})"
                 if index == 0 else ""))


def by_length(model, counts) -> list[str]:
    """One of the 20 sentences per token count asked for (the first with exactly that many tokens)."""
    every = sentences(20)
    lengths = [len(model.encode(text)) for text in every]
    missing = sorted(set(counts) - set(lengths))
    if missing:
        raise SystemExit(f"--curve-lengths: no sentence has {missing} tokens; the 20 have {sorted(set(lengths))}")
    return [every[lengths.index(count)] for count in counts]


def curve_part(model, texts, layers, fractions, curvature_tokens, kinds=("layer",), depth=2):
    """L(eps) of each kind: the attention layer, the whole layer (block), or the stack of ``depth`` layers from the
    layer on (a stack's line is followed by its per-block breakdown)."""
    from lipbound.measures.curves import local_curve
    for text, kind, layer in ((t, k, l) for t in texts for k in kinds for l in layers):
        top = min(layer + depth - 1, model.num_layers - 1) if kind == "stack" else None
        if kind == "stack" and top == layer:
            continue
        began, cpu = time.perf_counter(), time.process_time()
        curve, _ = local_curve(text, layer=layer, kind=kind, last=top, eps=fractions + (2.0,), model=model,
                               curvature_tokens=curvature_tokens)
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
        small = [p for p in curve.points if p.eps <= 0.01 * curve.radius * (1 + 1e-12)]
        last = curve.points[-1]
        within = 0.0  # the largest eps / R up to which every ratio is <= 1.5
        for p in small:
            if p.ratio > 1.5:
                break
            within = p.eps / curve.radius
        print(f"curve, n = {curve.n}, {curve.description}: ||DF(X)|| {curve.jacobian_norm:.4g} / "
              f"{curve.jacobian_witness:.4g} "
              f"({curve.jacobian_bound}), variation {curve.variation_bound}; certified / witness "
              + "  ".join(f"{p.eps / curve.radius:.0e}: {p.ratio:.3g}" for p in small)
              + f" (<= 1.5 up to {within:.0e} R)"
              + (f"; at 2R certified {last.certified:.4g} vs global {last.global_constant:.4g} "
                 f"({'meets' if math.isclose(last.certified, last.global_constant, rel_tol=1e-9) else 'below'})"
                 if math.isfinite(last.global_constant) else "; no global constant") + "; "
              f"verdicts {sorted({p.verdict for p in curve.points})}; {seconds:.0f} s, {cpu:.0f} CPU s "
              f"(set-up {curve.setup_cpu_seconds:.0f}, per radius "
              + " ".join(f"{p.cpu_seconds:.0f}" for p in curve.points) + ")")
        for block in curve.blocks:
            print(f"  layer {block['layer']}: ||DF(X_l)|| {block['jacobian_norm']:.4g}; L_l / V_l on radius: "
                  + "  ".join(f"{c:.3g} / {v:.3g} on {r:.3g}"
                              for c, v, r in zip(block["certified"], block["variation"], block["radius"])))


#: The time figures of issue 29: (kind, last layer, sentence, eps / R, target in CPU seconds, what the target
#: bounds).  "The cat sat on the mat." has 9 tokens, the stack's sentence 20.
TIME_FIGURES = (
    ("layer", None, "The cat sat on the mat.", (1e-5, 1e-4, 1e-3, 1e-2), 30.0, "the curve"),
    ("block", None, "The cat sat on the mat.", (1e-5, 1e-4), 60.0, "each radius"),
    ("stack", 5, "Interest rates rose by 0.25% last quarter, the third increase in a row.", (1e-5, 1e-4), 300.0,
     "the curve"),
)


def time_part(model, kinds):
    """CPU seconds (``time.process_time``, one process) of the curves of issue 29's time figures: the set-up every
    radius shares and each radius's own work, as the curve reports them, against the targets."""
    from lipbound.measures.curves import local_curve
    for kind, last, text, fractions, target, scope in TIME_FIGURES:
        if kind not in kinds:
            continue
        began = time.process_time()
        meter = _BlockMeter(began) if kind == "stack" else None
        curve, _ = local_curve(text, layer=0, kind=kind, last=last, eps=fractions, model=model, progress=meter)
        cpu = time.process_time() - began
        per_radius = [p.cpu_seconds for p in curve.points]
        figure = cpu if scope == "the curve" else max(curve.setup_cpu_seconds / len(per_radius) + p for p in per_radius)
        print(f"time, {kind}{f' 0..{last}' if last else ''}, n = {curve.n}, eps/R {list(fractions)}: {cpu:.1f} CPU s "
              f"(set-up {curve.setup_cpu_seconds:.1f}, per radius " + ", ".join(f"{p:.1f}" for p in per_radius)
              + f"); {scope}: {figure:.1f} CPU s against <= {target:.0f} "
              f"({'met' if figure <= target else 'NOT met'}); ratios "
              + ", ".join(f"{p.ratio:.3g}" for p in curve.points)
              + f"; peak resident memory of the process so far {_peak_gigabytes():.2f} GB")
        if meter is not None:
            meter.print()


class _BlockMeter:
    """A progress callback of a stack's curve that records, per block (the stack's own attention curve first), the
    CPU seconds from the previous block's last report to the block's last report and the process's peak resident
    memory so far at that report."""

    def __init__(self, began: float):
        self.began, self.rows = began, {}

    def __call__(self, done, total, what) -> None:
        found = re.search(r"block (\d+) of the stack", what)
        self.rows[f"block {found.group(1)}" if found else "the stack's attention curve"] = \
            (time.process_time() - self.began, _peak_gigabytes())

    def print(self) -> None:
        previous = 0.0
        for name, (cpu, peak) in self.rows.items():
            print(f"  {name}: {cpu - previous:.1f} CPU s, peak resident so far {peak:.2f} GB")
            previous = cpu


def _peak_gigabytes() -> float:
    """The process's peak resident set (``ru_maxrss``, kilobytes on Linux) in GB (issue 29's limit: 8 GB)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def _centred_change(engine, P, c, D, i, scales):
    """z's change ``(H n(j), n d)`` of query i for the movement D (n, d) in floats (lemma curvature-centred-change):
    row (h, j) is ``c (e_i . Qt_h (D_j - D~_hi) + (e_j - e~_hi) . Qt_h^T D_i)`` scaled by ``scales[h, i, j]``."""
    n, d = D.shape
    rows = []
    for h in range(engine.H):
        W_Q, W_K = engine.head_weights(h)[:2]
        moved_keys = (D - P[h, i] @ D) @ W_K @ W_Q.T                         # Qt_h (D_j - D~_hi), (n(j), d)
        block = (np.eye(n) - P[h, i][None, :])[:, :, None] * (D[i] @ W_Q @ W_K.T)[None, None, :]
        block[:, i, :] += moved_keys
        rows.append(c * scales[h, i][:, None, None] * block)
    return np.concatenate(rows).reshape(-1, n * d)


def _gradient(engine, P, c, w, e, i, scales):
    """The movement D (n, d) maximising ``w . (z_i's change for D) e`` up to scale: the form's gradient in D
    (``(e_i Qt_h) (delta_mj - p_m)`` summed on each token m, and ``Qt_h sum_m (delta_mj - p_m) e_m`` on token i)."""
    n, d = e.shape
    G = np.zeros((n, d))
    weights = w.reshape(engine.H, n)
    for h in range(engine.H):
        W_Q, W_K = engine.head_weights(h)[:2]
        alpha = c * weights[h] * scales[h, i]                                   # over the rows j
        beta = alpha - P[h, i] * alpha.sum()                                     # over the tokens m
        G += beta[:, None] * (e[i] @ W_Q @ W_K.T)[None, :]
        G[i] += W_Q @ (W_K.T @ (beta @ e))
    return G


def zchange_part(model, text, fraction, starts=3, steps=25):
    """Per query: the blockwise bound on ``||diag(s_i) (z_i(Y) - z_i(X))||_2`` over the ball, the bound with the heads
    together, and the ascent's largest (alternating: the top singular pair for a movement, then the movement the pair
    reads most: the form's gradient in the movement)."""
    from lipbound.local.balls import Neighbourhood
    from lipbound.local.bounds import attention_bounds
    from lipbound.local.centred import CentredRows
    from lipbound.local.chains import chain_for
    from lipbound.local.curvature import AttentionCurvature
    from lipbound.local.enclosed import EnclosedAttention
    from lipbound.local.zeta_changes import Changes
    X = model.hidden_states(model.encode(text))[0]
    eps = fraction * model.layernorm_feeding(0).radius_about_center
    target = chain_for(model.model, "layer", 0)[0].target
    E = EnclosedAttention(target, X)
    balls = Neighbourhood("fro", eps).balls(X)
    facts = attention_bounds(target, balls, E).facts
    began = time.process_time()
    curvature = AttentionCurvature(E, target)
    centred = curvature._functional_deviation(facts, balls.radii, eps)[2][0]
    scales = CentredRows.variance_scales(facts)
    blockwise = Changes(centred.per_token, centred.fixed, centred.linear, centred.radii, centred.frobenius)
    before, after = blockwise.norms(scales, 1), centred.norms(scales, 1)
    print(f"zchange, {text!r} (n = {E.n}), {fraction:g} R: bounds in {time.process_time() - began:.1f} CPU s")
    P, c, n, d = E.P.mid, E.c.mid.item(), E.n, E.engine.d
    rng = np.random.default_rng(0)
    for i in range(n):
        best = 0.0
        for _ in range(starts):
            D = rng.standard_normal((n, d))
            for _ in range(steps):
                D *= eps / np.linalg.norm(D)
                left, values, right = np.linalg.svd(_centred_change(E.engine, P, c, D, i, scales), full_matrices=False)
                best = max(best, values[0])
                D = _gradient(E.engine, P, c, left[:, 0], right[0].reshape(n, d), i, scales)
        print(f"  query {i}: blockwise {before[i]:.4g}, heads together {after[i]:.4g}, ascent {best:.4g}")


def fit(rows, key):
    """Least squares of ``log W1 = log C + a log k + b log n`` and of ``log W1 = log C + c log(k / n)``."""
    k = np.array([row.k for row in rows], dtype=float)
    n = np.array([row.n for row in rows], dtype=float)
    y = np.log([getattr(row, key) for row in rows])
    a, b = np.linalg.lstsq(np.stack([np.ones_like(k), np.log(k), np.log(n)], axis=1), y, rcond=None)[0][1:]
    c = np.polyfit(np.log(k / n), y, 1)[0]
    return a, b, c


def fits_part(rows, layers, figure):
    replaced = [row for mode, row in rows if mode == "replace"]
    fits = {}
    for layer in layers:
        chosen = [row for row in replaced if row.layer == layer]
        if len({row.n for row in chosen}) < 2:
            continue
        for key in ("measured", "predicted_path"):
            fits[layer, key] = fit(chosen, key)
            a, b, c = fits[layer, key]
            print(f"fits, layer {layer}, {key}: W1 ~ k^{a:.2f} n^{b:.2f};  W1 ~ (k/n)^{c:.2f}")
    if figure and replaced:
        from lipbound.printing.figures import draw_edit_scaling
        data = [{"layer": row.layer, "k": row.k, "n": row.n, "measured": row.measured,
                 "predicted_path": row.predicted_path} for row in replaced]
        print(f"wrote {draw_edit_scaling(data, figure)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["path", "set", "curve", "fits"],
                        choices=["path", "set", "curve", "fits", "time", "zchange"])
    parser.add_argument("--sentences", type=int, default=20, help="the N shortest of the 20 sentences (default 20)")
    parser.add_argument("--set-sentences", type=int, default=2,
                        help="sentences of the whole-vocabulary part (default 2)")
    parser.add_argument("--modes", nargs="+", default=["replace", "insert", "delete"])
    parser.add_argument("--k", default="1..3", help="edit sizes (default 1..3)")
    parser.add_argument("--layers", default="0..5", help="layers counted from 0 (default 0..5)")
    parser.add_argument("--figure", help="write the k / n figure of the fits here (e.g. docs/figures/edits.png)")
    parser.add_argument("--curve-lengths", default="",
                        help="the curve part on sentences with these token counts (e.g. 14,20,37) instead of the "
                             "two shortest")
    parser.add_argument("--curve-text", action="append", default=[],
                        help="the curve part on this text too (repeatable), e.g. inputs longer than the bundled "
                             "sentences, whose Jacobian at X is bounded by groups of tokens")
    parser.add_argument("--curve-kinds", nargs="+", default=["layer"], choices=["layer", "block", "stack"],
                        help="the curve part for the attention layer, the whole layer, and/or the stack of a layer "
                             "and the next (default layer)")
    parser.add_argument("--time-kinds", nargs="+", default=["layer", "block", "stack"],
                        choices=["layer", "block", "stack"],
                        help="the time part for these figures (default all three; the stack takes the longest)")
    parser.add_argument("--stack-depth", type=int, default=2,
                        help="layers of the stack in the curve part, from each layer on (default 2; 6 for MiniLM's "
                             "whole encoder from layer 0)")
    parser.add_argument("--fractions", default="1e-5,1e-4,1e-3,2e-3,3e-3,1e-2",
                        help="the curve part's radii as fractions of the LayerNorm radius (default "
                             "1e-5,1e-4,1e-3,2e-3,3e-3,1e-2; 2 R is added)")
    parser.add_argument("--curvature-tokens", type=int, default=None,
                        help="largest n of the curvature bound's Gram route in the curve part (longer: the split "
                             "bound; default: lipbound's)")
    parser.add_argument("--zchange-text", default="The cat sat on the mat.", help="the zchange part's sentence")
    parser.add_argument("--zchange-fraction", type=float, default=1e-2,
                        help="the zchange part's radius as a fraction of the LayerNorm radius (default 1e-2)")
    args = parser.parse_args()

    from lipbound.cli.parsing import int_list
    from lipbound.measures.bert import load_text_model
    model = load_text_model()
    ks, layers = int_list("--k", 1)(args.k), int_list("--layers")(args.layers)
    texts = sentences(args.sentences)
    rows = []
    if "path" in args.parts or "fits" in args.parts:
        rows = path_part(model, texts, args.modes if "path" in args.parts else ["replace"], ks, layers)
    if "fits" in args.parts:
        fits_part(rows, layers, args.figure)
    if "set" in args.parts:
        set_part(model, sentences(args.set_sentences), layers)
    if "zchange" in args.parts:
        zchange_part(model, args.zchange_text, args.zchange_fraction)
    if "time" in args.parts:
        time_part(model, args.time_kinds)
    if "curve" in args.parts:
        from lipbound.local.curvature import CURVATURE_TOKENS
        chosen = by_length(model, int_list("--curve-lengths", 1)(args.curve_lengths)) if args.curve_lengths \
            else [] if args.curve_text else texts[:2]
        chosen += args.curve_text
        fractions = tuple(float(f) for f in args.fractions.split(","))
        curve_part(model, chosen, sorted({min(layers), max(layers)}), fractions,
                   args.curvature_tokens or CURVATURE_TOKENS, args.curve_kinds, args.stack_depth)


if __name__ == "__main__":
    main()
