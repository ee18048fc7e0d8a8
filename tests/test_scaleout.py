"""Scale-out: the same report numbers serially, on a dask LocalCluster and with ``--jobs 2``;
clear errors for a bad ``--jobs`` and an unreachable ``--scheduler``; a failing task keeps what
finished.  One 2-worker LocalCluster is shared by the module (starting one costs seconds)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from lipbound.cli import main
from lipbound.errors import AssumptionError, ClusterError
from lipbound.numeric.domains import AllTokens, LayerNormOutputs, TokenBall, domain_from_plain
from lipbound.numeric.model import DEFAULT_WEIGHTS, attention_arrays, attention_from_arrays, load_default, load_weights
from lipbound.numeric.scaleout import TaskFailed, local_cluster, run_all
from lipbound.numeric.sdp.layer import stacked_weights
from lipbound.numeric.verification import Verification, verify_job
from lipbound.rigorous.intervals import Verdict
from lipbound.rigorous.value import CertifiedValue, not_certified

pytestmark = pytest.mark.xdist_group("scaleout")   # one xdist process starts the shared cluster

_FAST = dict(n=4, budget=0.05, seed=3)


def _connect_timeout(seconds: int):
    """A dask configuration block in which connecting to a scheduler gives up after ``seconds`` (dask is imported
    here, not in the collection of every test process)."""
    import dask
    import distributed  # noqa: F401  (its config defaults must exist before a dask.config.set block)
    return dask.config.set({"distributed.comm.timeouts.connect": f"{seconds}s"})


def slow_reciprocal(x: float, delay: float) -> float:
    """A task for the failure tests (module level: the workers import it by name)."""
    time.sleep(delay)
    return 1.0 / x


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(2) as local:
        yield local.scheduler_address


@pytest.fixture(scope="module")
def model():
    return load_default()


def _numbers(row_json: dict) -> dict:
    """A report row without the witness file's folder."""
    row = dict(row_json)
    row["witness"] = {k: v for k, v in row["witness"].items() if k != "file"}
    return row


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]          # closed again when the block ends


def _serial_and_cluster(model, cluster, tmp_path, heads) -> list[list[dict]]:
    """Report rows of layer 0's ``heads`` (None: the whole layer), serially and on the cluster."""
    verification = Verification(model, layers=[0], witness_dir=tmp_path, **_FAST)
    jobs = [job for job in verification.jobs if job.head in heads]
    assert [job.head for job in jobs] == list(heads)
    tasks = [verification.task(job) for job in jobs]
    seen = []
    serial = run_all(verify_job, tasks)
    spread = run_all(verify_job, tasks, scheduler=cluster, progress=lambda done, total, i, _: seen.append((done, i)))
    assert sorted(i for _, i in seen) == list(range(len(jobs)))
    assert [d for d, _ in seen] == list(range(1, len(jobs) + 1))
    rows = [[_numbers(verification.assemble(job, result).to_json()) for job, result in zip(jobs, results)]
            for results in (serial, spread)]
    assert all(row["best_upper"] is not None and row["witness"]["value"] > 0 for row in rows[0])
    return rows


def test_cluster_gives_the_serial_numbers(model, cluster, tmp_path):
    """Heads 0 and 1 of the embedded MiniLM's layer 0: serially and on 2 workers."""
    serial, spread = _serial_and_cluster(model, cluster, tmp_path, (0, 1))
    assert serial == spread


def test_a_layer_and_its_heads_on_the_cluster_give_the_serial_rows(cluster, tmp_path):
    """A generated rotary decoder layer with its heads: on the cluster the whole layer's job runs first and the head
    rows take its "derived" constants, whichever arrives first; the rows are the serial ones."""
    from decoder_checkpoints import config_of, random_weights, write_huggingface

    config = {**config_of("llama"), "num_hidden_layers": 1}
    decoder = load_weights(str(write_huggingface(tmp_path / "llama", config, random_weights(config, 3))))
    rows = []
    for where in ({}, {"scheduler": cluster}):
        verification = Verification(decoder, layers=[0], witness_dir=tmp_path / str(len(rows)), **_FAST)
        rows.append([_numbers(row.to_json()) for row in verification.run(**where).rows])
    assert [row["head"] for row in rows[0]] == [0, 1, 2, 3, None]
    assert rows[0] == rows[1]


