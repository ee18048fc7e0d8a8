"""The Jacobian of an attention layer enclosed over a whole neighbourhood: ``L(eps)`` without a curvature integral.

By the mean-value theorem on the convex ``U = U(X, eps)``, ``L(eps) <= sup_{Y in U} ||DF(Y)||_2``, and
``sup_U ||DF(Y)|| <= ||DF(X)|| + sup_U ||DF(Y) - DF(X)||``.  For an attention layer
``F_i = y_i + sum_h o^h_i W_O^h + b_O`` (``o_i = sum_j p_ij v_j``, scores ``s_ij = c q_i . k_j``) the derivative of
one head along ``E`` (n, d) is, row i
(lemma ``softmax-derivative``; ``J_i = diag(p_i) - p_i p_i^T``, ``N_i = J_i V W_O^h``, ``b_i = W_K q_i^T``):

    do_i[E] W_O^h = (P E W_V W_O^h)_i  +  c e_i W_Q K^T N_i  +  c b_i^T E^T N_i       (value, query and key paths).

``J_i 1 = 0`` and ``1^T J_i = 0`` centre V and K: ``N_i = J_i (V - 1 z^T) W_O^h`` and ``K^T N_i = (K - 1 y^T)^T N_i``
for any z, y (``f_i``, ``kappa_i = sum_j p_ij k_j`` at X).  Between a point Y of U (primes) and X, with ``Y - X`` of
spectral norm at most ``eps`` (so ``||(K' - K) W_Q^T|| <= eps ||W_Q W_K^T||``,
``||(V' - V) W_O^h|| <= eps ||W_V W_O^h||``),
``Delta_i >= ||p'_i - p_i||_2`` and ``mu_i >= max_j |p'_ij - p_ij|`` on U (theorem ``local-attention-jacobian``):

    ||J'_i - J_i|| <= min(1/2, mu_i + Delta_i (2 ||p_i|| + Delta_i))     (PSD matrices of norm <= 1/2, Gershgorin),
    ||N'_i - N_i|| <= ||J'_i - J_i|| (||(V - 1 f_i^T) W_O^h|| + eps ||W_V W_O^h||) + ||J_i|| eps ||W_V W_O^h||,

and over unit ``E`` (Frobenius) each head's three changes are at most

    t_1 = ||P' - P||_F ||W_V W_O^h||,
    t_2 = c max_i (eps ||W_Q W_K^T|| ||N'_i|| + ||(K - 1 kappa_i^T) W_Q^T|| ||N'_i - N_i||),
    t_3 = c (eps ||W_Q W_K^T|| max_i ||N'_i||
             + min(||B|| max_i ||N'_i - N_i||, (sum_i ||b_i||^2 ||N'_i - N_i||^2)^(1/2)))

(``sum_i ||x_i^T E^T N_i||^2 <= sum_i ||E x_i||^2 ||N_i||^2``, at most ``max_i ||N_i||^2 ||E X^T||_F^2`` or
``||E||_2^2 sum_i ||x_i||^2 ||N_i||^2``), so ``sup_U ||DF(Y) - DF(X)|| <= sum_h (t_1 + t_2 + t_3)``, or the heads
joined before ``W_O`` through ``||W_O||`` (:meth:`JacobianSpread.spread`).  Each factor also has an entry-by-entry
or row-by-row form, and a covariance form that holds for any weights: ``u^T W_Q K^T N_i w`` is the covariance of
``u . a_j`` and ``w . v~_j`` under ``p_i``, at most a quarter of the product of the rows' diameters (Popoviciu)
(:meth:`JacobianSpread.terms`).  The same factors bound ``||DF(Y)||`` itself, with no reference to X
(:meth:`JacobianSpread.supremum`): the smaller where the weights may be anything (large eps).  Nothing of size
``(n d)^2`` is formed: the norms at X are of ``n x d`` matrices per (head, query), computed once.

The weights' changes ``Delta_i`` and ``mu_i`` are where the set enters (:func:`weight_changes`): from an enclosure
of every weight on U (the route's: softmax ranges on the scores met with each row's bound on the Frobenius ball,
:class:`~lipbound.local.ball_weights.BallWeights`), and from the weights as an affine form over the ball's symbols
(:attr:`~lipbound.local.relational.RelationalAttention.weights_form`: a row's change is the operator norm of its
generators, every weight of a row moving under one direction of the ball).
"""

