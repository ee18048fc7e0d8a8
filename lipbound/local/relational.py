"""Relational routes of ``local``: an attention layer pushed through the Frobenius ball as one affine form.

The per-token description of :mod:`lipbound.local.balls` lets every token move by eps at once, where
a Frobenius ball lets the tokens share eps (``sum_j ||y_j - x_j||^2 <= eps^2``), and it bounds scores,
weights and values one by one.  Here ``U(X, eps)`` is the affine form ``X + eps E``, ``||E||_F <= 1``
(:class:`~lipbound.rigorous.zonotope.AffineForm`), and the attention layer is evaluated on it: queries,
keys and values (linear), the scores ``c q_i . k_j`` (bilinear, the product of the deviations bounded by
the operator norms of their generators), the softmax (mean-value form, with lipbound's own softmax ranges
(:func:`~lipbound.local.bounds._softmax_range`) and the simplex intersected), the weighted values, ``W_O``
and the residual.  What the routes take from it (:class:`RelationalAttention`):

* ``scores`` (H, n, n): an enclosure of every score on U, the form's hull intersected with its closed form
  on the ball (:func:`frobenius_scores`, used alone where no form is built);
  handed to :func:`~lipbound.local.bounds.attention_bounds` it gives Jacobian blocks, their variation and
  the movement on U from weights that move together;
* ``radii`` (n,): ``sup_U ||F_i(Y) - F_i(X~)||`` per output token, the operator norm of the token's
  generators: the token balls handed to the components after the attention in a block or a stack.

The route (:class:`RelationalRoute`) also meets the weights' ranges with those of each softmax row on the ball,
its scores moving together (:class:`~lipbound.local.ball_weights.BallWeights`, lemma softmax-ball), wherever it
reads weights: the bounds on U, every radius of the curvature integral, the Jacobian enclosed over U.

Covered: dot-product softmax heads without masks or rotations in a layer with an output projection and
residual (the encoder layers of BERT-type models), Frobenius and (2,1) balls (the (2,1) ball lies in the
Frobenius ball of the same radius).  Anything else gets no relational route (``None``), never another
layer's bound.
"""

from __future__ import annotations

import functools
import math
from typing import final

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from ..numeric.attention import AttentionMap
from ..numeric.kernels import SOFTMAX, DotProduct
from ..numeric.model import Layer
from ..rigorous.arrays import IntervalArray
from ..rigorous.zonotope import AffineForm, Symbols
from .ball_weights import BallWeights
from .balls import Neighbourhood
from .bounds import LocalBounds, _softmax_range, attention_bounds
from .enclosed import EnclosedAttention
from .jacobian_forms import JacobianSpread, weight_changes
from .joint_heads import JointHeads
from .scores import score_scale, visibility

__all__ = ["RelationalAttention", "RelationalRoute", "covers", "frobenius_scores"]


def covers(target, hood: Neighbourhood) -> bool:
    """True when the relational route applies: an attention layer with output projection and residual,
    unmasked dot-product softmax heads without rotations, on a Frobenius or (2,1) ball of radius > 0."""
    if hood.ball not in ("fro", "2,1") or hood.eps <= 0 or not isinstance(target, Layer):
        return False
    engine = AttentionMap(target)
    return (engine.residual and engine.W_O is not None and isinstance(engine.kernel, DotProduct)
            and engine.weights is SOFTMAX and engine.basis is None and engine.G == engine.H
            and not any(m.bias is not None or m.softcap is not None for m in engine.masks.masks)
            and visibility(engine, np.arange(2), np.arange(2)) is None)


