"""The library-job scripts (tests/library_jobs: public training scripts run unmodified), measured
on a GPU and estimated here, side by side.

1. Here: export the jobs the tests run (their working directories and the files their arguments
   name; tests/library_jobs/harness.py `PEAKMEM_EXPORT_JOBS`):

       PEAKMEM_EXPORT_JOBS=$PWD/.gpu/export python -m pytest -q -n 2 tests/library_jobs

2. On the GPU machine (`.gpu/export` carried), each job run to its end under `peakmem measure`
   (`--steps` far beyond what the tests' small flags run, a wall-clock limit per job), several at
   a time (NVML's per-process readings and torch's counters are per process), with an allocator
   snapshot shrunk to a digest; results appended as they come, packed after every job:

       python3 benchmarks/gpu_library_jobs.py measure .gpu/export --out $OUT --budget-s 420

3. Here: each measured job estimated as it ran (`--gpu` its profile, `--torch` its version,
   `--steps all`, and the default policy), and the table:

       python benchmarks/gpu_library_jobs.py estimate .gpu/export RESULTS.jsonl --out EST.jsonl
       python benchmarks/gpu_library_jobs.py table RESULTS.jsonl EST.jsonl
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "library_jobs" / "scripts"
ALL_STEPS = 1_000_000
"""`peakmem measure --steps` for a job run to its end."""


def read_lines(path: str | Path) -> list[dict]:
    """A JSON-lines file's objects (blank lines skipped)."""
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


def read_jobs(export: Path) -> list[dict]:
    return read_lines(export / "jobs.jsonl")


def job_command(job: dict, python: str) -> list[str]:
    if job["script"] == "-m":
        return [python, "-m", *job["args"]]
    return [python, str(SCRIPTS / job["script"]), *job["args"]]


def _steps(job: dict) -> int:
    """The test's own `--steps N`, else the job run to its end (`ALL_STEPS`)."""
    steps = job.get("steps")
    return int(steps) if steps and steps != "all" else ALL_STEPS


def _job_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    return env


def _scratch_copy(export: Path, job: dict) -> Path:
    """A fresh copy of the job's directory (its writes stay out of the export)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"libjob-{job['id']}-"))
    shutil.copytree(export / "jobs" / job["id"], scratch / "job", symlinks=True)
    return scratch / "job" / "cwd"


def measure_one(export: Path, job: dict, out: Path, timeout: float, snapshot: bool) -> dict:
    cwd = _scratch_copy(export, job)
    result_file = out / "json" / f"{job['id']}.json"
    command = [sys.executable, "-m", "peakmem", "measure", "--json", "--steps", str(_steps(job)),
               "--timeout", str(timeout), "--out", str(result_file)]
    pickle = cwd.parent / "snapshot.pickle"
    if snapshot:
        command += ["--snapshot", str(pickle)]
    command += ["--", *job_command(job, sys.executable)]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=cwd, env=_job_env(), capture_output=True, text=True,
                              timeout=timeout + 60, stdin=subprocess.DEVNULL)
        rc, tail = done.returncode, (done.stderr or "")[-3000:]
    except subprocess.TimeoutExpired:
        rc, tail = 124, "peakmem measure outlived its limit"
    row = {"id": job["id"], "test": job["test"], "script": job["script"], "args": job["args"],
           "rc": rc, "wall_s": round(time.monotonic() - started, 2)}
    try:
        row["measured"] = json.loads(result_file.read_text())
    except (OSError, ValueError):
        row["measured"] = None
        row["stderr_tail"] = tail
    if row["measured"] and row["measured"].get("status") != "ok":
        row["stderr_tail"] = tail
    if snapshot and pickle.is_file():
        digest = out / "digests" / f"{job['id']}.json.gz"
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "snapshots" / "digest.py"),
                        str(pickle), str(digest)], env=_job_env(), capture_output=True,
                       timeout=120)
    shutil.rmtree(cwd.parent.parent, ignore_errors=True)
    if snapshot and "rerun without --snapshot" in str((row["measured"] or {}).get("error")):
        row = measure_one(export, job, out, timeout, snapshot=False)  # session.SNAPSHOT_HINT
        row["snapshot_dropped"] = True
    return row


def measure(args: argparse.Namespace) -> int:
    export, out = Path(args.export), Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="libjobs-"))
    (work / "json").mkdir()
    (work / "digests").mkdir()
    jobs = [job for job in read_jobs(export) if not job["launcher"]]
    random.Random(0).shuffle(jobs)  # a run cut short by its budget samples every round
    done_ids: set[str] = set()
    results = work / "results.jsonl"
    lock = threading.Lock()
    deadline = time.monotonic() + args.budget_s

    def pack(digests: bool = True) -> None:
        """The results first (small), the snapshot digests apart (a file over the device
        tool's 16 MiB limit does not come back: the results must not ride with them)."""
        with tarfile.open(out / "library_jobs.tgz", "w:gz") as tar:
            tar.add(work / "json", arcname="library_jobs/json")
        shutil.copy(results, out / "results.jsonl")
        if digests:
            with tarfile.open(out / "digests.tgz", "w") as tar:  # already gzipped, each
                tar.add(work / "digests", arcname="library_jobs/digests")

    def run(job: dict) -> None:
        if time.monotonic() + args.timeout_s > deadline:
            return
        row = measure_one(export, job, work, args.timeout_s, args.snapshot)
        with lock:
            with open(results, "a") as lines:
                lines.write(json.dumps(row) + "\n")
            done_ids.add(job["id"])
            m = row["measured"] or {}
            print(f"[{len(done_ids)}/{len(jobs)}] {job['id']} {job['script']} rc={row['rc']} "
                  f"{m.get('status')} steps={m.get('steps')} peak={m.get('peak_bytes')} "
                  f"reserved={m.get('peak_reserved_bytes')} {row['wall_s']}s", flush=True)
            pack(digests=len(done_ids) % 10 == 0)

    results.touch()
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(run, jobs))
    pack()
    print(f"measured {len(done_ids)} of {len(jobs)} jobs", flush=True)
    return 0


