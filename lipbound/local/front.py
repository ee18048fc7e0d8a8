"""A normalised attention branch split at the attention's input: the pre-norm placement.

In a pre-norm layer (Llama, SmolLM2) the attention reads its tokens through a norm P acting token by
token, and a sandwich layer (Gemma) adds per-token maps Q after it (an output norm, a gain):
``F = Q o A o P``, with the residual's identity around it (which does not vary).  Telescoping the chain rule
at the attention's input (theorem local-attention-front)

    sup_U ||DF(Y) - DF(X)|| <= nu_P Lip(A) M_Q + n_P var(A) M_Q + n_P ||DA(Z)|| omega_Q,     Z = P(X),

keeps the attention whole: ``var(A)`` is its own variation on the token balls that hold ``P(U)`` -- the
smaller of the matrix of its blockwise variations and its second derivative integrated over those balls
(:class:`~lipbound.local.curvature.CurvatureIntegral`: ``P(U)`` lies in the product of token balls of the
norm's movements rho_j, and within ``max_j M^P_j theta_U eps`` of Z in the Frobenius norm), and
``Lip(A) <= ||DA(Z)|| + var(A)`` with ``||DA(Z)||`` the certified norm of its dense Jacobian at Z.  The
blockwise chain (theorem local-residual-step) multiplies every per-token block bound of the attention by
the norm's, and sums the heads by norms; the split pays the norm's scales once, as the largest over the
tokens.
"""

from __future__ import annotations

import math

import numpy as np

from ..rigorous.arrays import IntervalArray
from ..rigorous.linalg import spectral_norm_upper, spectral_norm_upper_large
from ..symbolic import local as T
from .bounds import evaluate_theorem
from .chains import PER_TOKEN, product_upper, telescoped_variation
from .curvature import CURVATURE_TOKENS, AttentionCurvature
from .curvature_integral import CurvatureIntegral, decade_grid

__all__ = ["FrontSplit"]


def _largest_diagonal(matrix: np.ndarray) -> float:
    return float(np.max(np.diag(matrix)))


def _block_norm(matrix: np.ndarray) -> float:
    """The spectral norm of a non-negative matrix of block norms (a bound on the operator norm), certified."""
    return spectral_norm_upper(np.asarray(matrix, dtype=np.float64)) if np.any(matrix) else 0.0


