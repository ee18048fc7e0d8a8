"""A row's key part centred over its keys (step 9 of :mod:`lipbound.numeric.sdp.rotary`,
:mod:`lipbound.numeric.sdp.rotary_centred`).

Against independent routes: the variance inequality on random distributions; each row's key part of the Jacobian
(written in tests/test_decoder_heads.py with the reference rotations) against the centred form of the lemma; the
certified eigenvalue against the same eigenvalue formed here from d x d matrices rotated by the reference forward
(a transposed rotation or the centring left out moves it outside the tolerance); and the head's reported bound
against the spectral norm of the reference Jacobian on generated causal RoPE heads (hypothesis).
"""

from __future__ import annotations

import math
from fractions import Fraction

import decoder_reference as reference
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_decoder_heads import CASES, _key_part, _points, reference_norm, rotary_case, rotary_cases

from lipbound.numeric.domains import TokenBall
from lipbound.numeric.kernels import AttentionMask, Rotary
from lipbound.numeric.model import Head
from lipbound.numeric.sdp.own_key import OwnKeyTerms
from lipbound.numeric.sdp.rotary import PositionalHeadBounds, positional_bound
from lipbound.numeric.sdp.rotary_centred import centred_head_rows
from lipbound.numeric.witness import search_witness
from lipbound.rigorous.intervals import IV, interval, upper
from lipbound.rigorous.linalg import weighted_sum


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 8), st.integers(0, 2 ** 31))
def test_a_variance_is_at_most_half_the_squares_about_the_mean_of_the_keys(count, seed):
    """``Var_p(z) <= (1/2) sum_j (z_j - zbar)^2`` (zbar the plain mean) for every distribution p, with equality at two
    keys of weight 1/2 and opposite z; a quarter in place of the half fails there."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(count) * rng.uniform(0.1, 10)
    for p in (rng.dirichlet(np.full(count, 0.3)), np.eye(count)[0], np.full(count, 1 / count)):
        variance = p @ z ** 2 - (p @ z) ** 2
        assert variance <= 0.5 * np.sum((z - z.mean()) ** 2) * (1 + 1e-12) + 1e-15
    pair, half = np.array([1.0, -1.0]), np.array([0.5, 0.5])
    variance = half @ pair ** 2 - (half @ pair) ** 2
    assert variance == 0.5 * np.sum((pair - pair.mean()) ** 2) == 1.0
    assert 0.25 * np.sum((pair - pair.mean()) ** 2) < variance


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 9), st.integers(0, 2 ** 31))
def test_a_weighted_sum_of_enclosures_encloses_the_exact_sum(count, seed):
    """``weighted_sum`` against exact rational arithmetic: every sum of members of the enclosures (their ends) with the
    float weights lies in the returned enclosure, with magnitudes from 1e-300 to 1e10 and cancelling signs."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal(count) * 10.0 ** rng.integers(-5, 5, count)
    mids = rng.standard_normal((count, 3, 2)) * 10.0 ** rng.integers(-300, 10, (count, 3, 2))
    rads = np.abs(mids) * rng.uniform(0, 1e-8, (count, 3, 2)) * (rng.random((count, 3, 2)) < 0.5)
    found = weighted_sum(weights, mids, rads)
    for sign in (-1, 1):
        for a in range(3):
            for b in range(2):
                exact = sum(Fraction(float(w)) * (Fraction(float(m[a, b])) + sign * Fraction(float(r[a, b])))
                            for w, m, r in zip(weights, mids, rads))
                assert abs(exact - Fraction(float(found.mid[a, b]))) <= Fraction(float(found.rad[a, b]))


def _rotated(head: Head, i: int, j: int) -> np.ndarray:
    """``sigma W_Q R_i^T R_j W_K^T`` (d x d): the score form of query position i and key position j, each vector rotated
    by the reference forward (the rotation of key j, then back by i)."""
    kernel, d_k = head.kernel, head.d_k
    turned = reference.rope(head.W_K[:, None, :], kernel.base, kernel.pairing, kernel.dims, [j] * head.d)[:, 0, :]
    back = reference.rope(turned[:, None, :], kernel.base, kernel.pairing, kernel.dims, [-i] * head.d)[:, 0, :]
    return head.W_Q @ back.T / math.sqrt(d_k)


