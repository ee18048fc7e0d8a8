"""Commands of the symbolic layer: ``list``, ``derive``, ``compare``, ``proofs``.

They load no numeric module (no numpy-heavy code, no cvxpy, no scipy): ``lipbound derive`` starts
in about the time SymPy takes to import.
"""

from __future__ import annotations

import json

from ..errors import LipboundError
from .parsing import EXIT_REFUTED, choice, epilog, float_list, output_directory, positive_int, window_size

__all__ = ["register", "NORMS"]

#: The norms on X a variant may be derived in (``--norm``).
NORMS = ("fro", "2,1", "2,inf", "inf", "w1")
_NORM_HELP = ("the norm on X, one of: fro (Frobenius, the default), 2,1 (the sum of the token norms), 2,inf (the "
              "largest token norm), inf (l_inf on vec X), w1 (Wasserstein-1: the measure variants, their only norm)")


def chosen_variant(name: str, score: str | None, facts, positions: dict | None = None):
    """The variant a command names, with the parsed ``--fact`` list: a registry variant, or
    ``custom`` built from ``--score`` (errors name the options); ``positions`` (:func:`position_options`) adds
    a causal mask, a sliding window, position biases or a soft cap."""
    from ..errors import AssumptionError
    from ..symbolic.custom import custom_variant, parse_fact
    from ..symbolic.positional import positioned
    from ..symbolic.registry import variant
    if name == "custom":
        if score is None:
            raise LipboundError("--score", "a score for the variant custom", "none",
                                'add e.g. --score "Inner(q, k)**2/d_k"')
        chosen, parsed = custom_variant(score, facts or ())
    elif score is not None:
        raise LipboundError("--score", "the variant custom (a score replaces the built-in one only there)",
                            f"--score with {name}", f'run lipbound derive custom --score "{score}"')
    else:
        chosen, parsed = variant(name), tuple(parse_fact(fact) for fact in facts or ())
    if positions and any(value not in (None, False) for value in positions.values()):
        from ..symbolic.blocks import BlockVariant
        if isinstance(chosen, BlockVariant) or chosen.score is None:
            asked = next(option for option, value in positions.items() if value not in (None, False))
            raise LipboundError(f"--{asked}", "an attention variant (masks, biases and caps act on scores)", name,
                                f"drop --{asked} for the block {name}")
        try:
            chosen = positioned(chosen, **positions)
        except AssumptionError as error:
            raise LipboundError(f"--{error.argument}", error.expected, error.got, error.fix) from None
    return chosen, parsed


def position_options(args) -> dict:
    """``--causal``, ``--window``, ``--bias``, ``--softcap`` as the keyword arguments of
    :func:`lipbound.symbolic.positional.positioned`."""
    return {"causal": args.causal, "window": args.window, "bias": args.bias, "softcap": args.softcap}


def derive_result(name: str, chosen, facts, norm: str | None, domain: str | None, sizes: dict,
                  variance_floor: bool = False):
    """Derive ``chosen`` under the options of ``derive``/``paper`` (``domain`` None: unbounded for a
    block, the ball for attention); a missing assumption of a user-defined score is reported as the
    ``--fact`` to add."""
    import sympy as sp

    from ..errors import AssumptionError
    from ..symbolic.assumptions import Assumptions, Ball, LayerNormImage, RMSNormImage, Unbounded
    from ..symbolic.custom import in_score_terms
    norm = norm or chosen.norms[0]
    if norm not in chosen.norms:
        raise LipboundError("--norm", f"one of {', '.join(chosen.norms)} for {name}", repr(norm),
                            f"omit --norm or pass --norm {chosen.norms[0]}")
    from ..symbolic.blocks import BlockVariant
    block = isinstance(chosen, BlockVariant)
    domain = domain or ("unbounded" if block else "ball")
    if variance_floor:
        fact = chosen.floor_fact() if block else None
        if fact is None:
            raise LipboundError("--variance-floor", "a normalisation or a pre-LN block (layernorm, rmsnorm, "
                                "pre-ln-feed-forward)", name, "drop --variance-floor for this variant")
        facts = (*facts, fact)
    tied = None if block or not chosen.score.tied else True
    assumptions = Assumptions(domain={"ball": Ball, "layernorm": LayerNormImage, "rmsnorm": RMSNormImage,
                                      "unbounded": Unbounded}[domain](),
                              norm=norm, tied=tied, facts=tuple(facts),
                              **{key: sp.Integer(value) for key, value in sizes.items() if value is not None})
    try:
        return chosen.derive(assumptions, name)
    except AssumptionError as error:
        if error.argument == "assumptions.facts":
            vector = in_score_terms(error.expected.split("||")[1]) if "||" in error.expected else "q"
            bound = {"q": "m_Q", "k": "m_K"}.get(vector, "m")
            raise LipboundError("--fact", f"a positive lower bound on Norm({vector}) over the domain (the score "
                                "divides by it)", "none stated", f'add --fact "Norm({vector}) >= {bound}"') from None
        if error.argument == "score":
            raise LipboundError("--score", in_score_terms(error.expected), in_score_terms(error.got),
                                in_score_terms(error.fix)) from None
        if error.argument == "domain":
            raise LipboundError("--domain", error.expected, error.got, "use --domain ball, layernorm or rmsnorm; "
                                "lipbound claims nothing else here") from None
        raise


