r"""Normalisation, feed-forward and residual blocks: their theorems and their variants.

The maps around attention in a transformer act on each token alone:

* **LayerNorm** ``N(x) = gamma * (x - mean x) / sqrt(var x + eps) + beta`` (Ba, Kiros, Hinton 2016)
  and **RMSNorm** ``N(x) = gamma * x / sqrt(||x||^2/d + eps)`` (Zhang and Sennrich 2019) are both
  ``D_gamma g(Pi x) + beta`` with ``g(a) = a / sqrt(||a||^2/d + eps)`` radial, ``D_gamma =
  diag(gamma)`` and ``Pi = I - 1 1^T / d`` (``Pi = I``, ``beta = 0`` for RMSNorm).  On all of ``R^d``
  ``Lip(N) = ||D_gamma Pi|| / sqrt(eps)``; on tokens whose variance is at least ``sigma_min^2``
  ``Lip(N) = ||D_gamma Pi|| / sqrt(sigma_min^2 + eps) <= gamma_max / sqrt(sigma_min^2 + eps)``.
  Both are equalities (lemma ``normalization-sharpness``), and the floor needs no convexity: the
  proof compares two points directly (lemma ``radial-normalization``).
* **Feed-forward** ``f(x) = W_2^T phi(W_1^T x + b_1) + b_2``: ``Lip(f) <= ||W_2|| ell_phi ||W_1||``,
  ``ell_phi = sup |phi'|`` (certified per activation in :mod:`lipbound.symbolic.activations`).
* **Residual blocks**, pre-LN ``x + F(N(x))`` and post-LN ``N(x + F(x))``, by the rules of
  :func:`lipbound.symbolic.theorems.norm_residual`.

The variance floor is a stated fact of the assumptions, ``NormAtLeast(Pi x, sqrt(d) sigma_min)``
(``NormAtLeast(x, ...)`` for RMSNorm): :func:`variance_floor`.  The theorems are per token and
lifted to sequences by :func:`lipbound.symbolic.theorems.tokenwise`.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from . import theorems as T
from .assumptions import Assumptions, Ball, LayerNormImage, NormAtLeast, RMSNormImage, Unbounded
from .bound import Bound
from .gated import GATED, SHORT, gated_feed_forward, gated_witness, outer_radius
from .record import Derivation, Described, eq, le
from .variants import Variant

__all__ = ["NORMALIZATIONS", "normalization", "feed_forward", "variance_floor", "BlockVariant",
           "NormalizationMap", "FeedForwardMap", "GatedFeedForwardMap", "NormResidual"]

#: kind -> title
NORMALIZATIONS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
_LIP = Described(r"\operatorname{Lip}(f)")


def _check_kind(kind: str) -> str:
    if kind not in NORMALIZATIONS:
        raise AssumptionError("kind", f"one of {sorted(NORMALIZATIONS)}", repr(kind), "pick a normalisation")
    return kind


def _centred(kind: str) -> sp.MatrixExpr:
    """What the normalisation divides by the norm of: ``Pi x`` (LayerNorm) or ``x`` (RMSNorm)."""
    return S.Pi * S.x if _check_kind(kind) == "layernorm" else S.x


def variance_floor(kind: str, floor=S.sigma_min, d=S.d) -> NormAtLeast:
    """The fact "every token's variance is at least ``floor^2``": ``||Pi x|| >= sqrt(d) floor``
    (LayerNorm; the mean square ``||x||^2 / d`` for RMSNorm)."""
    return NormAtLeast(_centred(kind), sp.sqrt(d) * floor)


@functools.cache  # theorems are pure: build each once
def normalization(kind: str, floor=None, largest_gain=S.gamma_max) -> T.Theorem:
    """LayerNorm or RMSNorm per token, on all of ``R^d`` (``floor=None``) or on tokens of variance
    at least ``floor^2``: ``Lip = ||D_gamma Pi|| / sqrt(floor^2 + eps)`` (``gamma_max`` for RMSNorm, or
    ``largest_gain``: ``gamma_post`` for the norm after a branch)."""
    layer = _check_kind(kind) == "layernorm"
    gain = S.matrix_norm(S.D_gamma * S.Pi) if layer else largest_gain
    scale = S.eps + (0 if floor is None else floor ** 2)
    statement = gain / sp.sqrt(scale)
    title = NORMALIZATIONS[kind] + ("" if floor is None else " with a variance floor")
    what, vector = ("variance", "Pi x") if layer else ("mean square", "x")
    proof = Derivation(title)
    proof.hypothesis("N(x) = gamma * (x - mean(x)) / sqrt(var(x) + epsilon) + beta per token, epsilon > 0" if layer
                     else "N(x) = gamma * x / sqrt(||x||^2 / d + epsilon) per token, epsilon > 0")
    if floor is not None:
        proof.hypothesis(f"every token has {what} at least sigma_min^2: ||{vector}||^2 / d >= sigma_min^2")
    proof.add(eq(Described(r"N(x)"), Described(r"D_\gamma\, g(\Pi x) + \beta" if layer else r"D_\gamma\, g(x)")),
              "g(u) = u / sqrt(||u||^2 / d + epsilon), D_gamma = diag(gamma)"
              + ("; Pi is the centring projection, Pi x = x - mean(x) 1 and var(x) = ||Pi x||^2 / d" if layer else ""))
    proof.add(le(Described(r"\|g(u) - g(u')\|"), Described(r"\|u - u'\|") / sp.sqrt(scale)),
              "g is radial" + ("" if floor is None else "; both ||u|| and ||u'|| are at least sqrt(d) sigma_min"),
              "radial-normalization")
    if layer:
        proof.add(le(Described(r"\|D_\gamma w\|"), gain * Described(r"\|w\|")),
                  "w = g(u) - g(u') is orthogonal to 1, so w = Pi w", "submultiplicative")
        proof.add(le(Described(r"\|\Pi x - \Pi y\|"), Described(r"\|x - y\|")), "Pi is an orthogonal projection")
    else:
        proof.add(le(Described(r"\|D_\gamma w\|"), gain * Described(r"\|w\|")), "||diag(gamma)|| = gamma_max",
                  "submultiplicative")
    proof.add(le(_LIP, statement), "compose the three maps", "composition")
    if not layer:  # the facts the blocks after an RMSNorm read
        proof.add(eq(Described(r"DN(x)"), Described(r"D_\gamma (I - x x^\top / (d\, s(x)^2)) / s(x)")),
                  "differentiate, s(x) = (||x||^2 / d + epsilon)^(1/2)", "rmsnorm-jacobian")
        proof.add(le(Described(r"\|DN(x)\|_2"), gain / Described(r"\sqrt{\|x\|^2 / d + \varepsilon}")),
                  "d s^2 >= ||x||^2, so the factor between D_gamma and 1 / s has its eigenvalues in [0, 1]: the local "
                  "bound at x, largest where ||x|| is smallest (at x = 0 without a floor: no centring)",
                  "rmsnorm-jacobian")
        proof.add(Described(r"N(x) \in \{\gamma \odot u : \|u\|_2 < \sqrt{d}\}"),
                  "||x / s(x)||^2 = ||x||^2 / (||x||^2 / d + epsilon) < d: the image, a bounded convex set about 0",
                  "rmsnorm-image")
    if layer:
        proof.add(le(statement, S.gamma_max / sp.sqrt(scale)), "||D_gamma Pi|| <= ||D_gamma|| ||Pi|| = gamma_max")
    direction = "v a top right singular vector of D_gamma Pi" if layer else "v = e_k where |gamma_k| is largest"
    proof.add(eq(Described(r"\|DN(x_0)\, v\|"), statement),
              f"attained: {direction}, x_0 = 0" if floor is None else
              f"attained: {direction}, {vector.replace('x', 'x_0')} orthogonal to v and "
              f"||{vector.replace('x', 'x_0')}||^2 / d = sigma_min^2", "normalization-sharpness")
    return T.Theorem(f"{kind}-{'global' if floor is None else 'variance-floor'}", title, statement, proof)


@functools.cache  # theorems are pure: build each once
def feed_forward() -> T.Theorem:
    """``f(x) = W_2^T phi(W_1^T x + b_1) + b_2`` per token: ``Lip <= ||W_2|| ell_phi ||W_1||``."""
    W_1, W_2 = S.MatrixNormSymbol("W_1"), S.MatrixNormSymbol("W_2")
    statement = W_2 * S.ell_phi * W_1
    proof = Derivation("Feed-forward block")
    proof.hypothesis("f(x) = W_2^T phi(W_1^T x + b_1) + b_2 per token, phi applied entrywise")
    proof.hypothesis("every secant slope of phi lies in [alpha_phi, beta_phi], and "
                     "ell_phi = max(|alpha_phi|, |beta_phi|)")
    proof.add(le(Described(r"\|f(x) - f(y)\|"), W_2 * Described(r"\|\varphi(z) - \varphi(z')\|")),
              "z = W_1^T x + b_1, z' = W_1^T y + b_1", "submultiplicative")
    proof.add(le(Described(r"\|\varphi(z) - \varphi(z')\|"), S.ell_phi * Described(r"\|z - z'\|")), "entrywise",
              "slope-restriction")
    proof.add(le(Described(r"\|z - z'\|"), W_1 * Described(r"\|x - y\|")), "z - z' = W_1^T (x - y)",
              "submultiplicative")
    proof.add(le(_LIP, statement), "chain the three: no derivative and no domain needed (ReLU included)")
    return T.Theorem("feed-forward", "Feed-forward block", statement, proof)


# Variants -----------------------------------------------------------------------------------------
class BlockVariant(Variant):
    """A token-wise block: a normalisation, a feed-forward block, or a residual block around one.

    Its theorem is stated per token (:meth:`per_token`) and lifted to the norms on X by
    :func:`~lipbound.symbolic.theorems.tokenwise`; it has no score and no head facts.  Abstract.
    """

    score = None  # type: ignore[assignment]  # a block has no score ...
    head_facts = None  # type: ignore[assignment]  # ... and no head facts
    norms = ("fro", "2,1", "2,inf", "inf")

    def per_token(self, assumptions: Assumptions) -> T.Theorem:
        raise NotImplementedError

    def domain_key(self, assumptions: Assumptions) -> str:
        return assumptions.domain.key

    def floor_fact(self) -> NormAtLeast | None:
        """The variance floor this block's theorem can use (:func:`variance_floor`), or None."""
        return None

    def proof_assumptions(self) -> tuple[Assumptions, ...]:
        """The settings the generated proofs derive this block in (the norm is set per norm)."""
        return (Assumptions(domain=Unbounded()),)

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        return T.tokenwise(self.per_token(assumptions), assumptions.norm, assumptions.d)

    def derive(self, assumptions: Assumptions, key: str = "") -> Bound:
        if not isinstance(assumptions, Assumptions):
            raise AssumptionError("assumptions", "an Assumptions object", type(assumptions).__name__,
                                  "build one with lipbound.Assumptions(domain=..., norm=...)")
        if assumptions.norm.key not in self.norms:
            raise AssumptionError("norm", "a norm on X (fro, 2,1, 2,inf, inf) for a token-wise block",
                                  repr(assumptions.norm.key), "use `norm` fro (blocks are not measure maps)")
        assumptions = assumptions.with_(self_attends=None)  # no attention inside a token-wise block
        theorem = self.theorem(assumptions)
        return Bound(variant=key or self.title, norm=assumptions.norm.key, domain=self.domain_key(assumptions),
                     expr=theorem.statement, generic=theorem.statement, constants={},
                     assumptions=tuple(assumptions.describe() + theorem.hypotheses), record=theorem.proof,
                     theorem=theorem.id, stated=assumptions)


