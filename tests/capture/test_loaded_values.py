"""Loaded device tensors larger than HOST_DATA_MAX_ELEMENTS keep their values for host reads in
fake mode, read lazily from the checkpoint (capture/host_deferred.py, device_map.py
`give_lazy_host_data`): a step counter or a mask whose values steer the job. Up to
LOADED_VALUES_MAX_BYTES per tensor; beyond, placeholders as before."""

from __future__ import annotations

import pytest
import torch

from peakmem.capture import capture_callable, device_map

BIG = 70_000  # more elements than HOST_DATA_MAX_ELEMENTS (65,536)


def run(job, a100, stack24):
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode="fake")
    assert result.error is None, result.error_text
    return result


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    steps = torch.arange(BIG, dtype=torch.long) * 3
    mask = torch.arange(BIG) % 7 == 0
    torch.save({"steps": steps, "mask": mask, "weights": torch.ones(BIG)}, path)
    return path, int(steps[-1]), int(mask.sum())


def test_a_large_tensor_loaded_onto_the_device_reads_its_values(a100, stack24, checkpoint):
    path, last_step, selected = checkpoint
    seen = {}

    def job():
        state = torch.load(path, map_location="cuda")
        seen["device"] = state["steps"].device.type
        seen["last"] = int(state["steps"][-1])
        seen["selected"] = int(state["mask"].cpu().sum())
        seen["weight"] = state["weights"].tolist()[:2]

    run(job, a100, stack24)
    assert seen == {"device": "cuda", "last": last_step, "selected": selected,
                    "weight": [1.0, 1.0]}


def test_loaded_on_the_host_then_moved(a100, stack24, checkpoint):
    path, last_step, selected = checkpoint
    seen = {}

    def job():
        state = torch.load(path)
        steps = state["steps"].to("cuda")
        seen["last"] = steps[-1].item()
        mask = state["mask"].cuda()
        seen["selected"] = int(mask.cpu().sum())
        steps.add_(torch.randn(BIG, device="cuda").long())  # written on the device: unknown
        seen["after_write"] = steps[-1].item()

    run(job, a100, stack24)
    assert seen == {"last": last_step, "selected": selected, "after_write": 0}


def test_safetensors_loaded_onto_the_device(a100, stack24, tmp_path):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "model.safetensors"
    save_file({"table": torch.arange(BIG, dtype=torch.int32)}, str(path))
    seen = {}

    def job():
        table = load_file(str(path), device="cuda")["table"]
        seen["values"] = table[-2:].tolist()

    run(job, a100, stack24)
    assert seen["values"] == [BIG - 2, BIG - 1]


def test_beyond_the_bound_the_values_are_placeholders(a100, stack24, checkpoint, monkeypatch):
    path, _last_step, _selected = checkpoint
    monkeypatch.setattr(device_map, "LOADED_VALUES_MAX_BYTES", BIG * 8 - 1)
    seen = {}

    def job():
        state = torch.load(path, map_location="cuda")
        seen["last"] = int(state["steps"][-1])  # int64: BIG * 8 bytes, over the bound
        seen["weight"] = state["weights"][0].item()  # float32: BIG * 4 bytes, within it

    result = run(job, a100, stack24)
    assert seen == {"last": 0, "weight": 1.0}
    assert result.host_reads == 1