def _head(rng, d: int, d_k: int, base: float) -> Head:
    return Head(2.0 * rng.standard_normal((d, d_k)), 2.0 * rng.standard_normal((d, d_k)), rng.standard_normal((d, 3)),
                kernel=Rotary(base=base), mask=AttentionMask(causal=True))


def test_each_rows_key_part_is_within_the_centred_form():
    """The lemma row by row, at points of a ball with large and small scores and random moves: ``||key part of row
    i||^2 <= rho^2 (1/2) sum_j (z_j - zbar)^2 <= rho^2 r^2 (1/2) sum_j ||c_j - cbar||^2`` with ``z_j = x_i . c_j``,
    ``c_j = sigma W_Q R_i^T R_j W_K^T e_j`` formed here; the plain form (no centring) is never below it."""
    rng = np.random.default_rng(23)
    d, d_k, n, radius = 5, 4, 4, 1.5
    for trial in range(3):
        head = _head(rng, d, d_k, 2.0 + trial)
        rho = radius * np.linalg.norm(head.W_V, 2)
        for X in _points(rng, TokenBall(radius), n, d, 12):
            for scale in (1.0, 0.3):
                J = _key_part(head, scale * X).reshape(n, head.d_v, n * d)
                for _move in range(3):
                    E = rng.standard_normal((n, d))
                    for i in range(1, n):
                        c = np.array([_rotated(head, i, j) @ E[j] for j in range(i + 1)])
                        z = c @ (scale * X[i])
                        found = float(np.sum((J[i] @ E.reshape(-1)) ** 2))
                        centred = rho ** 2 * 0.5 * float(np.sum((z - z.mean()) ** 2))
                        traced = rho ** 2 * radius ** 2 * 0.5 * float(np.sum((c - c.mean(axis=0)) ** 2))
                        assert found <= centred * (1 + 1e-7) + 1e-12, (found, centred)
                        assert centred <= traced * (1 + 1e-9) + 1e-12
                        assert traced <= rho ** 2 * radius ** 2 * 0.5 * float(np.sum(c ** 2)) * (1 + 1e-12) + 1e-12


def _formed(head: Head, bounds: PositionalHeadBounds, t: np.ndarray, transpose: bool = False,
            centre: bool = True, merged: frozenset = frozenset(), b_merged: float = 0.0, own: bool = False,
            projector: str = "both") -> float:
    """``lambda_max`` of :func:`_form` (same arguments) to the power 1/2."""
    D = _form(head, bounds, t, transpose, centre, merged, b_merged, own, projector)
    return math.sqrt(float(np.linalg.eigvalsh(D)[-1]))


def _form(head: Head, bounds: PositionalHeadBounds, t: np.ndarray, transpose: bool = False,
          centre: bool = True, merged: frozenset = frozenset(), b_merged: float = 0.0, own: bool = False,
          projector: str = "both") -> np.ndarray:
    """Step 9's form formed here on the n d coordinates of the moves (the domains here have interior,
    ``Pi = I``, ``M = I`` on a ball): ``(1 + t_j) b^2 P_Q`` on token j, and per row ``(1 + 1/t_i) rho^2 r^2 (1/2)
    sum_{j, l <= i} (delta_jl - 1/N_i) B_ij^T B_il`` with ``B_ij = sigma W_Q R_i^T R_j W_K^T``; ``transpose`` turns the
    key by ``-j`` (a wrong rotation), ``centre=False`` leaves the ``1/N_i`` out.  Rows in ``merged`` (step 10): the
    query part ``(1 + t_j) b_merged^2 P_F`` (``P_F`` the projector onto ``range [W_Q, W_K]``) and the row's own key left
    out of its form; ``own`` keeps it, ``projector="query"`` takes ``P_Q`` (two wrong forms)."""
    n, d = bounds.rows.n, head.d
    b2 = float(upper(bounds.query_term)) ** 2
    scale2 = float(upper(bounds.spread ** 2 * bounds.r ** 2))
    Q = np.linalg.qr(head.W_Q)[0]
    F = np.linalg.qr(np.concatenate([head.W_Q, head.W_K], axis=1))[0] if projector == "both" else Q
    D = np.zeros((n * d, n * d))
    for j in range(1, n):
        query = b_merged ** 2 * F @ F.T if j in merged else b2 * Q @ Q.T
        D[j * d:(j + 1) * d, j * d:(j + 1) * d] += (1 + t[j]) * query
    for i in range(1, n):
        keys = [j for j in range(i + 1) if own or i not in merged or j != i]
        B = {j: _rotated(head, i, -j if transpose else j) for j in keys}
        for j in keys:
            for l in keys:
                coefficient = 0.5 * ((j == l) - (1 / (i + 1) if centre else 0.0))     # N_i = i + 1 keys
                D[j * d:(j + 1) * d, l * d:(l + 1) * d] += (1 + 1 / t[i]) * scale2 * coefficient * B[j].T @ B[l]
    return D


