"""``advise``: diagnose a sentence encoder or a decoder, propose interventions, certify and measure each.

:func:`check_inputs` reads and checks everything before any work (model folder or GGUF file with its
tokenizer, feed-forward blocks and norms; text; positions; output folder); :func:`advise` then

1. certifies the original end to end (the tasks of :class:`.diagnosis.WholePlan`) and every head
   (:func:`.diagnosis.head_tasks`) and takes the local constants of every layer on the shortest
   sentences (:func:`.diagnosis.local_point`): one batch of independent tasks on ``jobs`` processes
   (:mod:`.batch`); then the measured movement of real one-word edits (a decoder's local constants
   are off by default: one whole-layer L(eps) of SmolLM2 ran over ten CPU minutes);
2. measures the regularity mismatch of substitutions at the chosen positions (:mod:`.mismatch`);
3. builds the interventions (:mod:`.interventions`) on the least regular head and layer, the
   norm epsilon and the most irregular tokens, fits their parameters on the text (the norm epsilon
   and a decoder's temperature of every head: the strongest of a grid whose function value, measured
   on the edited copy in memory, keeps the floor), writes each
   edited checkpoint (:mod:`.checkpoint`), reads it back and measures its functional cost
   (:mod:`.function`: sentence cosine for an encoder, next-token agreement and perplexity for a
   decoder); then certifies every edited model by the same routes in a second batch, in
   which only the tasks whose arrays changed run again (the head's job and the layer's local
   constants of a head edit too), with an ETA from the diagnosis' task times.

A decoder (pre-norm RMSNorm layers, SwiGLU, causal rotary heads with grouped keys and values: the
Llama family, SmolLM2's GGUF included) gets the edits that keep its architecture: temperature of
the least regular query head (exact: every offset matrix ``W_Q R(Delta theta) W_K^T`` scales with
``W_Q``), the rotary cap of that head (its ``W_Q`` alone, the group's keys untouched), its removal
(its block of ``W_O``; the group's keys and values serve the other heads), the same temperature on
every head of the least regular layer, a fitted temperature on every head of every layer, the rotary
cap of every layer's heads at that layer's median, the RMSNorm epsilon and the embeddings of the
irregular tokens.  QK-norm and tied L2 scores would drop the rotary positions and are not proposed
for a decoder.  A one-head edit moves the whole-model bound little: each layer's factor
``1 + L_A L_N`` is dominated by all its heads together.

A norm-eps edit of a pre-norm model reruns only the cheap part of each attention and feed-forward
task (:class:`.diagnosis.WholePlan`: the core on the norm's image does not read ``eps``).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np

from ..errors import AssumptionError, LipboundError, OutputError, WeightsError
from ..measures.bert import default_model_dir
from ..measures.edits import edited_ids
from ..numeric.model import load_tokenizer, load_weights
from ..numeric.model.components import FeedForward, GatedFeedForward
from ..numeric.whole import describe_task
from ..numeric.whole.chain import hidden_states
from .batch import run_batch
from .checkpoint import llama_writable, write_and_reload
from .diagnosis import (
    WholePlan,
    component_shares,
    head_row,
    head_tasks,
    local_rows,
    movement_shares,
)
from .function import (
    bundled_sentences,
    function_cost,
    function_reference,
    read_sentences,
)
from .interventions import (
    LayerRotaryCap,
    LayerTemperature,
    NormEpsilon,
    QKNormGain,
    RecentreEmbeddings,
    RemoveHead,
    RotaryCap,
    SpectralCap,
    Temperature,
    TiedL2,
    qk_spectrum,
    rotary_bound,
)
from .mismatch import token_counts, token_mismatch, word_ids, word_positions
from .report import Advice, InterventionResult

__all__ = ["DECODER_EPS_GRID", "DEFAULTS", "EPS_GRID", "FLOORS", "TEMPERATURE_GRID", "Inputs", "StageClock", "advise",
           "check_inputs"]

#: LayerNorm epsilons tried; the largest whose edit keeps every sentence's cosine >= the floor is certified
EPS_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
#: a decoder's RMSNorm epsilons tried (its residual stream's mean square is large: larger ones are cheap)
DECODER_EPS_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
#: the factors of ``W_Q`` tried on every head of every layer of a decoder (the strongest kept is certified)
TEMPERATURE_GRID = (0.95, 0.9, 0.8, 0.7, 0.6, 0.5)
#: the default floor of the function metric: min sentence cosine (encoder), next-token agreement (decoder)
FLOORS = {"encoder": 0.99, "decoder": 0.9}
#: advise's defaults per kind (a decoder's: SmolLM2's 30 layers in under 15 minutes on two cores; its
#: gated feed-forward blocks cost the same at any n and effort, its 270 heads and the mismatch's
#: forward passes scale with them)
DEFAULTS = {"encoder": {"n": 8, "head_budget": 0.5, "candidates": 512, "edits": 20},
            "decoder": {"n": 2, "head_budget": 0.05, "candidates": 64, "edits": 5}}


class Inputs:
    """The checked inputs of :func:`advise`; ``folder`` the checkpoint (a folder or a GGUF file),
    ``kind`` ``"encoder"`` or ``"decoder"``."""

    def __init__(self, folder, model, tokenizer, sentences, ids, positions, out):
        self.folder, self.model, self.tokenizer = folder, model, tokenizer
        self.sentences, self.ids, self.positions, self.out = sentences, ids, positions, out

    @property
    def kind(self) -> str:
        return "decoder" if self.model.decoder_only else "encoder"


def _check_decoder(loaded, path: Path) -> None:
    """A decoder advise can edit and write back (:func:`.checkpoint.llama_writable`), whole."""
    missing = [i for i in range(loaded.num_layers) if i not in loaded.layers]
    if missing or loaded.embeddings is None or loaded.lm_head is None:
        raise AssumptionError("model", "a whole decoder (embeddings, every layer, output projection)",
                              f"{path} without {'layers ' + str(missing[:3]) if missing else 'embeddings'}",
                              "pass the whole checkpoint")
    if not llama_writable(loaded):
        raise AssumptionError("model", "a Llama-family decoder (pre-norm RMSNorm with one eps, SwiGLU, causal "
                              "rotary heads, no biases) that advise can write back", f"a {loaded.layout} model",
                              "pass a Llama, Mistral without sliding window, or SmolLM checkpoint")


def check_inputs(model=None, *, text=None, positions=(), out=None) -> Inputs:
    """Load and check everything :func:`advise` needs, before any work (module docstring)."""
    if out is not None:
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise OutputError("out", "a folder for the edited checkpoints and reports", f"the file {out}",
                              "choose a folder path, e.g. -o advice/")
        parent = out if out.exists() else out.parent
        if not parent.is_dir():
            raise OutputError("out", "a folder whose parent exists", f"{out} (no folder {parent})",
                              f"create it first (mkdir -p {parent})")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError("out", "a writable folder", f"{out} (permission denied)", "choose another folder")
    folder = Path(default_model_dir() if model is None else model)
    gguf = folder.is_file() and folder.suffix.lower() == ".gguf"
    if not gguf and (not folder.is_dir() or not (folder / "config.json").is_file()):
        raise AssumptionError("model", "a Hugging Face folder (config.json, model.safetensors, tokenizer) of a "
                              "sentence encoder or a Llama-family decoder, or a GGUF file", repr(str(folder)),
                              "pass the folder of a BERT-style sentence encoder or a decoder, or omit it for the "
                              "installed all-MiniLM-L6-v2")
    loaded = load_weights(str(folder))
    if loaded.decoder or not loaded.layers:
        raise AssumptionError("model", "a BERT-style encoder or a decoder-only model",
                              f"{loaded.layout or 'a'} encoder-decoder model", "pass an encoder or a decoder")
    if loaded.decoder_only:
        _check_decoder(loaded, folder)
    elif loaded.embeddings is None or not hasattr(loaded.embeddings, "norm"):
        raise AssumptionError("model", "an encoder with its word and position embeddings", "no embeddings",
                              "pass the whole checkpoint folder")
    missing = [i for i, layer in loaded.layers.items() if not isinstance(layer.ffn, (FeedForward, GatedFeedForward))
               or layer.ln_in is None or layer.ffn_norm is None]
    if missing:
        raise AssumptionError("model", "every layer with its feed-forward block and norms",
                              f"layers {missing} without them", "pass the whole checkpoint folder")
    if not gguf and not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        raise AssumptionError("model", "a tokenizer.json or vocab.txt beside the weights", "no tokenizer",
                              "copy the model's tokenizer files into the folder")
    try:
        tokenizer = load_tokenizer(str(folder))
    except WeightsError as error:
        raise AssumptionError("model", "a model with its tokenizer", f"none usable ({error.got})",
                              "use a GGUF file converted with its tokenizer, or add tokenizer.json") from None
    sentences = bundled_sentences() if text is None else read_sentences(text)
    ids = [tokenizer.encode(s) for s in sentences]
    too_long = [len(i) for i in ids if len(i) > loaded.max_positions]
    if too_long:
        raise AssumptionError("text", f"sentences of at most {loaded.max_positions} tokens",
                              f"one of {max(too_long)}", "split the long lines")
    if min(len(i) for i in ids) < 2:
        raise AssumptionError("text", "sentences of at least two tokens", "a shorter one", "remove the short lines")
    low, high = word_positions(tokenizer, ids[0])
    chosen = tuple(int(p) for p in positions) if positions else (len(ids[0]) // 2,)
    bad = [p for p in chosen if not low <= p <= high]
    if bad:
        raise AssumptionError("positions", f"token positions of the first sentence in {low}..{high} (counted from 0; "
                              "special tokens excluded)", repr(bad), f"pick words of the first sentence, e.g. {high}")
    return Inputs(folder, loaded, tokenizer, sentences, ids, chosen, out)


class StageClock:
    """Wall and CPU seconds per stage of :func:`advise`: ``with clock(stage): ...`` counts this process,
    :meth:`add` the tasks of a batch (each measured where it ran, in a worker when ``jobs > 1``).  A
    stage run in a batch is split: "diagnosis (this process)" holds the wall time and the CPU of the
    main process besides the tasks, "whole model", "heads" and "local" the CPU of their tasks."""

    def __init__(self):
        self.stages: dict[str, dict] = {}
        self._name = None

    def __call__(self, name: str):
        self._name = name
        return self

    def __enter__(self):
        self._started = (time.perf_counter(), time.process_time())
        return self

    def add(self, name: str, cpu: float) -> None:
        """CPU seconds spent elsewhere (a task run in a worker, or in this process by a batch)."""
        self.stages.setdefault(name, {"wall": 0.0, "cpu": 0.0})["cpu"] += cpu

    def __exit__(self, *exc):
        row = self.stages.setdefault(self._name, {"wall": 0.0, "cpu": 0.0})
        row["wall"] += time.perf_counter() - self._started[0]
        row["cpu"] += time.process_time() - self._started[1]
        return False


def _shortest(ids, count: int) -> list:
    return [ids[i] for i in np.argsort([len(x) for x in ids], kind="stable")[:count]]


def _corpus(inputs: Inputs) -> list[str]:
    """The sentences whose token counts are the mismatch's frequencies: the text and the bundled ones."""
    bundled = bundled_sentences()
    return inputs.sentences + ([] if inputs.sentences == bundled else bundled)


