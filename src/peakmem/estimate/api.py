"""Estimate a job's peak GPU memory: capture -> trace -> allocator simulation -> estimate."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from peakmem.capture import job_module_loading
from peakmem.capture.job_alloc_conf import META_KEY as JOB_ALLOC_CONF
from peakmem.capture.result import DEFAULT_STEPS, NO_DEVICE_NOTE, CaptureResult
from peakmem.capture.spawned_children import processes_bytes, processes_note, used_device
from peakmem.estimate.breakdown import PeakBreakdown
from peakmem.estimate.first_use import first_use_bytes, job_ops
from peakmem.estimate.margin_kinds import margin_kind as _kind_of
from peakmem.estimate.margin_kinds import op_packets
from peakmem.estimate.margin_reserve import margin_reserve_bytes as _margin_reserve
from peakmem.estimate.phase_notes import compile_bound_note, eval_peak_note
from peakmem.jobs.stop import Steps
from peakmem.profiles import GpuProfile, StackProfile, load_gpu, load_stack

DEFAULT_GPU = "h100-80gb"
MODES = ("fake", "eager", "auto")


# peakmem's exit code -> the error kind of the shared contract (README "Exit codes")
ERROR_KINDS = {1: "job_failed", 2: "bad_input", 3: "unsupported", 70: "internal", 124: "timeout"}


class EstimateError(RuntimeError):
    """The job could not be estimated (its own error, a timeout, or an unsupported mode).

    ``str(error)`` is the whole text (the job's traceback where it raised); ``message`` is one
    line; ``exit_code`` is peakmem's exit code (the contract's table), ``job_exit_code`` the
    status the job asked for, ``reason`` the finer cause; ``to_json()`` the `--json` object."""

    def __init__(
        self,
        message: str,
        capture: CaptureResult | None = None,
        exit_code: int = 1,
        *,
        reason: str | None = None,
        job_exit_code: int | None = None,
        signal: str | None = None,
        traceback: str | None = None,
        summary: str | None = None,
    ):
        super().__init__(message)
        self.capture = capture
        self.exit_code = exit_code if exit_code in ERROR_KINDS else 1
        self.kind = ERROR_KINDS[self.exit_code]
        self.reason = reason or {2: "bad_input", 70: "internal", 124: "timeout"}.get(self.exit_code)
        self.job_exit_code = job_exit_code
        self.signal = signal
        self.traceback = traceback
        self.message = _one_line(summary if summary is not None else message)

    def to_json(self) -> dict[str, Any]:
        return {
            "error": {
                "kind": self.kind,
                "message": self.message,
                "exit_code": self.exit_code,
                "reason": self.reason,
                "job_exit_code": self.job_exit_code,
                "signal": self.signal,
                "traceback": self.traceback,
            }
        }


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    line = " ".join(lines[:1]) if lines else "the job failed"
    return line if len(line) <= 2000 else line[:1997] + "..."


def _is_unsupported(capture: CaptureResult) -> bool:
    """The job stopped on something peakmem does not support yet (capture.Unsupported), in this
    process or in the job's."""
    error = capture.error
    return error is not None and (
        capture.reason == "unsupported"
        or (capture.error_type or type(error).__name__) == "Unsupported"
    )


def failure(capture: CaptureResult) -> EstimateError:
    """The error for a capture whose job did not run to an estimate."""
    from peakmem.capture.result import first_line

    reason = capture.reason or ("timeout" if capture.exit_code == 124 else "raised")
    if _is_unsupported(capture):
        reason = "unsupported"
    text = (capture.error_text or "").rstrip() or _safe(capture.error)
    common = {"reason": reason, "job_exit_code": capture.job_exit_code, "signal": capture.signal}
    if reason == "raised":
        error = capture.error
        type_name = capture.error_type or getattr(error, "type_name", None) or type(error).__name__
        detail = first_line(error) if error is not None else ""
        summary = f"the job raised {type_name}" + (f": {detail}" if detail else "")
        if capture.failure_hint:
            summary += f" ({capture.failure_hint})"
        return EstimateError(text, capture, 1, traceback=text or None, summary=summary, **common)
    if reason == "timeout":
        return EstimateError(text, capture, 124, summary=text, **common)
    if reason in ("fake_limit", "unsupported"):
        if reason == "unsupported":
            text = _safe(capture.error) or text
        return EstimateError(text, capture, 3, summary=text, **common)
    if reason == "bad_input":
        return EstimateError(text, capture, 2, summary=text, **common)
    if reason == "internal":
        return EstimateError(text, capture, 70, traceback=text, summary=text, **common)
    if reason == "exit" and capture.failure_hint:
        return EstimateError(text, capture, 1, summary=f"{text} ({capture.failure_hint})",
                             **common)
    return EstimateError(text, capture, 1, summary=text, **common)


def _safe(error: BaseException | None) -> str:
    from peakmem.capture.result import safe_str

    return safe_str(error) if error is not None else ""


