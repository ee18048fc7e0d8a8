"""``sup_U ||DF(Y)||`` of an attention layer with its heads taken together: one operator norm for the sum of heads.

:meth:`~lipbound.local.jacobian_forms.JacobianSpread.supremum` bounds each head's value, query and key paths by
their own operator norms and adds the 36 numbers (12 heads): on MiniLM's layer 0 at 1e-1 R the heads' worst
points found by ascent add to about 46 where the layer's is about 5, so most of the sum is heads whose worst cases
lie at different points of U and act on different directions.  Here every path of every head gets a bilinear bound
through two quadratic forms (lemma ``jacobian-heads-joint``, docs/mathematics.md):

    |<F, D_k(E)>| <= gamma_k (tr E S_k E^T)^(1/2) (tr F T_k F^T)^(1/2)            for all E, F (n, d) and Y in U,

with PSD ``S_k``, ``T_k`` (d, d) that do not depend on Y, and then, for any ``t_k > 0`` (Cauchy-Schwarz twice),

    ||DF(Y) - I||_2 <= sum_k gamma_k (...)(...) <= ||sum_k t_k gamma_k S_k||^(1/2) ||sum_k gamma_k T_k / t_k||^(1/2).

Heads that read and write different directions then add up in squares, not in norms.  The forms of head h
(``c`` the score scale, ``a_j = W_Q k_j^T``, ``u_j = v_j W_O^h``, ``b_i = W_K q_i^T``, ``G = W_Q W_K^T``,
``A = W_V W_O^h``, all at X; ``C_a``, ``C_u`` the rows ``a_j``, ``u_j`` less a fixed centre; any ``r > 0``):

* value path ``P' E A``: ``gamma = ||P'||_2 <= (max_j sum_i p'_ij)^(1/2)``, ``S = W_V W_V^T``, ``T = W_O^hT W_O^h``;
* query path, row i ``c e_i W_Q K'^T J'_i V' W_O^h``: ``x^T W_Q K'^T J'_i V' W_O^h y`` is the covariance under
  ``p'_i`` of ``x . a'_j`` and ``y . u'_j``; a variable's variance is at most a quarter of its squared range, the
  range of ``x . a_j`` is at most ``2^(1/2) ||C_a x||`` and that of ``x . (a'_j - a_j)`` at most
  ``2^(1/2) eps ||x G||`` (``||y_j - x_j||^2 + ||y_l - x_l||^2 <= eps^2``), so
  ``Var(x . a') <= x^T ((1 + r) C_a^T C_a + (1 + 1/r) eps^2 G G^T) x / 2``: ``gamma = c``, ``S`` that, ``T`` the
  same of ``u`` (``C_u^T C_u`` and ``eps^2 A^T A``).  The spreads' halves ``C_a^T C_a / 2`` and ``C_u^T C_u / 2``
  are replaced by covering forms (:func:`_covering`, lemma ``jacobian-heads-covering``), which pay only the widest
  pair's half range and not the sum over the keys;
* key path, row i ``c (E b'_i)^T J'_i V' W_O^h``: the covariance of ``e_j . b'_i`` and ``f_i . u'_j`` under
  ``p'_i``; a variance is at most ``sum_j p'_ij z_j^2`` and at most a quarter of the squared range, so at most
  ``(z_j^2 + z_l^2) / 2 <= sum_j z_j^2 / 2``; with ``b'_i - b_i = (y_i - x_i) G`` and ``p'_ij <= max_j p^+_ij``:
  ``gamma = c``, ``S = (1 + r) sum_i w_i b_i^T b_i + (1 + 1/r) eps^2 G^T G / 2`` with ``w_i = min(max_j p^+_ij,
  1/2)``, ``T`` the query path's.

Every matrix is an outward-rounded enclosure (the keys, values and queries at X enclosed, the weights exact
floats); the two top eigenvalues are certified (:func:`~lipbound.rigorous.linalg.lambda_max_upper_large`).
The ``t_k`` and ``r`` are floats chosen to balance the two sides (any positive values give a bound).  The bound is
theorem ``local-jacobian-heads-joint`` (:mod:`lipbound.symbolic.local_jacobian`).
"""

from __future__ import annotations

from typing import final

import numpy as np

from ..numeric.model import Layer
from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import Enclosure, lambda_max_upper_large, lambda_min_lower
from ..symbolic.local_jacobian import heads_joint
from .bounds import evaluate_theorem
from .enclosed import EnclosedAttention

__all__ = ["JointHeads"]

#: the covering forms' ridge lambda, as a share of the largest eigenvalue of the rows' Gram matrix (any lambda > 0
#: is sound; lemma jacobian-heads-covering): on MiniLM's layer 0 at 1e-1 R around "The cat sat on the mat." the
#: heads joined come to 109.6 through the Gram forms, 94.2 / 91.1 / 98.7 through covering forms of share 0 / 0.1 / 1
COVER_RIDGE = 0.1
#: ``1 - s^2`` in the certificate ``M >= s^2 N^(-1)`` of a float inverse M of N: room for its rounding
COVER_SLACK = 1e-4


