r"""Derivation records as LaTeX proofs.

A :class:`~lipbound.symbolic.record.Derivation` becomes the hypotheses as an ``itemize`` and one
``align*`` environment, one row per step::

    lhs &\le rhs && \parbox[t]{0.28\textwidth}{\raggedright\small justification (Lemma~\ref{lem:id})}\\

Relations align at their relation symbol; long right-hand sides are broken by
:mod:`lipbound.printing.layout`; justifications go through :mod:`lipbound.printing.prose`.
The output needs ``amsmath`` and ``mathtools`` (for ``\coloneqq``) and is meant for a ``proof``
environment; :func:`lipbound.printing.document.standalone` provides the preamble.
"""

from __future__ import annotations

import re

import sympy as sp

from ..errors import AssumptionError
from ..symbolic import symbols as S
from ..symbolic.lemmas import LEMMAS
from ..symbolic.record import Derivation, Described, Sides, VectorSum
from .latex import LipboundLatexPrinter
from .layout import POINTS, SpreadNames, pack_lines, split_expression, visual_width
from .prose import escape_text, text_to_latex
from .style import PROOFS, TexStyle

__all__ = ["derivation_to_latex", "lemma_appendix", "cited_lemmas", "claim_rows", "hypotheses_latex",
           "justification_latex"]

_JUSTIFICATION_BOX = r"\parbox[t]{0.28\textwidth}{\raggedright\small %s}"
#: A left side wider than this share of a row goes on a line of its own.
_LEFT_SHARE = 0.34
#: The least room a right side is given, in points.
_MIN_ROOM = 120.0

# --------------------------------------------------------------------------------------------
_RELATION_TEX = {"==": "=", "<=": r"\le", ">=": r"\ge", "<": "<", ">": ">", "!=": r"\ne"}
_STRING_RELATIONS = re.compile(r"\\simeq|\\le(?![A-Za-z])|\\ge(?![A-Za-z])|(?<![:\\])=")


def _split_string_claim(text: str) -> tuple[str, str, str]:
    """``"Df_i[E] = ..." -> ("Df_i[E]", "=", "...")`` at the first top-level relation, else ("", "", text)."""
    depth = 0
    index = 0
    while index < len(text):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif depth == 0:
            match = _STRING_RELATIONS.match(text, index)
            if match and index > 0:
                return text[:index].strip(), match.group(), text[match.end():].strip()
        index += 1
    return "", "", text


def _split_string(text: str, width: float, first: float | None = None) -> list[str]:
    """Break a LaTeX string at top-level ``,\\ `` separators and ``+``/``-`` signs (outside
    braces, brackets, ``\\left``/``\\right`` pairs and norm bars)."""
    first = width if first is None else first
    if visual_width(text) <= first:
        return [text]
    pieces, depth, in_norm, start, index = [], 0, False, 0, 0
    while index < len(text):
        char = text[index]
        if text.startswith(r"\|", index):
            in_norm = not in_norm
            index += 2
            continue
        if text.startswith(r"\left", index):
            depth += 1
        elif text.startswith(r"\right", index):
            depth -= 1
        elif char in "{([":
            depth += 1
        elif char in "})]":
            depth -= 1
        top = depth == 0 and not in_norm
        if top and text.startswith(r",\ ", index):
            pieces.append([text[start:index + 1].strip() + r"\ "])  # keep the author's space
            start = index + 3
            index += 3
            continue
        if top and char in "+-" and index > 0 and text[index - 1] == " ":
            pieces.append([text[start:index].strip()])
            start = index
        index += 1
    pieces.append([text[start:].strip()])
    pieces = [[("{}" + p[0]) if p[0][:1] in "+-" else p[0]] for p in pieces if p[0]]
    lines = pack_lines(pieces, width, first)
    return [re.sub(r",\\\s*$", ",", line) for line in lines]  # no forced space before a line break


