"""`build_model` on the default device pushes no device context (each torch call of the build
then skips one torch-function mode), and elsewhere builds on the device asked for."""

import torch
from torch.utils._device import DeviceContext

from peakmem.datasets import gpumemnet_models
from peakmem.datasets.gpumemnet_jobs import CNNJob

JOB = CNNJob(3, 10, 4, "pyramid", 128, 2, 8, "relu", 0.0, False, False)


def contexts_seen_while_building(monkeypatch, device):
    seen = []
    builder = gpumemnet_models._BUILDERS[CNNJob]

    def spying(job):
        stack = torch.overrides._get_current_function_mode_stack()
        seen.append([m.device for m in stack if isinstance(m, DeviceContext)])
        return builder(job)

    monkeypatch.setitem(gpumemnet_models._BUILDERS, CNNJob, spying)
    model = gpumemnet_models.build_model(JOB, device)
    return model, seen[0]


def test_a_build_on_the_default_device_pushes_no_device_context(monkeypatch):
    model, contexts = contexts_seen_while_building(monkeypatch, "cpu")
    assert contexts == []
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_a_build_elsewhere_runs_in_its_device_context(monkeypatch):
    model, contexts = contexts_seen_while_building(monkeypatch, "meta")
    assert contexts == [torch.device("meta")]
    assert {p.device.type for p in model.parameters()} == {"meta"}
    cpu = gpumemnet_models.build_model(JOB, "cpu")
    assert [(n, p.shape, p.dtype) for n, p in model.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in cpu.named_parameters()]
