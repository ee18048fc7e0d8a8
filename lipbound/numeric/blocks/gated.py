r"""Gated feed-forward blocks (SwiGLU, GeGLU) as maps: Jacobian, domain, certified constants.

Tokens are rows: ``f(x) = (phi(x W_g + b_g) * (x W_u + b_u)) W_d + b_d`` with the arrays of the model
description's :class:`~lipbound.numeric.model.GatedFeedForward` (``W_g, W_u`` (d, m), ``W_d`` (m, d)),
which is also its forward map.
With ``g = x W_g + b_g`` and ``u = x W_u + b_u`` the Jacobian is

    Df(x) = W_d^T (diag(phi'(g) * u) W_g^T + diag(phi(g)) W_u^T)                     (d_out x d),

unbounded on ``R^d`` (the block grows quadratically: ``lipbound derive swiglu --domain unbounded``), so
every constant here holds on a bounded domain, an :class:`~lipbound.numeric.sdp.gated.Ellipsoid`
(:func:`ellipsoid_of`: a ball, a LayerNorm image, or an RMSNorm image ``{gamma * u : ||u|| <= sqrt(d)}``
-- what the block reads in a pre-norm decoder).  Certified constants:

* :func:`closed_form` -- the theorem ``gated-feed-forward`` of :mod:`lipbound.symbolic.gated`,
  ``r (ell_phi Gamma_up + Gamma_gate)`` with ``r`` the largest token norm on the domain, evaluated in
  interval arithmetic on the weights (biases: the unit on ``(x, 1)`` with ``[W; b^T]``, an isometric
  copy, on the ball of radius ``sqrt(r^2 + 1)``);
* the lifted SDP of :mod:`lipbound.numeric.sdp.gated`, which sees the matrices jointly.
"""

from __future__ import annotations

import numpy as np

from ...errors import WeightsError
from ...rigorous.elementwise import SMALLEST_SUBNORMAL
from ...rigorous.intervals import IV, interval
from ...rigorous.linalg import Enclosure, vector_norm_upper
from ...rigorous.value import CertifiedValue, not_certified
from ...symbolic.assumptions import Ball
from ...symbolic.gated import GATED
from ..domains import LayerNormOutputs, TokenDomain
from ..model.components import GatedFeedForward
from ..normalization import Normalization
from ..sdp.gated import Ellipsoid, gated_sdp
from .activations import activation_maps, slope_range
from .certify import best, derive_block, evaluate_block

__all__ = ["check_gated", "jacobian", "ellipsoid_of", "closed_form", "gated_constants", "BLOCK_OF"]

#: activation -> the symbolic block whose theorem covers it (``swiglu``, ``geglu``, ``geglu-tanh``)
BLOCK_OF = {activation: name for name, (activation, _) in GATED.items()}


def check_gated(ffn) -> GatedFeedForward:
    if not isinstance(ffn, GatedFeedForward):
        raise WeightsError("ffn", "a lipbound.numeric.model.GatedFeedForward", type(ffn).__name__,
                           "pass layer.ffn of a gated layer (Llama, Qwen, Mistral, Gemma)")
    return ffn


def jacobian(ffn: GatedFeedForward, x) -> np.ndarray:
    """``Df(x)`` (d_out x d) at one token (module docstring)."""
    ffn = check_gated(ffn)
    maps = activation_maps(ffn.act)
    x = np.asarray(x, dtype=np.float64)
    g, u = x @ ffn.W_gate + ffn.b_gate, x @ ffn.W_up + ffn.b_up
    return ((ffn.W_gate * (maps.slope(g) * u) + ffn.W_up * maps.forward(g)) @ ffn.W_down).T


def ellipsoid_of(domain, d: int) -> Ellipsoid:
    """The tokens of ``domain`` in ``R^d`` as ``{c + M w : ||w|| <= r}``: a bounded :class:`TokenDomain` (a
    ball, a LayerNorm image: :meth:`TokenDomain.shape`), or a normalisation, meaning its image (an
    RMSNorm's: ``c = 0``, ``M = diag(gamma)``, ``r = sqrt(d)``, lemma ``rmsnorm-image``)."""
    if isinstance(domain, Normalization):
        if domain.kind == "rmsnorm":
            return Ellipsoid(None, Enclosure.exact(np.diag(domain.gamma)), IV.sqrt(IV.mpf(domain.d)))
        domain = LayerNormOutputs(domain)
    if not isinstance(domain, TokenDomain):
        raise WeightsError("domain", "a bounded TokenDomain or the norm whose image the block reads",
                           type(domain).__name__, "pass layer.ffn_norm, or TokenBall(R)")
    domain.enclosing_ball()                                          # refuses all of R^d
    domain.check_width(d, "the feed-forward block")
    axes, radius = domain.shape(d)
    return Ellipsoid(domain.center, axes, radius)