@final
class NormalizationMap(BlockVariant):
    """LayerNorm (``kind="layernorm"``) or RMSNorm as a map; with the fact :func:`variance_floor`
    among the assumptions, the local theorem."""

    def __init__(self, kind: str = "layernorm"):
        self.kind = _check_kind(kind)
        self.title = NORMALIZATIONS[kind]

    def floor(self, assumptions: Assumptions):
        """``sigma_min`` if the assumptions state a variance floor, else None."""
        bound = assumptions.lower_bound(_centred(self.kind))
        return None if bound is None else sp.simplify(bound / sp.sqrt(assumptions.d))

    def per_token(self, assumptions: Assumptions) -> T.Theorem:
        return normalization(self.kind, self.floor(assumptions))

    def domain_key(self, assumptions: Assumptions) -> str:
        return "variance-floor" if self.floor(assumptions) is not None else assumptions.domain.key

    def floor_fact(self) -> NormAtLeast:
        return variance_floor(self.kind)

    def proof_assumptions(self) -> tuple[Assumptions, ...]:
        return (Assumptions(domain=Unbounded()), Assumptions(domain=Unbounded(), facts=(self.floor_fact(),)))


@final
class FeedForwardMap(BlockVariant):
    """The feed-forward block ``W_2^T phi(W_1^T x + b_1) + b_2``."""

    title = "feed-forward block"

    def per_token(self, assumptions: Assumptions) -> T.Theorem:
        return feed_forward()


