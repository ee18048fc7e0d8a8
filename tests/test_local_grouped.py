"""``||DF(X)||`` from the blocks between groups of tokens (lipbound.local.grouped), against independent routes.

* on generated heads and attention layers (hypothesis): the grouped bound is at least the exact norm of
  the Jacobian formed here by central differences and equals the certified dense norm with a single group;
  with one token per group its entries are the exact block norms (whose column and row sums bound the
  (2,1) and (2,inf) norms);
* a whole layer (attention, LayerNorm, feed-forward block, LayerNorm) on real weights: the grouped bound
  against the certified norm of the dense product of the four Jacobians;
* the curve on real weights with the dense route switched off: its value at eps = 0 comes from the groups,
  is certified above the dense value and far below the products of per-token block norms.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_local_bounds import central_jacobian
from test_local_curvature import _forward, _target

from lipbound.local import curve as curve_module
from lipbound.local.centre import ChainCentre
from lipbound.local.chains import Component, chain_for
from lipbound.local.curve import _matrix_norm, lipschitz_curve
from lipbound.local.grouped import covers, group_block_norms
from lipbound.local.witness_search import float_jacobian
from lipbound.rigorous.linalg import spectral_norm_upper_large


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), kind=st.sampled_from(["head", "layer"]), n=st.integers(2, 6),
       size=st.integers(1, 4), scale=st.floats(0.3, 3.0))
def test_group_bound_dominates_the_exact_norm_and_is_exact_for_one_group(seed, kind, n, size, scale):
    rng = np.random.default_rng(seed)
    d = 4
    target = _target(rng, kind, d, heads=2, d_k=3, scale=scale)
    X = rng.standard_normal((n, d))
    chain = [Component("head" if kind == "head" else "attention", target, kind)]
    centre = ChainCentre(chain, X, dense=True)
    J = central_jacobian(lambda Y: _forward(target, Y), X)                            # (n, d_out, n, d)
    exact = np.linalg.norm(J.reshape(J.shape[0] * J.shape[1], -1), 2)
    moving = np.ones(n, dtype=bool)
    grouped = _matrix_norm(group_block_norms(chain, centre.enclosed, moving, size), "fro")
    assert grouped >= exact * (1 - 1e-6)
    single = _matrix_norm(group_block_norms(chain, centre.enclosed, moving, n), "fro")
    dense = spectral_norm_upper_large(centre.jacobian)
    assert single == pytest.approx(dense, rel=1e-6) and single >= exact * (1 - 1e-6)
    assert grouped >= single * (1 - 1e-9)       # coarser blocks never beat the whole matrix
    # one token per group: the certified per-token block norms, whose column and row sums give the mixed norms
    per_token = group_block_norms(chain, centre.enclosed, moving, 1)
    blocks = np.linalg.norm(J.transpose(0, 2, 1, 3), ord=2, axis=(2, 3))            # (n_out, n_in), exact
    slack = 1e-6 * blocks.max()    # central differences' own error
    assert np.all(per_token >= blocks - slack)
    assert np.all(per_token <= blocks + slack)
    # only the moving tokens' inputs: the bound covers that sub-matrix
    some = moving.copy()
    some[0] = False
    sub = J[:, :, some, :]
    exact_sub = np.linalg.norm(sub.reshape(sub.shape[0] * sub.shape[1], -1), 2)
    assert _matrix_norm(group_block_norms(chain, centre.enclosed, some, size), "fro") >= exact_sub * (1 - 1e-6)


@pytest.mark.slow   # 6-8 s; generated layers above and the real-weights curve below cover the groups by default
def test_whole_layer_by_groups_on_real_weights():
    """The block chain (attention, LayerNorm, feed-forward, LayerNorm) of layer 0 on a real sentence, against
    the norm of its float Jacobian from JVPs (the product of the components' certified dense Jacobians took
    four minutes on two busy cores)."""
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("Cats slept."))[0][:4]   # four tokens: two groups of two
    chain = chain_for(bert.model, "block", 0)
    assert covers(chain) and not covers(chain_for(bert.model, "stack", 0, last=1))
    centre = ChainCentre(chain, X, dense=False)
    moving = np.ones(X.shape[0], dtype=bool)
    J = float_jacobian(chain, X, moving)
    dense = float(np.linalg.norm(J.reshape(J.shape[0] * J.shape[1], -1), 2))
    whole = _matrix_norm(group_block_norms(chain, centre.enclosed, moving, X.shape[0]), "fro")
    halves = _matrix_norm(group_block_norms(chain, centre.enclosed, moving, 2), "fro")
    assert dense <= whole <= dense * (1 + 1e-6)     # one group: the certified norm of the whole Jacobian
    assert whole <= halves <= 2 * dense


def test_curve_beyond_the_dense_limit_takes_the_groups(monkeypatch):
    """With the dense route switched off the eps = 0 value comes from the blocks between token groups: above
    the dense value, far below the products of per-token block norms, and the curve still holds."""
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    X = bert.hidden_states(bert.encode("Cats slept."))[0]
    dense = lipschitz_curve(bert.model, X, kind="layer", eps=(0.0,))
    monkeypatch.setattr(curve_module, "DENSE_LIMIT", 0)
    monkeypatch.setattr(curve_module.grouped, "GROUP_WIDTH", 4 * X.shape[1])
    calls = []
    by_groups = lipschitz_curve(bert.model, X, kind="layer", eps=(0.0,),
                                progress=lambda done, total, what: calls.append(what))
    assert (dense.jacobian_bound, by_groups.jacobian_bound) == ("dense", "grouped")
    assert by_groups.to_json()["jacobian_bound"] == "grouped"
    assert "blocks of DF(X)" in calls and calls[-1] == "radii"
    assert dense.jacobian_norm <= by_groups.jacobian_norm <= 2 * dense.jacobian_norm
    assert all(p.verdict == "holds" for p in by_groups.points)
    monkeypatch.setattr(curve_module.grouped, "covers", lambda chain: False)
    blockwise = lipschitz_curve(bert.model, X, kind="layer", eps=(0.0,))
    assert blockwise.jacobian_bound == "blockwise"
    assert blockwise.jacobian_norm > 5 * by_groups.jacobian_norm


def test_float_jacobian_in_chunks_is_the_whole_one():
    """The witnesses' dense float Jacobian, formed a few basis directions at a time, against one pass."""
    rng = np.random.default_rng(3)
    target = _target(rng, "layer", 4, heads=2, d_k=3, scale=1.0)
    X = rng.standard_normal((5, 4))
    chain = [Component("attention", target, "layer")]
    moving = np.array([True, False, True, True, False])
    whole = float_jacobian(chain, X, moving, chunk=10_000)
    assert np.array_equal(float_jacobian(chain, X, moving, chunk=3), whole)
    J = central_jacobian(lambda Y: _forward(target, Y), X)[:, :, moving]
    assert np.allclose(whole, J, atol=1e-6)


def test_every_route_of_the_curve_has_its_line_in_the_table():
    """The table names each way ||DF(X)|| and the variation can be bounded (registries complete)."""
    import dataclasses

    from lipbound.local.curve import LipschitzCurve
    from lipbound.measures.curves import curve_table
    curve = LipschitzCurve("layer", "layer 0 attention", "fro", "fro", (), 3, 1.0, 2.0, 1.5)
    lines = {(jacobian, variation): curve_table(dataclasses.replace(curve, jacobian_bound=jacobian,
                                                                    variation_bound=variation)).splitlines()[1]
             for jacobian in ("dense", "grouped", "blockwise")
             for variation in ("blockwise", "curvature-gram", "curvature-split")}
    assert len(set(lines.values())) == 9
