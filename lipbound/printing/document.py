r"""Whole LaTeX documents: a bound with its proof, standalone articles, comparison tables.

* :func:`bound_section` -- a :class:`~lipbound.symbolic.bound.Bound` (or
  :class:`~lipbound.symbolic.bound.NotLipschitz`) as a section: the statement
  :math:`\operatorname{Lip}(f) \le \ldots` in an equation, the assumptions, the proof.
* :func:`standalone` -- a complete ``article`` around a body, with the packages it needs and an
  appendix stating every lemma the body cites (so that no reference is undefined).
* :func:`comparison_table` -- a ``tabular`` of derived against published bounds.
"""

from __future__ import annotations

import functools
import math
import re
import shutil
import subprocess
from numbers import Number

import sympy as sp

from ..errors import AssumptionError
from ..symbolic.assumptions import NORMS
from ..symbolic.bound import Bound, NotLipschitz
from ..symbolic.record import Described
from .derivation import derivation_to_latex, lemma_appendix
from .latex import LipboundLatexPrinter
from .layout import DISPLAY_WIDTH, SpreadNames, split_expression, visual_width
from .prose import escape_text, text_to_latex
from .setting import assumption_list
from .style import PROOFS, TexStyle, document_preamble

__all__ = ["bound_section", "standalone", "comparison_table", "comparison_latex", "statement_latex", "preamble",
           "DOMAIN_TITLES", "has_booktabs"]

#: How a domain key reads in a title.
DOMAIN_TITLES = {"ball": "tokens in a ball", "layernorm": "tokens in the image of a LayerNorm",
                 "rmsnorm": "tokens in the image of an RMSNorm",
                 "unbounded": "unbounded domain", "variance-floor": "tokens with a variance floor"}

_LIP = Described(r"\operatorname{Lip}(f)")
_QUAD, _RELATION = 11.0, 15.5  # points taken by \quad and by a relation symbol


