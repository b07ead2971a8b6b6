"""Per-library patches for the fake device (capture/library_patches.py)."""

import pytest
import torch
from torch import nn

from peakmem.capture import capture_callable
from peakmem.capture.device_view import JOB_DEVICE
from peakmem.capture.library_patches import LIBRARY_PATCHES, library_patches, patched
from peakmem.estimate import estimate


def _run(job, gpu, stack, **kwargs):
    result = capture_callable(job, gpu=gpu, stack=stack, **kwargs)
    assert result.error is None, result.error_text
    return result


def _model():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))


def train(wrap):
    model = wrap(_model().cuda())
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(3):
        x, y = torch.randn(32, 64).cuda(), torch.randint(0, 8, (32,)).cuda()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_data_parallel_on_one_device_trains_like_the_bare_module():
    plain = estimate(train, lambda m: m, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    wrapped = estimate(train, nn.DataParallel, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    assert wrapped.steps == 3
    assert wrapped.peak_allocated_bytes == plain.peak_allocated_bytes
    assert wrapped.breakdown.by_category == plain.breakdown.by_category


def test_data_parallel_checks_its_parameters_on_cuda_0(a100, stack24):
    seen = {}

    def job():
        model = nn.DataParallel(_model().cuda(), device_ids=[0])
        seen["src"] = model.src_device_obj
        out = model(torch.randn(4, 64, device="cuda"))
        seen["out"] = (out.shape, out.device)

    _run(job, a100, stack24)
    assert seen == {"src": JOB_DEVICE, "out": (torch.Size([4, 8]), JOB_DEVICE)}


def test_lightning_fabric_accepts_the_model(a100, stack24):
    fabric_module = pytest.importorskip("lightning.fabric")
    seen = {}

    def job():
        fabric = fabric_module.Fabric(accelerator="cuda", devices=1, precision="16-mixed")
        fabric.launch()
        model = _model()
        model, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters()))
        seen["device"] = (fabric.device, next(model.parameters()).device)
        for _ in range(3):
            x = torch.randn(8, 64, device=fabric.device)
            loss = model(x).float().sum()
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    result = _run(job, a100, stack24)
    assert seen["device"] == (JOB_DEVICE, JOB_DEVICE)
    assert result.steps == 3


def test_every_patch_is_undone_after_the_capture():
    before = {
        "scatter": nn.DataParallel.scatter,
        "save": torch.save,
        "parse_to": torch._C._nn._parse_to,
    }
    with library_patches():
        assert nn.DataParallel.scatter is not before["scatter"]
        assert torch.save is not before["save"]
        assert torch._C._nn._parse_to is not before["parse_to"]
    after = {
        "scatter": nn.DataParallel.scatter,
        "save": torch.save,
        "parse_to": torch._C._nn._parse_to,
    }
    assert after == before
    assert {"data_parallel_one_device", "module_to_device_ordinal", "meta_storage_addresses"} <= set(
        LIBRARY_PATCHES
    )


def test_patched_removes_an_attribute_it_shadowed_on_a_subclass():
    class Base:
        def f(self):
            return "base"

    class Child(Base):
        pass

    with patched(Child, "f", lambda self: "patched"):
        assert Child().f() == "patched"
    assert "f" not in vars(Child) and Child().f() == "base"


def test_accelerate_trains_in_fp16(a100, stack24):
    """Accelerate places the model by `device` and runs its GradScaler on `cuda`: no patch
    needed once device tensors report cuda:0 (on meta devices its inf checks went missing)."""
    accelerate = pytest.importorskip("accelerate")
    seen = {}

    def job():
        accelerator = accelerate.Accelerator(mixed_precision="fp16")
        model = _model()
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
        seen["device"] = next(model.parameters()).device
        for _ in range(3):
            loss = model(torch.randn(8, 64, device=accelerator.device)).float().sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    result = _run(job, a100, stack24)
    assert seen["device"] == JOB_DEVICE
    assert result.steps == 3


def test_lstm_trains_without_a_cudnn_warning(a100, stack24, recwarn):
    def job():
        model = nn.LSTM(16, 32, num_layers=2, batch_first=True).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        for _ in range(3):
            out, _ = model(torch.randn(4, 10, 16, device="cuda"))
            out.sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    assert _run(job, a100, stack24).steps == 3
    assert not [w for w in recwarn if "cuDNN" in str(w.message)]