@dataclass
class Estimate:
    gpu: GpuProfile
    stack: StackProfile
    torch_version: str
    alloc_conf: str
    mode: str
    """The capture that produced the trace: "fake" or "eager"."""
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    context_bytes: int
    breakdown: PeakBreakdown
    steps: int
    seconds: float
    oom: bool
    notes: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    capture: CaptureResult | None = None
    simulation: Any = None
    mode_reason: str = ""
    libraries: dict[str, int] = field(default_factory=dict)
    """Device memory libraries load outside the caching allocator on first use (cuDNN...)."""
    distributed: dict[str, Any] | None = None
    """A distributed launch: its shape and every traced rank (estimate.distributed); this
    estimate is the largest rank's."""
    utilization: Any = None
    """Predicted GPU utilization of a steady-state training iteration
    (peakmem.utilization.model.Utilization), None where the job trained no step."""
    processes: list[dict[str, Any]] = field(default_factory=list)
    """The job's child processes (spawn / forkserver, Python subprocesses: capture.
    spawned_children): `peak_bytes` is the most the processes alive together hold."""
    own_span: tuple[float, float] | None = None
    """When the job's own process ran (monotonic seconds; None: all along), against which the
    children's spans are laid (capture.child's `process_span`)."""

    devices: list[dict[str, Any]] = field(default_factory=list)
    """`nn.DataParallel` over several GPUs: the other devices that held memory, each estimated
    on its own (capture.data_parallel); `peak_bytes` is the largest device's."""

    @property
    def library_bytes(self) -> int:
        return sum(self.libraries.values())

    @property
    def processes_bytes(self) -> int:
        """What the job's child processes add to its own device-level peak, at the moment the
        processes alive together hold the most (capture.spawned_children.alive_together)."""
        own = self.context_bytes + self.library_bytes + self.peak_reserved_bytes
        return processes_bytes(self.processes, own, self.own_span)

    @property
    def device_peak_bytes(self) -> int:
        """Device 0's (the job's device's) peak as nvidia-smi shows it: CUDA context +
        libraries loaded on first use + peak reserved (+ the job's child processes on the
        device, each its own context and allocator: capture.spawned_children)."""
        return (self.context_bytes + self.library_bytes + self.peak_reserved_bytes
                + self.processes_bytes)

    @property
    def peak_bytes(self) -> int:
        """The largest device's peak: device 0's, or with `nn.DataParallel` over several GPUs
        another device's where it is larger."""
        return max([self.device_peak_bytes] + [report["peak_bytes"] for report in self.devices])

    def devices_json(self) -> list[dict[str, Any]]:
        """Each device's figures, device 0 first (its breakdown is `breakdown`)."""
        own = {
            "device": 0,
            "peak_bytes": self.device_peak_bytes,
            "context_bytes": self.context_bytes,
            "library_bytes": self.library_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "breakdown": dict(sorted(self.breakdown.by_category.items())),
        }
        return [own] + [dict(report) for report in self.devices]

    @property
    def margin_kind(self) -> str:
        return margin_kind(self.libraries, self.ops)

    @property
    def ops(self) -> frozenset[str]:
        """The aten ops (overload packets) whose allocations the trace records."""
        if self.capture is None:
            return frozenset()
        return op_packets(tag.op for tag in self.capture.trace.tags)

    @property
    def safety_margin(self) -> float:
        """Fraction to add so that <= 1% of the calibration split's jobs of this kind were
        underestimated (stack profile `safety_margin`; 0 where none was fitted)."""
        return float(self.stack.safety_margin_for(self.gpu, self.margin_kind).value)

    @cached_property
    def margin_reserve_bytes(self) -> int:
        """Bytes stated on top of the fractional margin for kinds of jobs whose misses scale
        with one allocation size (estimate/margin_reserve.py; 0 for the other kinds)."""
        trace = self.capture.trace if self.capture is not None else None
        return _margin_reserve(self.margin_kind, trace, self.alloc_conf, self.torch_version)

    @property
    def peak_bytes_with_margin(self) -> int:
        return int(self.peak_bytes * (1 + self.safety_margin)) + self.margin_reserve_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.gpu.total_memory_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        return not self.oom and self.headroom_bytes >= 0

    @property
    def trained(self) -> bool:
        return self.steps > 0

    @property
    def estimate_kind(self) -> str:
        """"training" when the job ran a backward pass (with or without a parameter update:
        the notes say which), else "forward"."""
        backward = self.capture is not None and self.capture.backward_passes > 0
        return "training" if self.trained or backward else "forward"

    def to_json(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "context_bytes": self.context_bytes,
            "library_bytes": self.library_bytes,
            "libraries": dict(sorted(self.libraries.items())),
            "processes_bytes": self.processes_bytes,
            "processes": [dict(report) for report in self.processes],
            "devices": self.devices_json(),
            "breakdown": dict(sorted(self.breakdown.by_category.items())),
            "top_modules": [
                {"module": name, "bytes": size} for name, size in self.breakdown.top_modules()
            ],
            "fits": self.fits,
            "safety_margin": self.safety_margin,
            "margin_kind": self.margin_kind,
            "margin_reserve_bytes": self.margin_reserve_bytes,
            "peak_bytes_with_margin": self.peak_bytes_with_margin,
            "fits_with_margin": self.fits and self.peak_bytes_with_margin <= self.capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "capacity_bytes": self.capacity_bytes,
            "gpu": self.gpu.name,
            "torch_version": self.torch_version,
            "stack": self.stack.name,
            "alloc_conf": self.alloc_conf,
            "mode": self.mode,
            "mode_reason": self.mode_reason,
            "steps": self.steps,
            "estimate_kind": self.estimate_kind,
            "stopped": bool(self.capture is not None and self.capture.stopped),
            "phases_ran": list(self.capture.trace.meta.get("phases_ran", []))
            if self.capture is not None
            else [],
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
            "assumptions": list(self.assumptions),
            **self._step_growth_json(),
            **(self.distributed or {}),
            "utilization": self.utilization.to_json() if self.utilization is not None else None,
        }


    def _step_growth_json(self) -> dict[str, Any]:
        """A DataLoader loop whose live memory still grew at the cap (capture.loader_growth):
        its per-step growth and the rest of its epoch extrapolated linearly, on top of the
        estimate's peak (`extrapolated_peak_bytes`, labelled `extrapolated`: not traced, and not
        in `peak_bytes`); nothing for other jobs."""
        record = self.capture.trace.meta.get("step_growth") if self.capture is not None else None
        if not record:
            return {}
        record = dict(record)
        extra = record.get("extrapolated_extra_bytes")
        record["extrapolated_peak_bytes"] = None if extra is None else self.peak_bytes + extra
        return {"step_growth": record}


