"""peakmem's xmem rows next to the estimates xMem published for the same runs.

    python benchmarks/xmem_published.py /tmp/acc-xmem/cache.jsonl

Reads the bench cache that `peakmem bench xmem --estimators peakmem --report DIR` wrote and the
published columns the loader keeps (`published:<estimator>`, MiB), and prints one markdown row per
estimator over the rows peakmem estimated and the estimator published: median / p90 relative
error, underestimates, estimation-failure probability (peakmem.bench.metrics).
"""

from __future__ import annotations

import json
import sys

from peakmem.bench.metrics import RowResult, summarize
from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import MiB

PUBLISHED = ("xMem", "DNNMem", "SchedTune", "LLMem")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def main(cache_path: str) -> None:
    rows = {r.id: r for r in load_rows("xmem")}
    ours: dict[str, RowResult] = {}
    with open(cache_path) as lines:
        entries = [json.loads(line) for line in lines]
    for entry in entries:
        if "|xmem|peakmem" in entry["key"] and entry["result"]["estimate_bytes"] is not None:
            result = RowResult.from_json(entry["result"])
            ours[result.row_id] = result
    print("| estimator | runs | median rel. err | p90 | under | failure prob. |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in ("peakmem", *PUBLISHED):
        results = []
        for row_id, mine in sorted(ours.items()):
            if name == "peakmem":
                results.append(mine)
                continue
            value = rows[row_id].features.get(f"published:{name}", "")
            if value:
                results.append(RowResult(
                    row_id, mine.family, mine.status, mine.measured_bytes, mine.gpu_total_bytes,
                    int(float(value) * MiB), None,
                ))
        s = summarize(results)
        print(f"| {name} | {s['estimated']} | {_pct(s['median_rel_error'])} | "
              f"{_pct(s['p90_rel_error'])} | {_pct(s['under_rate'])} | {_pct(s['failure_prob'])} |")
    print()
    print("| run | model | batch | optimizer | GPU | measured MiB | peakmem | xMem |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row_id, mine in sorted(ours.items()):
        row = rows[row_id]
        oom = " (OOM)" if row.status == "oom" else ""
        print(f"| {row_id} | {row.job['model']} | {row.job['batch_size']} | "
              f"{row.job['optimizer']} | {row.gpu} | {row.measured_mib:.0f}{oom} | "
              f"{mine.estimate_bytes / MiB:.0f} | {row.features.get('published:xMem') or '-'} |")


if __name__ == "__main__":
    main(sys.argv[1])
