r"""The papers lipbound's LaTeX cites, as BibTeX with their arXiv (and DOI) identifiers.

Keys carry the prefix ``lb-`` so that they do not collide with the author's own.  Every entry
is one of docs/references.md; an identifier is given only where it was checked (arXiv
identifiers for the machine-learning papers, which have no DOI of their own).
:func:`variant_citations` and :func:`claim_citations` say which papers a variant and a published
claim come from; :func:`bibtex` writes the entries for a set of keys.
"""

from __future__ import annotations

from typing import Final

from ..errors import AssumptionError
from ..symbolic import claims as C

__all__ = ["REFERENCES", "bibtex", "variant_citations", "claim_citations", "cite"]

#: key -> (entry type, fields in order)
REFERENCES: Final[dict[str, tuple[str, dict[str, str]]]] = {
    "lb-vaswani2017": ("inproceedings", {
        "author": "Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion "
                  "and Gomez, Aidan N. and Kaiser, {\\L}ukasz and Polosukhin, Illia",
        "title": "Attention Is All You Need",
        "booktitle": "Advances in Neural Information Processing Systems (NeurIPS)",
        "year": "2017", "eprint": "1706.03762", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/1706.03762"}),
    "lb-vuckovic2020": ("misc", {
        "author": "Vuckovic, James and Baratin, Aristide and Tachet des Combes, Remi",
        "title": "A Mathematical Theory of Attention", "year": "2020", "eprint": "2007.02876",
        "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2007.02876"}),
    "lb-vuckovic2021": ("misc", {
        "author": "Vuckovic, James and Baratin, Aristide and Tachet des Combes, Remi",
        "title": "On the Regularity of Attention", "year": "2021", "eprint": "2102.05628",
        "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2102.05628"}),
    "lb-kim2021": ("inproceedings", {
        "author": "Kim, Hyunjik and Papamakarios, George and Mnih, Andriy",
        "title": "The {L}ipschitz Constant of Self-Attention",
        "booktitle": "Proceedings of the 38th International Conference on Machine Learning (ICML)",
        "series": "Proceedings of Machine Learning Research", "volume": "139", "pages": "5562--5571",
        "year": "2021", "eprint": "2006.04710", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2006.04710"}),
    "lb-castin2024": ("inproceedings", {
        "author": "Castin, Val{\\'e}rie and Ablin, Pierre and Peyr{\\'e}, Gabriel",
        "title": "How Smooth Is Attention?",
        "booktitle": "Proceedings of the 41st International Conference on Machine Learning (ICML)",
        "series": "Proceedings of Machine Learning Research", "volume": "235", "pages": "5817--5840",
        "year": "2024", "eprint": "2312.14820", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2312.14820"}),
    "lb-dasoulas2021": ("inproceedings", {
        "author": "Dasoulas, George and Scaman, Kevin and Virmaux, Aladin",
        "title": "{L}ipschitz Normalization for Self-Attention Layers with Application to Graph Neural Networks",
        "booktitle": "Proceedings of the 38th International Conference on Machine Learning (ICML)",
        "series": "Proceedings of Machine Learning Research", "volume": "139", "pages": "2456--2466",
        "year": "2021", "eprint": "2103.04886", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2103.04886"}),
    "lb-gao2017": ("misc", {
        "author": "Gao, Bolin and Pavel, Lacra",
        "title": "On the Properties of the Softmax Function with Application in Game Theory and Reinforcement Learning",
        "year": "2017", "eprint": "1704.00805", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/1704.00805"}),
    "lb-nair2025": ("misc", {
        "author": "Nair", "title": "{arXiv} preprint 2510.23012", "year": "2025", "eprint": "2510.23012",
        "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2510.23012"}),
    "lb-katharopoulos2020": ("inproceedings", {
        "author": "Katharopoulos, Angelos and Vyas, Apoorv and Pappas, Nikolaos and Fleuret, Fran{\\c{c}}ois",
        "title": "Transformers are {RNN}s: Fast Autoregressive Transformers with Linear Attention",
        "booktitle": "Proceedings of the 37th International Conference on Machine Learning (ICML)",
        "year": "2020", "eprint": "2006.16236", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2006.16236"}),
    "lb-ramapuram2024": ("misc", {
        "author": "Ramapuram, Jason and others",
        "title": "Theory, Analysis, and Best Practices for Sigmoid Self-Attention", "year": "2024",
        "eprint": "2409.04431", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2409.04431"}),
}

_SCORE_CITATIONS = {"dot": ("lb-vaswani2017",), "l2": ("lb-kim2021",), "feature-map": ("lb-katharopoulos2020",)}
_CLAIM_SOURCES = {C.KIM: ("lb-kim2021",), C.CASTIN: ("lb-castin2024",),
                  C.VUCKOVIC: ("lb-vuckovic2020", "lb-vuckovic2021"), C.NAIR: ("lb-nair2025",),
                  C.GAO: ("lb-gao2017",), C.DASOULAS: ("lb-dasoulas2021",)}


def variant_citations(variant) -> tuple[str, ...]:
    """The papers a variant's score, weights and structure come from."""
    facts = variant.head_facts
    keys = list(_SCORE_CITATIONS.get(facts.score, ()))
    if facts.weights == "sigmoid":
        keys.append("lb-ramapuram2024")
    if variant.norms == ("w1",):
        keys.append("lb-vuckovic2020")
    return tuple(dict.fromkeys(keys))


def claim_citations(item) -> tuple[str, ...]:
    """The papers a published claim comes from (none for a regression case from public code)."""
    return _CLAIM_SOURCES.get(item.source, ())


def cite(keys) -> str:
    r"""``~\cite{a,b}``, or "" for no key."""
    keys = list(keys)
    return "~\\cite{%s}" % ",".join(keys) if keys else ""


def bibtex(keys) -> str:
    """The BibTeX entries of ``keys`` (sorted, each once)."""
    out = []
    for key in sorted(set(keys)):
        if key not in REFERENCES:
            raise AssumptionError("citation", f"one of {', '.join(REFERENCES)}", repr(key),
                                  "add the paper to lipbound.printing.bibliography.REFERENCES and docs/references.md")
        kind, fields = REFERENCES[key]
        body = ",\n".join(f"  {name} = {{{value}}}" for name, value in fields.items())
        out.append(f"@{kind}{{{key},\n{body}\n}}\n")
    return "\n".join(out)
