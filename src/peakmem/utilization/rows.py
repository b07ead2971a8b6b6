"""The measured utilization of a bench row, the declared fit split, and the per-row facts the
model needs beyond the trace (the original job's DataLoader workers).

GPUMemNet's MLP and CNN rows carry DCGM's `Avg GRACT`, `Avg SMACT`, `Avg SMOCC`, `Avg FP32A`
(fractions, means of the non-zero 1 s samples of a ~60 s run; -1 where the log was empty) and
nvidia-smi's `Avg GPUTL` (percent). There is no DRAMA column: DRAMA is predicted, not scored.
"""

from __future__ import annotations

import hashlib
import math

from peakmem.datasets.rows import BenchRow

METRICS = ("gract", "smact", "smocc", "fp32a")
COLUMNS = {"gract": "Avg GRACT", "smact": "Avg SMACT", "smocc": "Avg SMOCC", "fp32a": "Avg FP32A"}
DATASETS = ("gpumemnet-mlp1", "gpumemnet-mlp2", "gpumemnet-cnn")

FIT_BUCKETS, FIT_TAKEN = 100, 20
FIT_SPLIT_DESCRIPTION = (
    f"rows with sha1('utilization:' + Filename) % {FIT_BUCKETS} < {FIT_TAKEN} (~20%)"
)
"""The declared split the model's free parameters are fitted on (never scored)."""

# what the original launchers did that the bench's rebuilt job does not (it loads its batches
# in the capture's main process): DataLoader workers and pinned memory, per family
LOADER = {"mlp": (0, False), "cnn": (2, True), "transformer": (2, True)}


def in_fit_split(row: BenchRow) -> bool:
    key = "utilization:" + row.features.get("Filename", row.id)
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % FIT_BUCKETS < FIT_TAKEN


def measured(row: BenchRow) -> dict[str, float] | None:
    """The row's measured means (0..1), or None when it has none (an empty log, a crash)."""
    if row.status != "ok":
        return None
    values = {}
    for metric, column in COLUMNS.items():
        try:
            value = float(row.features.get(column, ""))
        except ValueError:
            return None
        if not math.isfinite(value) or value < 0 or value > 1.0001:
            return None
        values[metric] = value
    return values


def loader_of(row: BenchRow) -> tuple[int, bool]:
    return LOADER.get(getattr(row.job, "family", ""), (0, False))
