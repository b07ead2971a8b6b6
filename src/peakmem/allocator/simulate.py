"""Replay a Trace through the caching-allocator simulation and report peaks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from peakmem.allocator.addresses import DeviceAddressSpace
from peakmem.allocator.caching import Block, CachingAllocator, DeviceLimits, OutOfMemory
from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.private_pools import PrivatePoolError, apply_pool_event
from peakmem.allocator.rules import AllocatorRules
from peakmem.trace.events import POOL_KINDS, EventKind, Trace


class TraceError(ValueError):
    """The trace is inconsistent (e.g. a free of an id that is not allocated). `index` is the
    event's index in the trace, when one event is at fault."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


@dataclass
class Timeline:
    """Reserved and allocated bytes after each event (index = event index)."""

    reserved: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)


@dataclass
class SimulationResult:
    """Peaks and facts of one simulated run. Indexes are event indexes in the trace."""

    peak_reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_requested_bytes: int = 0
    peak_reserved_index: int = -1
    peak_allocated_index: int = -1
    allocated_at_peak_reserved: int = 0
    num_segments: int = 0
    """Segments at the peak of reserved memory (an expandable segment counts once)."""
    max_segments: int = 0
    final_reserved_bytes: int = 0
    final_allocated_bytes: int = 0
    num_alloc_retries: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0
    num_smaller_fallbacks: int = 0
    """ALLOC_OR_SMALLER requests that did not fit and took a smaller block (or none)."""
    oom: bool = False
    oom_index: int | None = None
    oom_message: str | None = None
    events: int = 0
    torch_version: str | None = None
    alloc_conf: str = ""
    timeline: Timeline | None = None

    @property
    def fragmentation_at_peak(self) -> float:
        """Share of reserved memory not allocated at the peak of reserved memory."""
        if self.peak_reserved_bytes == 0:
            return 0.0
        return 1.0 - self.allocated_at_peak_reserved / self.peak_reserved_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_requested_bytes": self.peak_requested_bytes,
            "peak_reserved_index": self.peak_reserved_index,
            "peak_allocated_index": self.peak_allocated_index,
            "fragmentation_at_peak": round(self.fragmentation_at_peak, 6),
            "num_segments": self.num_segments,
            "max_segments": self.max_segments,
            "final_reserved_bytes": self.final_reserved_bytes,
            "final_allocated_bytes": self.final_allocated_bytes,
            "num_alloc_retries": self.num_alloc_retries,
            "oom": self.oom,
            "oom_index": self.oom_index,
            "oom_message": self.oom_message,
            "events": self.events,
            "torch_version": self.torch_version,
            "alloc_conf": self.alloc_conf,
        }


