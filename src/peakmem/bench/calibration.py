"""The declared calibration split: the rows a stack constant may be fitted on, and never scored.

Issue 3 allows fitting the one unknown constant of a software stack (its CUDA context and library
memory outside the caching allocator) on at most 10% of the GPUMemNet MLP step 1 rows. The split
is a fixed function of the row's job configuration (its `Filename`), so every run, every
estimator and every machine agrees on it, and it holds out the same rows whatever `--limit` is.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterable, Mapping

from peakmem.datasets.rows import BenchRow

CALIBRATION_BUCKETS = 10  # MLP step 1: 1 bucket of 10, ~10% of the rows (issue 3: at most 10%)
CNN_BUCKETS, CNN_TAKEN = 100, 18  # CNN: 18 buckets of 100, ~18% (issue 6: at most 20%)
TRANSFORMER_BUCKETS, TRANSFORMER_TAKEN = 100, 20  # Transformer: ~20% (issue 13: margins fitted)
XMEM_BUCKETS, XMEM_TAKEN = 100, 18  # xMem: 26 of 131 runs, 19.8% (issue 13: at most 20%)
GROUNDTRUTH_BUCKETS, GROUNDTRUTH_TAKEN = 100, 20  # this repo's GPU runs: 13 of 65 H100 runs, 20%
CALIBRATION_SPLITS = {
    "gpumemnet-mlp1": (CALIBRATION_BUCKETS, 1),
    "gpumemnet-cnn": (CNN_BUCKETS, CNN_TAKEN),
    "gpumemnet-transformer": (TRANSFORMER_BUCKETS, TRANSFORMER_TAKEN),
    "xmem": (XMEM_BUCKETS, XMEM_TAKEN),
    "groundtruth": (GROUNDTRUTH_BUCKETS, GROUNDTRUTH_TAKEN),
}
"""dataset -> (buckets, taken): a row is in the split when sha1(key) % buckets < taken, the key
being the row's `Filename` (GPUMemNet), 'xmem:' + its run directory (xMem) or 'groundtruth:' +
its job and arguments (this repo's own runs): `split_key`."""
CALIBRATION_DATASETS = set(CALIBRATION_SPLITS)
CNN_SPLIT_DESCRIPTION = f"gpumemnet-cnn rows with sha1(Filename) % {CNN_BUCKETS} < {CNN_TAKEN}"
TRANSFORMER_SPLIT_DESCRIPTION = (
    f"gpumemnet-transformer rows with sha1(Filename) % {TRANSFORMER_BUCKETS} < {TRANSFORMER_TAKEN}"
)
XMEM_SPLIT_DESCRIPTION = f"xmem runs with sha1('xmem:' + run_dir) % {XMEM_BUCKETS} < {XMEM_TAKEN}"
GROUNDTRUTH_SPLIT_CLOSED_AT = "2026-11-27T16:00:00Z"
"""The torch-2.11 stack's measured constants were fitted on the runs measured before this (the
H100 runs of 2026-11-26, the first H200 lease of 2026-11-27): runs measured later are all held
out, so that new rows never move a fitted constant."""
GROUNDTRUTH_SPLIT_DESCRIPTION = (
    "groundtruth runs with sha1('groundtruth:' + job + ' ' + args) "
    f"% {GROUNDTRUTH_BUCKETS} < {GROUNDTRUTH_TAKEN}, measured before {GROUNDTRUTH_SPLIT_CLOSED_AT}"
)
MiB = 2**20


def split_key(row: BenchRow) -> str:
    """What the split hashes: GPUMemNet's `Filename`; for xMem 'xmem:' + the run's directory
    (one per run and GPU); else the row id."""
    if row.dataset == "xmem" and "run_dir" in row.features:
        return "xmem:" + row.features["run_dir"]
    if row.dataset == "groundtruth":
        return f"groundtruth:{row.job['job']} {row.job['args']}"
    return row.features.get("Filename", row.id)


def in_calibration_split(row: BenchRow) -> bool:
    """True for the rows of a calibration dataset reserved for fitting constants: ~10% of the
    MLP step 1 rows (the stack's context constant), ~18% of the CNN rows (the cuDNN model),
    ~20% of the Transformer rows (margins), 19.8% of xMem's runs (the torch-2.6 consumer stack),
    20% of this repo's own GPU runs measured before GROUNDTRUTH_SPLIT_CLOSED_AT (the torch-2.11
    stack's measured context)."""
    split = CALIBRATION_SPLITS.get(row.dataset)
    if split is None:
        return False
    buckets, taken = split
    if row.dataset == "groundtruth" and (
        row.features.get("measured_at") or GROUNDTRUTH_SPLIT_CLOSED_AT
    ) >= GROUNDTRUTH_SPLIT_CLOSED_AT:
        return False
    return int(hashlib.sha1(split_key(row).encode()).hexdigest(), 16) % buckets < taken


def evaluation_rows(rows: Iterable[BenchRow]) -> list[BenchRow]:
    """The rows a benchmark may score: everything outside the calibration split."""
    return [row for row in rows if not in_calibration_split(row)]


def fit_context_bytes(measured_mib: list[int], simulated_reserved_bytes: list[int]) -> int:
    """The stack constant: the most common (measured - simulated reserved), to the MiB.

    nvidia-smi reports whole MiB and an exact trace leaves one constant difference, so the mode
    (not the mean) is the estimator that ignores the rows the trace still gets wrong."""
    if not measured_mib or len(measured_mib) != len(simulated_reserved_bytes):
        raise ValueError("need one simulated peak per measured row, and at least one row")
    differences = [m - round(r / MiB) for m, r in zip(measured_mib, simulated_reserved_bytes, strict=True)]
    return statistics.mode(differences) * MiB


def safety_margin(errors: list[float], failures: float = 0.01) -> float:
    """The smallest m for which estimate x (1 + m) falls below the measurement on at most
    `failures` of the rows (`errors`: (estimate - measured) / measured), rounded up to 0.5%."""
    needed = sorted(max(0.0, 1 / (1 + e) - 1) for e in errors if e > -1)
    if not needed:
        return 0.0
    allowed = int(failures * len(needed))  # rows that may stay above the margin
    return math.ceil(needed[len(needed) - 1 - allowed] * 200) / 200


def unavailable_at_baseline(
    rows: Iterable[BenchRow], totals: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Per GPU, the most device memory that can have been unavailable when a measurement took
    its baseline (the context as created and anything else resident), from the runs that ran
    out of memory: for rows whose measurement leaves the context out (xMem: NVML used - used at
    the first sample), an OOM run's measured level is what it held before cudaMalloc failed,
    so level + unavailable <= the GPU's total and unavailable <= total - the highest level.

    `totals` (GPU name -> bytes) replaces the rows' own totals (a GPU profile's figure, so that
    profile total - context - libraries is the capacity the rows saw). The bound is what that
    capacity needs: the context figure is this plus the kernels loaded after the baseline.
    GPUs without such an OOM row get no entry."""
    found: dict[str, int] = {}
    for row in rows:
        if row.status != "oom" or row.measured_includes_context:
            continue
        total = (totals or {}).get(row.gpu, row.gpu_total_bytes)
        if not total:
            continue
        bound = max(0, total - row.measured_peak_bytes)
        found[row.gpu] = min(bound, found.get(row.gpu, bound))
    return found
