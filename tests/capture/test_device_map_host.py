"""Host and device meeting in the job's own calls (capture/device_map.py): data built from device
scalars, pinned host memory on a CPU-only torch, device-to-host copies into host tensors."""

import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def run(job, a100, stack24, mode="fake"):
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode=mode)
    assert result.error is None, result.error_text
    return result


def test_a_tensor_built_from_device_scalars_lands_on_the_device(a100, stack24):
    seen = {}

    def job():
        freqs = torch.empty(8, device="cuda", dtype=torch.float32)  # values not known
        scaled = torch.tensor([f / 2 for f in freqs], dtype=freqs.dtype, device=freqs.device)
        seen["device"], seen["shape"] = scaled.device, scaled.shape
        seen["host"] = torch.tensor([freqs[0], freqs[1]]).device  # no device: stays on the host

    result = run(job, a100, stack24)
    assert seen == {"device": torch.device("cuda", 0), "shape": torch.Size([8]),
                    "host": torch.device("cpu")}
    assert [size for size, _tag in allocations(result.trace, "input")] == [8 * 4]
    assert result.host_reads == 8 + 2  # each device scalar is read on the host, as CUDA does


def test_device_scalars_give_their_real_values_in_eager_mode(a100, stack24):
    seen = {}

    def job():
        freqs = torch.arange(1, 5, device="cuda", dtype=torch.float32)
        seen["values"] = torch.tensor([f * 2 for f in freqs], device="cuda").tolist()

    run(job, a100, stack24, mode="eager")
    assert seen["values"] == [2.0, 4.0, 6.0, 8.0]


def test_pinned_host_memory_works_on_a_cpu_only_torch_and_is_not_device_memory(a100, stack24):
    seen = {}

    def job():
        staging = torch.empty(1 << 20, pin_memory=True)  # fails on a CPU-only torch outside
        host = torch.randn(256, 1024)
        seen["before"] = host.is_pinned()
        batch = host.pin_memory()
        seen["devices"] = (staging.device, batch.device)
        seen["pinned"] = (staging.is_pinned(), batch.is_pinned(), batch.pin_memory() is batch)
        device = batch.to("cuda", non_blocking=True)
        seen["device_pinned"] = device.is_pinned()

    result = run(job, a100, stack24)
    assert seen["devices"] == (torch.device("cpu"), torch.device("cpu"))
    # as with CUDA: pinned tensors say so, an ordinary host tensor and a device tensor not
    assert seen["before"] is False
    assert seen["pinned"] == (True, True, True)
    assert seen["device_pinned"] is False
    assert [size for size, _tag in allocations(result.trace)] == [256 * 1024 * 4]


def test_a_device_to_host_copy_into_a_host_tensor_allocates_nothing_on_the_device(a100, stack24):
    seen = {}

    def job():
        device = torch.empty(256, device="cuda").fill_(3.0)  # unknown memory written: unknown
        host = torch.empty(256)
        returned = host.copy_(device, non_blocking=True)
        seen["same"], seen["device"] = returned is host, host.device
        seen["sum"] = float(host.sum())

    fake = run(job, a100, stack24)
    assert seen == {"same": True, "device": torch.device("cpu"), "sum": 0.0}  # placeholder zeros
    assert [size for size, _tag in allocations(fake.trace)] == [256 * 4]
    assert fake.host_reads == 1
    run(job, a100, stack24, mode="eager")
    assert seen["sum"] == 3.0 * 256


def test_a_device_tensor_built_from_host_data_reads_back_its_values_in_fake_mode(a100, stack24):
    """accelerate's `pad_across_processes` (Trainer's evaluation loop) sizes its padding from
    `torch.tensor(t.shape, device=t.device).cpu()`: zeros there made it pad to size 0 and fail."""
    seen = {}

    def job():
        logits = torch.empty(4, 32, device="cuda")
        sizes = torch.tensor(logits.shape, device=logits.device)[None]
        seen["sizes"] = sizes.cpu().tolist()
        seen["max"] = max(s[1] for s in sizes.cpu())
        written = torch.tensor([1.0, 2.0], device="cuda")
        written.mul_(torch.randn(2, device="cuda"))
        seen["written"] = written.tolist()  # changed by unknown values: no longer known
        seen["view"] = torch.tensor([5, 6], device="cuda")[1:].tolist()  # a view of known data

    result = run(job, a100, stack24)
    assert seen["sizes"] == [[4, 32]] and int(seen["max"]) == 32
    assert seen["written"] == [0.0, 0.0]
    assert seen["view"] == [6]
    assert result.host_reads == 1  # the written tensor; reads of known data are not counted


def test_a_host_tensor_moved_to_the_device_reads_back_its_values_in_fake_mode(a100, stack24):
    """accelerate's `synchronize_rng_state` (every prepared DataLoader under a distributed
    launch) copies a generator's state to the device, broadcasts it and sets it back from
    `.cpu()`: zeros there failed with "Invalid mt19937 state"."""
    seen = {}

    def job():
        generator = torch.Generator()
        generator.manual_seed(7)
        state = generator.get_state().to("cuda")
        generator.set_state(state.cpu())
        seen["draw"] = torch.randint(0, 1000, (3,), generator=generator).tolist()
        ids = torch.arange(6).reshape(2, 3)
        seen["ids"] = ids.cuda().tolist()
        seen["half"] = ids.to("cuda", dtype=torch.float16).cpu().tolist()
        moved = torch.ones(3).to("cuda")
        moved.add_(torch.randn(3, device="cuda"))  # written with unknown values: unknown
        seen["written"] = moved.tolist()
        weight = torch.nn.Parameter(torch.ones(3))
        seen["parameter"] = weight.to("cuda").tolist()  # parameters keep no host copy

    result = run(job, a100, stack24)
    reference = torch.Generator()
    reference.manual_seed(7)
    assert seen["draw"] == torch.randint(0, 1000, (3,), generator=reference).tolist()
    assert seen["ids"] == [[0, 1, 2], [3, 4, 5]]
    assert seen["half"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert seen["written"] == [0.0, 0.0, 0.0] and seen["parameter"] == [0.0, 0.0, 0.0]
    assert result.host_reads == 2


def test_device_tensors_made_under_inference_mode_keep_their_host_data(a100, stack24):
    """Lightning's evaluation loop (`trainer.test` / `validate` / `predict`, under
    `torch.inference_mode`) sums `torch.tensor(len(loader), device=root_device)` over the ranks:
    inference tensors have no version counter, and reading it failed ("Inference tensors do not
    track version counter")."""
    seen = {}

    def job():
        with torch.inference_mode():
            length = torch.tensor(7, device="cuda")
            seen["length"] = int(length)
            seen["moved"] = torch.arange(3).to("cuda").tolist()

    run(job, a100, stack24)
    assert seen == {"length": 7, "moved": [0, 1, 2]}