def _installed_torch_version() -> str:
    """The installed torch's version, read from its metadata (importing torch costs seconds)."""
    from importlib import metadata

    try:
        return metadata.version("torch").split("+")[0]
    except metadata.PackageNotFoundError:
        import torch

        return torch.__version__.split("+")[0]


def margin_kind(libraries: dict[str, int], ops: frozenset[str] = frozenset()) -> str:
    """Which calibrated safety margin applies (estimate/margin_kinds.py): the cuDNN model's for
    jobs that convolve, the attention fit's for jobs that run fused attention, else default."""
    return _kind_of(libraries, ops)


def _assumptions(
    gpu: GpuProfile,
    stack: StackProfile,
    libraries: dict[str, int] | None = None,
    ops: frozenset[str] = frozenset(),
    environ: Any = None,
) -> list[str]:
    used = [
        ("GPU total memory", gpu.total_memory),
        ("CUDA context", stack.context_for(gpu, environ)),
        ("cuBLAS workspace", stack.cublas_workspace_for(gpu.capability)),
        ("cuBLASLt per-call workspace", stack.cublaslt_transient),
    ]
    if libraries is not None and "cudnn_convolution" in libraries:
        used.append(("cuDNN convolution workspace model",
                     stack.conv_workspace_table_for(gpu) or stack.conv_workspace_for(gpu)))
    for family in sorted(libraries or {}):
        used.append((f"{family} library memory", stack.library_bytes_for(gpu, family)))
    used.append(("safety margin", stack.safety_margin_for(gpu, margin_kind(libraries or {}, ops))))
    return [f"{what}: {value.value} ({value.describe()})" for what, value in used if value.assumed]


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise EstimateError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}", exit_code=2)


def _fake_assumptions(capture: CaptureResult) -> list[str]:
    """What a fake capture had to assume about values it does not have."""
    found = []
    if capture.data_dependent:
        ops = ", ".join(f"{name} x{count}" for name, count in sorted(capture.data_dependent.items()))
        found.append(
            f"data-dependent sizes ({ops}) bounded from above, every element selected "
            "(--mode eager sizes them exactly)"
        )
    if capture.host_reads:
        found.append(
            f"{capture.host_reads} host read(s) of device values (.item(), .tolist(), .cpu(), ...) "
            "saw zeros; if they steer the job's control flow, use --mode eager"
        )
    if capture.host_reads_before_forward:
        found.append(
            f"{capture.host_reads_before_forward} of them came before the first forward pass, "
            "while the model was built: if they set its sizes or depth (e.g. torchvision's "
            "RegNet built under a device context), the model estimated is not the job's; build "
            "it on the host or use --mode eager"
        )
    return found


CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT"})
"""Signals of a process that crashed by itself (not SIGKILL: the kernel's OOM killer, a user)."""


NETWORK_ERRORS = frozenset({
    "ConnectionError", "ConnectionRefusedError", "ConnectTimeout", "URLError", "gaierror",
    "MaxRetryError", "NameResolutionError", "OfflineModeIsEnabled",
})
"""Error types of a request that found no network (requests / urllib / urllib3 / socket,
huggingface_hub's offline mode): an eager run has no network either."""


def _network_error(capture: CaptureResult) -> bool:
    """The job failed for want of network access, not on a device value (round 23a:
    sentence-transformers' `push_to_hub` after an evaluator's `.tolist()` reads)."""
    error = capture.error
    name = capture.error_type or getattr(error, "type_name", None) or type(error).__name__
    return name in NETWORK_ERRORS or "it could not reach " in (capture.failure_hint or "")