class FrontSplit:
    """The split of one neighbourhood's variation at the attention's input (module docstring).

    Parameters
    ----------
    stages : list of Component
        The branch: a norm, a head or an attention layer, then per-token maps (possibly none).
    enclosed : list
        Their enclosures at the centre (each at the enclosure of the one before).
    tokens : int
        The curvature bound's Gram route up to this many tokens (:meth:`AttentionCurvature.route`).
    """

    def __init__(self, stages, enclosed, fold, tokens: int = CURVATURE_TOKENS):
        self.stages, self.enclosed, self.fold = list(stages), list(enclosed), fold
        norm, attention = self.enclosed[0], self.enclosed[1]
        self.dense = spectral_norm_upper_large(attention.jacobian_enclosure())      # ||DA(Z)||
        self.plain = self.folded = None
        route = AttentionCurvature.route(attention, tokens)
        if route is not None:
            self.plain = CurvatureIntegral(self.stages[1], attention, split=route == "split")
        if AttentionCurvature.route(attention, tokens, fold=True) is not None:
            fold = IntervalArray.stack([norm.jacobian_block(m) for m in range(attention.n)])
            self.folded = CurvatureIntegral(self.stages[1], attention, fold=fold)

    @classmethod
    def of(cls, chain, enclosed, tokens: int = CURVATURE_TOKENS):
        """The split for a chain of one sub-layer around a normalised attention, or a head read through its norm
        (the pre-norm ``layer`` and ``head``); None for other chains."""
        if len(chain) != 1 or chain[0].kind != "sublayer":
            return None
        branch = chain[0].target.branch
        if len(branch) < 2 or branch[0].kind != "norm" or branch[1].kind not in ("head", "attention") \
                or any(component.kind not in PER_TOKEN for component in branch[2:]):
            return None
        return cls(branch, [stage.enclosed for stage in enclosed[0].stages], enclosed[0].fold(branch[1]), tokens)

    def variation(self, M: list, V: list, N: list, radii: list, theta: float) -> float:
        """The bound on one neighbourhood from the branch's block-norm matrices ``M``, ``V``, ``N`` on its balls
        (norm, attention, then the per-token maps), the balls' radii before each stage, and ``theta >= ||Y -
        X||_F`` on U (theorem local-attention-front)."""
        n = V[0].shape[0]
        nu, n_p, m_p = (_largest_diagonal(A) for A in (V[0], N[0], M[0]))
        r, rho, tokens_nu = radii[0], radii[1], np.diag(V[0])
        blockwise = _block_norm(V[1])
        var = blockwise
        if self.plain is not None:   # P(U) lies within m_P theta of Z in the Frobenius norm
            var = min(var, self._integral(r, rho, tokens_nu, (IntervalArray(m_p) * IntervalArray(theta)).hi.item(),
                                          var, folded=False))
        lip = min((IntervalArray(self.dense) + IntervalArray(var)).hi.item(), _block_norm(M[1]))
        inner = (IntervalArray(n_p) * IntervalArray(var)).hi.item()
        if self.folded is not None and self.plain is not None:
            inner = min(inner, self._integral(r, rho, tokens_nu, theta, inner, folded=True,
                                              weight=(IntervalArray(nu) * IntervalArray(n_p)).hi.item()))
        if len(V) > 2:
            m_q = _largest_diagonal(product_upper(*reversed(M[2:])))
            omega = _largest_diagonal(telescoped_variation(M[2:], V[2:], N[2:], np.arange(n)))
        else:
            m_q, omega = 1.0, 0.0
        values = {r"\nu_P": nu, "n_P": n_p, r"\operatorname{Lip}_{P(U)}(A)": lip, "W_P": inner,
                  "M_Q": m_q, r"\omega_Q": omega, r"\|DA(\bar Z)\|": self.dense}
        return float(evaluate_theorem(T.attention_front(), **{k: np.float64(v) for k, v in values.items()}))

    def _integral(self, r: np.ndarray, rho: np.ndarray, nu: np.ndarray, theta: float, other: float, folded: bool,
                  weight: float = 0.0) -> float:
        """``theta sum_k (s_k - s_{k-1}) chi(P(s_k rho))``, or with ``folded`` ``theta sum_k (s_k - s_{k-1}) (chi^P +
        weight chi)(P(s_k rho))`` (theorem local-attention-front); on each ``P(s rho)`` the scores and values take
        their ranges through the norm's Jacobians (the segment's points are ``Z + s (P(Y) - Z)``, the image of
        the input balls of radii ``s r``: theorem local-score-deviation-normalised)."""
        if not np.any(rho) or theta == 0:
            return 0.0
        total, previous = IntervalArray(0.0), 0.0
        for s in decade_grid([1.0]):
            radii = (IntervalArray(rho) * s).hi
            width = (IntervalArray(s) - IntervalArray(previous)).hi.item()
            overrides = self.fold.overrides(self.enclosed[1], (IntervalArray(r) * s).hi, nu, radii)
            key = (s, r.tobytes(), nu.tobytes(), radii.tobytes())
            plain = self.plain.chis(radii, overrides, key)
            chis = (self.folded.chis(radii, overrides, key), plain) if folded else (plain,)
            if not all(math.isfinite(chi) for part in chis for chi in part):
                return math.inf
            total = total + IntervalArray(self.plain.curvature.piece(chis[-1], width)) * IntervalArray(weight) \
                if folded else total + IntervalArray(self.plain.curvature.piece(plain, width))
            if folded:
                total = total + IntervalArray(self.folded.curvature.piece(chis[0], width))
            previous = s
            if (total * IntervalArray(theta)).hi.item() > other:
                return math.inf
        return (total * IntervalArray(theta)).hi.item()
