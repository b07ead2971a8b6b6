"""estimate/layout_probe.py: a small extra block can make the caching allocator split a cached
block of the largest size and open one more segment of it (worked out by hand from
CUDACachingAllocator.cpp: best fit over the large pool, requests below kMinLargeAlloc (10 MiB)
open a kLargeBuffer (20 MiB) segment, a block is split when more than kSmallSize (1 MiB)
remains)."""

from __future__ import annotations

import pytest

from peakmem.allocator.simulate import simulate
from peakmem.estimate.layout_probe import (
    LayoutProbe,
    probe_layout,
    with_persistent_block,
    with_workspace_size,
)
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
    assert probe.moves == {f"block {4 * MiB}": LARGEST}  # the trace has no cuBLAS workspace
    assert probe.allowances == {f"block {4 * MiB}": 20 * MiB}
    assert probe.excess_bytes(f"block {4 * MiB}") == LARGEST - 20 * MiB
    assert probe.max_excess_bytes == LARGEST - 20 * MiB and probe.min_excess_bytes == 0
    assert probe.flips


def test_without_the_late_request_no_probe_moves_the_peak_beyond_its_own_segment():
    probe = probe_layout(embedding_step_trace(with_late_request=False), torch_version="2.4.1")
    assert probe.max_excess_bytes == 0 and probe.min_excess_bytes == 0
    assert not probe.flips
    # each probe block shares the activation's 20 MiB segment: the peak does not move at all
    assert set(probe.moves.values()) == {0}


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
    probe = LayoutProbe(500 * MiB, {"a": -100 * MiB, "b": 50 * MiB, "c": 10 * MiB},
                        {"a": 20 * MiB, "b": 20 * MiB, "c": 20 * MiB})
    assert probe.excess_bytes("a") == -80 * MiB
    assert probe.excess_bytes("b") == 30 * MiB
    assert probe.excess_bytes("c") == 0
    assert probe.max_excess_bytes == 30 * MiB
    assert probe.min_excess_bytes == -80 * MiB
    assert probe.flips


def workspace_step_trace() -> Trace:
    """As embedding_step_trace, with an 8.125 MiB cuBLAS workspace (torch 2.4's default
    `:4096:2:16:8`) taken at the first matmul, after the 8 MiB activation: together 16.125 MiB
    of the first 20 MiB segment, so the 9 MiB request has to split a cached LARGEST block."""
    trace = Trace()
    trace.alloc(8 * MiB, op="activation")
    trace.alloc(8519680, category="workspace", op="cublas_workspace[main]")
    trace.alloc(LARGEST, category="parameter")
    grad = trace.alloc(LARGEST, category="gradient")
    sqrt = trace.alloc(LARGEST, op="_foreach_sqrt")
    trace.free(sqrt)
    trace.free(grad)
    trace.alloc(9 * MiB, op="activation")
    trace.alloc(LARGEST, category="gradient")
    trace.alloc(LARGEST, op="_foreach_sqrt")
    return trace


def test_a_smaller_cublas_workspace_leaves_room_and_the_peak_drops_by_a_whole_segment():
    trace = workspace_step_trace()
    assert simulate(trace, torch_version="2.4.1").peak_reserved_bytes == 20 * MiB + 4 * LARGEST
    # `:16:8`: 128 KiB goes to the small pool (a 2 MiB segment of its own); the 20 MiB segment
    # keeps 12 MiB free for the 9 MiB request and the LARGEST blocks stay whole
    small = with_workspace_size(trace, 128 * 1024)
    assert small.sizes[1] == 128 * 1024 and small.sizes[2:] == trace.sizes[2:]
    assert simulate(small, torch_version="2.4.1").peak_reserved_bytes == 22 * MiB + 3 * LARGEST
    probe = probe_layout(trace, torch_version="2.4.1", sizes=[], workspace_sizes=[128 * 1024])
    name = f"cublas workspace {128 * 1024}"
    assert probe.moves == {name: 2 * MiB - LARGEST}
    assert probe.allowances == {name: (8519680 - 128 * 1024) + 20 * MiB}
    assert probe.min_excess_bytes == 2 * MiB - LARGEST + probe.allowances[name]
    assert probe.max_excess_bytes == 0 and probe.flips


def test_probe_sizes_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        probe_layout(embedding_step_trace(), sizes=[0])


def embedding_job(steps: int = 4) -> None:
    """An embedding classifier trained with Adam on "cuda" (fake device tensors in the capture):
    the embedding's gradient and Adam's sqrt temporary of it are freed and taken again every
    step."""
    import torch

    model = torch.nn.Sequential(torch.nn.Embedding(200_000, 64), torch.nn.Flatten(),
                                torch.nn.Linear(64 * 16, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(steps):
        optimizer.zero_grad()
        tokens = torch.randint(0, 200_000, (32, 16), device="cuda")
        model(tokens).sum().backward()
        optimizer.step()


def test_a_captured_job_replays_to_its_estimate_and_every_probe_is_reported():
    from peakmem.estimate import estimate

    result = estimate(embedding_job, gpu="a100-40gb", torch_version="2.4.1")
    trace = result.capture.trace
    probe = probe_layout(trace, result.alloc_conf, result.torch_version)
    # the unperturbed replay is the estimate's own simulation
    assert probe.base_reserved_bytes == result.peak_reserved_bytes
    names = {f"block {size}" for size in (2 * MiB, 4 * MiB, 6 * MiB, 8 * MiB)}
    names |= {f"cublas workspace {size}" for size in (128 * 1024, 4 * MiB, 16 * MiB)}
    assert set(probe.moves) == names  # the Linear took a cuBLAS workspace: probed too
    embedding_grad = 200_000 * 64 * 4
    # no perturbation of a few MiB can move the peak by more than one more embedding-sized
    # segment per cached block of that size (the gradient and the sqrt temporary)
    assert all(abs(move) <= 2 * embedding_grad + 40 * MiB for move in probe.moves.values())
