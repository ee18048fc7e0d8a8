"""Token edits of a sentence: replace, insert or delete k word tokens, drawn reproducibly.

Edits never touch ``[CLS]`` and ``[SEP]``; new words are whole vocabulary words of letters
(no special token, no ``##`` continuation); the edit of k tokens extends the one of k - 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from .bert import BertModel

__all__ = ["MODES", "Edit", "draw_edits", "whole_word_ids"]

MODES = ("replace", "insert", "delete")


def whole_word_ids(tokenizer) -> np.ndarray:
    """Ids of the vocabulary entries that are whole words of letters: ASCII letters only, so no
    special token (``[CLS]``, ``[unused0]``), no ``##`` continuation, no digit or punctuation."""
    return np.array([i for i, token in enumerate(tokenizer.vocab) if token.isascii() and token.isalpha()],
                    dtype=np.int64)


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


def draw_edits(model: BertModel, ids, mode: str, ks, seed: int) -> dict[int, Edit]:
    """The edits of :func:`perturb`, one per k, drawn by ``numpy.random.default_rng(seed)``.

    Nested: the edit of k tokens extends the one of k - 1 (same positions and words).  Word
    positions exclude ``[CLS]`` (index 0) and ``[SEP]`` (index n - 1); new words come from
    :func:`whole_word_ids`, and a replacement always differs from the token it replaces.

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
    """
    ids = [int(i) for i in ids]
    tokenizer = model.tokenizer
    rng = np.random.default_rng(seed)
    n, largest = len(ids), max(ks)
    candidates = whole_word_ids(tokenizer)
    order = rng.permutation(np.arange(1, n - 1))  # word positions; [CLS] (0) and [SEP] (n-1) never
    if mode == "insert":
        slots = rng.integers(1, n, size=largest)  # insert before an original token, after [CLS]
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
            out = []
            for i, token in enumerate(ids):
                out.extend(int(w) for s, w in zip(chosen, words) if s == i)
                out.append(token)
            described = tuple(tokenizer.vocab[int(w)] for w in words)
        edits[k] = Edit(k, tuple(int(p) for p in chosen), described, tuple(out),
                        tuple(tokenizer.decode_tokens(out)))
    return edits
