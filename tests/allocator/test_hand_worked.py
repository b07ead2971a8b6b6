"""Traces whose peaks are worked out by hand from c10/cuda/CUDACachingAllocator.cpp.

Each test names the rule it exercises; the comments carry the arithmetic.
"""

import pytest

from peakmem.allocator import AllocatorConfig, CachingAllocator, simulate
from peakmem.allocator.rules import AllocatorRules
from peakmem.trace import Trace

KiB = 1024
MiB = 1024 * 1024


def allocs(*sizes, stream=0):
    t = Trace()
    ids = [t.alloc(s, stream) for s in sizes]
    return t, ids


# -- round_size ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("request_bytes", "rounded"),
    [(0, 512), (1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024), (MiB - 1, MiB)],
)
def test_round_size_multiple_of_512(request_bytes, rounded):
    assert CachingAllocator().round_size(request_bytes) == rounded


def test_roundup_power2_divisions_rounds_to_quarter_of_interval():
    alloc = CachingAllocator(AllocatorConfig.parse("roundup_power2_divisions:4"))
    # 1.2 MiB lies in [1, 2) MiB: steps of 256 KiB -> 1.25 MiB
    assert alloc.round_size(int(1.2 * MiB)) == 1280 * KiB
    # a power of two is kept
    assert alloc.round_size(4 * MiB) == 4 * MiB
    # below 512 * divisions (2048 B) the plain 512 rounding applies
    assert alloc.round_size(1200) == 1536
    # 5 MiB + 1 in [4, 8) MiB: steps of 1 MiB -> 6 MiB
    assert alloc.round_size(5 * MiB + 1) == 6 * MiB
    # under 1 MiB the first interval's divisions apply: 300 KiB+1 in [256, 512) KiB -> 320 KiB
    assert alloc.round_size(300 * KiB + 1) == 320 * KiB


def test_roundup_divisions_of_one_leave_size_unrounded_in_2_4_only():
    conf = "roundup_power2_divisions:[1:1,>:1]"
    old = CachingAllocator(
        AllocatorConfig.parse(conf, "2.4.1"), AllocatorRules.for_version("2.4.1")
    )
    new = CachingAllocator(AllocatorConfig.parse(conf, "2.13"), AllocatorRules.for_version("2.13"))
    assert old.round_size(1_000_001) == 1_000_001
    assert new.round_size(1_000_001) == 1_000_448


# -- pools and segment sizes ---------------------------------------------------------------------
def test_exactly_1_mib_goes_to_small_pool_2_mib_segment():
    t, _ = allocs(MiB)
    r = simulate(t)
    assert r.peak_reserved_bytes == 2 * MiB
    assert r.peak_allocated_bytes == MiB  # split: remainder 1 MiB >= 512 B


def test_just_over_1_mib_goes_to_large_pool_20_mib_segment():
    t, _ = allocs(MiB + 1)  # rounds to 1 MiB + 512
    r = simulate(t)
    assert r.peak_reserved_bytes == 20 * MiB
    assert r.peak_allocated_bytes == MiB + 512  # remainder 19 MiB - 512 > 1 MiB: split


def test_two_small_requests_share_one_2_mib_segment_third_needs_another():
    t, _ = allocs(MiB, MiB, 512)
    r = simulate(t)
    assert r.peak_reserved_bytes == 4 * MiB
    assert r.peak_allocated_bytes == 2 * MiB + 512


def test_exactly_10_mib_gets_its_own_10_mib_segment():
    t, _ = allocs(10 * MiB)
    assert simulate(t).peak_reserved_bytes == 10 * MiB


def test_just_under_10_mib_gets_a_20_mib_segment():
    t, _ = allocs(10 * MiB - 512)  # < kMinLargeAlloc -> kLargeBuffer
    r = simulate(t)
    assert r.peak_reserved_bytes == 20 * MiB
    assert r.peak_allocated_bytes == 10 * MiB - 512