def _derive(args) -> int:
    from ..printing.document import statement_latex
    from ..printing.export import result_json
    from ..printing.plaintext import plain, plain_legend
    from ..printing.style import PAPER
    from ..printing.theorem import proof_fragment
    chosen, facts = chosen_variant(args.variant, args.score, args.fact, position_options(args))
    result = derive_result(args.variant, chosen, facts, args.norm, args.domain,
                           {"n": args.n, "m": args.m, "H": args.H}, args.variance_floor)
    if args.json:
        print(json.dumps(result_json(result), indent=2))
        return 0
    if args.proof:
        print(proof_fragment(chosen, result), end="")
        return 0
    if args.latex:
        if result.lipschitz:
            print(statement_latex(result.expr, width=PAPER.display_width), end="")
        else:
            from ..symbolic.record import Described
            print(statement_latex(result.family, relation="=", lhs=Described("X_t"), width=PAPER.display_width)
                  + "(not Lipschitz: an entry of the Jacobian along $X_t$ tends to infinity)\n", end="")
        return 0
    print(f"variant:  {args.variant}    norm: {result.norm}    domain: {result.domain}")
    if args.score:
        print(f"score:    s(x, y) = {chosen.score.expression()}  (q = W_Q.T*x, k = W_K.T*y)")
    if result.lipschitz:
        print(f"bound:    Lip <= {plain(result.expr)}")
        for line in plain_legend(result.expr):
            print(f"          {line}")
    else:
        print("bound:    NOT LIPSCHITZ on this domain")
        print(f"witness:  X_t = {result.family.tolist()} ({result.instance}); "
              f"entry of the Jacobian {result.growth} -> infinity")
    print("assumptions:")
    for line in result.assumptions:
        print(f"  - {line}")
    print(f"derivation ({len(result.record.steps)} steps; --proof for LaTeX):")
    for step in result.record.steps:
        print(f"  {step.justification}" + (f"  [{step.lemma}]" if step.lemma else ""))
    return 0


def _list(args) -> int:
    from ..symbolic.assumptions import Assumptions, Ball
    from ..symbolic.claims import CLAIMS
    from ..symbolic.lemmas import LEMMAS
    from ..symbolic.registry import BLOCKS, VARIANTS, variant
    from ..symbolic.theorem_index import describe_theorem
    print("variants (lipbound derive VARIANT):")
    for name, (_, description) in VARIANTS.items():
        print(f"  {name:24s} {description}")
    print(f"  {'custom':24s} self-attention with a score you write: lipbound derive custom --score EXPR [--fact ...]")
    ids = set()
    print("blocks (lipbound derive BLOCK [--variance-floor]):")
    for name, (_, description) in BLOCKS.items():
        print(f"  {name:24s} {description}")
        block = variant(name)
        for norm in block.norms:
            for assumptions in block.proof_assumptions():
                ids.add(block.derive(assumptions.with_(norm=norm), name).theorem)
    for name in VARIANTS:
        for norm in variant(name).norms:
            try:
                ids.add(variant(name).derive(Assumptions(domain=Ball(), norm=norm), name).theorem)
            except LipboundError:
                continue
    print("theorems (one proof each in proofs/):")
    for theorem_id in sorted(ids):
        print(f"  {theorem_id:38s} {describe_theorem(theorem_id)}")
    print("published claims (lipbound check CLAIM):")
    for key, item in CLAIMS.items():
        print(f"  {key:22s} [{item.tag}] {item.title}")
    print(f"lemmas: {len(LEMMAS)} ({', '.join(sorted(LEMMAS))})")
    return 0


