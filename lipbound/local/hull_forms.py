"""Edit sets as one relational set: the candidate words' input rows as an affine form over their own points.

For a replacement at one position p by any of K candidate words, the edited slot's input row ranges over the
words' rows ``x_w`` (after the embedding LayerNorm).  In the principal basis of the rows (centre ``c``, unit
directions ``v_k``, half-widths ``h_k = max_w |(x_w - c) . v_k|``) each word has coordinates ``t(w)`` in
``[-1, 1]^m`` (float32, chosen), and ``x_w = c + sum_k t_k(w) h_k v_k + r_w`` with ``|r_w| <= rho`` entrywise
(outward rounded over every word).  So the sentence's input rows lie in the affine form

    ``X(t, u) = X^0 + e_p (c - x^0_p + sum_k t_k h_k v_k + u)``,   t in conv{t(w)},  |u| <= rho,

whose first m box symbols range over the convex hull of the words' points
(:class:`~lipbound.rigorous.zonotope.Symbols` with ``points``): every bound of a linear function of the symbols is
its largest value over the words, not over the box (on all-MiniLM-L6-v2 the box would be about 15 times wider:
the rows spread evenly over 383 directions).  The form is pushed through each layer with the one affine arithmetic
(:class:`~lipbound.rigorous.zonotope.AffineForm`): the attention (queries, keys and values, bilinear scores, softmax
word by word (:func:`points_softmax`), the weighted values, ``W_O``, the residual), the LayerNorm (centring, the sum
of squares as a product, ``sqrt(d) / sqrt(s + d^3 eps)`` at every word as new point symbols, :func:`as_points`), the
GELU feed-forward block (each neuron by its mean-value form with GELU's slope range over the neuron's range) and the
output LayerNorm.  After each stage the
linearisation symbols are merged into the independent errors (:func:`condensed`); the words' symbols stay.

The set's bound at layer l (lemma edit-hull-form, docs/local.md): with the attention block's outputs ``Z_i(t) =
C_i + t B_i + (the rest, at most rho_i in norm)`` and the original outputs ``z^0``, the identity plan gives for
every word ``W1 <= (1/n) sum_i (||C_i - z^0_i + t(w) B_i|| + rho_i)``, evaluated for every word and maximised
(:func:`hull_bounds`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from ..numeric.attention import AttentionMap
from ..numeric.blas import one_blas_thread
from ..numeric.kernels import SOFTMAX, DotProduct
from ..rigorous.arrays import IntervalArray, gelu, gelu_slope, softmax
from ..rigorous.zonotope import AffineForm, Symbols, single_rows
from .relational import head_forms, mixed_output, weights_on
from .scores import visibility

__all__ = ["HullBounds", "candidate_form", "condensed", "points_softmax", "form_attention", "form_norm",
           "form_feedforward", "form_cost", "hull_bounds"]

#: The largest independent error a stage may leave before the layers end (the bound is then useless, and the next
#: products would overflow).
WIDEST = 1e12
#: Words whose scores and weights are formed at a time.
_POINT_ROWS = 1024


@final
@dataclass(frozen=True)
class HullBounds:
    """The hull form's certified W1 bounds of a one-slot replacement set.

    Attributes
    ----------
    bounds : dict
        ``bounds[l]``: the set's certified W1 at layer l (identity plan), for every layer reached.
    radii : dict
        ``radii[l]`` (n,): the non-word part ``rho_i`` of each token's bound (linearisation and rounding errors).
    spans : dict
        ``spans[l]`` (n,): per token the largest ``||C_i - z^0_i + t(w) B_i||`` over the words.
    seconds : dict
        ``seconds[l]``: CPU seconds of layer l (its attention and, before the next layer, its chain).
    stopped : str
        Why the form stopped before the last layer asked for ("" when it reached it).
    terms : dict
        ``terms[l]``: the largest independent error of the form entering layer l (``"input"``) and after each of its
        stages (``"attention"``, ``"norm"``, ``"feed-forward"``, ``"output norm"``): which term grows first.
    """

    bounds: dict
    radii: dict
    spans: dict
    seconds: dict
    stopped: str = ""
    terms: dict = field(default_factory=dict)

    def largest(self, layer: int) -> float:
        return float(self.bounds.get(layer, np.inf))


def candidate_form(own: IntervalArray, slot: int, candidates: IntervalArray) -> AffineForm:
    """The sentence's input rows (n, d) with row ``slot`` over the candidates' rows (K, d), enclosed, as an affine
    form whose first box symbols range over the words' points (module docstring).

    The principal directions and the words' coordinates are floats chosen freely; only the residual
    ``x_w - c - sum_k t_k(w) h_k v_k`` is enclosed, over every word and every point of its enclosure."""
    rows = candidates.mid
    centre = rows.mean(axis=0)
    _, values, basis = np.linalg.svd(rows - centre, full_matrices=False)
    basis = basis[values > values[0] * 1e-9]                                     # (m, d): the rows' own span
    coordinates = (rows - centre) @ basis.T                                      # (K, m)
    half = np.max(np.abs(coordinates), axis=0) * (1 + 1e-6)
    points = np.clip((coordinates / half).astype(np.float32), -1, 1)
    generators = half[:, None] * basis                                           # (m, d), float
    residual = candidates - IntervalArray(centre) - IntervalArray(points.astype(np.float64)).matmul(generators)
    rho = np.max(np.maximum(residual.hi, -residual.lo), axis=0)                  # (d,), over every word
    n, d = own.shape
    m = generators.shape[0]
    center = own.mid.copy()
    center[slot] = centre
    err = np.maximum(own.hi - own.mid, own.mid - own.lo)
    err[slot] = rho
    box = np.zeros((m, n, d))
    box[:, slot] = generators
    return AffineForm(center, np.zeros((0, n, d)), box, err, Symbols(points))


def condensed(form: AffineForm, symbols: Symbols | None = None) -> AffineForm:
    """The form with every box symbol after the words' merged into ``err`` (``|sum_b t_b B_b| <= sum_b |B_b|``
    entrywise), over a fresh counter (``symbols``: one whose points extend the form's by new columns, which the
    form does not read)."""
    points = form.symbols.points
    m = points.shape[1]
    symbols = symbols or Symbols(points)
    rest = IntervalArray(np.abs(form.box[m:])).sum(axis=0).hi if form.box.shape[0] > m else 0.0
    box = np.zeros((symbols.points.shape[1],) + form.shape)
    box[:min(m, form.box.shape[0])] = form.box[:m]
    err = (IntervalArray(form.err) + IntervalArray(np.broadcast_to(rest, form.shape).copy())).hi
    return AffineForm(form.center, form.l2, box, err, symbols)


def as_points(form: AffineForm, function) -> AffineForm:
    """``function`` of the form's entries at every word, as new point symbols (lemma edit-hull-points).

    At word w the entries lie in ``x_w = c + t(w) A +- (e + rest)``; ``function(x_w)`` (an interval map over a batch
    of words, (b, *S) -> (b, *S'), e.g. a row's norm) encloses their images.  Each entry whose value moves over the
    words gets a new symbol with coordinate ``t'(w) = fl32((y_w - mid) / half)`` (``y_w`` the enclosure's midpoint,
    ``mid +- half`` their range), generator ``half`` on that entry, and ``err`` the largest ``|f(x_w) - mid - t'(w)
    half|`` over the words (outward rounded).  The result lives on new symbols whose points are the old ones and the
    new columns; the forms it meets must be moved there by :func:`condensed` with those symbols."""
    points = form.symbols.points
    single, error, rest = _word_rows(form)
    width = (IntervalArray(error.reshape(form.shape)) + IntervalArray(rest)).hi

    def images(begin: int) -> IntervalArray:
        chunk = points[begin:begin + _POINT_ROWS]
        words = (chunk @ single).astype(np.float64).reshape((-1,) + form.shape)
        return function(IntervalArray.around(words, np.broadcast_to(width, words.shape)) + IntervalArray(form.center))

    shape = images(0).shape[1:]
    low, high = np.full(shape, np.inf), np.full(shape, -np.inf)
    for begin in range(0, points.shape[0], _POINT_ROWS):
        y = images(begin).mid
        low, high = np.minimum(low, y.min(axis=0)), np.maximum(high, y.max(axis=0))
    mid, half = (low + high) / 2, (high - low) / 2
    live = np.flatnonzero(half.reshape(-1) > 0)
    columns = np.empty((points.shape[0], live.size), dtype=np.float32)
    err = np.zeros(shape)
    for begin in range(0, points.shape[0], _POINT_ROWS):
        y = images(begin)
        flat = y.mid.reshape(y.shape[0], -1)
        t = np.clip(((flat[:, live] - mid.reshape(-1)[live]) / half.reshape(-1)[live]).astype(np.float32), -1, 1)
        columns[begin:begin + y.shape[0]] = t
        fitted = np.broadcast_to(mid.reshape(-1), flat.shape).copy()
        fitted_half = np.zeros(flat.shape)
        fitted_half[:, live] = t.astype(np.float64)
        offset = IntervalArray(fitted_half) * IntervalArray(half.reshape(-1)) + IntervalArray(fitted)
        gap = y.reshape(y.shape[0], -1) - offset
        err = np.maximum(err, np.max(np.maximum(gap.hi, -gap.lo), axis=0).reshape(shape))
    symbols = Symbols(np.concatenate([points, columns], axis=1))
    m = points.shape[1]
    box = np.zeros((m + live.size, int(np.prod(shape))))
    box[m + np.arange(live.size), live] = half.reshape(-1)[live]
    return AffineForm(mid, np.zeros((0,) + shape), box.reshape((m + live.size,) + shape), err, symbols)


def _check(engine: AttentionMap) -> None:
    if not (engine.residual and engine.W_O is not None and isinstance(engine.kernel, DotProduct)
            and engine.weights is SOFTMAX and engine.basis is None and engine.G == engine.H
            and not any(m.bias is not None or m.softcap is not None for m in engine.masks.masks)
            and visibility(engine, np.arange(2), np.arange(2)) is None):
        raise AssumptionError("layer", "unmasked dot-product softmax heads with output projection and residual",
                              "another attention", "the hull form covers BERT-style encoders")


def _word_rows(form: AffineForm) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The words' generators of a form in float32 (m, entries), the error bound of their products with the points
    per entry (:func:`~lipbound.rigorous.zonotope.single_rows`) and the bound on the
    rest of ``|x - c|`` (the other symbols and ``err``), entrywise."""
    m = form.symbols.points.shape[1]
    single, error = single_rows(form.box[:m].reshape(m, -1))
    rest = IntervalArray(np.abs(form.box[m:])).sum(axis=0).hi if form.box.shape[0] > m else np.zeros(form.shape)
    rest = (IntervalArray(rest) + IntervalArray(form.err)).hi
    return single, error, rest


