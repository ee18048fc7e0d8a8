"""The whole-model verification as independent tasks of plain data.

A task is a :class:`WholeTask`, a named tuple of strings and numbers; :func:`run_task` (module level)
runs one (``run_task(*task)``) and returns a
dict of plain data (numbers, strings, lists), loading the model from its path in the process
that runs it (cached per process).  So a list of tasks can run in a plain loop, in local
processes or on a cluster with the same numbers: every witness search is counted in power
iterations and restarts from a seeded generator, never in seconds.

Task kinds (``block``, ``layer`` say where; ``-1`` is the stack's final norm):

* ``attention`` -- one attention map of a layer (``kind`` self, causal, cross-queries or
  cross-context) on the image of the norm that feeds it: its certified bounds
  (:func:`lipbound.numeric.certify.layer_bounds`; a kernel no theorem covers yet comes back as
  "refused", not certified, with the reason), a witness of the map, a witness of its residual step
  and, in a pre-norm or sandwich layer, the residual rule on certified constants
  (:func:`lipbound.numeric.blocks.constants.residual_constant`, LayerScale and the sandwich norm
  included);
* ``ffn`` -- a feed-forward block: closed form, midpoint form, LipSDP-Neuron
  (:func:`lipbound.numeric.blocks.constants.ffn_constants`); a gated block (SwiGLU, GeGLU) on the
  image of its norm: the closed form and the lifted SDP
  (:func:`lipbound.numeric.blocks.gated.gated_constants`); for a pre-norm block also the norm's gain
  folded into the block; its certified witness, and a witness of its residual step;
* ``norm`` -- a LayerNorm or RMSNorm: its global constant and the certified witness that attains it;
* ``layer`` -- the witness of a whole layer (every step of :mod:`.chain`);
* ``model`` -- the end-to-end witness of a stack in its input (``stream``) or context.

A self-attention task and a gated feed-forward task are split in two: the *core* reads the norm
before the branch only through its image ``{c + M u : ||u|| <= sqrt(d)}`` (gain, centre, width), which
does not depend on the norm's ``eps``: the certified bounds of the branch on that image (and the
lifted SDP with the gain folded in), its witness and the worst input found.  The rest reads ``eps``
and is cheap: the residual rule ``1 + L_F L_N`` (``L_N`` the norm's constant, ``eps^{-1/2}`` in the
folded rule) on the core's certified numbers, and the witness of the residual step.  The result
carries its ``core``; a task given the core of a model that differs only in its norms' ``eps``
skips it and returns exactly the numbers the whole task would (the core is a function of arrays
that did not change).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ...errors import AssumptionError, NotLipschitzError
from ...rigorous.value import CertifiedValue, not_certified
from ..attention import AttentionMap, unit_rows
from ..blocks.certify import best
from ..blocks.constants import (
    ffn_constants,
    folded_gated_sdp,
    pre_norm_ffn_constants,
    pre_norm_gated_constants,
    residual_constant,
)
from ..blocks.ffn import arrays
from ..blocks.gated import gated_constants
from ..blocks.norms import norm_constant
from ..certify import layer_bounds
from ..domains import DomainSpec, LayerNormOutputs, TokenBall
from ..model import GatedFeedForward, LayerNorm, load_weights
from ..witness.blocks import ffn_witness, gated_witness, norm_witness
from ..witness.starts import castin_input
from .chain import Step, chain_jacobian_norm, layer_steps, stack_steps

__all__ = ["WholeTask", "describe_task", "layer_norms", "plan_tasks", "run_task"]


class WholeTask(NamedTuple):
    """One task of the whole-model verification, in :func:`run_task`'s argument order (plain data: it
    travels to local processes and cluster workers as it is; a task that reuses its core is the tuple
    with the core appended, ``run_task``'s last argument)."""

    kind: str      # attention, ffn, norm, layer or model
    path: str      # the checkpoint, loaded in the process that runs the task
    block: str     # encoder or decoder
    layer: int     # -1: the stack's final norm, or the whole stack
    detail: str    # the attention kind, the norm's slot, or stream / context
    n: int
    m: int         # 0 when not used
    domain: str
    effort: int
    restarts: int
    iterations: int
    seed: int


def layer_norms(layer) -> tuple[str, ...]:
    """The norm slots of a layer, in the order of its steps (post: after each residual sum; pre: before
    each branch; sandwich: before and after each branch)."""
    if layer.placement == "post":
        return ("ln_out", "ffn_norm")
    if layer.placement == "sandwich":
        return ("ln_in", "ln_out", "ffn_norm", "ffn_out_norm")
    return ("ln_in",) + (("cross_norm",) if layer.cross is not None else ()) + ("ffn_norm",)


