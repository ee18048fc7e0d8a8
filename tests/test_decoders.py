"""Llama-, Qwen3- and Gemma-shaped decoders through the one float engine, against the independent
forward pass of tests/decoder_reference.py (written from the published architectures: Touvron et al.
2023; Qwen3; Gemma 2).

The arrays of a tiny decoder are handed to the reference under Hugging Face names, whole weight
matrices the way the modelling code uses them (projections of all heads at once, ``rotate_half``,
``repeat_kv``, a causal -- and for Gemma sliding-window -- mask, soft-capped logits, SwiGLU / GeGLU,
RMSNorm with gain ``w`` or ``1 + w``, the sandwich norms); lipbound's model is built from the same
arrays with its own classes.  The chain's JVP and VJP are checked against finite differences and
each other for every placement, and the plain format round-trips every fact.
"""

from __future__ import annotations

import math

import decoder_reference as reference
import numpy as np
import pytest

from lipbound.errors import WeightsError
from lipbound.numeric.kernels import AttentionMask, QKNorm, Rotary
from lipbound.numeric.model import (
    GatedFeedForward,
    Head,
    Layer,
    LayerNorm,
    Model,
    RMSNorm,
    TokenEmbeddings,
    TransformerLayer,
    attention_arrays,
    attention_from_arrays,
    load_weights,
    save_plain,
)
from lipbound.numeric.model.components import FeedForward
from lipbound.numeric.whole.chain import chain_forward, hidden_states, layer_steps, logits

D, H, KV, DK, FF, VOCAB = 8, 4, 2, 4, 12, 11


# The reference (tests/decoder_reference.py) on these arrays, under Hugging Face names --------------
def reference_config(cfg, layers=1) -> dict:
    """The config.json of a tiny decoder of the family ``cfg`` describes (Gemma: every layer sliding)."""
    config = {"model_type": "gemma2" if cfg.get("gemma") else "qwen3" if cfg.get("qk_norm") else "llama",
              "hidden_size": D, "num_attention_heads": cfg["heads"], "num_key_value_heads": cfg["kv"],
              "head_dim": DK, "num_hidden_layers": layers, "rms_norm_eps": cfg["eps"], "rope_theta": cfg["base"],
              "tie_word_embeddings": True}
    if cfg.get("gemma"):
        config.update(query_pre_attn_scalar=cfg["scaling"] ** -2, attn_logit_softcapping=cfg["softcap"],
                      sliding_window=cfg["window"], layer_types=["sliding_attention"] * layers,
                      final_logit_softcapping=cfg["final_softcap"])
    return config


