"""Job worker processes: started at a lower priority than the server (`--job-nice`), supervised
like `peakmem estimate`'s (the fake-process estimator shares that path)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from peakmem.service.app import ServiceConfig, create_app
from peakmem.service.estimators import fake_process_estimator, lower_priority

from .conftest import wait_final

JOB = {"files": {"train.py": "print('hi')\n"}, "command": ["python", "train.py"]}
BASE = os.nice(0)


@pytest.mark.parametrize("nice", [0, 7, 40])
def test_the_worker_runs_nice_steps_below_the_server(nice):
    config = ServiceConfig(sandbox="off", job_nice=nice)
    with TestClient(create_app(config, estimator=fake_process_estimator)) as client:
        body = wait_final(client, client.post("/v1/estimates", json=JOB).json()["id"])
    assert body["status"] == "done", body
    assert f"worker niceness {min(19, BASE + nice)}" in body["result"]["notes"]
    assert os.nice(0) == BASE  # the server's own priority is untouched


def test_a_failing_job_fails_through_the_fake_process_estimator():
    config = ServiceConfig(sandbox="off")
    with TestClient(create_app(config, estimator=fake_process_estimator)) as client:
        body = wait_final(client, client.post("/v1/estimates", json={
            "files": {"fail": "x"}, "command": ["fail"]}).json()["id"])
    assert body["status"] == "failed" and body["error"]["kind"] == "job_failed"


def test_lower_priority_is_inherited_by_what_the_worker_starts_later():
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "time.sleep(0.5); subprocess.run([sys.executable, '-c', "
                             "'import os; print(os.nice(0))'])"], stdout=subprocess.PIPE, text=True)
    lower_priority(proc.pid, 5)
    out, _ = proc.communicate(timeout=30)
    assert int(out) == min(19, BASE + 5)


def test_lower_priority_of_a_process_that_is_gone_is_a_no_op():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    lower_priority(proc.pid, 5)  # reaped: no such process, no error