@functools.lru_cache(maxsize=2)   # a batch lists each checkpoint's tasks together; a decoder's copy is 1 GB
def _model(path: str):
    return load_weights(path)


def _values(values) -> list[dict]:
    return [{"name": v.name, "value": float(v.value), "certified": bool(v.certified)} for v in values]


def _image_points(norm, rng, shape) -> np.ndarray:
    """Points of the norm's image ``center + gamma z`` (``z`` mean zero for a LayerNorm, ``||z||`` uniform
    in ``(0.05, 0.99) sqrt(d)``), a batch of ``shape = (b, n)`` tokens."""
    z = rng.standard_normal(shape + (norm.d,))
    if norm.centred:
        z -= z.mean(axis=-1, keepdims=True)
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    z *= math.sqrt(norm.d) * rng.uniform(0.05, 0.99, shape + (1,))
    return norm.center + norm.gamma * z


def _image_domain(norm):
    """Where a norm's outputs lie, for the searches: a LayerNorm's image, or the ball about 0 that holds
    an RMSNorm's (radius ``max|gamma| sqrt(d)``: the domain its attention bound is taken on)."""
    return LayerNormOutputs(norm) if isinstance(norm, LayerNorm) else TokenBall(norm.radius_about_origin)


def _free_points(d: int, rng, shape) -> np.ndarray:
    """Points of ``R^d`` at scales from nearly constant tokens (where a LayerNorm stretches most)
    to large ones: a constant per token plus noise of scale ``10^k``, k from -4 to 1."""
    scales = 10.0 ** rng.integers(-4, 2, shape + (1,))
    return rng.standard_normal(shape + (1,)) + scales * rng.standard_normal(shape + (d,))


def _stream_points(model, block: str, layer: int, rng, shape):
    """Inputs of a layer: the image of the LayerNorm before it (post-LN), else all of R^d."""
    first = model.stack(block)[layer]
    if first.placement == "post" and first.ln_in is not None:
        return _image_points(first.ln_in, rng, shape), _image_domain(first.ln_in).tangent_directions
    return _free_points(model.hidden, rng, shape), None


def _context(model, rng, shape):
    norm = model.context_norm
    return _image_points(norm, rng, shape), _image_domain(norm).tangent_directions


def _chain_witness(steps, X, C, argument, tangent, iterations, seed) -> float:
    return float(np.max(chain_jacobian_norm(steps, X, C, argument=argument, tangent=tangent, iterations=iterations,
                                            seed=seed)[0]))


def _castin_starts(layer, n: int, heads: int = 3) -> np.ndarray:
    """Castin et al.'s input for the ``heads`` largest heads (``||A_h|| ||W_V^h||``), both signs,
    pulled into the image of the norm that feeds the layer (their construction of a large
    Jacobian, :func:`lipbound.numeric.witness.starts.castin_input`)."""
    norm, domain = layer.ln_in, _image_domain(layer.ln_in)
    sizes = [np.linalg.norm(h.A, 2) * np.linalg.norm(h.W_V, 2) for h in layer.heads]
    starts = []
    for index in np.argsort(sizes)[::-1][:heads]:
        head = layer.heads[index]
        tokens = castin_input(head.W_Q, head.W_K, norm.radius_about_center, n, literal=False)
        starts += [domain.retract(norm.center + tokens), domain.retract(norm.center - tokens)]
    return np.stack(starts)


#: ``||x||^2 / d`` in units of eps for the inputs of a pre-norm step that the norm stretches while its
#: output nears the edge of its image (``||N(x)|| = sqrt(kappa / (1 + kappa)) max-ish``, ``||DN|| = gamma /
#: sqrt((1 + kappa) eps)`` across x): the branch's worst points at the norm's steepest scales.
_NORM_SCALES = (0.25, 1.0, 4.0, 16.0, 64.0)


def _through_norm(norm, Y: np.ndarray) -> np.ndarray:
    """Inputs x (b * scales, n, d) with ``N(x)`` along ``Y`` (outputs of ``norm``, (b, n, d)), each token at
    ``||x||^2 / d = kappa eps`` for kappa in :data:`_NORM_SCALES`."""
    gamma = np.where(norm.gamma != 0, norm.gamma, 1.0)
    U = (Y - norm.center) / gamma
    if norm.centred:
        U = U - U.mean(axis=-1, keepdims=True)
    U = U / np.maximum(np.linalg.norm(U, axis=-1, keepdims=True), 1e-300)
    return np.concatenate([U * math.sqrt(kappa * norm.eps * norm.d) for kappa in _NORM_SCALES])


