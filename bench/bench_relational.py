"""L(eps) with and without the relational routes (lipbound/local/relational.py, jacobian_forms.py), side by side.

For each sentence (the shortest of lipbound/measures/data/sentences.txt first), kind and radius: the
certified L(eps), the witness (projected ascent inside U, as `local` finds it), their ratio before (the
per-token routes alone), without the Jacobian enclosed over U (``--without-jacobian``: the relational scores
and curvature integral only) and after (every route), the route that gave the certified value and the CPU
seconds of each curve and radius (time.process_time: the machine is shared, wall time is not a measure).

    python bench/bench_relational.py --sentences 3 --kinds layer --fractions 1e-3,1e-2,1e-1 --without-jacobian
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
    parser.add_argument("--without-jacobian", action="store_true",
                        help="also run with the relational route but without the Jacobian enclosed over U")
    args = parser.parse_args()
    from lipbound.measures.bert import load_text_model
    model = load_text_model()
    fractions = tuple(float(f) for f in args.fractions.split(","))
    for text in sentences(args.skip + args.sentences)[args.skip:]:
        for kind in args.kinds.split(","):
            modes = ("after",) if args.after_only else \
                ("before", "relational", "after") if args.without_jacobian else ("before", "after")
            runs = {mode: run(text, kind, args.layer, fractions, model, mode) for mode in modes}
            after, seconds = runs["after"]
            print(f"{text!r} {kind} layer {args.layer}, n = {after.n}, ||DF(X)|| {after.jacobian_norm:.4g}, "
                  f"variation {after.variation_bound}, relational {after.relational}; CPU s: "
                  + ", ".join(f"{mode} {s:.0f}" for mode, (_, s) in runs.items()))
            for index, point in enumerate(after.points):
                before = runs["before"][0].points[index] if "before" in runs else None
                middle = runs["relational"][0].points[index] if "relational" in runs else None
                print(f"  eps {point.eps / after.radius:7.0e} R: certified {point.certified:10.4g} witness "
                      f"{point.witness:8.4g} ratio {point.ratio:8.3g}"
                      + (f" (before {before.certified:10.4g}, ratio {before.ratio:8.3g})" if before else "")
                      + (f" (without the Jacobian route {middle.certified:10.4g}, ratio {middle.ratio:8.3g})"
                         if middle else "")
                      + f"; variation {point.variation:9.4g} (found {point.variation_witness:.3g}); "
                        f"route: {point.route}; CPU s {point.cpu_seconds:.1f}; {point.verdict}")


if __name__ == "__main__":
    main()
