import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def test_unique_runs_in_fake_mode_bounded_from_above(a100, stack24):
    """`torch.unique` has no meta kernel in torch: fake mode used to stop the job there (auto
    mode then reran it in eager). Every element counts as distinct; the inverse is shaped like
    the input; an output not asked for is empty, as CUDA returns it."""
    seen = {}

    def job():
        x = torch.randint(0, 10, (1000,), device="cuda")
        plain = torch.unique(x)
        values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
        seen["shapes"] = [tuple(t.shape) for t in (plain, values, inverse, counts)]

    result = capture_callable(job, gpu=a100, stack=stack24, mode="fake")
    assert result.error is None, result.error_text
    assert seen["shapes"] == [(1000,), (1000,), (1000,), (1000,)]
    unique = [size for size, tag in allocations(result.trace) if tag.op.startswith("_unique2")]
    assert unique == [8000] * 4  # plain; values, inverse, counts (empty outputs allocate nothing)


def test_bincount_with_minlength_runs_on_fake_tensors(a100, stack24):
    # torchmetrics' classification metrics count with `torch.bincount(x, minlength=...)`
    # (a confusion matrix: num_classes ** 2 bins); torch has no meta kernel for it
    seen = {}

    def job():
        target = torch.randint(0, 4, (64,), device="cuda")
        preds = torch.randint(0, 4, (64,), device="cuda")
        counts = torch.bincount(target * 4 + preds, minlength=16)
        weighted = torch.bincount(target, weights=torch.rand(64, device="cuda"), minlength=4)
        seen["counts"] = (counts.shape, counts.dtype, counts.device.type)
        seen["weighted"] = (weighted.shape, weighted.dtype)

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode="fake")
    assert result.error is None, result.error_text
    assert seen == {"counts": (torch.Size([16]), torch.long, "cuda"),
                    "weighted": (torch.Size([4]), torch.float)}
    assert result.fake_limit is None


def test_bincount_without_minlength_stays_a_fake_limit(a100, stack24):
    def job():
        torch.bincount(torch.randint(0, 4, (64,), device="cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode="fake")
    assert result.fake_limit is not None and "aten::bincount" in result.fake_limit
