"""Cross-entropy allocates the same on CUDA as on meta (log_softmax output saved; nll_loss output
and total_weight; backward: a zeroed gradient, then log_softmax's gradient), so it needs no rule.
This test pins that sequence so a change in either path shows up."""

import torch
import torch.nn.functional as F

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def test_cross_entropy_allocations_match_the_cuda_kernels(a100, stack24):
    batch, classes = 32, 100

    def job():
        logits = torch.randn(batch, classes, device="cuda", requires_grad=True)
        target = torch.randint(0, classes, (batch,), device="cuda")
        F.cross_entropy(logits, target).backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    sequence = [(size, tag.op) for size, tag in allocations(result.trace) if tag.op != "randint.low"]
    logits_bytes = batch * classes * 4
    assert sequence[1:] == [
        (logits_bytes, "_log_softmax.default"),
        (4, "nll_loss_forward.default"),  # the loss
        (4, "nll_loss_forward.default"),  # total_weight
        (4, "ones_like.default"),
        (logits_bytes, "nll_loss_backward.default"),
        (logits_bytes, "_log_softmax_backward_data.default"),
    ]
