"""CPU seconds of the meta cache's misses over held-out GPUMemNet CNN rows, with the fast
layouts (capture/fast_layouts.py) and with every op's own meta kernel (issue 14).

    python benchmarks/meta_miss_cost.py [--rows 16] [--rounds 2] [--top 15] [--dataset NAME]

The rows (`spread_subset` of the held-out set, the first one a warm-up) are estimated in this
process as the bench does (`PeakmemEstimator`), alternately with the fast layouts on and off
(`FAST_LAYOUTS` emptied), `--rounds` times each; each round starts with an empty meta cache, so
every row's first calls miss as in a fresh bench worker. Prints one JSON line per round (CPU
seconds of the rows, of the cache's misses, of its hits, the misses answered by the fast
layouts, and whether every row's estimate matched the other way's) and the `--top` ops by miss
CPU seconds of the last round each way.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
if not DATA.is_dir():
    DATA = Path("/work/shared/datasets")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--dataset", default="gpumemnet-cnn",
                        help="the bench set whose held-out rows are estimated (branch s1)")
    args = parser.parse_args()

    from peakmem.baselines.peakmem_estimator import PeakmemEstimator
    from peakmem.bench.calibration import evaluation_rows
    from peakmem.capture import fast_layouts, meta_cache, recorder
    from peakmem.datasets.loaders import load_rows, spread_subset

    rows = spread_subset(evaluation_rows(load_rows(args.dataset, DATA)), args.rows)
    estimator = PeakmemEstimator()
    rules = dict(fast_layouts.FAST_LAYOUTS)
    miss_cpu: collections.Counter = collections.Counter()
    hit_cpu = [0.0]
    original = meta_cache.MetaCache.call

    def timed(self, func, call_args, kwargs):
        misses, start = self.misses, time.process_time()
        out = original(self, func, call_args, kwargs)
        spent = time.process_time() - start
        if self.misses != misses:
            miss_cpu[str(func)] += spent
        else:
            hit_cpu[0] += spent
        return out

    def estimate_all(fast: bool) -> tuple[dict, list]:
        fast_layouts.FAST_LAYOUTS.clear()
        if fast:
            fast_layouts.FAST_LAYOUTS.update(rules)
        cache = recorder.SHARED_CACHE = meta_cache.MetaCache()
        miss_cpu.clear()
        hit_cpu[0] = 0.0
        results = []
        start = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            for row in rows[1:]:
                results.append(estimator.estimate(row))
        figure = {
            "fast_layouts": fast, "rows": len(rows) - 1,
            "rows_cpu_seconds": round(time.process_time() - start, 2),
            "miss_cpu_seconds": round(sum(miss_cpu.values()), 2),
            "hit_cpu_seconds": round(hit_cpu[0], 2),
            "misses": cache.misses, "answered_fast": cache.fast, "hits": cache.hits,
        }
        return figure, [(r.peak_bytes, r.stated_margin) for r in results]

    meta_cache.MetaCache.call = timed
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        estimator.estimate(rows[0])  # warm-up: imports, first calls
    tops = {}
    estimates: dict[bool, list] = {}
    for _ in range(args.rounds):
        for fast in (False, True):
            figure, estimates[fast] = estimate_all(fast)
            figure["same_estimates"] = estimates[fast] == estimates.get(not fast, estimates[fast])
            print(json.dumps(figure), flush=True)
            tops[fast] = miss_cpu.most_common(args.top)
    fast_layouts.FAST_LAYOUTS.update(rules)
    for fast, top in tops.items():
        print(f"\nmiss CPU ms by op, fast layouts {'on' if fast else 'off'}:")
        for name, seconds in top:
            print(f"  {seconds * 1000:8.1f}  {name}")
    return 0 if estimates[True] == estimates[False] else 1


if __name__ == "__main__":
    sys.exit(main())
