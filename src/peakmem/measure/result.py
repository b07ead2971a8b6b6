"""What one measurement recorded, and its JSON form (the keys `peakmem estimate --json` uses)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class MeasureStatus(StrEnum):
    OK = "ok"
    OOM = "oom"  # torch.cuda.OutOfMemoryError: recorded, not a crash
    ERROR = "error"  # the script raised something else, or exited non-zero
    TIMEOUT = "timeout"


# the keys every --json object starts with, in this order (shared with `peakmem estimate --json`)
JSON_KEYS = (
    "peak_bytes",
    "peak_reserved_bytes",
    "peak_allocated_bytes",
    "context_bytes",
    "status",
    "gpu",
    "driver",
    "cuda",
    "torch",
    "alloc_conf",
    "seconds",
    "steps",
)


@dataclass
class MeasureResult:
    peak_bytes: int  # device-level peak used memory of the process (what nvidia-smi shows)
    peak_reserved_bytes: int  # torch.cuda.max_memory_reserved
    peak_allocated_bytes: int  # torch.cuda.max_memory_allocated
    context_bytes: int  # used memory outside PyTorch's allocator at the end of the run
    status: MeasureStatus
    gpu: str
    driver: str
    cuda: str
    torch: str
    alloc_conf: str
    seconds: float
    steps: int
    # extra detail, after the shared keys
    steps_requested: int | None = None
    peak_source: str = ""  # "unknown": peak_bytes and context_bytes are 0, see peak_unknown
    peak_unknown: str = ""  # why the peak cannot be stated (peakmem.measure.peak_source)
    samples: int = 0
    sample_hz: float = 0.0
    total_bytes: int = 0
    job: str = ""
    exit_code: int = 0
    error: str = ""
    snapshot: str = ""
    peak_resets: int = 0  # the job's own resets of torch's peak counters (probe.PeakResets):
    # peak_reserved_bytes / peak_allocated_bytes are the run's maxima all the same

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = str(self.status)
        data["seconds"] = round(self.seconds, 3)
        data["sample_hz"] = round(self.sample_hz, 1)
        ordered = {key: data.pop(key) for key in JSON_KEYS}
        ordered.update(data)
        return ordered


def allocator_config(environ: dict[str, str] | None = None) -> str:
    """The allocator configuration in effect: PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF."""
    env = os.environ if environ is None else environ
    for name in ALLOC_CONF_VARS:
        value = env.get(name, "").strip()
        if value:
            return value
    return ""
