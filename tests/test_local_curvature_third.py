"""The curvature's third group through one Kronecker operator per query (lemma curvature-third-kronecker,
lipbound/local/third_group.py), against quantities formed here:

* the certified ``max_i ||K_i||`` is at least the dense operator's norm of every query (``sum_h Qt_h^T kron D_hi``
  formed with numpy's kron) and at least the trilinear half ``c^(-1) ||r_i(e, F)||`` written from its definition
  (``sum_(h, j) p_hij (e Qt_h f_j^T) u_hij``) at points found by alternating ascent, over generated layers;
* the whole third group's closed form (the tests' own second derivative) at points of the Frobenius ball, along
  directions found by alternating ascent, stays below ``chi_III`` with the new form, which is the smallest at X;
* a mutation: the heads' cross terms left out (``sum_h (Qt_h^T Qt_h) kron (D_hi D_hi^T)`` alone, each head's part
  squared) is beaten by the ascent on some generated layer, so the tests above can tell it apart.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_local_curvature import _frobenius_points, _second
from test_local_curvature_spread import _at
from test_relational import _layer

from lipbound.local.balls import Neighbourhood
from lipbound.local.bounds import attention_bounds, value_space
from lipbound.local.curvature import AttentionCurvature
from lipbound.local.enclosed import EnclosedAttention
from lipbound.local.third_group import third_group_norm


def _score_maps(target):
    return [h.W_Q @ h.W_K.T for h in target.heads]


def _rows(target, Y):
    """``D_hi``'s rows ``p_hij u_hij`` per head at Y, (H, n(i), n(j), d_out)."""
    return np.array([P[:, :, None] * u for P, u in _at(target, Y)])


def _certified(target, X) -> float:
    E = EnclosedAttention(target, X)
    at_x, outputs, _ = value_space(E, target)
    rows = E.P.expand(-1) * (at_x.expand(1) - outputs.expand(2))
    return third_group_norm([h.W_Q for h in target.heads], [h.W_K for h in target.heads], rows)


def _dense(Qts, D, cross: bool = True) -> float:
    """``||sum_h Qt_h^T kron D_h||`` through ``sum_(h, g) (Qt_h^T Qt_g) kron (D_h D_g^T)`` (or its h = g terms)."""
    S = sum(np.kron(Qts[h].T @ Qts[g], D[h] @ D[g].T) for h in range(len(Qts)) for g in range(len(Qts))
            if cross or h == g)
    return float(np.sqrt(max(np.linalg.eigvalsh(S)[-1], 0.0)))


def _trilinear(Qts, D, rng, starts: int = 3, steps: int = 60) -> float:
    """The largest ``||sum_(h, j) D_hj (e Qt_h f_j^T)||`` over unit e (d) and F (n, d) found by alternating ascent
    (e, then F, then the output direction y, each optimal for the others)."""
    d, d_out = Qts[0].shape[0], D.shape[2]
    best = 0.0
    for _ in range(starts):
        x, y = rng.standard_normal(d), rng.standard_normal(d_out)
        x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
        for _ in range(steps):
            Dy = [D[h] @ y for h in range(len(Qts))]
            F = sum(np.outer(Dy[h], Qts[h].T @ x) for h in range(len(Qts)))
            F /= max(np.linalg.norm(F), 1e-300)
            x = sum(Qts[h] @ (F.T @ Dy[h]) for h in range(len(Qts)))
            x /= max(np.linalg.norm(x), 1e-300)
            out = sum(D[h].T @ (F @ (Qts[h].T @ x)) for h in range(len(Qts)))
            value = float(np.linalg.norm(out))
            y = out / max(value, 1e-300)
        best = max(best, value)
    return best


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 5), st.integers(1, 3), st.floats(0.3, 3.0))
def test_the_certified_norm_is_above_every_querys_operator_and_its_trilinear_form(seed, n, heads, scale):
    target, rng = _layer(seed, heads=heads, scale=scale)
    X = rng.standard_normal((n, 6))
    certified = _certified(target, X)
    Qts, rows = _score_maps(target), _rows(target, X)
    for i in range(n):
        dense = _dense(Qts, rows[:, i])
        found = _trilinear(Qts, rows[:, i], rng)
        assert found <= dense * (1 + 1e-9) + 1e-12
        assert dense <= certified * (1 + 1e-9) + 1e-12


