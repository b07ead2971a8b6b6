"""The simulated run as a `torch.cuda.memory._snapshot()` dict, pickled for PyTorch's memory
visualizer (https://pytorch.org/memory_viz) and `torch.cuda._memory_viz`.

The estimate's trace is replayed through the same caching-allocator simulation, recording what a
real run with `torch.cuda.memory._record_memory_history()` would: `alloc` / `free_requested` /
`free_completed` of each block (its requested size, its address in the simulated segments),
`segment_alloc` / `segment_free` (or `segment_map` / `segment_unmap` with expandable segments),
an `oom` where the GPU would run out, and the segments with their blocks at the end. After the
segment frees of an `empty_cache()` a `snapshot` entry marks the call (torch records none, and
without it a reader cannot tell them from the allocator's own release before a new segment). The frames
of an entry name, innermost first, the op that allocated, the module path, and the category and
phase (peakmem has no Python stack of the job to give).

The pickle holds only plain data (dicts, lists, str, int), so `peakmem replay` (which refuses
anything else) reads it back: replaying it gives the estimate's peak reserved memory.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from peakmem.allocator.caching import Block, CachingAllocator, DeviceLimits, OutOfMemory
from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.rules import AllocatorRules
from peakmem.allocator.simulate import _apply_other, _smaller
from peakmem.trace.events import EventKind, Tag, Trace


def _frames(tag: Tag | None) -> list[dict[str, Any]]:
    if tag is None:
        return [{"filename": "<peakmem>", "line": 0, "name": "untagged allocation"}]
    frames = []
    if tag.op:
        frames.append({"filename": "<op>", "line": 0, "name": tag.op})
    frames.append({"filename": tag.module or "<no module>", "line": 0,
                   "name": tag.module.rsplit(".", 1)[-1] if tag.module else "<top level>"})
    frames.append({"filename": "<peakmem>", "line": 0,
                   "name": f"{tag.category or 'other'} ({tag.phase or 'no phase'})"})
    return frames


def build_snapshot(
    trace: Trace,
    config: AllocatorConfig,
    torch_version: str | None,
    *,
    capacity_bytes: int | None = None,
    device: int = 0,
) -> dict[str, Any]:
    """Replay `trace` and return the snapshot dict (`segments`, `device_traces`,
    `allocator_settings`). With `capacity_bytes` the run stops at its first out-of-memory,
    recorded as an `oom` entry, as on the GPU."""
    allocator = CachingAllocator(config, AllocatorRules.for_version(torch_version),
                                 DeviceLimits(capacity_bytes))
    entries: list[dict[str, Any]] = []
    live: dict[int, Block] = {}
    blockless: set[int] = set()  # ids that got no block (zero bytes, or nothing left)
    pending: dict[int, Block] = {}
    frames_of: dict[int, list[dict[str, Any]]] = {}  # block address -> frames of its alloc
    requested: dict[int, int] = {}  # block address -> requested size
    seen_segments = dict(allocator.segments)
    mapped = allocator.total_allocated_memory
    frame_cache: dict[int, list[dict[str, Any]]] = {}
    freed_at: dict[int, tuple[int, int]] = {}  # id() of a deferred free -> (address, stream)

    def entry(action: str, addr: int, size: int, stream: int, frames: list[Any], time: int) -> None:
        entries.append({"action": action, "addr": addr, "size": size, "stream": stream,
                        "frames": frames, "time_us": time, "device_free": 0})

    def segment_changes(time: int) -> None:
        nonlocal seen_segments, mapped
        now = allocator.segments
        if not config.expandable_segments:
            for addr, size in seen_segments.items():
                if now.get(addr) != size:
                    entry("segment_free", addr, size, 0, [], time)
            for addr, size in now.items():
                if seen_segments.get(addr) != size:
                    entry("segment_alloc", addr, size, 0, [], time)
            seen_segments = dict(now)
        else:
            delta = allocator.total_allocated_memory - mapped
            base = allocator.expandable_segments[0].base if allocator.expandable_segments else 0
            if delta:
                entry("segment_map" if delta > 0 else "segment_unmap", base, abs(delta), 0, [],
                      time)
        mapped = allocator.total_allocated_memory

    def completed(freed: list[tuple[int, int]], time: int) -> None:
        for addr, block_stream in freed:
            entry("free_completed", addr, requested.pop(addr, 0), block_stream,
                  frames_of.pop(addr, []), time)

    def deferred_frees_done(time: int) -> None:
        """free_completed for the deferred frees the allocator has now handed back (as torch
        records it: when process_events / a synchronisation frees the block)."""
        if not freed_at:
            return
        still = {id(block) for block in allocator.pending_free + allocator.ready_free}
        for key in [key for key in freed_at if key not in still]:
            addr, block_stream = freed_at.pop(key)
            completed([(addr, block_stream)], time)

    for index, (kind, ident, size, stream, tag_id) in enumerate(trace.events()):
        if kind in (EventKind.ALLOC, EventKind.ALLOC_OR_SMALLER):
            before = allocator.total_allocated_memory
            try:  # a zero-byte request gets a null pointer, no block (as in simulate())
                block = allocator.malloc(size, stream) if size else None
            except OutOfMemory:
                block = None
                if kind == EventKind.ALLOC:
                    entries.append({"action": "oom", "addr": 0, "size": size, "stream": stream,
                                    "frames": [], "time_us": index,
                                    "device_free": max(0, (capacity_bytes or 0) - before)})
                    break
                block = _smaller(allocator.malloc, size, stream)
            deferred_frees_done(index)
            segment_changes(index)
            if block is None:
                blockless.add(ident)
                continue
            live[ident] = block
            if tag_id not in frame_cache:
                frame_cache[tag_id] = _frames(trace.tags[tag_id] if tag_id >= 0 else None)
            frames_of[block.addr] = frame_cache[tag_id]
            requested[block.addr] = block.requested or size
            entry("alloc", block.addr, requested[block.addr], stream, frames_of[block.addr], index)
        elif kind == EventKind.FREE:
            block = live.pop(ident, None)
            if block is None:
                blockless.discard(ident)
                continue
            addr = block.addr  # the block may merge with its free neighbours when freed
            entry("free_requested", addr, requested.get(addr, block.size),
                  block.stream, frames_of.get(addr, []), index)
            waits = bool(block.stream_uses)
            if waits:
                pending[ident] = block
                freed_at[id(block)] = (addr, block.stream)
                allocator.free(block)
            else:
                allocator.free(block)
                completed([(addr, block.stream)], index)
            segment_changes(index)
        elif kind == EventKind.MARK:
            continue
        else:
            _apply_other(allocator, kind, ident, stream, index, live, pending, blockless)
            deferred_frees_done(index)
            released = len(entries)
            segment_changes(index)
            if kind == EventKind.EMPTY_CACHE and len(entries) > released:
                # a marker after empty_cache()'s segment frees, so that a reader (peakmem
                # replay) does not take them for the allocator's own release before a malloc
                entry("snapshot", 0, 0, 0, [], index)
    return {
        "segments": _segments(allocator, live, pending, frames_of, requested, device),
        "device_traces": [[] for _ in range(device)] + [entries],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": config.source or ""},
    }


def _segments(allocator: CachingAllocator, live: dict[int, Block], pending: dict[int, Block],
              frames_of: dict[int, list[Any]], requested: dict[int, int],
              device: int) -> list[dict[str, Any]]:
    """Each segment with its blocks, in address order, as the run leaves them (an expandable
    segment: each run of mapped pages, as torch reports it)."""
    waiting = {id(block) for block in allocator.pending_free + allocator.ready_free}
    by_addr = {block.addr: block for block in live.values()}
    by_addr.update(allocator.blocks_by_addr)
    by_addr.update({block.addr: block for block in pending.values()})
    by_addr.update(allocator._unmapped_blocks)
    runs: list[list[Block]] = []
    for address in sorted(allocator.segments):
        runs.append(_walk(by_addr.get(address)))
    for segment in sorted(allocator.expandable_segments, key=lambda s: s.base):
        run: list[Block] = []
        for block in _walk(by_addr.get(segment.base)):
            if block.mapped:
                run.append(block)
            elif run:
                runs.append(run)
                run = []
        if run:
            runs.append(run)
    segments = []
    for run in runs:
        if not run:
            continue
        blocks: list[dict[str, Any]] = []
        allocated = active = 0
        for block in run:
            if id(block) in waiting:
                state = "active_awaiting_free"
            else:
                state = "active_allocated" if block.allocated else "inactive"
            in_use = state != "inactive"
            blocks.append({"address": block.addr, "size": block.size,
                           "requested_size": requested.get(block.addr, block.size)
                           if in_use else 0,
                           "state": state,
                           "frames": frames_of.get(block.addr, []) if in_use else []})
            allocated += block.size if state == "active_allocated" else 0
            active += block.size if in_use else 0
        total = sum(block.size for block in run)
        segments.append({
            "device": device, "address": run[0].addr, "total_size": total,
            "stream": run[0].stream, "segment_type": "small" if run[0].pool.is_small else "large",
            "segment_pool_id": _pool_id(run[0]), "allocated_size": allocated, "active_size": active,
            "requested_size": sum(b["requested_size"] for b in blocks),
            "blocks": blocks,
        })
    return segments


def _walk(block: Block | None) -> list[Block]:
    """The blocks of a segment from its first one, in address order."""
    blocks = []
    while block is not None:
        blocks.append(block)
        block = block.next
    return blocks


def estimate_snapshot(result: Any) -> dict[str, Any]:
    """The snapshot of an Estimate's simulated run (on its GPU, with its allocator settings).
    A run that does not fit the GPU is written whole, as the estimate's peak is (on a device
    without a limit), not cut at the out-of-memory error; a job's own per-process memory
    fraction is not applied."""
    from peakmem.estimate.api import parse_alloc_conf

    capture = result.capture
    config = parse_alloc_conf(result.alloc_conf, result.torch_version)
    capacity = result.gpu.total_memory_bytes - result.context_bytes - result.library_bytes
    return build_snapshot(capture.trace, config, result.torch_version,
                          capacity_bytes=None if result.oom else capacity)


def write_snapshot(result: Any, path: str | Path) -> Path:
    """Pickle the estimate's snapshot to `path` (open it at https://pytorch.org/memory_viz)."""
    path = Path(path)
    with path.open("wb") as handle:
        pickle.dump(estimate_snapshot(result), handle, protocol=4)
    return path


def _pool_id(block: Any) -> tuple[int, int]:
    """The segment's `segment_pool_id`: (0, 0) for the default pools, (0, n) for private pool n
    (a CUDA graph's or a MemPool's: allocator.private_pools)."""
    owner = block.pool.owner
    return (0, 0) if owner is None else (0, owner.ident)
