"""The operator route's two halves on the balls of the attention remainder's grid, against the groups' bound.

For one sentence and layer of all-MiniLM-L6-v2, the block's attention curve at one radius (as
``bench_attention_remainder.py``); on the smallest and the widest ball the remainder's Riemann sum met, per output token
i: the queries' own groups summed, the certified change ``kappa_i`` of row i's second derivative over the ball
(``query_changes``, lemma curvature-row-change) and ``lambda_max(G_i(X))^(1/2) + kappa_i`` (lemma
curvature-row-operator, ``operator_tops`` certified); then ``rest_i`` with the groups alone and with the operator route
too, back to back (``--gram``: ``lambda_max(G_i(X))^(1/2)`` also in floats, ``matricized_gram`` of
``bench_relational.py``).  CPU seconds by ``time.process_time``.

Run: ``python bench/bench_query_operator.py [--text "The cat sat on the mat."] [--layer 0] [--fractions 1e-2,1e-1]
[--gram]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(values) -> str:
    return " ".join(f"{v:7.3f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="The cat sat on the mat.")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--fractions", default="1e-2,1e-1", help="eps as fractions of the LayerNorm radius")
    parser.add_argument("--gram", action="store_true", help="also lambda_max(G_i(X))^(1/2) in floats")
    args = parser.parse_args()
    from lipbound.local import curvature_integral, query_curvature
    from lipbound.local.centre import ChainCentre
    from lipbound.local.chains import chain_for
    from lipbound.local.curvature import CURVATURE_TOKENS
    from lipbound.local.curve import _curve
    from lipbound.local.query_operator import query_changes
    from lipbound.measures.bert import load_text_model

    bert = load_text_model()
    X = bert.hidden_states(bert.encode(args.text))[args.layer]
    n = X.shape[0]
    chain = chain_for(bert.model, "block", args.layer)
    centre = ChainCentre(chain, X, True, keep=(1,))
    gram = None
    if args.gram:
        from bench_relational import _query_heads, matricized_gram
        began = time.process_time()
        layer = chain[0].target
        gram = np.array([np.sqrt(max(np.linalg.eigvalsh(matricized_gram(_query_heads(layer, X, i), X, i))[-1], 0.0))
                         for i in range(n)])
        print(f"lambda_max(G_i(X))^(1/2) (floats) {_row(gram)}  ({time.process_time() - began:.1f} CPU s)")
    for fraction in (float(f) for f in args.fractions.split(",")):
        eps = fraction * bert.layernorm_feeding(args.layer).radius_about_center
        met, rests, tops = [], {}, {}

        def recorded(curvature, bounds, r, frobenius=None):
            groups = query_curvature.query_groups(curvature, bounds, r, frobenius)
            met.append((frobenius if frobenius is not None else float(np.max(r)),
                        np.stack([group.hi for group in groups]), query_changes(curvature, bounds, r, frobenius)))
            return groups

        def formed(integral):   # the certified tops, timed
            began = time.process_time()
            value = original(integral)
            tops["value"], tops["cpu"] = value, tops.get("cpu", 0.0) + time.process_time() - began
            return value
        original = curvature_integral.CurvatureIntegral.operator_tops
        for name, route in (("groups", lambda integral: np.full(n, np.inf)), ("operator", formed)):   # (inf: unused)
            met.clear()
            began = time.process_time()
            with mock.patch.object(curvature_integral, "query_groups", recorded), \
                    mock.patch.object(curvature_integral.CurvatureIntegral, "operator_tops", route):
                attention = _curve(bert.model, X, "layer", args.layer, None, None, "fro", "fro", (), [eps], 0, 0,
                                   CURVATURE_TOKENS, None, chain=chain[:1], centre=centre.part(chain, 0, 1, True),
                                   want_reach=True)
            rests[name] = (attention.points[0].token_remainders, time.process_time() - began)
        print(f"{args.text!r}, layer {args.layer}, n = {n}, eps = {fraction:g} R = {eps:.4g}; {len(met)} balls")
        print(f"lambda_max(G_i(X))^(1/2) certified {_row(tops['value'])}  ({tops['cpu']:.1f} CPU s)")
        radii = sorted({radius for radius, *_ in met})
        for radius in (radii[0], radii[-1]):
            at, groups, kappa = next(item for item in met if item[0] == radius)
            print(f"ball {at:.4g}:\n  own sum   {_row(groups.sum(axis=0))}\n  kappa_i   {_row(kappa)}"
                  f"\n  G + kappa {_row(tops['value'] + kappa)}")
        for name, (rest, cpu) in rests.items():
            print(f"rest_i {name:8s} {_row(rest)}  (curve {cpu:.1f} CPU s)")

if __name__ == "__main__":
    main()
