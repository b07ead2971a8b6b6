import pytest
import torch
import torch.nn.functional as F

from peakmem.capture import capture_callable
from peakmem.cuda_rules.sdpa import SdpaBackend, choose_backend
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations


def qkv(dtype, head_dim=64, length=100):
    return [torch.empty(2, 4, length, head_dim, dtype=dtype, device="meta") for _ in range(3)]


@pytest.mark.parametrize(
    "capability, dtype, head_dim, mask, backend",
    [
        ((8, 0), torch.float16, 64, False, SdpaBackend.FLASH),
        ((9, 0), torch.bfloat16, 128, False, SdpaBackend.FLASH),
        ((8, 0), torch.float32, 64, False, SdpaBackend.EFFICIENT),
        ((8, 0), torch.float16, 64, True, SdpaBackend.EFFICIENT),
        ((7, 0), torch.float16, 64, False, SdpaBackend.EFFICIENT),
        ((7, 0), torch.bfloat16, 64, False, SdpaBackend.MATH),
        ((8, 0), torch.float16, 12, True, SdpaBackend.MATH),
        ((8, 0), torch.float64, 64, False, SdpaBackend.MATH),
    ],
)
def test_backend_choice(capability, dtype, head_dim, mask, backend):
    q, k, v = qkv(dtype, head_dim)
    attn_mask = torch.empty(100, 100, dtype=torch.bool, device="meta") if mask else None
    assert choose_backend(capability, q, k, v, attn_mask) is backend


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def attention_job(dtype):
    def job():
        q, k, v = (torch.randn(2, 4, 100, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        Attention()(q, k, v).sum().backward()

    return job


def test_memory_efficient_saves_output_and_padded_logsumexp(stack24):
    result = capture_callable(attention_job(torch.float32), gpu=load_gpu("v100-32gb"), stack=stack24)
    assert result.error is None, result.error_text
    forward = [size for size, _ in allocations(result.trace, "activation", op="_scaled_dot_product")]
    out, logsumexp = 2 * 4 * 100 * 64 * 4, 2 * 4 * 128 * 4  # lse padded to 128 = ceil(100/32)*32
    assert forward == [out, logsumexp]
    attention_matrix = 2 * 4 * 100 * 100 * 4
    assert all(size < attention_matrix for size, _ in allocations(result.trace))


def test_flash_saves_output_and_logsumexp(a100, stack24):
    result = capture_callable(attention_job(torch.float16), gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    sizes = [size for size, _ in allocations(result.trace, "activation", op="_scaled_dot_product_flash")]
    assert 2 * 4 * 100 * 64 * 2 in sizes and 2 * 4 * 100 * 4 in sizes


def test_attention_inside_an_encoder_layer_uses_the_cuda_backend(stack24):
    def job():
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).cuda()
        layer(torch.randn(2, 100, 64, device="cuda")).sum().backward()

    result = capture_callable(job, gpu=load_gpu("a100-40gb"), stack=stack24)
    assert result.error is None, result.error_text
    ops = {tag.op for _, tag in allocations(result.trace, phase="forward")}
    assert "_scaled_dot_product_efficient_attention.default" in ops  # fp32 on A100
    assert "_safe_softmax.default" not in ops  # not the math path


def test_grouped_query_attention_takes_flash_and_saves_no_attention_matrix(stack24):
    q = torch.empty(1, 32, 128, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(1, 8, 128, 64, dtype=torch.bfloat16, device="meta")
    assert choose_backend((9, 0), q, kv, kv, None) is SdpaBackend.FLASH
    assert choose_backend((9, 0), q.float(), kv.float(), kv.float(), None) is SdpaBackend.MATH

    def job():
        q, k, v = (
            torch.randn(1, heads, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for heads in (32, 8, 8)
        )
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()

    result = capture_callable(job, gpu=load_gpu("h100-80gb"), stack=stack24)
    assert result.error is None, result.error_text
    attention_matrix = 32 * 128 * 128 * 2
    assert all(size < attention_matrix for size, _ in allocations(result.trace))



def test_separate_qkv_get_three_gradient_buffers(stack24):
    result = capture_callable(attention_job(torch.float32), gpu=load_gpu("a100-40gb"), stack=stack24)
    grads = [size for size, tag in allocations(result.trace, phase="backward")
             if tag.op.startswith("_scaled_dot_product_efficient_attention_backward")]
    assert grads == [2 * 4 * 100 * 64 * 4] * 3


def test_fp32_backward_computes_delta_with_temporaries(stack24):
    result = capture_callable(attention_job(torch.float32), gpu=load_gpu("a100-40gb"), stack=stack24)
    delta = [size for size, tag in allocations(result.trace, op="efficient_attention_backward[scratch]")]
    full, row = 2 * 4 * 100 * 64 * 4, 2 * 4 * 100 * 4
    # grad_out arrives as [B, H, M, K] contiguous: a copy into [B, M, H, K] first; then
    # grad_out * out, its sum and the contiguous delta
    assert delta == [full, full, row, row]


@pytest.mark.parametrize(
    "capability, dtype, queries, head_dim, expected",
    [
        # kernel_backward.h Params::workspace_size for the fp32 kernels of cutlassB.h
        # (dispatch_cutlassB_f32_sm80): B * H * align4(ceil(M / BI) * ceil(K / BJ) * (4 + BI * BJ))
        # floats; the 16-byte GradQTempStorage header is 4 floats.
        ((8, 0), torch.float32, 512, 16, 32 * 8 * (8 * 1 * (4 + 64 * 64)) * 4),  # 64x64 k32
        ((8, 0), torch.float32, 100, 64, 32 * 8 * (2 * 1 * (4 + 64 * 64)) * 4),  # 64x64 k64
        ((8, 0), torch.float32, 512, 96, 32 * 8 * (4 * 2 * (4 + 128 * 64)) * 4),  # 128x64 k128
        ((8, 6), torch.float32, 512, 96, 32 * 8 * (8 * 2 * (4 + 64 * 64)) * 4),  # 64x64 k128
        ((9, 0), torch.float32, 256, 192, 32 * 8 * (2 * 3 * (4 + 128 * 64)) * 4),  # 128x64 k65536
        ((8, 0), torch.float16, 512, 64, 0),  # half: not modelled
        ((7, 0), torch.float32, 512, 64, 0),  # sm70 kernels: not modelled
    ],
)
def test_efficient_backward_workspace_bytes(capability, dtype, queries, head_dim, expected):
    from peakmem.cuda_rules.sdpa import efficient_backward_workspace_bytes

    got = efficient_backward_workspace_bytes(capability, dtype, 32, 8, queries, head_dim, head_dim)
    assert got == expected


def test_fp32_backward_allocates_its_workspace_after_delta(stack24):
    result = capture_callable(attention_job(torch.float32), gpu=load_gpu("a100-40gb"), stack=stack24)
    assert result.error is None, result.error_text
    workspace = [size for size, _ in allocations(result.trace, op="efficient_attention_backward[workspace]")]
    assert workspace == [2 * 4 * (2 * 1 * (4 + 64 * 64)) * 4]  # M=100, K=64: 64x64 kernel, 2 tiles


# -- a mask (or query/key/value) whose last dimension is not contiguous: the math path ------------

def t5_position_bias(heads: int, length: int) -> torch.Tensor:
    """T5Attention.compute_bias's layout: embedding(buckets) is (q, k, heads), permuted to
    (1, heads, q, k): the keys' stride is `heads`, the heads' stride 1."""
    return torch.empty(length, length, heads, device="meta").permute([2, 0, 1]).unsqueeze(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mask_whose_last_dimension_is_strided_sends_attention_to_math(dtype):
    q, k, v = (torch.empty(2, 8, 512, 64, dtype=dtype, device="meta") for _ in range(3))
    bias = t5_position_bias(8, 512).to(dtype)
    assert bias.stride(-1) == 8
    assert choose_backend((9, 0), q, k, v, bias) is SdpaBackend.MATH
    assert choose_backend((9, 0), q, k, v, bias.contiguous()) is SdpaBackend.EFFICIENT


def test_query_key_value_with_a_strided_last_dimension_take_no_fused_backend():
    q = torch.empty(2, 8, 128, 64, dtype=torch.float16, device="meta")
    strided = torch.empty(2, 8, 64, 128, dtype=torch.float16, device="meta").transpose(-2, -1)
    assert choose_backend((9, 0), q, q, q, None) is SdpaBackend.FLASH
    assert choose_backend((9, 0), q, strided, q, None) is SdpaBackend.MATH


def t5_attention_job(dtype, contiguous_bias: bool, batch=2, heads=8, length=512, head_dim=64):
    """One T5 attention call as transformers <= 5.19 makes it (the relative position bias as the
    mask, learned, no scaling, dropout 0.1), or as 5.20 makes it (the bias made contiguous)."""
    def job():
        embedding = torch.nn.Embedding(32, heads).cuda()
        buckets = torch.randint(0, 32, (length, length), device="cuda")
        q, k, v = (torch.randn(batch, heads, length, head_dim, device="cuda", requires_grad=True)
                   for _ in range(3))
        bias = embedding(buckets).permute([2, 0, 1]).unsqueeze(0)
        if contiguous_bias:
            bias = bias.contiguous()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.1, scale=1.0)
        out.float().sum().backward()

    return job


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_t5_attention_with_its_strided_bias_saves_9_bytes_per_score(dtype):
    """The worked bytes of one T5 attention call at seq 512 (batch 2, 8 heads) on the H200 with
    transformers <= 5.19: the math path (bf16 autocast too: it computes in float32) keeps the
    float32 softmax (4 B per score), the dropout mask (1 B) and the dropout output (4 B) for
    backward: 9 B x 2 x 8 x 512 x 512 = 36 MiB per call, against none with the bias made
    contiguous (memory-efficient attention: output and logsumexp only)."""
    scores = 2 * 8 * 512 * 512
    gpu, stack = load_gpu("h200"), load_stack("2.11")
    result = capture_callable(t5_attention_job(dtype, contiguous_bias=False), gpu=gpu, stack=stack)
    assert result.error is None, result.error_text
    forward = allocations(result.trace, phase="forward")
    softmax = [size for size, tag in forward if tag.op == "_safe_softmax.default"]
    dropout = [size for size, tag in forward if tag.op == "native_dropout.default"]
    assert softmax == [4 * scores]
    assert sorted(dropout) == [scores, 4 * scores]  # the bool mask, the float32 output
    assert sum(softmax + dropout) == 9 * scores == 36 * 2**20

    result = capture_callable(t5_attention_job(dtype, contiguous_bias=True), gpu=gpu, stack=stack)
    assert result.error is None, result.error_text
    ops = {tag.op for _, tag in allocations(result.trace, phase="forward")}
    assert "_scaled_dot_product_efficient_attention.default" in ops
    bias_copy = 8 * 512 * 512 * 4  # the embedding's output and its contiguous copy, batch-free
    assert max(size for size, _ in allocations(result.trace, phase="forward")) == bias_copy
