import pytest
import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def adam_job(**options):
    def job():
        model = torch.nn.Linear(32, 32).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), **options)
        model(torch.randn(4, 32, device="cuda")).sum().backward()
        optimizer.step()

    return job


def optimizer_ops(result):
    return [tag.op for _, tag in allocations(result.trace, phase="optimizer")]


def test_adam_defaults_to_foreach_as_on_cuda(a100, stack24):
    result = capture_callable(adam_job(), gpu=a100, stack=stack24)
    ops = optimizer_ops(result)
    # foreach: one sqrt temporary per parameter, allocated together
    assert ops.count("_foreach_sqrt.default") == 2
    temporaries = [size for size, tag in allocations(result.trace, "temporary", phase="optimizer")]
    assert sorted(temporaries) == [32 * 4, 32 * 32 * 4]


def test_explicit_foreach_false_is_respected(a100, stack24):
    result = capture_callable(adam_job(foreach=False), gpu=a100, stack=stack24)
    assert not any(op.startswith("_foreach") for op in optimizer_ops(result))


@pytest.mark.parametrize("options", [{"fused": True}])
def test_fused_adam_is_accepted_and_allocates_only_state(a100, stack24, options):
    result = capture_callable(adam_job(**options), gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert allocations(result.trace, "temporary", phase="optimizer") == []
    # fused keeps its step counters on the device (4 bytes each) next to the two moments
    sizes = sorted(size for size, _ in allocations(result.trace, "optimizer_state"))
    assert sizes == [4, 4, 32 * 4, 32 * 4, 32 * 32 * 4, 32 * 32 * 4]