def reference_tensors(index, w, cfg) -> dict:
    """Layer ``index`` of the arrays as ``nn.Linear`` weights (out, in) and norm gains."""
    p = f"model.layers.{index}."
    raw = {p + f"self_attn.{name}_proj.weight": w[name].T for name in ("q", "k", "v", "o")}
    raw.update({p + f"mlp.{name}_proj.weight": w[name].T for name in ("gate", "up", "down")})
    norms = {"in_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
             "ffn_norm": "pre_feedforward_layernorm", "post_ffn_norm": "post_feedforward_layernorm"} \
        if cfg.get("gemma") else {"in_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    raw.update({p + f"{name}.weight": w[ours] for ours, name in norms.items()})
    if cfg.get("qk_norm"):
        raw[p + "self_attn.q_norm.weight"], raw[p + "self_attn.k_norm.weight"] = w["q_norm"], w["k_norm"]
    return raw


def attention_reference(h, w, cfg):
    """The attention of one layer of the arrays, after its output projection ``w["o"]``."""
    return reference.attention_block(reference_config(cfg), reference_tensors(0, w, cfg), 0, h)


def layer_reference(x, w, cfg):
    return reference.layer(reference_config(cfg), reference_tensors(0, w, cfg), 0, x)


def model_reference(ids, weights, cfg):
    raw = {"model.embed_tokens.weight": weights["embed"], "model.norm.weight": weights["final"]}
    for index, w in enumerate(weights["layers"]):
        raw.update(reference_tensors(index, w, cfg))
    return reference.forward(reference_config(cfg, len(weights["layers"])), raw, ids)[1]


# lipbound's model from the same arrays ----------------------------------------------------------------
CONFIGS = {
    "llama": {"heads": H, "kv": KV, "base": 10000.0, "eps": 1e-5},
    "qwen3": {"heads": H, "kv": KV, "base": 1e6, "eps": 1e-6, "qk_norm": True},
    "gemma": {"heads": H, "kv": 1, "base": 10000.0, "eps": 1e-6, "gemma": True, "softcap": 2.0, "window": 3,
              "scaling": 0.3, "final_softcap": 4.0},
}


def random_weights(rng, cfg, layers=2):
    def layer():
        w = {"q": rng.standard_normal((D, cfg["heads"] * DK)) * 0.6,
             "k": rng.standard_normal((D, cfg["kv"] * DK)) * 0.6,
             "v": rng.standard_normal((D, cfg["kv"] * DK)) * 0.6,
             "o": rng.standard_normal((cfg["heads"] * DK, D)) * 0.3,
             "gate": rng.standard_normal((D, FF)) * 0.4, "up": rng.standard_normal((D, FF)) * 0.4,
             "down": rng.standard_normal((FF, D)) * 0.3}
        for name in ("in_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm"):
            w[name] = rng.uniform(0.5, 1.5, D) - (1.0 if cfg.get("gemma") else 0.0)
        w["q_norm"], w["k_norm"] = rng.uniform(0.5, 1.5, DK), rng.uniform(0.5, 1.5, DK)
        return w
    return {"embed": rng.standard_normal((VOCAB, D)), "layers": [layer() for _ in range(layers)],
            "final": rng.uniform(0.5, 1.5, D) - (1.0 if cfg.get("gemma") else 0.0)}


def lipbound_layer(index, w, cfg) -> TransformerLayer:
    gemma, eps = cfg.get("gemma", False), cfg["eps"]
    norm = lambda weight: RMSNorm(1 + weight if gemma else weight, eps)  # noqa: E731  (the loader's 1 + w)
    rotary = Rotary(base=cfg["base"], scale=cfg.get("scaling"))
    kernel = QKNorm(w["q_norm"], w["k_norm"], eps, rotary=Rotary(base=cfg["base"])) if cfg.get("qk_norm") else rotary
    mask = AttentionMask(causal=True, window=cfg.get("window"), softcap=cfg.get("softcap"))
    r = cfg["heads"] // cfg["kv"]
    heads = tuple(Head(w["q"][:, h * DK:(h + 1) * DK], w["k"][:, (h // r) * DK:(h // r + 1) * DK],
                       w["v"][:, (h // r) * DK:(h // r + 1) * DK], kernel=kernel, mask=mask,
                       name=f"layer{index}.head{h}")
                  for h in range(cfg["heads"]))
    attention = Layer(heads, w["o"], groups=tuple(h // r for h in range(cfg["heads"])))
    ffn = GatedFeedForward(w["gate"], w["up"], w["down"], "gelu_pytorch_tanh" if gemma else "silu")
    if gemma:
        return TransformerLayer(index, attention, ln_in=norm(w["in_norm"]), ln_out=norm(w["post_attn_norm"]), ffn=ffn,
                                ffn_norm=norm(w["ffn_norm"]), ffn_out_norm=norm(w["post_ffn_norm"]),
                                placement="sandwich")
    return TransformerLayer(index, attention, ln_in=norm(w["in_norm"]), ffn=ffn, ffn_norm=norm(w["ffn_norm"]),
                            placement="pre")


def lipbound_model(weights, cfg) -> Model:
    gemma = cfg.get("gemma", False)
    layers = {i: lipbound_layer(i, w, cfg) for i, w in enumerate(weights["layers"])}
    embeddings = TokenEmbeddings(weights["embed"], math.sqrt(D) if gemma else 1.0)
    final = RMSNorm(1 + weights["final"] if gemma else weights["final"], cfg["eps"])
    return Model("tiny", layers, cfg["heads"], D, final_norm=final, decoder_only=True, embeddings=embeddings,
                 lm_head=embeddings.word, max_positions=16, metadata={"tied_embeddings": True}, layout="plain",
                 logit_softcap=cfg.get("final_softcap"))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decoder_layers_and_logits_match_the_reference(name):
    cfg = CONFIGS[name]
    rng = np.random.default_rng(list(CONFIGS).index(name))
    weights = random_weights(rng, cfg)
    model = lipbound_model(weights, cfg)
    x = rng.standard_normal((6, D))
    out, _ = chain_forward(layer_steps(model.layers[0], "decoder"), x[None])
    np.testing.assert_allclose(out[0], layer_reference(x, weights["layers"][0], cfg), rtol=1e-11, atol=1e-11)
    ids = np.array([3, 1, 4, 1, 5, 9, 2])
    np.testing.assert_allclose(logits(model, ids), model_reference(ids, weights, cfg), rtol=1e-10, atol=1e-10)
    states = hidden_states(model, ids)
    assert len(states) == 3 and states[0].shape == (7, D)
    with pytest.raises(WeightsError, match="at most 16 tokens"):
        hidden_states(model, np.arange(17) % VOCAB)


def _chain_derivatives(steps, X, rng):
    _, linear = chain_forward(steps, X)
    E, h = rng.standard_normal(X.shape), 1e-6
    dF = E
    for lin in linear:
        dF = lin.jvp(dF)
    plus, minus = chain_forward(steps, X + h * E)[0], chain_forward(steps, X - h * E)[0]
    np.testing.assert_allclose(dF, (plus - minus) / (2 * h), rtol=2e-5, atol=1e-6)
    G = rng.standard_normal(dF.shape)
    back = G
    for lin in reversed(linear):
        back = lin.vjp(back)[0]
    np.testing.assert_allclose(np.sum(dF * G), np.sum(E * back), rtol=1e-10)


def _layer_scaled(rng, placement):
    """A layer of the placement with LayerScale, a LayerNorm and an RMSNorm, and a plain or gated block."""
    heads = tuple(Head(rng.standard_normal((D, DK)), rng.standard_normal((D, DK)), rng.standard_normal((D, DK)),
                       mask=AttentionMask(causal=placement != "post")) for _ in range(2))
    attention = Layer(heads, rng.standard_normal((2 * DK, D)) * 0.4)
    ln = LayerNorm(rng.uniform(0.5, 1.5, D), 0.2 * rng.standard_normal(D), 1e-5)
    rms_norm = RMSNorm(rng.uniform(0.5, 1.5, D), 1e-6)
    ffn = (FeedForward(rng.standard_normal((D, FF)), rng.standard_normal(FF), rng.standard_normal((FF, D)),
                       rng.standard_normal(D), "gelu") if placement == "post"
           else GatedFeedForward(rng.standard_normal((D, FF)), rng.standard_normal((D, FF)),
                                 rng.standard_normal((FF, D))))
    scales = {"attn_scale": rng.uniform(0.1, 1, D), "ffn_scale": rng.uniform(0.1, 1, D)}
    if placement == "post":
        return TransformerLayer(0, attention, ln_out=ln, ffn=ffn, ffn_norm=rms_norm, placement="post", **scales)
    if placement == "pre":
        return TransformerLayer(0, attention, ln_in=rms_norm, ffn=ffn, ffn_norm=ln, placement="pre", **scales)
    return TransformerLayer(0, attention, ln_in=ln, ln_out=rms_norm, ffn=ffn, ffn_norm=rms_norm, ffn_out_norm=ln,
                            placement="sandwich", **scales)


@pytest.mark.parametrize("placement", ["post", "pre", "sandwich"])
def test_every_placement_with_layerscale_differentiates_exactly(placement):
    rng = np.random.default_rng(11)
    layer = _layer_scaled(rng, placement)
    X = rng.standard_normal((2, 5, D))
    _chain_derivatives(layer_steps(layer, "decoder"), X, rng)
    # the placement's equations, by hand
    attention = lambda Z: Layer(layer.heads, layer.W_O)  # noqa: E731
    from lipbound.numeric.attention import self_forward
    a, f = layer.attn_scale, layer.ffn_scale
    x = X[0]
    if placement == "post":
        y = layer.ln_out(x + a * self_forward(attention(x), x)[0])
        expected = layer.ffn_norm(y + f * layer.ffn(y))
    elif placement == "pre":
        z = x + a * self_forward(attention(x), layer.ln_in(x))[0]
        expected = z + f * layer.ffn(layer.ffn_norm(z))
    else:
        z = x + a * layer.ln_out(self_forward(attention(x), layer.ln_in(x))[0])
        expected = z + f * layer.ffn_out_norm(layer.ffn(layer.ffn_norm(z)))
    np.testing.assert_allclose(chain_forward(layer_steps(layer, "decoder"), X)[0][0], expected, rtol=1e-12, atol=1e-12)


def test_decoder_chains_differentiate_exactly():
    for name, cfg in CONFIGS.items():
        rng = np.random.default_rng(20 + len(name))
        model = lipbound_model(random_weights(rng, cfg, layers=1), cfg)
        _chain_derivatives(layer_steps(model.layers[0], "decoder"), rng.standard_normal((2, 5, D)), rng)


def test_the_plain_format_keeps_every_fact(tmp_path):
    rng = np.random.default_rng(30)
    for name, cfg in CONFIGS.items():
        model = lipbound_model(random_weights(rng, cfg), cfg)
        loaded = load_weights(save_plain(model, tmp_path / f"{name}.npz"))
        for index, layer in model.layers.items():
            other = loaded.layers[index]
            assert other.placement == layer.placement and other.attention.groups == layer.attention.groups
            assert [h.kernel for h in other.heads] == [h.kernel for h in layer.heads]
            assert [h.mask for h in other.heads] == [h.mask for h in layer.heads]
            for slot in ("ln_in", "ln_out", "ffn_norm", "ffn_out_norm"):
                mine, theirs = getattr(layer, slot), getattr(other, slot)
                assert (mine is None) == (theirs is None) and (mine is None or mine.kind == theirs.kind)
            assert isinstance(other.ffn, GatedFeedForward) and other.ffn.act == layer.ffn.act
        assert isinstance(loaded.embeddings, TokenEmbeddings) and loaded.metadata["tied_embeddings"]
        assert loaded.max_positions == 16 and loaded.lm_head is loaded.embeddings.word
        assert loaded.logit_softcap == model.logit_softcap
        ids = np.array([1, 2, 3, 4])
        np.testing.assert_array_equal(logits(loaded, ids), logits(model, ids))
        travelled = attention_from_arrays(attention_arrays(model.layers[0].attention))   # a job's plain arrays
        assert travelled.groups == model.layers[0].attention.groups
        assert [h.kernel for h in travelled.heads] == [h.kernel for h in model.layers[0].heads]
        assert [h.mask for h in travelled.heads] == [h.mask for h in model.layers[0].heads]
    layer = _layer_scaled(rng, "sandwich")
    model = Model("scaled", {0: layer}, 2, D, layout="plain")
    other = load_weights(save_plain(model, tmp_path / "scaled.npz")).layers[0]
    np.testing.assert_array_equal(other.attn_scale, layer.attn_scale)
    np.testing.assert_array_equal(other.ffn_scale, layer.ffn_scale)
    assert other.ln_in.kind == "layernorm" and other.ln_out.kind == "rmsnorm"


def test_layers_refuse_what_their_placement_does_not_have():
    rng = np.random.default_rng(40)
    layer = _layer_scaled(rng, "pre")
    with pytest.raises(WeightsError, match="placement"):
        TransformerLayer(0, layer.attention, placement="parallel")
    with pytest.raises(WeightsError, match="ffn_out_norm"):
        TransformerLayer(0, layer.attention, ffn_out_norm=layer.ffn_norm, placement="pre")
    with pytest.raises(WeightsError, match="attn_scale"):
        TransformerLayer(0, layer.attention, attn_scale=np.ones(3))
    with pytest.raises(WeightsError, match="sandwich layer"):
        layer_steps(TransformerLayer(0, layer.attention, ln_in=layer.ln_in, ffn=layer.ffn, ffn_norm=layer.ffn_norm,
                                     placement="sandwich"), "decoder")
