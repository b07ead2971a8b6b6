"""Retry loops that catch CUDA's out-of-memory error (capture.oom_retry) see it at the batch
that does not fit the GPU, without a memory fraction, as on the GPU; other code does not."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.estimate import api

MIB = 2**20
PER_SAMPLE = 64 * MIB
"""Each sample's two tensors of 64 MiB (multiples of the 2 MiB large-segment rounding)."""
START = 670
"""The batches tried: 670 (one tensor over the 40 GB A100), 603 (one tensor fits, in a segment
the later batches' two tensors share), ..., 318, then 286 fits: eight out-of-memory errors. From
1024 it was twelve, and accelerate runs gc.collect() after each (seconds apiece in an xdist
worker holding the library jobs' imports: the test took 79 s in the suite at load 9-10).
A start whose first one-tensor fit is under twice the batch that fits (420: 306 fits one
tensor) caches a segment too small for the final two: the allocator then rightly goes below
the batch `_batches_tried` predicts."""


def _capacity(gpu, stack) -> int:
    return gpu.total_memory_bytes - int(stack.context_for(gpu).value)


def _batches_tried(start: int, fits) -> list[int]:
    """accelerate's sequence: the batch times 0.9 (int) after each out-of-memory error."""
    tried = [start]
    while not fits(tried[-1]):
        tried.append(int(tried[-1] * 0.9))
    return tried


def _two_tensors(batch_size: int) -> int:
    x = torch.empty(batch_size, PER_SAMPLE, dtype=torch.uint8, device="cuda")
    y = x * 2
    return int(y.shape[0])


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate")
def test_find_executable_batch_size_sees_the_oom_and_settles_on_the_batch_that_fits(a100, stack24):
    from accelerate.utils import find_executable_batch_size

    tried: list[int] = []

    def job():
        @find_executable_batch_size(starting_batch_size=START)
        def train(batch_size):
            tried.append(batch_size)
            return _two_tensors(batch_size)

        tried.append(-train())

    capture = capture_callable(job, gpu=a100, stack=stack24)
    assert capture.error is None, capture.error
    capacity = _capacity(a100, stack24)
    expected = _batches_tried(START, lambda b: 2 * b * PER_SAMPLE <= capacity)
    assert len(expected) > 3
    assert tried == expected + [-expected[-1]]
    assert len(capture.trace.meta["simulated_ooms"]) == len(expected) - 1
    est = api.estimate_capture(capture, a100, stack24, torch_version="2.4.1")
    assert not est.oom and est.peak_reserved_bytes <= capacity
    caught = f"caught {len(expected) - 1} CUDA out-of-memory error(s) in a retry loop"
    assert any(caught in note for note in est.notes), est.notes


def test_outside_a_retry_loop_the_job_runs_on_and_the_estimate_reports_the_oom(a100, stack24):
    seen = []
    capture = capture_callable(lambda: seen.append(_two_tensors(1024)), gpu=a100, stack=stack24)
    assert capture.error is None and seen == [1024]
    assert "simulated_ooms" not in capture.trace.meta
    assert api.estimate_capture(capture, a100, stack24, torch_version="2.4.1").oom
