"""Printing: lipbound's symbolic results as LaTeX.

* :mod:`~lipbound.printing.latex` -- :class:`LipboundLatexPrinter` (a SymPy ``LatexPrinter`` with
  one ``_print_<Class>`` per lipbound node) and :func:`latex`;
* :mod:`~lipbound.printing.prose` -- ASCII mathematics in justifications, as LaTeX;
* :mod:`~lipbound.printing.layout` -- widths and line breaking of displayed formulas;
* :mod:`~lipbound.printing.derivation` -- derivation records as ``align*`` proofs, lemma appendices;
* :mod:`~lipbound.printing.document` -- a bound as a section, standalone articles, comparison tables;
* :mod:`~lipbound.printing.style` -- environment prefixes, label keys, line length, preambles;
* :mod:`~lipbound.printing.setting`, :mod:`~lipbound.printing.legend` -- assumptions as mathematics,
  symbol legends;
* :mod:`~lipbound.printing.theorem` -- a result as assumption, proposition, theorem, corollary and
  proofs (what ``derive --proof`` prints);
* :mod:`~lipbound.printing.paper`, :mod:`~lipbound.printing.bibliography`,
  :mod:`~lipbound.printing.numbers` -- paper sections, BibTeX, directed rounding;
* :mod:`~lipbound.printing.figures` -- figures at column width from plain data (matplotlib);
* :mod:`~lipbound.printing.proof_files` -- the generator of the repository's ``proofs/``
  (``lipbound proofs DIR``), not imported here.
"""

from .derivation import derivation_to_latex, lemma_appendix
from .document import bound_section, comparison_table, standalone
from .latex import LipboundLatexPrinter, latex
from .prose import text_to_latex

__all__ = ["LipboundLatexPrinter", "latex", "derivation_to_latex", "lemma_appendix", "text_to_latex",
           "bound_section", "standalone", "comparison_table"]
