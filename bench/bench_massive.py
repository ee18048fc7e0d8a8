"""Massive activations of SmolLM2-135M-Instruct and what they do to the attention sub-layer's constants.

On a real prompt, per block: the residual-stream norm of every token entering the block (token 0, the
attention sink, against the others), the spectral norm of the local Jacobian of the RMSNorm that feeds
the attention at each token (``||diag(gamma) (I - x x^T / (d s^2))|| / s``, ``s = (||x||^2 / d + eps)^(1/2)``,
from the dense d x d matrix), and the local Jacobian norm of the whole sub-layer ``x + Attn(RMSNorm(x))``
at the prompt, with every token moving and with token 0 alone held fixed (power iteration on the chain
engine's JVP/VJP).  Beside them the RMSNorm's global constant ``max|gamma| / sqrt(eps)`` and the
attention's certified constant on the RMSNorm image (``lipbound verify`` rows), which the sink does not
touch: the normalised sink is an ordinary point of the image.

Run: ``python bench/bench_massive.py [--text "..."] [--blocks 0,5,15,29]``
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np
from bench_decoders import smollm2


def rms_jacobian_norm(norm, x: np.ndarray) -> float:
    d = x.size
    s2 = float(x @ x) / d + norm.eps
    J = np.diag(norm.gamma) @ (np.eye(d) - np.outer(x, x) / (d * s2)) / math.sqrt(s2)
    return float(np.linalg.norm(J, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="The capital of France is Paris, and the capital of Italy is Rome.")
    parser.add_argument("--blocks", default="0,1,5,10,15,20,25,29")
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from lipbound.numeric.model import load_tokenizer, load_weights
    from lipbound.numeric.whole.chain import chain_jacobian_norm, hidden_states, layer_steps

    path = smollm2()
    model = load_weights(path)
    ids = load_tokenizer(path).encode(args.text)
    states = hidden_states(model, np.asarray(ids))
    blocks = [int(b) for b in args.blocks.split(",")]
    print(f"SmolLM2-135M-Instruct, {len(ids)} tokens: {args.text!r}")
    print(f"{'block':>5s} {'||x_0||':>9s} {'others: median':>14s} {'max':>8s} {'J_N(x_0)':>9s} {'J_N others':>10s} "
          f"{'global':>8s} {'sub-layer':>9s} {'sink fixed':>10s} {'sink only':>9s}")
    for block in blocks:
        X = states[block]
        layer = model.layers[block]
        norms = np.linalg.norm(X, axis=1)
        jn = [rms_jacobian_norm(layer.ln_in, x) for x in X]
        global_constant = layer.ln_in.gamma_max / math.sqrt(layer.ln_in.eps)
        attention = layer_steps(layer, "decoder")[:1]                  # x + Attn(RMSNorm(x))
        moving = np.ones_like(X)
        held = moving.copy()
        held[0] = 0.0
        alone = np.zeros_like(X)
        alone[0] = 1.0
        values = [float(chain_jacobian_norm(attention, X[None], tangent=lambda E, m=m: E * m, iterations=60)[0][0])
                  for m in (moving, held, alone)]
        print(f"{block:5d} {norms[0]:9.4g} {np.median(norms[1:]):14.4g} {np.max(norms[1:]):8.4g} {jn[0]:9.3g} "
              f"{np.median(jn[1:]):10.3g} {global_constant:8.4g} {values[0]:9.4g} {values[1]:10.4g} {values[2]:9.4g}")


if __name__ == "__main__":
    main()