def estimate(args: argparse.Namespace) -> int:
    export = Path(args.export)
    jobs = {job["id"]: job for job in read_jobs(export)}
    rows = read_lines(args.results)
    seen = set()
    if Path(args.out).exists():
        seen = {row["id"] for row in read_lines(args.out)}
    for row in rows:
        m = row.get("measured") or {}
        if row["id"] in seen or m.get("status") != "ok":
            continue
        job = jobs[row["id"]]
        torch_version = ".".join(str(m.get("torch", "")).split("+")[0].split(".")[:2])
        out: dict = {"id": row["id"], "script": job["script"]}
        ran_to_end = _steps(job) == ALL_STEPS
        policies = (("all", ["--steps", "all"]), ("default", [])) if ran_to_end else (
            ("all", ["--steps", str(_steps(job))]),)
        policies = tuple(p for p in policies if p[0] in args.policies)
        for policy, steps in policies:
            cwd = _scratch_copy(export, job)
            command = [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", args.gpu,
                       "--torch", torch_version, "--timeout", str(args.timeout_s), *steps,
                       *(["--mode", job["mode"]] if job.get("mode") else []),
                       "--", *job_command(job, "python")]
            started = time.monotonic()
            try:
                done = subprocess.run(command, cwd=cwd, env=_job_env(), capture_output=True,
                                      text=True, timeout=args.timeout_s + 120)
                data = json.loads(done.stdout) if done.stdout.strip() else {}
            except (subprocess.TimeoutExpired, ValueError):
                data = {}
            shutil.rmtree(cwd.parent.parent, ignore_errors=True)
            out[policy] = {key: data.get(key) for key in (
                "peak_bytes", "peak_reserved_bytes", "peak_allocated_bytes", "steps", "error")}
            out[policy]["seconds"] = round(time.monotonic() - started, 1)
        with open(args.out, "a") as lines:
            lines.write(json.dumps(out) + "\n")
        print(row["id"], job["script"], json.dumps(out["all"]), flush=True)
    return 0


FIGURES = ("peak_bytes", "peak_reserved_bytes", "peak_allocated_bytes")
COUNTER_RESETTING = frozenset({"p_batch_from_memory.py", "r19b_mixed_precision_tutorial.py",
                               "hf_causal_lm_loop.py", "r3_llmc_train_gpt2.py",
                               "r4_accelerate_fsdp_peak_mem.py"})
