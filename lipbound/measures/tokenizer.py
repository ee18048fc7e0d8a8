"""BERT WordPiece tokenization in pure Python, reading a ``vocab.txt``.

It reproduces the Hugging Face BERT tokenizer -- ``BertNormalizer`` + ``BertPreTokenizer``
+ ``WordPiece`` of the ``tokenizers`` library, the spec a model ships as ``tokenizer.json``
and what ``transformers.BertTokenizer`` runs since transformers 5; the algorithm of Devlin
et al. 2019, "BERT", ``tokenization.py`` -- for the usual uncased setting
``do_lower_case=True, strip_accents=None, tokenize_chinese_chars=True``:

1. special tokens (``[CLS]``, ``[SEP]``, ``[PAD]``, ``[UNK]``, ``[MASK]``) written in the
   text are kept whole (exact, case-sensitive match);
2. clean: drop NUL, U+FFFD and control characters (Unicode categories Cc, Cf, Co, Cs,
   except tab, newline, carriage return); every whitespace character becomes a space;
3. surround each CJK ideograph with spaces;
4. accents: NFD, then drop non-spacing marks (category Mn) -- on by default when lower-casing;
5. lower-case, character by character;
6. split on whitespace, and isolate every punctuation character (Unicode P* and the
   ASCII non-alphanumeric printable ranges 33-47, 58-64, 91-96, 123-126);
7. WordPiece: greedy longest-match-first with ``##`` continuations; a word longer
   than 100 characters, or one with an unmatched piece, becomes ``[UNK]``;
8. ``[CLS] ... [SEP]`` around the sequence (:meth:`WordPieceTokenizer.encode`).

Where the older pure-Python tokenizer (``BertTokenizer`` before transformers 5, now
``BertTokenizerLegacy``) differs, this module follows ``tokenizer.json``: lower-casing is
per character (Python's ``str.lower`` turns a word-final capital sigma into ``ς``),
unassigned code points (Cn) are kept rather than dropped, and CJK Extension E is isolated
from U+2B920 (the legacy code says U+2B820).  Character classes come from Python's
``unicodedata`` (Unicode 14 on Python 3.11); ``tokenizers`` uses older tables, so
characters assigned or re-classified in recent Unicode versions (e.g. U+061D, U+2E43..U+2E5D)
may still be tokenized differently.
"""

from __future__ import annotations

import json
import os
import unicodedata
from dataclasses import dataclass, field
from typing import final

from ..errors import WeightsError

