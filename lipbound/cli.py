"""Command line: ``lipbound list | derive | compare | demo | verify | check | recheck | perturb | depth``.

User errors (a :class:`~lipbound.errors.LipboundError` or a bad argument) print one
line and exit with status 2, never a traceback.  ``verify`` exits with status 3 when
a witness refutes a bound, so that it can gate a model's CI.
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import LipboundError

__all__ = ["main"]

EXIT_USER_ERROR = 2
EXIT_REFUTED = 3


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit 2."""

    def error(self, message):  # noqa: D401 - argparse API
        sys.stderr.write(f"lipbound: error: {message} (see `lipbound {self.prog.split()[-1]} --help`)\n")
        raise SystemExit(EXIT_USER_ERROR)


def _assumptions(args):
    import sympy as sp

    from .assumptions import Assumptions, Ball, LayerNormImage, Unbounded
    domain = {"ball": Ball, "layernorm": LayerNormImage, "unbounded": Unbounded}[args.domain]()
    sizes = {}
    for name in ("n", "m", "H"):
        value = getattr(args, name, None)
        if value is not None:
            sizes[name] = sp.Integer(value)
    return Assumptions(domain=domain, norm=args.norm, tied=True if "l2-tied" in args.variant else None, **sizes)


def _derive(args) -> int:
    from .symbolic.registry import variant
    result = variant(args.variant).derive(_assumptions(args), args.variant)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    from .printing.latex import latex
    from .printing.proof import derivation_to_latex
    if args.latex or args.proof:
        if result.lipschitz:
            print(latex(result.expr))
        else:
            print(r"\text{not Lipschitz: } X_t = " + latex(result.family) + r",\quad "
                  + latex(result.growth) + r" \to \infty")
        if args.proof:
            print(derivation_to_latex(result.record))
        return 0
    print(f"variant:  {args.variant}    norm: {result.norm}    domain: {result.domain}")
    if result.lipschitz:
        print(f"bound:    Lip <= {result.expr}")
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
    from .symbolic.claims import CLAIMS
    from .symbolic.lemmas import LEMMAS
    from .symbolic.registry import VARIANTS
    print("variants (lipbound derive VARIANT):")
    for name, (_, description) in VARIANTS.items():
        print(f"  {name:24s} {description}")
    print("theorems (one proof each in proofs/):")
    for theorem_id in _theorem_ids():
        print(f"  {theorem_id}")
    print("published claims (lipbound check CLAIM):")
    for key, claim in CLAIMS.items():
        print(f"  {key:20s} [{claim.tag}] {claim.title}")
    print(f"lemmas: {len(LEMMAS)} ({', '.join(sorted(LEMMAS))})")
    return 0


def _theorem_ids() -> list[str]:
    from .assumptions import Assumptions, Ball
    from .symbolic.registry import VARIANTS, variant
    ids = set()
    for name in VARIANTS:
        for norm in ("fro", "2,1", "2,inf", "inf"):
            try:
                ids.add(variant(name).derive(Assumptions(domain=Ball(), norm=norm), name).theorem)
            except LipboundError:
                continue
    return sorted(ids)


def _compare(args) -> int:
    from .symbolic.claims import claim
    from .symbolic.comparison import comparison_latex, comparison_rows
    if args.claim:
        claim(args.claim)  # a clear error for an unknown claim
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
        print(f"  claim:   Lip <= {row.published}")
        print(f"  derived: Lip <= {row.derived}")
        print(f"  relation: {row.relation}")
        for step in row.steps:
            print(f"    {step}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lipbound", description="Lipschitz bounds for attention: derive, prove, check, export.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("list", help="variants, theorems, published claims")

    derive = sub.add_parser("derive", help="derive a bound and its proof")
    derive.add_argument("variant")
    derive.add_argument("--norm", default="fro", choices=["fro", "2,1", "2,inf", "inf", "w1"])
    derive.add_argument("--domain", default="ball", choices=["ball", "layernorm", "unbounded"])
    derive.add_argument("--n", type=int, help="number of tokens (default: symbolic n)")
    derive.add_argument("--m", type=int, help="number of queries for cross-attention")
    derive.add_argument("--H", type=int, help="number of heads")
    derive.add_argument("--latex", action="store_true", help="print the bound as LaTeX")
    derive.add_argument("--proof", action="store_true", help="print the derivation as LaTeX (align*)")
    derive.add_argument("--json", action="store_true", help="print one JSON object")

    compare = sub.add_parser("compare", help="derived bounds against published claims, decided symbolically")
    compare.add_argument("claim", nargs="?", help="one claim (default: the whole table)")
    compare.add_argument("--latex", action="store_true", help="print the table as LaTeX")

    _add_numeric_commands(sub)
    return parser


def _add_numeric_commands(sub) -> None:
    from . import commands
    commands.register(sub)


COMMANDS = {"list": _list, "derive": _derive, "compare": _compare}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = COMMANDS.get(args.command) or args.handler
    try:
        return int(handler(args) or 0)
    except LipboundError as error:
        sys.stderr.write(f"lipbound: error: {error}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("lipbound: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