@functools.lru_cache(maxsize=1)
def has_booktabs() -> bool:
    """Whether ``booktabs.sty`` is installed (asked of ``kpsewhich``; False without TeX)."""
    kpsewhich = shutil.which("kpsewhich")
    if kpsewhich is None:
        return False
    try:
        found = subprocess.run([kpsewhich, "booktabs.sty"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return found.returncode == 0 and bool(found.stdout.strip())


def preamble(style: TexStyle = PROOFS) -> str:
    r"""The preamble of lipbound's standalone documents (:func:`~lipbound.printing.style.document_preamble`):
    an article of the style's line length with amsmath, amssymb, amsthm, mathtools, booktabs,
    graphicx, the theorem environments and ``\allowdisplaybreaks`` (long proofs span pages)."""
    return document_preamble(style)


def _where_lines(spreads: SpreadNames, printer, width: float) -> list[str]:
    rows = []
    for spread, name in spreads.names.items():
        head = r"\text{where } %s \coloneqq " % printer.doprint(name)
        lines = split_expression(spread, width - 2 * _QUAD, printer, first=width - visual_width(head))
        rows.append("&" + head + lines[0])
        rows += [r"&\qquad " + line for line in lines[1:]]
    return rows


def statement_latex(expr, relation: str = r"\le", lhs=_LIP, width: float = DISPLAY_WIDTH) -> str:
    r"""A displayed statement ``lhs <relation> expr`` (an ``equation*`` with ``split``), broken
    into lines when long; long spreads inside :math:`\kappa_n` are named :math:`\bar\omega`
    and defined on a ``where`` line."""
    printer = LipboundLatexPrinter()
    spreads = SpreadNames()
    for spread in sorted(spreads.wanted(expr), key=sp.default_sort_key):
        spreads.name(spread)
    shown = spreads.apply(expr)
    left = printer.doprint(lhs)
    room = width - visual_width(left) - _RELATION
    lines = split_expression(shown, room - _QUAD, printer, first=room)
    rows = [f"{left} &{relation} {lines[0]}"] + [r"&\quad " + line for line in lines[1:]]
    rows += _where_lines(spreads, printer, width)
    return "\\begin{equation*}\n\\begin{split}\n" + "\\\\\n".join(rows) + "\n\\end{split}\n\\end{equation*}\n"


def _label(*parts: str) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9]+", "-", part).strip("-") for part in parts)


def _norm_title(result) -> str:
    norm = NORMS.get(result.norm)
    return norm.title if norm is not None else str(result.norm)


def bound_section(result, level: str = "section", style: TexStyle = PROOFS) -> str:
    r"""A result as a LaTeX section: title, statement, assumptions (a mathematical list), proof.

    Parameters
    ----------
    result : Bound or NotLipschitz
        From ``variant(name).derive(Assumptions(...), name)``.
    level : {"section", "subsection", "subsubsection"}
        Sectioning command of the title.
    style : TexStyle
        Lemma labels and line length (default: the repository's ``proofs/``).

    Returns
    -------
    str
        For a :class:`Bound`: the statement :math:`\operatorname{Lip}(f) \le` ``result.expr``;
        for :class:`NotLipschitz`: :math:`\operatorname{Lip}(f) = \infty` with the witness curve
        :math:`X_t` and the growing Jacobian entry.  Needs :func:`preamble`; lemma references
        resolve in :func:`standalone`.
    """
    if level not in ("section", "subsection", "subsubsection"):
        raise AssumptionError("level", "'section', 'subsection' or 'subsubsection'", repr(level),
                              "choose a sectioning level")
    if not isinstance(result, (Bound, NotLipschitz)):
        raise AssumptionError("result", "a Bound or NotLipschitz", type(result).__name__,
                              "pass the result of variant(name).derive(Assumptions(...), name)")
    width = style.display_width
    domain = DOMAIN_TITLES.get(result.domain, result.domain)
    title = f"{escape_text(result.variant)}: {text_to_latex(_norm_title(result))}, {escape_text(domain)}"
    label = _label("bound", result.variant, result.norm, result.domain)
    out = [f"\\{level}{{{title}}}\\label{{sec:{label}}}\n"]
    if isinstance(result, Bound):
        out.append("In the %s on $X$, the map $f$ satisfies\n" % text_to_latex(_norm_title(result)))
        out.append(statement_latex(result.expr, width=width))
        if result.provenance != "derived":
            out.append("Provenance: %s.\n" % escape_text(result.provenance))
    else:
        out.append("The map $f$ is not Lipschitz on the unbounded domain: along the curve\n")
        out.append(statement_latex(result.family, relation="=", lhs=Described("X_t"), width=width))
        out.append("(in the instance %s) an entry of the Jacobian grows without bound,\n"
                   % text_to_latex(result.instance))
        out.append(statement_latex(result.growth, relation="=",
                                   lhs=Described(r"\partial f / \partial x \,(X_t)"), width=width))
        out.append("so $\\operatorname{Lip}(f) = \\infty$ in every norm on $X$.\n")
    out.append("\\paragraph{Assumptions.}\n" + assumption_list(result, result.record.hypotheses))
    out.append("\\begin{proof}\n" + derivation_to_latex(result.record, hypotheses=False, style=style)
               + "\\end{proof}\n")
    return "\n".join(out)


_LEMMA_REFERENCE = re.compile(r"\\ref\{((?:[A-Za-z]+:)?lem:[^{}]+)\}")


def standalone(body: str, title: str, style: TexStyle = PROOFS) -> str:
    r"""A complete ``article``: :func:`preamble`, ``title``, ``body`` and an appendix with every
    lemma the body cites (``\ref{lem:<id>}``) that it does not state itself.

    ``title`` is prose (ASCII mathematics allowed, see :func:`~lipbound.printing.prose.text_to_latex`).
    """
    if not isinstance(body, str) or not isinstance(title, str):
        raise AssumptionError("body, title", "two strings", f"{type(body).__name__}, {type(title).__name__}",
                              "pass the LaTeX body and a plain-text title")
    cited = set(_LEMMA_REFERENCE.findall(body))
    stated = set(re.findall(r"\\label\{((?:[A-Za-z]+:)?lem:[^{}]+)\}", body))
    missing = sorted(label.rsplit(":", 1)[1] for label in cited - stated)
    appendix = ""
    if missing:
        appendix = "\\appendix\n\\section{Lemmas}\n\\sloppy\n" + lemma_appendix(missing, style)
    return (preamble(style)
            + "\\title{%s}\n\\author{lipbound}\n\\date{}\n" % text_to_latex(title)
            + "\\begin{document}\n\\maketitle\n\n" + body.rstrip("\n") + "\n\n" + appendix
            + "\\end{document}\n")


def _cell(value, printer) -> str:
    if value is None:
        return "--"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, sp.Basic):
        return "$" + printer.doprint(value) + "$"
    if isinstance(value, Number):
        number = float(value)
        if isinstance(value, int) or (number.is_integer() and abs(number) < 1e15):
            return "$%d$" % int(number)
        if not math.isfinite(number):
            return r"$\infty$" if number > 0 else (r"$-\infty$" if number < 0 else "NaN")
        mantissa, _, exponent = ("%.6g" % number).partition("e")
        if exponent:
            return r"$%s \times 10^{%d}$" % (mantissa, int(exponent))
        return "$%s$" % mantissa
    if isinstance(value, str):
        return escape_text(value)
    raise AssumptionError("rows", "cells that are SymPy expressions, numbers, strings or None",
                          type(value).__name__, "convert the value to one of these first")