def _claim_parts(claim, spreads: SpreadNames, printer) -> tuple[object, str, object]:
    """(left side, relation LaTeX, right side) of a claim; sides are SymPy objects or LaTeX strings."""
    if isinstance(claim, sp.core.relational.Relational):
        return spreads.apply(claim.lhs), _RELATION_TEX[claim.rel_op], spreads.apply(claim.rhs)
    if isinstance(claim, Sides):
        return spreads.apply(claim.lhs), claim.relation, spreads.apply(claim.rhs)
    text = claim.name if isinstance(claim, sp.Symbol) else (claim if isinstance(claim, str) else printer.doprint(claim))
    left, relation, right = _split_string_claim(text)
    return left, relation, right


def _side_lines(side, width: float, printer, first: float | None = None) -> list[str]:
    if isinstance(side, (VectorSum, Described)):  # broken at its top-level signs, like text
        side = printer.doprint(side)
    if isinstance(side, str):
        return _split_string(side, width, first)
    return split_expression(side, width, printer, first=first)


def _side_tex(side, printer) -> str:
    return side if isinstance(side, str) else printer.doprint(side)


def claim_rows(claim, spreads: SpreadNames, printer: LipboundLatexPrinter | None = None,
               width: float = PROOFS.claim_width, left_width: float | None = None) -> list[str]:
    r"""The ``align*`` cells of one claim: ``["lhs &\le rhs1", "&\quad {}+ rhs2", ...]``.

    A long spread defined by the claim (``\omega \le X``) is named here: the row reads
    ``\omega &\le \bar\omega \coloneqq X`` and later claims write :math:`\bar\omega`.
    """
    printer = printer or LipboundLatexPrinter()
    left, relation, right = _claim_parts(claim, spreads, printer)
    left_tex = _side_tex(left, printer)
    prefix = ""
    if isinstance(claim, sp.core.relational.Relational) and claim.lhs == S.omega and \
            claim.rel_op in ("<=", "==") and claim.rhs in spreads.pending:
        prefix = printer.doprint(spreads.name(claim.rhs)) + r" \coloneqq "
    left_room = left_width if left_width is not None else visual_width(left_tex)
    if relation and visual_width(left_tex) > max(left_room, _LEFT_SHARE * width):
        # a wide left side takes a line of its own in the right column; the relation starts the next
        room = max(width - left_room - POINTS["quad"] - POINTS["relation"], _MIN_ROOM)
        lines = _side_lines(right, room - POINTS["quad"], printer, first=room - visual_width(prefix))
        return [f"&{left_tex}", rf"&\quad {relation} {prefix}{lines[0]}"] + [r"&\qquad " + line for line in lines[1:]]
    room = max(width - left_room - POINTS["relation"], _MIN_ROOM)
    lines = _side_lines(right, room - POINTS["quad"], printer, first=room - visual_width(prefix))
    lines[0] = prefix + lines[0]
    relation_cell = f"&{relation} " if relation else "& "
    rows = [f"{left_tex} {relation_cell}{lines[0]}".strip()]
    rows += [r"&\quad " + line for line in lines[1:]]
    return rows


def justification_latex(justification: str, lemma: str | None, style: TexStyle = PROOFS) -> str:
    """The justification in prose, with ``(Lemma~\\ref{lem:id})`` when a lemma is cited."""
    text = text_to_latex(justification) if justification else ""
    if lemma:
        _require_lemma(lemma)
        reference = r"(Lemma~\ref{%s})" % style.label("lem", lemma)
        text = (text + " " + reference).strip()
    return text


def _require_lemma(lemma: str) -> None:
    if lemma not in LEMMAS:
        raise AssumptionError("lemma", "an id defined in lipbound.symbolic.lemmas.LEMMAS", repr(lemma),
                              "add the lemma's title and statement to LEMMAS, or cite an existing one")


