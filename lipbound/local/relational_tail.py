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
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..errors import NotCertifiedError
from ..rigorous.arrays import IntervalArray, gelu_curvature_magnitude, gelu_slope
from ..rigorous.elementwise import inv_sqrt_2pi
from ..rigorous.linalg import Enclosure, lambda_max_upper_large, spectral_norm_upper_large
from ..rigorous.zonotope import AffineForm, Symbols, sum_upper
from ..symbolic import local as T
from .balls import TokenBalls
from .bounds import evaluate_theorem, evaluate_theorem_lower, norm_bounds
from .centre import rounding_reach
from .enclosed import EnclosedFeedForward, EnclosedNorm, feedforward_grams, feedforward_hadamards
from .taylor_quotients import curvature_split

__all__ = ["TokenForms", "BlockForms", "block_token_forms", "block_form_radii", "gelu_curvature_ceiling"]


def gelu_curvature_ceiling() -> float:
    """``sup |GELU''| = 2 phi(0) = 2 / sqrt(2 pi)``, rounded up: ``|GELU''(x)| = phi(x) |2 - x^2|`` is at most
    ``2 phi(0)`` where ``x^2 <= 2``, and beyond it ``phi(x) (x^2 - 2)`` peaks at ``|x| = 2``, where it is below 0.11."""
    return (IntervalArray(2.0) * IntervalArray(inv_sqrt_2pi()[1])).hi.item()


def _off_generators(row: AffineForm, ball: float) -> float:
    """``sup`` of the part of ``x - x~`` that is not along the row's Euclidean generators: its centre, its independent
    errors and the ball, rounded up."""
    return float(sum_upper(IntervalArray(row.center).norm_upper().item(), IntervalArray(row.err).norm_upper().item(),
                           ball))


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
                remainder = feedforward_remainder(enclosed, i, self.rows[i], self.balls[i], second, self.shape(i))
                if remainder >= FLOOR_WORTH * float(np.linalg.norm(after[i] - np.mean(after[i]))):
                    along[i] = feedforward_remainder_along(enclosed, i, self.rows[i], self.balls[i], second,
                                                           self.shape(i), centred_direction(after[i]), remainder)
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


def feedforward_remainder(enclosed: EnclosedFeedForward, i: int, row: AffineForm, ball: float,
                          second: float | None = None, shape: tuple = ()) -> float:
    """``sup ||FF(x) - FF(y) - (x - y) J_F(y)||`` over ``x - y`` in ``row + sum_p shape[p] + B(0, ball)``, y the block's
    float point at token i, ``shape`` the token's carried balls (:class:`TokenForms`, each over symbols of its own): the
    smaller of lemma feedforward-taylor-joint and lemma feedforward-taylor-signed.

    Joint: with ``t_k = (x - y).w_k``, ``FF(x) - FF(y) - (x - y) J_F(y) = sum_k phi_k(t_k) r_k`` and ``|phi_k(t)| <= S_k
    t^2 / 2``, ``S_k >= |GELU''|`` on ``h_k +- dev_k``.  So for a unit v, ``|sum_k phi_k (r_k.v)| <= (1/2) ||(S_k^(1/2)
    t_k)_k|| ||(S_k^(1/2) t_k r_k.v)_k||`` (Cauchy-Schwarz; ``S_k`` the smaller of that and the Taylor quotients'
    magnitude, lemma gelu-taylor-quotient), and with ``x - y = e G + sum_p z_p N_p + u``, ``||e||,
    ||z_p|| <= 1`` (the carried balls' generators N_p), ``||u|| <= beta`` (centres, errors, ball), Minkowski's
    inequality in each factor:

        P = lambda_max(D A^T A D)^(1/2) + sum_p ||N_p W_1 D|| + beta ||W_1 D||,
        Q = min(lambda_max(D (A^T A o W_2 W_2^T) D)^(1/2) + sum_p q_p + beta q_0, max_k D_k dev_k ||W_2||),

    ``q_p`` the smaller of ``||diag(D m_p) W_2||`` and ``lambda_max(D ((N_p W_1)^T (N_p W_1) o W_2 W_2^T) D)^(1/2)``,
    ``q_0`` of ``||diag(D ||w||) W_2||`` and ``lambda_max(D (W_1^T W_1 o W_2 W_2^T) D)^(1/2)`` (:func:`_hadamard_term`),

    ``A = G W_1`` (its Gram ``W_1^T (G^T G) W_1``), ``D = diag(S^(1/2))``, ``m_pk >= ||N_p w_k||``, ``dev_k = ||G
    w_k|| + sum_p m_pk + beta ||w_k||`` the bound on ``|t_k|`` (lemma token-form-carried).

    Signed: ``phi_k(t) = g_k t^2 / 2 + psi_k(t)`` with ``|psi_k(t)| <= S_k t^2 / 2``, ``g_k`` and ``S_k`` the midpoint
    and half-width of an enclosure of the quotients ``2 phi_k(t) / t^2`` on ``|t| <= dev_k`` (lemma
    gelu-taylor-quotient, :func:`~lipbound.local.taylor_quotients.curvature_split`; within ``GELU''(h_k) +- T_k dev_k /
    3``): the
    spread part is the joint bound with these ``S_k``, the quadratic part keeps the curvatures' signs
    (:func:`_signed_part`, each carried ball's symbols a part of its quadratic form).  ``second``: ``||W_2||``
    rounded up, when the caller has it."""
    parts = _remainder_parts(enclosed, i, row, ball, second, shape)
    return _remainder_on_parts(parts, curvature_split(enclosed.h[i], parts[4], outlier_neurons(enclosed.ffn)))


