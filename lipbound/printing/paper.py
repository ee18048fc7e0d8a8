r"""A section of a paper: bounds, proofs, regimes, published claims, a figure, a bibliography.

:func:`paper_files` returns the files ``lipbound paper`` writes:

* ``lipbound-section.tex`` -- the section to ``\input`` into a paper: a symbol legend; for each
  variant its assumption, proposition, theorem and corollary with proofs
  (:mod:`lipbound.printing.theorem`), the asymptotic regimes of the bound
  (:func:`lipbound.symbolic.asymptotics.regimes`) and the published claims about the same kind
  of attention (:func:`lipbound.symbolic.claim_table.comparison_rows`) as a booktabs table with
  their provenance; the lemmas the proofs cite, each once; the figure and its numbers when
  measurements on a real head are given;
* ``lipbound-preamble.tex`` -- what the section needs in the paper's preamble
  (:func:`~lipbound.printing.style.preamble_lines`);
* ``lipbound.bib`` -- every cited paper, with its arXiv identifier;
* ``main.tex`` -- a standalone article around the section, which compiles with pdflatex and
  bibtex (``latexmk -pdf main.tex``).

Labels are stable (``lb:cor:dot-product-fro-ball``), environments prefixed (``lbtheorem``), and
every number printed with its rounding direction (:mod:`lipbound.printing.numbers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..symbolic import symbols as S
from ..symbolic.asymptotics import Regime, regimes
from ..symbolic.claim_table import ComparisonRow, comparison_rows
from ..symbolic.claims import CLAIMS
from ..symbolic.record import Described
from ..symbolic.registry import variant as registry_variant
from ..symbolic.scores import CustomScore
from .bibliography import bibtex, cite, claim_citations, variant_citations
from .derivation import lemma_appendix
from .document import DOMAIN_TITLES, statement_latex
from .latex import latex
from .legend import legend_latex
from .numbers import lower_latex, upper_latex
from .prose import escape_text, text_to_latex
from .style import PAPER, TexStyle, document_preamble, preamble_lines
from .theorem import result_key, result_latex, sloppy

__all__ = ["PaperEntry", "Series", "ScalingFigure", "paper_entry", "paper_section", "paper_files",
           "related_claims", "fitted_slope", "SECTION_FILE", "PREAMBLE_FILE", "BIB_FILE", "MAIN_FILE", "FIGURE_STEM"]

SECTION_FILE, PREAMBLE_FILE = "lipbound-section.tex", "lipbound-preamble.tex"
BIB_FILE, MAIN_FILE = "lipbound.bib", "main.tex"
FIGURE_STEM = "lipbound-figure"
_B = Described("B")


@final
@dataclass(frozen=True)
class PaperEntry:
    """One variant of a section: its name, the variant, the derived result, the published claims
    about the same kind of attention, and the regimes of its bound."""

    key: str
    variant: object
    result: object
    claims: tuple[ComparisonRow, ...] = ()
    regimes: tuple[Regime, ...] = ()


@final
@dataclass(frozen=True)
class Series:
    """Certified bounds and witnesses of one head against one variable (``n`` or ``R``)."""

    variable: str
    values: tuple[float, ...]
    bounds: tuple[float, ...]
    witnesses: tuple[float, ...]

    @property
    def bound_slope(self) -> float:
        return fitted_slope(self.values, self.bounds)

    @property
    def witness_slope(self) -> float:
        return fitted_slope(self.values, self.witnesses)


@final
@dataclass(frozen=True)
class ScalingFigure:
    """Measurements on a real head for the figure of a section (drawn by
    :func:`lipbound.printing.figures.draw_scaling`)."""

    head: str
    theorem: str
    domain: str
    n_series: Series
    radius_series: Series
    fixed_n: int
    fixed_radius: float
    file: str = FIGURE_STEM
    notes: tuple[str, ...] = field(default=())


def fitted_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    x, y = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    return float(np.polyfit(x, y, 1)[0])


def related_claims(chosen) -> list[str]:
    """Keys of the published upper bounds about the same kind of attention: same score, same
    weights, same argument, same mask (a claim about a variant without biases counts for the
    variant with them)."""
    facts = chosen.head_facts
    if facts is None:  # a block: the published claims are about attention
        return []
    keys = []
    for key, item in CLAIMS.items():
        if item.kind != "upper-bound" or item.statement is None:
            continue
        other = registry_variant(item.variant).head_facts
        if (other.score, other.role, other.causal, other.weights) == (facts.score, facts.role, facts.causal,
                                                                      facts.weights) \
                and other.values_through_A == facts.values_through_A \
                and chosen.norms == registry_variant(item.variant).norms:
            keys.append(key)
    return keys


def paper_entry(key: str, chosen, result) -> PaperEntry:
    """Derive what a section shows about one variant besides its proof."""
    keys = related_claims(chosen)
    rows = tuple(comparison_rows(keys)) if keys else ()
    found = ()
    if result.lipschitz:
        radius = S.R if S.R in result.expr.free_symbols else S.RadiusSymbol("gamma_max")
        found = regimes(result.expr, radius, S.n)
    return PaperEntry(key, chosen, result, rows, found)


# ------------------------------------------------------------------------------------------------
# Regimes and claims
# ------------------------------------------------------------------------------------------------
def _regime_latex(regime: Regime, style: TexStyle) -> str:
    variable = latex(regime.variable)
    width = style.display_width
    if regime.point == 0:
        return ("As $%s \\to 0$, with the other quantities fixed, the bound $B$ tends to\n%s"
                % (variable, statement_latex(regime.leading, relation="=", lhs=Described(r"\lim B"), width=width)))
    relation = r"\sim" if regime.exact else r"\le (1 + o(1))"
    if regime.exponent == 0:
        return ("As $%s \\to \\infty$, with the other quantities fixed, $B$ stays bounded: it %s\n%s"
                % (variable, "tends to" if regime.exact else "is at most",
                   statement_latex(regime.leading, relation="=" if regime.exact else r"\le",
                                   lhs=Described(r"\lim B" if regime.exact else r"\limsup B"), width=width)))
    return ("As $%s \\to \\infty$, with the other quantities fixed, $B$ %s like $%s^{%s}$%s:\n%s"
            % (variable, "decays" if regime.exponent < 0 else "grows", variable, latex(regime.exponent),
               "" if regime.exact else " at most (a minimum whose winner depends on the weights was replaced by "
                                       "one of its arguments)",
               statement_latex(regime.leading, relation=relation, lhs=_B, width=width)))


def _regimes_latex(entry: PaperEntry, style: TexStyle) -> str:
    if not entry.regimes:
        return ""
    items = "".join("  \\item " + _regime_latex(regime, style) for regime in entry.regimes)
    # a bound in weight norms: one theorem
    role = ("Corollary", "cor") if entry.result.constants else ("Theorem", "thm")
    return ("\\paragraph{Asymptotic regimes.}\nLet $B$ denote the bound of %s~\\ref{%s}.\n\\begin{itemize}\n%s"
            "\\end{itemize}\n" % (role[0], style.label(role[1], _key(entry)), items))


def _key(entry: PaperEntry) -> str:
    return result_key(entry.result)


def _setting(item) -> str:
    norm = {"fro": "Frobenius", "2,1": "(2,1)", "2,inf": "(2,inf)", "inf": "l_inf on vec X", "w1": "W1"}.get(
        item.norm, item.norm)
    return "%s; %s; %s" % (r"\texttt{%s}" % escape_text(item.variant), text_to_latex(norm),
                           escape_text(DOMAIN_TITLES.get(item.domain, item.domain)))


def _claims_latex(entry: PaperEntry, style: TexStyle) -> tuple[str, set[str]]:
    """The booktabs table of related claims, their statements, and the keys they cite."""
    if not entry.claims:
        return ("\\paragraph{Published claims.}\nNo published bound in lipbound's list of claims is about this "
                "kind of attention.\n"), set()
    cited: set[str] = set()
    rows = []
    statements = []
    for row in entry.claims:
        item = row.claim
        keys = claim_citations(item)
        cited.update(keys)
        rows.append("%s & \\texttt{%s} & %s & %s \\\\" % (
            r"\texttt{%s}%s" % (escape_text(item.key), cite(keys)), escape_text(item.tag), _setting(item),
            escape_text(row.relation)))
        statements.append("\\texttt{%s} (%s%s):\n%s" % (
            escape_text(item.key), escape_text(item.tag), cite(keys),
            statement_latex(row.published, width=style.display_width)))
    columns = "".join(r">{\raggedright\arraybackslash}p{%s\linewidth}" % share
                      for share in ("0.22", "0.13", "0.27", "0.24"))
    table = ("\\begin{table}[ht]\n\\centering\\footnotesize\n"
             "\\begin{tabular}{@{}" + columns + "@{}}\n"
             "\\toprule\nClaim & Tag & Setting & Relation to the derived bound \\\\\n\\midrule\n"
             + "\n".join(rows) + "\n\\bottomrule\n\\end{tabular}\n"
             "\\caption{Published bounds about this kind of attention, each with its provenance: \\texttt{abstract} "
             "(read in the abstract), \\texttt{code} (read in the authors' code), \\texttt{3p} (restated by a third "
             "party), \\texttt{unverified} (recalled, not checked against the paper), "
             "\\texttt{known-wrong} (a constant "
             "in public code that is false). The relation compares each claim with lipbound's bound for the claim's "
             "own setting, proved or refuted symbolically; an \\texttt{unverified} claim is compared as "
             "transcribed.}\n\\label{%s}\n\\end{table}\n" % style.label("tab", "claims-" + _key(entry)))
    text = ("\\paragraph{Published claims.}\nTable~\\ref{%s} relates the published bounds to the derived ones. "
            "As transcribed, they read\n\\begin{itemize}\n%s\\end{itemize}\n"
            % (style.label("tab", "claims-" + _key(entry)), "".join("  \\item " + s for s in statements)))
    return table + text, cited


# ------------------------------------------------------------------------------------------------
# The figure
# ------------------------------------------------------------------------------------------------
def _series_rows(series: Series, symbol: str) -> list[str]:
    return ["$%s = %.4g$ & $\\le %s$ & $\\ge %s$ \\\\" % (symbol, value, upper_latex(bound), lower_latex(witness))
            for value, bound, witness in zip(series.values, series.bounds, series.witnesses)]


def _figure_latex(figure: ScalingFigure, style: TexStyle) -> str:
    label = style.label("fig", "scaling")
    n, r = figure.n_series, figure.radius_series
    caption = (
        "Certified bound (theorem \\texttt{%s}) and witness (a lower bound found by search and certified in "
        "interval arithmetic) of the "
        "Lipschitz constant of %s, on log-log axes, with least-squares lines (dotted). Top: against the number of "
        "tokens $n$ on the %s (fitted slopes: bound $%.2f$, witness $%.2f$). Bottom: against the radius $R$ of the "
        "ball about 0 holding the tokens, $n = %d$ "
        "(slopes: bound $%.2f$, witness $%.2f$). The true constant lies between the two curves."
        % (escape_text(figure.theorem), text_to_latex(figure.head), escape_text(figure.domain),
           n.bound_slope, n.witness_slope, figure.fixed_n, r.bound_slope, r.witness_slope))
    table = ("\\begin{table}[ht]\n\\centering\\small\n\\begin{tabular}{@{}lll@{}}\n\\toprule\n"
             "Setting & Certified bound (rounded up) & Witness (rounded down) \\\\\n\\midrule\n"
             + "\n".join(_series_rows(n, "n")) + "\n\\midrule\n" + "\n".join(_series_rows(r, "R"))
             + "\n\\bottomrule\n\\end{tabular}\n\\caption{The numbers of Figure~\\ref{%s}: the Lipschitz constant of "
             "%s lies between the two columns.}\n\\label{%s}\n\\end{table}\n"
             % (label, text_to_latex(figure.head), style.label("tab", "scaling")))
    return ("\\begin{figure}[ht]\n\\centering\n\\includegraphics[width=\\linewidth]{%s}\n\\caption{%s}\n"
            "\\label{%s}\n\\end{figure}\n" % (figure.file, caption, label) + table
            + "".join(text_to_latex(note) + "\n" for note in figure.notes))


# ------------------------------------------------------------------------------------------------
# The section and the files
# ------------------------------------------------------------------------------------------------
def paper_section(entries: list[PaperEntry], style: TexStyle = PAPER, figure: ScalingFigure | None = None,
                  title: str = "Lipschitz bounds") -> tuple[str, set[str]]:
    """The section's LaTeX and the bibliography keys it cites."""
    legend: list = []
    lemmas: set[str] = set()
    cited: set[str] = set()
    parts = []
    for entry in entries:
        pieces = result_latex(entry.variant, entry.result, style)
        legend += pieces.legend
        lemmas.update(pieces.lemmas)
        keys = variant_citations(entry.variant)
        cited.update(keys)
        claims_text, claim_keys = _claims_latex(entry, style)
        cited.update(claim_keys)
        parts.append("\\subsection{%s}\\label{%s}\n" % (
            escape_text(entry.variant.title[:1].upper() + entry.variant.title[1:]),
            style.label("sec", _key(entry)))
            + _opening(entry, keys)
            + pieces.body + "\n" + _regimes_latex(entry, style) + "\n" + claims_text)
    names = ", ".join(_name(entry) for entry in entries)
    head = ("\\section{%s}\\label{%s}\n" % (text_to_latex(title), style.label("sec", "lipbound"))
            + "The bounds below were derived and proved by lipbound for %s; every step of every proof is "
              "recorded, and the lemmas the proofs cite are stated in Section~\\ref{%s}.\n"
            % (names, style.label("sec", "lemmas"))
            + "\\paragraph{Symbols.}\n" + legend_latex(list(dict.fromkeys(legend))))
    body = head + "\n".join(parts)
    if figure is not None:
        body += ("\n\\subsection{On a real head}\\label{%s}\n" % style.label("sec", "real-head")
                 + _figure_latex(figure, style))
    body += "\n\\subsection{Lemmas}\\label{%s}\n" % style.label("sec", "lemmas") + lemma_appendix(sorted(lemmas), style)
    return sloppy(body), cited


