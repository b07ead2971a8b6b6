"""peakmem's signed error on xMem's Hugging Face and A100 LLM runs, one JSON line per run.

    python benchmarks/xmem_hf_runs.py OUT.jsonl [--group hf|llm|all] [--data DIR]
    python benchmarks/xmem_hf_runs.py OUT.jsonl --summary     # from OUT.jsonl, no estimates
    python benchmarks/xmem_hf_runs.py OUT.jsonl --installed-transformers   # the job before (no hf_451, mask passed)
    python benchmarks/xmem_hf_runs.py OUT.jsonl --summary --against OTHER.jsonl  # peak differences

Runs peakmem's xMem estimator (the bench's job command, in this process) on every xMem run that
is not a torchvision CNN, split runs included (marked), and appends per run: model, batch,
optimizer, GPU, measured bytes, the compared estimate, the simulated allocated and reserved
peaks, the signed error. A run already in OUT is skipped (reuse). `--summary` prints, per model,
the signed error in MiB of the held-out runs that did not OOM, and the under share: what
docs/BENCHMARKS.md "xMem's Hugging Face runs" reads. OUT holds public measurements: keep it out
of the repository (benchmarks/results/ is git-ignored).

Run it with `PYTHONPATH=<dir>:src` where <dir> holds transformers 4.51.3 to trace the jobs with
xMem's own transformers instead of the installed one (the job then applies nothing, hf_451.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

MiB = 2**20


def estimate_runs(out: Path, group: str, data: str | None, installed: bool) -> None:
    from peakmem.baselines import peakmem_estimator
    from peakmem.baselines.base import CannotEstimate
    from peakmem.baselines.peakmem_estimator import XMEM_CNNS, PeakmemEstimator, compared_bytes

    if installed:  # the job as it ran before hf_451.py: the installed transformers, mask passed
        command = peakmem_estimator.JOB_COMMANDS["xmem"]
        peakmem_estimator.JOB_COMMANDS["xmem"] = lambda row: [
            *command(row), "--transformers", "installed", "--all-ones-mask", "pass"]
    from peakmem.bench.calibration import in_calibration_split
    from peakmem.datasets.loaders import load_rows

    done = set()
    if out.exists():
        done = {json.loads(line)["row_id"] for line in out.read_text().splitlines()}
    rows = [r for r in load_rows("xmem", data) if r.job["model"] not in XMEM_CNNS]
    if group != "all":
        rows = [r for r in rows if r.gpu.startswith("a100") == (group == "llm")]
    estimator = PeakmemEstimator()
    for row in rows:
        if row.id in done:
            continue
        start = time.perf_counter()
        try:
            estimate = estimator.run(row)
        except CannotEstimate as exc:
            record = {"row_id": row.id, "error": str(exc)[:200]}
        else:
            compared = compared_bytes(row, estimate)
            record = {
                "row_id": row.id, "model": row.job["model"], "batch": row.job["batch_size"],
                "optimizer": row.job["optimizer"], "gpu": row.gpu,
                "split": in_calibration_split(row), "status": row.status,
                "measured": row.measured_peak_bytes, "compared": compared,
                "allocated": estimate.peak_allocated_bytes,
                "reserved": estimate.peak_reserved_bytes,
                "signed": (compared - row.measured_peak_bytes) / row.measured_peak_bytes,
                "seconds": round(time.perf_counter() - start, 1),
            }
        with out.open("a") as lines:
            lines.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


def summary(out: Path) -> None:
    records = [json.loads(line) for line in out.read_text().splitlines()]
    held = [r for r in records if "model" in r and not r["split"] and r["status"] == "ok"]
    by_model: dict[str, list[dict]] = defaultdict(list)
    for record in held:
        by_model[record["model"]].append(record)
    print("| model | runs | signed error, MiB (min / median / max) | median signed | under |")
    print("| --- | --- | --- | --- | --- |")
    for model, runs in sorted(by_model.items()):
        mib = [(r["compared"] - r["measured"]) / MiB for r in runs]
        signed = statistics.median(r["signed"] for r in runs)
        under = sum(r["signed"] < 0 for r in runs)
        print(f"| {model} | {len(runs)} | {min(mib):+.0f} / {statistics.median(mib):+.0f} / "
              f"{max(mib):+.0f} | {100 * signed:+.1f}% | {under} |")
    if held:
        mib = [(r["compared"] - r["measured"]) / MiB for r in held]
        print(f"| all | {len(held)} | {min(mib):+.0f} / {statistics.median(mib):+.0f} / "
              f"{max(mib):+.0f} | {100 * statistics.median(r['signed'] for r in held):+.1f}% | "
              f"{sum(r['signed'] < 0 for r in held)} |")


def against(out: Path, other: Path) -> None:
    """Range over the runs both files hold of OUT - OTHER: allocated peak and compared bytes."""
    def load(path: Path) -> dict[str, dict]:
        records = (json.loads(line) for line in path.read_text().splitlines())
        return {r["row_id"]: r for r in records if "model" in r}

    mine, theirs = load(out), load(other)
    common = sorted(set(mine) & set(theirs))
    if not common:
        return
    for key in ("allocated", "compared"):
        diffs = [(mine[i][key] - theirs[i][key]) / MiB for i in common]
        print(f"{key}: {out.name} - {other.name} over {len(common)} runs: "
              f"{min(diffs):+.0f} / {statistics.median(diffs):+.0f} / {max(diffs):+.0f} MiB "
              "(min / median / max)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--group", choices=("hf", "llm", "all"), default="hf")
    parser.add_argument("--data", default=None)
    parser.add_argument("--summary", action="store_true", help="summarise OUT only")
    parser.add_argument("--against", type=Path, default=None,
                        help="another OUT: print the range of the per-run peak differences")
    parser.add_argument("--installed-transformers", action="store_true",
                        help="the job as before: `--transformers installed --all-ones-mask pass`")
    args = parser.parse_args()
    if not args.summary:
        estimate_runs(args.out, args.group, args.data, args.installed_transformers)
    summary(args.out)
    if args.against is not None:
        against(args.out, args.against)


if __name__ == "__main__":
    main()
