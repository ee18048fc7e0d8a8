"""Token edits of real text: measured Wasserstein-1 movement against certificates along the edit and over its set.

A sentence of n WordPiece tokens (``[CLS] ... [SEP]``) is, at the input of layer l (counted from 0), the
uniform empirical measure of its hidden states (Vuckovic, Baratin, Tachet des Combes 2020, "A
Mathematical Theory of Attention", arXiv:2007.02876).  The residual attention block of the layer maps
it to the measure of ``X + MHA(X)``.  Edit the sentence -- replace, insert or delete k word tokens, at
drawn or chosen positions -- and compare, layer by layer (:class:`~lipbound.measures.edit_report.EditRow`):

* ``measured``: the exact W1 between the block outputs of the sentence and of the edit, and
  ``measured_max_token``, the largest movement of a matched token;
* ``predicted_path``: W1 certified along the segment between the layer's two inputs, coupled by their
  optimal plan (:func:`lipbound.local.path.path_certificate`): it knows the edit at that layer (the
  smaller of this and ``predicted_set``, which bounds the edit too, since the edit is in its set);
* ``predicted_set``: W1 certified for every edit of the set -- any token of ``vocabulary`` in every
  edited slot (a deletion is a set of one) -- pushed from the embeddings through the layers without
  running any edit through the model (:func:`lipbound.local.propagate.propagate`);
* ``worst_witness``: the largest exact W1 found over the set (:func:`lipbound.measures.vocabulary.worst_edits`):
  every candidate when one slot is edited and the search covers the set, coordinate ascent otherwise;
* ``global``: the certified W1 constant of the block on the whole LayerNorm image times the W1 of the
  layer's inputs, the prediction lipbound made before local certificates (theorem
  ``measure-w1-uniform``; for sentences of different lengths on ``lcm(n, n')`` atoms; the smaller of the
  constants on the LayerNorm image and on the ball about its bias that holds both inputs).

The chain ``measured <= predicted_path <= predicted_set`` and ``worst_witness <= predicted_set`` is
checked in interval arithmetic (:class:`~lipbound.measures.edit_report.EditReport`).
"""

from __future__ import annotations

import math
import os

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from ..errors import AssumptionError
from ..local.path import path_certificate
from ..local.propagate import propagate, set_bound
from ..numeric.blas import one_blas_thread
from ..numeric.certify import layer_constant
from ..numeric.domains import LayerNormOutputs, TokenBall
from ..rigorous.intervals import interval, upper
from ..rigorous.linalg import vector_norm_upper
from ..rigorous.value import CertifiedValue
from .bert import BertModel, load_text_model
from .decoder_edits import check_decoder_mode, decoder_rows, is_decoder
from .edit_report import FLOAT_ALLOWANCE, EditReport, EditRow
from .edits import MODES, draw_edits, drawable_ids, edit_set
from .empirical import EmpiricalMeasure
from .vocabulary import worst_edits
from .wasserstein import w1, w1_with_plan

__all__ = ["FLOAT_ALLOWANCE", "perturb", "block_constant", "data_radius", "integer_plan", "DEFAULT_SEARCH"]

#: Candidates per edited slot the worst-edit search screens by default (``search="all"``: the whole set).
DEFAULT_SEARCH = 4096


def block_constant(bert: BertModel, layer: int, atoms: int, radius: float | None = None) -> CertifiedValue:
    """The certified W1 constant of the residual attention block ``X -> X + MHA(X)`` of ``layer`` on
    uniform measures of ``atoms`` atoms: on the outputs of the LayerNorm feeding the layer, or (with
    ``radius``) on the ball of that radius about its bias.  Computed once per model, layer and size."""
    key = (layer, atoms, radius)
    cache = bert.constants
    if key not in cache:
        norm = bert.layernorm_feeding(layer)
        domain = LayerNormOutputs(norm) if radius is None else TokenBall(radius, norm.beta)
        cache[key] = layer_constant(bert.model.layer(layer), "w1", domain, atoms, residual=True)
    return cache[key]


