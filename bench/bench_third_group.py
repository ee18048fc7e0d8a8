"""The attention curvature's third group on MiniLM's first layer: the Kronecker form against the earlier forms.

For a sentence and a few radii (fractions of the LayerNorm radius R), on ``U(X, t)`` with the relational score and
weight ranges: ``chi_III`` with the earlier forms alone and with the Kronecker form (lemma curvature-third-kronecker,
lipbound/local/third_group.py), the form's two parts (``max_i ||K_i(X)||`` bounded through the sum over the queries,
and the rows' changes through the heads-weighted form), the CPU seconds of the certified ``||K||`` at X, and, at X,
a float lower estimate of each query's ``||K_i||``'s trilinear form (alternating ascent over e, F, y; never a bound).

    python bench/bench_third_group.py --text "The cat sat on the mat." --fractions 0,1e-3,2.5e-3,1e-2
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _trilinear(Qts, D, rng, starts: int = 3, steps: int = 100) -> float:
    """The largest ``||sum_(h, j) D_hj (x Qt_h f_j^T)||`` over unit x, F found by alternating ascent (floats)."""
    import numpy as np
    best = 0.0
    for _ in range(starts):
        x, y = rng.standard_normal(Qts[0].shape[0]), rng.standard_normal(D.shape[2])
        x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
        value = 0.0
        for _ in range(steps):
            Dy = [D[h] @ y for h in range(len(Qts))]
            F = sum(np.outer(Dy[h], Qts[h].T @ x) for h in range(len(Qts)))
            F /= np.linalg.norm(F)
            x = sum(Qts[h] @ (F.T @ Dy[h]) for h in range(len(Qts)))
            x /= np.linalg.norm(x)
            out = sum(D[h].T @ (F @ (Qts[h].T @ x)) for h in range(len(Qts)))
            value = float(np.linalg.norm(out))
            y = out / value
        best = max(best, value)
    return best


def main() -> None:
    import numpy as np

    from lipbound.local.balls import TokenBalls
    from lipbound.local.bounds import attention_bounds
    from lipbound.local.chains import Component
    from lipbound.local.curvature import AttentionCurvature, _changes
    from lipbound.local.enclosed import EnclosedAttention
    from lipbound.local.relational import RelationalRoute
    from lipbound.measures.bert import load_text_model
    from lipbound.rigorous.arrays import IntervalArray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="The cat sat on the mat.")
    parser.add_argument("--fractions", default="0,1e-3,2.5e-3,1e-2")
    args = parser.parse_args()
    bert = load_text_model(None)
    X = bert.hidden_states(bert.encode(args.text))[0]
    R = bert.layernorm_feeding(0).radius_about_center
    layer = bert.model.layer(0).as_layer(residual=True)
    E = EnclosedAttention(layer, X)
    route = RelationalRoute(Component("attention", layer, "layer 0"), X, E, movement=False)
    curvature = AttentionCurvature(E, layer)
    c2 = 2 * curvature.c
    print(f"{args.text!r}: n = {X.shape[0]}, R = {R:.2f}; chi_III = 2 c x (form), 2 c = {c2:.4f}")
    print(f"{'t / R':>8} {'before':>9} {'after':>9} {'||K(X)||':>9} {'changes':>9} {'K CPU s':>8}")
    for fraction in (float(f) for f in args.fractions.split(",")):
        t = fraction * R
        radii = np.full(X.shape[0], t)
        bounds = attention_bounds(layer, TokenBalls(X, radii), E, **(route.known(t) if t > 0 else {}))
        facts = bounds.facts
        saved = curvature.kronecker
        curvature.kronecker = False
        before = curvature.chis(bounds, radii, t if t > 0 else None)[2]
        curvature.kronecker = saved
        began = time.process_time()
        after = curvature.chis(bounds, radii, t if t > 0 else None)[2]
        spent = time.process_time() - began
        drift = IntervalArray(facts["value_shift"][:, None, :]) + IntervalArray(facts["head_movement"][:, :, None])
        changes = curvature._heads_weighted(_changes((curvature.rho + drift).hi, drift, facts, E.P.hi))
        at_x = curvature.third_at_x if curvature.third_at_x is not None else float("nan")
        print(f"{fraction:>8.2g} {before:>9.3f} {after:>9.3f} {at_x:>9.3f} {changes:>9.3f} {spent:>8.1f}")
    engine = E.engine
    Qts = [engine.head_weights(h)[0] @ engine.head_weights(h)[1].T for h in range(engine.H)]
    at = engine.linearize(engine.to_work(X)[None])
    rows = []
    for h in range(engine.H):
        U, P = at.V[0, h] @ layer.output_block(h), at.P[0, h]
        rows.append(P[:, :, None] * (U[None] - (P @ U)[:, None]))
    rows = np.array(rows)
    rng = np.random.default_rng(0)
    found = [_trilinear(Qts, rows[:, i], rng) for i in range(X.shape[0])]
    print("per query ||K_i||'s trilinear form found by ascent (floats):", " ".join(f"{v:.2f}" for v in found))


if __name__ == "__main__":
    main()
