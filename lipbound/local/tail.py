"""A whole layer split at its attention's output: the attention, then the maps that act token by token.

A block ``F = T o A`` is the attention layer A (with its residual) followed, at every token, by
``T = LN_out o (id + FFN) o LN_att``, whose Jacobian at token i is ``T_i = J_1 J_F J_2`` (row convention).
With ``DF(Y) - DF(X) = diag(T_i(A(X))) (DA(Y) - DA(X)) + diag(T_i(A(Y)) - T_i(A(X))) DA(Y)`` (theorem
local-attention-tail),

    sup_U ||DF(Y) - DF(X)|| <= tau var_U(A) + omega Lip_U(A),

``var_U(A)`` and ``Lip_U(A)`` the attention's own certified variation and constant on U, ``tau = max_i
||T_i(A(X))||`` and ``omega`` a bound on ``max_i ||T_i(z) - T_i(A(X)_i)||`` over the token balls that hold
``A(U)``.  For ``omega`` the smaller of two bounds counts, per token: the telescoping sum of the three maps'
bounds (theorem local-chain), and the same with both LayerNorms' Jacobians at the centre folded into the
feed-forward block's second derivative (theorem local-block-tail), which keeps the LayerNorms' projection
and scales apart from the directions the feed-forward weights read (about nine times smaller than the
product of their norms on MiniLM's blocks); the change of the feed-forward Jacobian seen through the first
LayerNorm, ``J_1 Delta J_F``, is folded the same way (theorem local-feedforward-front).  Both take the
output LayerNorm on balls whose radius follows the mean Jacobian of the first two maps (``||J_1 J_F||`` at
the centre plus its variation) instead of the product of their suprema.
"""

from __future__ import annotations

import math

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import Enclosure, lambda_max_upper_large, spectral_norm_upper_large
from ..symbolic import local as T
from .balls import TokenBalls
from .bounds import evaluate_theorem, norm_bounds, remainder_weights, replace_split, third_derivative_roots
from .chains import telescoped_variation
from .enclosed import feedforward_grams, trilinear_norm
from .folded_reach import FoldedFeedForward
from .grouped import token_tail

__all__ = ["BlockTail", "TokenTail", "weighted_tail_variation", "weighted_tail_reach", "column_block_norms",
           "token_reach"]

#: rows of the attention's Jacobian scaled at a time by :func:`_columns_scaled_norm`
SCALED_ROWS = 256
#: bytes of a block's ``A^T A`` and ``B B^T`` enclosures (the slopes' quadratic remainder reads them at every radius)
#: kept from the set-up, token by token while they fit; the other tokens' are formed again at each radius (MiniLM:
#: 75 MB a token, so 10 of 20 tokens: about 0.8 CPU s a token and radius for 0.75 GB, where the block's relational
#: route at n = 20 peaks)
KEPT_GRAM_BYTES = 750_000_000
#: a token's slopes' remainder is refined (lemma slope-remainder-quadratic) when its split terms are at least this
#: share of the token's bound
REFINE_SHARE = 0.01


def _folded_grams(A: IntervalArray, B: IntervalArray) -> tuple[IntervalArray, IntervalArray]:
    """``(A^T A, B B^T)`` (d_ff, d_ff) of a token's folded weights ``A = J_1 W_1`` (d, d_ff) and ``B = W_2 J_2`` (d_ff,
    d) (:meth:`BlockTail._token_facts`)."""
    return A.swapaxes(0, 1).bmm(A), B.bmm(B.swapaxes(0, 1))


