"""The host time a job's compiled regions took, for the CUDA-event timings the job takes.

The capture runs compiled code eagerly (fake_cuda's `compile_as_eager`) and answers
`torch.cuda.Event.elapsed_time` with the process's CPU time between the records. A job that
times the same work eager and compiled then sees two equal times give or take noise, and a job
that asserts the compiled run is faster (pytorch/tutorials' torch_compile_tutorial: `assert
speedup > 1` on the median times, before it trains) failed about half of the time, with no
estimate. Host time spent inside a compiled region counts at `COMPILED_TIME_SHARE` of itself in
an elapsed time: the compiled run is the faster one, as Inductor's kernels make it on a GPU.
The times stay the host's (noted), not the GPU's.

The clock is the process's CPU time (`time.process_time`), not the wall clock: a GPU event
times the work queued between its records, not the host's waits, and on a loaded machine the
wall clock counts the time the job was not scheduled. With the wall clock the tutorial's median
of three compiled runs came out slower than the eager median in a CI run on a loaded machine
(preemption noise larger than the 2x margin); CPU time does not count preemption.
"""

from __future__ import annotations

import time

COMPILED_TIME_SHARE = 0.5
"""The share of a compiled region's host time an elapsed time counts."""

NOTE = (
    "CUDA-event timings the job took are the host process's CPU time, with the time its compiled "
    f"code (run eagerly here) took counted at {COMPILED_TIME_SHARE:g} of itself, so that "
    "compiled runs time faster than eager ones as on a GPU; they are not GPU times"
)


class CompiledClock:
    """Process CPU seconds spent inside outermost compiled regions (nested regions count once)."""

    def __init__(self) -> None:
        self.depth = 0
        self.spent = 0.0
        self.entered_at = 0.0

    def enter(self) -> None:
        if self.depth == 0:
            self.entered_at = time.process_time()
        self.depth += 1

    def leave(self) -> None:
        if self.depth == 0:  # a region that began before the clock was made
            return
        self.depth -= 1
        if self.depth == 0:
            self.spent += time.process_time() - self.entered_at

    def seconds(self) -> float:
        """Seconds spent in compiled regions so far (an open region up to now)."""
        running = time.process_time() - self.entered_at if self.depth else 0.0
        return self.spent + running


CLOCK = CompiledClock()
"""The process's clock: compiled regions run in the job's threads, one capture at a time."""


def elapsed_ms(started: tuple[float, float], ended: tuple[float, float]) -> tuple[float, bool]:
    """Milliseconds between two (wall, compiled) readings, compiled time discounted; and
    whether any compiled time fell between them."""
    wall = ended[0] - started[0]
    compiled = max(0.0, ended[1] - started[1])
    return max((wall - (1 - COMPILED_TIME_SHARE) * compiled) * 1000.0, 1e-3), compiled > 0


def reading() -> tuple[float, float]:
    return time.process_time(), CLOCK.seconds()
