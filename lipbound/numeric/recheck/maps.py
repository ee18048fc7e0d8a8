"""One head and one map (a head, or a layer with ``W_O`` and maybe its residual) at an exact input:
exact projections, interval scores (:mod:`.scores`), masks, weights, the forward pass and the JVP."""

from __future__ import annotations

from typing import final

import numpy as np

from ...errors import AssumptionError
from ...rigorous.functions import tanh as interval_tanh
from ...rigorous.intervals import IV
from ..model import Head, Layer
from .exact import Ball, Dyadic, concat
from .scores import score_check

__all__ = ["HeadCheck", "MapCheck", "softmax_row", "softmax_tangent"]


def _visible(mask, i: int, j: int) -> bool:
    """Whether query i sees key j (positions 0..m-1 and 0..n-1)."""
    return (not mask.causal or j <= i) and (mask.window is None or abs(i - j) < mask.window)


@final
class HeadCheck:
    """Exact projections and interval attention weights of one head at one input (positions
    0..m-1 for queries and 0..n-1 for keys)."""

    def __init__(self, head: Head, X: Dyadic, weights: dict, queries: Dyadic | None = None):
        self.head, self.d_k = head, head.d_k
        self.n = X.shape[0]
        self.cross = queries is not None
        self.m = queries.shape[0] if self.cross else self.n
        W_Q, W_K, W_V, b_Q, b_K, b_V = (weights["W_Q"], weights["W_K"], weights["W_V"], weights["b_Q"], weights["b_K"],
                                        weights["b_V"])
        self.weights = weights
        self.Q = (queries if self.cross else X) @ W_Q + _row(b_Q, self.m)
        self.K = X @ W_K + _row(b_K, self.n)
        self.V = X @ W_V + _row(b_V, self.n)
        self.score = score_check(head.kernel, self)
        self.S, self.slope = self._masked(self.score.S)
        self.sigmoid = not head.kernel.weights().normalised
        self.P = self._sigmoid(self.S) if self.sigmoid else self._softmax(self.S)

    def _masked(self, S: np.ndarray):
        """Soft-cap, position bias; ``(scores, soft-cap slopes or None)``; hidden keys are skipped by the weights."""
        mask = self.head.mask
        slope = None
        if mask.softcap is not None:
            cap = IV.mpf(mask.softcap)
            squashed = np.array([[interval_tanh(s / cap) for s in row] for row in S], dtype=object)
            S, slope = squashed * cap, 1 - squashed * squashed
        if mask.bias is not None:
            S = S + np.vectorize(IV.mpf, otypes=[object])(mask.bias.matrix(np.arange(self.m), np.arange(self.n)))
        return S, slope

    def _keys(self, i: int):
        return [j for j in range(self.n) if _visible(self.head.mask, i, j)]

    def _softmax(self, S: np.ndarray) -> np.ndarray:
        P = np.empty((self.m, self.n), dtype=object)
        for i in range(self.m):
            keys = self._keys(i)
            weights = dict(zip(keys, softmax_row([S[i, j] for j in keys])))
            for j in range(self.n):
                P[i, j] = weights.get(j, IV.mpf(0))
        return P

    def _sigmoid(self, S: np.ndarray) -> np.ndarray:
        bias = -IV.log(IV.mpf(self.n)) if self.head.kernel.bias is None else IV.mpf(self.head.kernel.bias)
        P = np.empty((self.m, self.n), dtype=object)
        for i in range(self.m):
            keys = set(self._keys(i))
            for j in range(self.n):
                P[i, j] = 1 / (1 + IV.exp(-(S[i, j] + bias))) if j in keys else IV.mpf(0)
        return P

    def score_jvp(self, E: Dyadic, EQ: Dyadic | None = None) -> tuple[np.ndarray, Dyadic]:
        """``(dS, dV)``: the derivative of the masked scores (intervals) and the value tangent ``E W_V``
        (exact); ``EQ`` moves the queries of cross-attention (None: they stay)."""
        w = self.weights
        dK, dV = E @ w["W_K"], E @ w["W_V"]
        if not self.cross:
            dQ = E @ w["W_Q"]
        elif EQ is not None:
            dQ = EQ @ w["W_Q"]
        else:
            dQ = Dyadic(np.zeros(self.Q.shape, dtype=object), 0)
        dS = self.score.jvp(dQ, dK)
        return (dS if self.slope is None else dS * self.slope), dV

    def forward(self) -> Ball:
        """``f(X) = P V`` (n, d_v)."""
        return Ball.of_intervals(self.P).matmul_exact(self.V)

    def jvp(self, E: Dyadic, EQ: Dyadic | None = None) -> Ball:
        """``Df(X)[E] = dP V + P dV`` with ``dP = P o (dS - rowsum(P o dS))`` (softmax) or
        ``dP = P (1 - P) dS`` (sigmoid)."""
        dS, dV = self.score_jvp(E, EQ)
        P = self.P
        dP = P * (1 - P) * dS if self.sigmoid else softmax_tangent(P, dS)
        return Ball.of_intervals(dP).matmul_exact(self.V) + Ball.of_intervals(P).matmul_exact(dV)


