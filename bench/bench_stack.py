"""The six-layer curve of all-MiniLM-L6-v2 at n = 20, block by block: CPU seconds, resident memory, ratios.

Runs ``lipbound local SENTENCE --map stack --layer FIRST --last LAST --eps ...`` in this process (one BLAS thread)
and prints, as it goes, one line per stage (the stack's own attention curve, then each block): the CPU seconds
(user + system, ``time.process_time``) the stage took, the resident memory when it started and its peak while it ran
(sampled from ``/proc/self/statm`` every 50 ms), and with ``--trace`` the live Python-allocated memory at the stage's
start by ``tracemalloc`` with the allocation sites that grew most since the previous stage's start (what a block leaves
behind).  At the end: per eps the certified value, the witness and their ratio, and per block its certified constant,
variation and the radius of its ball, with the first term that is not finite named.

``--part estimates`` instead times one block's attention curvature bound (the Gram route's certified norms of
``H n^2`` scaled rows, :class:`~lipbound.rigorous.linalg.RowGram`) over the Riemann grid of each eps, in one process
side by side: every level estimate from the fixed random start (``WARM_STEPS = 0``, as before) and from the last
alike estimate's Ritz vector; CPU seconds of each, their ratio, and the largest relative difference of the chis.

Run: ``python bench/bench_stack.py [--sentence S] [--first 0] [--last 5] [--eps 1e-4,1e-3] [--trace] [--json F]``
(about an hour of CPU on MiniLM at n = 20; run it under ``ulimit -v 9000000``: issue 29's limit is 8 GB), or
``python bench/bench_stack.py --part estimates [--first L] [--eps ...]``.
Targets (issue 29): peak resident <= 8 GB, the curve <= 300 CPU s, certified / witness <= 10 at 1e-3 R.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import tracemalloc

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

SENTENCE = "Interest rates rose by 0.25% last quarter, the third increase in a row."
PAGE = os.sysconf("SC_PAGE_SIZE")
#: the stack's own attention curve is its first block's: they are one stage
FIRST_STAGE = "the stack's attention curve and block 0"


def resident_gigabytes() -> float:
    """The process's resident set now, GB (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * PAGE / 1e9
    except OSError:
        return 0.0


class StageMeter:
    """A progress callback of the stack's curve: a stage is the stack's own attention curve or one block (named by the
    progress messages); per stage its CPU seconds, resident memory at its start and peak while it ran."""

    def __init__(self, trace: bool, top: int = 8):
        self.trace, self.top = trace, top
        self.rows: list = []
        self.stage, self.began, self.start_rss, self.peak = FIRST_STAGE, time.process_time(), \
            resident_gigabytes(), 0.0
        self.snapshot = tracemalloc.take_snapshot() if trace else None
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, resident_gigabytes())

    def __call__(self, done, total, what) -> None:
        if what == "blocks of the stack":   # block done - 1 is done and its memory let go: the next stage begins
            self._close(f"block {done}" if done < total else "the stack's own radii")
            return
        found = re.search(r"block (\d+) of the stack", what)
        stage = f"block {found.group(1)}" if found else \
            "the stack's attention curve" if "attention alone" in what else "the stack's own radii"
        if stage != self.stage and self.stage != FIRST_STAGE:
            self._close(stage)
        print(f"    [{time.strftime('%H:%M:%S')}] {self.stage}: {what} {done}/{total}, "
              f"{time.process_time() - self.began:.1f} CPU s, resident {resident_gigabytes():.2f} GB", flush=True)

    def _close(self, following: str) -> None:
        cpu = time.process_time() - self.began
        self.peak = max(self.peak, resident_gigabytes())
        row = {"stage": self.stage, "cpu_seconds": cpu, "resident_at_start": self.start_rss, "peak": self.peak}
        self.rows.append(row)
        print(f"  {self.stage}: {cpu:.1f} CPU s, resident at start {self.start_rss:.2f} GB, peak {self.peak:.2f} GB",
              flush=True)
        self.stage, self.began, self.start_rss = following, time.process_time(), resident_gigabytes()
        self.peak = self.start_rss
        if self.trace:
            snapshot = tracemalloc.take_snapshot()
            live = sum(s.size for s in snapshot.statistics("filename")) / 1e9
            print(f"  live (tracemalloc) at the start of {following}: {live:.2f} GB; grown most since the last stage:",
                  flush=True)
            for stat in snapshot.compare_to(self.snapshot, "traceback")[:self.top]:
                where = [f"{frame.filename.split('lipbound/')[-1]}:{frame.lineno}" for frame in stat.traceback
                         if "lipbound/" in frame.filename][:5]
                print(f"      {stat.size_diff / 1e6:+9.1f} MB  {' < '.join(where)}", flush=True)
            self.snapshot = snapshot

    def finish(self) -> list:
        self._close("done")
        self._stop.set()
        return self.rows


