"""One estimate the service or a batch runs: the job (files, command, GPU, options), its content
key (what the cache is keyed by), and the errors a worker raises."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peakmem import __version__

DEFAULT_GPU = "h100-80gb"
OPTION_NAMES = ("steps", "mode", "timeout", "alloc_conf", "torch", "max_host_memory")
"""The estimate options a request may set (the `peakmem estimate` flags of the same names)."""


@dataclass(frozen=True)
class EstimateJob:
    """What to estimate. `files` are written into a fresh work directory, the command runs there
    (`cwd`, when given instead, is an existing directory: batch jobs of the platform's own)."""

    command: tuple[str, ...]
    files: Mapping[str, bytes] = field(default_factory=dict)
    gpu: str = DEFAULT_GPU
    options: Mapping[str, Any] = field(default_factory=dict)
    cwd: str | None = None

    def key(self) -> str:
        """The content hash of the files, command, GPU, options and peakmem version."""
        return job_key(self.files, self.command, self.gpu, self.options, self.cwd)


def job_key(
    files: Mapping[str, bytes],
    command: Sequence[str],
    gpu: str,
    options: Mapping[str, Any],
    cwd: str | None = None,
) -> str:
    digest = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}
    canonical = json.dumps(
        {
            "files": digest,
            "command": list(command),
            "gpu": gpu,
            "options": {k: options[k] for k in sorted(options) if options[k] is not None},
            "cwd": cwd,
            "peakmem": __version__,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def error_object(
    kind: str,
    message: str,
    exit_code: int,
    reason: str | None = None,
    *,
    signal: str | None = None,
    job_exit_code: int | None = None,
    traceback: str | None = None,
) -> dict[str, Any]:
    """The contract's error object (the value of `"error"` in `--json` output)."""
    return {
        "kind": kind,
        "message": message,
        "exit_code": exit_code,
        "reason": reason,
        "job_exit_code": job_exit_code,
        "signal": signal,
        "traceback": traceback,
    }


class JobFailed(Exception):
    """The estimate could not be made; `error` is the contract's error object. Final: the same
    job would fail the same way, so the failure is cached like a result."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", "the estimate failed"))
        self.error = error


class WorkerLost(Exception):
    """The worker running the estimate died or was killed (not the job's own failure): the job
    is retried, then failed with `error`."""

    def __init__(self, message: str, signal: str | None = None) -> None:
        super().__init__(message)
        self.error = error_object("job_failed", message, 1, "signal" if signal else "exit",
                                  signal=signal)


@dataclass(frozen=True)
class RunContext:
    """Where and how a worker runs one job."""

    workdir: Path
    sandbox: bool = False
    max_seconds: float | None = None
    max_host_memory: int | None = None
    log_path: Path | None = None
    nice: int = 0
    """Added to the worker process's niceness (the server's own stays as it is), so that the
    estimates' CPU work yields to the server answering requests."""


Estimator = Callable[[EstimateJob, RunContext], dict[str, Any]]
"""Runs one job: returns the estimate's JSON (`Estimate.to_json()`), raises JobFailed or
WorkerLost. Called in a worker thread."""


def load_estimator(spec: str) -> Estimator:
    """`module:function` -> the estimator it names (for tests, benchmarks and custom runners)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"an estimator is 'module:function', got {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec!r} is not callable")
    return target


def job_problem(job: EstimateJob) -> str | None:
    """Why `job` cannot be run, found before running it (a command that names no script or
    module, a script that is not among the files sent, an unknown GPU), or None."""
    from peakmem.jobs.launchers import LaunchError, job_command
    from peakmem.jobs.runner import JobSpec, JobSpecError
    from peakmem.profiles import ProfileError, load_gpu
    from peakmem.service.files import FilesError, check_path

    try:  # `env NAME=VALUE python ...`, `torchrun ... train.py`: the script one process runs
        spec = JobSpec.parse(list(job_command(job.command)[0]))
    except (JobSpecError, LaunchError) as exc:
        return str(exc)
    if spec.script is not None and job.cwd is None:
        try:
            script = check_path(spec.script)
        except FilesError:
            return f"the script {spec.script!r} must be a relative path to one of the files sent"
        if script not in job.files and f"{script}/__main__.py" not in job.files:
            return f"script not found: {spec.script} is not among the files sent"
    try:
        load_gpu(job.gpu)
    except ProfileError as exc:
        return str(exc)
    return None
