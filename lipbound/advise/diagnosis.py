"""Diagnosis: where a model's irregularity comes from, by the existing certified routes.

* **The whole-model certificate** (:func:`certify_whole`, :class:`WholePlan`): the tasks of
  ``lipbound verify --whole`` (:mod:`lipbound.numeric.whole.tasks`), composed by its report.  An edited
  model reruns only the tasks whose inputs changed (:func:`task_fingerprint`: the arrays each task
  reads, the end-to-end witness those of the whole stack); the others' results are the original's,
  which the same arrays give.  A pre-norm attention or gated feed-forward task whose norms changed only
  their ``eps`` reruns only its rest, with the original's core (``task_fingerprint(..., eps=False)``;
  the core reads the norm's image, not ``eps``): a norm-eps edit of SmolLM2 costs seconds, not the
  whole model's time again.
* **Shares of log10 of the bound** (:func:`component_shares`): a post-LN stack's bound is the product
  of its rows ``LN_out``, ``1 + L_A``, ``LN_ffn``, ``1 + L_F`` per layer (a pre-LN stack's: its
  residual rows) and the final norm; each row's share is ``log10(row) / sum log10(rows)``.
* **Heads** (:func:`head_rows`): each head's certified constants and witness by ``verify``'s job
  (:func:`lipbound.numeric.verification.verify_job`) on the image of the LayerNorm feeding it.
* **Local constants** (:func:`local_constants`): ``L(eps)`` of each whole layer at the hidden states of
  real sentences (:func:`lipbound.local.curve.lipschitz_curve`), median over the sentences; their
  product over layers and each layer's share of its log10 (:func:`local_product`).
* **Measured movement** (:func:`movement_shares`): real token edits (one word replaced) pushed through
  the one float engine step by step; after each step the exact Wasserstein-1 distance between the
  token measures of the sentence and of the edit, ``W1(mu_Y, mu_Y')`` with ``mu_Y = (1/n) sum_i
  delta_{y_i}`` (:func:`lipbound.measures.wasserstein.w1`, the assignment problem), per layer; each
  step's amplification ``a = W1(mu_Y, mu_Y') / W1(mu_X, mu_X')`` (its output over its input) and its
  share ``log10(a) / sum of the positive log10(a)`` of all steps (a contracting step has a negative
  share), medians over edits.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import AssumptionError
from ..local.curve import lipschitz_curve
from ..measures.empirical import EmpiricalMeasure
from ..measures.wasserstein import w1
from ..numeric.domains import DomainSpec
from ..numeric.model import Model, attention_arrays, load_weights
from ..numeric.scaleout import TaskFailed, run_all
from ..numeric.verification import verify_job
from ..numeric.whole import WholeReport, WholeTask, describe_task, plan_tasks, run_task
from ..numeric.whole.chain import hidden_states, layer_steps
from ..numeric.witness import Witness
from ..rigorous.intervals import upper_product
from ..rigorous.value import CertifiedValue

__all__ = [
    "NORM_SLOTS",
    "Movement",
    "WholeCertificate",
    "WholePlan",
    "certify_whole",
    "component_shares",
    "head_row",
    "head_rows",
    "head_tasks",
    "local_constants",
    "local_point",
    "local_product",
    "local_rows",
    "movement_shares",
    "step_states",
    "task_fingerprint",
]

NORM_SLOTS = ("ln_in", "ln_out", "ffn_norm", "ffn_out_norm", "cross_norm")


def _digest(*parts) -> str:
    h = hashlib.sha1()
    for part in parts:
        if part is None:
            h.update(b"none")
        elif isinstance(part, dict):
            for key in sorted(part):
                h.update(key.encode())
                h.update(np.ascontiguousarray(part[key]).tobytes())
        else:
            h.update(np.ascontiguousarray(part).tobytes())
    return h.hexdigest()


def _norm_arrays(norm, eps: bool = True):
    if norm is None:
        return None
    arrays = {"kind": np.array(norm.kind), "gamma": norm.gamma, "center": np.asarray(norm.center)}
    if eps:
        arrays["eps"] = np.array(float(norm.eps))
    return arrays


def _ffn_arrays(ffn):
    if ffn is None:
        return None
    return {name: np.asarray(getattr(ffn, name)) for name in ("W_1", "b_1", "W_2", "b_2", "W_gate", "W_up", "W_down",
                                                               "b_gate", "b_up", "b_down", "act")
            if getattr(ffn, name, None) is not None}


def _without_names(arrays: dict) -> dict:
    """A layer's arrays without the heads' names (labels for reports: a checkpoint read by another
    loader names its heads otherwise, with the same numbers)."""
    return {key: value for key, value in arrays.items() if key != "names"}


def _layer_digest(model: Model, layer) -> np.ndarray:
    """Every array of a layer (norms with their eps, attention, cross-attention, feed-forward, scales)."""
    cross = _without_names(attention_arrays(layer.cross)) if layer.cross is not None else None
    digest = _digest(_without_names(attention_arrays(layer.attention)), cross, _ffn_arrays(layer.ffn),
                     *[_norm_arrays(getattr(layer, slot)) for slot in NORM_SLOTS], layer.attn_scale,
                     layer.ffn_scale, np.array(layer.placement))
    return np.frombuffer(digest.encode(), dtype=np.uint8)


def task_fingerprint(model: Model, task: WholeTask, eps: bool = True) -> str:
    """A digest of every array ``task`` reads (the word embeddings are read by none: every task starts
    at the image of the first LayerNorm).  ``eps=False``: of what the task's core reads
    (:mod:`lipbound.numeric.whole.tasks`: the norms through their images, never their ``eps``)."""
    kind, block, index, detail = task.kind, task.block, task.layer, task.detail
    options = repr(task[5:])
    if kind == "model":   # the end-to-end witness reads every layer of the stack and the final norm
        return _digest(*(_layer_digest(model, layer) for layer in model.stack(block).values()),
                       _norm_arrays(model.final_norm_of(block)), _norm_arrays(model.context_norm),
                       np.array(detail), np.array(options))
    if index < 0:
        return _digest(_norm_arrays(model.final_norm_of(block)), np.array(options))
    layer = model.stack(block)[index]
    norms = [_norm_arrays(getattr(layer, slot)) for slot in NORM_SLOTS]
    attention = _without_names(attention_arrays(layer.attention))
    if kind == "norm":
        return _digest(_norm_arrays(getattr(layer, detail)), np.array(options))
    # A post-LN attention or feed-forward task reads its LayerNorms only through their images, the
    # points and tangents of beta + gamma z (||z|| <= sqrt(d)), which do not involve eps, and its residual
    # step holds no norm; a pre-LN one reads the norm's eps (the folded step).
    shapes = norms if layer.placement != "post" and eps else [_norm_arrays(getattr(layer, slot), eps=False)
                                                              for slot in NORM_SLOTS]
    if kind == "ffn":
        return _digest(_ffn_arrays(layer.ffn), *shapes, np.array(layer.placement), np.array(options))
    cross = _without_names(attention_arrays(layer.cross)) if layer.cross is not None else None
    context = _norm_arrays(model.context_norm) if layer.cross is not None else None
    scales = [layer.attn_scale, layer.ffn_scale]
    if kind == "attention":
        return _digest(attention, cross, context, *shapes, *scales, np.array(layer.placement), np.array(options))
    return _digest(attention, cross, context, _ffn_arrays(layer.ffn), *norms, *scales, np.array(layer.placement),
                   np.array(options))


@dataclass
class WholeCertificate:
    """The whole-model report with the raw result of every task, keyed ``(kind, block, layer, detail)``."""

    report: WholeReport
    results: dict
    fingerprints: dict
    rerun: int
    seconds: float
    core_prints: dict = field(default_factory=dict)
    cores_reused: int = 0

    @property
    def bound(self) -> dict:
        return self.report.model_bound

    @property
    def log10(self) -> float:
        """``log10`` of the certified whole-model bound (the report's ``log10_value``: finite when the
        bound itself overflows a float, as a deep decoder's does)."""
        return float(self.bound["log10_value"])

    def layer_row(self, index: int, block: str | None = None) -> dict | None:
        """The row of layer ``index`` of ``block`` (default: the stack the bound is for)."""
        block = block or self.bound.get("block", "encoder")
        return next((r for r in self.report.components if r["component"] == "layer" and r["layer"] == index
                     and r["block"] == block), None)


class WholePlan:
    """The tasks of ``verify --whole`` for ``model`` with the results ``reuse`` already holds filled in
    (same fingerprint); :attr:`todo` the tasks left to run, :meth:`certificate` the composed report.
    A task whose core (:mod:`lipbound.numeric.whole.tasks`) read the same arrays as ``reuse``'s (a
    pre-norm model whose norms changed only their ``eps``) runs with that core: only its cheap rest."""

    def __init__(self, model: Model, *, n: int = 8, restarts: int = 4, iterations: int = 30, effort: int = 30,
                 seed: int = 0, reuse: WholeCertificate | None = None):
        self.model, self.n = model, n
        self.tasks = plan_tasks(model, n=n, domain="layernorm", effort=effort, restarts=restarts,
                                iterations=iterations, seed=seed)
        self.keys = [(t.kind, t.block, t.layer, t.detail) for t in self.tasks]
        self.prints = {key: task_fingerprint(model, task) for key, task in zip(self.keys, self.tasks)}
        self.core_prints = {key: task_fingerprint(model, task, eps=False) for key, task in zip(self.keys, self.tasks)
                            if task.kind in ("attention", "ffn")}   # the kinds with a core
        self.results: list = [None] * len(self.tasks)
        self.positions, self.cores = [], {}
        for position, key in enumerate(self.keys):
            if reuse is not None and reuse.fingerprints.get(key) == self.prints[key]:
                self.results[position] = reuse.results[key]
                continue
            self.positions.append(position)
            before = reuse.results.get(key) if reuse is not None else None
            core = self.core_prints.get(key)
            if before and "core" in before and core is not None and reuse.core_prints.get(key) == core:
                self.cores[position] = before["core"]

    @property
    def todo(self) -> list[tuple]:
        """The tasks left to run, each with the core it reuses appended (plain data)."""
        return [self.tasks[i] + ((self.cores[i],) if i in self.cores else ()) for i in self.positions]

    def describe(self, index: int) -> str:
        return describe_task(self.tasks[self.positions[index]])

    def certificate(self, results, seconds: float) -> WholeCertificate:
        """The certificate once ``results`` (those of :attr:`todo`, in order) are in."""
        for position, result in zip(self.positions, results):
            self.results[position] = result
        report = WholeReport.build(self.model, self.tasks, self.results, self.n, None, seconds)
        return WholeCertificate(report, dict(zip(self.keys, self.results)), self.prints, len(self.positions), seconds,
                                self.core_prints, len(self.cores))


def certify_whole(model: Model, *, n: int = 8, restarts: int = 4, iterations: int = 30, effort: int = 30,
                  seed: int = 0, jobs: int = 1, reuse: WholeCertificate | None = None,
                  progress=None) -> WholeCertificate:
    """The whole-model certificate of ``model`` (loaded from a path), rerunning only the tasks whose
    fingerprint differs from ``reuse``'s (module docstring).  ``progress(done, total, text)``.  The
    defaults are ``verify --whole``'s, so that ``lipbound verify CHECKPOINT --whole`` prints the same
    numbers."""
    plan = WholePlan(model, n=n, restarts=restarts, iterations=iterations, effort=effort, seed=seed, reuse=reuse)
    started = time.perf_counter()
    if progress is not None:
        progress(0, len(plan.positions), "started")

    def arrived(done, total, index, result):
        if progress is not None:
            progress(done, total, plan.describe(index))

    try:
        results = run_all(run_task, plan.todo, jobs=jobs, progress=arrived)
    except TaskFailed as failure:
        raise failure.error from None
    return plan.certificate(results, time.perf_counter() - started)


def component_shares(report: WholeReport, block: str | None = None) -> list[dict]:
    """The rows whose product is the end-to-end bound, each with its share of log10 of the bound
    (``block`` default: the stack the bound is for)."""
    block = block or report.model_bound.get("block", "encoder")
    post = report.image_input.get(block, False)
    factors = [r for r in report.components if r["block"] == block and
               (r["component"] == "residual" or (r["component"] == "norm" and (post or r["layer"] is None)))]
    logs = [math.log10(r["best_upper"]) if r["best_upper"] > 0 and math.isfinite(r["best_upper"]) else 0.0
            for r in factors]
    total = sum(logs) or 1.0
    out = []
    for row, value in zip(factors, logs):
        what = "norm" if row["component"] == "norm" else ("attention" if "attention" in row["part"] else "ffn")
        out.append({"layer": row["layer"], "component": what, "part": row["part"], "bound": row["best_upper"],
                    "witness": row["witness"], "log10": value, "share": value / total})
    return out


def head_tasks(model: Model, heads, *, n: int = 8, budget: float = 0.5, seed: int = 0) -> list[tuple]:
    """``verify``'s jobs (:func:`lipbound.numeric.verification.verify_job`) for the pairs ``(layer, head)``
    on the image of the norm feeding each layer (a post-LN encoder's LayerNorm, a pre-norm decoder's
    ``ln_in``: the head reads it in both)."""
    spec = DomainSpec.parse("layernorm")
    origin = (model.name, model.path, model.sha256)
    block = model.blocks[0]
    return [(attention_arrays(model.layers[i].heads[h]), spec.resolve(model.layers[i].ln_in, f"layer {i}").plain(),
             None, n, None, "self", "self", False, budget, seed, origin, block, i, h) for i, h in heads]


def head_row(layer: int, head: int, result: dict) -> dict:
    """The row of one head from its job's result: the best certified bound and the witness."""
    bounds = [CertifiedValue.from_json(b) for b in result["bounds"]]
    best = min((b for b in bounds if b.certified and math.isfinite(float(b.value))),
               key=lambda b: float(b.value), default=None)
    return {"layer": layer, "head": head, "bound": None if best is None else float(best.value),
            "method": None if best is None else best.name, "certified": best is not None,
            "witness": float(Witness.from_arrays(result["witness"]).value), "refusal": None if best else
            "; ".join(f"{b.name}: {b.provenance}" for b in bounds)}


def head_rows(model: Model, *, n: int = 8, budget: float = 0.5, seed: int = 0, heads=None, jobs: int = 1,
              progress=None) -> list[dict]:
    """Certified constants and witness of every head (or of ``heads``, pairs ``(layer, head)``) by
    ``verify``'s job on the image of the LayerNorm feeding its layer, run as ``verify`` runs them
    (:func:`lipbound.numeric.scaleout.run_all`, ``jobs`` local processes)."""
    chosen = heads if heads is not None else [(i, h) for i in sorted(model.layers) for h in range(model.num_heads)]

    def arrived(done, total, index, result):
        if progress is not None:
            progress(done, total, f"head {chosen[index][1]} of layer {chosen[index][0]}")

    arrived(0, len(chosen), 0, None)
    try:
        results = run_all(verify_job, head_tasks(model, chosen, n=n, budget=budget, seed=seed), jobs=jobs,
                          progress=arrived)
    except TaskFailed as failure:
        raise failure.error from None
    return [head_row(i, h, result) for (i, h), result in zip(chosen, results)]


def local_point(path: str, ids, layer: int, eps_fraction: float) -> dict:
    """``L(eps)`` of the whole layer ``layer`` (``kind="block"``: attention, feed-forward block, their
    residuals and LayerNorms; ``lipbound local --map block``) of the model at ``path`` at the hidden
    states of the sentence ``ids``, ``eps`` = ``eps_fraction`` times the radius of the LayerNorm feeding it (plain data:
    a task of :func:`lipbound.numeric.scaleout.run_all`)."""
    model = load_weights(path)
    X = hidden_states(model, list(ids))[layer]
    radius = model.layers[layer].ln_in.radius_about_center
    point = lipschitz_curve(model, X, kind="block", layer=layer, eps=[eps_fraction * radius]).points[0]
    return {"certified": float(point.certified), "witness": float(point.witness), "verdict": point.verdict}


def local_rows(layers, sentences: int, points, eps_fraction: float) -> list[dict]:
    """Per layer the median over sentences of :func:`local_point`'s results (``points`` layer-major)."""
    rows = []
    for k, index in enumerate(layers):
        mine = points[k * sentences:(k + 1) * sentences]
        certified = [p["certified"] for p in mine]
        rows.append({"layer": index, "eps_fraction": eps_fraction, "certified": float(np.median(certified)),
                     "witness": float(np.median([p["witness"] for p in mine])), "sentences": sentences,
                     "per_sentence": certified, "all_certified": all(math.isfinite(c) for c in certified),
                     "verdicts": [p["verdict"] for p in mine]})
    return rows


def local_constants(model: Model, ids_list, *, eps_fraction: float = 1e-3, layers=None, jobs: int = 1,
                    progress=None) -> list[dict]:
    """``L(eps)`` of each whole layer at the hidden states of each sentence, ``eps`` a fraction of the
    radius of the LayerNorm feeding it; per layer the median over sentences of the certified value
    and of the witness (the model is read from ``model.path`` in each task)."""
    if not model.path:
        raise AssumptionError("model", "a model read from a checkpoint (each task reads it from its path)",
                              "a model without a path", "write it first (advise.checkpoint.write_and_reload)")
    chosen = sorted(model.layers) if layers is None else list(layers)
    tasks = [(model.path, tuple(int(t) for t in ids), index, eps_fraction) for index in chosen for ids in ids_list]

    def arrived(done, total, index, result):
        if progress is not None:
            progress(done, total, f"L(eps) of layer {tasks[index][2]}")

    arrived(0, len(tasks), 0, None)
    try:
        points = run_all(local_point, tasks, jobs=jobs, progress=arrived)
    except TaskFailed as failure:
        raise failure.error from None
    return local_rows(chosen, len(ids_list), points, eps_fraction)


def local_product(rows: list[dict]) -> dict | None:
    """The local whole-model certificate advise reports: per sentence the product over layers of the
    certified ``L_l(eps R_l)`` (:func:`local_rows`' ``per_sentence``), rounded up, and its median over
    sentences; each layer's share of its log10.  A product of per-layer local constants, each at its
    own radius about the sentence's hidden states -- not a composed certificate of the stack at one
    radius (``lipschitz_curve(kind="stack")`` is that; advise does not run it), so the output names
    its source."""
    if not rows or not all(r["all_certified"] for r in rows):
        return None
    products = [upper_product(*values) for values in zip(*(r["per_sentence"] for r in rows))]
    logs = [math.log10(r["certified"]) for r in rows]
    total = sum(logs) or 1.0
    return {"source": "product over layers of the certified local constants L_l(eps R_l) of each layer",
            "eps_fraction": rows[0]["eps_fraction"], "value": float(np.median(products)), "per_sentence": products,
            "shares": [{"layer": r["layer"], "certified": r["certified"], "log10": value, "share": value / total}
                       for r, value in zip(rows, logs)]}


def _step_name(step) -> str:
    return {"attention": "attention", "cross": "attention", "ffn": "ffn", "norm": "norm"}[step.kind]


@dataclass
class Movement:
    """Per step of the model (layer, component), the median W1 amplification of real edits; the median
    W1 of the edits at the input of layer 0 and after each layer (``w1_per_layer``, layers + 1)."""

    steps: list = field(default_factory=list)
    total: float = 1.0
    edits: int = 0
    w1_per_layer: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"steps": self.steps, "total_amplification": self.total, "edits": self.edits,
                "distance": "W1 of the token measures", "w1_per_layer": self.w1_per_layer}