def eager_fallback_reason(capture: CaptureResult) -> str | None:
    """Why auto mode must rerun a fake capture in eager mode (None: the fake one stands)."""
    if capture.fake_limit is not None:
        return capture.fake_limit
    if simulated_oom(capture) is not None or _is_unsupported(capture):
        return None  # the GPU would fail the same way / eager mode cannot help
    if capture.reason == "raised" and _network_error(capture):
        return None  # an eager run fails the same way, after as long again
    if capture.reason == "raised" and capture.host_reads:
        from peakmem.capture.result import first_line

        error = capture.error
        name = capture.error_type or getattr(error, "type_name", None) or type(error).__name__
        return (
            f"the job failed ({name}: {first_line(error)}) after {capture.host_reads} host "
            "read(s) of device values, which fake mode answers with zeros"
        )
    if capture.reason == "signal" and capture.signal in CRASH_SIGNALS:
        # the child's result died with it: whether it read device values is unknown, and
        # native code (scikit-learn's Barnes-Hut TSNE over an all-zero embedding) can crash on
        # the placeholder zeros fake mode answers them with
        return (
            f"the job's process was killed by {capture.signal}: native code may have crashed "
            "on the zeros fake mode answers host reads of device values with"
        )
    if capture.reason == "raised" and capture.data_dependent:
        # a size checked by the job (torchmetrics: `len(torch.unique(target)) > num_classes`)
        from peakmem.capture.result import first_line

        error = capture.error
        name = capture.error_type or getattr(error, "type_name", None) or type(error).__name__
        ops = ", ".join(sorted(capture.data_dependent))
        return (
            f"the job failed ({name}: {first_line(error)}) after data-dependent op(s) ({ops}) "
            "that fake mode sizes as if every element were kept"
        )
    return None


UnshortenedRun = Callable[[str, int], CaptureResult]
"""Runs the capture in a mode with an explicit step limit (nothing shortened)."""


def _capture_with_mode(run: Callable[[str], CaptureResult], mode: str,
                       unshortened: UnshortenedRun | None = None) -> CaptureResult:
    """Run the capture in `mode`; auto: fake, then eager if fake mode could not run the job.

    `unshortened` (given where the default step policy applies): when the job failed after the
    policy shortened its DataLoader epochs or ended its training loop (`len(loader)` said the
    shortened length: a schedule computed from it, as AdaLoRA's `total_step`, no longer fits
    the job), it is run
    again with its epochs as they are, stopped after the steps the first run reached (at least
    3, as `--steps N`), and that run stands if it succeeds."""
    capture = _capture_in_mode(run, mode)
    if unshortened is None or not capture.failed_after_shortening or capture.error is None:
        return capture
    from peakmem.capture.phases import MIN_STEPS
    from peakmem.capture.result import first_line

    limit = max(MIN_STEPS, capture.steps)
    rerun = _capture_in_mode(lambda run_mode: unshortened(run_mode, limit), mode)
    if rerun.error is not None:
        if not _same_error(rerun, capture):
            return capture  # it fails anyway: the first error, with its --steps all hint
        # the same error with its epochs as they are: the shortening did not cause it, so the
        # error stands without the hint that it may have (transformers' Trainer reads
        # `len(loader)` before it builds its optimizer: `--optim galore_adamw` without
        # galore-torch failed with "if that caused it, --steps all runs the job unchanged")
        rerun.seconds += capture.seconds
        return rerun
    name = capture.error_type or type(capture.error).__name__
    rerun.notes.insert(0, (
        f"the job failed ({name}: {first_line(capture.error)}) after peakmem shortened its "
        "DataLoader epochs (len(loader) said the shortened length): it was rerun with its "
        f"epochs as they are and stopped after {limit} optimizer steps (as --steps {limit}); "
        "what follows the training loop (evaluation, saving) was not traced; --steps all runs "
        "the job to its end"))
    rerun.mode_reason += " (rerun unshortened)"
    rerun.seconds += capture.seconds
    return rerun


def _same_error(first: CaptureResult, second: CaptureResult) -> bool:
    """Both captures failed with an error of one type and one first line."""
    from peakmem.capture.result import first_line

    def key(capture: CaptureResult) -> tuple[str, str]:
        error = capture.error
        name = capture.error_type or getattr(error, "type_name", None) or type(error).__name__
        return name, first_line(error) if error is not None else ""

    return key(first) == key(second)


def _capture_in_mode(run: Callable[[str], CaptureResult], mode: str) -> CaptureResult:
    """One capture in `mode`; auto: fake, then eager if fake mode could not run the job."""
    if mode == "eager":
        capture = run("eager")
        capture.mode_reason = "--mode eager: the job ran for real on the CPU"
        return capture
    capture = run("fake")
    reason = eager_fallback_reason(capture)
    if mode == "fake":
        capture.mode_reason = "--mode fake: device tensors were fake (meta), nothing computed"
        if reason is not None and capture.fake_limit is not None and capture.error is None:
            from peakmem.capture.runner import fake_limit_message

            capture.notes.append(fake_limit_message(reason))
        return capture
    if reason is None:
        capture.mode_reason = "auto: the whole job ran on fake tensors"
        return capture
    from peakmem.capture.eager import GIB, eager_ram_limit

    need, limit = capture.peak_device_bytes, eager_ram_limit()
    if need > limit:
        raise EstimateError(
            f"peakmem: fake mode could not run the job ({reason}), and eager mode (real CPU "
            f"execution) needs at least {need / GIB:.1f} GiB of host RAM "
            f"({limit / GIB:.1f} GiB available)",
            capture,
            3,
            reason="fake_limit",
        )
    first = capture
    capture = run("eager")
    capture.mode_reason = f"auto: fake mode could not run the job ({reason}); it ran for real on the CPU"
    capture.seconds += first.seconds
    return capture