def _edit_pairs(inputs: Inputs, count: int, seed: int) -> list:
    """One-word replacements, a random word at a random position of each sentence (at most ``count``)."""
    rng = np.random.default_rng(seed)
    words = word_ids(inputs.tokenizer)
    pairs = []
    for ids in inputs.ids[:count]:
        low, high = word_positions(inputs.tokenizer, ids)
        position = int(rng.integers(low, high + 1))
        pairs.append((np.array(ids), np.array(edited_ids(ids, "replace", (position,), (int(rng.choice(words)),)))))
    return pairs


def _fit_tau(model, layer: int, ids_list) -> tuple[float, float]:
    """``tau`` and ``eps`` of the cosine score keeping the layer's logits' scale: ``tau`` makes the
    root mean square of the cosine scores equal that of the dot-product scores on the text (all heads
    of the layer, all sentences); ``eps`` is a hundredth of the smallest squared norm of a projected
    query or key seen, so that it changes the norms by less than 1%."""
    dots, cosines, smallest = [], [], math.inf
    for ids in ids_list:
        X = hidden_states(model, ids)[layer]
        for head in model.layers[layer].heads:
            Q, K = X @ head.W_Q + head.b_Q, X @ head.W_K + head.b_K
            S = Q @ K.T
            dots.append((S / math.sqrt(head.d_k)).ravel())
            nq, nk = np.linalg.norm(Q, axis=1), np.linalg.norm(K, axis=1)
            cosines.append((S / np.outer(nq, nk)).ravel())
            smallest = min(smallest, float(np.min(nq ** 2)), float(np.min(nk ** 2)))
    def rms(v):
        return float(np.sqrt(np.mean(np.concatenate(v) ** 2)))
    return rms(dots) / rms(cosines), max(smallest / 100.0, 1e-6)


