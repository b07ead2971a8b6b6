"""The allocator replays random traces exactly as it did before its hot path was made faster
(issue 14): every result field, the reserved/allocated timeline after each event, each block
malloc hands out (address, size) and the free lists left at the end, under several configs,
limits and torch versions. The digests below were recorded on main at e0ee2a6 (before the
speed-up); a change to them is a change of behaviour, not of speed."""

from __future__ import annotations

import hashlib
import random

import pytest

from peakmem.allocator import AllocatorConfig, CachingAllocator, DeviceLimits, OutOfMemory, simulate
from peakmem.allocator.caching import key_fields
from peakmem.trace import Trace

MiB = 1024 * 1024
GiB = 1024 * MiB

BOUNDARY_SIZES = (0, 1, 511, 512, 513, MiB - 1, MiB, MiB + 1, 2 * MiB, 10 * MiB - 512, 10 * MiB,
                  19 * MiB, 20 * MiB, 21 * MiB, 64 * MiB, 100 * MiB, 130 * MiB)


def _size(rng: random.Random) -> int:
    pick = rng.random()
    if pick < 0.25:
        return rng.choice(BOUNDARY_SIZES)
    if pick < 0.6:
        return rng.randint(1, 2 * MiB)
    if pick < 0.9:
        return rng.randint(MiB, 64 * MiB)
    return rng.randint(64 * MiB, 300 * MiB)


def random_trace(seed: int, n_events: int = 3000, pools: bool = True) -> Trace:
    """Allocations on 3 streams, frees in random order, cross-stream uses, their completions,
    synchronizes, empty_cache, ALLOC_OR_SMALLER requests and (`pools`) private pools."""
    rng = random.Random(seed)
    trace = Trace()
    live: list[int] = []
    recorded: list[int] = []  # freed after a record_stream: waiting on their events
    pools_open: list[int] = []
    pools_ended: list[int] = []
    next_pool = 1
    while len(trace) < n_events:
        pick = rng.random()
        if pick < (0.42 if len(live) < 25 else 0.3) or not live:
            stream = 0 if rng.random() < 0.8 else rng.randint(1, 2)
            live.append(trace.alloc(_size(rng), stream, or_smaller=rng.random() < 0.03))
        elif pick < 0.80:
            ident = live.pop(rng.randrange(len(live)) if rng.random() < 0.5 else -1)
            trace.free(ident)
            if ident in recorded:
                recorded.remove(ident)
                if rng.random() < 0.7:
                    trace.free_completed(ident)
        elif pick < 0.86:
            ident = rng.choice(live)
            trace.record_stream(ident, rng.randint(0, 2))
            recorded.append(ident)
        elif pick < 0.88:
            trace.synchronize()
        elif pick < 0.895:
            trace.empty_cache()
        elif pools and pick < 0.93:
            if pools_open:
                pool = pools_open.pop()
                trace.pool_end(pool)
                pools_ended.append(pool)
            elif pools_ended and rng.random() < 0.5:
                trace.pool_release(pools_ended.pop(0))
            else:
                trace.pool_begin(next_pool)
                pools_open.append(next_pool)
                next_pool += 1
        else:
            trace.mark("step")
    for pool in pools_open:
        trace.pool_end(pool)
    return trace


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def replay_digest(seed: int, conf: str, version: str | None, limits: dict, pools: bool) -> str:
    trace = random_trace(seed, pools=pools)
    result = simulate(trace, conf, version, timeline=True, **limits)
    fields = result.to_dict()
    fields.update(
        num_device_alloc=result.num_device_alloc,
        num_device_free=result.num_device_free,
        num_smaller_fallbacks=result.num_smaller_fallbacks,
        allocated_at_peak_reserved=result.allocated_at_peak_reserved,
    )
    return _digest(sorted(fields.items()), result.timeline.reserved, result.timeline.allocated)


