"""The whole-model verification as independent tasks of plain data.

A task is a tuple of strings and numbers; :func:`run_task` (module level) runs one and returns a
dict of plain data (numbers, strings, lists), loading the model from its path in the process
that runs it (cached per process).  So a list of tasks can run in a plain loop, in local
processes or on a cluster with the same numbers: every witness search is counted in power
iterations and restarts from a seeded generator, never in seconds.

Task kinds (``block``, ``layer`` say where; ``-1`` is the stack's final LayerNorm):

* ``attention`` -- one attention map of a layer (``kind`` self, causal, cross-queries or
  cross-context) on the image of the LayerNorm that feeds it: its certified bounds
  (:func:`lipbound.numeric.certify.layer_bounds`), a witness of the map, and a witness of its
  residual step;
* ``ffn`` -- a feed-forward block: closed form, midpoint form, LipSDP-Neuron
  (:func:`lipbound.numeric.blocks.constants.ffn_constants`), for a pre-LN block also the
  LayerNorm gain folded into ``W_1``, its certified witness, and a witness of its residual step;
* ``norm`` -- a LayerNorm: its global constant and the certified witness that attains it;
* ``layer`` -- the witness of a whole layer (every step of :mod:`.chain`);
* ``model`` -- the end-to-end witness of a stack in its input (``stream``) or context.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...errors import AssumptionError
from ..attention import AttentionMap, unit_rows
from ..blocks.constants import ffn_constants, pre_norm_ffn_constants
from ..blocks.ffn import arrays
from ..blocks.norms import norm_constant
from ..certify import layer_bounds
from ..domains import DomainSpec, LayerNormOutputs
from ..model import FeedForward, LayerNorm, load_weights
from ..witness.blocks import ffn_witness, norm_witness
from ..witness.starts import castin_input
from .chain import Step, chain_jacobian_norm, layer_steps, stack_steps

__all__ = ["plan_tasks", "run_task", "describe_task"]

#: norm attribute of a layer -> the component's name in reports
NORM_NAMES = {"ln_in": "attention input LayerNorm", "ln_out": "attention LayerNorm", "cross_norm": "cross LayerNorm",
              "ffn_norm": "feed-forward LayerNorm", "final": "final LayerNorm"}


@functools.lru_cache(maxsize=4)
def _model(path: str):
    return load_weights(path)


def _values(values) -> list[dict]:
    return [{"name": v.name, "value": float(v.value), "certified": bool(v.certified)} for v in values]


def _image_points(norm, rng, shape) -> np.ndarray:
    """Points of the LayerNorm image ``beta + gamma z`` (``z`` mean zero, ``||z||`` uniform in
    ``(0, 0.99 sqrt(d))``), a batch of ``shape = (b, n)`` tokens."""
    z = rng.standard_normal(shape + (norm.d,))
    z -= z.mean(axis=-1, keepdims=True)
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    z *= math.sqrt(norm.d) * rng.uniform(0.05, 0.99, shape + (1,))
    return norm.beta + norm.gamma * z


def _free_points(d: int, rng, shape) -> np.ndarray:
    """Points of ``R^d`` at scales from nearly constant tokens (where a LayerNorm stretches most)
    to large ones: a constant per token plus noise of scale ``10^k``, k from -4 to 1."""
    scales = 10.0 ** rng.integers(-4, 2, shape + (1,))
    return rng.standard_normal(shape + (1,)) + scales * rng.standard_normal(shape + (d,))


def _stream_points(model, block: str, layer: int, rng, shape):
    """Inputs of a layer: the image of the LayerNorm before it (post-LN), else all of R^d."""
    first = model.stack(block)[layer]
    if first.placement == "post" and first.ln_in is not None:
        domain = LayerNormOutputs(first.ln_in)
        return _image_points(first.ln_in, rng, shape), domain.tangent_directions
    return _free_points(model.hidden, rng, shape), None


def _context(model, rng, shape):
    norm = model.context_norm
    return _image_points(norm, rng, shape), LayerNormOutputs(norm).tangent_directions


def _chain_witness(steps, X, C, argument, tangent, iterations, seed) -> float:
    return float(np.max(chain_jacobian_norm(steps, X, C, argument=argument, tangent=tangent, iterations=iterations,
                                            seed=seed)[0]))


def _castin_starts(layer, n: int, heads: int = 3) -> np.ndarray:
    """Castin et al.'s input for the ``heads`` largest heads (``||A_h|| ||W_V^h||``), both signs,
    pulled into the image of the LayerNorm that feeds the layer (their construction of a large
    Jacobian, :func:`lipbound.numeric.witness.starts.castin_input`)."""
    norm, domain = layer.ln_in, LayerNormOutputs(layer.ln_in)
    sizes = [np.linalg.norm(h.A, 2) * np.linalg.norm(h.W_V, 2) for h in layer.heads]
    starts = []
    for index in np.argsort(sizes)[::-1][:heads]:
        head = layer.heads[index]
        tokens = castin_input(head.W_Q, head.W_K, norm.radius_about_center, n, literal=False)
        starts += [domain.retract(norm.beta + tokens), domain.retract(norm.beta - tokens)]
    return np.stack(starts)


def _self_ascent(target, norm: LayerNorm, X: np.ndarray, iterations: int, seed: int) -> float:
    """Ascent of the local Jacobian norm of self-attention over the image of ``norm``: at each of
    ``iterations`` steps, a few power iterations give the top singular pair ``(E, G)`` (tangent to
    the image), ``||J E||`` is recorded (a lower bound: X lies in the image), and X moves along the
    tangent part of ``grad_X <G, J(X) E>`` (:meth:`Linearization.curvature`, the gradient of the norm)
    and is pulled back into the image.  Counted, not timed."""
    domain = LayerNormOutputs(norm)
    engine = AttentionMap(target)
    rng = np.random.default_rng(seed)
    E = unit_rows(domain.tangent_directions(rng.standard_normal(X.shape)))
    step = 0.6 * norm.gamma_max * math.sqrt(norm.d)
    best = 0.0
    for _ in range(iterations):
        lin = engine.linearize(X)
        for _ in range(4):
            E = unit_rows(domain.tangent_directions(lin.vjp(lin.jvp(E))))
        JE = lin.jvp(E)
        sigma = np.sqrt(np.sum(JE * JE, axis=(1, 2)))
        best = max(best, float(np.max(sigma)))
        grad = domain.tangent_directions(lin.curvature(E, JE / sigma[:, None, None]))
        X = domain.retract(X + step * unit_rows(grad))
    return best


def _attention(model, block, index, kind, n, m, domain_spec, restarts, iterations, seed) -> dict:
    layer = model.stack(block)[index]
    rng = np.random.default_rng(seed)
    spec = DomainSpec.parse(domain_spec)
    cross = kind.startswith("cross")
    if not cross:
        n = m if block == "decoder" else n  # a decoder's stream has the m query tokens
        domain = spec.resolve(layer.ln_in, f"{block} layer {index}")
        bounds = layer_bounds(layer, domain, n)
        image = LayerNormOutputs(layer.ln_in)
        X = _image_points(layer.ln_in, rng, (restarts, n))
        inner = [Step("attention", layer.as_layer(residual=False), None, False, "")]
        starts = np.concatenate([X, _castin_starts(layer, n)])
        witness = max(_chain_witness(inner, X, None, "stream", image.tangent_directions, iterations, seed),
                      _self_ascent(inner[0].part, layer.ln_in, starts, iterations, seed))
        residual = layer_steps(layer, block)[:1]
        Xr, tangent = _stream_points(model, block, index, rng, (restarts, n))
        residual_witness = _chain_witness(residual, Xr, None, "stream", tangent, iterations, seed)
        return {"upper": _values(bounds), "witness": witness, "residual_witness": residual_witness}
    context = spec.resolve(model.context_norm, f"the context of {block} layer {index}")
    queries = spec.resolve(layer.cross_norm, f"the queries of {block} layer {index}")
    bounds = layer_bounds(layer.cross, context, n, role=kind, m=m, query_domain=queries)
    Y = _image_points(layer.cross_norm, rng, (restarts, m))
    C, context_tangent = _context(model, rng, (restarts, n))
    inner = [Step("cross", layer.cross, None, False, "")]
    argument = "stream" if kind == "cross-queries" else "context"
    tangent = LayerNormOutputs(layer.cross_norm).tangent_directions if argument == "stream" else context_tangent
    witness = _chain_witness(inner, Y, C, argument, tangent, iterations, seed)
    result = {"upper": _values(bounds), "witness": witness}
    if kind == "cross-queries":
        step = [s for s in layer_steps(layer, block) if s.kind == "cross"]
        Xr = _free_points(model.hidden, rng, (restarts, m))
        result["residual_witness"] = _chain_witness(step, Xr, C, "stream", None, iterations, seed)
    return result


def _ffn(model, block, index, effort, restarts, iterations, seed) -> dict:
    layer = model.stack(block)[index]
    w = arrays(layer.ffn)
    values = ffn_constants(w["W_1"], w["W_2"], w["act"], effort=effort)
    upper = _values(v for k, v in values.items() if k != "best")
    result = {"upper": upper}
    if layer.placement == "pre":
        pre = pre_norm_ffn_constants(layer.ffn_norm, w["W_1"], w["W_2"], w["act"], effort=effort,
                                     inner=values["best"])
        result["residual_upper"] = _values([pre["composed"], pre["folded"]])
    witness = ffn_witness(w["W_1"], w["b_1"], w["W_2"], w["act"], b_2=w["b_2"], seed=seed, starts=max(restarts, 2),
                          steps=10 * iterations, budget=math.inf)
    result["witness"] = float(witness.certified)
    step = [s for s in layer_steps(layer, block) if s.kind == "ffn"]
    rng = np.random.default_rng(seed)
    if layer.placement == "post":
        X = _image_points(layer.ln_out, rng, (restarts, 1))
        tangent = LayerNormOutputs(layer.ln_out).tangent_directions
    else:
        X, tangent = _free_points(model.hidden, rng, (restarts, 1)), None
    result["residual_witness"] = _chain_witness(step, X, None, "stream", tangent, iterations, seed)
    return result


def _norm(model, block, index, name) -> dict:
    norm = model.final_norm_of(block) if name == "final" else getattr(model.stack(block)[index], name)
    value = norm_constant(norm)
    return {"upper": _values([value]), "witness": float(norm_witness(norm).certified), "eps": float(norm.eps)}


def _layer(model, block, index, n, m, restarts, iterations, seed) -> dict:
    rng = np.random.default_rng(seed)
    steps = layer_steps(model.stack(block)[index], block)
    X, tangent = _stream_points(model, block, index, rng, (restarts, m if block == "decoder" else n))
    C = _context(model, rng, (restarts, n))[0] if any(s.kind == "cross" for s in steps) else None
    return {"witness": _chain_witness(steps, X, C, "stream", tangent, iterations, seed)}


def _whole(model, block, argument, n, m, restarts, iterations, seed) -> dict:
    rng = np.random.default_rng(seed)
    steps = stack_steps(model, block)
    first = min(model.stack(block))
    X, tangent = _stream_points(model, block, first, rng, (restarts, m if block == "decoder" else n))
    C, context_tangent = (None, None)
    if any(s.kind == "cross" for s in steps):
        C, context_tangent = _context(model, rng, (restarts, n))
    if argument == "context":
        tangent = context_tangent
    return {"witness": _chain_witness(steps, X, C, argument, tangent, iterations, seed)}


def run_task(kind: str, path: str, block: str, layer: int, detail: str, n: int, m: int, domain: str, effort: int,
             restarts: int, iterations: int, seed: int) -> dict:
    """Run one task (module docstring) and return plain data; ``m`` is 0 when not used."""
    model = _model(path)
    m = m or n
    if kind == "attention":
        return _attention(model, block, layer, detail, n, m, domain, restarts, iterations, seed)
    if kind == "ffn":
        return _ffn(model, block, layer, effort, restarts, iterations, seed)
    if kind == "norm":
        return _norm(model, block, layer, detail)
    if kind == "layer":
        return _layer(model, block, layer, n, m, restarts, iterations, seed)
    if kind == "model":
        return _whole(model, block, detail, n, m, restarts, iterations, seed)
    raise ValueError(f"unknown task kind {kind!r}")


def _check_composable(layer, where: str) -> None:
    """The composed bounds cover post- and pre-LN layers of LayerNorms and plain feed-forward blocks;
    other block kinds (RMSNorm, gated blocks, the sandwich placement, LayerScale) are refused."""
    norms = [getattr(layer, slot) for slot in ("ln_in", "ln_out", "ffn_norm", "cross_norm")]
    kinds = [norm.kind for norm in norms if norm is not None and norm.kind != "layernorm"]
    other = ([f"placement {layer.placement}"] if layer.placement not in ("post", "pre") else []) + kinds \
        + (["a gated feed-forward block"] if not isinstance(layer.ffn, FeedForward) else []) \
        + (["LayerScale"] if layer.attn_scale is not None or layer.ffn_scale is not None else [])
    if other:
        raise AssumptionError("model", "layers whose blocks the composed bounds cover (post- or pre-LN, LayerNorms, "
                              "plain feed-forward blocks)", f"{where}: {', '.join(other)}",
                              "verify the attention without --whole; the composition of these blocks has no bound yet")


def plan_tasks(model, *, n: int, m: int | None = None, domain: str = "layernorm", effort: int = 30,
               restarts: int = 4, iterations: int = 30, seed: int = 0) -> list[tuple]:
    """Every task of the whole-model verification of ``model`` (loaded from ``model.path``)."""
    spec = DomainSpec.parse(domain)
    domain_text = spec.kind if spec.kind != "radius" else repr(spec.radius)  # plain data for the task
    common = (n, m or 0, domain_text, effort, restarts, iterations, seed)
    tasks = []
    for block in model.blocks:
        for index in sorted(model.stack(block)):
            layer = model.stack(block)[index]
            layer_steps(layer, block)  # a clear error on a partial checkpoint, before any work
            _check_composable(layer, f"{block} layer {index}")
            kinds = [layer.self_kind] + (["cross-queries", "cross-context"] if layer.cross is not None else [])
            tasks += [("attention", model.path, block, index, kind) + common for kind in kinds]
            tasks.append(("ffn", model.path, block, index, "") + common)
            norms = ("ln_out", "ffn_norm") if layer.placement == "post" else \
                ("ln_in",) + (("cross_norm",) if layer.cross is not None else ()) + ("ffn_norm",)
            tasks += [("norm", model.path, block, index, name) + common for name in norms]
            tasks.append(("layer", model.path, block, index, "") + common)
        if model.final_norm_of(block) is not None:
            tasks.append(("norm", model.path, block, -1, "final") + common)
        tasks.append(("model", model.path, block, -1, "stream") + common)
        if block == "decoder" and model.context_norm is not None:
            tasks.append(("model", model.path, block, -1, "context") + common)
    return tasks


def describe_task(task: tuple) -> str:
    """``"ffn of encoder layer 3"``, ``"end-to-end witness of the decoder in its context"``."""
    kind, _, block, layer, detail = task[:5]
    if kind == "model":
        return f"end-to-end witness of the {block} in its {'input' if detail == 'stream' else 'context'}"
    where = f"the {block}'s final LayerNorm" if layer < 0 else f"{block} layer {layer}"
    return f"{kind}{' ' + detail if detail else ''} of {where}"