def _mean_value(model, layer: int, head: int, ids_list) -> tuple:
    """The head's value ``y W_V + b_V`` averaged over the tokens of the text, ``y`` what the head reads:
    the layer's input (post-norm), its image under ``ln_in`` (pre-norm)."""
    chosen, norm = model.layers[layer], model.layers[layer].ln_in
    read = [hidden_states(model, ids)[layer] for ids in ids_list]
    if chosen.placement != "post":
        read = [norm(X) for X in read]
    values = [Y @ chosen.heads[head].W_V + chosen.heads[head].b_V for Y in read]
    return tuple(float(v) for v in np.concatenate(values).mean(axis=0))


def _sweep(inputs: Inputs, reference, candidates, floor: float, say) -> list[tuple]:
    """``(intervention, function value)`` for each of ``candidates`` (from the mildest to the strongest),
    measured on the edited copy in memory (the chosen one is written, read back and measured again as
    every intervention is), up to the first below ``min(floor, 0.9)`` (``value``: min sentence cosine,
    or next-token agreement)."""
    sweep = []
    for candidate in candidates:
        cost = function_cost(reference, candidate.apply(inputs.model), inputs.ids)
        say(f"{candidate.name}: {cost.metric} {cost.value:.5f}")
        sweep.append((candidate, cost.value))
        if cost.value < min(floor, 0.9):
            break
    return sweep