def _third_ascent(target, Y, rng, steps: int = 8) -> float:
    """The largest ``||III(e, f)||`` (the tests' closed form) over unit e, f found by alternating top singular
    vectors of the linear map ``e -> III(e, f)``, formed column by column."""
    n, d = Y.shape
    f = rng.standard_normal((n, d))
    f /= np.linalg.norm(f)
    value = 0.0
    for _ in range(steps):
        columns = _second(target, Y, np.eye(n * d).reshape(-1, n, d), f, ("III",)).reshape(n * d, -1).T
        u, s, vt = np.linalg.svd(columns)
        value = max(value, float(s[0]))
        f = vt[0].reshape(n, d)
    return value


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 4), st.floats(0.3, 2.0), st.sampled_from([0.0, 0.05, 0.3]))
def test_the_third_group_stays_below_chi_iii_at_points_of_the_ball(seed, n, scale, eps):
    target, rng = _layer(seed, heads=2, scale=scale)
    X = rng.standard_normal((n, 6))
    E = EnclosedAttention(target, X)
    balls = Neighbourhood("fro", eps).balls(X)
    bounds = attention_bounds(target, balls, E)
    curvature = AttentionCurvature(E, target)
    chi_iii = curvature.chis(bounds, balls.radii, eps if eps > 0 else None)[2]
    points = [X] if eps == 0 else [X] + list(_frobenius_points(rng, X, eps, 2))
    for Y in points:
        assert _third_ascent(target, Y, rng) <= chi_iii * (1 + 1e-9)
    if eps == 0:   # at X the Kronecker form is formed and is 2 c max_i ||K_i(X)|| at most
        assert curvature.third_at_x is not None
        assert chi_iii <= 2 * curvature.c * curvature.third_at_x * (1 + 1e-9) + 1e-12


def test_the_heads_cross_terms_are_needed():
    """Mutation: with each head's part alone (``g = h`` only) the bound is beaten by the trilinear form on some
    generated layer, where the certified one never is (above)."""
    beaten = 0
    for seed in range(12):
        target, rng = _layer(seed, heads=3, scale=1.5)
        X = rng.standard_normal((4, 6))
        Qts, rows = _score_maps(target), _rows(target, X)
        for i in range(4):
            if _trilinear(Qts, rows[:, i], rng) > _dense(Qts, rows[:, i], cross=False) * (1 + 1e-6):
                beaten += 1
    assert beaten > 0


@pytest.mark.slow
def test_minilm_first_layer_third_group_at_the_centre():
    """all-MiniLM-L6-v2's first attention layer at "The cat sat on the mat.": chi_III at X is the Kronecker form,
    below the heads-weighted form (the smallest before), and above the trilinear half found by ascent."""
    from lipbound.local.chains import chain_for
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("The cat sat on the mat."))[0]
    target = chain_for(bert.model, "layer", 0)[0].target
    E = EnclosedAttention(target, X)
    balls = Neighbourhood("fro", 0.0).balls(X)
    bounds = attention_bounds(target, balls, E)
    curvature = AttentionCurvature(E, target)
    chi_iii = curvature.chis(bounds, balls.radii)[2]
    before = 2 * curvature.c * curvature._heads_weighted(curvature.output_spreads(bounds.facts))
    assert chi_iii < 0.75 * before
    rows = _rows(target, X)
    Qts = _score_maps(target)
    found = _trilinear(Qts, rows[:, 4], np.random.default_rng(0), starts=2, steps=40)
    assert 2 * curvature.c * found <= chi_iii


