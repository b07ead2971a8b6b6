import torch

from peakmem.capture import capture_callable
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations


def test_autocast_casts_linear_inputs_and_caches_weight_casts(a100, stack24):
    seen = {}

    def job():
        model = torch.nn.Linear(64, 32).cuda()
        x = torch.randn(8, 64, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            first = model(x)
            second = model(x)
            seen["dtypes"] = (first.dtype, second.dtype)
            seen["loss"] = torch.nn.functional.cross_entropy(first, torch.zeros(8, dtype=torch.long, device="cuda")).dtype
            seen["softmax"] = torch.softmax(first, dim=-1).dtype
            seen["mm"] = torch.mm(x, x.t()).dtype
        seen["outside"] = model(x).dtype

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen["dtypes"] == (torch.bfloat16, torch.bfloat16)
    assert seen["loss"] == torch.float32 and seen["softmax"] == torch.float32
    assert seen["mm"] == torch.bfloat16 and seen["outside"] == torch.float32
    casts = [size for size, tag in allocations(result.trace, op="_to_copy") if tag.phase == "forward"]
    # weight (64*32) and bias (32) cast once for both calls; the input cast per call (8*64), x for mm
    assert sorted(casts).count(64 * 32 * 2) == 1 and sorted(casts).count(32 * 2) == 1


def test_weight_cast_cache_is_cleared_when_autocast_exits(a100, stack24):
    def job():
        model = torch.nn.Linear(64, 32, bias=False).cuda()
        x = torch.randn(8, 64, device="cuda")
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.float16):
                model(x)

    result = capture_callable(job, gpu=a100, stack=stack24)
    weight_casts = [size for size, _ in allocations(result.trace, op="_to_copy") if size == 64 * 32 * 2]
    assert len(weight_casts) == 2


def test_fp32_list_ops_run_in_float32_under_autocast(a100, stack24):
    """autocast_mode.h AT_FORALL_FP32: pow, exp, log, rsqrt, ... cast to float32 under CUDA
    autocast; in-place variants and code outside autocast keep the input's dtype."""
    seen = {}

    def job():
        x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            seen["pow"] = torch.pow(x, 3.0).dtype
            seen["**"] = (x ** 2).dtype
            seen["exp"] = x.exp().dtype
            seen["rsqrt"] = torch.rsqrt(x).dtype
            seen["softplus"] = torch.nn.functional.softplus(x).dtype
            seen["promoted"] = (x + torch.pow(x, 3.0)).dtype
            seen["relu"] = torch.relu(x).dtype
            seen["in_place"] = x.clone().pow_(2).dtype
            seen["out"] = torch.exp(x, out=torch.empty_like(x)).dtype
        seen["outside"] = torch.pow(x, 3.0).dtype

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    fp32 = ("pow", "**", "exp", "rsqrt", "softplus", "promoted")
    assert {k: seen[k] for k in fp32} == dict.fromkeys(fp32, torch.float32)
    assert seen["relu"] == seen["in_place"] == seen["out"] == seen["outside"] == torch.bfloat16


def test_gelu_new_saves_its_float32_tail_under_bf16_autocast(a100, stack24):
    """transformers' gelu_new under bf16 autocast: torch.pow makes the tail float32, so tanh's
    saved output is a float32 tensor (as on the H200 GPT-2 runs: the capture was 24 B per MLP
    hidden element and token under before)."""
    transformers_activations = __import__("transformers.activations", fromlist=["x"])

    def job():
        x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = transformers_activations.NewGELUActivation()(x)
        out.float().sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    tanh = [size for size, tag in allocations(result.trace, op="tanh") if tag.phase == "forward"]
    assert tanh == [16 * 256 * 4]


def test_cross_entropy_keeps_bf16_log_probabilities_and_casts_them_for_nll_loss():
    """CUDA autocast has no entry for `cross_entropy_loss` (autocast_mode.cpp: it is on the CPU's
    fp32 list only): the composite calls `log_softmax(x, 1, x.scalar_type())`, whose explicit
    dtype autocast's fp32_set_opt_dtype policy leaves alone, so the log-probabilities are bf16
    (2 B per logit); `nll_loss` is on the fp32 list and casts them to float32 (4 B, saved for
    its backward). Per logit: 2 + 4 B, not a float32 copy of the logits plus float32
    log-probabilities (4 + 4 B: one bf16 logits tensor more, +955 MiB at the peak of BERT-large
    bf16 batch 32 at seq 512 on the H200)."""
    rows, vocab = 1024, 1000

    def job():
        head = torch.nn.Linear(64, vocab, bias=False).cuda()
        x = torch.randn(rows, 64, device="cuda", requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(
                head(x), torch.zeros(rows, dtype=torch.long, device="cuda"))
        assert loss.dtype == torch.float32
        loss.backward()

    result = capture_callable(job, gpu=load_gpu("h200"), stack=load_stack("2.11"))
    assert result.error is None, result.error_text
    logits = rows * vocab
    forward = allocations(result.trace, phase="forward")
    assert [size for size, tag in forward if tag.op == "_log_softmax.default"] == [2 * logits]
    casts = [size for size, tag in forward if tag.op == "_to_copy.default"]
    assert casts.count(4 * logits) == 1  # nll_loss's float32 input; the logits are never cast
