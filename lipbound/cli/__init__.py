"""The command line, the only face of lipbound: ``lipbound COMMAND ...``.

* :mod:`.symbolic` -- ``list``, ``derive``, ``compare``, ``proofs`` (no numeric module is loaded);
* :mod:`.paper` -- ``paper``, ``preamble``, ``plot`` for authors (the numeric layer only to measure real heads);
* :mod:`.models` -- ``demo``, ``verify``, ``convert``, ``check``, ``recheck`` on real weights;
* :mod:`.text` -- ``perturb``, ``local``, ``depth`` on real text;
* :mod:`.advise` -- ``advise``: diagnosis and interventions with both prices;
* :mod:`.parsing` -- the parser and the ``type=`` converters; :mod:`.output` -- report files, progress.

A user error (bad option, unreadable file, missing assumption) prints one line naming the
option, what was expected, what came and the fix, and exits with status 2 -- never a
traceback.  Other exit statuses: 1 an invalid witness, 3 a bound or claim refuted, 130
interrupted, 141 the reader of the output went away (``lipbound ... | head``).
"""

from __future__ import annotations

import os
import sys

from .. import __version__
from ..errors import LipboundError
from . import advise, models, paper, symbolic, text
from .parsing import EXIT_USER_ERROR, Parser
from .terms import in_cli_terms

__all__ = ["main", "build_parser"]

EXIT_BROKEN_PIPE = 141


def build_parser() -> Parser:
    parser = Parser(prog="lipbound", description="Lipschitz bounds for attention: derive, prove, check, export.\n"
                    "Layers and heads are counted from 0.  `lipbound COMMAND --help` shows examples.")
    parser.add_argument("--version", action="version", version=f"lipbound {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for module in (symbolic, paper, models, text, advise):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except LipboundError as error:
        command = args.command + (f" {args.kind}" if args.command == "plot" else "")
        sys.stderr.write(f"lipbound: error: {in_cli_terms(error, command)}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("lipbound: interrupted\n")
        return models.EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader closed the pipe: stop quietly, and keep Python from complaining at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
