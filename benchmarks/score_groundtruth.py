"""Score peakmem against this repo's own GPU measurements (benchmarks/groundtruth/*.csv, written
by `peakmem measure` / benchmarks/sweep.py / benchmarks/gpu_session.sh), figure by figure: the
device-level peak (nvidia-smi), torch's max_memory_reserved and max_memory_allocated.

    PYTHONPATH=src python benchmarks/score_groundtruth.py [--rows h100-80gb:00003,...]
        [--match TEXT] [--limit N] [--out results.json] [--reuse results.json]

Each row's measured command is estimated exactly as the bench does (`peakmem bench
groundtruth`: the row's job and args, its GPU profile, torch version, steps and allocator
config; in this process). Prints one line per row (signed errors in MiB) and a summary.
Scores the rows outside the declared calibration split (peakmem.bench.calibration: the runs the
torch-2.11 stack's H100 context and cuDNN library memory were read from); `--split` scores the
split instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from peakmem.baselines.base import CannotEstimate
from peakmem.baselines.peakmem_estimator import PeakmemEstimator
from peakmem.bench.calibration import in_calibration_split
from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import MiB

# zoo scripts whose jobs run cuDNN convolutions (their workspaces are a fitted model: reported apart)
CONVOLUTION_JOBS = ("vision.py", "xmem_cnn.py", "unet.py", "detection.py")

FIGURES = (  # (name, estimate attribute, CSV column)
    ("peak", "peak_bytes", "measured_peak_bytes"),
    ("reserved", "peak_reserved_bytes", "max_reserved_bytes"),
    ("allocated", "peak_allocated_bytes", "max_allocated_bytes"),
)


def score_row(estimator: PeakmemEstimator, row) -> dict:
    start = time.perf_counter()
    try:
        estimate = estimator.run(row)
    except CannotEstimate as exc:
        return {"error": str(exc), "job": row.job["job"], "args": row.job["args"]}
    out: dict = {"seconds": round(time.perf_counter() - start, 2),
                 "job": row.job["job"], "args": row.job["args"]}
    for name, attribute, column in FIGURES:
        measured = int(row.features[column])
        estimated = int(getattr(estimate, attribute))
        out[name] = {"measured": measured, "estimated": estimated}
    return out


def summary(results: dict[str, dict]) -> list[str]:
    good = {k: r for k, r in results.items() if "error" not in r}
    lines = [f"rows {len(results)}, estimated {len(good)}, errors {len(results) - len(good)}"]
    for name, _attribute, _column in FIGURES:
        diffs = [r[name]["estimated"] - r[name]["measured"] for r in good.values()]
        rel = [abs(d) / r[name]["measured"] for d, r in zip(diffs, good.values(), strict=True)
               if r[name]["measured"]]
        if not diffs:
            continue
        rel_sorted = sorted(rel)
        p90 = rel_sorted[min(len(rel_sorted) - 1, int(0.9 * len(rel_sorted)))]
        lines.append(
            f"{name:9s}: median |error| {100 * statistics.median(rel):.2f}%, p90 {100 * p90:.2f}%,"
            f" exact {sum(d == 0 for d in diffs)}/{len(diffs)},"
            f" within 2 MiB {sum(abs(d) <= 2 * MiB for d in diffs)}/{len(diffs)},"
            f" under by > 2 MiB {sum(d < -2 * MiB for d in diffs)}/{len(diffs)}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="", help="comma-separated row ids")
    parser.add_argument("--match", default="", help="only rows whose job or args contain this")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reuse", type=Path, default=None, help="results already computed")
    parser.add_argument("--split", action="store_true",
                        help="score the declared calibration split instead of the held-out rows")
    parser.add_argument("--split-convolutions", action="store_true",
                        help="also summarise the rows with and without cuDNN convolutions apart")
    args = parser.parse_args()

    rows = [r for r in load_rows("groundtruth") if in_calibration_split(r) == args.split]
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r.id in wanted]
    if args.match:
        rows = [r for r in rows if args.match in r.job["job"] + " " + r.job["args"]]
    rows = rows[: args.limit]
    results: dict[str, dict] = json.loads(args.reuse.read_text()) if args.reuse else {}
    estimator = PeakmemEstimator()
    for row in rows:
        if row.id not in results:
            results[row.id] = score_row(estimator, row)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))
        r = results[row.id]
        label = f"{row.id} {Path(row.job['job']).name} {row.job['args'][:60]}"
        if "error" in r:
            print(label, "error:", r["error"], flush=True)
            continue
        diffs = "  ".join(
            f"{name} {(r[name]['estimated'] - r[name]['measured']) / MiB:+.1f}" for name, *_ in FIGURES
        )
        print(f"{label}: measured {r['peak']['measured'] / MiB:.0f} MiB; est - measured: {diffs}",
              flush=True)
    for line in summary({r.id: results[r.id] for r in rows}):
        print(line)
    if args.split_convolutions:
        for label, wanted in (("without cuDNN convolutions", False), ("with cuDNN convolutions", True)):
            part = {r.id: results[r.id] for r in rows
                    if Path(r.job["job"]).name.endswith(CONVOLUTION_JOBS) == wanted}
            print(f"-- {label}:")
            for line in summary(part):
                print(line)


if __name__ == "__main__":
    main()
