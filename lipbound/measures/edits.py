"""Token edits of a sentence: replace, insert or delete k word tokens, drawn reproducibly, and the
sets of edits they belong to.

Edits never touch ``[CLS]`` and ``[SEP]``; new words are whole vocabulary words of letters
(no special token, no ``##`` continuation) and never one of the offensive or pointed words of
``data/offensive_words.txt`` (:func:`clean_word_ids`: a drawn edit is printed, and must read as an
illustration); the edit of k tokens extends the one of k - 1.
Positions are drawn, or chosen (``positions``).  :func:`edit_set` describes every edit of the same
kind at the same positions -- any of the candidate tokens in every edited slot -- as an
:class:`~lipbound.local.propagate.EditTemplate` for the set certificates.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..local.propagate import EditTemplate
from .bert import BertModel

__all__ = ["MODES", "Edit", "draw_edits", "whole_word_ids", "clean_word_ids", "drawable_ids", "offensive_words",
           "edit_set", "check_positions", "edited_ids"]

MODES = ("replace", "insert", "delete")
#: The words random draws skip (module docstring).
OFFENSIVE_WORDS_FILE = Path(__file__).resolve().parent / "data" / "offensive_words.txt"


@functools.lru_cache(maxsize=1)
def offensive_words() -> frozenset[str]:
    """The lowercase words of :data:`OFFENSIVE_WORDS_FILE`, which random edits never draw."""
    lines = OFFENSIVE_WORDS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip().lower() for line in lines if line.strip() and not line.lstrip().startswith("#"))


def whole_word_ids(tokenizer) -> np.ndarray:
    """Ids of the vocabulary entries that are whole words of letters: ASCII letters only, so no
    special token (``[CLS]``, ``[unused0]``), no ``##`` continuation, no digit or punctuation."""
    return np.array([i for i, token in enumerate(tokenizer.vocab) if token.isascii() and token.isalpha()],
                    dtype=np.int64)


def clean_word_ids(tokenizer) -> np.ndarray:
    """The words random edits draw from: :func:`whole_word_ids` without :func:`offensive_words`."""
    banned = offensive_words()
    return np.array([i for i in whole_word_ids(tokenizer) if tokenizer.vocab[i].lower() not in banned], dtype=np.int64)


def drawable_ids(tokenizer) -> np.ndarray:
    """Every vocabulary id a random sample may take: all but the :func:`offensive_words` (samples of
    candidate tokens for set certificates and worst-edit searches)."""
    banned = offensive_words()
    return np.array([i for i, token in enumerate(tokenizer.vocab) if token.lower() not in banned], dtype=np.int64)


@final
@dataclass(frozen=True)
class Edit:
    """One perturbed sentence.

    Attributes
    ----------
    k : int
        Number of edited tokens.
    positions : tuple of int
        Replace/delete: indices (into the original ids, 0 = ``[CLS]``) of the edited tokens.
        Insert: indices of the original tokens the new words are inserted before.
    words : tuple of str
        Replace/insert: the new words, in the order of ``positions``; delete: the removed tokens.
    ids : tuple of int
        Token ids of the perturbed sentence, ``[CLS] ... [SEP]``.
    tokens : tuple of str
    """

    k: int
    positions: tuple
    words: tuple
    ids: tuple
    tokens: tuple

    def to_json(self) -> dict:
        return {"k": self.k, "positions": list(self.positions), "words": list(self.words),
                "tokens": list(self.tokens)}


def check_positions(positions, mode: str, n: int, framed: bool = True) -> tuple[int, ...]:
    """Chosen positions (token indices counted from 0, ``[CLS]`` is 0): replace and delete edit word
    tokens ``1..n-2``; insert puts a word before token ``1..n-1``.  Distinct, in the given order.
    ``framed=False`` (a decoder's ids, no ``[CLS]``/``[SEP]``): any token ``0..n-1``."""
    values = tuple(int(p) for p in positions)
    low, high = (0, n - 1) if not framed else (1, n - 1) if mode == "insert" else (1, n - 2)
    bad = [p for p in values if not low <= p <= high]
    if not values or bad or len(set(values)) != len(values):
        raise AssumptionError("positions", f"distinct token positions in {low}..{high} (counted from 0"
                              + (f"; [CLS] is 0{' and [SEP] is ' + str(n - 1) if mode != 'insert' else ''})"
                                 if framed else ")"),
                              repr(list(values)), f"pick `positions` of this sentence's words, e.g. {low}")
    return values


