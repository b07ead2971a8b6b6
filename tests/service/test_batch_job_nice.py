"""`peakmem batch --job-nice`: each job's worker process runs that many steps nicer than the batch
driver (as `peakmem serve --job-nice`); the fake-process estimator's notes give its niceness."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from peakmem.service.batch import BatchSettings, run_batch

from .test_batch import jobs_of, lines, run_cli, write_jobs

PROCESS = "peakmem.service.estimators:fake_process_estimator"
BASE = os.nice(0)


@pytest.mark.parametrize("nice", [0, 7, 40])
def test_the_worker_runs_nice_steps_below_the_batch(tmp_path, nice):
    jobs = write_jobs(tmp_path / "jobs.jsonl", jobs_of(2))
    out = tmp_path / "out.jsonl"
    summary = run_batch(jobs, out, BatchSettings(estimator=PROCESS, job_nice=nice),
                        in_process=True)
    assert (summary.done, summary.failed) == (2, 0)
    for line in lines(out):
        assert f"worker niceness {min(19, BASE + nice)}" in line["result"]["notes"], line
    assert os.nice(0) == BASE  # the batch's own priority is untouched


def test_the_default_is_serve_s_default():
    from peakmem.cli.batch import batch
    from peakmem.cli.serve import serve

    def default(command) -> int:
        return next(p.default for p in command.params if p.name == "job_nice")

    assert default(batch) == default(serve) == BatchSettings().job_nice == 10


def _niceness_of(path: Path) -> set[str]:
    return {note for line in lines(path) for note in line["result"]["notes"]
            if note.startswith("worker niceness")}


def test_cli_job_nice_reaches_the_worker_and_out_of_range_is_exit_2(tmp_path):
    write_jobs(tmp_path / "jobs.jsonl", jobs_of(1))
    result = run_cli("jobs.jsonl", "--in-process", "--estimator", PROCESS, "--job-nice", "3",
                     "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["done"] == 1
    # the CLI runs in a child of this process: same base niceness
    assert _niceness_of(tmp_path / "jobs.results.jsonl") == {f"worker niceness {min(19, BASE + 3)}"}
    bad = run_cli("jobs.jsonl", "--in-process", "--job-nice", "20", cwd=tmp_path)
    assert bad.returncode == 2 and "--job-nice" in bad.stderr
