"""A retry loop that caught out-of-memory errors (the Trainer's --auto_find_batch_size):
whether the peak belongs to an attempt the job gave up, and what the run it went on with needs."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.estimate import api

MIB = 2**20
GIB = 2**30

pytestmark = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate")


def _capture(a100, stack24, per_sample_mib: tuple[int, ...]):
    """find_executable_batch_size from 1024: each attempt allocates, in order, one tensor of
    batch x each size (MiB), all live at once."""
    from accelerate.utils import find_executable_batch_size

    tried: list[int] = []

    def job():
        @find_executable_batch_size(starting_batch_size=1024)
        def train(batch_size):
            tried.append(batch_size)
            held = [torch.empty(batch_size, size * MIB, dtype=torch.uint8, device="cuda")
                    for size in per_sample_mib]
            return len(held)

        train()

    capture = capture_callable(job, gpu=a100, stack=stack24)
    assert capture.error is None, capture.error
    return api.estimate_capture(capture, a100, stack24, torch_version="2.4.1"), tried


def test_a_given_up_attempt_set_the_peak_the_note_gives_the_run_that_went_on(a100, stack24):
    # 64 MiB then 4 MiB a sample: an attempt whose second tensor does not fit already holds
    # more than the whole of the smaller batch that fits next
    est, tried = _capture(a100, stack24, (64, 4))
    final = tried[-1]
    assert len(tried) > 2 and est.peak_allocated_bytes == tried[-2] * 64 * MIB
    note = next(n for n in est.notes if "set by an attempt that ran out of memory" in n)
    assert f"peaked at about {final * 68 * MIB / GIB:.2f} GiB allocated" in note, note


def test_no_note_when_the_run_that_went_on_set_the_peak(a100, stack24):
    # each attempt fails on its first tensor (nothing held), until one fits whole
    est, tried = _capture(a100, stack24, (68,))
    assert est.peak_allocated_bytes == tried[-1] * 68 * MIB
    assert any("caught" in note and "retry loop" in note for note in est.notes), est.notes
    assert not any("ran out of memory before" in note for note in est.notes), est.notes
