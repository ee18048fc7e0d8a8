"""Every attention kernel's score written again in exact and interval arithmetic: ``S`` and its
derivative ``jvp(dQ, dK)`` at a head's exact projections (:class:`~.maps.HeadCheck`), one class per
kernel in :data:`SCORE_CHECKS`, keyed by the kernel class (a test checks that it covers
:data:`lipbound.numeric.kernels.KERNELS`).  Nothing of the float engine is reused; a user-defined
score is re-derived from its text (:func:`lipbound.numeric.kernels.custom.gram_form`)."""

from __future__ import annotations

import functools
from typing import final

import numpy as np
import sympy as sp

from ...errors import AssumptionError
from ...rigorous.compiler import compile_interval
from ...rigorous.intervals import IV
from ...symbolic import symbols as S
from ...symbolic.custom import parse_score
from ...symbolic.scores import epsilon as EPSILON
from ...symbolic.scores import tau as TAU
from ..kernels import CustomKernel, DotProduct, FeatureMap, L2Distance, QKNorm, Rotary, ScaledCosine, Sigmoid
from ..kernels.custom import gram_form
from .exact import Dyadic

__all__ = ["SCORE_CHECKS", "score_check", "score_scale"]


# ---------------------------------------------------------------------------------------------
# One head, again: scores, softmax, forward and JVP
# ---------------------------------------------------------------------------------------------
def _inner_rows(A: Dyadic, B: Dyadic) -> np.ndarray:
    """``a_i . b_i`` for the rows of two exact matrices, as exact intervals."""
    return Dyadic(np.sum(A.m * B.m, axis=-1), A.e + B.e).intervals()


def score_scale(kernel, d_k: int):
    """The kernel's score scale as an interval: its own float exactly, or ``1/sqrt(d_k)`` enclosed."""
    return 1 / IV.sqrt(IV.mpf(d_k)) if kernel.scale is None else IV.mpf(kernel.scale)


@final
class _DotCheck:
    """``s = c q . k`` (DotProduct, and the scores of Sigmoid)."""

    def __init__(self, kernel, head):
        self.head, self.c = head, score_scale(kernel, head.d_k)
        self.S = (head.Q @ head.K.T).intervals() * self.c

    def jvp(self, dQ: Dyadic, dK: Dyadic) -> np.ndarray:
        return (dQ @ self.head.K.T + self.head.Q @ dK.T).intervals() * self.c


@final
class _L2Check:
    """``s = -c ||q - k||^2``."""

    def __init__(self, kernel, head):
        self.head, self.c = head, score_scale(kernel, head.d_k)
        Q, K = head.Q, head.K
        qq, kk = Q.row_sums_of_squares().intervals(), K.row_sums_of_squares().intervals()
        self.S = -(qq[:, None] - 2 * (Q @ K.T).intervals() + kk[None, :]) * self.c

    def jvp(self, dQ: Dyadic, dK: Dyadic) -> np.ndarray:
        Q, K = self.head.Q, self.head.K
        mixed = (Q @ dK.T + dQ @ K.T).intervals()
        return -2 * (_inner_rows(Q, dQ)[:, None] - mixed + _inner_rows(K, dK)[None, :]) * self.c


@final
class _CosineCheck:
    """``s = tau q . k / (N(q) N(k))``, ``N(u) = sqrt(||u||^2 + eps)``."""

    def __init__(self, kernel, head):
        self.head, self.tau, eps = head, IV.mpf(kernel.tau), IV.mpf(kernel.eps)
        norms = lambda M: np.array([IV.sqrt(v + eps) for v in M.row_sums_of_squares().intervals()], dtype=object)  # noqa: E731
        self.nq, self.nk = norms(head.Q), norms(head.K)
        self.qk = (head.Q @ head.K.T).intervals()
        self.S = self.qk * self.tau / (self.nq[:, None] * self.nk[None, :])

    def jvp(self, dQ: Dyadic, dK: Dyadic) -> np.ndarray:
        Q, K = self.head.Q, self.head.K
        dqk = (dQ @ K.T + Q @ dK.T).intervals()
        nq, nk = self.nq[:, None], self.nk[None, :]
        return (dqk / (nq * nk) - self.qk * (_inner_rows(Q, dQ)[:, None] / (nq ** 3 * nk)
                                            + _inner_rows(K, dK)[None, :] / (nq * nk ** 3))) * self.tau


