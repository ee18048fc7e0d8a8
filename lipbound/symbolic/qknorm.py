r"""QK-norm: a per-head RMSNorm on queries and keys before the score, and its kernel constants.

OLMo 2, Qwen3 and Gemma 3 normalise each head's query and key (Henry et al. 2020; Dehghani et al. 2023):

    n_Q(q) = gamma_q * q / sqrt(||q||^2 / d_k + epsilon),    s_ij = tau n_Q(q_i)^T [R_Delta] n_K(k_j),

``q = W_Q^T x + b_Q``, ``k = W_K^T y + b_K``, ``tau`` the score scale and, with rotary positions applied
after the norm (Qwen3, Gemma 3), ``R_Delta`` between them.  Facts of the normalisation (lemma
``qk-norm``): ``n_Q(q) = gamma_q * u`` with ``||u|| < sqrt(d_k)``, and ``||D n_Q(q)|| <= gamma_q / sqrt(epsilon)``.

* **Logits.**  ``|s_ij| = tau |sum_l gamma_q,l gamma_k,l u_l v_l| < tau d_k gamma_qk``, ``gamma_qk = max_l
  |gamma_q,l gamma_k,l|``; with rotations ``< tau d_k gamma_q gamma_k`` (``R_Delta`` mixes coordinates, so
  only the norms of the normalised vectors count).  Every weight of a row of N keys lies in
  ``[1 / (1 + (N - 1) e^{2M}), 1 / (1 + (N - 1) e^{-2M})]`` for that bound M, whatever the input.
* **Constants.**  ``beta <= tau ||W_K|| gamma_qk sqrt(d_k / epsilon)`` (``grad_y s = tau W_K D n_K^T (gamma_k *
  gamma_q * u)``), ``alpha <= tau ||W_Q|| gamma_qk sqrt(d_k / epsilon)`` (the normalised keys lie in a ball about
  0, so Popoviciu has no centre term), ``omega <= min(2 R beta, 2 tau d_k gamma_qk)``: no radius enters
  but through ``rho = ||W_V|| R`` and ``2 R beta``.
* **Not globally Lipschitz.**  The scores are bounded and Lipschitz, but the values are not: along
  ``X_t = (0, t)`` the query ``q_1 = 0`` sits where the normalisation's slope is ``gamma_q / sqrt(epsilon)``,
  and that slope multiplies the value spread ``t`` (:mod:`lipbound.symbolic.unbounded` finds the family).
  On a bounded set -- the image of an RMSNorm before the block -- the constants above apply, with their
  ``1 / sqrt(epsilon)``.
"""

from __future__ import annotations

from typing import final

import sympy as sp

from . import symbols as S
from .calculus import Inner, Region, SoftNorm, upper_norm_vec
from .record import Derivation, Described, eq, le
from .scores import KernelConstants, Score

__all__ = ["QKNormScore"]


