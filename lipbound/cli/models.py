"""Commands on real weights: ``demo``, ``verify``, ``convert``, ``check``, ``recheck``.

Layers and heads are counted from 0 everywhere.  Output paths are checked when the arguments
are parsed, before any work; reports are rewritten atomically after every finished row, so an
interrupted run (Ctrl-C) keeps what finished.  Exit statuses: 0 done, 1 an invalid witness
(``recheck``), 2 a user error, 3 a bound or claim refuted, 130 interrupted.
"""

from __future__ import annotations

import json
import sys

from ..errors import LipboundError
from .output import Progress, ReportFiles
from .parsing import (
    DEFAULT_MODEL,
    EMBEDDED_MODEL_HELP,
    EXIT_REFUTED,
    choice,
    epilog,
    index,
    model_path,
    output_directory,
    output_file,
    positive_float,
    positive_int,
    radius_spec,
    scheduler_address,
)

__all__ = ["register", "load_model", "EXIT_INVALID", "EXIT_REFUTED", "EXIT_INTERRUPTED", "BUDGET_HELP", "ROWS_HELP"]

EXIT_INVALID = 1
EXIT_INTERRUPTED = 130


#: ``--block`` and ``--kind`` values (the library's BLOCKS and KIND_CHOICES, spelled here so that
#: building the parser loads no numeric module)
_BLOCKS = ("encoder", "decoder")
_KINDS = ("self", "causal", "cross", "cross-queries", "cross-context", "cross-joint")


#: What --budget means, in every command that searches witnesses.
BUDGET_HELP = ("nominal seconds of witness search {per} (default %(default)g): a fixed amount of work, done in "
               "about half that many CPU seconds on an idle core (more on a busy one), so that the same "
               "--seed gives the same numbers on any machine, with any --jobs")
#: What a row of verify bounds (its --help and the README say the same).
ROWS_HELP = ("A head row bounds the head's own map X -> f^h(X), before its block W_O^h of the output projection: it is "
             "not that head's share of the layer output (||W_O^h|| can make f^h W_O^h larger than the row); the "
             "whole-layer row (head 'all') bounds the multi-head layer X -> sum_h f^h(X) W_O^h, without the residual.")


def load_model(name, num_heads=None, layers=None):
    """The model a command names: ``default`` (or None) is the embedded one, anything else a checkpoint path."""
    from ..numeric.model import load_default, load_weights
    if name in (None, DEFAULT_MODEL):
        return load_default(layers=layers)
    return load_weights(name, num_heads=num_heads, layers=layers)


def _row_text(row) -> str:
    who = "whole layer" if row.head is None else f"head {row.head}"
    flags = (" REFUTED: " + ", ".join(row.refuted)) if row.refuted else ""
    return (f"{row.block} layer {row.layer} {who} {row.kind}: witness {row.witness_value:.4g} <= Lip <= "
            f"{row.best_upper:.4g}, gap {row.gap:.3g}{flags}")


def _run_verification(verification, files: ReportFiles, args) -> int:
    """Run the rows (in this process, in --jobs processes or on the --scheduler's cluster):
    a progress bar on a terminal, every report file rewritten after each finished row; on Ctrl-C or a
    failed job the files keep the finished rows (marked partial)."""
    with Progress("rows", len(verification.jobs)) as progress:
        def on_row(report, row):
            files.write(report)
            progress.note(_row_text(row))
            progress.update(len(report.rows))

        try:
            report = verification.run(on_row, jobs=args.jobs, scheduler=args.scheduler)
        except KeyboardInterrupt:
            progress.close()
            files.write(verification.report)
            kept = files.describe()
            sys.stderr.write(f"lipbound: interrupted; {len(verification.report.rows)} of "
                             f"{verification.report.planned} rows kept{' in ' + kept if kept else ''}\n")
            return EXIT_INTERRUPTED
    files.write(report)
    print()
    print(report.table())
    if report.refuted:
        print("\nREFUTED: a witness beats at least one bound (exit status 3)")
        return EXIT_REFUTED
    return 0


def _files(args) -> ReportFiles:
    return ReportFiles(args.json, args.csv, args.markdown, args.latex)


