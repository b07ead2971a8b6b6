"""The estimators a worker can run: `peakmem estimate --json` in a child process (the default:
a crash or kill of it loses nothing but that attempt), and a fake one for tests and load
benchmarks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from peakmem.service.jobs import EstimateJob, JobFailed, RunContext, WorkerLost, error_object

RUNNING: set[subprocess.Popen] = set()
"""Worker processes running now (killed when the service stops)."""
_RUNNING_LOCK = threading.Lock()

KILL_GRACE_SECONDS = 30.0
"""How long past the job's own time limit the worker process may run before it is killed."""


def estimate_argv(job: EstimateJob, ctx: RunContext) -> list[str]:
    """The `python -P -m peakmem estimate --json ...` command line for `job`. `-P`: the work
    directory (the request's files) is not put first on sys.path, so a file sent as
    `peakmem.py`, `click.py` or `torch.py` cannot stand in for the estimator's own modules (the
    job's process sets its own sys.path[0], as `python train.py` would)."""
    argv = [sys.executable, "-P", "-m", "peakmem", "estimate", "--json", "--gpu", job.gpu]
    options = dict(job.options)
    timeout = options.get("timeout")
    if ctx.max_seconds is not None:
        timeout = ctx.max_seconds if timeout is None else min(float(timeout), ctx.max_seconds)
    memory = options.get("max_host_memory")
    if ctx.max_host_memory is not None:
        memory = ctx.max_host_memory if memory is None else min(int(memory), ctx.max_host_memory)
    if timeout is not None:
        argv += ["--timeout", repr(float(timeout))]
    if memory is not None:
        argv += ["--max-host-memory", str(int(memory))]
    if options.get("steps") is not None:
        argv += ["--steps", str(options["steps"])]
    if options.get("mode") is not None:
        argv += ["--mode", str(options["mode"])]
    if options.get("alloc_conf") is not None:
        argv += ["--alloc-conf", str(options["alloc_conf"])]
    if options.get("torch") is not None:
        argv += ["--torch", str(options["torch"])]
    if ctx.log_path is not None:
        argv += ["--job-log", str(ctx.log_path)]
    if ctx.sandbox:
        argv.append("--sandbox")
    return [*argv, "--", *job.command]


def cli_estimator(job: EstimateJob, ctx: RunContext) -> dict[str, Any]:
    """Run `peakmem estimate --json` for `job` in its work directory and return its JSON."""
    argv = estimate_argv(job, ctx)
    timeout = None
    limit = (job.options or {}).get("timeout") or ctx.max_seconds
    if limit is not None:
        timeout = float(limit) * 2 + KILL_GRACE_SECONDS  # auto mode may run twice
    return run_worker(argv, ctx, timeout)


def run_worker(argv: list[str], ctx: RunContext, timeout: float | None) -> dict[str, Any]:
    """Run one worker process (`argv`, in the job's work directory, its own session, `ctx.nice`
    lower priority) to the end and return the estimate JSON it printed (:func:`parse_output`);
    JobFailed past `timeout` seconds."""
    try:
        proc = subprocess.Popen(
            argv, cwd=ctx.workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, env=_worker_env(),
        )
    except OSError as exc:
        raise WorkerLost(f"peakmem: cannot start the estimate's worker: {exc}") from None
    with _RUNNING_LOCK:
        RUNNING.add(proc)
    try:
        lower_priority(proc.pid, ctx.nice)
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise JobFailed(error_object(
            "timeout", f"the estimate ran past the service's limit of {timeout:g} s", 124,
            "timeout")) from None
    finally:
        with _RUNNING_LOCK:
            RUNNING.discard(proc)
    return parse_output(proc.returncode, stdout, stderr)


def lower_priority(pid: int, nice: int) -> None:
    """Make process `pid` `nice` steps nicer than this process (at most 19).

    Set from here right after the fork (a `preexec_fn` is not safe with the service's threads):
    the worker is still starting Python then, so the processes it starts inherit the niceness.
    A process that already exited is left alone."""
    if nice <= 0:
        return
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpriority(os.PRIO_PROCESS, pid, target)


