"""The attention jobs' reserve of largest-gradient segments (estimate/margin_reserve.py)."""

from __future__ import annotations

import pytest
import torch

from peakmem.allocator.caching import CachingAllocator
from peakmem.allocator.config import AllocatorConfig
from peakmem.capture import capture_callable
from peakmem.estimate.api import estimate_capture
from peakmem.estimate.margin_reserve import (
    ATTENTION_RESERVE_SEGMENTS,
    largest_gradient_bytes,
    margin_reserve_bytes,
    segment_bytes,
)
from peakmem.trace.events import Trace

MiB = 2**20
EMBEDDING_GRAD = 318419 * 128 * 4  # GPUMemNet row 00084's embedding gradient, 155.5 MiB


def test_attention_reserves_two_segments():
    assert ATTENTION_RESERVE_SEGMENTS == 2


@pytest.mark.parametrize(
    "size", [100, 512 * 1024, 1 * MiB + 1, 5 * MiB, 10 * MiB, EMBEDDING_GRAD, 3 * 2**30 + 7]
)
@pytest.mark.parametrize("conf", ["", "roundup_power2_divisions:4", "expandable_segments:False"])
def test_segment_is_what_the_allocator_reserves_for_the_request(size, conf):
    allocator = CachingAllocator(AllocatorConfig.parse(conf, "2.4.1"))
    allocator.malloc(size)
    assert segment_bytes(size, conf, "2.4.1") == allocator.total_allocated_memory


def test_segment_rounding_by_hand():
    assert segment_bytes(100) == 2 * MiB  # small pool: one 2 MiB block
    assert segment_bytes(5 * MiB) == 20 * MiB  # 1-10 MiB: kLargeBuffer
    assert segment_bytes(EMBEDDING_GRAD) == 156 * MiB  # >= 10 MiB: rounded up to 2 MiB
    assert segment_bytes(0) == 0


def gradient_trace(sizes: list[int]) -> Trace:
    trace = Trace()
    trace.alloc(EMBEDDING_GRAD * 3, category="parameter")  # larger, but not a gradient
    for size in sizes:
        trace.alloc(size, category="gradient")
    trace.alloc(EMBEDDING_GRAD * 2, category="activation")
    return trace


def test_largest_gradient_only_counts_gradients():
    assert largest_gradient_bytes(gradient_trace([4 * MiB, EMBEDDING_GRAD, 1024])) == EMBEDDING_GRAD
    assert largest_gradient_bytes(gradient_trace([])) == 0


def test_reserve_is_two_largest_gradient_segments_for_attention_jobs():
    trace = gradient_trace([4 * MiB, EMBEDDING_GRAD, 1024])
    assert margin_reserve_bytes("attention", trace, "", "2.4.1") == 2 * 156 * MiB


@pytest.mark.parametrize("kind", ["default", "cudnn_convolution"])
def test_other_kinds_reserve_nothing(kind):
    assert margin_reserve_bytes(kind, gradient_trace([EMBEDDING_GRAD]), "", "2.4.1") == 0
    assert margin_reserve_bytes("attention", None) == 0


def encoder_job():
    model = torch.nn.Sequential(
        torch.nn.Embedding(5000, 32), torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    ).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randint(0, 5000, (2, 8), device="cuda")).sum().backward()
        optimizer.step()


def mlp_job():
    model = torch.nn.Linear(64, 64).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.zero_grad()
    model(torch.randn(4, 64, device="cuda")).sum().backward()
    optimizer.step()


def test_an_encoder_states_the_reserve_in_json(a100, stack24):
    estimate = estimate_capture(capture_callable(encoder_job, gpu=a100, stack=stack24), a100,
                                stack24, torch_version="2.4.1")
    data = estimate.to_json()
    assert data["margin_kind"] == "attention"
    # the embedding's gradient (5000 x 32 fp32, 625 KiB) is the largest: small-pool segments
    assert data["margin_reserve_bytes"] == 2 * 2 * MiB
    assert data["peak_bytes_with_margin"] == int(
        estimate.peak_bytes * (1 + estimate.safety_margin)) + 4 * MiB

    from rich.console import Console

    from peakmem.estimate.report import render

    console = Console(record=True, width=200)
    render(estimate, console)
    assert "+ 4.0 MiB reserve" in console.export_text()