def estimates_part(sentence: str, layer: int, fractions: list) -> None:
    """The curvature bound of layer ``layer``'s attention at the sentence over the grids of ``fractions`` (of the
    LayerNorm radius), with cold and warm level estimates side by side (module docstring)."""
    import numpy as np

    from lipbound.local.chains import chain_for
    from lipbound.local.curvature_integral import CurvatureIntegral, decade_grid
    from lipbound.local.enclosed import EnclosedAttention
    from lipbound.measures.bert import load_text_model
    from lipbound.rigorous import linalg

    bert = load_text_model()
    X = bert.hidden_states(bert.encode(sentence))[layer]
    radius = bert.layernorm_feeding(layer).radius_about_center
    component = chain_for(bert.model, "layer", layer, None, None)[0]
    E = EnclosedAttention(component.target, X)
    grid = decade_grid([f * radius for f in fractions])
    results, default = {}, linalg.WARM_STEPS
    for name, steps in (("cold (fixed start)", 0), ("warm (Ritz vector)", default)):
        linalg.WARM_STEPS = steps
        integral = CurvatureIntegral(component, E)
        began = time.process_time()
        results[name] = ([integral.chis(np.full(E.n, t), {"frobenius": t}) for t in grid],
                         time.process_time() - began)
    linalg.WARM_STEPS = default
    (cold, cold_cpu), (warm, warm_cpu) = results.values()
    worst = max(abs(w - c) / c for cs, ws in zip(cold, warm) for c, w in zip(cs, ws) if c > 0)
    print(f"curvature bound, layer {layer}, n = {E.n}, {len(grid)} radii ({fractions} R and the decades below): "
          f"cold {cold_cpu:.1f} CPU s, warm {warm_cpu:.1f} CPU s, warm / cold {warm_cpu / cold_cpu:.3f}; chis' largest "
          f"relative difference {worst:.2e} (identical floats: {cold == warm}); load "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentence", default=SENTENCE, help="the input (default: a bundled 20-token sentence)")
    parser.add_argument("--first", type=int, default=0, help="the stack's first layer (default 0)")
    parser.add_argument("--last", type=int, default=5, help="the stack's last layer (default 5)")
    parser.add_argument("--eps", default="1e-4,1e-3", help="radii as fractions of the LayerNorm radius")
    parser.add_argument("--trace", action="store_true", help="tracemalloc: live memory and its growth per stage")
    parser.add_argument("--json", help="write the rows and the curve as JSON")
    parser.add_argument("--keep-products", action="store_true",
                        help="keep every block's attention products to the stack's end (as before they were let go)")
    parser.add_argument("--part", choices=["stack", "estimates"], default="stack",
                        help="the stack's curve (default) or the curvature bound's estimates side by side")
    args = parser.parse_args(argv)
    try:
        fractions = [float(e) for e in args.eps.split(",")]
    except ValueError:
        print(f"error: --eps: expected comma-separated fractions, got {args.eps!r}; fix: e.g. --eps 1e-4,1e-3",
              file=sys.stderr)
        return 2
    from lipbound.measures.curves import local_curve
    from lipbound.numeric.blas import single_threaded_blas

    if args.part == "estimates":
        with single_threaded_blas():
            estimates_part(args.sentence, args.first, fractions)
        return 0

    if args.keep_products:
        from lipbound.local.enclosed import EnclosedAttention
        EnclosedAttention.release_products = lambda self: None   # type: ignore[method-assign]
    if args.trace:
        tracemalloc.start(16)
    with single_threaded_blas():
        began = time.process_time()
        meter = StageMeter(args.trace)
        curve, tokens = local_curve(args.sentence, layer=args.first, kind="stack", last=args.last, eps=fractions,
                                    progress=meter)
        rows = meter.finish()
        cpu = time.process_time() - began
    peak = max(row["peak"] for row in rows)
    print(f"stack {args.first}..{args.last}, n = {curve.n}, eps/R {fractions}: {cpu:.1f} CPU s (set-up "
          f"{curve.setup_cpu_seconds:.1f}), peak resident {peak:.2f} GB (target <= 8), load "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for fraction, point in zip(fractions, curve.points):
        print(f"  eps {fraction:g} R: certified {point.certified:.6g}, witness {point.witness:.6g}, ratio "
              f"{point.ratio:.4g}, variation {point.variation:.4g} ({point.route}), {point.cpu_seconds:.1f} CPU s")
    for block in curve.blocks:
        print(f"  block {block['layer']}: ||DF(X~)|| {block['jacobian_norm']:.4g}; per eps certified "
              + ", ".join(f"{v:.4g}" for v in block["certified"]) + "; variation "
              + ", ".join(f"{v:.4g}" for v in block["variation"]) + "; ball radius "
              + ", ".join(f"{v:.4g}" for v in block["radius"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"stages": rows, "cpu_seconds": cpu, "peak_gigabytes": peak, "n": curve.n,
                       "points": [{"eps": f, "certified": p.certified, "witness": p.witness, "ratio": p.ratio,
                                   "variation": p.variation} for f, p in zip(fractions, curve.points)],
                       "blocks": list(curve.blocks)}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