from __future__ import annotations

from typing import final

import numpy as np

from ..numeric.model import Layer
from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import spectral_norm_upper_large
from .bounds import attention_norms, value_space
from .enclosed import EnclosedAttention

__all__ = ["JacobianSpread", "weight_changes"]


def _norms(matrices: IntervalArray) -> np.ndarray:
    """Certified spectral norms of a stack of interval matrices (..., rows, columns), shape (...)."""
    lead = matrices.shape[:-2]
    flat = matrices.reshape((-1,) + matrices.shape[-2:])
    return np.array([spectral_norm_upper_large(flat[k].to_enclosure()) for k in range(flat.shape[0])]).reshape(lead)


def _up(x: IntervalArray) -> np.ndarray:
    return np.maximum(x.hi, 0.0)


def _diameters(rows: IntervalArray) -> np.ndarray:
    """``max_{j, l} ||r_j - r_l||`` for the rows of each head's matrix (H, n, k) -> (H,)."""
    return np.max((rows.expand(1) - rows.expand(2)).norm_upper(), axis=(1, 2))


def _gershgorin(weights: IntervalArray) -> np.ndarray:
    """``||diag(p_i) - p_i p_i^T||_2`` for every row p_i in the box ``weights`` (H, n, n) -> (H, n): the matrix is PSD,
    and Gershgorin's row j gives ``p_j - p_j^2 + p_j (1 - p_j) = 2 p_j (1 - p_j) <= 1/2``."""
    hi, lo = IntervalArray(np.minimum(weights.hi, 1.0)), IntervalArray(np.clip(weights.lo, 0.0, 1.0))
    return np.minimum(np.max(_up(IntervalArray(2.0) * hi * (IntervalArray(1.0) - lo)), axis=-1), 0.5)


def weight_changes(weights: IntervalArray, at_x: IntervalArray, form=None) -> np.ndarray:
    """``Delta`` (H, n): ``sup_U ||p_i(Y) - p_i(X)||_2`` bounded.

    Parameters
    ----------
    weights : IntervalArray (H, n, n)
        An enclosure of every weight on U (entry by entry).
    at_x : IntervalArray (H, n, n)
        The weights at X.
    form : AffineForm (H, n, n), optional
        The attention weights on U over the ball's symbols (:attr:`RelationalAttention.weights_form`).

    Each row: the entrywise bound ``||(max(|hi - p(X)|, |p(X) - lo|))_j||``, the form's (``||c_i - p_i(X)|| +`` the
    operator norm of the row's generators and box symbols ``+ ||err_i||``) if given, the smaller, and at most
    ``2^(1/2)`` (two probability vectors)."""
    entrywise = np.maximum(_up(weights - at_x), _up(at_x - weights))           # |p_ij(Y) - p_ij(X)| <= this
    delta = np.minimum(IntervalArray(entrywise).norm_upper(), IntervalArray(2.0).sqrt().hi.item())
    if form is not None:
        offset = (IntervalArray(form.center) - at_x).norm_upper()
        symbolic = IntervalArray(form.row_norms()) + IntervalArray(IntervalArray(form.err).norm_upper())
        delta = np.minimum(delta, _up(IntervalArray(offset) + symbolic))
    return delta


@final
class _Values:
    """Norms at X of one head's values in one space (output: ``v_j W_O^h``; or before ``W_O``), per head and query:
    ``||v~_ij||``, ``||N_i||`` and ``||V~_i||`` with ``v~_ij = v_j - f_i`` (H, n, n) and (H, n); ``A`` (H,) the norm of
    the value map (``||W_V W_O^h||`` or ``||W_V||``) and the values' diameter (H,)."""

    def __init__(self, P: IntervalArray, values: IntervalArray, outputs: IntervalArray, A):
        centred = values.expand(1) - outputs.expand(2)                                     # v_j - f_i, (H, n, n, .)
        self.A = np.asarray(A, dtype=np.float64)
        self.diameter = _diameters(values)                                                 # max_jl ||v_j - v_l||, (H,)
        self.value_rows = centred.norm_upper()
        self.N = _norms(P.expand(-1) * centred)                                            # ||J_i V~_i|| = ||N_i||
        self.V_centred = _norms(centred)


