"""The memory readings a job takes during the capture (`torch.cuda.memory_allocated`,
`memory_reserved`, `max_memory_*`, `memory_stats`, `mem_get_info`, `memory_snapshot`, ...): the
values of the caching-allocator simulation over the trace recorded so far, under the target torch
version's rules and the job's `PYTORCH_CUDA_ALLOC_CONF`.

`SimulatedMemory` keeps one allocator simulation and replays the trace lazily, from where it last
stopped, only when a reading is asked: free when nobody asks, one simulation of the trace in all
when the job reads at every step. After `set_per_process_memory_fraction` the simulation follows
every allocation as it is recorded, and an allocation the capped allocator cannot satisfy raises
`torch.OutOfMemoryError` in the job at that point, as on the GPU (capture.fake_oom).

The configuration is settled at the job's first CUDA allocator use (`SimulatedMemory.settle`):
where the job set `PYTORCH_CUDA_ALLOC_CONF` itself before it, torch reads the job's value
(capture.job_alloc_conf).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from peakmem.allocator.addresses import DeviceAddressSpace
from peakmem.allocator.caching import (
    K_SMALL_BUFFER,
    Block,
    CachingAllocator,
    DeviceLimits,
    OutOfMemory,
)
from peakmem.allocator.config import AllocatorConfig, AllocatorConfigError, BackendNotSimulated
from peakmem.allocator.private_pools import apply_pool_event
from peakmem.allocator.rules import AllocatorRules
from peakmem.capture import job_alloc_conf, job_module_loading
from peakmem.trace.events import POOL_KINDS, EventKind, Trace

POOLS = ("all", "small_pool", "large_pool")
ARRAY_STATS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
SIZE_MAX = 2**64 - 1

_TARGET: ContextVar[tuple[str | None, str | None, dict[str, str | None] | None]] = ContextVar(
    "peakmem_allocator_target", default=(None, None, None)
)


@contextmanager
def allocator_target(alloc_conf: str | None, torch_version: str | None) -> Iterator[None]:
    """The allocator configuration and torch version the job's memory readings simulate, for
    captures run inside this block (default: the environment's configuration and the stack's
    torch). The environment's allocator variables are taken as the job's starting point here:
    a change the job makes to them later (every pass of the block) is the job's own setting."""
    token = _TARGET.set((alloc_conf, torch_version, job_alloc_conf.snapshot()))
    try:
        yield
    finally:
        _TARGET.reset(token)


def target_settings(default_version: str) -> tuple[str, str]:
    conf, version, _ = _TARGET.get()
    version = version or default_version
    if conf is None:
        conf = job_alloc_conf.environ_conf(os.environ, version) or ""
    return conf, version


def target_start() -> dict[str, str | None]:
    """The allocator variables of the job's environment at its start (see allocator_target)."""
    start = _TARGET.get()[2]
    return job_alloc_conf.snapshot() if start is None else start


