"""A scripted DeviceProbe for CPU tests: used memory follows a value the test (or the fake job)
sets, the allocator counters are plain attributes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from peakmem.measure.probe import DeviceInfo, PeakResets, UsedSample


@dataclass
class FakeProbe:
    reason: str | None = None
    device: DeviceInfo = field(
        default_factory=lambda: DeviceInfo("Fake GPU", "999.1", "12.4", "2.13.0", 80 * 2**30)
    )
    used: int = 0  # what sample_used() reports; set it from the fake job
    source: str = "nvml-process"
    reserved: int = 0
    max_reserved: int = 0
    max_allocated: int = 0
    history_stacks: str | None = None
    events: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _resets: PeakResets | None = field(default=None, repr=False)

    def reset_peak(self) -> None:
        """What the fake job calls for `torch.cuda.reset_peak_memory_stats()`: the max counters
        drop to the current reserved bytes (allocated: 0), recorded first while watched."""
        with self._lock:
            if self._resets is not None:
                self._resets.record(self.max_reserved, self.max_allocated)
            self.max_reserved, self.max_allocated = self.reserved, 0

    @contextlib.contextmanager
    def peak_resets(self) -> Iterator[PeakResets]:
        self._resets = PeakResets()
        try:
            yield self._resets
        finally:
            self._resets = None

    def set_used(self, used: int, reserved: int | None = None) -> None:
        with self._lock:
            self.used = used
            if reserved is not None:
                self.reserved = reserved
                self.max_reserved = max(self.max_reserved, reserved)

    def unavailable_reason(self) -> str | None:
        return self.reason

    def info(self) -> DeviceInfo:
        return self.device

    def mark_baseline(self) -> None:
        self.events.append("baseline")

    def sample_used(self) -> UsedSample:
        with self._lock:
            return UsedSample(self.used, self.source)

    def synchronize(self) -> None:
        self.events.append("synchronize")

    def reserved_bytes(self) -> int:
        return self.reserved

    def max_reserved_bytes(self) -> int:
        return self.max_reserved

    def max_allocated_bytes(self) -> int:
        return self.max_allocated

    def start_history(self, stacks: str) -> None:
        self.history_stacks = stacks
        self.events.append("start_history")

    def dump_history(self, path: Path) -> None:
        Path(path).write_text("fake snapshot")
        self.events.append("dump_history")

    def close(self) -> None:
        self.events.append("close")
