"""Ending a training loop that does not iterate a DataLoader (default step policy only).

`for input, target in zip(data, targets)`, `for epoch in range(1, 101): train()`, `while
step < max_steps:`, `for batch in batches():` (a generator): the DataLoader mechanism
(capture.dataloader) cannot end them, and stopping the job at the step limit loses whatever the
script does after the loop: a later training section, the evaluation, the sampling. Instead, at
the step limit the loop is ended where the job's own code comes back to the loop's head: the
iteration that took the step finishes (its `zero_grad`, its evaluation, its prints), and then
the frame jumps to the loop's exit (`frame.f_lineno` from a `line` trace event, installed for
that moment only), as if the iterator were exhausted or the condition false (a `for` loop's
`else:` runs). Everything after it runs on the job's real objects; the loop's variables keep
their last values (`epoch` is the last one that ran, not the last of the range).

Which loops: the steps' loop, found from the job's frames (its own files: capture's
`is_job_file`) at the step's first forward and at the step itself: the innermost frame on the
stack at both, with the loops that enclose both places (so an inner `for p in params:` update
loop, or a `for opt in optimizers:` loop around the steps, is not the training loop; an epoch
loop around the batch loop is, and both end). When a loop site (code, loop start) that was
ended before reaches the limit again (an outer loop in a caller re-runs it: `for epoch in
range(E): train_epoch()`), the callers' loops around it are ended too.

Each later loop gets its own limit (the steps of the optimizers live in it, counted from where
the previous loop ended: a new optimizer starts at 0). Where no line leads to the loop's exit (a
loop that is the last statement of its function exits into the implicit return; a `with` or a
`try: ... finally:` right after or around a `for` loop puts its exit on a line CPython resolves
elsewhere), the frame is moved without a line (capture/frame_moves.py: a `for` loop's iterator
exhausted, a `while` loop sent to its exit). A loop is not ended when it has no exit at all (`while
True:` without a `break`), when frames cannot be moved so (not CPython 3.11) and no line leads
out, when the script's last statement is the loop (stopped: nothing follows; phases.py), when a
trace function is set already (a debugger, coverage), or after
`MAX_STEPS_AFTER_END` steps past the first end: the job is then stopped as before, and the note
says the estimate may be low (what follows did not run) and that `--steps all` checks it.
While an end waits for the loop's head, the job's `sys.gettrace()` / `sys.settrace()` see and set
its own trace function, not the capture's (its `settrace(None)` would switch the jump off); a plan
whose head does not come within `MAX_STEPS_AFTER_END` steps is given up (`abandon`): stopped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

from peakmem.capture import frame_moves, loop_exits
from peakmem.capture.loop_exits import Loop
from peakmem.jobs.exit_handlers import is_job_file

VERIFIED_PYTHONS = frozenset({(3, 11)})
"""The CPython versions whose bytecode (loop shapes, line starts, stack effects, `f_lineno`'s
rule) capture/loop_exits.py was written and tested against; elsewhere the job is stopped at the
step limit as before, with the note that the estimate may be low."""
VERIFIED_TEXT = ", ".join(f"{major}.{minor}" for major, minor in sorted(VERIFIED_PYTHONS))


@dataclass(frozen=True)
class _Exit:
    """How a planned loop ends at its head: `line` (`f_lineno` set to `line`), `exhaust` (its
    iterator replaced by an exhausted one) or `goto` (the next instruction set to `target`);
    `target` is the offset the frame goes on at, `end` the loop's last backward jump."""

    how: str
    end: int
    target: int
    line: int | None = None


@dataclass
class _FramePlan:
    frame: FrameType
    exits: dict[int, _Exit]
    """Each planned loop's start offset -> how it ends when the start is reached."""
    previous_trace: Any


@dataclass
class EndedLoop:
    """A loop the capture ended: where it is and after how many steps."""

    filename: str
    line: int
    steps: int