def hypotheses_latex(hypotheses) -> str:
    """An ``itemize`` of hypotheses (ASCII mathematics converted), or "" when there are none."""
    if not hypotheses:
        return ""
    items = "\n".join(r"  \item " + text_to_latex(text) for text in hypotheses)
    return "\\begin{itemize}\n" + items + "\n\\end{itemize}\n"


def derivation_to_latex(record: Derivation, hypotheses: bool = True,
                        spreads: SpreadNames | None = None, style: TexStyle = PROOFS) -> str:
    r"""A derivation as LaTeX: its hypotheses as an ``itemize``, then one ``align*``, a row per step.

    Parameters
    ----------
    record : Derivation
        Title, hypotheses and steps (claims are SymPy relations or LaTeX strings).
    hypotheses : bool
        Whether to print the hypotheses (a caller that states them in a theorem omits them).
    spreads : SpreadNames, optional
        Names of long spreads shared with the caller (so that a statement printed after the
        proof can use the same :math:`\bar\omega`).
    style : TexStyle
        Label keys of the cited lemmas and the line length (default: the repository's ``proofs/``).

    Returns
    -------
    str
        LaTeX for use inside a ``proof`` environment (needs amsmath and mathtools).
    """
    if not isinstance(record, Derivation):
        raise AssumptionError("record", "a lipbound.symbolic.record.Derivation", type(record).__name__,
                              "pass result.record of a Bound or NotLipschitz")
    printer = LipboundLatexPrinter()
    spreads = spreads if spreads is not None else SpreadNames()
    spreads.expect(step.claim for step in record.steps)
    out = []
    if hypotheses and record.hypotheses:
        out.append("Hypotheses:\n" + hypotheses_latex(record.hypotheses))
    if not record.steps:
        return "".join(out)
    left_width = _common_left_width(record, printer, style.claim_width)
    rows = []
    for step in record.steps:
        cells = claim_rows(step.claim, spreads, printer, style.claim_width, left_width)
        why = justification_latex(step.justification, step.lemma, style)
        # beside the relation: after a left side that took a line of its own, that is the second row
        at = 1 if len(cells) > 1 and cells[0].startswith("&") and not cells[0].startswith(r"&\quad") else 0
        if why:
            cells[at] += " && " + _JUSTIFICATION_BOX % why
        rows.append("\\\\\n".join(cells))
    out.append("\\begin{align*}\n" + "\\\\\n".join(rows) + "\n\\end{align*}\n")
    return "".join(out)


def _common_left_width(record: Derivation, printer, width: float) -> float:
    """All left sides share one column: the widest one sets the room left for right sides (left
    sides wider than :data:`_LEFT_SHARE` of the row go on a line of their own and do not count)."""
    widths = [0.0]
    for step in record.steps:
        left, _, _ = _claim_parts(step.claim, SpreadNames(), printer)
        widths.append(visual_width(_side_tex(left, printer)))
    return max(w for w in widths if w <= _LEFT_SHARE * width)


def cited_lemmas(*records: Derivation) -> list[str]:
    """Sorted ids of the lemmas cited by the records."""
    return sorted({step.lemma for record in records for step in record.steps if step.lemma})


def lemma_appendix(ids, style: TexStyle = PROOFS) -> str:
    r"""One ``\begin{lemma}[title]\label{lem:<id>}`` per lemma id (sorted, each once), with its statement
    (environment and label prefixed by ``style``).

    Raises
    ------
    AssumptionError
        If an id is not in :data:`lipbound.symbolic.lemmas.LEMMAS`.
    """
    blocks = []
    for lemma in sorted(set(ids)):
        _require_lemma(lemma)
        title, statement = LEMMAS[lemma]
        env = style.env("lemma")
        blocks.append("\\begin{%s}[%s]\\label{%s}\n%s\n\\end{%s}\n" % (
            env, escape_text(title), style.label("lem", lemma), statement, env))
    return "\n".join(blocks)
