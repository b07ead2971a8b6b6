"""`peakmem batch`: jobs file, streamed results, resume; in-process (fast) and on a local Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peakmem.service.batch import BatchInputError, BatchSettings, finished_ids, read_jobs, run_batch

FAKE = BatchSettings(estimator="peakmem.service.estimators:fake_estimator")


def write_jobs(path: Path, jobs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(job) + "\n" for job in jobs))
    return path


def jobs_of(n: int) -> list[dict]:
    return [{"id": f"job-{i}", "files": {"train.py": f"# {i}\n"}, "command": ["python", "train.py"]}
            for i in range(n)]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_in_process_batch_streams_every_job_once_and_resumes(tmp_path):
    jobs = write_jobs(tmp_path / "jobs.jsonl", [
        *jobs_of(5),
        {"id": "no-script", "command": ["python", "missing.py"]},
        {"id": "raises", "files": {"fail": "x"}, "command": ["fail"]},
        {"id": "bad-options", "files": {"t.py": ""}, "command": ["python", "t.py"],
         "options": {"steps": -3}},
        {"id": "both", "files": {"t.py": ""}, "cwd": ".", "command": ["python", "t.py"]},
        {"id": "on-disk", "cwd": "project", "command": ["python", "train.py"]},
    ])
    out = tmp_path / "out.jsonl"
    summary = run_batch(jobs, out, FAKE, in_process=True)
    assert (summary.total, summary.done, summary.failed) == (10, 6, 4)
    by_id = {line["id"]: line for line in lines(out)}
    assert len(by_id) == 10 == len(lines(out))
    assert by_id["job-0"]["status"] == "done" and by_id["job-0"]["result"]["peak_bytes"] > 0
    assert by_id["no-script"]["error"]["kind"] == "bad_input"
    assert by_id["raises"]["error"]["kind"] == "job_failed"
    assert by_id["bad-options"]["error"]["kind"] == "bad_input"
    assert "not both" in by_id["both"]["error"]["message"]
    assert by_id["on-disk"]["status"] == "done"
    # rerun: everything final is skipped, nothing is appended
    again = run_batch(jobs, out, FAKE, in_process=True)
    assert (again.skipped, again.done, again.failed) == (10, 0, 0) and len(lines(out)) == 10
    # --retry-failed reruns only the failures
    retried = run_batch(jobs, out, FAKE, in_process=True, retry_failed=True)
    assert (retried.skipped, retried.failed) == (6, 4)


def test_resume_after_a_crash_mid_line(tmp_path):
    jobs = write_jobs(tmp_path / "jobs.jsonl", jobs_of(4))
    out = tmp_path / "out.jsonl"
    run_batch(jobs, out, FAKE, in_process=True)
    text = out.read_text().splitlines()
    out.write_text("\n".join(text[:2]) + "\n" + text[2][:20])  # third line cut short
    assert finished_ids(out) == {"job-0", "job-1"}
    summary = run_batch(jobs, out, FAKE, in_process=True)
    assert (summary.skipped, summary.done) == (2, 2)
    tail = [json.loads(line) for line in out.read_text().splitlines()[-2:]]
    assert {line["id"] for line in tail} == {"job-2", "job-3"}


def test_lost_workers_are_retried_then_failed_and_rerun(tmp_path):
    jobs = write_jobs(tmp_path / "jobs.jsonl", jobs_of(1))
    out = tmp_path / "out.jsonl"
    settings = BatchSettings(estimator="tests.service.helpers:always_lost", max_attempts=3)
    summary = run_batch(jobs, out, settings, in_process=True)
    line = lines(out)[0]
    assert summary.failed == 1 and line["attempts"] == 3 and line["retryable"] is True
    assert finished_ids(out) == set()


@pytest.mark.parametrize("content, message", [
    ('{"id": "a"}\nnot json\n', "line 2: not JSON"),
    ('{"command": ["python", "x.py"]}\n', "with an \"id\""),
    ('{"id": "a"}\n{"id": "a"}\n', "appears twice"),
    ("[1, 2]\n", "with an \"id\""),
])
def test_bad_jobs_files(tmp_path, content, message):
    path = tmp_path / "jobs.jsonl"
    path.write_text(content)
    with pytest.raises(BatchInputError, match=message):
        read_jobs(path)


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2] / "src"), str(Path(__file__).resolve().parents[2]),
         os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "peakmem", "batch", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_bad_input_is_exit_2(tmp_path):
    missing = run_cli("nope.jsonl", "--in-process", cwd=tmp_path)
    assert missing.returncode == 2 and "no such jobs file" in missing.stderr
    (tmp_path / "jobs.jsonl").write_text("garbage\n")
    broken = run_cli("jobs.jsonl", "--in-process", "--json", cwd=tmp_path)
    assert broken.returncode == 2 and json.loads(broken.stdout)["error"]["kind"] == "bad_input"


@pytest.mark.slow
def test_cli_batch_on_a_local_ray(tmp_path):
    pytest.importorskip("ray")
    write_jobs(tmp_path / "jobs.jsonl", jobs_of(12))
    result = run_cli("jobs.jsonl", "--workers", "2", "--estimator",
                     "peakmem.service.estimators:fake_estimator", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["done"], summary["failed"]) == (12, 0)
    results = lines(tmp_path / "jobs.results.jsonl")
    assert sorted(line["id"] for line in results) == sorted(f"job-{i}" for i in range(12))
    # each line names the Ray node that ran it (one local node here: one id, Ray's 56-hex form)
    nodes = {line["ray_node"] for line in results}
    assert len(nodes) == 1 and len(nodes.pop()) == 56


def test_an_unreachable_ray_cluster_is_one_line_exit_2(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from click.testing import CliRunner

    from peakmem.cli.main import main

    def refuse(*args, **kwargs):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    write_jobs(tmp_path / "jobs.jsonl", jobs_of(1))
    result = CliRunner().invoke(main, ["batch", str(tmp_path / "jobs.jsonl"), "--ray-address",
                                       "10.0.0.1:6379", "--json"])
    assert result.exit_code == 2
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert error["kind"] == "bad_input" and "10.0.0.1:6379" in error["message"]


def test_a_ray_token_refusal_is_one_bad_input_line_with_the_hint(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from click.testing import CliRunner
    from ray.exceptions import AuthenticationError

    from peakmem.cli.main import main

    def refuse(*args, **kwargs):
        raise AuthenticationError("Token authentication is enabled but no authentication token "
                                  "was found.\nSet RAY_AUTH_TOKEN or ...\n\nMore help here.")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    write_jobs(tmp_path / "jobs.jsonl", jobs_of(1))
    result = CliRunner().invoke(main, ["batch", str(tmp_path / "jobs.jsonl"), "--ray-address",
                                       "10.0.0.1:6379", "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert error["kind"] == "bad_input" and "\n" not in error["message"]
    assert "10.0.0.1:6379" in error["message"] and "authentication" in error["message"]
    assert "no authentication token was found" in error["message"]
    assert "RAY_AUTH_TOKEN" in error["message"] and "More help" not in error["message"]
    assert not (tmp_path / "jobs.results.jsonl").exists() or not lines(
        tmp_path / "jobs.results.jsonl")