def _matmul(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Product of two object arrays of intervals (or exact intervals), entry by entry in IV."""
    out = np.empty((A.shape[0], B.shape[1]), dtype=object)
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            out[i, j] = IV.fsum(A[i, k] * B[k, j] for k in range(A.shape[1]))
    return out


@final
class _Rotation:
    """``R(p) u`` for exact rows u at positions 0, 1, ...: ``u'_a = u_a cos - u_b sin``,
    ``u'_b = u_b cos + u_a sin`` with ``cos(p theta_t)``, ``theta_t = base^(-2t/D)`` enclosed."""

    def __init__(self, rotary, d_k: int, rows: int):
        D = d_k if rotary.dims is None else rotary.dims
        half = D // 2
        log_base = IV.log(IV.mpf(rotary.base))
        angles = [[IV.mpf(p) * IV.exp(IV.mpf(-2 * t) / D * log_base) for t in range(half)] for p in range(rows)]
        self.cos = [[IV.cos(a) for a in row] for row in angles]
        self.sin = [[IV.sin(a) for a in row] for row in angles]
        self.pairs = [(t, t + half) for t in range(half)] if rotary.pairing == "half" else \
            [(2 * t, 2 * t + 1) for t in range(half)]

    def apply(self, U: np.ndarray) -> np.ndarray:
        """U: an object array of intervals (rows, d_k), row l at position l."""
        out = U.copy()
        for row in range(U.shape[0]):
            for t, (a, b) in enumerate(self.pairs):
                c, s = self.cos[row][t], self.sin[row][t]
                out[row, a] = U[row, a] * c - U[row, b] * s
                out[row, b] = U[row, b] * c + U[row, a] * s
        return out


def _normalize(U: np.ndarray, gamma: np.ndarray, eps):
    """``(gamma * u / s, s)`` per row, ``s = sqrt(||u||^2 / d_k + eps)``; U an object array of intervals."""
    d_k = U.shape[1]
    scales = np.array([IV.sqrt(IV.fsum(x * x for x in row) / d_k + eps) for row in U], dtype=object)
    gains = np.array([IV.mpf(float(g)) for g in gamma], dtype=object)
    return U * gains[None, :] / scales[:, None], scales


def _normalize_jvp(U: np.ndarray, dU: np.ndarray, gamma: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``gamma * (du / s - u (u . du) / (d_k s^3))`` per row."""
    d_k = U.shape[1]
    gains = np.array([IV.mpf(float(g)) for g in gamma], dtype=object)
    dots = np.array([IV.fsum(u * v for u, v in zip(row, drow)) for row, drow in zip(U, dU)], dtype=object)
    s = scales[:, None]
    return gains[None, :] * (dU / s - U * dots[:, None] / (d_k * s ** 3))


@final
class _QKCheck:
    """``s = c rot_i(rms_q(q)) . rot_j(rms_k(k))`` (QKNorm) and ``s = c rot_i(q) . rot_j(k)`` (Rotary,
    without the norm)."""

    def __init__(self, kernel, head):
        self.head, self.c = head, score_scale(kernel, head.d_k)
        self.norm = kernel if isinstance(kernel, QKNorm) else None
        rotary = kernel.rotary if self.norm is not None else kernel
        self.rotation = None if rotary is None else _Rotation(rotary, head.d_k, max(head.m, head.n))
        self.Q, self.K = head.Q.intervals(), head.K.intervals()
        self.Qt, self.Kt = self._transform(self.Q, "q"), self._transform(self.K, "k")
        self.S = _matmul(self.Qt, self.Kt.T) * self.c

    def _transform(self, U, which: str):
        if self.norm is not None:
            eps = IV.mpf(self.norm.eps)
            U, scales = _normalize(U, getattr(self.norm, f"gamma_{which}"), eps)
            setattr(self, f"scales_{which}", scales)
        return U if self.rotation is None else self.rotation.apply(U)

    def _tangent(self, U, dU, which: str):
        if self.norm is not None:
            dU = _normalize_jvp(U, dU, getattr(self.norm, f"gamma_{which}"), getattr(self, f"scales_{which}"))
        return dU if self.rotation is None else self.rotation.apply(dU)

    def jvp(self, dQ: Dyadic, dK: Dyadic) -> np.ndarray:
        dQt, dKt = self._tangent(self.Q, dQ.intervals(), "q"), self._tangent(self.K, dK.intervals(), "k")
        return (_matmul(dQt, self.Kt.T) + _matmul(self.Qt, dKt.T)) * self.c


@final
class _FeatureMapCheck:
    """``s = log(phi(q) . phi(k))``, ``phi = elu + 1``: ``u + 1`` above 0 (exact), ``e^u`` below."""

    def __init__(self, kernel, head):
        self.head = head
        (self.Qp, self.Qs), (self.Kp, self.Ks) = self._phi(head.Q), self._phi(head.K)
        self.kernel = _matmul(self.Qp, self.Kp.T)
        self.S = np.vectorize(IV.log, otypes=[object])(self.kernel)

    @staticmethod
    def _phi(U: Dyadic):
        values, slopes = np.empty(U.shape, dtype=object), np.empty(U.shape, dtype=object)
        for index, (man, x) in enumerate(zip(U.m.ravel(), U.intervals().ravel())):
            where = np.unravel_index(index, U.shape)
            if man > 0:
                values[where], slopes[where] = x + 1, IV.mpf(1)
            else:
                values[where] = slopes[where] = IV.exp(x)
        return values, slopes

    def jvp(self, dQ: Dyadic, dK: Dyadic) -> np.ndarray:
        dK_ = _matmul(self.Qs * dQ.intervals(), self.Kp.T) + _matmul(self.Qp, (self.Ks * dK.intervals()).T)
        return dK_ / self.kernel


@functools.lru_cache(maxsize=32)
def _gram_functions(kernel) -> tuple:
    """``g``, ``g_a``, ``g_b``, ``g_c`` of a user-defined score compiled to intervals (the values of tau and
    epsilon at their exact binary values)."""
    a, b, c = sp.symbols("a b c", real=True)                 # the Gram scalars of gram_form
    form = gram_form(parse_score(kernel.score)).xreplace({TAU: sp.Float(kernel.tau), EPSILON: sp.Float(kernel.epsilon)})
    symbols = (a, b, c, S.d_k, S.d)
    return tuple(compile_interval(expr, symbols)
                 for expr in (form, sp.diff(form, a), sp.diff(form, b), sp.diff(form, c)))


@final
class _CustomCheck:
    """A user-defined score ``g(q . q, q . k, k . k)`` with its partial derivatives, in intervals."""

    def __init__(self, kernel, head):
        self.head = head
        g, ga, gb, gc = _gram_functions(kernel)
        Q, K = head.Q, head.K
        qq, kk = Q.row_sums_of_squares().intervals(), K.row_sums_of_squares().intervals()
        qk = (Q @ K.T).intervals()
        sizes = (IV.mpf(head.d_k), IV.mpf(head.head.d))
        shape = (head.m, head.n)
        grid = [(qq[i], qk[i, j], kk[j]) for i in range(shape[0]) for j in range(shape[1])]
        self.S, self.ga, self.gb, self.gc = (
            np.array([f(*point, *sizes) for point in grid], dtype=object).reshape(shape) for f in (g, ga, gb, gc))

    def jvp(self, dQ: Dyadic, dK: Dyadic) -> np.ndarray:
        Q, K = self.head.Q, self.head.K
        mixed = (dQ @ K.T).intervals(), (Q @ dK.T).intervals()
        return 2 * self.ga * _inner_rows(Q, dQ)[:, None] + self.gb * (mixed[0] + mixed[1]) \
            + 2 * self.gc * _inner_rows(K, dK)[None, :]


#: kernel class -> its score in exact and interval arithmetic, written again here (``S``, ``jvp(dQ, dK)``);
#: every registered kernel has one (a test checks)
SCORE_CHECKS = {DotProduct: _DotCheck, Sigmoid: _DotCheck, L2Distance: _L2Check, ScaledCosine: _CosineCheck,
                Rotary: _QKCheck, QKNorm: _QKCheck, FeatureMap: _FeatureMapCheck, CustomKernel: _CustomCheck}


def score_check(kernel, head):
    entry = SCORE_CHECKS.get(type(kernel))
    if entry is None:
        raise AssumptionError("head_or_layer", "a head whose kernel the re-check encloses "
                              f"({', '.join(sorted(k.name for k in SCORE_CHECKS))})",
                              kernel.describe(), "re-check it with a kernel that has an interval score, or trust the "
                              "float value only as an estimate")
    return entry(kernel, head)
