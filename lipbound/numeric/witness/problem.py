"""What a witness search maximises, and over which set: the map, its argument, and the domains.

A :class:`SearchProblem` holds the attention engine in working coordinates, the role (the
argument of the constant: self-attention, cross-attention in the queries, the context or both)
and one chart per group of rows (the m queries of cross-attention first, then the n context
tokens).  Each domain is an ellipsoid ``{c + T (S * v) : ||v|| <= 1}``
(:meth:`~lipbound.numeric.domains.TokenDomain.frame`; a ball has ``T = I``, ``S = R``).  The
engine works in coordinates ``x' = B^T (x - c)``, ``B = T U`` orthonormal with ``U`` spanning what
the projections see of ``span T`` (:class:`~lipbound.numeric.attention.AttentionMap`), where the
domain is the ellipsoid ``{x' : x'^T K^{-1} x' <= 1}``, ``K = U^T S^2 U``; the chart is
``x' = u K^{1/2}``, ``||u|| <= 1``.  Every x' of the chart lifts to a token of the domain,
``x = c + x' K^{-1} U^T S^2 T^T`` (the point of the domain that minimises ``||v||`` among those with
these coordinates), and a direction E' to the tangent direction ``E' B^T`` of the same norm.

Rows of all groups are stacked in one array of width ``k = max(k_queries, k_context)`` (the
narrower group padded with zeros, which the charts and the direction masks ignore), so the
batched ascent of :mod:`.ascent` treats every role alike.
"""

from __future__ import annotations

from typing import final

import numpy as np

from ...errors import AssumptionError
from ..attention import AttentionMap, heads_of, unit_rows
from .clock import WorkClock

__all__ = ["SearchProblem", "ROLES", "Group"]

#: The argument of the constant: self-attention, or cross-attention in the queries, the context, both.
ROLES = ("self", "cross-queries", "cross-context", "cross-joint")


@final
class Group:
    """Rows ``[start, start + count)`` of the stacked input: tokens of one domain, in ``width``
    working coordinates (``basis`` (d, width) orthonormal, None: all of R^d), with the chart matrix
    ``root = K^{1/2}`` and the lift ``x = center + x' lift^T``; ``moves``: whether the constant is
    taken in these rows."""

    def __init__(self, start: int, count: int, center: np.ndarray, basis: np.ndarray | None, tangent, axes,
                 moves: bool):
        self.rows = slice(start, start + count)
        self.count, self.center, self.basis, self.moves = count, center, basis, moves
        d = center.size
        T = np.eye(d) if tangent is None else tangent
        U = T.T @ (np.eye(d) if basis is None else basis)             # (r, width)
        K = U.T @ (axes[:, None] ** 2 * U)
        values, vectors = np.linalg.eigh(0.5 * (K + K.T))
        values = np.maximum(values, values[-1] * 1e-24)
        self.width = U.shape[1]
        self.root = (vectors * np.sqrt(values)) @ vectors.T            # K^{1/2}
        self.root_inv = (vectors / np.sqrt(values)) @ vectors.T
        self.lift = T @ (axes[:, None] ** 2 * U) @ ((vectors / values) @ vectors.T)   # (d, width)
        self.radius = float(np.sqrt(values[-1]))                       # the longest semi-axis