def data_radius(center: np.ndarray, *token_sets: np.ndarray) -> float:
    """A certified upper bound on ``max ||x_i - c||`` over the rows of all ``token_sets``:
    ``fl(x - c)`` is within ``u |fl(x - c)|`` of ``x - c`` elementwise, so the certified norm of
    the computed difference, times ``1 + 2u``, bounds the exact distance."""
    largest = 0.0
    for tokens in token_sets:
        for row in np.asarray(tokens, dtype=np.float64) - center:
            largest = max(largest, vector_norm_upper(row))
    return upper(interval(largest) * (1 + interval(2) ** -52))



def _uniform(tokens: np.ndarray) -> EmpiricalMeasure:
    return EmpiricalMeasure.uniform(tokens)


def _check_ks(k, editable: int) -> tuple[int, ...]:
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        values = (k,)
    else:
        try:
            values = tuple(k)
        except TypeError:
            values = ()
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in values):
        raise AssumptionError("k", "a positive int or a non-empty sequence of them", repr(k),
                              "pass e.g. k=1 or k=(1, 2, 3)")
    bad = [int(v) for v in values if not 1 <= v <= editable]
    if bad:
        raise AssumptionError("k", f"1 <= k <= {editable} (the word tokens of the sentence; [CLS] and [SEP] "
                              "are never edited)", repr(bad[0] if len(bad) == 1 else bad),
                              "choose a smaller k or a longer sentence")
    return tuple(sorted({int(v) for v in values}))


def _check_layers(layers, count: int) -> tuple[int, ...]:
    try:
        values = tuple(layers)
    except TypeError:
        values = (layers,)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in values) \
            or any(not 0 <= v < count for v in values):
        raise AssumptionError("layers", f"layer numbers between 0 and {count - 1} (counted from 0)", repr(layers),
                              f"choose `layers` between 0 and {count - 1}")
    return tuple(sorted({int(v) for v in values}))


def integer_plan(plan: np.ndarray | None, n: int, n_new: int, cost: np.ndarray | None = None) -> np.ndarray:
    """A coupling of the uniform measures on n and n' atoms with integer masses (rows summing to n',
    columns to n): ``plan * n n'`` rounded when that is exact (transport vertices are integral), else the
    north-west corner coupling in sentence order.  ``cost`` (n, n') first finds an optimal plan (HiGHS)."""
    if plan is None and cost is not None:
        rows = sparse.kron(sparse.eye(n), np.ones((1, n_new)))
        cols = sparse.kron(np.ones((1, n)), sparse.eye(n_new))
        result = linprog(cost.ravel(), A_eq=sparse.vstack([rows, cols.tocsr()[:-1]]).tocsc(),
                         b_eq=np.concatenate([np.full(n, float(n_new)), np.full(n_new - 1, float(n))]),
                         bounds=(0, None), method="highs")
        plan = None if result.status != 0 or result.x is None else result.x.reshape(n, n_new) / (n * n_new)
    if plan is not None:
        scaled = np.rint(np.asarray(plan) * n * n_new).astype(np.int64)
        if np.all(scaled >= 0) and np.all(scaled.sum(axis=1) == n_new) and np.all(scaled.sum(axis=0) == n):
            return scaled
    out = np.zeros((n, n_new), dtype=np.int64)
    supply, demand = np.full(n, n_new), np.full(n_new, n)
    a = b = 0
    while a < n and b < n_new:
        amount = min(supply[a], demand[b])
        out[a, b] += amount
        supply[a] -= amount
        demand[b] -= amount
        a += supply[a] == 0
        b += demand[b] == 0
    return out


