"""The common row shape every benchmark dataset loader yields and every estimator reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

MiB = 2**20

Status = Literal["ok", "oom"]

# GPU profile name -> memory nvidia-smi reports as total (bytes). Used for the xMem metrics
# (failure probability, memory conserved) and the collocation simulation.
GPU_TOTAL_BYTES: dict[str, int] = {
    "a100-40gb": 40960 * MiB,
    "a100-80gb": 81920 * MiB,
    "h100-80gb": 81559 * MiB,
    "h200-141gb": 143771 * MiB,
    "rtx3060-12gb": 12288 * MiB,
    "rtx4060-8gb": 8188 * MiB,
}


@dataclass(frozen=True)
class BenchRow:
    """One measured training job.

    `job` is what an estimator needs to rebuild the job: a GPUMemNet job dataclass
    (peakmem.datasets.gpumemnet_jobs), or a small dict for the other sets ({"model", "batch_size",
    ...}). `features` holds the dataset's raw per-row columns (what feature-based estimators such as
    GPUMemNet's classifier read). `measured_peak_bytes` is device-level (nvidia-smi) unless the
    dataset says otherwise; for an `oom` row it is only the level reached before the crash.
    `measured_includes_context` is False where the dataset measured from a baseline taken after
    the CUDA context existed (xMem: NVML used - used at the first sample): an estimator that
    models the context leaves it out of what it compares with such a row.
    """

    id: str
    dataset: str
    family: str
    job: Any
    measured_peak_bytes: int
    status: Status
    gpu: str
    torch_version: str
    gpu_total_bytes: int
    features: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    measured_includes_context: bool = True

    @property
    def measured_mib(self) -> float:
        return self.measured_peak_bytes / MiB