def frobenius_scores(E: EnclosedAttention, eps: float) -> IntervalArray:
    """Every score of an attention layer covered by :func:`covers` on the Frobenius ball ``||Y - X||_F <= eps``,
    enclosed, (H, n, n).

    The scores are quadratic in Y: with ``e = Y - X``, ``s_ij(Y) - s_ij(X) = c (e_i . W_Q k_j + e_j . W_K q_i
    + e_i W_Q W_K^T e_j^T)`` (bars dropped: queries and keys at X).  For i != j the two tokens share eps
    (``||e_i||^2 + ||e_j||^2 <= eps^2``), so by Cauchy-Schwarz the linear part is at most
    ``eps (a_ij^2 + b_ij^2)^(1/2)`` and the quadratic part at most ``g ||e_i|| ||e_j|| <= g eps^2 / 2``; for
    i = j they are at most ``eps ||W_Q k_i + W_K q_i||`` and ``g eps^2`` (``a_ij = ||W_Q k_j||``,
    ``b_ij = ||W_K q_i||``, ``g = ||W_Q W_K^T||``: :class:`~lipbound.local.scores.ScoreNorms`).  It is the
    affine form's product :meth:`AffineForm.dot` on the ball, written in closed form with the exact norm of
    the quadratic part, and costs no generators."""
    pairs, n = E.norms, E.n
    a, b = IntervalArray(pairs.a), IntervalArray(pairs.b)
    across = (a * a + b * b).sqrt().hi                                            # (H, n, n)
    own = (pairs.key_vectors[:, 0] + pairs.w[:, :, 0]).norm_upper()              # (H, n)
    eye = np.eye(n, dtype=bool)[None]
    linear = np.where(eye, own[:, :, None], across)
    g = np.broadcast_to(pairs.g, linear.shape)
    quadratic = np.where(eye, g, (IntervalArray(g) * IntervalArray(0.5)).hi)
    t = IntervalArray(float(eps))
    deviation = (E.c * (t * IntervalArray(linear) + t * t * IntervalArray(quadratic))).hi
    return E.S + IntervalArray(-deviation, deviation)


#: Steps of the relational curvature integral's upper Riemann sum, of equal width eps / RELATIONAL_STEPS: the bound
#: grows steeply near eps, where 24 radii per decade spent most of theirs far below it (MiniLM layer 0, "The cat sat
#: on the mat.", 1e-2 R: 18.78 with 24 radii per decade, 18.70 with 16 equal steps, 19.11 with 12, 19.95 with 8; CPU
#: time in proportion to the radii).
RELATIONAL_STEPS = 16
#: Largest number of entries (box symbols times output entries) of the output form's box generators for which the whole
#: output form is built; beyond it the token radii are formed one output token at a time with the symbols that token
#: reads (:meth:`RelationalAttention.radii`).  At n = 20 tokens of MiniLM the whole form's box generators are 22080
#: symbols x 7680 entries (1.4 GB an array, past 9.7 GB resident while they are formed); at n = 9 about 2.2e7.
WHOLE_OUTPUT_ENTRIES = 50_000_000
#: Past it, about the entries of the values' box generators of a panel of output tokens formed at once (a token's
#: queries carry about 3 H n box symbols): 4 tokens a panel at n = 20 on MiniLM, 0.18 GB an array.
TOKEN_PANEL_ENTRIES = 25_000_000
#: the route runs where the variation found so far exceeds this fraction of ``||DF(X)||``: below it the certified
#: value is within that fraction of its floor, and the route's grid costs about twice the curve's curvature bounds
RELATIONAL_WORTH = 0.25


def relational_grid(eps: float) -> list[float]:
    """``eps k / RELATIONAL_STEPS`` for k = 1, ..., RELATIONAL_STEPS (the last is eps itself)."""
    return [eps * k / RELATIONAL_STEPS for k in range(1, RELATIONAL_STEPS)] + [eps]


def weights_on(scores: IntervalArray) -> IntervalArray:
    """Every attention weight (unit masses) where every score lies in ``scores`` (H, n, n): lipbound's softmax
    ranges (:func:`~lipbound.local.bounds._softmax_range`)."""
    hi, lo = _softmax_range(scores, np.ones(scores.shape[-1]))
    return IntervalArray(lo, np.maximum(lo, hi))


def _meet(*boxes: IntervalArray) -> IntervalArray:
    """The intersection of enclosures of one quantity."""
    lo = np.max([box.lo for box in boxes], axis=0)
    return IntervalArray(lo, np.maximum(lo, np.min([box.hi for box in boxes], axis=0)))


def head_forms(engine: AttentionMap, projected: AffineForm) -> tuple[AffineForm, AffineForm]:
    """The scores ``c q_i . k_j`` (H, n, n) and the values (H, n, d_v) of a layer's fused projection ``projected``
    (n, width), as affine forms."""
    Q, K, V = (engine.per_head(projected, part) for part in ("queries", "keys", "values"))
    return Q.dot(K).scale(score_scale(engine)), V


