"""Taylor's remainder of a block's attention token by token, and the three groups of the curvature bound it integrates.

For one sentence and layer of all-MiniLM-L6-v2, the block's attention curve (the one a block's curve runs first, with
each output token's own remainder, lemma curvature-per-query) at one radius: per output token the certified remainder
``rest_i`` and the whole output's ``rest``; then, on the smallest and the widest ball of each grid the remainder's
Riemann sum met, the groups ``chi_I,i``, ``chi_II,i``, ``chi_III,i`` of query i (``query_groups``; the remainder reads
each group as the smaller of these and the whole output's on the same ball, ``row_chis``), and the curve's CPU seconds
(``time.process_time``, the set-up of the centre apart).

Run: ``python bench/bench_attention_remainder.py [--text "The cat sat on the mat."] [--layer 0] [--fraction 1e-2]``
(about a minute of CPU at n = 9).
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
    parser.add_argument("--fraction", type=float, default=1e-2, help="eps as a fraction of the LayerNorm radius")
    args = parser.parse_args()
    from lipbound.local import curvature_integral, query_curvature
    from lipbound.local.centre import ChainCentre
    from lipbound.local.chains import chain_for
    from lipbound.local.curvature import CURVATURE_TOKENS
    from lipbound.local.curve import _curve
    from lipbound.measures.bert import load_text_model

    bert = load_text_model()
    X = bert.hidden_states(bert.encode(args.text))[args.layer]
    eps = args.fraction * bert.layernorm_feeding(args.layer).radius_about_center
    chain = chain_for(bert.model, "block", args.layer)
    began = time.process_time()
    centre = ChainCentre(chain, X, True, keep=(1,))
    setup = time.process_time() - began
    met = []   # (Frobenius radius or the largest token radius, chi_I, chi_II, chi_III) per ball

    def recorded(curvature, bounds, r, frobenius=None):
        groups = query_curvature.query_groups(curvature, bounds, r, frobenius)
        met.append((frobenius if frobenius is not None else float(np.max(r)), *(group.hi for group in groups)))
        return groups
    began = time.process_time()
    with mock.patch.object(curvature_integral, "query_groups", recorded):
        attention = _curve(bert.model, X, "layer", args.layer, None, None, "fro", "fro", (), [eps], 0, 0,
                           CURVATURE_TOKENS, None, chain=chain[:1], centre=centre.part(chain, 0, 1, True),
                           want_reach=True)
    spent = time.process_time() - began
    point = attention.points[0]
    print(f"{args.text!r}, layer {args.layer}, n = {X.shape[0]}, eps = {args.fraction:g} R = {eps:.4g}")
    print(f"rest (whole output) {point.remainder:.4f}")
    print(f"rest_i   {_row(point.token_remainders)}")
    radii = sorted({radius for radius, *_ in met})
    for radius in (radii[0], radii[-1]):
        for at, first, second, third in met:
            if at == radius:
                print(f"ball {at:.4g}:\n  chi_I    {_row(first)}\n  chi_II   {_row(second)}\n  chi_III  {_row(third)}")
                break
    print(f"CPU s: centre {setup:.1f}, the attention's curve {spent:.1f} ({len(met)} balls)")


if __name__ == "__main__":
    main()
