"""Independent tasks run in order, in local processes or on a dask.distributed cluster.

A verification of a whole model is hundreds of independent jobs (a witness search and the
certified bounds of one head or layer).  :func:`run_all` runs such jobs three ways, with one
result whatever the way:

* ``jobs=1`` (no scheduler): a plain loop in this process; dask is not imported;
* ``jobs=J > 1``: a :class:`dask.distributed.LocalCluster` of J worker processes with one thread
  each, started for the call and closed after it;
* ``scheduler="tcp://host:8786"``: the workers of a running dask cluster (started with
  ``dask scheduler`` and ``dask worker tcp://host:8786`` on each machine).

The function must be importable by the workers (defined at module level) and a task is plain
data -- numpy arrays, numbers, strings, dicts and small tuples of them -- passed as
``function(*task)``; results are plain data too (no cvxpy problem or SymPy object travels, a job
builds those where it runs).  Every call runs with one BLAS thread (:mod:`lipbound.numeric.blas`),
in this process as in a worker, so J workers do not oversubscribe the cores and every way
computes the same floating-point numbers; local workers also start with ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to 1.

Failure: the first task that raises stops the run.  The tasks not yet finished are cancelled,
and :class:`TaskFailed` is raised with the results of every task that had finished (each was
also handed to ``progress`` when it finished) and the task's own exception.
"""

from __future__ import annotations

import numbers
import os
import uuid
from collections.abc import Callable, Sequence

from ..errors import AssumptionError, ClusterError
from .blas import single_threaded_blas

__all__ = ["run_all", "check_jobs", "local_cluster", "TaskFailed", "BLAS_ENVIRONMENT"]

#: Environment of local worker processes: one thread for every BLAS numpy or a solver may load
#: (dask's own default, less its malloc setting; see :func:`local_cluster`).
BLAS_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

#: ``progress(done, total, index, result)``: ``result`` of task ``index`` just finished, ``done`` of ``total``.
Progress = Callable[[int, int, int, object], None]


class TaskFailed(Exception):
    """A task raised: the run stopped, the unfinished tasks were cancelled.

    Attributes
    ----------
    index : int
        The task that failed (counted from 0, in the order given).
    error : BaseException
        Its exception.
    results : list
        One entry per task: its result if it finished, else None.
    finished : list of int
        The tasks that finished, in order.
    """

    def __init__(self, index: int, error: BaseException, results: list, finished: list[int]):
        self.index, self.error, self.results, self.finished = index, error, results, sorted(finished)
        super().__init__(f"task {index + 1} of {len(results)} failed ({type(error).__name__}: {error}); "
                         f"{len(self.finished)} finished result{'s' if len(self.finished) != 1 else ''} kept")


def check_jobs(jobs) -> int:
    """``jobs`` as a positive int, or :class:`~lipbound.errors.AssumptionError`."""
    if isinstance(jobs, bool) or not isinstance(jobs, numbers.Integral) or jobs < 1:
        raise AssumptionError("jobs", "a whole number of worker processes >= 1", repr(jobs),
                              f"ask for e.g. `jobs` 2, at most the {os.cpu_count() or 1} cores here")
    return int(jobs)


def _call(function: Callable, task: tuple):
    """One task, with one BLAS thread (the same in this process and in a worker)."""
    with single_threaded_blas():
        return function(*task)


def run_all(function: Callable, tasks: Sequence, *, jobs: int = 1, scheduler: str | None = None,
            progress: Progress | None = None) -> list:
    """``[function(*task) for task in tasks]``, serially, in J local processes or on a dask cluster.

    Parameters
    ----------
    function : callable
        Defined at module level (workers import it by name); called as ``function(*task)``.
    tasks : sequence of tuple
        Plain data: numpy arrays, numbers, strings, dicts and tuples of them.
    jobs : int
        1: a loop in this process; J > 1: a LocalCluster of J processes, one thread each.
    scheduler : str, optional
        Address of a running dask scheduler (``tcp://host:8786``); its workers run the tasks.
    progress : callable, optional
        ``progress(done, total, index, result)`` as each task finishes (in the order they finish).

    Returns
    -------
    list
        The results in the order of ``tasks``.

    Raises
    ------
    TaskFailed
        A task raised (see the module docstring).
    AssumptionError, ClusterError
        Bad ``jobs`` or ``tasks``; no scheduler answering at ``scheduler``; dask not installed.
    """
    jobs = check_jobs(jobs)
    tasks = list(tasks)
    for position, task in enumerate(tasks):
        if not isinstance(task, tuple):
            raise AssumptionError("tasks", "a tuple of arguments per task", f"{type(task).__name__} at position "
                                  f"{position}", "wrap the arguments of each call in a tuple: (x,)")
    if scheduler is not None and jobs != 1:
        raise AssumptionError("jobs", "no count of local processes together with a scheduler (its workers run the "
                              "tasks)", f"jobs = {jobs} and scheduler {scheduler!r}", "drop `jobs` or `scheduler`")
    if scheduler is None and jobs == 1:
        return _serial(function, tasks, progress)
    return _distributed(function, tasks, jobs, scheduler, progress)


