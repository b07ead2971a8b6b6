"""SyncBatchNorm's CUDA-only kernels (cuda_rules/sync_batch_norm.py): torch has no meta kernel
for them, so a fake-mode job with `nn.SyncBatchNorm` over two processes raised
NotImplementedError (round 22b: facebookresearch/vicreg under torchrun). Sizes from
aten/src/ATen/native/cuda/Normalization.cu."""

import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

N, C, H, W = 8, 64, 14, 14


def _ops(trace, prefix):
    return [(size, tag.op) for size, tag in allocations(trace) if tag.op.startswith(prefix)]


def test_sync_batch_norm_kernels_allocate_what_cuda_returns(a100, stack24):
    seen = {}

    def job():
        x = torch.randn(N, C, H, W, device="cuda", dtype=torch.float16)
        weight = torch.ones(C, device="cuda")
        running_mean, running_var = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
        mean, invstd = torch.batch_norm_stats(x, 1e-5)
        gathered = torch.stack([mean, mean])  # two ranks' statistics
        counts = torch.full((2,), N * H * W, dtype=torch.float32, device="cuda")
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            x, gathered, gathered, running_mean, running_var, 0.1, 1e-5, counts)
        out = torch.batch_norm_elemt(x, weight, weight, mean, invstd, 1e-5)
        sums = torch.batch_norm_backward_reduce(out, x, mean, invstd, weight, True, True, True)
        no_weight = torch.batch_norm_backward_reduce(out, x, mean, invstd, None, True, False,
                                                     False)
        grad_input = torch.batch_norm_backward_elemt(out, x, mean, invstd, weight, sums[0],
                                                     sums[1], counts.int())
        seen.update(stats=mean.dtype, out=(out.dtype, out.shape), grad=grad_input.dtype,
                    undefined=(no_weight[2], no_weight[3]))

    result = capture_callable(job, gpu=a100, stack=stack24)
    per_channel = C * 4  # float32
    activation = N * C * H * W * 2  # fp16
    # fp16 input: mean and invstd in float (the accumulate type)
    assert _ops(result.trace, "batch_norm_stats") == 2 * [(per_channel, "batch_norm_stats.default")]
    assert [size for size, _ in _ops(result.trace, "batch_norm_gather_stats")] == 2 * [per_channel]
    assert _ops(result.trace, "batch_norm_elemt") == [(activation, "batch_norm_elemt.default")]
    # sum_dy, sum_dy_xmu, grad_weight, grad_bias; then only the two sums without a weight
    assert [size for size, _ in _ops(result.trace, "batch_norm_backward_reduce")] == 6 * [
        per_channel]
    assert _ops(result.trace, "batch_norm_backward_elemt") == [
        (activation, "batch_norm_backward_elemt.default")]
    assert seen == {"stats": torch.float32, "out": (torch.float16, (N, C, H, W)),
                    "grad": torch.float16, "undefined": (None, None)}


def test_sync_batch_norm_output_keeps_a_channels_last_input_layout(a100, stack24):
    strides = {}

    def job():
        x = torch.randn(N, C, H, W, device="cuda").to(memory_format=torch.channels_last)
        mean, invstd = torch.batch_norm_stats(x, 1e-5)
        strides["out"] = torch.batch_norm_elemt(x, None, None, mean, invstd, 1e-5).stride()

    capture_callable(job, gpu=a100, stack=stack24)
    assert strides["out"] == (C * H * W, 1, W * C, C)
