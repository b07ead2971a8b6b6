"""Time peakmem over the held-out GPUMemNet CNN set, as `peakmem bench` runs it (issue 14: the
1634 rows in <= 3 min on 2 cores).

    python benchmarks/cnn_set_speed.py [--jobs 2] [--limit N] [--json]

The rows are the CNN set's evaluation rows (outside the calibration split); `--limit N` takes N
of them spread over the set (`spread_subset`, the bench's own) and extrapolates the full set's
time from their wall time (rows x seconds per row of the sample). The estimates run in `--jobs`
worker processes through the bench's own runner (`run_estimators`, no result cache), so the
time is the bench's: workers' start-up, imports and every row (the CNN rows run `--steps 10`
with step repetition: `row_capture_options`, docs/BENCHMARKS.md "Steady-state step
repetition"). Prints one JSON object: wall
seconds, rows, seconds per row, the extrapolation, how many rows failed, and the CPU seconds of
this process and its workers (`full_set_cpu_seconds_per_worker`: the same extrapolation from
CPU seconds, divided over the workers: what the full set takes on `--jobs` idle cores).

That extrapolation multiplies the workers' start-up (imports, the first capture in a process)
with the rows too; `row_cpu_seconds` (each estimate's own CPU seconds, measured in its worker)
separates them: `startup_cpu_seconds` is the rest of `cpu_seconds`, paid once per run, and
`full_set_cpu_seconds_per_worker_amortized` = start-up / workers + mean row CPU x the held-out
rows / workers: what the full set takes on `--jobs` idle cores with start-up paid once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "datasets"
if not DATA.is_dir():
    DATA = Path("/work/shared/datasets")
TARGET_SECONDS = 180.0

from peakmem.baselines.peakmem_estimator import PeakmemEstimator  # noqa: E402  (no torch import)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class CpuTimedPeakmem(PeakmemEstimator):
    """peakmem whose Estimate.seconds are the estimate's CPU seconds in its worker."""

    def estimate(self, row):
        start = time.process_time()
        result = super().estimate(row)
        return dataclasses.replace(result, seconds=time.process_time() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--limit", type=int, default=None,
                        help="time N rows spread over the set and extrapolate (default: all)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from peakmem.bench.calibration import evaluation_rows
    from peakmem.bench.runner import ResultCache, run_estimators
    from peakmem.datasets.loaders import load_rows, spread_subset

    held_out = evaluation_rows(load_rows("gpumemnet-cnn", DATA))
    rows = spread_subset(held_out, args.limit) if args.limit else held_out
    wall, cpu = time.perf_counter(), _cpu()
    estimator = CpuTimedPeakmem()
    results = run_estimators({"peakmem": estimator}, rows, dataset="gpumemnet-cnn",
                             cache=ResultCache(None), jobs=args.jobs)["peakmem"]
    seconds, cpu_seconds = time.perf_counter() - wall, _cpu() - cpu
    row_cpu = sum(r.seconds or 0.0 for r in results)
    startup_cpu = max(cpu_seconds - row_cpu, 0.0)
    per_row = seconds / len(rows)
    errors = [f"{r.row_id}: {r.error}" for r in results if r.error]
    figure = {
        "figure": "gpumemnet_cnn_held_out_set_seconds",
        "jobs": args.jobs,
        "rows_timed": len(rows),
        "held_out_rows": len(held_out),
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu_seconds, 1),
        "seconds_per_row": round(per_row, 3),
        "full_set_seconds": round(per_row * len(held_out), 1) if args.limit else round(seconds, 1),
        "full_set_cpu_seconds_per_worker": round(
            cpu_seconds / len(rows) * len(held_out) / args.jobs, 1),
        "row_cpu_seconds": round(row_cpu, 1),
        "startup_cpu_seconds": round(startup_cpu, 1),
        "full_set_cpu_seconds_per_worker_amortized": round(
            (startup_cpu + row_cpu / len(rows) * len(held_out)) / args.jobs, 1),
        "extrapolated": bool(args.limit),
        "errors": len(errors),
        "first_errors": errors[:5],
        "target": f"<= {TARGET_SECONDS:g} s on 2 cores",
    }
    print(json.dumps(figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
