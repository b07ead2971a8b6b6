"""The real DeviceProbe: NVML (nvidia-ml-py) for device-level memory, torch.cuda for the
allocator's counters. Imported only on a machine that measures; never needed by tests.

Used memory of this process (``UsedSample.source``), in order of preference:
1. ``nvmlDeviceGetComputeRunningProcesses`` entry for ``os.getpid()`` ("nvml-process"). Once
   NVML has listed this process, every later sample is "nvml-process": a listing that fails
   (nvidia-ml-py's count-then-fill calls; it raises NVML_ERROR_INSUFFICIENT_SIZE when processes
   start in between) or misses us repeats the last per-process reading;
2. before that, readings that never count another process's memory:
   - "no-context" (0): torch has not initialised CUDA and NVML does not list us. A process has no
     device memory before its CUDA context exists. On the H200 lease of 2026-11-27 the probe
     read the device-wide delta here instead: 9 of 280 runs measured beside three sweeps took
     their peak from a neighbour's growth during their own start-up (a t5-small run read 69 GB,
     its own peak was 7.3 GB);
   - "nvml-device-delta": NVML's device used memory minus the used memory at the baseline, only
     while NVML lists no compute process at all, or lists us without a figure
     (``usedGpuMemory`` N/A, NVML_VALUE_NOT_AVAILABLE: always so under Windows WDDM) and no one
     else (a run alone on the GPU, between CUDA's initialisation and NVML listing it);
   - "not-listed-yet" (0): CUDA is initialised, NVML lists other processes and not us yet: our
     context is being created, or our pid is hidden;
   - "nvml-host-pid": after ``_PID_HIDDEN_AFTER`` such listings, NVML is taken to report host
     pids (a container's PID namespace: the driver returns host pids, NVIDIA/nvidia-docker#1483).
     When it then lists exactly one process, one that was not listed at the baseline, that one
     is us: its figure is read;
   - "unknown" (0): otherwise (other processes listed, or the listing failed). The run's peak
     is then unknown (``peak_source.resolve_peak``); the sweep records it as an error to
     measure again;
3. without nvidia-ml-py: ``cudaMemGetInfo`` used minus the baseline ("cuda-meminfo-delta"):
   device-wide, so it needs the GPU to ourselves.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from peakmem.measure.peak_source import (
    DEVICE_DELTA,
    HOST_PID,
    MEMINFO_DELTA,
    NO_CONTEXT,
    PROCESS,
    UNKNOWN,
    UNLISTED,
)
from peakmem.measure.probe import DeviceInfo, PeakResets, UsedSample

# after this many process listings without our pid (CUDA initialised), NVML's pids are host pids
_PID_HIDDEN_AFTER = 200


def _load_nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError: no driver
        return None
    return pynvml


class CudaProbe:
    """NVML + torch.cuda on device ``index``."""

    def __init__(self, index: int = 0) -> None:
        import torch

        self._torch = torch
        self._index = index
        self._nvml = _load_nvml()
        self._handle = None
        if self._nvml is not None:
            try:
                self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self._visible_nvml_index())
            except Exception:
                self._nvml = None
        self._pid = os.getpid()
        self._baseline = 0
        self._lock = threading.Lock()
        self._misses = 0  # listings (CUDA initialised) that had others or failed, not this pid
        self._last_process_used: int | None = None  # last per-process reading, once seen
        self._baseline_pids: frozenset[int] = frozenset()  # processes listed before the job

    def _visible_nvml_index(self) -> int:
        """NVML ignores CUDA_VISIBLE_DEVICES: map torch's index to NVML's (numeric lists only)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        if visible:
            entries = [v.strip() for v in visible.split(",") if v.strip()]
            if self._index < len(entries) and entries[self._index].isdigit():
                return int(entries[self._index])
        return self._index

    def unavailable_reason(self) -> str | None:
        torch = self._torch
        if torch.version.cuda is None:
            return f"torch {torch.__version__} was built without CUDA"
        if not torch.cuda.is_available():
            return "torch.cuda.is_available() is False (no GPU or no driver)"
        if self._index >= torch.cuda.device_count():
            return f"GPU index {self._index} not present ({torch.cuda.device_count()} visible)"
        return None

    def info(self) -> DeviceInfo:
        torch = self._torch
        props = torch.cuda.get_device_properties(self._index)
        driver = "unknown"
        if self._nvml is not None:
            raw = self._nvml.nvmlSystemGetDriverVersion()
            driver = raw.decode() if isinstance(raw, bytes) else str(raw)
        return DeviceInfo(
            gpu=props.name,
            driver=driver,
            cuda=str(torch.version.cuda),
            torch=torch.__version__,
            total_bytes=int(props.total_memory),
            index=self._index,
        )

    def _device_used(self) -> int:
        if self._nvml is not None:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        free, total = self._torch.cuda.mem_get_info(self._index)
        return int(total - free)

    def mark_baseline(self) -> None:
        if self._nvml is None:
            self._baseline = 0
            return
        self._baseline = self._device_used()
        processes, _listed = self._list_processes()
        self._baseline_pids = frozenset(p.pid for p in processes if p.pid != self._pid)

    def sample_used(self) -> UsedSample:
        if self._nvml is None:
            # cudaMemGetInfo needs a context: before the job made one, report nothing used
            if not self._torch.cuda.is_initialized():
                return UsedSample(0, MEMINFO_DELTA)
            return UsedSample(self._device_used() - self._baseline, MEMINFO_DELTA)
        processes, listed = self._list_processes()
        mine = [p for p in processes if p.pid == self._pid]
        if mine and mine[0].usedGpuMemory is not None:
            self._last_process_used = int(mine[0].usedGpuMemory)
            return UsedSample(self._last_process_used, PROCESS)
        if self._last_process_used is not None:  # seen before: a failed or racy listing
            return UsedSample(self._last_process_used, PROCESS)
        others = [p for p in processes if p.pid != self._pid]
        if mine:  # listed without a figure (N/A): the device delta, if no one else is listed
            return self._device_delta() if listed and not others else UsedSample(0, UNKNOWN)
        if not self._torch.cuda.is_initialized():
            return UsedSample(0, NO_CONTEXT)
        if listed and not processes:  # NVML lists no compute process: none to count
            return self._device_delta()
        self._misses += 1
        if self._misses <= _PID_HIDDEN_AFTER:
            return UsedSample(0, UNLISTED)
        new = [p for p in others if p.pid not in self._baseline_pids]
        if listed and len(others) == 1 and len(new) == 1 and new[0].usedGpuMemory is not None:
            return UsedSample(int(new[0].usedGpuMemory), HOST_PID)  # the only process: us
        return UsedSample(0, UNKNOWN)

    def _device_delta(self) -> UsedSample:
        return UsedSample(max(self._device_used() - self._baseline, 0), DEVICE_DELTA)

    def _list_processes(self) -> tuple[list[Any], bool]:
        """NVML's compute processes, retried: the list can change between its two calls."""
        for _ in range(3):
            try:
                return list(self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)), True
            except Exception:
                continue
        return [], False

    def synchronize(self) -> None:
        if self._torch.cuda.is_initialized():
            self._torch.cuda.synchronize(self._index)

    def reserved_bytes(self) -> int:
        return int(self._torch.cuda.memory_reserved(self._index))

    def max_reserved_bytes(self) -> int:
        return int(self._torch.cuda.max_memory_reserved(self._index))

    def max_allocated_bytes(self) -> int:
        return int(self._torch.cuda.max_memory_allocated(self._index))

    @contextlib.contextmanager
    def peak_resets(self) -> Iterator[PeakResets]:
        """Every path that resets the peak counters (`torch.cuda.reset_peak_memory_stats`, its
        `reset_max_memory_*` aliases, a library's `from torch.cuda import ...` copy of them)
        ends in `torch._C._cuda_resetPeakMemoryStats`, looked up at each call: wrapped here,
        the counters of the measured device are read before each reset."""
        resets = PeakResets()
        native = getattr(self._torch._C, "_cuda_resetPeakMemoryStats", None)
        if native is None:
            yield resets
            return

        def reset(*args: Any, **kwargs: Any) -> Any:
            resets.record(self.max_reserved_bytes(), self.max_allocated_bytes())
            return native(*args, **kwargs)

        self._torch._C._cuda_resetPeakMemoryStats = reset
        try:
            yield resets
        finally:
            self._torch._C._cuda_resetPeakMemoryStats = native

    def start_history(self, stacks: str) -> None:
        self._torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks=stacks, max_entries=2_000_000
        )

    def dump_history(self, path: Path) -> None:
        self._torch.cuda.memory._dump_snapshot(str(path))
        self._torch.cuda.memory._record_memory_history(enabled=None)

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