def test_large_segments_round_to_2_mib():
    t, _ = allocs(11 * MiB + 1)  # rounded 11 MiB + 512 -> segment 12 MiB; remainder < 1 MiB
    r = simulate(t)
    assert r.peak_reserved_bytes == 12 * MiB
    assert r.peak_allocated_bytes == 12 * MiB  # remainder 1 MiB - 512 not split: counts allocated


# -- should_split --------------------------------------------------------------------------------
def test_large_leftover_of_exactly_1_mib_is_not_split():
    t, _ = allocs(19 * MiB)  # 20 MiB segment, remainder exactly 1 MiB: split needs > 1 MiB
    r = simulate(t)
    assert r.peak_allocated_bytes == 20 * MiB
    assert r.peak_requested_bytes == 19 * MiB


def test_large_leftover_just_over_1_mib_is_split():
    t, _ = allocs(19 * MiB - 512)  # remainder 1 MiB + 512 > 1 MiB
    r = simulate(t)
    assert r.peak_allocated_bytes == 19 * MiB - 512


def test_unsplit_leftover_is_reused_only_as_a_whole():
    # 19 MiB takes the whole 20 MiB segment; a later 1.5 MiB request cannot use the 1 MiB tail
    t, _ = allocs(19 * MiB, 3 * MiB // 2)
    r = simulate(t)
    assert r.peak_reserved_bytes == 40 * MiB


# -- best fit, merge, streams --------------------------------------------------------------------
def test_best_fit_picks_the_smallest_block_that_fits():
    t = Trace()
    a = t.alloc(12 * MiB)  # segment 12 MiB
    b = t.alloc(14 * MiB)  # segment 14 MiB
    t.free(a)
    t.free(b)
    t.alloc(11 * MiB)  # fits both; best fit = 12 MiB block, remainder 1 MiB: not split
    t.alloc(13 * MiB)  # the 14 MiB block, remainder 1 MiB: not split
    r = simulate(t)
    assert r.peak_reserved_bytes == 26 * MiB
    assert r.final_allocated_bytes == 26 * MiB


def test_free_merges_neighbours_so_a_large_request_fits_again():
    t = Trace()
    a = t.alloc(4 * MiB)
    b = t.alloc(4 * MiB)  # same 20 MiB segment: [a 4][b 4][free 12]
    t.free(a)
    t.free(b)  # all three merge back into one 20 MiB block
    t.alloc(18 * MiB)
    assert simulate(t).peak_reserved_bytes == 20 * MiB


def test_no_merge_across_an_allocated_block():
    t = Trace()
    a = t.alloc(4 * MiB)
    t.alloc(4 * MiB)  # b stays allocated between a and the free tail
    t.free(a)
    t.alloc(14 * MiB)  # free pieces: 4 MiB and 12 MiB, neither fits -> a new 14 MiB segment
    assert simulate(t).peak_reserved_bytes == 34 * MiB


def test_cached_blocks_never_serve_another_stream():
    t = Trace()
    a = t.alloc(4 * MiB, stream=0)
    t.free(a)
    t.alloc(4 * MiB, stream=1)
    r = simulate(t)
    assert r.peak_reserved_bytes == 40 * MiB
    assert r.num_segments == 2


# -- max_split_size_mb and max_non_split_rounding ------------------------------------------------
def test_small_request_cannot_take_an_oversize_block():
    t = Trace()
    a = t.alloc(200 * MiB)
    t.free(a)
    t.alloc(50 * MiB)  # < max_split (100 MiB) but the cached block is >= max_split
    r = simulate(t, "max_split_size_mb:100")
    assert r.peak_reserved_bytes == 250 * MiB
    assert simulate(t).peak_reserved_bytes == 200 * MiB  # default: split the 200 MiB block


def test_large_request_takes_oversize_block_within_20_mib_unsplit():
    t = Trace()
    a = t.alloc(200 * MiB)
    t.free(a)
    t.alloc(190 * MiB)  # 200 < 190 + 20: reused, and never split (request >= max_split)
    r = simulate(t, "max_split_size_mb:100")
    assert r.peak_reserved_bytes == 200 * MiB
    assert r.peak_allocated_bytes == 200 * MiB


def test_large_request_rejects_block_20_mib_larger_or_more():
    t = Trace()
    a = t.alloc(200 * MiB)
    t.free(a)
    t.alloc(180 * MiB)  # 200 >= 180 + 20: not reused -> new 180 MiB segment
    assert simulate(t, "max_split_size_mb:100").peak_reserved_bytes == 380 * MiB


def test_max_non_split_rounding_mb_widens_reuse_from_2_6_on():
    t = Trace()
    a = t.alloc(200 * MiB)
    t.free(a)
    t.alloc(170 * MiB)  # 200 < 170 + 40 with max_non_split_rounding_mb:40
    conf = "max_split_size_mb:100,max_non_split_rounding_mb:40"
    assert simulate(t, conf, torch_version="2.6.0").peak_reserved_bytes == 200 * MiB
    assert simulate(t, conf, torch_version="2.13.0").peak_reserved_bytes == 200 * MiB
    # before 2.6 the option is unknown to the parser and the limit is fixed at 20 MiB
    assert (
        simulate(t, "max_split_size_mb:100", torch_version="2.5.1").peak_reserved_bytes == 370 * MiB
    )


def test_release_available_cached_blocks_frees_oversize_block_before_retry():
    t = Trace()
    a = t.alloc(200 * MiB)
    t.free(a)
    t.alloc(150 * MiB)  # cannot take 200 (>= 150 + 20); cudaMalloc 150 fails at 300 MiB capacity
    # release_available_cached_blocks frees the 200 MiB oversize block, then cudaMalloc succeeds
    r = simulate(t, "max_split_size_mb:100", capacity_bytes=300 * MiB)
    assert not r.oom
    assert r.peak_reserved_bytes == 200 * MiB
    assert r.final_reserved_bytes == 150 * MiB
    assert r.num_alloc_retries == 0  # not the full release-and-retry path


# -- capacity, OOM, release cached blocks --------------------------------------------------------
def test_release_cached_blocks_and_retry_avoids_oom():
    t = Trace()
    a = t.alloc(12 * MiB)
    t.free(a)
    t.alloc(30 * MiB)  # 12 + 30 > 40: free the cached 12 MiB segment, retry
    r = simulate(t, capacity_bytes=40 * MiB)
    assert not r.oom
    assert r.num_alloc_retries == 1
    assert r.peak_reserved_bytes == 30 * MiB
    assert r.final_reserved_bytes == 30 * MiB


def test_oom_reported_at_the_failing_event():
    t = Trace()
    t.alloc(30 * MiB)
    t.alloc(12 * MiB)  # 30 + 12 > 40 and nothing cached to release
    r = simulate(t, capacity_bytes=40 * MiB)
    assert r.oom
    assert r.oom_index == 1
    assert r.peak_reserved_bytes == 30 * MiB


def test_split_segment_is_not_released_by_retry():
    t = Trace()
    t.alloc(4 * MiB)  # 20 MiB segment, partly in use: cannot be released
    t.alloc(22 * MiB)  # 20 + 22 > 40 -> OOM even after the retry
    r = simulate(t, capacity_bytes=40 * MiB)
    assert r.oom and r.num_alloc_retries == 1


# -- garbage collection with a memory fraction --------------------------------------------------
def test_garbage_collection_frees_old_cached_blocks_above_threshold():
    t = Trace()
    a = t.alloc(12 * MiB)
    b = t.alloc(14 * MiB)
    t.free(a)
    t.free(b)  # reserved 26 MiB > gc threshold 0.5 * 50 MiB = 25 MiB
    t.alloc(16 * MiB)  # no fit; GC: both blocks have age 1 >= mean age 1: both released
    r = simulate(
        t,
        "garbage_collection_threshold:0.5",
        memory_fraction=0.5,
        total_bytes=100 * MiB,
    )
    assert r.peak_reserved_bytes == 26 * MiB
    assert r.final_reserved_bytes == 16 * MiB
    # without a memory fraction the threshold does nothing
    assert simulate(t, "garbage_collection_threshold:0.5").final_reserved_bytes == 42 * MiB


def test_memory_fraction_caps_reserved_memory():
    t = Trace()
    t.alloc(30 * MiB)
    t.alloc(30 * MiB)  # 60 MiB > 0.5 * 100 MiB
    r = simulate(t, memory_fraction=0.5, total_bytes=100 * MiB)
    assert r.oom and r.oom_index == 1


# -- expandable segments -----------------------------------------------------------------------
def test_expandable_segment_maps_20_mib_pages_and_grows_in_place():
    t = Trace()
    t.alloc(4 * MiB)  # maps one 20 MiB page; split (expandable: remainder >= 512 B)
    t.alloc(18 * MiB)  # free tail 16 MiB + next page mapped: one 36 MiB free block, split
    r = simulate(t, "expandable_segments:True")
    assert r.peak_reserved_bytes == 40 * MiB
    assert r.peak_allocated_bytes == 22 * MiB
    assert r.num_segments == 1
    # without expandable segments: a 20 MiB segment and an 18 MiB one
    assert simulate(t).peak_reserved_bytes == 38 * MiB


def test_expandable_small_pool_maps_2_mib_pages():
    t, _ = allocs(1000, MiB)
    r = simulate(t, "expandable_segments:True")
    assert r.peak_reserved_bytes == 2 * MiB  # 1024 B + 1 MiB fit one 2 MiB page
    t, _ = allocs(1000, MiB, MiB)
    r = simulate(t, "expandable_segments:True")
    assert r.peak_reserved_bytes == 4 * MiB  # the second 1 MiB spills into a second page
    assert r.peak_allocated_bytes == 2 * MiB + 1024
    assert r.num_segments == 1


def test_expandable_unsplit_remainder_rule_is_512_bytes():
    t, _ = allocs(19 * MiB)  # remainder 1 MiB: split under expandable segments
    r = simulate(t, "expandable_segments:True")
    assert r.peak_allocated_bytes == 19 * MiB


def test_expandable_empty_cache_unmaps_whole_free_pages_only():
    t = Trace()
    t.alloc(4 * MiB)
    b = t.alloc(30 * MiB)  # pages 0 and 1 mapped (40 MiB)
    t.free(b)  # free block [4, 40) MiB
    t.empty_cache()  # only page 1 ([20, 40) MiB) lies wholly inside the free block
    r = simulate(t, "expandable_segments:True")
    assert r.peak_reserved_bytes == 40 * MiB
    assert r.final_reserved_bytes == 20 * MiB


def test_expandable_segments_are_per_stream():
    t = Trace()
    t.alloc(4 * MiB, stream=0)
    t.alloc(4 * MiB, stream=1)
    r = simulate(t, "expandable_segments:True")
    assert r.peak_reserved_bytes == 40 * MiB
    assert r.num_segments == 2


def test_expandable_oom_when_a_page_does_not_fit():
    t = Trace()
    t.alloc(4 * MiB)
    t.alloc(30 * MiB)  # needs a second 20 MiB page: 40 MiB > 30 MiB capacity
    r = simulate(t, "expandable_segments:True", capacity_bytes=30 * MiB)
    assert r.oom and r.oom_index == 1


# -- record_stream and deferred frees ----------------------------------------------------------
def test_block_used_on_another_stream_is_held_until_its_uses_complete():
    t = Trace()
    a = t.alloc(4 * MiB)
    t.record_stream(a, 1)
    t.free(a)  # deferred: the segment still holds a
    t.alloc(18 * MiB)  # 16 MiB free tail cannot fit: new segment
    r = simulate(t)
    assert r.peak_reserved_bytes == 38 * MiB
    # freed at once without the other-stream use: the merged 20 MiB block is reused
    t2 = Trace()
    a2 = t2.alloc(4 * MiB)
    t2.free(a2)
    t2.alloc(18 * MiB)
    assert simulate(t2).peak_reserved_bytes == 20 * MiB


def test_completed_deferred_free_is_reclaimed_at_the_next_malloc():
    t = Trace()
    a = t.alloc(4 * MiB)
    t.record_stream(a, 1)
    t.free(a)
    t.free_completed(a)
    t.alloc(18 * MiB)  # process_events frees a first: the merged 20 MiB block fits
    assert simulate(t).peak_reserved_bytes == 20 * MiB


def test_synchronize_completes_deferred_frees():
    t = Trace()
    a = t.alloc(4 * MiB)
    t.record_stream(a, 1)
    t.free(a)
    t.synchronize()
    t.alloc(18 * MiB)
    assert simulate(t).peak_reserved_bytes == 20 * MiB


def test_deferred_free_drops_allocated_at_request_time():
    t = Trace()
    a = t.alloc(4 * MiB)
    t.record_stream(a, 1)
    t.free(a)
    t.alloc(18 * MiB)
    r = simulate(t)
    assert r.peak_allocated_bytes == 18 * MiB  # a no longer counts as allocated once freed


def test_record_stream_on_own_stream_is_ignored():
    t = Trace()
    a = t.alloc(4 * MiB)
    t.record_stream(a, 0)
    t.free(a)
    t.alloc(18 * MiB)
    assert simulate(t).peak_reserved_bytes == 20 * MiB


# -- empty_cache -------------------------------------------------------------------------------
def test_empty_cache_releases_whole_free_segments_only():
    t = Trace()
    a = t.alloc(4 * MiB)
    b = t.alloc(18 * MiB)  # the 16 MiB tail of a's segment is too small: own 18 MiB segment
    t.alloc(4 * MiB)  # c shares a's segment
    t.free(a)
    t.free(b)
    t.empty_cache()  # b's segment is whole and free: released; a's segment still holds c
    r = simulate(t)
    assert r.peak_reserved_bytes == 38 * MiB
    assert r.final_reserved_bytes == 20 * MiB


def test_reserved_memory_never_shrinks_without_release():
    t = Trace()
    ids = [t.alloc(s * MiB) for s in (3, 25, 7, 64)]
    for i in ids:
        t.free(i)
    r = simulate(t)
    assert r.final_reserved_bytes == r.peak_reserved_bytes


# -- addresses break ties between equal-size blocks ---------------------------------------------
def tie_trace() -> Trace:
    t = Trace()
    x = t.alloc(4 * MiB)  # S1: [x 4][free 16]
    q1, q2 = t.alloc(8 * MiB), t.alloc(8 * MiB)  # S1: [x 4][q1 8][q2 8]
    p1, p2 = t.alloc(8 * MiB), t.alloc(8 * MiB)  # S2: [p1 8][p2 8][free 4]
    t.alloc(4 * MiB)  # y fills S2: [p1][p2][y 4]
    for i in (p1, p2, q1, q2):
        t.free(i)  # S1: [x 4][free 16]   S2: [free 16][y 4]
    t.alloc(16 * MiB)  # two free 16 MiB blocks: the lower address wins
    t.free(x)
    t.alloc(20 * MiB)  # fits S1 only if the 16 MiB went to S2
    return t


def test_equal_size_blocks_tie_break_on_address():
    # default addresses grow: S1 < S2, so S1's block is taken and 20 MiB needs a third segment
    assert simulate(tie_trace()).peak_reserved_bytes == 60 * MiB
    # a real run whose driver placed S2 below S1 (hints from a snapshot) reuses S1 instead
    hints = [(20 * MiB, 0x2000000000), (20 * MiB, 0x1000000000)]
    r = simulate(tie_trace(), segment_address_hints=hints)
    assert r.peak_reserved_bytes == 40 * MiB


def test_expandable_segment_fully_unmapped_is_released_and_a_new_one_made_later():
    t = Trace()
    a = t.alloc(4 * MiB)
    t.free(a)
    t.empty_cache()  # the whole segment unmapped: released
    t.alloc(4 * MiB)
    alloc_conf = "expandable_segments:True"
    r = simulate(t, alloc_conf)
    assert r.final_reserved_bytes == 20 * MiB
    assert r.num_device_free == 1  # one unmap