def _remainder_on_parts(parts: tuple, split: tuple) -> float:
    """:func:`feedforward_remainder` on its :func:`_remainder_parts` and the Taylor quotients' ``split``."""
    enclosed = parts[0]
    joint = joint_remainder(*parts, split=split)
    # (a choice of work: a Rayleigh quotient is at most the top eigenvalue, so where its quadratic part alone is not
    # below the joint bound the signed one cannot be smaller, and its certified eigenvalue is not formed)
    beta, carried = parts[1], parts[-1]
    if not _signed_estimate(enclosed.ffn, split[0], parts[2], beta, carried) < joint:
        return joint
    c, F = _signed_part(enclosed.ffn, split[0], parts[2], beta, carried)
    if not (IntervalArray(0.5) * IntervalArray(c) * IntervalArray(F)).hi.item() < joint:
        return joint
    return min(joint, signed_remainder(*parts, signed=(c, F), split=split))


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


def feedforward_remainder_along(enclosed: EnclosedFeedForward, i: int, row: AffineForm, ball: float,
                                second: float | None, shape: tuple, direction: np.ndarray,
                                remainder: float = math.inf) -> float:
    """A bound on ``|<w, FF(x) - FF(y) - (x - y) J_F(y)>|`` over the set of :func:`feedforward_remainder` for the
    vector ``w = direction``: the smaller of lemma feedforward-taylor-directed and ``remainder ||w||`` (``remainder``
    a bound on the remainder's norm, when the caller has it)."""
    parts = _remainder_parts(enclosed, i, row, ball, second, shape)
    split = curvature_split(enclosed.h[i], parts[4], outlier_neurons(enclosed.ffn))
    size = IntervalArray(direction).norm_upper().item()
    whole = (IntervalArray(remainder) * IntervalArray(size)).hi.item() if math.isfinite(remainder) else math.inf
    return min(whole, directed_remainder(parts, split, direction))


def directed_remainder(parts: tuple, split: tuple, direction: np.ndarray) -> float:
    """Lemma feedforward-taylor-directed on :func:`_remainder_parts` and the Taylor quotients' ``split``
    (:func:`~lipbound.local.taylor_quotients.curvature_split`): with ``x_w = g o W_2 w`` and ``y_w = S o |W_2 w|`` (the
    outlier neurons' entries 0), ``(c / 2) (sqrt(x_w^T (K o K) x_w) + lambda_max(diag(y_w)^(1/2) K diag(y_w)^(1/2)))``
    plus the outliers' separated remainder times ``||w||``, rounded up (K, c of :func:`_signed_gram`)."""
    enclosed, beta, a_gram, dev, i, carried = parts[0], parts[1], parts[2], parts[4], parts[6], parts[-1]
    ffn = enclosed.ffn
    apart = outlier_neurons(ffn)
    K, c = _signed_gram(ffn, a_gram, beta, carried)
    w = np.asarray(direction, dtype=np.float64)
    reads = IntervalArray(ffn.W_2).matmul(w[:, None]).reshape(-1)                                # r_k . w
    x = _without_outliers(ffn, split[0]) * reads
    squares = ((K * K * x.expand(0)).sum(axis=-1) * x).sum()
    S = np.array(split[1], dtype=np.float64)
    S[apart] = 0.0
    root = (IntervalArray(S) * IntervalArray(reads.magnitude)).sqrt()
    scaled = K * root.expand(0) * root.expand(-1)
    values = {"c": float(c), "F_w": IntervalArray(max(squares.hi.item(), 0.0)).sqrt().hi.item(),
              r"\Lambda_w": max(lambda_max_upper_large(scaled.to_enclosure()), 0.0),
              "s": separated_remainder(enclosed, i, dev, apart), r"\|w\|": IntervalArray(w).norm_upper().item()}
    return float(evaluate_theorem(T.feedforward_taylor_directed(), **{key: np.float64(v) for key, v in values.items()}))


