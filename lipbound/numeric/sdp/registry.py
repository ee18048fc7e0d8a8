"""The registry of SDP relaxations, keyed by the symbolic variant class.

Meaning and lowering are kept apart: a variant of
:mod:`lipbound.symbolic.variants` says *what* map is bounded; the entry here says *how*
its constant is computed from concrete weights.  Every entry has the signature

    entry(target, domain, *, n, **options) -> CertifiedValue

with ``domain`` a :class:`~lipbound.numeric.domains.TokenDomain` (a ball, or a LayerNorm image that
the relaxations see as the ellipsoid it is)

and never returns an uncertified number: a failed solve or re-check comes back as
``certified=False`` with a reason, or raises :class:`~lipbound.errors.SolverError` when
called with ``require=True``.  A completeness test asserts that every variant class has
an entry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from ...errors import AssumptionError, WeightsError
from ...rigorous.intervals import IV, upper
from ...rigorous.linalg import Enclosure, spectral_norm_upper
from ...rigorous.value import CertifiedValue
from ...symbolic.scores import DotProduct
from ...symbolic.variants import CrossAttention, MeasureAttention, MultiHead, Residual, SelfAttention, Variant
from ..domains import TokenDomain
from ..model import Head, Layer
from .head import cross_attention_bound, measure_attention_bound, self_attention_bound
from .joint import SDP_ENCODINGS, check_encoding, sdp_value
from .layer import layer_head_bounds, layer_joint_bound

__all__ = ["SDP_RELAXATIONS", "SDP_ENCODINGS", "relax", "self_attention_entry", "cross_attention_entry",
           "measure_entry", "multi_head_entry", "residual_entry"]


def _head(target) -> Head:
    if not isinstance(target, Head):
        raise WeightsError("target", "a lipbound.numeric.attention.Head", type(target).__name__,
                           "pass one head (layer.heads[h]) for single-head variants")
    return target


def _layer(target) -> Layer:
    if not isinstance(target, Layer) and callable(getattr(target, "as_layer", None)):
        target = target.as_layer()  # lipbound.numeric.model.TransformerLayer
    if not isinstance(target, Layer):
        raise WeightsError("target", "a lipbound.numeric.attention.Layer", type(target).__name__,
                           "build Layer(heads=..., W_O=...) for a multi-head variant")
    return target


def _region(domain: TokenDomain) -> tuple[TokenDomain, None]:
    """``(domain, None)``: the relaxations take the domain itself (a ball or a LayerNorm image) where a
    ball's ``(radius, center)`` would go."""
    if not isinstance(domain, TokenDomain):
        raise AssumptionError("domain", "a TokenDomain (lipbound.numeric.domains)", type(domain).__name__,
                              "pass TokenBall(R) or LayerNormOutputs(norm)")
    domain.enclosing_ball()          # refuses unbounded domains
    return domain, None


def self_attention_entry(target: Head, domain: TokenDomain, *, n: int, causal: bool | None = None,
                         solver: str = "auto", require: bool = False, bounds=None) -> CertifiedValue:
    """Single-head dot-product self-attention on ``domain^n``: :func:`~.head.self_attention_bound`
    (``bounds``: precomputed :class:`~.head.HeadBounds` of the same head and domain)."""
    return self_attention_bound(_head(target), *_region(domain), n=n, causal=causal, solver=solver,
                                require=require, bounds=bounds)


def cross_attention_entry(target: Head, domain: TokenDomain, *, n: int, m: int, argument: str = "joint",
                          query_domain: TokenDomain | None = None, solver: str = "auto",
                          require: bool = False, bounds=None) -> CertifiedValue:
    """Dot-product cross-attention, m queries and n context tokens: :func:`~.head.cross_attention_bound`."""
    query_radius, query_center = _region(query_domain or domain)
    return cross_attention_bound(_head(target), *_region(domain), n=n, m=m, argument=argument,
                                 query_radius=query_radius, query_center=query_center, solver=solver,
                                 require=require, bounds=bounds)


def measure_entry(target: Head, domain: TokenDomain, *, n: int | None = None, regime: str = "uniform",
                  argument: str = "self", query_domain: TokenDomain | None = None, solver: str = "auto",
                  require: bool = False) -> CertifiedValue:
    """Attention on probability measures, Lipschitz in W1: :func:`~.head.measure_attention_bound`."""
    query_radius, query_center = _region(query_domain or domain)
    return measure_attention_bound(_head(target), *_region(domain), n=n, regime=regime, argument=argument,
                                   query_radius=query_radius, query_center=query_center, solver=solver,
                                   require=require)


