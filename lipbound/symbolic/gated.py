r"""Gated feed-forward blocks (SwiGLU, GeGLU): the theorem on a ball and the witness family on R^d.

``f(x) = W_down^T (phi(W_gate^T x) * (W_up^T x))`` (Shazeer 2020; Llama, Mistral, Qwen use SiLU, Gemma
the tanh GELU), ``W_gate, W_up`` of shape d x d_ff, ``W_down`` d_ff x d, no biases.  With ``g = W_gate^T x``
and ``u = W_up^T x``,

    Df(x) = W_down^T (diag(phi'(g) * u) W_gate^T + diag(phi(g)) W_up^T).

Two facts of the activation: ``|phi'| <= ell_phi`` (certified: SiLU ``1.0998...``, GELU ``1.1289...``, tanh
GELU ``1.1290...``, :func:`lipbound.symbolic.activations.slope_range`) and ``|phi(t)| <= |t|`` (``phi(t) = t m(t)``
with ``m`` the logistic function or the normal CDF, in ``(0, 1)``; the supremum 1 of ``|phi(t) / t|`` is
approached as ``t -> oo``).  On tokens with ``||x|| <= r``, ``|u_i| <= a_i r`` and ``|phi(g_i)| <= b_i r`` with
``a_i = ||W_up[:, i]||``, ``b_i = ||W_gate[:, i]||``, and a diagonal ``T`` with ``|T_ii| <= t a_i`` factors as
``D_a^(1/2) (T D_a^(-1)) D_a^(1/2)``, so

    Lip(f) <= r (ell_phi Gamma_up + Gamma_gate),
    Gamma_up = ||W_down^T D_a^(1/2)|| ||D_a^(1/2) W_gate^T||  <=  mu_up ||W_down|| ||W_gate||,   mu_up = max_i a_i,
    Gamma_gate = ||W_down^T D_b^(1/2)|| ||D_b^(1/2) W_up^T||  <=  mu_gate ||W_down|| ||W_up||,   mu_gate = max_i b_i.

The right-hand column form is the product bound; the matrix form is never larger.  On ``R^d`` the block
is not Lipschitz: with ``d = d_ff = 1`` and unit weights ``f(t) = phi(t) t`` grows like ``t^2``:
``f'(t) / t -> 2`` (exactly, by SymPy).

**Quadratic constraints for relaxations** (docs/mathematics.md, section 13).  On the ball, each neuron's
pair ``(g_i, u_i)`` lies in the box ``|g_i| <= b_i r``, ``|u_i| <= a_i r``, and the product ``p_i = phi(g_i) u_i``
obeys the McCormick envelopes of ``v_i u_i`` with ``v_i = phi(g_i)`` in ``[phi_min, b_i r]`` (``phi_min`` the
activation's minimum), plus the slope restriction of ``phi`` between ``g_i`` and ``v_i``.
"""

from __future__ import annotations

import functools
from decimal import ROUND_CEILING, Decimal

import sympy as sp

from ..rigorous.intervals import lower, upper
from . import activations
from . import symbols as S
from . import theorems as T
from .assumptions import Assumptions
from .bound import NotLipschitz
from .record import Derivation, Described, eq, le

__all__ = ["GATED", "SHORT", "gated_feed_forward", "gated_witness", "certified_slope", "outer_radius"]

#: block name -> (activation name, title)
GATED = {"swiglu": ("silu", "SwiGLU"), "geglu": ("gelu", "GeGLU"), "geglu-tanh": ("gelu_new", "GeGLU (tanh GELU)")}
#: block name -> its name inside a residual block's title
SHORT = {"swiglu": "SwiGLU", "geglu": "GeGLU", "geglu-tanh": "GeGLU"}
_LIP = Described(r"\operatorname{Lip}(f)")


@functools.cache
def certified_slope(activation: str) -> sp.Float:
    """``ell_phi = max(-inf phi', sup phi')`` of an activation, rounded up to 14 decimals from its certified
    enclosure (:func:`lipbound.symbolic.activations.slope_range`)."""
    found = activations.slope_range(activation)
    largest = max(upper(found.maximum), -lower(found.minimum))
    return sp.Float(str(Decimal(largest).quantize(Decimal("1e-14"), rounding=ROUND_CEILING)), 16)


def outer_radius(domain, record: Derivation | None = None) -> sp.Expr:
    """``r >= sup ||x||`` over a bounded domain: ``R + ||c||`` for a ball about c."""
    ball = domain.enclosing_ball(record)
    return ball.radius if ball.center is None else ball.radius + S.vector_norm(ball.center)


