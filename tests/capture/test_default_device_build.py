"""A model built after `torch.set_default_device("cuda")` (notebooks, lit-style scripts) has its
large parameters on the device: the default-device mode sits below the capture's modes, so the
host deferral of tensors made while a model is built must not take them for host tensors."""

import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def test_default_device_cuda_model_weights_are_device_allocations(a100, stack24):
    seen = {}

    def job():
        torch.set_default_device("cuda")
        model = torch.nn.Sequential(torch.nn.Linear(1024, 256), torch.nn.Linear(256, 8))
        seen["devices"] = {p.device.type for p in model.parameters()}
        with torch.device("cpu"):
            seen["cpu_context"] = torch.nn.Linear(1024, 256).weight.device.type
        model(torch.randn(4, 1024)).sum().backward()
        seen["grad"] = model[0].weight.grad.device.type

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"devices": {"cuda"}, "cpu_context": "cpu", "grad": "cuda"}
    sizes = [size for size, _ in allocations(result.trace)]
    assert sizes[:4] == [1024 * 256 * 4, 256 * 4, 8 * 256 * 4, 8 * 4]  # the model, as built
