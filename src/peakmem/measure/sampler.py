"""A background thread that samples used device memory at a fixed rate and keeps the peak."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from peakmem.measure.probe import UsedSample


@dataclass(frozen=True)
class SamplerStats:
    peak_bytes: int
    samples: int
    rate_hz: float  # achieved sampling rate
    sources: frozenset[str]
    peak_source: str  # how the peak sample was read
    peak_by_source: dict[str, int] = field(default_factory=dict)  # the largest sample per source


class PeakSampler:
    """Call ``read`` every ``1/hz`` seconds in a daemon thread; keep the maximum.

    Use as a context manager, or ``start()`` / ``stop()``. ``stop()`` takes one last sample, so a
    peak reached just before the job ended is never lost.
    """

    def __init__(self, read: Callable[[], UsedSample], hz: float = 200.0) -> None:
        if hz <= 0:
            raise ValueError(f"the sampling rate must be positive, got {hz}")
        self._read = read
        self._interval = 1.0 / hz
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._peak = 0
        self._samples = 0
        self._sources: set[str] = set()
        self._peak_source = ""
        self._by_source: dict[str, int] = {}
        self._started = 0.0
        self._error: BaseException | None = None

    def _take(self) -> None:
        sample = self._read()
        with self._lock:
            if sample.used_bytes > self._peak or not self._peak_source:
                self._peak, self._peak_source = sample.used_bytes, sample.source
            self._samples += 1
            self._sources.add(sample.source)
            best = self._by_source.get(sample.source)
            if best is None or sample.used_bytes > best:
                self._by_source[sample.source] = sample.used_bytes

    def _loop(self) -> None:
        next_due = time.perf_counter()
        while not self._stop.is_set():
            try:
                self._take()
            except BaseException as exc:  # reported by stop(); the job goes on
                self._error = exc
                return
            next_due += self._interval
            delay = next_due - time.perf_counter()
            if delay < 0:  # fell behind: do not burst to catch up
                next_due = time.perf_counter()
                delay = 0.0
            self._stop.wait(delay)

    def start(self) -> PeakSampler:
        if self._thread is not None:
            raise RuntimeError("the sampler is already running")
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="peakmem-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> SamplerStats:
        if self._thread is None:
            raise RuntimeError("the sampler was not started")
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"memory sampling failed: {self._error}") from self._error
        self._take()
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        with self._lock:
            return SamplerStats(
                self._peak,
                self._samples,
                self._samples / elapsed,
                frozenset(self._sources),
                self._peak_source,
                dict(self._by_source),
            )

    def __enter__(self) -> PeakSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None and not self._stop.is_set():
            self._stop.set()
            self._thread.join()
