"""The query term of a rotary layer on the shared tangent (:mod:`lipbound.numeric.sdp.rotary_layer`, step 8 of
``positional_layer_bound``): one form ``Kbar_h >= R_Delta G_h R_Delta^T`` for every offset, and the heads' query
gradients bounded together through ``r^2 lambda_max(sum_h Pi W_Q^h Kbar_h W_Q^hT Pi / lambda_h) <= 1``.

Against independent routes: the certified form against the query-gradient forms ``A_Delta M M^T A_Delta^T`` formed
here from the reference forward's rotations (tests/decoder_reference.py), and the query term against the query part
of the layer's Jacobian (central differences of the reference forward with the tokens moved only as queries) on
generated causal RoPE layers with grouped-query heads (hypothesis).
"""

from __future__ import annotations

import math

import decoder_reference as reference
import numpy as np
from hypothesis import given
from test_decoder_heads import (
    CASES,
    _layer,
    _points,
    layer_part,
    layer_setting,
    reference_norm,
    rotary_case,
    rotary_cases,
)

from lipbound.numeric.domains import TokenBall
from lipbound.numeric.sdp.rotary_layer import _shared_query_term, dominating_key_form, positional_layer_bound
from lipbound.numeric.witness import search_witness
from lipbound.rigorous.intervals import upper


def _query_gradient_form(head, M: np.ndarray, delta: int) -> np.ndarray:
    """``A_Delta M M^T A_Delta^T`` (d x d) with ``A_Delta = sigma W_Q R(Delta) W_K^T`` rotated by the reference: a
    query at position 0 against a key at position Delta."""
    kernel = head.kernel
    rotated_keys = reference.rope(head.W_K[:, None, :], kernel.base, kernel.pairing, kernel.dims, [delta] * head.d)
    A = head.W_Q @ rotated_keys[:, 0, :].T / math.sqrt(head.d_k)
    F = A @ M
    return F @ F.T


@CASES
@given(rotary_cases)
def test_the_dominating_form_holds_every_offsets_query_gradient_form_rotated_by_the_reference(case):
    """``W_Q Kbar W_Q^T - A_Delta M M^T A_Delta^T >= 0`` for every offset the rows read (floats, a relative 1e-9), and
    the form's largest eigenvalue at most the sum of the offsets' (the construction adds positive parts of
    differences)."""
    _, layer, domain = rotary_case(case)
    n = case["n"]
    region, heads, _, _ = layer_setting(layer, domain, n)
    M = region.shape.mid if region.shape is not None else np.eye(layer.d)
    for hb in heads:
        form = dominating_key_form(hb)
        assert form is not None
        Kbar = hb.head.W_Q @ form.mid @ hb.head.W_Q.T
        forms = [_query_gradient_form(hb.head, M, delta) for delta in hb.rows.offsets]
        scale = max(float(np.max(np.abs(Kbar))), 1e-300)
        for F in forms:
            assert np.linalg.eigvalsh(Kbar - F)[0] >= -1e-9 * scale, (hb.rows.offsets, np.linalg.eigvalsh(Kbar - F))
        # each positive part added is at most the largest eigenvalue of its offset's form
        assert np.linalg.eigvalsh(form.mid)[-1] <= sum(np.linalg.eigvalsh(R @ hb.gram("keys_scaled").mid @ R.T)[-1]
                                                       for R in (r.mid for r in hb.rotations.values())) * (1 + 1e-6)


@CASES
@given(rotary_cases)
def test_the_shared_query_term_bounds_the_query_part_of_the_layers_jacobian(case):
    """``||query part of DF(X)||_2 <= b`` (each row's query part depends on its own token only, so the operator is
    block diagonal over rows) at points of the domain and at lipbound's witness; the layer bound, whose query term is
    the smaller of this one and the others, above the whole Jacobian at the witness."""
    rng, layer, domain = rotary_case(case)
    d, n = case["d"], case["n"]
    region, heads, blocks, value_forms = layer_setting(layer, domain, n)
    b, info = _shared_query_term(heads, blocks, value_forms, region.r)
    assert b is not None, info
    bound = positional_layer_bound(layer, region, n, heads=heads)
    assert bound.details["query_shared"] == upper(b)
    witness = search_witness(layer, domain=domain, n=n, budget_seconds=0.1, seed=case["seed"] % 1000)
    for X in _points(rng, domain, n, d, 3) + [witness.X]:
        query_part = np.linalg.norm(layer_part(layer, X, "queries"), 2)
        assert query_part <= upper(b) * (1 + 1e-6) + 1e-12, (query_part, upper(b))
    assert reference_norm(layer, witness.X) <= bound.value * (1 + 1e-6) + 1e-12


def test_the_shared_query_term_lowers_the_query_term_where_the_heads_read_different_directions():
    """Four heads of size 2 in two groups in width 12 on a ball: the shared query term lies below the per-head
    gains' joint term, and the layer's reported query term is the smaller of the candidates."""
    rng = np.random.default_rng(1)
    d, n = 12, 4                      # width for the heads' query directions to differ; base 100 turns the keys
    layer = _layer("llama", rng, d, 2, 4, 2, 2.0)
    bound = positional_layer_bound(layer, TokenBall(1.0), n)
    details = bound.details
    assert details["query_shared"] < min(details["query_summed"], details["query_joint"])
    assert details["query"] == details["query_shared"]
