"""Whole blocks and whole models: the end-to-end certified bound, its breakdown and its witnesses.

* :mod:`.chain` -- a stack of layers as steps with exact JVPs and VJPs (the witnesses);
* :mod:`.tasks` -- the work as independent tasks of plain data and :func:`~.tasks.run_task`;
* :mod:`.report` -- components, layers and end-to-end maps composed from the task results.

:func:`verify_whole` plans the tasks, runs them through :func:`lipbound.numeric.scaleout.run_all`
(in this process, in local processes or on a dask cluster, with the same numbers) and returns the
:class:`~.report.WholeReport`; ``on_task`` sees the report after every task, so a long run can keep
what finished.
"""

from __future__ import annotations

import time

from ...errors import AssumptionError
from ..model import Model
from ..scaleout import TaskFailed, run_all
from .report import LOOSE_GAP, WholeReport
from .tasks import WholeTask, describe_task, plan_tasks, run_task

__all__ = ["verify_whole", "WholeReport", "WholeTask", "describe_task", "plan_tasks", "run_task", "LOOSE_GAP"]


def verify_whole(model: Model, *, n: int = 8, m: int | None = None, domain: str = "layernorm", effort: int = 30,
                 restarts: int = 4, iterations: int = 30, seed: int = 0, jobs: int = 1, scheduler: str | None = None,
                 on_task=None) -> WholeReport:
    """Certify ``model`` end to end with the breakdown (module docstring).

    Parameters
    ----------
    model : Model
        A full checkpoint loaded from a path (every layer with its feed-forward block and norms).
    n, m : int
        Tokens of the stream (of the context for a decoder), and the decoder's tokens (default n).
    domain : str
        How attention domains are taken from the LayerNorm before them (``--radius``).
    effort : int
        L-BFGS steps per smoothing level of LipSDP-Neuron.
    restarts, iterations, seed : int
        Witness starts, power iterations and seed (counted, never timed: the same numbers each run).
    jobs, scheduler
        Run the tasks in ``jobs`` local processes or on the dask cluster at ``scheduler``
        (:func:`lipbound.numeric.scaleout.run_all`); the numbers do not depend on the way.
    on_task : callable, optional
        ``on_task(report, done, total, text)`` after each task (``text`` names it).
    """
    if not isinstance(model, Model) or not model.path:
        raise AssumptionError("model", "a Model loaded from a path (load_weights(path))",
                              type(model).__name__, "load the checkpoint with load_weights(path)")
    if sorted(model.layers) != list(range(model.num_layers)):
        # every task reloads the file at model.path: a subset of its layers would be bound, the whole file witnessed
        raise AssumptionError("model", f"every layer of the checkpoint (0..{model.num_layers - 1})",
                              f"layers {sorted(model.layers)} of {model.num_layers}",
                              "load it without layers=, or write the cut model to its own file and verify that")
    tasks = plan_tasks(model, n=n, m=m, domain=domain, effort=effort, restarts=restarts, iterations=iterations,
                       seed=seed)
    started = time.perf_counter()

    results: list = [None] * len(tasks)

    def arrived(done, total, index, result):
        results[index] = result
        if on_task is not None:
            on_task(WholeReport.build(model, tasks, results, n, m, time.perf_counter() - started), done, total,
                    describe_task(tasks[index]))

    try:
        run_all(run_task, tasks, jobs=jobs, scheduler=scheduler, progress=arrived)
    except TaskFailed as failure:
        raise failure.error from None
    return WholeReport.build(model, tasks, results, n, m, time.perf_counter() - started)