def _strongest(sweep, floor: float):
    """The strongest edit of the sweep whose function value is >= ``floor`` (None: none)."""
    return next((candidate for candidate, value in reversed(sweep) if value >= floor), None)


def _plan(model, inputs: Inputs, original, heads, mismatch) -> list:
    """The interventions on the least regular head (largest certified constant; none when no head is
    certified), the least regular attention layer (an encoder's: new scores; a decoder's: every head
    cooler), every layer (a decoder's rotary heads capped at each layer's median) and the most
    irregular tokens."""
    plan = []
    certified = [r for r in heads if r["certified"]]
    if certified:
        top = max(certified, key=lambda r: r["bound"])
        L, H = top["layer"], top["head"]
        head = model.layers[L].heads[H]
        cap = RotaryCap(L, H, rotary_bound(head) / 4) if head.kernel.positional else \
            SpectralCap(L, H, float(qk_spectrum(head)[2][0]) / 4)
        plan += [Temperature(L, H, 0.5), cap, RemoveHead(L, H, _mean_value(model, L, H, inputs.ids))]
    layer_rows = [r for r in original.report.components if r["component"] == "attention" and r["layer"] is not None
                  and math.isfinite(r["best_upper"])]
    top_layer = max(layer_rows, key=lambda r: r["best_upper"])["layer"] if layer_rows else None
    irregular = sorted({row["id"] for m in mismatch for row in m.rows(10)})
    if inputs.kind == "decoder":   # QK-norm and tied L2 would drop the rotary positions
        if top_layer is not None:
            plan.append(LayerTemperature((top_layer,), 0.5))
        return plan + [LayerRotaryCap(quantile=0.5), RecentreEmbeddings(tuple(irregular), 0.5)]
    if top_layer is not None:
        tau, cos_eps = _fit_tau(model, top_layer, inputs.ids)
        plan += [QKNormGain(top_layer, tau=tau, eps=cos_eps), TiedL2(top_layer)]
    return plan + [RecentreEmbeddings(tuple(irregular), 0.5)]


def _estimate(seconds: dict, tasks) -> float:
    """CPU seconds ``tasks`` should take, from the mean of each kind in ``seconds`` (kind -> list); a task
    that reuses its core costs about what the witness of a whole layer does."""
    means = {kind: sum(v) / len(v) for kind, v in seconds.items() if v}
    fallback = sum(means.values()) / len(means) if means else 0.0
    means.setdefault("whole rest", means.get("whole layer", fallback))
    return sum(means.get(_task_kind(task), fallback) for task in tasks)


