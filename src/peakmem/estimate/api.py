"""Estimate a job's peak GPU memory: capture -> trace -> allocator simulation -> estimate."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from peakmem.capture import DEFAULT_STEPS, CaptureResult, Unsupported
from peakmem.capture.fake_memory import allocator_target
from peakmem.estimate.breakdown import PeakBreakdown
from peakmem.estimate.phase_notes import compile_bound_note, eval_peak_note
from peakmem.jobs.stop import Steps
from peakmem.profiles import GpuProfile, StackProfile, load_gpu, load_stack

DEFAULT_GPU = "h100-80gb"
MODES = ("fake", "eager", "auto")


class EstimateError(RuntimeError):
    """The job could not be estimated (its own error, a timeout, or an unsupported mode)."""

    def __init__(self, message: str, capture: CaptureResult | None = None, exit_code: int = 1):
        super().__init__(message)
        self.capture = capture
        self.exit_code = exit_code


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

    @property
    def library_bytes(self) -> int:
        return sum(self.libraries.values())

    @property
    def peak_bytes(self) -> int:
        """Device-level peak as nvidia-smi shows it: CUDA context + libraries loaded on first
        use + peak reserved."""
        return self.context_bytes + self.library_bytes + self.peak_reserved_bytes

    @property
    def margin_kind(self) -> str:
        return margin_kind(self.libraries)

    @property
    def safety_margin(self) -> float:
        """Fraction to add so that <= 1% of the calibration split's jobs of this kind were
        underestimated (stack profile `safety_margin`; 0 where none was fitted)."""
        return float(self.stack.safety_margin_for(self.gpu, self.margin_kind).value)

    @property
    def peak_bytes_with_margin(self) -> int:
        return int(self.peak_bytes * (1 + self.safety_margin))

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
            "breakdown": dict(sorted(self.breakdown.by_category.items())),
            "top_modules": [
                {"module": name, "bytes": size} for name, size in self.breakdown.top_modules()
            ],
            "fits": self.fits,
            "safety_margin": self.safety_margin,
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
        }


def _installed_torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def margin_kind(libraries: dict[str, int]) -> str:
    """Which calibrated safety margin applies: the cuDNN model's for jobs that convolve."""
    return "cudnn_convolution" if "cudnn_convolution" in libraries else "default"


def _assumptions(
    gpu: GpuProfile, stack: StackProfile, libraries: dict[str, int] | None = None
) -> list[str]:
    used = [
        ("GPU total memory", gpu.total_memory),
        ("CUDA context", stack.context_for(gpu)),
        ("cuBLAS workspace", stack.cublas_workspace_for(gpu.capability)),
        ("cuBLASLt per-call workspace", stack.cublaslt_transient),
    ]
    if libraries is not None and "cudnn_convolution" in libraries:
        used.append(("cuDNN convolution workspace model", stack.conv_workspace_for(gpu)))
    for family in sorted(libraries or {}):
        used.append((f"{family} library memory", stack.library_bytes_for(gpu, family)))
    used.append(("safety margin", stack.safety_margin_for(gpu, margin_kind(libraries or {}))))
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


def eager_fallback_reason(capture: CaptureResult) -> str | None:
    """Why auto mode must rerun a fake capture in eager mode (None: the fake one stands)."""
    if capture.fake_limit is not None:
        return capture.fake_limit
    if simulated_oom(capture) is not None or isinstance(capture.error, Unsupported):
        return None  # the GPU would fail the same way / eager mode cannot help
    if capture.error is not None and capture.exit_code != 124 and capture.host_reads:
        error = capture.error
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return (
            f"the job failed ({type(error).__name__}: {text}) after {capture.host_reads} host "
            "read(s) of device values, which fake mode answers with zeros"
        )
    return None


