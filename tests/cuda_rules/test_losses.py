"""Losses whose CUDA kernels allocate more than the meta kernels' outputs
(aten/src/ATen/native/Loss.cpp, aten/src/ATen/native/cuda/Loss.cu), and log_sigmoid's buffer."""

import pytest
import torch
import torch.nn.functional as F

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

SHAPE = (64, 300)
X = 64 * 300 * 4


def _forward_allocs(result):
    return [(size, tag.op) for size, tag in allocations(result.trace) if tag.phase != "backward"][2:]


def _two_inputs(loss, **kwargs):
    def job():
        x = torch.rand(*SHAPE, device="cuda", requires_grad=True)
        t = torch.rand(*SHAPE, device="cuda")
        loss(x, t, **kwargs).backward()

    return job


@pytest.mark.parametrize("loss, name", [(F.mse_loss, "mse_loss"), (F.smooth_l1_loss, "smooth_l1_loss")])
def test_reduced_pointwise_loss_makes_a_full_size_temporary_after_the_output(a100, stack24, loss, name):
    result = capture_callable(_two_inputs(loss), gpu=a100, stack=stack24)
    assert _forward_allocs(result) == [(4, f"{name}.default"), (X, f"{name}[loss]")]


def test_unreduced_mse_loss_has_no_temporary(a100, stack24):
    def job():
        x = torch.rand(*SHAPE, device="cuda", requires_grad=True)
        F.mse_loss(x, torch.rand(*SHAPE, device="cuda"), reduction="none").sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert not allocations(result.trace, op="mse_loss[loss]")


def test_huber_loss_temporary_is_live_around_the_output(a100, stack24):
    result = capture_callable(_two_inputs(F.huber_loss), gpu=a100, stack=stack24)
    assert _forward_allocs(result) == [(X, "huber_loss[loss]"), (4, "huber_loss.default")]


def test_binary_cross_entropy_output_keeps_the_input_size_storage(a100, stack24):
    result = capture_callable(_two_inputs(F.binary_cross_entropy), gpu=a100, stack=stack24)
    assert _forward_allocs(result) == [
        (X, "binary_cross_entropy.default"),  # loss.resize_as_(scalar) keeps the storage
        (4, "binary_cross_entropy[reduced]"),
    ]


def test_binary_cross_entropy_with_logits_internal_temporaries(a100, stack24):
    result = capture_callable(_two_inputs(F.binary_cross_entropy_with_logits), gpu=a100, stack=stack24)
    scratch = "binary_cross_entropy_with_logits[scratch]"
    assert _forward_allocs(result) == [
        (X, scratch),  # log_sigmoid(input)
        (X, scratch),  # (1 - target)
        (4, "binary_cross_entropy_with_logits.default"),
    ]


def test_binary_cross_entropy_with_logits_pos_weight(a100, stack24):
    def job():
        x = torch.rand(*SHAPE, device="cuda", requires_grad=True)
        pos_weight = torch.ones(SHAPE[1], device="cuda")
        F.binary_cross_entropy_with_logits(x, torch.rand(*SHAPE, device="cuda"), pos_weight=pos_weight).backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    scratch = [size for size, _tag in allocations(result.trace, op="binary_cross_entropy_with_logits[")]
    assert scratch == [X, SHAPE[1] * 4, X, X]  # log_sigmoid, pos_weight - 1, log_weight, 1 - target


def test_log_sigmoid_saves_no_buffer(a100, stack24):
    def job():
        x = torch.randn(*SHAPE, device="cuda", requires_grad=True)
        F.logsigmoid(x).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert [size for size, _tag in allocations(result.trace, op="log_sigmoid_forward")] == [X]


def test_audit_cases_are_all_covered():
    from peakmem.cuda_rules.audit import run_audit

    results = run_audit()
    assert [r.case.name for r in results if r.error] == []
    assert [r.case.name for r in results if not r.covered] == []
    findings = {r.case.name for r in results if r.finding}
    assert {"mish_backward", "log_sigmoid_forward", "mse_loss (mean)", "native_group_norm_backward"} <= findings