@final
class GatedFeedForwardMap(BlockVariant):
    """A gated feed-forward block (``"swiglu"``, ``"geglu"``, ``"geglu-tanh"``) as a map: its theorem on a
    bounded domain (:func:`lipbound.symbolic.gated.gated_feed_forward`), a witness family on ``R^d``."""

    def __init__(self, name: str = "swiglu"):
        if name not in GATED:
            raise AssumptionError("name", f"one of {sorted(GATED)}", repr(name), "pick a gated block")
        self.name, self.activation = name, GATED[name][0]
        self.title = f"{GATED[name][1]} block"

    def per_token(self, assumptions: Assumptions) -> T.Theorem:
        if not assumptions.domain.bounded:
            raise AssumptionError("domain", f"a bounded domain for the {self.title} (it grows quadratically)",
                                  "Unbounded", "state a ball or a normalisation's image")
        return gated_feed_forward(self.activation, outer_radius(assumptions.domain))

    def proof_assumptions(self) -> tuple[Assumptions, ...]:
        return (Assumptions(domain=Ball()), Assumptions(domain=RMSNormImage()), Assumptions(domain=Unbounded()))

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        """The theorem in the radius symbol r: one statement on every bounded domain."""
        if not assumptions.domain.bounded:
            self.per_token(assumptions)  # the error
        return T.tokenwise(gated_feed_forward(self.activation, S.r), assumptions.norm, assumptions.d)

    def derive(self, assumptions: Assumptions, key: str = ""):
        unbounded = isinstance(assumptions, Assumptions) and not assumptions.domain.bounded
        if unbounded and assumptions.norm.key in self.norms:
            return gated_witness(self.name, key or self.title, assumptions.with_(self_attends=None))
        bound = super().derive(assumptions, key)
        record = Derivation(bound.record.title).absorb(bound.record)
        radius = outer_radius(assumptions.domain, record)
        record.add(le(S.r, radius), "the largest token norm on the domain (R + ||c|| on a ball about c)",
                   "norm-calculus")
        expr = bound.expr.xreplace({S.r: radius})
        record.add(le(_LIP, expr), "substitute r")
        return replace(bound, expr=expr, record=record, assumptions=tuple(dict.fromkeys(bound.assumptions + tuple(
            record.hypotheses))))


