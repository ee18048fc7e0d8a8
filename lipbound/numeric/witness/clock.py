"""The search's clock: work done, counted in nominal seconds, so that a seed fixes the witness.

A search that stops at a wall-clock deadline finds different witnesses on a busy machine, a
fast one, or in a worker process next to others.  :class:`WorkClock` instead counts the work the
search has done, from a cost model of its batched operations -- an evaluation of the local
Jacobian norm of ``b`` inputs with ``s`` power steps on a map of ``H`` heads, ``r`` rows and
working width ``k`` costs ``b (s + 3) H r (r (d_k + d_v) + k (2 d_k + d_v)) + c_call`` multiply-adds
-- converted to seconds at :data:`WORK_PER_SECOND`, the single-thread rate of a 2020s x86 core.
Every deadline of the search (:mod:`.search`, :mod:`.ascent`, :mod:`.starts`) is read on this clock,
so ``budget_seconds`` buys the same steps and restarts on every machine, serially or in a dask
worker: the same seed gives the same witness, and the budget is about the seconds it takes on an
idle core (more on a loaded or slower one).
"""

from __future__ import annotations

__all__ = ["WorkClock", "WORK_PER_SECOND", "CALL_WORK"]

#: Multiply-adds of the cost model per nominal second, calibrated with one OpenBLAS thread on
#: all-MiniLM-L6-v2 layer 0: a head at n = 4 to 32 and the whole layer at n = 8 take about 0.6 to
#: 1.5 times the budget in wall-clock seconds on a 2020s AMD EPYC core.
WORK_PER_SECOND = 6.0e8
#: The fixed cost of one batched call (Python and numpy dispatch), in multiply-adds.
CALL_WORK = 2.0e5


class WorkClock:
    """Nominal seconds of work done so far; ``clock()`` reads it, ``charge(units)`` advances it."""

    def __init__(self):
        self.spent = 0.0

    def __call__(self) -> float:
        return self.spent

    def charge(self, units: float) -> None:
        self.spent += (units + CALL_WORK) / WORK_PER_SECOND
