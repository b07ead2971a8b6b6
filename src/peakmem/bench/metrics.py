"""Accuracy and safety metrics of an estimator over bench rows, as the papers report them.

- relative error |est - measured| / measured (median, p90, p99) and absolute error (MiB), over rows
  that ran (`ok`) with a measured peak > 0;
- underestimate rate: share of those rows with est < measured;
- xMem's estimation-failure probability: a job capped at its estimate (set_per_process_memory_
  fraction(est / total)) fails when est < measured; a job that really ran out of memory counts as
  accurate only when the estimate predicted it (est > GPU total). failure = 1 - accurate share;
- memory conserved per job (xMem): GPU total - estimate, averaged over accurate `ok` runs whose
  estimate fits on the GPU;
- median seconds per estimate;
- all of the above after a safety margin (estimate x (1 + margin)), and the smallest margin that
  brings the failure probability to <= 1%.
Percentiles are numpy's linear interpolation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

import numpy as np

from peakmem.datasets.rows import MiB

FAILURE_TARGET = 0.01


@dataclass(frozen=True)
class RowResult:
    """One estimator's answer on one row (estimate None when it could not estimate)."""

    row_id: str
    family: str
    status: str  # ok | oom
    measured_bytes: int
    gpu_total_bytes: int
    estimate_bytes: int | None
    seconds: float | None
    error: str | None = None
    stated_margin: float | None = None
    """The margin the estimator states for this row (peakmem's calibrated safety margin)."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RowResult:
        return cls(**data)


EXACT_BYTES = 2 * MiB  # "exact": within 2 MiB of the measured peak (nvidia-smi reports whole MiB)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _accurate(r: RowResult, estimate: float) -> bool:
    if r.status == "oom":
        return estimate > r.gpu_total_bytes
    return estimate >= r.measured_bytes


def required_margin(r: RowResult) -> float:
    """The smallest margin m with r accurate at estimate x (1 + m); inf when est is 0."""
    est = r.estimate_bytes or 0
    need = r.gpu_total_bytes + 1 if r.status == "oom" else r.measured_bytes
    if est >= need:
        return 0.0
    if est <= 0:
        return math.inf
    return need / est - 1


def margin_for_failure_rate(
    results: list[RowResult], target: float = FAILURE_TARGET
) -> float | None:
    """Smallest margin with failure probability <= target over the estimated rows."""
    margins = sorted(required_margin(r) for r in results if r.estimate_bytes is not None)
    if not margins:
        return None
    allowed_failures = math.floor(target * len(margins) + 1e-9)
    value = margins[len(margins) - 1 - allowed_failures]
    return value if math.isfinite(value) else None


def summarize(results: Iterable[RowResult], margin: float = 0.0) -> dict:
    """The metrics dict of one estimator over `results`, estimates scaled by (1 + margin)."""
    results = list(results)
    estimated = [r for r in results if r.estimate_bytes is not None]
    scale = 1.0 + margin
    rel: list[float] = []
    abs_mib: list[float] = []
    under = 0
    under_beyond_2mib = 0
    within_2mib = 0
    for r in estimated:
        if r.status != "ok" or r.measured_bytes <= 0:
            continue
        est = r.estimate_bytes * scale  # type: ignore[operator]
        rel.append(abs(est - r.measured_bytes) / r.measured_bytes)
        abs_mib.append(abs(est - r.measured_bytes) / MiB)
        under += est < r.measured_bytes
        under_beyond_2mib += est < r.measured_bytes - EXACT_BYTES
        within_2mib += abs(est - r.measured_bytes) <= EXACT_BYTES
    accurate = [r for r in estimated if _accurate(r, r.estimate_bytes * scale)]  # type: ignore[operator]
    conserved = [
        (r.gpu_total_bytes - r.estimate_bytes * scale) / MiB  # type: ignore[operator]
        for r in accurate
        if r.status == "ok" and r.estimate_bytes * scale <= r.gpu_total_bytes  # type: ignore[operator]
    ]
    seconds = [r.seconds for r in estimated if r.seconds is not None]
    return {
        "rows": len(results),
        "estimated": len(estimated),
        "cannot_estimate": len(results) - len(estimated),
        "margin": margin,
        "median_rel_error": _pct(rel, 50),
        "p90_rel_error": _pct(rel, 90),
        "p99_rel_error": _pct(rel, 99),
        "median_abs_error_mib": _pct(abs_mib, 50),
        "p99_abs_error_mib": _pct(abs_mib, 99),
        "under_rate": under / len(rel) if rel else None,
        "under_beyond_2mib_rate": under_beyond_2mib / len(rel) if rel else None,
        "within_2mib_share": within_2mib / len(rel) if rel else None,
        "failure_prob": 1 - len(accurate) / len(estimated) if estimated else None,
        "memory_conserved_mib": float(np.mean(conserved)) if conserved else None,
        "median_seconds": _pct(seconds, 50),
    }


def summarize_estimator(results: list[RowResult], margin: float) -> dict:
    """Headline metrics (no margin), the same with `margin`, the margin needed for <= 1%
    failures, and per-family metrics."""
    summary = summarize(results)
    summary["margin_for_1pct_failures"] = margin_for_failure_rate(results)
    summary["with_margin"] = summarize(results, margin)
    stated = [r for r in results if r.stated_margin is not None]
    if stated:
        summary["with_stated_margin"] = summarize(
            [replace(r, estimate_bytes=int(r.estimate_bytes * (1 + r.stated_margin)))
             if r.estimate_bytes is not None else r for r in stated]
        )
    by_family: dict[str, list[RowResult]] = defaultdict(list)
    for r in results:
        by_family[r.family].append(r)
    summary["families"] = {name: summarize(rs) for name, rs in sorted(by_family.items())}
    errors: dict[str, int] = defaultdict(int)
    for r in results:
        if r.error:
            errors[r.error] += 1
    summary["errors"] = dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5])
    return summary
