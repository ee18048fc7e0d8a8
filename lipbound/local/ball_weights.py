"""Attention weights on a Frobenius ball, with the scores of a row moving together.

lipbound's softmax ranges (:func:`~lipbound.local.bounds._softmax_range`) read a box of scores: each score of a
row at its own extreme at once, every one of them with the whole radius eps of the ball.  On the Frobenius ball
``||Y - X||_F <= eps`` the scores of a row share that radius, and one direction moves them all.  Here (lemma
softmax-ball in docs/mathematics.md) the largest weight ``p_ij`` on the ball is bounded through the smallest
denominator.  With unit masses, ``e = Y - X`` and bars dropped (queries, keys and scores at X),

    1 / p_ij(Y) = sum_l exp(s_il(Y) - s_ij(Y)),
    s_il(Y) - s_ij(Y) = d_l + gamma_l . e + c e_i Qt (e_l - e_j)^T,   d_l = s_il - s_ij,

``gamma_l = G_il - G_ij`` with ``G_il`` the gradient of ``s_il`` (``c W_Q k_l^T`` on token i, ``c W_K q_i^T`` on
token l: the two add up when ``l = i``) and ``Qt = W_Q W_K^T``.  The quadratic part is at least
``-kappa_l = -c g k_l eps^2`` (``g >= ||Qt||``; ``k_l = 1/2^(1/2)`` when i, j, l differ, from
``||e_i|| (||e_l|| + ||e_j||) <= eps^2 / 2^(1/2)``, and ``(1 + 2^(1/2)) / 2``, the top eigenvalue of
``[[1, 1/2], [1/2, 0]]``, when l = i or j = i; none when l = j).  So on the ball ``1 / p_ij >= psi(e)`` with the
convex

    psi(e) = 1 + sum_{l != j} w_l exp(gamma_l . e),   w_l = exp(d_l - kappa_l),

and, psi lying above each of its tangent planes, for ANY point ``e* = Gamma^T a`` (``Gamma`` the rows
``gamma_l``, ``M = Gamma Gamma^T``, ``y_l = w_l exp((M a)_l)``)

    min_{||e||_F <= eps} psi(e) >= psi(e*) - grad psi(e*) . e* - eps ||grad psi(e*)||
                                 = 1 + sum_l y_l - y^T M a - eps (y^T M y)^(1/2),

so ``p_ij <= 1 / that`` wherever it exceeds 1.  The point only decides how tight the bound is: it is found in
floats (Frank and Wolfe's conditional gradient, Naval Res. Logist. Q. 3, 1956, with line searches on the ball, in
the at most n coordinates ``M`` spans), and the right-hand
side is then evaluated in interval arithmetic from the enclosed ``M``, ``d`` and ``kappa``.  ``M`` costs nothing
of size ``n d`` per entry: ``G_il . G_im = c^2 (a_l . a_m + [m = i] a_l . b + [l = i] b . a_m + [l = m] b . b)``
with ``a_l = W_Q k_l^T`` and ``b = W_K q_i^T`` (:class:`~lipbound.local.scores.ScoreNorms`).  The weights'
lower ends follow from the rows summing to 1, ``p_ij >= 1 - sum_{l != j} p^+_il``, and from the largest denominator
(exp below its chord on each difference's range, :meth:`BallWeights._lower`).  Rows whose exponents pass
:data:`EXPONENT_LIMIT` keep the trivial ends [0, 1].

Covered: dot-product heads without rotations or masks and unit masses (a sentence), as
:func:`lipbound.local.relational.covers`; anything else gets no bound here (``None``).
"""

from __future__ import annotations

from typing import final

import numpy as np

from ..rigorous.arrays import IntervalArray
from .enclosed import EnclosedAttention

__all__ = ["BallWeights"]