def _self_ascent(target, norm, X: np.ndarray, iterations: int, seed: int) -> tuple[float, np.ndarray]:
    """Ascent of the local Jacobian norm of self-attention over the image of ``norm``: at each of
    ``iterations`` steps, a few power iterations give the top singular pair ``(E, G)`` (tangent to
    the image), ``||J E||`` is recorded (a lower bound: X lies in the image), and X moves along the
    tangent part of ``grad_X <G, J(X) E>`` (:meth:`Linearization.curvature`, the gradient of the norm)
    and is pulled back into the image.  Counted, not timed."""
    domain = _image_domain(norm)
    engine = AttentionMap(target)
    rng = np.random.default_rng(seed)
    E = unit_rows(domain.tangent_directions(rng.standard_normal(X.shape)))
    step = 0.6 * norm.gamma_max * math.sqrt(norm.d)
    best, where = 0.0, X[:1]
    for _ in range(iterations):
        lin = engine.linearize(X)
        for _ in range(4):
            E = unit_rows(domain.tangent_directions(lin.vjp(lin.jvp(E))))
        JE = lin.jvp(E)
        sigma = np.sqrt(np.sum(JE * JE, axis=(1, 2)))
        if float(np.max(sigma)) > best:
            best, where = float(np.max(sigma)), X[int(np.argmax(sigma))][None]
        grad = domain.tangent_directions(lin.curvature(E, JE / sigma[:, None, None]))
        X = domain.retract(X + step * unit_rows(grad))
    return best, where


def _attention_core(model, block, index, n, domain_spec, restarts, iterations, seed) -> dict:
    """The part of a self-attention task that reads the norm before it only through its image (gain,
    centre, width; never its ``eps``): the certified bounds on that image, the witness and the worst
    input the ascent found (plain data: a later task with another ``eps`` starts from it)."""
    layer = model.stack(block)[index]
    domain = DomainSpec.parse(domain_spec).resolve(layer.ln_in, f"{block} layer {index}")
    bounds = _attention_bounds(layer, domain, n)
    image = _image_domain(layer.ln_in)
    X = _image_points(layer.ln_in, np.random.default_rng(seed), (restarts, n))
    inner = [Step("attention", layer.as_layer(residual=False), None, False, "")]
    starts = np.concatenate([X, _castin_starts(layer, n)])
    ascent, worst = _self_ascent(inner[0].part, layer.ln_in, starts, iterations, seed)
    witness = max(_chain_witness(inner, X, None, "stream", image.tangent_directions, iterations, seed), ascent)
    return {"bounds": [b.to_json() for b in bounds], "witness": witness, "worst": worst.tolist()}


def _attention_residual(model, block, index, n, restarts, iterations, seed, core) -> dict:
    """The rest of a self-attention task, which reads the norm's ``eps``: the residual step's witness
    and, before a pre-norm or sandwich branch, the residual rule on the core's bounds."""
    layer = model.stack(block)[index]
    bounds = [CertifiedValue.from_json(b) for b in core["bounds"]]
    rng = np.random.default_rng(seed)
    _image_points(layer.ln_in, rng, (restarts, n))   # the core's draws: the residual's points come after them
    residual = layer_steps(layer, block)[:1]
    Xr, tangent = _stream_points(model, block, index, rng, (restarts, n))
    residual_witness = _chain_witness(residual, Xr, None, "stream", tangent, iterations, seed)
    if layer.placement != "post":   # the attention's worst input, reached through the norm's steepest scales
        worst = np.asarray(core["worst"], dtype=float)
        residual_witness = max(residual_witness, _chain_witness(residual, _through_norm(layer.ln_in, worst), None,
                                                                "stream", None, iterations, seed))
    result = {"upper": _values_with_reasons(bounds), "witness": core["witness"], "residual_witness": residual_witness,
              "core": core}
    if layer.placement != "post":
        result.update(_branch_rules(layer.ln_in, bounds, layer.attn_scale,
                                    layer.ln_out if layer.placement == "sandwich" else None))
    return result


def _attention(model, block, index, kind, n, m, domain_spec, restarts, iterations, seed, core=None) -> dict:
    if not kind.startswith("cross"):
        n = m if block == "decoder" else n  # a decoder's stream has the m query tokens
        if core is None:
            core = _attention_core(model, block, index, n, domain_spec, restarts, iterations, seed)
        return _attention_residual(model, block, index, n, restarts, iterations, seed, core)
    layer = model.stack(block)[index]
    rng = np.random.default_rng(seed)
    spec = DomainSpec.parse(domain_spec)
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