@final
@dataclass(frozen=True)
class CarriedBall:
    """What the feed-forward remainder reads of a token's carried balls ``z_p N_p`` (:func:`_remainder_parts`):
    ``rows`` the enclosed ``N_p W_1`` (m_p, d_ff), ``columns`` ``m_pk >= ||N_p w_k||`` (d_ff,) per part, ``reach`` their
    sum over the parts, rounded up."""

    rows: tuple
    columns: tuple
    reach: np.ndarray
    _grams: dict = field(default_factory=dict, compare=False, repr=False)

    def gram(self, p: int) -> IntervalArray:
        """``(N_p W_1)^T (N_p W_1)`` (d_ff, d_ff), enclosed (formed once, when first read: both lemmas read it)."""
        if p not in self._grams:
            self._grams[p] = self.rows[p].swapaxes(0, 1).bmm(self.rows[p])
        return self._grams[p]

    @property
    def grams(self) -> tuple:
        """:meth:`gram` of every part."""
        return tuple(self.gram(p) for p in range(len(self.rows)))


def _carried_ball(shape: tuple, ffn) -> CarriedBall:
    """:class:`CarriedBall` of the generators of the carried balls ``shape`` (none: zero reach)."""
    rows = tuple(IntervalArray(part.l2).matmul(ffn.W_1) for part in shape if part.l2.shape[0])
    columns = tuple(part.norm_upper(axis=0) for part in rows)
    return CarriedBall(rows, columns, sum_upper(np.zeros(ffn.W_1.shape[1]), *columns))


#: :func:`remainder_floor` is this share of its float estimate (the estimate's own rounding, far below it, and the
#: certified bound's hull read at the float deviations)
FLOOR_SHARE = 0.99


def remainder_floor(enclosed: EnclosedFeedForward, i: int, row: AffineForm, ball: float, shape: tuple = ()) -> float:
    """A float estimate from below of :func:`feedforward_remainder` (both lemmas' ball parts alone, a choice of work:
    it decides whether the certified one is formed, never a value).  With the notation there, the joint bound is at
    least ``(1/2) (sum_p ||N_p W_1 D|| + beta ||W_1 D||) min(sum_p ||diag(D m_p) W_2|| + beta ||diag(D ||w||) W_2||,
    max_k D_k dev_k ||W_2||)`` (``P`` and ``Q`` without their form parts, which are not negative) and the signed one at
    least the same with ``S_k = T_k dev_k / 3`` (its cubic part; ``c F / 2 >= 0``); each norm is estimated from below
    by power iteration (a Rayleigh quotient is at most the top eigenvalue), ``dev_k`` and the curvature bounds are read
    at the float deviations, and the smaller of the two is taken times :data:`FLOOR_SHARE`."""
    ffn = enclosed.ffn
    beta = _off_generators(row, ball) + sum(float(np.linalg.norm(part.center)) + float(np.linalg.norm(part.err))
                                            for part in shape)
    carried = [part.l2 @ ffn.W_1 for part in shape if part.l2.shape[0]]                                # N_p W_1
    if not beta > 0 and not carried:
        return 0.0
    gram = row.l2.T @ row.l2                                                                         # G^T G (d, d)
    columns = np.linalg.norm(ffn.W_1, axis=0)                                                        # ||w_k||
    m = [np.linalg.norm(part, axis=0) for part in carried]
    dev = np.sqrt(np.maximum(np.einsum("ak,ab,bk->k", ffn.W_1, gram, ffn.W_1), 0.0)) + sum(m) + beta * columns
    hull = enclosed.h[i] + IntervalArray(-dev, dev)
    second = _norm_from_below(ffn.W_2)

    apart = outlier_neurons(ffn)

    def half_product(S: np.ndarray) -> float:   # (the outliers are bounded apart, by a part not negative)
        root = np.sqrt(S)
        root[apart] = 0.0
        P = beta * _norm_from_below(ffn.W_1 * root)
        Q = beta * _norm_from_below(ffn.W_2 * (root * columns)[:, None])
        for part, reach in zip(carried, m):
            P += _norm_from_below(part * root)
            Q += _norm_from_below(ffn.W_2 * (root * reach)[:, None])
        return 0.5 * P * min(Q, float(np.max(root * dev)) * second)
    split = curvature_split(enclosed.h[i], dev, apart)
    joint = half_product(_joint_curvatures(hull, split))
    signed = half_product(split[1])
    return FLOOR_SHARE * min(joint, signed)