def draw_edits(model: BertModel, ids, mode: str, ks, seed: int, positions=None, framed: bool = True) -> dict[int, Edit]:
    """The edits of :func:`perturb`, one per k, drawn by ``numpy.random.default_rng(seed)``.

    Nested: the edit of k tokens extends the one of k - 1 (same positions and words).  Word
    positions exclude ``[CLS]`` (index 0) and ``[SEP]`` (index n - 1); new words come from
    :func:`clean_word_ids`, and a replacement always differs from the token it replaces.

    Parameters
    ----------
    model : BertModel
        Supplies the tokenizer.
    ids : sequence of int
        ``[CLS] ... [SEP]`` token ids of the sentence.
    mode : {"replace", "insert", "delete"}
    ks : sequence of int
        Edit sizes, each in ``[1, n - 2]`` (checked by :func:`perturb`).
    seed : int
    positions : sequence of int, optional
        Chosen positions (see :func:`check_positions`); the k-token edit uses the first k.
    framed : bool
        The ids hold ``[CLS]`` and ``[SEP]`` (a BERT); False: every token is a word (a decoder).
    """
    ids = [int(i) for i in ids]
    tokenizer = model.tokenizer
    rng = np.random.default_rng(seed)
    n, largest = len(ids), max(ks)
    candidates = clean_word_ids(tokenizer)
    order = rng.permutation(np.arange(1, n - 1) if framed else np.arange(n))  # [CLS] (0) and [SEP] (n-1) never
    if positions is not None:
        order = np.array(check_positions(positions, mode, n, framed))
        if largest > order.size:
            raise AssumptionError("positions", f"at least {largest} positions (one per edited token)",
                                  f"{order.size}", "give as many `positions` as the largest k")
    if mode == "insert":
        slots = order[:largest] if positions is not None else rng.integers(1, n, size=largest)
        new = rng.choice(candidates, size=largest)
    else:
        slots = order[:largest]
        new = np.empty(largest, dtype=np.int64)
        for j, position in enumerate(slots):
            choice = rng.choice(candidates)
            while choice == ids[position]:  # a replacement must change the token
                choice = rng.choice(candidates)
            new[j] = choice
    edits = {}
    for k in ks:
        chosen, words = slots[:k], new[:k]
        if mode == "replace":
            out = list(ids)
            for position, word in zip(chosen, words):
                out[position] = int(word)
            described = tuple(tokenizer.vocab[int(w)] for w in words)
        elif mode == "delete":
            removed = set(int(p) for p in chosen)
            out = [t for i, t in enumerate(ids) if i not in removed]
            described = tuple(tokenizer.vocab[ids[int(p)]] for p in chosen)
        else:
            out = edited_ids(ids, "insert", chosen, words)
            described = tuple(tokenizer.vocab[int(w)] for w in words)
        edits[k] = Edit(k, tuple(int(p) for p in chosen), described, tuple(out),
                        tuple(tokenizer.tokens(out)))
    return edits


def edited_ids(ids, mode: str, positions, words=()) -> list[int]:
    """The ids of an edited sentence: ``words`` replace the tokens at ``positions``, are inserted before
    them, or the tokens there are deleted."""
    ids = [int(i) for i in ids]
    if mode == "replace":
        out = list(ids)
        for position, word in zip(positions, words):
            out[int(position)] = int(word)
        return out
    if mode == "delete":
        removed = {int(p) for p in positions}
        return [t for i, t in enumerate(ids) if i not in removed]
    out = []
    for i, token in enumerate(ids):
        out.extend(int(w) for s, w in zip(positions, words) if int(s) == i)
        out.append(token)
    return out


def edit_set(ids, mode: str, positions, candidates) -> EditTemplate:
    """Every edit of kind ``mode`` at ``positions``, any of ``candidates`` (token ids) in every edited slot
    (a deletion is a set of one edit): the template of the set certificates.

    Replaced tokens are centred on themselves; an inserted token on the token it is inserted before;
    every other token on itself, at its position in the edited sentence.
    """
    ids = np.asarray([int(i) for i in ids], dtype=np.int64)
    candidates = np.unique(np.asarray(candidates, dtype=np.int64))
    positions = [int(p) for p in positions]
    n = ids.size
    if mode == "replace":
        words = tuple(candidates if i in positions else ids[i:i + 1] for i in range(n))
        return EditTemplate(ids, np.arange(n), np.arange(n), words)
    if mode == "delete":
        kept = np.array([i for i in range(n) if i not in set(positions)])
        return EditTemplate(ids, kept, np.arange(kept.size), tuple(ids[i:i + 1] for i in kept))
    source, words = [], []
    for i in range(n):
        for s in positions:
            if s == i:
                source.append(i)
                words.append(candidates)
        source.append(i)
        words.append(ids[i:i + 1])
    return EditTemplate(ids, np.array(source), np.arange(len(source)), tuple(words))