"""Scripts that reset torch's peak counters: measured before `peakmem measure` read them before
each reset (no `peak_resets` key in their rows), their max reserved / allocated are the last
epoch's, not the run's: only their NVML peak is scored."""

MIB2 = 2 * 2**20


def figures_all(est: dict) -> list[int | None]:
    e = est.get("all") or {}
    return [e.get(key) for key in FIGURES]


def summary(errors: dict[str, list[tuple[int, int]]]) -> str:
    """Median / p90 of |error| (% of the measurement) / exact / within 2 MiB / under by more
    than 2 MiB, per figure."""
    import statistics

    cells = []
    for key in FIGURES:
        pairs = errors[key]
        if not pairs:
            cells.append("-")
            continue
        relative = sorted(abs(d) / t * 100 if t else 0.0 for d, t in pairs)
        p90 = relative[min(len(relative) - 1, int(0.9 * len(relative)))]
        cells.append(f"{statistics.median(relative):.2f}% / {p90:.2f}% / "
                     f"{sum(d == 0 for d, _ in pairs)} / {sum(abs(d) <= MIB2 for d, _ in pairs)} / "
                     f"{sum(d < -MIB2 for d, _ in pairs)}")
    return f"| all ({len(errors['peak_bytes'])}) | " + " | ".join(cells) + " |"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def table(args: argparse.Namespace) -> int:
    measured = {r["id"]: r for r in read_lines(args.results) if r.get("measured")}
    estimated = list({e["id"]: e for e in read_lines(args.estimates)}.values())  # last wins
    errors: dict[str, list[tuple[int, int]]] = {key: [] for key in FIGURES}
    print("| job | steps | measured peak / reserved / allocated (MiB) | estimate `--steps all` "
          "| error (MiB) | estimate default | error (MiB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for est in sorted(estimated, key=lambda e: e["script"]):
        m = measured[est["id"]]["measured"]
        cells = []
        for policy in ("all", "default"):
            e = est.get(policy) or {}
            figures = [e.get(k) for k in ("peak_bytes", "peak_reserved_bytes",
                                           "peak_allocated_bytes")]
            truth = [m.get(k) for k in ("peak_bytes", "peak_reserved_bytes",
                                         "peak_allocated_bytes")]
            cells.append(" / ".join(_mib(v) for v in figures))
            cells.append(" / ".join("-" if None in (a, b) else f"{(a - b) / 2**20:+.1f}"
                                    for a, b in zip(figures, truth, strict=True)))
        for key, figure, truth in zip(FIGURES, figures_all(est), (m.get(k) for k in FIGURES),
                                      strict=True):
            if figure is not None and truth is not None and not (
                    key != "peak_bytes" and m.get("peak_resets") is None
                    and est["script"] in COUNTER_RESETTING):
                errors[key].append((figure - truth, truth))
        print(f"| {est['script']} | {m.get('steps')} | {_mib(m.get('peak_bytes'))} / "
              f"{_mib(m.get('peak_reserved_bytes'))} / {_mib(m.get('peak_allocated_bytes'))} | "
              + " | ".join(cells) + " |")
    print()
    print("| jobs | nvidia-smi peak | max reserved | max allocated |")
    print("| --- | --- | --- | --- |")
    print(summary(errors))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="on the GPU machine")
    m.add_argument("export")
    m.add_argument("--out", required=True)
    m.add_argument("--budget-s", type=float, default=420)
    m.add_argument("--timeout-s", type=float, default=60)
    m.add_argument("--parallel", type=int, default=4)
    m.add_argument("--no-snapshot", dest="snapshot", action="store_false")
    e = sub.add_parser("estimate", help="here, for the jobs measured")
    e.add_argument("export")
    e.add_argument("results")
    e.add_argument("--out", required=True)
    e.add_argument("--gpu", default="h200")
    e.add_argument("--timeout-s", type=float, default=300)
    e.add_argument("--policies", nargs="+", choices=("all", "default"), default=["all", "default"],
                   help="`--steps all` (what the measurement ran) and/or the default policy")
    t = sub.add_parser("table")
    t.add_argument("results")
    t.add_argument("estimates")
    args = parser.parse_args(argv)
    return {"measure": measure, "estimate": estimate, "table": table}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
