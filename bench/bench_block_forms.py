"""A block's per-token maps on the attention's Taylor set (lipbound/local/relational_tail.py) against the chained balls.

For one sentence and layer of all-MiniLM-L6-v2, the block's curve is run twice in one process at each radius: with the
sets (``BlockForms``) and without them.  Printed per radius: the token radii before the feed-forward block and before
the output LayerNorm, chained and from the sets (each token's smaller one counts in the curve), the certified value /
witness of both runs, and each run's CPU seconds (``time.process_time``, set-up included).

With ``--scale-rests S`` (S < 1) the sets start from the attention's Taylor remainders multiplied by S: not a bound,
a measurement of what a sharper remainder would give the block (the runs' values are then printed as "if").

With ``--parts`` the curves are not run: the block's attention curve at each radius gives Taylor's remainders, and the
sets are formed twice from them, with the remainders as plain balls (before) and carried through the linear steps
(lemma token-form-carried, now); printed per token and set, its radius and the parts it adds up (the affine form's own
radius, the carried balls, the plain ball), the output LayerNorm's centred norms beside the set before it, and the
CPU seconds of each way of forming the sets; then each token's feed-forward remainder on the carried set before the
feed-forward block, with GELU'' at the centre and the per-neuron Q terms (before) and with the Taylor quotients and
the joint Q terms (lemma gelu-taylor-quotient, now), side by side, and the float floors that order the work
(``remainder_floor``) with their CPU seconds; and, before the output LayerNorm, each part's extent
across the token's centred direction w, the floor of its centred norm, and the cap's chord on the ball against the
chord ``c / floor`` of a set of that extent c across w (floats).

With ``--floors`` the block's curve is run twice in one process at each radius: with the floors of the centred norm on
the sets (lemma centred-floor, now) and with every floor 0 (before: the LayerNorms read ``nu - R`` alone); printed
per token before the output LayerNorm: its centred norm ``nu``, the ball it is read on, ``nu - R`` and the floor, and
the tail's ``omega``, then each run's certified value / witness and CPU seconds.

Run: ``python bench/bench_block_forms.py [--text "The cat sat on the mat."] [--layer 0] [--fractions 1e-3,1e-2]
[--scale-rests 0.1] [--parts] [--floors]`` (about four minutes of CPU per radius at n = 9; with ``--parts`` about a
minute).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _span(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.min():.3g}-{values.max():.3g}" if np.all(np.isfinite(values)) else "inf"


def run(text: str, layer: int, fraction: float, forms: bool, scale: float = 1.0):
    """One block curve at one radius; the token balls before each map after the attention (as the chain takes them)
    and, with ``forms``, the sets' own radii (from Taylor's remainders times ``scale``: below 1 not a bound)."""
    from lipbound.local import curve as curve_module
    from lipbound.local import relational_tail
    from lipbound.measures.curves import local_curve
    balls, sets = [], []
    original_balls, original_next = curve_module.TokenBalls, relational_tail.BlockForms.next_radii
    original_init = relational_tail.BlockForms.__init__

    def scaled_init(self, chain, centre, jacobian, radius, rests):
        original_init(self, chain, centre, jacobian, radius, np.asarray(rests, dtype=np.float64) * scale)

    def recorded_balls(centre, radii, **kwargs):
        balls.append(np.array(radii))
        return original_balls(centre, radii, **kwargs)

    def recorded_next(self, *chained):
        sets.append(original_next(self, *chained))
        return sets[-1]
    began = time.process_time()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(curve_module, "TokenBalls", recorded_balls))
        stack.enter_context(mock.patch.object(relational_tail.BlockForms, "next_radii", recorded_next))
        if scale != 1.0:
            stack.enter_context(mock.patch.object(relational_tail.BlockForms, "__init__", scaled_init))
        if not forms:
            stack.enter_context(mock.patch.object(curve_module, "_block_forms", return_value=None))
        found, _ = local_curve(text, layer=layer, kind="block", eps=(fraction,))
    # the block's own chain forms its balls last (after the attention, before the feed-forward block, before the
    # output LayerNorm); its sets come in the same order (a fourth, the output's, only for the reach)
    return found.points[0], balls[-3:], sets[:3], time.process_time() - began


def floors(text: str, layer: int, fraction: float) -> None:
    """The block's curve at one radius with and without the sets' floors of the centred norm (module docstring)."""
    from lipbound.local import relational_tail
    from lipbound.local.tail import BlockTail
    from lipbound.measures.curves import local_curve
    original_floors, original_omegas = relational_tail.TokenForms.centred_floors, BlockTail.omegas
    for kept in (False, True):
        seen: dict = {}

        def recorded_floors(self, points):
            return original_floors(self, points) if kept else np.zeros(len(self.rows))

        def recorded_omegas(self, M, V, N, radii, rounding, floors=None):
            seen["omegas"] = original_omegas(self, M, V, N, radii, rounding, floors)
            seen["radii"], seen["nu"] = radii[3], self.ln_2.nu.lo
            seen["floors"] = floors[3] if floors is not None and floors[3] is not None else np.zeros(len(radii[3]))
            return seen["omegas"]
        began = time.process_time()
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(relational_tail.TokenForms, "centred_floors", recorded_floors))
            stack.enter_context(mock.patch.object(BlockTail, "omegas", recorded_omegas))
            if not kept:   # (nor the feed-forward remainders along the directions: the work before)
                stack.enter_context(mock.patch.object(relational_tail, "feedforward_remainder_along",
                                                      lambda *args, **kwargs: np.inf))
            found, _ = local_curve(text, layer=layer, kind="block", eps=(fraction,))
        cpu = time.process_time() - began
        point = found.points[0]
        print(f"{text!r} layer {layer}, {fraction:g} R, {'with the floors (now)' if kept else 'floors 0 (before)'}:")
        if "omegas" in seen:
            print(f"  output LayerNorm: nu      {_row(seen['nu'])}")
            print(f"                    ball    {_row(seen['radii'])}")
            print(f"                    nu - R  {_row(np.maximum(seen['nu'] - seen['radii'], 0.0))}")
            print(f"                    floor   {_row(seen['floors'])}")
            print(f"  omega per token           {_row(seen['omegas'])}")
        print(f"  certified / witness {point.certified:.6g} / {point.witness:.6g} = "
              f"{point.certified / point.witness:.4g} ({point.verdict}; {cpu:.1f} CPU s)")


def _row(values) -> str:
    return " ".join(f"{v:7.3f}" for v in values)


def parts(text: str, layer: int, fraction: float) -> None:
    """The sets before each map after the attention, formed from the same remainders with plain and carried balls
    (module docstring), per token."""
    from lipbound.local.balls import Neighbourhood
    from lipbound.local.centre import ChainCentre, frobenius_factor
    from lipbound.local.chains import chain_for
    from lipbound.local.curvature import CURVATURE_TOKENS
    from lipbound.local.curve import _curve
    from lipbound.local.relational_tail import TokenForms
    from lipbound.measures.bert import load_text_model
    from lipbound.rigorous.arrays import IntervalArray
    bert = load_text_model()
    X = bert.hidden_states(bert.encode(text))[layer]
    n = X.shape[0]
    eps = fraction * bert.layernorm_feeding(layer).radius_about_center
    chain = chain_for(bert.model, "block", layer)
    centre = ChainCentre(chain, X, True, keep=(1, 4))
    attention = _curve(bert.model, X, "layer", layer, None, None, "fro", "fro", (), [eps], 0, 0, CURVATURE_TOKENS, None,
                       chain=chain[:1], centre=centre.part(chain, 0, 1, True), want_reach=True).points[0]
    rests = np.minimum(attention.remainder, attention.token_remainders) if attention.token_remainders \
        else np.full(n, attention.remainder)
    radius = (frobenius_factor(Neighbourhood("fro", eps, ()), n) * IntervalArray(eps)).hi.item()
    offset = centre.enclosed[0].output - IntervalArray(centre.points[1])
    print(f"{text!r} layer {layer}, {fraction:g} R (eps = {eps:.4g}), per token:")
    print(f"  the attention's Taylor remainders  {_row(rests)}")
    for carried in (False, True):
        began = time.process_time()
        sets = [TokenForms.taylor(centre.prefix_jacobian[1], radius, offset, rests, carried=carried)]
        sets.append(sets[-1].norm_step(centre.enclosed[1], centre.points[2]))
        sets.append(sets[-1].feedforward_step(centre.enclosed[2], centre.points[3]))
        cpu = time.process_time() - began
        print(f"  {'carried (now)' if carried else 'plain balls (before)'}: {cpu:.1f} CPU s")
        for name, found in zip(("after the attention", "before the feed-forward block", "before the output LayerNorm"),
                               sets):
            print(f"    {name}: radius {_row(found.radii)}")
            print(f"      form   {_row([row.radius() for row in found.rows])}")
            print(f"      carried{_row([found.carried(i) for i in range(n)])}")
            print(f"      ball   {_row(found.balls)}")
    print(f"  the output LayerNorm's centred norms {_row(centre.enclosed[3].nu.lo)}")
    _across(sets[2], centre.points[3], centre.enclosed[3].nu.lo)
    _remainders(sets[1], centre)


def _across(before_norm, points, nu) -> None:
    """Per token, the set before the output LayerNorm along and across its centred direction w (floats, estimates):
    each part's extent across w (after the centring), the floor of the centred norm along w, and the normalised
    output's chord on the ball (``R / nu``, the cap) against the set's ``c / floor`` (c the extent across w)."""
    from lipbound.local.relational_tail import centred_direction
    floors = before_norm.centred_floors(points)
    rows = {name: [] for name in ("form across", "carried across", "ball", "c = across", "floor", "cap chord",
                                  "set c / floor")}
    for i, row in enumerate(before_norm.rows):
        w = centred_direction(points[i])
        d = w.shape[0]
        across = np.eye(d) - np.full((d, d), 1.0 / d) - np.outer(w, w)            # (I - w w^T) P, symmetric
        form = np.linalg.norm(row.center @ across) + np.linalg.norm(row.l2 @ across, 2)
        carried = sum(np.linalg.norm(part.center @ across) + np.linalg.norm(part.l2 @ across, 2)
                      for part in before_norm.shape(i))
        c = form + carried + before_norm.balls[i]
        ratio = before_norm.radii[i] / nu[i]
        rows["form across"].append(form)
        rows["carried across"].append(carried)
        rows["ball"].append(before_norm.balls[i])
        rows["c = across"].append(c)
        rows["floor"].append(floors[i])
        rows["cap chord"].append(ratio * np.sqrt(2 / (1 + np.sqrt(max(1 - ratio ** 2, 0.0)))) if ratio < 1 else np.inf)
        rows["set c / floor"].append(c / floors[i] if floors[i] > 0 else np.inf)
    print("  before the output LayerNorm, across its centred direction w (floats):")
    for name, values in rows.items():
        print(f"    {name:15s}{_row(values)}")


def _centre_split(h, dev, apart=(), pieces=None):
    """The signed lemma's pair before the Taylor quotients: ``g_k = GELU''(h_k)`` and ``S_k = T_k dev_k / 3``, and the
    joint lemma's ``|GELU''|`` on the range."""
    from lipbound.rigorous.arrays import IntervalArray, gelu_curvature, gelu_curvature_magnitude, gelu_third_magnitude
    hull = h + IntervalArray(-np.asarray(dev), np.asarray(dev))
    g = gelu_curvature(h)
    spread = (IntervalArray(gelu_third_magnitude(hull)) * IntervalArray(dev) / IntervalArray(3.0)).hi
    magnitude = gelu_curvature_magnitude(hull)
    apart = np.asarray(apart, dtype=np.int64)
    lo, hi = g.lo.copy(), g.hi.copy()
    lo[apart], hi[apart], spread[apart], magnitude[apart] = 0.0, 0.0, 0.0, 0.0
    return IntervalArray(lo, hi), spread, magnitude


