r"""Feed-forward blocks as maps: forward pass, Jacobian, certified closed forms.

Tokens are rows: ``f(x) = phi(x W_1 + b_1) W_2 + b_2`` with ``W_1`` (d, d_ff), ``W_2`` (d_ff, d_out)
-- the arrays of the model description's :class:`~lipbound.numeric.model.FeedForward` (see
:func:`arrays`), with any activation of :mod:`lipbound.symbolic.activations`.  With
``z = x W_1 + b_1`` the Jacobian acting on a column ``e`` is ``W_2^T diag(phi'(z)) W_1^T e``.

Certified per-token constants (each a :class:`~lipbound.rigorous.value.CertifiedValue`):

* :func:`closed_form` -- the theorem ``feed-forward``: ``||W_2|| ell_phi ||W_1||``;
* :func:`midpoint_form` -- ``f(x) - f(y) = ((x - y) W_1) S W_2`` with ``S = diag(s_k)`` the secant
  slopes, ``s_k`` in ``[alpha, beta]``; writing ``S = mu I + E``, ``mu = (alpha + beta) / 2``,
  ``|E_kk| <= r = (beta - alpha) / 2``: ``Lip <= |mu| ||W_1 W_2|| + r ||W_1|| ||W_2||`` (the linear
  part of GELU counts once, not ``ell_phi`` times);
* LipSDP-Neuron with the activation's slope range, :func:`lipbound.numeric.sdp.ffn.lipsdp_neuron`.

:func:`lift` turns a per-token constant into one for a norm on X by the theorem ``tokenwise``.
"""

from __future__ import annotations

import numpy as np

from ...errors import WeightsError
from ...rigorous.intervals import Verdict, interval, upper
from ...rigorous.linalg import product_norm_interval, spectral_norm_bounds
from ...rigorous.value import CertifiedValue
from ...symbolic import theorems as T
from ...symbolic.assumptions import norm_from_key
from ..model.components import FeedForward
from .activations import activation_maps, check_activation, slope_range
from .certify import NORMS, derive_block, enclose, evaluate_block

__all__ = ["arrays", "check_weights", "forward", "jacobian", "closed_form", "midpoint_form", "lift"]


def arrays(ffn: FeedForward) -> dict:
    """The plain arrays of a model description's feed-forward block, as keyword arguments."""
    if not isinstance(ffn, FeedForward):
        raise WeightsError("ffn", "a lipbound.numeric.model.FeedForward", type(ffn).__name__, "pass layer.ffn")
    return {"W_1": ffn.W_1, "b_1": ffn.b_1, "W_2": ffn.W_2, "b_2": ffn.b_2, "act": ffn.act}


def check_weights(W_1, W_2, b_1=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Finite float arrays ``W_1`` (d, d_ff), ``W_2`` (d_ff, d_out), ``b_1`` (d_ff,) (zeros if None)."""
    W_1, W_2 = (np.asarray(W, dtype=np.float64) for W in (W_1, W_2))
    if W_1.ndim != 2 or W_2.ndim != 2 or W_1.shape[1] != W_2.shape[0]:
        raise WeightsError("W_1, W_2", "W_1 (d, d_ff) and W_2 (d_ff, d_out)", f"shapes {W_1.shape}, {W_2.shape}",
                           "tokens are rows: pass Hugging Face weight.T")
    b_1 = np.zeros(W_1.shape[1]) if b_1 is None else np.asarray(b_1, dtype=np.float64)
    if b_1.shape != (W_1.shape[1],):
        raise WeightsError("b_1", f"shape ({W_1.shape[1]},)", f"shape {b_1.shape}", "one bias per hidden unit")
    for name, value in (("W_1", W_1), ("W_2", W_2), ("b_1", b_1)):
        if not np.all(np.isfinite(value)):
            raise WeightsError(name, "finite entries", "NaN or Inf", "the checkpoint is corrupt or diverged")
    return W_1, W_2, b_1


def forward(X, W_1, b_1, W_2, b_2, act: str) -> np.ndarray:
    """``phi(X W_1 + b_1) W_2 + b_2`` for tokens X (..., d)."""
    W_1, W_2, b_1 = check_weights(W_1, W_2, b_1)
    return activation_maps(check_activation(act)).forward(np.asarray(X, dtype=np.float64) @ W_1 + b_1) @ W_2 + b_2


def jacobian(x, W_1, b_1, W_2, act: str) -> np.ndarray:
    """``Df(x) = W_2^T diag(phi'(x W_1 + b_1)) W_1^T`` (d_out x d) at one token."""
    W_1, W_2, b_1 = check_weights(W_1, W_2, b_1)
    slopes = activation_maps(check_activation(act)).slope(np.asarray(x, dtype=np.float64) @ W_1 + b_1)
    return ((W_1 * slopes) @ W_2).T


def lift(value: CertifiedValue, norm: str, d: int) -> CertifiedValue:
    """A per-token constant as a constant in ``norm`` on X (theorem ``tokenwise``: unchanged in the
    Frobenius, (2,1) and (2,inf) norms, times ``sqrt(d)`` in l_inf on vec(X))."""
    if norm not in NORMS:
        raise WeightsError("norm", f"one of {', '.join(NORMS)}", repr(norm), "e.g. norm='fro'")
    if not value.certified or norm != "inf":
        return value
    statement = T.tokenwise(T.component("L_f", "f"), norm_from_key(norm)).statement
    lifted = enclose(statement, {"L_f": value.value, "d": d})
    return value.renamed(value.name, value=upper(lifted), details={**value.details, "norm": norm,
                                                                   "per_token": value.value})


def _norms(W_1, W_2):
    return interval(spectral_norm_bounds(W_1)), interval(spectral_norm_bounds(W_2))


def closed_form(W_1, W_2, act: str, norm: str = "fro") -> CertifiedValue:
    """``||W_2|| ell_phi ||W_1||`` (theorem ``feed-forward``), certified."""
    W_1, W_2, _ = check_weights(W_1, W_2)
    bound = derive_block("feed-forward", norm)
    n1, n2 = _norms(W_1, W_2)
    values = {"W_1": n1, "W_2": n2, "ell_phi": interval(slope_range(check_activation(act)).ell), "d": W_1.shape[0]}
    return evaluate_block(bound, values, name="closed form")


def midpoint_form(W_1, W_2, act: str, norm: str = "fro") -> CertifiedValue:
    """``|mu| ||W_1 W_2|| + r ||W_1|| ||W_2||`` with ``mu, r`` the midpoint and radius of the slope
    range (module docstring), certified."""
    W_1, W_2, _ = check_weights(W_1, W_2)
    slopes = slope_range(check_activation(act))
    alpha, beta = interval(slopes.alpha), interval(slopes.beta)
    n1, n2 = _norms(W_1, W_2)
    linear = product_norm_interval(W_1, W_2)
    value = abs((alpha + beta) / 2) * linear + (beta - alpha) / 2 * n1 * n2
    per_token = CertifiedValue("midpoint form", upper(value), Verdict.HOLDS,
                               "secant slopes mu I + E, |E| <= r: |mu| ||W_1 W_2|| + r ||W_1|| ||W_2|| "
                               "(lipbound.numeric.blocks.ffn.midpoint_form)",
                               details={"W_1 W_2": upper(linear), "alpha": slopes.alpha, "beta": slopes.beta})
    return lift(per_token, norm, W_1.shape[0])
