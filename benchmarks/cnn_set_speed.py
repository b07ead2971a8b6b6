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
seconds, rows, seconds per row, the extrapolation, how many rows failed, a digest of the rows'
results (row id, estimate bytes, stated margin, error: the same digest, the same estimates), and
the CPU seconds of
this process and its workers (`full_set_cpu_seconds_per_worker`: the same extrapolation from
CPU seconds, divided over the workers: what the full set takes on `--jobs` idle cores).

That extrapolation multiplies the workers' start-up (imports, the first capture in a process)
with the rows too; `row_cpu_seconds` (each estimate's own CPU seconds, measured in its worker)
separates them: `startup_cpu_seconds` is the rest of `cpu_seconds`, paid once per run, and
`full_set_cpu_seconds_per_worker_amortized` = start-up / workers + mean row CPU x the held-out
rows / workers: what the full set takes on `--jobs` idle cores with start-up paid once.

That figure still extrapolates each process's FIRST row with the rest: a process's first
capture pays one-off costs inside the row's own CPU seconds (the job's modules imported, the
capture's first set-up, the process-wide caches filled: ~1.3 CPU s for a CNN row, against
~0.2-0.4 s for the row itself), so with 30 rows and 2 workers ~2.7 s of one-off CPU were
multiplied by 1634 / 30. `full_set_cpu_seconds_per_worker_first_rows_once` pays them once per
process: (start-up + the first rows' CPU + the later rows' mean CPU x (held-out rows - the
processes that ran rows)) / workers. Each row's process and CPU seconds come from a log the
estimator appends to ($PEAKMEM_CNN_SET_ROW_LOG, a temporary file); `processes_with_rows`
counts the processes (the workers, and the bench's parent where it runs the first row itself
before forking them warm: bench/runner.py `warm_parent`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import resource
import shutil
import sys
import tempfile
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


ROW_LOG = "PEAKMEM_CNN_SET_ROW_LOG"
"""Environment variable naming the file each process appends `pid row_id cpu_seconds` to."""


class CpuTimedPeakmem(PeakmemEstimator):
    """peakmem whose Estimate.seconds are the estimate's CPU seconds in its worker; each row's
    process and CPU seconds are also appended to the file $PEAKMEM_CNN_SET_ROW_LOG names."""

    def estimate(self, row):
        start = time.process_time()
        result = super().estimate(row)
        seconds = time.process_time() - start
        if log := os.environ.get(ROW_LOG):
            with open(log, "a") as handle:  # one short line: appended whole
                handle.write(f"{os.getpid()} {row.id} {seconds:.6f}\n")
        return dataclasses.replace(result, seconds=seconds)


def first_rows_apart(log: Path) -> tuple[int, float, list[float]]:
    """(processes, the CPU seconds of each process's first row, the other rows' CPU seconds)
    from the row log: a process's first row pays its one-off costs (the job's modules
    imported, the first capture's set-up, the process-wide caches filled), once per process,
    not once per row."""
    first: dict[str, float] = {}
    later: list[float] = []
    for line in log.read_text().splitlines():
        pid, _row, seconds = line.split()
        if pid in first:
            later.append(float(seconds))
        else:
            first[pid] = float(seconds)
    return len(first), sum(first.values()), later


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--limit", type=int, default=None,
                        help="time N rows spread over the set and extrapolate (default: all)")
    parser.add_argument("--row-log", metavar="FILE", default=None,
                        help="keep the per-row log (`pid row_id cpu_seconds` lines) in FILE")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from peakmem.bench.calibration import evaluation_rows
    from peakmem.bench.runner import ResultCache, run_estimators
    from peakmem.datasets.loaders import load_rows, spread_subset

    held_out = evaluation_rows(load_rows("gpumemnet-cnn", DATA))
    rows = spread_subset(held_out, args.limit) if args.limit else held_out
    log = Path(args.row_log) if args.row_log else (
        Path(tempfile.mkdtemp(prefix="cnn_set_speed_")) / "rows.log")
    log.unlink(missing_ok=True)
    os.environ[ROW_LOG] = str(log)
    wall, cpu = time.perf_counter(), _cpu()
    estimator = CpuTimedPeakmem()
    results = run_estimators({"peakmem": estimator}, rows, dataset="gpumemnet-cnn",
                             cache=ResultCache(None), jobs=args.jobs)["peakmem"]
    seconds, cpu_seconds = time.perf_counter() - wall, _cpu() - cpu
    processes, first_cpu, later = first_rows_apart(log)
    if not args.row_log:
        shutil.rmtree(log.parent, ignore_errors=True)
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
        "processes_with_rows": processes,
        "first_rows_cpu_seconds": round(first_cpu, 1),
        "later_row_cpu_mean": round(sum(later) / len(later), 4) if later else None,
        "full_set_cpu_seconds_per_worker_first_rows_once": round(
            (startup_cpu + first_cpu + sum(later) / len(later) * (len(held_out) - processes))
            / args.jobs, 1) if later else None,
        "extrapolated": bool(args.limit),
        "errors": len(errors),
        "results_digest": hashlib.sha256(json.dumps(
            [[r.row_id, r.estimate_bytes, r.stated_margin, r.error] for r in results],
            default=str).encode()).hexdigest()[:12],
        "first_errors": errors[:5],
        "target": f"<= {TARGET_SECONDS:g} s on 2 cores",
    }
    print(json.dumps(figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
