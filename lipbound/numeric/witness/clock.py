"""The search's clock: work done, counted in nominal seconds, so that a seed fixes the witness.

A search that stops at a wall-clock deadline finds different witnesses on a busy machine, a
fast one, or in a worker process next to others.  :class:`WorkClock` instead counts the work the
search has done, from a cost model of its batched operations -- an evaluation of the local
Jacobian norm of ``b`` inputs with ``s`` power steps on a map of ``H`` heads, ``r`` rows and
working width ``k`` costs ``b (s + 3) H r (r (d_k + d_v) + k (2 d_k + d_v)) + c_call`` multiply-adds
-- converted to seconds at :data:`WORK_PER_SECOND`, the single-thread rate of a 2020s x86 core.
Every deadline of the search (:mod:`.search`, :mod:`.ascent`, :mod:`.starts`) is read on this clock,
so ``budget_seconds`` buys the same steps and restarts on every machine, serially or in a dask
worker: the same seed gives the same witness.  A nominal second is now about a quarter of a CPU second
(:data:`WORK_PER_SECOND`), more on a loaded or slower machine.
"""

from __future__ import annotations

__all__ = ["WorkClock", "WORK_PER_SECOND", "CALL_WORK"]

#: Multiply-adds of the cost model per nominal second, calibrated with one OpenBLAS thread on
#: all-MiniLM-L6-v2 layer 0: a head at n = 4 to 32 and the whole layer at n = 8 took about 0.6 to
#: 1.5 times the budget in wall-clock seconds on a 2020s AMD EPYC core.  The engine has since become
#: faster than the model counts: measured in CPU seconds (``time.process_time``) per nominal second at
#: n = 8, a head takes 0.23 (MiniLM layer 0) to 0.28 (SmolLM2 block 0) at a budget of 1 and 0.17 to 0.21 at
#: budgets of 4 to 30 (the polish is cheaper per counted unit than the starts), a whole layer 0.16 (MiniLM)
#: to 0.28 (SmolLM2); 0.30 for a MiniLM head at n = 4.  Raising the rate by 4 (a power of two, so that
#: budgets divided by 4 give bit-identical searches) would make a nominal second about a CPU second.
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
