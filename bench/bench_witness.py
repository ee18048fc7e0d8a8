"""Witnessed lower bounds on the Lipschitz constant of every head of the embedded model.

For each head of layers 0 and 5 of all-MiniLM-L6-v2, on the ball about the origin whose
radius is that of the LayerNorm feeding the layer (``max|gamma| sqrt(d) + ||beta||``), and
for each sequence length n, three lower bounds:

* ours:   :func:`lipbound.numeric.witness.search_witness` (structured inputs + polish);
* naive:  :func:`lipbound.numeric.witness.naive_ascent`, gradient ascent of the secant ratio
          from random starts, with the same time budget;
* Castin: the adversarial input of Castin, Ablin, Peyre (2024), its local Jacobian norm.

Prints one row per (layer, head, n), then the median of ours/naive and the minimum of
ours/Castin.  :func:`witness_rows` returns the rows (with the witnesses) for other reports.

Usage::

    python bench/bench_witness.py [--budget 5] [--n 8 32] [--layers 0 5] [--heads 0 1 ...] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lipbound.numeric.domains import TokenBall  # noqa: E402
from lipbound.numeric.model import load_default  # noqa: E402
from lipbound.numeric.witness import Witness, castin_adversarial, naive_ascent, search_witness  # noqa: E402


@final
@dataclass(frozen=True)
class WitnessRow:
    """One head at one sequence length: three witnessed lower bounds on ``Lip(f; B_R^n)``."""

    layer: int
    head: int
    n: int
    radius: float
    ours: float
    naive: float
    castin: float
    seconds: float
    witnesses: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def ours_over_naive(self) -> float:
        return self.ours / self.naive if self.naive > 0 else float("inf")

    @property
    def ours_over_castin(self) -> float:
        return self.ours / self.castin if self.castin > 0 else float("inf")


def witness_rows(weights=None, layers=(0, 5), heads=None, ns=(8, 32), budget: float = 5.0, seed: int = 0,
                 progress=None) -> list[WitnessRow]:
    """Run the three searches on every requested head.

    Parameters
    ----------
    weights : Model, optional
        Default: :func:`lipbound.numeric.model.load_default`.
    layers, heads, ns : iterables of int
        Layers, heads (default all) and sequence lengths.
    budget : float
        Seconds for our search and, separately, for the naive ascent.
    progress : callable, optional
        Called with each row as soon as it is computed.
    """
    weights = load_default() if weights is None else weights
    rows = []
    for layer_index in layers:
        layer = weights.layer(layer_index)
        domain = TokenBall(layer.ln_in.radius_about_origin)
        radius = domain.radius
        for head_index in (range(len(layer.heads)) if heads is None else heads):
            head = layer.heads[head_index]
            for n in ns:
                began = time.perf_counter()
                about = {"origin": weights, "layer": layer_index, "head": head_index}
                ours = search_witness(head, domain=domain, n=n, budget_seconds=budget, seed=seed, **about)
                naive = naive_ascent(head, domain=domain, n=n, budget_seconds=budget, seed=seed, **about)
                castin = castin_adversarial(head, domain=domain, n=n, origin=weights, layer=layer_index,
                                            head_index=head_index)
                row = WitnessRow(layer_index, head_index, n, radius, ours.value, naive.value, castin.value,
                                 time.perf_counter() - began, {"ours": ours, "naive": naive, "castin": castin})
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def summary(rows: list[WitnessRow]) -> dict:
    """Median of ours/naive and minimum of ours/Castin over the rows."""
    return {"median_ours_over_naive": statistics.median(r.ours_over_naive for r in rows),
            "min_ours_over_castin": min(r.ours_over_castin for r in rows),
            "rows": len(rows)}


HEADER = (f"{'layer':>5} {'head':>4} {'n':>3} {'R':>7} {'ours':>10} {'naive':>9} {'Castin':>8} {'ours/naive':>10} "
          f"{'ours/Castin':>11} {'s':>5}")


def format_row(r: WitnessRow) -> str:
    return (f"{r.layer:>5} {r.head:>4} {r.n:>3} {r.radius:>7.3f} {r.ours:>10.2f} {r.naive:>9.2f} {r.castin:>8.3f} "
            f"{r.ours_over_naive:>10.1f} {r.ours_over_castin:>11.1f} {r.seconds:>5.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=None, help="seconds per search (default 5; 1.5 with --quick)")
    parser.add_argument("--n", type=int, nargs="+", default=None,
                        help="sequence lengths (default 8 32; 8 with --quick)")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 5])
    parser.add_argument("--heads", type=int, nargs="+", default=None, help="head indices (default: all)")
    parser.add_argument("--quick", action="store_true", help="short budget, n = 8 only")
    parser.add_argument("--save", type=Path, default=None, help="directory to save our witnesses (.npz)")
    args = parser.parse_args(argv)
    budget = args.budget if args.budget is not None else (1.5 if args.quick else 5.0)
    ns = args.n if args.n is not None else ([8] if args.quick else [8, 32])
    print(f"Witnessed lower bounds, all-MiniLM-L6-v2, ball about 0 of the LayerNorm radius, budget {budget:g} s")
    print(HEADER)
    rows = witness_rows(layers=args.layers, heads=args.heads, ns=ns, budget=budget,
                        progress=lambda row: print(format_row(row), flush=True))
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        for r in rows:
            witness: Witness = r.witnesses["ours"]
            witness.save(args.save / f"layer{r.layer}-head{r.head}-n{r.n}.npz")
    s = summary(rows)
    print(f"median ours/naive  = {s['median_ours_over_naive']:.1f}   (target >= 3)")
    print(f"minimum ours/Castin = {s['min_ours_over_castin']:.1f}   (target >= 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