@dataclass
class LoopEnds:
    """The job's loops without a DataLoader that the capture ends (see the module doc)."""

    ended: list[EndedLoop] = field(default_factory=list)
    stop: Callable[[], None] | None = None
    """Stops the job (raises) when a planned jump fails after all."""
    boundary: CodeType | None = None
    """The code of the capture's frame that calls the job: the job's frames are inside it."""
    refused: str | None = None
    """Why the last loop that reached the limit could not be ended (for the note)."""
    _forward_frames: list[tuple[int, CodeType, int]] = field(default_factory=list)
    _sites: set[tuple[CodeType, int]] = field(default_factory=set)
    _plans: dict[int, _FramePlan] = field(default_factory=dict)
    _previous_global: Any = None

    @property
    def pending(self) -> bool:
        """An end is planned and its loop's head not reached yet."""
        return bool(self._plans)

    def forward_started(self) -> None:
        """A training step's first forward: where the job's frames are (ids, not the frames,
        which would keep their locals alive)."""
        self._forward_frames = [(id(frame), frame.f_code, frame.f_lasti)
                                for frame in _job_frames(self.boundary)]

    def plan(self, steps: int) -> bool:
        """At the step limit: arrange for the steps' loop to end when it next comes back to
        its head; False (with `refused` set) when it cannot be."""
        if self._plans:
            return True  # planned already in this iteration
        if sys.version_info[:2] not in VERIFIED_PYTHONS:
            self.refused = (f"loops are ended only on CPython {VERIFIED_TEXT}, whose bytecode "
                            f"capture/loop_exits.py reads (this is {sys.version.split()[0]})")
            return False
        if _REAL_GETTRACE() is not None:
            self.refused = "a trace function (debugger, coverage) is set"
            return False
        at_forward = {(frame_id, code): offset for frame_id, code, offset in self._forward_frames}
        common: list[tuple[FrameType, list[Loop]]] = []  # innermost first
        for frame in _job_frames(self.boundary):
            offset = at_forward.get((id(frame), frame.f_code))
            if offset is None:
                continue
            loops = loop_exits.enclosing(frame.f_code, offset, frame.f_lasti)
            if loops:
                common.append((frame, loops))
        if not common:
            self.refused = "no loop of the job's own code encloses its steps"
            return False
        frame, loops = common[0]
        repeated = any((frame.f_code, loop.start) in self._sites for loop in loops)
        chosen = common if repeated else common[:1]
        plans = {}
        for frame, loops in chosen:
            exits = _exits(frame.f_code, loops)
            if exits is None:
                if plans:
                    break  # the inner loops end; the outer ones run on
                innermost = loops[-1]
                why = ("the last statement of its function, or a `with` / `try` after it?"
                       if frame_moves.supported() else
                       "its exit starts no line of its own; frames are moved past that only "
                       f"on CPython {frame_moves.LAYOUT_VERSION[0]}.{frame_moves.LAYOUT_VERSION[1]}"
                       " release builds")
                self.refused = (
                    f"its loop at {_where(frame.f_code, innermost.start)} has no exit a "
                    f"running frame can jump to ({why})"
                )
                return False
            plans[id(frame)] = _FramePlan(frame, exits, frame.f_trace)
            self._sites.update((frame.f_code, loop.start) for loop in loops)
        first_frame, first_loops = chosen[0]
        self.ended.append(EndedLoop(first_frame.f_code.co_filename,
                                    _line_of(first_frame.f_code, first_loops[-1].start), steps))
        self._install(plans)
        return True

    def loop_ends_code(self) -> bool:
        """Whether the steps' loop ends the job: it is the last statement of its code, and each
        caller of the job's own, out to the script's top level, returns right after the call
        (`if __name__ == "__main__": main()`). Stopping there loses nothing after it."""
        frames = list(_job_frames(self.boundary))  # innermost first
        for index, frame in enumerate(frames):
            loops = loop_exits.enclosing(frame.f_code, frame.f_lasti)
            if loops:
                callers = frames[index + 1:]
                return (loops[0].ends_code
                        and all(loop_exits.returns_after(caller.f_code, caller.f_lasti)
                                for caller in callers)
                        and (callers or [frame])[-1].f_code.co_name == "<module>")
        return False

    # -- the trace function, for the moment the plans wait ------------------------------------
    def _install(self, plans: dict[int, _FramePlan]) -> None:
        self._plans = plans
        self._previous_global = sys.gettrace()
        for plan in plans.values():
            plan.frame.f_trace = self._local
            plan.frame.f_trace_lines = True
        _REAL_SETTRACE(_no_new_frames)
        # the job's own view of the global trace function while the plan waits: what it had
        # (or set since), never the capture's; `sys.settrace(None)` would stop the frames' traces
        sys.gettrace, sys.settrace = self._job_gettrace, self._job_settrace

    def _job_gettrace(self) -> Any:
        return self._previous_global

    def _job_settrace(self, function: Any) -> None:
        """The job's `sys.settrace` while a plan waits: kept for when it is done; a function
        (not None) is set now too (the planned frames keep their own traces)."""
        self._previous_global = function
        _REAL_SETTRACE(_no_new_frames if function is None else function)

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        plan = self._plans.get(id(frame))
        if plan is None or plan.frame is not frame:
            return None
        if event == "return":
            self._done(plan)
            return None
        if event == "line":
            head = frame.f_lasti
            planned = plan.exits.pop(head, None)
            if planned is not None:
                # the loops left behind by the jump are over too (an inner loop's jump to its
                # enclosing loop's exit)
                plan.exits = {start: value for start, value in plan.exits.items()
                              if start <= planned.target <= value.end}
                failed = _move(frame, head, planned)
                if failed is not None:  # CPython would not go there after all
                    self.abandon(f"the jump out of its loop failed ({failed})")
                    if self.stop is not None:
                        self.stop()  # raises into the job: stopped as before
                    return None
                if not plan.exits:
                    self._done(plan)
                    return None
        return self._local

    def _done(self, plan: _FramePlan) -> None:
        plan.frame.f_trace = plan.previous_trace
        self._plans.pop(id(plan.frame), None)
        if not self._plans:
            sys.gettrace, sys.settrace = _REAL_GETTRACE, _REAL_SETTRACE
            _REAL_SETTRACE(self._previous_global)
            self._previous_global = None

    def abandon(self, reason: str) -> None:
        """The waiting plan will not end its loop after all: not ended, no tracing left."""
        self.refused = reason
        if self._plans and self.ended:
            self.ended.pop()
        self.close()

    def close(self) -> None:
        """The job ended (or was stopped) with a plan waiting: no tracing left behind."""
        for plan in list(self._plans.values()):
            self._done(plan)


