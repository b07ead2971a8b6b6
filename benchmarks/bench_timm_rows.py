"""`peakmem bench timm --estimators peakmem` on chosen rows of GPUMemNet's timm set (model and
batch size), held-out rows only, with the full bench's cache keys.

    PYTHONPATH=src python benchmarks/bench_timm_rows.py --report DIR convnext_tiny:32 convnext_atto:8 ...

Prints one line per row: model, batch, status, signed error of the estimate in percent (the
measurements themselves stay in the cache, outside the repository). For a quick before/after of a
rule that touches a few model families without the ~16-minute full set.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from peakmem.baselines import get_estimator
from peakmem.bench.calibration import evaluation_rows
from peakmem.bench.runner import ResultCache, run_estimators
from peakmem.datasets.loaders import load_rows


def parse_pick(text: str) -> tuple[str, int]:
    """"convnext_tiny:32" -> ("convnext_tiny", 32)."""
    model, _, batch = text.rpartition(":")
    if not model or not batch.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected MODEL:BATCH")
    return model, int(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("picks", nargs="+", type=parse_pick, help="MODEL:BATCH")
    parser.add_argument("--report", type=Path, required=True, help="writes DIR/cache.jsonl")
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    all_rows = load_rows("timm", args.data)
    wanted = set(args.picks)
    rows = [r for r in evaluation_rows(all_rows)
            if (r.job.get("model"), r.job.get("batch_size")) in wanted]
    args.report.mkdir(parents=True, exist_ok=True)
    results = run_estimators({"peakmem": get_estimator("peakmem")}, rows, dataset="timm",
                             cache=ResultCache(args.report / "cache.jsonl"), all_rows=all_rows)
    for row, result in zip(rows, results["peakmem"], strict=True):
        if result.estimate_bytes is None:
            print(row.job["model"], row.job["batch_size"], row.status, result.error)
            continue
        signed = (result.estimate_bytes - row.measured_peak_bytes) / row.measured_peak_bytes
        print(row.job["model"], row.job["batch_size"], row.status, f"{100 * signed:+.1f}%")


if __name__ == "__main__":
    main()
