"""How much ``zeta``, the centred score changes of an attention layer, can change over a neighbourhood U of X: the
deviations that the curvature bound (:mod:`lipbound.local.curvature`, theorem ``local-attention-curvature``) adds to
each matrix it reads at X, bounded as spectral norms of row-scaled groups of ``zeta``'s rows (lemma
``curvature-joint`` in docs/mathematics.md).

Block m of row (h, i, j) changes by at most ``f + sum_t D_t x_t`` with ``x_t = ||y_t - x_t||``: f the weights'
part (their changes ``delta`` times the query's key direction, and the keys' weighted centre moved by the weights),
``D >= 0`` the tokens' movements.  :class:`Changes` takes the smaller of the blocks' Frobenius norm at the tokens'
radii and ``||fixed part|| + ||linear part||`` (Minkowski), the linear part at most ``t ||diag(s) D||_2`` on a
Frobenius ball of radius t (the tokens share it) and the fixed part, for dot-product heads, bounded as one operator
over the heads (:class:`HeadsJoint`: Schur's product bound on its Gram matrix).
"""

from __future__ import annotations

from typing import final

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.batched import interval_spectral_norms_upper, spectral_norms_upper
from ..rigorous.linalg import Enclosure, RowGram, spectral_norm_upper_large
from .centred_change import CentredChange
from .enclosed import EnclosedAttention

__all__ = ["Changes", "HeadsJoint", "centred_parts"]


