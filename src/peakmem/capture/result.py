"""What a capture hands on: the trace and the facts about the run (no torch needed, so that
peakmem's own process can read a child's result without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_STEPS = None  # auto: see phases.auto_step_limit

NO_DEVICE_NOTE = (
    "WARNING: the job made no device allocations: it never used the GPU (did it run on the "
    "CPU?); the estimate is the CUDA context alone"
)


@dataclass
class CaptureResult:
    trace: Any
    steps: int
    stopped: bool
    forward_calls: int
    seconds: float
    mode: str = "fake"
    mode_reason: str = ""
    error: BaseException | None = None
    error_text: str | None = None
    exit_code: int = 0
    notes: list[str] = field(default_factory=list)
    libraries: dict[str, int] = field(default_factory=dict)
    """Device memory outside the caching allocator loaded on first use, by library family."""
    fake_limit: str | None = None
    """Fake mode: why the fake device could not run the job (an op it cannot run)."""
    host_reads: int = 0
    """Fake mode: host reads of device values answered with placeholder zeros."""
    host_reads_before_forward: int = 0
    """Fake mode: those made before the first forward pass (while the model was built)."""
    data_dependent: dict[str, int] = field(default_factory=dict)
    """Fake mode: data-dependent ops, sized from above."""
    peak_device_bytes: int = 0
    """The largest allocated device memory the capture saw (before any error)."""
    reason: str | None = None
    """Why the job failed, when it did: "raised", "exit" (sys.exit non-zero), "os_exit",
    "timeout", "fake_limit", "host_memory", "signal", "no_result", "bad_input", "internal"
    (the finer cause of the shared error contract)."""
    job_exit_code: int | None = None
    """The status the job itself asked for (sys.exit(n), os._exit(n)), when it did."""
    signal: str | None = None
    """The signal that ended the job's process (a supervised run), e.g. "SIGSEGV"."""
    error_type: str | None = None
    """The class name of the job's exception, when it raised."""
    backward_passes: int = 0
    """Backward passes the job ran (a job with backward passes is a training estimate)."""
    failure_hint: str | None = None
    """A clause for the one-line error when the job failed (e.g. it started a Python process
    of its own that used CUDA outside the fake GPU)."""
    processes: list[dict[str, Any]] = field(default_factory=list)
    """The job's spawn / forkserver child processes, as each reported itself
    (capture.spawned_children: pid, name, start method, exit code, whether it used the device and
    its device-level peak)."""
    devices: list[dict[str, Any]] = field(default_factory=list)
    """`nn.DataParallel` over several GPUs: each device other than 0 that held memory, estimated
    on its own (capture.data_parallel.device_reports); the trace is device 0's."""
    device_traces: dict[int, Any] = field(default_factory=dict)
    """The same devices' traces (in the job's process only: not sent to peakmem's)."""
    failed_after_shortening: bool = False
    """The job failed after the default step policy shortened its DataLoader epochs or ended
    its training loop, or after `len(loader)` said a shortened length: by default it is rerun
    unshortened, stopped after the step limit (estimate/api.py, `_capture_with_mode`)."""

    @property
    def trained(self) -> bool:
        return self.steps > 0


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, also for an exception whose ``__str__`` raises or returns a non-string."""
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__ may raise anything
        return f"<{type(exc).__name__}: str() failed>"
    return text if isinstance(text, str) else ""


def first_line(exc: BaseException) -> str:
    text = safe_str(exc).strip()
    return text.splitlines()[0] if text else ""
