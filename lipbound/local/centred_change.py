"""How much ``z``, the score changes centred at X's weights, can change on a Frobenius ball: the heads' score maps
``Qt_h = W_Q^h W_K^h^T`` taken together instead of each block's ``||Qt_h||`` times a token's movement (lemma
``curvature-centred-change`` in docs/mathematics.md).

For dot-product heads and ``Delta = Y - X``, row (h, i, j) of z changes by (``Delta_hi~ = sum_l p_hil(X) Delta_l``,
the same for e)

    dz_hij(e) = c ( e_i . Qt_h (Delta_j - Delta_hi~) + (e_j - e_hi~) . Qt_h^T Delta_i ),

a bilinear form in (Delta, e).  For row scales s >= 0 (H, n(i), n(j)) let ``kappa_hi = ||diag(s_hi) (I - 1
p_hi(X)^T)||_2^2`` (n x n).  The second term's rows of (h, i) are ``diag(s_hi) (I - 1 p_hi^T)`` times the one vector
``Qt_h^T Delta_i``, so over the heads its norm is at most ``(sum_h kappa_hi ||Qt_h^T Delta_i||^2)^(1/2) <=
lambda_1i^(1/2) ||Delta_i||``; the first acts on e_i alone and its Frobenius norm is at most ``(sum_h kappa_hi
||Qt_h Delta^T||_F^2)^(1/2) <= lambda_2i^(1/2) ||Delta||_F`` (``(I - 1 p^T)^T diag(s^2) (I - 1 p^T) <= kappa I``), with

    lambda_1i = lambda_max(sum_h kappa_hi Qt_h Qt_h^T),   lambda_2i = lambda_max(sum_h kappa_hi Qt_h^T Qt_h).

Hence, on ``||Y - X||_F <= t``, query i's rows change by at most ``c t (lambda_1i^(1/2) + lambda_2i^(1/2))``; all rows
by ``c t (max_i lambda_1i^(1/2) + max_i lambda_2i^(1/2))`` (the second terms read disjoint ``Delta_i``, the first
terms disjoint ``e_i``); head h's rows by ``2 c t ||Qt_h|| max_i kappa_hi^(1/2)``.  The heads' score maps read and
write nearly orthogonal subspaces, so ``lambda`` stays near the largest ``kappa_hi ||Qt_h||^2`` where the blockwise
bound (:class:`~lipbound.local.zeta_changes.Changes`) adds every head's.

The eigenvalues are bounded through factors formed once: ``W_K^h^T W_K^h = L_h L_h^T + E_h`` (L a float Cholesky
factor, ``||E_h|| <= epsilon_h`` certified), so ``Qt_h Qt_h^T <= F_h^T F_h + epsilon_h ||W_Q^h||^2 I`` with ``F_h =
L_h^T W_Q^h^T`` (d_k x d), and ``lambda_max(sum_h kappa_h F_h^T F_h) = ||diag(kappa)^(1/2) F||^2`` is at most the
largest eigenvalue of the H x H matrix ``kappa_h^(1/2) kappa_h'^(1/2) ||F_h F_h'^T||`` (a block matrix's norm is at
most that of its blocks' norms): per query the price of an H x H norm (the exact eigenvalue, one factorisation of
``H d_k`` rows, was 0.55-0.63 against 0.67-0.78 on MiniLM's first layer at 1e-2 R, at five times the cost).
"""

from __future__ import annotations

from typing import final

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.batched import interval_spectral_norms_upper
from .enclosed import EnclosedAttention

__all__ = ["CentredChange"]


