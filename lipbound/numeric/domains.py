"""Where the tokens of an attention's input live: the one domain object of the numeric layer.

A domain is parsed once, at the edge (a CLI option or a Python call), and passed unchanged to
everything that needs it: the symbolic derivation (:attr:`TokenDomain.assumption`, the domain
of :mod:`lipbound.symbolic.assumptions` the theorem is derived on), the rigorous evaluation
(:meth:`TokenDomain.symbol_values`, intervals for the radius and the LayerNorm gain), the
witness search and the SDP relaxations (:meth:`TokenDomain.enclosing_ball`), the re-check of
a witness (:meth:`TokenDomain.contains`) and the reports (:meth:`TokenDomain.describe`).

* :class:`TokenBall` -- every token in the closed ball ``||x - c|| <= R``;
* :class:`LayerNormOutputs` -- every token an output ``gamma * z + beta`` of a LayerNorm
  (``z`` orthogonal to 1, ``||z|| <= sqrt(d)``): its hull is the ellipsoid
  ``{beta + M w : ||w|| <= sqrt(d)}``, ``M = diag(gamma) P``, ``P = I - 1 1^T / d``, flat (it lies in
  the hyperplane ``beta + diag(gamma) 1-perp``), inside the ball of radius ``max|gamma| sqrt(d)``
  about ``beta``.

Every bounded domain is such an ellipsoid ``{c + M w : ||w|| <= r}`` (a ball: ``M = I``, ``r = R``):
:meth:`TokenDomain.shape` gives ``(M, r)`` as enclosures for certified bounds,
:meth:`TokenDomain.frame` an orthonormal basis of the directions tokens move in with the
semi-axes for the searches, and :meth:`TokenDomain.representable` turns a float input into one
that lies in the domain exactly, with the coordinates that prove it (:meth:`TokenDomain.record`
stores the domain in a witness file).

:class:`DomainSpec` is the unresolved form a user writes (``"layernorm"``, ``"layernorm-image"``
or a radius), resolved per layer against the LayerNorm that feeds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..rigorous.intervals import IV, interval
from ..rigorous.linalg import Enclosure, vector_norm_upper
from ..symbolic import symbols as S
from ..symbolic.assumptions import Ball, Domain, LayerNormImage, RMSNormImage, Unbounded
from .model.components import LayerNorm, RMSNorm


def project_to_ball(X: np.ndarray, radius: float, center) -> np.ndarray:
    """Euclidean projection of the rows of X (..., d) onto the ball ``||x - c|| <= radius``."""
    shifted = np.asarray(X, dtype=float) - center
    norms = np.linalg.norm(shifted, axis=-1, keepdims=True)
    return shifted * np.where(norms > radius, radius / np.where(norms > 0, norms, 1.0), 1.0) + center

__all__ = ["TokenDomain", "TokenBall", "LayerNormOutputs", "RMSNormOutputs", "AllTokens", "DomainSpec", "DOMAIN_SPECS",
           "domain_from_plain"]


class TokenDomain:
    """A convex set holding every token.  Abstract: see :class:`TokenBall`, :class:`LayerNormOutputs`."""

    key: str = ""

    @property
    def assumption(self) -> Domain:
        """The symbolic domain the theorems are derived on."""
        raise NotImplementedError

    @property
    def center(self) -> np.ndarray | None:
        """The centre ``c`` the symbolic domain refers to (None: the origin)."""
        raise NotImplementedError

    def enclosing_ball(self) -> tuple[float, np.ndarray | None]:
        """``(R, c)``: a closed ball about c (None: 0) of radius R holding the domain; R rounded up."""
        raise NotImplementedError

    def symbol_values(self, centred: bool) -> dict:
        """Intervals for the domain's symbols by name: ``R`` and, for LayerNorm outputs, ``gamma_max``.

        ``centred``: the bound refers to the centre ``c`` (it was derived on a ball about c), so
        ``R`` is the radius about c; otherwise the bound assumed a ball about 0 and ``R`` is the
        radius of a ball about 0 holding the domain (``R + ||c||``).  Both are sound.
        """
        R, c = self.enclosing_ball()
        if centred or c is None:
            values = {"R": interval(R)}
        else:
            values = {"R": interval(R) + interval(vector_norm_upper(c))}
        return values

    def describe(self) -> str:
        raise NotImplementedError

    # the ellipsoid {c + M w : ||w|| <= r} ----------------------------------------------------
    def shape(self, d: int) -> tuple[Enclosure, object]:
        """``(M, r)``: every token is ``c + M w`` with ``||w|| <= r``; ``M`` (d, d) an enclosure, ``r`` an
        interval.  A ball: ``M = I``, ``r = R``."""
        R, _ = self.enclosing_ball()
        return Enclosure.exact(np.eye(d)), interval(R)

    def tangent_projector(self) -> Enclosure | None:
        """The orthogonal projector onto the directions the tokens move in (``range M``), as an
        enclosure; None when they move in every direction (the domain has interior)."""
        return None

    def frame(self, d: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``(c, T, S)`` in floats, for searches: the domain is ``{c + T (S * v) : ||v|| <= 1}`` with ``T``
        (d, r) orthonormal columns (None: ``T = I``, r = d) and semi-axes ``S`` (r,)."""
        R, c = self.enclosing_ball()
        return (np.zeros(d) if c is None else np.asarray(c, dtype=float)), None, np.full(d, R)

    def representable(self, X: np.ndarray, margin: float = 1e-9) -> tuple[np.ndarray, dict]:
        """``(X', coordinates)``: tokens near X (..., d) that lie in the domain exactly, pulled a relative
        ``margin`` inside; ``coordinates`` holds what proves membership exactly (empty for a ball,
        whose re-check tests ``||x - c|| <= R`` on X' itself)."""
        R, c = self.enclosing_ball()
        center = 0.0 if c is None else c
        for shrink in (margin, 4 * margin, 16 * margin, 1e-6):
            inside = project_to_ball(X, R * (1 - shrink), center)
            if np.all(np.linalg.norm(inside - center, axis=-1) <= R * (1 - shrink / 2)):
                return inside, {}
        raise AssumptionError("X", "tokens that can be pulled inside the domain", "tokens that rounding keeps outside",
                              "report this input")

    def representable_directions(self, E: np.ndarray) -> tuple[np.ndarray, dict]:
        """``(E', coordinates)``: directions near E along which the tokens may move (tangent to the
        domain) exactly; a ball takes any direction."""
        return np.asarray(E, dtype=float), {}

    def tangent_directions(self, E: np.ndarray) -> np.ndarray:
        """The orthogonal projection of directions (..., d) onto those the tokens move in (floats)."""
        return np.asarray(E, dtype=float)

    def retract(self, X: np.ndarray) -> np.ndarray:
        """Tokens (..., d) pulled into the domain in floats (membership up to rounding; see
        :meth:`representable` for exact membership)."""
        R, c = self.enclosing_ball()
        return project_to_ball(X, R, 0.0 if c is None else c)

    def same_as(self, other) -> bool:
        """Whether ``other`` is the same set (same kind, radius and arrays)."""
        if not isinstance(other, TokenDomain):
            return False
        mine, theirs = self.record(), other.record()
        return mine.keys() == theirs.keys() and all(
            (mine[k] is None and theirs[k] is None) or (mine[k] is not None and theirs[k] is not None
                                                          and np.array_equal(mine[k], theirs[k])) for k in mine)

    def record(self) -> dict:
        """The domain as plain JSON and float arrays, for a witness file (:mod:`lipbound.numeric.recheck`
        re-decides membership from it)."""
        R, c = self.enclosing_ball()
        return {"kind": "ball", "radius": R, "center": c}

    def plain(self) -> dict:
        """The domain as plain data (numbers and arrays) that travels to a worker process;
        :func:`domain_from_plain` rebuilds it."""
        raise NotImplementedError

    def check_width(self, d: int, what: str = "the head") -> None:
        center = self.center
        if center is not None and center.shape != (d,):
            raise AssumptionError("domain", f"a domain in R^{d} (the width of {what})",
                                  f"a centre of shape {center.shape}",
                                  "take the domain from the LayerNorm that feeds this layer")

    def contains(self, X: np.ndarray) -> np.ndarray:
        """Float check of membership of each token (rows of X); the exact check is in the re-check."""
        R, c = self.enclosing_ball()
        shifted = np.asarray(X, dtype=float) - (0.0 if c is None else c)
        return np.linalg.norm(shifted, axis=-1) <= R