class BlockTail:
    """The per-token maps of one block at its centre (module docstring).

    Parameters
    ----------
    enclosed : list
        The block's four enclosures at the float centres: attention, LayerNorm, feed-forward block,
        LayerNorm.
    """

    def __init__(self, enclosed):
        self.ln_1, self.ffn, self.ln_2 = enclosed[1], enclosed[2], enclosed[3]
        self.taus = _tail_norms(enclosed)
        self.tau = float(np.max(self.taus))
        # radius-free: formed with the curve's set-up, not by its first radius
        self._facts: list = []
        facts, kept = self._facts, 0
        for i in range(self.taus.shape[0]):
            fact = self._token_facts(i)
            size = sum(fact[key].lo.nbytes + fact[key].hi.nbytes for key in ("a_gram", "b_gram"))
            if kept + size > KEPT_GRAM_BYTES:   # past the budget: formed again at each radius
                del fact["a_gram"], fact["b_gram"]
            else:
                kept += size
            facts.append(fact)
        # (the folded weights read the facts' list, not the tail: a tail in a reference cycle is freed only by a full
        # collection, and its facts hold 19 MB a token of MiniLM and the grams kept, 1.1 GB a block at n = 20)
        self.folded = FoldedFeedForward(self.ffn, lambda i: facts[i]["A"])

    def _token(self, i: int) -> dict:
        """Radius-free facts of token i (:meth:`_token_facts`), formed with the tail."""
        return self._facts[i]

    def _token_facts(self, i: int) -> dict:
        """Radius-free facts of token i: the folded weights ``J_1 W_1`` and ``W_2 J_2``, the second-derivative
        bounds (e-side folded or not; b-side ``r_k J_2`` or ``r_k``) and ``||J_1 J_F||``, all certified."""
        ffn = self.ffn.ffn
        J_1, J_2 = self.ln_1.jacobian_block(i), self.ln_2.jacobian_block(i)
        A = J_1.matmul(ffn.W_1)                                                    # (d, d_ff): columns J_1 w_k
        B = IntervalArray(ffn.W_2).bmm(J_2)                                        # (d_ff, d): rows r_k J_2
        a_gram, b_gram = _folded_grams(A, B)
        plain, plain_b = feedforward_grams(ffn)                                   # W_1^T W_1, W_2 W_2^T
        W_2 = IntervalArray(ffn.W_2)
        g = self.ffn.curvature[i]
        squared = a_gram * a_gram                                                  # in "full" and "Lambda_10"
        return {
            "A": A, "B": B, "a_gram": a_gram, "b_gram": b_gram,   # (the grams: kept within KEPT_GRAM_BYTES)
            "full": trilinear_norm(g, A, B, a_gram, hadamards=(a_gram * b_gram, squared)),
            "mixed": trilinear_norm(g, A, B, plain, a_gram, b_gram),
            "Lambda_10": trilinear_norm(g, A, W_2, a_gram, hadamards=(a_gram * plain_b, squared)),  # J_1 Delta J_F
            "front": spectral_norm_upper_large(J_1.einsum("ab,bc->ac", self.ffn.jacobian_block(i)).to_enclosure())}

    def omega_tokens(self, M: list, V: list, N: list, radii: list, rounding: np.ndarray,
                     floors: list | None = None) -> tuple:
        """Per token, the two bounds on ``sup ||T_i(z) - T_i(A(X)_i)||`` on one neighbourhood: telescoped and
        folded.  ``M``, ``V``, ``N`` are the chain's per-token block-norm matrices (the attention first, then
        the three maps; diagonal for these), ``radii`` the token balls' radii before each map, ``rounding``
        the rounding radii of the chain's float centres (one array per map's input), ``floors`` (optional) the
        balls' floors of the centred norm (one array or None per map's input; lemma centred-floor).

        The slopes' remainder is then taken through the quadratic split folded behind the first LayerNorm (lemma
        slope-remainder-folded, three certified ``m x m`` eigenvalue bounds per token) at every token where it can
        lower the bound by a hundredth or more."""
        n = V[1].shape[0]
        M, V, folded_change = self._on_folded_reach(M, V, radii, rounding)
        splits = self.remainder_splits(radii)
        quadratic: dict = {}
        telescoped = None
        for _ in range(2):   # the bounds, then again with the remainders refined where that is worth it
            change, _ = self.feedforward_change(V, N, radii, rounding, splits, quadratic)
            change = np.minimum(change, folded_change)
            M_2, V_2 = self._output_norm_on_tighter_balls(M, V, radii, rounding, change,
                                                          None if floors is None else floors[3])
            if telescoped is None:
                telescoped = np.diag(telescoped_variation(M[1:3] + [M_2], V[1:3] + [V_2], N[1:], np.arange(n)))
            folded = np.array([self._folded_bound(i, V[1][i, i], M[2][i, i], M_2[i, i], V_2[i, i], change[i],
                                                  radii[1][i], rounding[2][i], splits[i], quadratic.get(i))
                               for i in range(n)])
            if quadratic:
                break
            bound = np.minimum(telescoped, folded)
            # every token's omega counts in theorem local-attention-tail-weighted, not only the largest; a
            # remainder below a hundredth of the token's bound cannot lower it by more: not worth the eigenvalues
            for i in range(n):
                finite = np.isfinite(bound[i]) and np.isfinite(radii[2][i]) and np.all(np.isfinite(splits[i]))
                if finite and splits[i][0] * (splits[i][1] + splits[i][2]) >= REFINE_SHARE * bound[i]:
                    near = (radii[1][i], (IntervalArray(V[1][i, i]) * IntervalArray(radii[1][i])
                                          + IntervalArray(rounding[2][i])).hi.item())
                    quadratic[i] = self.quadratic_remainder(i, radii[2][i], near)
            if not quadratic:
                break
        return telescoped, folded

    def _on_folded_reach(self, M: list, V: list, radii: list, rounding: list | np.ndarray) -> tuple:
        """``M`` and ``V`` with the feed-forward block's entries replaced by the smaller bounds on the image of each
        token's ball through the first LayerNorm (:class:`~lipbound.local.folded_reach.FoldedFeedForward`), and the
        change ``K`` seen through that LayerNorm on the same sets (inf where not formed)."""
        n = V[1].shape[0]
        M, V = list(M), list(V)
        M[2], V[2] = np.array(M[2], dtype=np.float64), np.array(V[2], dtype=np.float64)
        change = np.full(n, np.inf)
        at_centre = self.ffn.jacobian_norms()
        for i in range(n):
            if not V[2][i, i] > at_centre[i]:   # (decides work only) the slopes barely move: the chain's bounds stand
                continue
            delta = (IntervalArray(V[1][i, i]) * IntervalArray(radii[1][i]) + IntervalArray(rounding[2][i])).hi.item()
            found = self.folded.bounds(i, radii[1][i], delta, radii[2][i])
            M[2][i, i], V[2][i, i] = min(M[2][i, i], found["lipschitz"]), min(V[2][i, i], found["variation"])
            change[i] = found["change"]
        return M, V, change

    def _folded_bound(self, i: int, V_1, M_F, M_2, V_2, change, r, rho, split: tuple, quadratic) -> float:
        """Theorem local-block-tail at token i; with ``quadratic`` (:meth:`quadratic_remainder`) its split term
        ``a b`` replaced by the smaller of the two (an upper bound of the rest is the value less a lower bound of
        ``a b``)."""
        facts = self._token(i)
        values = {"V_1": V_1, "V_2": V_2, "M_F": M_F, "M_2": M_2, r"\sup \|J_1 \Delta J_F\|": change,
                  r"\|J_1 J_F\|": facts["front"], "r": r, r"\rho": rho,
                  r"\Lambda_{11}^{1/2}": facts["full"], r"\Lambda_{1}^{1/2}": facts["mixed"],
                  r"\|\operatorname{diag}(t)^{1/2} (J_1 W_1)^\top\|": split[0],
                  r"\|\operatorname{diag}(t)^{1/2} W_2 J_2\|": split[1]}
        value = float(evaluate_theorem(T.block_tail_variation(),
                                       **{key: np.float64(v) for key, v in values.items()}))
        return value if quadratic is None else replace_split(value, split[0], split[1], quadratic[0])

    def quadratic_remainder(self, i: int, radius: float, near: tuple) -> tuple[float, float]:
        """Bounds on ``sup ||(J_1 W_1) diag(rho) (W_2 J_2)||`` and ``sup ||(J_1 W_1) diag(rho) W_2||`` at token i over
        the feed-forward ball of ``radius`` (lemmas slope-remainder-quadratic and slope-remainder-folded): ``rho_k =
        GELU'(h_k + e.w_k) - GELU'(h_k) - g_k (e.w_k)`` is at most ``S_k (e.w_k)^2 / 2`` (``S_k`` at least GELU's third
        derivative on the interval of ``h_k``), and Cauchy-Schwarz over the neurons pays ``(e.w_k)^2`` jointly, not
        ``||w_k|| R`` per neuron.  ``near = (r, delta)``: the feed-forward input moves by ``e = z J_1(x) + e_1`` with
        ``||z|| <= r`` (the first LayerNorm's ball) and ``||e_1|| <= delta`` (``r V_1`` plus the centre's rounding), so
        ``e.w_k = z.a_k + e_1.w_k`` (``a_k`` the columns of ``A = J_1 W_1``) and Minkowski's inequality in each factor
        gives ``(1/2) (r lambda_AA^(1/2) + delta mu_A) (r lambda_AB^(1/2) + delta mu_B)``, ``lambda_AB =
        lambda_max(diag(S)^(1/2) (A^T A o B B^T) diag(S)^(1/2))`` (``B = W_2 J_2`` or ``W_2``), ``lambda_AA`` with ``A^T
        A`` twice, ``mu_A = ||A diag(S^(1/2) ||w||)||``, ``mu_B = ||diag(S^(1/2) ||w||) B||``.  On MiniLM's first block
        at 1e-3 R it is five to six times below the unfolded ``(R^2 / 2) (lambda_A lambda_B)^(1/2)`` (``W_1^T W_1`` on
        the e-side, R the feed-forward ball's radius): the first LayerNorm's projection and scales do not line up
        with the directions ``w_k``."""
        facts = self._token(i)
        second = feedforward_grams(self.ffn.ffn)[1]                                    # W_2 W_2^T
        # (A^T A and B B^T kept from the set-up within KEPT_GRAM_BYTES, or formed again: the same floats; their Hadamard
        # products, 113 MB a token more, are formed again)
        a_gram, b_gram = (facts["a_gram"], facts["b_gram"]) if "a_gram" in facts else \
            _folded_grams(facts["A"], facts["B"])
        columns = IntervalArray(IntervalArray(self.ffn.ffn.W_1).norm_upper(axis=0))
        root = third_derivative_roots(self.ffn, i, radius)
        r, delta, weights = IntervalArray(float(near[0])), IntervalArray(float(near[1])), root * columns

        def side(gram: IntervalArray, rows: IntervalArray) -> IntervalArray:    # rows: the vectors b_k (or a_k)
            scaled = a_gram * gram * root.expand(0) * root.expand(-1)
            spread = IntervalArray(spectral_norm_upper_large((rows * weights.expand(-1)).to_enclosure()))
            return r * IntervalArray(max(lambda_max_upper_large(scaled.to_enclosure()), 0.0)).sqrt() + delta * spread
        near_a, half = side(a_gram, facts["A"].swapaxes(0, 1)), IntervalArray(0.5)
        folded, front = ((half * near_a * side(gram, rows)).hi.item()
                         for gram, rows in ((b_gram, facts["B"]), (second, IntervalArray(self.ffn.ffn.W_2))))
        return folded, front

    def remainder_splits(self, radii: list) -> list:
        """Per token, the remainder's split norms (:meth:`_remainder_split`) on the feed-forward balls ``radii[2]``."""
        n = radii[2].shape[0]
        weights = remainder_weights(self.ffn.ffn, self.ffn, radii[2], range(n))
        return [self._remainder_split(i, weights[i]) for i in range(n)]

    def _remainder_split(self, i: int, weights: np.ndarray) -> tuple:
        """``(||diag(t)^(1/2) (J_1 W_1)^T||, ||diag(t)^(1/2) W_2 J_2||, ||diag(t)^(1/2) W_2||)`` of token i."""
        facts = self._token(i)
        root = IntervalArray(weights).sqrt()
        return tuple(spectral_norm_upper_large(M.to_enclosure()) for M in (
            facts["A"].swapaxes(0, 1) * root.expand(-1), facts["B"] * root.expand(-1),
            IntervalArray(self.ffn.ffn.W_2) * root.expand(-1)))

    def feedforward_change(self, V: list, N: list, radii: list, rounding: list | np.ndarray, splits: list | None = None,
                           quadratic: dict | None = None) -> tuple:
        """Per token, ``K >= sup ||J_1(x) (J_F(y_2) - J_F(x_2))||`` on the balls of ``omega_tokens``: the smaller of
        ``N_1 V_F`` and the folded form (theorem local-feedforward-front, its split term replaced by the second bound
        of :meth:`quadratic_remainder` for the tokens of ``quadratic`` where that is smaller); and the remainder's
        split norms per token (:meth:`remainder_splits`, computed here unless given)."""
        n, r = V[1].shape[0], radii[1]
        splits = self.remainder_splits(radii) if splits is None else splits
        out = (IntervalArray(np.diag(N[1])) * IntervalArray(np.diag(V[2]))).hi
        for i in range(n):
            facts = self._token(i)
            # e-side w_k: at most ||J_1|| times the block's own second-derivative bound (a J_1 w_k = (J_1^T a) w_k)
            plain = (IntervalArray(N[1][i, i]) * IntervalArray(self.ffn.curvature_norms([i])[i])).hi.item()
            values = {"V_1": V[1][i, i], "r": r[i], r"\rho": rounding[2][i],
                      r"\Lambda_{10}^{1/2}": facts["Lambda_10"], r"\Lambda_{00}^{1/2}": plain,
                      r"\|\operatorname{diag}(t)^{1/2} (J_1 W_1)^\top\|": splits[i][0],
                      r"\|\operatorname{diag}(t)^{1/2} W_2\|": splits[i][2]}
            value = float(evaluate_theorem(T.feedforward_front_variation(),
                                           **{key: np.float64(v) for key, v in values.items()}))
            if quadratic and i in quadratic:
                value = replace_split(value, splits[i][0], splits[i][2], quadratic[i][1])
            out[i] = min(out[i], value)
        return out, splits

    def _output_norm_on_tighter_balls(self, M, V, radii, rounding, change, floors=None) -> tuple:
        """``M_2``, ``V_2`` of the output LayerNorm on balls of radius ``min(radii[3], r (||J_1 J_F|| + V_1 M_F +
        K) + rho_3)``: the input of that LayerNorm moves by ``(y - x)`` times the mean Jacobian of the first two
        maps on the segment, within ``V_1 M_F + K`` of ``J_1 J_F`` at the centre (theorem local-block-tail,
        ``K`` from :meth:`feedforward_change`), where the chained balls pay ``M_1 M_F``; ``floors`` the floors of
        that LayerNorm's centred norm on the set that holds its input (lemma centred-floor), when formed."""
        n = V[1].shape[0]
        front = np.array([self._token(i)["front"] for i in range(n)])
        rate = (IntervalArray(front) + IntervalArray(np.diag(V[1])) * IntervalArray(np.diag(M[2]))
                + IntervalArray(change))
        # the float centre x_3 lies within rho_3 of the exact image of x (the roundings of two steps)
        rho_3 = IntervalArray(rounding[3]) + IntervalArray(np.diag(M[2])) * IntervalArray(rounding[2])
        tighter = np.minimum(radii[3], (rate * IntervalArray(radii[1]) + rho_3).hi)
        bounds = norm_bounds(self.ln_2.norm, TokenBalls(self.ln_2.Z.mid, tighter, floors=floors), self.ln_2)
        return bounds.blocks, bounds.variation

    def omegas(self, M: list, V: list, N: list, radii: list, rounding: np.ndarray,
               floors: list | None = None) -> np.ndarray:
        """Per token, the smaller of the two bounds of :meth:`omega_tokens`."""
        return np.minimum(*self.omega_tokens(M, V, N, radii, rounding, floors))

    def variation(self, attention, omegas: np.ndarray, jacobian=None) -> float:
        """``tau var_U(A) + omega Lip_U(A)`` (theorem local-attention-tail), ``attention`` a point of the
        attention's own curve on the same U, ``omegas`` from :meth:`omegas`; with ``jacobian`` (the attention's
        Jacobian at X, rows of the moving tokens) also the weighted form of :func:`weighted_tail_variation`."""
        return _tail_variation(self.tau, omegas, attention, jacobian)

    def reach(self, attention_reach: float, omegas: np.ndarray) -> float:
        """``max_i (tau_i + omega_i) R_A`` (lemma block-reach): a bound on ``sup_U ||F(Y) - F(X)||_F`` from the
        attention's ``R_A >= sup_U ||A(Y) - A(X)||_F``."""
        return _tail_reach(self.taus, omegas, attention_reach)