def _integrals(target, X, eps, floor):
    """The curvature integral over ``U(X, eps)`` with the Kronecker form formed wherever it can win (share 0),
    never (share inf) and as gated by :data:`KRONECKER_SHARE`, each on a fresh integral: ``(values, formed)``."""
    from types import SimpleNamespace

    import lipbound.local.curvature_integral as integral_module
    rho = Neighbourhood("fro", eps).balls(X).radii
    values, formed = [], []
    for share in (0.0, np.inf, integral_module.KRONECKER_SHARE):
        saved, integral_module.KRONECKER_SHARE = integral_module.KRONECKER_SHARE, share
        try:
            route = integral_module.CurvatureIntegral(SimpleNamespace(target=target), EnclosedAttention(target, X))
            route.floor = floor
            values.append(route.over_balls(rho, eps))
            formed.append(route.curvature.third_at_x is not None)
        finally:
            integral_module.KRONECKER_SHARE = saved
    return values, formed


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 3), st.floats(0.3, 2.0), st.sampled_from([0.01, 0.1, 0.5]),
       st.sampled_from([0.0, 1.0, 100.0]))
@example(3, 3, 0.5, 0.01, 0.0)   # the form lowers this integral by 5%: it must be formed
def test_the_kronecker_form_is_left_out_only_where_it_cannot_move_the_value(seed, n, scale, eps, floor):
    """The integral with the form gated by its effect lies between the one that always forms it where it can win (the
    integral of the chis of :meth:`AttentionCurvature.chis`, step by step) and the one that never does, and it is above
    the first by at most :data:`KRONECKER_SHARE` of ``floor`` plus itself; formed, the two agree."""
    from lipbound.local.curvature_integral import KRONECKER_SHARE, decade_grid
    target, rng = _layer(seed, heads=2, scale=scale)
    X = rng.standard_normal((n, 6))
    (always, never, gated), (_, never_formed, formed) = _integrals(target, X, eps, floor)
    assert not never_formed
    E = EnclosedAttention(target, X)
    curvature, rho = AttentionCurvature(E, target), Neighbourhood("fro", eps).balls(X).radii
    previous = written = 0.0
    for s in decade_grid([1.0]):   # the old integral, written out: every step's chis with the form where it wins
        balls = Neighbourhood("fro", eps * s).balls(X)   # (the heads' movement also by lemma head-movement-spread)
        bounds = curvature.moved_heads(attention_bounds(target, balls, E))
        written += (s - previous) * sum(curvature.chis(bounds, rho * s))
        previous = s
    assert always == pytest.approx(eps * written, rel=1e-9)
    assert always <= gated <= never
    assert gated - always <= KRONECKER_SHARE * (floor + gated) * (1 + 1e-9)
    if formed:
        assert gated == always
    if never > always * (1 + 2 * KRONECKER_SHARE) and floor == 0.0:
        assert formed


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 3), st.floats(0.3, 2.0), st.sampled_from([0.05, 0.5]))
def test_the_integral_stops_early_exactly_where_it_would_pass_the_other_bound(seed, n, scale, eps):
    """The integral with a bound ``other`` to beat is its full value where that is at most ``other`` and inf
    above it (its widest ball is read first, then the others in order); its last term alone (the curve's lower
    bound that orders the routes) is at most the full value."""
    from types import SimpleNamespace

    from lipbound.local.curvature_integral import CurvatureIntegral, decade_grid
    target, rng = _layer(seed, heads=2, scale=scale)
    X = rng.standard_normal((n, 6))
    rho, previous, steps = Neighbourhood("fro", eps).balls(X).radii, 0.0, []
    for s in decade_grid([1.0]):
        steps.append((s - previous, rho * s))
        previous = s
    made = lambda: CurvatureIntegral(SimpleNamespace(target=target), EnclosedAttention(target, X))  # noqa: E731
    full = made().integral(steps, eps)
    assert 0.0 <= made().integral(steps[-1:], eps) <= full
    for other in (0.5 * full, full * (1 - 1e-6), full * (1 + 1e-6), 2.0 * full):
        stopped = made().integral(steps, eps, other)
        assert stopped == (np.inf if full > other else full)
