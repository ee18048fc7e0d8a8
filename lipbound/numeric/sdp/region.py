r"""Where tokens live, for certified constants: ellipsoids ``{c + M w : ||w|| <= r}``, and the
trust-region supremum over them.

A ball ``B(c, R)`` is ``M = I``, ``r = R``; a LayerNorm image is ``M = diag(gamma) P``,
``P = I - 1 1^T / d``, ``r = sqrt(d)`` (:meth:`lipbound.numeric.domains.TokenDomain.shape`).  Tokens
of a flat region move only along ``range M``, whose orthogonal projector ``Pi`` is kept with the
region (identity for a ball): a direction ``e`` of a token satisfies ``e = Pi e``, so ``||W^T e||
<= ||W^T Pi|| ||e||`` for any matrix W.

**Trust region.**  ``sup_{||w|| <= r} ||F w + g||`` for a matrix ``F`` (k, d) and a vector ``g`` (k,):
with ``G = F^T F``, ``h = F^T g``, ``s_0 = ||g||^2`` the exact value solves the secular equation
``||(lambda I - G)^{-1} h|| = r``; certificate (S-lemma): if

    [[lambda' I - r^2 G, -r h], [-r h^T, tau - lambda' - s_0]]  >= 0

then ``[w / r; 1]`` gives ``||F w + g||^2 <= tau - lambda' (1 - ||w||^2 / r^2) <= tau`` on the ball, and
``sqrt(tau)`` is the certified value (never above the triangle bound ``r ||F|| + ||g||``, which is
also computed and reported when smaller).
"""

from __future__ import annotations

import functools
import math
import time
from typing import final

import numpy as np

from ...errors import AssumptionError
from ...rigorous.elementwise import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF
from ...rigorous.intervals import IV, interval, lower, upper
from ...rigorous.linalg import Enclosure, lambda_min_lower, spectral_norm_upper, vector_norm_upper
from ...rigorous.value import CertifiedValue
from ..blas import one_blas_thread
from ..domains import TokenDomain
from ..model import Head
from .joint import _check_head, sdp_value

__all__ = ["Region", "trust_region_sup", "key_gradient_sup", "column_scaled"]


@final
class Region:
    """Tokens ``c + M w`` with ``||w|| <= r``: the centre ``c`` (float, exact), the shape ``M`` (an
    :class:`Enclosure` (d, d); None: the identity), the radius ``r`` (an interval) and the projector
    ``Pi`` onto the directions tokens move in (None: the identity)."""

    def __init__(self, center: np.ndarray, radius, shape: Enclosure | None = None,
                 projector: Enclosure | None = None, description: str = "", domain: TokenDomain | None = None):
        self.domain = domain
        self.center = np.asarray(center, dtype=float)
        self.r = interval(radius)
        self.shape, self.projector = shape, projector
        self.d = self.center.size
        self.description = description or f"ball of radius {upper(self.r):.6g}"

    @classmethod
    def of(cls, where, center=None, d: int | None = None) -> Region:
        """A region from a :class:`TokenDomain`, a Region, or a ball's radius (and centre, default 0)."""
        if isinstance(where, Region):
            return where
        if isinstance(where, TokenDomain):
            R, c = where.enclosing_ball()
            width = d if c is None else c.size
            shape, r = where.shape(width)
            projector = where.tangent_projector()
            ball = projector is None and bool(np.array_equal(shape.mid, np.eye(width))) and shape.is_exact
            return cls(np.zeros(width) if c is None else c, r, None if ball else shape, projector, where.describe(),
                       where)
        try:
            radius = float(where)
        except (TypeError, ValueError):
            raise AssumptionError("radius", "a positive finite number or a TokenDomain", repr(where),
                                  "pass R > 0 or a domain (TokenBall, LayerNormOutputs)") from None
        if not (radius > 0 and math.isfinite(radius)):
            raise AssumptionError("radius", "a positive finite number", repr(where), "pass R > 0")
        center = np.zeros(d) if center is None else np.asarray(center, dtype=float)
        if (d is not None and center.shape != (d,)) or not np.all(np.isfinite(center)):
            raise AssumptionError("center", f"a finite vector of shape ({d},)", f"shape {center.shape}",
                                  "pass the ball's centre (the LayerNorm bias) or None")
        return cls(center, radius)

    @property
    def is_ball(self) -> bool:
        return self.shape is None and self.projector is None

    @property
    def R(self) -> float:
        """The radius r, rounded up."""
        return upper(self.r)

    def times_shape(self, F: Enclosure) -> Enclosure:
        """``F M`` for F (k, d); a diagonal M (an RMSNorm image) scales the columns."""
        if self.shape is None:
            return F
        diagonal = self._diagonal
        if diagonal is None:
            return F @ self.shape
        return column_scaled(F, diagonal)

    @functools.cached_property
    def _diagonal(self) -> np.ndarray | None:
        """The diagonal of an exact diagonal shape, else None."""
        shape = self.shape
        if shape is None or not shape.is_exact or np.any(shape.mid - np.diag(np.diag(shape.mid))):
            return None
        return np.diag(shape.mid).copy()

    def project(self, F: Enclosure) -> Enclosure:
        """``Pi F`` for F (d, k)."""
        return F if self.projector is None else self.projector @ F

    def same_as(self, other: Region) -> bool:
        if self is other:
            return True
        if self.domain is not None and other.domain is not None:
            return self.domain.same_as(other.domain)
        return (self.is_ball and other.is_ball and upper(self.r) == upper(other.r) and lower(self.r) == lower(other.r)
                and np.array_equal(self.center, other.center))