@final
class CentredChange:
    """``sup ||diag(s) (z(Y) - z(X))||_2`` over ``||Y - X||_F <= t`` for dot-product heads (module docstring): all
    rows, per head or per query.

    Parameters
    ----------
    E : EnclosedAttention
        The head or layer enclosed at X (no rotations).
    """

    def __init__(self, E: EnclosedAttention):
        engine = E.engine
        H, n = engine.H, E.n
        self.H, self.n, self.c = H, n, E.c
        self.centring = IntervalArray(np.eye(n)[None, None]) - E.P.expand(2)          # I - 1 p_hi^T, (H, n, n, n)
        self.score_norms = np.max(np.broadcast_to(E.norms.g, (H, 1, 1)).reshape(H, -1), axis=1)   # ||Qt_h||
        weights = [engine.head_weights(h)[:2] for h in range(H)]
        # Qt Qt^T through the keys' Gram matrix, Qt^T Qt through the queries'
        self.sides = [_Factors([(W_Q, W_K) for W_Q, W_K in weights]),
                      _Factors([(W_K, W_Q) for W_Q, W_K in weights])]
        self._kept: dict = {}

    def _roots(self, scales: np.ndarray) -> np.ndarray:
        """``||diag(s_hi) (I - 1 p_hi^T)||_2`` (H, n), rounded up; the last few scales' kept (a curvature bound asks for
        the same scales' norms over all rows and per query)."""
        key = scales.tobytes()
        if key not in self._kept:
            if len(self._kept) >= 4:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = interval_spectral_norms_upper(IntervalArray(scales).expand(-1) * self.centring)
        return self._kept[key]

    def norms(self, scales: np.ndarray, t: float, axis: int | None):
        """The bound for row scales s (H, n, n) >= 0 on ``||Y - X||_F <= t``: a float (``axis`` None), per head
        (0, (H,)) or per query (1, (n,)), rounded up."""
        root = IntervalArray(self._roots(np.asarray(scales, dtype=np.float64)))          # kappa_hi^(1/2), (H, n)
        radius = self.c * IntervalArray(float(t))
        if axis == 0:
            largest = IntervalArray(root.hi.max(axis=1))                                 # max_i kappa_hi^(1/2)
            return (IntervalArray(2.0) * radius * IntervalArray(self.score_norms) * largest).hi
        kappa = (root * root).hi                                                      # (H, n)
        per_query = [side.tops(kappa) for side in self.sides]                         # lambda_1i, lambda_2i, (n,)
        if axis == 1:
            total = IntervalArray(per_query[0]).sqrt() + IntervalArray(per_query[1]).sqrt()
            return (radius * total).hi
        total = IntervalArray(float(np.max(per_query[0]))).sqrt() + IntervalArray(float(np.max(per_query[1]))).sqrt()
        return (radius * total).hi.item()


@final
class _Factors:
    """``lambda_max(sum_h kappa_h A_h B_h^T B_h A_h^T)`` bounded for weights kappa >= 0 and pairs ``(A_h, B_h)``
    (d x d_k each): ``B_h^T B_h = L_h L_h^T + E_h``, rows ``F_h = L_h^T A_h^T`` (module docstring)."""

    def __init__(self, pairs: list):
        rows, slack = [], []
        for A, B in pairs:
            gram = IntervalArray(B.T).matmul(B)                                          # B^T B, (d_k, d_k)
            L = _factor(gram.mid)
            error = IntervalArray((gram - IntervalArray(L).matmul(L.T)).magnitude.ravel()).norm_upper()  # eps_h
            size = IntervalArray(IntervalArray(A.ravel()).norm_upper())                   # ||A||_F >= ||A||_2
            slack.append((IntervalArray(error) * size * size).hi.item())
            rows.append(IntervalArray(L.T).matmul(A.T))                                  # F_h, (d_k, d)
        self.slack = np.array(slack)                                                    # eps_h ||A_h||^2, (H,)
        F = IntervalArray.stack(rows)                                                   # (H, d_k, d)
        blocks = F.einsum("hkd,gld->hgkl", F)                                           # F_h F_g^T, (H, H, d_k, d_k)
        self.block_norms = interval_spectral_norms_upper(blocks)                        # (H, H)

    def tops(self, kappa: np.ndarray) -> np.ndarray:
        """Upper bounds on ``lambda_max(sum_h kappa_hi A_h B_h^T B_h A_h^T)`` per column i of kappa (H, n)."""
        root = IntervalArray(kappa).sqrt()                                              # (H, n)
        scaled = root.swapaxes(0, 1).expand(-1) * IntervalArray(self.block_norms)[None] * root.swapaxes(0, 1).expand(1)
        tops = interval_spectral_norms_upper(scaled)                                    # (n,)
        slack = (IntervalArray(kappa) * IntervalArray(self.slack)[:, None]).sum(axis=0)   # sum_h kappa_hi eps_h ||A||^2
        return (IntervalArray(tops) + slack).hi


def _factor(gram: np.ndarray) -> np.ndarray:
    """A float L with ``L L^T`` near the symmetric positive semi-definite ``gram`` (Cholesky, or the eigenvectors
    scaled where it is singular); its error is certified by the caller."""
    try:
        return np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:
        values, vectors = np.linalg.eigh(gram)
        return vectors * np.sqrt(np.maximum(values, 0.0))