@final
class QKNormScore(Score):
    """The QK-norm score ``tau n_Q(q)^T n_K(k)`` (``rotary=True``: ``tau n_Q(q)^T R_Delta n_K(k)``), with
    query and key biases.  Constants: module docstring."""

    kind = "dot"
    qk_norm = True

    def __init__(self, rotary: bool = False):
        self.rotary = rotary
        self.name = "qk-norm-rope" if rotary else "qk-norm"
        self.title = "QK-norm score" + (" with rotary positions" if rotary else "")

    @property
    def gains(self) -> sp.Expr:
        """``gamma_q gamma_k`` with rotations, ``gamma_qk = max_l |gamma_q,l gamma_k,l|`` without."""
        return S.gamma_q * S.gamma_k if self.rotary else S.gamma_qk

    def expression(self) -> sp.Expr:
        query, key = (S.W_Q.T * S.x + S.b_Q).doit(), (S.W_K.T * S.y + S.b_K).doit()
        normalised_key = (S.D_k * key).doit()
        if self.rotary:
            normalised_key = (S.R_Delta * normalised_key).doit()
        return S.tau * S.d_k * Inner((S.D_q * query).doit(), normalised_key) / (
            SoftNorm(query, S.d_k * S.epsilon) * SoftNorm(key, S.d_k * S.epsilon))

    def hypotheses(self) -> list[str]:
        out = ["QK-norm: n_Q(q) = gamma_q * q / sqrt(||q||^2 / d_k + epsilon) on each head's query, n_K likewise on "
               "its key, D_q = diag(gamma_q), D_k = diag(gamma_k); score s = tau n_Q(q)^T n_K(k)"
               + (" with R_Delta between them (rotary positions after the norm)" if self.rotary else "")]
        if self.rotary:
            out.append("rotary positions: R_Delta orthogonal, Delta = p_j - p_i")
        return out

    def witness_note(self) -> str:
        return "rotation angles in 2 pi Z, so R_Delta = I at every offset" if self.rotary else ""

    def _derive_constants(self, assumptions) -> KernelConstants:
        record = Derivation(f"Kernel constants of the {self.title}")
        for text in self.hypotheses():
            record.hypothesis(text)
        key_ball = assumptions.domain.enclosing_ball(record)
        radius, gains, root = key_ball.radius, self.gains, sp.sqrt(S.d_k / S.epsilon)
        record.add(eq(Described("s(x, y)"), Described(r"\tau\, n_Q(q)^\top " + (r"R_\Delta " if self.rotary else "")
                                                      + r"n_K(k)")),
                   "definition of the score: q = W_Q^T x + b_Q, n_Q(q) = D_q q / s, "
                   "s = (||q||^2 / d_k + epsilon)^(1/2), "
                   "and likewise n_K(k)", "qk-norm")
        record.add(le(Described(r"\|D n_Q(q)\|_2"), S.gamma_q / sp.sqrt(S.epsilon)),
                   "D n_Q(q) is D_q times a symmetric factor with eigenvalues in [0, 1], over s >= sqrt(epsilon)",
                   "qk-norm")
        record.add(le(Described(r"|s(x, y)|"), S.tau * S.d_k * gains),
                   "n_Q(q) = gamma_q * u with ||u|| < sqrt(d_k), likewise n_K(k) = gamma_k * v; "
                   + ("R_Delta is orthogonal, so |n_Q^T R_Delta n_K| <= ||n_Q|| ||n_K||" if self.rotary else
                      "sum_l gamma_q,l gamma_k,l u_l v_l <= gamma_qk ||u|| ||v||"), "qk-norm")
        value = (S.W_V.T * S.y).doit()
        L_V = upper_norm_vec(value, Region({S.y: (None, 1)}))
        rho = upper_norm_vec(value, Region({S.y: (None, radius)}))
        record.add(eq(S.L_V, L_V), "L_V is the operator norm of the linear part of v", "value-lipschitz")
        record.add(le(S.rho, rho), "rho = sup_y ||V^T (y - c)|| <= ||V|| R on the key domain", "value-spread")
        beta = S.tau * S.MatrixNormSymbol("W_K") * gains * root
        record.add(le(S.beta, beta), "grad_y s = tau W_K D n_K(k)^T " + ("R_Delta^T n_Q(q)" if self.rotary else
                   "(gamma_k * gamma_q * u)") + ", and ||D n_K|| <= gamma_k / sqrt(epsilon) acts on the "
                   "normalised query", "qk-norm")
        alpha = S.tau * S.MatrixNormSymbol("W_Q") * gains * root
        record.add(le(S.alpha, alpha), "grad_x s . e = tau (D n_Q(q) W_Q^T e) . " + ("(R_Delta n_K(k))" if self.rotary
                   else "(gamma_k * v)") + ": a linear function of the normalised key, which lies in a ball about "
                   "0 of radius sqrt(d_k); half its range bounds its standard deviation", "popoviciu")
        omega = sp.Min(2 * radius * beta, 2 * S.tau * S.d_k * gains)
        record.add(le(S.omega, omega), "mean value theorem along y -> y', or twice the bound on |s|", "score-range")
        return KernelConstants(L_V=L_V, rho=rho, alpha=alpha, beta=beta, omega=omega, record=record)

    def factor_alpha(self, assumptions, record: Derivation) -> sp.Expr:
        """``alpha`` bounds every ``|grad_x s . e| / ||e||`` (half the range of a linear function on a ball
        about 0 is its largest value): a factor in ``[0, 1]`` keeps it."""
        alpha = self.kernel_constants(assumptions).alpha
        record.add(le(S.alpha, alpha), "for the normalised keys in a ball about 0, alpha bounds every "
                   "|grad_x s . e| / ||e||; factors in [0, 1] keep the bound", "qk-norm")
        return alpha