def _verify_whole(args) -> int:
    """``verify --whole``: the end-to-end bound with its breakdown; the report files are rewritten
    after every task (JSON "complete": false until the end)."""
    from ..numeric.whole import verify_whole
    if args.latex is not None:
        raise LipboundError("--latex", "a report format --whole writes (--json, --csv, --markdown)",
                            f"--latex {args.latex}", "use --json or --markdown with --whole")
    for option, value in (("--layer", args.layer), ("--head", args.head), ("--kind", args.kind),
                          ("--block", args.block)):
        if value is not None:
            raise LipboundError(option, "no selection with --whole (it takes every layer, head and block)",
                                f"{option} {value}", f"drop {option}, or drop --whole to verify attention only")
    for option, value in (("--sdp", args.sdp), ("--drop-query-bias", args.drop_query_bias)):
        if value:
            raise LipboundError(option, "no attention-only option with --whole", option,
                                f"drop {option} (--whole takes each block's best certified bound)")
    model = load_model(args.weights, num_heads=args.num_heads)
    files = _files(args)
    state = {}
    with Progress("tasks") as progress:
        def on_task(report, done, total, text):
            files.write(report)
            state["report"] = report
            progress.note(f"[{done}/{total}] {text}")
            progress.update(done, total)

        try:
            report = verify_whole(model, n=args.n, m=args.m, domain=args.radius, effort=args.effort,
                                  restarts=args.restarts, iterations=args.iterations, seed=args.seed, jobs=args.jobs,
                                  scheduler=args.scheduler, on_task=on_task)
        except KeyboardInterrupt:
            progress.close()
            kept = files.describe()
            done = len(state["report"].components) if "report" in state else 0
            sys.stderr.write(f"lipbound: interrupted; {done} components kept{' in ' + kept if kept else ''}\n")
            return EXIT_INTERRUPTED
    files.write(report)
    print()
    print(report.table())
    refuted = [r for r in report.components if r["witness"] is not None and r["witness"] > r["best_upper"]]
    refuted += [b for b in report.model_bounds if b["witness"] is not None and b["witness"] > b["value"]]
    if refuted:
        print("\nREFUTED: a witness beats a certified bound (exit status 3)")
        return EXIT_REFUTED
    return 0


def _verify(args) -> int:
    if args.whole:
        return _verify_whole(args)
    from ..numeric.verification import Verification
    model = load_model(args.weights, num_heads=args.num_heads, layers=None if args.layer is None else [args.layer])
    verification = Verification(model, blocks=args.block, layers=None if args.layer is None else [args.layer],
                                heads=None if args.head is None else [args.head], kinds=args.kind, n=args.n, m=args.m,
                                domain=args.radius, sdp=args.sdp, budget=args.budget, seed=args.seed,
                                witness_dir=args.witness_dir, drop_query_bias=args.drop_query_bias)
    return _run_verification(verification, _files(args), args)


def _convert(args) -> int:
    from ..numeric.model import PLAIN_FORMAT, save_plain
    from ..numeric.model.files import sha256_of
    model = load_model(args.weights, num_heads=args.num_heads)
    written = save_plain(model, args.output)
    print(f"wrote {written} ({PLAIN_FORMAT}, sha256 {sha256_of([written])})")
    print(f"from {model.path} (sha256 {model.sha256}): {model.describe()}")
    return 0


def _demo(args) -> int:
    import numpy as np

    from ..numeric.model import load_default
    from ..numeric.verification import Verification
    from ..printing.latex import latex
    from ..printing.plaintext import plain, plain_legend
    from ..symbolic.assumptions import Assumptions, Ball
    from ..symbolic.registry import variant
    bound = variant("dot-product").derive(Assumptions(domain=Ball()), "dot-product")
    print("lipbound demo: the embedded default model (all-MiniLM-L6-v2, layers 0 and 5)")
    print("\n1. Derived bound (dot-product self-attention with biases, Frobenius norm, tokens in B_R):")
    print(f"   theorem {bound.theorem}:  Lip <= {plain(bound.generic)}")
    print("   with the kernel constants (value spread rho, query and key sensitivities alpha and beta, score spread "
          "omega) bounded by")
    for symbol, value in bound.constants.items():
        print(f"     {str(symbol):6s} <= {plain(value)}")
    for line in plain_legend(bound.generic, *bound.constants.values()):
        print(f"   {line}")
    print(f"   LaTeX: {latex(bound.expr)}")
    print(f"   ({len(bound.record.steps)} proof steps; `lipbound derive dot-product --proof` prints them)")
    model = load_default()
    print(f"\n2. Sandwich per head, n = {args.n} tokens, ball of the LayerNorm radius, witness budget "
          f"{args.budget:g} nominal s per head, bounds: the derived closed form"
          + (" and the SDP relaxation" if not args.no_sdp else "") + ".  " + ROWS_HELP, flush=True)
    verification = Verification(model, n=args.n, domain="layernorm", budget=args.budget, seed=args.seed,
                                witness_dir=args.witness_dir, heads=None if args.all_heads else range(args.heads),
                                whole_layers=args.all_heads, sdp=not args.no_sdp)
    status = _run_verification(verification, _files(args), args)
    rows = verification.report.rows
    gaps = [row.gap for row in rows if row.head is not None]
    if gaps:
        print(f"\nmedian gap (best certified upper / witness) over {len(gaps)} heads: {float(np.median(gaps)):.3g}; "
              f"worst {max(gaps):.3g}; refuted bounds: {sum(len(r.refuted) for r in rows)}")
        print(f"witnesses saved in {args.witness_dir}/ (re-check one with `lipbound recheck FILE`)")
    return status


