"""One estimate per pytest session for the tests that share it, across pytest-xdist workers.

A module fixture runs once per worker: under `pytest -n 2` the tests sharing it often land on
both workers, and the job is estimated twice. `shared_estimate` runs it in the first worker that
asks (a file lock in the session's temporary root, which xdist's workers share) and hands the
others its result (the CLI's JSON and the job's output) and its work directory."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock  # a dependency of torch

from tests.library_jobs.harness import JobEstimate

_IN_PROCESS: dict[str, tuple[JobEstimate, Path]] = {}
"""Without xdist: the estimates made in this pytest process, by key (tests of several modules
may share one)."""


def shared_estimate(tmp_path_factory: pytest.TempPathFactory, key: str,
                    run: Callable[[Path], JobEstimate]) -> tuple[JobEstimate, Path]:
    """`run(workdir)` once per session for `key`: its estimate and `workdir` (the files the job
    wrote there stay for every worker's assertions)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: once per key
        if key not in _IN_PROCESS:
            workdir = tmp_path_factory.mktemp(key)
            _IN_PROCESS[key] = run(workdir), workdir
        return _IN_PROCESS[key]
    root = tmp_path_factory.getbasetemp().parent / "shared-estimates"
    root.mkdir(exist_ok=True)
    workdir, saved = root / key, root / f"{key}.json"
    with FileLock(str(root / f"{key}.lock")):
        if saved.is_file():
            return JobEstimate(**json.loads(saved.read_text())), workdir
        workdir.mkdir()
        est = run(workdir)
        saved.write_text(json.dumps(dataclasses.asdict(est)))
        return est, workdir