@final
@dataclass(frozen=True)
class TokenBall(TokenDomain):
    """Every token in the closed ball ``{x : ||x - c||_2 <= R}``.

    Parameters
    ----------
    radius : float
        ``R > 0``, taken as exact.
    center : ndarray of shape (d,) or None
        ``c`` (None: the origin).
    """

    radius: float
    center: np.ndarray | None = None
    key: str = field(default="ball", init=False)

    def __post_init__(self):
        radius = float(self.radius)
        if not (math.isfinite(radius) and radius > 0):
            raise AssumptionError("radius", "a positive finite number", repr(self.radius),
                                  "give the radius of a ball holding every token, e.g. `radius` 20")
        object.__setattr__(self, "radius", radius)
        if self.center is not None:
            center = np.asarray(self.center, dtype=np.float64)
            if center.ndim != 1 or not np.all(np.isfinite(center)):
                raise AssumptionError("center", "a finite vector of shape (d,)", f"shape {center.shape}",
                                      "pass the centre as a vector, e.g. the LayerNorm bias")
            center.setflags(write=False)
            object.__setattr__(self, "center", center)

    @property
    def assumption(self) -> Domain:
        return Ball() if self.center is None else Ball(radius=S.R, center=S.c)

    def enclosing_ball(self) -> tuple[float, np.ndarray | None]:
        return self.radius, self.center

    def plain(self) -> dict:
        return {"kind": self.key, "radius": self.radius, "center": self.center}

    def describe(self) -> str:
        where = "0" if self.center is None else f"c (||c|| <= {vector_norm_upper(self.center):.6g})"
        return f"ball of radius {self.radius:.6g} about {where}"