class TokenTail:
    """The per-token maps after a block's attention step, telescoped (a pre-norm or sandwich block: the
    feed-forward residual step ``z + f N_ffo(FFN(N_ffn z))``).

    ``tau = max_i ||T_i(A(X))||`` is certified from the maps' blocks at the centre; ``omega`` is the largest
    diagonal entry of the telescoped variation of the per-token maps on the balls that hold ``A(U)``
    (theorem local-chain), so that ``sup_U ||DF(Y) - DF(X)|| <= tau var_U(A) + omega Lip_U(A)`` (theorem
    local-attention-tail)."""

    def __init__(self, enclosed):
        self.taus = _tail_norms(enclosed)
        self.tau = float(np.max(self.taus))

    def omegas(self, M: list, V: list, N: list, radii: list, rounding, floors: list | None = None) -> np.ndarray:
        """Per token, the diagonal of the maps' telescoped variation (``M``, ``V`` already read the balls'
        ``floors``)."""
        return np.diag(telescoped_variation(M[1:], V[1:], N[1:], np.arange(V[1].shape[0])))

    def variation(self, attention, omegas: np.ndarray, jacobian=None) -> float:
        return _tail_variation(self.tau, omegas, attention, jacobian)

    def reach(self, attention_reach: float, omegas: np.ndarray) -> float:
        return _tail_reach(self.taus, omegas, attention_reach)