def multi_head_entry(target: Layer, domain: TokenDomain, *, n: int,
                     inner: SelfAttention | CrossAttention | None = None, m: int | None = None,
                     query_domain: TokenDomain | None = None, solver: str = "auto", require: bool = False,
                     heads: list | None = None) -> CertifiedValue:
    r"""H heads concatenated, then ``W_O``: ``F(X) = [f^1(X), ..., f^H(X)] W_O``.

    Three certified combinations, the smallest is reported:

    * concatenation: ``||DF[E]|| <= ||W_O|| (sum_h ||Df^h[E]||^2)^(1/2) <= ||W_O|| (sum_h L_h^2)^(1/2)``;
    * split of ``W_O`` per head: ``F = sum_h f^h W_O^h`` with ``W_O^h`` the rows of head h, and
      ``f^h W_O^h`` is itself a head with value map ``W_V^h W_O^h``, so
      ``Lip(F) <= sum_h L'_h`` with ``L'_h`` its relaxation (the alignment of ``W_V^h``
      with ``W_O^h`` enters every joint constant);
    * the heads seen jointly with ``W_O`` (:func:`~.layer.layer_joint_bound`).

    ``inner`` is the per-head variant (default: non-causal self-attention); for cross-attention
    heads pass ``m`` (queries) and ``query_domain``.  ``heads``: precomputed
    :class:`~.head.HeadBounds` with the value maps ``W_V^h W_O^h`` (the concatenation is then skipped).
    """
    started = time.perf_counter()
    layer = _layer(target)
    if layer.residual:
        raise AssumptionError("target.residual", "False for MultiHead (the map without X)", "True",
                              "use the Residual entry, or replace(layer, residual=False)")
    inner = SelfAttention(DotProduct()) if inner is None else inner
    if not isinstance(inner, (SelfAttention, CrossAttention)):
        raise AssumptionError("inner", "a SelfAttention or CrossAttention variant", type(inner).__name__,
                              "pass the per-head variant, e.g. MultiHead(SelfAttention(DotProduct())).head")
    cross = isinstance(inner, CrossAttention)
    if cross and m is None:
        raise AssumptionError("m", "the number of queries for cross-attention heads", "None", "pass m=...")
    W_O = Enclosure.exact(layer.W_O)
    radius, center = _region(domain)
    query_radius = (query_domain or domain) if cross else None

    def per_head(head: Head, value, bounds=None) -> CertifiedValue:
        if not cross:
            return self_attention_bound(head, radius, center, n=n, causal=inner.causal, solver=solver, value=value,
                                        bounds=bounds)
        return cross_attention_bound(head, radius, center, n=n, m=m, argument=inner.argument, solver=solver,
                                     value=value, query_radius=query_radius, bounds=bounds)

    own, split = [], []
    if heads is None:
        heads = layer_head_bounds(layer, domain, query_radius, solver)
        own = [per_head(head, None) for head in layer.heads]
    for head, bounds in zip(layer.heads, heads):
        split.append(per_head(head, bounds.value, bounds))
    role = "self" if not cross else f"cross-{inner.argument}"
    joint = layer_joint_bound(layer, domain, n=n, role=role, m=m, query_domain=query_domain if cross else None,
                              solver=solver, heads=heads)
    certificate: dict = {"per_head": own, "per_head_split": split, "joint": joint}
    failed = next((b for b in own + split if not b.certified), None)
    if failed is not None:
        result = sdp_value("Lip(multi-head)", math.nan, False, certificate, solver,
                           time.perf_counter() - started, failed.details["status"],
                           "multi-head combination of per-head relaxations", reason=f"a head: {failed.reason}")
        if require:
            result.require()
        return result
    candidates = {"split": upper(sum((IV.mpf(b.value) for b in split), IV.mpf(0)))}
    if own:
        norm_O = spectral_norm_upper(W_O)
        candidates["concatenated"] = upper(IV.mpf(norm_O) * IV.sqrt(sum((IV.mpf(b.value) ** 2 for b in own),
                                                                       IV.mpf(0))))
    if joint.certified:
        candidates["joint"] = joint.value
    certificate.update(candidates)
    best = min(candidates, key=candidates.get)
    return sdp_value("Lip(multi-head)", candidates[best], True, certificate, solver, time.perf_counter() - started,
                     "certified", f"the smallest of ||W_O|| (sum_h L_h^2)^(1/2), sum_h Lip(f^h W_O^h) and the heads "
                     f"seen jointly ({best}); lipbound.numeric.sdp.registry.multi_head_entry")