@final
class NormResidual(BlockVariant):
    """A residual block with a normalisation: ``"pre"`` ``x + F(N(x))``, ``"post"`` ``N(x + F(x))``.

    ``inner`` (F) and ``norm`` (N) are block variants, or None for a map known only by its
    constant (``L_F``, ``L_N``): the rule itself, in every norm on X, which the numeric layer
    evaluates on certified constants.  A pre-norm block may also scale the branch by LayerScale's
    ``diag(lambda)`` (``layerscale``) and normalise its output (``sandwich``, Gemma 2/3:
    ``x + N'(F(N(x)))``; ``after`` the concrete N', an RMSNorm with gain ``gamma_post``, or None for ``L_N'``).
    """

    PLACEMENTS = ("pre", "post")

    def __init__(self, placement: str, inner: BlockVariant | None = None, norm: NormalizationMap | None = None,
                 layerscale: bool = False, sandwich: bool = False, after: NormalizationMap | None = None):
        if placement not in self.PLACEMENTS:
            raise AssumptionError("placement", f"one of {self.PLACEMENTS}", repr(placement), "pick pre or post")
        if inner is not None and not isinstance(inner, (FeedForwardMap, NormalizationMap, GatedFeedForwardMap)):
            raise AssumptionError("inner", "a FeedForwardMap, GatedFeedForwardMap or NormalizationMap (or None)",
                                  type(inner).__name__, "wrap a token-wise block, or None for the rule in L_F")
        if placement == "post" and (layerscale or sandwich or isinstance(inner, GatedFeedForwardMap)):
            raise AssumptionError("placement", "'pre' for LayerScale, sandwich norms and gated blocks", "'post'",
                                  "a post-norm block reads F on all of R^d, where a gated block is not Lipschitz")
        if after is not None and (not sandwich or after.kind != "rmsnorm"):
            raise AssumptionError("after", "an RMSNorm after the branch of a sandwich block", repr(after),
                                  "pass sandwich=True and NormalizationMap('rmsnorm')")
        self.placement, self.inner, self.norm = placement, inner, norm
        self.layerscale, self.sandwich, self.after = layerscale, sandwich, after
        shown = "F" if inner is None else "FFN" if isinstance(inner, FeedForwardMap) else \
            SHORT[inner.name] if isinstance(inner, GatedFeedForwardMap) else inner.title
        name = "N" if norm is None else ("LN" if norm.kind == "layernorm" else "RMSNorm")
        branch = f"{shown}({name}(x))"
        if sandwich:
            branch = f"{'N_2' if after is None else 'RMSNorm'}({branch})"
        if layerscale:
            branch = f"diag(lambda) {branch}"
        self.title = f"x + {branch}" if placement == "pre" else f"{name}(x + {shown}(x))"

    def _parts(self, assumptions: Assumptions) -> tuple[T.Theorem, T.Theorem]:
        norm_facts = assumptions if self.placement == "pre" else assumptions.with_(facts=())
        N = T.component("L_N", "N") if self.norm is None else self.norm.per_token(norm_facts)
        image = assumptions.with_(facts=(), domain=RMSNormImage() if self.norm is not None and
                                  self.norm.kind == "rmsnorm" else LayerNormImage())
        F = T.component("L_F", "F") if self.inner is None else self.inner.per_token(image)
        return F, N

    def _after(self) -> T.Theorem | None:
        if not self.sandwich:
            return None
        if self.after is None:
            return T.component("L_N'", "N'")
        return normalization("rmsnorm", largest_gain=S.gamma_post)

    def _id(self, assumptions: Assumptions) -> str:
        prefix = ("layerscale-" if self.layerscale else "") + ("sandwich-" if self.sandwich else "")
        if self.inner is None:
            return prefix + ("residual" if prefix else f"{self.placement}-norm-residual")
        floor = self.domain_key(assumptions) == "variance-floor"
        if self.norm is None:
            raise AssumptionError("norm", "a NormalizationMap with a concrete inner block", "None",
                                  "pass norm=NormalizationMap('layernorm') or NormalizationMap('rmsnorm'), or "
                                  "inner=None for the rule in L_F and L_N")
        norm = "ln" if self.norm.kind == "layernorm" else "rmsnorm"
        inner = "feed-forward" if isinstance(self.inner, FeedForwardMap) else \
            self.inner.name if isinstance(self.inner, GatedFeedForwardMap) else self.inner.kind
        return prefix + f"{self.placement}-{norm}-{inner}" + ("-variance-floor" if floor else "")

    def per_token(self, assumptions: Assumptions) -> T.Theorem:
        F, N = self._parts(assumptions)
        image = "within gamma_max sqrt(d) of beta, a bounded set" if self.norm is None or \
            self.norm.kind == "layernorm" else "within gamma_max sqrt(d) of 0"
        rule = T.norm_residual(self.placement, F, N, image, after=self._after(),
                               scale=S.lambda_max if self.layerscale else None)
        proof = Derivation(f"Residual block {self.title}").absorb(rule.proof)
        return T.Theorem(self._id(assumptions), self.title, rule.statement, proof)

    def theorem(self, assumptions: Assumptions) -> T.Theorem:
        if self.inner is None:  # the rule holds in every norm as it is (F need not act token-wise)
            return self.per_token(assumptions)
        return super().theorem(assumptions)

    def domain_key(self, assumptions: Assumptions) -> str:
        if self.placement == "pre" and self.norm is not None and self.norm.floor(assumptions) is not None:
            return "variance-floor"
        return assumptions.domain.key

    def floor_fact(self) -> NormAtLeast | None:
        """pre-LN: the norm reads the block's input, so a floor on it applies; post-LN: it does not."""
        return self.norm.floor_fact() if self.placement == "pre" and self.norm is not None else None
