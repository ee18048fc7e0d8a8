"""Edit-set certificates, k = 1 ("any vocabulary token at this position") and k = 2 (any pair of them at two
positions), route by route, layer by layer.

On all-MiniLM-L6-v2 and the shortest of the 20 bundled sentences, for a replacement at one position by
any of the candidate tokens (the whole vocabulary by default):

* per layer the set's certified W1 (``set_bound``: the smaller of the token-ball route of
  lipbound.local.propagate and the per-candidate passes of lipbound.local.candidates, the route named),
  the balls' bound alone, ``worst_witness`` of ``perturb(..., search="all")`` (its exhaustive search;
  with ``--no-search`` the largest exact W1 of the enumeration below) and the ratios, with the CPU
  seconds of the set certificate (balls alone, balls and passes) and of perturb;
* the rounding radius of the passes per layer (the term that ends them) and why they stopped;
* soundness, every edit enumerated: each candidate's edited sentence through an independent float64
  forward pass written here (plain numpy, erf GELU), exact W1 per layer by the assignment problem, against
  ``predicted_set`` and, where the passes reached, against the candidate's own certified bound -- each
  comparison in interval arithmetic with the float side widened by a relative 1e-6; a comparison the
  widening cannot decide counts as "not certified", never as a pass.

Run: ``python bench/bench_edit_sets.py [--sentences 2 | --texts "The cat sat on the mat."] [--vocabulary all|N]
[--positions 3 | --positions 3 5] [--no-search] [--exact-chain [--no-screen | --refine-within 0.05]]
[--add-words ID ...] [--save every_edit.npz] [--tiers] [--whole-vocabulary [--factor 3]] [--hull]`` (with two
positions every pair of the N + 2 candidates is enumerated: ``--vocabulary 63`` gives 65 x 65 pairs).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_local import sentences  # noqa: E402  (the 20 bundled sentences, shortest first)


def _layer_norm(X, norm):
    centred = X - X.mean(axis=-1, keepdims=True) if norm.centred else X
    return norm.gamma * centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + norm.eps) + norm.center


def block_outputs(model, ids: np.ndarray, last: int) -> list[np.ndarray]:
    """``X + MHA(X)`` of layers 0..last for a batch of sentences (B, n), float64, written from the weights."""
    from scipy.special import erf

    from lipbound.numeric.attention import AttentionMap
    e = model.embeddings
    n = ids.shape[1]
    X = _layer_norm(e.word[ids].astype(np.float64) + e.position[e.position_offset:e.position_offset + n]
                    + e.token_type[0], e.norm)
    out = []
    for index in range(last + 1):
        item = model.layer(index)
        engine = AttentionMap(item.as_layer(residual=True))
        projected = X @ engine.W + engine.bias
        Q, K, V = (engine.per_head(projected, part) for part in ("queries", "keys", "values"))
        S = np.einsum("bhik,bhjk->bhij", Q, K) / np.sqrt(engine.d_k)
        P = np.exp(S - S.max(axis=-1, keepdims=True))
        P /= P.sum(axis=-1, keepdims=True)
        heads = np.einsum("bhij,bhjv->bihv", P, V).reshape(X.shape[0], n, -1)
        Z = heads @ engine.W_O + engine.b_O + X
        out.append(Z)
        if index == last:
            break
        Y = _layer_norm(Z, item.ln_out)
        h = Y @ item.ffn.W_1 + item.ffn.b_1
        X = _layer_norm(Y + (0.5 * h * (1 + erf(h / np.sqrt(2)))) @ item.ffn.W_2 + item.ffn.b_2, item.ffn_norm)
    return out


def exact_w1(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.optimize import linear_sum_assignment
    cost = np.linalg.norm(a[:, None] - b[None], axis=-1)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def below(value: float, bound: float) -> str:
    """``value <= bound`` decided in interval arithmetic, the float value widened by a relative 1e-6."""
    from lipbound.rigorous.arrays import IntervalArray
    widened = IntervalArray(np.array(value)) * IntervalArray(np.array(1 - 1e-6), np.array(1 + 1e-6))
    if float(widened.hi) <= bound:
        return "holds"
    return "violated" if float(widened.lo) > bound else "not certified"


def run(bert, text: str, vocabulary, positions, chunk: int, search: bool, parts, exact_chain: bool = False,
        screen: bool = True, add_words=(), save: str | None = None, refine_within: float = 0.0) -> None:
    from lipbound.local.propagate import coupling_bound, propagate, set_bound
    from lipbound.measures.edits import draw_edits, edit_set
    from lipbound.measures.perturb import _set_ids, perturb
    ids = bert.encode(text)
    last = bert.num_layers - 1
    k = len(positions) if positions else 1
    edits = draw_edits(bert, ids, "replace", [k], 0, positions)
    slots = list(edits[k].positions)
    candidates, _ = _set_ids(bert, vocabulary, edits, 0)
    if add_words:
        candidates = np.union1d(candidates, np.asarray(add_words, dtype=np.int64))
        vocabulary = candidates
    template = edit_set(ids, "replace", slots, candidates)
    identity = np.eye(len(ids), dtype=np.int64) * len(ids)
    total = candidates.size ** k
    print(f"{text!r}: n = {len(ids)}, positions {slots}, {candidates.size} candidates per slot, {total} edits",
          flush=True)
    routes, passes = None, None
    if "set" in parts:
        began = time.process_time()
        balls = propagate(bert.model, template)
        balls_seconds = time.process_time() - began
        began = time.process_time()
        sets = propagate(bert.model, template, per_candidate=True, exact_chain=exact_chain, screen=screen,
                         refine_within=refine_within)
        set_seconds = time.process_time() - began
        passes = sets[0].facts["candidates"]
        print(f"  CPU s: set certificate (balls and passes) {set_seconds:.0f}, balls alone {balls_seconds:.1f}; "
              f"passes stopped: {passes.stopped or 'no'}; refined {passes.refined} of {total} (settled by tier "
              f"{'/'.join(map(str, passes.settled)) or '-'}); passes' CPU s by "
              "stage: " + ", ".join(f"{stage} {value:.1f}" for stage, value in passes.seconds.items()), flush=True)
        routes = [set_bound(sets[layer], identity) for layer in range(last + 1)]
        for layer, (bound, route) in enumerate(routes):
            width, ball = passes.widths.get(layer), coupling_bound(balls[layer], identity)
            print(f"  layer {layer}: predicted_set {bound:.6g} ({route}), balls {ball:.6g}"
                  + ("" if width is None else f"; rounding radius {width:.3g}"), flush=True)
    if "check" not in parts:
        return
    # every edit, an independent float64 forward pass, exact W1
    began = time.process_time()
    reference = block_outputs(bert.model, np.array([ids]), last)
    verdicts = {"holds": 0, "violated": 0, "not certified": 0}
    values = np.zeros((total, last + 1))
    excess = -np.inf
    for begin in range(0, total, chunk):
        choice = np.unravel_index(np.arange(begin, min(begin + chunk, total)), (candidates.size,) * k)
        batch = np.repeat(np.array([ids]), choice[0].size, axis=0)
        for slot, picked in zip(slots, choice):
            batch[:, slot] = candidates[picked]
        outputs = block_outputs(bert.model, batch, last)
        for layer in range(last + 1):
            for index, Z in enumerate(outputs[layer]):
                value = values[begin + index, layer] = exact_w1(reference[layer][0], Z)
                if routes is not None:
                    verdicts[below(value, routes[layer][0])] += 1
                if passes is not None and layer in passes.bounds:
                    own = float(passes.bounds[layer][begin + index])
                    excess = max(excess, (value - own) / own)
    if save:
        np.savez(save, words=candidates, values=values)
    worst = values.max(axis=0)
    worst_words = [np.stack(np.unravel_index(np.argmax(values[:, layer]), (candidates.size,) * k))
                   for layer in range(last + 1)]
    print(f"  every edit at positions {slots} ({total} x {last + 1} layers, independent float64 pass, "
          f"{time.process_time() - began:.0f} CPU s): exhaustive worst W1 per layer "
          + ", ".join(f"{w:.6g} ({'/'.join(str(candidates[i]) for i in at)})" for w, at in zip(worst, worst_words)),
          flush=True)
    if routes is None:
        return
    print(f"  against predicted_set {verdicts}; against each candidate's own certified bound, largest "
          f"(W1 - bound) / bound {excess:.3g} (the bound is the identity plan's cost plus rounding radii, and W1 is "
          "often that plan's cost: ties to ~1e-9 are expected, a positive excess beyond float64 error would be a "
          "violation)", flush=True)
    witness = worst
    if search:
        began = time.process_time()
        report = perturb(text, k=k, positions=slots, seed=0, model=bert, vocabulary=vocabulary, search="all")
        witness = np.array([row.worst_witness for row in report.rows])
        print(f"  perturb without passes (balls, exhaustive search, path certificates): "
              f"{time.process_time() - began:.0f} CPU s; its worst_witness / the exhaustive worst: "
              + ", ".join(f"{a / b:.6f}" for a, b in zip(witness, worst)))
    print("  predicted_set / worst_witness per layer: "
          + ", ".join(f"{bound / w:.4g} ({route})" for (bound, route), w in zip(routes, witness)), flush=True)


def _one_slot_set(bert, text: str, vocabulary, positions, add_words=()) -> tuple:
    """The set-up of a replacement set at ``positions`` by the same candidate words at each: the sentence's ids, the
    slots, the candidate words (with ``add_words``), the original outputs per layer, the sentence's enclosed
    embeddings and per slot the candidates' enclosed input rows."""
    from lipbound.local.propagate import embedding_enclosure, embedding_enclosure_tokens, propagate
    from lipbound.measures.edits import draw_edits, edit_set
    from lipbound.measures.perturb import _set_ids
    ids = np.array(bert.encode(text))
    edits = draw_edits(bert, list(ids), "replace", [len(positions)], 0, positions)
    slots = [int(slot) for slot in edits[len(positions)].positions]
    words, _ = _set_ids(bert, vocabulary, edits, 0)
    words = np.union1d(words, np.asarray(add_words, dtype=np.int64))
    embeddings = bert.model.embeddings
    references = [s.original for s in propagate(bert.model, edit_set(ids, "replace", slots, ids[slots][:, None]))]
    own = embedding_enclosure_tokens(embeddings, ids, np.arange(ids.size))
    return ids, slots, words, references, own, [embedding_enclosure(embeddings, words, slot) for slot in slots]