@final
class Changes:
    """Bounds on the norms of ``s (zeta(Y) - zeta(X))`` over U, for row scales s >= 0 (H, n(i), n(j)) fixed on U: the
    blocks' bounds ``per_token`` (H, n(i), n(j), n(m)) at the tokens' radii, and the same bounds split into a part
    ``fixed`` free of the movement and one linear in ``x_t = ||y_t - x_t||`` (``linear``, the arrays of
    ``AttentionCurvature._linear_part``).  By Minkowski's inequality the norm is at most that of the fixed part plus
    the linear part's Frobenius norm, the latter at most ``||s D r||_F`` and, where the ball is known to be a Frobenius
    ball of radius ``frobenius`` (``||x|| <= frobenius``), ``frobenius ||diag(s) D||_2`` (``D >= 0`` at its upper ends:
    the norm of a non-negative matrix grows with its entries): the tokens share the radius instead of each taking all
    of it.  The fixed part's norm is its blocks' Frobenius norm or, for dot-product heads, ``spectral``
    (:class:`HeadsJoint`); the linear part's, where it is z's change alone (no fixed part) for dot-product heads, also
    ``heads`` (:class:`~lipbound.local.centred_change.CentredChange`: the heads' score maps together)."""

    def __init__(self, per_token: np.ndarray, fixed: np.ndarray | None = None, linear: tuple | None = None,
                 radii: np.ndarray | None = None, frobenius: float | None = None, spectral=None, heads=None):
        self.per_token, self.fixed, self.linear, self.radii = per_token, fixed, linear, radii
        self.frobenius, self.spectral, self.heads = frobenius, spectral, heads

    def norms(self, scales, axis: int | None = None, extra: np.ndarray | None = None):
        """``sup_U ||extra + s (zeta(Y) - zeta(X))||_2`` bounded, over all rows (``axis`` None: a float) or for each
        index of ``axis`` (0: per head, 1: per query; an array), for row scales ``s`` (>= 0, (H, n, n)) and ``extra``
        >= 0 (H, n, n, n) bounds added block by block (their Frobenius norm)."""
        shape = self.per_token.shape
        s = IntervalArray(np.broadcast_to(np.asarray(scales, dtype=np.float64), shape[:3])).expand(-1)
        tail = IntervalArray(np.zeros(shape) if extra is None else extra)
        plain = _grouped(((tail + s * IntervalArray(self.per_token)).hi), axis)
        if self.fixed is None:
            return plain
        single, own = self.linear
        radii = IntervalArray(self.radii)
        moved = (s * IntervalArray(single) * radii[None, :, None, None]).hi
        index = np.arange(shape[1])                                                 # blocks m = i: their own rows
        moved[:, index, :, index] = (s[..., 0] * (IntervalArray(own) * radii).sum(axis=-1)).hi.transpose(1, 0, 2)
        linear = _grouped(moved, axis)
        if self.frobenius is not None:
            linear = np.minimum(linear, (IntervalArray(float(self.frobenius))
                                         * IntervalArray(self._linear_norms(s, axis))).hi)
        if self.heads is not None:    # the heads' score maps together (lemma curvature-centred-change)
            linear = np.minimum(linear, self.heads.norms(s.hi[..., 0], self._radius(), axis))
        fixed = _grouped((s * IntervalArray(self.fixed)).hi, axis)
        if self.spectral is not None and axis != 1:   # (a query's own rows: 0.98-1.13 times the blocks' norm on MiniLM)
            fixed = np.minimum(fixed, self.spectral.norms(s.hi[..., 0], axis))
        joint = IntervalArray(_grouped(tail.hi, axis)) + IntervalArray(fixed) + IntervalArray(linear)
        joint_hi = joint.hi if axis is not None else joint.hi.item()
        return np.minimum(plain, joint_hi)

    def _radius(self) -> float:
        """A bound on ``||Y - X||_F`` on U: the shared radius where known, else the tokens' radii's norm."""
        if self.frobenius is not None:
            return float(self.frobenius)
        return IntervalArray(np.asarray(self.radii, dtype=np.float64)).norm_upper().item()

    def _linear_norms(self, s: IntervalArray, axis: int | None) -> np.ndarray:
        """``||diag(s) D||_2`` over the rows of each group: a block m != i has one entry, on token i, so those of a
        group add up on the diagonal (their squares summed), beside the rows of the blocks m = i."""
        single, own = self.linear
        H, n = single.shape[:2]
        scattered = (s * IntervalArray(single)).hi                                 # (H, n(i), n(j), n(m))
        rows = (s * IntervalArray(own)).hi                                         # (H, n(i), n(j), n(t))
        eye = np.eye(n)
        if axis is None:
            diagonal = IntervalArray(scattered.transpose(1, 0, 2, 3).reshape(n, -1)).norm_upper()     # (n(i),)
            stacks = np.concatenate([eye * diagonal[:, None], rows.reshape(-1, n)])[None]
        elif axis == 0:
            diagonal = IntervalArray(scattered.reshape(H, n, -1)).norm_upper()                          # (H, n(i))
            stacks = np.concatenate([eye[None] * diagonal[:, :, None], rows.reshape(H, n * n, n)], axis=1)
        else:
            diagonal = IntervalArray(scattered.transpose(1, 0, 2, 3).reshape(n, -1)).norm_upper()     # (n(i),)
            stacks = np.concatenate([(eye * diagonal[:, None])[:, None, :],
                                     rows.transpose(1, 0, 2, 3).reshape(n, H * n, n)], axis=1)
        norms = spectral_norms_upper(stacks)
        return norms if axis is not None else norms[0]


