"""Private memory pools (CUDA graphs, torch.cuda.MemPool), worked out by hand from
c10/cuda/CUDACachingAllocator.cpp: `get_pool` under `captures_underway`, `create_or_incref_pool`,
`releasePool`, `release_cached_blocks` over `graph_pools_freeable`.

Sizes used: a 3 MiB request is large (> 1 MiB) and under 10 MiB, so a new segment for it is
kLargeBuffer = 20 MiB; an 18 MiB request gets an 18 MiB segment (rounded to 2 MiB); a 512 KiB
request is small, in a 2 MiB segment.
"""

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peakmem.allocator import CachingAllocator, DeviceLimits, OutOfMemory, TraceError, simulate
from peakmem.trace import EventKind, Trace
from peakmem.trace.events import TraceFormatError

KiB = 1024
MiB = 1024 * 1024


def test_capture_allocations_take_their_own_segment_not_the_cached_default_one():
    t = Trace()
    a = t.alloc(3 * MiB)  # default pool: a 20 MiB segment
    t.free(a)  # cached, free, in the default large pool
    t.pool_begin(1)
    t.alloc(3 * MiB)  # private pool 1 has no block: a second 20 MiB segment
    t.pool_end(1)
    t.alloc(3 * MiB)  # outside the capture: the cached default segment again
    r = simulate(t)
    assert r.peak_reserved_bytes == 40 * MiB
    assert r.final_reserved_bytes == 40 * MiB
    assert r.final_allocated_bytes == 6 * MiB
    assert r.num_device_alloc == 2


def test_a_private_pool_block_freed_after_capture_serves_no_other_allocation():
    t = Trace()
    t.pool_begin(1)
    b = t.alloc(3 * MiB)  # pool 1: 20 MiB segment, 3 MiB allocated, 17 MiB free (split)
    t.pool_end(1)
    t.free(b)  # back to pool 1, merged: a free 20 MiB segment of pool 1
    t.alloc(3 * MiB)  # default pool is empty: a new 20 MiB segment
    r = simulate(t)
    assert r.final_reserved_bytes == 40 * MiB
    assert r.final_allocated_bytes == 3 * MiB


def test_capture_time_frees_are_reused_within_the_pool_and_by_a_later_capture_sharing_it():
    t = Trace()
    t.pool_begin(1)
    x = t.alloc(3 * MiB)  # 20 MiB segment of pool 1
    t.free(x)  # a capture-time free: the block stays in pool 1
    y = t.alloc(3 * MiB)  # reuses it
    t.pool_end(1)
    t.pool_begin(1)  # a second graph sharing the pool (use count 2)
    z = t.alloc(15 * MiB)  # 17 MiB left in pool 1's segment: fits, split (2 MiB > 1 MiB left)
    t.pool_end(1)
    r = simulate(t)
    assert r.peak_reserved_bytes == 20 * MiB
    assert r.final_allocated_bytes == 18 * MiB
    assert r.num_device_alloc == 1
    assert y != z


def test_empty_cache_frees_a_pool_only_once_every_user_released_it():
    t = Trace()
    t.pool_begin(1)  # graph 1
    g1 = t.alloc(3 * MiB)
    t.pool_end(1)
    t.pool_begin(1)  # graph 2, same pool
    g2 = t.alloc(3 * MiB)
    t.pool_end(1)
    t.free(g1)
    t.free(g2)  # pool 1: one free 20 MiB segment
    d = t.alloc(MiB + 1)  # default pool: 20 MiB
    t.free(d)
    t.empty_cache()  # the default segment goes; pool 1 is in use (count 2): it stays
    t.pool_release(1)  # graph 1 reset: count 1
    t.empty_cache()  # still in use
    first = simulate(t)
    assert first.final_reserved_bytes == 20 * MiB
    t.pool_release(1)  # graph 2 reset: count 0, freeable
    t.mark("released")  # no memory effect until the cache is emptied
    second = simulate(t)
    assert second.final_reserved_bytes == 20 * MiB
    t.empty_cache()
    third = simulate(t)
    assert third.final_reserved_bytes == 0
    assert third.peak_reserved_bytes == 40 * MiB


