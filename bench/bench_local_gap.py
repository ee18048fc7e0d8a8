"""Where the local certificates' remaining gap comes from, measured on all-MiniLM-L6-v2.

Five parts, on the shortest of the 20 bundled sentences (layers counted from 0):

* ``variation`` -- the curve ``L(eps) <= ||DF(X)|| + variation`` of an attention layer (with its residual):
  per eps, the certified variation, the largest ``||DF(Y) - DF(X)||`` found in the Frobenius ball, and the
  variation the target ratio 1.5 would allow (``1.5 witness - ||DF(X)||``); then the curvature bound
  ``chi_I + chi_II + chi_III`` (theorem local-attention-curvature) at X and on three products of token
  balls for the same eps: every token at eps (the enclosure the curve uses), the cover of the Frobenius
  ball by the n products with one token at eps and the others at eps / sqrt(2) (at most one token of
  the ball moves by more than that), and every token at eps / sqrt(n) (not an enclosure: the budget
  shared evenly, a floor for any bound that keeps it), each integrated up to eps as the curve does.
* ``curvature`` -- the three groups of the second derivative at X (the curvature module's docstring:
  the value terms, the zeta-zeta terms, the ``Qt`` terms), evaluated in float from their formulas
  (checked against a finite-difference second derivative of the layer), and for each group and for
  their sum the largest ``||D^2F[e, f]||`` over unit e, f that alternating maximisation finds
  (each round: the exact top singular pair of ``e -> D^2F[e, f]``), beside ``chi_I``, ``chi_II``, ``chi_III``.
* ``groups`` -- the set certificate for k = 1 over the whole vocabulary with the vocabulary split into
  G groups (k-means on the words' layer-1 inputs, float32): per group, token balls about the group's
  mean state pushed through layers 1..5 by the movement bounds; the largest bound over the groups
  against the largest identity-coupling movement over the vocabulary (an upper bound on the exact
  W1 witness, so the printed ratios are lower estimates).  Radii are measured in float (a diagnosis,
  not a certificate).
* ``between`` -- the same set from the first attention block's output (enumerated: the balls are the
  exact largest movements) to the second layer's input, through the output LayerNorm, the residual
  feed-forward block and its LayerNorm: per step the balls' radii beside the largest movement over the
  vocabulary (float), for the edited token and for the others, with the LayerNorm's
  ``max |gamma| / rms gamma`` (what a ball pays over a typical direction) and the feed-forward block's
  Jacobian norm at the centres beside the constant the ball gets.
* ``hull`` -- the convex relaxation of the same set: Frank-Wolfe ascent of the layer-l movement over
  the convex hull of the word embeddings at the edited position, started at the worst word.

Run: ``python bench/bench_local_gap.py [--parts variation curvature groups between hull] [--layer 0]
[--groups 1,16,64]``.
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
                "cover, one token at eps": lambda t: [np.where(np.arange(n) == j, t, t / math.sqrt(2))
                                                      for j in range(n)],
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


def _second_derivative_groups(layer, X):
    """``(e, f) -> (I, II, III)``, the three groups of ``D^2F(X)[e, f]`` of an attention layer, batched
    over leading axes of e and f (b, n, d) -> three (b, n, d_out)."""
    heads = []
    for h, head in enumerate(layer.heads):
        Q, K, values = X @ head.W_Q + head.b_Q, X @ head.W_K + head.b_K, X @ head.V + head.b_V
        c = 1 / math.sqrt(head.d_k)
        S = c * Q @ K.T
        P = np.exp(S - S.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        rows = layer.output_block(h)
        out = values @ rows
        heads.append((head.W_Q, head.W_K, Q, K, P, head.V @ rows, out[None] - (P @ out)[:, None], c,
                      head.W_Q @ head.W_K.T))

    def zeta(W_Q, W_K, Q, K, P, c, E):
        dS = c * ((E @ W_Q) @ K.T + Q @ np.swapaxes(E @ W_K, -1, -2))
        return dS - (P * dS).sum(axis=-1, keepdims=True)

    def groups(E, F):
        first = second = third = 0.0
        for W_Q, W_K, Q, K, P, A, u, c, Qt in heads:
            ze, zf = zeta(W_Q, W_K, Q, K, P, c, E), zeta(W_Q, W_K, Q, K, P, c, F)
            first = first + np.einsum("bij,bjo->bio", P * zf, E @ A) + np.einsum("bij,bjo->bio", P * ze, F @ A)
            second = second + np.einsum("bij,ijo->bio", P * ze * zf, u)
            mixed = np.einsum("bik,bjk->bij", E @ Qt, F) + np.einsum("bik,bjk->bij", F @ Qt, E)
            third = third + c * np.einsum("bij,ijo->bio", P * mixed, u)
        return first, second, third
    return groups


def curvature_part(bert, text, layer, rounds):
    from lipbound.local.balls import TokenBalls
    from lipbound.local.chains import chain_for, chain_forward
    from lipbound.local.curvature import AttentionCurvature
    X = bert.hidden_states(bert.encode(text))[layer]
    n, d = X.shape
    component = chain_for(bert.model, "layer", layer)[0]
    groups = _second_derivative_groups(component.target, X)
    rng = np.random.default_rng(0)
    e, f = (v / np.linalg.norm(v) for v in rng.standard_normal((2, n, d)))
    h = 1e-3
    move = lambda Y: chain_forward([component], Y[None])[-1][0]  # noqa: E731
    finite = (move(X + h * e + h * f) - move(X + h * e - h * f) - move(X - h * e + h * f)
              + move(X - h * e - h * f)) / (4 * h * h)
    formula = sum(groups(e[None], f[None]))[0]
    enclosed = component.enclose(X)
    chis = AttentionCurvature(enclosed, component.target).chis(component.bounds(TokenBalls(X, np.zeros(n)), enclosed),
                                                              np.zeros(n))
    print(f"curvature, layer {layer}, n = {n}: the formula against finite differences: relative difference "
          f"{np.linalg.norm(formula - finite) / np.linalg.norm(finite):.1e}")
    basis = np.eye(n * d).reshape(n * d, n, d)
    for name, pick, bound in (("I", lambda g: g[0], chis[0]), ("II", lambda g: g[1], chis[1]),
                              ("III", lambda g: g[2], chis[2]), ("sum", sum, sum(chis))):
        began = time.perf_counter()
        f, largest = rng.standard_normal((n, d)), 0.0
        f /= np.linalg.norm(f)
        for _ in range(rounds):
            M = np.concatenate([pick(groups(basis[b:b + 512], np.broadcast_to(f, (min(512, n * d - b), n, d))))
                                for b in range(0, n * d, 512)]).reshape(n * d, -1)
            U, sigma, _ = np.linalg.svd(M, full_matrices=False)
            largest, f = max(largest, float(sigma[0])), U[:, 0].reshape(n, d)   # symmetric: f takes e's place
        print(f"  group {name}: largest found {largest:.4g}, certified {bound:.4g} (ratio {bound / largest:.3g}); "
              f"{time.perf_counter() - began:.0f} s")


def _vocabulary_states(bert, ids, position, last):
    """Float32 layer inputs and attention block outputs of every word at ``position`` (screening pass)."""
    from lipbound.measures.vocabulary import ScreeningModel
    screen = ScreeningModel(bert.model)
    words = screen.vocab_size
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


def between_part(bert, text, position):
    from lipbound.local.enclosed import EnclosedFeedForward
    from lipbound.local.propagate import propagate, through_layer_steps
    from lipbound.measures.edits import edit_set
    ids = np.array(bert.encode(text))
    began = time.perf_counter()
    _, outputs = _vocabulary_states(bert, ids, position, 0)
    moved = outputs[0].astype(np.float64)                                    # (V, n, d)
    start = propagate(bert.model, edit_set(ids, "replace", [position], np.arange(moved.shape[0])), layers=[0])[0]
    item = bert.model.layer(0)
    reference = start.centers
    others = np.arange(ids.size) != position
    print(f"between, layer 0 to 1, position {position} of {text!r} ({time.perf_counter() - began:.0f} s): "
          "ball radius / largest movement over the vocabulary")
    names = ("output LayerNorm", "residual feed-forward", "feed-forward LayerNorm")
    for name, (target, enclosed, bounds, _, radii) in zip(names, through_layer_steps(item, start.centers, start.radii)):
        if isinstance(enclosed, EnclosedFeedForward):
            step = lambda Y: Y + target(Y)  # noqa: E731
            at_center = enclosed.jacobian_norms(None)
            extra = (f"; Jacobian norm at the centres {np.min(at_center):.3g}-{np.max(at_center):.3g}, on the balls "
                     f"{np.min(np.diag(bounds.blocks)):.4g}-{np.max(np.diag(bounds.blocks)):.4g}")
        else:
            step = target
            extra = f"; max |gamma| / rms gamma {target.gamma_max / np.sqrt(np.mean(target.gamma ** 2)):.3g}"
        moved, reference = step(moved), step(reference)
        largest = np.linalg.norm(moved - reference[None], axis=-1).max(axis=0)
        ratios = radii / largest
        print(f"  {name}: edited token {radii[position]:.4g} / {largest[position]:.4g}; others' ratios "
              f"{np.min(ratios[others]):.3g}-{np.max(ratios[others]):.3g} (median {np.median(ratios[others]):.3g})"
              + extra)


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
        chain = [Component("norm", embeddings.norm, "embedding LayerNorm")]
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
            gradient = chain_vjp(states, (difference / np.maximum(sizes, 1e-300) / ids.size)[None])[0][position]
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
    parser.add_argument("--parts", nargs="+", default=["variation", "curvature", "groups", "between", "hull"],
                        choices=["variation", "curvature", "groups", "between", "hull"])
    parser.add_argument("--layer", type=int, default=0, help="layer of the variation and curvature parts (default 0)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the curvature part (default 3)")
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
    if "curvature" in args.parts:
        curvature_part(bert, text, args.layer, args.rounds)
    if "groups" in args.parts:
        groups_part(bert, text, args.position, int_list("--groups", 1)(args.groups))
    if "between" in args.parts:
        between_part(bert, text, args.position)
    if "hull" in args.parts:
        hull_part(bert, text, args.position, int_list("--hull-layers")(args.hull_layers), args.hull_steps)


if __name__ == "__main__":
    main()
