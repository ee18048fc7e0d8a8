"""The one certified-value type: a number, its verdict, and what it rests on.

Every upper bound lipbound reports -- a closed form evaluated on weights, an SDP relaxation
whose certificate was re-checked, a composition of per-head constants, a published claim
evaluated for comparison -- is a :class:`CertifiedValue`.  Its ``value`` is a number only
when the verdict is ``HOLDS``; otherwise it is NaN and ``reason`` says why, so that an
uncertified number can never be mistaken for a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import final

from ..errors import NotCertifiedError, SolverError
from .intervals import Verdict

__all__ = ["CertifiedValue", "not_certified", "jsonable"]


@final
@dataclass(frozen=True)
class CertifiedValue:
    """A certified upper bound on a named quantity, with the evidence for it.

    Attributes
    ----------
    name : str
        What is bounded or which method bounded it (``"derived"``, ``"sdp"``, ``"gamma_{A,V}"``).
    value : float
        The certified upper end (rounded up); NaN when the verdict is not ``HOLDS``.
    verdict : Verdict
        ``HOLDS``: ``value`` is proved to bound the quantity (given the provenance);
        ``UNKNOWN``: not certified (``reason`` says why).
    provenance : str
        The mathematics the value rests on: a theorem id, a certificate, a claim's source.
    proven : bool
        True for lipbound's theorems and re-checked certificates; False for a published claim
        evaluated on weights (its transcription may be wrong, so it is never a "best" bound).
    lower : float
        A certified lower bound on the same quantity, when one is known (else NaN).
    reason : str
        Why the value is not certified (empty when it is).
    details : dict
        JSON-serialisable extras: symbol enclosures, the plain float evaluation, solver and
        certificate numbers, per-head constants.
    """

    name: str
    value: float
    verdict: Verdict
    provenance: str
    proven: bool = True
    lower: float = math.nan
    reason: str = ""
    details: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.verdict, Verdict) or self.verdict is Verdict.FAILS:
            raise NotCertifiedError(self.name, "verdict HOLDS (certified) or UNKNOWN (not certified)",
                                    repr(self.verdict), "report a failed certificate as not_certified(...)")
        if self.verdict is Verdict.HOLDS:
            value = float(self.value)
            if math.isnan(value):
                raise NotCertifiedError(self.name, "a number for a certified value", "NaN",
                                        "report a failed re-check with not_certified(...)")
            object.__setattr__(self, "value", value)
        else:
            object.__setattr__(self, "value", math.nan)
            if not self.reason:
                object.__setattr__(self, "reason", "not certified")

    @property
    def certified(self) -> bool:
        return self.verdict is Verdict.HOLDS

    @property
    def gap(self) -> float:
        """``value / lower``: how far the bound may be from the truth (1 = exact)."""
        return self.value / self.lower if self.lower and self.lower > 0 else math.inf

    def require(self) -> float:
        """The value, or :class:`~lipbound.errors.SolverError` when it is not certified."""
        if not self.certified:
            raise SolverError(self.name, "a certified bound", f"not certified ({self.reason})",
                              "try another solver or method, or check the weights")
        return self.value

    def renamed(self, name: str, **changes) -> CertifiedValue:
        return replace(self, name=name, **changes)

    def to_json(self) -> dict:
        return {"name": self.name, "value": None if math.isnan(self.value) else self.value,
                "certified": self.certified, "verdict": self.verdict.value, "provenance": self.provenance,
                "proven": self.proven, "lower": None if math.isnan(self.lower) else self.lower,
                "reason": self.reason, "details": jsonable(self.details)}

    @classmethod
    def from_json(cls, data: dict) -> CertifiedValue:
        """The value of :meth:`to_json` (the same number, verdict and provenance; details as plain
        data), e.g. after it travelled from a worker process."""
        value, lower = data["value"], data["lower"]
        return cls(data["name"], math.nan if value is None else value, Verdict(data["verdict"]), data["provenance"],
                   proven=data["proven"], lower=math.nan if lower is None else lower, reason=data["reason"],
                   details=data["details"])


def not_certified(name: str, provenance: str, reason: str, **details) -> CertifiedValue:
    """A value that could not be certified (NaN, with the reason)."""
    return CertifiedValue(name, math.nan, Verdict.UNKNOWN, provenance, reason=reason, details=details)


def jsonable(value):
    """Plain JSON data from nested dicts, lists, numpy arrays and scalars, and certified values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, CertifiedValue):
        return value.to_json()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return jsonable(value.tolist())
    if hasattr(value, "_mpi_"):
        return [str(value.a), str(value.b)]
    return value
