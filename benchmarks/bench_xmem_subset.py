"""`peakmem bench xmem --estimators peakmem` restricted to some of xMem's held-out groups (GPU x
family, as `xmem_published.py` names them: `rtx3060-12gb hf`, `rtx4060-8gb cnn`,
`a100-40gb llm`, ...), writing the same cache lines, so benchmarks/xmem_published.py reads it.

    PYTHONPATH=src python benchmarks/bench_xmem_subset.py --report DIR \\
        --groups "rtx3060-12gb hf,rtx4060-8gb hf,a100-40gb llm" [--data DIR] [--jobs 2]
    PYTHONPATH=src python benchmarks/xmem_published.py DIR/cache.jsonl

The cache keys are the full bench's (the dataset size is the whole set's), so a later full
`peakmem bench xmem --report DIR` reuses these results (bench_xmem_cnn.py does the same for the
CNN runs). `xmem_published.py` prints only the groups the cache holds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from peakmem.baselines import get_estimator
from peakmem.bench.calibration import evaluation_rows
from peakmem.bench.runner import ResultCache, run_estimators
from peakmem.datasets.loaders import load_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from xmem_published import group_of  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, required=True, help="writes DIR/cache.jsonl")
    parser.add_argument("--groups", required=True,
                        help="comma-separated groups (xmem_published.py's group_of)")
    parser.add_argument("--data", default=None)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    wanted = {name.strip() for name in args.groups.split(",") if name.strip()}
    all_rows = load_rows("xmem", args.data)
    rows = [r for r in evaluation_rows(all_rows) if group_of(r) in wanted]
    args.report.mkdir(parents=True, exist_ok=True)
    cache = ResultCache(args.report / "cache.jsonl")
    results = run_estimators({"peakmem": get_estimator("peakmem")}, rows, dataset="xmem",
                             cache=cache, all_rows=all_rows, jobs=args.jobs)
    done = results["peakmem"]
    print(f"{len(done)} runs of {sorted(wanted)} estimated, "
          f"{sum(r.error is not None for r in done)} errors")


if __name__ == "__main__":
    main()