@final
class SearchProblem:
    """The map (a Head or a Layer), its argument (``role``) and the domains of its rows.

    Parameters
    ----------
    target : Head or Layer
    role : one of :data:`ROLES`
    domain : TokenDomain
        The tokens of self-attention, or the context of cross-attention.
    query_domain : TokenDomain
        The queries of cross-attention.
    n, m : int
        Context tokens, and queries (cross roles).
    clock : WorkClock, optional
        Charged for every evaluation (a new clock by default).
    """

    def __init__(self, target, role: str, domain, query_domain, n: int, m: int | None, clock: WorkClock | None = None):
        if role not in ROLES:
            raise AssumptionError("role", f"one of {ROLES}", repr(role), "choose the argument of the constant")
        heads = heads_of(target)[0]
        self.target, self.role, self.n = target, role, int(n)
        self.clock = WorkClock() if clock is None else clock
        self.domain, self.query_domain = domain, query_domain
        self.cross = role != "self"
        self.m = int(m) if self.cross else self.n
        if self.cross and heads[0].causal:
            raise AssumptionError("role", "'self' for a causal head (masks apply to self-attention)", repr(role),
                                  "cross-attention heads are not masked")
        d = heads[0].d
        c, T, S = domain.frame(d)
        if self.cross:
            cq, Tq, Sq = query_domain.frame(d)
            self.engine = AttentionMap(target, c, reduce=True, tangent=T, query_center=cq, query_tangent=Tq)
            self.queries = Group(0, self.m, cq, self.engine.query_basis, Tq, Sq,
                                 role in ("cross-queries", "cross-joint"))
            self.context = Group(self.m, self.n, c, self.engine.basis, T, S, role in ("cross-context", "cross-joint"))
            self.groups = (self.queries, self.context)
        else:
            self.engine = AttentionMap(target, c, reduce=True, tangent=T)
            self.queries = None
            self.context = Group(0, self.n, c, self.engine.basis, T, S, True)
            self.groups = (self.context,)
        self.width = max(g.width for g in self.groups)
        self.rows = sum(g.count for g in self.groups)
        self.mask = np.zeros((self.rows, self.width))
        for g in self.groups:
            self.mask[g.rows, :g.width] = 1.0 if g.moves else 0.0
        self.shape_mask = np.zeros((self.rows, self.width))
        for g in self.groups:
            self.shape_mask[g.rows, :g.width] = 1.0
        k = self.engine
        self.work_per_input = k.H * self.rows * (self.rows * (k.d_k + k.d_v) + self.width * (2 * k.d_k + k.d_v))
        self.clock.charge(4 * d * self.width ** 2)                 # the reduced bases and charts

    # inputs -----------------------------------------------------------------------------------
    def from_unit(self, U: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Working coordinates of chart points ``U`` (b, rows, width), ``||u|| <= 1`` per row."""
        Z = np.zeros_like(U)
        for g in self.groups:
            Z[:, g.rows, :g.width] = scale * U[:, g.rows, :g.width] @ g.root
        return Z

    def to_unit(self, Z: np.ndarray, scale: float = 1.0) -> np.ndarray:
        U = np.zeros_like(Z)
        for g in self.groups:
            U[:, g.rows, :g.width] = Z[:, g.rows, :g.width] @ g.root_inv / scale
        return U

    def random(self, rng, count: int, scale: float = 1.0) -> np.ndarray:
        """Inputs with every token on the boundary of the (scaled) domain."""
        U = rng.standard_normal((count, self.rows, self.width)) * self.shape_mask
        return self.from_unit(U / np.maximum(np.linalg.norm(U, axis=-1, keepdims=True), 1e-300), scale)

    def retract(self, Z: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Pull every token into the (scaled) domain along its chart ray."""
        U = self.to_unit(Z, scale)
        norms = np.linalg.norm(U, axis=-1, keepdims=True)
        return self.from_unit(U * np.where(norms > 1, 1 / np.where(norms > 0, norms, 1.0), 1.0), scale)

    def to_work(self, tokens: np.ndarray, queries: np.ndarray | None = None) -> np.ndarray:
        """Working coordinates of full tokens (b, n, d) (and queries (b, m, d) for cross roles)."""
        tokens = np.asarray(tokens, dtype=float)
        Z = np.zeros((tokens.shape[0], self.rows, self.width))
        Z[:, self.context.rows, :self.context.width] = self.engine.to_work(tokens)
        if self.cross:
            Z[:, self.queries.rows, :self.queries.width] = self.engine.to_work(queries, queries=True)
        return Z

    def split(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(X, Y)``: the context (or self-attention tokens) and the queries, in working coordinates."""
        X = Z[:, self.context.rows, :self.context.width]
        return (X, Z[:, self.queries.rows, :self.queries.width]) if self.cross else (X, None)

    def lift(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Full tokens of the domain (b, n, d) and queries (b, m, d) for working coordinates Z."""
        out = [g.center + Z[:, g.rows, :g.width] @ g.lift.T for g in self.groups]
        return (out[1], out[0]) if self.cross else (out[0], None)

    def lift_directions(self, E: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Tangent directions (b, n, d) and (b, m, d) of the same norm as the working directions E."""
        k = self.engine
        X = k.direction_from_work(E[:, self.context.rows, :self.context.width])
        if not self.cross:
            return X, None
        return X, k.direction_from_work(E[:, self.queries.rows, :self.queries.width], queries=True)

    # the objective ----------------------------------------------------------------------------
    def _jvp(self, lin, E):
        X, Y = self.split(E * self.mask)
        return lin.jvp(X, Y if self.cross else None)

    def _vjp(self, lin, G) -> np.ndarray:
        out = np.zeros((G.shape[0], self.rows, self.width))
        back = lin.vjp(G)
        if self.cross:
            gY, gX = back
            out[:, self.queries.rows, :self.queries.width] = gY
            out[:, self.context.rows, :self.context.width] = gX
        else:
            out[:, :, :self.context.width] = back
        return out

    def linearize(self, Z: np.ndarray):
        X, Y = self.split(Z)
        return self.engine.linearize(X, Y)

    def evaluate(self, Z: np.ndarray, E: np.ndarray, steps: int):
        """``(sigma, E, grad)``: power iteration warm-started at E (masked to the moving rows) and
        ``grad_Z sigma`` (envelope theorem: ``grad_Z <G, Df(Z)[E]>`` at ``G = Df[E] / sigma``);
        charges :attr:`clock`."""
        self.clock.charge_steps(len(Z), steps + (3 if not self.cross else 5), self.work_per_input)
        lin = self.linearize(Z)
        if not self.cross:
            sigma, E, JE = lin.top_singular(E[..., :self.context.width], steps)
            grad = lin.curvature(E, JE / np.maximum(sigma, 1e-300)[:, None, None])
            return sigma, E, grad
        E = unit_rows(E * self.mask)
        for _ in range(steps):
            E = unit_rows(self._vjp(lin, self._jvp(lin, E)) * self.mask)
        JE = self._jvp(lin, E)
        sigma = np.sqrt(np.einsum("bij,bij->b", JE, JE))
        G = JE / np.maximum(sigma, 1e-300)[:, None, None]
        # grad_Z <G, Df(Z)[E]> = (Df(Z + hE)^T G - Df(Z - hE)^T G) / 2h (symmetry of the Hessian of <G, f>)
        size = np.sqrt((Z * Z).sum(axis=(1, 2), keepdims=True)) + 1.0
        h = 1e-5 * size
        plus = self._vjp(self.linearize(Z + h * E * self.mask), G)
        minus = self._vjp(self.linearize(Z - h * E * self.mask), G)
        return sigma, E, (plus - minus) / (2 * h) * self.shape_mask

    def sigma(self, Z: np.ndarray, seed: int = 0, steps: int = 20) -> tuple[np.ndarray, np.ndarray]:
        """Local Jacobian norms (lower bounds) and directions at a batch of inputs."""
        rng = np.random.default_rng(seed)
        sigma, E, _ = self.evaluate(Z, rng.standard_normal(Z.shape) * self.mask, steps)
        return sigma, E

    # one head of a layer ---------------------------------------------------------------------------
    def for_head(self, h: int) -> SearchProblem:
        """Self-attention of head h alone on the same domain (its own reduced chart)."""
        return SearchProblem(self.engine.heads[h], "self", self.domain, None, self.n, None, self.clock)
