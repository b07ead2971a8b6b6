"""ALLOC_OR_SMALLER: a request that may shrink under memory pressure (cuDNN falling back to a plan
with a smaller workspace), worked out by hand from CUDACachingAllocator.cpp's malloc path."""

from peakmem.allocator import simulate
from peakmem.trace import Trace
from peakmem.trace.events import EventKind

MiB = 1024 * 1024


def test_a_request_that_does_not_fit_is_halved_until_it_does():
    trace = Trace()
    trace.alloc(70 * MiB)  # > 10 MiB: its own 70 MiB segment
    ws = trace.alloc(40 * MiB, or_smaller=True)  # 70 + 40 > 100: OOM, even after freeing the cache
    trace.free(ws)
    result = simulate(trace, capacity_bytes=100 * MiB)
    assert trace.kinds[1] == EventKind.ALLOC_OR_SMALLER
    assert not result.oom
    assert result.num_smaller_fallbacks == 1
    assert result.peak_reserved_bytes == 90 * MiB  # 70 + a 20 MiB segment for the halved request
    assert result.final_reserved_bytes == 90 * MiB  # the 20 MiB segment stays cached


def test_a_plain_alloc_of_the_same_size_is_an_oom():
    trace = Trace()
    trace.alloc(70 * MiB)
    trace.alloc(40 * MiB)
    result = simulate(trace, capacity_bytes=100 * MiB)
    assert result.oom and result.oom_index == 1


def test_the_cache_is_freed_before_shrinking():
    trace = Trace()
    a = trace.alloc(30 * MiB)
    trace.alloc(60 * MiB)
    trace.free(a)  # 30 MiB cached: 90 MiB reserved
    ws = trace.alloc(40 * MiB, or_smaller=True)  # 40 MiB fits once the 30 MiB segment is released
    trace.free(ws)
    result = simulate(trace, capacity_bytes=100 * MiB)
    assert result.num_smaller_fallbacks == 0
    assert result.final_reserved_bytes == 100 * MiB  # 60 + 40
    assert result.num_alloc_retries == 1


def test_nothing_left_means_the_request_goes_without():
    trace = Trace()
    trace.alloc(99 * MiB)  # a 100 MiB segment (> 10 MiB: rounded to 2 MiB), unsplit (1 MiB left)
    ws = trace.alloc(4 * MiB, or_smaller=True)  # even 1 KiB needs a fresh 2 MiB small segment
    trace.free(ws)
    trace.alloc(512)  # the trace goes on; the free of the missing request was accepted
    result = simulate(trace, capacity_bytes=100 * MiB)
    assert result.num_smaller_fallbacks == 1
    assert result.oom and result.oom_index == 3
    assert result.peak_reserved_bytes == 100 * MiB


def test_round_trips_through_json_lines(tmp_path):
    trace = Trace()
    ws = trace.alloc(3 * MiB, or_smaller=True)
    trace.free(ws)
    path = tmp_path / "t.jsonl"
    trace.dump(path)
    assert Trace.load(path) == trace


def test_a_smaller_block_can_come_from_the_small_pool():
    trace = Trace()
    trace.alloc(98 * MiB)
    ws = trace.alloc(4 * MiB, or_smaller=True)  # 4 and 2 MiB need 20 MiB segments; 1 MiB a 2 MiB one
    trace.free(ws)
    result = simulate(trace, capacity_bytes=100 * MiB)
    assert not result.oom
    assert result.peak_reserved_bytes == 100 * MiB
    assert result.peak_allocated_bytes == 99 * MiB