def ball_head_forms(engine: AttentionMap, X: np.ndarray, eps: float) -> tuple[AffineForm, AffineForm, AffineForm]:
    """The Frobenius ball U about X (n, d) of radius eps, and :func:`head_forms` of its fused projection: the scores
    (H, n, n) and the values (H, n, d_v), formed part by part.

    Each of the queries, keys and values is the ball's image under its own columns of the fused projection, its
    generators copied into the (H, n, k) order of the heads: the sums over the symbols then run by panels of entries
    (a view's order gives whole-size temporaries), and the queries and keys go once the scores are formed.  The
    centres are the fused product's columns and the rest is entrywise, so these are the floats of :func:`head_forms`
    on the fused image.  Memory at n = 20 tokens of MiniLM: about 2.2 GB at most (0.47 GB an array of generators),
    against 3.6 GB for the fused image (1.4 GB) and its views' sums."""
    def image(index: int, symbols=None) -> tuple[AffineForm | None, AffineForm]:
        """The ball (None with ``symbols``: it goes before the copy) and its image's part ``index``."""
        ball, fused = AffineForm.ball_image(X, eps, engine.W, engine.bias, engine.columns[index])
        if symbols is not None:
            ball = None
        count, width = ((engine.H, engine.d_k), (engine.G, engine.d_k), (engine.G, engine.d_v))[index]
        heads = fused.reshape(X.shape[0], count, width).swapaxes(-2, -3)
        del fused
        parts = (heads.center, heads.l2, heads.box, heads.err)
        return ball, AffineForm(*(np.ascontiguousarray(part) for part in parts), symbols or heads.symbols)
    U, Q = image(0)
    S = Q.dot(image(1, U.symbols)[1])
    del Q   # (before the scaling's temporaries, 1.3 GB)
    return U, S.scale(score_scale(engine)), image(2, U.symbols)[1]


def mixed_output(engine: AttentionMap, P: AffineForm, V: AffineForm, weights: IntervalArray,
                 X: AffineForm) -> AffineForm:
    """``X + concat_h(P_h V_h) W_O + b_O``: the weights' form P (H, n, n), within ``weights``, mixing the values."""
    merged = P.mix(V, weights).swapaxes(-2, -3).reshape(X.shape[0], engine.H * engine.d_v)
    return merged.linear(engine.W_O, engine.b_O) + X


def token_rows(engine: AttentionMap, P: AffineForm, V: AffineForm, weights: IntervalArray, X: AffineForm,
               rows: slice) -> AffineForm:
    """Rows ``rows`` (a panel of consecutive tokens) of :func:`mixed_output`, formed alone: the queries' weights
    ``P[:, rows]`` with only the box symbols that are not zero on them (each box symbol of the weights lives in one
    query's row: a score's own, its row's softmax remainder, a range put in its place), mixing the values V, then
    ``W_O`` and X's rows (V and X without box symbols, as those of :class:`RelationalAttention`).

    Every operation of the form acts on an output row through its query's row of the weights alone, so this is the
    whole form's rows with the symbols that are zero on them left out, counted afresh (the Euclidean symbols all kept;
    the roundings' bounds may differ in the last bits, counting fewer symbols).  Memory: the whole form's box
    generators are (box symbols, n, d), the panel's (its own symbols, its rows, d)."""
    live = np.flatnonzero(np.any(P.box[:, :, rows] != 0, axis=(1, 2, 3)))
    symbols = Symbols()
    symbols.fresh(live.size)
    panel = AffineForm(P.center[:, rows], P.l2[:, :, rows], P.box[live, :, rows], P.err[:, rows], symbols)
    own = AffineForm(X.center[rows], X.l2[:, rows], X.box[:, rows], X.err[rows], X.symbols)
    return mixed_output(engine, panel, V.with_symbols(symbols), weights[:, rows], own.with_symbols(symbols))


