"""``advise``: diagnose a sentence encoder, propose interventions, certify and measure each.

:func:`check_inputs` reads and checks everything before any work (model folder with its tokenizer,
feed-forward blocks and LayerNorms; text; positions; output folder); :func:`advise` then

1. certifies the original end to end (:func:`.diagnosis.certify_whole`) and every head
   (:func:`.diagnosis.head_rows`), takes local constants on the shortest sentences and the measured
   movement of real one-word edits;
2. measures the regularity mismatch of substitutions at the chosen positions (:mod:`.mismatch`);
3. builds the interventions (:mod:`.interventions`) on the least regular head and layer, the
   LayerNorm epsilon and the most irregular tokens, fits their parameters on the text, writes each
   edited checkpoint (:mod:`.checkpoint`), reads it back, certifies it by the same routes (only the
   tasks whose arrays changed run again) and measures its functional cost (:mod:`.function`).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import numpy as np

from ..errors import AssumptionError, LipboundError, OutputError
from ..measures.bert import default_model_dir
from ..measures.edits import edited_ids, whole_word_ids
from ..numeric.model import load_tokenizer, load_weights
from ..numeric.model.components import FeedForward
from ..numeric.whole.chain import hidden_states
from .checkpoint import write_and_reload
from .diagnosis import (
    certify_whole,
    component_shares,
    head_rows,
    local_constants,
    movement_shares,
)
from .function import (
    bundled_sentences,
    functional_cost,
    read_sentences,
    sentence_embeddings,
)
from .interventions import (
    NormEpsilon,
    QKNormGain,
    RecentreEmbeddings,
    RemoveHead,
    SpectralCap,
    Temperature,
    TiedL2,
    qk_spectrum,
)
from .mismatch import token_counts, token_mismatch
from .report import Advice, InterventionResult

__all__ = ["EPS_GRID", "Inputs", "StageClock", "advise", "check_inputs"]

#: LayerNorm epsilons tried; the largest whose edit keeps every sentence's cosine >= the floor is certified
EPS_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)


class Inputs:
    """The checked inputs of :func:`advise`."""

    def __init__(self, folder, model, tokenizer, sentences, ids, positions, out):
        self.folder, self.model, self.tokenizer = folder, model, tokenizer
        self.sentences, self.ids, self.positions, self.out = sentences, ids, positions, out


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
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise AssumptionError("model", "a Hugging Face encoder folder (config.json, model.safetensors, tokenizer)",
                              repr(str(folder)), "pass the folder of a BERT-style sentence encoder, or omit it for "
                              "the installed all-MiniLM-L6-v2")
    loaded = load_weights(str(folder))
    if loaded.decoder or loaded.decoder_only or not loaded.layers:
        raise AssumptionError("model", "a BERT-style encoder (advise measures sentence embeddings)",
                              f"{loaded.layout or 'a'} model with a decoder", "pass an encoder folder")
    if loaded.embeddings is None or not hasattr(loaded.embeddings, "norm"):
        raise AssumptionError("model", "an encoder with its word and position embeddings", "no embeddings",
                              "pass the whole checkpoint folder")
    missing = [i for i, layer in loaded.layers.items() if not isinstance(layer.ffn, FeedForward)
               or layer.ln_in is None or layer.ffn_norm is None]
    if missing:
        raise AssumptionError("model", "every layer with its feed-forward block and LayerNorms",
                              f"layers {missing} without them", "pass the whole checkpoint folder")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        raise AssumptionError("model", "a tokenizer.json or vocab.txt beside the weights", "no tokenizer",
                              "copy the model's tokenizer files into the folder")
    tokenizer = load_tokenizer(str(folder))
    sentences = bundled_sentences() if text is None else read_sentences(text)
    ids = [tokenizer.encode(s) for s in sentences]
    too_long = [len(i) for i in ids if len(i) > loaded.embeddings.max_positions]
    if too_long:
        raise AssumptionError("text", f"sentences of at most {loaded.embeddings.max_positions} tokens",
                              f"one of {max(too_long)}", "split the long lines")
    first = len(ids[0])
    chosen = tuple(int(p) for p in positions) if positions else (first // 2,)
    bad = [p for p in chosen if not 1 <= p <= first - 2]
    if bad:
        raise AssumptionError("positions", f"token positions of the first sentence in 1..{first - 2} (counted from 0; "
                              "[CLS] is 0)", repr(bad), "pick words of the first sentence, e.g. `positions` 2")
    return Inputs(folder, loaded, tokenizer, sentences, ids, chosen, out)


class StageClock:
    """Wall and CPU seconds of this process per stage of :func:`advise` (``with clock("heads"): ...``);
    the CPU of worker processes (``jobs > 1``) is not included."""

    def __init__(self):
        self.stages: dict[str, dict] = {}
        self._name = None

    def __call__(self, name: str):
        self._name = name
        return self

    def __enter__(self):
        self._started = (time.perf_counter(), time.process_time())
        return self

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
    words = whole_word_ids(inputs.tokenizer)
    pairs = []
    for ids in inputs.ids[:count]:
        position = int(rng.integers(1, len(ids) - 1))
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
    values = [hidden_states(model, ids)[layer] @ model.layers[layer].heads[head].W_V
              + model.layers[layer].heads[head].b_V for ids in ids_list]
    return tuple(float(v) for v in np.concatenate(values).mean(axis=0))


def _eps_sweep(model, folder, out, ids, E0, say) -> list[tuple[float, float]]:
    """``(eps, min sentence cosine)`` for each epsilon of :data:`EPS_GRID` (measured on the written and
    re-read checkpoint), up to the first below 0.9."""
    sweep, trial = [], out / "trial-norm-eps"
    for eps in EPS_GRID:
        edited = write_and_reload(NormEpsilon(eps=eps).apply(model), folder, trial)
        cosine = functional_cost(E0, sentence_embeddings(edited, ids)).min_cosine
        say(f"norm-eps {eps:g}: min sentence cosine {cosine:.5f}")
        sweep.append((eps, cosine))
        if cosine < 0.9:
            break
    shutil.rmtree(trial, ignore_errors=True)
    return sweep


def _largest_eps(sweep, floor: float) -> NormEpsilon | None:
    """The largest epsilon of the sweep whose edit keeps every sentence's cosine >= ``floor``."""
    kept = [eps for eps, cosine in sweep if cosine >= floor]
    return NormEpsilon(eps=max(kept)) if kept else None