def test_a_non_attention_job_is_unchanged(a100, stack24):
    estimate = estimate_capture(capture_callable(mlp_job, gpu=a100, stack=stack24), a100,
                                stack24, torch_version="2.4.1")
    data = estimate.to_json()
    assert data["margin_kind"] == "default"
    assert data["margin_reserve_bytes"] == 0
    assert data["peak_bytes_with_margin"] == int(estimate.peak_bytes * (1 + estimate.safety_margin))


def test_the_bench_states_the_reserve_as_part_of_its_fraction():
    from types import SimpleNamespace

    from peakmem.baselines.peakmem_estimator import stated_fraction

    estimate = SimpleNamespace(peak_bytes=1000 * MiB, safety_margin=0.03,
                               peak_bytes_with_margin=int(1000 * MiB * 1.03) + 312 * MiB)
    fraction = stated_fraction(estimate, 1000 * MiB)
    assert 1000 * MiB * (1 + fraction) == pytest.approx(estimate.peak_bytes_with_margin)
    # compared after the context (xMem): the same bytes are added on top of the smaller figure
    fraction = stated_fraction(estimate, 600 * MiB)
    assert 600 * MiB * (1 + fraction) == pytest.approx(600 * MiB + 30 * MiB + 312 * MiB, abs=1)


def layout_edge_trace(with_late_request: bool = True) -> Trace:
    """tests/estimate/test_layout_probe.py's embedding step: a 4 MiB block first makes the next
    step's sqrt temporary open one more 100 MiB segment (with the 9 MiB request); without that
    request the layout does not move."""
    from tests.estimate.test_layout_probe import embedding_step_trace

    return embedding_step_trace(with_late_request)


def test_an_attention_job_at_a_layout_edge_reserves_the_probes_move():
    from peakmem.allocator.simulate import simulate
    from peakmem.estimate.layout_probe import probe_layout, with_persistent_block
    from peakmem.estimate.margin_reserve import LAYOUT_RESERVE_QUANTUM, layout_reserve_bytes

    trace = layout_edge_trace()
    probe = probe_layout(trace, "", "2.4.1")
    assert probe.max_excess_bytes > 0  # a 4 MiB block first opens one more 100 MiB segment
    reserve = layout_reserve_bytes(trace, "", "2.4.1")
    assert reserve % LAYOUT_RESERVE_QUANTUM == 0
    assert reserve == 100 * MiB  # the segment the probed run opens (a whole 4 MiB already)
    # every probed run that flips reserves at most the replay's peak + the stated layout figure
    base = simulate(trace, "", "2.4.1").peak_reserved_bytes
    for size in (2 * MiB, 4 * MiB, 6 * MiB, 8 * MiB):
        probed = simulate(with_persistent_block(trace, size), "", "2.4.1").peak_reserved_bytes
        assert probed <= base + reserve
    # 2 segments of its largest gradient (100 MiB) are larger here: the segment figure stands
    assert margin_reserve_bytes("attention", trace, "", "2.4.1") == 200 * MiB


def test_the_layout_figure_stands_where_it_is_the_larger():
    from peakmem.estimate.margin_reserve import layout_reserve_bytes

    # the same edge (test_layout_probe.embedding_step_trace) with no gradient among its blocks:
    # no gradient segments to reserve, the layout figure alone
    largest = 100 * MiB
    trace = Trace()
    trace.alloc(8 * MiB, op="activation")
    trace.alloc(largest, category="parameter")
    held = trace.alloc(largest, category="activation")
    sqrt = trace.alloc(largest, op="_foreach_sqrt")
    trace.free(sqrt)
    trace.free(held)
    trace.alloc(9 * MiB, op="activation")
    trace.alloc(largest, category="activation")
    trace.alloc(largest, op="_foreach_sqrt")
    assert largest_gradient_bytes(trace) == 0
    assert layout_reserve_bytes(trace, "", "2.4.1") == largest
    assert margin_reserve_bytes("attention", trace, "", "2.4.1") == largest


def test_a_job_the_probes_do_not_move_keeps_the_segment_reserve():
    from peakmem.estimate.margin_reserve import layout_reserve_bytes

    trace = layout_edge_trace(with_late_request=False)
    assert layout_reserve_bytes(trace, "", "2.4.1") == 0
    assert margin_reserve_bytes("attention", trace, "", "2.4.1") == 2 * 100 * MiB


@pytest.mark.parametrize("kind", ["default", "cudnn_convolution"])
def test_other_kinds_state_no_layout_reserve(kind):
    assert margin_reserve_bytes(kind, layout_edge_trace(), "", "2.4.1") == 0

