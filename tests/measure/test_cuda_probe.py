"""The NVML logic of the real probe, with a fake pynvml module (no driver needed)."""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest

from peakmem.measure.cuda_probe import CudaProbe

MiB = 2**20


def fake_pynvml(state: dict) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: state.__setitem__("shutdown", True)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: state.setdefault("handles", []).append(i) or i
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=state["device_used"])
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in state["processes"]
    ]
    nvml.nvmlSystemGetDriverVersion = lambda: b"999.99"
    return nvml


@pytest.fixture
def nvml(monkeypatch):
    state = {"device_used": 1000 * MiB, "processes": []}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(state))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return state


def test_process_entry_preferred(nvml):
    probe = CudaProbe(0)
    nvml["processes"] = [(1, 5 * MiB), (os.getpid(), 700 * MiB)]
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (700 * MiB, "nvml-process")


def test_device_delta_when_pid_hidden(nvml):
    probe = CudaProbe(0)
    probe.mark_baseline()  # 1000 MiB used by others before the job
    nvml["device_used"] = 1600 * MiB
    nvml["processes"] = [(123456789, 600 * MiB)]  # a host pid: not ours
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (600 * MiB, "nvml-device-delta")
    nvml["device_used"] = 900 * MiB  # never negative
    assert probe.sample_used().used_bytes == 0


def test_visible_devices_map_to_nvml_index(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    CudaProbe(1)
    assert nvml["handles"][-1] == 1
    CudaProbe(0)
    assert nvml["handles"][-1] == 3


def test_close_shuts_nvml_down(nvml):
    CudaProbe(0).close()
    assert nvml["shutdown"]


def test_no_gpu_reason_on_cpu_torch(nvml):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert CudaProbe(0).unavailable_reason() is not None


def test_stops_asking_for_processes_once_pid_is_hidden(nvml, monkeypatch):
    import peakmem.measure.cuda_probe as cp

    probe = CudaProbe(0)
    probe.mark_baseline()
    nvml["processes"] = [(123456789, 10 * MiB)]
    calls = {"n": 0}
    nvml_mod = sys.modules["pynvml"]
    listing = nvml_mod.nvmlDeviceGetComputeRunningProcesses

    def counting(handle):
        calls["n"] += 1
        return listing(handle)

    monkeypatch.setattr(nvml_mod, "nvmlDeviceGetComputeRunningProcesses", counting)
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for _ in range(cp._PID_HIDDEN_AFTER + 20):  # before our context exists: keep asking
        probe.sample_used()
    assert calls["n"] == cp._PID_HIDDEN_AFTER + 20
    calls["n"] = 0
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    for _ in range(cp._PID_HIDDEN_AFTER + 20):
        assert probe.sample_used().source == "nvml-device-delta"
    assert calls["n"] == cp._PID_HIDDEN_AFTER


def test_failed_listing_repeats_last_process_reading_not_device_delta(nvml, monkeypatch):
    """Beside other processes, a listing that raises (a process started between NVML's count and
    fill calls) must not fall back to the device-wide delta, which counts the others' growth."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    probe = CudaProbe(0)
    probe.mark_baseline()
    nvml["processes"] = [(os.getpid(), 700 * MiB), (4242, 1 * MiB)]
    first = probe.sample_used()
    assert (first.used_bytes, first.source) == (700 * MiB, "nvml-process")
    nvml["device_used"] = 40_000 * MiB  # another process grew by ~39 GiB
    nvml_mod = sys.modules["pynvml"]

    def racing(handle):
        raise RuntimeError("NVML_ERROR_INSUFFICIENT_SIZE")

    monkeypatch.setattr(nvml_mod, "nvmlDeviceGetComputeRunningProcesses", racing)
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (700 * MiB, "nvml-process")
    monkeypatch.setattr(
        nvml_mod, "nvmlDeviceGetComputeRunningProcesses",
        lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=39_000 * MiB)],
    )  # fmt: skip
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (700 * MiB, "nvml-process")


def test_listing_retried_once_it_raises(nvml, monkeypatch):
    probe = CudaProbe(0)
    nvml_mod = sys.modules["pynvml"]
    listing = nvml_mod.nvmlDeviceGetComputeRunningProcesses
    calls = {"n": 0}

    def flaky(handle):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("NVML_ERROR_INSUFFICIENT_SIZE")
        return listing(handle)

    monkeypatch.setattr(nvml_mod, "nvmlDeviceGetComputeRunningProcesses", flaky)
    nvml["processes"] = [(os.getpid(), 321 * MiB)]
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (321 * MiB, "nvml-process")
    assert calls["n"] == 2
