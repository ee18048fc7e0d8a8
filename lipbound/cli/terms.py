"""The one translation point from the library's argument names to the options of a command.

The library names its own arguments: an error's ``argument`` is the Python name at fault (``layers``,
``num_heads``, ``budget_seconds``) or a file, and its text writes other arguments in backticks
(``"choose `layers` between 0 and 5"``).  :func:`in_cli_terms` writes such an error as the command
line speaks: the argument as the option that sets it in the command that ran (``--layers``), every
backticked name likewise, or the name itself where no option sets it.
"""

from __future__ import annotations

import re

from ..errors import LipboundError

__all__ = ["OPTIONS", "COMMAND_OPTIONS", "option_for", "in_cli_terms"]

#: library argument -> the option that sets it, in every command that has it
OPTIONS = {
    "head": "--head", "layer": "--layer", "layers": "--layers", "last": "--last", "block": "--block",
    "kind": "--kind", "n": "--n", "m": "--m", "num_heads": "--num-heads", "budget_seconds": "--budget",
    "budget": "--budget", "seed": "--seed", "norm": "--norm", "radius": "--radius", "domain": "--radius",
    "jobs": "--jobs", "scheduler": "--scheduler", "witness_dir": "--witness-dir",
    "k": "--replace/--insert/--delete", "mode": "--replace/--insert/--delete", "positions": "--positions",
    "vocabulary": "--vocabulary", "search": "--search", "path_tolerance": "--tolerance", "eps": "--eps",
    "ball": "--ball", "curvature_tokens": "--curvature-tokens", "score": "--score", "fact": "--fact",
    "prefix": "--prefix", "text_width": "--text-width", "font_size": "--font-size", "weights": "MODEL",
    "model": "MODEL", "effort": "--effort", "restarts": "--restarts", "iterations": "--iterations",
    "scale": "--scale", "steps": "--steps", "bias": "--bias", "softcap": "--softcap", "window": "--window",
    "causal": "--causal", "per_candidate": "--per-candidate", "recheck": "--recheck",
}
#: command (``plot`` with its kind) -> the options that differ from :data:`OPTIONS` there
COMMAND_OPTIONS = {
    "derive": {"domain": "--domain"},
    "paper": {"domain": "--domain", "weights": "--weights", "model": "--weights", "path": "--output"},
    "check": {"weights": "--weights", "model": "--weights"},
    "recheck": {"weights": "--weights", "model": "--weights", "path": "WITNESS"},
    "convert": {"path": "OUT"},
    "perturb": {"model": "--model", "path": "--plot"},
    "local": {"model": "--model", "kind": "--map"},
    "depth": {"model": "--model", "path": "--plot"},
    "plot scaling": {"weights": "--weights", "model": "--weights", "path": "--output"},
    "plot gaps": {"weights": "--weights", "model": "--weights", "path": "--output"},
    "plot perturb": {"path": "--output"},
    "plot edits": {"path": "--output"},
    "plot curve": {"path": "--output"},
    "advise": {"text": "--text", "out": "--output", "local_sentences": "--local-sentences", "model": "MODEL"},
}
_NAMED = re.compile(r"`(-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)`")


def option_for(argument: str, command: str = "") -> str | None:
    """The option of ``command`` that sets the library's ``argument``, or None."""
    return COMMAND_OPTIONS.get(command, {}).get(argument) or OPTIONS.get(argument)


def in_cli_terms(error: LipboundError, command: str = "") -> str:
    """The error's one line with the command's option names (module docstring)."""
    def named(match: re.Match) -> str:
        return option_for(match.group(1), command) or match.group(1)

    expected, got, fix = (_NAMED.sub(named, str(text)) for text in (error.expected, error.got, error.fix))
    return f"{option_for(error.argument, command) or error.argument}: expected {expected}, got {got}. Fix: {fix}"