def _gram(rows: Enclosure) -> Enclosure:
    """``R^T R`` (exactly symmetric enclosure)."""
    return (rows.T @ rows).sym()


def _sandwich(outer: Enclosure, inner: Enclosure) -> Enclosure:
    """``L (M^T M) L^T`` for ``L = outer`` (d, k) and ``M = inner`` (m, k): the Gram of ``M L^T`` through the small
    ``k x k`` middle (products of inner dimension k instead of d)."""
    return (outer @ _gram(inner) @ outer.T).sym()


def _centred(rows: IntervalArray) -> Enclosure:
    """The rows less their float mean (any fixed centre: ranges and variances do not see it)."""
    enclosed = rows - IntervalArray(np.mean(rows.to_enclosure().mid, axis=0))
    return enclosed.to_enclosure()


def _covering(rows: Enclosure) -> Enclosure:
    """A PSD form S (d, d) with ``x^T S x >= max_{j,l} (x . (r_j - r_l))^2 / 4`` for every x, ``rows`` (n, d) the
    points r_j less any centre (lemma ``jacobian-heads-covering``): ``S = mu C^T M C`` with C the rows,
    ``N = C C^T + lambda I`` (n, n), M a float inverse of N certified to satisfy ``M >= s^2 N^(-1)`` (M positive
    definite and ``M N M - s^2 M`` PSD) and ``mu >= max_{j<l} (||r_j - r_l||^2 + 2 lambda) / (4 s^2)``.

    Its top eigenvalue is at most ``(max_{j<l} ||r_j - r_l||^2 + 2 lambda) / 4`` where the Gram form ``C^T C / 2``
    (the same inequality through ``range^2 <= 2 sum_j (x . r_j)^2``) has ``lambda_max(C C^T) / 2``; the Gram form is
    returned where the certificate fails."""
    n = rows.shape[0]
    gram = (rows @ rows.T).sym()
    ridge = COVER_RIDGE * float(np.linalg.eigvalsh(gram.mid)[-1]) if n > 1 else 0.0
    if not ridge > 0:
        return _gram(rows).scale(0.5)
    N = gram + Enclosure.exact(ridge * np.eye(n))
    inverse = np.linalg.inv(N.mid)
    M = Enclosure.exact((inverse + inverse.T) / 2)
    s2 = 1.0 - COVER_SLACK
    if not (lambda_min_lower(M) > 0 and lambda_min_lower((M @ N @ M - M.scale(s2)).sym()) >= 0):
        return _gram(rows).scale(0.5)
    first, second = np.triu_indices(n, 1)
    pairs = np.zeros((len(first), n))
    pairs[np.arange(len(first)), first], pairs[np.arange(len(first)), second] = 1.0, -1.0
    P = Enclosure.exact(pairs)
    spans = IntervalArray.from_enclosure((P @ N).hadamard(P) @ Enclosure.exact(np.ones(n)))   # d^T N d per pair
    mu = IntervalArray(float(np.max(spans.hi))) / (IntervalArray(4.0) * IntervalArray(s2))
    return (rows.T @ M @ rows).sym().scale(float(mu.hi))


def _estimate(S: Enclosure, steps: int = 30) -> float:
    """A float estimate of ``||S||`` for a PSD midpoint by power iteration from a fixed start (chooses weights only,
    never decides a bound; a full eigendecomposition per term cost most of the route)."""
    if not S.mid.size or not np.any(S.mid):
        return 0.0
    x = np.abs(S.mid).sum(axis=0) + 1.0
    value = 0.0
    for _ in range(steps):
        y = S.mid @ x
        value = float(np.linalg.norm(y))
        if value == 0.0:
            return 0.0
        x = y / value
    return value


def _balanced(first: Enclosure, second: Enclosure, eps2: float) -> Enclosure:
    """``(1 + r) first + (1 + 1/r) eps2 second`` with ``r = (eps2 ||second|| / ||first||)^(1/2)``, which makes
    ``(x^T first x)^(1/2) + (eps2 x^T second x)^(1/2)`` at most its square root for every x."""
    a, b = _estimate(first), eps2 * _estimate(second)
    if b <= 0:
        return first
    if a <= 0:
        return second.scale(float(IntervalArray(eps2).hi))
    r = float(np.sqrt(b / a))
    up = IntervalArray(1.0) + IntervalArray(r)
    down = (IntervalArray(1.0) + IntervalArray(1.0) / IntervalArray(r)) * IntervalArray(eps2)
    return first.scale(float(up.hi)) + second.scale(float(down.hi))


