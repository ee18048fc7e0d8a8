"""Token-level perturbations of real text, measured in Wasserstein-1 and predicted by certified constants.

A sentence of n WordPiece tokens (``[CLS] ... [SEP]``) is, at the input of layer l (layers counted from 0), the uniform
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
  ``max|gamma| sqrt(d)`` (:class:`~lipbound.numeric.domains.LayerNormOutputs`).  For one pair
  of sentences, the smaller ball about ``beta`` whose radius is the largest ``||x_i - beta||`` over
  the tokens of both inputs also contains both measures, and the theorem applied there gives a
  smaller, equally valid constant for that pair.  Both are reported; the prediction uses the smaller.

Every constant is an upper end of an interval evaluation (:mod:`lipbound.rigorous`).  The
comparison ``measured <= predicted`` is decided in interval arithmetic after widening both sides by
a float allowance (:data:`FLOAT_ALLOWANCE`); a comparison the allowance cannot decide is reported
"not certified", never as a pass.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import final

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from ..numeric.certify import layer_constant
from ..numeric.domains import LayerNormOutputs, TokenBall
from ..rigorous.intervals import Verdict, certify_le, interval, upper
from ..rigorous.linalg import vector_norm_upper
from ..rigorous.value import CertifiedValue
from .bert import BertModel, load_text_model
from .edits import MODES, draw_edits
from .empirical import EmpiricalMeasure
from .wasserstein import w1

__all__ = ["FLOAT_ALLOWANCE", "PerturbationRow", "PerturbationReport", "perturb", "block_constant", "data_radius"]

#: Relative widening of measured and predicted values before they are compared.  The float64
#: forward pass and the W1 assignment round at about 1e-13 relative on these sizes (tokens of
#: norm about 20, d = 384, n < 100); 1e-6 is far above that, so rounding cannot decide a verdict.
FLOAT_ALLOWANCE = 1e-6


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


@final
@dataclass(frozen=True)
class PerturbationRow:
    """One layer and one edit size.

    Attributes
    ----------
    layer : int
        The layer (counted from 0) whose attention block is measured.
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
        raise AssumptionError("--layers", f"layer numbers between 0 and {count - 1} (counted from 0)", repr(layers),
                              f"pass e.g. --layers 0..{count - 1}")
    return tuple(sorted({int(v) for v in values}))


def _verdict(measured: float, constant: float, input_w1: float) -> str:
    allowance = interval((1 - FLOAT_ALLOWANCE, 1 + FLOAT_ALLOWANCE))
    answer = certify_le(interval(measured) * allowance, interval(constant) * interval(input_w1) * allowance)
    if answer is Verdict.HOLDS:
        return "holds"
    return "violated" if answer is Verdict.FAILS else "not certified"


def perturb(sentence: str, *, k=1, mode: str = "replace", layers=range(6), seed: int = 0,
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
        Layers counted from 0 (all six of all-MiniLM-L6-v2 by default).
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
    bert = load_text_model(model)
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
    outputs = {layer: bert.attention_block(layer, original[layer]).pre_norm for layer in chosen_layers}
    rows = []
    for k_value, edit in edits.items():
        states = bert.hidden_states(list(edit.ids))
        n_new = len(edit.ids)
        atoms = n if n_new == n else math.lcm(n, n_new)
        for layer in chosen_layers:
            X, X_new = original[layer], states[layer]
            Y, Y_new = outputs[layer], bert.attention_block(layer, X_new).pre_norm
            input_w1 = w1(_uniform(X), _uniform(X_new))
            measured = w1(_uniform(Y), _uniform(Y_new))
            hidden_w1 = w1(_uniform(original[layer + 1]), _uniform(states[layer + 1]))
            norm = bert.layernorm_feeding(layer)
            on_layernorm = block_constant(bert, layer, atoms)
            radius = data_radius(norm.beta, X, X_new)
            if radius > norm.radius_about_center:  # LayerNorm outputs cannot leave its ball: a float anomaly
                raise NotCertifiedError("inputs of layer", f"tokens within {norm.radius_about_center} of the LayerNorm "
                                        "bias", f"a token at distance up to {radius}",
                                        "check the hidden states; the LayerNorm-image constant does not apply")
            on_data = block_constant(bert, layer, atoms, radius)
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
                radius_layernorm=norm.radius_about_center, radius_data=radius, predicted=predicted, ratio=ratio,
                amplification=measured / input_w1 if input_w1 > 0 else math.inf,
                verdict=_verdict(measured, constant, input_w1), hidden_w1=hidden_w1, **extra))
    rows.sort(key=lambda r: (r.layer, r.k))
    return PerturbationReport(sentence, mode, int(seed), n, tuple(bert.tokenizer.decode_tokens(ids)), edits,
                              tuple(rows), model=_model_label(model))


def _model_label(model) -> str:
    if model is None:
        return "all-MiniLM-L6-v2 (installed)"
    return "BertModel (given)" if isinstance(model, BertModel) else os.fspath(model)
