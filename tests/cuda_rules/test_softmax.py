"""Softmax on CUDA (cuda_rules/softmax.py). SDPA's math path: `_safe_softmax` allocates an
`eq(-inf)` mask the size of its input, a per-row `all` and a 0-dim fill value right after its
output, freed before it returns (measured on an H200, torch 2.11:
benchmarks/snapshots/h200_t5_small_bf16_b8.digest.json.gz); `_softmax_backward_data` computes
`grad * output` after its gradient (SoftMax.cu `softmax_backward_cuda_out`)."""

import torch
import torch.nn.functional as F

from peakmem.capture import capture_callable
from peakmem.profiles import load_stack
from tests.capture.capture_helpers import allocations

STACK_2_11 = load_stack("2.11.0")


def test_safe_softmax_masks_follow_the_output(a100):
    b, h, q, k = 2, 4, 64, 96

    def job():
        scores = torch.randn(b, h, q, k, device="cuda")
        torch.ops.aten._safe_softmax(scores, -1)

    result = capture_callable(job, gpu=a100, stack=STACK_2_11)
    assert result.error is None, result.error_text
    sizes = [(size, tag.op) for size, tag in allocations(result.trace)]
    output_at = [op for _, op in sizes].index("_safe_softmax.default")
    assert sizes[output_at][0] == b * h * q * k * 4
    after = [size for size, op in sizes[output_at + 1:] if op == "_safe_softmax[masked_rows]"]
    # bool mask of the input, one bool per (b, h, q) row, a float32 0-dim fill value
    assert after == [b * h * q * k, b * h * q, 4]


def test_math_sdpa_with_a_permuted_mask_runs_the_safe_softmax_rule(a100):
    b, h, s, d = 2, 4, 64, 16

    def job():
        qkv = [torch.randn(b, h, s, d, device="cuda", requires_grad=True) for _ in range(3)]
        bias = torch.randn(s, s, h, device="cuda").permute(2, 0, 1)[None]  # last dim stride h
        F.scaled_dot_product_attention(*qkv, attn_mask=bias, dropout_p=0.1)

    result = capture_callable(job, gpu=a100, stack=STACK_2_11)
    assert result.error is None, result.error_text
    masks = [size for size, tag in allocations(result.trace, op="_safe_softmax[masked_rows]")]
    assert masks == [b * h * s * s, b * h * s, 4]


def backward_allocations(a100, stack24, job):
    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    return [(size, tag.op) for size, tag in allocations(result.trace, phase="backward")]


def test_softmax_backward_allocates_grad_times_output_after_its_gradient(a100, stack24):
    shape = (4, 8, 64, 96)

    def job():
        x = torch.randn(shape, device="cuda", requires_grad=True)
        torch.softmax(x, -1).sum().backward()

    backward = backward_allocations(a100, stack24, job)
    ops = [op for _, op in backward]
    at = ops.index("_softmax_backward_data.default")
    # SoftMax.cu softmax_backward_cuda_out: grad_input, then `tmp = grad * output` (float32)
    assert backward[at + 1] == (4 * 8 * 64 * 96 * 4, "_softmax_backward_data[grad*output]")


def test_log_softmax_backward_has_no_product(a100, stack24):
    def job():
        x = torch.randn(16, 1000, device="cuda", requires_grad=True)
        torch.log_softmax(x, -1).sum().backward()

    ops = [op for _, op in backward_allocations(a100, stack24, job)]
    assert "_log_softmax_backward_data.default" in ops
    assert not any(op.startswith("_softmax_backward_data") for op in ops)


def test_torch_2_4_math_path_has_no_safe_softmax_masks(a100, stack24):
    def job():
        torch.ops.aten._safe_softmax(torch.randn(2, 4, 64, 96, device="cuda"), -1)

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert allocations(result.trace, op="_safe_softmax[masked_rows]") == []