def simulate(
    trace: Trace,
    config: AllocatorConfig | str | None = None,
    torch_version: str | None = None,
    capacity_bytes: int | None = None,
    memory_fraction: float | None = None,
    total_bytes: int | None = None,
    timeline: bool = False,
    segment_address_hints: Iterable[tuple[int, int]] | None = None,
) -> SimulationResult:
    """Replay `trace` through a fresh caching allocator.

    `config` is an AllocatorConfig or a `PYTORCH_CUDA_ALLOC_CONF` string; `torch_version` picks
    the version's allocator rules (default: the newest); `capacity_bytes` is what the device can
    hand to the allocator (total memory less the CUDA context and other non-PyTorch memory);
    `memory_fraction` (with `total_bytes`) mirrors `set_per_process_memory_fraction`. The run
    stops at the first out-of-memory, which is reported (`oom`, `oom_index`), not raised.
    `segment_address_hints`: (size, address) of the segments a real run got, in order (from a
    snapshot), so that ties between equal-size blocks break as they did on the GPU.
    Raises TraceError for an inconsistent trace.
    """
    if not isinstance(config, AllocatorConfig):
        config = AllocatorConfig.parse(config, torch_version)
    allocator = CachingAllocator(
        config,
        AllocatorRules.for_version(torch_version),
        DeviceLimits(capacity_bytes, memory_fraction, total_bytes),
        DeviceAddressSpace(segment_address_hints),
    )
    result = SimulationResult(torch_version=torch_version, alloc_conf=config.source)
    line = Timeline() if timeline else None
    live: dict[int, Block] = {}
    freed_pending: dict[int, Block] = {}

    malloc = allocator.malloc
    free = allocator.free
    segment_sizes = allocator.segments  # cudaMalloc'd segments (num_segments, without the call)
    peak_reserved = peak_allocated = peak_requested = 0
    max_segments = 0
    ALLOC, FREE = int(EventKind.ALLOC), int(EventKind.FREE)
    ALLOC_OR_SMALLER = int(EventKind.ALLOC_OR_SMALLER)
    alloc_kinds = (ALLOC, ALLOC_OR_SMALLER)
    # The segment count can only grow where the device hands out memory (alloc_block, map_block
    # count num_device_alloc): it is read only after events where that count moved.
    device_allocs = -1
    # ids that hold no block: ALLOC_OR_SMALLER requests that got nothing, and zero-byte
    # allocations (CUDACachingAllocator::allocate(0) hands out a null pointer, no block)
    shrunk_away: set[int] = set()
    reserved_line = line.reserved.append if line is not None else None
    allocated_line = line.allocated.append if line is not None else None
    index = -1
    for index, (kind, ident, size, stream) in enumerate(
        zip(trace.kinds, trace.ids, trace.sizes, trace.streams, strict=True)
    ):
        if kind == FREE:
            block = live.pop(ident, None)
            if block is not None:
                if block.stream_uses:
                    freed_pending[ident] = block
                free(block)
            elif ident in shrunk_away:
                shrunk_away.discard(ident)
            else:
                raise TraceError(
                    f"event {index}: free of id {ident}, which is not allocated", index
                )
            if reserved_line is not None:
                reserved_line(allocator.total_allocated_memory)
                allocated_line(allocator.allocated_bytes)
            continue
        if kind in alloc_kinds:
            if ident in live or (shrunk_away and ident in shrunk_away):
                raise TraceError(
                    f"event {index}: id {ident} allocated twice without a free", index
                )
            try:
                block = malloc(size, stream) if size else None
            except OutOfMemory as exc:
                if kind == ALLOC_OR_SMALLER:
                    block = _smaller(malloc, size, stream)
                    result.num_smaller_fallbacks += 1
                else:
                    result.oom = True
                    result.oom_index = index
                    result.oom_message = str(exc)
                    break
            if block is None:  # nothing could be had: the caller went without
                shrunk_away.add(ident)
            else:
                live[ident] = block
            reserved = allocator.total_allocated_memory
            allocated = allocator.allocated_bytes
            if reserved > peak_reserved:
                peak_reserved = reserved
                result.peak_reserved_index = index
                result.allocated_at_peak_reserved = allocated
                result.num_segments = allocator.num_segments
            if allocated > peak_allocated:
                peak_allocated = allocated
                result.peak_allocated_index = index
            if allocator.requested_bytes > peak_requested:
                peak_requested = allocator.requested_bytes
        else:
            _apply_other(allocator, kind, ident, stream, index, live, freed_pending, shrunk_away)
        if reserved_line is not None:
            reserved_line(allocator.total_allocated_memory)
            allocated_line(allocator.allocated_bytes)
        if allocator.num_device_alloc != device_allocs:
            device_allocs = allocator.num_device_alloc
            segments = len(segment_sizes) + allocator._mapped_expandable
            if segments > max_segments:
                max_segments = segments
    result.max_segments = max_segments

    result.peak_reserved_bytes = peak_reserved
    result.peak_allocated_bytes = peak_allocated
    result.peak_requested_bytes = peak_requested
    result.final_reserved_bytes = allocator.total_allocated_memory
    result.final_allocated_bytes = allocator.allocated_bytes
    result.num_alloc_retries = allocator.num_alloc_retries
    result.num_device_alloc = allocator.num_device_alloc
    result.num_device_free = allocator.num_device_free
    result.events = index + 1 if not result.oom else index
    result.timeline = line
    return result


def _smaller(malloc, size: int, stream: int) -> Block | None:
    """The largest of size/2, size/4, ... (down to 1 KiB) the device can still supply."""
    size //= 2
    while size >= 1024:
        try:
            return malloc(size, stream)
        except OutOfMemory:
            size //= 2
    return None


def _apply_other(
    allocator: CachingAllocator,
    kind: int,
    ident: int,
    stream: int,
    index: int,
    live: dict[int, Block],
    freed_pending: dict[int, Block],
    blockless: set[int] | frozenset[int] = frozenset(),
) -> None:
    if kind == EventKind.RECORD_STREAM:
        block = live.get(ident)
        if block is None and ident in blockless:
            return  # record_stream of a null pointer: nothing to keep alive
        if block is None:
            raise TraceError(
                f"event {index}: record_stream of id {ident}, which is not allocated", index
            )
        allocator.record_stream(block, stream)
    elif kind == EventKind.FREE_COMPLETED:
        block = freed_pending.pop(ident, None)
        if block is not None:
            allocator.complete_free(block)
    elif kind == EventKind.SYNCHRONIZE:
        allocator.synchronize_and_free_events()
        freed_pending.clear()
    elif kind == EventKind.EMPTY_CACHE:
        if ident < 1:
            allocator.empty_cache()
            freed_pending.clear()
        else:
            allocator.empty_cache(ident)  # one private pool's (a MemPool's destructor)
    elif kind in POOL_KINDS:
        try:
            apply_pool_event(allocator, kind, ident)
        except PrivatePoolError as exc:
            raise TraceError(f"event {index}: {exc}", index) from None
    elif kind != EventKind.MARK:
        raise TraceError(f"event {index}: unknown event kind {kind}", index)