def _set_ids(bert: BertModel, vocabulary, edits: dict, seed: int) -> tuple[np.ndarray, str]:
    """The candidate tokens of the set: the whole vocabulary, a reproducible sample of N ids (with the
    drawn words), or the given ids."""
    size = bert.model.embeddings.vocab_size
    drawn = [bert.tokenizer.token_to_id(w) for e in edits.values() for w in e.words]
    if vocabulary is None or (isinstance(vocabulary, str) and vocabulary == "all"):
        return np.arange(size), f"any of the {size} tokens of the vocabulary"
    if isinstance(vocabulary, (int, np.integer)) and not isinstance(vocabulary, bool):
        if not 1 <= vocabulary <= size:
            raise AssumptionError("vocabulary", f"a number of tokens in 1..{size}, or 'all'", repr(vocabulary),
                                  "e.g. `vocabulary` 2048 or 'all'")
        pool = drawable_ids(bert.tokenizer)
        if vocabulary > pool.size:
            raise AssumptionError("vocabulary", f"a number of tokens in 1..{pool.size} (the vocabulary less the words "
                                  "random draws skip), or 'all'", repr(vocabulary), "e.g. `vocabulary` 2048 or "
                                  "'all'")
        sample = np.random.default_rng(seed + 7919).choice(pool, size=int(vocabulary), replace=False)
        ids = np.unique(np.concatenate([sample, np.asarray(drawn, dtype=np.int64)]))
        return ids, f"any of {ids.size} tokens (a sample of {vocabulary} drawn with seed {seed}, and the drawn words)"
    ids = np.unique(np.asarray(list(vocabulary), dtype=np.int64))
    if ids.size == 0 or ids.min() < 0 or ids.max() >= size:
        raise AssumptionError("vocabulary", f"token ids in 0..{size - 1}", repr(list(vocabulary))[:60],
                              "pass valid ids")
    ids = np.unique(np.concatenate([ids, np.asarray(drawn, dtype=np.int64)]))  # the edit is always in its set
    return ids, f"any of {ids.size} tokens (the given ones and the drawn words)"


def _search_ids(candidates: np.ndarray, search, seed: int, must: list, drawable: np.ndarray) -> tuple[np.ndarray, bool]:
    if search is None:
        search = DEFAULT_SEARCH
    if isinstance(search, str):
        if search != "all":
            raise AssumptionError("search", "a positive number of candidates or 'all'", repr(search),
                                  "e.g. `search` 4096")
        return candidates, True
    if isinstance(search, bool) or not isinstance(search, (int, np.integer)) or search < 1:
        raise AssumptionError("search", "a positive number of candidates or 'all'", repr(search), "e.g. `search` 4096")
    if search >= candidates.size:
        return candidates, True
    pool = np.intersect1d(candidates, drawable)   # a random sample never takes an offensive word
    if search >= pool.size:
        return np.unique(np.concatenate([pool, np.asarray(must, dtype=np.int64)])), False
    chosen = np.random.default_rng(seed + 104729).choice(pool, size=int(search), replace=False)
    return np.unique(np.concatenate([chosen, np.asarray(must, dtype=np.int64)])), False


