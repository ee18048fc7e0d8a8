"""A rotary layer's query and key charges of one column in one eigenvalue (:mod:`lipbound.numeric.sdp.rotary_joined`,
step 9 of ``positional_layer_bound``).

Against independent routes: the two forms against the query and key parts of the layer's Jacobian taken row by row
by central differences of the reference forward (tests/decoder_reference.py, the tokens moved only as queries or only
as keys), in the Loewner order; the certified value against the columns' eigenvalues formed here in floats at the
certified splits; and the bound against the query and key parts together at points of the domain and at lipbound's
witness, on generated causal RoPE layers with grouped-query heads (hypothesis).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from test_decoder_heads import CASES, _points, layer_part, layer_setting, reference_norm, rotary_case, rotary_cases
from test_sdp_key_columns import _offset_form

from lipbound.numeric.sdp.layer import layer_splits
from lipbound.numeric.sdp.rotary_joined import JoinedColumns
from lipbound.numeric.sdp.rotary_layer import (
    _shared_query_term,
    _spectral_key_term,
    dominating_key_form,
    positional_layer_bound,
)
from lipbound.numeric.witness import search_witness
from lipbound.rigorous.intervals import IV, upper


def _joined(layer, domain, n: int):
    """``(JoinedColumns, b, key2, region, heads, (the query weights, the key weights))`` as ``positional_layer_bound``
    forms them (spectral weights from a uniform start)."""
    region, heads, blocks, value_forms = layer_setting(layer, domain, n)
    b, info = _shared_query_term(heads, blocks, value_forms, region.r)
    spectral, key_info = _spectral_key_term(layer, region, heads, blocks, value_forms, np.ones(len(heads)))
    assert b is not None and spectral is not None, (info, key_info)
    weights = (info["weights"], [float(w) for w in key_info["columns"].weights])
    joined = JoinedColumns(info["form"], key_info["columns"].forms())
    return joined, b, (region.r * spectral) ** 2, region, heads, weights


def _rows(J: np.ndarray, n: int) -> list[np.ndarray]:
    """Row i's block of a layer part (n d_out, n d): the map from all tokens' moves to row i's output."""
    d_out = J.shape[0] // n
    return [J[i * d_out:(i + 1) * d_out] for i in range(n)]


def _loewner_excess(A: np.ndarray, B: np.ndarray) -> float:
    """``lambda_max(A - B)`` relative to ``lambda_max(B)``: at most a rounding when ``A <= B``."""
    return float(np.linalg.eigvalsh(0.5 * (A - B + (A - B).T))[-1]) / max(float(np.linalg.eigvalsh(B)[-1]), 1e-300)


@CASES
@given(rotary_cases)
def test_the_forms_are_r_squared_times_the_heads_forms_formed_from_the_reference(case):
    """``Phat_Delta = r^2 sum_h A^hT_Delta M M^T A^h_Delta / lambda'_h`` with the rotations of the reference forward,
    and ``Qhat = r^2 sum_h W_Q^h Kbar_h W_Q^hT / lambda_h`` (the domains here have interior, ``Pi = I``), to 1e-9."""
    _, layer, domain = rotary_case(case)
    n = case["n"]
    joined, _, _, region, heads, (query_weights, key_weights) = _joined(layer, domain, n)
    r2 = float(upper(region.r ** 2))
    for delta, form in joined.key_forms.items():
        expected = r2 * _offset_form(layer, region, key_weights, delta)
        assert np.allclose(form.mid, expected, rtol=1e-9, atol=1e-9 * float(np.max(np.abs(expected)))), delta
    expected = r2 * sum(hb.head.W_Q @ dominating_key_form(hb).mid @ hb.head.W_Q.T / w
                        for hb, w in zip(heads, query_weights))
    assert np.allclose(joined.query_form.mid, expected, rtol=1e-9, atol=1e-9 * float(np.max(np.abs(expected))))