_REAL_GETTRACE, _REAL_SETTRACE = sys.gettrace, sys.settrace


def _no_new_frames(frame: FrameType, event: str, arg: Any) -> None:
    return None  # tracing is on only for the planned frames' `f_trace`


def _exits(code: CodeType, loops: list[Loop]) -> dict[int, _Exit] | None:
    """Each loop's head -> how it ends there: a jump to the line starting its exit where one
    leads there; else, where capture/frame_moves.py can move this interpreter's frames, a `for`
    loop's iterator exhausted, a `while` loop's frame sent to its exit; else a jump to the exit
    of the nearest enclosing loop that has one (the rest of that loop's iteration is skipped with
    it); a loop with none of these runs on (its inner loops end). None when no loop can end."""
    exits: dict[int, _Exit] = {}
    outer: int | None = None  # the nearest enclosing loop's usable exit (offset)
    moves = frame_moves.supported()
    depths = loop_exits.stack_depths(code) or {}
    handlers = loop_exits.handlers(code)
    for loop in loops:  # outermost first
        if loop.exit_line is not None and loop.exit is not None:
            exits[loop.start] = _Exit("line", loop.end, loop.exit, loop.exit_line)
        elif moves and loop.exit is not None and loop.is_for:
            exits[loop.start] = _Exit("exhaust", loop.end, loop.exit)
        elif (moves and loop.exit is not None and loop.start in depths
              and depths.get(loop.exit) == depths[loop.start]
              and loop.exit not in handlers):
            exits[loop.start] = _Exit("goto", loop.end, loop.exit)
        elif moves and loop.exit is None and not loop.is_for and (
                returns := loop_exits.return_none(code, loop.start)) is not None:
            # `while True:` last in its function: its `break` became a `return None`; go there
            exits[loop.start] = _Exit("goto", loop.end, returns)
            continue
        elif outer is not None:
            line = loop_exits.jump_line(code, loop.start, outer)
            if line is not None:
                exits[loop.start] = _Exit("line", loop.end, outer, line)
            continue
        else:
            continue
        outer = loop.exit
    return exits or None


def _move(frame: FrameType, head: int, planned: _Exit) -> str | None:
    """End the loop whose head the frame is at, as planned; why not, when it could not be."""
    if planned.how == "line":
        try:
            frame.f_lineno = planned.line
        except ValueError as exc:
            return str(exc)
        return None
    if planned.how == "exhaust":
        moved = frame_moves.exhaust(frame, head)
    else:
        moved = frame_moves.goto(frame, head, planned.target)
    return None if moved else f"its frame could not be moved ({planned.how})"


def _job_frames(boundary: CodeType | None = None):
    """The job's own frames on the stack, innermost first, up to the capture's call of the job
    (`boundary`: the frames outside it, a caller of the in-process API, are not the job's)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is boundary:
            return
        if is_job_file(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back


def _line_of(code: CodeType, offset: int) -> int:
    line = None
    for at, number in loop_exits.line_starts(code):
        if at > offset:
            break
        line = number
    return line or code.co_firstlineno


def _where(code: CodeType, offset: int) -> str:
    return f"{os.path.basename(code.co_filename)}:{_line_of(code, offset)}"
