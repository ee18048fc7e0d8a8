"""The README as a new user reads it after the two Quickstart commands: every command of its ``bash`` blocks
runs as written, and every ``python`` block runs.

Each command of a ``bash`` block runs in a fresh folder, as its own test, except that a command reading what an
earlier one wrote (``plot gaps report.json`` the report of ``verify --json report.json``) runs after it in the
same folder (:data:`READS`); the block's variable assignments (``WHISPER=$(...)``) are the preamble of each
command.  A command passes when it exits with 0 -- or with the
status its comment announces ("exit status 3") -- and prints no traceback.  The commands without a shell
variable run through ``lipbound.cli.main`` in the test process with the words bash would pass them (a process of
their own would import the numeric stack again, about 4 CPU seconds each); those with one in bash, through the
installed ``lipbound`` command.  The fast profile appends a small
witness budget, few radii, a small vocabulary (argparse takes the last value of an option), so the block
runs in a minute or two, and a command with ``--jobs`` runs serially (``--jobs 1``; the worker processes have
their own default test in test_scaleout.py); ``verify --whole`` on the full model is slow-marked.  The
Quickstart's ``pip`` and ``bash scripts/test.sh`` are the install and this very suite: they are not run here
(``.ci/run`` runs the latter), the ``lipbound`` command after ``&&`` is.

Every command that takes more than 30 seconds says how long in its comment; the quick ones are the
commands listed in :data:`QUICK`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import cli_run
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
#: Options appended to a command of the README, by subcommand, for the fast profile.
FAST = {
    "demo": ["--heads", "1", "--no-sdp", "--budget", "0.05"],
    "paper": ["--budget", "0.05", "--n-values", "2,4"],
    "plot scaling": ["--budget", "0.05", "--n-values", "2,4"],
    "plot gaps": ["--budget", "0.05"],
    "check": ["--budget", "0.5"],
    "local": ["--eps", "0,1e-3", "--map", "head", "--head", "0"],
    "perturb": ["--vocabulary", "4", "--search", "4", "--layers", "0,1"],   # 16 -> 4 tokens: 5.2 -> 3.3 CPU-s
    "depth": ["--steps", "20"],
}
#: Commands quick enough (well under 30 s) to state no duration.
QUICK = ("list", "derive", "preamble", "compare", "convert", "recheck", "check", "depth", "plot perturb", "plot edits",
         "plot curve", "plot gaps report.json")
#: Commands too slow for the default profile even with the fast options.
SLOW = ("--whole", "lipbound advise")   # advise re-verifies every edited component (tests/test_advise.py)
#: ``(reader, writer)``: a command starting with ``lipbound <reader>`` reads what the last earlier command
#: starting with ``lipbound <writer>`` wrote (plot gaps its report.json, recheck its witness), so it runs after
#: it in the same folder; every other command starts a chain of its own, and the chains run in parallel.
READS = (("plot gaps", "verify --n 8"), ("recheck", "verify --n 8"), ("plot perturb", "perturb"),
         ("plot edits", "perturb"), ("plot curve", "local"))
_DURATION = re.compile(r"\b\d+(\.\d+)?\s*(s|min)\b")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def _code_and_comment(line: str) -> tuple[str, str]:
    """A shell line split at its first ``#`` outside quotes that starts a comment."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip(), line[index + 1:].strip()
    return line.rstrip(), ""


def _subcommand(words: list[str]) -> str:
    command = words[1] if len(words) > 1 else ""
    if command == "plot" and len(words) > 2:
        return f"plot {words[2]}"
    return command


def _commands() -> list[tuple[int, str, str, list[str]]]:
    """``(block, command, comment, preamble)`` for every lipbound command of the bash blocks."""
    found = []
    for number, block in enumerate(_blocks("bash")):
        preamble: list[str] = []
        for raw in block.splitlines():
            code, comment = _code_and_comment(raw)
            if not code:
                continue
            if re.match(r"^[A-Z_]+=", code):
                preamble.append(code)
                continue
            for part in (piece.strip() for piece in code.split("&&")):
                if part.startswith("lipbound"):
                    found.append((number, part, comment, list(preamble)))
                else:
                    assert part.startswith(("pip ",
                                            "bash scripts/test.sh")), f"a README command lipbound cannot run: {part}"
    return found


COMMANDS = _commands()


