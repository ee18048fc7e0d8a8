"""Design guidance: which heads, norms, blocks and tokens make a model irregular, and what to change.

* :mod:`.diagnosis` -- per component the certified constant, witness and share of log10 of the
  whole-model bound (the whole-model verification), local constants on the text, and the measured
  movement of real token edits layer by layer;
* :mod:`.mismatch` -- the regularity mismatch of tokens: movement of the contextual embeddings over
  the distance of the input embeddings, for substitutions at a position;
* :mod:`.interventions` -- edits of a copy of the weights; :mod:`.checkpoint` -- the edited
  checkpoints on disk, read back by the one loader;
* :mod:`.function` -- the functional cost of an edit on real text;
* :mod:`.report` -- the certified bound before and after each edit, ranked by certified reduction
  per unit of functional cost; tables, JSON, LaTeX.

This layer sits above :mod:`lipbound.measures` (it composes the existing certified routes and the
one float engine); only the CLI imports it.
"""
