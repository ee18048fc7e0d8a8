"""The row's own key merged into its query part (step 8 of :mod:`lipbound.numeric.sdp.rotary`,
:mod:`lipbound.numeric.sdp.own_key`): its constants recomputed here from dense matrices, and the bounds it gives
for causal rotary heads and grouped-query layers against the Jacobian of the independent forward pass of
tests/decoder_reference.py (through tests/test_decoder_heads.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from test_decoder_heads import _layer, _points, reference_norm

from lipbound.numeric.domains import RMSNormOutputs
from lipbound.numeric.model import RMSNorm
from lipbound.numeric.sdp.own_key import OwnKeyTerms
from lipbound.numeric.sdp.rotary import PositionalHeadBounds, positional_bound
from lipbound.numeric.sdp.rotary_layer import positional_layer_bound
from lipbound.numeric.witness import search_witness
from lipbound.rigorous.intervals import upper


def _rotation(kernel, d_k: int, delta: int) -> np.ndarray:
    """``R_Delta`` in floats, written here: the rotated pairs turn by ``Delta base^(-2t/D)``."""
    D, R = kernel.rotated(d_k), np.eye(d_k)
    for t in range(D // 2):
        angle = delta * kernel.base ** (-2 * t / D)
        a, b = (t, t + D // 2) if kernel.pairing == "half" else (2 * t, 2 * t + 1)
        R[a, a] = R[b, b] = math.cos(angle)
        R[a, b], R[b, a] = -math.sin(angle), math.sin(angle)
    return R


def test_the_merged_constants_are_those_of_the_dense_matrices():
    """``a'`` and ``b'`` of :class:`OwnKeyTerms` on an RMSNorm image (``M = diag(gamma)``, ``r = sqrt(d)``, ``Pi = I``)
    against the dense ``Ahat_0 = sigma (W_Q W_K^T + W_K W_Q^T)`` and ``A_Delta = sigma W_Q R_Delta W_K^T``: ``a'`` is
    ``r max ||Ahat M||`` to rounding, ``b'_1b`` at most 1% above ``(r^2 / 2) min_a max_Delta lambda_max(a M V V^T M +
    M Ahat^T Ahat M / a)`` (the certificate is taken at one a found in floats) and not below it (up to the tolerance of
    the search for a here)."""
    rng = np.random.default_rng(41)
    d, d_k, n = 7, 4, 4
    layer = _layer("llama", rng, d, d_k, 1, 1, 1.5)
    head = layer.heads[0]
    gamma = rng.uniform(0.2, 1.0, d)
    domain = RMSNormOutputs(RMSNorm(gamma, 1e-5))
    bounds = PositionalHeadBounds(head, domain, n)
    own = OwnKeyTerms(bounds)
    assert own.applies
    M, r, sigma = np.diag(gamma), math.sqrt(d), 1 / math.sqrt(d_k)
    matrices = {delta: sigma * head.W_Q @ _rotation(head.kernel, d_k, delta) @ head.W_K.T
                for delta in range(-n + 1, 1)}
    matrices[0] = matrices[0] + matrices[0].T
    gain = r * max(np.linalg.norm(A @ M, 2) for A in matrices.values())
    assert upper(own.gain) >= gain
    assert upper(own.gain) == pytest.approx(gain, rel=1e-9)
    values = M @ head.W_V @ head.W_V.T @ M
    scores = [M @ A.T @ A @ M for A in matrices.values()]
    centre = math.log(max(np.trace(s) for s in scores) / np.trace(values)) / 2
    coupled = r ** 2 / 2 * minimize_scalar(lambda log_a: max(np.linalg.eigvalsh(math.exp(log_a) * values + s / math.exp(
        log_a))[-1] for s in scores), bounds=(centre - 12, centre + 12), method="bounded",
        options={"xatol": 1e-10}).fun
    rho = r * np.linalg.norm(head.W_V.T @ M, 2)
    expected = min(coupled, rho * gain)
    assert expected * (1 - 1e-4) <= upper(own.query_term) <= expected * 1.01      # a found here to a tolerance


def test_the_merged_row_split_holds_against_an_independent_jacobian_and_is_tight_at_two_tokens():
    """A causal rotary head at n = 2 (one row: token 1 reads key 0 and itself) and a grouped-query layer at n = 3 on
    an RMSNorm image: step 8 is the reported bound, below steps 6-7, and above the spectral norm of the reference
    Jacobian at points of the domain (and at lipbound's witness for the head); at n = 2 the witness comes within a
    factor 2 of it (a short search: 56.2 against 103.1)."""
    rng = np.random.default_rng(52)
    d, d_k = 6, 2
    domain = RMSNormOutputs(RMSNorm(rng.uniform(0.2, 1.0, d), 1e-5))
    layer = _layer("llama", rng, d, d_k, 4, 2, 2.0)
    for target, n in ((layer.heads[0], 2), (layer, 3)):
        bound = positional_bound(target, domain, n) if target is layer.heads[0] else \
            positional_layer_bound(target, domain, n)
        certificate = bound.details
        assert bound.value == pytest.approx(certificate["own_key_rows"], rel=0, abs=0)
        assert certificate["own_key_rows"] < certificate["coupled_rows"]
        points = _points(rng, domain, n, d, 4)
        if n == 2:
            points.append(search_witness(target, domain=domain, n=n, seed=2, budget_seconds=0.05).X)
        found = max(reference_norm(target, X) for X in points)
        assert found <= bound.value, (found, bound.value)
        if n == 2:
            assert found > bound.value / 2, (found, bound.value)
