"""The movement of one edit through an attention block, certified along the segment between the inputs.

Two inputs of a layer -- a sentence X (n tokens) and its edit X' (n' tokens) -- are the uniform
measures ``mu``, ``mu'``.  A coupling ``pi`` of them (integer masses ``m_ab``, rows summing to n',
columns to n, so ``pi = m / (n n')``) defines atoms ``z_ab(t) = (1 - t) x_a + t x'_b`` with masses
``m_ab`` and the measures ``mu_t = sum_ab pi_ab delta_{z_ab(t)}``: ``mu_0 = mu``, ``mu_1 = mu'``.  The
attention block ``F(z) = z + MHA_mu(z)`` acts on measures atom by atom with the atoms' masses as
key weights, so its outputs at t = 0 and 1 are those of the two sentences, and

    W1(F_# mu, F_# mu')  <=  sum_ab pi_ab ||F_ab(1) - F_ab(0)||                 (theorem local-coupling)
    ||F_ab(1) - F_ab(0)|| <= ||sum_k w_k F'_ab(t_k)|| + sum_k w_k e_{k,ab}        (theorem local-path)

with [0, 1] cut into pieces ``I_k`` (length ``w_k``, midpoint ``t_k``) and
``e_{k,ab} >= sup_{t in I_k} ||F'_ab(t) - F'_ab(t_k)||``.  Along the segment queries, keys and values are
affine in t, so the scores ``s(t) = A_0 + A_1 t + A_2 t^2`` are quadratic and their range over a piece
is exact; attention weights over the piece follow from the softmax-range theorems, the velocity

    F'_i = x'_b - x_a + sum_h [sum_j p_ij (s'_ij - m_i) (v_j - g_i) + sum_j p_ij v'_j] W_O^h,
    m_i = sum_l p_il s'_il   (any fixed g_i: sum_j p_ij (s'_ij - m_i) = 0),

is enclosed over the piece in interval arithmetic and at its midpoint tightly.  Pieces whose
error dominates are halved until the error is a small fraction of the main term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..numeric import kernels
from ..numeric.attention import AttentionMap
from ..numeric.model import Layer
from ..rigorous.arrays import IntervalArray
from .bounds import _softmax_range, simplex_box_max
from .enclosed import inverse_sqrt, softmax

__all__ = ["PathCertificate", "path_certificate", "identity_plan"]


@final
@dataclass(frozen=True)
class PathCertificate:
    """The certified W1 movement of the block's output along one edit.

    Attributes
    ----------
    bound : float
        ``sum_ab pi_ab (main_ab + error_ab)``: a certified upper bound on the W1 distance between the
        block outputs of the two inputs.
    main, error : float
        The two parts (``sum_ab pi_ab main_ab`` and ``sum_ab pi_ab error_ab``).
    pieces : int
        Pieces of [0, 1] used.
    atom_bounds : ndarray
        Per atom ``main_ab + error_ab`` (bounds on ``||F_ab(1) - F_ab(0)||``).
    atoms : ndarray, shape (k, 2)
        ``(a, b)`` of each atom; ``masses`` their integer masses.
    """

    bound: float
    main: float
    error: float
    pieces: int
    atom_bounds: np.ndarray
    atoms: np.ndarray
    masses: np.ndarray


def identity_plan(n: int) -> np.ndarray:
    """The coupling of two sentences of equal length that matches token i with token i (masses n)."""
    return np.eye(n, dtype=np.int64) * n


def _check_plan(plan, n: int, n_new: int) -> np.ndarray:
    plan = np.asarray(plan)
    if plan.shape != (n, n_new) or not np.issubdtype(plan.dtype, np.integer) or np.any(plan < 0):
        raise AssumptionError("plan", f"non-negative integer masses of shape ({n}, {n_new})", f"shape {plan.shape}",
                              "pass the coupling scaled by n n' (rows sum to n', columns to n)")
    if np.any(plan.sum(axis=1) != n_new) or np.any(plan.sum(axis=0) != n):
        raise AssumptionError("plan",
                              f"rows summing to {n_new} and columns to {n} (a coupling of the uniform measures)",
                              "other marginals", "scale the coupling by n n' and round it to integers exactly")
    return plan


class _Segment:
    """Projections along the segment, affine in t, for every head: ``Q(t) = Q_0 + t dQ`` etc."""

    def __init__(self, engine: AttentionMap, start: IntervalArray, shift: IntervalArray):
        dk = engine.d_k
        self.engine = engine
        base = start.matmul(engine.W) + IntervalArray(engine.bias)
        step = shift.matmul(engine.W)
        self.Q0, self.dQ = engine.per_head(base, "queries"), engine.per_head(step, "queries")
        self.K0, self.dK = engine.per_head(base, "keys"), engine.per_head(step, "keys")
        self.V0, self.dV = engine.per_head(base, "values"), engine.per_head(step, "values")
        c = inverse_sqrt(dk)
        product = lambda A, B: A.einsum("hik,hjk->hij", B) * c  # noqa: E731
        self.A0 = product(self.Q0, self.K0)
        self.A1 = product(self.dQ, self.K0) + product(self.Q0, self.dK)
        self.A2 = product(self.dQ, self.dK)


def _velocity(seg: _Segment, t: np.ndarray, tau: np.ndarray, masses: np.ndarray, anchor: np.ndarray):
    """The head part of ``F'`` (before W_O) for pieces with midpoints t and half-widths tau (b,):
    enclosed at the midpoints and over the pieces, each (b, H, N, d_v)."""
    T = IntervalArray(t)[:, None, None, None]
    scores = seg.A0.expand(0) + seg.A1.expand(0) * T + seg.A2.expand(0) * T.square()
    slope = seg.A1.expand(0) + seg.A2.expand(0) * (T * 2.0)
    values = seg.V0.expand(0) + seg.dV.expand(0) * IntervalArray(t)[:, None, None, None]
    width = IntervalArray(-tau, tau)[:, None, None, None]
    piece_scores = scores + slope * width \
        + seg.A2.expand(0) * IntervalArray(np.zeros_like(tau), tau * tau)[:, None, None, None]
    piece_slope = slope + seg.A2.expand(0) * (width * 2.0)
    piece_values = values + seg.dV.expand(0) * width
    at_mid = softmax(scores, masses)
    p_hi, p_lo = _softmax_range(piece_scores, masses)
    piece_weights = IntervalArray(np.minimum(p_lo, at_mid.lo), np.maximum(p_hi, at_mid.hi))
    out = []
    for P, S1, V, bounds in ((at_mid, slope, values, None), (piece_weights, piece_slope, piece_values, (p_lo, p_hi))):
        if bounds is None:
            mean = (P * S1).sum(axis=-1, keepdims=True)
        else:  # the range of sum_l p_l s'_l over the softmax box: the box-simplex maximum and minimum
            top = simplex_box_max(bounds[0], bounds[1], S1.hi)
            bottom = -simplex_box_max(bounds[0], bounds[1], -S1.lo)
            mean = IntervalArray(bottom[..., None], top[..., None])
        centred = (S1 - mean) * P                                                  # (b, H, N, N)
        spread = V.expand(2) - IntervalArray(anchor)[None, :, :, None, :]          # v_j - g_i, (b, H, N, N, d_v)
        first = centred.einsum("bhij,bhijv->bhiv", spread)
        second = P.einsum("bhij,hjv->bhiv", seg.dV)
        out.append(first + second)
    return out


def _to_output(engine: AttentionMap, heads: IntervalArray) -> IntervalArray:
    b, H, N, dv = heads.shape
    merged = heads.swapaxes(1, 2).reshape(b, N, H * dv)
    return merged.matmul(engine.W_O)


def path_certificate(layer: Layer, X: np.ndarray, X_new: np.ndarray, plan=None, *, tolerance: float = 0.05,
                     initial_pieces: int = 16, max_pieces: int = 2048, chunk: int = 32) -> PathCertificate:
    """Certify the W1 movement of ``X -> X + MHA(X)`` along the segment from X to X_new.

    Parameters
    ----------
    layer : Layer
        The attention layer (its residual is added whatever ``layer.residual`` says).
    X, X_new : ndarray
        The two inputs, (n, d) and (n', d).
    plan : ndarray of int, shape (n, n'), optional
        The coupling scaled by ``n n'`` (default: the identity, for n = n').
    tolerance : float
        Halve pieces until the error part is at most this fraction of the main part (or ``max_pieces``).
    """
    X, X_new = np.asarray(X, dtype=np.float64), np.asarray(X_new, dtype=np.float64)
    n, n_new = X.shape[0], X_new.shape[0]
    if plan is None:
        if n != n_new:
            raise AssumptionError("plan", "a coupling of the two inputs (they differ in length)",
                                  f"{n} and {n_new} tokens",
                                  "pass the optimal W1 plan scaled by n n'")
        plan = identity_plan(n)
    plan = _check_plan(plan, n, n_new)
    atoms = np.argwhere(plan > 0)
    masses = plan[atoms[:, 0], atoms[:, 1]].astype(np.float64)
    engine = AttentionMap(Layer(layer.heads, layer.W_O, layer.b_O, residual=False))
    start = IntervalArray(X[atoms[:, 0]])
    shift = IntervalArray(X_new[atoms[:, 1]]) - start
    seg = _Segment(engine, start, shift)
    anchor = _anchor(engine, X[atoms[:, 0]], X_new[atoms[:, 1]], masses)
    weights = masses / (n * n_new)

    pieces = {(k, initial_pieces) for k in range(initial_pieces)}  # piece k of a grid of m: [k/m, (k+1)/m]
    done: dict = {}
    while True:
        todo = sorted(p for p in pieces if p not in done)
        for begin in range(0, len(todo), chunk):
            batch = todo[begin:begin + chunk]
            t = np.array([(k + 0.5) / m for k, m in batch])
            tau = np.array([0.5 / m for k, m in batch])
            mid, over = _velocity(seg, t, tau, masses, anchor)
            mid_out, over_out = _to_output(engine, mid), _to_output(engine, over)
            error = (over_out - mid_out).norm_upper()                              # (b, N)
            for index, key in enumerate(batch):
                done[key] = (mid_out[index], error[index])
        main_vector = None
        error_atoms = np.zeros(len(atoms))
        contributions = {}
        for k, m in pieces:
            velocity, error = done[(k, m)]
            scaled = velocity * (1.0 / m)
            main_vector = scaled if main_vector is None else main_vector + scaled
            part = (IntervalArray(error) * (1.0 / m)).hi
            error_atoms = (IntervalArray(error_atoms) + IntervalArray(part)).hi
            contributions[(k, m)] = float(np.dot(weights, part))
        main_atoms = (main_vector + shift).norm_upper()
        main = float((IntervalArray(weights) * IntervalArray(main_atoms)).sum().hi)
        error = float((IntervalArray(weights) * IntervalArray(error_atoms)).sum().hi)
        if error <= tolerance * main or len(pieces) >= max_pieces:
            break
        ranked = sorted(pieces, key=lambda p: -contributions[p])
        split = ranked[:max(1, min(len(ranked) // 2, max_pieces - len(pieces)))]
        for k, m in split:
            pieces.discard((k, m))
            pieces.update({(2 * k, 2 * m), (2 * k + 1, 2 * m)})
    atom_bounds = (IntervalArray(main_atoms) + IntervalArray(error_atoms)).hi
    bound = float((IntervalArray(weights) * IntervalArray(atom_bounds)).sum().hi)
    return PathCertificate(bound, main, error, len(pieces), atom_bounds, atoms, masses)


def _anchor(engine: AttentionMap, start: np.ndarray, end: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """``g_i``: the head outputs at the middle of the segment (floats; any fixed vectors are valid)."""
    middle = 0.5 * (start + end)
    lin = engine.linearize(middle[None])
    return np.einsum("hij,hjv->hiv", kernels.softmax(lin.S[0] + np.log(masses)[None, None, :]), lin.V[0])
