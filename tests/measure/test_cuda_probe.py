"""The NVML logic of the real probe, with a fake pynvml module (no driver needed)."""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest

from peakmem.measure.cuda_probe import CudaProbe
from peakmem.measure.probe import UsedSample

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


@pytest.fixture
def cuda_up(monkeypatch):
    """torch.cuda.is_initialized(), as the job's first CUDA call sets it (False until then)."""
    import torch

    state = {"up": False}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["up"])
    return state


def test_before_its_context_a_process_reads_nothing_whatever_the_neighbours_do(nvml, cuda_up):
    """The H200 lease of 2026-11-27: beside three sweeps, 9 of 280 runs took their peak from the
    device-wide delta before NVML listed them (a t5-small run read 69 GB, its own peak 7.3 GB)."""
    probe = CudaProbe(0)
    nvml["processes"] = [(4242, 20_000 * MiB)]
    probe.mark_baseline()  # 20 GB used by the neighbour
    nvml["device_used"] = 89_000 * MiB  # the neighbour grows by 69 GB while we import
    nvml["processes"] = [(4242, 89_000 * MiB)]
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (0, "no-context")
    cuda_up["up"] = True  # our context is being created: NVML lists the neighbour, not yet us
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (0, "not-listed-yet")
    nvml["processes"] = [(4242, 89_000 * MiB), (os.getpid(), 7_300 * MiB)]
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (7_300 * MiB, "nvml-process")


def test_device_delta_only_while_nvml_lists_no_process(nvml, cuda_up):
    probe = CudaProbe(0)
    probe.mark_baseline()  # 1000 MiB used before the job, by no compute process
    cuda_up["up"] = True
    nvml["device_used"] = 1600 * MiB
    sample = probe.sample_used()
    assert (sample.used_bytes, sample.source) == (600 * MiB, "nvml-device-delta")
    nvml["device_used"] = 900 * MiB  # never negative
    assert probe.sample_used().used_bytes == 0
    nvml["device_used"] = 5000 * MiB
    nvml["processes"] = [(4242, 3000 * MiB)]  # someone else is listed now: not a delta
    assert probe.sample_used() == UsedSample(0, "not-listed-yet")


def test_our_entry_without_a_figure_gives_the_delta_only_when_alone(nvml, cuda_up):
    # usedGpuMemory N/A (NVML_VALUE_NOT_AVAILABLE; nvidia-ml-py turns it into None)
    probe = CudaProbe(0)
    probe.mark_baseline()
    cuda_up["up"] = True
    nvml["device_used"] = 1700 * MiB
    nvml["processes"] = [(os.getpid(), None)]
    assert probe.sample_used() == UsedSample(700 * MiB, "nvml-device-delta")
    nvml["processes"] = [(os.getpid(), None), (4242, 10 * MiB)]
    assert probe.sample_used() == UsedSample(0, "unknown")


def test_hidden_pid_reads_the_only_new_process_and_nothing_beside_others(nvml, cuda_up):
    """A PID namespace: NVML lists host pids, ours among them under another number."""
    import peakmem.measure.cuda_probe as cp

    probe = CudaProbe(0)
    nvml["processes"] = [(4242, 900 * MiB)]
    probe.mark_baseline()  # a neighbour, listed before our context existed
    cuda_up["up"] = True
    nvml["processes"] = [(4242, 900 * MiB), (123456789, 600 * MiB)]  # 123456789: us, hidden
    for _ in range(cp._PID_HIDDEN_AFTER):  # while our context may still be coming up
        assert probe.sample_used() == UsedSample(0, "not-listed-yet")
    assert probe.sample_used() == UsedSample(0, "unknown")  # the neighbour is still there
    nvml["processes"] = [(123456789, 650 * MiB)]  # it left: the one process listed is us
    assert probe.sample_used() == UsedSample(650 * MiB, "nvml-host-pid")
    nvml["processes"] = [(123456789, 650 * MiB), (777, 1 * MiB)]  # a new neighbour
    assert probe.sample_used() == UsedSample(0, "unknown")
    nvml_mod = sys.modules["pynvml"]

    def failing(handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    nvml_mod.nvmlDeviceGetComputeRunningProcesses = failing
    assert probe.sample_used() == UsedSample(0, "unknown")  # no listing: no one is ruled out


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


def test_the_jobs_peak_resets_are_read_first_whichever_alias_it_calls(nvml, monkeypatch):
    """`torch.cuda.reset_peak_memory_stats`, `reset_max_memory_allocated` and a copy imported
    before the measurement all end in `torch._C._cuda_resetPeakMemoryStats`: each reset is
    preceded by a reading of the counters (the job's last reset must not hide the run's peak)."""
    import warnings

    import torch
    from torch.cuda import reset_peak_memory_stats as imported_before

    counters = {"reserved": 900 * MiB, "allocated": 700 * MiB}
    native_calls = []

    def native(device):
        native_calls.append(device)
        counters.update(reserved=100 * MiB, allocated=50 * MiB)

    monkeypatch.setattr(torch._C, "_cuda_resetPeakMemoryStats", native, raising=False)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda i=None: counters["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i=None: counters["allocated"])
    probe = CudaProbe(0)
    with probe.peak_resets() as resets:
        torch.cuda.reset_peak_memory_stats(0)
        counters.update(reserved=300 * MiB, allocated=200 * MiB)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.cuda.reset_max_memory_allocated(0)
        imported_before(0)
    assert native_calls == [0, 0, 0] and resets.count == 3
    assert (resets.max_reserved, resets.max_allocated) == (900 * MiB, 700 * MiB)
    assert torch._C._cuda_resetPeakMemoryStats is native  # put back