def _check(args) -> int:
    from ..numeric.claims import check
    weights = load_model(args.weights, num_heads=args.num_heads) if args.weights else None
    result = check(args.claim, weights=weights, seed=args.seed, budget=args.budget)
    print(result.describe())
    if args.json:
        from ..io import write_text
        write_text(args.json, json.dumps(result.__dict__, indent=2, default=str), "--json")
    return EXIT_REFUTED if result.refuted else 0


def _recheck(args) -> int:
    from ..numeric.model import DEFAULT_WEIGHTS
    from ..numeric.recheck import recheck_file
    result = recheck_file(args.witness, str(DEFAULT_WEIGHTS) if args.weights == DEFAULT_MODEL else args.weights)
    print(result.message)
    print(f"target: {result.target}; weights: {result.weights or 'in memory'} (sha256 {result.sha256 or 'unknown'})")
    print(f"enclosure [{result.lower!r}, {result.upper!r}]; in the domain: {result.in_domain} "
          f"(largest ||x_i - c|| = {result.max_distance!r}); {result.seconds:.2f} s")
    return 0 if result.valid else EXIT_INVALID


_WEIGHTS_HELP = ("a checkpoint: a .safetensors file or Hugging Face model directory (BERT, RoBERTa, DistilBERT, "
                 "ViT, GPT-2), a CTranslate2 Whisper model.bin or its directory, or a plain lipbound .npz; "
                 + EMBEDDED_MODEL_HELP)


