"""Time to derive every built-in variant and export its LaTeX (bound and proof), after import.

Target: under 2 s in total on a 2-core machine, for the default assumptions
(Frobenius norm, tokens in a ball).  Prints the total, the per-variant times
(cold: first derivation of each score's kernel constants; warm: cached), and the
same for every norm and domain.

Run: ``python bench/bench_derive.py``
"""

from __future__ import annotations

import argparse
import time


def run(norms=("fro",), domains=("ball",), proofs: bool = False) -> list[tuple[str, str, str, float]]:
    from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, Unbounded
    from lipbound.errors import LipboundError
    from lipbound.printing.latex import latex
    from lipbound.printing.derivation import derivation_to_latex
    from lipbound.symbolic.registry import VARIANTS, variant
    make = {"ball": Ball, "layernorm": LayerNormImage, "unbounded": Unbounded}
    rows = []
    for domain in domains:
        for norm in norms:
            for name in VARIANTS:
                start = time.perf_counter()
                try:
                    result = variant(name).derive(Assumptions(domain=make[domain](), norm=norm), name)
                except LipboundError:
                    continue
                text = latex(result.expr if result.lipschitz else result.growth)
                if proofs:
                    text += derivation_to_latex(result.record)
                rows.append((name, norm, domain, time.perf_counter() - start))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also every norm and domain")
    args = parser.parse_args()
    import lipbound.printing.latex  # noqa: F401  (import time is not part of the figure)
    import lipbound.printing.derivation  # noqa: F401
    import lipbound.symbolic.registry  # noqa: F401  (import time is not part of the figure)
    cold = run()
    warm = run()
    with_proofs = run(proofs=True)
    total_cold, total_warm = sum(r[3] for r in cold), sum(r[3] for r in warm)
    print(f"{'variant':24s} {'cold s':>8s} {'warm s':>8s} {'+proof s':>9s}")
    for (name, _, _, t_cold), (_, _, _, t_warm), (_, _, _, t_proof) in zip(cold, warm, with_proofs):
        print(f"{name:24s} {t_cold:8.3f} {t_warm:8.3f} {t_proof:9.3f}")
    print(f"TOTAL derive + LaTeX of the bound, {len(cold)} variants (fro, ball): cold {total_cold:.2f} s "
          f"(target < 2 s: {'MET' if total_cold < 2 else 'NOT MET'}), warm {total_warm:.2f} s")
    print(f"TOTAL derive + LaTeX of the bound and of the whole proof (align*): "
          f"{sum(r[3] for r in with_proofs):.2f} s (constants cached)")
    if args.all:
        everything = run(("fro", "2,1", "2,inf", "inf"), ("ball", "layernorm", "unbounded"))
        print(f"every norm and domain: {len(everything)} derivations in {sum(r[3] for r in everything):.2f} s")


if __name__ == "__main__":
    main()