@settings(max_examples=6, deadline=None)
@given(st.integers(2, 5), st.integers(0, 2 ** 31))
def test_the_worst_move_is_the_top_eigenvector_of_the_form_formed_from_the_rotated_matrices(n, seed):
    """The float estimate's worst move (``move=True``): at its splits t the form formed here from d x d matrices takes
    the value squared at E (its Rayleigh quotient), and that is the form's top eigenvalue, both within 1e-6; a move
    mapped back without the factor L (``e_j = F^+ v_j``) or a token left out gives a quotient outside that band (the
    comparison can fail)."""
    rng = np.random.default_rng(seed)
    d, d_k = 6, 2
    head = _head(rng, d, d_k, float(rng.choice([2.0, 10.0])))
    bounds = PositionalHeadBounds(head, TokenBall(3.0), n)
    value, E, t = centred_head_rows(bounds, bounds.query_term, estimate=True, move=True)
    assert E.shape == (n, d) and abs(np.linalg.norm(E) - 1) < 1e-12
    D = _form(head, bounds, t)
    top = float(np.linalg.eigvalsh(D)[-1])

    def quotient(M: np.ndarray) -> float:
        m = M.reshape(-1) / np.linalg.norm(M)
        return float(m @ D @ m)

    assert abs(quotient(E) - value ** 2) <= 1e-6 * top and abs(top - value ** 2) <= 1e-6 * top, (value ** 2, top)
    F = np.concatenate([bounds.query_left.mid, bounds.key_left.mid], axis=1)
    moves = np.linalg.solve(np.linalg.cholesky(F.T @ F), F.T @ E.T)                # v_j = L^-1 F^T e_j
    plain = np.linalg.pinv(F.T) @ moves                                             # e_j = (F^T)^+ v_j: L left out
    dropped = E.copy()
    dropped[int(np.argmax((E ** 2).sum(axis=1)))] = 0.0
    assert min(abs(quotient(plain.T) - top), abs(quotient(dropped) - top)) > 1e-6 * top


@settings(max_examples=4, deadline=None)
@given(st.integers(2, 5), st.integers(0, 2 ** 31))
def test_the_certified_eigenvalue_is_the_one_formed_from_the_rotated_matrices(n, seed):
    """``centred_head_rows`` at given splits equals the eigenvalue formed here from d x d matrices, from above and
    within 1e-5 (the enlarged inverse, the dyadic ``theta_i``); a transposed rotation or the centring left out moves the
    formed value outside that band (the comparison can fail).  The heads' weights are unconstrained here (``nu_i =
    1/2``), where every row is centred."""
    rng = np.random.default_rng(seed)
    d, d_k = 6, 2
    head = _head(rng, d, d_k, float(rng.choice([2.0, 10.0])))
    bounds = PositionalHeadBounds(head, TokenBall(3.0), n)
    assert all(upper(bounds.row_nu(i)) >= 0.5 for i in range(1, n))
    t = rng.uniform(0.3, 3.0, n)
    certified = float(upper(centred_head_rows(bounds, bounds.query_term, splits=t)))
    formed = _formed(head, bounds, t)
    assert formed <= certified <= formed * (1 + 1e-5), (formed, certified)
    for mutated in (_formed(head, bounds, t, transpose=True), _formed(head, bounds, t, centre=False)):
        assert not formed * (1 - 1e-5) <= mutated <= formed * (1 + 1e-5), (formed, mutated)