def _product_options(args) -> list[str]:
    """The options of stated per-block constants that were given (refused where they mean nothing)."""
    return [option for option, value in (("--blocks", args.blocks), ("--residual", args.residual),
                                         ("--layers", args.layers != 1), ("--weight", args.weight != "1"),
                                         ("--claimed", args.claimed)) if value]


def _compare_report(args) -> int:
    from ..symbolic.claim_table import PRODUCT_BOUND, claim_report
    from ..symbolic.claims import CLAIMS
    product = args.claim == PRODUCT_BOUND or CLAIMS[args.claim].kind == "product"
    given = _product_options(args)
    if given and not product:
        raise LipboundError(given[0], "per-block constants for product-bound or a product claim (newhouse-...)",
                            f"{given[0]} with {args.claim}", f"drop {given[0]}, or run lipbound compare product-bound "
                            "--blocks 1.5,1.5 --claimed 2")
    if args.claim == PRODUCT_BOUND and not args.blocks:
        raise LipboundError("--blocks", "the per-block constants to compose, e.g. --blocks 1.5,1.5,2", "none",
                            "add --blocks (and --claimed B to compare with a total)")
    if args.claimed is not None and args.claim != PRODUCT_BOUND:
        raise LipboundError("--claimed", "product-bound (a product claim states its own total)",
                            f"--claimed with {args.claim}", "drop --claimed, or run lipbound compare product-bound")
    if (args.residual or args.weight != "1" or args.layers != 1) and not args.blocks:
        raise LipboundError("--blocks", "per-block constants for --residual, --weight and --layers to apply to",
                            "none", "add --blocks, e.g. --blocks 0.5,0.5 --residual --layers 12")
    if args.latex:
        raise LipboundError("--latex", "the table of closed-form claims (lipbound compare --latex)",
                            f"--latex with {args.claim}", "drop --latex; `lipbound proofs DIR` writes this claim's "
                            "proof in claims.tex")
    lines, refuted = claim_report(args.claim, blocks=args.blocks or (), residual=args.residual, layers=args.layers,
                                  weight=args.weight, claimed=args.claimed)
    print("\n".join(lines))
    return EXIT_REFUTED if refuted else 0


def _compare(args) -> int:
    from ..printing.document import comparison_latex
    from ..printing.plaintext import plain, plain_legend
    from ..symbolic.claim_table import PRODUCT_BOUND, REPORTED, comparison_rows
    from ..symbolic.claims import claim
    if args.claim and args.claim != PRODUCT_BOUND:
        claim(args.claim)  # a clear error for an unknown claim
    if args.claim in REPORTED or args.claim == PRODUCT_BOUND:
        return _compare_report(args)
    given = _product_options(args)
    if given:
        raise LipboundError(given[0], "product-bound or a product claim (newhouse-...)",
                            f"{given[0]} with {args.claim or 'the whole table'}",
                            "run lipbound compare product-bound --blocks 1.5,1.5 --claimed 2")
    rows = comparison_rows(None if not args.claim else [args.claim])
    if args.claim and not rows:
        raise LipboundError("claim", "a claim with a closed-form upper bound on an attention variant",
                            repr(args.claim), "see `lipbound list`; e.g. castin-theorem or kim-l2-fro")
    if args.latex:
        print(comparison_latex(rows))
        return 0
    for row in rows:
        item = row.claim
        print(f"{item.key} {item.provenance}")
        print(f"  on: {item.variant}, norm {item.norm}, domain {item.domain}")
        print(f"  claim:   Lip <= {plain(row.published)}")
        print(f"  derived: Lip <= {plain(row.derived)}")
        for line in plain_legend(row.published, row.derived):
            print(f"    {line}")
        print(f"  relation: {row.relation}")
        if row.steps:
            print("  proof (norms by the name of their matrix: A stands for ||A||_2, W_V for ||W_V||_2; kappa(n, w) "
                  "for kappa_n(w)):")
        for step in row.steps:
            print(f"    {step}")
    return 0