def _attention_bounds(layer, domain, n) -> list[CertifiedValue]:
    """The certified bounds of a self-attention layer as the theorem dispatch gives them, or one "refused"
    value with the reason when it covers no theorem for its heads on this domain (the whole-model bound is
    then not certified, and says why)."""
    try:
        return layer_bounds(layer, domain, n)
    except (AssumptionError, NotLipschitzError) as refusal:
        return [not_certified("refused", "lipbound.numeric.certify.layer_bounds", str(refusal))]


def _values_with_reasons(values) -> list[dict]:
    """Plain values, each uncertified one with its reason."""
    values = list(values)
    return [entry if value.certified else {**entry, "reason": value.reason}
            for entry, value in zip(_values(values), values)]


def _branch_rules(norm, inner: list[CertifiedValue], scale, after_norm) -> dict:
    """The residual rule ``x + a * N'(F(N(x)))`` on the best and on the textbook (first) constant of F:
    ``{"residual_upper", "residual_textbook"}`` (lists of plain values)."""
    L_N = norm_constant(norm)
    after = None if after_norm is None else norm_constant(after_norm)

    def rule(value: CertifiedValue | None, name: str) -> CertifiedValue:
        if value is None or not value.certified:
            return not_certified(name, "lipbound theorem norm_residual",
                                 "the branch has no certified constant" + (f" ({value.reason})" if value else ""))
        return residual_constant("pre", L_N, value, scale=scale, after=after).renamed(name)

    return {"residual_upper": _values_with_reasons([rule(best(inner), "residual rule")]),
            "residual_textbook": _values_with_reasons([rule(inner[0], "textbook")])}


