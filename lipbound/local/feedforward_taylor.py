"""The feed-forward block's Taylor remainder on a token's set (lemmas feedforward-taylor-joint, -signed, -separated,
-directed).

A token's set before a block's feed-forward map (:class:`~lipbound.local.relational_tail.TokenForms`) is
``{y + e G + sum_p z_p N_p + u : ||e||, ||z_p|| <= 1, ||u|| <= beta}`` about the block's float point y.  With ``t_k =
(x - y).w_k`` (``w_k`` the columns of ``W_1``, ``r_k`` the rows of ``W_2``) the block's Taylor remainder is

    FF(x) - FF(y) - (x - y) J_F(y) = sum_k phi_k(t_k) r_k,   phi_k(t) = GELU(h_k + t) - GELU(h_k) - GELU'(h_k) t,

and this module bounds it over the set: its norm jointly over the neurons by Cauchy-Schwarz (:func:`joint_remainder`),
with the quadratic part's signs kept (:func:`signed_remainder`), the outlier neurons apart
(:func:`separated_remainder`), and along one fixed vector (:func:`directed_remainder`); :func:`remainder_floor` is a
float estimate from below that decides whether the certified bound is formed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..rigorous.arrays import IntervalArray, gelu_curvature_magnitude, gelu_slope
from ..rigorous.elementwise import inv_sqrt_2pi
from ..rigorous.linalg import Enclosure, lambda_max_upper_large, spectral_norm_upper_large
from ..rigorous.zonotope import AffineForm, sum_upper
from ..symbolic import local as T
from .bounds import evaluate_theorem
from .enclosed import EnclosedFeedForward, feedforward_float_grams, feedforward_grams, feedforward_hadamards
from .taylor_quotients import curvature_split

__all__ = ["CarriedBall", "feedforward_remainder", "feedforward_remainder_along", "directed_remainder",
           "joint_remainder", "signed_remainder", "separated_remainder", "remainder_floor", "outlier_neurons",
           "gelu_curvature_ceiling"]


def gelu_curvature_ceiling() -> float:
    """``sup |GELU''| = 2 phi(0) = 2 / sqrt(2 pi)``, rounded up: ``|GELU''(x)| = phi(x) |2 - x^2|`` is at most
    ``2 phi(0)`` where ``x^2 <= 2``, and beyond it ``phi(x) (x^2 - 2)`` peaks at ``|x| = 2``, where it is below 0.11."""
    return (IntervalArray(2.0) * IntervalArray(inv_sqrt_2pi()[1])).hi.item()


def _off_generators(row: AffineForm, ball: float) -> float:
    """``sup`` of the part of ``x - x~`` that is not along the row's Euclidean generators: its centre, its independent
    errors and the ball, rounded up."""
    return float(sum_upper(IntervalArray(row.center).norm_upper().item(), IntervalArray(row.err).norm_upper().item(),
                           ball))


def feedforward_remainder(enclosed: EnclosedFeedForward, i: int, row: AffineForm, ball: float,
                          second: float | None = None, shape: tuple = (), kept: dict | None = None) -> float:
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
    rounded up, when the caller has it.  ``kept``: a dict that receives the parts and the split ("parts", "split"),
    for :func:`feedforward_remainder_along` on the same set (a choice of work: they are formed once)."""
    parts = _remainder_parts(enclosed, i, row, ball, second, shape)
    split = curvature_split(enclosed.h[i], parts[4], outlier_neurons(enclosed.ffn))
    if kept is not None:
        kept.update(parts=parts, split=split)
    return _remainder_on_parts(parts, split)