@final
class JointHeads:
    """The quadratic forms of lemma ``jacobian-heads-joint`` for an attention layer at X (module docstring).

    Parameters
    ----------
    target : Layer
        Covered by :func:`lipbound.local.relational.covers` (dot-product softmax heads, no masks or rotations,
        output projection and residual).
    E : EnclosedAttention
        The layer at X.

    The parts that do not depend on the radius are formed here once (per head, (d, d) enclosures):
    ``W_V W_V^T``, ``W_O^hT W_O^h``, ``C_a^T C_a / 2``, ``G G^T / 2``, ``C_u^T C_u / 2``, ``A^T A / 2``, ``G^T G / 2``
    and the rows ``b_i``; :meth:`terms` adds the radius and the weights on U, :meth:`supremum` joins them.
    """

    def __init__(self, target: Layer, E: EnclosedAttention):
        engine = E.engine
        self.H, self.n = engine.H, E.n
        self.c = float(E.c.hi)
        half = 0.5
        self.heads = []
        for h in range(engine.H):
            W_Q, W_K, W_V = (Enclosure.exact(M) for M in engine.head_weights(h)[:3])
            W_O = Enclosure.exact(target.output_block(h))
            # G = W_Q W_K^T and A = W_V W_O^h (d, d) enter only through their Gram matrices, formed through
            # the heads' own width
            keys = _centred(E.K[h].matmul(engine.head_weights(h)[0].T))  # a_j = W_Q k_j^T, less a centre
            values = _centred(E.V[h].matmul(target.output_block(h)))     # u_j = v_j W_O^h, less a centre
            self.heads.append({
                "values_in": _gram(W_V.T), "out": _gram(W_O),
                "keys": _covering(keys), "keys_moved": _sandwich(W_Q, W_K).scale(half),      # G G^T / 2
                "values": _covering(values), "values_moved": _sandwich(W_O.T, W_V).scale(half),  # A^T A / 2
                "queries_moved": _sandwich(W_K, W_Q).scale(half),                                      # G^T G / 2
                "b": E.norms.w[h, :, 0, :].to_enclosure()})

    def terms(self, eps: float, weights: IntervalArray) -> list[tuple[str, int, float, Enclosure, Enclosure]]:
        """``(path, head, gamma, S, T)`` for every path of every head on ``U(X, eps)``, ``weights`` every attention
        weight on U (H, n, n): ``|<F, D(E)>| <= gamma (tr E S E^T)^(1/2) (tr F T F^T)^(1/2)`` (module docstring)."""
        eps2 = float((IntervalArray(float(eps)) * IntervalArray(float(eps))).hi)
        hi = np.clip(weights.hi, 0.0, 1.0)
        column_sums = IntervalArray(hi).sum(axis=-2).hi                  # sum_i p'_ij <= this, (H, n)
        out = []
        for h, parts in enumerate(self.heads):
            spread = float(IntervalArray(np.max(column_sums[h])).sqrt().hi)
            values = _balanced(parts["values"], parts["values_moved"], eps2)
            out.append(("value", h, spread, parts["values_in"], parts["out"]))
            out.append(("query", h, self.c, _balanced(parts["keys"], parts["keys_moved"], eps2), values))
            share = np.minimum(np.max(hi[h], axis=-1), 0.5)              # w_i >= p'_ij for every j, or the range
            b = parts["b"]
            weighted = b.hadamard(Enclosure.exact(share[:, None]))
            rows = (b.T @ weighted).sym()                                # sum_i w_i b_i^T b_i (PSD part)
            out.append(("key", h, self.c, _balanced(rows, parts["queries_moved"], eps2), values))
        return out

    @staticmethod
    def tops(terms) -> tuple[float, float]:
        """``(lambda_S, lambda_T)``, certified upper bounds on ``||sum_k t_k gamma_k S_k||`` and ``||sum_k gamma_k T_k /
        t_k||`` with ``t_k = (||T_k|| / ||S_k||)^(1/2)`` (each term then counts ``gamma_k (||S_k|| ||T_k||)^(1/2)`` at
        most)."""
        left = right = None
        for _, _, gamma, S, T in terms:
            s, t = _estimate(S), _estimate(T)
            if s <= 0 or t <= 0 or gamma <= 0:
                continue
            balance = IntervalArray(float(np.sqrt(t / s)))
            g = IntervalArray(float(gamma))
            a, b = float((g * balance).hi), float((g / balance).hi)     # a b >= gamma^2: both rounded up
            left = S.scale(a) if left is None else left + S.scale(a)
            right = T.scale(b) if right is None else right + T.scale(b)
        if left is None:
            return 0.0, 0.0
        return max(lambda_max_upper_large(left.sym()), 0.0), max(lambda_max_upper_large(right.sym()), 0.0)

    @classmethod
    def join(cls, terms) -> float:
        """``lambda_S^(1/2) lambda_T^(1/2)`` of :meth:`tops`, rounded up: a bound on ``||DF(Y) - I||_2`` on U."""
        lam_s, lam_t = cls.tops(terms)
        return float((IntervalArray(lam_s) * IntervalArray(lam_t)).sqrt().hi)

    def supremum(self, eps: float, weights: IntervalArray) -> float:
        """``sup_{U(X, eps)} ||DF(Y)||_2 <= 1 + lambda_S^(1/2) lambda_T^(1/2)`` (theorem
        ``local-jacobian-heads-joint``: the residual's identity plus the heads' paths joined)."""
        lam_s, lam_t = self.tops(self.terms(eps, weights))
        return float(evaluate_theorem(heads_joint(), **{r"\lambda_S": np.float64(lam_s),
                                                        r"\lambda_T": np.float64(lam_t)}))
