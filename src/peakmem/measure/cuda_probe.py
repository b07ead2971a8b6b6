"""The real DeviceProbe: NVML (nvidia-ml-py) for device-level memory, torch.cuda for the
allocator's counters. Imported only on a machine that measures; never needed by tests.

Used memory of this process, in order of preference:
1. ``nvmlDeviceGetComputeRunningProcesses`` entry for ``os.getpid()`` ("nvml-process");
2. NVML device used memory minus the used memory at the baseline ("nvml-device-delta"): for
   containers whose PID namespace hides our pid from NVML; needs the GPU to ourselves.
   Once NVML has listed this process, the probe never falls back to it: a listing that fails
   (nvidia-ml-py raises NVML_ERROR_INSUFFICIENT_SIZE when a process starts between its count and
   fill calls) or misses us repeats the last per-process reading. The device-wide delta would
   count every other process's growth: on the first H200 lease, 27 of 168 sweep runs measured
   beside the cuDNN probe read 1-44 GiB too high that way;
3. without nvidia-ml-py: ``cudaMemGetInfo`` used minus the baseline ("cuda-meminfo-delta").
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

from peakmem.measure.probe import DeviceInfo, UsedSample

# after this many process lists without our pid, stop asking (each query costs sampling rate)
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
        self._misses = 0  # process lists that had entries but not this pid
        self._last_process_used: int | None = None  # last per-process reading, once seen

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
        self._baseline = self._device_used() if self._nvml is not None else 0

    def sample_used(self) -> UsedSample:
        if self._nvml is None:
            # cudaMemGetInfo needs a context: before the job made one, report nothing used
            if not self._torch.cuda.is_initialized():
                return UsedSample(0, "cuda-meminfo-delta")
            return UsedSample(self._device_used() - self._baseline, "cuda-meminfo-delta")
        if self._misses < _PID_HIDDEN_AFTER or self._last_process_used is not None:
            processes, listed = self._list_processes()
            for process in processes:
                if process.pid == self._pid and process.usedGpuMemory is not None:
                    self._last_process_used = int(process.usedGpuMemory)
                    return UsedSample(self._last_process_used, "nvml-process")
            if self._last_process_used is not None:  # seen before: a failed or racy listing
                return UsedSample(self._last_process_used, "nvml-process")
            if listed and processes and self._torch.cuda.is_initialized():
                self._misses += 1  # we run CUDA, others are listed, we are not: hidden PIDs?
        return UsedSample(max(self._device_used() - self._baseline, 0), "nvml-device-delta")

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
