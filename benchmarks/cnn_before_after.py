"""Before/after per CNN family: score two estimators' results on the same bench rows.

    python benchmarks/cnn_before_after.py BEFORE.json|BEFORE_CACHE.jsonl BENCH_CACHE.jsonl

BEFORE is another bench cache (the `peakmem` results of an earlier run over the same rows), or a
JSON file that maps row id -> estimate bytes (or an error string) from the earlier estimator, e.g.
made by running `PeakmemEstimator` at an older commit over the row ids of BENCH_CACHE.jsonl (the
`--report DIR/cache.jsonl` of `peakmem bench gpumemnet-cnn`); the "after" figures are that
cache's own `peakmem` results. Prints one Markdown table: median / p90 relative error and the
share underestimated by more than 2%, per family and overall, over the rows that ran.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def summary(pairs: list[tuple[int, int]]) -> str:
    errors = [(est - meas) / meas for est, meas in pairs]
    magnitudes = sorted(abs(e) for e in errors)
    p90 = magnitudes[min(len(magnitudes) - 1, int(0.9 * len(magnitudes)))]
    under = sum(e < -0.02 for e in errors) / len(errors)
    return f"{statistics.median(magnitudes):.1%} / {p90:.1%} / {under:.0%}"


def peakmem_results(cache: Path) -> dict[str, dict]:
    """Row id -> the `peakmem` result of a bench cache (the last one, if it holds several)."""
    results: dict[str, dict] = {}
    for line in cache.read_text().splitlines():
        entry = json.loads(line)
        if entry["key"].split("|")[2].startswith("peakmem@"):
            results[entry["result"]["row_id"]] = entry["result"]
    return results


def main() -> None:
    path = Path(sys.argv[1])
    if path.suffix == ".jsonl":
        before = {rid: r["estimate_bytes"] if r["status"] == "ok" else r.get("error")
                  for rid, r in peakmem_results(path).items()}
    else:
        before = json.loads(path.read_text())
    after = peakmem_results(Path(sys.argv[2]))
    groups: dict[str, list[str]] = defaultdict(list)
    for rid, result in after.items():
        if result["status"] == "ok" and result.get("estimate_bytes") and isinstance(before.get(rid), int):
            groups[result["family"]].append(rid)
            groups["all"].append(rid)
    print("| family | rows | before: median / p90 / under > 2% | after: median / p90 / under > 2% |")
    print("| --- | --- | --- | --- |")
    for family in sorted(groups, key=lambda f: (f == "all", f)):
        rids = groups[family]
        old = [(before[r], after[r]["measured_bytes"]) for r in rids]
        new = [(after[r]["estimate_bytes"], after[r]["measured_bytes"]) for r in rids]
        print(f"| {family} | {len(rids)} | {summary(old)} | {summary(new)} |")


if __name__ == "__main__":
    main()
