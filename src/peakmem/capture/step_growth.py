"""Steps whose peak still grows when the default step limit is reached.

The default policy (capture.phases) ends or stops a loop that does not iterate a DataLoader after
`auto_step_limit` steps (3). That is enough for a steady loop: from its second step on each
step makes the same allocations. Some loops are not steady by then:

- an optimizer whose state grows step by step: `torch.optim.LBFGS` keeps up to `history_size`
  (100) pairs of parameter-sized vectors, `max_iter` (20) more per step: the pytorch/tutorials
  neural style transfer fills its history at the 6th step (59 pairs after 3 steps: 1.106 GB
  vs 1.372 GB at its end);
- tensors the job keeps across steps (`losses.append(loss)` keeps each step's graph: a leak a
  GPU run turns into an out-of-memory error).

So, under the default policy only, a loop without a DataLoader whose last step raised the
peak (the most bytes allocated so far) by more than `GROWTH_BYTES` keeps going, one step at a
time, at most `MAX_GROWING_STEPS` steps past the limit; the estimate's note says how many and,
when the peak still grew at that cap, that it may be low (the job's memory grows with its step
count, which `--steps all` runs to the end). An explicit `--steps N` is never extended.
A DataLoader loop's growth is read from the bytes live at each step's end instead
(capture.loader_growth: its epoch is held, the rest extrapolated).
"""

from __future__ import annotations

from peakmem.capture.session import CaptureSession

MIB = 1 << 20
GROWTH_BYTES = 2 * MIB
"""A step raised the peak when the most bytes allocated so far grew by more than this during
it (the bar the estimates aim for: within 2 MiB of the measured peak)."""
MAX_GROWING_STEPS = 16
"""Steps past the limit a loop may take while its peak still grows (LBFGS's default history
fills within 6 steps; a leak never stops growing: the cap bounds the capture's time)."""


class StepGrowth:
    """The peak after each step; whether a loop at the step limit should take one more."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        self._peak_before: int | None = None  # the peak when the previous step ended
        self.last_growth = 0  # bytes the last step raised the peak by
        self.extra_steps = 0  # steps taken past the limit because the peak grew (all loops)
        self._loop_extra = 0  # those of the current loop
        self.capped_at: int | None = None  # the step at which growth was still seen at the cap
        self.capped_growth = 0

    def step_taken(self) -> None:
        peak = self.session.max_allocated_bytes
        before, self._peak_before = self._peak_before, peak
        self.last_growth = 0 if before is None else max(0, peak - before)

    def keep_going(self, steps: int) -> bool:
        """At the step limit (`steps` of the current loop): take one more step when the last
        one raised the peak by more than `GROWTH_BYTES` and the cap is not reached."""
        if self.last_growth <= GROWTH_BYTES:
            return False
        if self._loop_extra >= MAX_GROWING_STEPS:
            self.capped_at, self.capped_growth = steps, self.last_growth
            return False
        self._loop_extra += 1
        self.extra_steps += 1
        return True

    def loop_ended(self) -> None:
        """A loop was ended: the next one gets its own allowance."""
        self._loop_extra = 0

    def notes(self, unit: str) -> list[str]:
        notes = []
        if self.extra_steps:
            notes.append(
                f"kept training {self.extra_steps} {unit} past the step limit while each raised "
                f"the peak by more than {GROWTH_BYTES // MIB} MiB (memory that grows with the "
                "steps: an optimizer history that fills, tensors kept across steps)"
            )
        if self.capped_at is not None:
            notes.append(
                f"the peak still grew at step {self.capped_at} (+{self.capped_growth / MIB:.1f} "
                f"MiB in that step, {MAX_GROWING_STEPS} steps past the limit): the job's memory "
                "grows with its number of steps (a history or tensors kept across steps), so "
                "the estimate may be low for a longer run; --steps all runs it to the end"
            )
        return notes