def _plan(model, inputs: Inputs, original, heads, mismatch) -> list:
    """The interventions on the least regular head (largest certified constant; none when no head is
    certified), the least regular attention layer and the most irregular tokens."""
    plan = []
    certified = [r for r in heads if r["certified"]]
    if certified:
        top = max(certified, key=lambda r: r["bound"])
        L, H = top["layer"], top["head"]
        s_max = float(qk_spectrum(model.layers[L].heads[H])[2][0])
        plan += [Temperature(L, H, 0.5), SpectralCap(L, H, s_max / 4),
                 RemoveHead(L, H, _mean_value(model, L, H, inputs.ids))]
    layer_rows = [r for r in original.report.components if r["component"] == "attention" and r["layer"] is not None
                  and math.isfinite(r["best_upper"])]
    if layer_rows:
        top_layer = max(layer_rows, key=lambda r: r["best_upper"])["layer"]
        tau, cos_eps = _fit_tau(model, top_layer, inputs.ids)
        plan += [QKNormGain(top_layer, tau=tau, eps=cos_eps), TiedL2(top_layer)]
    irregular = sorted({row["id"] for m in mismatch for row in m.rows(10)})
    return plan + [RecentreEmbeddings(tuple(irregular), 0.5)]


def advise(inputs: Inputs, *, n: int = 8, local_sentences: int = 1, eps_fraction: float = 1e-3,
           head_budget: float = 0.5, candidates: int = 512, edits: int = 20, restarts: int = 4, iterations: int = 30,
           effort: int = 30, cosine_floor: float = 0.99, jobs: int = 1, seed: int = 0, say=None,
           progress=None) -> Advice:
    """Run the diagnosis and the interventions (module docstring).

    ``say(text)`` receives one line per stage; ``progress(stage, done, total, text)`` the steps.
    """
    say = say or (lambda text: None)
    if isinstance(local_sentences, bool) or not isinstance(local_sentences, int) or local_sentences < 0:
        raise AssumptionError("local_sentences", "a number of sentences >= 0", repr(local_sentences),
                              "pass e.g. 1, or 0 for no local constants")
    stage = (lambda name: (lambda done, total, text: progress(name, done, total, text))) if progress else \
        (lambda name: None)
    started = time.perf_counter()
    clock = StageClock()
    model, out = inputs.model, Path(inputs.out)
    out.mkdir(parents=True, exist_ok=True)
    with clock("sentence embeddings"):
        E0 = sentence_embeddings(model, inputs.ids)
    short = _shortest(inputs.ids, local_sentences)

    say("whole-model certificate of the original")
    with clock("whole model"):
        original = certify_whole(model, n=n, restarts=restarts, iterations=iterations, effort=effort, seed=seed,
                                 jobs=jobs, progress=stage("whole model"))
    say("every head: certified constants and witnesses")
    with clock("heads"):
        heads = head_rows(model, n=n, budget=head_budget, seed=seed, jobs=jobs, progress=stage("heads"))
    local = []
    if local_sentences:
        say(f"local constants at {eps_fraction:g} R on {len(short)} sentence(s)")
        with clock("local"):
            local = local_constants(model, short, eps_fraction=eps_fraction, progress=stage("local"))
    with clock("movement"):
        movement = movement_shares(model, _edit_pairs(inputs, edits, seed))
    say("regularity mismatch of tokens")
    with clock("mismatch"):
        counts = token_counts(inputs.tokenizer, _corpus(inputs))
        mismatch = [token_mismatch(model, inputs.tokenizer, inputs.sentences[0], p, candidates=candidates, seed=seed,
                                   counts=counts) for p in inputs.positions]

    with clock("eps sweep"):
        plan = _plan(model, inputs, original, heads, mismatch)
        sweep = _eps_sweep(model, inputs.folder, out, inputs.ids, E0, say)
    eps_edits = {e.eps: e for e in (_largest_eps(sweep, max(cosine_floor, 0.999)), _largest_eps(sweep, cosine_floor))
                 if e is not None}
    plan = list(eps_edits.values()) + plan

    results = []
    for number, intervention in enumerate(plan, 1):
        say(f"intervention {number}/{len(plan)}: {intervention.name} on {intervention.target}")
        with clock(f"intervention {intervention.kind}"):
            results.append(_evaluate(intervention, out / f"{number:02d}-{intervention.kind}", inputs, original,
                                     heads, local, short, mismatch, E0, n=n, eps_fraction=eps_fraction,
                                     head_budget=head_budget, restarts=restarts, iterations=iterations, effort=effort,
                                     jobs=jobs, seed=seed, candidates=candidates, stage=stage))
    return Advice(model=model, folder=str(inputs.folder), sentences=len(inputs.sentences), n=n,
                  whole=original, shares=component_shares(original.report), heads=heads, local=local,
                  movement=movement, mismatch=mismatch, interventions=results, cosine_floor=cosine_floor,
                  eps_fraction=eps_fraction, seconds=time.perf_counter() - started, stages=clock.stages)


