import pytest
import torch
import torch.nn.functional as F

from peakmem.capture import capture_callable
from peakmem.cuda_rules.sdpa import (
    SdpaBackend,
    choose_backend,
    cudnn_backward_workspace_bytes,
    parse_release,
)
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


# -- cuDNN attention: first on sm 9.0 from torch 2.11 (bundled cuDNN 9.19 > 9.15.0) ---------------

TORCH_2_11 = parse_release("2.11.0+cu130")


@pytest.mark.parametrize("contiguous, dtype, backend", [
    (False, torch.float32, SdpaBackend.MATH),
    (False, torch.bfloat16, SdpaBackend.MATH),
    (True, torch.float32, SdpaBackend.EFFICIENT),
    (True, torch.bfloat16, SdpaBackend.CUDNN),
])
def test_the_measured_h200_choice(contiguous, dtype, backend):
    """benchmarks/groundtruth/h200_parallel_leases/t5_sdpa_choice.txt: torch 2.11.0+cu130, cuDNN
    9.19, H200: `torch._fused_sdp_choice(q, k, v, mask, 0.1, False, scale=1.0)` with q, k, v of
    shape (2, 8, 512, 64) and a float mask (1, 8, 512, 512): math for the mask permuted from (512,
    512, 8), memory-efficient (fp32) and cuDNN (bf16) for the contiguous one."""
    q, k, v = (torch.empty(2, 8, 512, 64, dtype=dtype, device="meta") for _ in range(3))
    bias = t5_position_bias(8, 512).to(dtype)
    mask = bias.contiguous() if contiguous else bias
    chosen = choose_backend((9, 0), q, k, v, mask, False, dropout_p=0.1, release=TORCH_2_11)
    assert chosen is backend


@pytest.mark.parametrize("release, capability, backend", [
    ("2.4.1", (9, 0), SdpaBackend.FLASH),
    ("2.5.0", (9, 0), SdpaBackend.CUDNN),  # cuDNN first on sm >= 9.0
    ("2.5.1", (9, 0), SdpaBackend.FLASH),  # made opt-in (#138522)
    ("2.6.0", (9, 0), SdpaBackend.FLASH),
    ("2.8.0", (9, 0), SdpaBackend.FLASH),
    ("2.9.0", (9, 0), SdpaBackend.CUDNN),  # #162073: sm 9.0 / 10.0
    ("2.9.1", (8, 0), SdpaBackend.FLASH),
    ("2.10.0", (9, 0), SdpaBackend.FLASH),  # bundled cuDNN below 9.15.1
    ("2.11.0+cu130", (9, 0), SdpaBackend.CUDNN),
    ("2.11.0", (10, 0), SdpaBackend.CUDNN),
    ("2.11.0", (8, 0), SdpaBackend.FLASH),
    ("2.11.0", (8, 9), SdpaBackend.FLASH),
])
def test_cudnn_priority_per_release_and_gpu(release, capability, backend):
    q, k, v = qkv(torch.bfloat16, head_dim=64, length=128)
    assert choose_backend(capability, q, k, v, None, release=parse_release(release)) is backend
    assert choose_backend(capability, q, k, v, None) is SdpaBackend.FLASH  # the default order


@pytest.mark.parametrize("release, variable, value", [
    ("2.9.0", "TORCH_CUDNN_SDPA_PREFERRED", "0"),
    ("2.11.0", "TORCH_CUDNN_SDPA_DEPRIORITIZED", "1"),
])
def test_the_environment_turns_the_preference_off(monkeypatch, release, variable, value):
    q, k, v = qkv(torch.bfloat16, head_dim=64, length=128)
    monkeypatch.setenv(variable, value)
    assert choose_backend((9, 0), q, k, v, None, release=parse_release(release)) is SdpaBackend.FLASH