def column_scaled(F: Enclosure, scales: np.ndarray) -> Enclosure:
    """``F diag(scales)`` for exact float scales: each entry one product, ``|fl(x s) - x s| <= u |fl(x s)| + eta``."""
    mid = F.mid * scales
    rad = (np.abs(F.rad * scales) + UNIT_ROUNDOFF * np.abs(mid)) * (1 + 4 * UNIT_ROUNDOFF) + SMALLEST_SUBNORMAL
    return Enclosure(mid, rad)


def trust_region_sup(F: Enclosure | tuple, g: Enclosure, radius, name: str, provenance: str) -> CertifiedValue:
    """Certified ``sup_{||w|| <= r} ||F w + g||`` (module docstring); ``lower`` from the maximiser.

    ``F`` may be given as a factorisation ``(L, R)``, ``F = L R`` with a small inner dimension (a
    head's ``W_K`` and ``W_Q^T M``): ``F^T F = R^T (L^T L) R`` is then formed in thin products."""
    started = time.perf_counter()
    r_iv = interval(radius)
    if isinstance(F, tuple):
        left, right = F
        G = (right.T @ ((left.T @ left).sym() @ right)).sym()
        h = right.T @ (left.T @ g)
        F = left @ right
    else:
        G = (F.T @ F).sym()
        h = F.T @ g
    s0 = (g.T @ g)
    g_values, g_vectors = np.linalg.eigh(G.mid)
    g_max = max(float(g_values[-1]), 0.0)
    coeffs = (g_vectors.T @ h.mid.reshape(-1)) ** 2
    s0_mid = float(s0.mid.reshape(()))
    R = float(r_iv.mid)

    def tau(lam: float) -> float:
        return lam * R * R + s0_mid + float(np.sum(coeffs / (lam - g_values)))

    def slope(lam: float) -> float:
        return R * R - float(np.sum(coeffs / (lam - g_values) ** 2))

    floor = g_max * (1 + 1e-9) + 1e-12 * (g_max + math.sqrt(float(np.sum(coeffs))) / R + 1e-300)
    if slope(floor) >= 0:
        lam = floor                                      # the "hard case": optimum at lambda_max
    else:
        hi = g_max + math.sqrt(float(np.sum(coeffs))) / R + 1.0
        from scipy.optimize import brentq
        lam = max(brentq(slope, floor, hi, xtol=1e-15 * hi, rtol=1e-15), floor)
    value = tau(lam)
    d = G.shape[0]
    certificate: dict = {"lambda": lam, "tau_candidate": value}
    lam_scaled = upper(IV.mpf(lam) * r_iv * r_iv)
    top = Enclosure.exact(np.eye(d)).scale(lam_scaled) - G.scale(Enclosure.scalar(r_iv ** 2))
    side = h.scale(Enclosure.scalar(-r_iv))
    certified_tau = None
    for slack in (1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5):
        tau_c = upper(IV.mpf(value) * (1 + IV.mpf(slack)) + IV.mpf(slack) * IV.mpf(lam_scaled))
        corner = Enclosure.exact(np.array([[tau_c]])) - Enclosure.exact(np.array([[lam_scaled]])) - s0
        blocks = Enclosure(np.block([[top.mid, side.mid], [side.mid.T, corner.mid]]),
                           np.block([[top.rad, side.rad], [side.rad.T, corner.rad]]))
        if lambda_min_lower(blocks) >= 0.0:
            certified_tau = tau_c
            certificate.update(slack=slack, tau=tau_c)
            break
    triangle = upper(IV.mpf(spectral_norm_upper(F)) * r_iv + IV.mpf(vector_norm_upper(g.mid.reshape(-1)))
                     + IV.mpf(float(np.sqrt(np.sum(g.rad ** 2))) * (1 + 1e-12)))
    certificate["triangle_bound"] = triangle
    best_low = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = g_vectors @ ((g_vectors.T @ h.mid.reshape(-1)) / (lam - g_values))
    for direction in (z, g_vectors[:, -1], -g_vectors[:, -1]):
        size = float(np.linalg.norm(direction)) if np.all(np.isfinite(direction)) else 0.0
        if not 1e-150 < size < 1e150:
            continue
        w = direction / size * lower(r_iv) * (1 - 1e-9)
        w_enc = Enclosure.exact(w.reshape(-1, 1))
        if upper((w_enc.T @ w_enc).interval()) > lower(r_iv ** 2):
            continue
        vec = F @ w_enc + g
        norm2 = (vec.T @ vec).interval()
        best_low = max(best_low, lower(IV.sqrt(IV.mpf(max(lower(norm2), 0.0)))))
    certificate["lower"] = best_low
    if certified_tau is None:
        return sdp_value(name, triangle, True, certificate, "triangle", time.perf_counter() - started,
                         "certified", provenance + " (the S-lemma matrix was not certified PSD: triangle bound)",
                         lower=best_low)
    value_up = upper(IV.sqrt(IV.mpf(certified_tau)))
    return sdp_value(name, min(value_up, triangle), True, certificate, "secular-equation",
                     time.perf_counter() - started, "certified", provenance, lower=best_low)