def whole_vocabulary(bert, text: str, vocabulary, positions, factor: float = 3.0, depths=(0, 3, 6, 9, 12, 14),
                     per_depth: int = 16, sample: int = 32) -> None:
    """A k = 1 set over the whole vocabulary (or a sample) by groups of candidates (lipbound.local.candidate_groups),
    in one run: the worst edit per layer over every candidate (float32 screen of every edit, float64 forward pass and
    exact W1 for the best of the screen); the bisection tree of the candidates' input rows with the certified group
    radii per depth; at each depth in ``depths`` ``per_depth`` groups (spread over the depth) passed through every
    layer (groups of two words or more), their bound against the worst edit and how many would settle (bound within
    ``factor`` times the worst edit at every layer); the per-word passes' CPU seconds on ``sample`` words and the
    whole set projected from them."""
    from lipbound.local.candidate_groups import bisect, group_balls, group_pass_bounds
    from lipbound.local.candidates import candidate_passes
    from lipbound.measures.edits import drawable_ids, edit_set
    from lipbound.measures.perturb import _screening_coupling
    from lipbound.measures.vocabulary import worst_edits
    model = bert.model
    began = time.process_time()
    ids, (slot,), words, references, own, (candidates,) = _one_slot_set(bert, text, vocabulary, positions[:1])
    last = bert.num_layers - 1
    print(f"{text!r}: n = {ids.size}, position {slot}, {words.size} candidates; factor {factor}", flush=True)
    print(f"  set-up (enclosed input rows of every candidate, references): {time.process_time() - began:.1f} CPU s",
          flush=True)
    began = time.process_time()
    states = bert.hidden_states(list(ids))
    original = [bert.attention_block(layer, states[layer]).pre_norm for layer in range(last + 1)]

    def outputs_of(new_ids):
        new = bert.hidden_states(list(new_ids))
        return [bert.attention_block(layer, new[layer]).pre_norm for layer in range(last + 1)]

    template = edit_set(ids, "replace", [slot], words)
    pairs, weights = _screening_coupling(ids.size, ids.size, template)

    def make(choice):
        out = ids.copy()
        out[slot] = choice[0]
        return out

    found = worst_edits(model, ids, make, [slot], [words], range(last + 1), original, pairs, weights,
                        start=[int(ids[slot])], reference=outputs_of, exhaustive=True)
    witness = np.array([found.values[layer] for layer in range(last + 1)])
    worst_words = [found.ids[layer][slot] for layer in range(last + 1)]
    print(f"  worst edit per layer ({found.evaluated} screened in float32, the best 16 per layer in float64 with exact "
          f"W1; {time.process_time() - began:.0f} CPU s): "
          + ", ".join(f"{w:.6g} ({bert.tokenizer.vocab[i]})" for w, i in zip(witness, worst_words)), flush=True)
    began = time.process_time()
    levels, rows = [[np.arange(words.size)]], candidates.mid
    while len(levels) <= max(depths) and any(m.size > 1 for m in levels[-1]):
        levels.append([half for m in levels[-1] for half in (bisect(rows, m) if m.size > 1 else (m,))])
    print(f"  bisection tree to depth {len(levels) - 1}: {time.process_time() - began:.0f} CPU s", flush=True)
    limits = factor * witness
    print(f"  {'depth':>5s} {'groups':>6s} {'words':>6s} {'radius min/median/max':>24s} {'CPU s':>6s}  "
          f"bound / worst edit at layers 0-{last} (median over the passed groups; min)  settled", flush=True)
    for depth in (d for d in depths if d < len(levels)):
        began = time.process_time()
        level = levels[depth]
        balls = group_balls(candidates, level)
        radius_seconds = time.process_time() - began
        several = [g for g in level if g.size > 1]         # a group of one word is that word's pass
        chosen = np.unique(np.linspace(0, len(several) - 1, min(per_depth, len(several))).astype(int))
        picked = group_balls(candidates, [several[g] for g in chosen])
        began = time.process_time()
        bounds = group_pass_bounds(model, own, slot, picked, references, last, np.full(last + 1, np.inf))
        ratios = bounds / witness
        settled = int(np.sum(np.all(bounds <= limits, axis=1)))
        print(f"  {depth:5d} {len(level):6d} {np.median([m.size for m in level]):6.0f} "
              f"{balls.radii.min():7.3g} {np.median(balls.radii):7.3g} {balls.radii.max():7.3g}  "
              f"{time.process_time() - began + radius_seconds:6.1f}  "
              + " ".join(f"{a:.3g};{b:.3g}" for a, b in zip(np.median(ratios, axis=0), ratios.min(axis=0)))
              + f"  {settled}/{chosen.size}", flush=True)
    rng = np.random.default_rng(0)
    some = np.union1d(rng.choice(np.intersect1d(words, drawable_ids(bert.tokenizer)), sample, replace=False),
                      np.intersect1d(words, worst_words))
    rows = np.searchsorted(words, some)
    began = time.process_time()
    passes = candidate_passes(model, own, [slot], [candidates[rows]], [some], references, last)
    seconds = time.process_time() - began
    print(f"  per-word passes (tiers, exact chains) of {some.size} words (the worst edits among them): {seconds:.1f} "
          f"CPU s, {seconds / some.size:.3f} per word; their set value / worst edit: "
          + ", ".join(f"{passes.largest(layer) / witness[layer]:.5g}" for layer in range(last + 1))
          + f"; the {words.size} words projected at {words.size * seconds / some.size:.3g} CPU s", flush=True)


