"""What the residual stream of a real prompt does to the norms' constants (massive activations).

A norm's global constant ``max|gamma| / sqrt(eps)`` is attained at tokens of (nearly) zero mean square;
at a token x its Jacobian has norm at most ``||D_gamma Pi|| / sqrt(||Pi x||^2 / d + eps)``
(:func:`lipbound.numeric.blocks.norms.local_constants`, ``max|gamma| / rms(x)`` for an RMSNorm).  Trained
decoders carry a few tokens with a residual norm orders of magnitude above the others (Sun et al. 2024,
"Massive activations in large language models"; in SmolLM2 the first token, the attention sink): the norm
reading them barely stretches, while the ordinary tokens meet a constant set by their own scale.

:func:`stream_norms` runs the one float engine on the token ids and, for every step of every layer
that reads its input through a norm, records each token's norm at that input and the certified local
constant of the norm there, beside the norm's global constant.
"""

from __future__ import annotations

import numpy as np

from ...errors import WeightsError
from ..blocks.norms import local_constants, norm_constant
from ..model.transformer import Model
from .chain import chain_forward, layer_steps

__all__ = ["stream_norms"]


def stream_norms(model: Model, ids) -> list[dict]:
    """One row per norm that reads the stream (or a branch's output) of a decoder or encoder on ``ids``.

    Returns
    -------
    list of dict
        ``{"layer", "step", "norm" ("input": the norm before the branch, "output": a sandwich norm after
        it), "kind", "token_norms" (n,), "local" (n,), "global"}``: the Euclidean norm of each token where
        the norm reads it, the certified bound of ``||DN(x)||`` there, and the norm's global constant; the
        final norm of a pre-norm stack as layer ``num_layers``.
    """
    if not model.complete or model.decoder:
        raise WeightsError(model.path or model.name, "a complete encoder or decoder-only model",
                           "a partial checkpoint or an encoder-decoder", "load the whole model directory")
    block = model.blocks[0]
    X = model.embeddings(ids).astype(np.float64)[None]
    rows = []
    for index in range(model.num_layers):
        steps = layer_steps(model.layers[index], block)
        _, linear = chain_forward(steps, X)
        inputs = [X] + [lin.F for lin in linear[:-1]]
        for step, lin, Y in zip(steps, linear, inputs):
            reads = [("input", step.norm, Y)] if step.norm is not None else []
            if step.kind == "norm":                  # a post-norm layer: the norm is the step itself
                reads = [("input", step.part, Y)]
            if step.out_norm is not None:
                reads.append(("output", step.out_norm, lin.inner.F))
            for where, norm, tokens in reads:
                rows.append(_row(index, step.name, where, norm, tokens[0]))
        X = linear[-1].F
    final = model.final_norm_of(block)
    if final is not None:
        rows.append(_row(model.num_layers, f"{block} final norm", "input", final, X[0]))
    return rows


def _row(layer: int, step: str, where: str, norm, tokens: np.ndarray) -> dict:
    return {"layer": layer, "step": step, "norm": where, "kind": norm.kind,
            "token_norms": np.linalg.norm(tokens, axis=-1).tolist(), "local": local_constants(norm, tokens).tolist(),
            "global": norm_constant(norm).value}
