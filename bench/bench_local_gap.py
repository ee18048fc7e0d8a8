"""Where the local certificates' remaining gap comes from, measured on all-MiniLM-L6-v2.

Three parts, on the shortest of the 20 bundled sentences (layers counted from 0):

* ``variation`` -- the curve ``L(eps) <= ||DF(X)|| + variation`` of an attention layer (with its residual):
  per eps, the certified variation, the largest ``||DF(Y) - DF(X)||`` found in the Frobenius ball, and the
  variation the target ratio 1.5 would allow (``1.5 witness - ||DF(X)||``); then the curvature bound
  ``chi_I + chi_II + chi_III`` (theorem local-attention-curvature) at X and on three products of token
  balls for the same eps: every token at eps (the enclosure the curve uses), the cover of the Frobenius
  ball by the n products with one token at eps and the others at eps / sqrt(2) (at most one token of
  the ball moves by more than that), and every token at eps / sqrt(n) (not an enclosure: the budget
  shared evenly, a floor for any bound that keeps it), each integrated up to eps as the curve does.
* ``groups`` -- the set certificate for k = 1 over the whole vocabulary with the vocabulary split into
  G groups (k-means on the words' layer-1 inputs, float32): per group, token balls about the group's
  mean state pushed through layers 1..5 by the movement bounds; the largest bound over the groups
  against the largest identity-coupling movement over the vocabulary (an upper bound on the exact
  W1 witness, so the printed ratios are lower estimates).  Radii are measured in float (a diagnosis,
  not a certificate).
* ``hull`` -- the convex relaxation of the same set: Frank-Wolfe ascent of the layer-l movement over
  the convex hull of the word embeddings at the edited position, started at the worst word.

Run: ``python bench/bench_local_gap.py [--parts variation groups hull] [--layer 0] [--groups 1,16,64]``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_local import sentences  # noqa: E402

FRACTIONS = (1e-3, 2e-3, 3e-3, 1e-2)


def variation_part(bert, text, layer):
    from lipbound.local.balls import TokenBalls
    from lipbound.local.chains import chain_for
    from lipbound.local.curvature import AttentionCurvature
    from lipbound.measures.curves import local_curve
    curve, _ = local_curve(text, layer=layer, eps=FRACTIONS, model=bert)
    print(f"variation, layer {layer}, n = {curve.n}, R = {curve.radius:.4g}, ||DF(X)|| = {curve.jacobian_norm:.5g}")
    for p in curve.points:
        allowed = 1.5 * p.witness - curve.jacobian_norm
        print(f"  eps {p.eps / curve.radius:.0e} R: witness {p.witness:.5g}, certified {p.certified:.5g} "
              f"(ratio {p.ratio:.3g}); variation certified {p.variation:.4g}, found {p.variation_witness:.4g}, "
              f"allowed by ratio 1.5: {allowed:.4g}")
    X = bert.hidden_states(bert.encode(text))[layer]
    n = X.shape[0]
    component = chain_for(bert.model, "layer", layer)[0]
    enclosed = component.enclose(X)
    curvature = AttentionCurvature(enclosed, component.target)

    def total(radii):
        balls = TokenBalls(X, radii)
        return sum(curvature.chis(component.bounds(balls, enclosed), balls.radii))

    profiles = {"every token at eps": lambda t: [np.full(n, t)],
                "cover, one token at eps": lambda t: [np.where(np.arange(n) == j, t, t / math.sqrt(2)) for j in range(n)],
                "eps / sqrt(n) (not an enclosure)": lambda t: [np.full(n, t / math.sqrt(n))]}
    print(f"  curvature bound at X: {total(np.zeros(n)):.4g}")
    grid = sorted({10 ** (k / 4) for k in range(-20, -7)} | set(FRACTIONS))
    integrals, previous = dict.fromkeys(profiles, 0.0), 0.0
    for fraction in grid:
        t = fraction * curve.radius
        values = {name: max(total(r) for r in make(t)) for name, make in profiles.items()}
        for name in profiles:
            integrals[name] += (t - previous) * values[name]
        previous = t
        if fraction in FRACTIONS:
            print(f"  eps {fraction:.0e} R: curvature bound / integrated variation: "
                  + "; ".join(f"{name} {values[name]:.4g} / {integrals[name]:.3g}" for name in profiles))


def _vocabulary_states(bert, ids, position, last):
    """Float32 layer inputs and attention block outputs of every word at ``position`` (screening pass)."""
    from lipbound.measures.vocabulary import ScreeningModel
    screen = ScreeningModel(bert.model)
    words = screen.word.shape[0]
    inputs, outputs = [[] for _ in range(last + 1)], [[] for _ in range(last + 1)]
    for begin in range(0, words, 512):
        batch = np.tile(ids, (min(512, words - begin), 1))
        batch[:, position] = np.arange(begin, begin + batch.shape[0])
        X, Z = screen.forward(batch, last)
        for layer in range(last + 1):
            inputs[layer].append(X[layer])
            outputs[layer].append(Z[layer])
    return [np.concatenate(x) for x in inputs], [np.concatenate(z) for z in outputs]


def groups_part(bert, text, position, counts):
    from scipy.cluster.vq import kmeans2
    from lipbound.local.balls import TokenBalls
    from lipbound.local.bounds import attention_bounds
    from lipbound.local.enclosed import EnclosedAttention
    from lipbound.local.propagate import through_layer
    ids = np.array(bert.encode(text))
    last = bert.num_layers - 1
    original = bert.hidden_states(list(ids))
    blocks = [bert.attention_block(layer, original[layer]).pre_norm for layer in range(last + 1)]
    began = time.perf_counter()
    inputs, outputs = _vocabulary_states(bert, ids, position, last)
    witness = [float(np.max(np.linalg.norm(outputs[layer] - blocks[layer][None], axis=-1).mean(axis=1)))
               for layer in range(last + 1)]
    print(f"groups: {inputs[1].shape[0]} words at position {position} of {text!r} through the model in "
          f"{time.perf_counter() - began:.0f} s; largest identity-coupling movement per layer "
          + " ".join(f"{w:.3g}" for w in witness))
    states = inputs[1].astype(np.float64)                                   # (V, n, d)
    for count in counts:
        began = time.perf_counter()
        if count == 1:
            labels = np.zeros(states.shape[0], dtype=int)
        else:
            labels = kmeans2(states.reshape(states.shape[0], -1).astype(np.float32), count, seed=0, minit="++")[1]
        worst, largest = np.zeros(last), 0.0
        for group in np.unique(labels):
            members = states[labels == group]
            centers = members.mean(axis=0)
            radii = np.linalg.norm(members - centers[None], axis=-1).max(axis=0) * (1 + 1e-6)
            largest = max(largest, float(radii[position]))
            for layer in range(1, last + 1):
                attention = bert.model.layer(layer).as_layer(residual=True)
                enclosed = EnclosedAttention(attention, centers)
                movement = attention_bounds(attention, TokenBalls(centers, radii), enclosed, want_blocks=False).movement
                z = enclosed.output.mid
                bound = float(np.mean(np.linalg.norm(z - blocks[layer], axis=-1) + movement))
                worst[layer - 1] = max(worst[layer - 1], bound)
                if layer < last:
                    centers, radii = through_layer(bert.model.layer(layer), z, movement)
        print(f"  G = {count}: edited token's largest group radius at layer 1 {largest:.3g}; bound / movement at "
              "layers 1-5 " + " ".join(f"{w / m:.3g}" for w, m in zip(worst, witness[1:]))
              + f"; {time.perf_counter() - began:.0f} s")


def hull_part(bert, text, position, layers, steps):
    from lipbound.local.chains import Component, chain_for, chain_forward, chain_vjp
    ids = np.array(bert.encode(text))
    model = bert.model
    embeddings = model.embeddings
    offset = embeddings.position_offset
    word = embeddings.word.astype(np.float64)
    summed = word[ids] + embeddings.position[offset:offset + ids.size] + embeddings.token_type[0]
    shift = summed[position] - word[ids[position]]
    _, outputs = _vocabulary_states(bert, ids, position, max(layers))
    for layer in layers:
        began = time.perf_counter()
        chain = [Component("layernorm", embeddings.norm, "embedding LayerNorm")]
        chain += (chain_for(model, "stack", 0, last=layer - 1) if layer else []) + chain_for(model, "layer", layer)
        reference = chain_forward(chain, summed[None])[-1][0]

        def moved(vectors):
            T = np.repeat(summed[None], len(vectors), axis=0)
            T[:, position] = vectors + shift
            return np.linalg.norm(chain_forward(chain, T)[-1] - reference[None], axis=-1).mean(axis=1)

        screened = np.linalg.norm(outputs[layer] - reference[None], axis=-1).mean(axis=1)
        top = np.argsort(-screened)[:16]
        values = moved(word[top])
        x = word[top[int(np.argmax(values))]].copy()
        worst = best = float(np.max(values))
        for _ in range(steps):
            T = np.repeat(summed[None], 1, axis=0)
            T[0, position] = x + shift
            states = chain_forward(chain, T)
            difference = states[-1][0] - reference
            sizes = np.linalg.norm(difference, axis=-1, keepdims=True)
            gradient = chain_vjp(chain, states, (difference / np.maximum(sizes, 1e-300) / ids.size)[None])[0][position]
            vertex = word[int(np.argmax(word @ gradient))]
            steps_along = np.concatenate([np.geomspace(1e-3, 0.05, 8), np.linspace(0.1, 1.0, 10)])
            candidates = x[None] + steps_along[:, None] * (vertex - x)[None]
            values = moved(candidates)
            if values.max() <= best:
                break
            best, x = float(values.max()), candidates[int(np.argmax(values))]
        print(f"hull, layer {layer}: worst word {worst:.4g}, best point of the hull found {best:.4g} "
              f"(ratio {best / worst:.3g}); {time.perf_counter() - began:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["variation", "groups", "hull"],
                        choices=["variation", "groups", "hull"])
    parser.add_argument("--layer", type=int, default=0, help="layer of the variation part (default 0)")
    parser.add_argument("--position", type=int, default=3, help="edited position of the set parts (default 3)")
    parser.add_argument("--groups", default="1,16,64", help="group counts of the groups part (default 1,16,64)")
    parser.add_argument("--hull-layers", default="1,5", help="layers of the hull part (default 1,5)")
    parser.add_argument("--hull-steps", type=int, default=30, help="Frank-Wolfe steps of the hull part (default 30)")
    args = parser.parse_args()

    from lipbound.cli.parsing import int_list
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    text = sentences(1)[0]
    if "variation" in args.parts:
        variation_part(bert, text, args.layer)
    if "groups" in args.parts:
        groups_part(bert, text, args.position, int_list("--groups", 1)(args.groups))
    if "hull" in args.parts:
        hull_part(bert, text, args.position, int_list("--hull-layers")(args.hull_layers), args.hull_steps)


if __name__ == "__main__":
    main()
