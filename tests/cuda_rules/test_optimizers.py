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


def fused_job(optimizer_class, **options):
    def job():
        model = torch.nn.Linear(32, 32).cuda()
        optimizer = optimizer_class(model.parameters(), fused=True, **options)
        for _ in range(2):
            model(torch.randn(4, 32, device="cuda")).sum().backward()
            optimizer.step()

    return job


@pytest.mark.parametrize(("optimizer_class", "options", "state"), [
    # momentum buffers, made by empty_like on the first step (SGD's own Python)
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}, [32 * 4, 32 * 32 * 4]),
    (torch.optim.SGD, {"lr": torch.tensor(0.1, device="cpu")}, []),  # the tensor_lr overload
    # Adagrad: state_sum per parameter and its step on the device
    (torch.optim.Adagrad, {"lr": 0.1}, [4, 4, 32 * 4, 32 * 32 * 4]),
])
def test_fused_sgd_and_adagrad_run_in_place_on_the_fake_device(a100, stack24, optimizer_class,
                                                                options, state):
    # torch has no meta kernel for _fused_sgd_ / _fused_adagrad_ (it has them for Adam / AdamW):
    # fake mode stopped with "aten::_fused_sgd_ has no meta kernel" (airbench's fused SGD)
    result = capture_callable(fused_job(optimizer_class, **options), gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert allocations(result.trace, "temporary", phase="optimizer") == []
    assert sorted(size for size, _ in allocations(result.trace, "optimizer_state")) == state
