"""Execute a sweep plan: one fresh worker process per run (``prestart`` of them started ahead,
importing torch while the current run measures: none touches the GPU before its run), rows
appended to the CSV as they finish, resumable, inside a time budget."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from peakmem.measure.groundtruth import (
    RowWriter,
    done_keys,
    key_of_row,
    read_rows,
    row_from_result,
)
from peakmem.measure.sweep_plan import PlannedRun, SweepPlan

Spawn = Callable[[IO[str]], subprocess.Popen]
READY_TIMEOUT_S = 180.0
KILL_GRACE_S = 45.0


def spawn_worker(
    python: str = sys.executable,
    preimport: str = "",
    device_index: int = 0,
    extra_args: tuple[str, ...] = (),
) -> Spawn:
    """A factory of real measurement workers (`python -m peakmem.measure.worker`)."""

    def spawn(log: IO[str]) -> subprocess.Popen:
        command = [python, "-m", "peakmem.measure.worker", "--device-index", str(device_index)]
        if preimport:
            command += ["--preimport", preimport]
        command += list(extra_args)
        return subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
        )

    return spawn


@dataclass
class SweepSummary:
    measured: int = 0
    skipped_done: int = 0
    skipped_oom: int = 0
    left: int = 0  # not started: out of budget
    statuses: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    run_seconds: list[float] = field(default_factory=list)


def _oom_floor(rows: list[dict[str, str]], plan: SweepPlan) -> dict[str, float]:
    """Per configuration, the smallest scale value that already ran out of memory."""
    scale_of = {run.key: run for run in plan.runs}
    floor: dict[str, float] = {}
    for row in rows:
        run = scale_of.get(key_of_row(row))
        if row["status"] == "oom" and run is not None and run.scale is not None:
            floor[run.config] = min(floor.get(run.config, run.scale), run.scale)
    return floor


class _Worker:
    def __init__(self, spawn: Spawn, log: IO[str]) -> None:
        self.proc = spawn(log)

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.strip() == "ready":
                return
            if line == "" and self.proc.poll() is not None:
                break
        raise RuntimeError(f"the measurement worker did not start (exit code {self.proc.poll()})")

    def send(self, request: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None and not self.proc.stdin.closed:
                    self.proc.stdin.close()  # an empty request: the worker exits
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()


def run_sweep(
    plan: SweepPlan,
    csv_path: Path,
    gpu: str,
    *,
    spawn: Spawn,
    budget_seconds: float,
    log: IO[str],
    retry_errors: bool = False,
    snapshot_dir: Path | None = None,
    on_run: Callable[[PlannedRun, str, float], None] | None = None,
    prestart: int = 2,
) -> SweepSummary:
    """Measure every run of ``plan`` not yet in ``csv_path`` until the budget is spent."""
    started = time.monotonic()
    summary = SweepSummary()
    rows = read_rows(csv_path)
    done = done_keys(rows, retry_errors=retry_errors)
    oom_floor = _oom_floor(rows, plan)
    todo = [run for run in plan.runs if run.key not in done]
    summary.skipped_done = len(plan.runs) - len(todo)
    group_seconds: dict[int, float] = {}
    workdir = Path(tempfile.mkdtemp(prefix="peakmem-sweep-"))
    spares: deque[_Worker] = deque()
    try:
        with RowWriter(csv_path) as writer:
            for position, run in enumerate(todo):
                floor = oom_floor.get(run.config)
                if floor is not None and run.scale is not None and run.scale > floor:
                    summary.skipped_oom += 1
                    continue
                remaining = budget_seconds - (time.monotonic() - started)
                expected = group_seconds.get(run.group, 20.0)
                if remaining < expected * 1.2 + 5:
                    summary.left = len(todo) - position
                    break
                timeout = min(run.timeout, max(remaining - 10, 1.0))
                worker = spares.popleft() if spares else _Worker(spawn, log)
                worker.wait_ready()
                out = workdir / f"run{position}.json"
                snapshot = None
                if run.snapshot and snapshot_dir is not None:
                    snapshot_dir.mkdir(parents=True, exist_ok=True)
                    snapshot = str(snapshot_dir / f"{plan.name}-{position:04d}.pickle")
                log.write(f"\n=== {' '.join(run.command())}\n")
                log.flush()
                t0 = time.monotonic()
                worker.send({
                    "argv": run.command(), "steps": run.steps, "timeout": timeout,
                    "out": str(out), "env": dict(run.env), "snapshot": snapshot,
                })  # fmt: skip
                while len(spares) < min(prestart, len(todo) - position - 1):
                    spares.append(_Worker(spawn, log))  # they import while this run measures
                result = _wait_result(worker, out, timeout + KILL_GRACE_S)
                wall = time.monotonic() - t0
                group_seconds[run.group] = max(group_seconds.get(run.group, 0.0), wall)
                status = str(result.get("status", "error"))
                if status == "timeout" and timeout < run.timeout:
                    summary.left = len(todo) - position  # cut by the budget: measure it later
                    break
                row = row_from_result(
                    result,
                    job=run.job,
                    args=run.args_text,
                    gpu=gpu,
                    config=run.config,
                    sweep=plan.name,
                )
                row.update(steps=run.steps, alloc_conf=run.alloc_conf, snapshot=snapshot or "")
                writer.write(row)
                summary.measured += 1
                summary.run_seconds.append(wall)
                recorded = str(row["status"])  # an ok run whose peak was unknown: error
                summary.statuses[recorded] = summary.statuses.get(recorded, 0) + 1
                if status == "oom" and run.scale is not None:
                    oom_floor[run.config] = min(oom_floor.get(run.config, run.scale), run.scale)
                if on_run is not None:
                    on_run(run, recorded, wall)
    finally:
        for spare in spares:
            spare.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # the runs' result files, read already
    summary.seconds = time.monotonic() - started
    return summary


def _wait_result(worker: _Worker, out: Path, limit: float) -> dict:
    try:
        code = worker.proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        worker.proc.kill()
        worker.proc.wait()
        return {"status": "timeout", "error": f"worker killed after {limit:.0f} s"}
    if out.is_file():
        return json.loads(out.read_text())
    return {"status": "error", "error": f"the worker exited with code {code} and no result"}