def _norm_from_below(M: np.ndarray, steps: int = 12) -> float:
    """``||M v|| / ||v||`` after ``steps`` rounds of power iteration on ``M^T M`` (float): at most ``||M||_2``."""
    v = np.ones(M.shape[1]) / math.sqrt(M.shape[1])
    size = 0.0
    for _ in range(steps):
        w = M.T @ (M @ v)
        size = float(np.linalg.norm(w))
        if not size > 0:
            return 0.0
        v = w / size
    return float(np.linalg.norm(M @ v))


def _remainder_parts(enclosed: EnclosedFeedForward, i: int, row: AffineForm, ball: float,
                     second: float | None = None, shape: tuple = ()) -> tuple:
    """What both bounds of :func:`feedforward_remainder` read: ``(enclosed, beta, A^T A, ||w_k||, dev, hull, i,
    ||W_2||, carried)``, ``hull`` the pre-activations' range ``h_k +- dev_k``, ``carried`` the :class:`CarriedBall` of
    the carried balls ``shape`` (their centres and errors go into ``beta``)."""
    ffn = enclosed.ffn
    beta = _off_generators(row, ball)
    if shape:
        beta = float(sum_upper(beta, *(IntervalArray(part.center).norm_upper().item() for part in shape),
                               *(IntervalArray(part.err).norm_upper().item() for part in shape)))
    carried = _carried_ball(shape, ffn)
    gram = Enclosure.exact(row.l2.T) @ Enclosure.exact(row.l2)                                      # G^T G (d, d)
    a_gram = IntervalArray.from_enclosure(Enclosure.exact(ffn.W_1.T) @ gram @ Enclosure.exact(ffn.W_1))  # A^T A
    columns = IntervalArray(IntervalArray(ffn.W_1).norm_upper(axis=0))
    # |t_k| <= ||G w_k|| + sum_p ||N_p w_k|| + beta ||w_k||
    dev = (IntervalArray(np.diagonal(a_gram.hi).copy()).sqrt() + IntervalArray(carried.reach)
           + IntervalArray(beta) * columns).hi
    second = spectral_norm_upper_large(Enclosure.exact(ffn.W_2)) if second is None else second
    return enclosed, beta, a_gram, columns, dev, enclosed.h[i] + IntervalArray(-dev, dev), i, second, carried


def _joint_curvatures(hull: IntervalArray, split: tuple) -> np.ndarray:
    """Lemma feedforward-taylor-joint's ``S_k`` per neuron: the smallest of ``|GELU''|``'s largest value on the
    neuron's range ``hull``, its ceiling over the line and the Taylor quotients' magnitude (``split[2]``)."""
    return np.minimum(np.minimum(gelu_curvature_magnitude(hull), gelu_curvature_ceiling()), split[2])


def joint_remainder(enclosed, beta, a_gram, columns, dev, hull, i, second, carried=None, split=None) -> float:
    """Lemma feedforward-taylor-joint on :func:`_remainder_parts` (:func:`feedforward_remainder`), the outlier
    neurons apart (lemma feedforward-taylor-separated); ``S_k`` the smaller of ``|GELU''|``'s largest value on the
    neuron's range and the Taylor quotient's (``split``, :func:`~lipbound.local.taylor_quotients.curvature_split`,
    formed here unless given)."""
    apart = outlier_neurons(enclosed.ffn)
    split = curvature_split(enclosed.h[i], dev, apart) if split is None else split
    S = _joint_curvatures(hull, split)
    S[apart] = 0.0
    P, Q = _joint_factors(enclosed.ffn, a_gram, columns, beta, dev, S, second, carried)
    rest = float(evaluate_theorem(T.feedforward_taylor_joint(), P=np.float64(P), Q=np.float64(Q)))
    return float(sum_upper(rest, separated_remainder(enclosed, i, dev, apart)))


