"""The outcome of a claim check: :class:`CheckResult`, and the verdict of a witness against a claim.

A verdict is decided in interval arithmetic (:func:`lipbound.rigorous.intervals.certify_le`):
REFUTED only when a certified lower bound exceeds the claim's certified upper end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

from ..rigorous.intervals import Verdict, certify_le, interval

__all__ = ["CheckResult", "claim_verdict"]


@final
@dataclass(frozen=True)
class CheckResult:
    """Outcome of trying to refute a claim.

    ``verdict``: ``"REFUTED"`` (a certified witness beats the claim), ``"not refuted"``
    (no witness found within the budget: not a proof), ``"confirmed"`` (the claim is
    also a theorem lipbound derives or checks exactly), or ``"not certified"``.
    """

    claim: str
    verdict: str
    provenance: str
    claimed: float | None = None
    witness_value: float | None = None
    witness: dict = field(default_factory=dict)
    notes: str = ""

    @property
    def refuted(self) -> bool:
        return self.verdict == "REFUTED"

    def describe(self) -> str:
        lines = [f"claim {self.claim} {self.provenance}", f"verdict: {self.verdict}"]
        if self.claimed is not None:
            lines.append(f"claimed value (certified upper end): {self.claimed:.6g}")
        if self.witness_value is not None:
            lines.append(f"witness value (certified lower end): {self.witness_value:.6g}")
        for key, value in self.witness.items():
            lines.append(f"witness {key}: {value}")
        if self.notes:
            lines.append(self.notes)
        return "\n".join(lines)


def claim_verdict(witness_low: float, claimed_high: float) -> str:
    """``"REFUTED"`` when the witness's lower end exceeds the claim's upper end with certainty,
    ``"not refuted"`` when it is certainly at most the claim, ``"not certified"`` otherwise."""
    answer = certify_le(interval(witness_low), interval(claimed_high))
    if answer is Verdict.FAILS:
        return "REFUTED"
    if answer is Verdict.HOLDS:
        return "not refuted"
    return "not certified"
