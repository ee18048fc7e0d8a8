"""A stack's Jacobian at its centre, multiplied block by block with a normwise radius, against a Jacobian written
from the layers' formulas (:func:`local_models.stack_jacobian`: central differences of a forward pass that does not
call the package's)."""

from __future__ import annotations

import local_models
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.local import tail
from lipbound.local.centre import ChainCentre
from lipbound.local.chains import NormwiseProduct, chain_for, right_product
from lipbound.local.stack import composed_variation
from lipbound.numeric.forward import hidden_states
from lipbound.rigorous.arrays import IntervalArray
from lipbound.rigorous.linalg import Enclosure, spectral_norm_upper_large, vector_norm_upper
from lipbound.rigorous.panels import point_product_panels


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(1, 4), size=st.integers(2, 9),
       radius=st.sampled_from([0.0, 1e-9, 1e-3, 0.3]))
def test_normwise_product_holds_every_product_of_enclosed_matrices(seed, count, size, radius):
    """Lemma normwise-product: products of matrices drawn inside the factors' enclosures (at their corners and
    inside) never exceed ``NormwiseProduct.norm_upper``, which also stays within the radii's reach of the
    midpoints' product."""
    rng = np.random.default_rng(seed)
    factors = [Enclosure(rng.standard_normal((size, size)), radius * rng.random((size, size))) for _ in range(count)]
    product = NormwiseProduct()
    for factor in factors:
        product.multiply(factor, spectral_norm_upper_large(factor))
    bound = product.norm_upper()
    for draw in range(8):
        shape = (count, size, size)
        signs = rng.choice([-1.0, 1.0], size=shape) if draw % 2 else rng.uniform(-1, 1, shape)   # corners, inside
        exact = np.linalg.multi_dot([np.eye(size)] + [f.mid + s * f.rad for f, s in zip(factors, signs)])
        assert np.linalg.norm(exact, 2) <= bound * (1 + 1e-12)
    middle = np.linalg.norm(np.linalg.multi_dot([np.eye(size)] + [f.mid for f in factors]), 2)
    reach = sum(np.prod([np.linalg.norm(g.mid, 2) + np.linalg.norm(g.rad) for g in factors[:k]])
                * np.linalg.norm(factors[k].rad)
                * np.prod([np.linalg.norm(g.mid, 2) + np.linalg.norm(g.rad) for g in factors[k + 1:]])
                for k in range(count))
    assert bound <= (middle + 2 * reach) * (1 + 1e-5) + 1e-12   # (the Cholesky level sits 1e-6 above)


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(2, 3), scale=st.sampled_from([1.0, 2.5]))
def test_stack_jacobian_from_block_products_is_tight_and_holds(seed, blocks, scale):
    """The blocks' Jacobians at the float centres (midpoint-radius, tiny radii) multiplied with a normwise radius
    bound the stack's Jacobian at X (central differences of the forward written here) from above, within 1e-6 of
    it: the entrywise radius of a dense product grows with every factor's absolute values instead."""
    model = local_models.model(seed=seed % 64, layers=blocks, scale=scale)
    X = hidden_states(model, list(np.random.default_rng(seed).integers(0, 12, 4)))[0]
    chain = chain_for(model, "stack", 0, last=blocks - 1)
    centre = ChainCentre(chain, X, True, keep=(4,), whole=False)
    assert centre.jacobian is None
    product = NormwiseProduct()
    for l in range(blocks):
        J = centre.part(chain, 4 * l, 4 * (l + 1), True).jacobian
        product.multiply(J, spectral_norm_upper_large(J))
    truth = np.linalg.norm(local_models.stack_jacobian(model, X, blocks), 2)
    bound = product.norm_upper()
    assert truth <= bound * (1 + 1e-7)   # (central differences: about 1e-9 relative)
    assert bound <= truth * (1 + 1e-6)


def test_a_composed_variation_past_the_float_range_is_no_bound_not_an_error():
    # six blocks' constants of 1e98 (MiniLM at 1e-3 R) multiply past the float range: the route gives inf
    L, V = [[1e98]] * 6, [[1e98]] * 6
    prefix = [1.0] + [1e60] * 6
    assert composed_variation(L, V, prefix, 6, 0) == np.inf
    exact = 3.0 * 0.5 + 0.25 * 4.0   # L_2 V_1 + V_2 pi_1
    assert exact <= composed_variation([[2.0], [3.0]], [[0.5], [0.25]], [1.0, 4.0, 12.0], 2, 0) <= exact * (1 + 1e-12)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 7), radius=st.sampled_from([0.0, 1e-9, 0.3]))