def signed_remainder(enclosed, beta, a_gram, columns, dev, hull, i, second, carried=None, signed=None,
                     split=None) -> float:
    """Lemma feedforward-taylor-signed on :func:`_remainder_parts` (:func:`feedforward_remainder`): ``g_k`` the
    midpoint of neuron k's Taylor quotients and ``S_k`` their spread about it (``split``,
    :func:`~lipbound.local.taylor_quotients.curvature_split`, formed here unless given); ``signed`` the quadratic
    part's ``(c, F)`` (:func:`_signed_part`) when the caller has it."""
    apart = outlier_neurons(enclosed.ffn)
    split = curvature_split(enclosed.h[i], dev, apart) if split is None else split
    c, F = _signed_part(enclosed.ffn, split[0], a_gram, beta, carried) if signed is None else signed
    cubic = np.array(split[1], dtype=np.float64)
    cubic[apart] = 0.0
    P_3, Q_3 = _joint_factors(enclosed.ffn, a_gram, columns, beta, dev, cubic, second, carried)
    values = {"c": c, "F": F, "P_3": P_3, "Q_3": Q_3}
    rest = float(evaluate_theorem(T.feedforward_taylor_signed(), **{key: np.float64(v) for key, v in values.items()}))
    return float(sum_upper(rest, separated_remainder(enclosed, i, dev, apart)))


def _joint_factors(ffn, a_gram: IntervalArray, columns: IntervalArray, beta: float, dev: np.ndarray, S: np.ndarray,
                   second: float, carried: CarriedBall | None = None) -> tuple[float, float]:
    """``(P, Q)`` of :func:`feedforward_remainder`'s joint bound for the curvature bounds ``S`` (d_ff,), rounded up."""
    W_1, W_2 = IntervalArray(ffn.W_1), IntervalArray(ffn.W_2)
    root = IntervalArray(S).sqrt()
    scaled = a_gram * root.expand(0) * root.expand(-1)
    P = (IntervalArray(max(lambda_max_upper_large(scaled.to_enclosure()), 0.0)).sqrt()
         + IntervalArray(beta) * IntervalArray(spectral_norm_upper_large((W_1 * root.expand(0)).to_enclosure())))
    b_gram = feedforward_grams(ffn)[1]                                                              # W_2 W_2^T
    joint = IntervalArray(max(lambda_max_upper_large((scaled * b_gram).to_enclosure()), 0.0)).sqrt()
    own = joint.hi.item()   # the form's term: the parts' joint terms are formed only where a part's is larger
    if beta > 0:
        plain = spectral_norm_upper_large((W_2 * (root * columns).expand(-1)).to_enclosure())
        hadamard = feedforward_hadamards(ffn)[0]
        joint = joint + IntervalArray(beta) * IntervalArray(
            _hadamard_term(hadamard.mid, lambda: hadamard, root, plain, beta * plain >= own))
    for p, (rows, reach) in enumerate(zip(*((carried.rows, carried.columns) if carried is not None else ((), ())))):
        # each carried ball's own terms (lemma token-form-carried)
        P = P + IntervalArray(spectral_norm_upper_large((rows * root.expand(0)).to_enclosure()))
        plain = spectral_norm_upper_large((W_2 * (root * IntervalArray(reach)).expand(-1)).to_enclosure())
        joint = joint + IntervalArray(_hadamard_term((rows.mid.T @ rows.mid) * b_gram.mid,
                                                     lambda p=p: carried.gram(p) * b_gram, root, plain, plain >= own))
    cheap = IntervalArray(float(np.max((root * IntervalArray(dev)).hi))) * IntervalArray(second)
    return P.hi.item(), min(joint.hi.item(), cheap.hi.item())


#: :func:`_hadamard_term` certifies the joint term only where its float estimate is below this share of the plain one
HADAMARD_SHARE = 0.95


