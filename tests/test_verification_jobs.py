"""How ``verify`` shares work between the jobs of one layer: the whole layer's job evaluates every head's
"derived" theorem once, and the head rows take theirs from it (the same floats as a head job that evaluates its
own), also when the layer's row arrives after its heads' rows or the layer's job fails."""

from __future__ import annotations

import pytest
from decoder_checkpoints import config_of, random_weights, write_huggingface

from lipbound.numeric import verification as verification_module
from lipbound.numeric.model import load_weights
from lipbound.numeric.scaleout import TaskFailed
from lipbound.numeric.verification import Verification, verify_job

_FAST = dict(n=4, budget=0.05, seed=3)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    config = {**config_of("llama"), "num_hidden_layers": 1}
    return load_weights(str(write_huggingface(tmp_path_factory.mktemp("llama"), config, random_weights(config, 3))))


def _bounds(row) -> list[tuple[str, float]]:
    return [(bound.name, bound.value) for bound in row.upper_bounds]


def _alone(verification: Verification, job):
    """The row of ``job`` run on its own, the head evaluating its own "derived" theorem."""
    return verification.assemble(job, verify_job(*verification.task(job)))


def test_head_rows_take_the_derived_constant_of_their_layers_job(model, tmp_path, monkeypatch):
    verification = Verification(model, layers=[0], witness_dir=tmp_path, **_FAST)
    verification.jobs = [job for job in verification.jobs if job.head in (0, 3, None)]
    sent = []
    real = verification_module.run_all

    def recording(function, tasks, **options):
        sent.extend(tasks)
        return real(function, tasks, **options)

    monkeypatch.setattr(verification_module, "run_all", recording)
    report = verification.run()
    # the head jobs leave the theorem to the layer's job (the last argument), which returns every head's
    assert [task[-1] for task in sent if task[-2] is not None] == [False, False]
    for job, row in zip(verification.jobs, report.rows):
        assert (row.layer, row.head) == (job.layer, job.head)
        if job.head is not None:
            assert _bounds(row) == _bounds(_alone(verification, job))
            assert row.upper_bounds[0].name == "derived" and row.upper_bounds[0].provenance
    whole = next(row for row in report.rows if row.head is None)
    per_head = next(bound for bound in whole.upper_bounds if bound.name == "derived").details["per_head"]
    assert [per_head[0], per_head[3]] == [row.upper_bounds[0].value for row in report.rows if row.head is not None]


def test_head_rows_wait_for_their_layer_and_survive_its_failure(model, tmp_path, monkeypatch):
    """Serially each layer's job runs just before its heads; where heads finish first (in parallel, simulated here by
    the order the results arrive in) their rows wait for it, and survive its failure with their own constant."""
    verification = Verification(model, layers=[0], witness_dir=tmp_path, **_FAST)
    verification.jobs = [job for job in verification.jobs if job.head in (0, 1, None)]
    seen, sent = [], []
    real = verification_module.run_all

    def recording(function, tasks, **options):
        sent.extend(task[13] for task in tasks)
        return real(function, tasks, **options)

    monkeypatch.setattr(verification_module, "run_all", recording)
    report = verification.run(lambda report, row: seen.append(row.head))
    assert sent == [None, 0, 1] and seen == [None, 0, 1]   # serially the layer's job first, then its heads
    assert [row.head for row in report.rows] == [0, 1, None]

    def heads_first_then_failing_layer(function, tasks, *, progress, **options):
        heads = [k for k, task in enumerate(tasks) if task[13] is not None]
        results = [None] * len(tasks)
        for done, k in enumerate(heads):
            results[k] = function(*tasks[k])
            progress(done + 1, len(tasks), k, results[k])
        layer = next(k for k, task in enumerate(tasks) if task[13] is None)
        raise TaskFailed(layer, RuntimeError("the layer's job fails"), results, heads)

    monkeypatch.setattr(verification_module, "run_all", heads_first_then_failing_layer)
    again = Verification(model, layers=[0], witness_dir=tmp_path / "again", **_FAST)
    again.jobs = list(verification.jobs)
    arrived = []
    with pytest.raises(RuntimeError, match="layer's job fails"):
        again.run(lambda report, row: arrived.append(row.head))
    assert arrived == [0, 1] and [row.head for row in again.report.rows] == [0, 1]
    for before, after in zip(report.rows, again.report.rows):
        assert _bounds(before) == _bounds(after)
    assert again.report.rows[0].upper_bounds[0].name == "derived"


def test_an_interrupted_run_keeps_the_head_rows_that_waited_for_their_layer(model, tmp_path, monkeypatch):
    """Ctrl-C while a layer's job runs after heads that finished first: their rows are kept."""
    def heads_then_interrupt(function, tasks, *, progress, **options):
        heads = [k for k, task in enumerate(tasks) if task[13] is not None]
        for done, k in enumerate(heads):
            progress(done + 1, len(tasks), k, function(*tasks[k]))
        raise KeyboardInterrupt

    monkeypatch.setattr(verification_module, "run_all", heads_then_interrupt)
    verification = Verification(model, layers=[0], witness_dir=tmp_path, **_FAST)
    verification.jobs = [job for job in verification.jobs if job.head in (0, None)]
    with pytest.raises(KeyboardInterrupt):
        verification.run()
    assert [row.head for row in verification.report.rows] == [0] and not verification.report.complete


def test_the_command_line_and_the_library_share_the_default_budget():
    from lipbound.cli import build_parser
    from lipbound.numeric.verification import DEFAULT_BUDGET

    assert build_parser().parse_args(["verify"]).budget == DEFAULT_BUDGET
