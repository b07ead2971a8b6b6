"""Steady-state step repetition (issue 14): once the last few training steps left the same
events in the trace, the remaining steps up to the step limit are written by repeating the
last one instead of running the job through them.

What is compared: the trace window of each step (the events after the previous step's mark, up
to and including its own mark). Two windows are isomorphic when they match event for event —
kind, requested size, stream and tag (marks: the same labels, a step mark one step on) — and
every allocation id of the later one is the earlier one's plus one constant shift (the ids the
step consumes), every free referring to an allocation of its own window or the one before
(tensors living across a step: the batch, the loss, outputs kept into the next forward).

When it is used ("provably repeats"), all of:
- it was asked for (`PhaseTracker(repeat_steady=True)`, `PEAKMEM_REPEAT_STEADY=1`): peakmem
  cannot see code that depends on the step count (`if step == 5:`, a learning-rate schedule that
  allocates, a loop that ends by itself before the limit), so the job's author vouches that
  the job runs at least N steps and that they repeat;
- the job is stopped at an explicit step limit (`--steps N`, StopJob after an optimizer step):
  what follows the last step is then the same StopJob wherever it is raised, so the job can be
  stopped at step K with its live tensors standing for step N's (their ids shifted);
- a DataLoader feeding the steps does so one batch a step, from one epoch, and its batches up to
  the limit are full ones: the epoch's last batch (often smaller) and the next epoch run for
  real (the steps of a later epoch may be repeated among themselves);
- fake mode (eager mode follows real values, which may change later steps' shapes), no other
  stream used (record_stream), the memory not capped (`set_per_process_memory_fraction`: an OOM
  could come in a later step), and nothing allocated before the previous window is freed or
  left alive per step (a leak);
- `REQUIRED_WINDOWS` consecutive windows are isomorphic (the first step, which allocates the
  optimizer state, never is).
Everything the capture counts per step (steps, forward calls, backward passes, host reads,
in-place gradient accumulations, the peak of allocated bytes) is advanced as the repeated steps
would have, so the estimate, its notes and its trace are those of the full run; one note says
which steps were repeated.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from peakmem.trace.events import ALLOC_KINDS, POOL_KINDS, EventKind, Tag, Trace

REQUIRED_WINDOWS = 3
"""Consecutive isomorphic step windows needed before the rest are repeated (conservative)."""
ENV_FLAG = "PEAKMEM_REPEAT_STEADY"
TALLIES = ("data_dependent", "branches_in_place")
"""The session's dict[str, int] counts (data-dependent ops met, results replayed as in place by
branch, where the session has them): a repeated step adds what the template step added."""
STEADY_MARKS = frozenset({"forward", "backward", "optimizer"})
"""Marks a repeatable window may hold besides its step mark (eval, loop ended, ... are not)."""
_ID_KINDS = frozenset({int(EventKind.ALLOC), int(EventKind.ALLOC_OR_SMALLER), int(EventKind.FREE)})
_REFUSED_KINDS = frozenset({int(EventKind.RECORD_STREAM), int(EventKind.FREE_COMPLETED)}) | {
    int(kind) for kind in POOL_KINDS  # a graph captured (a pool made) per step: one pool each
}
_ALLOC_KINDS = frozenset(int(k) for k in ALLOC_KINDS)
_FREE = int(EventKind.FREE)
_MARK = int(EventKind.MARK)


def enabled_by_env() -> bool:
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes", "on")


@contextmanager
def repeating_steady_steps() -> Iterator[None]:
    """Step repetition asked for while the block runs (captures started in it read it)."""
    before = os.environ.get(ENV_FLAG)
    os.environ[ENV_FLAG] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_FLAG, None)
        else:
            os.environ[ENV_FLAG] = before


@dataclass(frozen=True)
class StepWindow:
    """One step's events: trace[start:end] (its mark last), the allocation ids it could use
    ([first_id, end_id)) and the capture's counters when it ended."""

    step: int
    start: int
    end: int
    first_id: int
    end_id: int
    counters: tuple[int, ...]
    tallies: dict[tuple[str, str], int]
    """The session's per-name tallies (TALLIES) when it ended, by (attribute, name)."""
    source: int = 0
    """id() of the DataLoader epoch that fed the step (0: none): compared steps share one."""