def estimate_capture(
    capture: CaptureResult,
    gpu: GpuProfile,
    stack: StackProfile,
    *,
    torch_version: str,
    alloc_conf: str = "",
    mode: str = "fake",
    timeline: bool = False,
) -> Estimate:
    """Replay a captured trace through the allocator simulation."""
    from peakmem.allocator.simulate import simulate

    # the job's own CUDA_MODULE_LOADING where it set one before CUDA started
    loading = job_module_loading.environ_for(capture.trace.meta)
    context = int(stack.context_for(gpu, loading).value)
    libraries = dict(capture.libraries)
    # kernel families' first-use memory outside the allocator, where the GPU has a measured
    # first-use model (estimate/first_use.py; its base is then the context figure)
    libraries.update(first_use_bytes(stack, gpu, job_ops(capture), loading))
    processes = [dict(report) for report in capture.processes]
    only_children = processes_bytes(processes) > 0 and not used_device(capture)
    own_span = process_span(capture.trace.meta)
    if only_children:  # the job's own process never touched the GPU: no context of its own
        context, libraries = 0, {}
    job_conf = capture.trace.meta.get(JOB_ALLOC_CONF)
    if isinstance(job_conf, str):  # the job set its own before torch read it: torch's choice
        alloc_conf = job_conf
    config = parse_alloc_conf(alloc_conf, torch_version)
    fraction = capture.trace.meta.get("memory_fraction")
    fraction = float(fraction) if isinstance(fraction, (int, float)) and 0 <= fraction <= 1 else None
    capacity = gpu.total_memory_bytes - context - sum(libraries.values())
    limits: dict[str, Any] = dict(
        capacity_bytes=capacity, memory_fraction=fraction,
        total_bytes=gpu.total_memory_bytes if fraction is not None else None)
    result = simulate(capture.trace, config=config, torch_version=torch_version,
                      timeline=timeline, **limits)
    oom_message = result.oom_message if result.oom else None
    if fraction is not None and oom_message:
        oom_message += f" (the job capped its memory at fraction {fraction} of the GPU)"
    job_oom = simulated_oom(capture)
    if job_oom is not None and oom_message is None:
        oom_message = job_oom
    if result.oom:
        # what the job would need on a device without a limit: the size of the shortfall
        result = simulate(capture.trace, config=config, torch_version=torch_version, timeline=timeline)
        limits = {}
    # The breakdown shows what is live when allocated memory is highest (reserved memory only
    # grows, so its first maximum can come before the steady state's largest live set).
    peak_index = result.peak_allocated_index
    if peak_index is None or peak_index < 0:
        peak_index = len(capture.trace) - 1
    notes = list(capture.notes)
    if isinstance(job_conf, str):
        notes.append(job_alloc_conf_note(job_conf))
    job_loading = job_module_loading.changed_by_job(capture.trace.meta)
    if job_loading is not None:
        value = job_loading or "unset"
        notes.append(f"the job set CUDA_MODULE_LOADING ({value}) itself before CUDA started: the "
                     f"CUDA context follows it ({stack.module_loading(loading)} module loading)")
    for note in (
        eval_peak_note(capture.trace, result.peak_reserved_index,
                       lambda: _reserved_line(capture.trace, result, config, torch_version,
                                              limits),
                       result.peak_allocated_index),
        compile_bound_note(capture.trace, peak_index, int(result.peak_allocated_bytes)),
    ):
        if note is not None:
            notes.append(note)
    if job_oom is None and capture.trace.meta.get("simulated_ooms"):
        ooms = capture.trace.meta["simulated_ooms"]
        under = (
            "under its per-process memory fraction"
            if any(oom.get("fraction") is not None for oom in ooms)
            else "in a retry loop (a smaller batch after each)"
        )
        notes.append(f"the job caught {len(ooms)} CUDA out-of-memory error(s) {under} and went on")
        from peakmem.estimate.retry_notes import retry_peak_note

        retry_note = retry_peak_note(capture.trace, peak_index)
        if retry_note is not None:
            notes.append(retry_note)
    if only_children:
        notes = [note for note in notes if note != NO_DEVICE_NOTE]
        notes.append("the job's own process made no device allocations: only its child "
                     "processes used the GPU, so its own CUDA context is not counted")
    if (note := processes_note(processes)) is not None:
        notes.append(note)
    devices = [dict(report) for report in capture.devices]
    from peakmem.estimate.fallbacks import stack_note

    if stack_note(torch_version, stack):
        notes.append(stack_note(torch_version, stack))
    if job_oom is not None and oom_message == job_oom:
        notes.append(job_oom)
    elif oom_message:
        notes.append(f"the simulated run runs out of memory on this GPU: {oom_message}")
    elif result.num_alloc_retries:
        notes.append(release_and_retry_note(result.num_alloc_retries, capacity))
    from peakmem.utilization.estimate import utilization_of

    utilization_assumptions: list[str] = []
    utilization = utilization_of(capture, gpu, notes, assumptions=utilization_assumptions)
    if devices:
        own = (context + sum(libraries.values()) + int(result.peak_reserved_bytes)
               + processes_bytes(processes))
        notes.append(_devices_note(devices, own))
    return Estimate(
        gpu=gpu,
        stack=stack,
        torch_version=torch_version,
        alloc_conf=alloc_conf,
        mode=capture.mode,
        mode_reason=capture.mode_reason,
        peak_reserved_bytes=int(result.peak_reserved_bytes),
        peak_allocated_bytes=int(result.peak_allocated_bytes),
        context_bytes=context,
        breakdown=PeakBreakdown.at(capture.trace, peak_index),
        steps=capture.steps,
        seconds=capture.seconds,
        oom=oom_message is not None,
        notes=notes,
        assumptions=_assumptions(gpu, stack, libraries, op_packets(t.op for t in capture.trace.tags),
                                 loading)
        + _fake_assumptions(capture)
        + utilization_assumptions,
        capture=capture,
        simulation=result,
        libraries=libraries,
        utilization=utilization,
        processes=processes,
        devices=devices,
        own_span=own_span,
    )


