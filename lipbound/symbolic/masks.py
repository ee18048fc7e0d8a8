r"""Masks and position biases: which keys a query sees, and how much the weights of a column can add up to.

Every softmax theorem of :mod:`lipbound.symbolic.theorems` reads the attention matrix P through two
numbers: a bound ``K`` on its column sums and ``Q``, the most queries a column has.  Both come from the
*weight cap*: if the scores of row i spread by at most ``omega'`` over its ``N_i`` keys,
``p_ij <= c(N_i) = 1 / (1 + (N_i - 1) e^{-omega'})``.

* **Full attention**: ``N_i = n``, ``K = n c(n) = kappa_n(omega')``, ``Q = n``.
* **Causal**: row i sees i keys, ``K = sum_{i <= n} c(i) = kappa^c_n(omega')``, ``Q = n``.
* **Causal sliding window** (query i sees keys ``i - w + 1 .. i``): ``N_i = min(i, w)``.  Column j is
  seen by queries ``j .. j + w - 1``; its t-th term ``c(min(j + t, w))`` is at most column 1's
  ``c(min(1 + t, w))`` (c decreases), and it has at most ``min(n, w)`` terms, so exactly
  ``K = kappa^c_{min(n, w)}(omega')``, ``Q = min(n, w)``: where ``kappa^c_n`` grows like ``log n``, the window
  stops it at ``log w``; ``sqrt(min(n, w))`` replaces ``sqrt(n)`` in the covariance cap.
* **Bidirectional sliding window** (``|i - j| < w``): every row has at least ``N = min(n, w)`` keys and
  every column at most ``Q = min(n, 2w - 1)`` queries, so a column sums to at most ``Q c(N)``; since
  ``Q - 1 <= 2 (N - 1)``, ``Q c(N) <= Q / (1 + (Q - 1) e^{-omega' - log 2})``: ``K = kappa_Q(omega' + log 2)``, full
  attention over ``2w - 1`` tokens with the spread raised by ``log 2`` (equal to ``Q c(N)`` for ``n >= 2w - 1``,
  and to ``kappa_n`` plus ``log 2`` for ``n <= w``); the largest column sum of the caps themselves is
  :func:`largest_cap_column` (docs/mathematics.md compares them).
* **Position biases** ``b_ij`` constant in X (T5's relative buckets, ALiBi): the score's Jacobian is
  unchanged, but a row's scores spread by ``omega + Delta_b``, ``Delta_b`` the biases' spread over a row;
  ``omega' = omega + Delta_b``.  For ALiBi, ``b_ij = -m_A |i - j|``, ``Delta_b = m_A (min(n, w) - 1)``, and the
  bias decays along the row: for a key ``t >= 1`` positions from its query, the ``t`` keys between
  them (the query included) have biases larger by ``m_A, 2 m_A, ..., t m_A``, so
  ``p_ij <= 1 / (1 + e^{m_A t - omega})``; summed over a column (``sum_{t >= 1} <= integral_0^oo``),
  ``K <= 1 + log(1 + e^omega) / m_A`` causal and ``1 + 2 log(1 + e^omega) / m_A`` bidirectional: independent of n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from .record import Described, le

__all__ = ["BIASES", "Mask", "largest_cap_column"]

#: Additive position biases: none, any relative bias constant in X (stated in its spread), ALiBi.
BIASES = ("none", "relative", "alibi")
_COLUMN = Described(r"\max_j \textstyle\sum_i p_{ij}")


@final
@dataclass(frozen=True)
class Mask:
    """Which keys each query sees (``causal``, a sliding ``window`` of width w: ``|i - j| < w``, or
    ``0 <= i - j < w`` when causal) and the additive position ``bias`` it adds."""

    causal: bool = False
    window: sp.Expr | None = None
    bias: str = "none"

    def __post_init__(self):
        if self.bias not in BIASES:
            raise AssumptionError("bias", f"one of {BIASES}", repr(self.bias), "pick none, relative or alibi")
        if self.window is not None:
            window = sp.sympify(self.window)
            if window.is_positive is not True or window.is_integer is not True:
                raise AssumptionError("window", "a positive integer (or positive integer symbol) w", repr(self.window),
                                      "give w >= 1, e.g. Mask(window=S.w) or Mask(window=4096)")
            object.__setattr__(self, "window", window)

    @property
    def tag(self) -> str:
        """``-causal-window-alibi``: the mask's part of a theorem id."""
        return ("-causal" if self.causal else "") + ("-window" if self.window is not None else "") + \
            {"none": "", "relative": "-relative-bias", "alibi": "-alibi"}[self.bias]

    def title(self) -> str:
        parts = (["causal"] if self.causal else []) + (["sliding-window"] if self.window is not None else [])
        bias = {"none": "", "relative": "relative position biases", "alibi": "ALiBi biases"}[self.bias]
        return ", ".join(part for part in (" ".join(parts) + (" mask" if parts else ""), bias) if part)

    def hypotheses(self) -> list[str]:
        out = []
        if self.window is not None:
            out.append(f"sliding window of width w = {self.window}: token i attends to the tokens j with "
                       + ("0 <= i - j < w" if self.causal else "|i - j| < w"))
        elif self.causal:
            out.append("causal mask: token i attends to tokens 1..i")
        if self.bias == "relative":
            out.append("additive position biases b_ij constant in X; over a row they spread by at most Delta_b")
        elif self.bias == "alibi":
            out.append("ALiBi: additive biases b_ij = - m_A |i - j| with slope m_A > 0")
        return out

    def keys_per_row(self, n) -> sp.Expr:
        """The fewest keys a full row has, ``min(n, w)`` under a window (``n`` without)."""
        return n if self.window is None else sp.Min(n, self.window)

    def spread(self, n) -> sp.Expr:
        """How much the biases of a row can spread: ``Delta_b``, ``m_A (min(n, w) - 1)`` for ALiBi, or 0."""
        if self.bias == "relative":
            return S.Delta_b
        if self.bias == "alibi":
            return S.m_A * (self.keys_per_row(n) - 1)
        return sp.Integer(0)

    def column_sums(self, n, omega, proof) -> tuple[sp.Expr, sp.Expr]:
        """``(K, Q)``: a bound on every column sum of P and the most queries a column has, with the steps
        recorded in ``proof``."""
        spread = self.spread(n)
        if spread != 0:
            proof.add(le(Described(r"\max_{i, j, k} |s_{ij} - s_{ik}|"), omega + spread),
                      "the position biases are constant in X: they leave the score's derivatives unchanged and "
                      "widen the spread of a row by the spread of its biases" +
                      (", -m_A times offsets 0 .. min(n, w) - 1" if self.bias == "alibi" else ""), "position-bias")
        capped = omega + spread
        rows = self.keys_per_row(n)
        if self.causal:
            K, Q = S.causal_kappa(rows, capped), rows
            why, lemma = ("row i has min(i, w) keys; column j's t-th weight is capped as column 1's, which has "
                          "at most min(n, w) queries", "causal-window-cap") if self.window is not None else \
                ("row i attends to i tokens", "causal-cap")
        elif self.window is None:
            K, Q = S.kappa(n, capped), n
            why, lemma = "each weight is at most e^omega/(e^omega + n - 1)", "weight-cap"
        else:
            Q = sp.Min(n, 2 * self.window - 1)
            K = S.kappa(Q, capped + sp.log(2))
            why, lemma = ("every row has at least min(n, w) keys and every column at most min(n, 2w - 1) queries; "
                          "min(n, 2w - 1) - 1 <= 2 (min(n, w) - 1)", "window-cap")
        proof.add(le(_COLUMN, K), why, lemma)
        if self.bias == "alibi":
            tail = 1 + (1 if self.causal else 2) * sp.log(1 + sp.exp(omega)) / S.m_A
            proof.add(le(_COLUMN, tail), "a key t positions before its query weighs at most 1/(1 + e^(m_A t - omega)); "
                      "sum over t >= 1 below the integral over t >= 0" + ("" if self.causal else ", on both sides"),
                      "alibi-columns")
            K = sp.Min(K, tail)
        return K, Q


def largest_cap_column(n: int, w: int | None, omega: float, causal: bool = False) -> float:
    """The largest column sum of the weight caps ``c(N_i) = 1 / (1 + (N_i - 1) e^{-omega})``, by brute
    force over the columns (the quantity :meth:`Mask.column_sums` bounds; for tests and the docs)."""
    width = n if w is None else w

    def keys(i: int) -> int:  # positions 1..n; window |i - j| < width (causal: 0 <= i - j < width)
        low = max(1, i - width + 1)
        high = i if causal else min(n, i + width - 1)
        return high - low + 1

    def seen_by(j: int) -> range:
        last = min(n, j + width - 1)
        return range(j, last + 1) if causal else range(max(1, j - width + 1), last + 1)

    return max(sum(1.0 / (1.0 + (keys(i) - 1) * math.exp(-omega)) for i in seen_by(j)) for j in range(1, n + 1))