def softmax_row(scores: list) -> list:
    """Interval softmax of one row of scores (shifted by the largest midpoint; empty for no keys)."""
    if not scores:
        return []
    shift = max(scores, key=lambda x: x.mid).mid
    exps = [IV.exp(s - shift) for s in scores]
    total = IV.fsum(exps)
    return [x / total for x in exps]


def softmax_tangent(P: np.ndarray, dS: np.ndarray) -> np.ndarray:
    """``dP = P o (dS - rowsum(P o dS))``, the softmax rows' derivative along the score change dS."""
    mean = np.array([IV.fsum(p * ds for p, ds in zip(P[i], dS[i])) for i in range(P.shape[0])], dtype=object)
    return P * (dS - mean[:, None])


def _row(bias: Dyadic, n: int) -> Dyadic:
    return Dyadic(np.broadcast_to(bias.m, (n,) + bias.shape).copy(), bias.e)


def exact_weights(head: Head) -> dict:
    """The head's floats as exact dyadics; ``W_V`` is the value matrix the head applies
    (:attr:`Head.V`, which goes through ``A`` for Kim et al.'s L2 values)."""
    weights = {key: Dyadic.of(getattr(head, key)) for key in ("W_Q", "W_K", "b_Q", "b_K", "b_V")}
    weights["W_V"] = Dyadic.of(head.V)
    return weights


@final
class MapCheck:
    """The map named by a witness (one head, or a layer with ``W_O`` and maybe the residual)."""

    def __init__(self, target: Head | Layer):
        self.target = target
        if isinstance(target, Head):
            self.heads, self.W_O, self.residual = (target,), None, False
        else:
            self.heads, self.W_O, self.residual = tuple(target.heads), Dyadic.of(target.W_O), bool(target.residual)
        self.weights = [exact_weights(h) for h in self.heads]

    def _combine(self, parts: list[Ball], identity: Dyadic) -> Ball:
        if self.W_O is None:
            return parts[0]
        merged = Ball(concat([p.center for p in parts], axis=1), np.concatenate([p.radius for p in parts], axis=1))
        out = merged.matmul_exact(self.W_O)
        return out + Ball.exact(identity) if self.residual else out

    def forward_difference(self, X: Dyadic, Y: Dyadic) -> Ball:
        """``F(X) - F(Y)``: the output bias cancels exactly."""
        parts = []
        for head, weights in zip(self.heads, self.weights):
            parts.append(HeadCheck(head, X, weights).forward() - HeadCheck(head, Y, weights).forward())
        return self._combine(parts, X - Y)

    def jvp(self, X: Dyadic, E: Dyadic, queries: Dyadic | None = None, EQ: Dyadic | None = None) -> Ball:
        """``Df[E]`` (self-attention) or ``Df(Q, X)[EQ, E]`` (cross-attention: ``queries`` given)."""
        if queries is not None and self.residual:
            raise AssumptionError("head_or_layer", "a map without the residual for cross-attention", "residual=True",
                                  "re-check the cross-attention layer itself")
        parts = [HeadCheck(head, X, weights, queries).jvp(E, EQ) for head, weights in zip(self.heads, self.weights)]
        return self._combine(parts, E)