def _hadamard_term(estimated: np.ndarray, hadamard, root: IntervalArray, plain: float, wanted: bool = True) -> float:
    """The smaller of ``plain`` (a part's ``||diag(D m) W_2||``) and ``lambda_max(D H D)^(1/2)``, ``H`` (d_ff, d_ff) the
    part's Hadamard product (the Gram matrix of its vectors ``N w_k (x) r_k``: ``(N W_1)^T (N W_1) o W_2 W_2^T``), ``D
    = diag(root)``, rounded up (lemma feedforward-taylor-joint: the part's squares ``sum_k S_k (z . N w_k)^2 (r_k .
    v)^2`` are the quadratic form of that Gram matrix at ``z (x) v``).  ``hadamard()`` forms H enclosed, ``estimated``
    is H in floats: only where a float estimate from below of the eigenvalue (:func:`_norm_from_below` of the positive
    semidefinite ``D H D`` in floats) is below :data:`HADAMARD_SHARE` of ``plain`` is H enclosed and the eigenvalue
    certified (a choice of work); not at all unless ``wanted`` (the caller's choice of work: :func:`_joint_factors`
    forms it where the part's plain term is at least the form's own, so that the part weighs in Q)."""
    if not wanted:
        return plain
    r = root.mid
    estimate = _norm_from_below(estimated * r[:, None] * r[None, :])
    if not math.sqrt(max(estimate, 0.0)) < HADAMARD_SHARE * plain:
        return plain
    scaled = hadamard() * root.expand(0) * root.expand(-1)
    found = IntervalArray(max(lambda_max_upper_large(scaled.to_enclosure(), estimate=estimate), 0.0)).sqrt()
    return min(plain, found.hi.item())


def _signed_gram(ffn, a_gram: IntervalArray, beta: float, carried: CarriedBall | None) -> tuple[IntervalArray, int]:
    """``(K, c)`` of :func:`_signed_part`: ``K = A^T A + sum_p (N_p W_1)^T (N_p W_1) + beta^2 W_1^T W_1`` (the terms of
    the carried balls and of the ball where present), ``c`` the number of its parts."""
    K, c = a_gram, 1
    for gram in (carried.grams if carried is not None else ()):
        K, c = K + gram, c + 1
    if beta > 0:
        K, c = K + IntervalArray(beta) * IntervalArray(beta) * feedforward_grams(ffn)[0], c + 1
    return K, c


def _signed_estimate(ffn, g: IntervalArray, a_gram: IntervalArray, beta: float, carried: CarriedBall | None = None,
                     steps: int = 30) -> float:
    """A float estimate from below of ``c F / 2`` (:func:`_signed_part`): the Rayleigh quotient of ``W_2^T diag(g) (K o
    K) diag(g) W_2`` after ``steps`` rounds of power iteration on its products (the matrix is not formed)."""
    K, c = a_gram.mid, 1
    for rows in (carried.rows if carried is not None else ()):
        K, c = K + rows.mid.T @ rows.mid, c + 1
    if beta > 0:
        K, c = K + (beta * beta) * feedforward_grams(ffn)[0].mid, c + 1
    squares, g = K * K, _without_outliers(ffn, g).mid

    def product(v: np.ndarray) -> np.ndarray:
        return ffn.W_2.T @ (g * (squares @ (g * (ffn.W_2 @ v))))
    v = np.ones(ffn.W_2.shape[1]) / np.sqrt(ffn.W_2.shape[1])
    for _ in range(steps):
        w = product(v)
        size = np.linalg.norm(w)
        if not size > 0:
            return 0.0
        v = w / size
    return 0.5 * c * math.sqrt(max(float(v @ product(v)), 0.0))