@functools.cache  # theorems are pure: build each once
def gated_feed_forward(activation: str, radius: sp.Expr) -> T.Theorem:
    """``W_down^T (phi(W_gate^T x) * W_up^T x)`` on tokens of norm at most ``radius``: module docstring."""
    spec = activations.activation(activation)
    statement = radius * (S.ell_phi * S.Gamma_up + S.Gamma_gate)
    proof = Derivation(f"Gated feed-forward block ({spec.title})")
    proof.hypothesis("f(x) = W_down^T (phi(W_gate^T x) * (W_up^T x)) per token, no biases")
    proof.hypothesis(f"phi is {spec.title}; ell_phi = sup |phi'| (certified: at most {certified_slope(activation)}), "
                     "and |phi(t)| <= |t|")
    proof.hypothesis(f"every token satisfies ||x|| <= {radius}")
    proof.add(eq(Described(r"Df(x)"), Described(
        r"W_{\mathrm{down}}^\top \operatorname{diag}(\varphi'(g) \odot u)\, W_{\mathrm{gate}}^\top + "
        r"W_{\mathrm{down}}^\top \operatorname{diag}(\varphi(g))\, W_{\mathrm{up}}^\top")),
              "product rule, with g = W_gate^T x and u = W_up^T x", "gated-jacobian")
    proof.add(le(Described(r"|\varphi'(g_i)\, u_i|"), S.ell_phi * radius * Described(r"\|W_{\mathrm{up}} e_i\|_2")),
              "|phi'| <= ell_phi and |u_i| = |(W_up e_i) . x| <= ||W_up e_i|| ||x||", "gated-jacobian")
    proof.add(le(Described(r"|\varphi(g_i)|"), radius * Described(r"\|W_{\mathrm{gate}} e_i\|_2")),
              "phi(t) = t m(t) with m in (0, 1), so |phi(g_i)| <= |g_i|", "gated-jacobian")
    proof.add(le(Described(r"\|Df(x)\|_2"), statement),
              "a diagonal T with |T_ii| <= t a_i is D_a^(1/2) (T D_a^(-1)) D_a^(1/2), with ||T D_a^(-1)|| <= t; "
              "submultiplicativity on each of the two terms", "gated-jacobian")
    proof.add(le(_LIP, statement), "mean value theorem on the convex domain", "mean-value")
    proof.add(le(S.Gamma_up, S.mu_up * S.MatrixNormSymbol("W_down") * S.MatrixNormSymbol("W_gate")),
              "||D_a^(1/2)|| = mu_up^(1/2) on both sides: the product form", "submultiplicative")
    proof.add(le(S.Gamma_gate, S.mu_gate * S.MatrixNormSymbol("W_down") * S.MatrixNormSymbol("W_up")),
              "likewise with D_b", "submultiplicative")
    proof.add(le(S.ell_phi, certified_slope(activation)),
              f"the certified slope range of {spec.title} (branch and bound and a tail lemma, outward rounding)",
              "slope-restriction")
    return T.Theorem(f"gated-feed-forward-{activation.replace('_', '-')}", f"Gated feed-forward block ({spec.title})",
                     statement, proof)


@functools.cache
def _growth(activation: str) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """``f(t) = phi(t) t``, ``f'(t)`` and ``lim f'(t) / t`` in the unit instance (exact, SymPy; once per activation)."""
    along = (activations.activation(activation).expression * activations.t).xreplace({activations.t: S.t})
    entry = sp.diff(along, S.t)
    return along, entry, sp.limit(entry / S.t, S.t, sp.oo)


def gated_witness(name: str, key: str, assumptions: Assumptions) -> NotLipschitz:
    """``d = d_ff = 1``, unit weights: ``f(t) = phi(t) t`` and ``f'(t) / t -> 2``: the Jacobian grows linearly, the
    block quadratically."""
    along, entry, slope = _growth(GATED[name][0])
    record = Derivation(f"The {GATED[name][1]} block is not Lipschitz on the unbounded domain")
    instance = "d = d_ff = 1, W_gate = W_up = W_down = 1"
    record.hypothesis(f"instance: {instance}")
    record.add(eq(Described("x_t"), S.t), "a curve in the instance")
    record.add(eq(Described(r"f(x_t)"), along), "phi(W_gate^T x) times W_up^T x, read by W_down")
    derivative = Described(r"\partial f / \partial x \,(x_t)")
    record.add(eq(derivative, entry), "exact derivative (SymPy)", "gated-jacobian")
    record.add(eq(sp.Limit(derivative / S.t, S.t, sp.oo), slope),
               "the Jacobian grows linearly in t, so it is unbounded and f grows quadratically", "witness-family")
    return NotLipschitz(variant=key, norm=assumptions.norm.key, domain="unbounded", family=sp.ImmutableMatrix([[S.t]]),
                        growth=entry, instance=instance, assumptions=tuple(assumptions.describe() + record.hypotheses),
                        record=record, theorem=f"not-lipschitz-{name}", stated=assumptions)