def _add_run_options(parser, weights: bool = True) -> None:
    if weights:
        parser.add_argument("weights", metavar="MODEL", nargs="?", default=DEFAULT_MODEL, type=model_path("MODEL"),
                            help=_WEIGHTS_HELP)
        parser.add_argument("--block", type=choice("--block", _BLOCKS),
                            help="one stack: encoder or decoder (default: every stack the model has)")
        parser.add_argument("--layer", type=index("--layer", "layer"),
                            help="one layer of each selected stack, counted from 0 (default: all)")
        parser.add_argument("--head", type=index("--head", "head"),
                            help="one head, counted from 0 (default: every head and the whole layer)")
        parser.add_argument("--kind", type=choice("--kind", _KINDS),
                            help="which attention: self (an encoder's), causal (a decoder's self-attention), cross "
                                 "(a decoder's cross-attention in its three senses: cross-queries, the constant in "
                                 "the m queries; cross-context, in the n context tokens; cross-joint, in both), or "
                                 "one of those three (default: every kind each layer has)")
        parser.add_argument("--m", type=positive_int("--m"),
                            help="queries of cross-attention (default: n); n is then the number of context tokens")
        parser.add_argument("--radius", type=radius_spec(), default="layernorm",
                            help="the domain of each attention's inputs: 'layernorm' (default: the ball about 0 "
                                 "holding every output of the LayerNorm that feeds them: for cross-attention, the "
                                 "decoder's pre-cross-attention LayerNorm for the queries and the encoder's final "
                                 "LayerNorm for the context), 'layernorm-image' (those outputs, an ellipsoid; their "
                                 "hull lies in the ball about the LayerNorm bias), or a radius R (the ball "
                                 "||x|| <= R for every token)")
        parser.add_argument("--num-heads", type=positive_int("--num-heads"),
                            help="heads per layer, when no config.json or metadata says")
        parser.add_argument("--sdp", action="store_true", help="add the SDP relaxations (slower, tighter)")
        parser.add_argument("--whole", action="store_true",
                            help="the whole model end to end: every attention, feed-forward block, LayerNorm, "
                                 "residual step and layer, composed from the input of the first layer to the last "
                                 "hidden state (a decoder: in its input and in the encoder output), with witnesses "
                                 "and gaps per component and end to end")
        parser.add_argument("--effort", type=positive_int("--effort"), default=30,
                            help="with --whole: L-BFGS steps per smoothing level of LipSDP-Neuron (default 30)")
        parser.add_argument("--restarts", type=positive_int("--restarts"), default=4,
                            help="with --whole: witness starts per component (default 4)")
        parser.add_argument("--iterations", type=positive_int("--iterations"), default=30,
                            help="with --whole: power iterations per witness (default 30; counted, not timed, so "
                                 "the same seed gives the same numbers)")
        parser.add_argument("--drop-query-bias", action="store_true",
                            help="verify the heads without their query bias, the setting of published claims about "
                                 "plain dot-product attention (they are then listed and checked)")
    parser.add_argument("--n", type=positive_int("--n"), default=8,
                        help="number of tokens (default 8); for cross-attention, of context tokens")
    # verify's default is lipbound.numeric.verification.DEFAULT_BUDGET (not imported here: the CLI starts light)
    parser.add_argument("--budget", type=positive_float("--budget"), default=4.0,
                        help=BUDGET_HELP.format(per="per head, twice that per whole layer"))
    parser.add_argument("--seed", type=int, default=0, help="seed of the witness search (default 0)")
    parser.add_argument("--jobs", type=positive_int("--jobs"), default=1,
                        help="worker processes on this machine, one thread each (default 1: no extra process; "
                             "needs dask.distributed: pip install 'lipbound[scale]')")
    parser.add_argument("--scheduler", type=scheduler_address(), metavar="ADDRESS",
                        help="run the rows on the dask cluster whose scheduler is at ADDRESS (tcp://HOST:8786; "
                             "start it with `dask scheduler` and `dask worker ADDRESS` on each machine); the "
                             "connection waits distributed.comm.timeouts.connect (dask config, e.g. "
                             "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=10s)")
    parser.add_argument("--witness-dir", type=output_directory("--witness-dir"), default="witnesses",
                        help="folder the witnesses are saved in (default witnesses/)")
    parser.add_argument("--json", type=output_file("--json", ".json"), help="write the report as JSON")
    parser.add_argument("--csv", type=output_file("--csv", ".csv"), help="write the report as CSV")
    parser.add_argument("--markdown", type=output_file("--markdown", ".md"), help="write the report as Markdown")
    parser.add_argument("--latex", type=output_file("--latex", ".tex"),
                        help="write the report as LaTeX booktabs tables (the rows, then the "
                                                                               "rankings; over 40 rows, a longtable)")


_STATUSES = "Exit status: 0 done, 2 user error, 3 a witness refutes a bound, 130 interrupted (finished rows kept)."