def _identity_costs(bert, ids: np.ndarray, slot: int, words: np.ndarray, references: list, last: int,
                    chunk: int = 512) -> np.ndarray:
    """Every word's identity-plan cost ``(1/n) sum_i ||z_i(w) - z^0_i||`` per layer (K, last + 1), by the independent
    float64 pass of this bench (it bounds nothing: the witnesses the bounds are compared with)."""
    out = np.empty((words.size, last + 1))
    for begin in range(0, words.size, chunk):
        batch = np.repeat(ids[None], min(chunk, words.size - begin), axis=0)
        batch[:, slot] = words[begin:begin + chunk]
        for layer, Z in enumerate(block_outputs(bert.model, batch, last)):
            out[begin:begin + batch.shape[0], layer] = np.linalg.norm(Z - references[layer], axis=-1).mean(axis=-1)
    return out


def hull_form(bert, text: str, vocabulary, positions, depths=(3, 9, 12), per_depth: int = 2) -> None:
    """The k = 1 set as one affine form over the words' points (lipbound.local.hull_forms), in one run: the whole set
    through the layers (bound per layer, the identity-plan cost's words' part and rest, CPU seconds, peak memory,
    the largest independent error after each stage: which term grows first), the worst edit per layer it reached
    (every word through the float64 pass of this bench), and the set split by the bisection tree of
    lipbound.local.candidate_groups: at each depth ``per_depth`` groups (spread over the depth) as forms of their
    own, each group's bound against its own worst word."""
    import resource

    from lipbound.local.candidate_groups import bisect
    from lipbound.local.hull_forms import hull_bounds
    ids, (slot,), words, references, own, (candidates,) = _one_slot_set(bert, text, vocabulary, positions[:1])
    last = bert.num_layers - 1
    print(f"{text!r}: n = {ids.size}, position {slot}, {words.size} candidates", flush=True)
    began = time.process_time()
    found = hull_bounds(bert.model, own, slot, candidates, references, last)
    seconds = time.process_time() - began
    reached = max(found.bounds)
    began = time.process_time()
    costs = _identity_costs(bert, ids, slot, words, references, reached)
    worst = costs.max(axis=0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    print(f"  whole set as one form: {seconds:.1f} CPU s, peak memory {peak:.2f} GB; stopped: {found.stopped or 'no'}; "
          f"worst edits by the float64 pass ({time.process_time() - began:.0f} CPU s)", flush=True)
    for layer in sorted(found.terms):
        bound = found.bounds.get(layer)
        line = f"  layer {layer}: CPU s {found.seconds[layer]:.1f}; largest independent error after " + ", ".join(
            f"{stage} {value:.3g}" for stage, value in found.terms[layer].items())
        if bound is not None:
            part, rest = np.sum(found.spans[layer]) / ids.size, np.sum(found.radii[layer]) / ids.size
            line += (f"; bound {bound:.6g}, worst edit {worst[layer]:.6g}, ratio {bound / worst[layer]:.4g} (words' "
                     f"part {part:.4g}, rest {rest:.4g})")
        print(line, flush=True)
    levels, rows = [[np.arange(words.size)]], candidates.mid
    while len(levels) <= max(depths) and any(m.size > 1 for m in levels[-1]):
        levels.append([half for m in levels[-1] for half in (bisect(rows, m) if m.size > 1 else (m,))])
    print(f"  {'depth':>5s} {'groups':>6s} {'words':>6s} {'CPU s':>6s}  per group: layers reached, bound / its own "
          "worst word at layer 0 (and 1)", flush=True)
    for depth in (d for d in depths if 0 < d < len(levels)):
        level = [g for g in levels[depth] if g.size > 1]
        chosen = np.unique(np.linspace(0, len(level) - 1, min(per_depth, len(level))).astype(int))
        began = time.process_time()
        parts = []
        for g in (level[c] for c in chosen):
            group = hull_bounds(bert.model, own, slot, candidates[g], references, min(1, last))
            ratios = [group.bounds[layer] / costs[g, layer].max() for layer in sorted(group.bounds) if layer <= reached]
            parts.append(f"{len(group.bounds)}: " + "/".join(f"{r:.3g}" for r in ratios))
        print(f"  {depth:5d} {len(levels[depth]):6d} {np.median([m.size for m in levels[depth]]):6.0f} "
              f"{(time.process_time() - began) / chosen.size:6.1f}  " + "; ".join(parts), flush=True)


def tiers(bert, text: str, vocabulary, positions, add_words=(), refine_within: float = 0.0) -> None:
    """The screened per-candidate passes of one set with and without the cheap first tier, side by side in one run:
    CPU seconds (in all and per sentence), how many sentences each tier left, the set's value per layer."""
    from lipbound.local.candidates import CHEAP_EDITED_UNTIL, SCREEN_EXACT_FROM, candidate_passes
    ids, slots, words, references, own, candidates = _one_slot_set(bert, text, vocabulary, positions, add_words)
    last = bert.num_layers - 1
    total = words.size ** len(slots)
    print(f"{text!r}: positions {slots}, {words.size} candidates per slot, {total} sentences, refine_within "
          f"{refine_within}", flush=True)
    print(f"  {'first tier':>26s} {'CPU s':>7s} {'per sentence':>13s} {'settled by tier':>16s}  set's value, layers 0-"
          f"{last}")
    for cheap in (False, True):
        began = time.process_time()
        passes = candidate_passes(bert.model, own, slots, candidates, [words] * len(slots), references, last,
                                  exact_chain=True, refine_within=refine_within, cheap_tier=cheap)
        seconds = time.process_time() - began
        label = f"edited before layer {CHEAP_EDITED_UNTIL}" if cheap else f"every chain from layer {SCREEN_EXACT_FROM}"
        print(f"  {label:>26s} {seconds:7.1f} {seconds / total:13.3f} {'/'.join(map(str, passes.settled)):>16s}  "
              + ", ".join(f"{passes.largest(layer):.6g}" for layer in range(last + 1)), flush=True)
        print("    CPU s by stage: " + ", ".join(f"{stage} {value:.1f}" for stage, value in passes.seconds.items()),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=2, help="the N shortest of the 20 sentences")
    parser.add_argument("--skip", type=int, default=0, help="start at the S-th of them")
    parser.add_argument("--texts", nargs="+", default=None, help="these sentences instead of the bundled ones")
    parser.add_argument("--vocabulary", default="all", help="'all' or a number of sampled tokens")
    parser.add_argument("--positions", type=int, nargs="*", default=None,
                        help="the edited position (default drawn); two positions: the k = 2 set, every pair enumerated")
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--parts", nargs="+", default=["set", "check"], choices=["set", "check"],
                        help="set: the certificate by route per layer; check: every edit through an independent "
                             "float64 pass (with set: each verdict)")
    parser.add_argument("--no-search", action="store_true",
                        help="skip perturb's search: the witness is the exhaustive float64 enumeration alone")
    parser.add_argument("--exact-chain", action="store_true",
                        help="the passes bound each feed-forward chain by its certified norm at the point (deeper, "
                             "about ten times the CPU time)")
    parser.add_argument("--no-screen", action="store_true",
                        help="with --exact-chain, every sentence through the all-exact passes (no screening pass)")
    parser.add_argument("--add-words", type=int, nargs="*", default=(),
                        help="token ids added to the sampled set (e.g. the worst edits of a whole-vocabulary "
                             "`--parts check` run)")
    parser.add_argument("--refine-within", type=float, default=0.0,
                        help="with screening, leave unrefined the sentences within this fraction above the refined "
                             "maximum (the set's value at most 1 + it times the fully refined one)")
    parser.add_argument("--tiers", action="store_true",
                        help="only the screened passes with and without the cheap first tier, side by side (CPU "
                             "seconds per sentence, sentences settled by each tier, the set's value per layer)")
    parser.add_argument("--whole-vocabulary", action="store_true",
                        help="the k = 1 set by groups of candidates: worst edit over every candidate, group radii per "
                             "depth of the bisection tree, sampled groups' bounds against it, per-word cost projected")
    parser.add_argument("--hull", action="store_true",
                        help="the k = 1 set as one affine form over the words' points: bound per layer against the "
                             "worst edit, CPU seconds, peak memory, the term that grows first; groups by depth")
    parser.add_argument("--factor", type=float, default=3.0,
                        help="with --whole-vocabulary: a group settles within this factor of the worst edit")
    parser.add_argument("--save", default=None,
                        help="with check: write every edit's exact W1 per layer (and the candidate ids) to this .npz")
    args = parser.parse_args()
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    vocabulary = "all" if args.vocabulary == "all" else int(args.vocabulary)
    os.system("uptime")
    for text in args.texts or sentences(args.sentences)[args.skip:]:
        if args.hull:
            hull_form(bert, text, vocabulary, args.positions or [3])
            continue
        if args.whole_vocabulary:
            whole_vocabulary(bert, text, vocabulary, args.positions or [3], args.factor)
            continue
        if args.tiers:
            tiers(bert, text, vocabulary, args.positions or [3], args.add_words, args.refine_within)
            continue
        run(bert, text, vocabulary, args.positions, args.chunk, not args.no_search, args.parts, args.exact_chain,
            not args.no_screen, args.add_words, args.save, args.refine_within)


if __name__ == "__main__":
    main()
