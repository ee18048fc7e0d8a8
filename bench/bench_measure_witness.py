"""Witnesses on measures for real heads: W1(F(mu), F(nu)) / W1(mu, nu) against the certified constant.

For each head of the embedded model (layers 0 and 5) at the LayerNorm radius and n atoms:
the best exact W1 ratio found from (2,1) secant witnesses, the certified W1 constant of
the head on uniform measures of n atoms (theorem measure-w1-uniform: the (2,1) closed form)
and its SDP refinement, and the gap = certified / witness.

Run: ``python bench/bench_measure_witness.py [--n 8] [--budget 3] [--heads 0 1 2]``
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--budget", type=float, default=3.0)
    parser.add_argument("--layers", type=int, nargs="*", default=[0, 5])
    parser.add_argument("--heads", type=int, nargs="*", default=None)
    args = parser.parse_args()
    from lipbound.measures.witness import measure_witness
    from lipbound.numeric.certify import head_constant
    from lipbound.numeric.domains import TokenBall
    from lipbound.numeric.model import load_default
    from lipbound.numeric.sdp import relax
    from lipbound.symbolic.registry import variant
    model = load_default()
    print(f"{'layer':>5} {'head':>4} {'W1 witness':>11} {'closed form':>12} {'SDP':>10} {'gap':>6}")
    gaps = []
    for layer_index in args.layers:
        layer = model.layers[layer_index]
        domain = TokenBall(layer.ln_in.radius_about_origin)
        for h in (args.heads if args.heads is not None else range(len(layer.heads))):
            head = layer.heads[h]
            witness = measure_witness(head, domain=domain, n=args.n, budget_seconds=args.budget)
            closed = head_constant(head, "w1", domain, args.n).value
            sdp = relax(variant("measure-w1"), head, domain, n=args.n)
            best = min(closed, sdp.value) if sdp.certified else closed
            gaps.append(best / witness.ratio)
            assert witness.ratio <= best, "a measure witness beats a certified W1 constant"
            print(f"{layer_index:5d} {h:4d} {witness.ratio:11.4g} {closed:12.4g} "
                  f"{sdp.value if sdp.certified else float('nan'):10.4g} {gaps[-1]:6.3g}", flush=True)
    print(f"gap certified W1 constant / measure witness: min {min(gaps):.3g}  median {float(np.median(gaps)):.3g}  "
          f"max {max(gaps):.3g} ({len(gaps)} heads)")


if __name__ == "__main__":
    main()