def test_a_released_pool_keeps_the_segments_its_live_tensors_hold():
    t = Trace()
    t.pool_begin(1)
    kept = t.alloc(3 * MiB)  # a static output still referenced after the graph is gone
    small = t.alloc(512 * KiB)  # pool 1's small pool: a 2 MiB segment
    t.pool_end(1)
    t.pool_release(1)
    t.free(small)
    t.empty_cache()  # the unsplit free 2 MiB segment goes; the 20 MiB one is split (kept)
    r = simulate(t)
    assert r.final_reserved_bytes == 20 * MiB
    t.free(kept)
    t.empty_cache()  # now wholly free: cudaFreed, and the pool is forgotten
    r = simulate(t)
    assert r.final_reserved_bytes == 0


def test_mempool_destructor_empties_only_its_own_pool():
    t = Trace()
    t.pool_begin(1)  # MemPool(): createOrIncrefPool, count 1
    t.pool_end(1)
    t.pool_begin(1)  # use_mem_pool: count 2
    m = t.alloc(3 * MiB)  # 20 MiB in pool 1
    t.pool_end(1)
    t.pool_release(1)  # use_mem_pool's exit: count 1
    d = t.alloc(3 * MiB)  # default pool: 20 MiB
    t.free(d)
    t.free(m)
    t.pool_release(1)  # ~MemPool: releasePool (count 0) ...
    t.empty_cache(1)  # ... and emptyCache(its id): the default pool's cache is kept
    r = simulate(t)
    assert r.final_reserved_bytes == 20 * MiB
    assert r.peak_reserved_bytes == 40 * MiB


def test_no_cache_flush_retry_while_capturing():
    # The device can hold 40 MiB. A cached free 20 MiB default segment plus a 26 MiB one for
    # a 25 MiB request do not fit; outside a capture the allocator frees its cache and retries,
    # under capture it may not (captures_underway guards release_cached_blocks).
    def trace(capturing: bool) -> Trace:
        t = Trace()
        t.free(t.alloc(3 * MiB))
        if capturing:
            t.pool_begin(1)
        t.alloc(25 * MiB)
        return t

    eager = simulate(trace(False), capacity_bytes=40 * MiB)
    assert not eager.oom and eager.final_reserved_bytes == 26 * MiB
    captured = simulate(trace(True), capacity_bytes=40 * MiB)
    assert captured.oom and captured.oom_index == 3


def test_empty_cache_during_a_capture_leaves_the_default_pools():
    t = Trace()
    t.free(t.alloc(3 * MiB))
    t.pool_begin(1)
    t.empty_cache()
    r = simulate(t)
    assert r.final_reserved_bytes == 20 * MiB


def test_small_and_large_blocks_of_a_private_pool_are_apart_from_the_default_ones():
    t = Trace()
    t.alloc(512 * KiB)  # default small: 2 MiB segment (1.5 MiB free)
    t.pool_begin(7)
    t.alloc(512 * KiB)  # pool 7 small: its own 2 MiB segment
    t.alloc(512 * KiB)  # same segment of pool 7
    t.pool_end(7)
    t.alloc(512 * KiB)  # default small segment
    r = simulate(t)
    assert r.final_reserved_bytes == 4 * MiB
    assert r.num_device_alloc == 2


def test_expandable_segments_map_a_private_pool_its_own_segment():
    t = Trace()
    t.free(t.alloc(3 * MiB))  # default: a 20 MiB page mapped, then free
    t.pool_begin(1)
    t.alloc(3 * MiB)  # pool 1's own expandable segment: one 20 MiB page
    t.pool_end(1)
    r = simulate(t, "expandable_segments:True")
    assert r.final_reserved_bytes == 40 * MiB


@pytest.mark.parametrize(("version", "pool_bytes"), [("2.4.1", 26 * MiB), ("2.5.1", 40 * MiB)])
def test_expandable_segments_in_private_pools_from_2_5(version, pool_bytes):
    # 25 MiB: a plain segment rounds to 26 MiB; an expandable one maps two 20 MiB pages.
    # torch 2.4's alloc_block kept private pools off expandable segments.
    t = Trace()
    t.pool_begin(1)
    t.alloc(25 * MiB)
    t.pool_end(1)
    t.alloc(25 * MiB)  # the default pool: expandable in every version
    r = simulate(t, "expandable_segments:True", version)
    assert r.final_reserved_bytes == pool_bytes + 40 * MiB


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([("pool_release", 1)], "not in use"),
        ([("pool_end", 1)], "not being recorded"),
        ([("pool_begin", 1), ("pool_begin", 1)], "already recording"),
        ([("pool_begin", 1), ("pool_end", 1), ("pool_release", 1), ("pool_begin", 1)],
         "was released"),
    ],
)
def test_pool_misuse_the_cpp_asserts_on_is_a_trace_error(events, message):
    t = Trace()
    for name, pool in events:
        getattr(t, name)(pool)
    with pytest.raises(TraceError, match=message):
        simulate(t)


