"""Certified Lipschitz constants of real heads and layers, from the symbolic theorems.

A head's constant is the bound of the theorem that covers it (:mod:`lipbound.numeric.dispatch`:
its score, biases, tying, values and mask select the variant), derived on the domain's
symbolic form and evaluated rigorously on its weights (:func:`~lipbound.numeric.evaluate.evaluate_bound`).

A multi-head layer ``F(X) = sum_h f^h(X) W_O^h`` (``W_O^h`` the rows of ``W_O`` that read head h)
composes the per-head constants by the rule of :func:`lipbound.symbolic.theorems.compose_heads`
(per token ``||sum_h u_h W_O^h|| <= sum_h ||W_O^h|| ||u_h||``, and in Frobenius and (2,inf) also
``||W_O|| (sum_h L_h^2)^(1/2)``), evaluated in interval arithmetic; a residual layer adds 1 and the
l_inf norm on vec(X) goes through the (2,inf) constant times ``sqrt(d)`` (the same theorems).
"""

from __future__ import annotations

from ..errors import AssumptionError
from ..rigorous.compiler import compile_interval
from ..rigorous.intervals import Verdict, interval, upper
from ..rigorous.linalg import spectral_norm_upper, vector_norm_upper
from ..rigorous.value import CertifiedValue, not_certified
from ..symbolic import theorems as T
from ..symbolic.scores import DotProduct
from ..symbolic.variants import CrossAttention, MultiHead, SelfAttention
from .dispatch import ROLES, check_layer, derive_for, dot_product_scope, head_facts, positional_scope
from .domains import TokenBall, TokenDomain
from .evaluate import evaluate_bound
from .model import Head, Layer, TransformerLayer
from .sdp import HeadBounds, matrix_aware_closed_form, relax
from .sdp.layer import layer_head_bounds, layer_joint_bound
from .sdp.region import Region
from .sdp.rotary import PositionalHeadBounds, positional_bound
from .sdp.rotary_floor import layer_candidate_floor
from .sdp.rotary_layer import positional_layer_bound

__all__ = ["head_constant", "layer_constant", "head_bounds", "layer_bounds", "output_blocks", "NORMS"]

#: norm key -> meaning, for heads and layers (``w1``: uniform empirical measures of n atoms)
NORMS = {"fro": "Frobenius", "2,1": "(2,1)", "2,inf": "(2,inf)", "inf": "l_inf on vec(X)", "w1": "Wasserstein-1"}


def _check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise AssumptionError("norm", f"one of {', '.join(NORMS)}", repr(norm), "e.g. `norm` fro")
    return norm


def _joint_domain(domain: TokenDomain, query_domain: TokenDomain | None) -> TokenDomain:
    """One domain holding the queries and the context (the symbolic theorems state one): the domain
    itself when both agree, else the ball about 0 holding both."""
    if query_domain is None or domain.same_as(query_domain):
        return domain
    radius = max(upper(interval(R) + interval(0.0 if c is None else vector_norm_upper(c)))
                 for R, c in (domain.enclosing_ball(), query_domain.enclosing_ball()))
    return TokenBall(radius)


def _check_role(role: str, m: int | None) -> None:
    if role not in ROLES:
        raise AssumptionError("role", f"one of {ROLES}", repr(role), "choose the argument of the constant")
    if role != "self" and m is None:
        raise AssumptionError("m", "the number of queries of cross-attention", "None", "give `m`")


def head_constant(head: Head, norm: str, domain: TokenDomain, n: int, *, m: int | None = None,
                  role: str = "self", query_domain: TokenDomain | None = None) -> CertifiedValue:
    """The certified constant of one head in ``norm`` on ``domain`` (n tokens; m queries for
    cross-attention in ``role``, in ``query_domain``), by the theorem that covers the head."""
    norm = _check_norm(norm)
    _check_role(role, m)
    joint = _joint_domain(domain, query_domain)
    bound = derive_for(head, joint.assumption, "fro" if norm == "w1" else norm, role, measure=norm == "w1")
    value = evaluate_bound(bound, head, joint, n, m=m, name="derived")
    where = "" if joint is domain else f", on {joint.describe()} (holds queries and context)"
    return value.renamed("derived", provenance=f"lipbound theorem {bound.theorem} ({bound.variant}, {NORMS[norm]})"
                         + where)


def output_blocks(layer: Layer | TransformerLayer) -> list[float]:
    """Certified ``||W_O^h||_2`` for the rows of ``W_O`` that read each head."""
    attention = layer.attention if isinstance(layer, TransformerLayer) else layer
    return [spectral_norm_upper(attention.output_block(h)) for h in range(attention.num_heads)]


