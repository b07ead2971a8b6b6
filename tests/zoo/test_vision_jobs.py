"""The timm and xMem-CNN zoo jobs (benchmarks/zoo/timm_train.py, xmem_cnn.py): rows map to their
commands where the optional package is installed and say which package they need where it is
not; each job trains end to end under peakmem with a stub `timm` / `torchvision` module."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest
import torch
from torch import nn

from peakmem.baselines import peakmem_estimator as pe
from peakmem.baselines.base import CannotEstimate
from peakmem.datasets.rows import BenchRow

GPU, TORCH = "rtx3060-12gb", "2.6.0"


def _row(dataset: str, model: str, **features: str) -> BenchRow:
    job = {"model": model, "batch_size": 16}
    if dataset == "xmem":
        job.update(library="torchvision/transformers", optimizer="RMSprop")
    else:
        job.update(library="timm")
    return BenchRow(
        id="00000", dataset=dataset, family=model, job=job, measured_peak_bytes=1, status="ok",
        gpu=GPU, torch_version=TORCH, gpu_total_bytes=1, features=dict(features),
    )


@pytest.fixture
def installed(monkeypatch):
    """Pretend the named optional packages are (or are not) installed."""
    present: set[str] = set()
    monkeypatch.setattr(pe, "has_package", lambda name: name in present)
    return present


def test_has_package_checks_without_importing():
    assert pe.has_package("torch")
    assert not pe.has_package("surely_not_a_package_xyz")


def test_timm_rows_map_to_the_timm_job(installed):
    installed.add("timm")
    assert pe.job_command(_row("timm", "convnext_tiny")) == [
        "python", str(pe.TIMM_JOB), "--model", "convnext_tiny", "--batch-size", "16",
    ]


def test_timm_rows_need_timm(installed):
    with pytest.raises(CannotEstimate, match="needs the optional `timm` package"):
        pe.job_command(_row("timm", "convnext_tiny"))


def test_xmem_cnn_rows_map_to_the_cnn_job(installed):
    installed.add("torchvision")
    assert pe.job_command(_row("xmem", "MobeNetV3Small", zero_grad_mode_recorded="1.0")) == [
        "python", str(pe.XMEM_CNN_JOB), "--model", "MobeNetV3Small", "--batch-size", "16",
        "--optimizer", "RMSprop", "--zero-grad-mode", "1",
    ]


@pytest.mark.parametrize(("recorded", "mode"), [("", "1"), ("0", "0"), ("2.0", "2")])
def test_xmem_cnn_rows_without_a_recorded_mode_use_model_trainers_default(installed, recorded, mode):
    # xMem's FastRunner.train_on_gpu left ModelTrainer's default zero_grad_mode=1 in place on the
    # runs that recorded no mode; a recorded mode is used as recorded
    installed.add("torchvision")
    command = pe.job_command(_row("xmem", "ResNet50", zero_grad_mode_recorded=recorded))
    assert command[-2:] == ["--zero-grad-mode", mode]
    assert pe.XMEM_CNN_UNRECORDED_ZERO_GRAD_MODE == 1


def test_xmem_cnn_rows_need_torchvision(installed):
    installed.add("timm")  # the wrong one
    with pytest.raises(CannotEstimate, match="needs the optional `torchvision` package"):
        pe.job_command(_row("xmem", "ResNet50"))


def test_dataset_rows_say_why_without_the_packages(installed, shared_data):
    from peakmem.datasets.loaders import load_rows

    for name, package in (("timm", "timm"), ("xmem", "torchvision")):
        rows = load_rows(name, shared_data)
        cnn = [r for r in rows if name == "timm" or r.job["model"] in pe.XMEM_CNNS]
        assert cnn
        for row in cnn:
            with pytest.raises(CannotEstimate, match=f"optional `{package}`"):
                pe.job_command(row)
        installed.add(package)
        assert {pe.job_command(r)[1] for r in cnn} == {
            str(pe.TIMM_JOB if name == "timm" else pe.XMEM_CNN_JOB)
        }


def test_xmem_cnn_knows_every_xmem_model():
    sys.path.insert(0, str(pe.ZOO))
    try:
        import xmem_cnn
    finally:
        sys.path.remove(str(pe.ZOO))
    assert set(xmem_cnn.MODELS) == pe.XMEM_CNNS
    # xMem's MobileNetV3s and MnasNet have CIFAR-10's 10 classes; the others torchvision's 1000
    assert {k for k, (_, c) in xmem_cnn.MODELS.items() if c == 10} == {
        "MobeNetV3Small", "MobeNetV3Large", "MnasNet"}
    assert xmem_cnn.resolve("ResNet50") == ("resnet50", 1000)


# ---- end to end, with stub packages --------------------------------------------------------

class TinyNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def _allocated(model: nn.Module) -> int:
    """The model's float32 parameters as the caching allocator holds them (512-byte blocks)."""
    return sum(-(-p.numel() * 4 // 512) * 512 for p in model.parameters())


def _module(monkeypatch, name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _capture(argv: list[str]):
    from peakmem.capture import capture_command
    from peakmem.profiles import load_gpu, load_stack

    # a step limit above the jobs' own: each runs to its end
    return capture_command(argv, gpu=load_gpu(GPU), stack=load_stack(TORCH), steps=50)


def test_timm_job_trains_with_a_stub_timm(monkeypatch):
    calls = []

    def create_model(name, pretrained=False):
        calls.append((name, pretrained, torch.get_default_device().type))
        model = TinyNet(num_classes=7)
        model.pretrained_cfg = {"input_size": (3, 40, 40), "num_classes": 7}
        return model

    _module(monkeypatch, "timm", create_model=create_model)
    capture = _capture(["python", str(pe.TIMM_JOB), "--model", "stubnet", "--batch-size", "4",
                        "--steps", "3"])
    assert capture.error is None, capture.error_text
    assert calls == [("stubnet", False, "cuda")]  # built on the (fake) device, no host copy
    assert capture.steps == 3
    params = _allocated(TinyNet(7))
    est = _estimate(capture)
    assert est.breakdown.by_category.get("parameter") == params
    # Adam (the assumed optimizer): two moments per parameter
    assert est.breakdown.by_category.get("optimizer_state", 0) >= 2 * params


def test_xmem_cnn_job_trains_with_a_stub_torchvision(monkeypatch):
    calls = []

    def get_model(name, weights=None, num_classes=1000):
        calls.append((name, weights, num_classes))
        return TinyNet(num_classes)

    models = _module(monkeypatch, "torchvision.models", get_model=get_model)
    _module(monkeypatch, "torchvision", models=models)
    capture = _capture(["python", str(pe.XMEM_CNN_JOB), "--model", "MnasNet", "--batch-size", "4",
                        "--optimizer", "Adagrad", "--image-size", "16"])
    assert capture.error is None, capture.error_text
    assert calls == [("mnasnet1_0", None, 10)]
    assert capture.steps == 4  # xMem's loop: 4 steps
    params = _allocated(TinyNet(10))
    est = _estimate(capture)
    assert est.breakdown.by_category.get("parameter") == params
    assert est.breakdown.by_category.get("optimizer_state", 0) >= params  # Adagrad's state_sum


def _estimate(capture):
    from peakmem.estimate.api import estimate_capture
    from peakmem.profiles import load_gpu, load_stack

    return estimate_capture(capture, load_gpu(GPU), load_stack(TORCH), torch_version=TORCH)
