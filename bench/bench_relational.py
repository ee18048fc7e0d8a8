"""L(eps) with and without the relational route (lipbound/local/relational.py), side by side.

For each sentence (the shortest of lipbound/measures/data/sentences.txt first), kind and radius: the
certified L(eps), the witness (projected ascent inside U, as `local` finds it), their ratio before (the
per-token routes alone) and after (the relational route added), which term dominates the certified value
(``||DF(X)||`` and the variation bound, the product of the block bounds, the global constant) and the CPU
seconds of each curve (time.process_time: the machine is shared, wall time is not a measure).

    python bench/bench_relational.py --sentences 1 --kinds layer --fractions 1e-3,1e-2,1e-1
    python bench/bench_relational.py --sentences 2 --kinds block,stack --fractions 1e-4,1e-3,1e-2
"""

from __future__ import annotations

import argparse
import os
import time
from unittest import mock

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def sentences(count: int) -> list[str]:
    from importlib import resources
    text = resources.files("lipbound.measures").joinpath("data/sentences.txt").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return sorted(lines, key=len)[:count]


def run(text, kind, layer, fractions, model, relational: bool):
    from lipbound.local import curve as curve_module
    from lipbound.measures.curves import local_curve
    top = layer + 1 if kind == "stack" else None
    began = time.process_time()
    if relational:
        found, _ = local_curve(text, layer=layer, kind=kind, last=top, eps=fractions, model=model)
    else:
        with mock.patch.object(curve_module.RelationalRoute, "of", return_value=None):
            found, _ = local_curve(text, layer=layer, kind=kind, last=top, eps=fractions, model=model)
    return found, time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1, help="how many of the shortest sentences")
    parser.add_argument("--skip", type=int, default=0, help="leave out this many of the shortest first")
    parser.add_argument("--kinds", default="layer")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--fractions", default="1e-3,1e-2,1e-1")
    parser.add_argument("--after-only", action="store_true", help="skip the run without the relational route")
    args = parser.parse_args()
    from lipbound.measures.bert import load_text_model
    model = load_text_model()
    fractions = tuple(float(f) for f in args.fractions.split(","))
    for text in sentences(args.skip + args.sentences)[args.skip:]:
        for kind in args.kinds.split(","):
            runs = {}
            for relational in ((True,) if args.after_only else (False, True)):
                runs[relational] = run(text, kind, args.layer, fractions, model, relational)
            after, seconds = runs[True]
            print(f"{text!r} {kind} layer {args.layer}, n = {after.n}, ||DF(X)|| {after.jacobian_norm:.4g}, "
                  f"variation {after.variation_bound}, relational {after.relational}; CPU s: "
                  + ", ".join(f"{'after' if r else 'before'} {s:.0f}" for r, (_, s) in runs.items()))
            for index, point in enumerate(after.points):
                before = runs[False][0].points[index] if False in runs else None
                print(f"  eps {point.eps / after.radius:7.0e} R: certified {point.certified:10.4g} witness "
                      f"{point.witness:8.4g} ratio {point.ratio:8.3g}"
                      + (f" (before {before.certified:10.4g}, ratio {before.ratio:8.3g})" if before else "")
                      + f"; variation {point.variation:9.4g} (found {point.variation_witness:.3g}); "
                        f"route: {point.route}; CPU s {point.cpu_seconds:.1f}; {point.verdict}")


if __name__ == "__main__":
    main()
