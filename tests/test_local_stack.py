"""A stack's Jacobian at its centre, multiplied block by block with a normwise radius, against a Jacobian written
from the layers' formulas (:func:`local_models.stack_jacobian`: central differences of a forward pass that does not
call the package's)."""

from __future__ import annotations

import local_models
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.local.centre import ChainCentre
from lipbound.local.chains import NormwiseProduct, chain_for
from lipbound.local.stack import composed_variation
from lipbound.numeric.forward import hidden_states
from lipbound.rigorous.linalg import Enclosure, spectral_norm_upper_large


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
