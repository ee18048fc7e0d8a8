"""Local certificates of decoders (causal rotary attention with grouped keys, RMSNorm, SwiGLU, pre-norm
layers): the certified ``L(eps)`` against Jacobians of the reference forward pass written in
tests/decoder_reference.py from the published architecture (not the package's engine), taken by central
differences at points of the Frobenius ball ``U(X, eps)``; and on the real SmolLM2-135M-Instruct (GGUF),
layer 15 (and, slow, layer 0) at small radii, against difference quotients of the float engine.

On a convex neighbourhood the Lipschitz constant in the Frobenius norm is the largest spectral norm of
the Jacobian over it, so every such norm is a witness the certified value must not fall below.
"""

from __future__ import annotations

import numpy as np
import pytest
from decoder_checkpoints import SMOLLM_GROUP
from decoder_reference import rms_norm
from hypothesis import given, settings
from hypothesis import strategies as st
from test_decoders import (
    CONFIGS,
    DK,
    D,
    attention_reference,
    layer_reference,
    lipbound_model,
    random_weights,
)
from test_local_bounds import central_jacobian

from lipbound.local.curve import lipschitz_curve

EPS = (0.0, 1e-3, 1e-2, 0.1)


def _reference(kind: str, w: dict, cfg: dict, head: int):
    """The map of ``--kind`` on a pre-norm layer, from the reference equations."""
    if kind == "block":
        return lambda Y: layer_reference(Y, w, cfg)
    if kind == "layer":
        return lambda Y: Y + attention_reference(rms_norm(Y, w["in_norm"], cfg["eps"]), w, cfg)
    pick = np.zeros((cfg["heads"] * DK, DK))          # the head's output before W_O
    pick[head * DK:(head + 1) * DK] = np.eye(DK)
    return lambda Y: attention_reference(rms_norm(Y, w["in_norm"], cfg["eps"]), {**w, "o": pick}, cfg)


def _spectral(J: np.ndarray) -> float:
    n, d_out = J.shape[:2]
    return float(np.linalg.norm(J.reshape(n * d_out, -1), 2))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), kv=st.sampled_from([1, 2, 4]), kind=st.sampled_from(["head", "layer", "block"]),
       n=st.integers(2, 4), spread=st.sampled_from([0.5, 2.0, 20.0]))
def test_decoder_local_constants_cover_independent_jacobians(seed, kv, kind, n, spread):
    """Causal RoPE attention with 1, 2 or 4 key/value groups behind an RMSNorm, with its residual, and the
    whole pre-norm layer with its SwiGLU block; inputs of spread 20 make the RMSNorm's scales differ."""
    rng = np.random.default_rng(seed)
    cfg = {**CONFIGS["llama"], "kv": kv}
    weights = random_weights(rng, cfg, layers=1)
    model = lipbound_model(weights, cfg)
    X = rng.standard_normal((n, D)) * spread
    head = int(rng.integers(cfg["heads"]))
    curve = lipschitz_curve(model, X, kind=kind, layer=0, head=head if kind == "head" else None, eps=EPS,
                            ascent_steps=2, seed=seed)
    f = _reference(kind, weights["layers"][0], cfg, head)
    np.testing.assert_allclose(_spectral(central_jacobian(f, X)), curve.jacobian_norm, rtol=1e-5, atol=1e-7)
    for point, eps in zip(curve.points, EPS, strict=True):
        assert point.verdict == "holds" and point.witness <= point.certified
        for _ in range(4 if eps else 1):
            E = rng.standard_normal(X.shape)
            Y = X + eps * rng.random() ** (1 / X.size) * E / np.linalg.norm(E)
            assert _spectral(central_jacobian(f, Y)) <= point.certified * (1 + 1e-6) + 1e-6, (kind, eps)
    certified = [p.certified for p in curve.points]
    assert np.all(np.diff(certified) >= 0)


@SMOLLM_GROUP
@pytest.mark.parametrize("layer, prompt", [
    (15, "The capital"),
    # five tokens: the enclosed Jacobian is (5 d)^2 = 2880^2, about a minute of CPU per layer (8 s on two)
    pytest.param(0, "The capital of France is", marks=pytest.mark.slow),
    pytest.param(15, "The capital of France is", marks=pytest.mark.slow)])
def test_smollm2_sublayer_constants_hold_around_a_real_prompt(smollm2, layer, prompt):
    """The attention sub-layer ``x + W_O MHA(RMSNorm(x))`` of SmolLM2 around a real prompt (layer 15 on two
    tokens in the default profile, layers 0 and 15 on five in the slow one): at eps = 0 the certified value is
    the Jacobian's norm (witnessed), and on U(X, 1e-4 R) no difference quotient of the float engine beats it."""
    from lipbound.local.chains import chain_for
    text = smollm2
    ids = text.encode(prompt)
    assert len(ids) == len(prompt.split())
    assert text.tokenizer.tokens(ids)[:2] == ["The", "Ġcapital"]
    X = text.hidden_states(ids)[layer]
    radius = text.layernorm_feeding(layer).radius_about_center
    eps = (0.0, 1e-4 * radius)
    curve = lipschitz_curve(text.model, X, kind="layer", layer=layer, eps=eps, ascent_steps=2)
    at_x, small = curve.points
    assert at_x.verdict == small.verdict == "holds"
    np.testing.assert_allclose(at_x.witness, at_x.certified, rtol=1e-6)
    assert small.witness <= small.certified <= 1.5 * small.witness
    (component,) = chain_for(text.model, "layer", layer)
    rng = np.random.default_rng(layer)
    for _ in range(3):
        E = rng.standard_normal(X.shape)
        Y = X + eps[1] * rng.random() * E / np.linalg.norm(E)
        Z = Y + 1e-3 * eps[1] * rng.standard_normal(X.shape)
        quotient = np.linalg.norm(component.forward(Z[None])[0] - component.forward(Y[None])[0]) / np.linalg.norm(Z - Y)
        assert quotient <= small.certified


@SMOLLM_GROUP
def test_smollm2_replacements_are_certified_per_layer(smollm2):
    """perturb on a decoder: one replacement at token 3, the row of layer 1 (its input already moved by layer 0),
    whose measured W1 between the sub-layer outputs (recomputed here) lies below the certified token-ball
    movement; insertions are refused."""
    from lipbound.errors import AssumptionError
    from lipbound.local.chains import chain_for
    from lipbound.measures.empirical import EmpiricalMeasure
    from lipbound.measures.perturb import perturb
    from lipbound.measures.wasserstein import w1
    text = smollm2
    report = perturb("The capital of France is", positions=[3], layers=(1,), model=text, vocabulary=16, search=4)
    assert report.violations == 0 and [row.layer for row in report.rows] == [1]
    edit = report.edits[1]
    before, after = text.hidden_states(text.encode("The capital of France is")), text.hidden_states(list(edit.ids))
    for row in report.rows:
        (component,) = chain_for(text.model, "layer", row.layer)
        measured = w1(EmpiricalMeasure.uniform(component.forward(before[row.layer][None])[0]),
                      EmpiricalMeasure.uniform(component.forward(after[row.layer][None])[0]))
        np.testing.assert_allclose(row.measured, measured, rtol=1e-9)
        assert 0 < row.measured <= row.predicted_path and row.measured <= row.worst_witness
        assert np.isnan(row.predicted_set) and row.global_ == np.inf
    with pytest.raises(AssumptionError, match="replace for a decoder"):
        perturb("The capital of France is", mode="insert", k=1, layers=(0,), model=text)
