"""The default estimator: `peakmem estimate --json` in a child process, over real HTTP."""

from __future__ import annotations

import signal

import httpx
import pytest

from peakmem.service.app import ServiceConfig, create_app
from peakmem.service.estimators import estimate_argv, parse_output
from peakmem.service.jobs import EstimateJob, JobFailed, RunContext, WorkerLost

from .conftest import running_server, wait_final

TRAIN = """\
import torch
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_real_estimates_over_http():
    app = create_app(ServiceConfig(sandbox="auto", workers=2, max_seconds=120))
    with running_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        good = client.post("/v1/estimates", json={
            "files": {"train.py": TRAIN}, "command": ["python", "train.py"],
            "options": {"mode": "fake"}})
        bad = client.post("/v1/estimates", json={
            "files": {"job/boom.py": "raise ValueError('no data')\n"},
            "command": ["python", "job/boom.py"]})
        assert good.status_code == bad.status_code == 202
        done = wait_final(client, good.json()["id"], 180)
        failed = wait_final(client, bad.json()["id"], 180)
        health = client.get("/healthz").json()
    assert done["status"] == "done", done
    assert done["result"]["peak_bytes"] > 64 * 64 * 4 and done["result"]["gpu"] == "h100-80gb"
    assert done["sandbox"] == health["sandbox"]
    assert failed["status"] == "failed"
    assert failed["error"]["kind"] == "job_failed" and failed["error"]["reason"] == "raised"
    assert "ValueError" in failed["error"]["message"]


def test_estimate_argv_caps_the_request_by_the_service_limits(tmp_path):
    job = EstimateJob(("python", "t.py"), {}, "a100-40gb",
                      {"timeout": 900, "max_host_memory": 2**40, "steps": "all", "mode": "eager"})
    argv = estimate_argv(job, RunContext(tmp_path, sandbox=True, max_seconds=60,
                                         max_host_memory=2**30))
    assert argv[argv.index("--timeout") + 1] == "60.0"
    assert argv[argv.index("--max-host-memory") + 1] == str(2**30)
    assert "--sandbox" in argv and argv[-3:] == ["--", "python", "t.py"]
    assert argv[argv.index("--steps") + 1] == "all" and argv[argv.index("--gpu") + 1] == "a100-40gb"


def test_parse_output():
    assert parse_output(0, b'{"peak_bytes": 5}\n', b"")["peak_bytes"] == 5
    with pytest.raises(JobFailed) as failed:
        parse_output(1, b'{"error": {"kind": "job_failed", "message": "m", "exit_code": 1}}', b"")
    assert failed.value.error["kind"] == "job_failed"
    with pytest.raises(WorkerLost) as lost:
        parse_output(-signal.SIGKILL, b"", b"")
    assert lost.value.error["signal"] == "SIGKILL"
    with pytest.raises(WorkerLost):
        parse_output(0, b"not json", b"boom")


def test_files_sent_cannot_stand_in_for_the_estimators_modules(tmp_path):
    """A request's files are the worker's work directory: one named like a module the
    estimator imports (`peakmem.py`, `click.py`) must not be imported in its place, where it
    would run outside the job's supervision and print a forged estimate."""
    from peakmem.service.estimators import cli_estimator

    forged = 'import json\nprint(json.dumps({"peak_bytes": 1}))\n'
    (tmp_path / "peakmem.py").write_text(forged)
    (tmp_path / "click.py").write_text(forged)
    (tmp_path / "train.py").write_text(TRAIN)
    job = EstimateJob(("python", "train.py"), {}, "a100-40gb", {"mode": "fake"})
    result = cli_estimator(job, RunContext(tmp_path, max_seconds=120))
    assert result["peak_bytes"] > 64 * 64 * 4 and result["gpu"] == "a100-40gb"
