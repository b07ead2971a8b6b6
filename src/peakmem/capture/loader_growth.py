"""DataLoader training loops whose live device memory grows step by step (a leak).

Under the default policy a DataLoader epoch is shortened (its first batches, then its last) and
the training loop is ended after a few steps (capture.dataloader, capture.phases). That is exact
for a steady loop, whose steps all leave the same bytes live. A loop that keeps something on the
device at every step is not steady: `all_preds.append(logits)` for an epoch-end metric,
`losses.append(loss)` after a `backward(retain_graph=True)` (the step's saved tensors stay with
it). Over a full epoch of N batches it holds N of them, where the shortened capture saw 4.

`LoaderGrowth` reads the bytes live at the end of each training step (the optimizer step's
post hook), over the steps one epoch feeds in a row. When each of the last two steps left more
bytes live than the step before, and that growth over the epoch's length (or
`MAX_GROWING_STEPS` steps, the length unknown) comes to more than `GROWTH_BYTES`, the epoch keeps
yielding full batches and the loop is not ended (`hold`), at most `MAX_GROWING_STEPS` steps past
the point the capture would have shortened or ended it. If it still grows there, the rest of the
epoch is extrapolated linearly: the note and the trace's `step_growth` record (the estimate's
JSON) give the bytes per step and the extrapolated peak, labelled so; the estimate's peak stays
the traced one (what the simulated allocator replayed), never the extrapolation.
A host copy (`all_preds.append(logits.cpu())`) leaves no device bytes: not flagged. An explicit
`--steps N` and `--steps all` are never extended (the latter runs every batch anyway).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from peakmem.capture.session import CaptureSession
from peakmem.capture.step_growth import GROWTH_BYTES, MAX_GROWING_STEPS

MIB = 1 << 20
GB = 1e9
_MAX_SAMPLES = MAX_GROWING_STEPS + 8
META_KEY = "step_growth"


class LoaderGrowth:
    """The live bytes at the end of each step a DataLoader fed; whether to keep stepping."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        # (live bytes, trace length) at the end of each step fed by one epoch in a row (a step
        # fed by another epoch, or by none, starts again: an epoch's smaller last batch, then
        # the next epoch's full ones, would read as growth)
        self._samples: list[tuple[int, int]] = []
        self._epoch: int | None = None
        self._hold_start: int | None = None  # state.steps when the hold began
        self.done = False  # the hold is over (one per job: it bounds the capture's time)
        self.held_steps = 0  # steps taken while held
        self.stopped_growing_at: int | None = None
        self.capped: dict[str, Any] | None = None  # what was seen at the cap (still growing)

    # -- samples -----------------------------------------------------------------------------
    def step_fed(self, feeding: Any) -> None:
        """A training step ended; `feeding` is the LoaderIteration that fed it (None: none)."""
        if feeding is None:
            self._samples, self._epoch = [], None
            return
        if id(feeding) != self._epoch:
            self._samples, self._epoch = [], id(feeding)
        session = self.session
        self._samples.append((session.allocated_bytes, len(session.trace)))
        del self._samples[:-_MAX_SAMPLES]
        if self._hold_start is not None and not self.done:
            self.held_steps = session.state.steps - self._hold_start

    def _run_start(self) -> int:
        """Index of the first sample of the latest run of growing steps."""
        samples = self._samples
        start = len(samples) - 1
        while start > 0 and samples[start][0] > samples[start - 1][0]:
            start -= 1
        return start

    def rate(self) -> int:
        """Bytes per step over the latest run of growing steps (0: the last step did not grow)."""
        start, samples = self._run_start(), self._samples
        steps = len(samples) - 1 - start
        return 0 if steps <= 0 else (samples[-1][0] - samples[start][0]) // steps

    def growing(self, feeding: Any) -> bool:
        """Each of the last two steps left more bytes live than the one before, enough to
        matter over the epoch (more than GROWTH_BYTES over its length, or MAX_GROWING_STEPS)."""
        samples = self._samples
        if len(samples) < 3 or not samples[-3][0] < samples[-2][0] < samples[-1][0]:
            return False
        steps = epoch_steps(feeding) or MAX_GROWING_STEPS
        return self.rate() * steps > GROWTH_BYTES

    # -- the decision --------------------------------------------------------------------------
    def hold(self, feeding: Any) -> bool:
        """Whether `feeding`'s epoch keeps yielding full batches (no skip to its last) and the
        loop is not ended yet: its live memory still grows, fewer than MAX_GROWING_STEPS steps
        held. Asked by the epoch at each batch where it would skip, by the phase tracker at each
        step at the limit; once it says no, it says no for the rest of the job."""
        if self.done or self._epoch != id(feeding):
            return False
        steps = self.session.state.steps
        if not self.growing(feeding):
            if self._hold_start is not None:
                self.done, self.stopped_growing_at = True, steps
            return False
        if self._hold_start is None:
            self._hold_start = steps
        if steps - self._hold_start >= MAX_GROWING_STEPS:
            self.done = True
            self.capped = self._extrapolate(feeding)
            self.session.trace.meta[META_KEY] = dict(self.capped)
            return False
        return True

    def _extrapolate(self, feeding: Any) -> dict[str, Any]:
        rate, samples = self.rate(), self._samples
        epoch = epoch_steps(feeding)
        # the epoch's last batch is traced after the skip (when it can skip to it)
        traced = feeding.steps_fed + (1 if feeding.can_skip else 0)
        remaining = None if epoch is None else max(0, epoch - traced)
        return {
            "extrapolated": True,
            "bytes_per_step": rate,
            "at_step": self.session.state.steps,
            "epoch_steps": epoch,
            "steps_traced_in_epoch": feeding.steps_fed,
            "steps_not_traced_in_epoch": remaining,
            "extrapolated_extra_bytes": None if remaining is None else rate * remaining,
            "kept": self._kept(samples[-3][1], samples[-2][1]),
        }

    def _kept(self, begin: int, end: int) -> str | None:
        """What the step before the last allocated and still holds after the last (kept across
        a step: not its gradients or temporaries), by op and module (largest first)."""
        trace, sizes = self.session.trace, Counter()
        for record in list(self.session.live.values()):
            if begin <= record.alloc_index < end:
                tag = trace.tag_of(record.alloc_index)
                what = "an allocation" if tag is None else (
                    f"{tag.op or 'an op'}'s output"
                    + (f" in {tag.module}" if tag.module else "")
                    + (f" ({tag.category})" if tag.category else ""))
                sizes[what] += record.nbytes
        if not sizes:
            return None
        return ", ".join(f"{what}: {size:,} B" for what, size in sizes.most_common(3))

    # -- what the estimate says -----------------------------------------------------------------
    def notes(self, unit: str) -> list[str]:
        if self._hold_start is None:
            return []
        if self.capped is None:
            when = (f"; it stopped growing at step {self.stopped_growing_at}"
                    if self.stopped_growing_at is not None else "")
            return [f"kept training a DataLoader epoch {self.held_steps} {unit} past the point "
                    "peakmem shortens it while the live device memory grew at each step (an "
                    f"optimizer history that fills, tensors kept across steps){when}"]
        capped = self.capped
        rate = capped["bytes_per_step"]
        kept = f" (kept each step: {capped['kept']})" if capped["kept"] else ""
        text = (f"the live device memory grew by {rate / MIB:.2f} MiB per {unit.rstrip('s')} "
                f"in a DataLoader loop{kept}, still at step {capped['at_step']} "
                f"({MAX_GROWING_STEPS} steps past the point peakmem shortens the epoch): "
                "tensors kept on the device across steps (`all_preds.append(logits)`, "
                "`losses.append(loss)` with its graph) grow with the number of steps")
        extra = capped["extrapolated_extra_bytes"]
        if extra is not None:
            reach = self.session.max_allocated_bytes + extra
            text += (f"; a full epoch of {capped['epoch_steps']} steps would hold "
                     f"~{_size(extra)} more and reach ~{_size(reach)} allocated "
                     "(EXTRAPOLATED linearly, not traced: the estimate's peak is the traced "
                     "one, the JSON's step_growth gives the extrapolated peak)")
        else:
            text += "; the epoch's length is unknown: not extrapolated"
        text += "; --steps all runs every batch"
        return [text]


def epoch_steps(feeding: Any) -> int | None:
    """Steps a full epoch of `feeding` takes: its true length over its accumulation window."""
    length = getattr(feeding, "length", None)
    if length is None:
        return None
    window = feeding.window or feeding._loaders.window or 1
    return -(-length // window)


def _size(nbytes: int) -> str:
    return f"{nbytes / GB:.2f} GB" if nbytes >= GB else f"{nbytes / MIB:.1f} MiB"