@one_blas_thread   # many products of a few hundred rows: a second BLAS thread costs more than it saves
def perturb(sentence: str, *, k=1, mode: str = "replace", layers=range(6), seed: int = 0, model=None,
            positions=None, vocabulary=None, search=None, path_tolerance: float = 0.2, set_certificate: bool = True,
            per_candidate: bool = False, exact_chain: bool | None = None, progress=None) -> EditReport:
    """Edit k word tokens of ``sentence``; per layer, measured W1 movement against its certificates.

    Parameters
    ----------
    sentence : str
    k : int or sequence of int
        Edit sizes, ``1 <= k <= n - 2``; nested (the k-token edit extends the (k-1)-token one).
    mode : {"replace", "insert", "delete"}
    layers : iterable of int
        Layers counted from 0.
    seed : int
        Draws positions (unless given) and words.
    model : BertModel, path or None
    positions : sequence of int, optional
        The positions to edit (token indices counted from 0; ``[CLS]`` is 0); insertions go before them.
    vocabulary : None, "all", int or sequence of int
        The candidate tokens of the set certificate: the whole vocabulary (default), a sample of N, or ids.
    search : None, "all" or int
        Candidates per edited slot the worst-edit search screens (default :data:`DEFAULT_SEARCH`; 0: none,
        the drawn edit is the worst found).
    path_tolerance : float
        The path certificate halves its pieces until its error is at most this fraction of its main part.
    set_certificate : bool
        False skips the set certificate (``predicted_set`` is NaN), for sweeps of the path certificate.
    per_candidate : bool
        For replacements, also push every edited sentence of the set (every combination of the slots'
        candidates, at most :data:`lipbound.local.candidates.MOST_SENTENCES`) through the layers as a float
        point with certified radii (:mod:`lipbound.local.candidates`); ``predicted_set`` is the smaller route,
        named per layer in the report's ``set["routes"]`` (about 0.3 CPU-s per sentence for three layers at n = 9).
    exact_chain : bool, optional
        With ``per_candidate``: bound each feed-forward chain of the passes by its certified norm at the point
        (:func:`lipbound.local.candidates.candidate_passes`), about four times the CPU time, which carries the
        passes through all six layers of all-MiniLM-L6-v2.  Default (None): the passes' own choice, exact when
        a layer from :data:`~lipbound.local.candidates.EXACT_CHAIN_FROM` (4) on is asked.
    progress : callable, optional
        ``progress(done, total, what)`` as each stage finishes (a set certificate, a search, a layer's path
        certificate: ``total`` of them).

    Returns
    -------
    EditReport
        One :class:`~lipbound.measures.edit_report.EditRow` per (layer, k).
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise AssumptionError("sentence", "a non-empty sentence", repr(sentence),
                              'pass some text, e.g. "The cat slept all afternoon."')
    if mode not in MODES:
        raise AssumptionError("mode", f"one of {MODES}", repr(mode), "choose replace, insert or delete")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise AssumptionError("seed", "an int", repr(seed), "pass e.g. seed=0")
    if isinstance(path_tolerance, bool) or not (isinstance(path_tolerance, (int, float)) and 0 < path_tolerance <= 1):
        raise AssumptionError("path_tolerance", "a fraction in (0, 1]", repr(path_tolerance),
                              "e.g. `path_tolerance` 0.2")
    if not (search is None or search == "all" or (isinstance(search, (int, np.integer)) and not isinstance(search, bool)
                                                  and search >= 0)):
        raise AssumptionError("search", "a number of candidates (0: the drawn edit only) or 'all'", repr(search),
                              "e.g. `search` 4096 or 'all'")
    bert = load_text_model(model)
    if bert.tokenizer is None:
        raise AssumptionError("model", "a checkpoint with its tokenizer (tokenizer.json or vocab.txt)", "no tokenizer",
                              "copy the model's tokenizer.json into its directory")
    say = progress or (lambda text: None)
    ids = bert.encode(sentence)
    n = len(ids)
    decoder = is_decoder(bert)
    if decoder:
        check_decoder_mode(mode)
    if n < (1 if decoder else 3):
        raise AssumptionError("sentence", "at least one word token", f"{sentence!r} (no tokens)",
                              "pass a sentence with words in it")
    ks = _check_ks(len(positions) if positions is not None and k is None else k, n if decoder else n - 2)
    chosen_layers = _check_layers(layers, bert.num_layers)
    edits = draw_edits(bert, ids, mode, ks, int(seed), positions, framed=not decoder)
    candidates, set_text = _set_ids(bert, vocabulary, edits, int(seed)) if mode != "delete" else (None, "")
    if decoder:
        rows, search_info = decoder_rows(bert, ids, edits, candidates, DEFAULT_SEARCH if search is None else search,
                                         int(seed), chosen_layers, say)
        rows.sort(key=lambda r: (r.k, r.layer))
        return EditReport(sentence, mode, int(seed), n, tuple(bert.tokenizer.tokens(ids)), edits, tuple(rows),
                          {"description": set_text, "size": int(candidates.size)}, search_info,
                          model=_model_label(model))
    original = bert.hidden_states(ids)
    blocks = {layer: bert.attention_block(layer, original[layer]).pre_norm for layer in range(max(chosen_layers) + 1)}

    def outputs_of(new_ids):
        states = bert.hidden_states(list(new_ids))
        return [bert.attention_block(layer, states[layer]).pre_norm for layer in range(max(chosen_layers) + 1)]

    stages = len(edits) * (int(set_certificate) + int(search != 0 and mode != "delete") + len(chosen_layers))
    finished = []

    def say(what: str) -> None:
        finished.append(what)
        if progress is not None:
            progress(len(finished), stages, what)

    rows, search_info, routes = [], {}, {}
    for k_value, edit in edits.items():
        states = bert.hidden_states(list(edit.ids))
        n_new = len(edit.ids)
        template = edit_set(ids, mode, edit.positions, candidates if candidates is not None else [])
        pairs = _matched(template)
        sets = None
        if set_certificate:
            sets = propagate(bert.model, template, layers=chosen_layers, per_candidate=per_candidate,
                             exact_chain=exact_chain)
            say(f"k = {k_value}: set certificate through layers 0..{max(chosen_layers)}")
        if search == 0:
            search_info[k_value] = {"description": "the drawn edit only", "evaluated": 1, "exhaustive": False}
        worst = {} if search == 0 else _worst(bert, ids, edit, mode, template, candidates, search, seed, chosen_layers,
                                              blocks, outputs_of, search_info, k_value, say)
        if sets is not None and search != 0 and "candidates" in sets[0].facts:
            _passes_witnesses(sets[0].facts["candidates"], template, chosen_layers, blocks, outputs_of, worst,
                              search_info[k_value])
        for layer in chosen_layers:
            X, X_new = original[layer], states[layer]
            Y, Y_new = blocks[layer], bert.attention_block(layer, X_new).pre_norm
            measured = w1(EmpiricalMeasure.uniform(Y), EmpiricalMeasure.uniform(Y_new))
            moved = max(float(np.linalg.norm(Y[a] - Y_new[i])) for a, i in pairs) if len(pairs) else math.nan
            coupling = w1_with_plan(EmpiricalMeasure.uniform(X), EmpiricalMeasure.uniform(X_new))
            plan = integer_plan(coupling.plan, n, n_new)
            path = path_certificate(bert.model.layer(layer).as_layer(residual=True), X, X_new, plan,
                                    tolerance=path_tolerance)
            say(f"k = {k_value}, layer {layer}: path certificate")
            predicted_set = math.nan
            if sets is not None:
                predicted_set, routes[(k_value, layer)] = set_bound(sets[layer], _set_plan(sets[layer], n, n_new, mode))
            # the edit is in its set, so the set certificate bounds it too: the path certificate is the smaller
            rows.append(EditRow(layer, k_value, tuple(edit.positions), n, measured, moved,
                                path.bound if math.isnan(predicted_set) else min(path.bound, predicted_set),
                                predicted_set, max(worst.get(layer, measured), measured),
                                _global(bert, layer, X, X_new, coupling.value)))
    rows.sort(key=lambda r: (r.k, r.layer))
    return EditReport(sentence, mode, int(seed), n, tuple(bert.tokenizer.tokens(ids)), edits, tuple(rows),
                      {"description": set_text or "the deletion itself (a set of one edit)",
                       "size": None if candidates is None else int(candidates.size),
                       "routes": {f"k={k}, layer {layer}": route for (k, layer), route in routes.items()}},
                      search_info, model=_model_label(model))


def _matched(template) -> np.ndarray:
    """``(a, i)``: original token a and the edited sentence's token i it became (an inserted token matches
    none; it sits just before the token it was inserted before)."""
    source = template.source
    inserted = np.append(source[1:] == source[:-1], False)
    return np.array([(a, i) for i, a in enumerate(source) if not inserted[i]])


def _set_plan(layer_set, n: int, n_new: int, mode: str) -> np.ndarray:
    """The coupling of the original outputs with the set's balls: the identity for a replacement, else
    the optimal plan of the bounding costs ``||z_a - c_i|| + r_i`` (any coupling gives a valid bound)."""
    if mode == "replace":
        return np.eye(n, dtype=np.int64) * n
    distances = np.linalg.norm(layer_set.original[:, None, :] - layer_set.centers[None, :, :], axis=-1)
    cost = distances + layer_set.radii[None, :]
    return integer_plan(None, n, n_new, cost)


def _worst(bert, ids, edit, mode, template, candidates, search, seed, layers, blocks, outputs_of, info, k, say):
    """The largest exact W1 per layer over the set (the edit itself for a deletion)."""
    if mode == "delete":
        info[k] = {"description": "the deletion itself", "evaluated": 1, "exhaustive": True}
        return {}
    slots = [i for i, words in enumerate(template.words) if words.size > 1]
    drawn = [edit.ids[i] for i in slots]
    drawable = drawable_ids(bert.tokenizer)
    options, exhaustive = zip(*[_search_ids(candidates, search, seed + j, [drawn[j]], drawable)
                                for j in range(len(slots))])
    n_new = template.n_new
    screen_pairs, screen_weights = _screening_coupling(len(ids), n_new, template)

    def make(choice):
        out = np.array([int(template.words[i][0]) for i in range(n_new)])
        out[slots] = choice
        return out

    found = worst_edits(bert.model, ids, make, slots, list(options), layers,
                        [blocks[l] for l in range(max(layers) + 1)],
                        screen_pairs, screen_weights, start=drawn, reference=outputs_of,
                        exhaustive=all(exhaustive) and len(slots) == 1)
    info[k] = {"description": ("every candidate" if found.exhaustive else
                               f"{'screened' if len(slots) == 1 else 'coordinate ascent over'} "
                               f"{found.evaluated} candidates") + f" in {found.seconds:.1f} s",
               "evaluated": found.evaluated, "exhaustive": found.exhaustive, "seconds": found.seconds}
    say(f"k = {k}: the worst edit over {sum(len(o) for o in options)} candidates")
    return found.values


def _passes_witnesses(passes, template, layers, blocks, outputs_of, worst: dict, info: dict, top: int = 4) -> None:
    """Per layer the passes reached, the ``top`` edits of largest certified bound, evaluated (float64 forward
    pass, exact W1) as witnesses: ``worst`` keeps the larger value, ``info["passes_evaluated"]`` counts them."""
    slots = [i for i, words in enumerate(template.words) if words.size > 1]
    base = np.array([int(words[0]) for words in template.words])
    computed: dict = {}
    for layer in (layer for layer in layers if layer in passes.bounds):
        for row in np.argsort(-passes.bounds[layer])[:top]:
            ids = base.copy()
            ids[slots] = passes.words[row]
            key = tuple(int(i) for i in ids)
            if key not in computed:
                computed[key] = outputs_of(list(key))
            value = w1(EmpiricalMeasure.uniform(blocks[layer]), EmpiricalMeasure.uniform(computed[key][layer]))
            worst[layer] = max(worst.get(layer, -math.inf), value)
    info["passes_evaluated"] = len(computed)


def _screening_coupling(n: int, n_new: int, template) -> tuple[np.ndarray, np.ndarray]:
    """A fixed coupling of the original and an edited sentence for screening (north-west corner in order)."""
    plan = integer_plan(None, n, n_new) if n != n_new else np.eye(n, dtype=np.int64) * n
    pairs = np.argwhere(plan > 0)
    return pairs, plan[pairs[:, 0], pairs[:, 1]] / (n * n_new)


def _global(bert: BertModel, layer: int, X: np.ndarray, X_new: np.ndarray, input_w1: float) -> float:
    """The pre-local prediction: the smaller certified W1 constant (LayerNorm image, data ball) times the input W1."""
    n, n_new = len(X), len(X_new)
    atoms = n if n == n_new else math.lcm(n, n_new)
    norm = bert.layernorm_feeding(layer)
    constants = [block_constant(bert, layer, atoms)]
    radius = data_radius(norm.beta, X, X_new)
    if radius <= norm.radius_about_center:
        constants.append(block_constant(bert, layer, atoms, radius))
    values = [c.value for c in constants if c.certified]
    if not values:
        return math.inf
    return upper(interval(min(values)) * interval(input_w1))


def _model_label(model) -> str:
    if model is None:
        return "all-MiniLM-L6-v2 (installed)"
    return "BertModel (given)" if isinstance(model, BertModel) else os.fspath(model)