def blocks_digest(seed: int, conf: str, limits: DeviceLimits) -> str:
    """Drive the allocator directly: which block each malloc hands out, and the pools at the
    end (addresses and tie-breaks between equal sizes included)."""
    rng = random.Random(seed)
    alloc = CachingAllocator(AllocatorConfig.parse(conf), limits=limits)
    live: list = []
    handed: list[tuple[int, int] | None] = []
    for _ in range(2500):
        pick = rng.random()
        if pick < (0.48 if len(live) < 25 else 0.35) or not live:
            try:
                block = alloc.malloc(_size(rng) or 1, 0 if rng.random() < 0.8 else 1)
                live.append(block)
                handed.append((block.addr, block.size))
            except OutOfMemory:
                handed.append(None)
        elif pick < 0.9:
            alloc.free(live.pop(rng.randrange(len(live))))
        elif pick < 0.95:
            alloc.record_stream(rng.choice(live), 1)
        elif pick < 0.98:
            alloc.synchronize_and_free_events()
        else:
            alloc.empty_cache()
    pools = [[key_fields(key) for key in pool.blocks] for pool in (alloc.small_blocks, alloc.large_blocks)]
    unmapped = [list(pool.unmapped) for pool in (alloc.small_blocks, alloc.large_blocks)]
    return _digest(handed, pools, unmapped, sorted(alloc.segments.items()),
                   alloc.total_allocated_memory, alloc.num_alloc_retries, alloc.num_device_free)


UNBOUNDED: dict = {}
BOUNDED = {"capacity_bytes": 6 * GiB}
TIGHT = {"capacity_bytes": 3 * GiB}  # out-of-memory retries, cache releases, an OOM
FRACTION = {"capacity_bytes": 8 * GiB, "memory_fraction": 0.6, "total_bytes": 8 * GiB}

REPLAYS = [
    # (seed, conf, torch version, limits, private pools) -> digest
    (1, "", None, UNBOUNDED, True, "07fe030f321614eb"),
    (2, "", "2.4.1", TIGHT, True, "94a1845f759afd4e"),
    (3, "expandable_segments:True", None, TIGHT, True, "e27c44c9d7dd49a9"),
    (4, "expandable_segments:True", "2.4.1", UNBOUNDED, True, "6e938aefc06b602a"),
    (5, "max_split_size_mb:40", None, TIGHT, True, "826ce02e0be48cce"),
    (6, "max_split_size_mb:20,expandable_segments:True", None, BOUNDED, False, "a008ef4694a840ff"),
    (7, "roundup_power2_divisions:4", None, UNBOUNDED, True, "dc8cc83bb8ac14ec"),
    (8, "roundup_power2_divisions:[256:1,512:2,>:8]", "2.6", BOUNDED, True, "3d48290a481aea22"),
    (9, "garbage_collection_threshold:0.6,max_split_size_mb:64", None, FRACTION, True,
     "c8408843b4ae6f22"),
    (10, "garbage_collection_threshold:0.5", "2.4.1", FRACTION, False, "cd34aca91cbb7800"),
    (11, "max_split_size_mb:128", "1.10", BOUNDED, False, "d4085dbbca7fbbf3"),
    (12, "large_segment_size_mb:40,max_non_split_rounding_mb:64", None, BOUNDED, True,
     "0cb64ca6f18a01a6"),
]


@pytest.mark.parametrize(("seed", "conf", "version", "limits", "pools", "digest"), REPLAYS)
def test_replay_of_a_random_trace_is_unchanged(seed, conf, version, limits, pools, digest):
    assert replay_digest(seed, conf, version, limits, pools) == digest


BLOCKS = [
    (21, "", DeviceLimits(), "6338966a4d189101"),
    (22, "", DeviceLimits(capacity_bytes=2 * GiB), "a0ef4ad1fec9f703"),
    (23, "expandable_segments:True", DeviceLimits(capacity_bytes=2 * GiB), "c26cb1bae7b0c0d2"),
    (24, "max_split_size_mb:40", DeviceLimits(capacity_bytes=2 * GiB), "c1fee7eb1da58bab"),
    (25, "max_split_size_mb:20,expandable_segments:True", DeviceLimits(), "1fd37243589eeacf"),
    (26, "garbage_collection_threshold:0.7,max_split_size_mb:64",
     DeviceLimits(3 * GiB, 0.7, 3 * GiB), "f523e87d54b94732"),
]


@pytest.mark.parametrize(("seed", "conf", "limits", "digest"), BLOCKS)
def test_blocks_handed_out_and_pools_left_are_unchanged(seed, conf, limits, digest):
    assert blocks_digest(seed, conf, limits) == digest
