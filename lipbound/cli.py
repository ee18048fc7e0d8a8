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
    from .assumptions import Assumptions, Ball
    from .symbolic.claims import claim
    from .symbolic.registry import variant
    published = claim(args.claim)
    if published.statement is None or published.kind != "upper-bound":
        raise LipboundError("claim", "a claim with a closed-form upper bound", f"{args.claim} ({published.kind})",
                            "pick one of kim-l2-fro, kim-l2-inf, castin-theorem, ...")
    name = args.variant or published.variant
    from .assumptions import LayerNormImage, Unbounded
    domain = {"ball": Ball, "layernorm": LayerNormImage, "unbounded": Unbounded}[published.domain]()
    derived = variant(name).derive(Assumptions(domain=domain, norm=published.norm, tied=True if "l2" in name else None),
                                   name)
    from .symbolic.compare import compare
    forward = compare(derived.expr, published.statement)
    print(f"derived ({name}, {derived.norm}, {derived.domain}): Lip <= {derived.expr}")
    print(f"claim {published.key} {published.provenance}: Lip <= {published.statement}")
    print(f"derived <= claim: {forward.verdict}" + (" (strictly)" if forward.strict else ""))
    for step in forward.steps:
        print(f"  {step}")
    if forward.counterexample:
        print(f"  counterexample: {forward.counterexample}")
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

    compare = sub.add_parser("compare", help="compare a derived bound with a published claim symbolically")
    compare.add_argument("claim")
    compare.add_argument("--variant", help="derived variant to compare (default: the claim's)")

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
