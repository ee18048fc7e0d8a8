"""What each component does on a product of token balls: movement, Jacobian blocks, their variation.

For a component ``g`` (a head, an attention layer with its residual, a LayerNorm, a residual
feed-forward block) and token balls U around a centre X (:class:`~lipbound.local.balls.TokenBalls`),
:class:`LocalBounds` holds certified upper bounds on

* ``movement[i] >= sup_U ||g_i(Y) - g_i(X)||`` (so ``g(U)`` lies in the token balls about ``g(X)``);
* ``blocks[i, j] >= sup_U ||B_ij(Y)||`` (the Jacobian block ``d g_i / d y_j``);
* ``variation[i, j] >= sup_U ||B_ij(Y) - B_ij(X)||``;
* ``at_center[i, j] >= ||B_ij(X)||``.

The data-dependent facts are measured on X in interval arithmetic (:mod:`lipbound.local.enclosed`)
and fed into the closed forms of :mod:`lipbound.symbolic.local` (score deviation, softmax
range, attention movement, block and variation bounds, LayerNorm and feed-forward theorems),
compiled by :func:`~lipbound.rigorous.compiler.compile_array`.  A layer's head h is read as a head
whose values are ``v W_O^h`` (its contribution to the output), and heads add up (the split form
of :func:`lipbound.symbolic.theorems.compose_heads`); the residual adds the identity
(:func:`~lipbound.symbolic.theorems.residual`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from ..numeric.model import FeedForward, Head, Layer
from ..numeric.normalization import Normalization
from ..rigorous.arrays import IntervalArray, gelu_curvature_range, gelu_slope, gelu_third, gelu_third_magnitude
from ..rigorous.compiler import compile_array
from ..rigorous.elementwise import gelu_slope_extrema, normal_pdf_bounds
from ..rigorous.linalg import lambda_max_upper_large, product_norm_upper, spectral_norm_upper, spectral_norm_upper_large
from ..symbolic import local as T
from .balls import TokenBalls
from .enclosed import (
    EnclosedAttention,
    EnclosedFeedForward,
    EnclosedNorm,
    feedforward_hadamards,
    head_products,
    hidden_fill,
)

__all__ = ["LocalBounds", "NormFold", "attention_bounds", "norm_bounds", "feedforward_bounds", "remainder_weights",
           "simplex_box_max", "attention_norms", "value_space", "evaluate_theorem", "head_movement", "replace_split",
           "third_derivative_roots", "joint_remainder", "gelu_third_ceiling"]

#: the slopes' remainder is also bounded jointly over the neurons (:func:`joint_remainder`, two certified
#: ``d_ff x d_ff`` top eigenvalues per token) when its per-neuron split is at least this share of the token's bound
JOINT_SHARE = 0.05


@final
@dataclass(frozen=True, eq=False)
class LocalBounds:
    """Certified bounds of one component on token balls (module docstring); arrays of floats."""

    movement: np.ndarray
    blocks: np.ndarray
    variation: np.ndarray
    at_center: np.ndarray
    output: IntervalArray
    facts: dict


#: compiled statements by theorem id (an id names one statement; families such as local-chain-m have one per m)
_COMPILED: dict[str, tuple] = {}


def _compiled(theorem) -> tuple:
    if theorem.id not in _COMPILED:
        symbols = sorted(theorem.statement.free_symbols, key=str)
        _COMPILED[theorem.id] = compile_array(theorem.statement, symbols), [str(s) for s in symbols]
    return _COMPILED[theorem.id]


def _enclose(theorem, **values) -> IntervalArray:
    """A local theorem's statement on arrays, its symbols given by their (LaTeX) names."""
    function, names = _compiled(theorem)
    return function(*[values[name] for name in names])


def evaluate_theorem(theorem, **values) -> np.ndarray:
    """The upper end of :func:`_enclose`: the certified upper bound the theorem states."""
    return _enclose(theorem, **values).hi


def evaluate_theorem_lower(theorem, **values) -> np.ndarray:
    """The lower end of :func:`_enclose`: a certified lower bound of what the theorem states (a floor)."""
    return _enclose(theorem, **values).lo