def _remainder_on_parts(parts: tuple, split: tuple) -> float:
    """:func:`feedforward_remainder` on its :func:`_remainder_parts` and the Taylor quotients' ``split``.

    (A choice of work, never of the value: where the signed lemma's quadratic part is estimated below a float estimate
    from below of the joint bound (:func:`joint_floor`), the signed bound is certified first, and the joint one only
    where its estimate times :data:`FLOOR_SHARE` is not above it.)"""
    enclosed = parts[0]
    beta, carried = parts[1], parts[-1]
    estimate = _signed_estimate(enclosed.ffn, split[0], parts[2], beta, carried)
    floor = joint_floor(parts, split)
    if estimate < floor:
        signed = signed_remainder(*parts, split=split)
        if FLOOR_SHARE * floor > signed:
            return signed
        return min(signed, joint_remainder(*parts, split=split))
    joint = joint_remainder(*parts, split=split)
    # (a choice of work: a Rayleigh quotient is at most the top eigenvalue, so where its quadratic part alone is not
    # below the joint bound the signed one cannot be smaller, and its certified eigenvalue is not formed)
    if not estimate < joint:
        return joint
    c, F = _signed_part(enclosed.ffn, split[0], parts[2], beta, carried)
    if not (IntervalArray(0.5) * IntervalArray(c) * IntervalArray(F)).hi.item() < joint:
        return joint
    return min(joint, signed_remainder(*parts, signed=(c, F), split=split))


def joint_floor(parts: tuple, split: tuple) -> float:
    """A float estimate from below of :func:`joint_remainder` on :func:`_remainder_parts` and the Taylor quotients'
    ``split`` (its ``P Q / 2`` with the form's parts, :func:`_half_product_floor`, plus the outliers' certified
    separated remainder): it decides which bound is certified first, never a value."""
    enclosed, beta, a_gram, dev, hull, i = parts[0], parts[1], parts[2], parts[4], parts[5], parts[6]
    carried = parts[-1]
    rows = [] if carried is None else [part.mid for part in carried.rows]
    half = _half_product_floor(enclosed.ffn, _joint_curvatures(hull, split), beta, rows, dev, a_gram.mid)
    return half + separated_remainder(enclosed, i, dev, outlier_neurons(enclosed.ffn))


def feedforward_remainder_along(enclosed: EnclosedFeedForward, i: int, row: AffineForm, ball: float,
                                second: float | None, shape: tuple, direction: np.ndarray,
                                remainder: float = math.inf, kept: dict | None = None) -> float:
    """A bound on ``|<w, FF(x) - FF(y) - (x - y) J_F(y)>|`` over the set of :func:`feedforward_remainder` for the
    vector ``w = direction``: the smaller of lemma feedforward-taylor-directed and ``remainder ||w||`` (``remainder``
    a bound on the remainder's norm, when the caller has it).  ``kept``: the parts and split that
    :func:`feedforward_remainder` kept for the same arguments, when the caller has them."""
    if kept is not None and "parts" in kept:
        parts, split = kept["parts"], kept["split"]
    else:
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

    def kept(self, a_gram: IntervalArray, beta: float, compute):
        """``compute()`` for the set's form Gram matrix ``a_gram`` and ball ``beta``, formed once (the signed and
        directed lemmas both read :func:`_signed_gram`'s sum)."""
        key = ("sum", id(a_gram), beta)
        if key not in self._grams:
            self._grams[key] = (a_gram, compute())   # (a_gram held: its id is not reused while the entry lives)
        return self._grams[key][1]

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
    least ``(1/2) (sum_p ||N_p W_1 D|| + beta ||W_1 D||) min(sum_p q_p + beta q_0, max_k D_k dev_k ||W_2||)`` (``P``
    and ``Q`` without their form parts, which are not negative; ``q_p``, ``q_0`` each the smaller of its plain and
    Hadamard terms, as the certified ``Q`` may take either) and the signed one at
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
    # ||G w_k||^2 = (W_1^T G^T G W_1)_kk, by one BLAS product (einsum's own three-index loop is ten times slower)
    dev = np.sqrt(np.maximum(np.einsum("ak,ak->k", ffn.W_1, gram @ ffn.W_1), 0.0)) + sum(m) + beta * columns
    hull = enclosed.h[i] + IntervalArray(-dev, dev)
    apart = outlier_neurons(ffn)
    split = curvature_split(enclosed.h[i], dev, apart)
    joint = _half_product_floor(ffn, _joint_curvatures(hull, split), beta, carried, dev)
    signed = _half_product_floor(ffn, split[1], beta, carried, dev)
    return FLOOR_SHARE * min(joint, signed)