@final
@dataclass(frozen=True)
class LayerNormOutputs(TokenDomain):
    """Every token an output of the LayerNorm ``norm``: ``gamma * z + beta``, ``z`` orthogonal to
    the all-ones vector, ``||z|| <= sqrt(d)`` (the LayerNormImage domain of the symbolic layer)."""

    norm: LayerNorm
    key: str = field(default="layernorm-image", init=False)

    def __post_init__(self):
        if not isinstance(self.norm, LayerNorm):
            raise AssumptionError("norm", "a LayerNorm", type(self.norm).__name__,
                                  "take it from the layer (TransformerLayer.ln_in)")

    @property
    def assumption(self) -> Domain:
        return LayerNormImage()

    @property
    def center(self) -> np.ndarray:
        return self.norm.beta

    def enclosing_ball(self) -> tuple[float, np.ndarray]:
        return self.norm.radius_about_center, self.norm.beta

    def symbol_values(self, centred: bool) -> dict:
        return {**super().symbol_values(centred), "gamma_max": interval(self.norm.gamma_max)}

    def describe(self) -> str:
        return (f"LayerNorm image: ellipsoid beta + diag(gamma) z, z orthogonal to 1, ||z|| <= sqrt({self.norm.d}), "
                f"max|gamma| = {self.norm.gamma_max:.6g} (within {self.norm.radius_about_center:.6g} of beta)")

    def shape(self, d: int | None = None) -> tuple[Enclosure, object]:
        d = self.norm.d
        centring = Enclosure.exact(np.eye(d)) - Enclosure.exact(np.ones((d, d))).scale(Enclosure.scalar(1 / IV.mpf(d)))
        return Enclosure.exact(np.diag(self.norm.gamma)) @ centring, IV.sqrt(IV.mpf(d))

    def tangent_projector(self) -> Enclosure:
        """``I_S - nu nu^T / ||nu||^2``, ``nu_k = 1 / gamma_k`` (0 where ``gamma_k = 0``, and ``I_S`` zero
        there): the projector onto ``range(diag(gamma) P) = diag(gamma) 1-perp``."""
        gamma = self.norm.gamma
        live = gamma != 0
        nu = np.zeros_like(gamma)
        nu[live] = 1.0 / gamma[live]
        spread = np.where(live, np.abs(nu) * 2.0 ** -52, 0.0)               # 1/gamma rounds by <= 1/2 ulp
        nu_enclosure = Enclosure(nu[:, None], spread[:, None])
        square = (nu_enclosure.T @ nu_enclosure).interval()
        outer = (nu_enclosure @ nu_enclosure.T).scale(1 / square)
        return Enclosure.exact(np.diag(live.astype(float))) - outer

    def frame(self, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        gamma = self.norm.gamma
        M = np.sqrt(gamma.size) * (np.diag(gamma) - np.outer(gamma, np.ones_like(gamma)) / gamma.size)
        left, singular, _ = np.linalg.svd(M)
        keep = singular > singular[0] * 1e-12
        return np.asarray(self.norm.beta, dtype=float), left[:, keep], singular[keep]

    def representable(self, X: np.ndarray, margin: float = 1e-9) -> tuple[np.ndarray, dict]:
        """Tokens ``beta + gamma * z`` with ``z`` on a dyadic grid, ``sum z = 0`` exactly and
        ``||z||^2 < d`` exactly; the coordinates are ``{"z": z}``.  The float tokens returned are the
        rounded ``beta + gamma * z`` (the re-check uses the exact ones)."""
        z = self._coordinates(X)
        d = self.norm.d
        norms = np.linalg.norm(z, axis=-1, keepdims=True)
        limit = math.sqrt(d) * (1 - margin)
        z = z * np.where(norms > limit, limit / np.where(norms > 0, norms, 1.0), 1.0)
        for _ in range(8):
            exact = _on_grid(z)
            if all(_squares(row) < d * 2 ** (2 * _GRID) for row in exact.reshape(-1, d)):
                z = np.ldexp(exact.astype(float), -_GRID)
                return self.norm.beta + self.norm.gamma * z, {"z": z}
            z = z * (1 - 4 * margin)
        raise AssumptionError("X", "tokens that can be pulled inside the LayerNorm image", "tokens that stay outside",
                              "report this input")

    def tangent_directions(self, E: np.ndarray) -> np.ndarray:
        gamma = self.norm.gamma
        live = gamma != 0
        nu = np.where(live, 1.0 / np.where(live, gamma, 1.0), 0.0)
        E = np.where(live, np.asarray(E, dtype=float), 0.0)
        return E - (E @ nu)[..., None] * nu / (nu @ nu)

    def retract(self, X: np.ndarray) -> np.ndarray:
        z = self._coordinates(X)
        norms = np.linalg.norm(z, axis=-1, keepdims=True)
        limit = math.sqrt(self.norm.d) * (1 - 1e-9)
        shrink = np.where(norms > limit, limit / np.where(norms > 0, norms, 1.0), 1.0)
        return self.norm.beta + self.norm.gamma * z * shrink

    def representable_directions(self, E: np.ndarray) -> tuple[np.ndarray, dict]:
        """Directions ``gamma * w`` with ``w`` on a dyadic grid and ``sum w = 0`` exactly (tangent to the
        image); the coordinates are ``{"w": w}``."""
        w = np.ldexp(_on_grid(self._coordinates(E, shift=False)).astype(float), -_GRID)
        return self.norm.gamma * w, {"w": w}

    def _coordinates(self, X: np.ndarray, shift: bool = True) -> np.ndarray:
        """``z`` with ``gamma * z = x - beta`` where ``gamma != 0``, the rest chosen so that ``sum z = 0``
        (if every gain is non-zero, the part of ``x - beta`` off the image is dropped: ``z`` is centred)."""
        gamma = self.norm.gamma
        live = gamma != 0
        shifted = np.asarray(X, dtype=float) - (self.norm.beta if shift else 0.0)
        z = np.zeros_like(shifted)
        z[..., live] = shifted[..., live] / gamma[live]
        if np.all(live):
            return z - z.mean(axis=-1, keepdims=True)
        z[..., ~live] = -z[..., live].sum(axis=-1, keepdims=True) / np.sum(~live)
        return z

    def plain(self) -> dict:
        return {"kind": self.key, "gamma": self.norm.gamma, "beta": self.norm.beta, "eps": self.norm.eps}

    def record(self) -> dict:
        return {"kind": "layernorm-image", "gamma": self.norm.gamma, "beta": self.norm.beta,
                "radius": self.norm.radius_about_center, "center": self.norm.beta}


#: Coordinates on the LayerNorm image are multiples of 2^-_GRID (|z| <= sqrt(d) < 2^12 keeps them exact).
_GRID = 40


def _on_grid(z: np.ndarray) -> np.ndarray:
    """Integers ``k`` (object array) with ``k 2^-_GRID`` close to z and every row summing to exactly 0."""
    z = np.asarray(z, dtype=float)
    k = np.rint(np.ldexp(z, _GRID)).astype(np.int64).astype(object)
    rows = k.reshape(-1, k.shape[-1])
    for row in rows:
        total = int(sum(row))
        if total:
            largest = int(np.argmax(np.abs(row.astype(float))))
            row[largest] -= total
    return rows.reshape(k.shape)


def _squares(row) -> int:
    return sum(int(v) * int(v) for v in row)


@final
@dataclass(frozen=True)
class RMSNormOutputs(TokenDomain):
    """Every token an output of the RMSNorm ``norm``: ``gamma * u`` with ``||u|| < sqrt(d)``
    (``u = x / sqrt(||x||^2 / d + eps)``), held by the full-dimensional ellipsoid
    ``{M w : ||w|| <= sqrt(d)}``, ``M = diag(gamma)``, about 0 (the RMSNormImage domain of the
    symbolic layer).  Its semi-axes are the gains: where most ``|gamma_k|`` are far below
    ``max|gamma|`` (SmolLM2's first block: largest 0.31, root mean square 0.04) it is much thinner
    than the ball ``max|gamma| sqrt(d)`` about 0 that holds it."""

    norm: RMSNorm
    key: str = field(default="rmsnorm-image", init=False)

    def __post_init__(self):
        if not isinstance(self.norm, RMSNorm):
            raise AssumptionError("norm", "an RMSNorm", type(self.norm).__name__,
                                  "take it from the layer (TransformerLayer.ln_in)")

    @property
    def assumption(self) -> Domain:
        return RMSNormImage()

    @property
    def center(self) -> None:
        return None

    def enclosing_ball(self) -> tuple[float, None]:
        return self.norm.radius_about_center, None

    def symbol_values(self, centred: bool) -> dict:
        return {**super().symbol_values(centred), "gamma_max": interval(self.norm.gamma_max)}

    def describe(self) -> str:
        gamma = self.norm.gamma
        return (f"RMSNorm image: ellipsoid diag(gamma) u, ||u|| <= sqrt({self.norm.d}), max|gamma| = "
                f"{self.norm.gamma_max:.6g}, rms(gamma) = {math.sqrt(float(np.mean(gamma ** 2))):.3g}")

    def shape(self, d: int | None = None) -> tuple[Enclosure, object]:
        return Enclosure.exact(np.diag(self.norm.gamma)), IV.sqrt(IV.mpf(self.norm.d))

    def frame(self, d: int) -> tuple[np.ndarray, None, np.ndarray]:
        return np.zeros(self.norm.d), None, np.abs(self.norm.gamma) * math.sqrt(self.norm.d)

    def _coordinates(self, X: np.ndarray) -> np.ndarray:
        gamma = self.norm.gamma
        live = gamma != 0
        u = np.zeros(np.shape(X))
        u[..., live] = np.asarray(X, dtype=float)[..., live] / gamma[live]
        return u

    def representable(self, X: np.ndarray, margin: float = 1e-9) -> tuple[np.ndarray, dict]:
        """Tokens ``gamma * u`` with ``u`` on a dyadic grid and ``||u||^2 < d`` exactly; the coordinates
        are ``{"z": u}`` (the re-check forms the exact products ``gamma * u``)."""
        u = self._coordinates(X)
        d = self.norm.d
        norms = np.linalg.norm(u, axis=-1, keepdims=True)
        limit = math.sqrt(d) * (1 - margin)
        u = u * np.where(norms > limit, limit / np.where(norms > 0, norms, 1.0), 1.0)
        for _ in range(8):
            exact = np.rint(np.ldexp(u, _GRID)).astype(np.int64).astype(object)
            if all(_squares(row) < d * 2 ** (2 * _GRID) for row in exact.reshape(-1, d)):
                u = np.ldexp(exact.astype(float), -_GRID)
                return self.norm.gamma * u, {"z": u}
            u = u * (1 - 4 * margin)
        raise AssumptionError("X", "tokens that can be pulled inside the RMSNorm image", "tokens that stay outside",
                              "report this input")

    def retract(self, X: np.ndarray) -> np.ndarray:
        u = self._coordinates(X)
        norms = np.linalg.norm(u, axis=-1, keepdims=True)
        limit = math.sqrt(self.norm.d) * (1 - 1e-9)
        return self.norm.gamma * u * np.where(norms > limit, limit / np.where(norms > 0, norms, 1.0), 1.0)

    def contains(self, X: np.ndarray) -> np.ndarray:
        return np.linalg.norm(self._coordinates(X), axis=-1) <= math.sqrt(self.norm.d)

    def plain(self) -> dict:
        return {"kind": self.key, "gamma": self.norm.gamma, "eps": self.norm.eps}

    def record(self) -> dict:
        return {"kind": self.key, "gamma": self.norm.gamma, "radius": self.norm.radius_about_center,
                "center": None}


@final
@dataclass(frozen=True)
class AllTokens(TokenDomain):
    """No constraint: ``X`` ranges over all of ``R^{n x d}`` (for global theorems, e.g. tied L2)."""

    key: str = field(default="unbounded", init=False)

    @property
    def assumption(self) -> Domain:
        return Unbounded()

    @property
    def center(self) -> None:
        return None

    def enclosing_ball(self):
        raise AssumptionError("domain", "a bounded domain (a ball or LayerNorm outputs)", "all of R^{n x d}",
                              "witness searches and relaxations need a ball; give its `radius`")

    def symbol_values(self, centred: bool) -> dict:
        return {}

    def describe(self) -> str:
        return "all of R^(n x d)"

    def plain(self) -> dict:
        return {"kind": self.key}

    def contains(self, X: np.ndarray) -> np.ndarray:
        return np.ones(np.asarray(X).shape[:-1], dtype=bool)


def domain_from_plain(data: dict) -> TokenDomain:
    """The domain of :meth:`TokenDomain.plain`."""
    kind = data.get("kind")
    if kind == "ball":
        return TokenBall(data["radius"], data["center"])
    if kind == "layernorm-image":
        return LayerNormOutputs(LayerNorm(data["gamma"], data["beta"], data["eps"]))
    if kind == "rmsnorm-image":
        return RMSNormOutputs(RMSNorm(data["gamma"], data["eps"]))
    if kind == "unbounded":
        return AllTokens()
    raise AssumptionError("domain", "ball, layernorm-image or unbounded", repr(kind), "pass TokenDomain.plain()")


#: The spellings of :class:`DomainSpec` besides a radius.
DOMAIN_SPECS = {
    "layernorm": "the ball about 0 holding every output of the LayerNorm that feeds the layer "
                 "(radius max|gamma| sqrt(d) + ||beta||); for an RMSNorm its image, the ellipsoid "
                 "{gamma * u : ||u|| <= sqrt(d)} about 0",
    "layernorm-image": "the outputs of the LayerNorm that feeds the layer (their hull: the ball of radius "
                       "max|gamma| sqrt(d) about beta); for an RMSNorm its image, as 'layernorm'",
}


@final
@dataclass(frozen=True)
class DomainSpec:
    """A domain as a user states it, before the layer it applies to is known.

    ``kind`` is ``"radius"`` (with ``radius``), ``"layernorm"`` or ``"layernorm-image"``.
    """

    kind: str
    radius: float | None = None

    @classmethod
    def parse(cls, text, option: str = "domain") -> DomainSpec:
        """``"layernorm"``, ``"layernorm-image"`` or a positive number."""
        if isinstance(text, DomainSpec):
            return text
        if isinstance(text, str) and text in DOMAIN_SPECS:
            return cls(text)
        try:
            radius = float(text)
        except (TypeError, ValueError):
            radius = math.nan
        if not (math.isfinite(radius) and radius > 0):
            raise AssumptionError(option, f"a positive number or one of {', '.join(DOMAIN_SPECS)}", repr(text),
                                  f"e.g. `{option}` 20.25 or `{option}` layernorm")
        return cls("radius", radius)

    def resolve(self, layer_norm, where: str = "this layer") -> TokenDomain:
        """The domain for a layer fed by ``layer_norm`` (a LayerNorm or RMSNorm; None: no norm known)."""
        if self.kind == "radius":
            return TokenBall(self.radius)
        if layer_norm is None:
            raise AssumptionError("domain", f"a number, since no LayerNorm or RMSNorm feeds {where}", repr(self.kind),
                                  "give a radius R as the `domain`")
        if isinstance(layer_norm, RMSNorm):
            return RMSNormOutputs(layer_norm)       # its image is a full-dimensional ellipsoid about 0
        if self.kind == "layernorm":
            return TokenBall(layer_norm.radius_about_origin)
        return LayerNormOutputs(layer_norm)

    def describe(self) -> str:
        return f"ball R = {self.radius:.6g}" if self.kind == "radius" else self.kind