def _reserved_line(trace: Any, result: Any, config: Any, torch_version: str,
                   limits: dict[str, Any]) -> list[int]:
    """Reserved bytes after each event of `trace`, as the run the figures come from had them
    (its timeline, or that run again with one: only for the evaluation-peak note)."""
    from peakmem.allocator.simulate import simulate

    line = result.timeline
    if line is None:
        line = simulate(trace, config=config, torch_version=torch_version, timeline=True,
                        **limits).timeline
    return line.reserved if line is not None else []


def _devices_note(devices: list[dict[str, Any]], own: int) -> str:
    """What the figures are with `nn.DataParallel` over several GPUs (`own`: cuda:0's peak)."""
    others = ", ".join(f"cuda:{report['device']} {report['peak_bytes']} B" for report in devices)
    largest = max(devices, key=lambda report: report["peak_bytes"])
    which = ("cuda:0's" if own >= largest["peak_bytes"]
             else f"cuda:{largest['device']}'s, more than cuda:0's {own} B")
    return (f"nn.DataParallel: {len(devices) + 1} GPUs held memory, each estimated on its own "
            f"(\"devices\": {others}); the breakdown and allocator figures are cuda:0's, the peak "
            f"is the largest GPU's: {which}")


def process_span(meta: dict[str, Any]) -> tuple[float, float] | None:
    """The job's own process's (start, end) in monotonic seconds, where the job's process
    recorded it (`process_span`: its process began after an exec, or it ran with children)."""
    span = meta.get("process_span")
    if (isinstance(span, list) and len(span) == 2
            and all(type(v) is float and math.isfinite(v) for v in span) and span[0] <= span[1]):
        return span[0], span[1]
    return None


def job_alloc_conf_note(conf: str) -> str:
    """The job chose its allocator configuration itself (capture.job_alloc_conf)."""
    return (
        f"the job set its allocator configuration itself before its first CUDA use "
        f"(PYTORCH_CUDA_ALLOC_CONF={conf!r} in its own process): torch reads that one, so the "
        "estimate simulates it (--alloc-conf and the caller's environment give only the starting "
        "point)"
    )


def release_and_retry_note(retries: int, capacity_bytes: int) -> str:
    """The job fits only because the allocator gave its cache back: torch's
    CUDACachingAllocator `malloc`, when cudaMalloc fails, frees the cached blocks
    (`release_available_cached_blocks` with max_split_size_mb, then `release_cached_blocks`:
    every unsplit cached segment) and retries before raising an out-of-memory error."""
    from peakmem.estimate.report import human_bytes

    return (
        f"the simulated run reaches what this GPU leaves the caching allocator "
        f"({human_bytes(capacity_bytes)}) and fits only by releasing its cached blocks: "
        f"{retries} cudaMalloc retr{'y' if retries == 1 else 'ies'} "
        "(torch.cuda.memory_stats()['num_alloc_retries']); peak reserved stays under that "
        "limit, and each retry synchronizes the device"
    )


def simulated_oom(capture: CaptureResult) -> str | None:
    """Where the job stopped with the out-of-memory error the capped simulated allocator raised
    in it (`set_per_process_memory_fraction`), or None."""
    if capture.error is None or not (
        capture.reason == "simulated_oom" or getattr(capture.error, "peakmem_simulated_oom", False)
    ):
        return None
    ooms = capture.trace.meta.get("simulated_ooms") or [{}]
    last = ooms[-1] if isinstance(ooms[-1], dict) else {}
    where = f" at {last['where']}" if last.get("where") else ""
    return (
        f"the job ran out of memory{where} under its per-process memory fraction "
        f"{last.get('fraction')}: it tried to allocate {last.get('bytes')} bytes (torch.OutOfMemoryError, "
        "as on the GPU); the peaks are those of the run up to there"
    )


def _check_steps(steps: Any) -> Any:
    from peakmem.jobs.stop import parse_steps

    try:
        return parse_steps(steps)
    except ValueError as exc:
        raise EstimateError(str(exc), exit_code=2) from None


def parse_alloc_conf(alloc_conf: str, torch_version: str) -> Any:
    """The allocator configuration as the target torch parses it; EstimateError if it would
    reject it."""
    from peakmem.allocator.config import AllocatorConfig, AllocatorConfigError

    try:
        return AllocatorConfig.parse(alloc_conf, torch_version)
    except AllocatorConfigError as exc:
        raise EstimateError(f"bad allocator configuration {alloc_conf!r}: {exc}", exit_code=2) from None


def _resolve(gpu: str | GpuProfile, torch_version: str | None, alloc_conf: str | None,
             job_env: dict[str, str] | None = None):
    gpu_profile = gpu if isinstance(gpu, GpuProfile) else load_gpu(gpu)
    version = torch_version or _installed_torch_version()
    stack = load_stack(version)  # refuses a torch version without allocator rules, by name
    if alloc_conf is None:  # what torch reads in the job's environment at its start
        from peakmem.capture.job_alloc_conf import environ_conf

        alloc_conf = environ_conf({**os.environ, **(job_env or {})}, version)
    conf = alloc_conf or ""
    parse_alloc_conf(conf, version)  # reject a bad configuration before running the job
    _check_cublas_workspace_config({**os.environ, **(job_env or {})})
    return gpu_profile, stack, version, conf


