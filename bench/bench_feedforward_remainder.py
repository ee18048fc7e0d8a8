"""The feed-forward block's Taylor remainder on a block's set before it, certified part by part against ascent.

For one sentence, layer and radius of all-MiniLM-L6-v2 the block's sets (``lipbound/local/relational_tail.py``) are
formed up to the feed-forward block's input, ``x~ + e G + u`` per token (``||e|| <= 1``, ``||u|| <= beta``: the
form's centre, errors and ball).  Printed per token: ``||G||`` (float) and ``beta``; the certified remainder of lemma
feedforward-taylor-joint and of lemma feedforward-taylor-signed (its quadratic part ``c F / 2`` and cubic part ``P_3
Q_3 / 2``), on the whole set and on the form alone (``beta`` = 0); the largest ``||FF(x) - FF(y) - (x - y) DFF(y)||``
found by projected gradient ascent (three starts of 60 steps) over the form alone, the ball alone and the whole set.

With ``--scale-rests S`` the sets start from the attention's Taylor remainders times S (below 1: a what-if, not a
bound).  Run: ``python bench/bench_feedforward_remainder.py [--text "The cat sat on the mat."] [--layer 0]
[--fraction 1e-2] [--scale-rests 0.1]`` (about 90 CPU s at n = 9).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
from scipy.special import erf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gelu_parts():
    def cdf(x):
        return 0.5 * (1 + erf(x / math.sqrt(2)))

    def pdf(x):
        return np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    return (lambda x: x * cdf(x)), (lambda x: cdf(x) + x * pdf(x))


def ascent_remainder(ffn, y: np.ndarray, G: np.ndarray, beta: float, mode: str, rng) -> float:
    """The largest ``||FF(y + e G + u) - FF(y) - (e G + u) DFF(y)||`` found over ``||e|| <= 1`` and ``||u|| = beta``
    (``mode``: "form" with u = 0, "ball" with e = 0, or "set")."""
    gelu, slope = _gelu_parts()
    h = y @ ffn.W_1 + ffn.b_1
    at = slope(h)

    def remainder(delta):
        t = delta @ ffn.W_1
        return (gelu(h + t) - gelu(h) - at * t) @ ffn.W_2, t
    best = 0.0
    for _ in range(3):
        e = rng.standard_normal(G.shape[0]) * (mode != "ball")
        e /= max(np.linalg.norm(e), 1e-300)
        u = rng.standard_normal(G.shape[1]) * (mode != "form")
        u *= beta / max(np.linalg.norm(u), 1e-300)
        for _ in range(60):
            r, t = remainder(e @ G + u)
            v = r / max(np.linalg.norm(r), 1e-300)
            gradient = ffn.W_1 @ ((slope(h + t) - at) * (ffn.W_2 @ v))
            if mode != "ball":
                step = G @ gradient
                e = e + 0.3 * step / max(np.linalg.norm(step), 1e-300)
                e /= max(np.linalg.norm(e), 1.0)
            if mode != "form":
                u = u + 0.3 * beta * gradient / max(np.linalg.norm(gradient), 1e-300)
                u *= beta / max(np.linalg.norm(u), 1e-300)
        best = max(best, float(np.linalg.norm(remainder(e @ G + u)[0])))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="The cat sat on the mat.")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--fraction", type=float, default=1e-2)
    parser.add_argument("--scale-rests", type=float, default=1.0,
                        help="the attention's Taylor remainders times this (below 1: what-if, not a bound)")
    args = parser.parse_args()
    from lipbound.local import feedforward_taylor as lemmas
    from lipbound.local import relational_tail as tail
    from lipbound.local.balls import Neighbourhood
    from lipbound.local.centre import ChainCentre, frobenius_factor
    from lipbound.local.chains import chain_for
    from lipbound.local.curvature import CURVATURE_TOKENS
    from lipbound.local.curve import _curve
    from lipbound.measures.bert import load_text_model
    from lipbound.rigorous.arrays import IntervalArray, gelu_third_magnitude
    began = time.process_time()
    bert = load_text_model(None)
    X = bert.hidden_states(bert.encode(args.text))[args.layer]
    n = X.shape[0]
    eps = args.fraction * bert.layernorm_feeding(args.layer).radius_about_center
    chain = chain_for(bert.model, "block", args.layer)
    centre = ChainCentre(chain, X, True, keep=(1,))
    attention = _curve(bert.model, X, "layer", args.layer, None, None, "fro", "fro", (), [eps], 0, 0,
                       CURVATURE_TOKENS, None, chain=chain[:1], centre=centre.part(chain, 0, 1, True), want_reach=True)
    point = attention.points[0]
    rests = np.minimum(point.remainder, point.token_remainders) if point.token_remainders else \
        np.full(n, point.remainder)
    rests = rests * args.scale_rests
    radius = (frobenius_factor(Neighbourhood("fro", eps, ()), n) * IntervalArray(eps)).hi.item()
    first = tail.TokenForms.taylor(centre.prefix_jacobian[1], radius,
                                   centre.enclosed[0].output - IntervalArray(centre.points[1]), rests)
    before = first.norm_step(centre.enclosed[1], centre.points[2])
    enclosed = centre.enclosed[2]
    what = "" if args.scale_rests == 1.0 else f", the attention's remainders x {args.scale_rests:g} (not a bound)"
    print(f"{args.text!r} layer {args.layer}, {args.fraction:g} R{what}; sets formed in "
          f"{time.process_time() - began:.1f} CPU s")
    print("token  ||G||   beta | joint  signed (c F/2, P3 Q3/2) | form: joint signed | ascent: form  ball   set")
    rng = np.random.default_rng(0)
    for i, (row, ball) in enumerate(zip(before.rows, before.balls)):
        parts = lemmas._remainder_parts(enclosed, i, row, ball)
        _, beta, a_gram, columns, dev, hull, _, second = parts
        c, F = lemmas._signed_part(enclosed.ffn, enclosed.h[i], a_gram, beta)
        cubic = (IntervalArray(gelu_third_magnitude(hull)) * IntervalArray(dev) / IntervalArray(3.0)).hi
        P_3, Q_3 = lemmas._joint_factors(enclosed.ffn, a_gram, columns, beta, dev, cubic, second)
        form = lemmas._remainder_parts(enclosed, i, row, 0.0)
        found = [ascent_remainder(enclosed.ffn, enclosed.Y.mid[i], row.l2, beta, mode, rng)
                 for mode in ("form", "ball", "set")]
        print(f"{i:5d} {np.linalg.norm(row.l2, 2):6.3f} {beta:6.3f} | {lemmas.joint_remainder(*parts):6.3g} "
              f"{lemmas.signed_remainder(*parts, signed=(c, F)):6.3g} ({c * F / 2:.3g}, {P_3 * Q_3 / 2:.3g}) | "
              f"{lemmas.joint_remainder(*form):6.3g} {lemmas.signed_remainder(*form):6.3g} | "
              f"{found[0]:.3g} {found[1]:.3g} {found[2]:.3g}")
    print(f"total {time.process_time() - began:.1f} CPU s")


if __name__ == "__main__":
    main()
