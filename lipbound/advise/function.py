"""The functional cost of an edit on real text, from the one float engine
(:func:`lipbound.numeric.whole.chain.hidden_states`).

For a sentence encoder the sentence embedding is the mean of the last hidden states over the tokens
(the pooling of sentence-transformers' all-MiniLM-L6-v2), and the cost of an edit is read from

* ``cosine``: the cosine of each sentence's embedding under the edited weights to the original's
  (its minimum and mean over the sentences);
* ``ranking``: the similarity ranking of sentence pairs -- Spearman's correlation between the
  pairs' cosine similarities under both models, and the fraction of discordant pairs of pairs
  (two pairs whose order the edit swaps).

For a decoder (:func:`decoder_cost`), from the next-token logits ``final_norm(X_L) lm_head^T``
(:func:`lipbound.numeric.whole.chain.logits`) at every position of every sentence:

* ``next-token agreement``: the fraction of positions whose most likely next token under the edited
  weights is the original's;
* ``perplexity``: ``exp`` of the mean over positions ``t < n - 1`` of ``-log softmax(z_t)[ids[t + 1]]``
  (the text's own next tokens), before and after, and their ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np

from ..errors import AssumptionError
from ..numeric.model import Model
from ..numeric.whole.chain import hidden_states, logits

__all__ = ["DecoderCost", "FunctionalCost", "bundled_sentences", "decoder_cost", "function_cost",
           "function_reference", "functional_cost", "next_token_logits", "perplexity", "read_sentences",
           "sentence_embeddings"]


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

    metric = "min sentence cosine to the original"
    #: the second figure of the ranked table: its label and :attr:`secondary`
    secondary_label = "rho"

    @property
    def value(self) -> float:
        """The figure of :attr:`metric` (what a floor is set on)."""
        return self.min_cosine

    @property
    def secondary(self) -> float:
        return self.spearman

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


def next_token_logits(model: Model, ids_list) -> list[np.ndarray]:
    """The next-token logits (n, vocab) of a decoder at every position of each sentence."""
    return [logits(model, list(ids)) for ids in ids_list]


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def perplexity(logits_list, ids_list) -> float:
    """``exp`` of the mean negative log-likelihood of each sentence's tokens ``ids[1:]`` given their
    prefixes, over every predicted position of every sentence."""
    nll = [-_log_softmax(z[:-1])[np.arange(len(ids) - 1), np.asarray(ids[1:])] for z, ids in zip(logits_list, ids_list)]
    return float(np.exp(np.concatenate(nll).mean()))


@dataclass(frozen=True)
class DecoderCost:
    """What an edit of a decoder costs on the text (module docstring)."""

    agreement: float
    perplexity_before: float
    perplexity_after: float
    positions: int
    sentences: int

    metric = "next-token agreement with the original"
    secondary_label = "ppl x"

    @property
    def value(self) -> float:
        return self.agreement

    @property
    def secondary(self) -> float:
        """The perplexity ratio after / before."""
        return self.perplexity_ratio

    @property
    def cost(self) -> float:
        """``1 - next-token agreement``."""
        return max(1.0 - self.agreement, 0.0)

    @property
    def perplexity_ratio(self) -> float:
        return self.perplexity_after / self.perplexity_before

    def to_json(self) -> dict:
        return {"next_token_agreement": self.agreement, "perplexity_before": self.perplexity_before,
                "perplexity_after": self.perplexity_after, "perplexity_ratio": self.perplexity_ratio,
                "positions": self.positions, "sentences": self.sentences}


def decoder_cost(original, edited, ids_list) -> DecoderCost:
    """Compare the edited decoder's next-token logits ``edited`` with ``original`` (lists of (n, vocab),
    :func:`next_token_logits`) on the sentences ``ids_list``."""
    same = np.concatenate([np.argmax(a, axis=-1) == np.argmax(b, axis=-1) for a, b in zip(original, edited)])
    return DecoderCost(float(same.mean()), perplexity(original, ids_list), perplexity(edited, ids_list), len(same),
                       len(ids_list))


def function_reference(model: Model, ids_list):
    """What an edit is compared with: the sentence embeddings of an encoder (S, d), the next-token
    logits of a decoder (a list of (n, vocab))."""
    return next_token_logits(model, ids_list) if model.decoder_only else sentence_embeddings(model, ids_list)


def function_cost(reference, edited: Model, ids_list) -> FunctionalCost | DecoderCost:
    """The functional cost of ``edited`` against ``reference`` (:func:`function_reference` of the
    original): :func:`functional_cost` for an encoder, :func:`decoder_cost` for a decoder."""
    if edited.decoder_only:
        return decoder_cost(reference, next_token_logits(edited, ids_list), ids_list)
    return functional_cost(reference, sentence_embeddings(edited, ids_list))