def residual_entry(target: Head | Layer, domain: TokenDomain, *, n: int, inner: Variant | None = None,
                   **options) -> CertifiedValue:
    """``X -> X + g(X)``: ``Lip <= 1 + Lip(g)`` in every norm (triangle inequality).

    ``inner`` is the variant of g (default: SelfAttention for a Head, MultiHead for a Layer);
    ``options`` go to g's entry.
    """
    started = time.perf_counter()
    if not isinstance(target, Head):
        target = _layer(target)
    if inner is None:
        inner = (MultiHead(SelfAttention(DotProduct())) if isinstance(target, Layer)
                 else SelfAttention(DotProduct(), causal=bool(getattr(target, "causal", False))))
    if isinstance(inner, Residual):
        raise AssumptionError("inner", "a non-residual variant", "Residual", "wrap the attention map once")
    if isinstance(target, Layer) and target.residual:
        target = replace(target, residual=False)
    bound = relax(inner, target, domain, n=n, **options)
    certificate = {"inner": bound}
    if not bound.certified:
        return sdp_value("Lip(residual)", math.nan, False, certificate, bound.details["solver"],
                              time.perf_counter() - started, bound.details["status"], "1 + Lip(inner)",
                              reason=f"inner: {bound.reason}")
    return sdp_value("Lip(residual)", upper(1 + IV.mpf(bound.value)), True, certificate, bound.details["solver"],
                          time.perf_counter() - started, "certified", "1 + Lip(inner) (triangle inequality)")


#: variant class -> entry(target, domain, *, n, **options) -> CertifiedValue
SDP_RELAXATIONS: Final[dict[type, Callable[..., CertifiedValue]]] = {
    SelfAttention: self_attention_entry,
    CrossAttention: cross_attention_entry,
    MeasureAttention: measure_entry,
    MultiHead: multi_head_entry,
    Residual: residual_entry,
}


def relax(variant: Variant, target, domain: TokenDomain, *, n: int, **options) -> CertifiedValue:
    """Certified bound for ``variant`` with concrete weights ``target`` on ``B(center, radius)^n``.

    Parameters
    ----------
    variant : Variant
        From :mod:`lipbound.symbolic.variants`; its score must be :class:`DotProduct`.
    target : Head or Layer
        The weights (a Layer for MultiHead, a Head for single-head variants).
    domain, n :
        The domain of every token (its enclosing ball ``B(c, R)``) and the number of tokens.
    **options
        Passed to the entry (``solver``, ``require``, ``m`` for cross-attention, ...).
    """
    if not isinstance(variant, Variant):
        raise AssumptionError("variant", "a lipbound.symbolic.variants.Variant", type(variant).__name__,
                              "pass e.g. SelfAttention(DotProduct())")
    entry = SDP_RELAXATIONS.get(type(variant))
    if entry is None:
        raise AssumptionError("variant", f"one of {[c.__name__ for c in SDP_RELAXATIONS]}", type(variant).__name__,
                              "add an entry to SDP_RELAXATIONS")
    if not isinstance(variant.score, DotProduct):
        raise AssumptionError("variant.score", "a DotProduct score", type(variant.score).__name__,
                              "the SDP relaxations cover dot-product attention; use the symbolic closed form "
                              "for L2 and cosine scores")
    if isinstance(target, (Head, Layer)) or callable(getattr(target, "as_layer", None)):
        check_encoding(target if isinstance(target, (Head, Layer)) else target.as_layer())
    fixed = sorted(set(options) & {"causal", "argument", "regime", "inner"})
    if fixed:  # the variant states these facts; a second, possibly different, value has no place
        raise AssumptionError(fixed[0], "no such option (the variant states it)", f"{fixed[0]}={options[fixed[0]]!r}",
                              "choose the variant that states it, e.g. SelfAttention(DotProduct(), causal=True)")
    if isinstance(variant, SelfAttention):
        return entry(target, domain, n=n, causal=variant.causal, **options)
    if isinstance(variant, CrossAttention):
        return entry(target, domain, n=n, argument=variant.argument, **options)
    if isinstance(variant, MeasureAttention):
        return entry(target, domain, n=n, regime=variant.regime, argument=variant.argument, **options)
    if isinstance(variant, MultiHead):
        return entry(target, domain, n=n, inner=variant.head, **options)
    return entry(target, domain, n=n, inner=variant.inner, **options)