def _check_cublas_workspace_config(environ: dict[str, str]) -> None:
    """The job's CUBLAS_WORKSPACE_CONFIG as torch reads it; EstimateError (bad input) where
    torch's first cuBLAS call would fail on it (was: an OverflowError inside the job)."""
    from peakmem.cublas_workspace_config import WorkspaceConfigError, workspace_config_bytes

    try:
        workspace_config_bytes(environ.get("CUBLAS_WORKSPACE_CONFIG") or "")
    except WorkspaceConfigError as exc:
        raise EstimateError(str(exc), exit_code=2, reason="bad_input") from None


def _finish(capture: CaptureResult, **kwargs: Any) -> Estimate:
    if capture.error is not None and simulated_oom(capture) is None:
        raise failure(capture)
    return estimate_capture(capture, **kwargs)


def check_timeout(timeout: float | None) -> float | None:
    """A timeout is a finite positive number of seconds (or None); EstimateError otherwise."""
    if timeout is None:
        return None
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise EstimateError(
            f"the timeout must be a finite positive number of seconds, got {timeout!r}",
            exit_code=2, reason="bad_input",
        )
    return value


def estimate(
    fn: Callable[..., Any],
    *args: Any,
    gpu: str | GpuProfile = DEFAULT_GPU,
    torch_version: str | None = None,
    alloc_conf: str | None = None,
    steps: Steps = DEFAULT_STEPS,
    mode: str = "auto",
    timeout: float | None = None,
    timeline: bool = False,
    **kwargs: Any,
) -> Estimate:
    """Estimate the peak GPU memory of `fn(*args, **kwargs)` on `gpu`, without a GPU.

    `fn` is written as for a GPU (it uses "cuda"); it runs on the CPU with fake device tensors.
    `steps`: None (default): at least 3 training steps (a DataLoader epoch plus 2, a long epoch
    shortened to 3 full batches and its smaller last batch), then the training loop is ended
    early so what follows it (evaluation, predict) still runs; a loop without a DataLoader is
    ended at its head (capture.loop_ends), or, where it cannot be, the job is stopped there (the
    notes say so, and that the estimate may be low); N: stop after N steps; "all": run the job
    to its end, nothing shortened."""
    from peakmem.capture import capture_callable
    from peakmem.capture.fake_memory import allocator_target
    from peakmem.capture.job_alloc_conf import job_environment

    _check_mode(mode)
    steps = _check_steps(steps)
    timeout = check_timeout(timeout)
    gpu_profile, stack, version, conf = _resolve(gpu, torch_version, alloc_conf)
    with job_environment(conf, version), allocator_target(conf, version):
        def run(run_mode: str, run_steps: Steps = steps) -> CaptureResult:
            return capture_callable(fn, *args, gpu=gpu_profile, stack=stack, steps=run_steps,
                                    timeout=timeout, mode=run_mode, **kwargs)

        capture = _capture_with_mode(run, mode, run if steps is None else None)
    return _finish(
        capture, gpu=gpu_profile, stack=stack, torch_version=version, alloc_conf=conf,
        mode=mode, timeline=timeline,
    )


