"""Every certified constant of a block side by side, and the residual rule on certified numbers.

These are the calls a whole-model composition makes per block, with plain arrays:

* :func:`ffn_constants` -- the closed form, the midpoint form and LipSDP-Neuron of a
  feed-forward block, and the best of them;
* :func:`residual_constant` -- the rule of :func:`lipbound.symbolic.theorems.norm_residual`
  (pre-LN ``1 + L_F L_N``, post-LN ``L_N (1 + L_F)``; with LayerScale ``1 + lambda_max L_F L_N``, with a
  sandwich norm N' on the branch ``1 + L_N' L_F L_N``, both at once ``1 + lambda_max L_N' L_F L_N``),
  evaluated in interval arithmetic on certified constants;
* :func:`pre_norm_ffn_constants` -- ``x + F(N(x))`` twice: the rule on the two constants, and the
  rule with N's gain folded into F: ``N(x) = D_gamma g(Pi x) + beta`` and ``g`` maps into the
  mean-zero hyperplane, so ``F(N(x)) = F~(g(Pi x))`` with ``F~(u) = phi(u W~_1 + b~_1) W_2 + b_2``,
  ``W~_1 = Pi D_gamma W_1``, ``b~_1 = beta W_1 + b_1``; then ``Lip(F o N) <= Lip(F~) Lip(g)`` with
  ``Lip(g) = (sigma_min^2 + eps)^{-1/2}`` (lemma ``radial-normalization``) -- the same rule
  with other components, and the alignment of the gain with ``W_1`` counted once;
* :func:`pre_norm_gated_constants` -- ``x + a * N'(f(N(x)))`` for a gated f after an RMSNorm (or a
  LayerNorm): the rule on ``Lip(N)`` and f's best constant on N's image, and the rule with N's gain
  folded into f: ``N(x) = c + M g(x)`` with g the radial map into the ball of radius ``sqrt(d)``
  (``Lip(g) = eps^{-1/2}``), so ``f(N(x)) = f~(g(x))``, ``f~(w) = f(c + M w)`` bounded by the lifted SDP
  with ``fold=True``;
* :func:`norm_image` -- the domain fact: every output of a normalisation lies in its image
  (whatever came in), a bounded set, which is the domain of the block that reads it.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import AssumptionError
from ...rigorous.intervals import IV, interval, upper
from ...rigorous.value import CertifiedValue
from ...symbolic.assumptions import Assumptions, Unbounded
from ...symbolic.blocks import NormResidual
from ..domains import LayerNormOutputs, TokenBall, TokenDomain
from ..sdp.ffn import lipsdp_neuron
from ..sdp.gated import gated_sdp
from .certify import best, derive_block, evaluate_block
from .ffn import closed_form, midpoint_form
from .gated import check_gated, ellipsoid_of, gated_constants
from .norms import check_floor, norm_constant, norm_kind

__all__ = ["ffn_constants", "best", "residual_constant", "pre_norm_ffn_constants", "pre_norm_gated_constants",
           "folded_gated_sdp", "fold_gain", "norm_image", "layerscale_gain"]


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


def layerscale_gain(scale) -> float:
    """``lambda_max = max_k |lambda_k|`` of a LayerScale gain (exact: one of the entries); 1 for None."""
    return 1.0 if scale is None else float(np.max(np.abs(np.asarray(scale, dtype=np.float64))))


def residual_constant(placement: str, norm_constant, inner_constant, norm: str = "fro", *, scale=None,
                      after=None) -> CertifiedValue:
    """The constant of ``x + F(N(x))`` (``"pre"``) or ``N(x + F(x))`` (``"post"``) from certified
    constants of N and F in ``norm`` (for ``"pre"``, F's constant on the image of N).

    ``scale`` (LayerScale: the gain vector, or its largest magnitude) and ``after`` (the certified
    constant of a sandwich norm N' on the branch, ``x + N'(F(N(x)))``) belong to pre-norm blocks."""
    if placement not in ("pre", "post"):
        raise AssumptionError("placement", "'pre' or 'post'", repr(placement), "pick the residual placement")
    values = {"L_N": _number("norm_constant", norm_constant), "L_F": _number("inner_constant", inner_constant)}
    if scale is None and after is None:
        bound = derive_block(f"{placement}-norm-residual", norm)
        return evaluate_block(bound, values, name=f"{placement}-LN residual")
    if placement != "pre":
        raise AssumptionError("placement", "'pre' with LayerScale or a sandwich norm", repr(placement),
                              "LayerScale and sandwich norms belong to pre-norm blocks")
    rule = NormResidual("pre", layerscale=scale is not None, sandwich=after is not None)
    bound = rule.derive(Assumptions(domain=Unbounded(), norm=norm))
    if scale is not None:
        values["lambda_max"] = _number("scale", scale if np.ndim(scale) == 0 else layerscale_gain(scale))
    if after is not None:
        values["L_N'"] = _number("after", after)
    return evaluate_block(bound, values, name="pre-LN residual" + (", LayerScale" if scale is not None else "")
                          + (", sandwich" if after is not None else ""))


def folded_gated_sdp(norm, ffn, *, effort: int = 16) -> CertifiedValue:
    """``Lip(f~)``, ``f~(w) = f(c + M w)`` on the ball ``||w|| <= sqrt(d)`` (module docstring): the lifted
    SDP with ``fold=True``.  It reads the norm's image (gain, centre, width), never its ``eps``."""
    ffn = check_gated(ffn)
    return gated_sdp(ffn.W_gate, ffn.W_up, ffn.W_down, ffn.act, ellipsoid_of(norm, ffn.d), b_gate=ffn.b_gate,
                     b_up=ffn.b_up, fold=True, effort=effort)


def pre_norm_gated_constants(norm, ffn, *, effort: int = 16, inner: CertifiedValue | None = None, scale=None,
                             after=None, sdp: bool = True, folded: CertifiedValue | None = None) -> dict:
    """``{"composed", "folded", "best"}`` for the pre-norm block ``x + a * N'(f(N(x)))`` with a gated f
    (per token): the rule on ``Lip(N)`` and f's best constant on N's image (``inner`` when already
    computed), and on ``Lip(g) = eps^{-1/2}`` and the lifted SDP of ``f~`` (module docstring; only when
    ``sdp``; ``folded``: :func:`folded_gated_sdp` when already computed).  ``scale``: LayerScale gain;
    ``after``: the sandwich norm's certified constant."""
    ffn = check_gated(ffn)
    if inner is None:
        inner = gated_constants(ffn, norm, effort=effort, sdp=sdp)["best"]
    composed = residual_constant("pre", norm_constant(norm), inner, scale=scale, after=after)
    values = {"composed": composed}
    if sdp:
        radial = upper(1 / IV.sqrt(interval(norm.eps)))
        folded_inner = folded if folded is not None else folded_gated_sdp(norm, ffn, effort=effort)
        if folded_inner.certified:
            values["folded"] = residual_constant("pre", radial, folded_inner, scale=scale, after=after).renamed(
                "pre-norm residual, gain folded", details={"Lip(g)": radial, "Lip(f~)": folded_inner.value})
    values["best"] = best(list(values.values()))
    return values


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