def _user_defined(entry: PaperEntry) -> bool:
    return isinstance(getattr(entry.variant, "score", None), CustomScore)


def _name(entry: PaperEntry) -> str:
    """How the section's first sentence names a variant: its key, or a user-defined score as such."""
    if _user_defined(entry):
        return "self-attention with a user-defined score"
    return r"\texttt{%s}" % escape_text(entry.key)


def _opening(entry: PaperEntry, keys) -> str:
    """The subsection's first sentence: the variant's key and its papers, or a user-defined score's formula."""
    if _user_defined(entry):
        return ("The score is $s(x, y) = %s$, a function of the query $W_Q^\\top x$ and the key $W_K^\\top y$%s.\n"
                % (latex(entry.variant.score.expression()), cite(keys)))
    return "The variant \\texttt{%s}%s.\n" % (escape_text(entry.key), cite(keys))


def paper_files(entries: list[PaperEntry], style: TexStyle = PAPER, figure: ScalingFigure | None = None,
                title: str = "Lipschitz bounds") -> dict[str, str]:
    """``{file name: text}`` of the section, the preamble lines, the bibliography and the standalone
    article (see the module docstring)."""
    section, cited = paper_section(entries, style, figure, title)
    header = "% Generated by lipbound. \\input it after \\input{lipbound-preamble} in the preamble.\n"
    main = (document_preamble(style) + "\\title{%s}\n\\author{}\n\\date{}\n\\begin{document}\n\\maketitle\n\n"
            "\\input{%s}\n\n" % (text_to_latex(title), SECTION_FILE[:-4])
            + ("\\bibliographystyle{plain}\n\\bibliography{%s}\n" % BIB_FILE[:-4] if cited else "")
            + "\\end{document}\n")
    files = {SECTION_FILE: header + section, PREAMBLE_FILE: preamble_lines(style), MAIN_FILE: main}
    if cited:
        files[BIB_FILE] = bibtex(cited)
    return files

