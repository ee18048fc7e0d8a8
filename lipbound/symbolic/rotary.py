r"""Rotary position embeddings (RoPE): the score and its kernel constants.

RoPE (Su et al. 2021) rotates the query of token i by its position and the key of token j by
its own, so that the score depends on the offset ``Delta = p_j - p_i`` only:

    s_ij = (W_Q^T x_i + b_Q)^T R_Delta (W_K^T x_j + b_K) / sqrt(d_k),    R_Delta = R(theta p_i)^T R(theta p_j),

``R`` block-diagonal with 2 x 2 rotations (orthogonal, ``R_0 = I``).  Each key of a query is seen
through its own matrix ``A_Delta = W_Q R_Delta W_K^T / sqrt(d_k)``; the constants are stated in

    a = max_Delta ||A_Delta||    over the offsets that occur

(``2n - 1`` in self-attention, ``n`` under a causal mask, ``w`` or ``2w - 1`` under a window, ``m + n - 1``
in cross-attention) and in three centre terms that vanish on a ball about the origin without biases
(the image of an RMSNorm, in every model without query/key biases):

    g_Q = max_Delta ||W_K R_Delta^T q_c|| / sqrt(d_k),   g_K = max_Delta ||W_Q R_Delta k_c|| / sqrt(d_k),
    s_c = max_Delta |q_c^T R_Delta k_c| / sqrt(d_k),      q_c = W_Q^T c_Q + b_Q,  k_c = W_K^T c + b_K.

The query constant is **not** the mean-value one of the dot product, ``R ||A||``: that route differences
``grad_x s(x_i, x_j) - grad_x s(x_i, x_k)`` along the keys, and with RoPE these use different matrices,
``A_Dj (x_j - c) - A_Dk (x_k - c) + W_Q (R_Dj - R_Dk) k_c``.  lipbound bounds every query gradient
instead: ``|grad_x s_ij . e| <= (a R + g_K) ||e||``, so ``alpha <= a R + g_K`` (a standard deviation is
at most the largest absolute value).  On a ball about 0 without biases every constant is the
dot product's with ``||A||`` replaced by ``a``.  The unrotated ``||W_Q W_K^T|| / sqrt(d_k)`` is *not*
a valid replacement (:data:`UNROTATED_FAMILY`; the claim ``rope-unrotated``).
"""

from __future__ import annotations

from typing import Final, final

import sympy as sp

from ..rigorous.compiler import compile_interval
from ..rigorous.intervals import IV, lower
from . import symbols as S
from .calculus import Inner, Region, upper_norm_vec
from .record import Defines, Derivation, Described, eq, le
from .scores import KernelConstants, Score, affine_projection

__all__ = ["RotaryScore", "CRUDE", "UNROTATED_FAMILY", "unrotated_counterexample", "query_centre", "key_centre"]

_ROOT = sp.sqrt(S.d_k)
_A_DELTA = sp.MatrixSymbol("A_Delta", S.d, S.d)
#: The cruder forms (R_Delta is orthogonal): substitute them into a bound to evaluate it with plain norms.
CRUDE: Final = {
    S.a_rot: S.MatrixNormSymbol("W_Q") * S.MatrixNormSymbol("W_K") / _ROOT,
}
#: The counterexample to the unrotated constant: d = 1, d_k = 2, W_Q = e_1^T, W_K = e_2^T (so W_Q W_K^T = 0,
#: every unrotated score is 0 and the unrotated bound is ||W_V||), rotation angle theta = pi / 2 per position.
UNROTATED_FAMILY: Final = ("d = 1, d_k = 2, W_Q = (1, 0), W_K = (0, 1), W_V = 1, no biases, theta = pi/2 per position, "
                           "n = 2 tokens in [-R, R]: W_Q W_K^T = 0, so the unrotated bound is ||W_V|| = 1, but "
                           "A_Delta = -sin(Delta pi / 2) / sqrt(2) and s_ij = -x_i x_j sin((j - i) pi / 2) / sqrt(2) "
                           "move "
                           "the weights: ||Df|| > 1.2 at R = 1 and grows about like R")


def query_centre(score: Score, centre) -> sp.MatrixExpr | None:
    """``q_c = W_Q^T c_Q + b_Q``, the query of the queries' centre (None when it is 0)."""
    parts = ([S.W_Q.T * centre] if centre is not None else []) + ([S.b_Q] if score.biased else [])
    return sp.MatAdd(*parts).doit() if parts else None


