"""Assumptions a bound is derived under: domain, sizes, norm, weight facts.

Queries are three-valued (:class:`~lipbound.rigorous.intervals.Verdict`): an assumption that was not stated is
``UNKNOWN``, and an unknown never counts as a pass -- :meth:`Assumptions.require`
raises :class:`~lipbound.errors.AssumptionError` naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import final

import sympy as sp

from ..errors import AssumptionError
from ..rigorous.intervals import Verdict
from . import symbols as S
from .record import Derivation, le

__all__ = [
    "Domain", "Ball", "LayerNormImage", "RMSNormImage", "Unbounded",
    "Norm", "Frobenius", "Mixed21", "Mixed2Inf", "VecInf", "Wasserstein1", "NORMS", "norm_from_key",
    "NormAtLeast", "Assumptions",
]


# Domains ------------------------------------------------------------------
class Domain:
    """Where each token lives.  Abstract; see :class:`Ball`, :class:`LayerNormImage`,
    :class:`Unbounded`."""

    key: str = ""
    bounded: bool = True

    def enclosing_ball(self, record: Derivation | None = None) -> Ball:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@final
@dataclass(frozen=True)
class Ball(Domain):
    """Every token in the closed ball ``{x : ||x - c||_2 <= R}`` (centre 0 by default).

    Parameters
    ----------
    radius : sympy expression or number
        R > 0.
    center : sympy MatrixSymbol of shape (d, 1) or None
        The centre c; ``None`` means the origin.
    """

    radius: sp.Expr = S.R
    center: sp.MatrixSymbol | None = None
    key: str = field(default="ball", init=False)

    def __post_init__(self):
        radius = sp.sympify(self.radius)
        if radius.is_positive is not True:
            raise AssumptionError(
                "radius", "a positive number or positive symbol", repr(self.radius),
                "give R > 0, e.g. Ball(radius=sympy.Symbol('R', positive=True))")
        object.__setattr__(self, "radius", radius)

    def enclosing_ball(self, record: Derivation | None = None) -> Ball:
        return self

    def describe(self) -> str:
        centre = "0" if self.center is None else str(self.center)
        return f"every token x_i satisfies ||x_i - {centre}||_2 <= {self.radius}"


@final
@dataclass(frozen=True)
class LayerNormImage(Domain):
    r"""Tokens in the image of a LayerNorm, ``x = gamma * z + c`` with ``z ⟂ 1``, ``||z|| = sqrt(d)``.

    The image is an affine image of a centred sphere; its convex hull (where the
    mean value theorem is applied) lies in the ball of radius
    ``gamma_max sqrt(d)`` about the LayerNorm bias c, ``gamma_max = ||gamma||_inf``.
    The LayerNorm epsilon only shrinks ``||z||``.
    """

    gain: sp.Expr = S.RadiusSymbol("gamma_max")
    dim: sp.Expr = S.d
    center: sp.MatrixSymbol | None = S.c
    key: str = field(default="layernorm", init=False)

    def enclosing_ball(self, record: Derivation | None = None) -> Ball:
        ball = Ball(radius=self.gain * sp.sqrt(self.dim), center=self.center)
        if record is not None:
            record.hypothesis(
                "tokens lie in the image of a LayerNorm: x = gamma * z + c, z orthogonal to 1, ||z|| = sqrt(d)")
            record.add(le(sp.Symbol(r"\|x - c\|"), ball.radius),
                       "||gamma * z|| <= ||gamma||_inf ||z|| = gamma_max sqrt(d); the convex hull "
                       "of the image lies in this ball", "layernorm-ball")
        return ball

    def describe(self) -> str:
        return (f"every token is a LayerNorm output gamma*z + {self.center}, ||z|| = sqrt({self.dim}), "
                f"||gamma||_inf <= {self.gain}")


@final
@dataclass(frozen=True)
class RMSNormImage(Domain):
    r"""Tokens in the image of an RMSNorm, ``x = gamma * u`` with ``||u|| < sqrt(d)`` (lemma ``rmsnorm-image``).

    A full-dimensional ellipsoid about 0 (no centring, no bias): convex, and inside the ball of radius
    ``gamma_max sqrt(d)`` about the origin, where the mean value theorem is applied.  The domain of an
    attention or feed-forward block that a pre-RMSNorm feeds (Llama, Mistral, Qwen, Gemma).
    """

    gain: sp.Expr = S.gamma_max
    dim: sp.Expr = S.d
    key: str = field(default="rmsnorm", init=False)

    @property
    def center(self) -> None:
        return None

    def enclosing_ball(self, record: Derivation | None = None) -> Ball:
        ball = Ball(radius=self.gain * sp.sqrt(self.dim))
        if record is not None:
            record.hypothesis("tokens lie in the image of an RMSNorm: x = gamma * u with ||u|| < sqrt(d)")
            record.add(le(sp.Symbol(r"\|x\|"), ball.radius),
                       "||gamma * u|| <= ||gamma||_inf ||u|| < gamma_max sqrt(d); the image is convex", "rmsnorm-image")
        return ball

    def describe(self) -> str:
        return f"every token is an RMSNorm output gamma*u, ||u|| < sqrt({self.dim}), ||gamma||_inf <= {self.gain}"


@final
@dataclass(frozen=True)
class Unbounded(Domain):
    """No constraint on the tokens: ``X`` ranges over all of ``R^{n x d}``."""

    key: str = field(default="unbounded", init=False)
    bounded: bool = field(default=False, init=False)

    def enclosing_ball(self, record: Derivation | None = None) -> Ball:
        raise AssumptionError(
            "domain", "a bounded domain (Ball or LayerNormImage)", "Unbounded",
            "this derivation needs every token in a ball; state Ball(radius=R)")

    def describe(self) -> str:
        return "tokens unconstrained (X in R^{n x d})"


# Norms on X ---------------------------------------------------------------
class Norm:
    """A norm on ``X in R^{n x d}`` built from the Euclidean token norm.  Abstract."""

    key: str = ""
    title: str = ""

    def __repr__(self):
        return f"{type(self).__name__}()"

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(self.key)


@final
class Frobenius(Norm):
    """``||X||_F = (sum_i ||x_i||_2^2)^(1/2)``, the default."""

    key = "fro"
    title = "Frobenius norm"


@final
class Mixed21(Norm):
    """``||X||_{2,1} = sum_i ||x_i||_2``: the norm of token edits and of W1 between empirical measures."""

    key = "2,1"
    title = "(2,1) norm"


@final
class Mixed2Inf(Norm):
    """``||X||_{2,inf} = max_i ||x_i||_2``."""

    key = "2,inf"
    title = "(2,infinity) norm"


@final
class VecInf(Norm):
    """``||vec(X)||_inf = max_{i,k} |X_ik|``."""

    key = "inf"
    title = "l_infinity norm on vec(X)"


@final
class Wasserstein1(Norm):
    """Wasserstein-1 between the empirical measures of the tokens (Euclidean ground cost);
    for measure-valued variants only."""

    key = "w1"
    title = "Wasserstein-1 distance between measures"


NORMS: dict[str, Norm] = {cls.key: cls() for cls in (Frobenius, Mixed21, Mixed2Inf, VecInf, Wasserstein1)}


def norm_from_key(key: str | Norm) -> Norm:
    if isinstance(key, Norm):
        return key
    try:
        return NORMS[key]
    except KeyError:
        raise AssumptionError("norm", f"one of {sorted(NORMS)}", repr(key),
                              "pick a supported `norm`, e.g. fro") from None


# Facts --------------------------------------------------------------------
@final
@dataclass(frozen=True)
class NormAtLeast:
    """A stated lower bound: ``||vector|| >= bound`` for every token of the domain.

    Example: ``NormAtLeast(W_Q.T * x, m_Q)`` keeps a cosine score away from 0/0.
    """

    vector: sp.MatrixExpr
    bound: sp.Expr

    def __post_init__(self):
        bound = sp.sympify(self.bound)
        if bound.is_positive is not True:
            raise AssumptionError("NormAtLeast.bound", "a positive lower bound", repr(self.bound),
                                  "use a positive symbol, e.g. LowerBoundSymbol('m_Q')")
        object.__setattr__(self, "bound", bound)


@final
@dataclass(frozen=True)
class Assumptions:
    """Everything a derivation may rely on.

    Parameters
    ----------
    domain : Domain
        Where the key/context tokens live (and the queries too, unless ``query_domain``).
    norm : Norm or str
        Norm on X: ``"fro"`` (default), ``"2,1"``, ``"2,inf"``, ``"inf"``.
    n, m, d, d_k, d_v, H : sympy expressions
        Tokens, queries (cross-attention), width, key width, value width, heads.
    tied : bool or None
        Whether ``W_Q = W_K`` (L2 attention); ``None`` = not stated.
    self_attends : bool or None
        Whether every token attends to itself (no diagonal mask); ``None`` = not stated.
    facts : tuple of NormAtLeast
        Lower bounds on norms of projections over the domain.
    query_domain : Domain or None
        Domain of the queries in cross-attention; defaults to ``domain``.
    """

    domain: Domain = field(default_factory=Ball)
    norm: Norm = field(default_factory=Frobenius)
    n: sp.Expr = S.n
    m: sp.Expr = S.m
    d: sp.Expr = S.d
    d_k: sp.Expr = S.d_k
    d_v: sp.Expr = S.d_v
    H: sp.Expr = S.H
    tied: bool | None = None
    self_attends: bool | None = True
    facts: tuple[NormAtLeast, ...] = ()
    query_domain: Domain | None = None

    def __post_init__(self):
        object.__setattr__(self, "norm", norm_from_key(self.norm))
        if not isinstance(self.domain, Domain):
            raise AssumptionError("domain", "a Domain (Ball, LayerNormImage, Unbounded)",
                                  repr(self.domain), "pass e.g. Ball(radius=R)")
        for name in ("n", "m", "d", "d_k", "d_v", "H"):
            value = sp.sympify(getattr(self, name))
            if value.is_positive is not True or value.is_integer is not True:
                raise AssumptionError(name, "a positive integer (or positive integer symbol)",
                                      repr(getattr(self, name)), f"give {name} >= 1")
            object.__setattr__(self, name, value)

    # three-valued queries -------------------------------------------------
    def ask(self, question: str) -> Verdict:
        """Answer ``"bounded"``, ``"tied"``, ``"self_attends"`` with a :class:`Verdict`."""
        if question == "bounded":
            return Verdict.of(self.domain.bounded)
        if question == "tied":
            return Verdict.of(self.tied)
        if question == "self_attends":
            return Verdict.of(self.self_attends)
        raise AssumptionError("question", "'bounded', 'tied' or 'self_attends'", repr(question),
                              "ask about a known assumption")

    def require(self, question: str, needed_by: str) -> None:
        """Raise :class:`AssumptionError` unless ``question`` is known to be true."""
        answer = self.ask(question)
        if answer is not Verdict.HOLDS:
            raise AssumptionError(
                question, f"known true ({needed_by} needs it)", answer.value,
                f"state {question}=True in Assumptions if it holds")

    def lower_bound(self, vector: sp.MatrixExpr) -> sp.Expr | None:
        """The stated lower bound on ``||vector||``, or None."""
        for fact in self.facts:
            if sp.simplify(fact.vector - vector) == sp.ZeroMatrix(*vector.shape) or fact.vector == vector:
                return fact.bound
        return None

    def with_(self, **changes) -> Assumptions:
        return replace(self, **changes)

    def describe(self) -> list[str]:
        """Human-readable list of the assumptions (the ``assumptions`` field of ``--json``): the
        domain, the norm, the sizes given as numbers, tying, the diagonal, the stated floors."""
        lines = [f"domain: {self.domain.describe()}"]
        if self.query_domain is not None:
            lines.append(f"query domain: {self.query_domain.describe()}")
        lines.append(f"norm: {self.norm.title}")
        given = [f"{name} = {getattr(self, name)}" for name in ("n", "m", "d", "d_k", "d_v", "H")
                 if getattr(self, name).is_Number]
        if given:
            lines.append("sizes: " + ", ".join(given))
        if self.tied is not None:
            lines.append("tied weights W_Q = W_K" if self.tied else "untied weights W_Q, W_K")
        if self.self_attends is not None:
            lines.append("every token attends to itself" if self.self_attends else "the diagonal is masked")
        for fact in self.facts:
            lines.append(f"||{fact.vector}|| >= {fact.bound} on the domain")
        return lines
