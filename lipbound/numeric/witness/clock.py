"""The search's clock: work done, counted in nominal seconds, so that a seed fixes the witness.

A search that stops at a wall-clock deadline finds different witnesses on a busy machine, a
fast one, or in a worker process next to others.  :class:`WorkClock` instead counts the work the
search has done, from a cost model of its batched operations -- an evaluation of the local
Jacobian norm of ``b`` inputs with ``s`` power steps on a map of ``H`` heads, ``r`` rows and
working width ``k`` costs ``(s + 3) max(b max(w, c_input), c_step) + c_call`` multiply-adds, with
``w = H r (r (d_k + d_v) + k (2 d_k + d_v))`` per input and step (:func:`step_work`)
-- converted to seconds at :data:`WORK_PER_SECOND`, the single-thread rate of a 2020s x86 core.
Every deadline of the search (:mod:`.search`, :mod:`.ascent`, :mod:`.starts`) is read on this clock,
so ``budget_seconds`` buys the same steps and restarts on every machine, serially or in a dask
worker: the same seed gives the same witness.  A nominal second is about half a CPU second
(:data:`WORK_PER_SECOND`), more on a loaded or slower machine.
"""

from __future__ import annotations

__all__ = ["WorkClock", "WORK_PER_SECOND", "CALL_WORK", "STEP_WORK", "INPUT_WORK", "step_work"]

#: Multiply-adds of the cost model per nominal second, calibrated with one OpenBLAS thread on
#: all-MiniLM-L6-v2 layer 0: a head at n = 4 to 32 and the whole layer at n = 8 took about 0.6 to
#: 1.5 times the budget in wall-clock seconds on a 2020s AMD EPYC core.  Measured since in CPU seconds
#: (``time.process_time``) per nominal second, side by side on a shared 2-core machine (load 5 to 8), at verify's
#: n = 8 on the LayerNorm (RMSNorm) image, a head at a budget of 4 and a layer at 8: a MiniLM layer-0 head 0.67 to
#: 0.94, a SmolLM2 block-0 head 0.35 to 0.39, MiniLM's layer 0.28 to 0.30, a whole verify of MiniLM's layer 0 and of
#: SmolLM2's block 0 (their heads and layer) 0.52 and 0.44; a tiny rotary head and layer of width 6 at n = 5, at
#: budgets of 0.1 to 1, 0.95 to 1.5 (4 to 5 before :data:`STEP_WORK` and :data:`INPUT_WORK`).  Raising the rate by a
#: power of two keeps searches bit-identical when budgets are divided by it.
WORK_PER_SECOND = 6.0e8
#: The fixed cost of one batched call (Python and numpy dispatch), in multiply-adds.
CALL_WORK = 2.0e5
#: The least cost of one step of a batched evaluation (a power step, or one of the passes around them), in
#: multiply-adds: the dispatch of its dozen numpy operations, about 0.1 ms of CPU whatever the map's size.
STEP_WORK = 6.5e4
#: The least cost of one input in one step: numpy's products of tiny matrices run far below the rate of
#: :data:`WORK_PER_SECOND` (measured: 6 to 13 us of CPU per input and step on heads and layers of width 6).
INPUT_WORK = 1.0e4


def step_work(batch: int, work_per_input: float) -> float:
    """Multiply-adds charged for one step of a batched evaluation of ``batch`` inputs.

    ``max(batch * max(w, INPUT_WORK), STEP_WORK)`` for ``w`` multiply-adds per input: the arithmetic, or, on maps so
    small that the dispatch outweighs it, the dispatch.  Without these floors the search's budget bought 4 to 8
    CPU seconds per nominal second on the tests' tiny heads against 0.3 to 0.9 on the real models.  A map with
    ``w >= STEP_WORK`` never meets a floor: verify's heads and layers of MiniLM (a head at n = 8: ``w`` = 77 824) and
    SmolLM2 at n >= 8 are charged their arithmetic alone, as before, so their witnesses are the same bit for bit.
    Below it lie MiniLM's single heads at n <= 6 (``w`` = 57 600 at n = 6, 9 280 at n = 1) and SmolLM2's at n = 1:
    their one-input steps now cost the floor, so a budget buys them somewhat fewer steps than before.
    """
    return max(batch * max(work_per_input, INPUT_WORK), STEP_WORK)


class WorkClock:
    """Nominal seconds of work done so far; ``clock()`` reads it, ``charge(units)`` advances it."""

    def __init__(self):
        self.spent = 0.0

    def __call__(self) -> float:
        return self.spent

    def charge(self, units: float) -> None:
        self.spent += (units + CALL_WORK) / WORK_PER_SECOND

    def charge_steps(self, batch: int, steps: int, work_per_input: float) -> None:
        """One batched call of ``steps`` steps on ``batch`` inputs (:func:`step_work`)."""
        self.charge(steps * step_work(batch, work_per_input))