def estimate_command(
    argv: list[str],
    *,
    gpu: str | GpuProfile = DEFAULT_GPU,
    torch_version: str | None = None,
    alloc_conf: str | None = None,
    steps: Steps = DEFAULT_STEPS,
    mode: str = "auto",
    timeout: float | None = None,
    timeline: bool = False,
    max_host_memory: int | None = None,
    job_log: str | os.PathLike[str] | None = None,
    sandbox: Any = None,
    isolate: bool = True,
    nproc_per_node: int | None = None,
    nnodes: int | None = None,
    ranks: str | None = None,
) -> Estimate:
    """Estimate an unmodified `python script.py args` / `python -m module args`.

    The job runs in a child process supervised from here (``isolate=False``: in this process,
    without the limits below). `timeout`: wall-clock seconds for the whole estimate (auto mode's
    eager rerun included); `max_host_memory`: bytes the job's processes may hold resident;
    `job_log`: a file for the job's stdout and stderr (default: this process's stderr);
    `sandbox`: a command prefix for the child, or a ``peakmem.jobs.sandbox.Sandbox``. Raises
    EstimateError (``exit_code``, ``kind``, ``reason``: the contract's table) when no estimate
    can be made. A launcher command (`torchrun ...`, `accelerate launch ...`, `deepspeed ...`)
    or `nproc_per_node` / `nnodes` make it a distributed launch: `ranks` (None: rank 0, "all",
    "0,3") are traced, see estimate.distributed. An environment prefix (`env NAME=VALUE ...`,
    `NAME=VALUE ...`) sets those variables for the job, PYTORCH_CUDA_ALLOC_CONF among them
    (`alloc_conf` wins over it)."""
    _check_mode(mode)
    steps = _check_steps(steps)
    timeout = check_timeout(timeout)
    if max_host_memory is not None and max_host_memory <= 0:
        raise EstimateError(f"--max-host-memory must be positive, got {max_host_memory}",
                            exit_code=2, reason="bad_input")
    if max_host_memory is None and isolate:
        max_host_memory = _default_max_host_memory()
    from peakmem.estimate.distributed import estimate_launch, launch_for

    launch = launch_for(argv, nproc_per_node, nnodes, ranks)
    prefix_env: dict[str, str] = dict(launch.env) if launch is not None else {}
    if alloc_conf is None and "PYTORCH_CUDA_ALLOC_CONF" in prefix_env:  # `env PYTORCH_...=x`
        alloc_conf = prefix_env["PYTORCH_CUDA_ALLOC_CONF"]
    gpu_profile, stack, version, conf = _resolve(gpu, torch_version, alloc_conf, prefix_env)
    launch_notes: tuple[str, ...] = ()
    launch_env: dict[str, str] = {}
    if launch is not None and not launch.distributed:  # one process (`tune run` on one
        argv, launch_notes, launch_env = list(launch.command), launch.notes, dict(launch.env)
        launch = None  # device, an `env NAME=VALUE` prefix, a wrapper such as `nohup`)
    if launch is not None:
        return estimate_launch(
            launch, ranks, gpu=gpu_profile, stack=stack, torch_version=version, alloc_conf=conf,
            steps=steps, mode=mode, timeout=timeout, timeline=timeline,
            max_host_memory=max_host_memory, job_log=job_log, sandbox=sandbox, isolate=isolate,
        )
    _check_command(argv)
    from peakmem.estimate.distributed import rank_environment

    with rank_environment(launch_env):  # what the launcher sets for its one process
        if not isolate:
            from peakmem.capture import capture_command
            from peakmem.capture.fake_memory import allocator_target
            from peakmem.capture.job_alloc_conf import job_environment

            with job_environment(conf, version), allocator_target(conf, version):
                def run(run_mode: str, run_steps: Steps = steps) -> CaptureResult:
                    return capture_command(argv, gpu=gpu_profile, stack=stack, steps=run_steps,
                                           timeout=timeout, mode=run_mode)

                capture = _capture_with_mode(run, mode, run if steps is None else None)
        else:
            capture = _capture_supervised(
                argv, gpu_profile, version, conf, steps, mode, timeout, max_host_memory,
                job_log, sandbox,
            )
    result = _finish(
        capture, gpu=gpu_profile, stack=stack, torch_version=version, alloc_conf=conf,
        mode=mode, timeline=timeline,
    )
    result.notes = [*launch_notes, *result.notes]
    from peakmem.estimate.distributed import adopt_self_launch

    return adopt_self_launch(result, capture, argv)  # Lightning's devices=N: rank 0 of N


def _default_max_host_memory() -> int | None:
    """The host-memory cap of a job given none (jobs.host_memory: a share of the machine's
    memory, or PEAKMEM_MAX_HOST_MEMORY)."""
    from peakmem.jobs.host_memory import HostMemorySettingError, default_max_host_memory

    try:
        return default_max_host_memory()
    except HostMemorySettingError as exc:
        raise EstimateError(str(exc), exit_code=2, reason="bad_input") from None


def _check_command(argv: Sequence[str]) -> None:

    from peakmem.jobs.runner import JobSpec, JobSpecError, missing_script, script_exists

    try:
        spec = JobSpec.parse(list(argv))
        if spec.script is not None and not script_exists(spec.script):
            raise JobSpecError(missing_script(spec.script))
    except JobSpecError as exc:
        raise EstimateError(str(exc), exit_code=2, reason="bad_input") from None


def _capture_supervised(
    argv: Sequence[str],
    gpu: GpuProfile,
    version: str,
    alloc_conf: str,
    steps: int | None,
    mode: str,
    timeout: float | None,
    max_host_memory: int | None,
    job_log: str | os.PathLike[str] | None,
    sandbox: Any,
    env: dict[str, str] | None = None,
) -> CaptureResult:
    """Each capture pass in a fresh child (auto mode's eager rerun too), within one deadline."""
    from peakmem.capture.supervised import capture_in_child, timed_out
    from peakmem.profiles import ProfileError

    try:
        known = load_gpu(gpu.name) == gpu
    except ProfileError:
        known = False
    if not known:  # the child loads the profile by name
        raise EstimateError(
            f"the GPU profile {gpu.name!r} is not one of peakmem's profiles and cannot be passed "
            "to the job's process; use a profile name, or isolate=False to run in this process",
            exit_code=3, reason="unsupported",
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    log_fd = None
    if job_log is not None:
        try:
            from peakmem.jobs.job_log import open_job_log

            log_fd = open_job_log(job_log)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
            raise EstimateError(str(exc), exit_code=2, reason="bad_input") from None

    def run(run_mode: str, run_steps: Steps = steps) -> CaptureResult:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return timed_out(run_mode, timeout)
        return capture_in_child(
            argv, gpu=gpu, torch_version=version, alloc_conf=alloc_conf, steps=run_steps,
            mode=run_mode, timeout=remaining,
            max_host_memory=max_host_memory, output_fd=log_fd, sandbox=sandbox, env=env,
        )

    try:
        capture = _capture_with_mode(run, mode, run if steps is None else None)
    finally:
        if log_fd is not None:
            os.close(log_fd)
    if capture.reason == "timeout" and timeout is not None:
        capture.error_text = f"the job ran past the time limit of {timeout:g} s"
    return capture