def key_centre(score: Score, centre) -> sp.MatrixExpr | None:
    """``k_c = W_K^T c + b_K``, the key of the keys' centre (None when it is 0)."""
    parts = ([S.W_K.T * centre] if centre is not None else []) + ([S.b_K] if score.biased else [])
    return sp.MatAdd(*parts).doit() if parts else None


def _centre_text(vector) -> str:
    return "0" if vector is None else str(vector).replace("*", " ")


@final
class RotaryScore(Score):
    r"""The rotary dot-product score ``s_ij = q_i^T R_Delta k_j / sqrt(d_k)`` with query and key biases
    (``biases=False``: without), Su et al. 2021.  Kernel constants: module docstring."""

    name = "rope"
    title = "rotary dot-product score"
    kind = "dot"
    rotary = True

    def __init__(self, biases: bool = True):
        self.biases = biases

    @property
    def biased(self) -> bool:
        return self.biases

    def expression(self) -> sp.Expr:
        query = affine_projection(S.W_Q.T * S.x, S.b_Q, self.biases)
        key = affine_projection(S.W_K.T * S.y, S.b_K, self.biases)
        return Inner(query, (S.R_Delta * key).doit()) / _ROOT

    def hypotheses(self) -> list[str]:
        return ["rotary positions: s_ij = q_i^T R_Delta k_j / sqrt(d_k) with Delta = p_j - p_i, R_Delta orthogonal "
                "(block-diagonal 2 x 2 rotations)",
                "Delta ranges over the offsets that occur; a = max_Delta ||A_Delta||, A_Delta = W_Q R_Delta W_K^T / "
                "sqrt(d_k)"]

    def witness_note(self) -> str:
        return "rotation angles in 2 pi Z, so R_Delta = I at every offset"

    def _derive_constants(self, assumptions) -> KernelConstants:
        record = Derivation(f"Kernel constants of the {self.title}")
        for text in self.hypotheses():
            record.hypothesis(text)
        key_ball = assumptions.domain.enclosing_ball(record)
        query_ball = key_ball if assumptions.query_domain is None else assumptions.query_domain.enclosing_ball(record)
        R, R_Q = key_ball.radius, query_ball.radius
        q_c, k_c = query_centre(self, query_ball.center), key_centre(self, key_ball.center)
        g_Q = S.g_Q if q_c is not None else sp.Integer(0)
        g_K = S.g_K if k_c is not None else sp.Integer(0)
        s_c = S.s_c if q_c is not None and k_c is not None else sp.Integer(0)
        a = S.a_rot
        record.add(eq(Described("s(x_i, x_j)"), self.expression()),
                   "R(theta p_i)^T R(theta p_j) = R_Delta: the score depends on the positions through "
                   "Delta = p_j - p_i",
                   "rotary-offset")
        record.add(Defines(_A_DELTA, S.W_Q * S.R_Delta * S.W_K.T / _ROOT),
                   "the matrix of the bilinear part of the score at offset Delta")
        record.add(Defines(Described("a"), Described(r"\max_{\Delta} \|A_\Delta\|_2")),
                   "the largest over the offsets that occur (2n - 1 in self-attention, fewer under a mask)")
        value = (S.W_V.T * S.y).doit()
        L_V = upper_norm_vec(value, Region({S.y: (None, 1)}))
        rho = upper_norm_vec(value, Region({S.y: (None, R)}))
        record.add(eq(S.L_V, L_V), "L_V is the operator norm of the linear part of v", "value-lipschitz")
        record.add(le(S.rho, rho), "rho = sup_y ||V^T (y - c)|| <= ||V|| R on the key domain", "value-spread")
        record.add(eq(Described(r"\nabla_y s(x_i, x_j)"),
                      Described(r"A_\Delta^\top (x_i - c_Q) + W_K R_\Delta^\top q_c / \sqrt{d_k}")),
                   f"differentiation, with q_c = {_centre_text(q_c)} the query at the centre c_Q of the query domain")
        beta = a * R_Q + g_Q
        record.add(le(S.beta, beta), "triangle inequality: ||A_Delta^T|| <= a at every offset that occurs, "
                   "||x_i - c_Q|| <= R_Q, and g_Q = max_Delta ||W_K R_Delta^T q_c|| / sqrt(d_k)", "norm-calculus")
        record.add(eq(Described(r"\nabla_x s(x_i, x_j)"),
                      Described(r"A_{\Delta_{ij}} (x_j - c) + W_Q R_{\Delta_{ij}} k_c / \sqrt{d_k}")),
                   f"differentiation, with k_c = {_centre_text(k_c)} the key at the centre c of the key domain")
        alpha = a * R + g_K
        record.add(le(Described(r"|\nabla_x s(x_i, x_j) \cdot e|"), alpha * Described(r"\|e\|_2")),
                   "every key has its own offset: the query gradients of two keys use different matrices A_Delta and "
                   "different centre terms, so the mean value theorem along the keys does not apply; bound each "
                   "gradient "
                   "instead, with g_K = max_Delta ||W_Q R_Delta k_c|| / sqrt(d_k)", "rotary-query-term")
        record.add(le(S.alpha, alpha), "a standard deviation is at most the largest absolute value",
                   "rotary-query-term")
        omega = 2 * (a * R_Q * R + g_Q * R + g_K * R_Q + s_c)
        record.add(le(S.omega, omega),
                   "expand s_ij about the centres into four terms, each at most a R_Q R, g_Q R, g_K R_Q and "
                   "s_c = max_Delta |q_c^T R_Delta k_c| / sqrt(d_k) in absolute value at every offset; the spread of "
                   "a row is at most twice their sum", "rotary-query-term")
        crude = {S.a_rot: CRUDE[S.a_rot]}
        if q_c is not None:
            crude[S.g_Q] = S.MatrixNormSymbol("W_K") * S.vector_norm(q_c) / _ROOT
        if k_c is not None:
            crude[S.g_K] = S.MatrixNormSymbol("W_Q") * S.vector_norm(k_c) / _ROOT
        if q_c is not None and k_c is not None:
            crude[S.s_c] = S.vector_norm(q_c) * S.vector_norm(k_c) / _ROOT
        for symbol, value in crude.items():
            record.add(le(symbol, value), "R_Delta is orthogonal (the cruder form, free of the offsets)",
                       "submultiplicative")
        return KernelConstants(L_V=L_V, rho=rho, alpha=alpha, beta=beta, omega=omega, record=record)

    def factor_alpha(self, assumptions, record: Derivation) -> sp.Expr:
        """``alpha`` bounds every ``|grad_x s . e| / ||e||``, not a range: a factor in ``[0, 1]`` keeps it."""
        alpha = self.kernel_constants(assumptions).alpha
        record.add(le(S.alpha, alpha), "alpha bounds every |grad_x s . e| / ||e||; factors in [0, 1] keep the bound",
                   "rotary-query-term")
        return alpha


