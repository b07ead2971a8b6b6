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