def simplex_box_max(p_lo: np.ndarray, p_hi: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Upper bounds on ``max {sum_l p_l z_l : p_lo <= p <= p_hi, sum_l p_l = 1}`` over the last axis.

    Lagrangian duality: for every lambda, ``sum_l p_l z_l = lambda + sum_l p_l (z_l - lambda) <=
    lambda + sum_l max(p_lo_l (z_l - lambda), p_hi_l (z_l - lambda))``; lambda is taken at the greedy
    breakpoint (lemma ``box-simplex``), where the bound is the maximum, and evaluated in interval
    arithmetic, so any float lambda gives a valid bound.
    """
    p_lo, p_hi, z = (np.asarray(a, dtype=np.float64) for a in np.broadcast_arrays(p_lo, p_hi, z))
    order = np.argsort(-z, axis=-1)
    capacity = np.take_along_axis(p_hi - p_lo, order, axis=-1)
    slack = 1.0 - p_lo.sum(axis=-1, keepdims=True)
    filled = np.cumsum(capacity, axis=-1) >= slack
    index = np.where(filled.any(axis=-1), filled.argmax(axis=-1), z.shape[-1] - 1)[..., None]
    lam = np.take_along_axis(np.take_along_axis(z, order, axis=-1), index, axis=-1)
    shifted = IntervalArray(z) - IntervalArray(lam)
    terms = (shifted * IntervalArray(p_lo)).maximum(shifted * IntervalArray(p_hi))
    return (terms.sum(axis=-1) + IntervalArray(lam[..., 0])).hi


def _norm(head: Head, key: str, matrix_of) -> float:
    """A certified spectral norm of a matrix (or of a product of two, without forming it), kept in the
    head's cache of norms (the head is immutable)."""
    cache = head.norm_cache
    if ("local", key) not in cache:
        matrix = matrix_of()
        cache[("local", key)] = product_norm_upper(*matrix) if isinstance(matrix, tuple) \
            else spectral_norm_upper(matrix)
    return cache[("local", key)]


def attention_norms(engine) -> dict:
    """Certified ``||W_Q||, ||W_K||, ||V|| (= L_V)`` per head, arrays (H,) (the per-pair ``||W_Q R_ij W_K^T||`` are
    :attr:`EnclosedAttention.norms`)."""
    out = {key: [] for key in ("W_Q", "W_K", "L_V")}
    for h, head in enumerate(engine.heads):
        W_Q, W_K, V = engine.head_weights(h)[:3]
        out["W_Q"].append(_norm(head, "W_Q", lambda: W_Q))
        out["W_K"].append(_norm(head, "W_K", lambda: W_K))
        out["L_V"].append(_norm(head, "V", lambda: V))
    return {key: np.array(value) for key, value in out.items()}


def value_space(E: EnclosedAttention, target) -> tuple[IntervalArray, IntervalArray, np.ndarray]:
    """Values and head outputs where they act on the output: ``v_j W_O^h`` and ``f_i W_O^h`` for a layer
    (each head of a layer is a head with values ``v W_O^h``), ``v_j`` and ``f_i`` for a head; and the
    certified norm of each head's value map (``||V^h W_O^h||`` or ``||V||``), shape (H,)."""
    engine = E.engine
    if engine.W_O is None:
        head = engine.heads[0]
        return E.V, E.F, np.array([_norm(head, "V", lambda: engine.head_weights(0)[2])])
    values, outputs, norms = [], [], []
    for h, head in enumerate(engine.heads):
        rows = target.output_block(h)
        values.append(E.V[h].matmul(rows))
        outputs.append(E.F[h].matmul(rows))
        norms.append(_norm(head, "V W_O^h", lambda: (engine.head_weights(h)[2], rows)))
    return IntervalArray.stack(values), IntervalArray.stack(outputs), np.array(norms)


def attention_bounds(target: Head | Layer, balls: TokenBalls, enclosed: EnclosedAttention | None = None,
                     want_blocks: bool = True, scores: IntervalArray | None = None,
                     value_shift: np.ndarray | None = None, weights: IntervalArray | None = None) -> LocalBounds:
    """Bounds of a head, or of an attention layer (with its residual when ``target.residual``).

    ``scores`` (H, n, n) and ``value_shift`` (H, n) replace the ball-derived score ranges and
    ``Delta v_j = ||V^h W_O^h|| r_j`` when the caller knows sharper ones (e.g. maxima over a finite
    set of inputs); ``weights`` (H, n, n) narrows the weight ranges the scores give (e.g. the rows of a
    Frobenius ball moving together: :class:`~lipbound.local.ball_weights.BallWeights`); all must hold on
    the whole of U.
    """
    E = enclosed or EnclosedAttention(target, balls.center, balls.masses)
    engine = E.engine
    norms = attention_norms(engine)
    n = balls.n
    r = balls.radii
    values, outputs, value_norms = value_space(E, target)
    pairs = E.norms                                   # a_ij, b_ij, g_ij (lipbound.local.scores)
    if scores is None:
        sigma = evaluate_theorem(T.score_deviation(), **{
            "c": E.c, T.SCORE_NAMES["a"]: pairs.a, T.SCORE_NAMES["b"]: pairs.b, T.SCORE_NAMES["g"]: pairs.g,
            "r_i": r[None, :, None], "r_j": r[None, None, :]})
        scores = hidden_fill(E.S + IntervalArray(-sigma, sigma), E.visible)
    p_hi, p_lo = _softmax_range(scores, E.masses)
    if weights is not None:
        p_hi, p_lo = np.minimum(p_hi, weights.hi), np.maximum(p_lo, weights.lo)
    p_hi, p_lo = np.maximum(p_hi, E.P.hi), np.minimum(p_lo, E.P.lo)
    delta = np.maximum((IntervalArray(p_hi) - IntervalArray(E.P.lo)).hi,
                       (IntervalArray(E.P.hi) - IntervalArray(p_lo)).hi)
    rho = (values.expand(1) - outputs.expand(2)).norm_upper()                     # ||(v_j - f_i) W_O^h|| at X
    shift = (IntervalArray(value_norms[:, None]) * IntervalArray(r[None, :])).hi if value_shift is None else value_shift
    head_move = head_movement(p_lo, p_hi, delta, rho, shift)
    facts = {"p_hi": p_hi, "p_lo": p_lo, "head_movement": head_move, "scores": scores, "delta": delta,
             "value_shift": shift}
    per_head = [head_move]
    if want_blocks:
        per_head += list(_attention_blocks(E, norms, value_norms, r, shift, p_lo, p_hi, delta, rho, head_move))
    movement, *matrices = (IntervalArray(m).sum(axis=0).hi for m in per_head)   # heads add up (multi-head rule)
    if engine.residual:
        movement = (IntervalArray(movement) + IntervalArray(r)).hi
        if want_blocks:
            eye = IntervalArray(np.eye(n))
            matrices[0] = (IntervalArray(matrices[0]) + eye).hi
            matrices[2] = (IntervalArray(matrices[2]) + eye).hi
    blocks, variation, at_center = matrices if want_blocks else (None, None, None)
    if want_blocks:  # the mean value theorem on U, token by token: movement_i <= sum_j M_ij r_j
        movement = np.minimum(movement, IntervalArray(blocks).einsum("ij,j->i", IntervalArray(r)).hi)
    return LocalBounds(movement, blocks, variation, at_center, output=E.output, facts=facts)


def head_movement(p_lo: np.ndarray, p_hi: np.ndarray, delta: np.ndarray, rho: np.ndarray,
                  shift: np.ndarray) -> np.ndarray:
    """``sup_U ||f_i(Y) - f_i(X)||`` per head and query (theorems local-movement and local-reach), from the
    weight ranges ``[p_lo, p_hi]`` (H, n, n), the weights' largest changes ``delta``, ``rho_ij >= ||v_j - f_i||``
    at X and the value shifts ``shift`` (H, n) on U, all in one space (the values' or the output's)."""
    D = (IntervalArray(delta) * IntervalArray(rho)).sum(axis=-1).hi
    mean_shift = simplex_box_max(p_lo, p_hi, np.broadcast_to(shift[:, None, :], p_lo.shape))
    moved = evaluate_theorem(T.attention_movement(), D_i=D, **{r"E_i[\Delta v]": mean_shift})
    reach = evaluate_theorem(T.attention_reach(), **{r"E_i[\rho + \Delta v]": simplex_box_max(
        p_lo, p_hi, (IntervalArray(rho) + IntervalArray(shift[:, None, :])).hi)})
    return np.minimum(moved, reach)


#: Largest |exponent| the softmax theorems are evaluated at (see :func:`_softmax_range`).
_EXPONENT_LIMIT = 600.0


def _softmax_range(scores: IntervalArray, masses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(p_upper, p_lower)`` for scores anywhere in ``scores`` (theorems local-softmax-upper/lower).

    Upper ends: shift every row by its largest lower score, so the other tokens' sum Z^- (or the own
    term) contains a term ``e^0`` and the denominator stays away from 0; an own exponent beyond 600
    gives the trivial bound 1.  Lower ends: shift by the largest upper score; an own exponent below -600,
    or a denominator whose enclosure reaches 0 (everything underflows), gives the trivial bound 0.
    """
    m = IntervalArray(masses)
    ends = {}
    for side, values, others in (("upper", scores.hi, scores.lo), ("lower", scores.lo, scores.hi)):
        shift = np.max(scores.lo if side == "upper" else scores.hi, axis=-1, keepdims=True)
        exponent = IntervalArray(values) - IntervalArray(shift)
        # beyond +-600 the exponentials (and the reciprocals the theorems take of them) leave the float
        # range: there the trivial ends 1 (upper) and 0 (lower) lose nothing a float could show
        trivial = exponent.hi > _EXPONENT_LIMIT if side == "upper" else exponent.lo < -_EXPONENT_LIMIT
        exponent = IntervalArray(np.clip(exponent.lo, -_EXPONENT_LIMIT, _EXPONENT_LIMIT),
                                 np.clip(exponent.hi, -_EXPONENT_LIMIT, _EXPONENT_LIMIT))
        rest = (IntervalArray(others) - IntervalArray(shift)).exp() * m
        Z = rest.sum(axis=-1, keepdims=True) - rest                          # sum over l != j
        Z = IntervalArray(np.maximum(Z.lo, 0.0), np.maximum(Z.hi, 0.0))
        own = exponent.exp() * m
        undefined = (own + Z).lo <= 0.0
        Z = IntervalArray(np.where(undefined, 1.0, Z.lo), np.where(undefined, 1.0, Z.hi))
        theorem = T.softmax_upper() if side == "upper" else T.softmax_lower()
        names = {"upper": (r"s^{+}_{ij}", r"Z^{-}_{ij}"), "lower": (r"s^{-}_{ij}", r"Z^{+}_{ij}")}[side]
        result = _enclose(theorem, **{"m_j": m, names[0]: exponent, names[1]: Z})
        if side == "upper":
            ends[side] = np.where(trivial | undefined, 1.0, np.minimum(result.hi, 1.0))
        else:
            ends[side] = np.where(trivial | undefined, 0.0, np.maximum(result.lo, 0.0))
    return ends["upper"], ends["lower"]


def _attention_blocks(E: EnclosedAttention, norms: dict, value_norms, r, shift, p_lo, p_hi, delta, rho, head_move):
    """Per head ``(M, V, N)`` of shape (H, n, n): block bounds on U, their variation, and at X
    (theorems local-attention-block and local-attention-variation, in the heads' output space)."""
    H = E.engine.H
    w_norm, g = E.norms.b, E.norms.g                                      # ||w_ij|| at X, ||W_Q R_ij W_K^T||
    L_V = value_norms[:, None, None]
    rj = r[None, None, :]
    mu = head_move[:, :, None]
    dU = (IntervalArray(shift[:, None, :]) + IntervalArray(mu)).hi
    U_plus = (IntervalArray(rho) + IntervalArray(dU)).hi                                  # (H, n, n)
    dw = (IntervalArray(g) * IntervalArray(r[None, :, None])).hi                          # w_ij moves with q_i
    w_plus = (IntervalArray(w_norm) + IntervalArray(dw)).hi                              # (H, n, n or 1)
    # K^+_il = ||k_l - kappa_i|| + ||W_K|| r_l with the fixed key kappa_i = sum_l p_il k_l (floats at X)
    kappa = np.einsum("hil,hlk->hik", E.P.mid, E.K.mid)
    key_spread = (E.K.expand(1) - IntervalArray(kappa).expand(2)).norm_upper()           # (H, n, n)
    key_shift = IntervalArray(norms["W_K"][:, None, None]) * IntervalArray(rj)
    K_plus = (IntervalArray(key_spread) + key_shift).hi
    C_plus = simplex_box_max(p_lo, p_hi, (IntervalArray(U_plus) * IntervalArray(K_plus)).hi)
    dC = (IntervalArray(delta) * IntervalArray(U_plus) * IntervalArray(K_plus)
          + IntervalArray(E.P.hi) * (IntervalArray(dU) * IntervalArray(K_plus)
                                     + IntervalArray(rho) * key_shift)).sum(axis=-1).hi
    C_at = simplex_box_max(E.P.lo, E.P.hi, (IntervalArray(rho) * IntervalArray(key_spread)).hi)
    diagonal = np.broadcast_to(np.eye(E.n), (H, E.n, E.n))
    common = {"c": E.c, "L_V": L_V, r"[i = j]": diagonal, "W_Q": norms["W_Q"][:, None, None]}
    M = evaluate_theorem(T.attention_block(), **common, **{
        r"p^{+}_{ij}": p_hi, r"U^{+}_{ij}": U_plus, r"w^{+}_{ij}": w_plus, r"C^{+}_i": C_plus[:, :, None]})
    V = evaluate_theorem(T.attention_variation(), **common, **{
        r"\delta_{ij}": delta, r"U^{+}_{ij}": U_plus, r"w^{+}_{ij}": w_plus, r"\bar p_{ij}": E.P.hi,
        r"\Delta U_{ij}": dU, r"\|\bar u_{ij}\|": rho, r"\Delta w_{ij}": dw, r"\Delta C_i": dC[:, :, None]})
    N = evaluate_theorem(T.attention_block(), **common, **{
        r"p^{+}_{ij}": E.P.hi, r"U^{+}_{ij}": rho, r"w^{+}_{ij}": w_norm, r"C^{+}_i": C_at[:, :, None]})
    return M, V, N


# Attention behind a norm (pre-norm) ------------------------------------------------------------------
class NormFold:
    """What a norm's Jacobians ``J_j`` at the centre do to the scores and values of the attention that reads it
    (theorem local-score-deviation-normalised): ``||J_i a_ij||``, ``||J_j w_ij||`` (H, n, n) and ``||J_j A_h||``
    (H, n), certified once.

    Parameters
    ----------
    norm : EnclosedNorm
        The norm at X.
    attention : EnclosedAttention
        The attention at the norm's output.
    target : Head or Layer
    """

    def __init__(self, norm: EnclosedNorm, attention: EnclosedAttention, target):
        n = attention.n
        self.J = IntervalArray.stack([norm.jacobian_block(m) for m in range(n)])       # (n, d, d)
        pairs = attention.norms
        H = attention.engine.H
        keys = pairs.key_vectors + IntervalArray(np.zeros((H, n, n, 1)))               # (H, n(i), n(j), d)
        queries = pairs.w + IntervalArray(np.zeros((H, n, n, 1)))
        self.keys = keys.einsum("hijd,ikd->hijk", self.J).norm_upper()                 # ||a_ij J_i^T||
        self.queries = queries.einsum("hijd,jkd->hijk", self.J).norm_upper()           # ||w_ij J_j^T||
        values = head_products(attention.engine)                                         # A_h, (H, d, d_out)
        self.values = np.array([[spectral_norm_upper_large(self.J[j].bmm(values[h]).to_enclosure()) for j in range(n)]
                                for h in range(H)])                                      # ||J_j A_h||
        _, _, self.value_norms = value_space(attention, target)                         # ||A_h||

    def overrides(self, attention: EnclosedAttention, r: np.ndarray, nu: np.ndarray, rho: np.ndarray) -> dict:
        """``scores`` and ``value_shift`` for :func:`attention_bounds` on the image of the balls of radii r: every
        token's norm output within rho_j of its centre, its Jacobian within nu_j of ``J_j``.  Each is the smaller of
        the route through the Jacobians and the plain one on the balls of radii rho (theorem local-score-deviation,
        ``||A_h|| rho_j``): both hold there, and the plain one wins once the balls reach the norm's singular point."""
        pairs = attention.norms
        names = {"c": attention.c, T.SCORE_NAMES["a"]: pairs.a, T.SCORE_NAMES["b"]: pairs.b,
                 T.SCORE_NAMES["g"]: pairs.g}
        sigma = evaluate_theorem(T.score_deviation_normalised(), **names, **{
            r"\|J_i a_{ij}\|": self.keys, r"\|J_j w_{ij}\|": self.queries,
            r"\nu_i": nu[None, :, None], r"\nu_j": nu[None, None, :], "r_i": r[None, :, None], "r_j": r[None, None, :],
            r"\rho_i": rho[None, :, None], r"\rho_j": rho[None, None, :]})
        plain = evaluate_theorem(T.score_deviation(), **names, r_i=rho[None, :, None], r_j=rho[None, None, :])
        sigma = np.minimum(sigma, plain)
        scores = hidden_fill(attention.S + IntervalArray(-sigma, sigma), attention.visible)
        shift = ((IntervalArray(self.values) + IntervalArray(self.value_norms[:, None]) * IntervalArray(nu[None, :]))
                 * IntervalArray(r[None, :])).hi
        shift = np.minimum(shift, (IntervalArray(self.value_norms[:, None]) * IntervalArray(rho[None, :])).hi)
        return {"scores": scores, "value_shift": shift}


# LayerNorm and RMSNorm ------------------------------------------------------------------------------
def norm_bounds(norm: Normalization, balls: TokenBalls, enclosed: EnclosedNorm | None = None) -> LocalBounds:
    """Bounds of a LayerNorm or an RMSNorm (per token: the block matrices are diagonal)."""
    E = enclosed or EnclosedNorm(norm, balls.center)
    kind = norm.kind
    R = balls.radii
    common = {r"\|\gamma\|_\infty": np.float64(norm.gamma_max), "d": np.float64(norm.d), r"\nu": E.nu,
              r"\delta": E.delta}
    # a set with a floor of its centred norm (lemma centred-floor) reads max(nu - R, floor) where nu - R stood
    floored = {} if balls.floors is None else {r"\ell": np.asarray(balls.floors, dtype=np.float64)}
    lipschitz = evaluate_theorem((T.norm_lipschitz_floor if floored else T.norm_lipschitz)(kind), **common, R=R,
                                 **floored)
    at_center = evaluate_theorem(T.norm_lipschitz(kind), **common, R=np.zeros_like(R))
    reach = (IntervalArray(norm.radius_about_center)
             + IntervalArray((E.output - IntervalArray(norm.center)).norm_upper())).hi
    small = R < E.nu.lo                                                      # the chord form needs R < nu
    chord = np.full_like(R, np.inf)
    if np.any(small):
        restricted = {k: (v[small] if isinstance(v, IntervalArray) and v.shape else v) for k, v in common.items()}
        chord[small] = evaluate_theorem(T.norm_movement(kind), **restricted, R=R[small])
    movement = np.minimum(np.minimum(chord, (IntervalArray(lipschitz) * IntervalArray(R)).hi), reach)
    scale = IntervalArray(norm.gamma_max) * IntervalArray(float(norm.d)).sqrt()
    G = np.minimum((IntervalArray(movement) / scale).hi, 2.0)
    variation = evaluate_theorem((T.norm_variation_floor if floored else T.norm_variation)(kind), **common, R=R, G=G,
                                 **floored)
    return LocalBounds(movement, np.diag(lipschitz), np.diag(variation), np.diag(at_center), E.output,
                       {"nu": E.nu, "lipschitz": lipschitz})


# Feed-forward ----------------------------------------------------------------------------------------
def _column_norms(ffn: FeedForward) -> np.ndarray:
    return IntervalArray(ffn.W_1).norm_upper(axis=0)


def _split_norms(ffn: FeedForward, spread: np.ndarray) -> tuple[float, float]:
    """``(||W_2^T diag(s)^{1/2}||, ||diag(s)^{1/2} W_1^T||)`` for one token's slope deviations s, certified."""
    if not np.any(spread):
        return 0.0, 0.0
    root = IntervalArray(spread).sqrt()
    left = (IntervalArray(ffn.W_2) * root[:, None]).to_enclosure()
    right = (IntervalArray(ffn.W_1) * root[None, :]).to_enclosure()
    return spectral_norm_upper_large(left), spectral_norm_upper_large(right)


def _slope_deviation(over: IntervalArray, at_centre: IntervalArray) -> np.ndarray:
    """``s_k >= |a - b|`` for a slope ``a`` in ``over`` and ``b`` in ``at_centre`` (entrywise, rounded up): how far
    GELU' over a neuron's interval strays from its value at the centre."""
    return np.maximum((IntervalArray(over.hi) - IntervalArray(at_centre.lo)).hi,
                      (IntervalArray(at_centre.hi) - IntervalArray(over.lo)).hi)


def remainder_weights(ffn: FeedForward, E: EnclosedFeedForward, R: np.ndarray, tokens) -> np.ndarray:
    """Per token and neuron, ``t_k >= |Delta_k (e.w_k)|`` on the ball of radius R (theorem
    local-feedforward-curvature): how far the mean of GELU'' over the segment moves from its value at the
    centre -- the range of GELU'' over the interval of h, or half the largest third derivative there times
    ``||w_k|| R`` -- times ``||w_k|| R``.  Shape (n, d_ff), zero for tokens not listed."""
    columns = IntervalArray(_column_norms(ffn))
    reach = columns[None, :] * IntervalArray(R)[:, None]
    interval = E.h + IntervalArray(-reach.hi, reach.hi)
    ranges, third = gelu_curvature_range(interval), gelu_third_magnitude(interval)
    at_centre = E.curvature
    out = np.zeros(E.h.shape)
    for i in tokens:
        change = np.maximum((IntervalArray(ranges.hi[i]) - IntervalArray(at_centre.lo[i])).hi,
                            (IntervalArray(at_centre.hi[i]) - IntervalArray(ranges.lo[i])).hi)
        # or half the largest third derivative times ||w_k|| R: the mean of a Lipschitz change over the segment
        change = np.minimum(change, (IntervalArray(third[i]) * columns * IntervalArray(R[i]) * IntervalArray(0.5)).hi)
        out[i] = (IntervalArray(change) * columns * IntervalArray(R[i])).hi
    return out


def _second_derivative_variation(ffn: FeedForward, E: EnclosedFeedForward, R: np.ndarray,
                                 local: np.ndarray) -> np.ndarray:
    """The variation of the block's Jacobian on the token balls through its second derivative at the centre
    (theorem local-feedforward-curvature; inf for tokens not in ``local``): ``R Lambda^(1/2)`` plus the slopes'
    remainder, the smaller of the split bound of :func:`remainder_weights` and the joint one of
    :func:`joint_remainder` (the latter formed only where the split is at least :data:`JOINT_SHARE` of the bound)."""
    tokens = np.flatnonzero(local)
    root = E.curvature_norms(tokens)
    weights = remainder_weights(ffn, E, R, tokens)
    rest = np.zeros((2, R.shape[0]))
    for i in tokens:
        rest[:, i] = _split_norms(ffn, weights[i])
    names = (r"\|W_2^\top \operatorname{diag}(t)^{1/2}\|", r"\|\operatorname{diag}(t)^{1/2} W_1^\top\|")
    bound = evaluate_theorem(T.feedforward_curvature(), R=R, **{r"\Lambda^{1/2}": root, names[0]: rest[0],
                                                                names[1]: rest[1]})
    for i in tokens:
        split = (IntervalArray(rest[0, i]) * IntervalArray(rest[1, i])).hi.item()
        if np.isfinite(bound[i]) and split >= JOINT_SHARE * bound[i]:
            bound[i] = replace_split(bound[i], rest[0, i], rest[1, i], joint_remainder(E, int(i), R[i]))
    return np.where(local, bound, np.inf)


def replace_split(value: float, a: float, b: float, smaller: float) -> float:
    """An upper bound of a sum ``value`` with its term ``a b`` replaced by ``min(a b, smaller)``: the value less a
    lower bound of ``a b``, plus ``smaller``, rounded up."""
    product = IntervalArray(a) * IntervalArray(b)
    if not smaller < product.lo.item():
        return value
    return (IntervalArray(value) - product + IntervalArray(smaller)).hi.item()


#: GELU''' is enclosed on pieces of this width over [-_THIRD_SPAN, _THIRD_SPAN] (:func:`gelu_third_ceiling`)
_THIRD_PIECE, _THIRD_SPAN = 1.0 / 512, 12.0
_THIRD_CEILING: list = []


def gelu_third_ceiling() -> float:
    """A certified upper bound on ``sup |GELU'''|`` over the real line (the supremum is 0.7788..., at ``x^2 = (7 -
    sqrt 33) / 2``): GELU''' ``= x phi(x) (x^2 - 4)`` enclosed on pieces of width 1/512 covering [-12, 12] (0.7807),
    and beyond them ``|x|^3 phi(x)``, which decreases for ``|x| > sqrt 3``, at ``|x| = 12`` (about 1e-28).  It caps
    the enclosure of GELU''' over a wide interval, which multiplies the factors' ranges."""
    if not _THIRD_CEILING:
        starts = np.arange(-_THIRD_SPAN, _THIRD_SPAN, _THIRD_PIECE)            # exact: multiples of 2^-9
        inside = float(np.max(gelu_third(IntervalArray(starts, starts + _THIRD_PIECE)).magnitude))
        edge = IntervalArray(_THIRD_SPAN)
        tail = (edge * edge * edge * IntervalArray(float(normal_pdf_bounds(_THIRD_SPAN)[1]))).hi.item()
        _THIRD_CEILING.append(max(inside, tail))
    return _THIRD_CEILING[0]


def third_derivative_roots(E: EnclosedFeedForward, i: int, radius: float) -> IntervalArray:
    """``S_k^(1/2)`` (d_ff,): ``S_k >= |GELU'''|`` on the interval ``h_ik +- ||w_k|| radius`` of neuron k's
    pre-activation over token i's ball (capped by :func:`gelu_third_ceiling`)."""
    reach = (IntervalArray(_column_norms(E.ffn)) * IntervalArray(float(radius))).hi
    third = np.minimum(gelu_third_magnitude(E.h[i] + IntervalArray(-reach, reach)), gelu_third_ceiling())
    return IntervalArray(third).sqrt()


def joint_remainder(E: EnclosedFeedForward, i: int, radius: float) -> float:
    """A bound on ``sup ||W_1 diag(rho) W_2||`` over token i's ball of ``radius`` (lemma slope-remainder-quadratic
    with ``A = W_1``, ``B = W_2``): ``rho_k = GELU'(h_k + e.w_k) - GELU'(h_k) - GELU''(h_k) (e.w_k)``, ``|rho_k| <= S_k
    (e.w_k)^2 / 2`` (:func:`third_derivative_roots`), and Cauchy-Schwarz over the neurons pays the pre-activations'
    moves jointly through the one direction e: ``(radius^2 / 2) (lambda_A lambda_B)^(1/2)``, ``lambda_A =
    lambda_max(diag(S)^(1/2) (G_1 o G_1) diag(S)^(1/2))``, ``lambda_B`` the same with ``G_1 o G_2``
    (:func:`~lipbound.local.enclosed.feedforward_hadamards`), where the split of :func:`remainder_weights` pays
    ``||w_k|| radius`` for every neuron at once.  Two certified top eigenvalues of ``d_ff x d_ff`` matrices; inf for
    an infinite radius."""
    if not np.isfinite(radius):
        return np.inf
    root = third_derivative_roots(E, i, radius)
    tops = [max(lambda_max_upper_large((gram * root.expand(0) * root.expand(-1)).to_enclosure()), 0.0)
            for gram in feedforward_hadamards(E.ffn)]                          # G_1 o G_2, G_1 o G_1
    half_square = IntervalArray(float(radius)) * IntervalArray(float(radius)) * IntervalArray(0.5)
    return (half_square * (IntervalArray(tops[0]) * IntervalArray(tops[1])).sqrt()).hi.item()


_GLOBAL: dict = {}


def feedforward_global(ffn: FeedForward) -> float:
    """``1 + max GELU' ||W_1|| ||W_2||``: the residual block's Lipschitz constant on all of R^d
    (``max GELU' = GELU'(sqrt 2) = 1.1289...``); computed once per block."""
    key = id(ffn)
    if key not in _GLOBAL or _GLOBAL[key][0] is not ffn:
        top = gelu_slope_extrema()[1][1]
        value = (IntervalArray(1.0) + IntervalArray(top) * IntervalArray(spectral_norm_upper(ffn.W_1))
                 * IntervalArray(spectral_norm_upper(ffn.W_2))).hi.item()
        _GLOBAL[key] = (ffn, value)
    return _GLOBAL[key][1]


def feedforward_bounds(ffn: FeedForward, balls: TokenBalls, enclosed: EnclosedFeedForward | None = None,
                       want_variation: bool = True, local_limit: float = 2.0) -> LocalBounds:
    """Bounds of the residual feed-forward block ``y + FFN(y)`` (per token): on the ball of token i the
    slopes ``GELU'(h_k)`` stay within ``s_k`` of their value at the centre, so
    ``sup ||B_ii(Y) - B_ii(X)|| <= ||W_2^T diag(s)^(1/2)|| ||diag(s)^(1/2) W_1^T||`` (theorem
    local-feedforward-variation), ``sup ||B_ii|| <= ||B_ii(X)|| + that`` (theorem local-lipschitz), and
    the movement is at most that times the radius (mean value theorem, lemma secant-slope).  Tokens whose
    radius exceeds ``local_limit`` (their slopes range over nearly everything) take the global constant
    :func:`feedforward_global`, unless the variation is asked for."""
    E = enclosed or EnclosedFeedForward(ffn, balls.center)
    R = balls.radii
    n = R.shape[0]
    local = (R > 0) & ((R <= local_limit) | want_variation)
    reach = IntervalArray(_column_norms(ffn))[None, :] * IntervalArray(R)[:, None]
    slopes = gelu_slope(E.h + IntervalArray(-reach.hi, reach.hi))                 # GELU' over the interval of h
    factors = np.zeros((2, n))
    for i in np.flatnonzero(local):
        factors[:, i] = _split_norms(ffn, _slope_deviation(slopes[i], E.slope[i]))
    names = (r"\|W_2^\top \operatorname{diag}(s)^{1/2}\|", r"\|\operatorname{diag}(s)^{1/2} W_1^\top\|")
    variation = evaluate_theorem(T.feedforward_variation(), **{names[0]: factors[0], names[1]: factors[1]})
    if want_variation and np.any(local):
        variation = np.minimum(variation, _second_derivative_variation(ffn, E, R, local))
    at_center = E.jacobian_norms(None if want_variation else np.flatnonzero(local))
    lipschitz = evaluate_theorem(T.jacobian_on_neighbourhood(), **{r"\|Df(X)\|": at_center,
                                                                   r"\sup_U \|Df(Y) - Df(X)\|": variation})
    lipschitz = np.where(local | (R == 0), lipschitz, feedforward_global(ffn))
    movement = (IntervalArray(lipschitz) * IntervalArray(R)).hi
    return LocalBounds(movement, np.diag(lipschitz), np.diag(variation), np.diag(at_center), E.output,
                       {"slopes": slopes})