_POINT: Final = (sp.Rational(19, 20), sp.Rational(-3, 10))  # unrotated_counterexample's defaults (immutable)
_DIRECTION: Final = (sp.Integer(1), sp.Integer(2))


def unrotated_counterexample(radius=1, point=_POINT, direction=_DIRECTION) -> dict:
    """The instance of :data:`UNROTATED_FAMILY` at ``point`` (two tokens in ``[-radius, radius]``): the exact
    Jacobian (SymPy) and a certified lower bound on its spectral norm, ``||J v|| / ||v||`` for ``direction``,
    enclosed in interval arithmetic with outward rounding, against the unrotated claim's value ``||W_V|| = 1``
    (``W_Q W_K^T = 0``: every unrotated score is 0, ``kappa = 1``, no covariance term).

    Returns ``{"point", "jacobian", "lower", "claimed"}``; ``lower > claimed`` refutes the claim.
    """
    if any(abs(sp.sympify(coordinate)) > sp.sympify(radius) for coordinate in point):
        raise ValueError(f"the point {point} leaves [-{radius}, {radius}]^2")
    x1, x2 = sp.symbols("x_1 x_2", real=True)
    tokens = (x1, x2)
    angle = sp.pi / 2
    query, key = sp.Matrix([1, 0]), sp.Matrix([0, 1])

    def rotation(offset):
        return sp.Matrix([[sp.cos(offset * angle), -sp.sin(offset * angle)],
                          [sp.sin(offset * angle), sp.cos(offset * angle)]])

    def score(i, j):  # q_i^T R_(p_j - p_i) k_j / sqrt(d_k), q = W_Q^T x, k = W_K^T x
        return (tokens[i] * query.T * rotation(j - i) * key * tokens[j])[0, 0] / sp.sqrt(2)

    outputs = []
    for i in range(2):
        weights = [sp.exp(score(i, j)) for j in range(2)]
        outputs.append(sum(w * t for w, t in zip(weights, tokens)) / sum(weights))
    jacobian = sp.Matrix(outputs).jacobian(sp.Matrix(tokens)).xreplace(dict(zip(tokens, point)))
    v = sp.Matrix(direction)
    ratio = compile_interval(((jacobian * v).norm() ** 2 / v.norm() ** 2), [])()
    return {"point": tuple(point), "jacobian": jacobian, "lower": lower(IV.sqrt(ratio)), "claimed": 1.0}
