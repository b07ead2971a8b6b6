"""Global-memory scratch of CUDA sum/mean (cuda_rules/reductions.py), worked out by hand from
Reduce.cuh's `setReduceConfig` / `ReduceConfig` (torch 2.4) for an A100 (108 SMs, 2048 threads
per SM)."""

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.cuda_rules.reductions import (
    max_threads_per_sm,
    reduce_layout,
    reduce_scratch_bytes,
    set_reduce_config,
)
from tests.capture.capture_helpers import allocations

A100 = (108, 2048)


def scratch(shape, dims, dtype=torch.float32, gpu=A100):
    x = torch.empty(shape, device="meta", dtype=dtype)
    return reduce_scratch_bytes(x, set(dims), *gpu)


def test_layout_puts_reduced_dims_first_and_coalesces():
    # bias gradient of a Linear on (B, S, N): the two reduced dims merge into one
    assert reduce_layout((64, 256, 2977), (256 * 2977, 2977, 1), {0, 1}) == reduce_layout(
        (16384, 2977), (2977, 1), {0}
    )
    col = reduce_layout((16384, 2977), (2977, 1), {0})
    assert (col.shape, col.input_strides, col.output_strides, col.num_reduce_dims) == (
        (16384, 2977), (2977, 1), (0, 1), 1
    )
    # mean over the sequence of (B, S, E): S first, then E (stride 1) and B, which do not merge
    seq = reduce_layout((8, 512, 1024), (512 * 1024, 1024, 1), {1})
    assert seq.shape == (512, 1024, 8) and seq.num_reduce_dims == 1 and seq.num_outputs == 8 * 1024
    # size-1 dims vanish; a full reduction of a contiguous tensor is one dimension
    assert reduce_layout((1, 32, 16), (512, 16, 1), {0, 1, 2}).shape == (512,)


def test_column_sum_with_odd_width():
    """(16384, 2977) summed over rows: output vec 1 (2977 is odd); block 32 x 16 (set_block_dimension:
    dims 2977 and 16384 both cap at 512); output split over 32 lanes -> grid 94; 16384 values >=
    16 x 16 -> split over 16 warps -> 1024 per thread; target grid 108 x (2048 / 512) = 432;
    ctas = max(min(ceil(432 / 94) = 5, ceil(1024 / 16) = 64), ceil(1024 / 256) = 4) = 5.
    buffer = 4 x 2977 x 5 x block.x 32 x vec 1; semaphores = 4 x grid 94."""
    assert scratch((16384, 2977), [0]) == (4 * 2977 * 5 * 32, 4 * 94)
    assert scratch((64, 256, 2977), [0, 1]) == (4 * 2977 * 5 * 32, 4 * 94)


def test_column_sum_with_vectorised_output():
    """(16384, 768): vec 4 -> dim0 192, max threads 512 / 4 = 128 -> block 32 x 4; grid
    ceil(192 / 32) = 6; 4096 values per thread; target 108 x 16 = 1728; ctas = max(min(288, 256),
    16) = 256. buffer = 4 x 768 x 256 x 32 x 4 (96 MiB: the staging slots of every lane)."""
    assert scratch((16384, 768), [0]) == (4 * 768 * 256 * 32 * 4, 4 * 6)


def test_full_sum_of_a_long_vector():
    """2**24 elements: vectorised input (dim0 / 4), block 512 x 1 reducing along x; 32768 values
    per thread; ctas = max(min(432, 2048), 128) = 432; block_x_reduce -> buffer 4 x 1 x 432."""
    assert scratch((2**24,), [0]) == (4 * 432, 4)


@pytest.mark.parametrize(
    ("shape", "dims"),
    [((64, 128), [1]), ((4096, 64), [1]), ((8, 512, 1024), [1]), ((128, 10), [0]), ((0, 5), [0])],
)
def test_reductions_that_stay_inside_a_block(shape, dims):
    assert scratch(shape, dims) == (0, 0)


def test_fewer_threads_per_sm_raise_the_split_threshold():
    assert max_threads_per_sm((8, 6)) == 1536 and max_threads_per_sm((8, 0)) == 2048
    layout = reduce_layout((16384, 2977), (2977, 1), {0})
    rtx3060 = set_reduce_config(layout, 4, 4, 0, 28, 1536)  # target grid 28 x 3 = 84 < grid 94
    assert not rtx3060.should_global_reduce()


def test_half_input_accumulates_in_float():
    """sum of fp16 (4096, 1024) over rows: scalar 2 bytes but arg_t float; vec 4, grid 8, 1024
    values per thread; ctas = max(min(ceil(1728 / 8) = 216, 64), 4) = 64."""
    assert scratch((4096, 1024), [0], dtype=torch.float16) == (4 * 1024 * 64 * 32 * 4, 4 * 8)


def test_bias_gradient_in_a_capture_allocates_the_staging_buffer(a100, stack24):
    def job():
        layer = torch.nn.Linear(64, 768).cuda()
        layer(torch.randn(16384, 64, device="cuda")).pow(2).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    backward = [
        (size, tag.op) for size, tag in allocations(result.trace, phase="backward")
        if tag.op.startswith("sum")
    ]
    # the bias gradient (768,) first, then the buffer and semaphores of its column reduction
    assert backward == [
        (4 * 768, "sum.dim_IntList"),
        (4 * 768 * 256 * 32 * 4, "sum[reduce_global]"),
        (4 * 6, "sum[reduce_global]"),
    ]
    forward = [size for size, _ in allocations(result.trace, op="sum[reduce_global]", phase="forward")]
    assert forward == [4 * 432, 4]  # the loss: a full reduction of 16384 x 768 values


def test_the_staging_buffer_is_freed_when_the_kernel_returns(a100, stack24):
    from peakmem.trace.events import EventKind

    def job():
        torch.randn(16384, 768, device="cuda").sum(0)

    trace = capture_callable(job, gpu=a100, stack=stack24).trace
    kinds = [(kind, trace.sizes[i]) for i, kind in enumerate(trace.kinds)
             if kind in (EventKind.ALLOC, EventKind.FREE)]
    big = 4 * 768 * 256 * 32 * 4
    at = kinds.index((EventKind.ALLOC, big))
    # buffer, semaphores, then semaphores freed and the buffer freed
    assert [k for k, _ in kinds[at:at + 4]] == [EventKind.ALLOC, EventKind.ALLOC, EventKind.FREE,
                                                EventKind.FREE]


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda x: x.sum(0), (4 * 768 * 256 * 32 * 4, 4 * 6)),
        (lambda x: x.mean(0), (4 * 768 * 256 * 32 * 4, 4 * 6)),
        (lambda x: torch.nansum(x, 0), (4 * 768 * 256 * 32 * 4, 4 * 6)),
        (lambda x: x.sum(), (4 * 432, 4)),
        (lambda x: x.sum(1), None),  # row sums stay inside one block per output
    ],
)
def test_every_registered_overload(a100, stack24, call, expected):
    def job():
        call(torch.randn(16384, 768, device="cuda"))

    trace = capture_callable(job, gpu=a100, stack=stack24).trace
    found = [size for size, _ in allocations(trace, category="temporary") if size != 4 * 16384]
    assert found == (list(expected) if expected else [])
