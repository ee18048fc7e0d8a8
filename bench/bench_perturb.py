"""Token-level perturbations on the 20 sentences of lipbound/measures/data/sentences.txt.

For every sentence, k = 1..3 replaced word tokens (nested edits, seed 0) and all six layers of
all-MiniLM-L6-v2: the exact W1 between the attention-block outputs (measured) against the
certified W1 constant of the block times the exact input W1 (predicted).  Prints, per layer, the
distribution of measured/predicted, the measured stretch W1(out)/W1(in) against the certified
constant, and the number of violations (rows where measured certainly exceeds predicted; any
would refute a bound).  ``--modes insert delete`` adds insertions and deletions.

Run: ``python bench/bench_perturb.py [--modes replace insert delete] [--k 1..3] [--layers 1..6]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def sentences() -> list[str]:
    path = os.path.join(os.path.dirname(__file__), os.pardir, "lipbound", "measures", "data", "sentences.txt")
    with open(path, encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


def summary(reports, title: str) -> str:
    rows = [row for report in reports for row in report.rows]
    lines = [title,
             f"{'layer':>5s} {'rows':>5s} {'ratio min':>10s} {'median':>10s} {'max':>10s} "
             f"{'stretch med':>11s} {'stretch max':>11s} {'L (data) med':>12s} {'L (LN) med':>11s} "
             f"{'violations':>10s} {'undecided':>9s}"]
    for layer in sorted({row.layer for row in rows}):
        chosen = [row for row in rows if row.layer == layer]
        ratio = np.array([row.ratio for row in chosen])
        stretch = np.array([row.amplification for row in chosen])
        lines.append(f"{layer:5d} {len(chosen):5d} {ratio.min():10.3g} {np.median(ratio):10.3g} {ratio.max():10.3g} "
                     f"{np.median(stretch):11.3f} {stretch.max():11.3f} "
                     f"{np.median([r.constant_data for r in chosen]):12.4g} "
                     f"{np.median([r.constant_layernorm for r in chosen]):11.4g} "
                     f"{sum(r.verdict == 'violated' for r in chosen):10d} "
                     f"{sum(r.verdict == 'not certified' for r in chosen):9d}")
    ratio = np.array([row.ratio for row in rows])
    lines.append(f"all: {len(rows)} rows, measured/predicted in [{ratio.min():.3g}, {ratio.max():.3g}], "
                 f"median {np.median(ratio):.3g}")
    lines.append(f"violations: {sum(r.violations for r in reports)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["replace"], choices=["replace", "insert", "delete"])
    parser.add_argument("--k", default="1..3", help="edit sizes (default 1..3)")
    parser.add_argument("--layers", default="0..5", help="layers counted from 0 (default 0..5)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from lipbound.cli.parsing import int_list
    from lipbound.measures.bert import load_text_model
    from lipbound.measures.perturb import perturb
    model = load_text_model()
    ks, layers = int_list("--k", 1)(args.k), int_list("--layers")(args.layers)
    for mode in args.modes:
        start = time.perf_counter()
        reports = [perturb(s, k=ks, mode=mode, layers=layers, seed=args.seed, model=model) for s in sentences()]
        elapsed = time.perf_counter() - start
        print(summary(reports, f"{mode}, k in {ks}, {len(reports)} sentences, layers {layers} ({elapsed:.1f} s)"))
        print()


if __name__ == "__main__":
    main()