def _serial(function, tasks, progress) -> list:
    results: list = [None] * len(tasks)
    for index, task in enumerate(tasks):
        try:
            results[index] = _call(function, task)
        except Exception as error:
            raise TaskFailed(index, error, results, list(range(index))) from error
        if progress is not None:
            progress(index + 1, len(tasks), index, results[index])
    return results


def _connect(scheduler: str):
    """A client of the scheduler at ``scheduler`` with at least one worker, waiting dask's
    ``distributed.comm.timeouts.connect`` (e.g. ``DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=5s``)."""
    import dask
    from dask.distributed import Client
    from dask.utils import parse_timedelta
    timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect", default="30s"), default="seconds")
    how = (f"start one with `dask scheduler` and a worker per machine with `dask worker {scheduler}`, "
           "or check the address")
    try:
        client = Client(scheduler, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as error:
        raise ClusterError("scheduler", f"a dask scheduler answering at {scheduler}",
                           f"no answer within {timeout:g} s ({type(error).__name__})", how) from None
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (OSError, TimeoutError):
        client.close()
        raise ClusterError("scheduler", f"a dask scheduler at {scheduler} with at least one worker",
                           f"no worker within {timeout:g} s", f"start workers with `dask worker {scheduler}`") from None
    return client


def local_cluster(workers: int):
    """A :class:`dask.distributed.LocalCluster` of ``workers`` processes, one thread each, no
    dashboard (the scheduler's HTTP endpoints on a free port: on 8787, the default, a second cluster
    warns), started with :data:`BLAS_ENVIRONMENT` only: dask's default worker environment also
    sets ``MALLOC_TRIM_THRESHOLD_``, which turns glibc's reuse of large blocks off and costs numpy
    code full of temporaries many times the system time (measured 8x on witness searches)."""
    import dask
    from dask.distributed import LocalCluster
    with dask.config.set({"distributed.nanny.pre-spawn-environ": dict(BLAS_ENVIRONMENT)}):
        return LocalCluster(n_workers=check_jobs(workers), threads_per_worker=1, processes=True,
                            dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"})


def _distributed(function, tasks, jobs, scheduler, progress) -> list:
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise ClusterError("scheduler" if scheduler else "jobs", "dask.distributed installed", "not installed",
                           "pip install 'lipbound[scale]', or run with `jobs` 1") from None
    cluster = None
    if scheduler is not None:
        client = _connect(scheduler)
    else:
        cluster = local_cluster(jobs)
        client = Client(cluster)
    results: list = [None] * len(tasks)
    finished: list[int] = []
    run = uuid.uuid4().hex[:12]
    try:
        # each task's data goes to a worker beside the graph: a task carrying a layer's matrices (megabytes) would
        # otherwise travel inside the graph through the scheduler (and dask warns of a large graph)
        data = client.scatter(tasks, hash=False)
        futures = {client.submit(_call, function, task, key=f"lipbound-{run}-{index}", pure=False): index
                   for index, task in enumerate(data)}
        for future in as_completed(futures):
            index = futures[future]
            if future.status == "error":
                error = future.exception()
                client.cancel([f for f in futures if not f.done()])
                raise TaskFailed(index, error, results, finished) from error
            results[index] = future.result()
            finished.append(index)
            if progress is not None:
                progress(len(finished), len(tasks), index, results[index])
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return results
