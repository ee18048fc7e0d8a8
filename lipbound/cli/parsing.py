"""The parser class and the ``type=`` converters of every option.

Each converter turns the text a user typed into the value the library takes, or raises an
:class:`argparse.ArgumentTypeError` whose message says what was expected, what came and how to
fix it in terms of the command line; the parser prints it on one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from pathlib import Path

__all__ = ["Parser", "EXIT_USER_ERROR", "EXIT_REFUTED", "positive_int", "index", "positive_float", "int_list",
           "radius_spec", "window_size", "choice", "output_file", "output_directory", "plot_file", "epilog",
           "scheduler_address", "model_path", "DEFAULT_MODEL", "EMBEDDED_MODEL_HELP", "renamed"]

EXIT_USER_ERROR = 2
#: A bound or a published claim refuted (``verify``, ``check``, ``compare``).
EXIT_REFUTED = 3

#: The name of the embedded model wherever a command takes a model (no path means it too).
DEFAULT_MODEL = "default"
#: What every --help that takes a model says about it.
EMBEDDED_MODEL_HELP = ("'default' (or no model at all): the embedded all-MiniLM-L6-v2 layers 0 and 5 "
                       "(attention and the LayerNorms feeding it)")


class _Formatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal paragraph by paragraph; examples (indented lines) as written."""

    def _fill_text(self, text, width, indent):
        paragraphs = []
        for paragraph in text.split("\n\n"):
            if paragraph.startswith("examples:") or "\n  " in paragraph:
                paragraphs.append("\n".join(indent + line for line in paragraph.splitlines()))
            else:
                paragraphs.append(textwrap.fill(" ".join(paragraph.split()), width, initial_indent=indent,
                                                subsequent_indent=indent, break_on_hyphens=False))
        return "\n\n".join(paragraphs)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit with status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # noqa: D401 - argparse API
        sys.stderr.write(f"lipbound: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(EXIT_USER_ERROR)


def epilog(*examples: str, notes: str = "") -> str:
    """The ``--help`` footer: examples, then notes."""
    text = "examples:\n" + "\n".join(f"  {line}" for line in examples)
    return text + ("\n\n" + notes if notes else "")


def _fail(expected: str, got: str, fix: str):
    raise argparse.ArgumentTypeError(f"expected {expected}, got {got!r}. Fix: {fix}")


def positive_int(option: str, largest: int | None = None):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            _fail("a positive integer", text, f"write e.g. {option} 8")
        if value < 1:
            _fail("a positive integer", text, f"write e.g. {option} 8")
        if largest is not None and value > largest:
            _fail(f"an integer at most {largest}", text, f"write e.g. {option} {min(largest, 8)}")
        return value
    convert.__name__ = option
    return convert


def index(option: str, what: str):
    """A 0-based index (layers and heads are counted from 0)."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            _fail(f"a {what} number counted from 0", text, f"write e.g. {option} 0")
        if value < 0:
            _fail(f"a {what} number counted from 0 (0, 1, 2, ...)", text,
                  f"{what}s are counted from 0; write e.g. {option} 0 for the first {what}")
        return value
    convert.__name__ = option
    return convert


def positive_float(option: str):
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            _fail("a positive number", text, f"write e.g. {option} 10")
        return value
    convert.__name__ = option
    return convert


def float_list(option: str, example: str, *, zero: bool = False, fix: str = "", text: bool = False,
               single: bool = False):
    """``"0.5"`` or ``"0,1e-3,1e-2"`` -> a tuple of finite numbers, positive (``zero``: or 0), in the
    order given; ``text``: the numbers as typed (decimal strings, for exact enclosures), checked the
    same way; ``single``: exactly one number, returned alone."""
    def convert(typed: str):
        values = []
        parts = str(typed).split(",")
        if single and len(parts) != 1:
            _fail(f"one number, e.g. {example}", typed, fix or f"write {option} {example}")
        for part in parts:
            try:
                value = float(part)
            except ValueError:
                value = math.nan
            if not (math.isfinite(value) and (value > 0 or (zero and value == 0))):
                sign = "non-negative" if zero else "positive"
                _fail(f"a {sign} number, e.g. {example}" if single else
                      f"{sign} numbers separated by commas, e.g. {example}", typed, fix or f"write {option} {example}")
            values.append(part.strip() if text else value)
        return values[0] if single else tuple(values)
    convert.__name__ = option
    return convert


def int_list(option: str, low: int = 0):
    """``"3"``, ``"1..3"`` (inclusive) or ``"1,4,6"`` -> a sorted tuple of ints >= ``low``."""
    def convert(text: str) -> tuple[int, ...]:
        values: set[int] = set()
        for part in str(text).split(","):
            match = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?", part)
            if match is None:
                _fail("an integer, a range A..B or a comma list", text, f"write e.g. {option} 0..5 or {option} 0,2")
            start = int(match.group(1))
            stop = int(match.group(2)) if match.group(2) is not None else start
            if stop < start or start < low:
                _fail(f"a range A..B with {low} <= A <= B", text, f"write e.g. {option} {low}..{low + 2}")
            values.update(range(start, stop + 1))
        return tuple(sorted(values))
    convert.__name__ = option
    return convert


def window_size(option: str):
    """A sliding window's width: a positive integer, or ``w`` for the symbol (a SymPy integer or symbol)."""
    def convert(text: str):
        import sympy as sp

        from ..symbolic import symbols as S
        if text.strip() == "w":
            return S.w
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            _fail("a positive integer or w (the symbol)", text, f"write e.g. {option} 4096 or {option} w")
        return sp.Integer(value)
    convert.__name__ = option
    return convert


def choice(option: str, choices: tuple[str, ...]):
    """One of ``choices``, spelled exactly (give the option ``metavar=`` and list the choices in its help when
    they contain commas: argparse's ``{fro,2,1,2,inf}`` cannot be read)."""
    def convert(text: str) -> str:
        if text not in choices:
            _fail(f"one of {' | '.join(choices)}", text, f"write e.g. {option} {choices[0]}")
        return text
    convert.__name__ = option
    return convert


def renamed(option: str, new: str, why: str):
    """An option's old name (``help=argparse.SUPPRESS``): refused in one line that gives its new name ``new``."""
    def refuse(text: str):
        _fail(f"{new} {text} (this option is now called {new}; {why})", f"{option} {text}", f"write {new} {text}")
    refuse.__name__ = option
    return refuse


def model_path(option: str, what: str = "checkpoint file or folder", default_is: str = "the embedded model"):
    """``default`` (:data:`DEFAULT_MODEL`: ``default_is``) or the path of an existing file or folder; what the
    file holds is checked when it is read."""
    def convert(text: str) -> str:
        if text == DEFAULT_MODEL:
            return text
        if not Path(text).exists():
            _fail(f"an existing {what}, or {DEFAULT_MODEL} for {default_is}", text,
                  f"check the path, or write {DEFAULT_MODEL} for {default_is}")
        return text
    convert.__name__ = option
    return convert


def radius_spec(option: str = "--radius"):
    """``layernorm``, ``layernorm-image`` or a positive number (a :class:`DomainSpec`)."""
    def convert(text: str):
        from ..numeric.domains import DOMAIN_SPECS, DomainSpec
        try:
            return DomainSpec.parse(text, option)
        except Exception:
            _fail(f"a positive number or one of {', '.join(DOMAIN_SPECS)}", text,
                  f"write e.g. {option} 20.25 or {option} layernorm")
    convert.__name__ = option
    return convert


def scheduler_address(option: str = "--scheduler"):
    """A dask scheduler address, ``tcp://host:port`` (or ``host:port``, read as tcp); whether it
    answers is checked when the run starts."""
    def convert(text: str) -> str:
        address = text if "://" in text else f"tcp://{text}"
        match = re.fullmatch(r"(tcp|tls|ucx)://([^/:\s]+|\[[0-9A-Fa-f:]+\]):(\d{1,5})", address)
        if match is None or not 0 < int(match.group(3)) < 65536:
            _fail("a dask scheduler address tcp://HOST:PORT", text, f"write e.g. {option} tcp://10.0.0.5:8786 "
                  "(the address `dask scheduler` prints)")
        return address
    convert.__name__ = option
    return convert


def _writable(path: Path, option: str) -> Path:
    from ..errors import OutputError
    from ..io import check_output
    from .terms import in_cli_terms
    try:
        return check_output(path, option)
    except OutputError as error:
        raise argparse.ArgumentTypeError(in_cli_terms(error).split(": ", 1)[1]) from None


def output_file(option: str, *suffixes: str):
    """A file that can be written (its folder exists and is writable), checked before any work."""
    def convert(text: str) -> Path:
        path = Path(text)
        if suffixes and path.suffix.lower() not in suffixes:
            _fail(f"a file ending in {' or '.join(suffixes)}", text, f"write e.g. {option} report{suffixes[0]}")
        return _writable(path, option)
    convert.__name__ = option
    return convert


def output_directory(option: str):
    """A folder that exists and is writable, or that can be created in an existing writable folder.

    The one rule of every output: its parent folder must exist (as for every output file,
    :func:`lipbound.io.check_output`); lipbound creates the folder itself, never its parents."""
    def convert(text: str) -> Path:
        import os
        path = Path(text)
        if path.exists() and not path.is_dir():
            _fail("a folder", f"{text} (a file)", f"choose another {option}")
        parent = path.parent if str(path.parent) else Path(".")
        if not path.exists() and not parent.is_dir():
            _fail("a folder in an existing folder", f"{text} (no folder {parent})",
                  f"create it first (mkdir -p {parent}) or choose another {option}")
        if not os.access(path if path.exists() else parent, os.W_OK | os.X_OK):
            _fail("a folder that can be written", f"{text} (permission denied)", f"choose another {option}")
        return path
    convert.__name__ = option
    return convert


def plot_file(option: str = "--plot"):
    """A file in a format matplotlib can write (png, pdf, svg, ...), in a writable folder."""
    def convert(text: str) -> Path:
        path = Path(text)
        try:
            from matplotlib.figure import Figure
            formats = sorted(Figure().canvas.get_supported_filetypes())
        except ImportError:
            _fail("a plot file (needs matplotlib)", text, "pip install 'lipbound[all]' to draw plots")
        if path.suffix.lower().lstrip(".") not in formats:
            _fail(f"a file ending in one of .{', .'.join(formats)}", text, f"write e.g. {option} figure.png")
        return _writable(path, option)
    convert.__name__ = option
    return convert
