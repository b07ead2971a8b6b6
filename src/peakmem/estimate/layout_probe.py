"""How far a simulated peak sits from an allocator-layout flip.

The caching allocator serves a request from the smallest cached block that fits (best fit,
`get_free_block`) and splits it. A job whose largest tensor (an embedding's gradient, Adam's
`_foreach_sqrt` temporary of it) is freed and allocated again every step leaves a cached block
of that size free while the forward and backward run; as long as every other request finds a
smaller cached block, the block stays whole and is reused. When one request does not (the
20 MiB segments of the requests below 10 MiB happen to be full at that moment), best fit splits
the large free block and the next request of the large size opens a new segment: the reserved
peak grows by one whole segment of the largest size, from a change of a few MiB.

Which side of that edge a real run falls on depends on every small allocation in it; a capture
that differs from the GPU run by one small persistent block (a library workspace of another
size, a cuBLAS handle of another thread) can land on the other side. `probe_layout` measures
that: it replays the trace again under small perturbations of the 20 MiB-segment pool, each
alone, and reports how the reserved peak moves beyond what the perturbation itself takes:
- one extra persistent block of 2-8 MiB allocated before the first event;
- the cuBLAS workspaces (`cublas_workspace[...]` allocations) at the sizes other
  CUBLAS_WORKSPACE_CONFIG values give (`:16:8` 128 KiB, `:4096:1` 4 MiB, `:4096:4` 16 MiB).

Found on GPUMemNet's Transformer rows (issue 13): the rows the A100 measured about one
embedding-gradient segment over the estimate (00481, 00831, 00754) move up by that segment under
one of the probes (00754 only when its workspaces shrink), 00014, measured to the MiB, moves
down by one segment, and 00240, 00573, also measured to the MiB, do not move at all.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from peakmem.allocator.addresses import DeviceAddressSpace
from peakmem.allocator.caching import (
    K_SMALL_SIZE,
    Block,
    CachingAllocator,
    DeviceLimits,
    OutOfMemory,
)
from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.rules import AllocatorRules
from peakmem.allocator.simulate import simulate
from peakmem.trace.events import ALLOC_KINDS, EventKind, Trace

MiB = 1 << 20
KERNEL_SEGMENT = 20 * MiB
"""kLargeBuffer: the segment a large-pool request below kMinLargeAlloc (10 MiB) opens."""

PROBE_SIZES: tuple[int, ...] = (2 * MiB, 4 * MiB, 6 * MiB, 8 * MiB)
"""Extra persistent blocks tried: all above kSmallSize (1 MiB) and below kMinLargeAlloc (10 MiB),
so each one lands in the pool of 20 MiB segments that the large pool's requests below 10 MiB
share (a 1 MiB request would go to the small pool's 2 MiB segments instead)."""

WORKSPACE_PROBE_SIZES: tuple[int, ...] = (128 * 1024, 4 * MiB, 16 * MiB)
"""cuBLAS workspace sizes tried: CUBLAS_WORKSPACE_CONFIG `:16:8`, `:4096:1` and `:4096:4`
(aten/src/ATen/cuda/CublasHandlePool.cpp: the sum of size x count over the `:SIZE_KiB:COUNT`
pairs)."""

WORKSPACE_OP_PREFIX = "cublas_workspace"


@dataclass(frozen=True)
class LayoutProbe:
    """The reserved peak of a trace, and how each perturbation moved it."""

    base_reserved_bytes: int
    moves: dict[str, int]
    """probe name -> peak reserved bytes with the probe - without it."""
    allowances: dict[str, int]
    """probe name -> how far the perturbation itself may move the peak: a 20 MiB segment per
    block it adds or resizes, plus the bytes it adds or removes."""

    def excess_bytes(self, name: str) -> int:
        """How far probe `name` moved the peak beyond its allowance, with its sign (0 inside)."""
        move, allowance = self.moves[name], self.allowances[name]
        if move > allowance:
            return move - allowance
        if move < -allowance:
            return move + allowance
        return 0

    @property
    def max_excess_bytes(self) -> int:
        """The largest growth beyond a probe's allowance (0 when no probe grows it more)."""
        return max([0, *(self.excess_bytes(name) for name in self.moves)])

    @property
    def min_excess_bytes(self) -> int:
        """The largest drop beyond a probe's allowance (<= 0): the simulation sat one layout
        above a run that differs from it by a small block."""
        return min([0, *(self.excess_bytes(name) for name in self.moves)])

    @property
    def flips(self) -> bool:
        """Whether some probe moves the peak beyond its allowance either way."""
        return self.max_excess_bytes > 0 or self.min_excess_bytes < 0


def with_persistent_block(trace: Trace, size: int) -> Trace:
    """A copy of `trace` with one block of `size` bytes allocated before its first event and
    never freed (tags, streams and ids of the other events unchanged)."""
    probed = Trace(meta=dict(trace.meta))
    for tag in trace.tags:  # the same tag ids as in `trace`
        probed.intern(tag)
    used = [ident for ident, kind in zip(trace.ids, trace.kinds, strict=True)
            if kind in ALLOC_KINDS]
    probed.alloc(size, ident=max(used, default=-1) + 1, op="layout_probe")
    probed.kinds.extend(trace.kinds)
    probed.ids.extend(trace.ids)
    probed.sizes.extend(trace.sizes)
    probed.streams.extend(trace.streams)
    probed.tag_ids.extend(trace.tag_ids)
    return probed


def workspace_events(trace: Trace) -> list[int]:
    """Indexes of the trace's cuBLAS workspace allocations."""
    tagged = {index for index, tag in enumerate(trace.tags)
              if (tag.op or "").startswith(WORKSPACE_OP_PREFIX)}
    return [i for i, (kind, tag_id) in enumerate(zip(trace.kinds, trace.tag_ids, strict=True))
            if kind in ALLOC_KINDS and tag_id in tagged]


def with_workspace_size(trace: Trace, size: int) -> Trace:
    """A copy of `trace` with every cuBLAS workspace allocation resized to `size` bytes."""
    probed = Trace(meta=dict(trace.meta))
    for tag in trace.tags:
        probed.intern(tag)
    probed.kinds.extend(trace.kinds)
    probed.ids.extend(trace.ids)
    probed.sizes.extend(trace.sizes)
    probed.streams.extend(trace.streams)
    probed.tag_ids.extend(trace.tag_ids)
    for index in workspace_events(trace):
        probed.sizes[index] = size
    return probed


def probe_layout(
    trace: Trace,
    alloc_conf: str | None = None,
    torch_version: str | None = None,
    sizes: Iterable[int] = PROBE_SIZES,
    workspace_sizes: Iterable[int] = WORKSPACE_PROBE_SIZES,
) -> LayoutProbe:
    """What `probe_layout_plain` finds, probe for probe, replayed cheaper (`_probe_lean`): each
    replay runs the allocator alone (`_Replay`: no trace copy, only the reserved peak kept);
    the small pool (requests up to 1 MiB), the same under every probe of large requests, is
    replayed once and those probes replay the large pool's events alone (`_pool_lanes`); the
    cuBLAS workspace probes start from a copy of the unprobed replay at the first workspace
    allocation (the events before it are the same in every one of them). A trace this lean
    replay does not cover (events other than allocations, frees and marks; an out-of-memory;
    an inconsistent trace) is replayed by `probe_layout_plain`."""
    sizes, workspace_sizes = tuple(sizes), tuple(workspace_sizes)
    checked = (*sizes, *workspace_sizes) if workspace_events(trace) else sizes
    for size in checked:  # the sizes `probe_layout_plain` replays
        if size <= 0:
            raise ValueError(f"probe sizes must be positive, got {size}")
    if not set(trace.kinds) <= _LEAN_KINDS:
        return probe_layout_plain(trace, alloc_conf, torch_version, sizes, workspace_sizes)
    try:
        return _probe_lean(trace, alloc_conf, torch_version, sizes, workspace_sizes)
    except _NotLean:
        return probe_layout_plain(trace, alloc_conf, torch_version, sizes, workspace_sizes)


_LEAN_KINDS = frozenset({EventKind.ALLOC, EventKind.ALLOC_OR_SMALLER, EventKind.FREE,
                         EventKind.MARK})


_ALLOC_KINDS = (EventKind.ALLOC, EventKind.ALLOC_OR_SMALLER)


class _NotLean(Exception):
    """The lean replay met something only `simulate` handles (its reports included)."""


class _Replay:
    """One allocator replaying allocations and frees, keeping only the peak of reserved bytes
    (`simulate` keeps it the same way: after each allocation)."""

    def __init__(self, alloc_conf: str | None, torch_version: str | None) -> None:
        self.allocator = CachingAllocator(
            AllocatorConfig.parse(alloc_conf, torch_version),
            AllocatorRules.for_version(torch_version),
            DeviceLimits(),
            DeviceAddressSpace(),
        )
        self.live: dict[int, Block] = {}
        self.peak = 0
        self.skipped = 0
        """Events not replayed: found to repeat what was (`run`)."""

    def fork(self) -> _Replay:
        """An independent copy (allocator, live blocks and peak) to replay on from here (a
        segment's block chain is copied at once by `Block.__deepcopy__`, not by recursion)."""
        return copy.deepcopy(self)

    def alloc(self, size: int, stream: int = 0) -> Block:
        try:
            block = self.allocator.malloc(size, stream)
        except OutOfMemory as exc:
            raise _NotLean from exc
        reserved = self.allocator.total_allocated_memory
        if reserved > self.peak:
            self.peak = reserved
        return block

    def run(self, kinds: Sequence[int], ids: Sequence[int], sizes: Sequence[int],
            streams: Sequence[int], start: int = 0, stop: int | None = None,
            cuts: Sequence[int] = ()) -> None:
        """Replay events `start` to `stop` (exclusive; None: to the end). `cuts`: event indexes
        (the trace's step marks) where the replay may find that what follows repeats the
        stretch since the last cut, replayed from an equal allocator state, and jump over the
        repeats (`_jump`): they reach no reserved figure that stretch did not, and leave the
        allocator as it is now."""
        stop = len(kinds) if stop is None else stop
        before = self._state()
        first = start
        while first < stop:
            cut = next((c for c in cuts if first < c < stop), stop)
            alloc_addrs: dict[int, int] = {}
            free_addrs: dict[int, int] = {}
            if before is not None and _repeats_from(kinds, sizes, streams, first, cut, stop):
                self._replay(kinds, ids, sizes, streams, first, cut, alloc_addrs, free_addrs)
            else:
                self._replay(kinds, ids, sizes, streams, first, cut)
            after = self._state() if cut < stop else None
            if after is not None and after == before and (alloc_addrs or free_addrs):
                resume = self._jump(kinds, ids, sizes, streams, first, cut, stop,
                                    alloc_addrs, free_addrs)
                self.skipped += resume - cut
                cut = resume
            before, first = after, cut

    def _replay(self, kinds: Sequence[int], ids: Sequence[int], sizes: Sequence[int],
                streams: Sequence[int], start: int, stop: int,
                alloc_addrs: dict[int, int] | None = None,
                free_addrs: dict[int, int] | None = None) -> None:
        """Replay events `start` to `stop`; with `alloc_addrs` and `free_addrs`, note event
        index -> address of the block each allocation got and each free released."""
        allocator, live = self.allocator, self.live
        malloc, free = allocator.malloc, allocator.free
        peak = self.peak
        alloc_kinds, free_kind = _ALLOC_KINDS, EventKind.FREE
        recording = alloc_addrs is not None and free_addrs is not None
        try:
            for index in range(start, stop):
                kind = kinds[index]
                if kind == free_kind:
                    block = live.pop(ids[index])
                    if recording:
                        free_addrs[index] = block.addr
                    free(block)
                elif kind in alloc_kinds:
                    ident = ids[index]
                    if ident in live:
                        raise _NotLean(f"event {index}: id {ident} allocated twice")
                    block = live[ident] = malloc(sizes[index], streams[index])
                    if recording:
                        alloc_addrs[index] = block.addr
                    reserved = allocator.total_allocated_memory
                    if reserved > peak:
                        peak = reserved
        except (KeyError, OutOfMemory) as exc:
            raise _NotLean from exc
        finally:
            self.peak = peak

    def _state(self) -> tuple | None:
        """Everything of the allocator a later malloc or free can depend on (the blocks with
        their addresses, neighbours and flags, the segments, the address space, the byte
        counts), comparable between two moments; None where the lean replay does not compare
        (expandable segments, garbage collection, blocks waiting on streams)."""
        a = self.allocator
        if (a.config.expandable_segments or a._gc_enabled or a.pending_free  # noqa: SLF001
                or a.ready_free or a.expandable_segments):
            return None
        blocks = sorted(
            (b.addr, b.size, b.stream, b.pool.is_small, b.allocated, b.requested, b.mapped,
             None if b.prev is None else b.prev.addr, None if b.next is None else b.next.addr,
             b.segment is None, bool(b.stream_uses), b.event_count, b.gc_count_base)
            for b in (*a.blocks_by_addr.values(), *self.live.values())
        )
        space = a.addresses
        return (
            tuple(blocks), tuple(sorted(a.segments.items())),
            a.total_allocated_memory, a.allocated_bytes, a.requested_bytes,
            len(a._unmapped_blocks), a._mapped_expandable,  # noqa: SLF001
            space._next, tuple(space._free_ranges), tuple(sorted(space._live.items())),  # noqa: SLF001
            bool(space._hints),  # noqa: SLF001
        )

    def _jump(self, kinds: Sequence[int], ids: Sequence[int], sizes: Sequence[int],
              streams: Sequence[int], first: int, cut: int, stop: int,
              alloc_addrs: dict[int, int], free_addrs: dict[int, int]) -> int:
        """Skip the events from `cut` on that repeat events `first` to `cut` (just replayed
        from a state equal to the present one) operation for operation: the same requests,
        and every free releasing the block at the address the free at the same place in that
        stretch released (addresses followed without replaying: the k-th allocation of a
        repeat lands where the k-th of the stretch did). Whole repeats are skipped, and a last
        one cut short by the end of the trace; the live blocks are renamed to the ids the
        repeats left on them. Returns the index where the replay resumes (`cut`: none)."""
        address = {ident: block.addr for ident, block in self.live.items()}
        period = cut - first
        free_kind = EventKind.FREE
        resume, renamed = cut, address.copy()
        at = cut
        while at < stop:
            end = min(at + period, stop)
            if not _same_requests(kinds, sizes, streams, first, at, end):
                break
            for index in range(at, end):
                kind = kinds[index]
                same = first + index - at
                if kind == free_kind:
                    if address.pop(ids[index], None) != free_addrs[same]:
                        return self._rename(resume, renamed)
                elif kind in _ALLOC_KINDS:
                    ident = ids[index]
                    if ident in address:
                        return self._rename(resume, renamed)
                    address[ident] = alloc_addrs[same]
            if end == stop:
                return stop  # the rest repeats to the end: nothing more to replay
            resume, renamed = end, address.copy()
            at = end
        return self._rename(resume, renamed)

    def _rename(self, resume: int, address: dict[int, int]) -> int:
        """Give the live blocks the ids `address` (id -> block address) names; returns
        `resume`."""
        by_addr = {block.addr: block for block in self.live.values()}
        self.live = {ident: by_addr[addr] for ident, addr in address.items()}
        return resume



def _same_requests(kinds: Sequence[int], sizes: Sequence[int], streams: Sequence[int],
                   first: int, at: int, end: int) -> bool:
    """Whether events `at` to `end` have the kinds, sizes and streams of the as many events
    from `first` on."""
    length = end - at
    return all(column[at:end] == column[first:first + length]
               for column in (kinds, sizes, streams))


def _repeats_from(kinds: Sequence[int], sizes: Sequence[int], streams: Sequence[int],
                  first: int, cut: int, stop: int) -> bool:
    """Whether at least the events just after `cut` repeat the stretch `first` to `cut` (a
    whole repeat, or all that is left), so that noting the stretch's addresses may pay."""
    period = cut - first
    if period <= 0 or cut >= stop:
        return False
    return _same_requests(kinds, sizes, streams, first, cut, min(cut + period, stop))



@dataclass
class _Events:
    """Events of a trace, or of one allocator pool's share of them (`_pool_lanes`)."""

    kinds: list[int]
    ids: list[int]
    sizes: list[int]
    streams: list[int]
    workspaces: list[int]
    """Positions of the cuBLAS workspace allocations among these events."""
    cuts: list[int]
    """Positions where the trace's training steps end (`step_marks`): a replay may jump over
    steps that repeat (`_Replay.run`)."""

    @classmethod
    def of(cls, trace: Trace, keep: Sequence[int] | None = None) -> _Events:
        """The trace's events, or those at indexes `keep` (in order)."""
        workspaces = workspace_events(trace)
        marks = step_marks(trace)
        if keep is None:
            return cls(trace.kinds, trace.ids, trace.sizes, trace.streams, workspaces, marks)
        position = {index: at for at, index in enumerate(keep)}
        cuts = sorted({bisect.bisect_left(keep, mark) for mark in marks})
        return cls([trace.kinds[i] for i in keep], [trace.ids[i] for i in keep],
                   [trace.sizes[i] for i in keep], [trace.streams[i] for i in keep],
                   [position[i] for i in workspaces if i in position], cuts)

    def with_workspace_size(self, size: int) -> list[int]:
        """The sizes with every workspace allocation at `size` bytes."""
        sizes = list(self.sizes)
        for at in self.workspaces:
            sizes[at] = size
        return sizes


def step_marks(trace: Trace) -> list[int]:
    """Indexes of the trace's step marks (`step N` labels: a training step ended)."""
    steps = {index for index, tag in enumerate(trace.tags)
             if (tag.op or "").startswith("step ")}
    return [i for i, (kind, tag_id) in enumerate(zip(trace.kinds, trace.tag_ids, strict=True))
            if kind == EventKind.MARK and tag_id in steps]


def _pool_lanes(trace: Trace, allocator: CachingAllocator) -> tuple[_Events, _Events] | None:
    """The trace's small-pool and large-pool events apart (requests of at most kSmallSize
    (1 MiB) once rounded, and their frees), where replaying each alone gives the same reserved
    peak as replaying them together: the two pools never share a block; without a capacity,
    garbage collection, expandable segments or an empty_cache no segment is ever released, so
    each pool's reserved bytes only grow and the peak is the sum of the two pools' last
    figures; and segments are handed out at rising addresses, so within a pool equal-size
    blocks keep their order by address with or without the other pool's segments between
    them. None where that does not hold (or the trace frees an id it did not allocate, or
    allocates one twice: the whole replay reports that)."""
    if allocator.config.expandable_segments:
        return None
    small: list[int] = []
    large: list[int] = []
    pool_of: dict[int, list[int]] = {}
    alloc_kinds, free_kind = _ALLOC_KINDS, EventKind.FREE
    round_size = allocator.round_size
    for index, (kind, ident, size) in enumerate(
        zip(trace.kinds, trace.ids, trace.sizes, strict=True)
    ):
        if kind == free_kind:
            lane = pool_of.pop(ident, None)
            if lane is None:
                return None
            lane.append(index)
        elif kind in alloc_kinds:
            if ident in pool_of:
                return None
            lane = small if round_size(size) <= K_SMALL_SIZE else large
            pool_of[ident] = lane
            lane.append(index)
    return _Events.of(trace, small), _Events.of(trace, large)


def _probe_lean(
    trace: Trace,
    alloc_conf: str | None,
    torch_version: str | None,
    sizes: tuple[int, ...],
    workspace_sizes: tuple[int, ...],
) -> LayoutProbe:
    """The probes by lean replays. Where the pools can be replayed apart (`_pool_lanes`), a
    probe that only adds or resizes large-pool requests replays the large pool's events alone,
    on top of the small pool's peak (replayed once): the small pool is the same in all of
    them. Workspace probes start from a copy of their lane's unprobed replay at its first
    workspace allocation."""
    full = _Events.of(trace)
    sizer = _Replay(alloc_conf, torch_version).allocator  # rounds sizes as the replays do
    lanes = _pool_lanes(trace, sizer) if trace.kinds else None
    small_peak = 0
    main = full
    if lanes is not None:
        small_lane, main = lanes
        small = _Replay(alloc_conf, torch_version)
        small.run(small_lane.kinds, small_lane.ids, small_lane.sizes, small_lane.streams,
                  cuts=small_lane.cuts)
        small_peak = small.peak

    def large_only(*requests: int) -> bool:
        return lanes is not None and all(sizer.round_size(size) > K_SMALL_SIZE for size in requests)

    forks: dict[int, _Replay] = {}

    def replay_lane(events: _Events, fork_workspaces: bool, to_end: bool = True) -> _Replay:
        """The unprobed replay of `events` (only up to the first workspace where not
        `to_end`), noting a copy of it at the first workspace."""
        replay = _Replay(alloc_conf, torch_version)
        at = events.workspaces[0] if fork_workspaces and events.workspaces else len(events.kinds)
        replay.run(events.kinds, events.ids, events.sizes, events.streams, 0, at, events.cuts)
        if at < len(events.kinds):
            forks[id(events)] = replay.fork() if to_end else replay
        if to_end:
            replay.run(events.kinds, events.ids, events.sizes, events.streams, at, None,
                       events.cuts)
        return replay

    workspaces = [trace.sizes[i] for i in full.workspaces]
    probe_workspaces = bool(workspaces and workspace_sizes)
    base = replay_lane(main, probe_workspaces)
    base_peak = small_peak + base.peak if main is not full else base.peak
    moves: dict[str, int] = {}
    allowances: dict[str, int] = {}
    for size in sizes:
        lane, on_top = (main, small_peak) if large_only(size) else (full, 0)
        replay = _Replay(alloc_conf, torch_version)
        replay.alloc(size)  # the persistent block: stream 0, before the first event
        replay.run(lane.kinds, lane.ids, lane.sizes, lane.streams, cuts=lane.cuts)
        moves[f"block {size}"] = on_top + replay.peak - base_peak
        allowances[f"block {size}"] = KERNEL_SEGMENT
    for size in workspace_sizes if probe_workspaces else ():
        in_lane = large_only(size, *workspaces)
        lane, on_top = (main, small_peak) if in_lane else (full, 0)
        if id(lane) not in forks:  # the whole trace, where the lane is only the large pool
            replay_lane(lane, True, to_end=False)
        replay = forks[id(lane)].fork()
        replay.run(lane.kinds, lane.ids, lane.with_workspace_size(size), lane.streams,
                   lane.workspaces[0], None, lane.cuts)
        name = f"cublas workspace {size}"
        moves[name] = on_top + replay.peak - base_peak
        allowances[name] = (sum(abs(size - old) for old in workspaces)
                            + len(workspaces) * KERNEL_SEGMENT)
    return LayoutProbe(base_peak, moves, allowances)


def probe_layout_plain(
    trace: Trace,
    alloc_conf: str | None = None,
    torch_version: str | None = None,
    sizes: Iterable[int] = PROBE_SIZES,
    workspace_sizes: Iterable[int] = WORKSPACE_PROBE_SIZES,
) -> LayoutProbe:
    """Replay `trace` as is and under each perturbation (module docstring): one extra block of
    each of `sizes` bytes, and the cuBLAS workspaces at each of `workspace_sizes` (where the
    trace has any). Each replay is one `simulate` of the whole trace, of a probed copy of the
    trace: the reference `probe_layout` must match probe for probe."""
    base = simulate(trace, alloc_conf, torch_version).peak_reserved_bytes
    moves: dict[str, int] = {}
    allowances: dict[str, int] = {}

    def replay(name: str, probed: Trace, allowance: int) -> None:
        moves[name] = simulate(probed, alloc_conf, torch_version).peak_reserved_bytes - base
        allowances[name] = allowance

    for size in sizes:
        if size <= 0:
            raise ValueError(f"probe sizes must be positive, got {size}")
        replay(f"block {size}", with_persistent_block(trace, size), KERNEL_SEGMENT)
    workspaces = [trace.sizes[i] for i in workspace_events(trace)]
    for size in workspace_sizes if workspaces else ():
        if size <= 0:
            raise ValueError(f"probe sizes must be positive, got {size}")
        changed = sum(abs(size - old) for old in workspaces)
        replay(f"cublas workspace {size}", with_workspace_size(trace, size),
               changed + len(workspaces) * KERNEL_SEGMENT)
    return LayoutProbe(base, moves, allowances)