def comparison_table(rows: list[dict], columns: list[tuple[str, str]], booktabs: bool | None = None) -> str:
    r"""A ``tabular`` of derived against published bounds.

    Parameters
    ----------
    rows : list of dict
        One dict per row; ``row[key]`` is a SymPy expression (printed in math mode), a number
        (6 significant digits), a string (escaped prose) or None/missing (printed ``--``).
    columns : list of (key, header)
        Which keys to show, in order, and their headers (prose).
    booktabs : bool, optional
        Use ``\toprule``/``\midrule``/``\bottomrule``; by default when ``booktabs.sty`` is installed
        (:func:`has_booktabs`), else ``\hline``.

    Returns
    -------
    str
        ``\begin{tabular}{l...l} ... \end{tabular}``.
    """
    if not columns or not all(isinstance(c, tuple) and len(c) == 2 for c in columns):
        raise AssumptionError("columns", "a non-empty list of (key, header) pairs", repr(columns)[:80],
                              "e.g. [('variant', 'Variant'), ('derived', 'Derived bound')]")
    if not all(isinstance(row, dict) for row in rows):
        raise AssumptionError("rows", "a list of dicts", repr(rows)[:80], "give one dict per row")
    booktabs = has_booktabs() if booktabs is None else booktabs
    top, middle, bottom = (r"\toprule", r"\midrule", r"\bottomrule") if booktabs else (r"\hline",) * 3
    printer = LipboundLatexPrinter()
    lines = ["\\begin{tabular}{%s}" % ("l" * len(columns)), top,
             " & ".join(escape_text(header) for _, header in columns) + r" \\", middle]
    for row in rows:
        lines.append(" & ".join(_cell(row.get(key), printer) for key, _ in columns) + r" \\")
    lines += [bottom, "\\end{tabular}"]
    return "\n".join(lines) + "\n"




def comparison_latex(rows) -> str:
    """The table of derived bounds against published claims
    (:func:`lipbound.symbolic.claim_table.comparison_rows`), with the provenance tag of every claim."""
    columns = [("claim", "Claim"), ("tag", "Tag"), ("norm", "Norm"), ("domain", "Domain"),
               ("published", "Published bound"), ("relation", "Relation to the derived bound")]
    return comparison_table([row.as_dict() for row in rows], columns)
