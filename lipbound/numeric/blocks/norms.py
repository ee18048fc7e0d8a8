r"""LayerNorm and RMSNorm as maps: forward pass, Jacobian, certified constants.

Both are ``N(x) = D_gamma g(Pi x) + beta`` with ``g(u) = u / sqrt(||u||^2 / d + eps)``,
``D_gamma = diag(gamma)``, ``Pi = I - 1 1^T / d`` for LayerNorm and ``Pi = I``, ``beta = 0`` for
RMSNorm (:mod:`lipbound.symbolic.blocks`).  With ``c = Pi x`` and ``s = sqrt(||c||^2 / d + eps)``
the Jacobian is

    DN(x) = D_gamma (Pi - c c^T / (d s^2)) / s                                    (d x d),

and the constant is ``||D_gamma Pi|| / sqrt(eps)`` on all of ``R^d``, ``||D_gamma Pi|| /
sqrt(sigma_min^2 + eps)`` on tokens whose variance (RMSNorm: mean square) is at least
``sigma_min^2`` -- both attained (:func:`lipbound.numeric.witness.blocks.norm_witness`).  The
middle factor of ``DN(x)`` has its eigenvalues in ``[0, 1]`` on ``range(Pi)``, so at one token
``||DN(x)|| <= ||D_gamma Pi|| / s(x)`` (:func:`local_constants`; RMSNorm: ``max|gamma| / rms``, lemma
``rmsnorm-jacobian``), largest where the token's mean square is smallest -- which is why a model's
large-norm tokens (SmolLM2's attention sink) meet a norm that barely stretches them.  The image
``{c + M u : ||u|| <= sqrt(d)}`` (an RMSNorm's: ``M = diag(gamma)``, ``c = 0``, lemma ``rmsnorm-image``) is
:func:`lipbound.numeric.blocks.gated.ellipsoid_of`.  The classes are the model description's
(:mod:`lipbound.numeric.normalization`).
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import AssumptionError, WeightsError
from ...rigorous.intervals import IV, interval, upper
from ...rigorous.linalg import Enclosure, vector_norm_lower, vector_norm_upper
from ...rigorous.value import CertifiedValue
from ..normalization import Normalization
from ..sdp.joint import _layernorm_projector  # diag(gamma) P as an enclosure, written once
from .certify import derive_block, evaluate_block

__all__ = ["norm_kind", "norm_jacobian", "gain_interval", "norm_constant", "check_floor", "local_constants"]


def norm_kind(norm) -> str:
    """``"layernorm"`` or ``"rmsnorm"`` (:attr:`~lipbound.numeric.normalization.Normalization.kind`)."""
    if isinstance(norm, Normalization):
        return norm.kind
    raise WeightsError("norm", "a LayerNorm or an RMSNorm", type(norm).__name__,
                       "build LayerNorm(gamma, beta, eps) or RMSNorm(gamma, eps)")


def check_floor(sigma_min) -> float | None:
    """A variance floor as a positive float, or None (no floor)."""
    if sigma_min is None:
        return None
    value = float(sigma_min)
    if not (math.isfinite(value) and value > 0):
        raise AssumptionError("sigma_min", "a positive finite number (or None: no variance floor)",
                              repr(sigma_min), "state the smallest standard deviation of the tokens, e.g. 0.5")
    return value


def norm_jacobian(norm, x: np.ndarray) -> np.ndarray:
    """``DN(x)`` (d x d) at one token x (module docstring)."""
    kind = norm_kind(norm)
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    d = norm.d
    if x.shape != (d,):
        raise WeightsError("x", f"one token of {d} features", f"shape {x.shape}", "pass a vector")
    centred = x - x.mean() if kind == "layernorm" else x
    scale = math.sqrt(float(centred @ centred) / d + norm.eps)
    projection = np.eye(d) - (1.0 / d if kind == "layernorm" else 0.0)
    return norm.gamma[:, None] * (projection - np.outer(centred, centred) / (d * scale ** 2)) / scale


def gain_interval(norm):
    """An interval holding ``||D_gamma Pi||`` (LayerNorm) or ``gamma_max`` (RMSNorm, exact)."""
    if norm_kind(norm) == "rmsnorm":
        return interval(norm.gamma_max)
    return _layernorm_projector(norm.gamma).norm_interval()


def norm_constant(norm, sigma_min: float | None = None, norm_key: str = "fro") -> CertifiedValue:
    """The certified Lipschitz constant of a LayerNorm or RMSNorm (the theorem ``layernorm-global``,
    ``layernorm-variance-floor``, ...), evaluated on its gain and epsilon.

    Parameters
    ----------
    norm : LayerNorm or RMSNorm
    sigma_min : float, optional
        Every token's standard deviation (RMSNorm: root mean square) is at least this.
    norm_key : {"fro", "2,1", "2,inf", "inf"}
        The norm on X (the first three give the per-token constant).
    """
    kind = norm_kind(norm)
    floor = check_floor(sigma_min)
    bound = derive_block(kind, norm_key, floor=floor is not None)
    values = {"D_gamma*Pi": gain_interval(norm), "gamma_max": interval(norm.gamma_max), "eps": interval(norm.eps),
              "d": interval(norm.d)}
    if floor is not None:
        values["sigma_min"] = interval(floor)
    return evaluate_block(bound, values, name="derived")


def local_constants(norm, X) -> np.ndarray:
    """Certified upper bounds of ``||DN(x)||`` at each token x (rows of X (..., d)): ``||D_gamma Pi|| /
    sqrt(||Pi x||^2 / d + eps)`` rounded up (module docstring), shape ``X.shape[:-1]``."""
    norm_kind(norm)
    X = np.asarray(X, dtype=np.float64)
    if X.shape[-1] != norm.d:
        raise WeightsError("X", f"tokens of {norm.d} features (last axis)", f"shape {X.shape}", "tokens are rows")
    rows = Enclosure.exact(X.reshape(-1, norm.d))
    if norm.centred:
        rows = rows - (rows @ Enclosure.exact(np.ones((norm.d, 1)))).scale(1 / IV.mpf(norm.d))
    gain, eps, d = gain_interval(norm), interval(norm.eps), IV.mpf(norm.d)
    out = []
    for mid, rad in zip(rows.mid, rows.rad):
        length = interval(vector_norm_lower(mid)) - interval(vector_norm_upper(rad))
        length = length if length.a > 0 else interval(0)
        out.append(upper(gain / IV.sqrt(length ** 2 / d + eps)))
    return np.array(out).reshape(X.shape[:-1])