@final
class HeadsJoint:
    """The spectral norm of the weights' part of ``zeta``'s change, all heads of a group of rows at once (lemma
    ``curvature-joint``), for dot-product heads (no rotations): with ``dp = p(Y) - p(X)``, row (h, i, j) changes by
    ``-c dp_him a_hi`` on every block m (``a_hi = W_K q_i^T``) and by ``-c W_Q^h u_hi`` on block i,
    ``u_hi = sum_l dp_hil (k_l - kappa_hi)``.  For row scales s, ``sigma_hi = ||s_hi.||``, ``Delta_hi >= ||dp_hi||``:

    * the first part has Gram matrix ``(sigma sigma^T) o G_a o C`` (``G_a`` of the rows ``a_hi``, ``C`` of the rows
      ``dp_hi``), at most ``c ||diag(sigma Delta) A||`` (Schur: ``lambda_max(A o B) <= max_k B_kk lambda_max(A)`` for
      PSD A, B, here ``B = diag(Delta)^-1 C diag(Delta)^-1``);
    * the second lies on block i only (block-diagonal over the queries), and for a query its rows are
      ``c blockdiag(sigma_hi u_hi^T) [W_Q^1 ... W_Q^H]^T``: at most ``c max_i min(||W_Q|| max_h sigma_hi ||u_hi||,
      (sum_h sigma_hi^2 ||W_Q^h u_hi||^2)^(1/2))``, ``||u_hi|| <= min(sum_l delta_hil ||k_l - kappa_hi||, Delta_hi
      ||K - 1 kappa_hi^T||)``.

    The heads' key directions ``a_hi`` lie in nearly orthogonal subspaces, so this is below the blocks' Frobenius norm.
    """

    def __init__(self, E: EnclosedAttention, spread: IntervalArray, c: IntervalArray):
        engine = E.engine
        H, n = engine.H, E.n
        self.H, self.n, self.c = H, n, c
        self.directions = RowGram(E.norms.w[:, :, 0].reshape(H * n, -1).to_enclosure())     # rows a_hi, (h, i)
        queries = np.concatenate([engine.head_weights(h)[0] for h in range(H)], axis=1)           # [W_Q^1 ... W_Q^H]
        self.query_stack = spectral_norm_upper_large(Enclosure.exact(queries))
        self.key_rows = spread.norm_upper()                                                  # ||k_l - kappa_hi||
        self.key_stack = interval_spectral_norms_upper(spread)                               # ||K - 1 kappa_hi^T||

    def at(self, delta: IntervalArray, kappa: IntervalArray) -> HeadsJoint:
        """Bound to a neighbourhood: the weights' changes ``delta`` (H, n, n) and ``||W_Q^h u_hi||`` bounds ``kappa``
        (H, n) there."""
        bound = HeadsJoint.__new__(HeadsJoint)
        bound.__dict__.update(self.__dict__)
        bound.Delta = delta.norm_upper()                                                     # (H, n)
        by_entries = (delta * IntervalArray(self.key_rows)).sum(axis=-1).hi
        bound.u = np.minimum(by_entries, (IntervalArray(bound.Delta) * IntervalArray(self.key_stack)).hi)
        bound.kappa = kappa.hi
        return bound

    def norms(self, s: np.ndarray, axis: int | None):
        """The fixed part's norm for row scales s (H, n, n), all rows or per index of ``axis`` (:class:`Changes`)."""
        H, n = self.H, self.n
        sigma = IntervalArray(s).norm_upper()                                                # (H, n)
        scaled = (IntervalArray(sigma) * IntervalArray(self.Delta)).hi.ravel()                # rows (h, i)
        groups = [np.arange(H * n)] if axis is None else \
            [h * n + np.arange(n) for h in range(H)] if axis == 0 else [np.arange(H) * n + i for i in range(n)]
        first = np.array([self.directions.norm_upper(scaled[rows], rows) for rows in groups])
        by_stack = IntervalArray(self.query_stack) * IntervalArray(sigma) * IntervalArray(self.u)         # (H, n)
        by_heads = IntervalArray(sigma) * IntervalArray(self.kappa)
        per_query = [np.minimum(np.max(by_stack.hi[:, i]), by_heads[:, i].norm_upper().item()) for i in range(n)]
        if axis is None:
            second = np.array([max(per_query)])
        elif axis == 0:
            second = np.max(np.minimum(by_stack.hi, by_heads.hi), axis=1)
        else:
            second = np.array(per_query)
        total = (self.c * (IntervalArray(first) + IntervalArray(second))).hi
        return total if axis is not None else total[0]