def points_softmax(S: AffineForm) -> tuple[AffineForm, IntervalArray]:
    """Rows of the softmax of the scores S (H, n, n), every word evaluated (lemma edit-hull-softmax).

    At word w the scores lie in the box ``S_w = c + t(w) A +- (e + rest)`` (the words' part in float32 with its
    error e, the other symbols and errors anywhere).  A linear map ``p ~ a + Sigma (s - c)`` per row is fitted to
    the words' float weights (least squares; any a and Sigma give a valid form); its remainder
    ``softmax(S_w) - a - Sigma (S_w - c)`` is enclosed word by word in interval arithmetic and its largest size
    over the words joins the form as an independent error.  The weights' range over the words, from the same
    enclosures, is returned as the second value."""
    points = S.symbols.points
    H, n, k = S.shape
    single, error, rest = _word_rows(S)
    width = (IntervalArray(error.reshape(S.shape)) + IntervalArray(rest)).hi
    normal = np.zeros((H, n, k + 1, k + 1))
    moments = np.zeros((H, n, k + 1, k))
    for begin in range(0, points.shape[0], _POINT_ROWS):
        deviations = (points[begin:begin + _POINT_ROWS] @ single).astype(np.float64).reshape((-1,) + S.shape)
        scores = S.center + deviations
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        design = np.concatenate([np.ones(deviations.shape[:-1] + (1,)), deviations], axis=-1)
        normal += np.einsum("vhia,vhib->hiab", design, design)
        moments += np.einsum("vhia,vhil->hial", design, weights)
    ridge = 1e-12 * np.trace(normal, axis1=-2, axis2=-1)[..., None, None] + 1e-300
    coefficients = np.linalg.solve(normal + ridge * np.eye(k + 1), moments)                 # (H, n, k + 1, k)
    at, sigma = coefficients[:, :, 0, :], np.swapaxes(coefficients[:, :, 1:, :], -1, -2)   # (H, n, k), (H, n, k, k)
    largest, lo, hi = np.zeros(S.shape), np.ones(S.shape), np.zeros(S.shape)
    for begin in range(0, points.shape[0], _POINT_ROWS):
        deviations = (points[begin:begin + _POINT_ROWS] @ single).astype(np.float64).reshape((-1,) + S.shape)
        moved = IntervalArray.around(deviations, np.broadcast_to(width, deviations.shape))   # S_w - c
        exact = softmax(moved + IntervalArray(S.center), np.ones(k))
        remainder = exact - moved.einsum("vhik,hilk->vhil", IntervalArray(sigma)) - IntervalArray(at)
        largest = np.maximum(largest, np.max(np.maximum(remainder.hi, -remainder.lo), axis=0))
        lo, hi = np.minimum(lo, exact.lo.min(axis=0)), np.maximum(hi, exact.hi.max(axis=0))
    weights = IntervalArray(lo, np.maximum(lo, hi))
    P = S.row_map(sigma, IntervalArray(at)).shift(IntervalArray(-largest, largest))
    return P.within(weights), weights


