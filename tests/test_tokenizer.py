"""BERT WordPiece through the one tokenizer interface, against the model's own tokenizer.json.

Three references:

* lipbound/measures/data/tokenizer_reference.json: tokens and ids for 32 texts (accents,
  punctuation, digits, unknown and over-long words, emoji, CJK, kana, Hangul, Greek, control
  and zero-width characters, special tokens), produced ONCE by
  ``scripts/make_reference_outputs.py`` with ``tokenizers.Tokenizer.from_file(tokenizer.json)``
  (tokenizers 0.23.3; padding and truncation off); always checked.
* the settings and vocabulary written in tokenizer.json itself; always checked.
* the two sources of one :class:`Tokenizer`: ``tokenizer.json`` as shipped, and ``vocab.txt``
  with the BERT pipeline built from its pieces; they must agree everywhere.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import WeightsError
from lipbound.measures import default_model_dir
from lipbound.numeric.model import Tokenizer, load_tokenizer

DATA = os.path.join(os.path.dirname(__file__), "..", "lipbound", "measures", "data")


@pytest.fixture(scope="module")
def model_dir():
    return default_model_dir()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.from_vocab(os.path.join(model_dir, "vocab.txt"))


@pytest.fixture(scope="module")
def reference():
    with open(os.path.join(DATA, "tokenizer_reference.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def fast_tokenizer(model_dir):
    return load_tokenizer(model_dir)


# Stored references -------------------------------------------------------------------------
def test_reference_file_covers_the_hard_cases(reference):
    texts = [case["text"] for case in reference["cases"]]
    assert len(texts) >= 30
    assert "tokenizer.json" in reference["provenance"]
    joined = "".join(texts)
    for needle in ("é", "€", "😀", "東", "한", "ΟΔΟΣ", "\u0301", "\u200b", "\x07", "[MASK]", "a" * 101):
        assert needle in joined


def test_stored_reference_ids_and_tokens(tokenizer, fast_tokenizer, reference):
    for case in reference["cases"]:
        for source in (tokenizer, fast_tokenizer):
            assert source.encode(case["text"]) == case["ids"], case["text"]
            assert source.tokens(source.encode(case["text"])) == case["tokens"], case["text"]


def test_only_final_sigma_separates_the_legacy_python_tokenizer(reference):
    # The older pure-Python BertTokenizer lower-cases whole words (str.lower: final sigma -> "ς");
    # tokenizer.json lower-cases per character.  That is the only disagreement among the cases.
    disagreeing = [case["text"] for case in reference["cases"] if not case["legacy_agrees"]]
    assert disagreeing == ["Αθήνα and ΟΔΟΣ are Greek; Москва is Russian."]
    assert "ΟΔΟΣ".lower().endswith("ς") and "".join(c.lower() for c in "ΟΔΟΣ").endswith("σ")


# tokenizer.json settings ---------------------------------------------------------------------
def test_tokenizer_json_describes_the_vocab_txt_pipeline(model_dir, tokenizer, fast_tokenizer):
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as handle:
        spec = json.load(handle)
    assert spec["normalizer"] == {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                  "strip_accents": None, "lowercase": True}
    assert spec["pre_tokenizer"] == {"type": "BertPreTokenizer"}
    model = spec["model"]
    assert model["type"] == "WordPiece" and model["continuing_subword_prefix"] == "##"
    assert model["max_input_chars_per_word"] == 100 and model["unk_token"] == "[UNK]"
    assert model["vocab"] == {token: i for i, token in enumerate(tokenizer.vocab)}
    assert tokenizer.vocab == fast_tokenizer.vocab and tokenizer.kind == fast_tokenizer.kind == "wordpiece"
    single = spec["post_processor"]["single"]
    assert [s.get("SpecialToken", {}).get("id") for s in single] == ["[CLS]", None, "[SEP]"]
    for token in spec["added_tokens"]:
        assert tokenizer.token_to_id(token["content"]) == token["id"]
    assert spec["truncation"]["max_length"] == 128  # switched off: every token of a long text is kept
    assert len(fast_tokenizer.encode("word " * 300)) == 302
    for source in (tokenizer, fast_tokenizer):
        assert (source.cls_id, source.sep_id, source.unk_id, source.special_id("pad"), source.special_id("mask")) == \
            (101, 102, 100, 0, 103)
        assert source.bos_id is None and source.eos_id is None and source.vocab_size == 30522


# The algorithm on a hand-made vocabulary -----------------------------------------------------
def _vocab_file(directory, tokens) -> str:
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(tokens) + "\n")
    return path


@pytest.fixture()
def toy(tmp_path):
    vocab = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "a", "##b", "##a",
             "!", ",", "naive", "cafe", "x", "##x", "Ab", "Cafe")
    return Tokenizer.from_vocab(_vocab_file(tmp_path, vocab))


def words(tokenizer, text):
    return tokenizer.tokens(tokenizer.encode(text, add_special_tokens=False))


def test_greedy_longest_match_first(toy):
    assert words(toy, "unaffable") == ["un", "##aff", "##able"]
    assert words(toy, "ab") == ["a", "##b"]
    assert words(toy, "aba") == ["a", "##b", "##a"]
    # An unmatched suffix makes the whole word unknown, not just the piece.
    assert words(toy, "unaffablez") == ["[UNK]"]
    assert toy.encode("unaffable!") == [2, 5, 6, 7, 11, 3]


def test_word_length_limit(toy):
    assert words(toy, "x" * 100) == ["x"] + ["##x"] * 99
    assert words(toy, "x" * 101) == ["[UNK]"]


def test_basic_tokenizer_steps(tokenizer, tmp_path):
    assert words(tokenizer, "Hello,World!") == ["hello", ",", "world", "!"]
    assert words(tokenizer, "NAÏVE Café") == ["naive", "cafe"]
    assert words(tokenizer, "e\u0301") == ["e"]  # combining accent stripped
    assert words(tokenizer, "a\x00b\ufffdc\x07d") == ["abc", "##d"]  # NUL, U+FFFD, controls dropped: one word
    assert words(tokenizer, "a\tb\nc\u00a0d\u3000e") == ["a", "b", "c", "d", "e"]
    assert words(tokenizer, "中文ok") == ["中", "文", "ok"]
    assert words(tokenizer, "x$y^z") == ["x", "$", "y", "^", "z"]  # ASCII symbols count as punctuation
    cased = ("[UNK]", "[CLS]", "[SEP]", "Ab", "Cafe", "Café")
    assert words(Tokenizer.from_vocab(_vocab_file(tmp_path, cased), lowercase=False), "Ab Café") == ["Ab", "Café"]
    stripped = Tokenizer.from_vocab(_vocab_file(tmp_path, cased), lowercase=False, strip_accents=True)
    assert words(stripped, "Café") == ["Cafe"]


def test_special_tokens_in_text_are_kept_whole(toy):
    assert words(toy, "a[MASK]b") == ["a", "[MASK]", "[UNK]"]
    assert words(toy, "[mask]") == ["[UNK]", "[UNK]", "[UNK]"]  # case-sensitive: "[", "mask", "]"


def test_tokens_and_decode(tokenizer):
    ids = tokenizer.encode("Hello, world!")
    assert tokenizer.tokens(ids) == ["[CLS]", "hello", ",", "world", "!", "[SEP]"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello, world!"
    with pytest.raises(WeightsError):
        tokenizer.tokens([tokenizer.vocab_size])
    assert tokenizer.token_to_id("hello") == 7592 and tokenizer.token_to_id("no-such-entry") is None


# Errors -----------------------------------------------------------------------------------------
def test_missing_vocab_file(tmp_path):
    with pytest.raises(WeightsError) as info:
        Tokenizer.from_vocab(tmp_path / "vocab.txt")
    assert info.value.argument == "vocab_file"


def test_vocab_without_unknown_token(tmp_path):
    with pytest.raises(WeightsError) as info:
        Tokenizer.from_vocab(_vocab_file(tmp_path, ("[CLS]", "[SEP]", "a")))
    assert "unk_token" in info.value.expected


def test_text_must_be_a_string(tokenizer):
    with pytest.raises(WeightsError) as info:
        tokenizer.encode(b"bytes")
    assert info.value.argument == "text"


# The two sources agree everywhere ----------------------------------------------------------------
def test_unicode_blocks_agree(tokenizer, fast_tokenizer):
    # Every code point of these blocks inside, before and after words.
    blocks = [(0x0000, 0x05FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF),
              (0x4E00, 0x4FFF), (0xAC00, 0xACFF), (0xFB00, 0xFFFF), (0x1F300, 0x1F64F)]
    texts = [f"Ab{chr(c)}x {chr(c)}. {chr(c)}{chr(c)}" for lo, hi in blocks for c in range(lo, hi + 1)
             if not 0xD800 <= c <= 0xDFFF]
    mismatches = [t for t in texts if tokenizer.encode(t) != fast_tokenizer.encode(t)]
    assert mismatches == []


POOL = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`")
        + list("éèêëàâäôöûüçñÉÈÀÇÑßøåæœÆŒİıΣσςΟΔΑλ中文字日本語한국어ひらがなカタカナ😀👍🏽🇫🇷")
        + list("\u00a0\u2028\u3000\t\n\r\x00\ufffd\u200b\u200d\u0301\u0308\ue000")
        + ["[CLS]", "[SEP]", "[MASK]", "[UNK]", "[PAD]", "[mask]", "##", "un", "affable", "x" * 101])


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(POOL), max_size=30))
def test_random_text_agrees(tokenizer, fast_tokenizer, pieces):
    text = "".join(pieces)
    assert tokenizer.encode(text) == fast_tokenizer.encode(text)