#: Frank-Wolfe iterations of the float search for the tangent point (each with a bisection line search): on
#: MiniLM's layer 0 at 1e-2 R, 4 of 6 bisections give the bounds of 8 of 10 to four digits (n = 9 and 24)
SEARCH_STEPS = 4
#: bisection steps of each line search
LINE_STEPS = 6


#: entries of the heads' ``M`` formed at once (about 16 bytes each, and a few arrays of that size)
CHUNK_ENTRIES = 2_000_000
#: largest exponent taken: the squares of the terms (in ``y^T M y``) stay within the float range
EXPONENT_LIMIT = 300.0


def _tame(exponent: IntervalArray, cut: np.ndarray | None = None) -> tuple[IntervalArray, np.ndarray]:
    """``exponent`` (..., l) with the rows (...) where an entry passes :data:`EXPONENT_LIMIT`, or already ``cut``, set
    to 0, and those rows (their bound is then the trivial one)."""
    over = np.any(exponent.hi > EXPONENT_LIMIT, axis=-1) | (False if cut is None else cut)
    return IntervalArray(np.where(over[..., None], 0.0, exponent.lo), np.where(over[..., None], 0.0, exponent.hi)), over


@final
class BallWeights:
    """Attention weights of a layer on Frobenius balls about X, each row's scores moving together (module docstring).

    Parameters
    ----------
    E : EnclosedAttention
        The layer at X: dot-product heads, no rotations or masks, unit masses (else :meth:`of` gives None).

    The gradients' Gram matrices ``A`` (H, n, n, n) are formed once; :meth:`weights` takes a radius and forms the
    heads' ``M`` (n, n, n, n each) a few heads at a time (:data:`CHUNK_ENTRIES`).
    """

    def __init__(self, E: EnclosedAttention):
        H, n = E.engine.H, E.n
        self.E, self.H, self.n = E, H, n
        a = E.norms.key_vectors[:, 0]                                                     # a_l = W_Q k_l^T, (H, n, d)
        b = E.norms.w[:, :, 0]                                                            # b_i = W_K q_i^T, (H, n, d)
        keys = a.einsum("hld,hmd->hlm", a)                                                # a_l . a_m, (H, n, n)
        mixed = b.einsum("hid,hld->hil", a)                                               # b_i . a_l, (H, n(i), n(l))
        own = (b * b).sum(axis=-1)                                                        # ||b_i||^2, (H, n)
        eye = np.eye(n)
        # A[h, i, l, m] = G_il . G_im (symmetric in l, m)
        A = keys.expand(1) + mixed.expand(-1) * IntervalArray(eye[None, :, None, :]) \
            + mixed.expand(2) * IntervalArray(eye[None, :, :, None]) + own.expand(-1).expand(-1) * IntervalArray(eye)
        self.A = A * (E.c * E.c)
        self.d = E.S.expand(2) - E.S.expand(3)                                            # d[h,i,j,l] = s_il - s_ij
        index = np.arange(n)
        l_is_i = index[None, None, :] == index[:, None, None]                            # (i, j, l)
        j_is_i = (index[:, None] == index[None, :])[:, :, None]
        self.factor = IntervalArray(np.where(l_is_i | j_is_i, (1 + np.sqrt(2)) / 2, 1 / np.sqrt(2)) * (1 + 1e-15))
        self.others = IntervalArray(np.broadcast_to(index[:, None] != index[None, :], (n, n, n)).astype(np.float64))
        self.g = np.asarray(E.norms.g, dtype=np.float64).reshape(H)

    @classmethod
    def of(cls, E: EnclosedAttention) -> BallWeights | None:
        """The bound for a layer it covers (module docstring), else None."""
        if E.rotations is not None or E.visible is not None or np.any(np.asarray(E.masses) != 1.0):
            return None
        return cls(E)

    def _gram(self, heads: slice) -> IntervalArray:
        """``M[i, j, l, m] = (G_il - G_ij) . (G_im - G_ij) = A[i, l, m] - A[i, j, l] - A[i, j, m] + A[i, j, j]`` of
        these heads, (k, n, n, n, n)."""
        A = self.A[heads]
        diagonal = IntervalArray(np.einsum("hijj->hij", A.lo), np.einsum("hijj->hij", A.hi))
        return A.expand(2) - A.expand(-1) - A.expand(3) + diagonal.expand(-1).expand(-1)

    def _tangent_points(self, M: IntervalArray, w: np.ndarray, eps: float) -> np.ndarray:
        """Float coefficients ``a`` (k, n, n, n) of points ``e* = Gamma^T a`` near the minimiser of psi on the ball, for
        k heads' ``M`` and weights ``w`` (k, n, n, n)."""
        n = self.n
        middle = M.mid.reshape(-1, n, n)
        values, vectors = np.linalg.eigh(0.5 * (middle + middle.swapaxes(1, 2)))
        kept = values > 1e-12 * np.maximum(values[:, -1:], 1e-300)
        roots = np.where(kept, np.sqrt(np.maximum(values, 0.0)), 0.0)
        B = vectors * roots[:, None, :]                                                   # B B^T = M, z = B u
        weights = w.reshape(-1, n)

        def slope(u, direction):
            z = np.einsum("klm,km->kl", B, u)
            with np.errstate(over="ignore"):
                terms = weights * np.exp(np.minimum(z, 700.0))
            return np.einsum("kl,kl->k", terms, np.einsum("klm,km->kl", B, direction)), terms

        u = np.zeros((B.shape[0], n))
        for _ in range(SEARCH_STEPS):
            _, terms = slope(u, np.zeros_like(u))
            gradient = np.einsum("klm,kl->km", B, terms)
            size = np.linalg.norm(gradient, axis=1, keepdims=True)
            target = -eps * gradient / np.where(size > 0, size, 1.0)
            direction = target - u
            low, high = np.zeros(len(u)), np.ones(len(u))
            for _ in range(LINE_STEPS):          # psi is convex along the segment: bisect on its slope
                half = 0.5 * (low + high)
                rising = slope(u + half[:, None] * direction, direction)[0] > 0
                high, low = np.where(rising, half, high), np.where(rising, low, half)
            u = u + low[:, None] * direction
        inverse = np.where(kept, 1.0 / np.where(roots > 0, roots, 1.0), 0.0)
        return np.einsum("klm,km->kl", vectors * inverse[:, None, :], u).reshape(w.shape)

    def weights(self, eps: float) -> IntervalArray:
        """Every attention weight on ``||Y - X||_F <= eps``, enclosed (H, n, n) (module docstring)."""
        t = IntervalArray(float(eps))
        step = max(1, CHUNK_ENTRIES // self.n ** 4)
        ends = [self._heads(slice(h, h + step), t) for h in range(0, self.H, step)]
        upper, lower = (np.concatenate([end[k] for end in ends]) for k in (0, 1))
        rest = IntervalArray(upper).sum(axis=-1, keepdims=True) - IntervalArray(upper)  # sum_{l != j} p^+_il
        lower = np.maximum(np.maximum((IntervalArray(1.0) - rest).lo, 0.0), lower)
        return IntervalArray(np.minimum(lower, upper), upper)

    def _heads(self, heads: slice, t: IntervalArray) -> tuple[np.ndarray, np.ndarray]:
        """These heads' upper ends ``1 / L_ij`` and lower ends from :meth:`_lower`, (k, n, n) each."""
        M, d = self._gram(heads), self.d[heads]
        kappa = IntervalArray(self.g[heads].reshape(-1, 1, 1, 1)) * self.E.c * t * t * self.factor   # (k, n, n, n)
        exponent, cut = _tame(d - kappa)
        w = exponent.exp() * self.others                                                  # w_l, 0 at l = j
        a = IntervalArray(self._tangent_points(M, w.mid, float(t.hi.item())))
        z = M.einsum("hijlm,hijm->hijl", a)                                                  # gamma_l . e* = (M a)_l
        exponent, cut = _tame(exponent + z, cut)
        y = exponent.exp() * self.others                                                  # w_l exp((M a)_l)
        z = IntervalArray(np.where(cut[..., None], 0.0, z.lo), np.where(cut[..., None], 0.0, z.hi))
        linear = (y * z).sum(axis=-1)
        quadratic = M.einsum("hijlm,hijm->hijl", y).einsum("hijl,hijl->hij", y)                 # y^T M y
        slope = IntervalArray(np.maximum(quadratic.lo, 0.0), np.maximum(quadratic.hi, 0.0)).sqrt()
        floor = (IntervalArray(1.0) + y.sum(axis=-1) - linear - t * slope).lo             # <= min psi on the ball
        valid = np.isfinite(floor) & (floor > 1.0) & ~cut
        with np.errstate(divide="ignore", invalid="ignore"):
            upper = np.where(valid, (IntervalArray(1.0) / IntervalArray(np.where(valid, floor, 2.0))).hi, 1.0)
        return upper, self._lower(M, d, t, kappa)

    def _lower(self, M: IntervalArray, d: IntervalArray, t: IntervalArray, kappa: IntervalArray) -> np.ndarray:
        """``p_ij >= 1 / max psi+`` with ``psi+(e) = 1 + sum_{l != j} W_l exp(gamma_l . e)``, ``W_l = exp(d_l +
        kappa_l)``: on the ball ``|gamma_l . e| <= r_l = eps ||gamma_l||`` and exp lies below its chord there,
        ``exp(x) <= cosh(r) + x sinh(r) / r``, so ``max psi+ <= 1 + sum_l W_l cosh(r_l) + eps ||sum_l W_l
        (sinh(r_l) / r_l) gamma_l||`` (the last norm is ``(v^T M v)^(1/2)``): the rows' linear parts add up as
        vectors, not as their norms.  For k heads: ``M`` (k, n, n, n, n), ``d`` and ``kappa`` (k, n, n, n)."""
        diagonal = IntervalArray(np.einsum("hijll->hijl", M.lo), np.einsum("hijll->hijl", M.hi))
        r = t * IntervalArray(np.maximum(diagonal.lo, 0.0), np.maximum(diagonal.hi, 0.0)).sqrt()   # r_l
        exponent, cut = _tame(d + kappa + r)              # W_l cosh(r_l) and W_l sinh(r_l) / r_l stay below e^that
        r = IntervalArray(np.where(cut[..., None], 0.0, r.lo), np.where(cut[..., None], 0.0, r.hi))
        W = (exponent - r).exp() * self.others                                            # (k, n, n, n)
        grow, shrink = r.exp(), (-r).exp()
        cosh = (grow + shrink) * IntervalArray(0.5)
        # sinh(r) / r = sum_k r^(2k) / (2k + 1)!, increasing in r: its value at r's upper end, enclosed
        top = IntervalArray(np.maximum(r.hi, 1e-300))
        series = IntervalArray(1.0) + top * top * IntervalArray(1 / 6) * (IntervalArray(1.0) + top)   # r < 1e-3
        quotient = (top.exp() - (-top).exp()) * IntervalArray(0.5) / top
        ratio = np.where(top.hi < 1e-3, series.hi, quotient.hi)                           # >= sinh(r) / r
        v = W * IntervalArray(ratio)
        quadratic = M.einsum("hijlm,hijm->hijl", v).einsum("hijl,hijl->hij", v)
        slope = IntervalArray(np.maximum(quadratic.lo, 0.0), np.maximum(quadratic.hi, 0.0)).sqrt()
        ceiling = (IntervalArray(1.0) + (W * cosh).sum(axis=-1) + t * slope).hi
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            found = (IntervalArray(1.0) / IntervalArray(np.where(np.isfinite(ceiling), ceiling, 1.0))).lo
        return np.where(np.isfinite(ceiling) & ~cut, np.maximum(found, 0.0), 0.0)
