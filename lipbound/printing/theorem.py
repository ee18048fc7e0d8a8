r"""One derived result as the statements and proofs of a paper.

For a bound on a bounded domain the derivation splits where the mathematics does:

1. an **assumption** (``lbassumption``): the domain, the norm, the sizes and facts, the score's
   hypotheses, as a mathematical list (:mod:`lipbound.printing.setting`);
2. a **proposition**: the constants of the score on that domain (``L_V``, ``rho``, ``alpha``,
   ``beta``, ``omega``, or the constants of sigmoid attention), with its proof;
3. the **theorem** that turns such constants into a Lipschitz bound, with its proof;
4. a **corollary**: the bound in weight norms, proved by substituting 2 into 3.

A global theorem (tied L2 attention on ``R^{n x d}``) is one theorem; a map that is not
Lipschitz is a theorem with its witness curve.  Every environment and label goes through the
:class:`~lipbound.printing.style.TexStyle` (``lbtheorem``, ``\label{lb:thm:...}``), and every
cited lemma is returned so that the caller states each once (:func:`lemma_appendix`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import sympy as sp

from ..symbolic import symbols as S
from ..symbolic.bound import Bound, NotLipschitz
from ..symbolic.record import Described, le
from .derivation import cited_lemmas, claim_rows, derivation_to_latex, hypotheses_latex, lemma_appendix
from .document import statement_latex
from .latex import LipboundLatexPrinter
from .layout import SpreadNames
from .legend import legend_entries, legend_latex
from .prose import escape_text, text_to_latex
from .setting import assumption_list
from .style import PAPER, TexStyle

__all__ = ["ResultLatex", "result_latex", "result_key", "proof_fragment", "symbols_paragraph"]

_NORM_NAMES = {"fro": "Frobenius norm", "2,1": "$(2,1)$ norm", "2,inf": r"$(2,\infty)$ norm",
               "inf": r"norm $\|\operatorname{vec} X\|_\infty$", "w1": "Wasserstein-1 distance"}


@final
@dataclass(frozen=True)
class ResultLatex:
    """The LaTeX of one result: ``body`` (environments and proofs), the ``labels`` it defines by
    role (``assumption``, ``proposition``, ``theorem``, ``corollary``), the lemmas it cites, and the
    legend entries of its statements."""

    body: str
    labels: dict
    lemmas: tuple[str, ...]
    legend: list = field(default_factory=list)


def result_key(result) -> str:
    """A stable label key: ``dot-product-fro-ball``."""
    return f"{result.variant}-{result.norm}-{result.domain}".replace(",", "")


def _environment(style: TexStyle, kind: str, title: str, label: str, body: str) -> str:
    env = style.env(kind)
    head = "\\begin{%s}%s\\label{%s}\n" % (env, f"[{title}]" if title else "", label)
    return head + body.rstrip("\n") + "\n\\end{%s}\n" % env


def _proof(text: str) -> str:
    return "\\begin{proof}\n" + text.rstrip("\n") + "\n\\end{proof}\n"


def _constant_rows(constants, style: TexStyle) -> str:
    printer = LipboundLatexPrinter()
    spreads = SpreadNames()
    rows = []
    for symbol, value in constants.as_substitution().items():
        relation = sp.Eq(symbol, value, evaluate=False) if symbol == S.L_V else le(symbol, value)
        rows += claim_rows(relation, spreads, printer, style.display_width, left_width=14.0)
    return "\\begin{align*}\n" + "\\\\\n".join(rows) + "\n\\end{align*}\n"


def result_latex(variant, result, style: TexStyle = PAPER) -> ResultLatex:
    """The statements and proofs of ``result`` (derived by ``variant``), see the module docstring."""
    key = result_key(result)
    labels = {role: style.label(short, key) for role, short in
              (("assumption", "asm"), ("proposition", "prop"), ("theorem", "thm"), ("corollary", "cor"))}
    width = style.display_width
    norm = _NORM_NAMES.get(result.norm, escape_text(result.norm))
    title = escape_text(variant.title[:1].upper() + variant.title[1:])
    if isinstance(result, NotLipschitz) or not result.constants:
        return _single_theorem(variant, result, style, labels, title, norm)
    constants = variant.kernel_constants(result.stated)
    theorem = variant.theorem(result.stated)
    out = [_environment(style, "assumption", title, labels["assumption"], _assumption_body(variant, result))]
    out.append(_environment(
        style, "proposition", "Constants of the %s" % text_to_latex(variant.score.title), labels["proposition"],
        "Under Assumption~\\ref{%s},\n%s" % (labels["assumption"], _constant_rows(constants, style))))
    out.append(_proof(derivation_to_latex(constants.record, hypotheses=False, style=style)))
    out.append(_environment(
        style, "theorem", text_to_latex(theorem.title), labels["theorem"],
        "Assume\n%sThen, in the %s,\n%s" % (hypotheses_latex(theorem.hypotheses), norm,
                                            statement_latex(theorem.statement, width=width))))
    out.append(_proof(derivation_to_latex(theorem.proof, hypotheses=False, style=style)))
    out.append(_environment(
        style, "corollary", "", labels["corollary"],
        "Under Assumption~\\ref{%s}, in the %s,\n%s" % (labels["assumption"], norm,
                                                       statement_latex(result.expr, width=width))))
    out.append(_proof("Substitute the constants of Proposition~\\ref{%s} into Theorem~\\ref{%s}: its bound "
                      "increases with each constant, and $\\kappa_n(\\omega)$ increases with $\\omega$."
                      % (labels["proposition"], labels["theorem"])))
    legend = legend_entries(result.expr, theorem.statement, variant.score.expression(),
                            *constants.as_substitution().values(), tied=variant.score.tied)
    return ResultLatex("\n".join(out), labels, tuple(cited_lemmas(constants.record, theorem.proof)), legend)


def _assumption_body(variant, result) -> str:
    hypotheses = list(variant.score.hypotheses()) if variant.score is not None else []  # a block has no score
    part = variant
    while part is not None:  # the mask and position biases of the head, under its wrappers
        mask = getattr(part, "mask", None)
        hypotheses += mask.hypotheses() if mask is not None else []
        part = getattr(part, "head", None) or getattr(part, "inner", None)
    return "The map $f$ is %s, and\n" % text_to_latex(variant.title) + assumption_list(result, hypotheses)


def _score_terms(variant) -> tuple:
    """The score expression for the legend (none for a block), and whether it is tied."""
    if variant.score is None:
        return (), False
    return (variant.score.expression(),), variant.score.tied


def _single_theorem(variant, result, style, labels, title, norm) -> ResultLatex:
    """A global bound in weight norms, or a map that is not Lipschitz, as one theorem."""
    width = style.display_width
    assumption = _environment(style, "assumption", title, labels["assumption"], _assumption_body(variant, result))
    if isinstance(result, Bound):
        statement = "Under Assumption~\\ref{%s} and\n%sin the %s,\n%s" % (
            labels["assumption"], hypotheses_latex(result.record.hypotheses), norm,
            statement_latex(result.expr, width=width))
        proof = derivation_to_latex(result.record, hypotheses=False, style=style)
        score, tied = _score_terms(variant)
        legend = legend_entries(result.expr, *score, tied=tied)
    else:
        statement = ("Under Assumption~\\ref{%s}, $f$ is not Lipschitz: along the curve\n%s"
                     "(in the instance %s) an entry of the Jacobian grows without bound,\n%s"
                     "so $\\operatorname{Lip}(f) = \\infty$ in every norm on $X$.\n") % (
            labels["assumption"], statement_latex(result.family, relation="=", lhs=Described("X_t"), width=width),
            text_to_latex(result.instance),
            statement_latex(result.growth, relation="=", lhs=Described(r"\partial f / \partial x \,(X_t)"),
                            width=width))
        proof = derivation_to_latex(result.record, hypotheses=False, style=style)
        score, tied = _score_terms(variant)
        legend = legend_entries(*score, tied=tied)
    body = assumption + _environment(style, "theorem", text_to_latex(result.record.title), labels["theorem"],
                                     statement) + _proof(proof)
    return ResultLatex(body, {k: v for k, v in labels.items() if k in ("assumption", "theorem")},
                       tuple(cited_lemmas(result.record)), legend)


def symbols_paragraph(entries) -> str:
    """The legend under a heading (empty without entries)."""
    return "\\paragraph{Symbols.}\n" + legend_latex(entries) if entries else ""


def proof_fragment(variant, result, style: TexStyle = PAPER) -> str:
    r"""What ``lipbound derive --proof`` prints: the statements and proofs of :func:`result_latex`, the
    symbol legend, and every cited lemma stated once, so that pasted after ``lipbound preamble`` into
    a plain article it compiles with every reference resolved."""
    parts = result_latex(variant, result, style)
    return sloppy(parts.body + "\n" + symbols_paragraph(parts.legend) + "\n" + lemma_appendix(parts.lemmas, style))


def sloppy(body: str) -> str:
    r"""``body`` in a group with ``\sloppy`` line breaking: long inline formulas of lemmas and
    assumptions move to the next line instead of running into the margin, and the author's own
    paragraphs outside the group keep their settings."""
    return "{\\sloppy\n" + body.rstrip("\n") + "\n\\par}\n"
