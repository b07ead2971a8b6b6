"""Probe: estimate rebuilt GPUMemNet jobs (A100-40GB, torch 2.4.1) and print, per row, the
measured nvidia-smi peak minus the simulated peak reserved: the memory outside the caching
allocator that the job needed. If the trace and the allocator are exact, this is one constant per
software stack (CUDA context + libraries). This is a diagnostic, not the accuracy benchmark (that
one fits the constant on a declared calibration split and scores the rest).

    python benchmarks/gpumemnet_probe/implied_context.py mlp1 --rows 40 --seed 1
    python benchmarks/gpumemnet_probe/implied_context.py mlp2 --rows 40 --seed 3
    python benchmarks/gpumemnet_probe/implied_context.py transformer
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1].parent / "shared" / "datasets" / "gpumemnet"
FAMILIES = {
    "mlp1": ("mlp_data_step1.csv", "mlp_job.py"),
    "mlp2": ("mlp_data_step2.csv", "mlp_job.py"),
    "transformer": ("transformer_data_sample17.csv", "transformer_job.py"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--rows", type=int, default=0, help="random sample size (0: all rows)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()

    from peakmem.estimate import EstimateError, estimate_command

    table, job = FAMILIES[args.family]
    with open(args.data / table, newline="") as handle:
        rows = [
            row for row in csv.DictReader(handle)
            if row.get("Status", "SUCCESSFUL") == "SUCCESSFUL" and "output:1_" not in row["Filename"]
        ]
    if args.rows:
        rows = random.Random(args.seed).sample(rows, min(args.rows, len(rows)))
    implied = []
    for row in rows:
        try:
            result = estimate_command(
                ["python", str(HERE / job), row["Filename"]], gpu="a100-40gb", torch_version="2.4.1"
            )
        except EstimateError as exc:
            print(f"FAILED {row['Filename']}: {str(exc).splitlines()[-1]}", file=sys.stderr)
            continue
        measured = int(row["Max GPU Memory (MiB)"])
        outside = measured - result.peak_reserved_bytes / 2**20
        implied.append(outside)
        print(
            f"{row['Filename'][:72]:72s} measured {measured:6d} MiB  reserved "
            f"{result.peak_reserved_bytes / 2**20:9.1f} MiB  outside {outside:7.1f} MiB  "
            f"steps {result.steps:3d}  {result.seconds:5.1f} s",
            flush=True,
        )
    if implied:
        mode = statistics.mode(implied)
        exact = sum(abs(value - mode) <= 2 for value in implied)
        print(f"rows {len(implied)}  most common {mode:.0f} MiB  within 2 MiB of it: {exact}")


if __name__ == "__main__":
    main()
