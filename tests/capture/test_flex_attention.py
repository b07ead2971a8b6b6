"""flex_attention (torch.nn.attention.flex_attention) trains under the capture, with what the
compiled CUDA kernels allocate."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from peakmem.capture.flex_attention import dense_strides_like
from peakmem.estimate import estimate
from tests.capture.capture_helpers import allocations

B, H, M, D = 2, 4, 256, 16
BF16 = 2


def causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class Attention(torch.nn.Module):
    def __init__(self, use_block_mask: bool) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)
        self.proj = torch.nn.Linear(H * D, H * D)
        self.use_block_mask = use_block_mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(B, M, 3, H, D).permute(2, 0, 3, 1, 4)
        if self.use_block_mask:
            block_mask = create_block_mask(causal_mask, B, H, M, M, device=x.device)
            y = flex_attention(q, k, v, block_mask=block_mask)
        else:
            y = flex_attention(q, k, v, score_mod=causal)
        return self.proj(y.transpose(1, 2).reshape(B, M, H * D))


def train(use_block_mask: bool, steps: int = 2) -> None:
    model = Attention(use_block_mask).to("cuda", torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        x = torch.randn(B, M, H * D, device="cuda", dtype=torch.bfloat16)
        model(x).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _sizes(trace, op):
    return [size for size, tag in allocations(trace) if tag.op == op]


@pytest.mark.parametrize("use_block_mask", [False, True], ids=["score_mod", "block_mask"])
def test_a_flex_attention_model_trains_two_steps_with_the_kernels_allocations(use_block_mask):
    result = estimate(train, use_block_mask, gpu="a100-40gb", steps="all", mode="fake")
    capture = result.capture
    assert capture.error is None, capture.error_text
    assert capture.steps == 2
    out, per_row = B * H * M * D * BF16, B * H * M * 4  # bf16 output, fp32 logsumexp/max
    # per call: out, logsumexp, max_scores (the forward kernel's three outputs)
    assert _sizes(capture.trace, "flex_attention") == [out, per_row, per_row] * 2
    # backward: grad_query, grad_value, grad_key of the inputs' dtype; delta in fp32 scratch
    assert _sizes(capture.trace, "flex_attention_backward") == [out, out, out] * 2
    assert _sizes(capture.trace, "flex_attention_backward[delta]") == [per_row] * 2
    # autograd keeps out and logsumexp for backward (activations); no B x H x M x M scores
    saved = {size for size, tag in allocations(capture.trace, "activation", op="flex_attention")}
    assert saved >= {out, per_row}
    scores = B * H * M * M * BF16  # what eager torch's unfused math path would materialise
    assert max(s for s, tag in allocations(capture.trace) if tag.category != "workspace") < scores
    if not use_block_mask:  # tracing the score_mod into graphs (FakeTensors) allocates nothing
        assert not allocations(capture.trace, op="ge.") + allocations(capture.trace, op="empty_strided")
    if use_block_mask:  # create_block_mask ran on the device: its int32 kv_num_blocks table
        tables = [size for size, tag in allocations(capture.trace, op="_to_copy")]
        assert B * H * (M // 128) * 4 in tables


def test_broadcast_key_value_and_grouped_heads_get_their_own_shapes_of_gradient():
    heads_kv = 2

    def job():
        q = torch.randn(B, H, M, D, device="cuda", requires_grad=True)
        k = torch.randn(1, heads_kv, M, D, device="cuda", requires_grad=True)
        v = torch.randn(1, heads_kv, M, 2 * D, device="cuda", requires_grad=True)
        block_mask = create_block_mask(causal_mask, B, None, M, M, device="cuda")
        out = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
        assert tuple(out.shape) == (B, H, M, 2 * D)
        out.sum().backward()
        assert tuple(k.grad.shape) == (1, heads_kv, M, D)
        assert tuple(v.grad.shape) == (1, heads_kv, M, 2 * D)

    result = estimate(job, gpu="a100-40gb", steps="all", mode="fake")
    assert result.capture.error is None, result.capture.error_text
    fp32 = 4
    broadcast_k, broadcast_v = B * heads_kv * M * D * fp32, B * heads_kv * M * 2 * D * fp32
    assert _sizes(result.capture.trace, "flex_attention_backward") == [
        B * H * M * D * fp32, broadcast_v, broadcast_k,  # the kernel's outputs
        broadcast_k // B, broadcast_v // B,  # summed over the broadcast batch
    ]


def test_a_score_mod_buffer_that_requires_grad_gets_an_fp32_gradient_cast_to_its_dtype():
    """What compiled code calls: the operator with the score_mod's captured tensor lifted into
    score_mod_other_buffers (Dynamo does that lifting)."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop

    def job():
        bias = torch.zeros(M, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        q, k, v = (torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        block_mask = create_block_mask(causal_mask, None, None, M, M, device="cuda")
        out, _, _ = flex_attention_hop(
            q, k, v, lambda score, b, h, q_idx, kv_idx, bias: score + bias[kv_idx],
            block_mask.as_tuple(), D ** -0.5, {}, (bias,), (),
        )
        out.float().sum().backward()
        assert bias.grad is not None and bias.grad.dtype == torch.bfloat16

    result = estimate(job, gpu="a100-40gb", steps="all", mode="fake")
    assert result.capture.error is None, result.capture.error_text
    grads = _sizes(result.capture.trace, "flex_attention_backward")
    assert grads[3:] == [M * 4, M * BF16]  # fp32 accumulation, then the bf16 gradient


def test_outputs_are_dense_in_the_querys_stride_order():
    # q from (B, M, 3, H, D).permute(2, 0, 3, 1, 4): out is laid out (B, M, H, D)
    q = torch.empty(B, M, 3, H, D).permute(2, 0, 3, 1, 4)[0]
    assert dense_strides_like((B, H, M, D), q.stride()) == [M * H * D, D, H * D, 1]
    assert dense_strides_like((B, H, M, 8), (H * M * D, M * D, D, 1)) == [H * M * 8, M * 8, 8, 1]
    # the last dimension is always innermost
    assert dense_strides_like((B, H, M, D), (1, B, B * H, B * H * M)) == [D, B * D, B * H * D, 1]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_flex_attentions_own_compile_is_not_noted_as_eager(compiled):
    """torch compiles flex_attention's operator itself (and a job may compile flex_attention):
    the capture records the compiled kernel, so no 'ran eagerly' upper bound applies."""

    def job():
        q, k, v = (torch.randn(B, H, M, D, device="cuda", requires_grad=True) for _ in range(3))
        attend = torch.compile(flex_attention) if compiled else flex_attention
        attend(q, k, v, score_mod=causal).sum().backward()

    result = estimate(job, gpu="a100-40gb", steps="all", mode="fake")
    assert result.capture.error is None, result.capture.error_text
    assert _sizes(result.capture.trace, "flex_attention") == [B * H * M * D * 4] + [B * H * M * 4] * 2
    assert not [note for note in result.notes if "torch.compile" in note]


def _attention_and_grads(q, k, v, *, flex: bool):
    """The attention's output and the gradients of (q, k, v) for causal scores: flex_attention
    on the (fake) device, or the same attention written out on the host."""
    device = "cuda" if flex else "cpu"
    leaves = [t.to(device).detach().requires_grad_() for t in (q, k, v)]
    q, k, v = leaves
    if flex:
        out = flex_attention(q, k, v, score_mod=causal)
    else:
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        causal_scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -float("inf"))
        out = causal_scores.softmax(-1) @ v
    out.square().sum().backward()
    return [out.detach().cpu()] + [t.grad.cpu() for t in leaves]


def test_eager_mode_gives_the_real_values_of_flex_attention_and_its_gradients():
    torch.manual_seed(0)
    inputs = [torch.randn(1, 2, 128, 8) for _ in range(3)]
    expected = _attention_and_grads(*inputs, flex=False)  # outside the capture
    seen = []

    def job():
        seen.extend(_attention_and_grads(*inputs, flex=True))

    result = estimate(job, gpu="a100-40gb", steps="all", mode="eager")
    assert result.capture.error is None, result.capture.error_text
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    lse = 1 * 2 * 128 * 4
    assert _sizes(result.capture.trace, "flex_attention") == [1 * 2 * 128 * 8 * 4, lse, lse]


def test_flex_attention_on_host_tensors_computes_real_values_under_the_capture():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 8) for _ in range(3))
    expected = _attention_and_grads(q, k, v, flex=False)[0]  # written out, outside the capture
    seen = []

    def job():
        seen.append(flex_attention(q, k, v, score_mod=causal))

    result = estimate(job, gpu="a100-40gb", steps="all", mode="fake")
    assert result.capture.error is None, result.capture.error_text
    torch.testing.assert_close(seen[0], expected, rtol=1e-4, atol=1e-4)
    assert not _sizes(result.capture.trace, "flex_attention")  # no device allocation
