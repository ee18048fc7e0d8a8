"""A local curve's witnesses re-checked in high precision: the point in U decided exactly (boundary points on
both sides of every ball kind), the value enclosed and compared with an independent central difference, and the
curve's verdict taken from the enclosure; maps the re-check does not cover are refused."""
from __future__ import annotations

from dataclasses import replace

import local_models
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError
from lipbound.local.balls import Neighbourhood
from lipbound.local.chains import chain_for, chain_forward
from lipbound.local.curve import lipschitz_curve
from lipbound.local.witness_check import inside, recheckable, witness_enclosure
from lipbound.numeric.kernels.masks import AttentionMask
from lipbound.numeric.model import Layer, LayerNorm
from lipbound.numeric.recheck.chains import CHAIN_WIDTH, chain_directional_norm, chain_gaps


def _on_boundary(ball: str, eps: float, n: int = 3, d: int = 4) -> np.ndarray:
    """An offset whose ball norm is exactly eps in floats (powers of two)."""
    offset = np.zeros((n, d))
    if ball == "2,1":
        offset[0, 0], offset[1, 1] = eps / 2, eps / 2
    else:
        offset[1, 2] = eps
    return offset


@pytest.mark.parametrize("ball", ["fro", "2,1", "2,inf", "tokens"])
def test_membership_is_decided_exactly_on_the_boundary(ball):
    X = np.arange(12.0).reshape(3, 4) / 8
    hood = Neighbourhood(ball, 0.25, (1,) if ball == "tokens" else ())
    edge = _on_boundary(ball, 0.25)
    assert inside(X, X + edge, hood)
    beyond = edge.copy()
    beyond[np.nonzero(edge)[0][0], np.nonzero(edge)[1][0]] *= 1 + 2.0 ** -40
    assert not inside(X, X + beyond, hood)
    if ball == "tokens":   # a token that may not move, moved by one unit in the last place
        still = X.copy()
        still[0, 0] = np.nextafter(still[0, 0], 1.0)
        assert not inside(X, still, hood)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2 ** 16), scale=st.sampled_from([0.5, 2.0, 6.0]))
def test_the_enclosure_holds_an_independent_central_difference(seed, scale):
    model = local_models.model(seed, layers=1, scale=scale)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((4, 6))
    for kind, head in (("layer", None), ("head", 1)):
        chain = chain_for(model, kind, 0, head, None)
        hood = Neighbourhood("fro", 0.5)
        Y = X + 0.3 * rng.standard_normal(X.shape) / np.sqrt(X.size)
        E = rng.standard_normal(X.shape)
        low, high = witness_enclosure(chain, X, Y, E, hood)
        h = 1e-5
        plus, minus = (chain_forward(chain, (Y + s * h * E)[None])[-1][0] for s in (1, -1))
        difference = np.linalg.norm((plus - minus) / (2 * h)) / np.linalg.norm(E)
        assert low <= high <= low * (1 + 1e-12)
        assert difference == pytest.approx(low, rel=1e-6)
        # a point outside U, or a direction moving a token that may not move: not re-checked
        assert witness_enclosure(chain, X, X + 2 * (Y - X) / np.linalg.norm(Y - X), E, hood) is None
        tokens = Neighbourhood("tokens", 0.5, (0,))
        assert witness_enclosure(chain, X, X, E, tokens) is None


def test_the_curve_reports_and_judges_by_the_enclosure():
    model = local_models.model(3, layers=1, scale=3.0)
    X = np.random.default_rng(3).standard_normal((5, 6))
    curve = lipschitz_curve(model, X, kind="layer", eps=[0.0, 0.1, 1.0], recheck=True)
    for point in curve.points:
        low, high = point.witness_rechecked
        assert low <= point.witness * (1 + 1e-9) and point.witness <= high * (1 + 1e-9)
        assert point.verdict == "holds" and high <= point.certified
    plain = lipschitz_curve(model, X, kind="layer", eps=[0.0, 0.1, 1.0])
    assert [p.witness for p in plain.points] == [p.witness for p in curve.points]
    assert all(p.witness_rechecked == () for p in plain.points)
    with pytest.raises(AssumptionError, match="recheck"):
        lipschitz_curve(model, X, kind="layer", eps=[0.1], norm="2,1", recheck=True)
    assert recheckable(chain_for(model, "layer", 0, None, None), "2,1")


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2 ** 16), blocks=st.sampled_from([1, 2]), scale=st.sampled_from([0.5, 3.0]))
def test_a_chain_enclosure_holds_the_test_suites_own_layer_formula(seed, blocks, scale):
    """Blocks and stacks: the chain re-check against central differences of BERT's layer written in the test
    helpers (``local_models._layer``), not through the package's engine."""
    model = local_models.model(seed, layers=2, scale=scale)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((3, 6))
    E = rng.standard_normal(X.shape)
    chain = chain_for(model, "block" if blocks == 1 else "stack", 0, None, blocks - 1)
    assert recheckable(chain, "fro") == ""
    low, high = chain_directional_norm([(c.kind, c.target) for c in chain], X, E)

    def forward(Z):
        for index in range(blocks):
            Z = local_models._layer(model.layer(index), Z)
        return Z
    h = 1e-5
    difference = np.linalg.norm((forward(X + h * E) - forward(X - h * E)) / (2 * h)) / np.linalg.norm(E)
    assert low <= high <= low * (1 + CHAIN_WIDTH)
    assert difference == pytest.approx(low, rel=1e-6)
    # the same chain with its last LayerNorm's gain doubled is told apart
    ln = chain[-1].target
    doubled = [(c.kind, c.target) for c in chain[:-1]] + [("norm", LayerNorm(2 * ln.gamma, ln.beta, eps=ln.eps))]
    assert chain_directional_norm(doubled, X, E)[0] > high


def test_maps_the_chain_check_does_not_follow_are_named():
    model = local_models.model(0, layers=1)
    item = model.layer(0)
    causal = Layer(tuple(replace(h, mask=AttentionMask(causal=True)) for h in item.attention.heads),
                   item.attention.W_O, item.attention.b_O, residual=True)
    assert "masks" in chain_gaps([("attention", causal)])
    assert "GELU" in chain_gaps([("feedforward", replace(item.ffn, act="relu"))])
    assert "gated" in chain_gaps([("gated", item.ffn)])


def test_the_error_functions_series_reaches_past_the_tail_bound():
    from mpmath import erf as exact_erf
    from mpmath import mp, mpf

    from lipbound.rigorous.functions import erf
    from lipbound.rigorous.intervals import IV, precision
    with precision(140):
        pairs = [(x, erf(IV.mpf(x)), erf(IV.mpf(x), tail_from=14)) for x in ("6.5", "9.25", "13.5")]
    with precision(1200), mp.workdps(300):   # (the ends compared exactly)
        for x, tail, series in pairs:
            assert series.a >= tail.a   # (its upper end may pass 1 by its own width)
            assert series.delta < min(mpf("1e-35"), tail.delta / 1000)
            assert series.a <= exact_erf(mpf(x)) <= series.b