def form_attention(layer, X: AffineForm) -> AffineForm:
    """``X + MHA(X)`` of an attention layer (with residual) on the form X (n, d): the steps of
    :class:`~lipbound.local.relational.RelationalAttention` on any input form."""
    engine = AttentionMap(layer)
    _check(engine)
    S, V = head_forms(engine, X.linear(engine.W, engine.bias))
    if S.symbols.points is not None and S.box.shape[0] >= S.symbols.points.shape[1]:
        P, weights = points_softmax(S)
    else:
        P, weights = S.softmax(weights_on(S.hull()))
        P = P.within(weights)
    return mixed_output(engine, P, V, weights, X)


def form_norm(norm, Z: AffineForm) -> AffineForm:
    """A LayerNorm ``gamma sqrt(d) u / sqrt(||u||^2 + d eps) + beta`` (u the centred row) on the form Z (n, d):
    ``d u = Z (d I - 1 1^T)`` (an integer matrix, exact) times ``r = sqrt(d) / sqrt(||d u||^2 + d^3 eps)``.  With the
    words' points, r is evaluated at every word from its own row (:func:`as_points`, lemma edit-hull-points);
    otherwise ``||d u||^2`` is a product and r its mean-value form over the sum's certified range (whose lower end
    is the certified variance bound: not certified when it is not positive and eps vanishes)."""
    d = Z.shape[-1]
    if not norm.centred:
        raise AssumptionError("norm", "a LayerNorm (centred)", "an RMSNorm", "the hull form covers encoders")
    scaled = Z.linear(d * np.eye(d) - np.ones((d, d)))                            # d u
    floor = IntervalArray(float(d)) * IntervalArray(float(d)) * IntervalArray(float(d)) * IntervalArray(float(norm.eps))
    root_d = IntervalArray(float(d)).sqrt()
    if Z.symbols.points is not None:   # every word's r from its own row, as new point symbols
        inverse = as_points(scaled, lambda x: root_d / (x.square().sum(axis=-1) + floor).sqrt())
        scaled = condensed(scaled, inverse.symbols)
    else:
        squares = scaled.product(scaled, "ik,ik->i")                              # (n,)
        s = squares.hull()
        low = np.maximum(s.lo, 0.0)
        ranged = IntervalArray(low, np.maximum(low, s.hi)) + floor
        if not np.all(ranged.lo > 0):
            raise NotCertifiedError("LayerNorm", "a positive variance over the set", "a range reaching 0",
                                    "split the candidates")
        value = root_d / (IntervalArray(np.maximum(squares.center, 0.0)) + floor).sqrt()
        inverse = squares.elementwise(value, IntervalArray(-0.5) * root_d / (ranged * ranged.sqrt()))   # (n,)
    return scaled.product(inverse, "ik,i->ik").linear(np.diag(np.asarray(norm.gamma, dtype=np.float64)), None) \
        .shift(IntervalArray(np.asarray(norm.center, dtype=np.float64)))


