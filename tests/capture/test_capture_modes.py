"""One torch-function mode for the capture (capture/capture_modes.py, issue 14): the same estimate,
every trace event and tag and the trace's metadata (utilization record included), as the host
deferral and the device map stacked as two modes, and as every call taken the stacked way."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils.data import DataLoader, Dataset

from peakmem.capture import capture_modes, device_map, host_deferred
from peakmem.capture.capture_modes import CaptureModes
from peakmem.estimate import estimate
from tests.capture.capture_helpers import small_cnn_training_job as cnn_job
from tests.capture.capture_helpers import two_stacked_modes


class _Draws(Dataset):
    """Samples drawn on the host in `__getitem__` (lazily drawn by the capture)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return torch.randn(4, 32, 32), torch.randint(0, 10, ()).item()


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(4096, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.body(x))


def deferral_job() -> None:
    model = _Net()  # its large weights are built host-deferred
    first = float(model.body[1].weight.detach().abs().sum())  # a host read of a deferred tensor
    assert first >= 0.0
    with torch.device("meta"):
        extra = nn.Linear(64, 64)  # the job's own meta tensors
    extra = extra.to_empty(device="cuda")
    model = model.to("cuda", dtype=torch.float16).float()
    model.head.weight.register_hook(lambda grad: grad * torch.ones_like(grad))
    optimizer = torch.optim.AdamW([*model.parameters(), *extra.parameters()], lr=1e-3)
    loader = DataLoader(_Draws(), batch_size=4)
    pool = ThreadPoolExecutor(1)
    for x, y in loader:
        x, y = x.cuda(), torch.as_tensor(y, device="cuda")
        hidden = pool.submit(model.body, x).result()  # forward in a thread the job started
        loss = nn.functional.cross_entropy(extra(hidden) @ model.head.weight.t(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert f"{loss:.3f}" == "0.000"  # a host read through `__format__`
    pool.shutdown()


def whole(job) -> dict:
    result = estimate(job, gpu="a100-40gb", steps="all")
    data = result.to_json()
    data.pop("seconds", None)
    trace = result.capture.trace
    data["trace"] = [list(trace.kinds), list(trace.ids), list(trace.sizes), list(trace.streams),
                     [None if t is None else t.to_json() for t in map(trace.tag_of, range(len(trace)))]]
    data["meta"] = trace.meta
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def _counting(monkeypatch, cls, counts: dict) -> None:
    original = cls.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):
        counts[cls.__name__] = counts.get(cls.__name__, 0) + 1
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(cls, "__torch_function__", counted)
    monkeypatch.setattr(host_deferred, "HANDING_ON_FRAMES",
                        {*host_deferred.HANDING_ON_FRAMES, counted.__code__})


@pytest.mark.parametrize("job", [cnn_job, deferral_job])
def test_one_mode_gives_the_two_stacked_modes_estimate(monkeypatch, job):
    stacked_calls: dict = {}
    with monkeypatch.context() as patch:
        two_stacked_modes(patch)
        _counting(patch, host_deferred.HostDeferral, stacked_calls)
        stacked = whole(job)
    merged_calls: dict = {}
    with monkeypatch.context() as patch:
        _counting(patch, host_deferred.HostDeferral, merged_calls)
        _counting(patch, CaptureModes, merged_calls)
        merged = whole(job)
    assert merged == stacked
    assert stacked["trace"][0]  # a trace with events
    if job is deferral_job:
        assert any("were kept fake" in note for note in merged["notes"])
        assert any("1 recomputed" in note for note in merged["notes"])
    # most calls never reach the deferral's handler now: one Python entry per torch call
    assert merged_calls["HostDeferral"] * 3 < stacked_calls["HostDeferral"]
    assert merged_calls["CaptureModes"] > 100


@pytest.mark.parametrize("job", [cnn_job, deferral_job])
def test_the_fast_path_gives_the_layered_paths_estimate(monkeypatch, job):
    def always_layered(self, func, types, args=(), kwargs=None):
        return self.layered(func, types, args, kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(CaptureModes, "__torch_function__", always_layered)
        patch.setattr(host_deferred, "HANDING_ON_FRAMES",
                      {*host_deferred.HANDING_ON_FRAMES, always_layered.__code__})
        layered = whole(job)
    assert whole(job) == layered


def test_the_device_maps_branches_are_taken_in_one_mode(monkeypatch):
    taken = []
    original = device_map.CudaAsMeta._from_data

    def spy(self, func, args, kwargs):
        taken.append(func)
        return original(self, func, args, kwargs)

    monkeypatch.setattr(device_map.CudaAsMeta, "_from_data", spy)
    whole(cnn_job)
    assert torch.tensor in taken  # `torch.tensor([0.5], device="cuda")`


def test_the_job_runs_under_one_capture_mode():
    seen = []

    def job() -> None:
        seen.append([type(mode) for mode in _get_current_function_mode_stack()])
        x = torch.ones(4, device="cuda")
        seen.append(str(x.device))

    estimate(job, gpu="a100-40gb", steps="all")
    assert seen == [[CaptureModes], "cuda:0"]


class _Marker(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_removing_the_device_map_keeps_a_mode_pushed_above_it():
    below, device_view, above = _Marker(), _Marker(), _Marker()
    with below:
        capture_modes._push(device_view)
        capture_modes._push(above)
        capture_modes._remove(device_view)
        assert _get_current_function_mode_stack() == [below, above]
        capture_modes._remove(above)
        assert _get_current_function_mode_stack() == [below]


def test_host_reads_of_flat_arguments_give_the_tree_maps_estimate(monkeypatch):
    reads = []
    original = device_map.CudaAsMeta._host

    def counted(self, value):
        reads.append(type(value))
        return original(self, value)

    monkeypatch.setattr(device_map.CudaAsMeta, "_host", counted)
    with monkeypatch.context() as patch:
        patch.setattr(device_map, "_FLAT_LEAVES", frozenset())  # every host read through tree_map
        full = whole(deferral_job)
    through_tree_map = list(reads)
    reads.clear()
    assert whole(deferral_job) == full
    assert reads == through_tree_map and str in reads  # `f"{loss:.3f}"`: (tensor, ".3f")
