"""Batched versus one-at-a-time Jacobian-norm evaluation on a real attention head.

Each evaluation is a fixed number of power-iteration steps, each one application of
``Df(X) Df(X)^T`` (a VJP then a JVP), at one input X of n tokens, with the batched kernel of
:mod:`lipbound.numeric.witness` (one fused projection GEMM over the batch, then the
iteration in output space through n x n Gram sandwiches; no explicit Jacobian).  The same code
runs once on a batch of b inputs and b times on one input; the script prints both rates
(evaluations per second) and their ratio.

Usage::

    python bench/bench_throughput.py [--batch 512] [--loop 64] [--n 8] [--steps 20] [--layer 0] [--head 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lipbound.numeric.attention import AttentionMap  # noqa: E402
from lipbound.numeric.blas import single_threaded_blas  # noqa: E402
from lipbound.numeric.model import load_default  # noqa: E402
from lipbound.numeric.witness import jacobian_norms  # noqa: E402


def measure(batch: int = 512, loop: int = 64, n: int = 8, steps: int = 20, layer: int = 0, head: int = 0,
            seed: int = 0) -> dict:
    """Rates of batched and looped evaluation; returns a dict of the figures printed."""
    weights = load_default()
    target = weights.layers[layer].heads[head]
    radius = weights.layers[layer].ln_in.radius_about_origin
    # full token space (d = 384), no reduction to the head's span: the benchmark is about batching
    kernel = AttentionMap(target, reduce=False)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((batch, n, kernel.d_in))
    X *= radius / np.linalg.norm(X, axis=-1, keepdims=True)
    with single_threaded_blas():
        jacobian_norms(kernel, X[:8], steps=2)                      # warm-up
        began = time.perf_counter()
        batched, _ = jacobian_norms(kernel, X, steps=steps, seed=seed, directions=False)
        batched_seconds = time.perf_counter() - began
        began = time.perf_counter()
        looped = np.concatenate([jacobian_norms(kernel, X[i:i + 1], steps=steps, seed=seed, directions=False)[0]
                                 for i in range(loop)])
        looped_seconds = time.perf_counter() - began
    # same inputs, same code; only the random starts differ (input 0 shares its start)
    agreement = float(np.max(np.abs(looped - batched[:loop]) / batched[:loop]))
    batched_rate, looped_rate = batch / batched_seconds, loop / looped_seconds
    return {"n": n, "d": kernel.d_in, "steps": steps, "batch": batch, "loop": loop,
            "batched_rate": batched_rate, "looped_rate": looped_rate, "ratio": batched_rate / looped_rate,
            "max_relative_difference": agreement, "target": f"layer {layer} head {head}"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512, help="inputs in the batched call")
    parser.add_argument("--loop", type=int, default=64, help="inputs evaluated one at a time")
    parser.add_argument("--n", type=int, default=8, help="tokens per input")
    parser.add_argument("--steps", type=int, default=20, help="power-iteration steps per evaluation")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--head", type=int, default=0)
    args = parser.parse_args(argv)
    r = measure(args.batch, args.loop, args.n, args.steps, args.layer, args.head)
    print(f"Jacobian-norm evaluations, {r['target']} of all-MiniLM-L6-v2, n = {r['n']}, d = {r['d']}, "
          f"{r['steps']} JVP/VJP steps each")
    print(f"{'mode':<22}{'inputs':>8}{'evals/s':>12}")
    print(f"{'batched (one call)':<22}{r['batch']:>8}{r['batched_rate']:>12.1f}")
    print(f"{'one at a time (loop)':<22}{r['loop']:>8}{r['looped_rate']:>12.1f}")
    print(f"{'ratio batched / loop':<22}{'':>8}{r['ratio']:>12.1f}")
    print(f"(largest relative difference of the estimates on shared inputs, different random starts: "
          f"{r['max_relative_difference']:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