__all__ = ["WordPieceTokenizer", "basic_tokenize", "is_punctuation", "is_chinese_char"]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# CJK Unified Ideographs and extensions, CJK compatibility ideographs, as in tokenizers'
# BertNormalizer.  Its Extension E range starts at U+2B920 where the original BERT code
# (and BertTokenizerLegacy) says U+2B820; we follow tokenizer.json, so U+2B820..U+2B91F
# are not isolated.
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def is_chinese_char(char: str) -> bool:
    """Whether ``char`` is a CJK ideograph (BERT's definition, which excludes kana and Hangul)."""
    cp = ord(char)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def is_punctuation(char: str) -> bool:
    """BERT punctuation: Unicode categories P*, or ASCII printable non-alphanumerics
    (``$``, ``+``, ``<``, ``=``, ``>``, ``^``, `````, ``|``, ``~`` are symbols in Unicode but count here)."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_whitespace(char: str) -> bool:
    # Tab, newline and return are controls in Unicode but whitespace here; str.isspace
    # covers the Unicode White_Space characters (Zs, U+2028, U+2029, ...).
    return char in " \t\n\r" or char.isspace()


def _is_control(char: str) -> bool:
    # Cc, Cf, Co, Cs as in tokenizers (its "is_other"); unassigned code points (Cn) are
    # kept, whereas BertTokenizerLegacy drops them too.
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs")


def _clean(text: str) -> str:
    out = []
    for char in text:
        if char == "\x00" or char == "\ufffd" or _is_control(char):
            continue
        out.append(" " if _is_whitespace(char) else char)
    return "".join(out)


def _isolate_cjk(text: str) -> str:
    return "".join(f" {c} " if is_chinese_char(c) else c for c in text)


def _strip_accents(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def _split_punctuation(word: str) -> list[str]:
    pieces: list[str] = []
    current: list[str] = []
    for char in word:
        if is_punctuation(char):
            if current:
                pieces.append("".join(current))
                current = []
            pieces.append(char)
        else:
            current.append(char)
    if current:
        pieces.append("".join(current))
    return pieces


def basic_tokenize(text: str, lowercase: bool = True, strip_accents: bool | None = None,
                   tokenize_chinese_chars: bool = True) -> list[str]:
    """Steps 2-6 of the module docstring: cleaned, normalised words and punctuation marks.

    ``strip_accents=None`` follows ``lowercase`` (as in the original BERT).
    """
    text = _clean(text)
    if tokenize_chinese_chars:
        text = _isolate_cjk(text)
    if lowercase if strip_accents is None else strip_accents:
        text = _strip_accents(text)
    if lowercase:
        # Per character: tokenizers lower-cases code point by code point (no final-sigma rule).
        text = "".join(c.lower() for c in text)
    words: list[str] = []
    for word in text.split(" "):
        if word:
            words.extend(_split_punctuation(word))
    return words


@final
@dataclass(frozen=True)
class WordPieceTokenizer:
    """A BERT WordPiece tokenizer.

    Parameters
    ----------
    vocab : tuple of str
        The vocabulary in id order (line ``i`` of ``vocab.txt`` has id ``i``).
    lowercase, strip_accents, tokenize_chinese_chars : bool
        Normaliser settings (``strip_accents=None`` follows ``lowercase``).
    max_input_chars_per_word : int
        Longer words become ``[UNK]``.
    """

    vocab: tuple[str, ...]
    lowercase: bool = True
    strip_accents: bool | None = None
    tokenize_chinese_chars: bool = True
    max_input_chars_per_word: int = 100
    unk_token: str = "[UNK]"
    cls_token: str = "[CLS]"
    sep_token: str = "[SEP]"
    _ids: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        vocab = tuple(self.vocab)
        object.__setattr__(self, "vocab", vocab)
        ids: dict[str, int] = {}
        for index, token in enumerate(vocab):
            ids.setdefault(token, index)  # a repeated entry keeps its first id
        for name in ("unk_token", "cls_token", "sep_token"):
            token = getattr(self, name)
            if token not in ids:
                raise WeightsError("vocab", f"an entry for {name} {token!r}", "none",
                                   "use the vocab.txt that belongs to the model")
        object.__setattr__(self, "_ids", ids)

    @classmethod
    def from_vocab_file(cls, path, **settings) -> "WordPieceTokenizer":
        """Read ``vocab.txt`` (UTF-8, one token per line, id = line number)."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as handle:
                vocab = handle.read().split("\n")
        except (OSError, UnicodeDecodeError) as error:
            raise WeightsError("vocab_file", "a readable UTF-8 vocab.txt", f"{path!r} ({error})",
                               "pass the vocab.txt of a BERT checkpoint") from error
        if vocab and vocab[-1] == "":
            vocab.pop()  # the newline ending the last line
        return cls(tuple(vocab), **settings)

    @classmethod
    def from_directory(cls, path) -> "WordPieceTokenizer":
        """Read ``vocab.txt`` and, when present, the settings of ``tokenizer_config.json``."""
        path = os.fspath(path)
        settings: dict = {}
        config_path = os.path.join(path, "tokenizer_config.json")
        if os.path.exists(config_path):
            with open(config_path, encoding="utf-8") as handle:
                config = json.load(handle)
            settings = {"lowercase": bool(config.get("do_lower_case", True)),
                        "strip_accents": config.get("strip_accents"),
                        "tokenize_chinese_chars": bool(config.get("tokenize_chinese_chars", True))}
            if not config.get("do_basic_tokenize", True):
                raise WeightsError("tokenizer_config.json", "do_basic_tokenize true", "false",
                                   "only the standard BERT basic tokenizer is implemented")
        return cls.from_vocab_file(os.path.join(path, "vocab.txt"), **settings)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_to_id(self, token: str) -> int:
        """Id of a vocabulary entry (``[UNK]``'s id for anything else)."""
        return self._ids.get(token, self._ids[self.unk_token])

    def _wordpiece(self, word: str) -> list[str]:
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces: list[str] = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self._ids:
                    break
                end -= 1
            else:
                return [self.unk_token]  # some suffix has no match: the whole word is unknown
            pieces.append(piece)
            start = end
        return pieces

    def _special_split(self, text: str) -> list[tuple[str, bool]]:
        """Cut ``text`` at special tokens written in it: ``[(segment, is_special), ...]``."""
        specials = sorted((t for t in SPECIAL_TOKENS if t in self._ids), key=len, reverse=True)
        segments: list[tuple[str, bool]] = []
        start = position = 0
        while position < len(text):
            match = next((t for t in specials if text.startswith(t, position)), None)
            if match is None:
                position += 1
                continue
            segments.append((text[start:position], False))
            segments.append((match, True))
            position = start = position + len(match)
        segments.append((text[start:], False))
        return [s for s in segments if s[0]]

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of ``text``, without ``[CLS]``/``[SEP]``."""
        if not isinstance(text, str):
            raise WeightsError("text", "a str", type(text).__name__, "decode bytes to str first")
        tokens: list[str] = []
        for segment, special in self._special_split(text):
            if special:
                tokens.append(segment)
                continue
            for word in basic_tokenize(segment, self.lowercase, self.strip_accents,
                                       self.tokenize_chinese_chars):
                tokens.extend(self._wordpiece(word))
        return tokens

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``: ``[CLS] tokens [SEP]`` by default."""
        ids = [self.token_to_id(t) for t in self.tokenize(text)]
        if add_special_tokens:
            ids = [self._ids[self.cls_token]] + ids + [self._ids[self.sep_token]]
        return ids

    def decode_tokens(self, ids) -> list[str]:
        """Vocabulary entries of ``ids`` (for display)."""
        out = []
        for i in ids:
            if not 0 <= int(i) < len(self.vocab):
                raise WeightsError("ids", f"ids in [0, {len(self.vocab)})", repr(i), "use ids from encode")
            out.append(self.vocab[int(i)])
        return out