def _proofs(args) -> int:
    from ..printing.proof_files import generate
    paths = generate(args.directory)
    print(f"wrote {len(paths)} files to {args.directory}")
    return 0


def add_variant_options(parser, many: bool = False) -> None:
    """The options that choose a variant and its assumptions (``derive`` and ``paper``)."""
    parser.add_argument("variant", nargs="+" if many else None,
                        help="a built-in variant or block (see `lipbound list`), or custom with --score")
    parser.add_argument("--norm", metavar="NORM", type=choice("--norm", NORMS), help=_NORM_HELP)
    parser.add_argument("--domain", choices=["ball", "layernorm", "rmsnorm", "unbounded"],
                        help="where tokens live: ball (every token in B(0, R), default for attention), layernorm (the "
                             "image of a LayerNorm), rmsnorm (the image of an RMSNorm, a ball about 0), unbounded (all "
                             "of R^d, default for blocks; attention and gated blocks may be NOT LIPSCHITZ there)")
    parser.add_argument("--causal", action="store_true",
                        help="a causal mask on a self-attention variant (token i attends to tokens 1..i)")
    parser.add_argument("--window", type=window_size("--window"), metavar="W",
                        help="a sliding window on a self-attention variant: token i attends to |i - j| < W "
                             "(0 <= i - j < W with --causal); W a positive integer, or w for the symbol")
    parser.add_argument("--bias", choices=["alibi", "t5"],
                        help="additive position biases on a self-attention variant: alibi (-m_A |i - j|, its own "
                             "column sums) or t5 (any relative bias, stated in its spread Delta_b over a row)")
    parser.add_argument("--softcap", action="store_true",
                        help="soft-capped logits c_cap tanh(s / c_cap) on a dot-product, rotary or QK-norm variant")
    parser.add_argument("--score", metavar="EXPR",
                        help="the score of the variant custom, in the query q = W_Q^T x and key k = W_K^T y: "
                             "Inner(q, k), Norm(q), SoftNorm(q, epsilon), d_k, d, tau, numbers, + - * / ** and exp, "
                             'sqrt, tanh, e.g. "Inner(q, k)**2/d_k"')
    parser.add_argument("--fact", action="append", metavar="FACT",
                        help='an assumption on the domain, e.g. "Norm(q) >= m_Q" (repeat for several)')