@pytest.mark.parametrize("case, backend", [
    ("float32", SdpaBackend.EFFICIENT),  # cuDNN: fp16/bf16 only
    ("mask needing a gradient", SdpaBackend.EFFICIENT),  # cuDNN computes no dBias
    ("one key", SdpaBackend.FLASH),
    ("head size 12", SdpaBackend.FLASH),  # cuDNN: a multiple of 8
    ("head size 256", SdpaBackend.CUDNN),  # sm 9.0 with cuDNN >= 9.10
    ("3-D mask", SdpaBackend.EFFICIENT),  # check_attn_mask_shape: 2-D or 4-D
])
def test_what_cudnn_attention_refuses(case, backend):
    head_dim = {"head size 12": 12, "head size 256": 256}.get(case, 64)
    dtype = torch.float32 if case == "float32" else torch.bfloat16
    q = torch.empty(2, 4, 128, head_dim, dtype=dtype, device="meta")
    kv = torch.empty(2, 4, 1 if case == "one key" else 128, head_dim, dtype=dtype, device="meta")
    mask = None
    if case == "mask needing a gradient":
        mask = torch.zeros(128, 128, dtype=dtype, device="meta", requires_grad=True)
    elif case == "3-D mask":
        mask = torch.zeros(4, 128, 128, dtype=dtype, device="meta")
    assert choose_backend((9, 0), q, kv, kv, mask, release=TORCH_2_11) is backend


def cudnn_attention_job():
    def job():
        q, k, v = (torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        mask = torch.randn(1, 8, 512, 512, device="cuda", dtype=torch.bfloat16)
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1).sum().backward()

    return job


def test_cudnn_attention_forward_and_backward_bytes():
    """The worked bytes of one bf16 call, batch 2, 8 heads, 512 queries and keys, head size 64 on
    the H200 with torch 2.11 (attention.cu `_cudnn_attention_forward`, MHA.cpp):
    forward: the output in the query's layout (2 x 8 x 512 x 64 x 2 B = 1 MiB), the logsumexp
    (2, 8, 512, 1) float32 (32 KiB), the philox seed and offset (`at::empty({}, kLong)` on the
    device, 8 B each); backward: dQ, dK, dV (1 MiB each), the gradient of `sum()` (expanded,
    stride 0) copied into the output's layout (1 MiB), then the workspace: the float32 dQ
    accumulator (2 MiB) and softmax_sum (2 x 8 x 512 x 4 B = 32 KiB)."""
    result = capture_callable(cudnn_attention_job(), gpu=load_gpu("h200"), stack=load_stack("2.11"))
    assert result.error is None, result.error_text
    forward = [size for size, _ in allocations(result.trace, op="_scaled_dot_product_cudnn_attention.")]
    assert forward == [2**20, 2 * 8 * 512 * 4, 8, 8]
    backward = [size for size, _ in allocations(result.trace, op="_scaled_dot_product_cudnn_attention_backward")]
    assert backward == [2**20] * 3
    scratch = [size for size, _ in allocations(result.trace, op="cudnn_attention_backward")]
    assert scratch == [2**20, 2 * 2**20 + 2 * 8 * 512 * 4]


def test_the_target_release_decides_the_backend():
    """The same job estimated for torch 2.6 (default order: the mask rules out flash) takes
    memory-efficient attention and allocates nothing of cuDNN's."""
    from peakmem.capture.fake_memory import allocator_target

    with allocator_target(None, "2.6.3"):
        result = capture_callable(cudnn_attention_job(), gpu=load_gpu("h200"), stack=load_stack("2.6"))
    assert result.error is None, result.error_text
    ops = {tag.op for _, tag in allocations(result.trace)}
    assert "_scaled_dot_product_efficient_attention.default" in ops
    assert not any("cudnn_attention" in (op or "") for op in ops)


def test_cudnn_backward_workspace_bytes():
    assert cudnn_backward_workspace_bytes(2, 8, 512, 64) == 2 * 8 * 512 * (64 + 1) * 4
    assert cudnn_backward_workspace_bytes(2, 8, 512, 64, deterministic=True) == 2 * 8 * 512 * 4