def test_panel_products_hold_every_product_and_match_the_whole_one(seed, rows, radius):
    """``point_product_panels`` (panels of ``rows`` rows): its midpoint is the whole product's up to the float
    products' own rounding, ``s`` is at least the whole midpoint-radius product's radius norm (up to the panels'
    interval sum), and ``|P A' - mid|`` stays within ``s`` for matrices A' at the corners of and inside A."""
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((13, 9))
    A = Enclosure(rng.standard_normal((9, 11)), radius * rng.random((9, 11)))
    mid, s = point_product_panels(P, A, rows=rows)
    whole = Enclosure.exact(P) @ A
    assert np.allclose(mid, whole.mid, rtol=1e-14, atol=1e-14)
    assert vector_norm_upper(whole.rad) <= s * (1 + 1e-12)
    for draw in range(6):
        signs = rng.choice([-1.0, 1.0], size=A.shape) if draw % 2 else rng.uniform(-1, 1, A.shape)
        assert np.linalg.norm(P @ (A.mid + signs * A.rad) - mid) <= s


def test_a_factor_settled_later_gives_the_same_product_bound():
    """``NormwiseProduct.multiply(A, None)`` then ``settle(a)`` is ``multiply(A, a)``: the stack multiplies a block's
    Jacobian before its curve and gives the norm after."""
    rng = np.random.default_rng(3)
    factors = [Enclosure(rng.standard_normal((600, 600)) / 30, 1e-6 * rng.random((600, 600))) for _ in range(3)]
    now, later = NormwiseProduct(), NormwiseProduct()
    for factor in factors:
        norm = spectral_norm_upper_large(factor)
        now.multiply(factor, norm)
        later.multiply(factor, None)
        later.settle(norm)
    assert now.radius == later.radius and np.array_equal(now.mid, later.mid)
    assert now.norm_upper() == later.norm_upper()


def test_memory_saving_jacobians_are_the_dense_ones():
    """The attention's Jacobian filled as midpoints and radii token by token, a per-token map's product written
    over its left factor, and the Jacobian's scaled columns formed by panels of rows: the same floats as the
    whole-matrix forms."""
    model = local_models.model(seed=5, layers=1, d=8)
    X = hidden_states(model, [1, 4, 2, 7, 3])[0]
    chain = chain_for(model, "block", 0)
    centre = ChainCentre(chain, X, True)
    attention = centre.enclosed[0]
    at_x = attention.jacobian_enclosure()
    dense = attention.jacobian().to_enclosure()
    assert np.array_equal(at_x.mid, dense.mid) and np.array_equal(at_x.rad, dense.rad)
    fresh = right_product(at_x, chain[1], centre.enclosed[1])
    copied = Enclosure(at_x.mid.copy(), at_x.rad.copy())
    written = right_product(copied, chain[1], centre.enclosed[1], in_place=True)
    assert written.mid is copied.mid
    assert np.array_equal(fresh.mid, written.mid) and np.array_equal(fresh.rad, written.rad)
    scales = np.linspace(0.5, 3.0, X.shape[0])
    repeated = IntervalArray(np.repeat(scales, X.shape[1]))
    whole = spectral_norm_upper_large((IntervalArray.from_enclosure(at_x) * repeated.expand(0)).to_enclosure())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tail, "SCALED_ROWS", 3)
        assert tail._columns_scaled_norm(at_x, scales) == whole


def test_euclidean_sums_by_panels_are_the_whole_ones(monkeypatch):
    """The affine forms' Euclidean sums over the symbols, formed for panels of entries: the same floats."""
    from lipbound.rigorous import zonotope
    rng = np.random.default_rng(2)
    generators = rng.standard_normal((40, 3, 7)) * 1e-3
    whole = IntervalArray(np.abs(generators)).norm_upper(axis=0)
    monkeypatch.setattr(zonotope, "_PANEL_ENTRIES", 50)
    assert np.array_equal(zonotope._l2_sum(generators, absolute=True), whole)
    assert np.array_equal(zonotope._l2_sum(np.abs(generators).swapaxes(1, 2)), whole.T)


