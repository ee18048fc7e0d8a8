"""The key term of a rotary layer by columns (:mod:`lipbound.numeric.sdp.rotary_layer`, step 7 of
``positional_layer_bound``): each key charged ``r^2 Lambda' r^2 lambda_max(sum_{i sees j} f_i Phi_{j-i})`` under the
spectral condition's weights.

Against independent routes: the certified column value against the same eigenvalue formed here from the d x d
matrices ``Pi A^hT_Delta M`` (no Gram trick, rotations from the reference forward of tests/decoder_reference.py), and
the lemma against the key part of the layer's Jacobian (central differences of the reference forward with the
tokens moved only as keys) on generated causal RoPE layers with grouped-query heads (hypothesis).
"""

from __future__ import annotations

import math

import decoder_reference as reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
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

from lipbound.numeric.domains import RMSNormOutputs, TokenBall
from lipbound.numeric.model import RMSNorm
from lipbound.numeric.sdp.rotary_layer import _spectral_key_term, positional_layer_bound
from lipbound.numeric.witness import search_witness
from lipbound.rigorous.intervals import upper


def _spectral(layer, domain, n: int):
    """``(Lambda'^(1/2), KeyColumns, region, heads)`` of the layer's spectral key term (weights from a uniform start)
    and the per-head constants."""
    region, heads, blocks, value_forms = layer_setting(layer, domain, n)
    value, info = _spectral_key_term(layer, region, heads, blocks, value_forms, np.ones(len(heads)))
    return value, info.get("columns"), region, heads


def _offset_form(layer, region, weights, delta: int) -> np.ndarray:
    """``sum_h A^hT_Delta M M^T A^h_Delta / lambda_h`` (d x d; the domains here have interior, ``Pi = I``) with
    ``A_Delta = sigma W_Q R(Delta) W_K^T``: a query at position 0 against a key at position Delta, rotated by the
    reference."""
    M = region.shape.mid if region.shape is not None else np.eye(layer.d)
    total = np.zeros((layer.d, layer.d))
    for h, head in enumerate(layer.heads):
        kernel = head.kernel
        # q . R_Delta k = (rope of q at 0) . (rope of k at Delta): A_Delta = sigma W_Q R_Delta W_K^T
        rotated_keys = reference.rope(head.W_K[:, None, :], kernel.base, kernel.pairing, kernel.dims, [delta] * layer.d)
        A = head.W_Q @ rotated_keys[:, 0, :].T / math.sqrt(head.d_k)           # (d, d)
        F = A.T @ M
        total += F @ F.T / weights[h]
    return total


@settings(max_examples=4, deadline=None)
@given(st.integers(2, 5), st.sampled_from([(2, 1), (4, 2), (3, 3)]), st.sampled_from(["ball", "rmsnorm"]),
       st.integers(0, 2 ** 31))
def test_the_certified_column_is_the_eigenvalue_formed_from_the_rotated_matrices(n, shape, kind, seed):
    """``KeyColumns.column`` at arbitrary shares equals ``r^2 lambda_max(sum_Delta share_Delta Phi_Delta)`` formed here
    in floats from d x d matrices, from above and within 1e-6; one offset at share 1 is at most 1 (the condition)."""
    rng = np.random.default_rng(seed)
    heads, groups = shape
    d, d_k = 6, 2
    layer = _layer("llama", rng, d, d_k, heads, groups, 1.5)
    domain = TokenBall(1.3) if kind == "ball" else RMSNormOutputs(RMSNorm(rng.uniform(0.2, 1.0, d), 1e-5))
    value, columns, region, _ = _spectral(layer, domain, n)
    assert value is not None and columns is not None
    r2 = float(upper(region.r ** 2))
    weights = [float(w) for w in columns.weights]
    offsets = list(columns.inner)
    for trial in range(3):
        shares = {delta: float(rng.uniform(0.0, 2.0)) for delta in offsets if trial == 0 or rng.random() < 0.6}
        if not shares:
            continue
        certified = columns.column(shares)
        formed = r2 * float(np.linalg.eigvalsh(sum(s * _offset_form(layer, region, weights, delta)
                                                   for delta, s in shares.items()))[-1])
        assert formed <= certified <= formed * (1 + 1e-6) + 1e-12, (formed, certified)
    for delta in offsets:
        assert columns.column({delta: 1.0}) <= 1.0 + 1e-9


@CASES
@given(rotary_cases)
def test_the_layer_key_term_by_columns_holds_against_an_independent_key_part_and_jacobian(case):
    """The lemma: ``||key part of DF(X)||^2 <= r^2 Lambda' max_j r^2 lambda_max(sum_{i sees j} (1/2) Phi_{j-i})`` (row
    coefficients ``c_i = 1/2 >= 2 max p (1 - p)``, no split) at points of the domain and at lipbound's witness, and
    the layer bound (whose candidates include step 7) above the whole Jacobian at the witness (every other point:
    tests/test_decoder_heads.py's soundness test)."""
    rng, layer, domain = rotary_case(case)
    d, n = case["d"], case["n"]
    value, columns, region, heads = _spectral(layer, domain, n)
    assert value is not None and columns is not None
    key2 = float(upper(region.r ** 2 * value ** 2))
    charged = max(columns.column({j - i: 0.5 for i in range(1, n) if i >= j}) for j in range(n))
    assert charged <= 0.5 * (n - 1) * (1 + 1e-9)                 # never above the plain column sum
    bound = positional_layer_bound(layer, region, n, heads=heads)
    witness = search_witness(layer, domain=domain, n=n, budget_seconds=0.1, seed=case["seed"] % 1000)
    for X in _points(rng, domain, n, d, 3) + [witness.X]:
        key_part = np.linalg.norm(layer_part(layer, X, "keys"), 2)
        assert key_part ** 2 <= key2 * charged * (1 + 1e-6) + 1e-12, (key_part ** 2, key2 * charged)
    assert reference_norm(layer, witness.X) <= bound.value * (1 + 1e-6) + 1e-12


def test_the_columns_lower_the_layer_bound_where_the_rotations_turn_fast():
    """With a fast rotation (base 3) the column candidate is recorded, lies below the row split without it, and the
    reported bound is the smallest candidate."""
    rng = np.random.default_rng(7)
    d, n = 6, 5
    layer = _layer("llama", rng, d, 2, 4, 2, 2.0)
    while layer.heads[0].kernel.base != 3.0:
        layer = _layer("llama", rng, d, 2, 4, 2, 2.0)
    domain = TokenBall(1.0)
    bound = positional_layer_bound(layer, domain, n)
    details = bound.details
    assert details["key_columns_rows"] < details["coupled_rows"]
    assert bound.value == min(details[k] for k in ("coupled_rows", "key_columns_rows", "minkowski", "row_form",
                                                   "own_key_rows", "joined_columns_rows") if details.get(k) is not None)