def _tail_norms(enclosed) -> np.ndarray:
    """``||T_i(A(X))||_2`` per token, certified from the maps' blocks at the centre."""
    n = enclosed[-1].output.shape[0]
    return np.array([spectral_norm_upper_large(token_tail(enclosed, i).to_enclosure()) for i in range(n)])


def _tail_variation(tau: float, omegas: np.ndarray, attention, jacobian=None) -> float:
    """``tau var_U(A) + omega Lip_U(A)``, ``omega`` the largest of ``omegas`` (theorem local-attention-tail); with
    ``jacobian`` the smaller of that and :func:`weighted_tail_variation`."""
    values = {r"\tau": tau, r"\operatorname{var}_U(A)": attention.variation, r"\omega": np.max(omegas),
              r"\operatorname{Lip}_U(A)": attention.certified}
    value = float(evaluate_theorem(T.attention_tail(), **{key: np.float64(v) for key, v in values.items()}))
    if jacobian is None or not np.all(np.isfinite(omegas)) or not math.isfinite(attention.variation):
        return value
    return min(value, weighted_tail_variation(tau, omegas, attention.variation, jacobian))


def weighted_tail_variation(tau: float, omegas: np.ndarray, variation: float, jacobian: Enclosure) -> float:
    """``tau var_U(A) + ||Omega DA(X)|| + max_i omega_i var_U(A)``, ``Omega = diag(omega_i I)``, rounded up (theorem
    local-attention-tail-weighted): the second term of theorem local-attention-tail has output token i's part
    scaled by a change of norm at most ``omega_i``, and ``DA(Y)`` is within ``var_U(A)`` of ``DA(X)``, so the tokens
    whose per-token maps move little no longer pay the largest change times the attention's whole constant.
    ``jacobian`` (row convention -- rows: the moving tokens' inputs, columns: the n output tokens' ``d``
    coordinates, so Omega scales its columns) is the attention's Jacobian at X, enclosed."""
    scaled = _columns_scaled_norm(jacobian, omegas)
    values = {r"\tau": tau, r"\operatorname{var}_U(A)": variation, r"\omega": np.max(omegas),
              r"\|\Omega\,DA(X)\|": scaled}
    return float(evaluate_theorem(T.attention_tail_weighted(), **{key: np.float64(v) for key, v in values.items()}))