@pytest.mark.slow
def test_cluster_gives_the_serial_numbers_for_a_whole_layer(model, cluster, tmp_path):
    """The whole layer 0 (about 10 s a run): the joint bound's Lanczos start does not depend on the process."""
    serial, spread = _serial_and_cluster(model, cluster, tmp_path, (None,))
    assert serial == spread
    assert {b["name"] for b in serial[0]["upper_bounds"]} >= {"derived", "matrix-aware", "joint"}


def test_the_joint_weights_do_not_depend_on_earlier_eigensolves():
    """ARPACK draws its start from a state each call advances: the layer bound must not use it."""
    from scipy.sparse.linalg import eigsh
    rng = np.random.default_rng(5)
    outputs = [rng.standard_normal((40, 6)) for _ in range(3)]
    inputs = [rng.standard_normal((30, 6)) for _ in range(3)]
    first = stacked_weights(outputs, inputs, np.ones(3), 2.0, iterations=8)
    eigsh(np.diag(np.arange(1.0, 31.0)), k=1)      # advances ARPACK's own random state
    assert np.array_equal(first, stacked_weights(outputs, inputs, np.ones(3), 2.0, iterations=8))


def test_cluster_gives_the_serial_numbers_with_the_sdp(model, cluster, tmp_path):
    reports = []
    for how, folder in (({}, "serial"), ({"scheduler": cluster}, "cluster")):
        verification = Verification(model, layers=[0], heads=[0], sdp=True, witness_dir=tmp_path / folder, **_FAST)
        reports.append(verification.run(**how))
    assert all(report.complete for report in reports)
    assert [_numbers(r.to_json()) for r in reports[0].rows] == [_numbers(r.to_json()) for r in reports[1].rows]
    assert any(b.name == "sdp" and b.certified for b in reports[0].rows[0].upper_bounds)


def test_jobs_2_through_the_cli_matches_serial(tmp_path):
    outputs = []
    for extra, name in (([], "serial"), (["--jobs", "2"], "jobs")):
        report = tmp_path / f"{name}.json"
        status = main(["verify", str(DEFAULT_WEIGHTS), "--layer", "5", "--head", "2", "--n", "4", "--budget", "0.05",
                       "--seed", "3", "--witness-dir", str(tmp_path / name), "--json", str(report)] + extra)
        assert status == 0
        outputs.append(json.loads(report.read_text()))
    assert outputs[0]["complete"] and outputs[1]["complete"]
    assert [_numbers(r) for r in outputs[0]["rows"]] == [_numbers(r) for r in outputs[1]["rows"]]


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two"])
def test_bad_jobs_is_one_line_exit_2(value, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["verify", str(DEFAULT_WEIGHTS), "--jobs", value])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--jobs" in err and "positive integer" in err and value in err


def test_bad_jobs_in_the_library():
    for jobs in (0, 2.5, True, "2"):
        with pytest.raises(AssumptionError, match="jobs"):
            run_all(slow_reciprocal, [(1.0, 0.0)], jobs=jobs)


def test_unreachable_scheduler_is_one_line_exit_2(tmp_path, capsys):
    address = f"tcp://127.0.0.1:{_closed_port()}"
    began = time.perf_counter()
    with _connect_timeout(1):
        status = main(["verify", str(DEFAULT_WEIGHTS), "--layer", "0", "--head", "0", "--n", "4", "--budget", "0.05",
                       "--scheduler", address, "--witness-dir", str(tmp_path)])
    assert status == 2 and time.perf_counter() - began < 30
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lipbound: error: --scheduler:")
    assert address in err and "dask scheduler" in err and f"dask worker {address}" in err


def test_scheduler_address_is_checked_when_parsed(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["verify", str(DEFAULT_WEIGHTS), "--scheduler", "not an address"])
    assert stop.value.code == 2 and "tcp://HOST:PORT" in capsys.readouterr().err


def test_unreachable_scheduler_in_the_library():
    with _connect_timeout(1):
        with pytest.raises(ClusterError, match="dask worker"):
            run_all(slow_reciprocal, [(1.0, 0.0)], scheduler=f"tcp://127.0.0.1:{_closed_port()}")


def test_a_failing_task_keeps_what_finished_serially():
    seen = []
    with pytest.raises(TaskFailed) as failure:
        run_all(slow_reciprocal, [(2.0, 0.0), (0.0, 0.0), (4.0, 0.0)], progress=lambda *a: seen.append(a))
    assert failure.value.index == 1 and isinstance(failure.value.error, ZeroDivisionError)
    assert failure.value.results == [0.5, None, None] and failure.value.finished == [0]
    assert seen == [(1, 3, 0, 0.5)]
    assert "task 2 of 3 failed" in str(failure.value) and "1 finished result kept" in str(failure.value)