def _chains() -> list[list[tuple[int, str, str, list[str]]]]:
    """The commands grouped into chains: a reader of :data:`READS` joins its writer's chain."""
    chains: list[list[tuple[int, str, str, list[str]]]] = []
    for entry in COMMANDS:
        block, command = entry[0], entry[1]
        writer = next((w for r, w in READS if command.startswith(f"lipbound {r}")), None)
        if writer is None:
            chains.append([entry])
            continue
        found = [chain for chain in chains if chain[0][0] == block
                 and any(other.startswith(f"lipbound {writer}") for _, other, _, _ in chain)]
        assert found, f"README: {command!r} reads what a 'lipbound {writer}' command writes, but none precedes it"
        found[-1].append(entry)
    return chains


CHAINS = _chains()


def test_the_readme_has_commands_and_every_slow_one_states_its_duration():
    assert len(COMMANDS) >= 25
    for _, command, comment, _ in COMMANDS:
        words = shlex.split(command)
        quick = any(" ".join(words[1:]).startswith(prefix) for prefix in QUICK)
        assert quick or _DURATION.search(comment), f"no expected duration in the README for: {command}"


def _fast(command: str) -> str:
    words = shlex.split(command)
    extra = list(FAST.get(_subcommand(words), []))
    if words[1] == "verify" and "--whole" not in words:
        extra += ["--budget", "0.05"] + ([] if "--layer" in words or "--head" in words else ["--layer", "0", "--head",
                                                                                             "0"])
    if words[1] == "verify" and "--whole" in words:
        extra += ["--n", "2", "--restarts", "1", "--iterations", "2", "--effort", "2"]
    if words[1] == "paper" and "--weights" not in words:
        extra = []
    if "--jobs" in words and "--whole" not in words:
        # serially: the worker processes of --jobs (a cluster's start and imports, about 8 CPU-s) have their
        # default test in test_scaleout.py (test_jobs_2_through_the_cli_matches_serial)
        extra += ["--jobs", "1"]
    return command + "".join(" " + shlex.quote(word) for word in extra)


def _in_this_process(command: str) -> bool:
    """A command that uses no shell variable runs through ``lipbound.cli.main`` in the test process (the words bash
    would pass, without the start-up and imports of a process); the others run in bash."""
    return "$" not in command


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("chain", CHAINS, ids=[f"{chain[0][0]}-{index}-{_subcommand(shlex.split(chain[0][1]))}"
                                              .replace(" ", "-") for index, chain in enumerate(CHAINS)])
def test_every_command_of_a_bash_block_runs_as_written(chain, tmp_path, request, monkeypatch):
    """One chain of a bash block, its commands in order in one folder, with the fast options."""
    slow = request.config.getoption("--runslow") or os.environ.get("LIPBOUND_SLOW") == "1"
    monkeypatch.chdir(tmp_path)
    for _, command, comment, preamble in chain:
        if any(marker in command for marker in SLOW) and not slow:
            pytest.skip(f"slow: {command}")
        expected = int(re.search(r"exit status (\d)", comment).group(1)) if "exit status" in comment else 0
        if _in_this_process(command):
            result = cli_run.run(*shlex.split(_fast(command))[1:])
        else:
            script = "set -e\n" + "\n".join(preamble) + "\n" + _fast(command)
            result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                                    timeout=1200, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert "Traceback" not in result.stderr, (command, result.stderr[-3000:])
        assert result.returncode == expected, (command, result.returncode, result.stderr[-2000:])


def test_commands_run_both_in_bash_and_in_the_test_process():
    in_bash = [command for _, command, _, _ in COMMANDS if not _in_this_process(command)]
    assert in_bash and len(in_bash) < len(COMMANDS)


def test_the_chains_hold_every_command_once_in_the_readme_order():
    assert sorted(entry for chain in CHAINS for entry in chain) == sorted(COMMANDS)
    for chain in CHAINS:
        assert [COMMANDS.index(entry) for entry in chain] == sorted(COMMANDS.index(entry) for entry in chain)
    assert max(len(chain) for chain in CHAINS) >= 3     # verify, plot gaps, recheck share a folder


@pytest.mark.parametrize("number", range(len(_blocks("python"))))
def test_every_python_block_runs(number, tmp_path, monkeypatch):
    """The block as a script in a fresh folder, in this process (a process of its own would import the numeric
    stack again, about 3 CPU seconds): an exception fails the test with the block's own traceback."""
    monkeypatch.chdir(tmp_path)
    exec(compile(_blocks("python")[number], f"README.md python block {number}", "exec"), {"__name__": "__main__"})
