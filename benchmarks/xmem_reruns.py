"""How well xMem's own ground truth repeats: the second GPU runs its records hold.

xMem verifies every estimate by running the same job again on the same GPU, capped at the
estimate with `torch.cuda.set_per_process_memory_fraction(round(estimate / total, 2))`, and
stores that run's NVML peak only as an error (Stone-ResearchLife/xMem `exp/run.py`
`_verify_est_mem`, `format_old_json_data`: "2nd verification" error = |ground2 - memory| /
ground, memory being the estimate). The published CSV keeps it as `second_run_rel_error`, so
ground2 = estimate -/+ error x measured. A rerun whose cap lies above the first run's measured
peak (cap >= measured + `--slack` MiB) does not bind: it is the same job measured a second
time. This prints, over the runs that ran (not OOM), how far such reruns land from the first
measurement, and `--run ID` lists one run's
reruns (the bench's row id, as `xmem_published.py --per-run` prints it).

    PYTHONPATH=src python benchmarks/xmem_reruns.py [--data DIR] [--run 00117] [--per-run]

The summary is over the public measurements; `--per-run` and `--run` print them, so keep that
output out of the repository.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import BenchRow, MiB

ESTIMATORS = ("xMem", "DNNMem", "SchedTune", "LLMem")


@dataclass(frozen=True)
class Rerun:
    estimator: str
    estimate_mib: float
    cap_mib: float
    measured_mib: float  # the second run's NVML peak (second_run)

    def binds(self, first_mib: float, slack_mib: float) -> bool:
        return self.cap_mib < first_mib + slack_mib


def cap_mib(estimate_mib: float, total_mib: float) -> float:
    """The allocator cap of xMem's verification run (fraction rounded to 2 places, at most 1)."""
    return min(round(estimate_mib / total_mib, 2), 1.0) * total_mib


def second_run(estimate_mib: float, error: float, first_mib: float) -> float:
    """The verification run's peak from xMem's error |ground2 - estimate| / ground: the lower
    root, estimate - error x ground (where the cap does not bind, the rerun lies under the cap
    and so under the estimate; the other root lies above the cap)."""
    return estimate_mib - error * first_mib


def reruns(row: BenchRow, raw_by_estimator: dict[str, dict[str, str]]) -> list[Rerun]:
    first = row.measured_peak_bytes / MiB
    total = row.gpu_total_bytes / MiB
    out = []
    for name in ESTIMATORS:
        raw = raw_by_estimator.get(name)
        if raw is None or raw.get("second_run_oom") != "False":
            continue
        estimate, error = raw.get("estimate_mib", ""), raw.get("second_run_rel_error", "")
        if not estimate or not error:
            continue
        cap = cap_mib(float(estimate), total)
        out.append(Rerun(name, float(estimate), cap,
                         second_run(float(estimate), float(error), first)))
    return out


def per_estimator_rows(data: str | None) -> dict[str, dict[str, dict[str, str]]]:
    """run_dir -> estimator -> its CSV line (the loader keeps one line per run)."""
    import csv

    from peakmem.datasets.loaders import resolve_data_dir

    path = resolve_data_dir(data) / "xmem" / "xmem_runs.csv"
    out: dict[str, dict[str, dict[str, str]]] = {}
    with open(path, encoding="utf-8-sig", newline="") as fh:
        for line in csv.DictReader(fh):
            out.setdefault(line["run_dir"], {})[line["estimator"]] = line
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--run", default="", help="list this row id's reruns")
    parser.add_argument("--per-run", action="store_true")
    parser.add_argument("--slack", type=float, default=100.0,
                        help="MiB a cap must clear the first peak by to count as not binding")
    args = parser.parse_args()
    lines = per_estimator_rows(args.data)
    gaps: list[tuple[float, BenchRow]] = []
    for row in load_rows("xmem", args.data):
        if row.status != "ok":
            continue
        first = row.measured_peak_bytes / MiB
        found = reruns(row, lines.get(row.features["run_dir"], {}))
        free = [r for r in found if not r.binds(first, args.slack)]
        if args.run == row.id or args.per_run:
            for r in found:
                print(f"{row.id} {row.job['model']} b{row.job['batch_size']} "
                      f"{row.job['optimizer']} {row.gpu}: first {first:.0f} MiB; {r.estimator} "
                      f"rerun capped at {r.cap_mib:.0f} MiB "
                      f"({'binds' if r.binds(first, args.slack) else 'does not bind'}): "
                      f"{r.measured_mib:.0f} MiB ({r.measured_mib - first:+.0f})")
        for r in free:
            gaps.append((r.measured_mib - first, row))
    if not gaps:
        print("no rerun with a cap above its first peak")
        return
    values = sorted(g for g, _ in gaps)
    print(f"{len(values)} reruns whose cap does not bind, on "
          f"{len({row.id for _, row in gaps})} runs: rerun - first peak "
          f"min {values[0]:+.0f} / median {statistics.median(values):+.0f} / "
          f"max {values[-1]:+.0f} MiB; "
          f"{sum(abs(v) > 100 for v in values)} differ by more than 100 MiB")


if __name__ == "__main__":
    main()
