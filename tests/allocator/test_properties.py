"""Invariants of the allocator simulation over random traces (hypothesis)."""

import contextlib
import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peakmem.allocator import AllocatorConfig, CachingAllocator, DeviceLimits, OutOfMemory, simulate
from peakmem.allocator.caching import key_fields
from peakmem.trace import Trace

MiB = 1024 * 1024

# Sizes concentrated around the allocator's boundaries (512 B, 1 MiB, 10 MiB, 20 MiB, ...).
boundary = st.sampled_from(
    [
        1,
        511,
        512,
        513,
        MiB - 1,
        MiB,
        MiB + 1,
        10 * MiB - 512,
        10 * MiB,
        19 * MiB,
        19 * MiB + 512,
        20 * MiB,
        21 * MiB,
        100 * MiB,
    ]
)
sizes = st.one_of(boundary, st.integers(0, 2 * MiB), st.integers(MiB, 64 * MiB))
op = st.tuples(
    st.sampled_from(["alloc", "alloc", "free", "free", "record", "sync", "empty"]),
    sizes,
    st.integers(0, 2),
    st.integers(0, 10**6),
)
configs = st.sampled_from(
    [
        "",
        "expandable_segments:True",
        "max_split_size_mb:40",
        "roundup_power2_divisions:4",
        "max_split_size_mb:20,expandable_segments:True",
    ]
)


def check_structure(alloc: CachingAllocator, live: dict[int, object], pending: list) -> None:
    """Blocks tile their segments, free blocks are exactly the pooled ones, counters add up."""
    by_addr = dict(alloc.blocks_by_addr)
    for block in list(live.values()) + pending:
        by_addr[block.addr] = block
    allocated = sum(b.size for b in live.values())
    requested = sum(b.requested for b in live.values())
    assert alloc.allocated_bytes == allocated
    assert alloc.requested_bytes == requested
    assert (
        alloc.total_allocated_memory
        >= alloc.allocated_bytes
        >= sum(b.requested for b in live.values())
    )
    # cudaMalloc'd segments: walk each from its head block
    reserved = 0
    for addr, size in alloc.segments.items():
        block = by_addr[addr]
        assert block.prev is None
        covered = 0
        while block is not None:
            assert block.addr == addr + covered
            if block.next is not None:
                assert block.next.prev is block
                free_pair = (
                    not block.allocated
                    and not block.next.allocated
                    and block.event_count == 0
                    and block.next.event_count == 0
                )
                assert not free_pair, "two free neighbours were not merged"
            covered += block.size
            block = block.next
        assert covered == size
        reserved += size
    reserved += sum(s.mapped_bytes for s in alloc.expandable_segments)
    assert reserved == alloc.total_allocated_memory
    # the segment count is kept as a counter: it equals a scan of the segments
    mapped = sum(1 for s in alloc.expandable_segments if s.mapped_pages)
    assert alloc.num_segments == len(alloc.segments) + mapped
    pooled = {
        key_fields(key)[2] for pool in (alloc.small_blocks, alloc.large_blocks) for key in pool.blocks
    }
    assert pooled == set(alloc.blocks_by_addr)
    for block in alloc.blocks_by_addr.values():
        assert not block.allocated and block.mapped


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=60), configs, st.booleans())
def test_structure_and_counters_hold_after_every_operation(ops, conf, bounded):
    limits = DeviceLimits(capacity_bytes=256 * MiB if bounded else None, total_bytes=256 * MiB)
    alloc = CachingAllocator(AllocatorConfig.parse(conf), limits=limits)
    live: dict[int, object] = {}
    pending: list = []
    next_id = 0
    for kind, size, stream, pick in ops:
        if kind == "alloc":
            with contextlib.suppress(OutOfMemory):
                live[next_id] = alloc.malloc(size, stream)
            next_id += 1
        elif kind in ("free", "record") and live:
            key = sorted(live)[pick % len(live)]
            if kind == "record":
                alloc.record_stream(live[key], (stream + 1) % 3)
            else:
                block = live.pop(key)
                alloc.free(block)
                if block.event_count:
                    pending.append(block)
        elif kind == "sync":
            alloc.synchronize_and_free_events()
            pending.clear()
        elif kind == "empty":
            alloc.empty_cache()
            pending.clear()
        pending = [b for b in pending if b.event_count]
        check_structure(alloc, live, pending)


def build_trace(ops) -> Trace:
    t = Trace()
    live: list[int] = []
    for kind, size, stream, pick in ops:
        if kind == "alloc":
            live.append(t.alloc(size, stream))
        elif kind == "free" and live:
            t.free(live.pop(pick % len(live)))
        elif kind == "record" and live:
            t.record_stream(live[pick % len(live)], (stream + 1) % 3)
        elif kind == "sync":
            t.synchronize()
    return t


@settings(max_examples=100, deadline=None)
@given(st.lists(op, max_size=80), configs)
def test_peaks_are_ordered_and_reserved_never_shrinks_without_a_release(ops, conf):
    # no empty_cache, no capacity, no memory fraction: nothing may give memory back
    ops = [o for o in ops if o[0] != "empty"]
    r = simulate(build_trace(ops), conf, timeline=True)
    assert r.peak_reserved_bytes >= r.peak_allocated_bytes >= r.peak_requested_bytes
    reserved = r.timeline.reserved
    assert all(a <= b for a, b in zip(reserved, reserved[1:], strict=False))
    for res, al in zip(r.timeline.reserved, r.timeline.allocated, strict=True):
        assert res >= al


@settings(max_examples=50, deadline=None)
@given(st.lists(op, max_size=80), configs)
def test_identical_traces_give_identical_results(ops, conf):
    a = simulate(build_trace(ops), conf).to_dict()
    b = simulate(build_trace(ops), conf).to_dict()
    assert a == b


@settings(max_examples=50, deadline=None)
@given(st.lists(op, max_size=40))
def test_trace_round_trips_through_json_lines(ops):
    t = build_trace(ops)
    t.mark("step 1")
    t.alloc(4096, category="activation", module="model.fc1", phase="forward", op="aten.mm")
    buffer = io.StringIO()
    t.dump(buffer)
    buffer.seek(0)
    assert Trace.load(buffer) == t
