"""`peakmem batch` over a 1,000-job file: in one process (`--in-process`) against a local Ray
with 2 workers, the same jobs and the same estimator (the fake one spinning the CPU
`--cpu-seconds` per job, as a real estimate is CPU work). Wall-clock times include Ray's
start-up.

    PYTHONPATH=src python benchmarks/batch_scaling.py --jobs 1000 --cpu-seconds 0.05 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(jobs: Path, extra: list[str], cpu_seconds: float) -> tuple[float, dict]:
    out = jobs.with_name(f"results-{int(time.time() * 1000)}.jsonl")
    env = {**os.environ, "PEAKMEM_FAKE_ESTIMATE_CPU_SECONDS": str(cpu_seconds)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "peakmem", "batch", str(jobs), "-o", str(out), "--json",
         "--estimator", "peakmem.service.estimators:fake_estimator", *extra],
        env=env, capture_output=True, text=True, timeout=3600,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len({line["id"] for line in lines}), "duplicated results"
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--cpu-seconds", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = Path(tmp) / "jobs.jsonl"
        jobs.write_text("".join(
            json.dumps({"id": f"job-{i}", "files": {"train.py": f"# {i}\n"},
                        "command": ["python", "train.py"]}) + "\n" for i in range(args.jobs)))
        one_seconds, one = run(jobs, ["--in-process"], args.cpu_seconds)
        ray_seconds, ray = run(jobs, ["--workers", str(args.workers)], args.cpu_seconds)
    report = {
        "jobs": args.jobs, "cpu_seconds_per_job": args.cpu_seconds, "workers": args.workers,
        "in_process_seconds": round(one_seconds, 1), "ray_seconds": round(ray_seconds, 1),
        "ray_over_in_process": round(ray_seconds / one_seconds, 3),
        "in_process_done": one["done"], "ray_done": ray["done"],
        "load_average": os.getloadavg()[0], "cpu_count": os.cpu_count(),
    }
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
