"""Optimizer updates that torch.compile fuses into one kernel.

torchao's low-bit optimizers (and any optimizer written the same way) run each parameter's
update as `torch.compile(single_param_adam, fullgraph=True)(p, grad, step, exp_avg, ...)`: a
whole graph of elementwise math (dequantise the state, the Adam update, requantise) that writes
its results in place and returns nothing. Inductor compiles it into fused kernels that keep the
intermediates in registers: none of the fp32 temporaries the eager run makes exists on the GPU.

The capture runs compiled code eagerly (fake_cuda's torch.compile), so such a call is bracketed:
`begin` remembers where the trace stood; `end` removes from the trace every allocation made
after that point and freed again before the call returned (with its free), when the call
returned nothing and ran inside `optimizer.step()`. What the call kept (new storages it left
alive) stays. A note says it once.
"""

from __future__ import annotations

from typing import Any

from peakmem.capture.session import CaptureSession
from peakmem.trace.events import EventKind
from peakmem.trace.vocab import Phase

NOTE = (
    "optimizer updates compiled with torch.compile(fullgraph=True) that work in place (torchao's "
    "low-bit optimizers): their elementwise temporaries were dropped, as Inductor fuses the "
    "update into kernels that keep them in registers"
)
_EVENTS_OF_AN_ALLOCATION = (
    EventKind.ALLOC,
    EventKind.ALLOC_OR_SMALLER,
    EventKind.FREE,
    EventKind.FREE_COMPLETED,
    EventKind.RECORD_STREAM,
)


def begin(session: CaptureSession, fullgraph: bool) -> int | None:
    """Where the trace stands, when a fused in-place update may follow (None: it may not)."""
    if not fullgraph or session.closed or session.state.phase != Phase.OPTIMIZER.value:
        return None
    return len(session.trace)


def end(session: CaptureSession, start: int | None, returned: Any) -> int:
    """Drop the temporaries made since `start` (see the module's docstring); how many."""
    if start is None or returned is not None or session.closed:
        return 0
    dropped = drop_freed_since(session, start)
    if dropped and NOTE not in session.notes:
        session.notes.append(NOTE)
    return dropped


def drop_freed_since(session: CaptureSession, start: int) -> int:
    """Remove from the trace every allocation made since event `start` and freed again (with
    its free): the temporaries of code Inductor compiles into fused kernels. How many."""
    if session.closed:
        return 0
    trace = session.trace
    with session._lock:
        stop = len(trace)
        memory = session.memory
        if memory is not None and start < memory.position < stop:
            return 0  # the job's memory readings replayed part of the call: leave it
        allocated, freed = set(), set()
        for index in range(start, stop):
            kind = trace.kinds[index]
            if kind in (EventKind.ALLOC, EventKind.ALLOC_OR_SMALLER):
                allocated.add(trace.ids[index])
            elif kind == EventKind.FREE:
                freed.add(trace.ids[index])
        dropped = allocated & freed
        if not dropped:
            return 0
        keep = [
            index
            for index in range(start, stop)
            if not (trace.kinds[index] in _EVENTS_OF_AN_ALLOCATION and trace.ids[index] in dropped)
        ]
        moved = {old: start + new for new, old in enumerate(keep)}
        for column in (trace.kinds, trace.ids, trace.sizes, trace.streams, trace.tag_ids):
            column[start:] = [column[index] for index in keep]
        for record in session.live.values():
            if record.alloc_index >= start:
                record.alloc_index = moved[record.alloc_index]
        if memory is not None and memory.position >= stop:
            memory.position = len(trace)
    return len(dropped)
