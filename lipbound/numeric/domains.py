"""Where the tokens of an attention's input live: the one domain object of the numeric layer.

A domain is parsed once, at the edge (a CLI option or a Python call), and passed unchanged to
everything that needs it: the symbolic derivation (:attr:`TokenDomain.assumption`, the domain
of :mod:`lipbound.symbolic.assumptions` the theorem is derived on), the rigorous evaluation
(:meth:`TokenDomain.symbol_values`, intervals for the radius and the LayerNorm gain), the
witness search and the SDP relaxations (:meth:`TokenDomain.enclosing_ball`), the re-check of
a witness (:meth:`TokenDomain.contains`) and the reports (:meth:`TokenDomain.describe`).

* :class:`TokenBall` -- every token in the closed ball ``||x - c|| <= R``;
* :class:`LayerNormOutputs` -- every token an output ``gamma * z + beta`` of a LayerNorm
  (``z`` orthogonal to 1, ``||z|| <= sqrt(d)``), whose convex hull lies in the ball of radius
  ``max|gamma| sqrt(d)`` about ``beta``.

:class:`DomainSpec` is the unresolved form a user writes (``"layernorm"``, ``"layernorm-image"``
or a radius), resolved per layer against the LayerNorm that feeds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..rigorous.intervals import interval
from ..rigorous.linalg import vector_norm_upper
from ..symbolic import symbols as S
from ..symbolic.assumptions import Ball, Domain, LayerNormImage, Unbounded
from .model.components import LayerNorm

__all__ = ["TokenDomain", "TokenBall", "LayerNormOutputs", "AllTokens", "DomainSpec", "DOMAIN_SPECS"]


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

    def check_width(self, d: int, what: str = "the head") -> None:
        center = self.center
        if center is not None and center.shape != (d,):
            raise AssumptionError("domain", f"a domain in R^{d} (the width of {what})", f"a centre of shape {center.shape}",
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
            raise AssumptionError("--radius", "a positive finite number", repr(self.radius),
                                  "give the radius of a ball holding every token, e.g. --radius 20")
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
        return (f"LayerNorm outputs gamma * z + beta, ||z|| <= sqrt({self.norm.d}), max|gamma| = "
                f"{self.norm.gamma_max:.6g} (within {self.norm.radius_about_center:.6g} of beta)")


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
                              "witness searches and relaxations need a ball; pass --radius R")

    def symbol_values(self, centred: bool) -> dict:
        return {}

    def describe(self) -> str:
        return "all of R^(n x d)"

    def contains(self, X: np.ndarray) -> np.ndarray:
        return np.ones(np.asarray(X).shape[:-1], dtype=bool)


#: The spellings of :class:`DomainSpec` besides a radius.
DOMAIN_SPECS = {
    "layernorm": "the ball about 0 holding every output of the LayerNorm that feeds the layer "
                 "(radius max|gamma| sqrt(d) + ||beta||)",
    "layernorm-image": "the outputs of the LayerNorm that feeds the layer (their hull: the ball of radius "
                       "max|gamma| sqrt(d) about beta)",
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
    def parse(cls, text, option: str = "--radius") -> "DomainSpec":
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
                                  f"e.g. {option} 20.25 or {option} layernorm")
        return cls("radius", radius)

    def resolve(self, layer_norm: LayerNorm | None, where: str = "this layer") -> TokenDomain:
        """The domain for a layer fed by ``layer_norm`` (None: no LayerNorm known)."""
        if self.kind == "radius":
            return TokenBall(self.radius)
        if layer_norm is None:
            raise AssumptionError("--radius", f"a number, since no LayerNorm feeds {where}", repr(self.kind),
                                  "pass --radius R")
        if self.kind == "layernorm":
            return TokenBall(layer_norm.radius_about_origin)
        return LayerNormOutputs(layer_norm)

    def describe(self) -> str:
        return f"ball R = {self.radius:.6g}" if self.kind == "radius" else self.kind
