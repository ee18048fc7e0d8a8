"""The pre-norm whole-model tasks split into an eps-free core and an eps-dependent rest: on a generated
Llama decoder (RMSNorm, rotary heads with grouped keys, SwiGLU), the split task gives the numbers of the
unsplit routes, the core does not move with eps, and a norm-eps edit reruns only the cheap rest with
the numbers of a full rerun."""

from __future__ import annotations

import json

import numpy as np
import pytest
from decoder_checkpoints import config_of, random_weights, write_huggingface

from lipbound.advise.diagnosis import certify_whole
from lipbound.advise.interventions import NormEpsilon
from lipbound.numeric.blocks.certify import best
from lipbound.numeric.blocks.constants import pre_norm_gated_constants, residual_constant
from lipbound.numeric.blocks.gated import gated_constants
from lipbound.numeric.blocks.norms import norm_constant
from lipbound.numeric.certify import layer_bounds
from lipbound.numeric.domains import DomainSpec
from lipbound.numeric.model import load_weights, save_plain

OPTIONS = {"n": 3, "restarts": 2, "iterations": 4, "effort": 3}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """A generated one-layer Llama decoder; its whole-model certificate; that of its copy with every
    RMSNorm's eps raised to 1e-2, reusing the cores of the first, and computed in full."""
    root = tmp_path_factory.mktemp("split")
    config = {**config_of("llama"), "num_hidden_layers": 1}
    model = load_weights(str(write_huggingface(root / "llama", config, random_weights(config, seed=3))))
    raised = load_weights(str(save_plain(NormEpsilon(eps=1e-2).apply(model), root / "raised.npz")))
    original = certify_whole(model, **OPTIONS)
    return model, original, certify_whole(raised, reuse=original, **OPTIONS), certify_whole(raised, **OPTIONS)


def _result(certificate, kind: str) -> dict:
    return next(r for key, r in certificate.results.items() if key[0] == kind and key[2] == 0)


def test_split_tasks_give_the_unsplit_routes_numbers(certificates):
    """The residual rows of a pre-norm layer are the rule on the norm's constant and the branch's bound on
    the norm's image, and the folded rule on eps^(-1/2) and the folded lifted SDP, exactly as the routes
    compute them in one call."""
    model, original, _, _ = certificates
    layer = model.layers[0]
    attention = _result(original, "attention")
    bounds = layer_bounds(layer, DomainSpec.parse("layernorm").resolve(layer.ln_in), OPTIONS["n"])
    assert [u["value"] for u in attention["upper"]] == [float(b.value) for b in bounds]
    rule = residual_constant("pre", norm_constant(layer.ln_in), best(bounds))
    assert attention["residual_upper"][0]["value"] == float(rule.value)
    ffn = _result(original, "ffn")
    evaluations = max(8, OPTIONS["effort"] // 2)
    inner = gated_constants(layer.ffn, layer.ffn_norm, effort=evaluations)
    whole = pre_norm_gated_constants(layer.ffn_norm, layer.ffn, effort=evaluations, inner=inner["best"])
    assert {u["name"]: u["value"] for u in ffn["residual_upper"]} == \
        {v.name: float(v.value) for k, v in whole.items() if k != "best"}
    assert len(ffn["residual_upper"]) == 2   # the composed and the folded rule, both certified here
    for result in (attention, ffn):
        best_upper = min(u["value"] for u in result["residual_upper"] if u["certified"])
        assert result["residual_witness"] <= best_upper and result["witness"] <= min(
            u["value"] for u in result["upper"] if u["certified"])


def _numbers(core: dict) -> str:
    """The core's numbers (its certified values without their details, which hold solver timings)."""
    values = core.get("bounds") or list(core["values"].values()) + [core["folded"]]
    plain = {key: value for key, value in core.items() if key not in ("bounds", "values", "folded")}
    return json.dumps([plain, [(v["name"], v["value"], v["certified"]) for v in values]], sort_keys=True)


def test_the_core_does_not_move_with_eps(certificates):
    _, original, _, full = certificates
    for kind in ("attention", "ffn"):
        before, after = _result(original, kind), _result(full, kind)
        assert _numbers(before["core"]) == _numbers(after["core"]), kind
        # ... while the rule that reads eps does: a larger eps, a smaller constant of the norm
        assert max(u["value"] for u in after["residual_upper"]) < max(u["value"] for u in before["residual_upper"])


def test_norm_eps_edit_reuses_every_core_with_the_numbers_of_a_full_rerun(certificates):
    _, original, reused, full = certificates
    assert reused.cores_reused == 2 and full.cores_reused == 0 and reused.rerun == full.rerun
    assert json.dumps(reused.report.components, sort_keys=True, default=str) == \
        json.dumps(full.report.components, sort_keys=True, default=str)
    assert reused.bound["log10_value"] == full.bound["log10_value"] < original.bound["log10_value"]
    for certificate in (original, reused):
        assert certificate.bound["certified"] and certificate.bound["witness"] <= certificate.bound["value"]
    np.testing.assert_array_less(0.0, [r["best_upper"] for r in reused.report.components])
