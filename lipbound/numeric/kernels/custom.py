r"""A user-defined score as a numeric kernel: the text ``lipbound derive custom --score`` takes,
parsed by :func:`lipbound.symbolic.custom.parse_score` (no ``eval``), compiled to numpy.

Every score the parser accepts is built from ``Inner``, ``Norm`` and ``SoftNorm`` of vectors
``alpha q + beta k``, so it is a function of three Gram scalars,

    s(q, k) = g(a, b, c),    a = q . q,    b = q . k,    c = k . k,

with ``Inner(alpha q + beta k, gamma q + delta k) = alpha gamma a + (alpha delta + beta gamma) b
+ beta delta c`` and ``Norm(u) = sqrt(Inner(u, u))``.  ``g`` and its partial derivatives are exact
SymPy expressions lambdified to numpy, so

    ds = g_a 2 q . dq + g_b (dq . k + q . dk) + g_c 2 k . dk,
    gQ_i = sum_j gs_ij (2 g_a q_i + g_b k_j),    gK_j = sum_i gs_ij (g_b q_i + 2 g_c k_j).

The parameters ``tau`` and ``epsilon`` take the kernel's values, ``d_k`` and ``d`` the head's sizes.
A score that names a lower bound of a fact (``m_Q``) has no numeric value and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, final

import numpy as np
import sympy as sp

from ...errors import AssumptionError, WeightsError
from ...symbolic import symbols as S
from ...symbolic.calculus import Inner, Norm, SoftNorm, affine_parts
from ...symbolic.custom import parse_score
from ...symbolic.scores import epsilon as EPSILON
from ...symbolic.scores import tau as TAU
from ..checks import positive_float
from .base import AttentionKernel, KernelFacts, ScoreMap, reduce_to, register

__all__ = ["CustomKernel", "gram_form"]

_A, _B, _C = sp.symbols("a b c", real=True)
_SIZES = (S.d_k, S.d)


def _coefficient(part, matrix) -> sp.Expr:
    """``alpha`` of ``alpha * matrix`` (a coefficient of :func:`affine_parts`)."""
    if part == matrix:
        return sp.Integer(1)
    if isinstance(part, sp.MatMul):
        scalars = [a for a in part.args if not isinstance(a, sp.MatrixExpr)]
        matrices = [a for a in part.args if isinstance(a, sp.MatrixExpr)]
        if matrices == [matrix]:
            return sp.Mul(*scalars)
    if isinstance(part, sp.MatAdd):
        return sp.Add(*(_coefficient(term, matrix) for term in part.args))
    raise WeightsError("score", "vectors alpha q + beta k", str(part), "write the score in q and k only")


def _combination(vector) -> tuple[sp.Expr, sp.Expr]:
    parts = affine_parts(vector, (S.x, S.y))
    if parts.get(None) is not None:
        raise WeightsError("score", "vectors alpha q + beta k without constant terms", str(vector),
                           "write the score in q and k only")
    alpha = _coefficient(parts[S.x], S.W_Q.T) if S.x in parts else sp.Integer(0)
    beta = _coefficient(parts[S.y], S.W_K.T) if S.y in parts else sp.Integer(0)
    return alpha, beta


def _inner(u, v) -> sp.Expr:
    (p, q), (r, s) = _combination(u), _combination(v)
    return p * r * _A + (p * s + q * r) * _B + q * s * _C


def gram_form(score: sp.Expr) -> sp.Expr:
    """The parsed score as ``g(a, b, c)`` (module docstring)."""
    replacements = {}
    for atom in score.atoms(Inner, Norm, SoftNorm):
        if isinstance(atom, Inner):
            replacements[atom] = _inner(*atom.args)
        elif isinstance(atom, Norm):
            replacements[atom] = sp.sqrt(_inner(atom.args[0], atom.args[0]))
        else:
            replacements[atom] = sp.sqrt(_inner(atom.args[0], atom.args[0]) + atom.args[1])
    return score.xreplace(replacements)


@final
class _GramScores(ScoreMap):
    """``S = g(a, b, c)`` at a batch, with the derivatives of the module docstring."""

    def __init__(self, compiled, Q, K, sizes):
        self.Q, self.K = Q, K
        a = np.sum(Q * Q, axis=-1)[..., :, None]
        b = Q @ np.swapaxes(K, -1, -2)
        c = np.sum(K * K, axis=-1)[..., None, :]
        shape = b.shape
        value, ga, gb, gc = (np.broadcast_to(np.asarray(f(a, b, c, *sizes), dtype=Q.dtype), shape) for f in compiled)
        self.S, self.ga, self.gb, self.gc = np.array(value), ga, gb, gc

    def jvp(self, dQ, dK):
        dS = np.zeros_like(self.S)
        if dQ is not None:
            dS += (2 * self.ga * np.sum(self.Q * dQ, axis=-1)[..., :, None]
                   + self.gb * (dQ @ np.swapaxes(self.K, -1, -2)))
        if dK is not None:
            dS += (2 * self.gc * np.sum(self.K * dK, axis=-1)[..., None, :]
                   + self.gb * (self.Q @ np.swapaxes(dK, -1, -2)))
        return dS

    def vjp(self, gS):
        wb = gS * self.gb
        gQ = 2 * np.sum(gS * self.ga, axis=-1)[..., None] * self.Q + wb @ self.K
        gK = 2 * np.sum(gS * self.gc, axis=-2)[..., None] * self.K + np.swapaxes(wb, -1, -2) @ self.Q
        return gQ, reduce_to(gK, self.K.shape)


@register
@final
@dataclass(frozen=True, eq=False)
class CustomKernel(AttentionKernel):
    """A user-defined score (module docstring).

    Parameters
    ----------
    score : str
        The text, e.g. ``"Inner(q, k)**2 / d_k"`` (:data:`lipbound.symbolic.custom.SCORE_SYNTAX`).
    tau, epsilon : float
        Values of the parameters ``tau`` and ``epsilon`` when the score uses them.
    """

    score: str
    tau: float = 1.0
    epsilon: float = 1.0
    name: ClassVar[str] = "custom"

    def __post_init__(self):
        for key in ("tau", "epsilon"):
            object.__setattr__(self, key, positive_float(key, getattr(self, key), f"pass {key} > 0"))
        try:
            parsed = parse_score(self.score)
        except AssumptionError as error:
            raise WeightsError("score", "a score lipbound can parse", str(self.score), str(error)) from None
        g = gram_form(parsed).xreplace({TAU: sp.Float(self.tau), EPSILON: sp.Float(self.epsilon)})
        unknown = g.free_symbols - {_A, _B, _C, *_SIZES}
        if unknown:
            raise WeightsError("score", "a score whose every symbol has a numeric value (q, k, d_k, d, tau, epsilon)",
                               f"{self.score} (names {', '.join(sorted(map(str, unknown)))})",
                               "a lower bound of a fact has no value in a model; write the score without it")
        arguments = (_A, _B, _C, *_SIZES)
        compiled = tuple(sp.lambdify(arguments, expr, modules="numpy")
                         for expr in (g, sp.diff(g, _A), sp.diff(g, _B), sp.diff(g, _C)))
        object.__setattr__(self, "_compiled", compiled)   # not a field: equality reads the text and values

    def facts(self, d_k: int) -> KernelFacts:
        return KernelFacts("custom", describe=f"user-defined score {self.score}")

    def linearize(self, Q, K, pos_q, pos_k, d):
        with np.errstate(divide="ignore", invalid="ignore"):
            return _GramScores(self._compiled, Q, K, (Q.shape[-1], d))