def register(sub) -> None:
    sub.add_parser("list", help="variants, theorems, published claims",
                   description="List the built-in variants, the theorems with a proof in proofs/, the published "
                               "claims lipbound can check, and the lemmas the proofs cite.",
                   epilog=epilog("lipbound list")).set_defaults(handler=_list)

    derive = sub.add_parser(
        "derive", help="derive a bound and its proof",
        description="Derive the Lipschitz bound of an attention variant from its kernel assumptions, or of a "
                    "normalisation, feed-forward or residual block, with every step recorded; print it as text, "
                    "LaTeX, a LaTeX proof or JSON.",
        epilog=epilog("lipbound derive dot-product --norm fro --domain ball",
                      "lipbound derive dot-product --domain unbounded      # NOT LIPSCHITZ, with X_t",
                      "lipbound derive l2-tied --domain unbounded --latex",
                      "lipbound derive causal --proof > proof.tex        # paste after `lipbound preamble`",
                      'lipbound derive custom --score "Inner(q, k)**2/d_k"',
                      'lipbound derive custom --score "tau*Inner(q, k)/(Norm(q)*Norm(k))" '
                      '--fact "Norm(q) >= m_Q" --fact "Norm(k) >= m_K"',
                      "lipbound derive sigmoid --domain layernorm",
                      "lipbound derive measure-w1 --json",
                      "lipbound derive layernorm --variance-floor --proof",
                      "lipbound derive pre-ln-feed-forward --norm 2,inf",
                      "lipbound derive rope --domain rmsnorm            # ||A|| becomes a = max_Delta ||A_Delta||",
                      "lipbound derive qk-norm --domain unbounded       # NOT LIPSCHITZ, with X_t",
                      "lipbound derive rope-causal --window 4096 --softcap",
                      "lipbound derive dot-product --causal --bias alibi",
                      "lipbound derive swiglu --domain rmsnorm",
                      notes="Run `lipbound list` for the variants.  Exit status 0, or 2 for a user error."))
    add_variant_options(derive)
    derive.add_argument("--n", type=positive_int("--n"), help="number of tokens (default: the symbol n)")
    derive.add_argument("--m", type=positive_int("--m"), help="number of queries, for cross-attention")
    derive.add_argument("--H", type=positive_int("--H"), help="number of heads, for multi-head variants")
    derive.add_argument("--latex", action="store_true",
                        help="print the bound as a displayed LaTeX equation (paste it after `lipbound preamble`)")
    derive.add_argument("--proof", action="store_true",
                        help="print the assumptions, the theorems, their proofs, the symbols and the lemmas as LaTeX "
                             "that compiles after `lipbound preamble`")
    derive.add_argument("--json", action="store_true", help="print one JSON object")
    derive.add_argument("--variance-floor", action="store_true",
                        help="state that every token's variance is at least sigma_min^2 (the mean square for "
                             "rmsnorm): the local constant of a normalisation or of a pre-LN block")
    derive.set_defaults(handler=_derive)

    compare = sub.add_parser(
        "compare", help="derived bounds against published claims, decided symbolically",
        description="Compare lipbound's derived bound with a published claim under the same assumptions, and "
                    "prove the relation (<=, >=, or where it changes) with recorded steps.  Claims that are not a "
                    "bound on a variant (emadi-softmax-inf1, sigmoid-regularity, newhouse-..., lipattn-1-lipschitz) "
                    "get a report: the theorem lipbound proves about them, or where the relation holds.  "
                    "product-bound composes per-block constants you state with lipbound's rules.",
        epilog=epilog("lipbound compare                  # the whole table", "lipbound compare castin-theorem",
                      "lipbound compare --latex > table.tex", "lipbound compare sigmoid-regularity",
                      "lipbound compare product-bound --blocks 1.5,1.5,2 --claimed 4",
                      "lipbound compare product-bound --blocks 0.5,0.5 --residual --weight 0.1 --layers 12 "
                      "--claimed 2",
                      "lipbound compare newhouse-2-lipschitz --blocks 1.01,1.02 --layers 24",
                      notes="Exit status: 0 done, 2 user error, 3 stated constants compose to more than the claimed "
                            "total, or the comparison refutes the claim."))
    compare.add_argument("claim", nargs="?",
                         help="one claim (default: the whole table; see `lipbound list`), or product-bound")
    compare.add_argument("--latex", action="store_true", help="print the table as LaTeX")
    compare.add_argument("--blocks", type=float_list("--blocks", "1.5,1.5,2", zero=True, text=True),
                         metavar="C1,C2,...",
                         help="per-block Lipschitz constants, applied one after another (with product-bound or a "
                              "product claim)")
    compare.add_argument("--residual", action="store_true",
                         help="each constant of --blocks is a residual branch f of a block x + w f(x)")
    compare.add_argument("--weight", type=float_list("--weight", "0.1", zero=True, text=True, single=True),
                         default="1", help="the branch weight w of --residual blocks (default 1)")
    compare.add_argument("--layers", type=positive_int("--layers"), default=1,
                         help="repeat the --blocks list this many times, one list per layer (default 1)")
    compare.add_argument("--claimed", type=float_list("--claimed", "2", text=True, single=True), metavar="B",
                         help="the whole-model bound to compare with (product-bound only; a claim states its own)")
    compare.set_defaults(handler=_compare)

    proofs = sub.add_parser(
        "proofs", help="regenerate the LaTeX proofs of every theorem",
        description="Write one LaTeX file per theorem, the kernel constants, the claims table and main.tex "
                    "(which inputs them all) into DIRECTORY.  Only files lipbound generated are replaced.",
        epilog=epilog("lipbound proofs proofs/ && (cd proofs && latexmk -pdf main.tex)"))
    proofs.add_argument("directory", type=output_directory("directory"), help="the folder to write")
    proofs.set_defaults(handler=_proofs)
