"""The regularity mismatch of tokens: for substitutions at a position, how far the contextual
embeddings move per unit of distance of the input embeddings.

For a sentence ``ids``, a position ``p`` and a candidate word ``v`` (the sentence with ``ids[p] = v``),
with ``X_0`` the embeddings after the embedding LayerNorm and ``X_l`` the output of layer ``l - 1``
(the one float engine, float64),

    ratio_l(v) = ||X_l(v) - X_l|| / ||X_0(v) - X_0||        (Frobenius; only row p of X_0 moves).

The most irregular tokens are those of the largest ratio at the last layer.  What they have in
common is read from three features of each candidate, with Spearman's correlation to the ratio over
all candidates: the norm of its word embedding, the alignment of its input displacement with the top
singular directions of the first layer's heads' ``W_Q W_K^T`` (largest ``|u . delta| / ||delta||`` over
heads and the left and right top singular vectors), and its frequency: the number of times the token
occurs in a corpus the caller passes (``advise`` passes the tokenized text together with lipbound's
bundled sentences; a WordPiece vocabulary is not ordered by frequency and ships no counts, so the
text is the one sound source; a byte-level BPE vocabulary's merge ranks order its tokens only
roughly by frequency, so the counts in the text are used there too).  So that the frequency varies
over the candidates, every whole word of the corpus is a candidate, and the rest of the
``candidates`` are drawn from the vocabulary; the frequency correlation is None when fewer than
three candidates occur in the corpus.

A whole word (:func:`word_ids`) is a WordPiece entry of ASCII letters (no ``##`` continuation), or
in GPT-2-style byte-level BPE an entry ``Ġ`` + ASCII letters: the leading-space marker starts a word
(an entry without it continues one, or starts the text).  For a decoder's rotary heads, the
alignment is read from ``W_Q W_K^T``, the score matrix at offset 0 (``W_Q R(0) W_K^T``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import AssumptionError
from ..measures.edits import whole_word_ids
from ..numeric.model import Model, Tokenizer
from .diagnosis import step_states

__all__ = ["BPE_SPACE", "Mismatch", "token_counts", "token_mismatch", "top_directions", "word_ids", "word_positions"]

#: byte-level BPE's mark of a leading space (the byte 0x20 mapped to a printable character)
BPE_SPACE = "\u0120"


def word_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Ids of the whole words of the vocabulary (module docstring)."""
    if tokenizer.kind != "bpe":
        return whole_word_ids(tokenizer)
    return np.array([i for i, token in enumerate(tokenizer.vocab) if token.startswith(BPE_SPACE)
                     and token[1:].isascii() and token[1:].isalpha()], dtype=np.int64)


def word_positions(tokenizer: Tokenizer, ids) -> tuple[int, int]:
    """The first and last position of ``ids`` that is not a special token the tokenizer added
    (BERT's ``[CLS]`` and ``[SEP]``, a decoder's ``bos``)."""
    ids = list(ids)
    specials = set(tokenizer.specials.values())
    low = 1 if ids and ids[0] in specials else 0
    high = len(ids) - 2 if len(ids) > 1 and ids[-1] in specials else len(ids) - 1
    return low, high


def top_directions(model: Model, layer: int = 0) -> np.ndarray:
    """Unit top left and right singular vectors of ``W_Q W_K^T`` of every head of ``layer`` (2 H, d)."""
    rows = []
    for head in model.layers[layer].heads:
        U, _, Vt = np.linalg.svd(head.W_Q @ head.W_K.T)
        rows += [U[:, 0], Vt[0]]
    return np.array(rows)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass
class Mismatch:
    """Ratios of every candidate at every layer, the most irregular tokens and the features."""

    sentence: str
    position: int
    original: str
    candidates: np.ndarray
    words: list
    ratios: np.ndarray              # (candidates, layers + 1): ratio_0 = 1, ..., ratio_L
    norms: np.ndarray               # ||e_v|| of the word embeddings
    alignment: np.ndarray
    top: int = 10
    correlations: dict = field(default_factory=dict)

    frequency: np.ndarray | None = None    # occurrences of each candidate in the corpus (None: no corpus)

    def __post_init__(self):
        last = self.ratios[:, -1]
        seen = self.frequency is not None and np.count_nonzero(self.frequency) >= 3
        self.correlations = {"embedding_norm": _spearman(last, self.norms),
                             "alignment_with_qk": _spearman(last, self.alignment),
                             "frequency": _spearman(last, self.frequency) if seen else None}

    @property
    def order(self) -> np.ndarray:
        return np.argsort(self.ratios[:, -1])[::-1]

    def rows(self, top: int | None = None) -> list[dict]:
        """The ``top`` most irregular candidates, largest last-layer ratio first."""
        chosen = self.order[: top or self.top]
        return [{"sentence": self.sentence, "position": self.position, "original": self.original,
                 "token": self.words[i], "id": int(self.candidates[i]), "ratio_per_layer": self.ratios[i].tolist(),
                 "ratio": float(self.ratios[i, -1]), "embedding_norm": float(self.norms[i]),
                 "alignment": float(self.alignment[i]),
                 "frequency": None if self.frequency is None else int(self.frequency[i])} for i in chosen]

    def summary(self) -> dict:
        last = self.ratios[:, -1]
        return {"sentence": self.sentence, "position": self.position, "original": self.original,
                "candidates": len(last), "median_ratio": float(np.median(last)), "max_ratio": float(last.max()),
                "median_ratio_per_layer": np.median(self.ratios, axis=0).tolist(), "correlations": self.correlations}


def token_counts(tokenizer: Tokenizer, sentences) -> dict[int, int]:
    """Occurrences of each token id in the tokenized ``sentences`` (special tokens included)."""
    ids, counts = np.unique(np.concatenate([np.asarray(tokenizer.encode(s)) for s in sentences]), return_counts=True)
    return {int(i): int(c) for i, c in zip(ids, counts)}


def token_mismatch(model: Model, tokenizer: Tokenizer, sentence: str, position: int, *, candidates: int = 512,
                   seed: int = 0, batch: int = 64, top: int = 10, counts: dict | None = None) -> Mismatch:
    """The mismatch of substitutions at ``position`` (a token index, ``[CLS]`` is 0) of ``sentence``,
    over ``candidates`` whole words (0: every whole word): those of ``counts`` (occurrences of token ids
    in a corpus, :func:`token_counts`) and the rest drawn from the vocabulary."""
    ids = np.array(tokenizer.encode(sentence))
    low, high = word_positions(tokenizer, ids)
    if not low <= position <= high:
        raise AssumptionError("positions", f"a token position in {low}..{high} (counted from 0; special tokens "
                              "excluded)", repr(position), f"pick a word of the sentence, e.g. {high}")
    pool = word_ids(tokenizer)
    pool = pool[pool != ids[position]]
    if candidates and candidates < len(pool):
        seen = np.intersect1d(pool, np.fromiter(counts or (), dtype=pool.dtype))[:candidates]
        rest = np.setdiff1d(pool, seen)
        pool = np.sort(np.concatenate([seen, np.random.default_rng(seed).choice(rest, candidates - len(seen),
                                                                                replace=False)]))
    X_orig = model.embeddings(ids)
    ratios, deltas = [], []
    for start in range(0, len(pool), batch):
        chunk = pool[start:start + batch]
        edited = np.repeat(ids[None], len(chunk), axis=0)
        edited[:, position] = chunk
        X = np.stack([X_orig] + [model.embeddings(e) for e in edited]).astype(float)
        base = np.linalg.norm((X[1:] - X[:1]).reshape(len(chunk), -1), axis=1)
        deltas.append((X[1:, position] - X[0, position]) / base[:, None])
        layer_ratios = [np.ones(len(chunk))]
        states = {}
        for index, _, Y in step_states(model, X):
            states[index] = Y
        for index in sorted(states):
            Y = states[index]
            layer_ratios.append(np.linalg.norm((Y[1:] - Y[:1]).reshape(len(chunk), -1), axis=1) / base)
        ratios.append(np.stack(layer_ratios, axis=1))
    ratios, deltas = np.concatenate(ratios), np.concatenate(deltas)
    alignment = np.max(np.abs(deltas @ top_directions(model).T), axis=1)
    norms = np.linalg.norm(model.embeddings.word[pool], axis=1)
    words = tokenizer.tokens([int(v) for v in pool])
    frequency = None if counts is None else np.array([counts.get(int(v), 0) for v in pool])
    return Mismatch(sentence, position, tokenizer.tokens([int(ids[position])])[0], pool, words, ratios, norms,
                    alignment, top, frequency=frequency)