def _signed_part(ffn, g: IntervalArray, a_gram: IntervalArray, beta: float,
                 carried: CarriedBall | None = None) -> tuple[float, float]:
    """``(c, F)`` with ``sup_v |sum_k g_k t_k^2 (r_k.v)| <= c F`` over unit v and ``t = e A + sum_p z_p N_p W_1 + u
    W_1`` (``||e||, ||z_p|| <= 1``, ``||u|| <= beta``; N_p the carried balls' generators, lemma token-form-carried),
    ``g`` (d_ff,) the curvatures of the quadratic part (the Taylor quotients' midpoints), enclosed: with
    ``z^ = (e, z_1, .., u / beta)``,
    ``||z^||^2 <= c`` (the number of parts present) and ``a^_k = (a_k, N_1 w_k, .., beta w_k)`` the sum is ``z^ (A^
    diag(g o W_2 v) A^^T) z^^T``, at most ``c`` times that matrix's Frobenius norm, whose square is ``v^T W_2^T diag(g)
    (K o K) diag(g) W_2 v`` with ``K = A^T A + sum_p (N_p W_1)^T (N_p W_1) + beta^2 W_1^T W_1`` the Gram matrix of the
    ``a^_k``; ``F`` is the square root of that d x d matrix's top eigenvalue, rounded up.  The outlier neurons
    (:func:`outlier_neurons`) have ``g_k = 0``: they are bounded apart (lemma feedforward-taylor-separated)."""
    K, c = _signed_gram(ffn, a_gram, beta, carried)
    g = _without_outliers(ffn, g)
    weighted = K * K * g.expand(0) * g.expand(-1)
    N = Enclosure.exact(ffn.W_2.T) @ weighted.to_enclosure() @ Enclosure.exact(ffn.W_2)
    return float(c), IntervalArray(max(lambda_max_upper_large(N), 0.0)).sqrt().hi.item()


#: a neuron is an outlier of its feed-forward block when ``||r_k|| ||w_k||^2`` (its row of W_2 times its column of W_1
#: squared: what it adds to the second-order remainder) is at least this many times the median over the neurons
#: (MiniLM: neuron 856 of layer 0, 112 times; no other neuron of the six layers reaches 12)
OUTLIER_FACTOR = 32.0
#: pieces per side of :func:`separated_remainder`'s sums
SEPARATED_PIECES = 32


def outlier_neurons(ffn) -> np.ndarray:
    """The neurons the feed-forward remainders bound apart (:data:`OUTLIER_FACTOR`; a choice of work and of
    tightness, never of soundness: lemma feedforward-taylor-separated holds for any set of neurons)."""
    weight = np.linalg.norm(ffn.W_2, axis=1) * np.linalg.norm(ffn.W_1, axis=0) ** 2
    return np.flatnonzero(weight >= OUTLIER_FACTOR * np.median(weight))


def _without_outliers(ffn, g: IntervalArray) -> IntervalArray:
    """``g`` (d_ff,) with the outlier neurons' entries 0."""
    apart = outlier_neurons(ffn)
    lo, hi = g.lo.copy(), g.hi.copy()
    lo[apart], hi[apart] = 0.0, 0.0
    return IntervalArray(lo, hi)


def separated_remainder(enclosed: EnclosedFeedForward, i: int, dev: np.ndarray, neurons: np.ndarray) -> float:
    """``sum_k sup_{|t| <= dev_k} |phi_k(t)| ||r_k||`` over ``neurons`` at token i, rounded up (lemma
    feedforward-taylor-separated): ``phi_k(t) = GELU(h_k + t) - GELU(h_k) - GELU'(h_k) t = int_0^t (GELU'(h_k + s) -
    GELU'(h_k)) ds``, so ``|phi_k(t)|`` is at most, on the side of t, the upper sum over :data:`SEPARATED_PIECES`
    equal pieces of ``[0, dev_k]`` of each piece's width times the largest ``|GELU'(h_k + s) - GELU'(h_k)|`` there
    (the range of GELU' over the piece, enclosed, against GELU' at the centre)."""
    if not len(neurons):
        return 0.0
    h, at_centre = enclosed.h[i][neurons], enclosed.slope[i][neurons]
    rows = IntervalArray(IntervalArray(enclosed.ffn.W_2[neurons]).norm_upper(axis=1))
    ends = [np.asarray(dev[neurons], dtype=np.float64) * (j / SEPARATED_PIECES) for j in range(SEPARATED_PIECES)]
    ends.append(np.asarray(dev[neurons], dtype=np.float64))
    sides = []
    for sign in (1.0, -1.0):
        total = IntervalArray(np.zeros(len(neurons)))
        for a, b in zip(ends[:-1], ends[1:]):
            piece = h + IntervalArray(np.minimum(sign * a, sign * b), np.maximum(sign * a, sign * b))
            slopes = gelu_slope(piece)
            spread = np.maximum((IntervalArray(slopes.hi) - IntervalArray(at_centre.lo)).hi,
                                (IntervalArray(at_centre.hi) - IntervalArray(slopes.lo)).hi)
            total = total + (IntervalArray(b) - IntervalArray(a)) * IntervalArray(spread)
        sides.append(total.hi)
    return float(sum_upper(0.0, *(IntervalArray(np.maximum(*sides)) * rows).hi))


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