def _half_product_floor(ffn, S: np.ndarray, beta: float, carried: list, dev: np.ndarray,
                        a_gram: np.ndarray | None = None) -> float:
    """A float estimate from below of lemma feedforward-taylor-joint's ``P Q / 2`` for the curvature bounds ``S``
    (d_ff,; the outlier neurons' 0: they are bounded apart, by a part not negative): ``carried`` the float ``N_p W_1``,
    ``dev`` the deviations; with ``a_gram`` (the float ``A^T A``) the form's parts ``lambda_max(D A^T A D)^(1/2)`` and
    ``lambda_max(D (A^T A o W_2 W_2^T) D)^(1/2)`` too, without it the ball's and carried balls' parts alone (every
    part is not negative); either way, as the certified ``Q`` may, each part's smaller of its plain and joint terms
    (:func:`_hadamard_term`).  Each norm by power iteration (:func:`_norm_from_below`, :func:`_top_from_below`)."""
    root = np.sqrt(np.maximum(S, 0.0))
    root[outlier_neurons(ffn)] = 0.0
    columns = np.linalg.norm(ffn.W_1, axis=0)
    b_gram = feedforward_float_grams(ffn)[1]                                                        # W_2 W_2^T

    def joint_term(gram: np.ndarray) -> float:   # lambda_max(D (gram o W_2 W_2^T) D)^(1/2)
        return math.sqrt(max(_top_from_below(gram * b_gram * root[:, None] * root[None, :]), 0.0))
    P = beta * _norm_from_below(ffn.W_1 * root)
    Q = beta * _norm_from_below(ffn.W_2 * (root * columns)[:, None])
    if beta > 0:   # (the certified Q may take the smaller of the two terms, _hadamard_term: so may its floor)
        Q = min(Q, beta * joint_term(feedforward_float_grams(ffn)[0]))                           # W_1^T W_1
    for part in carried:
        P += _norm_from_below(part * root)
        plain = _norm_from_below(ffn.W_2 * (root * np.linalg.norm(part, axis=0))[:, None])
        Q += min(plain, joint_term(part.T @ part))
    if a_gram is not None:
        P += math.sqrt(max(_top_from_below(a_gram * root[:, None] * root[None, :]), 0.0))
        Q += joint_term(a_gram)
    return 0.5 * P * min(Q, float(np.max(root * dev)) * _norm_from_below(ffn.W_2))


def _top_from_below(M: np.ndarray, steps: int = 12) -> float:
    """The Rayleigh quotient of the symmetric positive semidefinite M after ``steps`` rounds of power iteration
    (float): at most ``lambda_max(M)``."""
    v = np.ones(M.shape[0]) / math.sqrt(M.shape[0])
    for _ in range(steps):
        w = M @ v
        size = float(np.linalg.norm(w))
        if not size > 0:
            return 0.0
        v = w / size
    return float(v @ (M @ v))


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
    b_gram, b_float = feedforward_grams(ffn)[1], feedforward_float_grams(ffn)[1]                   # W_2 W_2^T
    joint = IntervalArray(max(lambda_max_upper_large((scaled * b_gram).to_enclosure()), 0.0)).sqrt()
    own = joint.hi.item()   # the form's term: the parts' joint terms are formed only where a part's is larger
    if beta > 0:
        plain = spectral_norm_upper_large((W_2 * (root * columns).expand(-1)).to_enclosure())
        hadamard = feedforward_hadamards(ffn)[0]
        joint = joint + IntervalArray(beta) * IntervalArray(
            _hadamard_term(lambda: hadamard.mid, lambda: hadamard, root, plain, beta * plain >= own))
    for p, (rows, reach) in enumerate(zip(*((carried.rows, carried.columns) if carried is not None else ((), ())))):
        # each carried ball's own terms (lemma token-form-carried)
        P = P + IntervalArray(spectral_norm_upper_large((rows * root.expand(0)).to_enclosure()))
        plain = spectral_norm_upper_large((W_2 * (root * IntervalArray(reach)).expand(-1)).to_enclosure())
        joint = joint + IntervalArray(_hadamard_term(lambda rows=rows: (rows.mid.T @ rows.mid) * b_float,
                                                     lambda p=p: carried.gram(p) * b_gram, root, plain, plain >= own))
    cheap = IntervalArray(float(np.max((root * IntervalArray(dev)).hi))) * IntervalArray(second)
    return P.hi.item(), min(joint.hi.item(), cheap.hi.item())


