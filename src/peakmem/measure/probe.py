"""The interface between the measurement logic and the device (NVML + torch.cuda)."""

from __future__ import annotations

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

    def start_history(self, stacks: str) -> None:
        """Begin torch.cuda.memory._record_memory_history."""

    def dump_history(self, path: Path) -> None:
        """torch.cuda.memory._dump_snapshot(path) and stop recording."""

    def close(self) -> None: ...