def _compose(per_head: list[float], blocks: list[float], whole: float, norm: str, residual: bool, d: int) -> float:
    """Evaluate the composition theorem of :mod:`lipbound.symbolic.theorems` on certified numbers."""
    theorem = T.compose_heads(len(per_head), "2,inf" if norm == "inf" else norm)
    statement = theorem.statement
    if norm == "inf":
        statement = T.vector_infinity(theorem).statement
    if residual:
        statement = T.residual(T.Theorem(theorem.id, theorem.title, statement, theorem.proof)).statement
    values = {**{str(s): interval(v) for s, v in zip(T.head_constants(len(per_head)), per_head)},
              **{str(s): interval(v) for s, v in zip(T.block_norms(len(per_head)), blocks)},
              "W_O": interval(whole), "d": interval(d)}
    symbols = sorted(statement.free_symbols, key=str)
    return upper(compile_interval(statement, symbols)(*[values[str(s)] for s in symbols]))


def layer_constant(layer: TransformerLayer | Layer, norm: str, domain: TokenDomain, n: int,
                   residual: bool = False, *, role: str = "self", m: int | None = None,
                   query_domain: TokenDomain | None = None,
                   per_head: list[CertifiedValue] | None = None) -> CertifiedValue:
    """The certified constant of a multi-head layer, composed from its heads' constants and the
    per-head blocks of ``W_O`` (plus the identity when ``residual``).  ``per_head``: the heads'
    :func:`head_constant` in the head norm, when the caller has evaluated them already."""
    norm = _check_norm(norm)
    attention = layer.attention if isinstance(layer, TransformerLayer) else layer
    head_norm = "2,inf" if norm == "inf" else norm
    if per_head is None:
        per_head = [head_constant(h, head_norm, domain, n, role=role, m=m, query_domain=query_domain)
                    for h in attention.heads]
    failed = next((v for v in per_head if not v.certified), None)
    if failed is not None:
        return not_certified("derived", "per-head theorems composed with the W_O blocks", f"a head: {failed.reason}")
    blocks = output_blocks(attention)
    whole = spectral_norm_upper(attention.W_O)
    value = _compose([v.value for v in per_head], blocks, whole, norm, residual, attention.d)
    return CertifiedValue("derived", value, Verdict.HOLDS,
                          "per-head theorems composed with the W_O blocks (theorem multi-head-composition)"
                          + (", residual" if residual else ""),
                          details={"per_head": [v.value for v in per_head], "W_O_blocks": blocks, "W_O": whole})


def head_bounds(head: Head, domain: TokenDomain, n: int, *, role: str = "self", m: int | None = None,
                query_domain: TokenDomain | None = None, sdp: bool = False,
                derived: bool = True) -> list[CertifiedValue]:
    """Every applicable certified upper bound on the Frobenius Lipschitz constant of one head.

    Parameters
    ----------
    head : Head
    domain : TokenDomain
        The tokens (self-attention) or the context (cross-attention): a ball or a LayerNorm image.
    n : int
        Tokens (context tokens).
    role : {"self", "cross-queries", "cross-context", "cross-joint"}
        The argument of the constant; causal heads take "self" only.
    m : int, optional
        Queries of cross-attention.
    query_domain : TokenDomain, optional
        The queries' domain (default: ``domain``).
    sdp : bool
        Add the SDP relaxation of the local Lipschitz problem (dot-product heads).
    derived : bool
        Evaluate the ``"derived"`` theorem (False: the caller has it, e.g. from the whole layer's
        :func:`layer_bounds`, which evaluates every head's).

    Returns
    -------
    list of CertifiedValue
        ``"derived"`` (first, when asked): the theorem that covers the head (:mod:`lipbound.numeric.dispatch`), on one
        domain holding queries and context; for dot-product heads ``"matrix-aware"``: the same
        theorem with the norm products replaced by joint constants on the true domains (ellipsoids
        for LayerNorm images, two domains for cross-attention; eigenvalue certificates, no conic
        solver); ``"sdp"`` when asked.  A bound that could not be certified is listed with
        ``certified=False`` and its reason.
    """
    _check_role(role, m)
    head_facts(head, role)                               # refuses what no theorem covers, e.g. causal cross
    values = [head_constant(head, "fro", domain, n, m=m, role=role, query_domain=query_domain)] if derived else []
    if not dot_product_scope(head):
        if role == "self" and positional_scope(head):
            values.append(positional_bound(head, domain, n))
        return values
    cross = role != "self"
    queries = (query_domain or domain) if cross else None
    bounds = HeadBounds(head, domain, query_radius=queries, solver="auto" if sdp else "eig")
    # a conic solver that fails leaves the eigenvalue certificates, which need none
    closed = bounds if bounds.gamma.certified else HeadBounds(head, domain, query_radius=queries, solver="eig")
    argument = role[6:] if cross else None
    values.append(matrix_aware_closed_form(head, domain, n=n, m=m, argument=argument, query_radius=queries,
                                           bounds=closed).renamed("matrix-aware"))
    if sdp:
        values.append(_relaxation(head, domain, n, role, m, query_domain, bounds=bounds))
    return values