def test_a_group_block_filled_token_by_token_is_the_stacked_one():
    """``||DF(X)||`` by groups: the block between two groups of tokens filled input token by input token is the
    stacked interval block settled at once, float for float."""
    from lipbound.local import grouped
    model = local_models.model(seed=8, layers=1, d=8)
    X = hidden_states(model, [3, 1, 4, 1, 5, 9])[0]
    centre = ChainCentre(chain_for(model, "block", 0), X, False)
    attention, inputs, outputs = centre.enclosed[0], np.array([1, 2, 4]), np.array([0, 3])
    tails = IntervalArray.stack([grouped.token_tail(centre.enclosed, int(i)) for i in outputs])
    block = IntervalArray.stack([attention.jacobian_column(int(j), outputs).bmm(tails) for j in inputs])
    g, m, d, width = block.shape
    stacked = block.swapaxes(1, 2).reshape(g * d, m * width).to_enclosure()
    filled = attention.jacobian_enclosure(inputs, outputs, tails)
    assert np.array_equal(filled.mid, stacked.mid) and np.array_equal(filled.rad, stacked.rad)


def test_a_block_tail_goes_without_the_cycle_collector():
    """A block's tail (its per-token facts, 19 MB a token of MiniLM) is freed when its curve lets it go, not only by a
    full collection of the cycle collector (which a stack's blocks seldom trigger)."""
    import gc
    import weakref
    model = local_models.model(seed=3, layers=1, d=8)
    X = hidden_states(model, [2, 7, 1, 8])[0]
    centre = ChainCentre(chain_for(model, "block", 0), X, False)
    enabled = gc.isenabled()
    gc.disable()
    try:
        made = tail.BlockTail(centre.enclosed)
        assert made.folded.folded_weights(1) is made._token(1)["A"]
        kept = weakref.ref(made)
        del made
        assert kept() is None
    finally:
        if enabled:
            gc.enable()


def test_a_released_block_leaves_its_caches_and_only_its_own():
    """:func:`~lipbound.local.enclosed.release_block`: the per-block caches forget the entries one of the owners
    given owns, keep the others, and compute a released entry afresh."""
    from lipbound.local import enclosed, point_stages
    model = local_models.model(seed=4, layers=2, d=8)
    first, second = model.layer(0).ffn, model.layer(1).ffn
    grams = [enclosed.feedforward_grams(ffn) for ffn in (first, second)]
    slopes = point_stages._slope_gram(first, model.layer(0).ffn_norm.gamma)
    enclosed.release_block(model.layer(0).ln_out, first)
    assert all(owner is not first for cache in (enclosed._GRAMS, point_stages._SLOPE_GRAMS)
               for kept, _ in cache.values() for owner in kept)
    assert enclosed.feedforward_grams(second) is grams[1]
    again = enclosed.feedforward_grams(first)
    assert again is not grams[0] and np.array_equal(again[0].lo, grams[0][0].lo)
    assert point_stages._slope_gram(first, model.layer(0).ffn_norm.gamma) is not slopes


def test_a_stack_lets_each_blocks_attention_products_go_with_the_same_curve(monkeypatch):
    """:func:`~lipbound.local.stack.release_products`: once a block's curve has run, its attention's Jacobian
    products go (every block's, each once, after its own Jacobians were formed), and the stack's curve is the same
    float by float as when they stay."""
    from lipbound.local.curve import lipschitz_curve
    from lipbound.local.enclosed import EnclosedAttention
    model = local_models.model(seed=3, layers=2)
    X = hidden_states(model, [1, 5, 7, 2])[0]
    released = []
    original = EnclosedAttention.release_products

    def recording(self):
        released.append((self, self._products is not None))
        original(self)
    monkeypatch.setattr(EnclosedAttention, "release_products", recording)
    curve = lipschitz_curve(model, X, kind="stack", layer=0, last=1, eps=[1e-3], ascent_steps=0)
    assert len(released) == 2 and len({id(e) for e, _ in released}) == 2 and all(formed for _, formed in released)
    assert all(e._products is None for e, _ in released)
    monkeypatch.setattr(EnclosedAttention, "release_products", lambda self: None)
    kept = lipschitz_curve(model, X, kind="stack", layer=0, last=1, eps=[1e-3], ascent_steps=0)
    assert [p.certified for p in curve.points] == [p.certified for p in kept.points]
    assert [p.variation for p in curve.points] == [p.variation for p in kept.points]
    assert curve.blocks == kept.blocks