@one_blas_thread
def key_gradient_sup(head: Head, radius: float, center: np.ndarray | None = None) -> CertifiedValue:
    r"""``beta = sup_{||x - c|| <= R} ||A^T x + u||``, ``u = W_K b_Q / sqrt(d_k)``: the exact trust-region
    value on a ball, certified by the S-lemma (:func:`trust_region_sup`, with ``F = A^T`` and
    ``g = A^T c + u``); the closed form's ``||A|| R + ||A^T c + u||`` is the certificate's
    ``triangle_bound``."""
    head = _check_head(head)
    region = Region.of(radius, center, head.d)
    F, g = key_gradient(head, region)
    return trust_region_sup(F, g, region.r, "beta",
                            "beta = sup_{||x-c||<=R} ||A^T x + u||: trust-region secular equation, certified by an "
                            "S-lemma PSD check; lipbound.numeric.sdp.region.key_gradient_sup")


def key_gradient(head: Head, queries: Region, keys: Region | None = None, side: str = "project"):
    """``((L, R), g)`` with ``L R = K A^T M_Q`` and ``g = K (A^T c_Q + u)``: the key gradient
    ``A^T x + u`` at ``x = c_Q + M_Q w`` is ``(A^T M_Q) w + (A^T c_Q + u)``; ``K`` is the keys' projector
    ``Pi`` (``side="project"``), their ``M^T`` (``side="shape"``), or the identity (``keys`` None)."""
    scale = Enclosure.scalar(1 / IV.sqrt(IV.mpf(head.d_k)))
    W_Q, W_K = Enclosure.exact(head.W_Q), Enclosure.exact(head.W_K)
    if keys is not None:
        W_K = keys.project(W_K) if side == "project" else keys.times_shape(W_K.T).T
    right = queries.times_shape(W_Q.T).scale(scale)                     # W_Q^T M_Q / sqrt(d_k), (d_k, d)
    shift = W_K @ (W_Q.T @ Enclosure.exact(queries.center.reshape(-1, 1))
                   + Enclosure.exact(head.b_Q.reshape(-1, 1))).scale(scale)
    return (W_K, right), shift
