"""The first-use model's misses on the runs measured from a given time on (e.g. one lease's held-out
rows), per kind of job and for the classes that miss by more than NVML's 2 MiB step. Reuses
benchmarks/score_context.py's prediction on its cached captures (run that script first).

    PYTHONPATH=src python benchmarks/score_context_since.py --since 2026-11-27T16 [--gpu h200]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from score_context import DEFAULT_OPS, class_key, kind_of, predicted, summarise  # noqa: E402

from peakmem.datasets.loaders import load_rows  # noqa: E402
from peakmem.datasets.rows import MiB  # noqa: E402
from peakmem.estimate.first_use import families_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", required=True, help="measured_at prefix, UTC (2026-11-27T16)")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--ops", type=Path, default=DEFAULT_OPS)
    args = parser.parse_args()
    cache = json.loads(args.ops.read_text())
    rows = [r for r in load_rows("groundtruth") if r.gpu == args.gpu
            and r.features.get("context_bytes") and r.features["measured_at"] >= args.since]  # fmt: skip
    by_kind: dict[str, list[int]] = defaultdict(list)
    by_class: dict[str, list[int]] = defaultdict(list)
    missing = 0
    for row in rows:
        seen = cache.get(class_key(row))
        if seen is None or "error" in seen:
            missing += 1
            continue
        miss = predicted(row, seen) - int(row.features["context_bytes"])
        by_kind[kind_of(class_key(row), seen["libraries"])].append(miss)
        by_class[class_key(row)].append(miss)
    print(f"{args.gpu}: {len(rows)} runs measured from {args.since}, {missing} not captured")
    for kind, misses in sorted(by_kind.items()):
        print(summarise(kind, misses))
    print(summarise("all", [m for misses in by_kind.values() for m in misses]))
    for key, misses in sorted(by_class.items()):
        if any(abs(m) > 2 * MiB for m in misses):
            families = sorted(families_run(cache[key]["ops"])) + cache[key]["libraries"]
            print(f"  {key}: {summarise('', misses).lstrip(': ')}; families {families}")


if __name__ == "__main__":
    main()
