"""Printing: lipbound's symbolic results as LaTeX.

* :mod:`~lipbound.printing.latex` -- :class:`LipboundLatexPrinter` (a SymPy ``LatexPrinter`` with
  one ``_print_<Class>`` per lipbound node) and :func:`latex`;
* :mod:`~lipbound.printing.proof` -- derivation records as ``align*`` proofs, lemma appendices;
* :mod:`~lipbound.printing.document` -- a bound as a section, standalone articles, comparison tables;
* :mod:`~lipbound.printing.proofs` -- the generator of ``proofs/`` (``python -m lipbound.printing.proofs
  proofs/``), not imported here.
"""

from .document import bound_section, comparison_table, standalone
from .latex import LipboundLatexPrinter, latex
from .proof import derivation_to_latex, lemma_appendix, text_to_latex

__all__ = ["LipboundLatexPrinter", "latex", "derivation_to_latex", "lemma_appendix", "text_to_latex",
           "bound_section", "standalone", "comparison_table"]