def register(sub) -> None:
    verify = sub.add_parser(
        "verify", help="the sandwich witness <= Lip <= bounds for every attention head and layer of a model",
        description="For every head (and whole multi-head layer) of every attention of a checkpoint -- an encoder's "
                    "self-attention, a decoder's causal self-attention, cross-attention in its queries, in its "
                    "context and jointly -- search a witness, evaluate every certified bound on the domain the "
                    "attention's inputs live on (from the LayerNorm that feeds them; see --radius), and report the "
                    "sandwich witness <= Lip <= bound with the gap, then the least smooth heads and layers.  "
                    "Stacks, layers and heads are counted from 0.  The model is a checkpoint path, or 'default' "
                    "(or nothing) for the embedded all-MiniLM-L6-v2 layers 0 and 5.\n\n" + ROWS_HELP,
        epilog=epilog("lipbound verify                     # the embedded model (also: lipbound verify default)",
                      "lipbound verify model.safetensors",
                      "lipbound verify MODEL_DIR --layer 0 --head 3 --n 16 --sdp",
                      "lipbound verify whisper/model.bin --block decoder --kind cross --n 8 --m 4",
                      "lipbound verify model.safetensors --radius 20 --json report.json --latex table.tex",
                      "lipbound verify MODEL_DIR --jobs 2",
                      "lipbound verify MODEL_DIR --scheduler tcp://10.0.0.5:8786",
                      "lipbound verify MODEL_DIR --whole --n 8 --json whole.json   # end to end, with the breakdown",
                      notes=_STATUSES + "  Report files are rewritten after every row (JSON \"complete\": false "
                                        "until the end)."))
    _add_run_options(verify)
    verify.set_defaults(handler=_verify)

    convert = sub.add_parser(
        "convert", help="write any checkpoint lipbound reads in the plain .npz format",
        description="Read a checkpoint (any layout `verify` reads) and write it in the plain lipbound .npz format "
                    "(docs/formats.md): every stack, head, cross-attention, LayerNorm with its placement, final "
                    "norm and feed-forward block, with the source's sha256.  The output path is checked before "
                    "the model is read, and the file is written atomically.",
        epilog=epilog("lipbound convert gpt2/ gpt2.npz", "lipbound convert whisper/model.bin whisper.npz",
                      "lipbound convert default minilm.npz   # the embedded model",
                      notes="Exit status: 0 written, 2 user error."))
    convert.add_argument("weights", metavar="MODEL", type=model_path("MODEL"), help=_WEIGHTS_HELP)
    convert.add_argument("output", metavar="OUT", type=output_file("OUT", ".npz"), help="the .npz file to write")
    convert.add_argument("--num-heads", type=positive_int("--num-heads"),
                         help="heads per layer, when no config.json or metadata says")
    convert.set_defaults(handler=_convert)

    demo = sub.add_parser(
        "demo", help="derive, evaluate and sandwich on the embedded default model",
        description="Derive the dot-product bound, evaluate it on every head of the embedded default model "
                    "(layers 0 and 5 of all-MiniLM-L6-v2), search a witness for each and print the sandwich.  "
                    + ROWS_HELP,
        epilog=epilog("lipbound demo", "lipbound demo --no-sdp --budget 1",
                      "lipbound demo --all-heads --json demo.json",
                      notes=_STATUSES))
    _add_run_options(demo, weights=False)
    demo.add_argument("--heads", type=positive_int("--heads", 12), default=12,
                      help="heads per layer to show, the first ones (default all 12)")
    demo.add_argument("--all-heads", action="store_true", help="every head and the whole multi-head layers")
    demo.add_argument("--no-sdp", action="store_true", help="closed forms only (faster)")
    demo.set_defaults(handler=_demo, budget=2.0)

    check = sub.add_parser(
        "check", help="try to refute a published claim (exit 3 if refuted)",
        description="Search for a certified witness against a published claim (`lipbound list` names them), "
                    "on random weights and on --weights if given.  Verdicts: REFUTED, not refuted, confirmed "
                    "(lipbound proves it), not certified.",
        epilog=epilog("lipbound check castin-theorem", "lipbound check kim-l2-fro --budget 60",
                      "lipbound check castin-code --weights model.safetensors --json check.json",
                      notes="Exit status: 0 not refuted or confirmed, 2 user error, 3 refuted."))
    check.add_argument("claim", help="a claim key (see `lipbound list`)")
    check.add_argument("--weights", metavar="MODEL", type=model_path("--weights"),
                       help="also try these weights: a checkpoint file or directory, or " + EMBEDDED_MODEL_HELP)
    check.add_argument("--num-heads", type=positive_int("--num-heads"), help="heads per layer of --weights")
    check.add_argument("--seed", type=int, default=0, help="seed of the search (default 0)")
    check.add_argument("--budget", type=positive_float("--budget"), default=20.0,
                       help=BUDGET_HELP.format(per="of the claim's search"))
    check.add_argument("--json", type=output_file("--json", ".json"), help="write the result as JSON")
    check.set_defaults(handler=_check)

    recheck = sub.add_parser(
        "recheck", help="recompute a saved witness in high precision",
        description="Re-verify a witness file with exact arithmetic on the stored floats and 50-digit interval "
                    "arithmetic, against the weights it was found on (the file and sha256 it records; a "
                    "different file is refused).",
        epilog=epilog("lipbound recheck witnesses/sentence-transformers-all-MiniLM-L6-v2-encoder-L0-self-H0-n8.npz",
                      "lipbound recheck witness.npz --weights finetuned.safetensors",
                      notes="Exit status: 0 valid, 1 invalid, 2 user error (e.g. other weights than recorded)."))
    recheck.add_argument("witness", help="a witness .npz written by verify, demo or search_witness")
    recheck.add_argument("--weights", metavar="MODEL", type=model_path("--weights"),
                         help="the weights the witness was found on (default: the file it records), or "
                              + EMBEDDED_MODEL_HELP)
    recheck.set_defaults(handler=_recheck)
