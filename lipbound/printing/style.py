r"""Where lipbound's LaTeX goes: environment names, label keys, the preamble, and the room on a line.

A :class:`TexStyle` says how the output meets the document it is pasted into:

* ``prefix`` names lipbound's amsthm environments and labels (``lbtheorem``, ``lblemma``,
  ``\label{lb:lem:jensen}``) so that they never clash with the author's own ``theorem`` or
  ``lem:...``; the generated ``proofs/`` use no prefix (:data:`PROOFS`);
* ``text_width`` and ``font_size`` give the line length in points, from which the layout
  (:mod:`lipbound.printing.layout`) takes the room for a displayed formula and for a derivation
  row beside its justification.  The default is a plain ``\documentclass{article}`` (10pt, a text
  width of 345pt).

:func:`preamble_lines` is what ``lipbound preamble`` prints: packages and environments only, no
``\documentclass`` and no page geometry, so that it can go into any LaTeX preamble.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, final

from ..errors import AssumptionError

__all__ = ["TexStyle", "PROOFS", "PAPER", "ENVIRONMENTS", "preamble_lines", "document_preamble", "MIN_TEXT_WIDTH"]

#: lipbound's theorem-like environments: (kind, printed name, amsthm style).
ENVIRONMENTS: Final = (("theorem", "Theorem", "plain"), ("proposition", "Proposition", "plain"),
                       ("corollary", "Corollary", "plain"), ("lemma", "Lemma", "plain"),
                       ("assumption", "Assumption", "definition"))
#: Narrower lines leave no room for a derivation beside its justifications.
MIN_TEXT_WIDTH: Final = 300.0
#: Font size (pt) the width estimates of :func:`lipbound.printing.layout.visual_width` are made for.
_ESTIMATE_FONT: Final = 11.0
#: Room the justification box (0.28 of the line) and the column gaps take, as a fraction and in points.
_BOX_FRACTION, _GAPS = 0.28, 30.0
_DISPLAY_MARGIN = 32.0
#: The width estimates run short by up to a tenth on tall formulas (fractions, sized delimiters):
#: a line is filled to this share of the room.
_SAFETY = 0.92
#: Text width of the standard article class at each font size, in points.
_ARTICLE_WIDTH: Final = {10.0: 345.0, 11.0: 360.0, 12.0: 390.0}


@final
@dataclass(frozen=True)
class TexStyle:
    """Environment prefix and line length of the LaTeX lipbound writes.

    Parameters
    ----------
    prefix : str
        Letters put before lipbound's environment names and label keys; ``""`` for the
        repository's own ``proofs/``.
    text_width : float
        ``\textwidth`` of the target document in points (345 for a plain 10pt article).
    font_size : float
        Its body font size in points (10, 11 or 12).
    """

    prefix: str = "lb"
    text_width: float = 345.0
    font_size: float = 10.0

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z]*", self.prefix):
            raise AssumptionError("prefix", "letters only (it names LaTeX environments)", repr(self.prefix),
                                  "use e.g. lb")
        if not self.text_width >= MIN_TEXT_WIDTH:
            raise AssumptionError("text_width", f"a text width of at least {MIN_TEXT_WIDTH:g}pt",
                                  f"{self.text_width:g}pt", "use a single-column width, e.g. 345 (article)")
        if self.font_size not in (10.0, 11.0, 12.0):
            raise AssumptionError("font_size", "10, 11 or 12 (pt)", repr(self.font_size), "use the document's size")

    def env(self, kind: str) -> str:
        """``lbtheorem`` for ``theorem``."""
        return self.prefix + kind

    def label(self, kind: str, key: str) -> str:
        """``lb:lem:jensen`` for ``("lem", "jensen")``; ``lem:jensen`` without a prefix."""
        key = re.sub(r"[^A-Za-z0-9:-]+", "-", key).strip("-")
        return f"{self.prefix}:{kind}:{key}" if self.prefix else f"{kind}:{key}"

    @property
    def _units(self) -> float:
        """The line length in the units of :func:`~lipbound.printing.layout.visual_width`."""
        return self.text_width * _ESTIMATE_FONT / self.font_size

    @property
    def display_width(self) -> float:
        """Room for a displayed formula."""
        return round((self._units - _DISPLAY_MARGIN) * _SAFETY)

    @property
    def claim_width(self) -> float:
        """Room for a derivation row (left side, relation, right side) beside its justification."""
        return round((self._units * (1 - _BOX_FRACTION) - _GAPS) * _SAFETY)


#: The generated ``proofs/``: no prefix, an 11pt article with 2.2cm margins on A4.
PROOFS: Final = TexStyle(prefix="", text_width=472.0, font_size=11.0)
#: Fragments and paper sections: prefixed environments, a plain 10pt article.
PAPER: Final = TexStyle()


def preamble_lines(style: TexStyle = PAPER) -> str:
    r"""Packages and environments lipbound's LaTeX needs: amsmath, amssymb, amsthm, mathtools
    (``\coloneqq``), array, booktabs and graphicx (tables and figures of a paper section), the prefixed
    theorem environments, and ``\allowdisplaybreaks`` (long derivations break across pages).

    No ``\documentclass`` and no page geometry: the lines go into any preamble, after the author's
    own packages."""
    lines = [r"\usepackage{amsmath,amssymb,amsthm,mathtools}", r"\usepackage{array,booktabs,graphicx}"]
    counter, current = style.env("theorem"), None
    for kind, name, theorem_style in ENVIRONMENTS:
        if theorem_style != current:
            lines.append(r"\theoremstyle{%s}" % theorem_style)
            current = theorem_style
        if kind == "theorem":  # proofs/ number theorems within sections
            lines.append(r"\newtheorem{%s}{%s}%s" % (counter, name, "" if style.prefix else "[section]"))
        elif kind == "lemma" and not style.prefix:  # proofs/ state their lemmas in an appendix
            lines.append(r"\newtheorem{%s}{%s}" % (style.env(kind), name))
        else:
            lines.append(r"\newtheorem{%s}[%s]{%s}" % (style.env(kind), counter, name))
    lines += [r"\theoremstyle{plain}", r"\allowdisplaybreaks"]
    return "\n".join(lines) + "\n"


def document_preamble(style: TexStyle = PAPER) -> str:
    r"""A standalone article whose line length is the style's: ``\documentclass``, geometry when
    the width is not the class's own, :func:`preamble_lines`, and paragraph settings."""
    size = "" if style.font_size == 10.0 else "[%dpt]" % style.font_size
    lines = [r"\documentclass%s{article}" % size]
    if style.text_width != _ARTICLE_WIDTH[style.font_size]:
        lines.append(r"\usepackage[a4paper,textwidth=%gpt,vmargin=2.2cm]{geometry}" % style.text_width)
    lines.append(preamble_lines(style).rstrip("\n"))
    lines += [r"\setlength{\emergencystretch}{3em}", r"\setlength{\parindent}{0pt}",
              r"\setlength{\parskip}{0.5ex plus 0.2ex}"]
    return "\n".join(lines) + "\n"