def _evaluate(intervention, folder, inputs, original, heads, local, short, mismatch, E0, *, n, eps_fraction,
              head_budget, restarts, iterations, effort, jobs, seed, candidates, stage) -> InterventionResult:
    model = inputs.model
    try:
        edited = write_and_reload(intervention.apply(model), inputs.folder, folder)
    except LipboundError as error:  # an edit the model cannot take, reported and never ranked
        return InterventionResult(intervention, None, error=str(error))
    checkpoint = edited.path
    cost = functional_cost(E0, sentence_embeddings(edited, inputs.ids))
    whole = None
    try:
        whole = certify_whole(edited, n=n, restarts=restarts, iterations=iterations, effort=effort, seed=seed,
                              jobs=jobs, reuse=original, progress=stage(intervention.name))
        error = None if whole.bound and whole.bound["certified"] else "the edited model's bound is not certified"
    except LipboundError as refused:  # a theorem refuses the edited model: not certified, never ranked
        error = f"not certified: {refused}"
    head_before = head_after = None
    if hasattr(intervention, "head"):
        head_before = next(r for r in heads if (r["layer"], r["head"]) == (intervention.layer, intervention.head))
        head_after = head_rows(edited, n=n, budget=head_budget, seed=seed,
                               heads=[(intervention.layer, intervention.head)])[0]
    layer = intervention.layers[0] if intervention.layers else 0
    local_before = next((r for r in local if r["layer"] == layer), None)
    local_after = None
    if local_before is not None and error is None:
        try:
            local_after = local_constants(edited, short, eps_fraction=eps_fraction, layers=[layer])[0]
        except LipboundError as refused:
            local_after = {"layer": layer, "error": str(refused)}
    mismatch_after = None
    if intervention.kind == "embeddings":
        counts = token_counts(inputs.tokenizer, _corpus(inputs))
        mismatch_after = [token_mismatch(edited, inputs.tokenizer, m.sentence, m.position, candidates=candidates,
                                         seed=seed, counts=counts).summary() for m in mismatch]
    return InterventionResult(intervention, checkpoint, cost=cost, whole_before=original, whole_after=whole,
                              layer=layer, head_before=head_before, head_after=head_after, local_before=local_before,
                              local_after=local_after, mismatch_after=mismatch_after, error=error)
