"""The global constant of a curve on a domain that holds its neighbourhood, checked against sampled points."""

from __future__ import annotations

import numpy as np

import local_models
from lipbound.local.chains import chain_for
from lipbound.local.curve import _top_singular, lipschitz_curve
from lipbound.numeric.certify import head_constant
from lipbound.numeric.domains import LayerNormOutputs
from lipbound.numeric.model.transformer import Model


def test_curve_global_constant_holds_off_the_layernorm_image():
    """U(X, eps) leaves the LayerNorm image, where the image's constant does not hold: points of U found by
    sampling beat it, and the curve's certified value (its global constant taken on a ball holding U) is
    above every one of them."""
    rng = np.random.default_rng(0)
    norm = local_models.norm(rng, 6, scale=0.05)
    item = local_models.layer(rng, ln_in=norm, scale=2.0)
    model = Model("generated", {0: item}, num_heads=2, hidden=6, num_layers=1)
    X = norm(rng.standard_normal((3, 6)))
    eps = 4.0
    chain = chain_for(model, "head", 0, 0)
    image = head_constant(model.head(0, 0), "fro", LayerNormOutputs(norm), 3).value
    found = 0.0
    for _ in range(40):
        E = rng.standard_normal(X.shape)
        found = max(found, _top_singular(chain, X + E * (eps / np.linalg.norm(E)), np.ones(3, dtype=bool), None, 0)[0])
    assert found > image  # a cap at the image's constant would be refuted
    point = lipschitz_curve(model, X, kind="head", head=0, layer=0, eps=[eps], ascent_steps=2).points[0]
    assert point.verdict == "holds" and found <= point.certified
    assert point.global_constant >= found