def _remainders(before_ffn, centre) -> None:
    """Per token, the feed-forward remainder on the set before the feed-forward block, certified three ways in one
    process: with ``GELU''`` at the centre, ``T_k dev_k / 3`` and the carried balls' Q terms per neuron (before), with
    the Taylor quotients and the joint Q terms, the joint bound certified first (joint first), and the same with the
    signed bound first where the joint floor says it is the smaller (now); each way's CPU seconds."""
    from lipbound.local import feedforward_taylor
    found = {}
    # "joint first": the joint bound certified first at every token (a joint floor of 0), the order of work before
    # joint_floor; the values are the same as "now"
    for name, patches in (("before", {"curvature_split": _centre_split, "HADAMARD_SHARE": 0.0}),
                          ("joint first", {"joint_floor": lambda parts, split: 0.0}), ("now", {})):
        began = time.process_time()
        with contextlib.ExitStack() as stack:
            for key, value in patches.items():
                stack.enter_context(mock.patch.object(feedforward_taylor, key, value))
            found[name] = [feedforward_taylor.feedforward_remainder(centre.enclosed[2], i, row, before_ffn.balls[i],
                                                                    None, before_ffn.shape(i))
                           for i, row in enumerate(before_ffn.rows)]
        found[name + " cpu"] = time.process_time() - began
    began = time.process_time()
    floors = [feedforward_taylor.remainder_floor(centre.enclosed[2], i, row, before_ffn.balls[i], before_ffn.shape(i))
              for i, row in enumerate(before_ffn.rows)]
    floors_cpu = time.process_time() - began
    print("  the feed-forward remainders on the carried sets:")
    for name in ("before", "joint first", "now"):
        print(f"    {name:11s}{_row(found[name])}  ({found[name + ' cpu']:.1f} CPU s)")
    print(f"    {'floors':11s}{_row(floors)}  ({floors_cpu:.1f} CPU s; remainder_floor, never above \"now\")")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="The cat sat on the mat.")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--fractions", default="1e-3,1e-2")
    parser.add_argument("--scale-rests", type=float, default=1.0,
                        help="the attention's Taylor remainders times this (below 1: what-if, not a bound)")
    parser.add_argument("--parts", action="store_true",
                        help="the sets' radii per token and their parts, plain and carried balls (no curves)")
    parser.add_argument("--floors", action="store_true",
                        help="the curves with the sets' floors of the centred norm and with every floor 0")
    args = parser.parse_args()
    if args.floors:
        for fraction in (float(f) for f in args.fractions.split(",")):
            floors(args.text, args.layer, fraction)
        return
    if args.parts:
        for fraction in (float(f) for f in args.fractions.split(",")):
            parts(args.text, args.layer, fraction)
        return
    scale = args.scale_rests
    for fraction in (float(f) for f in args.fractions.split(",")):
        before, chained, _, cpu_before = run(args.text, args.layer, fraction, forms=False)
        after, taken, sets, cpu_after = run(args.text, args.layer, fraction, forms=True, scale=scale)
        what = "" if scale == 1.0 else f" (if Taylor's remainders were {scale:g} times theirs: not a bound)"
        print(f"{args.text!r} layer {args.layer}, {fraction:g} R{what}:")
        for name, k in (("before the feed-forward block", 1), ("before the output LayerNorm", 2)):
            own = _span(sets[k]) if len(sets) > k else "not formed"
            print(f"  {name}: chained {_span(chained[k])}, sets {own}, taken {_span(taken[k])}")
        print(f"  certified / witness: without the sets {before.certified:.6g} / {before.witness:.6g} = "
              f"{before.certified / before.witness:.4g} ({cpu_before:.1f} CPU s), with them {after.certified:.6g} / "
              f"{after.witness:.6g} = {after.certified / after.witness:.4g} ({cpu_after:.1f} CPU s)")


if __name__ == "__main__":
    main()
