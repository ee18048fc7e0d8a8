"""The suite's own set-up, which its cost depends on (tests/conftest.py, scripts/test.sh)."""

from __future__ import annotations

import gc
import re
import shlex
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "test.sh"


def test_the_collections_objects_are_out_of_the_cycle_collectors_reach():
    """conftest freezes what the collection made (modules, theorems' caches, the test items): a full collection
    traverses only what the tests have made since."""
    assert gc.get_freeze_count() > 10_000


def test_the_test_command_writes_the_bytecode_and_warms_it_with_the_runs_plugins():
    """scripts/test.sh lets pytest keep the rewritten test modules (unless bytecode may be written, each of the two
    test processes rewrites all of them) and collects once, with the plugins of the run, before the run starts."""
    lines = [line.split("#")[0].strip() for line in SCRIPT.read_text().splitlines()]
    unset = lines.index("unset PYTHONDONTWRITEBYTECODE")
    warm = next(i for i, line in enumerate(lines) if "--collect-only" in line)
    run = next(i for i, line in enumerate(lines) if line.startswith("exec python3 -m pytest"))
    assert unset < warm < run
    assert "export PYTHONDONTWRITEBYTECODE" not in "\n".join(lines[unset:])
    plugins = next(line for line in lines if line.startswith("PLUGINS=("))
    assert '"${PLUGINS[@]}"' in lines[warm] and '"${PLUGINS[@]}"' in lines[run]
    assert re.fullmatch(r"PLUGINS=\((.*)\)", plugins) and "--disable-plugin-autoload" in shlex.split(plugins[9:-1])