@settings(max_examples=4, deadline=None)
@given(st.integers(3, 5), st.integers(0, 2 ** 31))
def test_the_merged_rows_eigenvalue_is_the_one_formed_from_the_rotated_matrices(n, seed):
    """Step 10 at given splits: ``centred_head_rows`` with the own keys of some rows merged into their query parts
    equals the eigenvalue formed here from d x d matrices, from above and within 1e-5; keeping the merged rows' own
    keys in their forms, or bounding their query parts on the span of ``W_Q`` alone, moves the formed value outside
    that band for one of the two choices of rows at least (the comparison can fail)."""
    rng = np.random.default_rng(seed)
    d, d_k = 6, 2
    head = _head(rng, d, d_k, float(rng.choice([2.0, 10.0])))
    bounds = PositionalHeadBounds(head, TokenBall(3.0), n)
    t = rng.uniform(0.3, 3.0, n)
    b_merged = float(upper(bounds.query_term)) * rng.uniform(0.9, 1.3)
    moved = {"own": False, "query": False}
    for merged in (frozenset({1}), frozenset(range(1, n))):
        certified = float(upper(centred_head_rows(bounds, bounds.query_term, splits=t, merged=merged,
                                                  b_merged=interval(b_merged))))
        formed = _formed(head, bounds, t, merged=merged, b_merged=b_merged)
        assert formed <= certified <= formed * (1 + 1e-5), (formed, certified)
        for kind, mutated in (("own", _formed(head, bounds, t, merged=merged, b_merged=b_merged, own=True)),
                              ("query", _formed(head, bounds, t, merged=merged, b_merged=b_merged,
                                                projector="query"))):
            moved[kind] |= not formed * (1 - 1e-5) <= mutated <= formed * (1 + 1e-5)
    assert all(moved.values()), moved


@CASES
@given(rotary_cases)
def test_the_merged_rows_hold_against_an_independent_jacobian(case):
    """Step 10 on generated causal RoPE heads: with every row's own key merged (the certified ``b'`` of step 8), and
    with the first row's alone, the bound plus the mean term is at least the spectral norm of the reference Jacobian
    at points of the domain and at lipbound's witness."""
    rng, layer, domain = rotary_case(case)
    d, n = case["d"], case["n"]
    head = layer.heads[0]
    bounds = PositionalHeadBounds(head, domain, n)
    own = OwnKeyTerms(bounds)
    if not own.applies or n < 2:
        return
    mean = bounds.value_norm * IV.sqrt(bounds.terms()["kappa"])
    witness = search_witness(head, domain=domain, n=n, budget_seconds=0.1, seed=case["seed"] % 1000)
    found = max(reference_norm(head, X) for X in _points(rng, domain, n, d, 3) + [witness.X])
    for merged in (frozenset({1}), frozenset(range(1, n))):
        rows = centred_head_rows(bounds, bounds.query_term, merged=merged, b_merged=own.query_term)
        if rows is not None:
            assert found <= upper(rows + mean), (found, upper(rows + mean))


@CASES
@given(rotary_cases)
def test_the_centred_rows_hold_against_an_independent_jacobian(case):
    """Step 9 on generated causal RoPE heads (the first head of a grouped-query layer): the centred candidate bounds the
    spectral norm of the reference Jacobian at points of the domain and at lipbound's witness, and so does the reported
    bound."""
    rng, layer, domain = rotary_case(case)
    d, n = case["d"], case["n"]
    head = layer.heads[0]
    bound = positional_bound(head, domain, n)
    certificate = bound.details
    witness = search_witness(head, domain=domain, n=n, budget_seconds=0.1, seed=case["seed"] % 1000)
    found = max(reference_norm(head, X) for X in _points(rng, domain, n, d, 3) + [witness.X])
    assert found <= bound.value, (found, bound.value)
    if "centred_rows" in certificate:
        assert found <= certificate["centred_rows"], (found, certificate["centred_rows"])
