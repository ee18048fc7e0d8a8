"""The gap between certified upper bounds and witnesses on every head of the embedded model.

For every head of layers 0 and 5 of the embedded default (all-MiniLM-L6-v2), at the
LayerNorm radius of the LayerNorm that feeds the layer (ball about 0) and n tokens:
the witness (structured search), the derived closed form, the SDP relaxation, the best
certified upper bound and gap = best upper / witness.  Prints the table, the whole
distribution of gaps (min, quartiles, median, max), the worst head, and the whole
multi-head layers.  Target (n = 8): median gap at most 3.

Run: ``python bench/bench_gap.py [--n 8] [--budget 5] [--layers 0 5] [--no-layers]``
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--budget", type=float, default=5.0, help="witness search seconds per head")
    parser.add_argument("--layers", type=int, nargs="*", default=[0, 5])
    parser.add_argument("--no-layers", action="store_true", help="skip the whole multi-head layers")
    args = parser.parse_args()
    from lipbound.numeric.report import verify_model
    from lipbound.numeric.model import load_default
    model = load_default()
    with tempfile.TemporaryDirectory() as directory:
        report = verify_model(model, layers=args.layers, n=args.n, domain="layernorm", sdp=True, budget=args.budget,
                              witness_dir=directory, whole_layers=not args.no_layers,
                              progress=lambda row: print(f"  layer {row.layer} head "
                                                         f"{'all' if row.head is None else row.head}: witness "
                                                         f"{row.witness_value:.4g}, best upper {row.best_upper:.4g}, "
                                                         f"gap {row.gap:.3g}", flush=True))
    print()
    print(report.table())
    heads = [row for row in report.rows if row.head is not None]
    gaps = np.array([row.gap for row in heads])
    closed = np.array([next(b.value for b in row.upper_bounds if b.name == "derived") / row.witness_value
                       for row in heads])
    worst = heads[int(np.argmax(gaps))]
    print(f"\nn = {args.n}, {len(heads)} heads, witness budget {args.budget} s per head")
    print("gap best-certified / witness: min {:.3g}  q1 {:.3g}  median {:.3g}  q3 {:.3g}  max {:.3g}".format(
        *np.percentile(gaps, [0, 25, 50, 75, 100])))
    print("gap closed-form / witness:    min {:.3g}  q1 {:.3g}  median {:.3g}  q3 {:.3g}  max {:.3g}".format(
        *np.percentile(closed, [0, 25, 50, 75, 100])))
    print(f"worst head: layer {worst.layer} head {worst.head} (gap {worst.gap:.3g}: witness "
          f"{worst.witness_value:.4g}, best upper {worst.best_upper:.4g})")
    print(f"median gap target (<= 3): {'MET' if np.median(gaps) <= 3 else 'NOT MET'}; "
          f"refuted bounds: {sum(len(row.refuted) for row in report.rows)}; total {report.seconds:.0f} s")


if __name__ == "__main__":
    main()
