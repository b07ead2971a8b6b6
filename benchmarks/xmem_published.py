"""peakmem's xmem rows next to the estimates xMem published for the same runs.

    python benchmarks/xmem_published.py /tmp/acc-xmem/cache.jsonl [--all] [--per-run]

Reads the bench cache that `peakmem bench xmem --estimators peakmem --report DIR` wrote and the
published columns the loader keeps (`published:<estimator>`, MiB), and prints markdown tables over
the held-out runs (the declared calibration split, peakmem.bench.calibration, left out; `--all`
keeps it): one row per estimator over the runs peakmem estimated and the estimator published
(median / p90 relative error, underestimates, estimation-failure probability:
peakmem.bench.metrics; peakmem's also at the margin it states, `peak_bytes_with_margin`), then
the same per group (GPU x family: Hugging Face models, torchvision CNNs, the A100 LLM runs) with
peakmem's median signed error, and per margin kind (estimate/margin_kinds.py; the kind each
run's stated margin shows, benchmarks/fit_xmem_margins.py `stated_kind`). `--per-run` adds one line per run;
it prints the public measurements, so keep its output out of the repository.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from peakmem.baselines.peakmem_estimator import XMEM_CNNS
from peakmem.bench.calibration import in_calibration_split
from peakmem.bench.metrics import RowResult, summarize
from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import BenchRow, MiB

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_xmem_margins import (  # noqa: E402
    carried_margins,
    context_at_creation,
    margin_sets,
    stated_kind,
)

PUBLISHED = ("xMem", "DNNMem", "SchedTune", "LLMem")


def kind_of(row: BenchRow, mine: RowResult, carried: dict[str, float]) -> str:
    """The margin kind peakmem's estimate of `row` stated (`?` when its margin fits none)."""
    peak = mine.estimate_bytes + context_at_creation(row.gpu)  # type: ignore[operator]
    added = round((mine.stated_margin or 0.0) * mine.estimate_bytes)  # type: ignore[operator]
    found = stated_kind(peak, added, margin_sets(row.gpu, carried))
    return found[0] if found else "?"


def stated_failure(results: list[RowResult]) -> float | None:
    """peakmem's failure probability at the margin it states (estimate x (1 + stated))."""
    stated = [replace(r, estimate_bytes=int(r.estimate_bytes * (1 + r.stated_margin)))
              for r in results if r.estimate_bytes is not None and r.stated_margin is not None]
    return summarize(stated)["failure_prob"] if stated else None


def group_of(row: BenchRow) -> str:
    """GPU x family: `<gpu> cnn`, `<gpu> hf`, or `a100-40gb llm` (the Colab runs)."""
    if row.job["model"] in XMEM_CNNS:
        return f"{row.gpu} cnn"
    return f"{row.gpu} {'llm' if row.gpu.startswith('a100') else 'hf'}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def published(row: BenchRow, mine: RowResult, name: str) -> RowResult | None:
    if name == "peakmem":
        return mine
    value = row.features.get(f"published:{name}", "")
    if not value:
        return None
    return RowResult(row.id, mine.family, mine.status, mine.measured_bytes, mine.gpu_total_bytes,
                     int(float(value) * MiB), None)


def signed_median(results: list[RowResult]) -> float | None:
    errors = [(r.estimate_bytes - r.measured_bytes) / r.measured_bytes
              for r in results if r.status == "ok" and r.estimate_bytes is not None]
    return statistics.median(errors) if errors else None


def table(rows: dict[str, BenchRow], ours: dict[str, RowResult], title: str) -> None:
    print(f"{title}\n")
    print("| estimator | runs | median rel. err | p90 | under | failure prob. | median signed | "
          "failure @stated margin |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ("peakmem", *PUBLISHED):
        results = [r for r in (published(rows[i], m, name) for i, m in sorted(ours.items())) if r]
        if not results:
            continue
        s = summarize(results)
        print(f"| {name} | {s['estimated']} | {_pct(s['median_rel_error'])} | "
              f"{_pct(s['p90_rel_error'])} | {_pct(s['under_rate'])} | {_pct(s['failure_prob'])} | "
              f"{_pct(signed_median(results))} | "
              f"{_pct(stated_failure(results)) if name == 'peakmem' else '-'} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache")
    parser.add_argument("--data", default=None)
    parser.add_argument("--all", action="store_true", help="keep the calibration split's runs")
    parser.add_argument("--per-run", action="store_true", help="one line per run (public data)")
    args = parser.parse_args()
    rows = {r.id: r for r in load_rows("xmem", args.data)}
    ours: dict[str, RowResult] = {}
    with open(args.cache) as lines:
        entries = [json.loads(line) for line in lines]
    for entry in entries:
        if "|xmem|peakmem" in entry["key"] and entry["result"]["estimate_bytes"] is not None:
            result = RowResult.from_json(entry["result"])
            if args.all or not in_calibration_split(rows[result.row_id]):
                ours[result.row_id] = result
    scope = "all runs" if args.all else "held-out runs (calibration split left out)"
    table(rows, ours, f"### All {len(ours)} {scope}")
    for group in sorted({group_of(rows[i]) for i in ours}):
        members = {i: m for i, m in ours.items() if group_of(rows[i]) == group}
        table(rows, members, f"### {group}: {len(members)} runs")
    carried = carried_margins()
    kinds = {i: kind_of(rows[i], m, carried) for i, m in ours.items()}
    for kind in sorted(set(kinds.values())):
        members = {i: m for i, m in ours.items() if kinds[i] == kind}
        table(rows, members, f"### margin kind {kind}: {len(members)} runs")
    if args.per_run:
        print("| run | model | batch | optimizer | GPU | measured MiB | peakmem | xMem |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for row_id, mine in sorted(ours.items()):
            row = rows[row_id]
            oom = " (OOM)" if row.status == "oom" else ""
            print(f"| {row_id} | {row.job['model']} | {row.job['batch_size']} | "
                  f"{row.job['optimizer']} | {row.gpu} | {row.measured_mib:.0f}{oom} | "
                  f"{mine.estimate_bytes / MiB:.0f} | {row.features.get('published:xMem') or '-'} |")


if __name__ == "__main__":
    main()
