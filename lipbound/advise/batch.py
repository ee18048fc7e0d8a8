"""One batch of advise's tasks of every kind on the one scale-out (:func:`lipbound.numeric.scaleout.run_all`).

A task is ``(kind, arguments)`` with ``kind`` one of :data:`RUNNERS`: ``"whole"`` (a task of
``verify --whole``, :func:`lipbound.numeric.whole.run_task`), ``"head"`` (``verify``'s job of one head,
:func:`lipbound.numeric.verification.verify_job`) or ``"local"`` (``L(eps)`` of one layer at one sentence,
:func:`.diagnosis.local_point`).  Running every independent task of a stage in one batch keeps both
workers busy to the end and starts one cluster per stage.  Each result carries the CPU seconds of
the process that ran it (workers included), and a refusal of a theorem (a
:class:`~lipbound.errors.LipboundError`) comes back as the task's ``error`` instead of stopping the
batch: one intervention that cannot be certified is reported as such, the others go on.
"""

from __future__ import annotations

import time

from ..errors import LipboundError
from ..numeric.scaleout import TaskFailed, run_all
from ..numeric.verification import verify_job
from ..numeric.whole import run_task
from .diagnosis import local_point

__all__ = ["RUNNERS", "run_batch"]

RUNNERS = {"whole": run_task, "head": verify_job, "local": local_point}


def _one(kind: str, arguments: tuple) -> dict:
    started = time.process_time()
    try:
        result, error = RUNNERS[kind](*arguments), None
    except LipboundError as refused:
        result, error = None, str(refused)
    return {"result": result, "error": error, "cpu": time.process_time() - started}


def run_batch(tasks, *, jobs: int = 1, progress=None, describe=None) -> list[dict]:
    """``[{"result", "error", "cpu"}]`` of ``tasks`` (pairs ``(kind, arguments)``), in their order;
    ``progress(done, total, text)`` as each finishes, ``text`` from ``describe(index)``."""
    tasks = [(kind, tuple(arguments)) for kind, arguments in tasks]

    def arrived(done, total, index, result):
        if progress is not None:
            progress(done, total, describe(index) if describe else tasks[index][0])

    if progress is not None:
        progress(0, len(tasks), "started")
    try:
        return run_all(_one, tasks, jobs=jobs, progress=arrived)
    except TaskFailed as failure:
        raise failure.error from None
