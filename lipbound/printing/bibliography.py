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
    "lb-ramapuram2024": ("inproceedings", {
        "author": "Ramapuram, Jason and Danieli, Federico and Dhekane, Eeshan and Weers, Floris and Busbridge, Dan "
                  "and Ablin, Pierre and Likhomanenko, Tatiana and Digani, Jagrit and Gu, Zijin and Shidani, Amitis "
                  "and Webb, Russ",
        "title": "Theory, Analysis, and Best Practices for Sigmoid Self-Attention",
        "booktitle": "International Conference on Learning Representations (ICLR)", "year": "2025",
        "eprint": "2409.04431", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2409.04431"}),
    "lb-emadi2026": ("misc", {
        "author": "Emadi, Seyed Morteza",
        "title": "Exact Attention Sensitivity and the Geometry of Transformer Stability", "year": "2026",
        "eprint": "2602.18849", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2602.18849"}),
    "lb-newhouse2025": ("misc", {
        "author": "Newhouse, Laker and Hess, R. Preston and Cesista, Franz and Zahorodnii, Andrii and Bernstein, "
                  "Jeremy and Isola, Phillip",
        "title": "Training Transformers with Enforced {L}ipschitz Constants", "year": "2025",
        "eprint": "2507.13338", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2507.13338"}),
    "lb-lipattn2026": ("misc", {  # an anonymous submission: no arXiv identifier
        "author": "Anonymous",
        "title": "Globally 1-{L}ipschitz Attention Without Sequence-Length Dependence",
        "howpublished": "Submission to the International Conference on Learning Representations (ICLR) 2026, "
                        "OpenReview 9Y7L5VeV4Z", "year": "2025", "url": "https://openreview.net/forum?id=9Y7L5VeV4Z"}),
    "lb-su2021": ("misc", {
        "author": "Su, Jianlin and Lu, Yu and Pan, Shengfeng and Murtadha, Ahmed and Wen, Bo and Liu, Yunfeng",
        "title": "{RoFormer}: Enhanced Transformer with Rotary Position Embedding", "year": "2021",
        "eprint": "2104.09864", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2104.09864"}),
    "lb-henry2020": ("inproceedings", {
        "author": "Henry, Alex and Dachapally, Prudhvi Raj and Pawar, Shubham and Chen, Yuxuan",
        "title": "Query-Key Normalization for Transformers", "booktitle": "Findings of EMNLP", "year": "2020",
        "eprint": "2010.04245", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2010.04245"}),
    "lb-press2022": ("inproceedings", {
        "author": "Press, Ofir and Smith, Noah A. and Lewis, Mike",
        "title": "Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation",
        "booktitle": "International Conference on Learning Representations (ICLR)", "year": "2022",
        "eprint": "2108.12409", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2108.12409"}),
    "lb-raffel2020": ("article", {
        "author": "Raffel, Colin and Shazeer, Noam and Roberts, Adam and Lee, Katherine and Narang, Sharan and "
                  "Matena, Michael and Zhou, Yanqi and Li, Wei and Liu, Peter J.",
        "title": "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer",
        "journal": "Journal of Machine Learning Research", "year": "2020", "eprint": "1910.10683",
        "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/1910.10683"}),
    "lb-beltagy2020": ("misc", {
        "author": "Beltagy, Iz and Peters, Matthew E. and Cohan, Arman",
        "title": "Longformer: The Long-Document Transformer", "year": "2020", "eprint": "2004.05150",
        "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2004.05150"}),
    "lb-shazeer2019": ("misc", {
        "author": "Shazeer, Noam", "title": "Fast Transformer Decoding: One Write-Head is All You Need", "year": "2019",
        "eprint": "1911.02150", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/1911.02150"}),
    "lb-ainslie2023": ("inproceedings", {
        "author": "Ainslie, Joshua and Lee-Thorp, James and de Jong, Michiel and Zemlyanskiy, Yury and Lebr{\\'o}n, "
                  "Federico and Sanghai, Sumit",
        "title": "{GQA}: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints",
        "booktitle": "Proceedings of EMNLP", "year": "2023", "eprint": "2305.13245", "archivePrefix": "arXiv",
        "url": "https://arxiv.org/abs/2305.13245"}),
    "lb-shazeer2020": ("misc", {
        "author": "Shazeer, Noam", "title": "{GLU} Variants Improve Transformer", "year": "2020",
        "eprint": "2002.05202", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2002.05202"}),
    "lb-zhang2019": ("inproceedings", {
        "author": "Zhang, Biao and Sennrich, Rico", "title": "Root Mean Square Layer Normalization",
        "booktitle": "Advances in Neural Information Processing Systems (NeurIPS)", "year": "2019",
        "eprint": "1910.07467", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/1910.07467"}),
    "lb-touvron2021": ("inproceedings", {
        "author": "Touvron, Hugo and Cord, Matthieu and Sablayrolles, Alexandre and Synnaeve, Gabriel and "
                  "J{\\'e}gou, Herv{\\'e}",
        "title": "Going Deeper with Image Transformers", "booktitle": "Proceedings of ICCV", "year": "2021",
        "eprint": "2103.17239", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2103.17239"}),
    "lb-gemma2024": ("misc", {
        "author": "{Gemma Team}", "title": "Gemma 2: Improving Open Language Models at a Practical Size",
        "year": "2024", "eprint": "2408.00118", "archivePrefix": "arXiv", "url": "https://arxiv.org/abs/2408.00118"}),
}

_SCORE_CITATIONS = {"dot": ("lb-vaswani2017",), "l2": ("lb-kim2021",), "feature-map": ("lb-katharopoulos2020",)}
_CLAIM_SOURCES = {C.KIM: ("lb-kim2021",), C.CASTIN: ("lb-castin2024",),
                  C.VUCKOVIC: ("lb-vuckovic2020", "lb-vuckovic2021"), C.NAIR: ("lb-nair2025",),
                  C.GAO: ("lb-gao2017",), C.DASOULAS: ("lb-dasoulas2021",), C.EMADI: ("lb-emadi2026",),
                  C.RAMAPURAM: ("lb-ramapuram2024",), C.NEWHOUSE: ("lb-newhouse2025",), C.LIPATTN: ("lb-lipattn2026",)}


#: Head facts -> the papers they come from.
_FACT_CITATIONS = {"rotary": ("lb-su2021",), "qk_norm": ("lb-henry2020",), "window": ("lb-beltagy2020",),
                   "softcap": ("lb-gemma2024",)}
_BIAS_CITATIONS = {"relative": ("lb-raffel2020",), "alibi": ("lb-press2022",)}


def variant_citations(variant) -> tuple[str, ...]:
    """The papers a variant's score, weights and structure come from (a block's: its normalisation, gated
    unit, LayerScale, sandwich norms)."""
    facts = variant.head_facts
    if facts is None:
        return _block_citations(variant)
    keys = list(_SCORE_CITATIONS.get(facts.score, ()))
    if facts.weights == "sigmoid":
        keys.append("lb-ramapuram2024")
    if variant.norms == ("w1",):
        keys.append("lb-vuckovic2020")
    for fact, cited in _FACT_CITATIONS.items():
        if getattr(facts, fact):
            keys.extend(cited)
    keys.extend(_BIAS_CITATIONS.get(facts.position_bias, ()))
    if getattr(variant, "grouped", False):
        keys.extend(("lb-shazeer2019", "lb-ainslie2023"))
    return tuple(dict.fromkeys(keys))


def _block_citations(block) -> tuple[str, ...]:
    parts = [block] + [getattr(block, name, None) for name in ("inner", "norm", "after")]
    keys = []
    for part in parts:
        if getattr(part, "kind", None) == "rmsnorm":
            keys.append("lb-zhang2019")
        if getattr(part, "activation", None) is not None:
            keys.append("lb-shazeer2020")
    if getattr(block, "layerscale", False):
        keys.append("lb-touvron2021")
    if getattr(block, "sandwich", False):
        keys.append("lb-gemma2024")
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
