"""A script's own `try/except torch.cuda.OutOfMemoryError` batch-halving loop sees the error
the GPU would raise (capture.oom_handlers)."""

import sys

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.oom_handlers import catches_oom, oom_handler_on_stack
from peakmem.profiles import load_gpu


def raise_point():
    """The caller's frame: its code and the offset of the call being made."""
    frame = sys._getframe(1)
    return frame.f_code, frame.f_lasti


def cuda_oom():
    for _ in range(1):
        try:
            return raise_point()
        except torch.cuda.OutOfMemoryError:
            continue


def torch_oom_in_a_tuple_through_a_with():
    while True:
        try:
            with torch.no_grad():
                return raise_point()
        except (ValueError, torch.OutOfMemoryError):
            return None


def runtime_error_with_text():
    for _ in range(1):
        try:
            return raise_point()
        except RuntimeError as error:
            if "CUDA out of memory" in str(error):
                continue
            raise


def nested_inner_value_error_outer_oom():
    for _ in range(1):
        try:
            try:
                return raise_point()
            except ValueError:
                return None
        except torch.cuda.OutOfMemoryError:
            continue


def other_error_only():
    for _ in range(1):
        try:
            return raise_point()
        except ValueError:
            continue


def oom_handler_elsewhere():
    for _ in range(1):
        try:
            pass
        except torch.cuda.OutOfMemoryError:
            continue
    return raise_point()


def whole_job_handler_that_reraises():
    try:
        return raise_point()
    except torch.cuda.OutOfMemoryError:
        print(torch.cuda.memory_summary())
        raise


@pytest.mark.parametrize("job, caught", [
    (cuda_oom, True),
    (torch_oom_in_a_tuple_through_a_with, True),
    (runtime_error_with_text, True),
    (nested_inner_value_error_outer_oom, True),
    (other_error_only, False),
    (oom_handler_elsewhere, False),
    (whole_job_handler_that_reraises, False),  # no loop: no retry can follow
])
def test_handler_that_would_run_is_read_from_the_exception_table(job, caught):
    code, offset = job()
    assert catches_oom(code, offset) is caught


def test_stack_walk_finds_the_callers_handler():
    def inner():
        return oom_handler_on_stack()

    for _ in range(1):
        try:
            inside = inner()
        except torch.cuda.OutOfMemoryError:
            inside = None
    assert inside is True
    assert inner() is False


def test_halving_loop_goes_on_with_the_batch_that_fits(stack24):
    gpu = load_gpu("rtx4060-8gb")
    tried = []

    def job():
        batch = 2 * gpu.total_memory_bytes // 1024  # rows of 1 KiB: twice the GPU
        while batch >= 1:
            try:
                tried.append(batch)
                x = torch.empty(batch, 256, device="cuda")
                (x * 2).sum()
                break
            except torch.cuda.OutOfMemoryError:
                batch //= 2

    result = capture_callable(job, gpu=gpu, stack=stack24)
    assert result.error is None, result.error_text
    total = gpu.total_memory_bytes
    # x and x * 2 take twice x: 2x, 1x and half the GPU do not fit, a quarter does
    assert [round(batch * 1024 / total, 2) for batch in tried] == [2.0, 1.0, 0.5, 0.25]