@final
class RelationalAttention:
    """An attention layer with residual on ``U(X, eps)``, as affine forms (module docstring).

    Parameters
    ----------
    target : Layer
        Covered by :func:`covers`.
    X : ndarray (n, d)
        The centre.
    eps : float
        The Frobenius radius.
    enclosed : EnclosedAttention, optional
        The layer at X (for the norms of :func:`frobenius_scores`).
    scores_only : bool
        Keep only the score enclosure (the forms, (n d)^2-sized, are dropped: no weights, output or radii).
    known_weights : IntervalArray (H, n, n), optional
        Weight ranges known to hold on U (:class:`~lipbound.local.ball_weights.BallWeights`), met with the form's.

    Attributes
    ----------
    scores : IntervalArray (H, n, n)
    weights : IntervalArray (H, n, n)
        Enclosures of the attention weights on U.
    output : AffineForm (n, d)
    radii : ndarray (n,)
        ``sup_U ||F_i(Y) - c_i||`` about the form's centre ``c`` (:attr:`drift` bounds ``||c_i - F_i(X)||``).
    """

    def __init__(self, target: Layer, X: np.ndarray, eps: float, enclosed: EnclosedAttention | None = None,
                 scores_only: bool = False, known_weights: IntervalArray | None = None):
        X = np.asarray(X, dtype=np.float64)
        engine = AttentionMap(target)
        E = enclosed or EnclosedAttention(target, X)
        if self._whole_output(engine, X.shape[0]):
            U, projected = AffineForm.ball_image(X, eps, engine.W, engine.bias)
            S, V = head_forms(engine, projected)
            del projected
        else:   # (the fused image, 3 n d x n d, is not formed: ball_head_forms)
            U, S, V = ball_head_forms(engine, X, eps)
        # (the closed form is never wider than the score-deviation theorem on the token balls of U)
        self.scores = _meet(S.hull(), frobenius_scores(E, eps))
        self.enclosed, self._engine, self._known = E, engine, known_weights
        self._forms = None if scores_only else (U, S, V)   # (the forms hold (n d)^2-sized generators each)

    @functools.cached_property
    def weights(self) -> IntervalArray:
        return self._weights[0]

    @functools.cached_property
    def weights_form(self) -> AffineForm:
        """The attention weights (H, n, n) as an affine form over the ball's symbols (within :attr:`weights`)."""
        return self._weights[1]

    @functools.cached_property
    def _weights(self) -> tuple:
        """The weights' enclosure and form (only a caller that needs them pays for them)."""
        if self._forms is None:
            raise AssumptionError("scores_only", "False for the weights and the output", "True",
                                  "build RelationalAttention without scores_only")
        S = self._forms[1]
        masses = np.ones(S.shape[-1])
        p_hi, p_lo = _softmax_range(S.hull(), masses)     # on the form's whole score box (the mean value form's need)
        P, box = S.softmax(IntervalArray(p_lo, np.maximum(p_lo, p_hi)))
        weights = _meet(box, weights_on(self.scores))       # on the scores of U only: the weights' values
        if self._known is not None:
            weights = _meet(weights, self._known)
        return weights, P.within(weights)

    @functools.cached_property
    def output(self) -> AffineForm:
        """The layer's output on U (n, d) as an affine form."""
        (U, _, V), engine = self._forms, self._engine
        weights, P = self._weights
        return mixed_output(engine, P, V, weights, U)

    @functools.cached_property
    def radii(self) -> np.ndarray:
        """``sup_U ||F_i(Y) - c_i||`` per output token (n,): the whole output form's token radii, or (past
        :data:`WHOLE_OUTPUT_ENTRIES`) by panels of tokens from their own rows of the form (:func:`token_rows`)."""
        return self._token_parts[0]

    @functools.cached_property
    def drift(self) -> np.ndarray:
        """``||c_i - F_i(X)||`` bounded: the form's centre against the layer's enclosure at X."""
        return (IntervalArray(self._token_parts[1]) - self.enclosed.output).norm_upper()

    @functools.cached_property
    def _token_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """The token radii and the centre (n, d) of the output form, from the whole form where it is formed or
        small enough, else row by row."""
        U, S, V = self._forms
        if "output" in self.__dict__ or self._whole_output(self._engine, U.shape[0]):
            return self.output.token_radii(), self.output.center
        weights, P = self._weights
        engine, n = self._engine, U.shape[0]
        # panels of tokens whose values' box generators (3 H n symbols a query, H n d_v entries) stay within a budget
        size = max(1, TOKEN_PANEL_ENTRIES // (3 * engine.H * n * engine.H * n * engine.d_v))
        radii, centre = np.empty(n), np.empty(U.shape)
        for start in range(0, n, size):   # (each panel's form goes before the next one's is formed)
            rows = slice(start, min(start + size, n))
            panel = token_rows(engine, P, V, weights, U, rows)
            radii[rows], centre[rows] = panel.token_radii(), panel.center
        return radii, centre

    @staticmethod
    def _whole_output(engine: AttentionMap, n: int) -> bool:
        """Whether the whole output form is small enough to build (:data:`WHOLE_OUTPUT_ENTRIES`): its box symbols are
        about the scores' own (H n^2), as many again from the softmax, and one per mixed value."""
        symbols = 3 * engine.H * n * n + engine.H * n * engine.d_v
        return symbols * n * engine.W_O.shape[1] <= WHOLE_OUTPUT_ENTRIES

    def bounds(self, target: Layer, hood: Neighbourhood) -> LocalBounds:
        """:func:`~lipbound.local.bounds.attention_bounds` on the token balls of ``hood`` with the relational
        score enclosure, its movement also capped by the relational radii (about X)."""
        balls = hood.balls(self.enclosed.X.mid)
        found = attention_bounds(target, balls, self.enclosed, scores=self.scores, weights=self._known)
        reach = (IntervalArray(self.radii) + IntervalArray(self.drift)).hi
        return LocalBounds(np.minimum(found.movement, reach), found.blocks, found.variation, found.at_center,
                           found.output, found.facts)


@final
class RelationalRoute:
    """The relational facts of the first component of a chain (an attention layer covered by :func:`covers`)
    on each ``U(X, t)`` asked for, computed once per radius, and what ``local`` takes from them:

    * :meth:`tighten`: the component's bounds on the token balls of U with the relational scores and weights
      (blocks, variation, movement; the movement also capped by the relational token radii), entrywise the smaller
      of these and the per-token theorems' (each holds on U);
    * :meth:`variation`: the curvature integral of theorem local-attention-curvature (``||DF(Y) - DF(X)||`` on
      U through the second derivative, :class:`~lipbound.local.curvature.CurvatureIntegral`) with the
      relational score and weight ranges on every radius of its grid;
    * :meth:`jacobian`: the Jacobian enclosed over U (theorem local-attention-jacobian,
      :class:`~lipbound.local.jacobian_forms.JacobianSpread`) from the weights' ranges on U: a bound on
      ``sup_U ||DF(Y) - DF(X)||`` and one on ``sup_U ||DF(Y)||`` itself (a single attention layer only);
    * :meth:`joint_supremum`: ``sup_U ||DF(Y)||`` with the heads' paths joined through quadratic forms
      (lemma jacobian-heads-joint, :class:`~lipbound.local.joint_heads.JointHeads`).
    """

    def __init__(self, component, X: np.ndarray, enclosed: EnclosedAttention, movement: bool = True):
        self.component, self.X, self.enclosed = component, np.asarray(X, dtype=np.float64), enclosed
        self.movement = movement      # whether a later component reads the movement (the token radii cost most)
        self._at: dict = {}
        self._weights: dict = {}
        self._ball_at: dict = {}
        self._spread: JacobianSpread | None = None
        self._joint: JointHeads | None = None
        self._ball = BallWeights.of(enclosed)

    @classmethod
    def of(cls, chain, X, enclosed, neighbourhoods) -> RelationalRoute | None:
        first = chain[0]
        if first.kind != "attention" or not any(covers(first.target, hood) for hood in neighbourhoods):
            return None
        return cls(first, X, enclosed, movement=len(chain) > 1)

    def scores(self, eps: float) -> IntervalArray:
        """The relational score enclosure on ``U(X, eps)``: :func:`frobenius_scores` (the form's own hull, no
        tighter for the scores, is taken where the form is built anyway: :meth:`tighten`)."""
        if eps not in self._at:
            self._at[eps] = frobenius_scores(self.enclosed, eps)
        return self._at[eps]

    def weights(self, eps: float) -> IntervalArray:
        """Every attention weight on ``U(X, eps)``: lipbound's softmax ranges on :meth:`scores`, met with the
        rows' joint bound on the Frobenius ball (:class:`~lipbound.local.ball_weights.BallWeights`)."""
        if eps not in self._weights:
            box, ball = weights_on(self.scores(eps)), self._ball_weights(eps)
            self._weights[eps] = box if ball is None else _meet(box, ball)
        return self._weights[eps]

    def _ball_weights(self, eps: float) -> IntervalArray | None:
        """:meth:`BallWeights.weights` on ``U(X, eps)`` (computed once per radius), or None where it does not apply."""
        if self._ball is None:
            return None
        if eps not in self._ball_at:
            self._ball_at[eps] = self._ball.weights(eps)
        return self._ball_at[eps]

    def known(self, eps: float) -> dict:
        """The score and weight ranges on ``U(X, eps)``, as keyword arguments of
        :func:`~lipbound.local.bounds.attention_bounds` (which meets the weights with the scores' softmax ranges
        itself)."""
        return {"scores": self.scores(eps), "weights": self._ball_weights(eps)}

    def tighten(self, hood: Neighbourhood, bounds: LocalBounds) -> LocalBounds:
        """``bounds`` (the component's on the token balls of ``hood``) made entrywise no larger by the relational
        facts; unchanged where the route does not cover ``hood``."""
        if not covers(self.component.target, hood):
            return bounds
        try:
            if self.movement:
                relational = RelationalAttention(self.component.target, self.X, hood.eps, self.enclosed,
                                                 known_weights=self.weights(hood.eps))
                self._at[hood.eps] = relational.scores
                found = relational.bounds(self.component.target, hood)
            else:   # a single attention layer: only the scores and weights are read
                found = attention_bounds(self.component.target, hood.balls(self.X), self.enclosed,
                                         **self.known(hood.eps))
        except NotCertifiedError:   # an enclosure overflowed: the per-token bounds stand alone
            return bounds
        return LocalBounds(np.minimum(bounds.movement, found.movement), np.minimum(bounds.blocks, found.blocks),
                           np.minimum(bounds.variation, found.variation), bounds.at_center, bounds.output,
                           found.facts)

    def variation(self, curvature, hood: Neighbourhood, other: float) -> float:
        """The curvature route's integral for ``U(X, hood.eps)`` (``curvature``: the curve's
        :class:`~lipbound.local.curve._CurvatureRoute`) with the relational scores on each radius of
        :func:`relational_grid`; inf where the route does not cover ``hood`` or the partial sum passes ``other``."""
        if not covers(self.component.target, hood):
            return math.inf
        try:
            # (the curvature route's steps add that U(X, t) lies in the Frobenius ball of radius t)
            return curvature.variation(hood, other, grid=relational_grid, known=self.known)
        except NotCertifiedError:
            return math.inf

    def jacobian(self, hood: Neighbourhood) -> tuple[float, float]:
        """``(spread, supremum)``: bounds on ``sup_U ||DF(Y) - DF(X)||_2`` and ``sup_U ||DF(Y)||_2`` for ``U = U(X,
        hood.eps)`` (:class:`~lipbound.local.jacobian_forms.JacobianSpread`, the weights' changes entry by entry: on
        MiniLM's layer 0 at 1e-2 and 1e-1 R the weights' affine form gives the same row changes, at several seconds
        per radius); ``(inf, inf)`` where the route does not cover ``hood``."""
        if not covers(self.component.target, hood):
            return math.inf, math.inf
        try:
            if self._spread is None:
                self._spread = JacobianSpread(self.component.target, self.enclosed)
            weights = self.weights(hood.eps)
            delta = weight_changes(weights, self.enclosed.P)
            return self._spread.spread(hood.eps, weights, delta), self._spread.supremum(hood.eps, weights, delta)
        except NotCertifiedError:
            return math.inf, math.inf

    def joint_supremum(self, hood: Neighbourhood) -> float:
        """``sup_U ||DF(Y)||_2`` for ``U = U(X, hood.eps)`` with every head's paths joined in one pair of quadratic
        forms (:class:`~lipbound.local.joint_heads.JointHeads`), from the weights' ranges on U; inf where the route
        does not cover ``hood``."""
        if not covers(self.component.target, hood):
            return math.inf
        try:
            if self._joint is None:
                self._joint = JointHeads(self.component.target, self.enclosed)
            return self._joint.supremum(hood.eps, self.weights(hood.eps))
        except NotCertifiedError:
            return math.inf