def _task_kind(task) -> str:
    kind, arguments = task
    if kind != "whole":
        return kind
    # a task with its core appended (run_task's one dict argument) runs only its rest
    return "whole rest" if isinstance(arguments[-1], dict) else f"whole {arguments[0]}"


def advise(inputs: Inputs, *, n: int | None = None, local_sentences: int | None = None, eps_fraction: float = 1e-3,
           head_budget: float | None = None, candidates: int | None = None, edits: int | None = None,
           restarts: int = 4, iterations: int = 30, effort: int = 30, cosine_floor: float | None = None,
           agreement_floor: float | None = None, jobs: int = 1, seed: int = 0, say=None, progress=None) -> Advice:
    """Run the diagnosis and the interventions (module docstring).

    ``n``, ``head_budget``, ``candidates``, ``edits``: None takes :data:`DEFAULTS` of the model's kind.

    ``local_sentences`` (default 1 for an encoder, 0 for a decoder); ``cosine_floor`` (an encoder's,
    default 0.99) or ``agreement_floor`` (a decoder's, default 0.9): the smallest function value an
    automatically fitted edit (the norm epsilon; a decoder's temperature of every head) may cost.

    ``say(text)`` receives one line per stage; ``progress(stage, done, total, text)`` the tasks.  The
    independent tasks of a stage (the original's whole-model tasks, every head, every local constant;
    then every edited model's tasks) run in one batch on ``jobs`` processes (:mod:`.batch`).
    """
    say = say or (lambda text: None)
    kind = inputs.kind
    wrong, right = ("agreement_floor", "cosine_floor") if kind == "encoder" else ("cosine_floor", "agreement_floor")
    if (cosine_floor if wrong == "cosine_floor" else agreement_floor) is not None:
        raise AssumptionError(wrong, f"nothing for {'an' if kind == 'encoder' else 'a'} {kind}",
                              f"{wrong} for {inputs.model.name}", f"set {right} instead")
    given = {"n": n, "head_budget": head_budget, "candidates": candidates, "edits": edits}
    n, head_budget, candidates, edits = (DEFAULTS[kind][key] if value is None else value
                                         for key, value in given.items())
    floor = cosine_floor if kind == "encoder" else agreement_floor
    floor = FLOORS[kind] if floor is None else floor
    if not (isinstance(floor, (int, float)) and 0 < floor <= 1):
        raise AssumptionError(right, "a number in (0, 1]", repr(floor), "pass e.g. 0.99")
    if local_sentences is None:
        local_sentences = 0 if kind == "decoder" else 1
    if isinstance(local_sentences, bool) or not isinstance(local_sentences, int) or local_sentences < 0:
        raise AssumptionError("local_sentences", "a number of sentences >= 0", repr(local_sentences),
                              "pass e.g. 1, or 0 for no local constants")
    stage = (lambda name: (lambda done, total, text: progress(name, done, total, text))) if progress else \
        (lambda name: None)
    started = time.perf_counter()
    clock = StageClock()
    model, out = inputs.model, Path(inputs.out)
    out.mkdir(parents=True, exist_ok=True)
    options = {"n": n, "restarts": restarts, "iterations": iterations, "effort": effort, "seed": seed}
    with clock("sentence embeddings" if kind == "encoder" else "next-token logits"):
        reference = function_reference(model, inputs.ids)
    short = _shortest(inputs.ids, local_sentences)

    say(f"diagnosis: whole-model tasks, every head, local constants at {eps_fraction:g} R on {len(short)} "
        f"sentence(s) ({jobs} process{'es' if jobs > 1 else ''})")
    with clock("diagnosis (this process)"):
        plan = WholePlan(model, **options)
        pairs = [(i, h) for i in sorted(model.layers) for h in range(model.num_heads)]
        layers = sorted(model.layers) if short else []
        tasks = ([("whole", t) for t in plan.todo] + [("head", t) for t in head_tasks(model, pairs, n=n,
                                                                                     budget=head_budget, seed=seed)]
                 + [("local", _local_task(model, i, ids, eps_fraction)) for i in layers for ids in short])
        done = run_batch(tasks, jobs=jobs, progress=stage("diagnosis"),
                         describe=lambda k: _describe(tasks[k]))
        failed = next((d["error"] for d in done if d["error"]), None)
        if failed:
            raise AssumptionError("model", "a model every whole-model route certifies", failed,
                                  "check the model with `lipbound verify MODEL --whole`")
        seconds: dict = {}
        for task, d in zip(tasks, done):
            seconds.setdefault(_task_kind(task), []).append(d["cpu"])
            clock.add({"whole": "whole model", "head": "heads", "local": "local"}[task[0]], d["cpu"])
        results = [d["result"] for d in done]
        original = plan.certificate(results[:len(plan.todo)], time.perf_counter() - started)
        heads = [head_row(i, h, r) for (i, h), r in zip(pairs, results[len(plan.todo):len(plan.todo) + len(pairs)])]
        local = local_rows(layers, len(short), results[len(plan.todo) + len(pairs):], eps_fraction)
    if jobs == 1:   # the tasks ran in this process: their CPU is counted once, by kind
        clock.add("diagnosis (this process)", -sum(d["cpu"] for d in done))
    with clock("movement"):
        movement = movement_shares(model, _edit_pairs(inputs, edits, seed))
    say("regularity mismatch of tokens")
    with clock("mismatch"):
        counts = token_counts(inputs.tokenizer, _corpus(inputs))
        mismatch = [token_mismatch(model, inputs.tokenizer, inputs.sentences[0], p, candidates=candidates, seed=seed,
                                   counts=counts) for p in inputs.positions]

    with clock("sweeps"):
        planned = _plan(model, inputs, original, heads, mismatch)
        grid = DECODER_EPS_GRID if kind == "decoder" else EPS_GRID
        sweep = _sweep(inputs, reference, [NormEpsilon(eps=eps) for eps in grid], floor, say)
        strict = max(floor, 0.999 if kind == "encoder" else 0.99)
        fitted = list(dict.fromkeys(e for e in (_strongest(sweep, strict), _strongest(sweep, floor)) if e))
        if kind == "decoder":   # every head of every layer cooler, as far as the floor allows
            cooler = _strongest(_sweep(inputs, reference, [LayerTemperature(factor=t) for t in TEMPERATURE_GRID],
                                       floor, say), floor)
            fitted += [cooler] if cooler is not None else []
    planned = fitted + planned

    with clock("interventions (this process)"):
        pending = [_Pending(iv, out / f"{number:02d}-{iv.kind}", inputs, reference, heads, local, short, eps_fraction,
                            head_budget, original, options) for number, iv in enumerate(planned, 1)]
        owners = [p for p in pending for _ in p.tasks]
        batch = [task for p in pending for task in p.tasks]
        estimate = _estimate(seconds, batch)
        say(f"{len(planned)} interventions: {len(batch)} tasks (the rest reused), about {estimate:.0f} CPU s "
            f"(from the diagnosis' tasks of each kind), ETA {estimate / jobs / 60:.1f} min on {jobs} process(es)")
        done = run_batch(batch, jobs=jobs, progress=stage("interventions"),
                         describe=lambda k: f"{owners[k].intervention.name}: {_describe(batch[k])}")
        for p, d in zip(owners, done):
            p.arrived.append(d)
            clock.add(f"intervention {p.intervention.kind}", d["cpu"])
    if jobs == 1:   # the tasks ran in this process: their CPU is counted once, by kind
        clock.add("interventions (this process)", -sum(d["cpu"] for d in done))
    with clock("interventions (this process)"):
        results = [p.result(inputs, mismatch, candidates, seed, time.perf_counter() - started) for p in pending]
    return Advice(model=model, folder=str(inputs.folder), sentences=len(inputs.sentences), n=n,
                  whole=original, shares=component_shares(original.report), heads=heads, local=local,
                  movement=movement, mismatch=mismatch, interventions=results, function_floor=floor,
                  eps_fraction=eps_fraction, seconds=time.perf_counter() - started, stages=clock.stages)


