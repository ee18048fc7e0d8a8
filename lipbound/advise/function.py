"""The functional cost of an edit on real text, from the one float engine
(:func:`lipbound.numeric.whole.chain.hidden_states`).

For a sentence encoder the sentence embedding is the mean of the last hidden states over the tokens
(the pooling of sentence-transformers' all-MiniLM-L6-v2), and the cost of an edit is read from

* ``cosine``: the cosine of each sentence's embedding under the edited weights to the original's
  (its minimum and mean over the sentences);
* ``ranking``: the similarity ranking of sentence pairs -- Spearman's correlation between the
  pairs' cosine similarities under both models, and the fraction of discordant pairs of pairs
  (two pairs whose order the edit swaps).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np

from ..errors import AssumptionError
from ..numeric.model import Model
from ..numeric.whole.chain import hidden_states

__all__ = ["FunctionalCost", "bundled_sentences", "functional_cost", "read_sentences", "sentence_embeddings"]


def bundled_sentences() -> list[str]:
    """The 20 sentences shipped with lipbound (``lipbound/measures/data/sentences.txt``)."""
    text = resources.files("lipbound.measures").joinpath("data/sentences.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_sentences(path) -> list[str]:
    """One sentence per non-empty line of the UTF-8 file ``path`` (at least two)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line.strip() for line in handle if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise AssumptionError("text", "a readable UTF-8 text file, one sentence a line", f"{path} ({error})",
                              "pass a text file") from None
    if len(lines) < 2:
        raise AssumptionError("text", "at least two sentences (one a line)", f"{len(lines)} in {path}",
                              "add sentences to the file")
    return lines


def sentence_embeddings(model: Model, ids_list) -> np.ndarray:
    """Mean-pooled last hidden states, one row per sentence (S, d)."""
    return np.stack([hidden_states(model, ids)[-1].mean(axis=0) for ids in ids_list])


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    return ranks


def _pair_similarities(E: np.ndarray) -> np.ndarray:
    U = E / np.linalg.norm(E, axis=1, keepdims=True)
    i, j = np.triu_indices(len(E), 1)
    return np.sum(U[i] * U[j], axis=1)


@dataclass(frozen=True)
class FunctionalCost:
    """What an edit costs on the text (module docstring)."""

    min_cosine: float
    mean_cosine: float
    spearman: float
    discordant: float
    sentences: int

    @property
    def cost(self) -> float:
        """``1 - min cosine``: the unit the ranking divides by."""
        return max(1.0 - self.min_cosine, 0.0)

    def to_json(self) -> dict:
        return {"min_cosine": self.min_cosine, "mean_cosine": self.mean_cosine, "spearman": self.spearman,
                "discordant_pairs": self.discordant, "sentences": self.sentences}


def functional_cost(original: np.ndarray, edited: np.ndarray) -> FunctionalCost:
    """Compare sentence embeddings ``edited`` with ``original`` (both (S, d), S >= 2)."""
    cos = np.sum(original * edited, axis=1) / (np.linalg.norm(original, axis=1) * np.linalg.norm(edited, axis=1))
    a, b = _pair_similarities(original), _pair_similarities(edited)
    ra, rb = _ranks(a), _ranks(b)
    spearman = float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else 1.0
    da, db = np.sign(a[:, None] - a[None, :]), np.sign(b[:, None] - b[None, :])
    iu = np.triu_indices(len(a), 1)
    discordant = float(np.mean((da * db)[iu] < 0)) if len(a) > 1 else 0.0
    return FunctionalCost(float(cos.min()), float(cos.mean()), spearman, discordant, len(original))