def _augmented(ffn: GatedFeedForward, radius) -> tuple[np.ndarray, np.ndarray, object]:
    """``(W_g, W_u, r)`` of a bias-free unit equal to ``ffn`` on ``(x, 1)`` when it has biases."""
    if not (np.any(ffn.b_gate) or np.any(ffn.b_up)):
        return ffn.W_gate, ffn.W_up, interval(radius)
    return (np.vstack([ffn.W_gate, ffn.b_gate]), np.vstack([ffn.W_up, ffn.b_up]),
            IV.sqrt(interval(radius) ** 2 + 1))


def _column_scaled(W: np.ndarray, scale: np.ndarray) -> Enclosure:
    """``W diag(scale)`` enclosed (one rounding per entry)."""
    mid = W * scale
    return Enclosure(mid, np.abs(mid) * 2.0 ** -52 + SMALLEST_SUBNORMAL)


def _factored_gain(W_down: np.ndarray, inner: np.ndarray, outer: np.ndarray):
    """``||W_down^T D^(1/2)|| ||D^(1/2) inner^T||``, ``D = diag ||outer[:, i]||``, certified from above with
    ``s_i >= ||outer[:, i]||^(1/2)`` in floats (any such s keeps the proof)."""
    norms = np.array([vector_norm_upper(column) for column in outer.T])
    s = np.nextafter(np.sqrt(norms), np.inf)
    while np.any(s * s < norms):                                     # s_i^2 >= the column norm, exactly
        s = np.where(s * s < norms, np.nextafter(s, np.inf), s)
    left = _column_scaled(W_down.T, s).norm_interval()
    right = _column_scaled(inner, s).norm_interval()
    return left * right


def closed_form(ffn: GatedFeedForward, domain, norm: str = "fro") -> CertifiedValue:
    """``r (ell_phi Gamma_up + Gamma_gate)`` (theorem ``gated-feed-forward``) on ``domain``, certified."""
    ffn = check_gated(ffn)
    ellipsoid = domain if isinstance(domain, Ellipsoid) else ellipsoid_of(domain, ffn.d)
    name = BLOCK_OF.get(slope_range(ffn.act).name)
    if name is None:
        return not_certified("closed form", "lipbound theorem gated-feed-forward",
                             f"no gated theorem for the activation {ffn.act!r} (SiLU, GELU, tanh GELU)")
    W_gate, W_up, r = _augmented(ffn, ellipsoid.outer_radius)
    bound = derive_block(name, norm, domain=Ball())
    values = {"R": r, "ell_phi": interval(slope_range(ffn.act).ell), "d": ffn.d,
              "Gamma_up": _factored_gain(ffn.W_down, W_gate, W_up),
              "Gamma_gate": _factored_gain(ffn.W_down, W_up, W_gate)}
    return evaluate_block(bound, values, name="closed form")


def gated_constants(ffn: GatedFeedForward, domain, *, norm: str = "fro", sdp: bool = True,
                    effort: int = 16) -> dict:
    """``{"closed form", "lifted SDP", "best"}`` of the gated block on ``domain`` (certified values in
    ``norm``; the SDP only when ``sdp``)."""
    ffn = check_gated(ffn)
    ellipsoid = domain if isinstance(domain, Ellipsoid) else ellipsoid_of(domain, ffn.d)
    values = {"closed form": closed_form(ffn, ellipsoid, norm)}
    if sdp:
        values["lifted SDP"] = gated_sdp(ffn.W_gate, ffn.W_up, ffn.W_down, ffn.act, ellipsoid, b_gate=ffn.b_gate,
                                         b_up=ffn.b_up, norm=norm, effort=effort)
    values["best"] = best(list(values.values()))
    return values