def _columns_scaled_norm(jacobian: Enclosure, scales: np.ndarray) -> float:
    """``||DA(X) diag(s_i I)||_2`` rounded up: the attention's Jacobian at X (row convention) with output token i's
    ``d`` columns scaled by ``s_i >= 0`` (n,)."""
    n = scales.shape[0]
    repeated = IntervalArray(np.repeat(scales, jacobian.shape[1] // n)).expand(0)
    mid, rad = np.empty(jacobian.shape), np.empty(jacobian.shape)
    for start in range(0, jacobian.shape[0], SCALED_ROWS):   # entrywise: by rows, no end points of the whole matrix
        rows = slice(start, start + SCALED_ROWS)
        part = (IntervalArray.around(jacobian.mid[rows], jacobian.rad[rows]) * repeated).to_enclosure()
        mid[rows], rad[rows] = part.mid, part.rad
    return spectral_norm_upper_large(Enclosure._trusted(mid, rad))


def weighted_tail_reach(taus: np.ndarray, omegas: np.ndarray, jacobian: Enclosure, theta: float, eps: float,
                        remainder: float, token_remainders=()) -> float:
    """``||DA(X) D_w|| theta_U eps + min(max_i w_i rest, ||(w_i rest_i)_i||)``, ``w_i = tau_i + omega_i``, ``D_w =
    diag(w_i I)``, rounded up (theorem local-block-reach-weighted): a bound on ``sup_U ||F(Y) - F(X)||_F`` of the block.
    Token i's per-token map moves by at most ``w_i ||A(Y)_i - A(X)_i||`` (as in lemma block-reach) and ``A(Y) - A(X) =
    (Y - X) DA(X) + r`` with ``||r||_F <= rest`` and ``||r_i|| <= rest_i`` (lemmas attention-reach-remainder and
    curvature-per-query), so the tokens' weights multiply the attention's own columns instead of the largest weight
    multiplying its whole reach.  ``jacobian`` is the attention's Jacobian at X (rows: the moving tokens' inputs);
    inf where ``remainder`` is."""
    if not math.isfinite(remainder) or not np.all(np.isfinite(omegas)):
        return math.inf
    weights = (IntervalArray(taus) + IntervalArray(omegas)).hi
    whole = (IntervalArray(float(np.max(weights))) * IntervalArray(float(remainder))).hi.item()
    tokens = whole   # (no per-token remainders: the minimum is the whole remainder's term)
    if len(token_remainders) and np.all(np.isfinite(token_remainders)):
        rests = np.minimum(np.asarray(token_remainders, dtype=np.float64), remainder)
        tokens = (IntervalArray(weights) * IntervalArray(rests)).norm_upper().item()
    values = {r"\|DA(X)\,D_w\|": _columns_scaled_norm(jacobian, weights), r"\theta_U": theta, r"\epsilon": eps,
              r"\max_i w_i\,\operatorname{rest}": whole, r"\|(w_i \operatorname{rest}_i)_i\|": tokens}
    return float(evaluate_theorem(T.block_reach_weighted(), **{key: np.float64(v) for key, v in values.items()}))


def _tail_reach(taus: np.ndarray, omegas: np.ndarray, attention_reach: float) -> float:
    """``max_i (tau_i + omega_i) R_A``, rounded up (lemma block-reach): on the convex ball of token i that holds
    ``A(U)_i`` the per-token map moves by at most ``sup ||T_i|| <= tau_i + omega_i`` times the attention's own
    movement, and ``sum_i ||A(Y)_i - A(X)_i||^2 <= R_A^2``."""
    rates = (IntervalArray(taus) + IntervalArray(omegas)).hi
    return (IntervalArray(float(np.max(rates))) * IntervalArray(attention_reach)).hi.item()


def column_block_norms(jacobian: Enclosure, n: int) -> np.ndarray:
    """``c_i >= ||DA(X)_(:, i)||_2`` per output token i (n,): the certified norms of the column blocks of the
    attention's Jacobian at X (row convention, rows the moving tokens' inputs, ``d`` columns per output token)."""
    d = jacobian.shape[1] // n
    return np.array([spectral_norm_upper_large(jacobian[:, i * d:(i + 1) * d]) for i in range(n)])


def token_reach(columns: np.ndarray, remainder, theta: float, eps: float) -> np.ndarray:
    """``c_i theta_U eps + rest_i`` per token, rounded up (lemma attention-token-reach): on U, ``A(Y)_i - A(X)_i =
    ((Y - X) DA(X))_i + r_i`` with ``||((Y - X) DA(X))_i|| <= c_i ||Y - X||_F <= c_i theta_U eps`` (``c_i`` from
    :func:`column_block_norms`) and ``||r_i|| <= rest_i``: ``remainder`` one float, Taylor's remainder of the whole
    output (lemma attention-reach-remainder, ``||r_i|| <= ||r||_F``), or one per token (lemma curvature-per-query);
    inf where the remainder is."""
    rests = np.broadcast_to(np.asarray(remainder, dtype=np.float64), columns.shape)
    values = {"c_i": np.asarray(columns, dtype=np.float64), r"\theta_U": np.float64(theta),
              r"\epsilon": np.float64(eps), r"\operatorname{rest}_i": np.where(np.isfinite(rests), rests, 0.0)}
    return np.where(np.isfinite(rests), evaluate_theorem(T.attention_token_reach(), **values), np.inf)
