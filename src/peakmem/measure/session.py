"""Measure one job: baseline, sampler on, run the job for N optimizer steps, sampler off, read
the allocator's counters. Everything device-specific goes through a DeviceProbe."""

from __future__ import annotations

import contextlib
import gc
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from peakmem.jobs.runner import JobOutcome, JobSpec, JobStatus, run_job
from peakmem.measure.peak_source import UNKNOWN, resolve_peak
from peakmem.measure.probe import DeviceProbe
from peakmem.measure.result import MeasureResult, MeasureStatus, allocator_config
from peakmem.measure.sampler import PeakSampler


class NoGPUError(RuntimeError):
    """There is no GPU to measure on."""


@dataclass(frozen=True)
class MeasureOptions:
    steps: int | None = 3
    timeout: float | None = None
    sample_hz: float = 200.0
    snapshot: Path | None = None
    snapshot_stacks: str = "python"
    job_stdout: TextIO | None = None  # where the script's prints go (None: unchanged)


def is_oom_error(exc: BaseException | None) -> bool:
    """A CUDA out-of-memory error (torch.cuda.OutOfMemoryError, or an older RuntimeError)."""
    while exc is not None:
        if any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__):
            return True
        if isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


SNAPSHOT_HINT = (
    " [with --snapshot: torch's allocator history was recording; on Python 3.12 + torch 2.11"
    " jobs have failed this way with it on and run without it: rerun without --snapshot]"
)
"""Added to the error of a job that failed with `is_history_interaction`'s error while the
allocator history was recording. Seen on the H200 lease of 2026-11-28 (Python 3.12.3, torch
2.11.0+cu130): Hugging Face's run_clm with --gradient_checkpointing (in dropout, recomputed
inside backward) and TRL's RLOO trainer (in `run_backward`) failed under `peakmem measure
--snapshot` and ran to their end without it; torch's history alone around a checkpointed
backward did not fail (docs/MEASURE.md, "The library-job scripts on the H200")."""


def is_history_interaction(error: BaseException) -> bool:
    """A C function of torch that returned an error without setting one (CPython's
    SystemError): what recording the allocator history broke in those jobs."""
    return isinstance(error, SystemError) and "without setting an exception" in str(error)


def classify(outcome: JobOutcome) -> MeasureStatus:
    if outcome.ok:
        return MeasureStatus.OK
    if outcome.status is JobStatus.TIMEOUT:
        return MeasureStatus.TIMEOUT
    if is_oom_error(outcome.error):
        return MeasureStatus.OOM
    return MeasureStatus.ERROR


def measure_job(spec: JobSpec, probe: DeviceProbe, options: MeasureOptions) -> MeasureResult:
    """Run ``spec`` in this process on the probe's GPU and record its memory."""
    reason = probe.unavailable_reason()
    if reason is not None:
        raise NoGPUError(reason)
    probe.mark_baseline()
    if options.snapshot is not None:
        probe.start_history(options.snapshot_stacks)
    sampler = PeakSampler(probe.sample_used, hz=options.sample_hz)
    redirect = (
        contextlib.redirect_stdout(options.job_stdout)
        if options.job_stdout is not None
        else contextlib.nullcontext()
    )
    sampler.start()
    try:
        with redirect, probe.peak_resets() as resets:
            outcome = run_job(spec, steps=options.steps, timeout=options.timeout)
            _synchronize(probe)
    finally:
        stats = sampler.stop()
    status = classify(outcome)
    error_text = ""
    if status is not MeasureStatus.OK and outcome.error is not None:
        error_text = f"{type(outcome.error).__name__}: {outcome.error}".splitlines()[0][:500]
        if options.snapshot is not None and is_history_interaction(outcome.error):
            error_text += SNAPSHOT_HINT
    if status is MeasureStatus.ERROR and outcome.traceback_text:
        sys.stderr.write(outcome.traceback_text)
    outcome.error = None  # drop the frames (and tensors) the exception holds
    gc.collect()
    end = probe.sample_used()
    peak = resolve_peak(stats.peak_by_source, end.used_bytes, end.source)
    context = max(end.used_bytes - probe.reserved_bytes(), 0) if peak.source != UNKNOWN else 0
    if options.snapshot is not None:
        probe.dump_history(options.snapshot)
    info = probe.info()
    return MeasureResult(
        peak_bytes=peak.bytes,
        peak_reserved_bytes=max(probe.max_reserved_bytes(), resets.max_reserved),
        peak_allocated_bytes=max(probe.max_allocated_bytes(), resets.max_allocated),
        context_bytes=context,
        status=status,
        gpu=info.gpu,
        driver=info.driver,
        cuda=info.cuda,
        torch=info.torch,
        alloc_conf=allocator_config(),
        seconds=outcome.seconds,
        steps=outcome.steps,
        steps_requested=options.steps,
        peak_source=peak.source,
        peak_unknown=peak.unknown_reason,
        samples=stats.samples,
        sample_hz=stats.rate_hz,
        total_bytes=info.total_bytes,
        job=" ".join(spec.command_line()),
        exit_code=outcome.exit_code,
        error=error_text,
        snapshot=str(options.snapshot) if options.snapshot is not None else "",
        peak_resets=resets.count,
    )


def _synchronize(probe: DeviceProbe) -> None:
    """Wait for queued kernels; after an OOM or a broken kernel this may raise: ignore it."""
    with contextlib.suppress(Exception):
        probe.synchronize()
