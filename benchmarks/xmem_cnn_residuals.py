"""Where peakmem's signed error on xMem's held-out CNN runs comes from, grouped (no per-run lines).

    PYTHONPATH=src python benchmarks/xmem_cnn_residuals.py R/cache.jsonl [--data DIR]

Reads the bench cache that `benchmarks/bench_xmem_cnn.py --report R` (or `peakmem bench xmem
--report R`) wrote, keeps the held-out CNN runs that did not OOM (the declared calibration split
left out), and prints the median signed error (percent and MiB) and its range by model,
optimizer, GPU, batch size and by how close the estimate comes to the GPU's ceiling (the
highest level a run could reach above xMem's baseline: GPU total - the context as created, the
stack's context less its lazily loaded kernels), then the least-squares line signed MiB =
a + b x measured MiB and the correlation of the signed error with estimate / ceiling.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from peakmem.baselines.peakmem_estimator import XMEM_CNNS
from peakmem.bench.calibration import in_calibration_split
from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import BenchRow, MiB


@dataclass(frozen=True)
class Residual:
    model: str
    optimizer: str
    gpu: str
    batch: int
    measured_mib: float
    estimate_mib: float
    ceiling_mib: float

    @property
    def signed_mib(self) -> float:
        return self.estimate_mib - self.measured_mib

    @property
    def signed(self) -> float:
        return self.signed_mib / self.measured_mib


def ceiling_mib(gpu: str, torch_version: str) -> float:
    """GPU total - the context as created (the stack's context less its lazy kernels)."""
    from peakmem.profiles import load_gpu, load_stack

    profile, stack = load_gpu(gpu), load_stack(torch_version)
    created = int(stack.context_for(profile).value) - int(stack.lazy_loaded_for(profile).value)
    return (profile.total_memory_bytes - created) / MiB


def batch_band(r: Residual) -> str:
    return "<300" if r.batch < 300 else "300-499" if r.batch < 500 else ">=500"


def ceiling_band(r: Residual) -> str:
    share = r.estimate_mib / r.ceiling_mib
    return "<0.5" if share < 0.5 else "0.5-0.8" if share < 0.8 else ">=0.8"


GROUPS: dict[str, Callable[[Residual], str]] = {
    "model": lambda r: r.model,
    "optimizer": lambda r: r.optimizer,
    "gpu": lambda r: r.gpu,
    "batch": batch_band,
    "estimate / ceiling": ceiling_band,
}


def grouped(residuals: list[Residual], key: Callable[[Residual], str]) -> dict[str, list[Residual]]:
    found: dict[str, list[Residual]] = {}
    for r in residuals:
        found.setdefault(key(r), []).append(r)
    return dict(sorted(found.items()))


def residuals_of(rows: dict[str, BenchRow], entries: list[dict]) -> list[Residual]:
    found = []
    for entry in entries:
        result = entry["result"]
        row = rows.get(result["row_id"])
        if ("|xmem|peakmem" not in entry["key"] or row is None or result["estimate_bytes"] is None
                or row.status != "ok" or row.job["model"] not in XMEM_CNNS
                or in_calibration_split(row)):
            continue
        found.append(Residual(row.job["model"], row.job["optimizer"], row.gpu,
                              int(row.job["batch_size"]), row.measured_peak_bytes / MiB,
                              result["estimate_bytes"] / MiB, ceiling_mib(row.gpu, row.torch_version)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache")
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    rows = {r.id: r for r in load_rows("xmem", args.data)}
    with open(args.cache) as lines:
        residuals = residuals_of(rows, [json.loads(line) for line in lines])
    print(f"{len(residuals)} held-out CNN runs that did not OOM")
    for name, key in GROUPS.items():
        print(f"\n| {name} | runs | median signed | median signed MiB | min / max MiB |")
        print("| --- | --- | --- | --- | --- |")
        for label, members in grouped(residuals, key).items():
            mib = [r.signed_mib for r in members]
            print(f"| {label} | {len(members)} | {100 * statistics.median(r.signed for r in members):+.1f}% "
                  f"| {statistics.median(mib):+.0f} | {min(mib):+.0f} / {max(mib):+.0f} |")
    measured = [r.measured_mib for r in residuals]
    signed = [r.signed_mib for r in residuals]
    slope, intercept = statistics.linear_regression(measured, signed)
    print(f"\nsigned MiB = {intercept:+.0f} + {slope:.4f} x measured MiB "
          f"(correlation {statistics.correlation(measured, signed):+.2f})")
    share = [r.estimate_mib / r.ceiling_mib for r in residuals]
    print(f"correlation of the signed error with estimate / ceiling: "
          f"{statistics.correlation(share, [r.signed for r in residuals]):+.2f}")


if __name__ == "__main__":
    main()
