"""Long inputs and the LayerNorm image: time and peak memory at n = 128 and 512, and the score constant.

For layer 0 head 0 of the embedded all-MiniLM-L6-v2, on the ball of the LayerNorm radius and on the
LayerNorm image, at each n: wall time and peak memory (``tracemalloc``, numpy's allocations
included) of the witness search (with its budget), of the closed forms (derived theorem and
matrix-aware form) and of the SDP relaxation, side by side, with the values.  Target: the search
within its budget (+5 %), everything within memory.

Then the matrix-aware score constant of the LayerNorm image, ``||M^T A M|| d`` with
``M = diag(gamma) P``, against ``||A|| R^2`` with ``R = max|gamma| sqrt(d)`` (the enclosing ball),
for heads 0-2 of layers 0 and 5: the ratio the bounds gain on the true domain (0.45-0.65).

Run: ``python bench/bench_scale.py [--n 128 512] [--budget 10]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from lipbound.numeric.certify import head_bounds  # noqa: E402
from lipbound.numeric.domains import DomainSpec, LayerNormOutputs  # noqa: E402
from lipbound.numeric.model import load_default  # noqa: E402
from lipbound.numeric.witness import search_witness  # noqa: E402


def measured(call):
    """``(result, seconds, peak MiB)`` of one call."""
    tracemalloc.start()
    started = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
    tracemalloc.stop()
    return result, seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="*", default=[128, 512])
    parser.add_argument("--budget", type=float, default=10.0)
    args = parser.parse_args()
    model = load_default()
    layer = model.layer(0)
    head = layer.heads[0]
    domains = {"ball": DomainSpec.parse("layernorm").resolve(layer.ln_in), "image": LayerNormOutputs(layer.ln_in)}
    print(f"layer 0 head 0, witness budget {args.budget} s")
    print(f"{'n':>5} {'domain':>6} | {'witness':>9} {'s':>6} {'MiB':>6} | {'derived':>9} {'matrix':>9} {'s':>6} "
          f"{'MiB':>6} | {'sdp':>9} {'s':>6} {'MiB':>6} | {'gap':>5}")
    for n in args.n:
        for name, domain in domains.items():
            witness, w_s, w_mib = measured(lambda: search_witness(head, domain=domain, n=n, budget_seconds=args.budget))
            closed, c_s, c_mib = measured(lambda: head_bounds(head, domain, n))
            full, s_s, s_mib = measured(lambda: head_bounds(head, domain, n, sdp=True))
            values = {b.name: (b.value if b.certified else float("nan")) for b in closed + full}
            best = min(b.value for b in full if b.certified)
            print(f"{n:>5} {name:>6} | {witness.value:9.4g} {w_s:6.1f} {w_mib:6.0f} | {values['derived']:9.4g} "
                  f"{values['matrix-aware']:9.4g} {c_s:6.1f} {c_mib:6.0f} | {values['sdp']:9.4g} {s_s:6.1f} "
                  f"{s_mib:6.0f} | {best / witness.value:5.3g}", flush=True)
            if w_s > 1.05 * args.budget:
                print(f"      the search overran its budget: {w_s:.1f} s for {args.budget} s")
    print("\nLayerNorm image score constant ||M^T A M|| d against ||A|| (max|gamma| sqrt(d))^2:")
    for index in (0, 5):
        norm = model.layer(index).ln_in
        M, _ = LayerNormOutputs(norm).shape()
        for h, head in enumerate(model.layer(index).heads[:3]):
            image = np.linalg.norm(M.mid.T @ head.A @ M.mid, 2) * norm.d
            ball = np.linalg.norm(head.A, 2) * norm.gamma_max ** 2 * norm.d
            print(f"  layer {index} head {h}: {image:10.4g} / {ball:10.4g} = {image / ball:.3f}")


if __name__ == "__main__":
    main()
