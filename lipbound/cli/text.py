"""Commands on real text: ``perturb`` (token edits, W1 movement) and ``depth`` (weight-shared iteration).

Layers and heads are counted from 0, as everywhere in lipbound.
"""

from __future__ import annotations

import json

from .parsing import epilog, index, int_list, output_file, plot_file, positive_int

__all__ = ["register"]

MODES = ("replace", "insert", "delete")


def _perturb(args) -> int:
    from ..io import write_text
    from ..measures.perturb import perturb
    mode, spec = "replace", (1,)
    for candidate in MODES:
        if getattr(args, candidate, None) is not None:
            mode, spec = candidate, getattr(args, candidate)
    report = perturb(args.sentence, k=spec, mode=mode, layers=args.layers, seed=args.seed, model=args.model)
    print(report.table())
    if args.json:
        write_text(args.json, json.dumps(report.to_json(), indent=2), "--json")
    if args.plot:
        report.plot(args.plot)
    return 3 if report.violations else 0


def _scales(text: str) -> tuple[float, ...]:
    import argparse
    import math
    values = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"expected positive numbers, e.g. 0.5 or 0.5,16,64, got {text!r}. "
                                             "Fix: write the certified constant(s) of the block")
        values.append(value)
    return tuple(values)


def _depth(args) -> int:
    from ..io import write_text
    from ..measures.depth import scale_sweep, sweep_table
    reports = scale_sweep(args.scale, steps=args.steps, sentence=args.sentence, model=args.model,
                          layer=args.layer, head=args.head)
    for report in reports:
        print(report.table())
        print()
    if len(reports) > 1:
        print(sweep_table(reports))
        print(f"violations: {sum(r.rate_violations for r in reports)}")
    if args.json:
        payload = reports[0].to_json() if len(reports) == 1 else [r.to_json() for r in reports]
        write_text(args.json, json.dumps(payload, indent=2), "--json")
    if args.plot:
        reports[0].plot(args.plot)
    return 3 if any(r.rate_violations for r in reports) else 0


def register(sub) -> None:
    perturb = sub.add_parser(
        "perturb", help="edit k tokens of a sentence; measured vs certified W1 movement per layer",
        description="Replace, insert or delete k word tokens of a sentence and compare the exact Wasserstein-1 "
                    "movement of every attention block's output with the certified W1 constant times the input "
                    "movement.  Layers are counted from 0.",
        epilog=epilog('lipbound perturb "The cat sat on the mat."',
                      'lipbound perturb "The cat sat on the mat." --replace 1..3 --layers 0,5 --plot w1.png',
                      'lipbound perturb "A longer sentence to edit." --delete 2 --json edits.json',
                      notes="Exit status: 0, 2 user error, 3 a measured movement exceeds its certified prediction."))
    perturb.add_argument("sentence", help="the text to perturb (at most the model's 512 positions)")
    edit = perturb.add_mutually_exclusive_group()
    edit.add_argument("--replace", metavar="K", type=int_list("--replace", 1),
                      help="replace K word tokens (K, A..B or a list; default 1)")
    edit.add_argument("--insert", metavar="K", type=int_list("--insert", 1), help="insert K random whole words")
    edit.add_argument("--delete", metavar="K", type=int_list("--delete", 1), help="delete K word tokens")
    perturb.add_argument("--layers", type=int_list("--layers"), default=tuple(range(6)),
                         help="layers counted from 0, e.g. 0..5 or 0,3 (default 0..5)")
    perturb.add_argument("--seed", type=int, default=0, help="seed of the positions and words (default 0)")
    perturb.add_argument("--json", type=output_file("--json", ".json"), help="write the report as JSON")
    perturb.add_argument("--plot", type=plot_file(), help="save measured and predicted W1 against k/n (png, pdf, ...)")
    perturb.add_argument("--model", metavar="DIR", help="a BERT checkpoint directory (default: all-MiniLM-L6-v2)")
    perturb.set_defaults(handler=_perturb)

    depth = sub.add_parser(
        "depth", help="weight-shared iteration of a certified tied-L2 block: inversion and fixed points",
        description="Rescale a tied L2 attention block built from real weights to a certified Lipschitz constant "
                    "S, invert X + Att(X) by fixed-point iteration and iterate X -> Att(X); measured contraction "
                    "rates are checked against S.  Layers and heads are counted from 0.",
        epilog=epilog("lipbound depth", "lipbound depth --scale 0.5,16,64 --json depth.json",
                      "lipbound depth --layer 2 --head 5 --plot depth.png",
                      notes="Exit status: 0, 2 user error, 3 a measured rate exceeds its certified constant."))
    depth.add_argument("--scale", type=_scales, default=(0.5,),
                       help="certified constant(s) of the block: S, or a comma list for a sweep (default 0.5)")
    depth.add_argument("--steps", type=positive_int("--steps"), default=100, help="iteration budget (default 100)")
    depth.add_argument("--sentence", default="The cat slept all afternoon.",
                       help="text whose hidden states are iterated")
    depth.add_argument("--layer", type=index("--layer", "layer"), default=0,
                       help="layer of the source head and of the inputs, counted from 0 (default 0)")
    depth.add_argument("--head", type=index("--head", "head"), default=0, help="source head, counted from 0 (default 0)")
    depth.add_argument("--json", type=output_file("--json", ".json"), help="write the report(s) as JSON")
    depth.add_argument("--plot", type=plot_file(), help="save the convergence plot (first scale)")
    depth.add_argument("--model", metavar="DIR", help="a BERT checkpoint directory (default: all-MiniLM-L6-v2)")
    depth.set_defaults(handler=_depth)
