"""`peakmem bench xmem --estimators peakmem` restricted to xMem's torchvision CNN runs (the
held-out ones), writing the same cache lines, so benchmarks/xmem_published.py reads it.

    PYTHONPATH=src python benchmarks/bench_xmem_cnn.py --report DIR [--data DIR] [--gpu NAME]
    PYTHONPATH=src python benchmarks/xmem_published.py DIR/cache.jsonl

The 44 held-out CNN runs take ~6 minutes on two free cores, against ~20 for all 105 runs; the
cache keys are the full bench's (the dataset size is the whole set's), so a later full
`peakmem bench xmem --report DIR` reuses these results.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from peakmem.baselines import get_estimator
from peakmem.baselines.peakmem_estimator import XMEM_CNNS
from peakmem.bench.calibration import evaluation_rows
from peakmem.bench.runner import ResultCache, run_estimators
from peakmem.datasets.loaders import load_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, required=True, help="writes DIR/cache.jsonl")
    parser.add_argument("--data", default=None)
    parser.add_argument("--gpu", default="", help="only this GPU's runs (rtx3060-12gb, ...)")
    args = parser.parse_args()
    all_rows = load_rows("xmem", args.data)
    rows = [r for r in evaluation_rows(all_rows) if r.job["model"] in XMEM_CNNS
            and (not args.gpu or r.gpu == args.gpu)]
    args.report.mkdir(parents=True, exist_ok=True)
    cache = ResultCache(args.report / "cache.jsonl")
    results = run_estimators({"peakmem": get_estimator("peakmem")}, rows, dataset="xmem",
                             cache=cache, all_rows=all_rows)
    done = results["peakmem"]
    print(f"{len(done)} CNN runs estimated, {sum(r.error is not None for r in done)} errors")


if __name__ == "__main__":
    main()
