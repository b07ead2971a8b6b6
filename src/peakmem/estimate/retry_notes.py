"""Where the peak stands in a job that caught out-of-memory errors in a retry loop (accelerate's
`find_executable_batch_size`, the Trainer's `--auto_find_batch_size`, Lightning's batch size
finder; capture/oom_retry.py): each attempt that did not fit filled the GPU up to the allocation
that failed, so the process's peak (and its breakdown) can belong to an attempt the job gave up,
as the GPU's own peak statistics would show. What the run that went on needs is its own peak."""

from __future__ import annotations

from peakmem.trace.events import ALLOC_KINDS, EventKind, Trace

_BLOCK = 512
_GIB = 2**30


def _rounded(size: int) -> int:
    """The caching allocator's block size for a request (kMinBlockSize multiples)."""
    return max(_BLOCK, -(-size // _BLOCK) * _BLOCK)


def allocated_peak_after(trace: Trace, start: int) -> int:
    """Most bytes allocated (as the allocator rounds them) at once after event `start`."""
    live: dict[int, int] = {}
    allocated = peak = 0
    for index, (kind, ident, size, _stream, _tag) in enumerate(trace.events()):
        if kind in ALLOC_KINDS:
            live[ident] = _rounded(size)
            allocated += live[ident]
        elif kind == EventKind.FREE:
            allocated -= live.pop(ident, 0)
        if index > start:
            peak = max(peak, allocated)
    return peak


def retry_peak_note(trace: Trace, peak_index: int) -> str | None:
    """A note when the peak was set before the last out-of-memory error a retry loop caught: the
    peak allocated after that error (the run the job went on with). None otherwise."""
    ooms = trace.meta.get("simulated_ooms") or []
    last = max((oom.get("event", -1) for oom in ooms if isinstance(oom, dict)), default=-1)
    if last < 0 or peak_index >= last:
        return None
    after = allocated_peak_after(trace, last)
    return (
        "the peak and its breakdown were set by an attempt that ran out of memory before the "
        "job's last retry (the GPU's peak statistics would show it too); the run it went on "
        f"with peaked at about {after / _GIB:.2f} GiB allocated"
    )
