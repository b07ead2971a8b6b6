"""The interface between the measurement logic and the device (NVML + torch.cuda)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class DeviceInfo:
    gpu: str  # e.g. "NVIDIA H200"
    driver: str  # e.g. "550.90.07"
    cuda: str  # CUDA version torch was built with, e.g. "12.4"
    torch: str  # torch.__version__
    total_bytes: int  # device memory capacity
    index: int = 0


@dataclass(frozen=True)
class UsedSample:
    """One reading of the device memory this process uses."""

    used_bytes: int
    source: str  # how it was read: one of peakmem.measure.peak_source


@dataclass
class PeakResets:
    """The job's own resets of torch's peak counters (`torch.cuda.reset_peak_memory_stats`,
    `reset_max_memory_allocated`, `reset_max_memory_cached`, Accelerate's and Lightning's memory
    trackers): how many, and the largest max reserved / allocated read just before each. A
    measurement reports the larger of these and the counters at the end: the run's peak, not the
    peak since the job's last reset."""

    count: int = 0
    max_reserved: int = 0
    max_allocated: int = 0

    def record(self, max_reserved: int, max_allocated: int) -> None:
        self.count += 1
        self.max_reserved = max(self.max_reserved, max_reserved)
        self.max_allocated = max(self.max_allocated, max_allocated)


@runtime_checkable
class DeviceProbe(Protocol):
    def unavailable_reason(self) -> str | None:
        """None when a CUDA GPU can be measured, else a one-line reason."""

    def info(self) -> DeviceInfo: ...

    def mark_baseline(self) -> None:
        """Remember the device's used memory now, before this process touches the GPU."""

    def sample_used(self) -> UsedSample:
        """The device memory this process uses now (thread-safe: called from the sampler)."""

    def synchronize(self) -> None: ...

    def reserved_bytes(self) -> int:
        """torch.cuda.memory_reserved() now."""

    def max_reserved_bytes(self) -> int: ...

    def max_allocated_bytes(self) -> int: ...

    def peak_resets(self) -> AbstractContextManager[PeakResets]:
        """While inside: every reset of torch's peak counters the job makes is recorded (the
        counters read first) in the `PeakResets` it yields."""

    def start_history(self, stacks: str) -> None:
        """Begin torch.cuda.memory._record_memory_history."""

    def dump_history(self, path: Path) -> None:
        """torch.cuda.memory._dump_snapshot(path) and stop recording."""

    def close(self) -> None: ...