class StepRepeater:
    """Watches the step windows of one capture; repeats the steady one on request."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.windows: list[StepWindow] = []
        self._last_end = 0
        self._last_id = 0
        self.repeated: tuple[int, int, int] | None = None  # (first, last, template step)

    # -- recording -----------------------------------------------------------------------------
    def _counters(self) -> tuple[int, ...]:
        session, state = self.session, self.session.state
        return (
            state.forward_calls,
            state.backward_passes,
            state.manual_steps,
            session.host_reads,
            session.accumulations_in_place,
            len(session.notes),
            len(session.libraries),
            len(session.failure_hints),
        )

    def step_marked(self, step: int, source: int = 0) -> None:
        """The mark of `step` was just written: close its window (`source`: see StepWindow)."""
        trace = self.session.trace
        end = len(trace)
        window = StepWindow(step, self._last_end, end, self._last_id, trace._next_id,
                            self._counters(), _tallies(self.session), source)
        self._last_end, self._last_id = end, trace._next_id
        self.windows.append(window)
        if len(self.windows) > REQUIRED_WINDOWS + 1:
            del self.windows[0]

    # -- the steady state ----------------------------------------------------------------------
    def steady(self) -> bool:
        """Whether the last REQUIRED_WINDOWS windows are isomorphic (each to the one before)."""
        windows = self.windows
        if len(windows) < REQUIRED_WINDOWS + 1:
            return False  # the window before the first compared one bounds its frees
        session = self.session
        if session.eager:  # real values: later steps' shapes may follow them
            return False
        if session.memory is not None and getattr(session.memory, "strict", False):
            return False
        if session._recorded or session._deferred or session._pending_accumulation:
            return False
        trace = session.trace
        compared = windows[-REQUIRED_WINDOWS:]
        for before, window in zip(windows[-REQUIRED_WINDOWS - 1:], compared, strict=False):
            if window.step != before.step + 1 or window.source != compared[0].source:
                return False
        first = compared[0]
        for before, window in zip(windows[-REQUIRED_WINDOWS - 1:], compared, strict=False):
            if not _repeatable(trace, window, before.first_id):
                return False
        deltas = _delta(windows[-REQUIRED_WINDOWS - 1].counters, first.counters)
        if any(deltas[5:]):  # notes, libraries, hints: must not move
            return False
        tally_deltas = _tally_delta(windows[-REQUIRED_WINDOWS - 1].tallies, first.tallies)
        pairs = list(zip(windows[-REQUIRED_WINDOWS - 1:], compared, compared[1:], strict=False))
        for number, (bound, earlier, later) in enumerate(pairs):
            # the last pair exactly (its shift is the one repeated); before it, a free of the
            # previous window's allocation may find it elsewhere in that window (the first
            # step's window also allocates the optimizer state)
            loose = bound if number < len(pairs) - 1 else None
            if not _isomorphic(trace, earlier, later, loose):
                return False
            if _delta(earlier.counters, later.counters) != deltas:
                return False
            if _tally_delta(earlier.tallies, later.tallies) != tally_deltas:
                return False
        last = compared[-1]
        # nothing the window before the last allocated is still live (no per-step leak)
        previous = compared[-2]
        return not any(
            previous.first_id <= record.ident < previous.end_id
            for record in session.live.values()
        ) and not any(previous.first_id <= ident for ident in session._scratch_sizes) and (
            last.end_id - last.first_id == previous.end_id - previous.first_id
        )

    def repeat_to(self, target: int) -> bool:
        """Write the windows of steps last+1..target as repetitions of the last one, advance
        the counters, and shift the live allocations to the ids they would have by then.
        Returns False (nothing done) unless the steps are steady."""
        if not self.windows or target <= self.windows[-1].step or not self.steady():
            return False
        session, trace = self.session, self.session.trace
        template, before = self.windows[-1], self.windows[-2]
        times = target - template.step
        id_shift = template.end_id - template.first_id
        length = template.end - template.start
        sizes = _sizes_of(trace, before.start, template.end)
        kinds = trace.kinds[template.start:template.end]
        ids = trace.ids[template.start:template.end]
        sizes_col = trace.sizes[template.start:template.end]
        streams = trace.streams[template.start:template.end]
        tags = trace.tag_ids[template.start:template.end]
        is_id = [kind in _ID_KINDS for kind in kinds]
        allocated, peak = session.allocated_bytes, session.max_allocated_bytes
        for repeat in range(1, times + 1):
            shift = repeat * id_shift
            trace.kinds.extend(kinds)
            trace.ids.extend([i + shift if flag else i for i, flag in zip(ids, is_id, strict=True)])
            trace.sizes.extend(sizes_col)
            trace.streams.extend(streams)
            step_tag = trace.intern(Tag(op=f"step {template.step + repeat}"))
            trace.tag_ids.extend(tags[:-1])
            trace.tag_ids.append(step_tag)
            for kind, ident, size in zip(kinds, ids, sizes_col, strict=True):
                if kind in _ALLOC_KINDS:
                    allocated += size
                    peak = max(peak, allocated)
                elif kind == _FREE:
                    allocated -= sizes[ident]
        session.allocated_bytes, session.max_allocated_bytes = allocated, peak
        total_shift = times * id_shift
        trace._next_id += total_shift
        for record in session.live.values():
            if record.ident >= before.first_id:
                record.ident += total_shift
                record.alloc_index += times * length
        deltas = _delta(before.counters, template.counters)
        state = session.state
        state.forward_calls += times * deltas[0]
        state.backward_passes += times * deltas[1]
        state.manual_steps += times * deltas[2]
        session.host_reads += times * deltas[3]
        session.accumulations_in_place += times * deltas[4]
        for (attribute, name), delta in _tally_delta(before.tallies, template.tallies).items():
            tally = getattr(session, attribute)
            tally[name] = tally.get(name, 0) + times * delta
        self.repeated = (template.step + 1, target, template.step)
        self.windows.clear()
        return True

    def note(self) -> str | None:
        if self.repeated is None:
            return None
        first, last, template = self.repeated
        span = f"step {first}" if first == last else f"steps {first}-{last}"
        return (
            f"{span} repeated from step {template} (steady state: steps "
            f"{template - REQUIRED_WINDOWS + 1}-"
            f"{template} left the same events; {ENV_FLAG} / repeat_steady)"
        )


def _delta(before: tuple[int, ...], after: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(b - a for a, b in zip(before, after, strict=True))


def _tallies(session: Any) -> dict[tuple[str, str], int]:
    return {
        (attribute, name): count
        for attribute in TALLIES
        for name, count in (getattr(session, attribute, None) or {}).items()
    }


def _tally_delta(
    before: dict[tuple[str, str], int], after: dict[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    moved = {key: count - before.get(key, 0) for key, count in after.items()}
    return {key: delta for key, delta in moved.items() if delta}


def _repeatable(trace: Trace, window: StepWindow, lowest_id: int) -> bool:
    """No event a repetition cannot reproduce: other-stream uses, private pools begun, ended or
    released (a graph captured each step), marks other than the steady phases, frees of
    allocations older than the previous window."""
    kinds = trace.kinds[window.start:window.end]
    if _REFUSED_KINDS.intersection(kinds):
        return False
    ids = trace.ids
    for offset, kind in enumerate(kinds):
        index = window.start + offset
        if kind == _MARK and index != window.end - 1:
            tag = trace.tag_of(index)
            if tag is None or tag.op not in STEADY_MARKS:
                return False
        elif kind == _FREE and ids[index] < lowest_id:
            return False
    return True


def _isomorphic(
    trace: Trace, earlier: StepWindow, later: StepWindow, bound: StepWindow | None = None
) -> bool:
    """`later` repeats `earlier`: the same events, ids shifted by the ids one step uses. With
    `bound` (the window before `earlier`), a free of an allocation of the window before may
    refer to one at another place there: the freed allocations must then match (size, stream,
    tag) rather than their ids."""
    length = earlier.end - earlier.start
    if later.end - later.start != length or later.start != earlier.end:
        return False
    shift = later.first_id - earlier.first_id
    if later.end_id - later.first_id != shift:
        return False
    a, b = slice(earlier.start, earlier.end), slice(later.start, later.end)
    kinds = trace.kinds[a]
    if kinds != trace.kinds[b] or trace.sizes[a] != trace.sizes[b]:
        return False
    if trace.streams[a] != trace.streams[b] or trace.tag_ids[earlier.start:earlier.end - 1] != (
        trace.tag_ids[later.start:later.end - 1]
    ):
        return False
    allocs = _alloc_index(trace, bound.start, later.end) if bound is not None else {}
    for kind, x, y in zip(kinds, trace.ids[a], trace.ids[b], strict=True):
        if kind not in _ID_KINDS:
            if x != y:
                return False
        elif y != x + shift:
            if bound is None or kind != _FREE or x >= earlier.first_id or not (
                earlier.first_id <= y < later.first_id
            ):
                return False
            i, j = allocs.get(x), allocs.get(y)
            if i is None or j is None or (trace.sizes[i], trace.streams[i]) != (
                trace.sizes[j], trace.streams[j]
            ) or not _same_role(trace, i, j):
                return False
    return True


def _same_role(trace: Trace, i: int, j: int) -> bool:
    """The allocations at trace[i] and trace[j] (a loose free's, see `_isomorphic`) were made
    for the same thing: their tags equal but for the phase. The phase is the tracker's when
    the allocation was made, and the first step's batch is moved to the device before its
    first forward, in whatever phase the code before the loop left (a summary's forward:
    'forward'); later steps' batches in the phase the previous optimizer step left ('other').
    The allocation event itself is not repeated (it lies in the window before the compared
    ones), and the last compared pair, whose events are repeated, matches tags exactly."""
    if trace.tag_ids[i] == trace.tag_ids[j]:
        return True
    a, b = trace.tag_of(i), trace.tag_of(j)
    return a is not None and b is not None and (a.category, a.module, a.op) == (
        b.category, b.module, b.op
    )


def _alloc_index(trace: Trace, start: int, end: int) -> dict[int, int]:
    """Allocation id -> the index of its event, for the allocations made in trace[start:end]."""
    return {trace.ids[i]: i for i in range(start, end) if trace.kinds[i] in _ALLOC_KINDS}


def _sizes_of(trace: Trace, start: int, end: int) -> dict[int, int]:
    """Requested bytes of each allocation made in trace[start:end]."""
    return {
        trace.ids[i]: trace.sizes[i] for i in range(start, end) if trace.kinds[i] in _ALLOC_KINDS
    }
