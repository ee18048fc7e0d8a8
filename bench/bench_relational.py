"""L(eps) with and without the relational routes (lipbound/local/relational.py, jacobian_forms.py), side by side.

For each sentence (the shortest of lipbound/measures/data/sentences.txt first), kind and radius: the
certified L(eps), the witness (projected ascent inside U, as `local` finds it), their ratio before (the
per-token routes alone), without the Jacobian enclosed over U (``--without-jacobian``: the relational scores
and curvature integral only) and after (every route), the route that gave the certified value and the CPU
seconds of each curve and radius (time.process_time: the machine is shared, wall time is not a measure).

    python bench/bench_relational.py --sentences 3 --kinds layer --fractions 1e-3,1e-2,1e-1 --without-jacobian
    python bench/bench_relational.py --sentences 2 --kinds block,stack --fractions 1e-4,1e-3,1e-2
    python bench/bench_relational.py --sentences 20 --fractions 1e-4,1e-3,1e-2,1e-1 --after-only --table

``--table`` ends with the ratios' median and worst over the sentences per radius, and the CPU seconds per radius
(median, largest); ``--text`` runs one sentence of your own instead of the bundled ones.
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


def run(text, kind, layer, fractions, model, mode: str):
    """One curve: ``mode`` "before" (no relational route), "relational" (no Jacobian enclosed over U) or "after"."""
    import contextlib
    import math

    from lipbound.local import curve as curve_module
    from lipbound.measures.curves import local_curve
    top = layer + 1 if kind == "stack" else None
    began = time.process_time()
    patch = mock.patch.object(curve_module.RelationalRoute, "of", return_value=None) if mode == "before" else \
        mock.patch.object(curve_module.RelationalRoute, "jacobian", return_value=(math.inf, math.inf)) \
        if mode == "relational" else contextlib.nullcontext()
    with patch:
        found, _ = local_curve(text, layer=layer, kind=kind, last=top, eps=fractions, model=model)
    return found, time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1, help="how many of the shortest sentences")
    parser.add_argument("--skip", type=int, default=0, help="leave out this many of the shortest first")
    parser.add_argument("--kinds", default="layer")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--fractions", default="1e-3,1e-2,1e-1")
    parser.add_argument("--after-only", action="store_true", help="skip the runs without the relational routes")
    parser.add_argument("--table", action="store_true", help="end with the median and worst ratio per radius")
    parser.add_argument("--text", help="this sentence instead of the bundled ones")
    parser.add_argument("--without-jacobian", action="store_true",
                        help="also run with the relational route but without the Jacobian enclosed over U")
    args = parser.parse_args()
    from lipbound.measures.bert import load_text_model
    model = load_text_model()
    fractions = tuple(float(f) for f in args.fractions.split(","))
    texts = [args.text] if args.text else sentences(args.skip + args.sentences)[args.skip:]
    table: dict = {}
    for text in texts:
        for kind in args.kinds.split(","):
            modes = ("after",) if args.after_only else \
                ("before", "relational", "after") if args.without_jacobian else ("before", "after")
            runs = {mode: run(text, kind, args.layer, fractions, model, mode) for mode in modes}
            after, seconds = runs["after"]
            print(f"{text!r} {kind} layer {args.layer}, n = {after.n}, ||DF(X)|| {after.jacobian_norm:.4g}, "
                  f"variation {after.variation_bound}, relational {after.relational}; CPU s: "
                  + ", ".join(f"{mode} {s:.0f}" for mode, (_, s) in runs.items()))
            for index, point in enumerate(after.points):
                table.setdefault((kind, fractions[index]), []).append((point.ratio, point.cpu_seconds))
                before = runs["before"][0].points[index] if "before" in runs else None
                middle = runs["relational"][0].points[index] if "relational" in runs else None
                print(f"  eps {point.eps / after.radius:7.0e} R: certified {point.certified:10.4g} witness "
                      f"{point.witness:8.4g} ratio {point.ratio:8.3g}"
                      + (f" (before {before.certified:10.4g}, ratio {before.ratio:8.3g})" if before else "")
                      + (f" (without the Jacobian route {middle.certified:10.4g}, ratio {middle.ratio:8.3g})"
                         if middle else "")
                      + f"; variation {point.variation:9.4g} (found {point.variation_witness:.3g}); "
                        f"route: {point.route}; CPU s {point.cpu_seconds:.1f}; {point.verdict}")

    if args.table:
        import numpy as np
        for (kind, fraction), rows in table.items():
            ratios, seconds = np.array(rows).T
            print(f"{kind} eps {fraction:7.0e} R over {len(rows)} sentences: ratio median {np.median(ratios):.3g} "
                  f"worst {np.max(ratios):.3g} (best {np.min(ratios):.3g}); CPU s per radius median "
                  f"{np.median(seconds):.1f}, largest {np.max(seconds):.1f}")


if __name__ == "__main__":
    main()