#: :func:`_hadamard_term` certifies the joint term only where its float estimate is below this share of the plain one
HADAMARD_SHARE = 0.95


def _hadamard_term(estimated, hadamard, root: IntervalArray, plain: float, wanted: bool = True) -> float:
    """The smaller of ``plain`` (a part's ``||diag(D m) W_2||``) and ``lambda_max(D H D)^(1/2)``, ``H`` (d_ff, d_ff) the
    part's Hadamard product (the Gram matrix of its vectors ``N w_k (x) r_k``: ``(N W_1)^T (N W_1) o W_2 W_2^T``), ``D
    = diag(root)``, rounded up (lemma feedforward-taylor-joint: the part's squares ``sum_k S_k (z . N w_k)^2 (r_k .
    v)^2`` are the quadratic form of that Gram matrix at ``z (x) v``).  ``hadamard()`` forms H enclosed,
    ``estimated()`` H in floats (each only where it is read): only where a float estimate from below of the eigenvalue
    (:func:`_norm_from_below` of the positive semidefinite ``D H D`` in floats) is below :data:`HADAMARD_SHARE` of
    ``plain`` is H enclosed and the eigenvalue certified (a choice of work); not at all unless ``wanted`` (the caller's
    choice of work: :func:`_joint_factors` forms it where the part's plain term is at least the form's own, so that
    the part weighs in Q)."""
    if not wanted:
        return plain
    r = root.mid
    estimate = _norm_from_below(estimated() * r[:, None] * r[None, :])
    if not math.sqrt(max(estimate, 0.0)) < HADAMARD_SHARE * plain:
        return plain
    scaled = hadamard() * root.expand(0) * root.expand(-1)
    found = IntervalArray(max(lambda_max_upper_large(scaled.to_enclosure(), estimate=estimate), 0.0)).sqrt()
    return min(plain, found.hi.item())


def _signed_gram(ffn, a_gram: IntervalArray, beta: float, carried: CarriedBall | None) -> tuple[IntervalArray, int]:
    """``(K, c)`` of :func:`_signed_part`: ``K = A^T A + sum_p (N_p W_1)^T (N_p W_1) + beta^2 W_1^T W_1`` (the terms of
    the carried balls and of the ball where present), ``c`` the number of its parts.  (Kept by ``carried``, which
    belongs to one set's parts, for the same ``A^T A`` and ``beta``: the signed and directed lemmas both read it.)"""
    def compute() -> tuple[IntervalArray, int]:
        K, c = a_gram, 1
        for gram in (carried.grams if carried is not None else ()):
            K, c = K + gram, c + 1
        if beta > 0:
            K, c = K + IntervalArray(beta) * IntervalArray(beta) * feedforward_grams(ffn)[0], c + 1
        return K, c
    return compute() if carried is None else carried.kept(a_gram, beta, compute)


def _signed_estimate(ffn, g: IntervalArray, a_gram: IntervalArray, beta: float, carried: CarriedBall | None = None,
                     steps: int = 30) -> float:
    """A float estimate from below of ``c F / 2`` (:func:`_signed_part`): the Rayleigh quotient of ``W_2^T diag(g) (K o
    K) diag(g) W_2`` after ``steps`` rounds of power iteration on its products (the matrix is not formed)."""
    K, c = a_gram.mid, 1
    for rows in (carried.rows if carried is not None else ()):
        K, c = K + rows.mid.T @ rows.mid, c + 1
    if beta > 0:
        K, c = K + (beta * beta) * feedforward_float_grams(ffn)[0], c + 1
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


