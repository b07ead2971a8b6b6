"""`peakmem serve` from the command line: bad flags exit 2; the server starts and answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

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
                 ["--job-nice", "20"], ["--job-nice", "-1"]):
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