def _capture_with_mode(run: Callable[[str], CaptureResult], mode: str) -> CaptureResult:
    """Run the capture in `mode`; auto: fake, then eager if fake mode could not run the job."""
    from peakmem.capture.eager import GIB, eager_ram_limit
    from peakmem.capture.runner import fake_limit_message

    if mode == "eager":
        capture = run("eager")
        capture.mode_reason = "--mode eager: the job ran for real on the CPU"
        return capture
    capture = run("fake")
    reason = eager_fallback_reason(capture)
    if mode == "fake":
        capture.mode_reason = "--mode fake: device tensors were fake (meta), nothing computed"
        if reason is not None and capture.fake_limit is not None and capture.error is None:
            capture.notes.append(fake_limit_message(reason))
        return capture
    if reason is None:
        capture.mode_reason = "auto: the whole job ran on fake tensors"
        return capture
    need, limit = capture.peak_device_bytes, eager_ram_limit()
    if need > limit:
        raise EstimateError(
            f"peakmem: fake mode could not run the job ({reason}), and eager mode (real CPU "
            f"execution) needs at least {need / GIB:.1f} GiB of host RAM "
            f"({limit / GIB:.1f} GiB available)",
            capture,
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

    context = int(stack.context_for(gpu).value)
    libraries = dict(capture.libraries)
    config = parse_alloc_conf(alloc_conf, torch_version)
    fraction = capture.trace.meta.get("memory_fraction")
    fraction = float(fraction) if isinstance(fraction, (int, float)) and 0 <= fraction <= 1 else None
    result = simulate(
        capture.trace,
        config=config,
        torch_version=torch_version,
        capacity_bytes=gpu.total_memory_bytes - context - sum(libraries.values()),
        memory_fraction=fraction,
        total_bytes=gpu.total_memory_bytes if fraction is not None else None,
        timeline=timeline,
    )
    oom_message = result.oom_message if result.oom else None
    if fraction is not None and oom_message:
        oom_message += f" (the job capped its memory at fraction {fraction} of the GPU)"
    job_oom = simulated_oom(capture)
    if job_oom is not None and oom_message is None:
        oom_message = job_oom
    if result.oom:
        # what the job would need on a device without a limit: the size of the shortfall
        result = simulate(capture.trace, config=config, torch_version=torch_version, timeline=timeline)
    # The breakdown shows what is live when allocated memory is highest (reserved memory only
    # grows, so its first maximum can come before the steady state's largest live set).
    peak_index = result.peak_allocated_index
    if peak_index is None or peak_index < 0:
        peak_index = len(capture.trace) - 1
    notes = list(capture.notes)
    for note in (
        eval_peak_note(capture.trace, result.peak_reserved_index),
        compile_bound_note(capture.trace, peak_index, int(result.peak_allocated_bytes)),
    ):
        if note is not None:
            notes.append(note)
    if job_oom is None and capture.trace.meta.get("simulated_ooms"):
        notes.append(
            f"the job caught {len(capture.trace.meta['simulated_ooms'])} CUDA out-of-memory "
            "error(s) under its per-process memory fraction and went on"
        )
    if job_oom is not None and oom_message == job_oom:
        notes.append(job_oom)
    elif oom_message:
        notes.append(f"the simulated run runs out of memory on this GPU: {oom_message}")
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
        assumptions=_assumptions(gpu, stack, libraries) + _fake_assumptions(capture),
        capture=capture,
        simulation=result,
        libraries=libraries,
    )


def simulated_oom(capture: CaptureResult) -> str | None:
    """Where the job stopped with the out-of-memory error the capped simulated allocator raised
    in it (`set_per_process_memory_fraction`), or None."""
    if not getattr(capture.error, "peakmem_simulated_oom", False):
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


def _resolve(gpu: str | GpuProfile, torch_version: str | None, alloc_conf: str | None):
    gpu_profile = gpu if isinstance(gpu, GpuProfile) else load_gpu(gpu)
    version = torch_version or _installed_torch_version()
    conf = alloc_conf if alloc_conf is not None else os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    stack = load_stack(version)  # refuses a torch version without allocator rules, by name
    parse_alloc_conf(conf, version)  # reject a bad configuration before running the job
    return gpu_profile, stack, version, conf


def _finish(capture: CaptureResult, **kwargs: Any) -> Estimate:
    if capture.error is not None and simulated_oom(capture) is None:
        raise EstimateError(capture.error_text or str(capture.error), capture, capture.exit_code)
    return estimate_capture(capture, **kwargs)


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
    early so what follows it (evaluation, predict) still runs, or the job is stopped where its
    loop does not iterate a DataLoader (the notes say so); N: stop after N steps; "all": run the
    job to its end, nothing shortened."""
    from peakmem.capture import capture_callable

    _check_mode(mode)
    steps = _check_steps(steps)
    gpu_profile, stack, version, conf = _resolve(gpu, torch_version, alloc_conf)
    with allocator_target(conf, version):
        capture = _capture_with_mode(
            lambda run_mode: capture_callable(
                fn, *args, gpu=gpu_profile, stack=stack, steps=steps, timeout=timeout,
                mode=run_mode, **kwargs,
            ),
            mode,
        )
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
) -> Estimate:
    """Estimate an unmodified `python script.py args` / `python -m module args`."""
    from peakmem.capture import capture_command

    _check_mode(mode)
    steps = _check_steps(steps)
    gpu_profile, stack, version, conf = _resolve(gpu, torch_version, alloc_conf)
    with allocator_target(conf, version):
        capture = _capture_with_mode(
            lambda run_mode: capture_command(
                argv, gpu=gpu_profile, stack=stack, steps=steps, timeout=timeout, mode=run_mode
            ),
            mode,
        )
    return _finish(
        capture, gpu=gpu_profile, stack=stack, torch_version=version, alloc_conf=conf,
        mode=mode, timeline=timeline,
    )
