"""Tensors a job makes on the meta device on purpose are not device memory, however it makes
them (issue 20: a 4 GiB meta Linear showed up as 4 GiB allocated)."""

import pytest
import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

N = 8192  # a 256 MiB fp32 weight: it must not appear


def build(how):
    if how == "kwarg":
        return torch.nn.Linear(N, N, device="meta")
    if how == "device_object":
        return torch.nn.Linear(N, N, device=torch.device("meta"))
    if how == "context":
        with torch.device("meta"):
            return torch.nn.Linear(N, N)
    if how == "default_device":
        torch.set_default_device("meta")
        try:
            return torch.nn.Linear(N, N)
        finally:
            torch.set_default_device("cpu")
    if how == "init_empty_weights":
        from accelerate import init_empty_weights

        with init_empty_weights():
            return torch.nn.Linear(N, N)
    if how == "to_meta":
        return torch.nn.Linear(N, N).to("meta")
    if how == "like_a_device_tensor":
        source = torch.empty(N, N, device="cuda")
        made = torch.empty_like(source, device="meta")
        del source
        return made
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    ["kwarg", "device_object", "context", "default_device", "init_empty_weights", "to_meta",
     "like_a_device_tensor"],
)
def test_the_jobs_own_meta_tensors_are_not_device_memory(a100, stack24, how):
    kept = []

    def job():
        made = build(how)
        kept.append(made)
        # shape arithmetic on them stays on the meta device too
        weight = made.weight if isinstance(made, torch.nn.Module) else made
        (weight @ weight.t() + 1).sum()
        small = torch.nn.Linear(64, 64).cuda()
        small(torch.randn(8, 64, device="cuda")).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    big = [size for size, _tag in allocations(result.trace) if size >= N * N]
    if how == "like_a_device_tensor":
        assert big == [N * N * 4]  # the cuda source, not its meta twin
    else:
        assert big == []
    item = kept[0]
    weight = item.weight if isinstance(item, torch.nn.Module) else item
    assert weight.is_meta