def form_feedforward(ffn, Y: AffineForm) -> AffineForm:
    """``Y + GELU(Y W_1 + b_1) W_2 + b_2`` on the form Y (n, d), each neuron by its mean-value form with GELU's
    slope range over the neuron's range (:func:`~lipbound.rigorous.arrays.gelu_slope`)."""
    if ffn.act != "gelu" or getattr(ffn, "W_gate", None) is not None:
        raise AssumptionError("ffn", "an exact-GELU feed-forward block", f"activation {ffn.act}",
                              "the hull form covers BERT-style encoders")
    hidden = Y.linear(ffn.W_1, ffn.b_1)
    activated = hidden.elementwise(gelu(IntervalArray(hidden.center)), gelu_slope(hidden.hull()))
    return activated.linear(ffn.W_2, ffn.b_2) + Y


def form_cost(Z: AffineForm, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per word ``(1/n) sum_i ||Z_i - z^0_i||`` bounded (the identity plan's cost), with per token the words' part
    ``max_w ||C_i - z^0_i + t(w) B_i||`` and the rest ``rho_i`` (lemma edit-hull-form).

    ``t(w) B_i`` is formed in float32 (the points are exact float32; ``B`` rounded to float32): its error is at most
    ``|B - fl32(B)| + gamma_m |fl32(B)|`` entrywise summed over the symbols (``|t| <= 1``), added to the enclosure."""
    if Z.l2.shape[0]:
        raise AssumptionError("Z", "a form with box symbols only", "Euclidean symbols", "build it by candidate_form")
    points = Z.symbols.points
    n, d = Z.shape
    single, error, rest = _word_rows(Z)
    single, error = single.reshape(-1, n, d), error.reshape(n, d)
    rho = IntervalArray(rest).norm_upper()                                                          # (n,)
    offset = IntervalArray(Z.center) - IntervalArray(reference)                                     # (n, d)
    total = np.zeros(points.shape[0])
    spans = np.zeros(n)
    for i in range(n):
        words = (points @ single[:, i]).astype(np.float64)
        moved = IntervalArray.around(words, error[i][None, :]) + offset[i].expand(0)
        norms = moved.norm_upper()                                                                  # (K,)
        spans[i] = float(np.max(norms))
        total = (IntervalArray(total) + IntervalArray(norms)).hi
    cost = ((IntervalArray(total) + IntervalArray(rho).sum(axis=0)) / float(n)).hi
    return cost, spans, rho


@one_blas_thread
def hull_bounds(model, own: IntervalArray, slot: int, candidates: IntervalArray, references: list, last: int,
                progress=None) -> HullBounds:
    """The hull form of a one-slot replacement set (:func:`candidate_form`) pushed through layers ``0..last`` of a
    post-norm BERT model; per layer the set's certified W1 under the identity plan (the largest per-word cost of
    :func:`form_cost`).  An enclosure that overflows or a variance that may vanish ends the layers there."""
    X = candidate_form(own, slot, candidates)
    bounds, radii, spans, seconds, terms = {}, {}, {}, {}, {}
    stopped = ""

    def stage(name: str, form: AffineForm, widest: dict) -> AffineForm:
        """The form condensed, its largest independent error recorded; past :data:`WIDEST` the layers end."""
        form = condensed(form)
        widest[name] = float(np.max(form.err))
        if not widest[name] <= WIDEST:
            raise NotCertifiedError("hull form", f"independent errors below {WIDEST:g}",
                                    f"{widest[name]:.3g} after the {name}", "split the candidates")
        return form

    for index in range(last + 1):
        began = time.process_time()
        item = model.layer(index)
        widest: dict = {"input": float(np.max(X.err))}
        try:
            # (an overflow inside an enclosure ends in a non-finite interval, which the interval layer refuses)
            with np.errstate(over="ignore", invalid="ignore"):
                Z = stage("attention", form_attention(item.as_layer(residual=True), X), widest)
                cost, spans[index], radii[index] = form_cost(Z, references[index])
                bounds[index] = float(np.max(cost)) if np.all(np.isfinite(cost)) else np.inf
                if index < last:
                    Y = stage("norm", form_norm(item.ln_out, Z), widest)
                    F = stage("feed-forward", form_feedforward(item.ffn, Y), widest)
                    X = stage("output norm", form_norm(item.ffn_norm, F), widest)
        except NotCertifiedError as error:
            stopped = f"layer {index}: {error}"
            seconds[index], terms[index] = time.process_time() - began, widest
            break
        seconds[index], terms[index] = time.process_time() - began, widest
        if progress is not None:
            progress(index, bounds.get(index))
    return HullBounds(bounds, radii, spans, seconds, stopped, terms)
