"""Time to derive every built-in variant and block and export its LaTeX (bound and proof), after import.

Targets: under 2 s in total on a 2-core machine for the attention variants with the default assumptions
(Frobenius norm, tokens in a ball), and under 2 s for each variant or block derived alone in a fresh
process (``--each``: nothing cached, not even the score's kernel constants or an activation's certified
slope range; blocks on their own default domain, all of R^d, where a gated block gives its witness
family).  Prints the per-variant times (cold: first derivation of each score's constants; warm:
cached), and with ``--all`` every norm and domain.

Run: ``python bench/bench_derive.py [--all] [--each]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

_ONE = """
import time
import lipbound.printing.latex, lipbound.printing.derivation, lipbound.printing.theorem, lipbound.symbolic.registry
from lipbound.printing.latex import latex
from lipbound.printing.theorem import proof_fragment
from lipbound.symbolic.assumptions import Assumptions, Ball, Unbounded
from lipbound.symbolic.registry import BLOCKS, variant
name = {name!r}
start = time.perf_counter()
chosen = variant(name)
result = chosen.derive(Assumptions(domain=Unbounded() if name in BLOCKS else Ball(), norm=chosen.norms[0]), name)
latex(result.expr if result.lipschitz else result.growth)
bound = time.perf_counter() - start
proof_fragment(chosen, result)
print(bound, time.perf_counter() - start)
"""


def run(norms=("fro",), domains=("ball",), proofs: bool = False) -> list[tuple[str, str, str, float]]:
    from lipbound.errors import LipboundError
    from lipbound.printing.derivation import derivation_to_latex
    from lipbound.printing.latex import latex
    from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, RMSNormImage, Unbounded
    from lipbound.symbolic.registry import VARIANTS, variant
    make = {"ball": Ball, "layernorm": LayerNormImage, "rmsnorm": RMSNormImage, "unbounded": Unbounded}
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


def each() -> list[tuple[str, float, float]]:
    """Every variant and block derived alone in a fresh process: (name, bound + LaTeX s, + proof s)."""
    from lipbound.symbolic.registry import variant_names
    rows = []
    for name in variant_names():
        out = subprocess.run([sys.executable, "-c", _ONE.format(name=name)], capture_output=True, text=True,
                             check=True).stdout.split()
        rows.append((name, float(out[0]), float(out[1])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also every norm and domain")
    parser.add_argument("--each", action="store_true", help="every variant and block alone, in a fresh process")
    args = parser.parse_args()
    import lipbound.printing.derivation  # noqa: F401
    import lipbound.printing.latex  # noqa: F401  (import time is not part of the figure)
    import lipbound.symbolic.registry  # noqa: F401  (import time is not part of the figure)
    cold = run()
    warm = run()
    with_proofs = run(proofs=True)
    total_cold, total_warm = sum(r[3] for r in cold), sum(r[3] for r in warm)
    print(f"{'variant':30s} {'cold s':>8s} {'warm s':>8s} {'+proof s':>9s}")
    for (name, _, _, t_cold), (_, _, _, t_warm), (_, _, _, t_proof) in zip(cold, warm, with_proofs):
        print(f"{name:30s} {t_cold:8.3f} {t_warm:8.3f} {t_proof:9.3f}")
    print(f"TOTAL derive + LaTeX of the bound, {len(cold)} variants (fro, ball): cold {total_cold:.2f} s "
          f"(target < 2 s: {'MET' if total_cold < 2 else 'NOT MET'}), warm {total_warm:.2f} s")
    print(f"TOTAL derive + LaTeX of the bound and of the whole proof (align*): "
          f"{sum(r[3] for r in with_proofs):.2f} s (constants cached)")
    if args.all:
        everything = run(("fro", "2,1", "2,inf", "inf"), ("ball", "layernorm", "rmsnorm", "unbounded"))
        print(f"every norm and domain: {len(everything)} derivations in {sum(r[3] for r in everything):.2f} s")
    if args.each:
        rows = each()
        print(f"\n{'alone, in a fresh process':30s} {'bound s':>8s} {'+proof s':>9s}")
        for name, bound, proof in rows:
            print(f"{name:30s} {bound:8.3f} {proof:9.3f}")
        slowest = max(rows, key=lambda row: row[2])
        print(f"SLOWEST alone: {slowest[0]} {slowest[2]:.2f} s with its proof "
              f"(target < 2 s each: {'MET' if slowest[2] < 2 else 'NOT MET'})")


if __name__ == "__main__":
    main()
