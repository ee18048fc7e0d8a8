"""Certified SDP bounds on real heads, beside the closed form.

Layer 0 of all-MiniLM-L6-v2, tokens in the ball of radius R = 20.25 about 0 (the radius of
the LayerNorm feeding the layer, ``max|gamma| sqrt(d) + ||beta||``), n = 8 tokens.

* head 0, part (a): each matrix-aware constant (certified upper and lower bound) beside the
  norm product it replaces, and the time of each route (conic solver, eigenvalue search);
* head 0, part (b): the relaxation of the local Lipschitz problem beside the closed form
  and the matrix-aware closed form, with its time, and a witnessed lower bound;
* all 12 heads: closed form, matrix-aware closed form, relaxation, their ratio, and the
  median ratio relaxation / closed form.

Every value printed as certified is the re-checked upper bound (a solver's objective never
is).  Times exclude the one-time import of cvxpy, which is printed separately.

Usage::

    python bench/bench_sdp.py [--solver auto|clarabel|scs|eig] [--radius 20.25] [--n 8]
                              [--heads 0 1 ...] [--witness-budget 10] [--layer-bound]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from lipbound.numeric.certify import head_constant  # noqa: E402
from lipbound.numeric.domains import TokenBall  # noqa: E402
from lipbound.numeric.model import load_default  # noqa: E402
from lipbound.numeric.sdp import (  # noqa: E402
    HeadBounds,
    key_gradient_sup,
    layernorm_joint_gain,
    layernorm_value_spread,
    matrix_aware_closed_form,
    relax,
    self_attention_bound,
)
from lipbound.numeric.sdp.joint import JointRange, key_form, value_gram  # noqa: E402
from lipbound.symbolic.scores import DotProduct  # noqa: E402
from lipbound.symbolic.variants import MultiHead, SelfAttention  # noqa: E402


def _timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def part_a(head, ln, radius: float, n: int, solver: str) -> None:
    print("(a) matrix-aware constants, layer 0 head 0")
    print(f"{'quantity':34s} {'certified upper':>16s} {'certified lower':>16s} {'norm product':>13s} "
          f"{'ratio':>6s} {'seconds':>8s}")
    norm_A, norm_V = np.linalg.norm(head.A, 2), np.linalg.norm(head.W_V, 2)
    joint_range = JointRange(key_form(head), value_gram(head.W_V))
    for route in dict.fromkeys((joint_range.pick_solver(solver), "clarabel", "scs", "eig")):
        gamma, seconds = _timed(joint_range.gain, solver=route)
        label = f"gamma_AV [{gamma.details['solver']}]"
        print(f"{label:34s} {gamma.value:16.10f} {gamma.lower:16.10f} {norm_A * norm_V:13.6f} "
              f"{gamma.value / (norm_A * norm_V):6.3f} {seconds:8.2f}")
    beta, seconds = _timed(key_gradient_sup, head, radius)
    triangle = beta.details["triangle_bound"]
    print(f"{'beta = sup ||A^T x + u|| [secular]':34s} {beta.value:16.10f} {beta.lower:16.10f} {triangle:13.6f} "
          f"{beta.value / triangle:6.3f} {seconds:8.2f}")
    spread, seconds = _timed(layernorm_value_spread, head.W_V, ln.gamma)
    naive = spread.details["naive"]
    print(f"{'rho on the LayerNorm image':34s} {spread.value:16.10f} {spread.lower:16.10f} {naive:13.6f} "
          f"{spread.value / naive:6.3f} {seconds:8.2f}")
    ln_gain, seconds = _timed(layernorm_joint_gain, head, ln.gamma, solver="eig")
    product = norm_A * norm_V * ln.gamma_max ** 2 * head.d
    print(f"{'d gamma on the LayerNorm image':34s} {ln_gain.value:16.6f} {ln_gain.lower:16.6f} {product:13.3f} "
          f"{ln_gain.value / product:6.3f} {seconds:8.2f}")
    aware, seconds = _timed(matrix_aware_closed_form, head, radius, n=n, solver=solver)
    closed = head_constant(head, "fro", TokenBall(radius), n).value
    print(f"{'closed form with these constants':34s} {aware.value:16.4f} {'':>16s} {closed:13.4f} "
          f"{aware.value / closed:6.3f} {seconds:8.2f}")
    print()


def part_b(head, radius: float, n: int, solver: str, witness_budget: float) -> None:
    print(f"(b) relaxation of the local Lipschitz problem, layer 0 head 0, n = {n}, R = {radius}")
    closed = head_constant(head, "fro", TokenBall(radius), n).value
    for route in dict.fromkeys((solver, "eig")):
        bound, seconds = _timed(self_attention_bound, head, radius, n=n, solver=route)
        status = "certified" if bound.certified else f"NOT certified ({bound.reason})"
        print(f"  [{route:8s}] relaxation {bound.value:10.3f}   closed form {closed:10.3f}   "
              f"ratio {bound.value / closed:6.3f}   {seconds:6.2f} s   {status}")
    terms = bound.details
    print(f"  terms: b_hat = R^2 gamma = {terms['b_hat']:.3f}, Phi = {terms['Phi']:.1f}, "
          f"c_hat = {terms['c_hat']:.1f}, xi = {terms['xi']:.4f}; "
          f"sqrt(b^2 + Phi + 2 c xi) = {terms['pythagorean']:.3f}, b + sqrt(Phi) = {terms['minkowski']:.3f}")
    if witness_budget > 0:
        from lipbound.numeric.witness import search_witness
        found, seconds = _timed(search_witness, head, domain=TokenBall(radius), n=n, budget_seconds=witness_budget)
        print(f"  witness (lower bound, {witness_budget:g} s search): {found.value:.3f}   "
              f"sandwich [{found.value:.1f}, {bound.value:.1f}], width ratio {bound.value / found.value:.2f}")
    print()


def all_heads(layer, heads, radius: float, n: int, solver: str) -> None:
    print(f"all heads of layer 0 (n = {n}, R = {radius}, solver {solver})")
    print(f"{'head':>4s} {'closed form':>12s} {'matrix-aware':>13s} {'relaxation':>11s} {'ratio':>6s} {'seconds':>8s}")
    ratios = []
    for index in heads:
        head = layer.heads[index]
        started = time.perf_counter()
        constants = HeadBounds(head, radius, solver=solver)
        bound = self_attention_bound(head, radius, n=n, bounds=constants)
        aware = matrix_aware_closed_form(head, radius, n=n, bounds=constants)
        seconds = time.perf_counter() - started
        closed = head_constant(head, "fro", TokenBall(radius), n).value
        if not bound.certified:
            print(f"{index:4d} {closed:12.2f} {'':>13s} NOT certified: {bound.reason}")
            continue
        ratios.append(bound.value / closed)
        print(f"{index:4d} {closed:12.2f} {aware.value:13.2f} {bound.value:11.2f} {ratios[-1]:6.3f} {seconds:8.2f}")
    if ratios:
        print(f"median ratio relaxation / closed form: {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} heads)")
    print()


def layer_bound(layer, radius: float, n: int, solver: str) -> None:
    target = layer.as_layer()
    bound, seconds = _timed(relax, MultiHead(SelfAttention(DotProduct())), target, TokenBall(radius), n=n,
                            solver=solver)
    print(f"multi-head layer 0 (registry, MultiHead): {bound.value:.2f} "
          f"[concatenated {bound.details.get('concatenated', float('nan')):.2f}, "
          f"split through W_O {bound.details.get('split', float('nan')):.2f}], {seconds:.1f} s")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solver", default="auto", choices=("auto", "clarabel", "scs", "eig"))
    parser.add_argument("--radius", type=float, default=20.25)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--heads", type=int, nargs="*", default=list(range(12)))
    parser.add_argument("--witness-budget", type=float, default=10.0)
    parser.add_argument("--layer-bound", action="store_true", help="also the multi-head layer (24 head solves)")
    args = parser.parse_args(argv)

    layer = load_default(layers=[0]).layers[0]
    print(f"all-MiniLM-L6-v2 layer 0: {layer.num_heads} heads, d = {layer.d}, d_k = {layer.heads[0].d_k}; "
          f"LayerNorm radius about 0 = {layer.ln_in.radius_about_origin:.4f} (R used: {args.radius})")
    if args.solver != "eig":
        _, seconds = _timed(__import__, "cvxpy")
        print(f"one-time import of cvxpy: {seconds:.2f} s (not counted below)")
    print()
    head = layer.heads[0]
    part_a(head, layer.ln_in, args.radius, args.n, args.solver)
    part_b(head, args.radius, args.n, args.solver, args.witness_budget)
    all_heads(layer, args.heads, args.radius, args.n, args.solver)
    if args.layer_bound:
        layer_bound(layer, args.radius, args.n, args.solver)


if __name__ == "__main__":
    main()