class Stat:
    """One c10 `Stat`: current, peak, allocated (total increase), freed (total decrease)."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, amount: int) -> None:
        if amount >= 0:
            self.allocated += amount
        else:
            self.freed -= amount
        self.current += amount
        if self.current > self.peak:
            self.peak = self.current

    def set(self, value: int) -> None:
        if value != self.current:
            self.add(value - self.current)

    def as_dict(self) -> dict[str, int]:
        return {
            "current": self.current,
            "peak": self.peak,
            "allocated": self.allocated,
            "freed": self.freed,
        }


class SimulatedMemory:
    def __init__(
        self,
        trace: Trace,
        config: AllocatorConfig,
        rules: AllocatorRules,
        total_bytes: int,
        outside_bytes: Callable[[], int],
    ) -> None:
        self.trace = trace
        self.total_bytes = total_bytes
        self.outside_bytes = outside_bytes
        self.config = config
        self.rules = rules
        self.allocator = self._fresh_allocator()
        self.initialized = False
        """CUDA is initialised (`torch.cuda.is_initialized()`): set at `settle`, the job's first
        CUDA allocation or first CUDA-initialising call."""
        self.settle_config: Callable[[], AllocatorConfig | None] | None = None
        """Called once, at the job's first CUDA allocator use: the configuration the job set
        itself by then (None: the one given stands; raises the job's error for a bad one)."""
        self.position = 0
        self.live: dict[int, Block] = {}
        self.awaiting: dict[int, Block] = {}
        self.went_without: set[int] = set()
        self.stats = {name: [Stat(), Stat(), Stat()] for name in ARRAY_STATS}
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.fraction: float | None = None
        self._reserved_seen = 0

    @property
    def strict(self) -> bool:
        """A per-process memory fraction is set: allocations beyond it fail in the job."""
        return self.fraction is not None

    def settle(self) -> None:
        """The job's first CUDA allocator use: torch reads its allocator configuration now
        (capture.job_alloc_conf). Nothing has been replayed yet, so the allocator starts anew
        under the job's configuration where it set one."""
        self.initialized = True
        resolve, self.settle_config = self.settle_config, None
        if resolve is None:
            return
        config = resolve()
        if config is None:
            return
        self.config = config
        self.allocator = self._fresh_allocator()
        self.position = 0
        self.live.clear()
        self.awaiting.clear()

    def _fresh_allocator(self) -> CachingAllocator:
        """An empty allocator for this simulation's configuration, rules and device."""
        return CachingAllocator(
            self.config, self.rules, DeviceLimits(None, None, self.total_bytes),
            DeviceAddressSpace(),
        )

    # -- replay ---------------------------------------------------------------------------------
    def sync(self, raise_oom: bool = False) -> None:
        """Replay the events recorded since the last call; with `raise_oom` (the job catches
        CUDA's out-of-memory error: capture.oom_retry) the latest allocation, when the allocator
        cannot place it, raises that error in the job even without a memory fraction."""
        trace = self.trace
        end = len(trace)
        raise_oom = raise_oom or self.strict
        if raise_oom:
            self.allocator.set_capacity(self.total_bytes - self.outside_bytes())
        while self.position < end:
            index = self.position
            self.position += 1
            kind = trace.kinds[index]
            ident = trace.ids[index]
            if kind in (EventKind.ALLOC, EventKind.ALLOC_OR_SMALLER):
                self._malloc(index, kind, ident, trace.sizes[index], trace.streams[index], raise_oom)
            elif kind == EventKind.FREE:
                self._free(ident)
            elif kind == EventKind.RECORD_STREAM:
                block = self.live.get(ident)
                if block is not None:
                    self.allocator.record_stream(block, trace.streams[index])
            elif kind == EventKind.FREE_COMPLETED:
                block = self.awaiting.pop(ident, None)
                if block is not None:
                    self.allocator.complete_free(block)
            elif kind == EventKind.EMPTY_CACHE and ident >= 1:
                self.allocator.empty_cache(ident)  # one private pool's (private_pools)
            elif kind in POOL_KINDS:
                apply_pool_event(self.allocator, kind, ident)
            elif kind in (EventKind.SYNCHRONIZE, EventKind.EMPTY_CACHE):
                self.num_sync_all_streams += 1
                if kind == EventKind.EMPTY_CACHE:
                    self.allocator.empty_cache()
                else:
                    self.allocator.synchronize_and_free_events()
                self.awaiting.clear()
            self._update_segments()

    def _malloc(
        self, index: int, kind: int, ident: int, size: int, stream: int, raise_oom: bool = False
    ) -> None:
        try:
            block: Block | None = self.allocator.malloc(size, stream)
        except OutOfMemory:
            if kind == EventKind.ALLOC_OR_SMALLER:
                block = _smaller(self.allocator, size, stream)
            else:
                self.num_ooms += 1
                self._update_segments()
                if raise_oom and index == len(self.trace) - 1:
                    from peakmem.capture.fake_oom import job_error

                    raise job_error(self, size, index) from None
                block = None
        if block is None:
            self.went_without.add(ident)
            return
        self.live[ident] = block
        self._count(block, +1)

    def _free(self, ident: int) -> None:
        block = self.live.pop(ident, None)
        if block is None:
            self.went_without.discard(ident)
            return
        self._count(block, -1)
        if block.stream_uses:
            self.awaiting[ident] = block
        self.allocator.free(block)

    def _count(self, block: Block, sign: int) -> None:
        pool = 1 if block.pool.is_small else 2
        for name, amount in (
            ("allocation", 1),
            ("active", 1),
            ("allocated_bytes", block.size),
            ("active_bytes", block.size),
            ("requested_bytes", block.requested),
        ):
            stats = self.stats[name]
            stats[0].add(sign * amount)
            stats[pool].add(sign * amount)

    def _update_segments(self) -> None:
        reserved = self.allocator.total_allocated_memory
        if reserved == self._reserved_seen:
            return
        self._reserved_seen = reserved
        sizes = [0, 0, 0]
        counts = [0, 0, 0]
        for size in self.allocator.segments.values():
            pool = 1 if size == K_SMALL_BUFFER else 2
            sizes[pool] += size
            counts[pool] += 1
        for segment in self.allocator.expandable_segments:
            if segment.mapped_bytes:
                pool = 1 if segment.pool.is_small else 2
                sizes[pool] += segment.mapped_bytes
                counts[pool] += 1
        sizes[0], counts[0] = sizes[1] + sizes[2], counts[1] + counts[2]
        for pool in range(3):
            self.stats["reserved_bytes"][pool].set(sizes[pool])
            self.stats["segment"][pool].set(counts[pool])

    def _update_inactive_split(self) -> None:
        counts, sizes = [0, 0, 0], [0, 0, 0]
        for block in self.allocator.blocks_by_addr.values():
            if block.is_split():
                pool = 1 if block.pool.is_small else 2
                for at in (0, pool):
                    counts[at] += 1
                    sizes[at] += block.size
        for pool in range(3):
            self.stats["inactive_split"][pool].set(counts[pool])
            self.stats["inactive_split_bytes"][pool].set(sizes[pool])

    # -- what the job reads ---------------------------------------------------------------------
    def stat(self, name: str, metric: str = "current") -> int:
        self.sync()
        return getattr(self.stats[name][0], metric)

    def reset_peaks(self) -> None:
        self.sync()
        for stats in self.stats.values():
            for stat in stats:
                stat.peak = stat.current

    def reset_accumulated(self) -> None:
        self.sync()
        for stats in self.stats.values():
            for stat in stats:
                stat.allocated = stat.freed = 0
        self.num_ooms = self.num_sync_all_streams = 0
        self.allocator.num_alloc_retries = 0
        self.allocator.num_device_alloc = self.allocator.num_device_free = 0

    def set_fraction(self, fraction: float) -> None:
        self.settle()  # torch.cuda.set_per_process_memory_fraction initialises CUDA
        self.sync()
        self.fraction = fraction
        self.allocator.set_memory_fraction(fraction, self.total_bytes)
        self.allocator.set_capacity(self.total_bytes - self.outside_bytes())

    def nested_stats(self) -> dict[str, Any]:
        """`torch._C._cuda_memoryStats`: c10's DeviceStats as a nested dict."""
        self.sync()
        self._update_inactive_split()
        allocator = self.allocator
        result: dict[str, Any] = {
            name: {pool: stat.as_dict() for pool, stat in zip(POOLS, stats, strict=True)}
            for name, stats in self.stats.items()
        }
        max_split = self.config.max_split_size
        result.update(
            {
                "num_alloc_retries": allocator.num_alloc_retries,
                "num_ooms": self.num_ooms,
                "num_sync_all_streams": self.num_sync_all_streams,
                "num_device_alloc": allocator.num_device_alloc,
                "num_device_free": allocator.num_device_free,
                "max_split_size": -1 if max_split == SIZE_MAX else max_split,
                "oversize_allocations": self._oversize(self.live.values(), max_split),
                "oversize_segments": self._oversize(
                    [size for size in allocator.segments.values()], max_split
                ),
            }
        )
        return result

    @staticmethod
    def _oversize(items: Any, max_split: int) -> dict[str, int]:
        count = sum(
            1 for item in items if (item if isinstance(item, int) else item.size) >= max_split
        )
        return {"current": count, "peak": count, "allocated": count, "freed": 0}

    def mem_get_info(self) -> tuple[int, int]:
        reserved = self.stat("reserved_bytes")
        free = self.total_bytes - self.outside_bytes() - reserved
        return max(free, 0), self.total_bytes

    def segments(self) -> list[dict[str, Any]]:
        """`torch.cuda.memory_snapshot()`: the simulated segments and their blocks."""
        self.sync()
        allocator = self.allocator
        ranges = sorted(allocator.segments.items())
        ranges += sorted(
            (segment.base, segment.size) for segment in allocator.expandable_segments
        )
        ranges.sort()
        starts = [start for start, _ in ranges]
        found: list[list[tuple[Block, str]]] = [[] for _ in ranges]
        states = [
            (self.live.values(), "active_allocated"),
            (self.awaiting.values(), "active_awaiting_free"),
            (allocator.blocks_by_addr.values(), "inactive"),
        ]
        for blocks, state in states:
            for block in blocks:
                at = bisect.bisect_right(starts, block.addr) - 1
                if at >= 0:
                    found[at].append((block, state))
        out = []
        for (start, size), blocks in zip(ranges, found, strict=True):
            blocks.sort(key=lambda item: item[0].addr)
            allocated = sum(b.size for b, state in blocks if state == "active_allocated")
            active = sum(b.size for b, state in blocks if state != "inactive")
            small = any(b.pool.is_small for b, _ in blocks) if blocks else size == K_SMALL_BUFFER
            owner = next((b.pool.owner for b, _ in blocks if b.pool.owner is not None), None)
            out.append(
                {
                    "device": 0,
                    "address": start,
                    "total_size": size,
                    "allocated_size": allocated,
                    "active_size": active,
                    "requested_size": sum(b.requested for b, s in blocks if s != "inactive"),
                    "stream": 0,
                    "segment_type": "small" if small else "large",
                    "segment_pool_id": (0, owner.ident) if owner is not None else (0, 0),
                    "is_expandable": self.config.expandable_segments,
                    "frames": [],
                    "blocks": [
                        {
                            "address": b.addr,
                            "size": b.size,
                            "requested_size": b.requested if state != "inactive" else 0,
                            "state": state,
                            "frames": [],
                        }
                        for b, state in blocks
                    ],
                }
            )
        return out


def _smaller(allocator: CachingAllocator, size: int, stream: int) -> Block | None:
    size //= 2
    while size >= 1024:
        try:
            return allocator.malloc(size, stream)
        except OutOfMemory:
            size //= 2
    return None


def build(
    trace: Trace,
    *,
    total_bytes: int,
    outside_bytes: Callable[[], int],
    default_version: str,
    notes: list[str],
) -> SimulatedMemory:
    """The simulation for a capture; a configuration the target torch rejects is noted and the
    default configuration used (the estimate itself reports the bad configuration)."""
    conf, version = target_settings(default_version)
    start = target_start()
    loading_start = job_module_loading.start_value()
    try:
        rules = AllocatorRules.for_version(version)
    except ValueError:
        rules = AllocatorRules.for_version(None)
        version = None
    try:
        config = AllocatorConfig.parse(conf, version)
    except AllocatorConfigError:
        config = AllocatorConfig()
        notes.append(
            f"memory readings during the capture used the default allocator settings "
            f"(PYTORCH_CUDA_ALLOC_CONF={conf!r} was rejected)"
        )
    memory = SimulatedMemory(trace, config, rules, total_bytes, outside_bytes)

    def settle() -> AllocatorConfig | None:
        job_module_loading.record_at_init(trace.meta, loading_start)  # cuInit reads it too
        job = job_alloc_conf.job_conf(start, version)
        if job is None:
            return None
        try:
            parsed = AllocatorConfig.parse(job, version)
        except BackendNotSimulated as exc:
            from peakmem.capture.unsupported import Unsupported

            raise Unsupported(f"the job's own allocator setting ({exc})") from None
        except AllocatorConfigError as exc:  # torch raises this at the first CUDA use
            raise RuntimeError(str(exc)) from None
        trace.meta[job_alloc_conf.META_KEY] = job
        return parsed

    memory.settle_config = settle
    return memory
