"""A block's per-token maps on the attention's output set, carried as affine forms plus per-token balls.

After a block's attention A (with residual) the maps act token by token: ``LN_1``, the feed-forward block with its
residual, ``LN_2``.  The per-token balls of :mod:`lipbound.local.tail` give every map the whole ball before it and pay
its supremum there, so at 1e-2 R the feed-forward block's balls are several times the true movement and the output
LayerNorm's reach past its centre.  Here the image of U is the set (docs/local.md, lemma token-form-step)

    S_k = { x~_k + f_k(e) + z :  ||e||_2 <= 1,  ||z_i|| <= b_i per token },

``x~_k`` the chain's float point before map k, ``f_k`` an affine form over the ball's Euclidean symbols (one row form
per token, :class:`~lipbound.rigorous.zonotope.AffineForm`, its generators the directions the tokens move along
together) and ``b`` the radii of independent per-token balls (the remainders).  It starts from the attention's Taylor
form on U, ``A(Y) = A(X) + (Y - X) DA(X) + r`` with ``||r_i|| <= rest_i`` (lemmas attention-reach-remainder and
curvature-per-query); every map g is then linearised about the float point: ``g(x) = g(x~) + (x - x~) M + q``, M the
midpoint of g's enclosed Jacobian at ``x~`` acting on the form's generators exactly, and ``q`` bounded in norm:

* LayerNorm: ``||q|| <= r (||J - M|| + V(r))`` (mean value: the Jacobian's variation ``V`` on the token's ball of
  radius r, :func:`~lipbound.local.bounds.norm_bounds`, which keeps a certified lower bound on the centred norm);
* feed-forward block: ``||q|| <= r ||J - M|| + (1/2) P Q`` (lemma feedforward-taylor-joint): the GELU values' second
  order remainders ``|phi_k(t_k)| <= S_k t_k^2 / 2`` (``S_k`` at least the Taylor quotients ``|2 phi_k(t) / t^2|`` on
  neuron k's pre-activation range, :mod:`lipbound.local.taylor_quotients`)
  summed through ``W_2`` by Cauchy-Schwarz over the neurons, with ``P >= ||(S_k^(1/2) t_k)_k||`` and ``Q >= sup_v
  ||(S_k^(1/2) t_k r_k.v)_k||`` from the Gram matrices of the form's pre-activation generators.

The remainders need not be round (lemma token-form-carried): the attention's Taylor remainder and each LayerNorm's
(``rho diag(gamma)``, ``||rho|| <= T / max|gamma|``) are carried as balls of their own symbols per token, which the
later linear steps map by their matrices M, so the feed-forward block sees them through ``||N w_k||`` rather than
``||N|| ||w_k||``; only the feed-forward remainder, whose outlier neurons are bounded apart (lemma
feedforward-taylor-separated), stays a plain ball.

The radii ``sup ||x - x~_k||`` per token of each ``S_k`` bound the token balls before each map, and the output
set's Frobenius radius the block's reach.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import NotCertifiedError
from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import Enclosure, spectral_norm_upper_large
from ..rigorous.zonotope import AffineForm, Symbols, sum_upper
from ..symbolic import local as T
from .balls import TokenBalls
from .bounds import evaluate_theorem, evaluate_theorem_lower, norm_bounds
from .centre import rounding_reach
from .enclosed import EnclosedFeedForward, EnclosedNorm
from .feedforward_taylor import (
    _off_generators,
    feedforward_remainder,
    feedforward_remainder_along,
    gelu_curvature_ceiling,
    remainder_floor,
)

__all__ = ["TokenForms", "BlockForms", "block_token_forms", "block_form_radii", "gelu_curvature_ceiling"]


@final
@dataclass(frozen=True)
class TokenForms:
    """``{x~ + f(e) + sum_p s_p(z_p) + w}`` (module docstring): ``rows[i]`` the form of token i, shape (d,), all over
    one set of symbols, centred near 0 (``x~`` is held by the caller); ``shapes[i]`` (optional, empty for none) the
    carried balls of token i, forms ``s_p(z_p)`` (d,) each over Euclidean symbols of its own (``||z_p|| <= 1``,
    independent of e, of each other and of the other tokens'; lemma token-form-carried); ``balls[i] >= ||w_i||``."""

    rows: tuple
    balls: np.ndarray
    shapes: tuple = ()
    #: (n,) the part of each ball that is not the feed-forward remainder, and (n,) bounds of that remainder along the
    #: token's :func:`centred_direction` (inf where not formed): what :meth:`centred_floors` reads of the ball
    plain: np.ndarray | None = None
    along: np.ndarray | None = None
    #: (n, d) the vectors w of ``along``
    directions: np.ndarray | None = None

    def shape(self, i: int) -> tuple:
        """Token i's carried balls (empty where the set carries none)."""
        return self.shapes[i] if self.shapes else ()

    def carried(self, i: int) -> float:
        """``sup ||sum_p s_p(z_p)||`` over the carried balls' symbols (their centres, generators and errors), rounded
        up."""
        return float(sum_upper(0.0, *(sum_upper(IntervalArray(part.center).norm_upper().item(), part.radius())
                                      for part in self.shape(i))))

    @functools.cached_property
    def radii(self) -> np.ndarray:
        """``sup ||x_i - x~_i||`` per token: the row form's centre, its own radius and the ball, rounded up (inf with
        an infinite ball)."""
        return np.array([float(sum_upper(IntervalArray(row.center).norm_upper().item(), row.radius(),
                                         self.carried(i), b))
                         if math.isfinite(b) else math.inf for i, (row, b) in enumerate(zip(self.rows, self.balls))])

    def centred_floors(self, points: np.ndarray) -> np.ndarray:
        """Per token, a certified lower bound of the centred norm ``||P x||`` on the set (lemma centred-floor) and on
        the segments from ``points[i]`` (the set's float point, (n, d)) to it, along ``w``, the vector of ``along``
        where formed, else ``centred_direction(points[i])``: the form's and the carried balls' parts along w (their
        centres counted both ways), the ball times ``||w||`` except for the feed-forward remainder, which counts by its
        own bound along w where formed; 0 where the set is not finite or the bound not positive."""
        floors = np.zeros(len(self.rows))
        for i, (row, b) in enumerate(zip(self.rows, self.balls)):
            if not math.isfinite(self.radii[i]):
                continue
            directed = self.along is not None and self.plain is not None and self.directions is not None \
                and math.isfinite(self.along[i])
            w = self.directions[i] if directed else centred_direction(points[i])
            values = {r"\langle \tilde x, w\rangle": (IntervalArray(points[i]) * IntervalArray(w)).sum().lo.item(),
                      "f_w": _along(row, w), "c_w": float(sum_upper(0.0, *(_along(part, w) for part in self.shape(i)))),
                      "b_0": self.plain[i] if directed else b, "T_w": self.along[i] if directed else 0.0,
                      r"\|w\|": IntervalArray(w).norm_upper().item(),
                      r"\sigma": IntervalArray(w).sum().magnitude.item(),
                      r"\rho": float(sum_upper(IntervalArray(points[i]).norm_upper().item(), self.radii[i])),
                      "d": float(w.shape[0])}
            floor = float(evaluate_theorem_lower(T.centred_floor(), **{k: np.float64(v) for k, v in values.items()}))
            floors[i] = floor if floor > 0 else 0.0   # (and 0 where it is not a number)
        return floors

    def frobenius(self) -> float:
        """``sup ||x - x~||_F``: the operator norm of all rows' Euclidean generators side by side (the tokens move
        along the same symbols) plus, token by token, the centre, the independent errors and the ball."""
        if not np.all(np.isfinite(self.balls)):
            return math.inf
        generators = np.concatenate([row.l2 for row in self.rows], axis=1)
        operator = spectral_norm_upper_large(generators) if generators.size else 0.0
        rest = [float(sum_upper(_off_generators(row, b), self.carried(i)))
                for i, (row, b) in enumerate(zip(self.rows, self.balls))]
        return float(sum_upper(operator, IntervalArray(np.array(rest)).norm_upper().item()))

    @classmethod
    def taylor(cls, jacobian: Enclosure, radius: float, offset: IntervalArray, rests: np.ndarray,
               carried: bool = True) -> TokenForms:
        """The attention's Taylor set on the Frobenius ball ``||Y - X||_F <= radius``: rows ``(Y - X) DA(X)`` with the
        Jacobian (row convention: rows the moving tokens' inputs, columns the n output tokens' ``d`` coordinates),
        plus ``offset`` (n, d), an enclosure of ``A(X) - x~``, and Taylor's remainder per token ``rests``: carried
        balls ``rest_i I`` (lemma token-form-carried: the later linear steps act on them), or with ``carried`` False
        plain balls."""
        n = rests.shape[0]
        d = jacobian.shape[1] // n
        symbols, scale = Symbols(), IntervalArray(float(radius))
        rows = tuple(AffineForm.generated(offset[i], IntervalArray.around(jacobian.mid[:, i * d:(i + 1) * d],
                                                                           jacobian.rad[:, i * d:(i + 1) * d]) * scale,
                                          symbols) for i in range(n))
        rests = np.asarray(rests, dtype=np.float64)
        if not carried or not np.all(np.isfinite(rests)):
            return cls(rows, rests)
        shapes = tuple((AffineForm.generated(IntervalArray(np.zeros(d)), IntervalArray(np.eye(d) * rest)),)
                       for rest in rests)
        return cls(rows, np.zeros(n), shapes)

    def norm_step(self, enclosed: EnclosedNorm, after: np.ndarray) -> TokenForms:
        """Through a LayerNorm or RMSNorm at the float point ``enclosed.Z`` (module docstring), about ``after``.  A set
        that carries balls also carries the norm's Taylor remainder, as the ball ``rho diag(gamma)``, ``||rho|| <= T /
        max|gamma|`` (lemma token-form-carried: the norm is ``gamma`` times a map whose remainder is at most that)."""
        radii = self.radii
        if not np.all(np.isfinite(radii)):
            return TokenForms(self.rows, np.full(len(self.rows), np.inf))
        rests = norm_taylor_remainder(enclosed, radii, self.centred_floors(enclosed.Z.mid))
        rows, balls, Js = [], [], []
        for i, (row, b) in enumerate(zip(self.rows, self.balls)):
            Js.append(enclosed.jacobian_block(i))
            form, gap, scale = _linear_step(row, Js[-1], enclosed.output[i] - IntervalArray(after[i]))
            rows.append(form)
            balls.append(_step_ball(b, scale, radii[i], gap, taylor=0.0 if self.shapes else rests[i]))
        shapes = self._carried_through(Js)
        if self.shapes:
            gamma = IntervalArray(np.diag(np.asarray(enclosed.norm.gamma, dtype=np.float64)))
            shapes = tuple(parts + (AffineForm.generated(IntervalArray(np.zeros(gamma.shape[0])), gamma * IntervalArray(
                (IntervalArray(rest) / IntervalArray(enclosed.norm.gamma_max)).hi.item())),)
                           for parts, rest in zip(shapes, rests))
        return TokenForms(tuple(rows), np.array(balls), shapes)

    def _carried_through(self, jacobians: list) -> tuple:
        """The carried balls through a step's linear part: ``s_i(z) M_i``, M_i the midpoint of the step's enclosed
        Jacobian at token i (``jacobians[i]``: the matrix the rows take), outward-rounded
        (:meth:`AffineForm.linear`)."""
        return tuple(tuple(part.linear(J.mid) for part in parts) for parts, J in zip(self.shapes, jacobians))

    def feedforward_step(self, enclosed: EnclosedFeedForward, after: np.ndarray,
                         tokens: np.ndarray | None = None, ceiling: np.ndarray | None = None) -> TokenForms:
        """Through the residual feed-forward block at the float point ``enclosed.Y`` (module docstring), about
        ``after``; ``tokens`` (n,) bool, optional: only these tokens' remainders are formed, the others' balls are
        inf (a choice of work).  ``ceiling`` (n,), optional: the radii below which the new set matters (the chain's
        own balls after the block): the certified remainders are formed first for the tokens whose radius with
        :func:`remainder_floor` for their remainder (at most the radius with the certified one: the step's ball grows
        with the remainder) is below their ceiling, and where none of those tokens' radii is, every ball is inf and
        no other remainder is formed (a choice of work: the caller keeps the smaller of the two radii and drops a set
        no token of which wins, so its values are those it would have had)."""
        radii = self.radii
        if not np.all(np.isfinite(radii)):
            return TokenForms(self.rows, np.full(len(self.rows), np.inf))
        Js = [enclosed.jacobian_block(i) for i in range(len(self.rows))]
        shapes = self._carried_through(Js)
        steps = [_linear_step(row, Js[i], enclosed.output[i] - IntervalArray(after[i]))
                 for i, row in enumerate(self.rows)]
        rows = tuple(form for form, _, _ in steps)
        n = len(rows)
        wanted = np.ones(n, dtype=bool) if tokens is None else np.asarray(tokens, dtype=bool)
        balls, plain, along = np.full(n, np.inf), np.full(n, np.inf), np.full(n, np.inf)
        second = spectral_norm_upper_large(Enclosure.exact(enclosed.ffn.W_2))

        def form(chosen: np.ndarray) -> None:   # the certified balls of these tokens
            for i in np.flatnonzero(chosen & wanted):
                _, gap, scale = steps[i]
                kept: dict = {}   # the lemmas' parts, formed once for both bounds
                remainder = feedforward_remainder(enclosed, i, self.rows[i], self.balls[i], second, self.shape(i),
                                                  kept)
                if remainder >= FLOOR_WORTH * float(np.linalg.norm(after[i] - np.mean(after[i]))):
                    along[i] = feedforward_remainder_along(enclosed, i, self.rows[i], self.balls[i], second,
                                                           self.shape(i), centred_direction(after[i]), remainder,
                                                           kept)
                plain[i] = _step_ball(self.balls[i], scale, radii[i], gap)
                balls[i] = _step_ball(self.balls[i], scale, radii[i], gap, taylor=remainder)
        if ceiling is not None:
            floors = [_step_ball(b, scale, radii[i], gap, taylor=remainder_floor(enclosed, i, row, b, self.shape(i)))
                      for i, (row, b, (_, gap, scale)) in enumerate(zip(self.rows, self.balls, steps))]
            # the tokens whose set may win first: where none of them does, no token's set does
            candidates = TokenForms(rows, np.array(floors), shapes).radii < ceiling
            form(candidates)
            if not np.any(TokenForms(rows, balls, shapes).radii < ceiling):
                return TokenForms(rows, np.full(n, np.inf))
            form(~candidates)
        else:
            form(np.ones(n, dtype=bool))
        return TokenForms(rows, balls, shapes, plain, along, np.array([centred_direction(x) for x in after]))


#: the nested balls of :func:`norm_taylor_remainder`: radii ``k r / NESTED_BALLS``, k = 1 .. NESTED_BALLS
NESTED_BALLS = 8
_NESTED_SUM = r"\textstyle\sum_k (t_k - t_{k-1})\,V(t_k r)"


def norm_taylor_remainder(enclosed: EnclosedNorm, radii: np.ndarray, floors: np.ndarray | None = None) -> np.ndarray:
    """Per token, a bound on Taylor's remainder ``sup ||g(x) - g(x~) - (x - x~) J||`` of a LayerNorm or RMSNorm g on
    ``B(x~, r)`` (lemma token-form-nested): ``r sum_k (t_k - t_(k-1)) V(t_k r)``, ``V(rho)`` its Jacobian's variation on
    the ball of radius rho (:func:`~lipbound.local.bounds.norm_bounds`), ``t_k = k / NESTED_BALLS``; at most ``r
    V(r)``, which it replaces in lemma token-form-step (about ``(1 + 1 / NESTED_BALLS) / 2`` of it where V grows
    linearly).  ``floors``: lower bounds of the centred norm on the set and on the segments from its float point
    (:meth:`TokenForms.centred_floors`), which the nested balls' bounds read too."""
    width = IntervalArray(1.0) / IntervalArray(float(NESTED_BALLS))
    total, variation = IntervalArray(np.zeros(len(radii))), None
    for k in range(1, NESTED_BALLS + 1):
        inner = (IntervalArray(radii) * width * IntervalArray(float(k))).hi        # t_k r, rounded up
        variation = np.diag(norm_bounds(enclosed.norm, TokenBalls(enclosed.Z.mid, inner, floors=floors),
                                         enclosed).variation)
        total = total + width * IntervalArray(variation)
    nested = evaluate_theorem(T.token_form_nested(), r=np.asarray(radii, dtype=np.float64), **{_NESTED_SUM: total.hi})
    return np.minimum(nested, (IntervalArray(radii) * IntervalArray(variation)).hi)


def _step_ball(ball: float, scale: float, radius: float, gap: float, variation: float = 0.0,
               taylor: float = 0.0) -> float:
    """The new ball of theorem local-token-form-step, rounded up."""
    values = {"b": ball, r"\|M\|": scale, "r": radius, r"\|J - M\|": gap, "V": variation, "T": taylor}
    return float(evaluate_theorem(T.token_form_step(), **{key: np.float64(v) for key, v in values.items()}))


def _linear_step(row: AffineForm, J: IntervalArray, offset: IntervalArray) -> tuple[AffineForm, float, float]:
    """``row M + offset`` with M the float midpoint of the enclosed Jacobian J (d, d), ``||J - M||`` and ``||M||``
    rounded up."""
    M = J.mid
    form = row.linear(M).shift(offset)
    gap = spectral_norm_upper_large(Enclosure._trusted(np.zeros_like(M), (J - IntervalArray(M)).magnitude))
    return form, gap, spectral_norm_upper_large(M)


#: the feed-forward remainder along a token's centred direction is formed only where the remainder is at least this
#: share of the token's centred norm (a choice of work: below it the floor ``nu - R`` is close to ``nu`` anyway)
FLOOR_WORTH = 0.05


def centred_direction(x: np.ndarray) -> np.ndarray:
    """``P x / ||P x||`` in floats (P the centring; any non-zero vector serves lemma centred-floor, this one makes it
    tight at x); the first unit vector where ``P x`` is 0."""
    centred = np.asarray(x, dtype=np.float64) - np.mean(x)
    size = float(np.linalg.norm(centred))
    return centred / size if size > 0 else np.eye(centred.shape[0])[0]


def _along(form: AffineForm, w: np.ndarray) -> float:
    """``sup |<y, w>|`` over the values y of a row form (d,), its centre included, rounded up."""
    line = form.linear(np.asarray(w, dtype=np.float64)[:, None])
    return float(sum_upper(IntervalArray(line.center).norm_upper().item(), line.radius()))


def block_token_forms(enclosed: list, points: list, jacobian: Enclosure, radius: float,
                      rests: np.ndarray, wanted: dict | None = None) -> Iterator[TokenForms]:
    """The sets ``S_1 .. S_4`` of a post-norm block (attention, LayerNorm, feed-forward block, LayerNorm) on the
    Frobenius ball of ``radius`` about X (module docstring), one at a time (a caller may stop early): ``enclosed`` and
    ``points`` the chain's enclosures and float points (:class:`~lipbound.local.centre.ChainCentre`), ``jacobian`` the
    attention's at X, ``rests`` Taylor's remainder per output token.  Set k is about ``points[k]``.  ``wanted``: its
    entries, when set before ``S_3`` is drawn: "tokens" (n,) bool, the tokens whose feed-forward remainder is formed,
    and "ceiling" (n,), the radii below which ``S_3`` matters (:meth:`TokenForms.feedforward_step`)."""
    current = TokenForms.taylor(jacobian, radius, enclosed[0].output - IntervalArray(points[1]), rests)
    yield current
    current = current.norm_step(enclosed[1], points[2])
    yield current
    current = current.feedforward_step(enclosed[2], points[3], (wanted or {}).get("tokens"),
                                       (wanted or {}).get("ceiling"))
    yield current
    yield current.norm_step(enclosed[3], points[4])


@final
class BlockForms:
    """The sets of :func:`block_token_forms` formed stage by stage for a block's curve (``chain``, its ``centre``):
    :meth:`next_radii` the next set's token radii (about the chain's float point there), :meth:`reach` a bound on
    ``sup_U ||F(Y) - F(X)||_F`` once the output set is formed.  Where Taylor's remainders are not finite every radius
    is infinite."""

    def __init__(self, chain: list, centre, jacobian: Enclosure, radius: float, rests):
        self.chain, self.centre = chain, centre
        n = centre.points[0].shape[0]
        rests = np.broadcast_to(np.asarray(rests, dtype=np.float64), (n,))
        finite = math.isfinite(radius) and bool(np.all(np.isfinite(rests)))
        self._wanted: dict = {}
        self._sets = block_token_forms(centre.enclosed, centre.points, jacobian, radius, rests, self._wanted) \
            if finite else None
        self._n = n
        self.formed: list[TokenForms | None] = []
        #: the last formed set's floors of the centred norm (:meth:`TokenForms.centred_floors`), None where none
        self.floors: np.ndarray | None = None

    def next_radii(self, chained: np.ndarray | None = None) -> np.ndarray:
        """The next set's token radii (inf where an enclosure overflowed: no later set is formed then).  ``chained``:
        the chain's own balls there, when the caller has them; the feed-forward remainders are then formed only for
        the tokens whose set before the feed-forward block is below its chained ball (a choice of work: at 1e-2 R of
        MiniLM's block 0 the others' sets stay above the chained balls after it), and none where no token's set after
        it can be below its chained ball even without its remainder (:meth:`TokenForms.feedforward_step`)."""
        try:
            if self._sets is not None:
                if chained is not None and len(self.formed) == 2:
                    self._wanted["ceiling"] = chained
                formed = next(self._sets)
                self.formed.append(formed)
                self.floors = formed.centred_floors(self.centre.points[len(self.formed)])
                if chained is not None and len(self.formed) == 2:
                    self._wanted["tokens"] = formed.radii < chained
                return formed.radii
        except NotCertifiedError:
            self._sets = None
        self.formed.append(None)
        self.floors = None
        return np.full(self._n, np.inf)

    def reach(self, limit: float = math.inf) -> float:
        """The output set's Frobenius radius (the smaller of :meth:`TokenForms.frobenius` and the token radii's
        Euclidean norm) plus the float chain's rounding (:func:`~lipbound.local.centre.rounding_reach`), the sets not
        yet formed formed first; inf where its largest token radius is already ``limit`` or more (a choice of work)."""
        while len(self.formed) < 4:
            self.next_radii()
        if self.formed[3] is None:
            return math.inf
        last = self.formed[3]
        if not np.all(np.isfinite(last.radii)) or np.max(last.radii) >= limit:
            return math.inf
        try:
            whole = min(last.frobenius(), IntervalArray(last.radii).norm_upper().item())
            return float(sum_upper(whole, rounding_reach(self.chain, self.centre, 0)))
        except NotCertifiedError:
            return math.inf


def block_form_radii(chain: list, centre, jacobian: Enclosure, radius: float, rests) -> tuple[list, float]:
    """Every set's token radii ``[r_1, .., r_4]`` (``r_k`` about ``centre.points[k]``) and the reach of
    :class:`BlockForms`."""
    forms = BlockForms(chain, centre, jacobian, radius, rests)
    radii = [forms.next_radii() for _ in range(4)]
    return radii, forms.reach()