def layer_bounds(attention_layer: Layer | TransformerLayer, domain: TokenDomain, n: int, *, role: str = "self",
                 m: int | None = None, query_domain: TokenDomain | None = None, sdp: bool = False,
                 per_head: list[CertifiedValue] | None = None) -> list[CertifiedValue]:
    """Every applicable certified upper bound on the Frobenius Lipschitz constant of a whole
    multi-head layer ``sum_h f^h W_O^h`` (no residual), as :func:`head_bounds` for one head:
    ``"derived"`` (the per-head theorems composed with the blocks of ``W_O``), for dot-product heads
    ``"matrix-aware"`` (the sum over heads of the matrix-aware bound of ``f^h W_O^h``) and
    ``"joint"`` (the heads seen jointly with ``W_O``, :func:`lipbound.numeric.sdp.layer.layer_joint_bound`),
    and ``"sdp"`` when asked (the smallest of the registry's multi-head combinations).  ``per_head``: the
    heads' ``"derived"`` constants (:func:`head_constant`), when the caller has evaluated them already."""
    _check_role(role, m)
    attention = attention_layer.attention if isinstance(attention_layer, TransformerLayer) else attention_layer
    if attention.residual:
        attention = Layer(attention.heads, attention.W_O, attention.b_O, groups=attention.groups)
    for head in attention.heads:
        head_facts(head, role)
    check_layer(attention)
    values = [layer_constant(attention, "fro", domain, n, role=role, m=m, query_domain=query_domain,
                             per_head=per_head)]
    if not dot_product_scope(attention):
        if role == "self" and positional_scope(attention):
            values += _positional_layer(attention, domain, n)
        return values
    cross = role != "self"
    queries = (query_domain or domain) if cross else None
    heads = layer_head_bounds(attention, domain, queries, "auto" if sdp else "eig")
    argument = role[6:] if cross else None
    split = [matrix_aware_closed_form(h, domain, n=n, m=m, argument=argument, query_radius=queries, bounds=b,
                                      value=b.value) for h, b in zip(attention.heads, heads)]
    failed = next((v for v in split if not v.certified), None)
    if failed is None:
        total = upper(sum((interval(v.value) for v in split), interval(0)))
        values.append(CertifiedValue("matrix-aware", total, Verdict.HOLDS,
                                     "sum over heads of the matrix-aware bound of f^h W_O^h (triangle inequality)",
                                     details={"per_head": [v.value for v in split]}))
    else:
        values.append(not_certified("matrix-aware", "sum over heads of f^h W_O^h", f"a head: {failed.reason}"))
    values.append(layer_joint_bound(attention, domain, n=n, role=role, m=m, query_domain=queries, heads=heads)
                  .renamed("joint"))
    if sdp:
        values.append(_relaxation(attention, domain, n, role, m, query_domain, heads=heads))
    return values


def _positional_layer(attention: Layer, domain: TokenDomain, n: int) -> list[CertifiedValue]:
    """``"matrix-aware"`` (the sum over heads of the bound of ``f^h W_O^h``) and ``"joint"`` for a layer of rotary
    or masked heads (:mod:`lipbound.numeric.sdp.rotary`), from one set of per-head constants.  The first is left out
    where a certified floor under it (:mod:`lipbound.numeric.sdp.rotary_floor`) lies above the joint bound: it could
    not be the best, and the joint bound's details record that floor."""
    region = Region.of(domain, None, attention.d)
    heads = [PositionalHeadBounds(head, region, n, output=attention.output_block(h))
             for h, head in enumerate(attention.heads)]
    joint = positional_layer_bound(attention, region, n, heads=heads)
    floor = layer_candidate_floor(heads) if joint.certified else None
    if floor is not None and floor > joint.value:
        return [joint.renamed(joint.name, details={**joint.details, "matrix_aware_floor": floor})]
    split = [positional_bound(head, region, n, bounds=bounds) for head, bounds in zip(attention.heads, heads)]
    failed = next((v for v in split if not v.certified), None)
    if failed is None:
        total = upper(sum((interval(v.value) for v in split), interval(0)))
        summed = CertifiedValue("matrix-aware", total, Verdict.HOLDS,
                                "sum over heads of the bound of f^h W_O^h "
                                "(triangle inequality; lipbound.numeric.sdp.rotary)",
                                details={"per_head": [v.value for v in split]})
    else:
        summed = not_certified("matrix-aware", "sum over heads of f^h W_O^h", f"a head: {failed.reason}")
    return [summed, joint]


def _relaxation(target, domain, n, role, m, query_domain, **reuse) -> CertifiedValue:
    """The SDP relaxation of the registry for the target's variant (``reuse``: precomputed constants)."""
    causal = any(h.causal for h in ((target,) if isinstance(target, Head) else target.heads))
    inner = SelfAttention(DotProduct(), causal=causal) if role == "self" else CrossAttention(DotProduct(), role[6:])
    options = dict(reuse) if role == "self" else {"m": m, "query_domain": query_domain, **reuse}
    variant = inner if isinstance(target, Head) else MultiHead(inner)
    return relax(variant, target, domain, n=n, **options).renamed("sdp")
