"""Taylor's remainder of a block's attention token by token, and the bounds of its second derivative it integrates.

For one sentence and layer of all-MiniLM-L6-v2, the block's attention curve (the one a block's curve runs first, with
each output token's own remainder, lemma curvature-per-query) at each radius: per output token the certified remainder
``rest_i`` and the whole output's ``rest``; then, on the smallest and the widest ball of each grid the remainder's
Riemann sum met, the groups ``chi_I,i``, ``chi_II,i``, ``chi_III,i`` of query i (``query_groups``; the remainder reads
each group as the smaller of these and the whole output's on the same ball, ``row_chis``), and the curve's CPU seconds
(``time.process_time``, the set-up of the centre apart).

``--operator`` adds the operator route (lemmas curvature-row-operator and curvature-row-change): the certified
``lambda_max(G_i(X))^(1/2)`` (``operator_tops``) with its CPU seconds, on the two balls the groups' sum, the certified
change ``kappa_i`` of row i's second derivative over the ball (``query_changes``) and ``G + kappa_i``, and ``rest_i``
with the groups alone and with the operator route too, back to back.  ``--gram`` also prints
``lambda_max(G_i(X))^(1/2)`` in floats (``matricized_gram`` of ``bench_relational.py``).

Run: ``python bench/bench_attention_remainder.py [--text "The cat sat on the mat."] [--layer 0] [--fractions 1e-2]
[--operator] [--gram]`` (about a minute of CPU per radius at n = 9).
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
    parser.add_argument("--fractions", default="1e-2", help="eps as fractions of the LayerNorm radius")
    parser.add_argument("--operator", action="store_true", help="the operator route too, before and after")
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
    began = time.process_time()
    centre = ChainCentre(chain, X, True, keep=(1,))
    setup = time.process_time() - began
    print(f"{args.text!r}, layer {args.layer}, n = {n}; CPU s of the centre {setup:.1f}")
    if args.gram:
        from bench_relational import _query_heads, matricized_gram
        began = time.process_time()
        layer = chain[0].target
        gram = [np.sqrt(max(np.linalg.eigvalsh(matricized_gram(_query_heads(layer, X, i), X, i))[-1], 0.0))
                for i in range(n)]
        print(f"lambda_max(G_i(X))^(1/2) (floats) {_row(gram)}  ({time.process_time() - began:.1f} CPU s)")
    original = curvature_integral.CurvatureIntegral.operator_tops
    for fraction in (float(f) for f in args.fractions.split(",")):
        eps = fraction * bert.layernorm_feeding(args.layer).radius_about_center
        met, tops = [], {}   # met: (Frobenius radius or the largest token radius, groups (3, n), kappa or None)

        def recorded(curvature, bounds, r, frobenius=None):
            groups = query_curvature.query_groups(curvature, bounds, r, frobenius)
            kappa = query_changes(curvature, bounds, r, frobenius) if args.operator else None
            met.append((frobenius if frobenius is not None else float(np.max(r)),
                        np.stack([group.hi for group in groups]), kappa))
            return groups

        def formed(integral):   # the certified tops, timed
            began = time.process_time()
            value = original(integral)
            tops["value"], tops["cpu"] = value, tops.get("cpu", 0.0) + time.process_time() - began
            return value
        routes = [("groups", lambda integral: np.full(n, np.inf))] if args.operator else []   # (inf: unused)
        print(f"eps = {fraction:g} R = {eps:.4g}")
        for name, route in routes + [("now", formed)]:
            met.clear()
            began = time.process_time()
            with mock.patch.object(curvature_integral, "query_groups", recorded), \
                    mock.patch.object(curvature_integral.CurvatureIntegral, "operator_tops", route):
                attention = _curve(bert.model, X, "layer", args.layer, None, None, "fro", "fro", (), [eps], 0, 0,
                                   CURVATURE_TOKENS, None, chain=chain[:1], centre=centre.part(chain, 0, 1, True),
                                   want_reach=True)
            point = attention.points[0]
            print(f"rest_i {name:6s} {_row(point.token_remainders)}  (rest {point.remainder:.4f}; curve "
                  f"{time.process_time() - began:.1f} CPU s, {len(met)} balls)")
        if "value" in tops:
            print(f"lambda_max(G_i(X))^(1/2) certified {_row(tops['value'])}  ({tops['cpu']:.1f} CPU s)")
        radii = sorted({radius for radius, *_ in met})
        for radius in (radii[0], radii[-1]):
            at, groups, kappa = next(item for item in met if item[0] == radius)
            print(f"ball {at:.4g}:\n  chi_I     {_row(groups[0])}\n  chi_II    {_row(groups[1])}"
                  f"\n  chi_III   {_row(groups[2])}")
            if kappa is not None:
                print(f"  own sum   {_row(groups.sum(axis=0))}\n  kappa_i   {_row(kappa)}"
                      f"\n  G + kappa {_row(tops['value'] + kappa)}")


if __name__ == "__main__":
    main()
