"""How a reading of the process's device memory was taken (``UsedSample.source``), and which
readings a run's peak may come from.

A device-wide figure counts every other process's memory: a run measured beside others may
take its peak only from readings of its own. NVML lists a process from the moment its CUDA
context exists, so a run that NVML listed by its own pid held no memory before that: its peak
is the largest per-process reading. A run never listed by its pid (a PID namespace, or a
listing that is not supported) has a peak only when no reading was unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PROCESS = "nvml-process"  # NVML's entry for this process's pid
HOST_PID = "nvml-host-pid"  # the one process NVML lists: ours, under a host pid
DEVICE_DELTA = "nvml-device-delta"  # device used - baseline, while NVML lists no one else
MEMINFO_DELTA = "cuda-meminfo-delta"  # no nvidia-ml-py: cudaMemGetInfo used - baseline
NO_CONTEXT = "no-context"  # 0: torch has not initialised CUDA, NVML does not list us
UNLISTED = "not-listed-yet"  # 0: CUDA initialised, NVML lists others but not (yet) us
UNKNOWN = "unknown"  # not readable: others listed, ours never (or the listing failed)

_REASONS = {
    UNKNOWN: "NVML listed other processes on the GPU but never this one by its pid (a PID "
    "namespace, or a process listing that failed): a device-wide figure would count theirs",
    UNLISTED: "NVML had not listed this process by the end of the run and listed others: a "
    "device-wide figure would count theirs",
}


@dataclass(frozen=True)
class PeakReading:
    bytes: int
    source: str  # UNKNOWN when the peak cannot be stated
    unknown_reason: str = ""


def resolve_peak(peaks: Mapping[str, int], end_bytes: int, end_source: str) -> PeakReading:
    """The run's peak from the largest reading per source (``peaks``) and the reading after the
    job (``end_*``)."""
    if end_source == PROCESS:  # listed by its pid: earlier readings of other kinds came before
        return PeakReading(max(peaks.get(PROCESS, 0), end_bytes), PROCESS)  # its context
    if end_source in _REASONS:
        return PeakReading(0, UNKNOWN, _REASONS[end_source])
    if UNKNOWN in peaks:
        return PeakReading(0, UNKNOWN, _REASONS[UNKNOWN])
    every = {**peaks, end_source: max(peaks.get(end_source, 0), end_bytes)}
    source = max(every, key=lambda name: (every[name], name == end_source))
    return PeakReading(every[source], source)
