"""One tokenizer for every model lipbound reads, backed by the ``tokenizers`` package.

Three sources, one interface (:class:`Tokenizer`):

* ``tokenizer.json`` -- the complete specification a Hugging Face checkpoint ships (normaliser,
  pre-tokeniser, model, post-processor, added tokens), read as it is; truncation and padding
  are switched off (one sentence, every token);
* ``vocab.txt`` -- BERT WordPiece (Devlin et al. 2019): ``BertNormalizer`` (clean the text,
  isolate CJK ideographs, strip accents and lower-case as ``tokenizer_config.json`` says),
  ``BertPreTokenizer`` (whitespace and punctuation), greedy longest-match-first WordPiece with
  ``##`` continuations (words over 100 characters become ``[UNK]``), ``[CLS] ... [SEP]``;
* a GGUF file's metadata -- llama.cpp's byte-level BPE (Radford et al. 2019; ``tokenizer.ggml.model
  = gpt2``): the vocabulary ``tokenizer.ggml.tokens`` in id order, the ranked
  ``tokenizer.ggml.merges``, the pre-tokeniser named by ``tokenizer.ggml.pre`` (see
  :data:`GGUF_PRE_TOKENIZERS`), control tokens kept whole, ``bos``/``eos`` added as
  ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say.

Special tokens written in the text (``[MASK]``, ``<|im_start|>``) are kept whole, as the
models' own tokenizers do.  :func:`load_tokenizer` finds the tokenizer of a checkpoint path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import final

from ...errors import WeightsError
from .files import read_config, sniff_format
from .gguf import gguf_fields

__all__ = ["Tokenizer", "load_tokenizer", "GGUF_PRE_TOKENIZERS"]

_INSTALL = "pip install tokenizers (or lipbound[measures])"
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
#: ``tokenizer.ggml.pre`` -> the regular expressions that split the text before BPE, in order
#: (llama.cpp's ``llama-vocab.cpp``; each applies to the pieces of the one before).
GGUF_PRE_TOKENIZERS = {
    "gpt2": (_GPT2_SPLIT,),
    "default": (_GPT2_SPLIT,),
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "llama-bpe": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
}
_BERT_SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "pad": "[PAD]", "mask": "[MASK]"}
_ROLES = ("bos", "eos", "cls", "sep", "unk", "pad", "mask")


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise WeightsError("tokenizers", "the tokenizers package", "not installed", _INSTALL) from None
    return tokenizers


@final
class Tokenizer:
    """A model's tokenizer: text to token ids and back.

    Parameters
    ----------
    backend : tokenizers.Tokenizer
    specials : dict
        Role (``"bos"``, ``"eos"``, ``"cls"``, ``"sep"``, ``"unk"``, ``"pad"``, ``"mask"``) to
        token id, for the roles the model has.
    source : str
        Where it was read from, for messages.
    kind : str
        ``"wordpiece"`` or ``"bpe"`` (the backend's model).
    """

    def __init__(self, backend, specials: dict, source: str, kind: str):
        backend.no_truncation()
        backend.no_padding()
        self._backend, self.source, self.kind = backend, str(source), kind
        self.specials = {role: int(i) for role, i in specials.items() if i is not None}
        size = backend.get_vocab_size(with_added_tokens=True)
        vocab = [""] * size
        for token, index in backend.get_vocab(with_added_tokens=True).items():
            if 0 <= index < size:
                vocab[index] = token
        self.vocab: tuple[str, ...] = tuple(vocab)
        for role, index in self.specials.items():
            if not 0 <= index < size:
                raise WeightsError(f"{self.source}: {role} token", f"an id in [0, {size})", str(index),
                                   "use the tokenizer files that belong to the model")

    # Constructors --------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path, specials: dict | None = None) -> Tokenizer:
        """Read a ``tokenizer.json``; ``specials`` adds or overrides special ids by role."""
        tokenizers = _tokenizers()
        path = os.fspath(path)
        try:
            backend = tokenizers.Tokenizer.from_file(path)
        except Exception as error:  # the package raises its own Exception subclass
            raise WeightsError(path, "a tokenizer.json of the tokenizers package", f"{type(error).__name__}: {error}",
                               "use the tokenizer.json shipped with the model") from None
        kind = json.loads(backend.model.__getstate__()).get("type", "").lower()
        found = {role: backend.token_to_id(token) for role, token in _BERT_SPECIALS.items()}
        found.update(specials or {})
        return cls(backend, found, path, kind)

    @classmethod
    def from_vocab(cls, path, lowercase: bool = True, strip_accents: bool | None = None,
                   tokenize_chinese_chars: bool = True) -> Tokenizer:
        """BERT WordPiece from ``vocab.txt`` (UTF-8, one token per line, id = line number)."""
        tokenizers = _tokenizers()
        from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors

        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().split("\n")
        except (OSError, UnicodeDecodeError) as error:
            raise WeightsError("vocab_file", "a readable UTF-8 vocab.txt", f"{path!r} ({error})",
                               "pass the vocab.txt of a BERT checkpoint") from None
        if lines and lines[-1] == "":
            lines.pop()  # the newline ending the last line
        vocab: dict[str, int] = {}
        for index, token in enumerate(lines):
            vocab.setdefault(token, index)  # a repeated entry keeps its first id
        for role in ("unk", "cls", "sep"):
            if _BERT_SPECIALS[role] not in vocab:
                raise WeightsError("vocab_file", f"an entry for the {role}_token {_BERT_SPECIALS[role]!r}", "none",
                                   "use the vocab.txt that belongs to the model")
        backend = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
        backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
                                                        strip_accents=strip_accents, lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        present = {role: vocab.get(token) for role, token in _BERT_SPECIALS.items()}
        backend.add_special_tokens([AddedToken(_BERT_SPECIALS[role], special=True, normalized=False)
                                    for role, index in present.items() if index is not None])
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", present["cls"]), ("[SEP]", present["sep"])])
        return cls(backend, present, path, "wordpiece")

    @classmethod
    def from_gguf(cls, fields: dict, source) -> Tokenizer:
        """Byte-level BPE from a GGUF file's metadata (``fields``: key -> value)."""
        tokenizers = _tokenizers()
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

        where = str(source)
        model = fields.get("tokenizer.ggml.model")
        if model is None:
            raise WeightsError(f"{where}: tokenizer.ggml.model", "a tokenizer in the GGUF metadata", "none",
                               "use a GGUF file converted with its tokenizer")
        if model != "gpt2":
            raise WeightsError(f"{where}: tokenizer.ggml.model", "'gpt2' (byte-level BPE)", repr(model),
                               "lipbound builds byte-level BPE tokenizers from GGUF metadata only; pass the model's "
                               "tokenizer.json")
        pre = str(fields.get("tokenizer.ggml.pre", "default"))
        if pre not in GGUF_PRE_TOKENIZERS:
            raise WeightsError(f"{where}: tokenizer.ggml.pre", f"one of {', '.join(GGUF_PRE_TOKENIZERS)}", repr(pre),
                               "pass the model's tokenizer.json instead")
        tokens = list(fields.get("tokenizer.ggml.tokens") or [])
        merges = list(fields.get("tokenizer.ggml.merges") or [])
        if not tokens or not merges:
            raise WeightsError(f"{where}: tokenizer.ggml.tokens/merges", "a vocabulary and its merges",
                               f"{len(tokens)} tokens and {len(merges)} merges", "re-convert the model with llama.cpp")
        vocab = {token: index for index, token in enumerate(tokens)}
        pairs = [tuple(merge.split(" ", 1)) for merge in merges]
        backend = tokenizers.Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
        splits = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in GGUF_PRE_TOKENIZERS[pre]]
        backend.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                           use_regex=False)])
        backend.decoder = decoders.ByteLevel()
        types = list(fields.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        # control tokens (type 3) are special, user-defined ones (4) kept whole but not special
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, kind in zip(tokens, types) if kind == 3])
        backend.add_tokens([AddedToken(t, normalized=False) for t, kind in zip(tokens, types) if kind == 4])
        ids = {role: fields.get(f"tokenizer.ggml.{key}_token_id") for role, key in
               (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"), ("sep", "seperator"),
                ("cls", "cls"), ("mask", "mask"))}
        ids = {role: None if value is None else int(value) for role, value in ids.items()}
        single = [role for role in ("bos",) if fields.get("tokenizer.ggml.add_bos_token") and ids["bos"] is not None]
        single += ["$A"] + [role for role in ("eos",) if fields.get("tokenizer.ggml.add_eos_token")
                            and ids["eos"] is not None]
        if len(single) > 1:
            template = " ".join(tokens[ids[part]] if part != "$A" else part for part in single)
            backend.post_processor = processors.TemplateProcessing(
                single=template, special_tokens=[(tokens[ids[r]], ids[r]) for r in single if r != "$A"])
        return cls(backend, ids, where, "bpe")

    # The interface -------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (with the model's special tokens around it unless told not to:
        ``[CLS] ... [SEP]`` for BERT, ``bos`` where the model adds it)."""
        if not isinstance(text, str):
            raise WeightsError("text", "a str", type(text).__name__, "decode bytes to str first")
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def _checked(self, ids) -> list[int]:
        out = []
        for i in ids:
            if isinstance(i, bool) or not 0 <= int(i) < self.vocab_size:
                raise WeightsError("ids", f"ids in [0, {self.vocab_size})", repr(i), "use ids from encode")
            out.append(int(i))
        return out

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (special tokens kept unless ``skip_special_tokens``)."""
        return self._backend.decode(self._checked(ids), skip_special_tokens=skip_special_tokens)

    def to_json(self) -> str:
        """The complete specification as a ``tokenizer.json`` (what :meth:`from_file` reads back)."""
        return self._backend.to_str()

    def tokens(self, ids) -> list[str]:
        """The vocabulary entries of ``ids`` (for display)."""
        return [self.vocab[i] for i in self._checked(ids)]

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry, None if it has none."""
        return self._backend.token_to_id(token)

    def special_id(self, role: str) -> int | None:
        """The id of a special token by role (``"bos"``, ``"eos"``, ``"cls"``, ``"sep"``, ``"unk"``,
        ``"pad"``, ``"mask"``), None if the model has none."""
        if role not in _ROLES:
            raise WeightsError("role", f"one of {', '.join(_ROLES)}", repr(role), "name a special token's role")
        return self.specials.get(role)

    @property
    def bos_id(self) -> int | None:
        return self.specials.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self.specials.get("eos")

    @property
    def cls_id(self) -> int | None:
        return self.specials.get("cls")

    @property
    def sep_id(self) -> int | None:
        return self.specials.get("sep")

    @property
    def unk_id(self) -> int | None:
        return self.specials.get("unk")

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, {self.vocab_size} tokens, from {self.source})"


def _named_specials(directory: Path, tokens_to_ids) -> dict:
    """Special ids by role from ``tokenizer_config.json`` (token strings) and config.json (ids)."""
    settings = read_config(directory / "tokenizer_config.json")
    config = read_config(directory / "config.json")
    found = {}
    for role in _ROLES:
        token = settings.get(f"{role}_token")
        token = token.get("content") if isinstance(token, dict) else token
        index = tokens_to_ids(token) if isinstance(token, str) else None
        stated = config.get(f"{role}_token_id")
        if index is None and isinstance(stated, int) and not isinstance(stated, bool):
            index = stated
        if index is not None:
            found[role] = index
    return found


def _from_directory(directory: Path) -> Tokenizer:
    if (directory / "tokenizer.json").is_file():
        backend = Tokenizer.from_file(directory / "tokenizer.json")
        return Tokenizer.from_file(directory / "tokenizer.json", _named_specials(directory, backend.token_to_id))
    if (directory / "vocab.txt").is_file():
        settings = read_config(directory / "tokenizer_config.json")
        if settings.get("do_basic_tokenize", True) is False:
            raise WeightsError(str(directory / "tokenizer_config.json"), "do_basic_tokenize true", "false",
                               "only the standard BERT basic tokenizer is implemented")
        lowercase = bool(settings.get("do_lower_case", True))
        return Tokenizer.from_vocab(directory / "vocab.txt", lowercase=lowercase,
                                    strip_accents=settings.get("strip_accents"),
                                    tokenize_chinese_chars=bool(settings.get("tokenize_chinese_chars", True)))
    raise WeightsError(str(directory), "a tokenizer beside the weights (tokenizer.json or vocab.txt)", "none",
                       "copy the model's tokenizer.json into the directory")


def load_tokenizer(path) -> Tokenizer:
    """The tokenizer of a checkpoint: a GGUF file's own (from its metadata), or ``tokenizer.json``
    (else BERT's ``vocab.txt``) in a model directory or beside a weights file.

    Raises
    ------
    WeightsError
        No tokenizer found, or one of a kind lipbound cannot build (the message names it).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise WeightsError("path", "a file or directory path", type(path).__name__, "pass the checkpoint's path")
    path = Path(path)
    if not path.exists():
        raise WeightsError(str(path), "an existing file or directory", "no such path", "check the path")
    if path.is_file() and sniff_format(path) == "gguf":
        return Tokenizer.from_gguf(gguf_fields(path), path)
    return _from_directory(path if path.is_dir() else path.parent)
