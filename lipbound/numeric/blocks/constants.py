"""Every certified constant of a block side by side, and the residual rule on certified numbers.

These are the calls a whole-model composition makes per block, with plain arrays:

* :func:`ffn_constants` -- the closed form, the midpoint form and LipSDP-Neuron of a
  feed-forward block, and the best of them;
* :func:`residual_constant` -- the rule of :func:`lipbound.symbolic.theorems.norm_residual`
  (pre-LN ``1 + L_F L_N``, post-LN ``L_N (1 + L_F)``), evaluated in interval arithmetic on two
  certified constants;
* :func:`pre_norm_ffn_constants` -- ``x + F(N(x))`` twice: the rule on the two constants, and the
  rule with N's gain folded into F: ``N(x) = D_gamma g(Pi x) + beta`` and ``g`` maps into the
  mean-zero hyperplane, so ``F(N(x)) = F~(g(Pi x))`` with ``F~(u) = phi(u W~_1 + b~_1) W_2 + b_2``,
  ``W~_1 = Pi D_gamma W_1``, ``b~_1 = beta W_1 + b_1``; then ``Lip(F o N) <= Lip(F~) Lip(g)`` with
  ``Lip(g) = (sigma_min^2 + eps)^{-1/2}`` (lemma ``radial-normalization``) -- the same rule
  with other components, and the alignment of the gain with ``W_1`` counted once;
* :func:`norm_image` -- the domain fact: every output of a normalisation lies in its image
  (whatever came in), a bounded set, which is the domain of the block that reads it.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import AssumptionError
from ...rigorous.intervals import IV, interval, upper
from ...rigorous.value import CertifiedValue
from ..domains import LayerNormOutputs, TokenBall, TokenDomain
from ..sdp.ffn import lipsdp_neuron
from .certify import derive_block, evaluate_block
from .ffn import closed_form, midpoint_form
from .norms import check_floor, norm_constant, norm_kind

__all__ = ["ffn_constants", "best", "residual_constant", "pre_norm_ffn_constants", "fold_gain", "norm_image"]


def best(values: list[CertifiedValue]) -> CertifiedValue | None:
    """The smallest certified value (None if none is certified)."""
    certified = [v for v in values if v.certified and v.proven]
    return min(certified, key=lambda v: v.value) if certified else None


def ffn_constants(W_1, W_2, act: str, *, norm: str = "fro", solver: str = "auto", sdp: bool = True,
                  effort: int = 60) -> dict:
    """``{"closed form", "midpoint form", "LipSDP-Neuron", "best"}`` for ``phi(x W_1 + b_1) W_2 + b_2``
    (certified values in ``norm``; LipSDP-Neuron only when ``sdp``)."""
    values = {"closed form": closed_form(W_1, W_2, act, norm), "midpoint form": midpoint_form(W_1, W_2, act, norm)}
    if sdp:
        values["LipSDP-Neuron"] = lipsdp_neuron(W_1, W_2, act, solver=solver, norm=norm, effort=effort)
    values["best"] = best(list(values.values()))
    return values


def _number(name: str, value) -> float:
    if isinstance(value, CertifiedValue):
        if not value.certified:
            raise AssumptionError(name, "a certified constant", f"not certified ({value.reason})",
                                  "certify the component first")
        return value.value
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise AssumptionError(name, "a finite non-negative constant", repr(value), "pass a certified upper bound")
    return number


def residual_constant(placement: str, norm_constant, inner_constant, norm: str = "fro") -> CertifiedValue:
    """The constant of ``x + F(N(x))`` (``"pre"``) or ``N(x + F(x))`` (``"post"``) from certified
    constants of N and F in ``norm`` (for ``"pre"``, F's constant on the image of N)."""
    if placement not in ("pre", "post"):
        raise AssumptionError("placement", "'pre' or 'post'", repr(placement), "pick the residual placement")
    bound = derive_block(f"{placement}-norm-residual", norm)
    values = {"L_N": _number("norm_constant", norm_constant), "L_F": _number("inner_constant", inner_constant)}
    return evaluate_block(bound, values, name=f"{placement}-LN residual")


def norm_image(norm) -> TokenDomain:
    """Where every output of the normalisation lies: a LayerNorm's image (:class:`LayerNormOutputs`,
    within ``max|gamma| sqrt(d)`` of beta), an RMSNorm's ball of radius ``max|gamma| sqrt(d)`` about 0."""
    if norm_kind(norm) == "layernorm":
        return LayerNormOutputs(norm)
    return TokenBall(upper(interval(norm.gamma_max) * IV.sqrt(norm.d)))


def fold_gain(norm, W_1, b_1=None):
    """``(Pi D_gamma W_1, beta W_1 + b_1)``: the first layer of ``F~`` (module docstring)."""
    W_1 = np.asarray(W_1, dtype=np.float64)
    folded = norm.gamma[:, None] * W_1
    if norm_kind(norm) == "layernorm":
        folded = folded - folded.mean(axis=0, keepdims=True)
        shift = norm.beta @ W_1
    else:
        shift = np.zeros(W_1.shape[1])
    return folded, shift + (0.0 if b_1 is None else np.asarray(b_1, dtype=np.float64))


def pre_norm_ffn_constants(norm, W_1, W_2, act: str, *, sigma_min: float | None = None, solver: str = "auto",
                           effort: int = 60, inner: CertifiedValue | None = None) -> dict:
    """``{"composed", "folded", "best"}`` for the pre-LN block ``x + F(N(x))`` (per token): the rule
    on ``Lip(N)`` and F's best constant (``inner`` when already computed), and on ``Lip(g)`` and
    LipSDP-Neuron of ``F~``."""
    floor = check_floor(sigma_min)
    if inner is None:
        inner = ffn_constants(W_1, W_2, act, solver=solver, effort=effort)["best"]
    composed = residual_constant("pre", norm_constant(norm, floor), inner)
    folded_W_1, _ = fold_gain(norm, W_1)
    radial = upper(1 / IV.sqrt(interval(floor or 0.0) ** 2 + interval(norm.eps)))
    folded_inner = lipsdp_neuron(folded_W_1, W_2, act, solver=solver, effort=effort)
    folded = residual_constant("pre", radial, folded_inner).renamed(
        "pre-LN residual, gain folded", details={"Lip(g)": radial, "Lip(F~)": folded_inner.value})
    return {"composed": composed, "folded": folded, "best": best([composed, folded])}
