"""Per-library patches for the fake device (capture/library_patches.py)."""

import io
import os

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


def test_hydra_main_raises_the_jobs_error_during_a_capture(monkeypatch):
    """`@hydra.main` turns the job's exception into `sys.exit(1)`; under the capture the
    exception itself comes out (HYDRA_FULL_ERROR=1), and the variable is restored after."""
    run_and_report = pytest.importorskip("hydra._internal.utils").run_and_report
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)

    def job():
        raise RuntimeError("Detected more unique values in `target` than expected")

    with pytest.raises(SystemExit):
        run_and_report(job)  # what Hydra does outside the capture
    with library_patches(), pytest.raises(RuntimeError, match="more unique values"):
        run_and_report(job)
    assert "HYDRA_FULL_ERROR" not in os.environ


def test_pickling_a_module_on_the_fake_device_succeeds_as_on_a_gpu(a100, stack24):
    """Lightning's `is_picklable(net)` (`pickle.dumps`) of a module on the device: its meta
    tensors pickle as their geometry, and unpickle as new device memory of that geometry."""
    import pickle

    seen = {}

    def job():
        net = _model().cuda()
        blob = pickle.dumps(net)
        copy = pickle.loads(blob)
        seen["devices"] = {str(p.device) for p in copy.parameters()}
        seen["shapes"] = [tuple(p.shape) for p in copy.parameters()]
        seen["host"] = pickle.loads(pickle.dumps(torch.ones(3)))  # host tensors as before

    result = _run(job, a100, stack24)
    assert result.fake_limit is None  # nothing failed on the fake device
    assert seen["devices"] == {"cuda:0"}
    assert seen["shapes"] == [(256, 64), (256,), (8, 256), (8,)]
    assert torch.equal(seen["host"], torch.ones(3))


def test_torch_save_of_device_tensors_still_loads_with_weights_only(a100, stack24, tmp_path):
    """The pickling above leaves torch.save alone: its file holds torch's own meta rebuild,
    which `torch.load(weights_only=True)` accepts."""
    seen = {}

    def job():
        net = _model().cuda()
        torch.save(net.state_dict(), tmp_path / "ckpt.pt")
        state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        seen["shapes"] = [tuple(t.shape) for t in state.values()]
        buffer = io.BytesIO()  # Lightning's _atomic_save writes the checkpoint here first
        torch.save(net.state_dict(), buffer)
        buffer.seek(0)
        seen["buffered"] = [tuple(t.shape) for t in torch.load(buffer, weights_only=True).values()]

    result = _run(job, a100, stack24)
    assert result.fake_limit is None
    assert seen["shapes"] == [(256, 64), (256,), (8, 256), (8,)]
    assert seen["buffered"] == seen["shapes"]