def test_a_failing_task_keeps_what_finished_on_the_cluster(cluster):
    seen = []
    tasks = [(2.0, 0.0), (0.0, 1.5), (4.0, 0.0), (5.0, 4.0)]
    with pytest.raises(TaskFailed) as failure:
        run_all(slow_reciprocal, tasks, scheduler=cluster, progress=lambda done, total, i, r: seen.append((done, i, r)))
    caught = failure.value
    assert caught.index == 1 and isinstance(caught.error, ZeroDivisionError)
    # task 0 finished while task 1 slept; task 3 (4 s) had not when task 1 failed, and was dropped
    assert 0 in caught.finished and 1 not in caught.finished and 3 not in caught.finished
    assert sorted((i, r) for _, i, r in seen) == [(i, caught.results[i]) for i in caught.finished]
    assert [done for done, _, _ in seen] == list(range(1, len(seen) + 1))
    assert caught.results[0] == 0.5 and caught.results[1] is None and caught.results[3] is None


def test_a_task_of_megabytes_travels_beside_the_graph(cluster):
    """A task carrying megabytes (a decoder layer's matrices) goes to a worker beside the task graph: inside it, it
    would pass through the scheduler, and dask warns of a graph past its 10 MB threshold."""
    import warnings
    big = np.ones(1_600_000)   # 12.8 MB
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Sending large graph")
        assert run_all(np.sum, [(big,), (2 * big,)], scheduler=cluster) == [1.6e6, 3.2e6]


def test_a_failing_job_keeps_the_finished_rows(model, tmp_path):
    """Through Verification.run: the row before the failing job stays, the job's own error propagates."""
    verification = Verification(model, layers=[0], heads=[0, 1], witness_dir=tmp_path, **_FAST)
    rows = []
    original = verification.task

    def broken(job):
        task = original(job)
        return task if job.head == 0 else (task[0], task[1], task[2], -1) + task[4:]   # n = -1 fails in the job
    verification.task = broken
    with pytest.raises(AssumptionError, match="^n: expected"):
        verification.run(lambda report, row: rows.append(row))
    assert [row.head for row in rows] == [0] and [row.head for row in verification.report.rows] == [0]
    assert not verification.report.complete and math.isfinite(verification.report.rows[0].best_upper)


def test_plain_data_round_trips(model):
    """What travels to a worker: weights, domains, certified values."""
    layer = model.layer(0).attention
    for target in (layer.heads[3], layer):
        back = attention_from_arrays(attention_arrays(target))
        assert back == target and type(back) is type(target)
    assert attention_from_arrays(attention_arrays(layer)).heads[3].name == layer.heads[3].name
    norm = model.layer(0).ln_in
    for domain in (TokenBall(3.5), TokenBall(2.0, norm.beta), LayerNormOutputs(norm), AllTokens()):
        back = domain_from_plain(domain.plain())
        mine, theirs = domain.plain(), back.plain()
        assert type(back) is type(domain) and back.describe() == domain.describe() and mine.keys() == theirs.keys()
        assert all(np.array_equal(mine[k], theirs[k]) if mine[k] is not None else theirs[k] is None for k in mine)
    for value in (CertifiedValue("derived", 12.5, Verdict.HOLDS, "theorem", lower=3.0, details={"k": [1.0]}),
                  not_certified("sdp", "relaxation", "solver failed")):
        back = CertifiedValue.from_json(value.to_json())
        assert back == value and back.to_json() == value.to_json()


def test_the_serial_path_does_not_import_dask():
    code = ("import sys; from lipbound.numeric.scaleout import run_all; "
            "assert run_all(divmod, [(7, 2), (9, 4)]) == [(3, 1), (2, 1)]; "
            "assert not any(m == 'dask' or m.startswith(('dask.', 'distributed')) for m in sys.modules), 'dask'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(DEFAULT_WEIGHTS.parents[3]))


@pytest.mark.slow
def test_whole_model_tasks_on_the_cluster_give_the_serial_report(cluster, tmp_path):
    """``verify --whole`` runs its tasks through the same runner: identical numbers on the cluster (the library's
    call; its fast sibling is the command line's, test_verify_whole_through_the_command_line_...)."""
    from test_whole import _saved, encoder_decoder

    from lipbound.numeric.whole import verify_whole

    model = _saved(encoder_decoder(layers=1), tmp_path)
    settings = dict(n=2, m=2, effort=3, restarts=2, iterations=5)
    seen = []
    serial = verify_whole(model, **settings)
    spread = verify_whole(model, scheduler=cluster, on_task=lambda report, done, total, text: seen.append(done),
                          **settings)
    assert serial.complete and spread.complete and sorted(seen) == list(range(1, len(seen) + 1))
    assert json.dumps(serial.components, sort_keys=True) == json.dumps(spread.components, sort_keys=True)
    assert [b["value"] for b in serial.model_bounds] == [b["value"] for b in spread.model_bounds]


def _without_thread_settings() -> dict:
    """This environment without the BLAS thread counts the tests set (a user's shell sets none)."""
    import os
    return {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                             "MKL_NUM_THREADS")}


