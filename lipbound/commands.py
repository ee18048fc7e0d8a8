"""Numeric commands of the CLI: demo, verify, check, recheck, perturb, depth.

Kept apart from :mod:`lipbound.cli` so that the symbolic commands never import the
numeric layer (and cvxpy) just to parse arguments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["register"]

EXIT_REFUTED = 3


def _print_row(row) -> None:
    who = "all heads" if row.head is None else f"head {row.head}"
    flags = (" REFUTED: " + ", ".join(row.refuted)) if row.refuted else ""
    print(f"  layer {row.layer} {who:9s} witness {row.witness_value:10.4g}  <=  Lip  <=  "
          f"{row.best_upper:10.4g}   gap {row.gap:6.3g}{flags}", flush=True)


def _write_outputs(report, args) -> None:
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
    if getattr(args, "csv", None):
        Path(args.csv).write_text(report.csv())
    if getattr(args, "markdown", None):
        Path(args.markdown).write_text(report.markdown())


def _verify(args) -> int:
    from .numeric.report import verify_model
    from .numeric.weights import load_weights
    model = load_weights(args.weights, num_heads=args.num_heads,
                         layers=None if args.layer is None else [args.layer])
    radius = args.radius
    report = verify_model(model, layers=None if args.layer is None else [args.layer],
                          heads=None if args.head is None else [args.head], n=args.n, radius=radius,
                          sdp=args.sdp, budget=args.budget, seed=args.seed, witness_dir=args.witness_dir,
                          drop_query_bias=args.drop_query_bias, progress=_print_row)
    print()
    print(report.table())
    _write_outputs(report, args)
    if report.refuted:
        print("\nREFUTED: a witness beats at least one bound (exit status 3)")
        return EXIT_REFUTED
    return 0


def _demo(args) -> int:
    import numpy as np

    from .assumptions import Assumptions, Ball
    from .numeric.report import verify_model
    from .numeric.weights import load_default
    from .printing.latex import latex
    from .symbolic.registry import variant
    bound = variant("dot-product").derive(Assumptions(domain=Ball()), "dot-product")
    print("lipbound demo: the embedded default model (all-MiniLM-L6-v2, layers 0 and 5)")
    print("\n1. Derived bound (dot-product self-attention with biases, Frobenius norm, tokens in B_R):")
    print(f"   theorem {bound.theorem}:  Lip <= {bound.generic}")
    for symbol, value in bound.constants.items():
        print(f"     {str(symbol):6s} <= {value}")
    print(f"   LaTeX: {latex(bound.expr)}")
    print(f"   ({len(bound.record.steps)} proof steps; `lipbound derive dot-product --proof` prints them)")
    model = load_default()
    print(f"\n2. Sandwich per head, n = {args.n} tokens, ball of the LayerNorm radius, "
          f"witness budget {args.budget} s per head, bounds: derived closed form"
          + (" and SDP relaxation" if not args.no_sdp else "") + ":")
    report = verify_model(model, n=args.n, radius="layernorm", budget=args.budget, seed=args.seed,
                          witness_dir=args.witness_dir, heads=None if args.all_heads else range(args.heads),
                          whole_layers=args.all_heads, sdp=not args.no_sdp, progress=_print_row)
    gaps = [row.gap for row in report.heads if row.head is not None]
    print(f"\nmedian gap (best certified upper / witness) over {len(gaps)} heads: {float(np.median(gaps)):.3g}; "
          f"worst {max(gaps):.3g}; refuted bounds: {sum(len(r.refuted) for r in report.heads)}")
    print(f"witnesses saved in {args.witness_dir}/ (re-check one with `lipbound recheck FILE`)")
    _write_outputs(report, args)
    return EXIT_REFUTED if report.refuted else 0


def _check(args) -> int:
    from .numeric.claims import check
    weights = None
    if args.weights:
        from .numeric.weights import load_weights
        weights = load_weights(args.weights, num_heads=args.num_heads)
    result = check(args.claim, weights=weights, seed=args.seed, budget=args.budget)
    print(result.describe())
    if args.json:
        Path(args.json).write_text(json.dumps(result.__dict__, indent=2, default=str))
    return EXIT_REFUTED if result.refuted else 0


def _recheck(args) -> int:
    from .numeric.recheck import recheck_file
    weights = None
    if args.weights:
        from .numeric.weights import load_weights
        weights = load_weights(args.weights, num_heads=args.num_heads)
    result = recheck_file(args.witness, weights)
    print(result.message)
    print(f"target: {result.target}; enclosure [{result.lower!r}, {result.upper!r}]; "
          f"in the domain: {result.in_domain} (largest ||x_i - c|| = {result.max_distance!r}); {result.seconds:.2f} s")
    return 0 if result.valid else 1


def _add_verify_arguments(parser, weights: bool = True) -> None:
    if weights:
        parser.add_argument("weights", help="a .safetensors file or Hugging Face BERT directory, or a plain .npz")
        parser.add_argument("--layer", type=int, help="one layer (default: every layer in the file)")
        parser.add_argument("--head", type=int, help="one head (default: every head and the whole layer)")
        parser.add_argument("--radius", default="layernorm",
                            help="R, 'layernorm' (ball about 0 holding the LayerNorm output that feeds the layer) "
                                 "or 'layernorm-image' (ball about the LayerNorm bias)")
        parser.add_argument("--num-heads", type=int, help="heads per layer if no config says")
        parser.add_argument("--sdp", action="store_true", help="add the SDP relaxations (slower)")
        parser.add_argument("--drop-query-bias", action="store_true",
                            help="verify the heads without their query bias, where published claims about plain "
                                 "dot-product attention apply (they are listed and checked)")
    parser.add_argument("--n", type=int, default=8, help="number of tokens (default 8)")
    parser.add_argument("--budget", type=float, default=10.0, help="witness search seconds per head")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--witness-dir", default="witnesses", help="where witnesses are saved")
    parser.add_argument("--json", help="write the report as JSON")
    parser.add_argument("--csv", help="write the report as CSV")
    parser.add_argument("--markdown", help="write the report as Markdown")


def register(sub) -> None:
    verify = sub.add_parser("verify", help="the sandwich witness <= Lip <= bounds for every head of a model")
    _add_verify_arguments(verify)
    verify.set_defaults(handler=_verify)

    demo = sub.add_parser("demo", help="derive, evaluate and sandwich on the embedded default model")
    _add_verify_arguments(demo, weights=False)
    demo.add_argument("--heads", type=int, default=12, help="heads per layer to show (default all 12)")
    demo.add_argument("--all-heads", action="store_true", help="also the whole multi-head layers")
    demo.add_argument("--no-sdp", action="store_true", help="closed forms only (faster)")
    demo.set_defaults(handler=_demo, budget=2.0)

    check = sub.add_parser("check", help="try to refute a published claim (exit 3 if refuted)")
    check.add_argument("claim")
    check.add_argument("--weights", help="also try these weights")
    check.add_argument("--num-heads", type=int)
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--budget", type=float, default=20.0)
    check.add_argument("--json", help="write the result as JSON")
    check.set_defaults(handler=_check)

    recheck = sub.add_parser("recheck", help="recompute a saved witness in high precision")
    recheck.add_argument("witness")
    recheck.add_argument("--weights", help="the weights the witness was found on (default: from its metadata)")
    recheck.add_argument("--num-heads", type=int)
    recheck.set_defaults(handler=_recheck)

    for name, module in (("perturb", "perturb"), ("depth", "depth")):
        _register_measure_command(sub, name, module)


def _register_measure_command(sub, name: str, module: str) -> None:
    import importlib
    try:
        target = importlib.import_module(f"lipbound.measures.{module}")
    except ImportError as error:  # the measures layer needs scipy (exact W1)
        reason = str(error)
        parser = sub.add_parser(name, help=f"(unavailable: {reason})")
        parser.set_defaults(handler=lambda args: _unavailable(name, reason))
        return
    getattr(target, f"add_{name}_parser")(sub)


def _unavailable(name, error) -> int:
    sys.stderr.write(f"lipbound: error: {name} needs the measures layer ({error}); "
                     f"install with pip install 'lipbound[all]'\n")
    return 2
