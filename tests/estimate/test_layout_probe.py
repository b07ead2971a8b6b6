"""estimate/layout_probe.py: a small extra block can make the caching allocator split a cached
block of the largest size and open one more segment of it (worked out by hand from
CUDACachingAllocator.cpp: best fit over the large pool, requests below kMinLargeAlloc (10 MiB)
open a kLargeBuffer (20 MiB) segment, a block is split when more than kSmallSize (1 MiB)
remains)."""

from __future__ import annotations

import pytest

from peakmem.allocator.simulate import simulate
from peakmem.estimate.layout_probe import LayoutProbe, probe_layout, with_persistent_block
from peakmem.trace.events import Trace

MiB = 1 << 20
LARGEST = 100 * MiB  # an embedding gradient: a segment of its own (>= 10 MiB, 2 MiB multiple)


def embedding_step_trace(with_late_request: bool = True) -> Trace:
    """An 8 MiB activation opens a 20 MiB segment (12 MiB left free); the parameter, its
    gradient and Adam's sqrt temporary take three LARGEST segments, the last two freed again
    (cached, whole); then a 9 MiB request and the next step's gradient and temporary."""
    trace = Trace()
    trace.alloc(8 * MiB, op="activation")
    trace.alloc(LARGEST, category="parameter")
    grad = trace.alloc(LARGEST, category="gradient")
    sqrt = trace.alloc(LARGEST, op="_foreach_sqrt")
    trace.free(sqrt)
    trace.free(grad)
    if with_late_request:
        trace.alloc(9 * MiB, op="activation")
    trace.alloc(LARGEST, category="gradient")
    trace.alloc(LARGEST, op="_foreach_sqrt")
    return trace


def test_the_9_mib_request_fits_the_20_mib_segment_and_the_large_blocks_stay_whole():
    result = simulate(embedding_step_trace(), torch_version="2.4.1")
    assert result.peak_reserved_bytes == 20 * MiB + 3 * LARGEST


def test_a_4_mib_block_first_pushes_it_into_a_large_block_and_one_more_segment_opens():
    # the probe takes the 20 MiB segment's first 4 MiB, the activation the next 8: 8 MiB stay
    # free, too few for 9 MiB, so best fit splits one cached LARGEST block; the next step's
    # sqrt temporary no longer fits it and opens a fourth LARGEST segment
    probed = with_persistent_block(embedding_step_trace(), 4 * MiB)
    assert simulate(probed, torch_version="2.4.1").peak_reserved_bytes == 20 * MiB + 4 * LARGEST
    probe = probe_layout(embedding_step_trace(), torch_version="2.4.1", sizes=[4 * MiB])
    assert probe.base_reserved_bytes == 20 * MiB + 3 * LARGEST
    assert probe.probe_segment_bytes == {4 * MiB: 20 * MiB}
    assert probe.excess_bytes(4 * MiB) == LARGEST - 20 * MiB
    assert probe.max_excess_bytes == LARGEST - 20 * MiB
    assert probe.flips


def test_without_the_late_request_no_probe_moves_the_peak_beyond_its_own_segment():
    probe = probe_layout(embedding_step_trace(with_late_request=False), torch_version="2.4.1")
    assert probe.max_excess_bytes == 0 and probe.min_excess_bytes == 0
    assert not probe.flips
    # each probe block shares the activation's 20 MiB segment: the peak does not move at all
    assert set(probe.probed_reserved_bytes.values()) == {probe.base_reserved_bytes}


def test_the_probed_trace_keeps_every_event_and_tag_after_the_block():
    trace = embedding_step_trace()
    probed = with_persistent_block(trace, 2 * MiB)
    assert len(probed) == len(trace) + 1
    assert probed.sizes[0] == 2 * MiB and probed.tag_of(0).op == "layout_probe"
    assert probed.ids[0] not in trace.ids
    assert [probed.tag_of(i + 1) for i in range(len(trace))] == [
        trace.tag_of(i) for i in range(len(trace))
    ]
    assert probed.sizes[1:] == trace.sizes and probed.kinds[1:] == trace.kinds


def test_excess_figures_and_a_probe_that_lowers_the_peak():
    probe = LayoutProbe(100 * MiB, {MiB: 80 * MiB, 2 * MiB: 150 * MiB},
                        {MiB: 20 * MiB, 2 * MiB: 20 * MiB})
    assert probe.excess_bytes(2 * MiB) == 30 * MiB
    assert probe.max_excess_bytes == 30 * MiB
    assert probe.min_excess_bytes == -20 * MiB
    assert probe.flips


def test_probe_sizes_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        probe_layout(embedding_step_trace(), sizes=[0])
