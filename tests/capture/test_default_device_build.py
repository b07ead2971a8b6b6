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


def _names_job(seen: dict) -> None:
    """pytorch/tutorials char_rnn_classification_tutorial.py's idioms after
    `set_default_device("cuda")`: labels from host data (`torch.tensor([i])`), one-hot rows
    written in place, both printed, and a device Generator for `random_split`."""
    torch.set_default_device("cuda")
    label = torch.tensor([2], dtype=torch.long)
    line = torch.zeros(3, 1, 5)
    line[1][0][4] = 1
    seen["text"] = f"{label} {line}"
    seen["repr"] = repr((label, line))
    seen["devices"] = (label.device.type, line.device.type)
    seen["label"] = label.item()
    generator = torch.Generator(device="cuda").manual_seed(0)
    seen["split"] = [len(part) for part in torch.utils.data.random_split(range(10), [0.8, 0.2],
                                                                         generator=generator)]


def test_default_device_cuda_tensors_print_and_keep_their_data(a100, stack24):
    """Printing a tensor made on the job's default device raised in fake mode (the capture's
    placeholder zeros were made on the default device, meta, and `_tensor_str`'s
    `masked_select` has no meta kernel); `torch.tensor(data)` went to the device out of the
    capture's sight, so a host read of it gave zeros, not its data."""
    seen = {}
    result = capture_callable(lambda: _names_job(seen), gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen["devices"] == ("cuda", "cuda")
    assert "device='cuda:0'" in seen["text"] and seen["repr"].startswith("(tensor([0], device='cuda:0')")
    assert seen["label"] == 2  # the data it was made from, read back
    assert seen["split"] == [8, 2]
    sizes = [size for size, _ in allocations(result.trace)]
    assert sizes[:2] == [8, 60]  # the label and the one-hot line: device allocations


def test_default_device_cuda_tensors_print_real_values_in_eager_mode(a100, stack24):
    """Eager mode: a tensor made from host data on the default device has a shadow with that
    data (before: none, and making zeros for it on the default device raised)."""
    seen = {}
    result = capture_callable(lambda: _names_job(seen), gpu=a100, stack=stack24, mode="eager")
    assert result.error is None, result.error_text
    assert seen["repr"].startswith("(tensor([2], device='cuda:0'), tensor([[[0., 0., 0., 0., 0.]],")
    assert "[[0., 0., 0., 0., 1.]]" in seen["repr"]
    assert seen["label"] == 2