def step_states(model: Model, X: np.ndarray):
    """Run a batch of embedded sentences ``X`` (b, n, d) through every step of the model (the one
    float engine); yields ``(layer, component, state after the step)``."""
    block = model.blocks[0]
    for index in sorted(model.layers):
        for step in layer_steps(model.layers[index], block):
            X = step.linearize(X, None).F
            yield index, _step_name(step), X


def _w1(X: np.ndarray, Y: np.ndarray) -> float:
    """Exact W1 between the uniform token measures of ``X`` and ``Y`` (n, d)."""
    return w1(EmpiricalMeasure.uniform(X), EmpiricalMeasure.uniform(Y))


def movement_shares(model: Model, pairs) -> Movement:
    """Push pairs ``(ids, edited ids)`` of equal length through the model's steps and measure the W1
    distance of their token measures after each step (module docstring)."""
    rows, totals, names, layers = [], [], [], []
    for ids, edited in pairs:
        X = np.stack([model.embeddings(ids), model.embeddings(edited)]).astype(float)
        distances = [_w1(X[0], X[1])]
        names = []
        for index, name, Y in step_states(model, X):
            distances.append(_w1(Y[0], Y[1]))
            names.append((index, name))
        distances = np.maximum(np.array(distances), 1e-300)
        rows.append(distances[1:] / distances[:-1])
        totals.append(distances[-1] / distances[0])
        ends = [s + 1 for s, (index, _) in enumerate(names) if s + 1 == len(names) or names[s + 1][0] != index]
        layers.append([distances[0]] + [distances[e] for e in ends])
    ratios, totals, layers = np.array(rows), np.array(totals), np.array(layers)
    logs = np.log10(ratios)
    expansion = np.sum(np.maximum(logs, 0.0), axis=1)
    shares = logs / np.where(expansion > 0, expansion, 1.0)[:, None]
    out = Movement(total=float(np.median(totals)), edits=len(pairs),
                   w1_per_layer=[float(v) for v in np.median(layers, axis=0)])
    for s, (index, name) in enumerate(names):
        out.steps.append({"layer": index, "component": name, "amplification": float(np.median(ratios[:, s])),
                          "share": float(np.median(shares[:, s]))})
    return out
