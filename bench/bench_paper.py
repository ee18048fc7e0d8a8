"""Time of ``lipbound paper`` for one variant, and where it goes, next to ``lipbound derive --proof``.

Runs each command as a fresh process (what a user waits for) several times and prints the median
wall time and its ratio to ``derive --proof`` of the same variant; then, in one process, the time of
each stage of ``paper``: deriving the bound, the published claims (symbolic comparisons), the
asymptotic regimes (SymPy limits) and writing the LaTeX.  ``--compile`` adds ``latexmk -pdf`` of the
written article.  Without ``--weights`` no real head is measured.

Run: ``python bench/bench_paper.py [--variant dot-product] [--repeat 3] [--compile]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_SECONDS = 10.0


def _run(arguments: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lipbound.cli", *arguments], check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def _stages(name: str) -> list[tuple[str, float]]:
    """Each stage of ``paper`` for one variant, in one fresh process."""
    code = f"""
import time
t0 = time.perf_counter()
from lipbound.cli.symbolic import chosen_variant, derive_result
from lipbound.printing.paper import paper_files, related_claims
from lipbound.symbolic.asymptotics import regimes
from lipbound.symbolic.claim_table import comparison_rows
from lipbound.symbolic import symbols as S
t1 = time.perf_counter()
chosen, facts = chosen_variant({name!r}, None, ())
result = derive_result({name!r}, chosen, facts, None, "ball", {{}})
t2 = time.perf_counter()
keys = related_claims(chosen)
rows = tuple(comparison_rows(keys)) if keys else ()
t3 = time.perf_counter()
found = regimes(result.expr, S.R, S.n)
t4 = time.perf_counter()
from lipbound.printing.paper import PaperEntry
paper_files([PaperEntry({name!r}, chosen, result, rows, found)])
t5 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)
"""
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    values = [float(v) for v in done.stdout.split()]
    return list(zip(("imports", "derive the bound", "published claims", "asymptotic regimes", "write LaTeX"), values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="dot-product", help="the variant (default dot-product)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (median reported)")
    parser.add_argument("--compile", action="store_true", help="also time latexmk -pdf on the written article")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "section"
        proof = statistics.median(_run(["derive", args.variant, "--proof"]) for _ in range(args.repeat))
        paper = statistics.median(_run(["paper", args.variant, "-o", str(out)]) for _ in range(args.repeat))
        print(f"{'command':40s} {'median s':>9s} {'ratio':>7s}")
        print(f"{'lipbound derive ' + args.variant + ' --proof':40s} {proof:9.2f} {1.0:7.2f}")
        print(f"{'lipbound paper ' + args.variant:40s} {paper:9.2f} {paper / proof:7.2f}"
              f"   (target under {TARGET_SECONDS:g} s: {'met' if paper < TARGET_SECONDS else 'MISSED'})")
        if args.compile and shutil.which("latexmk"):
            started = time.perf_counter()
            subprocess.run(["latexmk", "-pdf", "-interaction=nonstopmode", "main.tex"], cwd=out, check=True,
                           capture_output=True)
            print(f"{'latexmk -pdf main.tex':40s} {time.perf_counter() - started:9.2f}")
    print("\nstages of paper (one process):")
    for stage, seconds in _stages(args.variant):
        print(f"  {stage:24s} {seconds:7.2f} s")


if __name__ == "__main__":
    main()