def test_every_blas_runs_one_thread_inside_a_task_even_when_loaded_there():
    """numpy's, scipy's and SCS's OpenBLAS each on one thread inside ``single_threaded_blas`` (scipy's is
    loaded by the first task that factors a matrix: a threaded one made serial runs differ from --jobs)."""
    code = ("import json, numpy; from lipbound.numeric.blas import blas_thread_counts, single_threaded_blas\n"
            "with single_threaded_blas():\n"
            "    import scipy.linalg, scs\n"
            "    inside = blas_thread_counts()\n"
            "print(json.dumps([inside, blas_thread_counts()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_without_thread_settings()).stdout
    inside, after = json.loads(out.strip().splitlines()[-1])
    assert len(inside) >= 2 and set(inside.values()) == {1}, inside
    assert after.keys() == inside.keys()


def _whole_serially_and_with_two_jobs(model_path, tmp_path, *options: str) -> tuple[dict, dict]:
    """``verify --whole`` on ``model_path`` in a shell that sets no thread count, then with ``--jobs 2``."""
    reports = []
    for extra, name in (([], "serial"), (["--jobs", "2"], "jobs")):
        subprocess.run([sys.executable, "-m", "lipbound.cli", "verify", str(model_path), "--whole", "--json",
                        str(tmp_path / f"{name}.json"), *options, *extra], check=True, capture_output=True,
                       env=_without_thread_settings(), timeout=1800)
        reports.append(json.loads((tmp_path / f"{name}.json").read_text()))
    return reports[0], reports[1]


def test_verify_whole_through_the_command_line_is_the_same_serially_and_on_the_cluster(cluster, tmp_path):
    """The fast variant of the next two: a generated encoder-decoder (every kind of whole-model task), the serial
    run in a shell that sets no thread count, the other through the command line on the module's two workers
    (``--scheduler``: the runner ``--jobs 2`` starts a cluster of its own for, as in
    test_jobs_2_through_the_cli_matches_serial and the two slow tests below)."""
    from test_whole import encoder_decoder

    from lipbound.numeric.model.plain import save_plain
    path = save_plain(encoder_decoder(layers=1), tmp_path / "encoder-decoder.npz")
    options = ["--n", "2", "--m", "2", "--effort", "2", "--restarts", "1", "--iterations", "3"]
    subprocess.run([sys.executable, "-m", "lipbound.cli", "verify", str(path), "--whole", "--json",
                    str(tmp_path / "serial.json"), *options], check=True, capture_output=True,
                   env=_without_thread_settings(), timeout=1800)
    assert main(["verify", str(path), "--whole", "--json", str(tmp_path / "cluster.json"), *options, "--scheduler",
                 cluster]) == 0
    serial, spread = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("serial", "cluster"))
    assert serial["complete"] and spread["complete"]
    assert {row["component"] for row in serial["components"]} >= {"attention", "ffn", "norm", "residual", "layer"}
    assert serial["components"] == spread["components"]
    assert serial["model_bound"]["value"] == spread["model_bound"]["value"]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_verify_whole_on_minilm_is_the_same_serially_and_with_two_jobs(tmp_path):
    """The whole all-MiniLM-L6-v2 end to end (about 4 and 2.5 minutes): the serial run in a shell that sets no
    thread count, the other in two workers; every component and the model bound agree to the last bit."""
    from lipbound.measures.bert import default_model_dir
    serial, jobs = _whole_serially_and_with_two_jobs(default_model_dir(), tmp_path)
    assert serial["complete"] and jobs["complete"]
    assert serial["components"] == jobs["components"]
    assert serial["model_bound"]["value"] == jobs["model_bound"]["value"]
