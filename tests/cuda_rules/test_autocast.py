import torch

from peakmem.capture import capture_callable
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
