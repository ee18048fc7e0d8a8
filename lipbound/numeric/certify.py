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
from ..rigorous.linalg import spectral_norm_upper
from ..rigorous.value import CertifiedValue, not_certified
from ..symbolic import theorems as T
from .dispatch import derive_for
from .domains import TokenDomain
from .evaluate import evaluate_bound
from .model import Head, Layer, TransformerLayer

__all__ = ["head_constant", "layer_constant", "output_blocks", "NORMS"]

#: norm key -> meaning, for heads and layers (``w1``: uniform empirical measures of n atoms)
NORMS = {"fro": "Frobenius", "2,1": "(2,1)", "2,inf": "(2,inf)", "inf": "l_inf on vec(X)", "w1": "Wasserstein-1"}


def _check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise AssumptionError("--norm", f"one of {', '.join(NORMS)}", repr(norm), "e.g. --norm fro")
    return norm


def head_constant(head: Head, norm: str, domain: TokenDomain, n: int, *, m: int | None = None,
                  role: str = "self") -> CertifiedValue:
    """The certified constant of one head in ``norm`` on ``domain`` (n tokens; m queries for
    cross-attention in ``role``), by the theorem that covers the head."""
    norm = _check_norm(norm)
    bound = derive_for(head, domain.assumption, "fro" if norm == "w1" else norm, role, measure=norm == "w1")
    value = evaluate_bound(bound, head, domain, n, m=m, name="derived")
    return value.renamed("derived", provenance=f"lipbound theorem {bound.theorem} ({bound.variant}, {NORMS[norm]})")


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
                   residual: bool = False) -> CertifiedValue:
    """The certified constant of a multi-head layer, composed from its heads' constants and the
    per-head blocks of ``W_O`` (plus the identity when ``residual``)."""
    norm = _check_norm(norm)
    attention = layer.attention if isinstance(layer, TransformerLayer) else layer
    head_norm = "2,inf" if norm == "inf" else norm
    per_head = [head_constant(h, head_norm, domain, n) for h in attention.heads]
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
