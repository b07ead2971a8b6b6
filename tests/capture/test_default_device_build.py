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


def test_default_device_cuda_host_reads_in_eager_mode(a100, stack24, tmp_path):
    """Eager mode's host copies of device values are host tensors whatever the job's default
    device: before, `.cpu()` after `set_default_device("cuda")` raised (a meta view was set to
    a CPU storage), e.g. a checkpoint's RNG state loaded with `map_location="cuda"`."""
    path = tmp_path / "state.pt"
    torch.save({"rng": torch.get_rng_state()}, path)
    seen = {}

    def job():
        torch.set_default_device("cuda")
        state = torch.load(path, map_location="cuda")["rng"]
        host = state.cpu()
        torch.set_rng_state(host)
        seen["host"] = (host.device.type, host.dtype, tuple(host.shape))
        seen["value"] = (torch.arange(3) * 2).tolist()

    result = capture_callable(job, gpu=a100, stack=stack24, mode="eager")
    assert result.error is None, result.error_text
    assert seen == {"host": ("cpu", torch.uint8, tuple(torch.get_rng_state().shape)),
                    "value": [0, 2, 4]}
