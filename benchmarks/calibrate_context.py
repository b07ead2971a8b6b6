"""Fit a stack's one unknown constant (CUDA context + library memory outside the caching
allocator) on the declared calibration split, and nothing else.

    python benchmarks/calibrate_context.py [--dataset gpumemnet-mlp1] [--data DIR] [--jobs 2] [--write]

For every row of the split (peakmem.bench.calibration: sha1(Filename) % 10 == 0, ~10% of the
GPUMemNet MLP step 1 rows) it runs `peakmem estimate` on the rebuilt job and takes
measured nvidia-smi MiB - simulated peak reserved MiB; the constant is the most common value.
`--write` stores it in the stack profile (src/peakmem/profiles/data/stacks/torch-X.Y.toml,
[context_bytes.<gpu>]) with the split, the row count and this command as its source.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from peakmem.baselines.base import CannotEstimate
from peakmem.baselines.peakmem_estimator import PeakmemEstimator
from peakmem.bench.calibration import (
    CALIBRATION_BUCKETS,
    fit_context_bytes,
    in_calibration_split,
    safety_margin,
)
from peakmem.datasets.loaders import load_rows

MiB = 2**20
STACKS = Path(__file__).resolve().parents[1] / "src" / "peakmem" / "profiles" / "data" / "stacks"


def _simulate(row):
    try:
        return row, PeakmemEstimator().run(row).peak_reserved_bytes
    except CannotEstimate as exc:
        return row, str(exc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="gpumemnet-mlp1")
    parser.add_argument("--data", default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="store the fit in the stack profile")
    args = parser.parse_args()

    rows = [r for r in load_rows(args.dataset, args.data) if r.status == "ok"]
    split = [r for r in rows if in_calibration_split(r)]
    print(f"{args.dataset}: {len(rows)} ok rows, calibration split {len(split)} "
          f"({len(split) / len(rows):.1%})", flush=True)
    measured, reserved, failed = [], [], 0
    with ProcessPoolExecutor(args.jobs) as pool:
        for row, result in pool.map(_simulate, split, chunksize=4):
            if isinstance(result, str):
                failed += 1
                continue
            measured.append(round(row.measured_mib))
            reserved.append(result)
    context = fit_context_bytes(measured, reserved)
    diffs = Counter(m - round(r / MiB) for m, r in zip(measured, reserved, strict=True))
    within = sum(n for d, n in diffs.items() if abs(d * MiB - context) <= 2 * MiB)
    print(f"fitted context: {context // MiB} MiB ({context} B) from {len(measured)} rows "
          f"({failed} could not be estimated); within 2 MiB of it: {within}/{len(measured)}; "
          f"median difference {statistics.median(diffs.elements())} MiB")
    print("most common differences (MiB: rows):", dict(diffs.most_common(6)))
    errors = [(context + r - m * MiB) / (m * MiB) for m, r in zip(measured, reserved, strict=True)]
    margin = safety_margin(errors)
    print(f"safety margin (<= 1% of the split underestimated): {margin:.1%}")
    if args.write:
        gpu, torch_version = split[0].gpu, split[0].torch_version
        major_minor = ".".join(torch_version.split(".")[:2])
        path = STACKS / f"torch-{major_minor}.toml"
        text = path.read_text()
        block = (
            f'\n[context_bytes.{gpu}]\nvalue = {context}\n'
            f'source = "fitted: mode of measured nvidia-smi MiB - simulated peak reserved over '
            f'{len(measured)} rows of the calibration split of {args.dataset} '
            f'(sha1(Filename) % {CALIBRATION_BUCKETS} == 0; never scored); '
            f'python benchmarks/calibrate_context.py --write"\n'
        )
        block += (
            f'\n[safety_margin.{gpu}.default]\nvalue = {margin}\n'
            f'source = "fitted: the smallest margin under which <= 1% of the {len(measured)} rows '
            f'of the calibration split of {args.dataset} are underestimated; '
            f'python benchmarks/calibrate_context.py --write"\n'
        )
        for header in (f"context_bytes.{gpu}", f"safety_margin.{gpu}.default"):
            pattern = re.compile(rf"\n\[{re.escape(header)}\]\n(?:[^\[\n].*\n?)*")
            text = pattern.sub("", text)
        text = text.rstrip("\n") + "\n" + block
        path.write_text(text)
        print(f"wrote [context_bytes.{gpu}] to {path}")


if __name__ == "__main__":
    main()