@final
class JacobianSpread:
    """``sup_U ||DF(Y) - DF(X)||_2`` and ``sup_U ||DF(Y)||_2`` of an attention layer from its weights on U (module
    docstring).

    Parameters
    ----------
    target : Layer
        An attention layer covered by :func:`lipbound.local.relational.covers` (dot-product softmax heads, no masks or
        rotations, output projection and residual).
    E : EnclosedAttention
        The layer at X.

    The norms at X (per head and query: ``||N_i||``, ``||J_i||``, ``||(V - 1 f_i^T) W_O^h||``, ``||(K - 1 kappa_i^T)
    W_Q^T||``, ``||b_i||``; per head: ``||B||``, ``||W_V W_O^h||``, ``||W_Q W_K^T||``) are computed here once;
    :meth:`spread` and :meth:`supremum` take a radius and the weights' changes on its U.
    """

    def __init__(self, target: Layer, E: EnclosedAttention):
        engine = E.engine
        H = engine.H
        self.c, self.P = E.c, E.P
        # the heads' values where they act (v_j W_O^h: the heads add up) and before W_O (joined by ||W_O||)
        self.spaces = {"output": _Values(E.P, *value_space(E, target)),
                       "values": _Values(E.P, E.V, E.F, attention_norms(engine)["L_V"])}
        self.W_O = spectral_norm_upper_large(engine.W_O)
        self.g = np.asarray(E.norms.g, dtype=np.float64).reshape(H)                        # ||W_Q W_K^T||
        kappa = E.P.einsum("hij,hjk->hik", E.K)
        spread = E.K.expand(1) - kappa.expand(2)                                           # k_j - kappa_i
        keys = IntervalArray.stack([spread[h].matmul(engine.head_weights(h)[0].T) for h in range(H)])
        self.key_rows = keys.norm_upper()                                                  # ||(k_j - kappa_i) W_Q^T||
        self.K_centred = _norms(keys)                                                      # ||(K - 1 kappa_i^T) W_Q^T||
        # max_jl ||(k_j - k_l) W_Q^T||
        self.key_diameter = _diameters(IntervalArray.stack([E.K[h].matmul(engine.head_weights(h)[0].T)
                                                            for h in range(H)]))
        self.J = _gershgorin(E.P)                                                          # ||J_i|| (PSD)
        self.p_norms = E.P.norm_upper()                                                    # ||p_i||_2
        keys_side = E.norms.w                                                              # b_i = W_K q_i, (H, n, 1, d)
        self.b = np.asarray(E.norms.b, dtype=np.float64).reshape(H, -1)
        self.B = _norms(keys_side.reshape((H, E.n, keys_side.shape[-1])))                 # ||[b_i]_i||, (H,)

    def terms(self, eps: float, weights: IntervalArray, delta: np.ndarray, space: str = "output") -> dict:
        """For ``U(X, eps)`` with ``weights`` (every weight on U) and row changes ``delta`` (:func:`weight_changes`):
        the per-head bounds ``t_1``, ``t_2``, ``t_3`` (H,) on the paths' changes, and (H, n) bounds on the changes of
        ``J_i`` and ``N_i`` and on ``||N'_i||`` on U (keys "J", "N", "at_y_N"); with the values in ``space``: "output"
        (``v_j W_O^h``) or "values" (before ``W_O``)."""
        t = IntervalArray(float(eps))
        S = self.spaces[space]
        hi = IntervalArray(np.minimum(weights.hi, 1.0))
        entries = IntervalArray(np.maximum(_up(weights - self.P), _up(self.P - weights)))  # |p'_ij - p_ij|
        Delta = IntervalArray(delta)
        Mu = IntervalArray(np.minimum(np.max(entries.hi, axis=-1), delta))
        moved_J = np.minimum(_up(Mu + Delta * (IntervalArray(2.0) * IntervalArray(self.p_norms) + Delta)), 0.5)
        J_at_y = IntervalArray(_gershgorin(weights))
        shift_V = (t * IntervalArray(S.A))[:, None]                                     # eps ||W_V W_O^h||, (H, 1)
        values = IntervalArray(S.V_centred) + shift_V
        rows = IntervalArray(S.value_rows)
        # (J' - J) V~ = diag(Delta p) V~ - p' (Delta p^T V~), V~ centred at f_i; J' (V~' - V~) at most
        # ||J'|| eps ||W_V W_O||; ||Delta p^T V~|| <= mixed
        mixed = IntervalArray(np.minimum(_up((entries * rows).sum(axis=-1)),
                                         _up(Delta * IntervalArray(S.V_centred))))
        p_at_y = IntervalArray(np.minimum(_up(IntervalArray(self.p_norms) + Delta), 1.0))
        by_entries = IntervalArray((entries * rows).norm_upper()) + p_at_y * mixed + J_at_y * shift_V
        by_norms = IntervalArray(moved_J) * values + IntervalArray(self.J) * shift_V
        concentrated = IntervalArray(np.max(hi.hi, axis=-1)).sqrt() * (IntervalArray((hi * rows * rows).sum(axis=-1).hi)
                                                                        .sqrt() + shift_V)
        # x^T N'_i = Cov_p'(x, v~') for unit x: at most (1/2)^(1/2) D_v / 2 (Popoviciu; x's range is at most 2^(1/2))
        diameter = IntervalArray(S.diameter) + IntervalArray(2.0).sqrt() * t * IntervalArray(S.A)
        covariance = (diameter * IntervalArray(0.125).sqrt())[:, None]
        level = np.minimum(_up(J_at_y * values), np.minimum(_up(concentrated), _up(covariance)))   # ||N'_i||
        moved_N = np.minimum(np.minimum(_up(by_entries), _up(by_norms)), _up(IntervalArray(level) + IntervalArray(S.N)))
        at_y_N = np.minimum(level, _up(IntervalArray(S.N) + IntervalArray(moved_N)))
        g = IntervalArray(self.g)[:, None]
        # W_Q K~^T Delta N_i: its norm by the spectral norm of K~ W_Q^T, or row by row (row j of Delta N_i is at most
        # |Delta p_ij| ||v~_j|| + p'_ij (the mixed term + 2 eps ||W_V W_O||))
        row_changes = entries * rows + hi * (mixed + IntervalArray(2.0) * shift_V).expand(-1)
        # or as covariances: Cov_p'(a, v~' - v~) + Cov_p'(a, v~) - Cov_p(a, v~), the last
        # sum_j dp_j a~_j v~_j^T - (sum_j dp_j a~_j)(sum_j dp_j v~_j)^T
        keys = IntervalArray(self.key_rows)
        moved_keys = IntervalArray(np.minimum(_up((entries * keys).sum(axis=-1)),
                                              _up(Delta * IntervalArray(self.K_centred))))
        covariances = (entries * keys * rows).sum(axis=-1) + moved_keys * mixed \
            + (IntervalArray(self.key_diameter) * t * IntervalArray(S.A) * IntervalArray(0.125).sqrt())[:, None]
        keyed = np.minimum(np.minimum(_up(IntervalArray(self.K_centred) * IntervalArray(moved_N)),
                                      _up((keys * row_changes).sum(axis=-1))), _up(covariances))
        moved_M = _up(t * g * IntervalArray(at_y_N) + IntervalArray(keyed))
        t1 = _up(IntervalArray(Delta.norm_upper()) * IntervalArray(S.A))              # ||P' - P||_F ||W_V W_O^h||
        t2 = _up(self.c * IntervalArray(np.max(moved_M, axis=-1)))
        by_max = IntervalArray(self.B) * IntervalArray(np.max(moved_N, axis=-1))
        by_rows = IntervalArray((IntervalArray(self.b) * IntervalArray(moved_N)).norm_upper())
        key_change = IntervalArray(np.minimum(_up(by_max), _up(by_rows)))
        t3 = _up(self.c * (t * IntervalArray(self.g) * IntervalArray(np.max(at_y_N, axis=-1)) + key_change))
        return {"value": t1, "query": t2, "key": t3, "J": moved_J, "N": moved_N, "at_y_N": at_y_N}

    def _joined(self, paths) -> float:
        """``min(sum_h t_h, ||W_O|| (sum_h s_h^2)^(1/2))`` for per-head bounds ``t`` in the output space and ``s``
        before ``W_O`` (``paths(space)``: the three paths' bounds per head): ``sum_h Z_h W_O^h = [Z_1 ... Z_H] W_O``."""
        def heads(space):
            parts = paths(space)
            return IntervalArray(parts["value"]) + IntervalArray(parts["query"]) + IntervalArray(parts["key"])
        by_heads = _up(heads("output").sum(axis=0))
        joint = _up(IntervalArray(self.W_O) * IntervalArray(heads("values").norm_upper(axis=0)))
        return float(min(by_heads, joint))

    def spread(self, eps: float, weights: IntervalArray, delta: np.ndarray) -> float:
        """``sup_{U(X, eps)} ||DF(Y) - DF(X)||_2`` bounded (module docstring)."""
        return self._joined(lambda space: self.terms(eps, weights, delta, space))

    def levels(self, eps: float, weights: IntervalArray, delta: np.ndarray, space: str = "output") -> dict:
        """Per head (H,), bounds on the three paths' operator norms at every point of ``U(X, eps)``
        (:meth:`supremum`), with the values in ``space`` (:meth:`terms`)."""
        t = IntervalArray(float(eps))
        S = self.spaces[space]
        N = self.terms(eps, weights, delta, space)["at_y_N"]
        hi = IntervalArray(np.minimum(weights.hi, 1.0))
        g = t * IntervalArray(self.g)
        # row j of N'_i is p'_ij (v'_j - o'_i) W_O^h: at most p'_ij (||v~_j|| + max_l ||v~_l|| + 2 eps ||W_V W_O^h||)
        reach = IntervalArray(np.max(S.value_rows, axis=-1))[:, :, None] + (IntervalArray(2.0) * t
                                                                              * IntervalArray(S.A))[:, None, None]
        rows = hi * (IntervalArray(S.value_rows) + reach)
        by_rows = ((IntervalArray(self.key_rows) + g[:, None, None]) * rows).sum(axis=-1)
        by_norms = (IntervalArray(self.K_centred) + g[:, None]) * IntervalArray(N)
        P = IntervalArray(_up(hi.sum(axis=-2))).sqrt()                                  # ||P'||_2 per column sum
        # W_Q K'^T N'_i = Cov_p'(a', v~') and x^T N'_i = Cov_p'(x, v~'): Popoviciu and Cauchy-Schwarz (diameters)
        root_two = IntervalArray(2.0).sqrt()
        keys_reach = IntervalArray(self.key_diameter) + root_two * g
        values_reach = IntervalArray(S.diameter) + root_two * t * IntervalArray(S.A)
        covariance = IntervalArray(0.25) * keys_reach * values_reach
        query = np.minimum(np.max(np.minimum(_up(by_rows), _up(by_norms)), axis=-1), _up(covariance))
        b_at_y = IntervalArray(self.b) + g[:, None]
        spread_b = IntervalArray(np.max(_up((hi * (b_at_y * b_at_y).expand(-1)).sum(axis=-2)), axis=-1)).sqrt()
        key = np.minimum(_up((IntervalArray(self.B) + g) * IntervalArray(np.max(N, axis=-1))),
                         _up(IntervalArray(0.5) * values_reach * spread_b))
        return {"value": _up(IntervalArray(np.max(_up(P), axis=-1)) * IntervalArray(S.A)),
                "query": _up(self.c * IntervalArray(query)), "key": _up(self.c * IntervalArray(key))}

    def supremum(self, eps: float, weights: IntervalArray, delta: np.ndarray) -> float:
        """``sup_{U(X, eps)} ||DF(Y)||_2`` bounded directly, without ``DF(X)``: ``1 + sum_h u_h`` with, per head,

            u = ||P'|| ||W_V W_O^h|| + c max_i ||W_Q K'^T N'_i|| + c sup ||(b'_i^T E^T N'_i)_i||,

        ``||P'||_2 <= (max_j sum_i p'_ij)^(1/2)`` (rows sum to 1); ``W_Q K'^T N'_i`` is the covariance of the keys
        ``a'_j = k'_j W_Q^T`` and the values under ``p'_i``, at most ``D_a D_v / 4`` (Popoviciu: a variable of range D
        has variance at most ``D^2 / 4``; diameters of the rows at Y), or by the norms of ``K'`` centred at
        ``kappa_i`` and of ``N'_i`` (:meth:`terms`), or row by row; the key path is at most ``(||B|| + eps g) max_i
        ||N'_i||`` or, as ``sum_i ||Cov_p'_i(E b'_i, v~')||^2 <= (D_v / 2)^2 sum_j ||e_j||^2 sum_i p'_ij ||b'_i||^2``,
        ``(D_v / 2) (max_j sum_i p'_ij ||b'_i||^2)^(1/2)``."""
        joined = self._joined(lambda space: self.levels(eps, weights, delta, space))
        return float(_up(IntervalArray(1.0) + IntervalArray(joined)))
