"""One attempt at one job: a fresh work directory with the job's files, the estimator run there,
the directory removed. Shared by the service's workers and the batch runner's Ray tasks."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from peakmem.service.files import write_files
from peakmem.service.jobs import EstimateJob, Estimator, RunContext


def run_attempt(
    job: EstimateJob,
    estimator: Estimator,
    *,
    sandbox: bool = False,
    max_seconds: float | None = None,
    max_host_memory: int | None = None,
    workdir_base: str | None = None,
    nice: int = 0,
) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="peakmem-job-", dir=workdir_base)
    try:
        workdir = Path(base) / "work"
        workdir.mkdir()
        write_files(dict(job.files), workdir)
        ctx = RunContext(
            workdir=Path(job.cwd) if job.cwd else workdir,
            sandbox=sandbox,
            max_seconds=max_seconds,
            max_host_memory=max_host_memory,
            # nothing reads the job's output: a file kept it all, a job printing 10 GB filled
            # the disk of the service (or batch worker) until the attempt ended
            log_path=Path(os.devnull),
            nice=nice,
        )
        return estimator(job, ctx)
    finally:
        shutil.rmtree(base, ignore_errors=True)