def _local_task(model, layer: int, ids, eps_fraction: float) -> tuple:
    return (model.path, tuple(int(t) for t in ids), layer, eps_fraction)


def _describe(task) -> str:
    kind, arguments = task
    if kind == "whole":
        return describe_task(arguments)
    if kind == "head":
        return f"head {arguments[-1]} of layer {arguments[-2]}"
    return f"L(eps) of layer {arguments[2]}"


class _Pending:
    """One intervention between its edit and its certificate: the edited checkpoint written and read
    back, its functional cost, and the tasks left to run (:attr:`tasks`; their outcomes go to
    :attr:`arrived`, in order, and :meth:`result` assembles the row)."""

    def __init__(self, intervention, folder, inputs, reference, heads, local, short, eps_fraction, head_budget,
                 original, options):
        self.intervention, self.original, self.tasks, self.arrived = intervention, original, [], []
        self.edited = self.path = self.cost = self.plan = self.error = None
        self.head_before = self.local_before = None
        self.layer = intervention.layers[0] if intervention.layers else 0
        try:
            self.edited = write_and_reload(intervention.apply(inputs.model), inputs.folder, folder)
        except LipboundError as error:  # an edit the model cannot take, reported and never ranked
            self.error = str(error)
            return
        self.cost = function_cost(reference, self.edited, inputs.ids)
        try:
            self.plan = WholePlan(self.edited, reuse=original, **options)
            self.tasks += [("whole", t) for t in self.plan.todo]
        except LipboundError as refused:  # a theorem refuses the edited model: not certified, never ranked
            self.error = f"not certified: {refused}"
        if hasattr(intervention, "head"):
            pair = (intervention.layer, intervention.head)
            self.head_before = next(r for r in heads if (r["layer"], r["head"]) == pair)
            self.tasks += [("head", t) for t in head_tasks(self.edited, [pair], n=options["n"], budget=head_budget,
                                                           seed=options["seed"])]
        self.local_before = next((r for r in local if r["layer"] == self.layer), None)
        if self.local_before is not None:
            self.tasks += [("local", _local_task(self.edited, self.layer, ids, eps_fraction)) for ids in short]
        # the weights are let go until the result is assembled: nine edited copies of SmolLM2 in float64
        # (1.1 GB each) besides the original took the run past 14 GB
        self.path, self.edited = self.edited.path, None
        if self.plan is not None:
            self.plan.model = None
        self.sentences = len(short)
        self.eps_fraction = eps_fraction

    def result(self, inputs, mismatch, candidates, seed, seconds) -> InterventionResult:
        if self.path is None:
            return InterventionResult(self.intervention, None, error=self.error)
        edited = load_weights(self.path)
        outcomes = dict.fromkeys(("whole", "head", "local"))
        for (kind, _), d in zip(self.tasks, self.arrived):
            outcomes[kind] = (outcomes[kind] or []) + [d]
        whole = error = None
        if self.plan is not None:
            refused = next((d["error"] for d in outcomes["whole"] or () if d["error"]), None)
            if refused:
                error = f"not certified: {refused}"
            else:
                self.plan.model = edited
                whole = self.plan.certificate([d["result"] for d in outcomes["whole"] or ()], seconds)
                self.plan.model = None
                error = None if whole.bound and whole.bound["certified"] else \
                    "the edited model's bound is not certified"
        error = self.error or error
        head_after = None
        if outcomes["head"]:
            d = outcomes["head"][0]
            head_after = head_row(self.intervention.layer, self.intervention.head, d["result"]) if not d["error"] \
                else {"layer": self.intervention.layer, "head": self.intervention.head, "bound": None,
                      "certified": False, "witness": None, "refusal": d["error"]}
        local_after = None
        if outcomes["local"] and error is None:
            refused = next((d["error"] for d in outcomes["local"] if d["error"]), None)
            local_after = {"layer": self.layer, "error": refused} if refused else \
                local_rows([self.layer], self.sentences, [d["result"] for d in outcomes["local"]],
                           self.eps_fraction)[0]
        mismatch_after = None
        if self.intervention.kind == "embeddings":
            counts = token_counts(inputs.tokenizer, _corpus(inputs))
            mismatch_after = [token_mismatch(edited, inputs.tokenizer, m.sentence, m.position,
                                             candidates=candidates, seed=seed, counts=counts).summary()
                              for m in mismatch]
        return InterventionResult(self.intervention, self.path, cost=self.cost, whole_before=self.original,
                                  whole_after=whole, layer=self.layer, head_before=self.head_before,
                                  head_after=head_after, local_before=self.local_before, local_after=local_after,
                                  mismatch_after=mismatch_after, error=error)
