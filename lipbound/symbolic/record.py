"""The derivation record: every inequality a bound rests on, with its reason.

A :class:`Derivation` is a titled list of :class:`Step` objects.  A step's claim
is a SymPy relation (``Le``, ``Eq``) whose sides may contain :class:`Described`
quantities, i.e. objects known by a description such as
``sup_{x,y in D} ||grad_y s(x, y)||``.  The printing layer turns a derivation
into an ``align*`` block, one line per step, with the justification beside it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import final

import sympy as sp

__all__ = ["Described", "Sides", "Simeq", "Defines", "VectorSum", "Step", "Derivation", "le", "eq", "quantity"]


@final
class Described(sp.Symbol):
    """A quantity known by its description; its name is its LaTeX.

    Example: ``Described(r"\\sup_{x, y \\in \\mathcal{D}} \\|\\nabla_y s(x, y)\\|")``.
    """

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("nonnegative", True)
        return super().__new__(cls, name, **assumptions)


class Sides(sp.Basic):
    """Two sides kept as written (``lhs``, ``rhs``), joined by :attr:`relation` (LaTeX).  Abstract: see
    :class:`Simeq`, :class:`Defines`."""

    relation: str = ""

    def __new__(cls, lhs, rhs):
        return sp.Basic.__new__(cls, sp.sympify(lhs), rhs if isinstance(rhs, sp.Basic) else sp.sympify(rhs))

    @property
    def lhs(self):
        return self.args[0]

    @property
    def rhs(self):
        return self.args[1]


@final
class Simeq(Sides):
    """``lhs ≃ rhs``: equal up to terms a softmax ignores (added to every score of a row)."""

    relation = r"\simeq"


@final
class Defines(Sides):
    """``name := value``: notation a proof introduces (``A := W_Q W_K^T / sqrt(d_k)``)."""

    relation = r"\coloneqq"


@final
class VectorSum(sp.Basic):
    """``sum_t c_t v_t``: scalar coefficients times vector expressions (a gradient), kept as its terms.

    Built from ``(coefficient, vector)`` pairs; ``terms`` gives them back.
    """

    def __new__(cls, terms):
        return sp.Basic.__new__(cls, *[sp.Tuple(sp.sympify(c), v) for c, v in terms])

    @property
    def terms(self) -> list[tuple]:
        return [tuple(pair) for pair in self.args]


@functools.cache
def quantity(name: str) -> Described:
    """A data-dependent quantity of a local theorem (measured on a real input), by its LaTeX name."""
    return Described(name)


def le(lhs, rhs) -> sp.Rel:
    """``lhs <= rhs`` kept unevaluated (so that a printer shows it as written)."""
    return sp.Le(sp.sympify(lhs), sp.sympify(rhs), evaluate=False)


def eq(lhs, rhs) -> sp.Rel:
    """``lhs = rhs`` kept unevaluated."""
    return sp.Eq(sp.sympify(lhs), sp.sympify(rhs), evaluate=False)


@final
@dataclass(frozen=True)
class Step:
    """One step of a derivation.

    Attributes
    ----------
    claim : sympy relation or str
        What the step establishes, e.g. ``Le(alpha, ||A|| R)``.
    justification : str
        Why it holds, in words (``"Cauchy-Schwarz"``, ``"domain: ||y - c|| <= R"``).
    lemma : str or None
        Identifier of a named lemma in :mod:`lipbound.symbolic.lemmas`, if any.
    """

    claim: sp.Basic | str
    justification: str
    lemma: str | None = None

    def as_dict(self) -> dict:
        return {"claim": str(self.claim), "justification": self.justification,
                "lemma": self.lemma}


@final
@dataclass
class Derivation:
    """A titled, ordered list of steps with the hypotheses they use."""

    title: str
    hypotheses: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def add(self, claim, justification: str, lemma: str | None = None) -> Derivation:
        self.steps.append(Step(claim, justification, lemma))
        return self

    def hypothesis(self, text: str) -> Derivation:
        if text not in self.hypotheses:
            self.hypotheses.append(text)
        return self

    def absorb(self, other: Derivation) -> Derivation:
        """Append another derivation's steps and hypotheses (a lemma used inside this one)."""
        for text in other.hypotheses:
            self.hypothesis(text)
        self.steps.extend(other.steps)
        return self

    @property
    def lemmas(self) -> list[str]:
        return sorted({s.lemma for s in self.steps if s.lemma})

    def as_dicts(self) -> list[dict]:
        return [s.as_dict() for s in self.steps]