def test_pool_events_round_trip_and_old_traces_load():
    t = Trace()
    t.pool_begin(3)
    a = t.alloc(MiB)
    t.pool_end(3)
    t.free(a)
    t.pool_release(3)
    t.empty_cache(3)
    t.empty_cache()
    out = io.StringIO()
    t.dump(out)
    back = Trace.load(io.StringIO(out.getvalue()))
    assert back == t
    assert back.kinds[0] == EventKind.POOL_BEGIN and back.ids[0] == 3
    assert back.ids[-2:] == [3, -1]
    old = '{"format":"peakmem-trace","version":1,"meta":{},"tags":[]}\n[0,0,512,0,-1]\n[5,-1,0,0,-1]\n'
    assert len(Trace.load(io.StringIO(old))) == 2


def test_a_pool_id_below_one_is_refused():
    with pytest.raises(ValueError):
        Trace().pool_begin(0)
    text = '{"format":"peakmem-trace","version":1,"meta":{},"tags":[]}\n[8,0,0,0,-1]\n'
    with pytest.raises(TraceFormatError, match="pool id"):
        Trace.load(io.StringIO(text))


# -- invariants over random traces -----------------------------------------------------------
sizes = st.sampled_from([1, 512 * KiB, MiB, MiB + 1, 3 * MiB, 10 * MiB, 19 * MiB, 25 * MiB])
steps = st.lists(
    st.tuples(st.sampled_from(["alloc", "alloc", "free", "begin", "end", "empty"]), sizes,
              st.integers(0, 10**6)),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.sampled_from(["", "expandable_segments:True", "max_split_size_mb:20"]))
def test_blocks_never_cross_pools_and_everything_goes_back(ops, conf):
    from peakmem.allocator import AllocatorConfig

    alloc = CachingAllocator(AllocatorConfig.parse(conf), limits=DeviceLimits())
    live: list[tuple[object, int]] = []  # (block, pool id or 0)
    begun: list[int] = []
    next_pool = 1
    for name, size, pick in ops:
        if name == "alloc":
            try:
                block = alloc.malloc(size)
            except OutOfMemory:  # pragma: no cover - unbounded device
                continue
            owner = block.pool.owner
            # the block came from the pool being captured into, or the default pools
            assert (owner.ident if owner else 0) == (begun[0] if begun else 0)
            live.append((block, begun[0] if begun else 0))
        elif name == "free" and live:
            block, _pool = live.pop(pick % len(live))
            alloc.free(block)
        elif name == "begin":
            alloc.begin_allocate_to_pool(next_pool)
            begun.append(next_pool)
            next_pool += 1
        elif name == "end" and begun:
            pool = begun.pop(pick % len(begun))
            alloc.end_allocate_to_pool(pool)
            alloc.release_pool(pool)  # the graph is gone at once
        elif name == "empty":
            alloc.empty_cache()
    # every free block sits in a pool of its own owner
    for block in alloc.blocks_by_addr.values():
        pools = [alloc.small_blocks, alloc.large_blocks] + [
            p for pp in alloc.graph_pools.values() for p in (pp.small_blocks, pp.large_blocks)
        ]
        assert block.pool in pools
    for pool in begun:
        alloc.end_allocate_to_pool(pool)
        alloc.release_pool(pool)
    for block, _pool in live:
        alloc.free(block)
    alloc.empty_cache()
    assert alloc.total_allocated_memory == 0
    assert alloc.graph_pools == {} or all(
        pp.use_count == 0 for pp in alloc.graph_pools.values()
    )


def test_the_estimate_snapshot_names_a_private_pool_segment_by_its_pool():
    from peakmem.allocator.config import AllocatorConfig
    from peakmem.estimate.memory_snapshot import build_snapshot

    t = Trace()
    t.alloc(3 * MiB)
    t.pool_begin(2)
    t.alloc(3 * MiB)
    t.pool_end(2)
    snapshot = build_snapshot(t, AllocatorConfig(), None)
    pools = sorted(seg["segment_pool_id"] for seg in snapshot["segments"])
    assert pools == [(0, 0), (0, 2)]
    assert all(seg["total_size"] == 20 * MiB for seg in snapshot["segments"])