def kill_running() -> None:
    """Stop every worker process still running (the service is shutting down)."""
    with _RUNNING_LOCK:
        procs = list(RUNNING)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # the job's alloc_conf is
        env.pop(name, None)  # an option, not ours (capture.job_alloc_conf.VARIABLES)
    return env


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def parse_output(returncode: int, stdout: bytes, stderr: bytes) -> dict[str, Any]:
    """The estimate JSON of a finished `peakmem estimate --json`; JobFailed with its error object,
    WorkerLost where it printed nothing usable (killed, crashed)."""
    lines = [line for line in stdout.decode("utf-8", "replace").splitlines() if line.strip()]
    payload: Any = None
    if lines:
        try:
            payload = json.loads(lines[-1])
        except ValueError:
            payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        raise JobFailed(payload["error"])
    if isinstance(payload, dict) and returncode == 0 and "peak_bytes" in payload:
        return payload
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else None
        raise WorkerLost(f"the estimate's worker process was killed by {name or -returncode}",
                         signal=name)
    tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    raise WorkerLost(f"the estimate's worker process exited {returncode} without a result: "
                     f"{tail[0][:300]}")


_FAKE_WORKER = """
import json, os, sys, time
delay = float(os.environ.get("PEAKMEM_FAKE_ESTIMATE_SECONDS", "0") or 0)
if delay > 0:
    time.sleep(delay)
busy = float(os.environ.get("PEAKMEM_FAKE_ESTIMATE_CPU_SECONDS", "0") or 0)
end = time.process_time() + busy
while time.process_time() < end:
    pass
estimate = json.loads(sys.argv[1])
estimate["notes"].append("worker niceness %d" % os.nice(0))
print(json.dumps(estimate))
"""


def fake_process_estimator(job: EstimateJob, ctx: RunContext) -> dict[str, Any]:
    """:func:`fake_estimator`'s answer printed by a worker process of its own (a bare Python,
    started and supervised like `peakmem estimate`'s, at the job's niceness, which its notes
    give): the service's cost of a job process without the capture's. The same environment
    variables, applied in the worker; a command whose first word is `fail` fails at once."""
    if job.command and job.command[0] == "fail":
        return fake_estimator(job, ctx)
    _log_fake_run(job)
    argv = [sys.executable, "-S", "-c", _FAKE_WORKER, json.dumps(fake_result(job))]
    return run_worker(argv, ctx, ctx.max_seconds)


def fake_estimator(job: EstimateJob, ctx: RunContext) -> dict[str, Any]:
    """A stand-in that answers at once with a made-up but well-formed estimate: for tests and
    load benchmarks (`PEAKMEM_FAKE_ESTIMATE_SECONDS`: sleep that long; `..._CPU_SECONDS`: spin
    the CPU that long; `..._LOG`: a file each run appends the job's key to). A command whose
    first word is `fail` fails as a job that raised."""
    delay = float(os.environ.get("PEAKMEM_FAKE_ESTIMATE_SECONDS", "0") or 0)
    if delay > 0:
        time.sleep(delay)
    busy = float(os.environ.get("PEAKMEM_FAKE_ESTIMATE_CPU_SECONDS", "0") or 0)
    end = time.process_time() + busy
    while time.process_time() < end:  # CPU work, as a real estimate does
        pass
    if job.command and job.command[0] == "fail":
        raise JobFailed(error_object("job_failed", "the job raised RuntimeError: fake", 1,
                                     "raised", traceback="RuntimeError: fake"))
    _log_fake_run(job)
    return fake_result(job)


def _log_fake_run(job: EstimateJob) -> None:
    """`PEAKMEM_FAKE_ESTIMATE_LOG`: append the job's key to that file, one line a run (the load
    benchmark counts runs across server processes with it)."""
    path = os.environ.get("PEAKMEM_FAKE_ESTIMATE_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{job.key()}\n".encode())
        finally:
            os.close(fd)


def fake_result(job: EstimateJob) -> dict[str, Any]:
    """A made-up but well-formed estimate of `job` (its peak drawn from the job's key)."""
    seed = int(hashlib.sha256(job.key().encode()).hexdigest()[:6], 16)
    peak = (1 + seed % 64) * 2**28
    return {
        "peak_bytes": peak,
        "peak_reserved_bytes": peak - 2**29 if peak > 2**29 else peak,
        "peak_allocated_bytes": peak // 2,
        "peak_bytes_with_margin": int(peak * 1.05),
        "safety_margin": 0.05,
        "fits": True,
        "fits_with_margin": True,
        "capacity_bytes": 80 * 2**30,
        "gpu": job.gpu,
        "mode": "fake",
        "notes": ["fake estimator: not a real estimate"],
        "assumptions": [],
    }
