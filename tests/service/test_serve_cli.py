"""`peakmem serve` from the command line: bad flags exit 2; the server starts and answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import free_port

SRC = str(Path(__file__).resolve().parents[2] / "src")


def serve(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "peakmem", "serve", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch):
    cert = tmp_path / "tls.crt"
    cert.write_text("x")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    for args in (["--configmaps", "--port", "0"], ["--tls-cert", str(cert)], ["--emit", "nope"], ["--port", "-1"],
                 ["--estimator", "no.such.module:fn"], ["--max-host-memory", "lots"],
                 ["--job-nice", "20"], ["--job-nice", "-1"], ["--processes", "2"],
                 ["--processes", "0"], ["--store", str(cert)]):
        proc = serve(*args)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, (args, err)
        assert err.strip().startswith("peakmem: error:") and len(err.strip().splitlines()) == 1


def test_a_port_in_use_is_exit_2():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        proc = serve("--port", str(taken.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "address already in use" in err.lower()


def test_serve_starts_and_answers():
    port = free_port()
    proc = serve("--port", str(port), "--sandbox", "off", "--log-level", "warning",
                 "--job-nice", "3",
                 "--estimator", "peakmem.service.estimators:fake_process_estimator")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.2)
        assert health["status"] == "ok" and health["sandbox"] == "none"
        response = httpx.post(f"http://127.0.0.1:{port}/v1/estimates", timeout=10, json={
            "files": {"train.py": "x"}, "command": ["python", "train.py"]})
        assert response.status_code == 202
        job_id = response.json()["id"]
        deadline = time.monotonic() + 60
        while (body := httpx.get(f"http://127.0.0.1:{port}/v1/estimates/{job_id}", timeout=10)
               .json())["status"] not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert body["status"] == "done", body
        assert f"worker niceness {min(19, os.nice(0) + 3)}" in body["result"]["notes"]
        assert "peakmem_estimate_requests_total" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def children_of(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def test_several_processes_share_the_port_and_the_store(tmp_path):
    import signal

    from peakmem.service.processes import MIN_UPTIME_SECONDS

    port = free_port()
    store = tmp_path / "store"
    proc = serve("--port", str(port), "--sandbox", "off", "--log-level", "warning",
                 "--processes", "2", "--store", str(store),
                 "--estimator", "peakmem.service.estimators:fake_estimator")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.2)
        up = time.monotonic()
        servers = children_of(proc.pid)
        assert len(servers) == 2
        job = {"files": {"train.py": "x"}, "command": ["python", "train.py"]}
        job_id = httpx.post(f"{url}/v1/estimates", json=job, timeout=10).json()["id"]
        while (body := httpx.get(f"{url}/v1/estimates/{job_id}", timeout=10).json())[
                "status"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert body["status"] == "done" and (store / f"{job_id}.json").exists()
        answers = [httpx.post(f"{url}/v1/estimates", json=job, timeout=10) for _ in range(20)]
        assert {(a.status_code, a.json()["id"], a.json()["status"]) for a in answers} == {
            (200, job_id, "done")}
        time.sleep(max(0.0, MIN_UPTIME_SECONDS + 0.5 - (time.monotonic() - up)))
        os.kill(servers[0], signal.SIGKILL)  # a server process dies: another takes its place
        while len(now := children_of(proc.pid)) != 2 or servers[0] in now:
            assert proc.poll() is None and time.monotonic() < deadline + 30, (now, proc.poll())
            time.sleep(0.1)
        assert httpx.post(f"{url}/v1/estimates", json=job, timeout=10).json()["status"] == "done"
    finally:
        servers = children_of(proc.pid)
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    for pid in servers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text(
            ).split(")")[1].split()[0]


def test_a_server_process_that_fails_to_start_stops_the_others():
    from peakmem.service.processes import ChildFailed, listen, serve_processes

    def broken_app():
        raise RuntimeError("no app today")

    sock = listen("127.0.0.1", 0)
    started = time.monotonic()
    with pytest.raises(ChildFailed, match="start-up"):
        serve_processes(broken_app, sock, 2, {"log_level": "critical"})
    assert time.monotonic() - started < 30 and sock.fileno() == -1


def test_the_serving_process_switches_threads_often_and_passes_job_nice(monkeypatch):
    import uvicorn
    from click.testing import CliRunner

    from peakmem.cli.main import main
    from peakmem.service.fast_path import SWITCH_INTERVAL_SECONDS

    seen = {}

    def fake_run(app, **kwargs):
        seen["interval"] = sys.getswitchinterval()
        seen["queue"] = app.state.queue

    before = sys.getswitchinterval()
    monkeypatch.setattr(uvicorn, "run", fake_run)
    try:
        result = CliRunner().invoke(main, ["serve", "--port", str(free_port()), "--sandbox", "off",
                                           "--job-nice", "4"])
    finally:
        sys.setswitchinterval(before)
    assert result.exit_code == 0, result.output
    assert seen["interval"] == pytest.approx(SWITCH_INTERVAL_SECONDS)
    assert seen["queue"].job_nice == 4 and seen["queue"].store is None
