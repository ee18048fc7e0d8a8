"""Certified Lipschitz constants of real heads and layers, from the symbolic bounds.

A head's constant is the symbolic bound of its variant (derived once, with the
head's biases) evaluated rigorously on its weights
(:func:`~lipbound.numeric.evaluate.evaluate_bound`).  A multi-head layer
``F(X) = sum_h f^h(X) W_O^h`` (``W_O^h`` the rows of ``W_O`` that read head h)
composes per-head constants with the per-head blocks of ``W_O``, which is sharper
than ``||W_O|| sqrt(H) max_h L_h`` of the symbolic multi-head theorem:

* Frobenius: ``min(||W_O|| (sum_h L_h^2)^(1/2), sum_h ||W_O^h|| L_h)``;
* (2,1), (2,inf), W1: ``sum_h ||W_O^h|| L_h`` (per token ``||sum_h u_h W_O^h|| <=
  sum_h ||W_O^h|| ||u_h||``), and ``||W_O|| (sum_h L_h^2)^(1/2)`` for (2,inf).

Every number is an upper end of an interval enclosure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

from mpmath import iv

from ..assumptions import Assumptions, Ball, LayerNormImage
from ..errors import AssumptionError
from ..symbolic.registry import variant
from . import attention
from .evaluate import NumericDomain, evaluate_bound
from .rigorous import interval, spectral_norm_upper, upper

__all__ = ["CertifiedConstant", "head_constant", "layer_constant", "output_blocks", "compose_heads", "HEAD_VARIANT"]

#: norm key -> the registry variant whose bound certifies a single real (biased) head
HEAD_VARIANT = {"fro": "dot-product", "2,1": "dot-product", "2,inf": "dot-product", "inf": "dot-product",
                "w1": "measure-w1"}


@final
@dataclass(frozen=True)
class CertifiedConstant:
    """A certified upper bound on a Lipschitz constant.

    Attributes
    ----------
    value : float
        The certified upper end.
    name : str
        What it is (``"dot-product (fro)"``, ``"layer (2,1), per-head W_O blocks"``).
    norm : str
    per_head : tuple of float
        The per-head constants a layer constant was composed from (empty for a head).
    provenance : str
        ``"derived"`` for lipbound's theorems.
    """

    value: float
    name: str
    norm: str
    per_head: tuple = ()
    provenance: str = "derived"
    details: dict = field(default_factory=dict, compare=False)


def _domain_key(domain: NumericDomain):
    return LayerNormImage() if domain.gamma_max is not None else Ball()


def head_constant(head: attention.Head, norm: str, domain: NumericDomain, n: int,
                  variant_name: str | None = None) -> CertifiedConstant:
    """The certified constant of one head (Frobenius, (2,1), (2,inf), l_inf on vec, or W1
    on uniform measures of n atoms) on the domain."""
    name = variant_name or HEAD_VARIANT.get(norm)
    if name is None:
        raise AssumptionError("norm", f"one of {sorted(HEAD_VARIANT)}", repr(norm), "pick a supported norm")
    if head.causal and name == "dot-product":
        name = "causal"
    bound = variant(name).derive(Assumptions(domain=_domain_key(domain), norm=norm), name)
    evaluation = evaluate_bound(bound, head, domain, n)
    return CertifiedConstant(evaluation.upper, f"{name} ({norm})", norm, details={"float": evaluation.float_value})


def output_blocks(layer) -> list[float]:
    """Certified ``||W_O^h||_2`` for the rows of ``W_O`` that read each head."""
    blocks, start = [], 0
    for head in layer.heads:
        blocks.append(spectral_norm_upper(layer.W_O[start:start + head.d_v]))
        start += head.d_v
    return blocks


def compose_heads(per_head, blocks, norm: str, residual: bool = False, whole_output_norm: float | None = None) -> float:
    """The composition rule of a multi-head layer, written once (certified, interval arithmetic).

    ``sum_h ||W_O^h|| L_h`` in every norm (per token ``||sum_h u_h W_O^h|| <= sum_h ||W_O^h|| ||u_h||``);
    for Frobenius and (2,inf) also ``||W_O|| (sum_h L_h^2)^(1/2)`` when ``whole_output_norm`` is given,
    and the smaller is kept; plus 1 for a residual layer.
    """
    L = [interval(v) for v in per_head]
    value = upper(sum((interval(b) * l for b, l in zip(blocks, L)), interval(0)))
    if whole_output_norm is not None and norm in ("fro", "2,inf"):
        value = min(value, upper(interval(whole_output_norm) * iv.sqrt(sum((l * l for l in L), interval(0)))))
    return upper(interval(value) + 1) if residual else value


def layer_constant(layer, norm: str, domain: NumericDomain, n: int, residual: bool = False) -> CertifiedConstant:
    """The certified constant of a multi-head layer (``attention.Layer`` or ``LayerWeights``),
    composed from per-head constants and the per-head blocks of ``W_O`` (:func:`compose_heads`)."""
    heads = layer.heads
    blocks = output_blocks(layer)
    whole = spectral_norm_upper(layer.W_O)
    if norm == "inf":  # through (2,inf) and norm equivalence: ||X||_{2,inf} <= sqrt(d) ||vec X||_inf
        per_head = [head_constant(h, "2,inf", domain, n).value for h in heads]
        value = upper(interval(compose_heads(per_head, blocks, "2,inf", False, whole)) * iv.sqrt(interval(heads[0].d)))
        value = upper(interval(value) + 1) if residual else value
    else:
        per_head = [head_constant(h, norm, domain, n).value for h in heads]
        value = compose_heads(per_head, blocks, norm, residual, whole)
    return CertifiedConstant(value, f"layer ({norm}), per-head W_O blocks" + (", residual" if residual else ""),
                             norm, tuple(per_head), details={"W_O_blocks": tuple(blocks)})