def _gated_core(model, block, index, effort, restarts, iterations, seed) -> dict:
    """The part of a gated block's task that reads its norm only through the image (never ``eps``): its
    constants on the image, the lifted SDP of the block with the gain folded in, and its certified
    witness (plain data: a later task with another ``eps`` reuses them).  ``effort // 2`` (at least 8)
    evaluations of the lifted SDP's objective."""
    layer = model.stack(block)[index]
    ffn, norm = layer.ffn, layer.ffn_norm
    evaluations = max(8, effort // 2)
    values = gated_constants(ffn, norm, effort=evaluations)
    folded = folded_gated_sdp(norm, ffn, effort=evaluations)
    witness = gated_witness(ffn, norm, seed=seed, starts=max(restarts, 2), steps=iterations)
    return {"values": {key: value.to_json() for key, value in values.items()}, "folded": folded.to_json(),
            "witness": float(witness.certified), "witness_x": witness.x.tolist()}


def _gated(model, block, index, effort, restarts, iterations, seed, core=None) -> dict:
    """A gated feed-forward block on the image of its norm (module docstring): the core
    (:func:`_gated_core`, or the one given) and the parts that read the norm's ``eps``: the residual
    rules and the residual step's witness."""
    layer = model.stack(block)[index]
    ffn, norm = layer.ffn, layer.ffn_norm
    if core is None:
        core = _gated_core(model, block, index, effort, restarts, iterations, seed)
    values = {key: CertifiedValue.from_json(value) for key, value in core["values"].items()}
    result = {"upper": _values_with_reasons([v for k, v in values.items() if k != "best"])}
    sandwich = layer.ffn_out_norm if layer.placement == "sandwich" else None
    after = None if sandwich is None else norm_constant(sandwich)
    residual = pre_norm_gated_constants(norm, ffn, effort=max(8, effort // 2), inner=values["best"],
                                        scale=layer.ffn_scale, after=after,
                                        folded=CertifiedValue.from_json(core["folded"]))
    result["residual_upper"] = _values_with_reasons([v for k, v in residual.items() if k != "best"])
    result["residual_textbook"] = _branch_rules(norm, [values["closed form"]], layer.ffn_scale,
                                                sandwich)["residual_textbook"]
    result["witness"] = core["witness"]
    step = [s for s in layer_steps(layer, block) if s.kind == "ffn"]
    X = _free_points(model.hidden, np.random.default_rng(seed), (restarts, 1))
    X = np.concatenate([X, _through_norm(norm, np.asarray(core["witness_x"], dtype=float)[None, None])])
    result["residual_witness"] = _chain_witness(step, X, None, "stream", None, iterations, seed)
    result["core"] = core
    return result


def _ffn(model, block, index, effort, restarts, iterations, seed, core=None) -> dict:
    layer = model.stack(block)[index]
    if isinstance(layer.ffn, GatedFeedForward):
        return _gated(model, block, index, effort, restarts, iterations, seed, core)
    w = arrays(layer.ffn)
    values = ffn_constants(w["W_1"], w["W_2"], w["act"], effort=effort)
    upper = _values(v for k, v in values.items() if k != "best")
    result = {"upper": upper}
    if layer.placement == "pre" and layer.ffn_scale is None:
        pre = pre_norm_ffn_constants(layer.ffn_norm, w["W_1"], w["W_2"], w["act"], effort=effort,
                                     inner=values["best"])
        result["residual_upper"] = _values([pre["composed"], pre["folded"]])
        result["residual_textbook"] = _branch_rules(layer.ffn_norm, [values["closed form"]], None, None)[
            "residual_textbook"]
    elif layer.placement != "post":   # LayerScale or a sandwich norm: the rule with a and N'
        result.update(_branch_rules(layer.ffn_norm, [values["closed form"], values["best"]], layer.ffn_scale,
                                    layer.ffn_out_norm if layer.placement == "sandwich" else None))
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
    return {"upper": _values([value]), "witness": float(norm_witness(norm).certified), "eps": float(norm.eps),
            "kind": norm.kind}


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
             restarts: int, iterations: int, seed: int, core: dict | None = None) -> dict:
    """Run one task (module docstring) and return plain data; ``m`` is 0 when not used.  A self-attention
    or gated feed-forward task returns its ``core`` too (module docstring): passed back as ``core`` to
    the same task of a model that differs only in its norms' ``eps``, it is reused instead of recomputed,
    with the same numbers."""
    model = _model(path)
    m = m or n
    if kind == "attention":
        return _attention(model, block, layer, detail, n, m, domain, restarts, iterations, seed, core)
    if kind == "ffn":
        return _ffn(model, block, layer, effort, restarts, iterations, seed, core)
    if kind == "norm":
        return _norm(model, block, layer, detail)
    if kind == "layer":
        return _layer(model, block, layer, n, m, restarts, iterations, seed)
    if kind == "model":
        return _whole(model, block, detail, n, m, restarts, iterations, seed)
    raise ValueError(f"unknown task kind {kind!r}")


def plan_tasks(model, *, n: int, m: int | None = None, domain: str = "layernorm", effort: int = 30,
               restarts: int = 4, iterations: int = 30, seed: int = 0) -> list[WholeTask]:
    """Every task of the whole-model verification of ``model`` (loaded from ``model.path``)."""
    spec = DomainSpec.parse(domain)
    domain_text = spec.kind if spec.kind != "radius" else repr(spec.radius)  # plain data for the task
    common = (n, m or 0, domain_text, effort, restarts, iterations, seed)
    tasks: list[WholeTask] = []

    def add(kind: str, block: str, layer: int, detail: str) -> None:
        tasks.append(WholeTask(kind, model.path, block, layer, detail, *common))
    for block in model.blocks:
        for index in sorted(model.stack(block)):
            layer = model.stack(block)[index]
            layer_steps(layer, block)  # a clear error on a partial checkpoint, before any work
            if isinstance(layer.ffn, GatedFeedForward) and layer.placement == "post":
                raise AssumptionError(f"{block} layer {index}",
                                      "a pre-norm or sandwich layer around a gated block (it is "
                                      "Lipschitz only on bounded sets: the image of the norm before it)",
                                      "a post-norm layer", "lipbound bounds gated blocks read through a norm")
            for kind in [layer.self_kind] + (["cross-queries", "cross-context"] if layer.cross is not None else []):
                add("attention", block, index, kind)
            add("ffn", block, index, "")
            for name in layer_norms(layer):
                add("norm", block, index, name)
            add("layer", block, index, "")
        if model.final_norm_of(block) is not None:
            add("norm", block, -1, "final")
        add("model", block, -1, "stream")
        if block == "decoder" and model.context_norm is not None:
            add("model", block, -1, "context")
    return tasks


def describe_task(task: tuple) -> str:
    """What a task computes, for progress lines: ``"ffn of encoder layer 3"``, ``"witness of the whole decoder
    layer 2"``, ``"end-to-end witness of the decoder in its context"``."""
    kind, _, block, layer, detail = task[:5]   # a WholeTask, or one with its core appended
    if kind == "model":
        return f"end-to-end witness of the {block} in its {'input' if detail == 'stream' else 'context'}"
    where = f"the {block}'s final norm" if layer < 0 else f"{block} layer {layer}"
    if kind == "layer":
        return f"witness of the whole {where}"
    if layer < 0:
        return where
    return f"{kind}{' ' + detail if detail else ''} of {where}"
