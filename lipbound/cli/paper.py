"""Commands for authors: ``paper`` (a section to input into a paper), ``preamble``, ``plot``.

``paper`` and ``plot`` check their output paths before any work, write every file atomically,
and measure real heads only when asked (``--weights``, or ``plot scaling``/``plot gaps``), with
the numeric layer: certified bounds by :func:`lipbound.numeric.certify.head_constant`, witnesses
by :func:`lipbound.numeric.witness.search_witness` re-checked in interval arithmetic by
:func:`lipbound.numeric.recheck.recheck` (so a plotted witness is a certified lower bound).
Exit statuses: 0 done, 2 a user error.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import LipboundError
from .models import BUDGET_HELP, load_model
from .output import Progress
from .parsing import (
    EMBEDDED_MODEL_HELP,
    epilog,
    index,
    int_list,
    model_path,
    output_directory,
    plot_file,
    positive_float,
    positive_int,
)
from .symbolic import add_variant_options, chosen_variant, derive_result, position_options

__all__ = ["register", "scaling_figure", "gap_grid"]

#: Token counts and radii (as fractions of the layer's LayerNorm radius) of the scaling figure.
N_VALUES = (2, 4, 8, 16, 32)
RADIUS_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
FIXED_N = 8


def _style(args):
    from ..printing.style import TexStyle
    return TexStyle(prefix=args.prefix, text_width=args.text_width, font_size=args.font_size)


def _certified_witness(head, domain, n: int, budget: float, seed: int) -> float:
    """The certified lower end of the best witness found in ``budget`` seconds."""
    from ..numeric.recheck import recheck
    from ..numeric.witness import search_witness
    witness = search_witness(head, domain=domain, n=n, budget_seconds=budget, seed=seed)
    return recheck(witness, head).lower


def scaling_figure(model, layer: int, head: int, budget: float, n_values=N_VALUES, seed: int = 0,
                   progress=None):
    """Certified bound and certified witness of one real head against n (on the ball of the
    LayerNorm that feeds the layer) and against the radius R (n = 8), as a
    :class:`~lipbound.printing.paper.ScalingFigure`."""
    from ..numeric.certify import head_constant
    from ..numeric.domains import DomainSpec, TokenBall
    from ..printing.paper import ScalingFigure, Series
    chosen = model.layer(layer)
    target = model.head(layer, head)
    domain = DomainSpec.parse("layernorm").resolve(chosen.ln_in, f"layer {layer}")
    radius = domain.enclosing_ball()[0]
    done, total = 0, len(n_values) + len(RADIUS_FRACTIONS)

    def point(on, n):
        nonlocal done
        bound = head_constant(target, "fro", on, n)
        witness = _certified_witness(target, on, n, budget, seed)
        done += 1
        if progress is not None:
            progress(done, total, f"n = {n}, {on.describe()}: witness {witness:.4g} <= Lip <= {bound.value:.4g}")
        return bound, witness

    by_n = [point(domain, n) for n in n_values]
    radii = [radius * fraction for fraction in RADIUS_FRACTIONS]
    by_radius = [point(TokenBall(value), FIXED_N) for value in radii]
    theorem = by_n[0][0].provenance.split("theorem ", 1)[-1].split(" ", 1)[0]
    return ScalingFigure(
        head=f"{model.name}, layer {layer}, head {head}", theorem=theorem, domain=domain.describe(),
        n_series=Series("n", tuple(float(n) for n in n_values), tuple(b.value for b, _ in by_n),
                        tuple(w for _, w in by_n)),
        radius_series=Series("R", tuple(radii), tuple(b.value for b, _ in by_radius), tuple(w for _, w in by_radius)),
        fixed_n=FIXED_N, fixed_radius=radius)


def gap_grid(model, n: int, budget: float, seed: int = 0, progress=None):
    """The gap (certified closed-form bound / certified witness) of every head of ``model`` on the
    ball of the LayerNorm feeding each layer."""
    import numpy as np

    from ..numeric.certify import head_constant
    from ..numeric.domains import DomainSpec
    from ..printing.figures import GapGrid
    layers = sorted(model.layers)
    heads = max(model.layer(i).num_heads for i in layers)
    gaps = np.full((len(layers), heads), np.nan)
    total, done = sum(model.layer(i).num_heads for i in layers), 0
    for row, index_ in enumerate(layers):
        layer = model.layer(index_)
        domain = DomainSpec.parse("layernorm").resolve(layer.ln_in, f"layer {index_}")
        for h, head in enumerate(layer.heads):
            bound = head_constant(head, "fro", domain, n)
            witness = _certified_witness(head, domain, n, budget, seed)
            gaps[row, h] = bound.value / witness if witness > 0 and bound.certified else np.nan
            done += 1
            if progress is not None:
                progress(done, total, f"layer {index_} head {h}: gap {gaps[row, h]:.3g}")
    return GapGrid(model.name, tuple(layers), heads, tuple(map(tuple, gaps)), n)


def _paper(args) -> int:
    from ..io import write_text
    from ..printing.figures import draw_scaling
    from ..printing.paper import FIGURE_STEM, MAIN_FILE, paper_entry, paper_files
    style = _style(args)
    if args.score is not None and "custom" not in args.variant:
        raise LipboundError("--score", "the variant custom among the variants", " ".join(args.variant),
                            "add custom to the variants, e.g. lipbound paper dot-product custom --score ...")
    model = None
    if args.weights is not None:  # a clear error about the weights before any work
        model = load_model(args.weights)
        model.head(args.layer, args.head)
    entries = []
    for name in dict.fromkeys(args.variant):
        chosen, facts = chosen_variant(name, args.score if name == "custom" else None, args.fact,
                                       position_options(args))
        result = derive_result(name, chosen, facts, args.norm, args.domain, {})
        entries.append(paper_entry(name, chosen, result))
    figure = None
    if model is not None:
        with Progress("figure") as progress:
            figure = scaling_figure(model, args.layer, args.head, args.budget, args.n_values, args.seed,
                                    progress.update)
    args.output.mkdir(exist_ok=True)  # its parent exists (checked by --output)
    files = paper_files(entries, style, figure, args.title)
    for name, text in files.items():
        write_text(args.output / name, text, "--output")
    if figure is not None:
        draw_scaling(figure, args.output / f"{FIGURE_STEM}.pdf")
        files[f"{FIGURE_STEM}.pdf"] = ""
    print(f"wrote {', '.join(sorted(files))} to {args.output}")
    print(f"compile the standalone article with: (cd {args.output} && latexmk -pdf {MAIN_FILE})")
    print(r"or \input{lipbound-preamble} in your preamble and \input{lipbound-section} in your paper")
    return 0


def _preamble(args) -> int:
    from ..printing.style import preamble_lines
    print(preamble_lines(_style(args)), end="")
    return 0


def _plot_scaling(args) -> int:
    from ..printing.figures import draw_scaling
    model = load_model(args.weights)
    model.head(args.layer, args.head)  # a clear error before any work
    with Progress("figure") as progress:
        figure = scaling_figure(model, args.layer, args.head, args.budget, args.n_values, args.seed, progress.update)
    draw_scaling(figure, args.output)
    for series in (figure.n_series, figure.radius_series):
        print(f"against {series.variable}: bound slope {series.bound_slope:.3f}, witness slope "
              f"{series.witness_slope:.3f}")
    print(f"wrote {args.output}")
    return 0


def _read_json(path: str, option: str) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LipboundError(option, "a readable JSON report", f"{path} ({type(error).__name__})",
                            "pass a file written with --json") from None


def _plot_gaps(args) -> int:
    from ..printing.figures import draw_gaps, gap_grid_from_report
    if args.report is not None and args.weights is not None:
        raise LipboundError("--weights", "either a report or --weights", "both", "drop one of them")
    if args.report is not None:
        grid = gap_grid_from_report(_read_json(args.report, "report"), "report")
    else:
        with Progress("heads") as progress:
            grid = gap_grid(load_model(args.weights), args.n, args.budget, args.seed, progress.update)
    draw_gaps(grid, args.output)
    print(f"wrote {args.output}")
    return 0


def _plot_report(draw_name: str):
    def handler(args) -> int:
        from ..printing import figures
        getattr(figures, draw_name)(_read_json(args.report, "report"), args.output)
        print(f"wrote {args.output}")
        return 0
    return handler


def _add_style_options(parser) -> None:
    parser.add_argument("--prefix", default="lb",
                        help="letters put before lipbound's environment names and labels (default lb: lbtheorem, "
                             "\\label{lb:thm:...}), so that they never clash with yours")
    parser.add_argument("--text-width", type=positive_float("--text-width"), default=345.0,
                        help="\\textwidth of your document in pt (default 345, a 10pt article; at least 300)")
    parser.add_argument("--font-size", type=float, choices=[10.0, 11.0, 12.0], default=10.0, metavar="PT",
                        help="body font size of your document in pt, one of: 10 (the default), 11, 12")


def _add_head_options(parser, weights_help: str) -> None:
    parser.add_argument("--weights", metavar="MODEL", type=model_path("--weights"), help=weights_help)
    parser.add_argument("--layer", type=index("--layer", "layer"), default=0, help="layer, counted from 0 (default 0)")
    parser.add_argument("--head", type=index("--head", "head"), default=0, help="head, counted from 0 (default 0)")
    parser.add_argument("--budget", type=positive_float("--budget"), default=0.5,
                        help=BUDGET_HELP.format(per="per point of the figure"))
    parser.add_argument("--seed", type=int, default=0, help="seed of the witness searches (default 0)")
    parser.add_argument("--n-values", type=int_list("--n-values", 1), default=N_VALUES,
                        help="token counts of the figure, e.g. 2,4,8,16,32 (default)")


def _add_figure_output(parser) -> None:
    parser.add_argument("-o", "--output", required=True, type=plot_file("--output"),
                        help="the figure file, in any format matplotlib writes (png, pdf, svg, ...), checked first")


def register(sub) -> None:
    paper = sub.add_parser(
        "paper", help="write a LaTeX section with bounds, proofs, regimes, claims and a figure",
        description="Derive the bounds of the variants and write, into DIR, a section to \\input into a paper "
                    "(assumptions, symbols, theorems with their proofs, asymptotic regimes, the published claims "
                    "about the same attention with their provenance, the lemmas), the preamble lines it needs, a "
                    ".bib with every cited paper, and main.tex, a standalone article that compiles with latexmk.  "
                    "With --weights, a figure of the certified bound and a certified witness of a real head "
                    "against n and R.",
        epilog=epilog("lipbound paper dot-product -o section/",
                      "lipbound paper dot-product l2-tied cross-joint --domain ball -o section/",
                      'lipbound paper custom --score "Inner(q, k)**2/d_k" -o section/',
                      "lipbound paper dot-product --weights default --layer 0 --head 3 -o section/",
                      "cd section && latexmk -pdf main.tex",
                      notes="Exit status 0, or 2 for a user error."))
    add_variant_options(paper, many=True)
    paper.add_argument("-o", "--output", required=True, type=output_directory("--output"),
                       help="the folder to write (created if missing; its parent must exist)")
    _add_head_options(paper, "measure a real head of this checkpoint for a figure: a checkpoint path, or "
                             + EMBEDDED_MODEL_HELP.replace(" (or no model at all)", "") + " (no --weights: no figure)")
    paper.add_argument("--title", default="Lipschitz bounds", help="the section title")
    _add_style_options(paper)
    paper.set_defaults(handler=_paper)

    preamble = sub.add_parser(
        "preamble", help="print the LaTeX preamble lines that lipbound's output needs",
        description="Print the packages and the prefixed theorem environments that `derive --latex/--proof` and "
                    "`paper` output needs; put them in your preamble (no \\documentclass, no page layout).",
        epilog=epilog("lipbound preamble >> my-preamble.tex", "lipbound preamble --prefix lip"))
    _add_style_options(preamble)
    preamble.set_defaults(handler=_preamble)

    plot = sub.add_parser(
        "plot", help="figures: bound and witness against n and R, gaps per head, token edits, L(eps)",
        description="Draw a figure at paper column width (3.3 in): scaling (certified bound and witness of a real "
                    "head against n and R, log-log, fitted slopes), gaps (certified bound / witness of every head, "
                    "from a verify --json report or measured now), perturb (a perturb --json report against k / n), "
                    "edits (the same per layer, with the set certificates), curve (L(eps) of a local --json report).",
        epilog=epilog("lipbound plot scaling -o scaling.pdf", "lipbound plot gaps report.json -o gaps.png",
                      "lipbound plot perturb edits.json -o edits.pdf", "lipbound plot edits edits.json -o layers.pdf",
                      "lipbound plot curve local.json -o curve.pdf"))
    kinds = plot.add_subparsers(dest="kind", required=True, metavar="KIND", parser_class=type(plot),
                                help="scaling, gaps, perturb, edits or curve")
    scaling = kinds.add_parser(
        "scaling", help="certified bound and witness of one head against n and R",
        description="Certified bound and certified witness of one head against the number of tokens (on the ball "
                    "of its layer's LayerNorm) and against the radius (n = 8), log-log, with fitted slopes.",
        epilog=epilog("lipbound plot scaling -o scaling.pdf",
                      "lipbound plot scaling --weights MODEL_DIR --layer 2 --head 5 --n-values 2,8,32 -o s.png"))
    _add_figure_output(scaling)
    _add_head_options(scaling, "a checkpoint path, or " + EMBEDDED_MODEL_HELP)
    scaling.set_defaults(handler=_plot_scaling)

    gaps = kinds.add_parser(
        "gaps", help="a heatmap of the gap bound / witness of every head",
        description="The gap between the certified closed-form bound and the certified witness of every head, "
                    "layers by heads: read from a `lipbound verify --json` report, or measured now.",
        epilog=epilog("lipbound plot gaps report.json -o gaps.png", "lipbound plot gaps --budget 0.3 -o gaps.pdf"))
    gaps.add_argument("report", nargs="?", help="a report written by lipbound verify --json (default: measure now)")
    _add_figure_output(gaps)
    gaps.add_argument("--weights", metavar="MODEL", type=model_path("--weights"),
                      help="measure this checkpoint (without a report): a checkpoint path, or " + EMBEDDED_MODEL_HELP)
    gaps.add_argument("--n", type=positive_int("--n"), default=8, help="tokens when measuring (default 8)")
    gaps.add_argument("--budget", type=positive_float("--budget"), default=0.3,
                      help=BUDGET_HELP.format(per="per head when measuring"))
    gaps.add_argument("--seed", type=int, default=0, help="seed of the witness searches (default 0)")
    gaps.set_defaults(handler=_plot_gaps)

    perturb = kinds.add_parser(
        "perturb", help="measured and certified W1 movement against the edited share of tokens",
        description="The curves of a `lipbound perturb --json` report: measured Wasserstein-1 movement of each "
                    "layer's attention block and its certified prediction, against k / n.",
        epilog=epilog('lipbound perturb "The cat sat on the mat." --replace 1..3 --json edits.json',
                      "lipbound plot perturb edits.json -o edits.pdf"))
    perturb.add_argument("report", help="a report written by lipbound perturb --json")
    _add_figure_output(perturb)
    perturb.set_defaults(handler=_plot_report("draw_perturbation"))

    edits = kinds.add_parser(
        "edits", help="per layer: measured, worst witness, certified for the set and along the edit, global",
        description="The rows of a `lipbound perturb --json` (or `lipbound local --json`) report per layer, on a log "
                    "axis: measured Wasserstein-1 movement of the attention block outputs, the worst edit found in "
                    "the set, predicted_set, predicted_path and the global prediction; one panel per k.",
        epilog=epilog('lipbound perturb "The cat sat on the mat." --positions 2 --json edits.json',
                      "lipbound plot edits edits.json -o layers.pdf"))
    edits.add_argument("report", help="a report written by lipbound perturb --json or lipbound local --json")
    _add_figure_output(edits)
    edits.set_defaults(handler=_plot_report("draw_edit_layers"))

    curve = kinds.add_parser(
        "curve", help="the local Lipschitz constant L(eps) and its witness",
        description="The certified local Lipschitz constant L(eps) of a `lipbound local --json` report and its "
                    "witness against eps / R, log-log, with ||DF(X)|| and the global constant.",
        epilog=epilog('lipbound local "The cat sat on the mat." --json local.json',
                      "lipbound plot curve local.json -o curve.pdf"))
    curve.add_argument("report", help="a report written by lipbound local --json")
    _add_figure_output(curve)
    curve.set_defaults(handler=_plot_report("draw_local_curve"))
