"""Errors raised by lipbound.

A small flat hierarchy. Every message names the argument at fault, what was
expected, what came, and how to fix it, so that a user never needs a traceback
to act on it (the CLI prints the message alone and exits with status 2).
"""

from __future__ import annotations

__all__ = [
    "LipboundError",
    "AssumptionError",
    "NotLipschitzError",
    "WeightsError",
    "SolverError",
    "NotCertifiedError",
    "OutputError",
    "ClusterError",
    "LipboundWarning",
]


class LipboundError(Exception):
    """Base class: a user-facing error with a structured, one-line message.

    Parameters
    ----------
    argument : str
        The argument, assumption or file at fault.
    expected : str
        What was expected.
    got : str
        What came instead.
    fix : str
        What the user can do about it.
    """

    def __init__(self, argument: str, expected: str, got: str, fix: str):
        self.argument = argument
        self.expected = expected
        self.got = got
        self.fix = fix
        super().__init__(f"{argument}: expected {expected}, got {got}. Fix: {fix}")


class AssumptionError(LipboundError):
    """A derivation needed an assumption that is missing, unknown, or violated."""


class NotLipschitzError(LipboundError):
    """The map is not Lipschitz on the stated domain (a witness family exists)."""


class WeightsError(LipboundError):
    """Weights are unreadable, malformed, non-finite, or of the wrong shape."""


class SolverError(LipboundError):
    """A numerical solver failed, or its certificate did not survive re-checking."""


class NotCertifiedError(LipboundError):
    """Rigorous arithmetic could not decide a comparison; nothing is claimed."""


class OutputError(LipboundError):
    """An output path cannot be written (checked before any work starts)."""


class ClusterError(LipboundError):
    """Work cannot be handed out: no dask scheduler answers at the address, or dask is missing."""


class LipboundWarning(UserWarning):
    """Base class of lipbound's warnings; the tests turn every one into an error (pyproject.toml)."""
