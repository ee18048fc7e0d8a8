"""The model description: heads, attention layers, norms, feed-forward blocks, whole models,
and the loaders that build them from checkpoints.

* :mod:`.components` -- :class:`Head` (with its attention kernel and mask), :class:`Layer`
  (multi-head attention, grouped-query groups), :class:`FeedForward`, :class:`GatedFeedForward`,
  and the norms :class:`LayerNorm`, :class:`RMSNorm` (:mod:`lipbound.numeric.normalization`);
* :mod:`.transformer` -- :class:`TransformerLayer` (a layer with its norms and their placement),
  :class:`Embeddings`, :class:`TokenEmbeddings`, :class:`Model` (layers with provenance: path and sha256);
* :mod:`.files` -- reading safetensors and ``.npz`` by their bytes, never unpickling;
* :mod:`.layouts` -- the checkpoint layouts declared as data: BERT/RoBERTa, DistilBERT, ViT, GPT-2
  (read by :mod:`.huggingface`) and the rotary decoders Llama, Mistral, Qwen2, Qwen3, Gemma 2,
  Gemma 3 and llama.cpp's GGUF ``llama`` (read by :mod:`.decoders`; GGUF files by :mod:`.gguf`);
  :mod:`.ctranslate2` -- Whisper as CTranslate2 ships it; :mod:`.plain` -- the plain format;
* :mod:`.tokenizer` -- the one :class:`Tokenizer` interface (``tokenizer.json``, ``vocab.txt``,
  a GGUF file's BPE), found for a checkpoint by :func:`load_tokenizer`.

:func:`load_weights` reads any of them; :func:`load_default` the embedded default (layers 0
and 5 of sentence-transformers/all-MiniLM-L6-v2, attention and LayerNorms; Apache-2.0, see
``data/NOTICE``).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import WeightsError
from .components import FeedForward, GatedFeedForward, Head, Layer, LayerNorm, Normalization, RMSNorm
from .ctranslate2 import load_whisper
from .decoders import load_decoder
from .files import TensorSource, open_checkpoint, sniff_format
from .gguf import GGUFSource, gguf_config
from .huggingface import layout_of, load_huggingface
from .layouts import supported_layouts
from .plain import PLAIN_FORMAT, attention_arrays, attention_from_arrays, load_plain, save_plain
from .tokenizer import Tokenizer, load_tokenizer
from .transformer import BLOCKS, PLACEMENTS, Embeddings, Model, TokenEmbeddings, TransformerLayer

__all__ = ["Head", "Layer", "LayerNorm", "RMSNorm", "Normalization", "FeedForward", "GatedFeedForward",
           "TransformerLayer", "Embeddings", "TokenEmbeddings", "Model", "BLOCKS", "PLACEMENTS",
           "load_weights", "load_default", "save_plain", "PLAIN_FORMAT", "DEFAULT_WEIGHTS", "DEFAULT_LAYERS",
           "attention_arrays", "attention_from_arrays", "Tokenizer", "load_tokenizer"]

DATA = Path(__file__).resolve().parent.parent / "data"
DEFAULT_WEIGHTS = DATA / "minilm-l6-attention.safetensors"
DEFAULT_LAYERS = (0, 5)


def load_weights(path, num_heads: int | None = None, layers=None) -> Model:
    """Load a checkpoint: a ``.safetensors`` file or Hugging Face model directory (BERT/RoBERTa,
    DistilBERT, ViT, GPT-2; the decoders Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3), a GGUF
    file (llama.cpp's ``llama``: Llama, Mistral, SmolLM; dequantised, ``metadata["quantisation"]``),
    a CTranslate2 Whisper ``model.bin`` (or its directory), or a plain ``.npz``.

    Parameters
    ----------
    path : str or pathlib.Path
    num_heads : int, optional
        Heads per layer when no config.json or metadata says (a decoder's configuration always
        says; a different count is refused).
    layers : int or iterable of int, optional
        Layer indices to load (counted from 0; default: all), in every stack that has them.

    Raises
    ------
    WeightsError
        Unreadable or unrecognised files (pickles are refused), unknown layouts (the message
        names the tensors seen and the layouts supported), missing keys, wrong shapes, NaN/Inf.
    """
    source, config = open_checkpoint(path)
    if not isinstance(source, TensorSource):
        if sniff_format(source) != "gguf":  # a CTranslate2 model.bin
            return load_whisper(source, layers, num_heads, config)
        source = GGUFSource(source)
        config = gguf_config(source)
    if source.kind == "npz":
        return load_plain(source, num_heads, layers)
    layout = layout_of(source, config)
    if layout is not None and layout.positions == "rotary":
        model = load_decoder(source, config, layers, layout)
        if num_heads is not None and num_heads != model.num_heads:
            raise WeightsError("--num-heads", f"{model.num_heads} (the model's own configuration) or nothing",
                               str(num_heads), "drop --num-heads")
        return model
    if layout is not None:
        return load_huggingface(source, config, num_heads, layers, layout)
    sample = ", ".join(sorted(source.keys())[:6])
    raise WeightsError(str(source.path), f"tensor names of a supported layout: {supported_layouts()}",
                       f"{len(source.keys())} tensors such as {sample or 'none'}",
                       "write the attention weights in the plain .npz format (docs/formats.md)")


def load_default(layers=None) -> Model:
    """The embedded default: layers 0 and 5 of sentence-transformers/all-MiniLM-L6-v2 (a 6-layer
    BERT, hidden 384, 12 heads of size 32), with the LayerNorms feeding each layer."""
    if not DEFAULT_WEIGHTS.is_file():
        raise WeightsError(str(DEFAULT_WEIGHTS), "the embedded default weights", "no such file",
                           "regenerate them with python scripts/extract_default.py")
    return load_weights(DEFAULT_WEIGHTS, layers=layers)
