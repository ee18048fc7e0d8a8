"""WordPiece tokenization against the model's own tokenizer.json.

Three references:

* lipbound/measures/data/tokenizer_reference.json: tokens and ids for 32 texts (accents,
  punctuation, digits, unknown and over-long words, emoji, CJK, kana, Hangul, Greek, control
  and zero-width characters, special tokens), produced ONCE by
  ``scripts/make_reference_outputs.py`` with ``tokenizers.Tokenizer.from_file(tokenizer.json)``
  (tokenizers 0.23.3; padding and truncation off); always checked.
* the settings and vocabulary written in tokenizer.json itself; always checked.
* the ``tokenizers`` package, when installed, as a live independent implementation.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import WeightsError
from lipbound.measures import WordPieceTokenizer, basic_tokenize, default_model_dir

DATA = os.path.join(os.path.dirname(__file__), "..", "lipbound", "measures", "data")


@pytest.fixture(scope="module")
def model_dir():
    return default_model_dir()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return WordPieceTokenizer.from_directory(model_dir)


@pytest.fixture(scope="module")
def reference():
    with open(os.path.join(DATA, "tokenizer_reference.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def fast_tokenizer(model_dir):
    import tokenizers
    fast = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    fast.no_truncation()
    fast.no_padding()
    return fast


# Stored references -------------------------------------------------------------------------
def test_reference_file_covers_the_hard_cases(reference):
    texts = [case["text"] for case in reference["cases"]]
    assert len(texts) >= 30
    assert "tokenizer.json" in reference["provenance"]
    joined = "".join(texts)
    for needle in ("é", "€", "😀", "東", "한", "ΟΔΟΣ", "\u0301", "\u200b", "\x07", "[MASK]", "a" * 101):
        assert needle in joined


def test_stored_reference_ids_and_tokens(tokenizer, reference):
    for case in reference["cases"]:
        assert tokenizer.encode(case["text"]) == case["ids"], case["text"]
        assert ["[CLS]"] + tokenizer.tokenize(case["text"]) + ["[SEP]"] == case["tokens"], case["text"]


def test_only_final_sigma_separates_the_legacy_python_tokenizer(reference):
    # The older pure-Python BertTokenizer lower-cases whole words (str.lower: final sigma -> "ς");
    # tokenizer.json lower-cases per character.  That is the only disagreement among the cases.
    disagreeing = [case["text"] for case in reference["cases"] if not case["legacy_agrees"]]
    assert disagreeing == ["Αθήνα and ΟΔΟΣ are Greek; Москва is Russian."]
    assert "ΟΔΟΣ".lower().endswith("ς") and "".join(c.lower() for c in "ΟΔΟΣ").endswith("σ")


# tokenizer.json settings ---------------------------------------------------------------------
def test_tokenizer_json_describes_this_algorithm(model_dir, tokenizer):
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as handle:
        spec = json.load(handle)
    assert spec["normalizer"] == {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                  "strip_accents": None, "lowercase": True}
    assert spec["pre_tokenizer"] == {"type": "BertPreTokenizer"}
    model = spec["model"]
    assert model["type"] == "WordPiece" and model["continuing_subword_prefix"] == "##"
    assert model["max_input_chars_per_word"] == tokenizer.max_input_chars_per_word
    assert model["unk_token"] == tokenizer.unk_token
    assert model["vocab"] == {token: i for i, token in enumerate(tokenizer.vocab)}
    single = spec["post_processor"]["single"]
    assert [s.get("SpecialToken", {}).get("id") for s in single] == ["[CLS]", None, "[SEP]"]
    for token in spec["added_tokens"]:
        assert tokenizer.token_to_id(token["content"]) == token["id"]


# The algorithm on a hand-made vocabulary -----------------------------------------------------
@pytest.fixture()
def toy():
    vocab = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "a", "##b", "##a",
             "!", ",", "naive", "cafe", "x", "##x")
    return WordPieceTokenizer(vocab)


def test_greedy_longest_match_first(toy):
    assert toy.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert toy.tokenize("ab") == ["a", "##b"]
    assert toy.tokenize("aba") == ["a", "##b", "##a"]
    # An unmatched suffix makes the whole word unknown, not just the piece.
    assert toy.tokenize("unaffablez") == ["[UNK]"]
    assert toy.encode("unaffable!") == [2, 5, 6, 7, 11, 3]


def test_word_length_limit(toy):
    assert toy.tokenize("x" * 100) == ["x"] + ["##x"] * 99
    assert toy.tokenize("x" * 101) == ["[UNK]"]


def test_basic_tokenizer_steps():
    assert basic_tokenize("Hello,World!") == ["hello", ",", "world", "!"]
    assert basic_tokenize("NAÏVE Café") == ["naive", "cafe"]
    assert basic_tokenize("e\u0301") == ["e"]  # combining accent stripped
    assert basic_tokenize("a\x00b\ufffdc\x07d") == ["abcd"]  # NUL, U+FFFD, controls dropped
    assert basic_tokenize("a\tb\nc\u00a0d\u3000e") == ["a", "b", "c", "d", "e"]
    assert basic_tokenize("中文ok") == ["中", "文", "ok"]
    assert basic_tokenize("x$y^z") == ["x", "$", "y", "^", "z"]  # ASCII symbols count as punctuation
    assert basic_tokenize("Ab", lowercase=False) == ["Ab"]
    assert basic_tokenize("Café", lowercase=False, strip_accents=True) == ["Cafe"]


def test_special_tokens_in_text_are_kept_whole(toy):
    assert toy.tokenize("a[MASK]b") == ["a", "[MASK]", "[UNK]"]
    assert toy.tokenize("[mask]") == ["[UNK]", "[UNK]", "[UNK]"]  # case-sensitive: "[", "mask", "]"


def test_decode_tokens(tokenizer):
    assert tokenizer.decode_tokens(tokenizer.encode("Hello, world!")) == ["[CLS]", "hello", ",", "world", "!", "[SEP]"]
    with pytest.raises(WeightsError):
        tokenizer.decode_tokens([tokenizer.vocab_size])


# Errors -----------------------------------------------------------------------------------------
def test_missing_vocab_file(tmp_path):
    with pytest.raises(WeightsError) as info:
        WordPieceTokenizer.from_vocab_file(tmp_path / "vocab.txt")
    assert info.value.argument == "vocab_file"


def test_vocab_without_unknown_token():
    with pytest.raises(WeightsError) as info:
        WordPieceTokenizer(("[CLS]", "[SEP]", "a"))
    assert "unk_token" in info.value.expected


def test_text_must_be_a_string(tokenizer):
    with pytest.raises(WeightsError) as info:
        tokenizer.encode(b"bytes")
    assert info.value.argument == "text"


# Live comparison with the tokenizers package (skipped when it is not installed) ----------------
def test_reference_cases_against_tokenizers(tokenizer, fast_tokenizer, reference):
    for case in reference["cases"]:
        assert tokenizer.encode(case["text"]) == fast_tokenizer.encode(case["text"]).ids


def test_unicode_blocks_against_tokenizers(tokenizer, fast_tokenizer):
    # Every code point of these blocks inside, before and after words.  Blocks of recent Unicode
    # additions are left out: tokenizers classifies characters with older Unicode tables.
    blocks = [(0x0000, 0x05FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF),
              (0x4E00, 0x4FFF), (0xAC00, 0xACFF), (0xFB00, 0xFFFF), (0x1F300, 0x1F64F)]
    texts = [f"Ab{chr(c)}x {chr(c)}. {chr(c)}{chr(c)}" for lo, hi in blocks for c in range(lo, hi + 1)
             if not 0xD800 <= c <= 0xDFFF]
    expected = [e.ids for e in fast_tokenizer.encode_batch(texts)]
    mismatches = [(t, e) for t, e in zip(texts, expected) if tokenizer.encode(t) != e]
    assert mismatches == []


POOL = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`")
        + list("éèêëàâäôöûüçñÉÈÀÇÑßøåæœÆŒİıΣσςΟΔΑλ中文字日本語한국어ひらがなカタカナ😀👍🏽🇫🇷")
        + list("\u00a0\u2028\u3000\t\n\r\x00\ufffd\u200b\u200d\u0301\u0308\ue000")
        + ["[CLS]", "[SEP]", "[MASK]", "[UNK]", "[PAD]", "[mask]", "##", "un", "affable", "x" * 101])


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(POOL), max_size=30))
def test_random_text_against_tokenizers(tokenizer, fast_tokenizer, pieces):
    text = "".join(pieces)
    assert tokenizer.encode(text) == fast_tokenizer.encode(text).ids