@CASES
@given(rotary_cases)
def test_the_forms_bound_each_rows_query_and_key_parts_of_the_reference_jacobian(case):
    """Row i: ``S_i^T S_i <= b^2 Qhat`` (on its own token) and ``cov_i^T cov_i <= key2 (1/2) diag_j(Phat_{j-i})`` over
    the keys it sees (``c_i = 1/2 >= 2 max p (1 - p)``), at points of the domain, with the parts of the Jacobian formed
    by central differences of the reference forward."""
    rng, layer, domain = rotary_case(case)
    d, n = case["d"], case["n"]
    joined, b, key2, _, _, _ = _joined(layer, domain, n)
    b2, k2 = float(upper(b ** 2)), float(upper(key2))
    for X in _points(rng, domain, n, d, 2):
        queries, keys = _rows(layer_part(layer, X, "queries"), n), _rows(layer_part(layer, X, "keys"), n)
        for i in range(1, n):
            S = queries[i][:, i * d:(i + 1) * d]
            assert _loewner_excess(S.T @ S, b2 * joined.query_form.mid) <= 1e-6
            C = keys[i][:, :(i + 1) * d]                                      # causal: row i sees keys 0..i
            form = np.zeros(((i + 1) * d, (i + 1) * d))
            for j in range(i + 1):
                form[j * d:(j + 1) * d, j * d:(j + 1) * d] = 0.5 * k2 * joined.key_forms[j - i].mid
            assert _loewner_excess(C.T @ C, form) <= 1e-6


@CASES
@given(rotary_cases)
def test_the_certified_value_is_the_columns_eigenvalue_and_bounds_the_layers_parts(case):
    """At its splits the certified value is ``max_j lambda_max(C_j)^(1/2)`` formed here in floats (from above, within
    1e-6), never above step 7's split at the same splits, and above the norm of the query and key parts of the
    Jacobian together at points of the domain and at lipbound's witness; the layer bound holds at the witness."""
    rng, layer, domain = rotary_case(case)
    d, n = case["d"], case["n"]
    joined, b, key2, region, heads, _ = _joined(layer, domain, n)
    rows = heads[0].rows
    has_query = rows.key_counts >= 2
    coefficients = [IV.mpf(0.5)] * n
    t = layer_splits(b, key2, coefficients, rows.visible, has_query)
    value = joined.bound(b, key2, coefficients, rows.visible, has_query, t)
    assert value is not None and joined.splits is not None
    s = joined.splits
    b2, k2 = float(upper(b ** 2)), float(upper(key2))
    tops, plain = [], []
    for j in range(n):
        form = (1 + s[j]) * b2 * joined.query_form.mid if has_query[j] else np.zeros((d, d))
        for i in range(j, n):
            if has_query[i]:
                form = form + k2 * 0.5 * (1 + 1 / s[i]) * joined.key_forms[j - i].mid
        tops.append(float(np.linalg.eigvalsh(form)[-1]))
        plain.append((1 + s[j]) * b2 * float(np.linalg.eigvalsh(joined.query_form.mid)[-1]) * has_query[j]
                     + sum(k2 * 0.5 * (1 + 1 / s[i]) * float(np.linalg.eigvalsh(joined.key_forms[j - i].mid)[-1])
                           for i in range(j, n) if has_query[i]))
    formed = max(tops) ** 0.5
    certified = float(upper(value))
    assert formed <= certified <= formed * (1 + 1e-6) + 1e-12, (formed, certified)
    assert certified <= max(plain) ** 0.5 * (1 + 1e-6) + 1e-12
    witness = search_witness(layer, domain=domain, n=n, budget_seconds=0.1, seed=case["seed"] % 1000)
    for X in _points(rng, domain, n, d, 2) + [witness.X]:
        parts = layer_part(layer, X, "queries") + layer_part(layer, X, "keys")
        assert np.linalg.norm(parts, 2) <= certified * (1 + 1e-6) + 1e-12
    bound = positional_layer_bound(layer, region, n, heads=heads)
    assert reference_norm(layer, witness.X) <= bound.value * (1 + 1e-6) + 1e-12
    joined_rows = bound.details.get("joined_columns_rows")
    assert joined_rows is None or bound.value <= joined_rows
