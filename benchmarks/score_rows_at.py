"""Score peakmem from another checkout (e.g. an older commit) on the rows of a bench cache.

    git worktree add /tmp/wt-before 2e28e81
    python benchmarks/score_rows_at.py /tmp/wt-before gpumemnet-cnn CACHE.jsonl OUT.json [--data DIR]

Writes {row id: estimate bytes, or the error text} for every row id in CACHE.jsonl (a
`peakmem bench --report DIR` cache), using that checkout's `src/` and job scripts; 2 processes.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def _score(task: tuple[str, str, str]) -> tuple[str, int | str]:
    dataset, data, row_id = task
    from peakmem.baselines.peakmem_estimator import PeakmemEstimator
    from peakmem.datasets.loaders import load_rows

    row = next(r for r in load_rows(dataset, data) if r.id == row_id)
    try:
        return row_id, int(PeakmemEstimator().estimate_bytes(row))
    except Exception as exc:  # the other checkout's failure, recorded as such
        return row_id, f"{type(exc).__name__}: {exc}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("dataset")
    parser.add_argument("cache", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    args = parser.parse_args()
    sys.path.insert(0, str(args.checkout / "src"))  # before anything imports peakmem
    ids = sorted({json.loads(line)["result"]["row_id"] for line in args.cache.open()})
    with ProcessPoolExecutor(2) as pool:
        results = dict(pool.map(_score, [(args.dataset, args.data, i) for i in ids]))
    args.out.write_text(json.dumps(results))
    print(f"{len(results)} rows -> {args.out}")


if __name__ == "__main__":
    main()