def centred_parts(coefficient: np.ndarray, delta: IntervalArray, g: IntervalArray, c: IntervalArray, fixed: np.ndarray,
                  radii: np.ndarray, frobenius: float | None, spectral: HeadsJoint | None,
                  heads: CentredChange | None = None) -> tuple[Changes, Changes]:
    """``zeta(Y) - zeta(X) = (z(Y) - z(X)) - m(Y)`` split at X's weights (lemma ``curvature-covariance-centred``):
    ``z_ij = ds_ij - sum_l p_il(X) ds_il`` (the score changes centred with X's weights, at Y's keys and queries) and
    ``m_hi = sum_l (p_il(Y) - p_il(X)) ds_il``, the same for every key j of a query.  Block m of row (h, i, j) of
    the first changes by at most ``c |delta_mj - p_im| g_im x_i`` plus, on block i, ``c sum_l |delta_lj - p_il(X)|
    g_il x_l`` (the movements alone: the keys' part is one vector, ``c W_Q M_i (dk_j - sum_l p_il(X) dk_l)``); the
    second's block m is ``c dp_im a_him(Y)`` plus, on block i, ``-c W_Q sum_l dp_il (k_l(Y) - kappa_i)``, at most
    ``fixed`` (the weights' part of :class:`Changes`) plus ``c delta_im g_im x_i`` and ``c delta_il g_il x_l`` on
    block i.  Returns ``(centred, weights)``, two :class:`Changes` (the second's value
    at X is 0, so it bounds ``m`` itself); ``coefficient`` is ``|delta_mj - p_im|`` at X (H, n(i), n(j), n(m)),
    ``delta`` the weights' changes and ``g`` ``||W_Q M_i M_j^T W_K^T||`` (H, n(i), n(j))."""
    n = coefficient.shape[1]
    index = np.arange(n)
    fixed = np.broadcast_to(fixed, coefficient.shape)                        # (H, n, 1 or n, n): the same for each j
    g_query = g.expand(2)                                                     # g_im, (H, n(i), 1, n(m))

    def split(on_query: IntervalArray, keys: IntervalArray) -> tuple[np.ndarray, np.ndarray]:
        single = on_query.hi.copy()
        single[:, index, :, index] = 0.0
        own_query = np.zeros(single.shape)
        own_query[:, index, :, index] = on_query.hi[:, index, :, index]       # block i's entry on token i
        return single, (IntervalArray(own_query) + keys).hi                    # and the keys' part on token l

    # z's keys move by W_Q (dk_j - sum_l p_il(X) dk_l): one vector, c |delta_lj - p_il(X)| g_il on token l
    centred = split(c * IntervalArray(coefficient) * g_query, c * IntervalArray(coefficient) * g_query)
    moved = split(c * delta.expand(2) * g_query, (c * delta * g).expand(2))
    zero = np.zeros(coefficient.shape)
    return (Changes(_per_token(zero, *centred, radii), zero, centred, radii, frobenius, heads=heads),
            Changes(_per_token(fixed, *moved, radii), fixed, moved, radii, frobenius, spectral))


def _per_token(fixed: np.ndarray, single: np.ndarray, own: np.ndarray, radii: np.ndarray) -> np.ndarray:
    """``fixed + D r`` block by block (the tokens' radii r for every ``x_t``): ``single`` on token i, ``own`` on
    block i's tokens, (H, n(i), n(j), n(m))."""
    r = IntervalArray(radii)
    total = (IntervalArray(fixed) + IntervalArray(single) * r[None, :, None, None]).hi
    index = np.arange(fixed.shape[1])
    own_blocks = (IntervalArray(fixed[:, index, :, index].transpose(1, 0, 2))
                  + (IntervalArray(own) * r).sum(axis=-1)).hi                 # (H, n(i), n(j))
    total[:, index, :, index] = own_blocks.transpose(1, 0, 2)
    return total


def _grouped(blocks: np.ndarray, axis: int | None):
    """Upper bounds on the Frobenius norms of the non-negative ``blocks`` (H, n, n, n), all (a float) or per index of
    ``axis``."""
    if axis is None:
        return IntervalArray(blocks.ravel()).norm_upper().item()
    return IntervalArray(np.moveaxis(blocks, axis, 0).reshape(blocks.shape[axis], -1)).norm_upper()

