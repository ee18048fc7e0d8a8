"""Rows, tables and JSON of edit certificates (``lipbound perturb`` and ``lipbound local``).

One :class:`EditRow` per layer and edit size: the measured movement of the actual edit, the
certificates along its path and over its set, the worst edit found in the set, and the global
prediction for comparison (:mod:`lipbound.measures.perturb`).  :class:`EditReport` checks the chain

    measured <= predicted_path <= predicted_set,   measured <= predicted_set,   worst_witness <= predicted_set

in interval arithmetic, each float side widened by :data:`FLOAT_ALLOWANCE`: a comparison the allowance
cannot decide is "not certified", never a pass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import final

from ..printing.plaintext import legend_lines
from ..rigorous.intervals import Verdict, certify_le, interval

__all__ = ["FLOAT_ALLOWANCE", "EditRow", "EditReport", "CHECKS", "TABLE_LEGEND"]

#: Relative widening of float values before they are compared.  The float64 forward pass and the W1
#: assignment round at about 1e-13 relative on these sizes; 1e-6 is far above that.
FLOAT_ALLOWANCE = 1e-6

#: The comparisons every row is checked for: (name, smaller, larger).
CHECKS = (("measured <= predicted_path", "measured", "predicted_path"),
          ("predicted_path <= predicted_set", "predicted_path", "predicted_set"),
          ("measured <= predicted_set", "measured", "predicted_set"),
          ("worst_witness <= predicted_set", "worst_witness", "predicted_set"))


#: The columns of :meth:`EditReport.table`, for its legend.
TABLE_LEGEND = [
    ("layer", "the layer whose attention block outputs are compared, counted from 0"),
    ("k", "edited tokens"),
    ("measured", "W1 of this edit, computed exactly"),
    ("max token", "the largest movement ||z_i - z'_i|| of a token the edit keeps (or replaces)"),
    ("path", "certified W1 along this edit (predicted_path: the segment between the layer's two inputs)"),
    ("set", "certified W1 for every edit of the set (predicted_set: any candidate token in the edited slots)"),
    ("worst", "the largest W1 found over the set (worst_witness: a real edit, so at most set)"),
    ("global", "the global W1 constant of the block times the W1 of the layer's inputs (the prediction before "
               "local certificates)"),
    ("path/meas", "path / measured (1: the path certificate is exact)"),
    ("set/worst", "set / worst (1: the set certificate is attained)"),
]


@final
@dataclass(frozen=True)
class EditRow:
    """One layer and one edit size.

    Attributes
    ----------
    layer : int
        The layer (counted from 0) whose attention block outputs ``X + MHA(X)`` are compared.
    k : int
        Edited tokens.
    positions : tuple of int
        Where (token indices counted from 0; for insertions, the token the word goes before).
    n : int
        Tokens of the original sentence.
    measured : float
        Exact W1 between the block outputs of the sentence and of the edit.
    measured_max_token : float
        ``max ||z_i - z'_i||`` over tokens matched by the edit (unedited ones, and replaced ones).
    predicted_path : float
        Certified W1 along the segment between the layer's two inputs (:mod:`lipbound.local.path`).
    predicted_set : float
        Certified W1 for every edit of the set, from the embeddings on (:mod:`lipbound.local.propagate`).
    worst_witness : float
        The largest exact W1 found over the set (a real edit).
    global_ : float
        The global W1 constant of the block on the LayerNorm image times the W1 of the layer's inputs
        (JSON key ``global``).
    """

    layer: int
    k: int
    positions: tuple
    n: int
    measured: float
    measured_max_token: float
    predicted_path: float
    predicted_set: float
    worst_witness: float
    global_: float

    def to_json(self) -> dict:
        out = asdict(self)
        out["global"] = out.pop("global_")
        out["positions"] = list(self.positions)
        return {key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in out.items()}

    def verdict(self, smaller: str, larger: str) -> str:
        a, b = getattr(self, smaller), getattr(self, larger)
        if any(isinstance(v, float) and math.isnan(v) for v in (a, b)):
            return "not computed"
        if math.isinf(b):
            return "holds"
        allowance = interval((1 - FLOAT_ALLOWANCE, 1 + FLOAT_ALLOWANCE))
        answer = certify_le(interval(a) * allowance, interval(b) * allowance)
        return {Verdict.HOLDS: "holds", Verdict.FAILS: "violated"}.get(answer, "not certified")


@final
@dataclass(frozen=True)
class EditReport:
    """Rows of one sentence and one kind of edit, with what the set was and how it was searched."""

    sentence: str
    mode: str
    seed: int
    n: int
    tokens: tuple
    edits: dict
    rows: tuple
    edit_set: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)
    model: str = ""

    def counts(self) -> dict:
        """Per check: how many rows hold, are violated, are not certified."""
        out = {}
        for name, smaller, larger in CHECKS:
            verdicts = [row.verdict(smaller, larger) for row in self.rows]
            out[name] = {key: verdicts.count(key) for key in ("holds", "violated", "not certified", "not computed")}
        return out

    @property
    def violations(self) -> int:
        """Rows where a certified bound is refuted (measured or the witness above it)."""
        return sum(row.verdict(smaller, larger) == "violated" for row in self.rows
                   for name, smaller, larger in CHECKS if name != "predicted_path <= predicted_set")

    @property
    def orderings_broken(self) -> int:
        """Rows whose path certificate exceeds the set certificate (both bound the same edit; not a refutation)."""
        return sum(row.verdict("predicted_path", "predicted_set") == "violated" for row in self.rows)

    def to_json(self) -> dict:
        return {"sentence": self.sentence, "mode": self.mode, "seed": self.seed, "n": self.n, "model": self.model,
                "tokens": list(self.tokens), "edits": [edit.to_json() for edit in self.edits.values()],
                "set": self.edit_set, "search": self.search, "rows": [row.to_json() for row in self.rows],
                "checks": self.counts(), "violations": self.violations, "float_allowance": FLOAT_ALLOWANCE}

    def table(self) -> str:
        lines = [f"sentence: {self.sentence!r} (n = {self.n} tokens), {self.mode}, seed {self.seed}"]
        for edit in self.edits.values():
            lines.append(f"  k = {edit.k} at {list(edit.positions)}: {' '.join(edit.words)}")
        if self.edit_set:
            lines.append(f"  set: {self.edit_set.get('description', '')}")
        for k, found in self.search.items():
            lines.append(f"  worst edits, k = {k}: {found.get('description', '')}")
        lines.append(f"{'layer':>5s} {'k':>2s} {'measured':>10s} {'max token':>9s} {'path':>10s} {'set':>10s} "
                     f"{'worst':>10s} {'global':>10s} {'path/meas':>9s} {'set/worst':>9s}")
        for row in self.rows:
            flags = [name for name, a, b in CHECKS if row.verdict(a, b) in ("violated", "not certified")]
            lines.append(f"{row.layer:5d} {row.k:2d} {row.measured:10.4g} {row.measured_max_token:9.4g} "
                         f"{row.predicted_path:10.4g} {row.predicted_set:10.4g} {row.worst_witness:10.4g} "
                         f"{row.global_:10.4g} {_ratio(row.predicted_path, row.measured):9.3g} "
                         f"{_ratio(row.predicted_set, row.worst_witness):9.3g}"
                         + (f"  {'; '.join(flags)}" if flags else ""))
        for name, count in self.counts().items():
            if count["violated"] or count["not certified"]:
                lines.append(f"{name}: {count['violated']} violated, {count['not certified']} not certified")
        lines.append(f"violations: {self.violations}")
        return "\n".join(lines + [""] + legend_lines(
            "columns (W1: the Wasserstein-1 distance between the uniform measures of the sentence's and the edit's "
            "attention block outputs X + MHA(X), in the units of the hidden states):", TABLE_LEGEND))


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf
