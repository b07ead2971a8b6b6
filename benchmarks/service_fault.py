"""Fault test: a worker killed mid-job gives a retried or a failed job, never a lost one.

1. `peakmem serve` (real estimates, `peakmem estimate --json` in a worker process per job): a
   job whose worker is SIGKILLed once is retried and done (attempts 2); a job whose worker is
   killed on every attempt is failed (kind job_failed, signal SIGKILL, retryable) and a new
   submission runs it again.
2. `peakmem batch` on a local Ray: a Ray worker process SIGKILLed mid-task is retried by Ray;
   every job of the file ends with a result line.

    PYTHONPATH=src python benchmarks/service_fault.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SLOW_JOB = """\
import time
import torch
model = torch.nn.Linear(16, 16).cuda()
time.sleep({seconds})
model(torch.randn(4, 16, device="cuda")).sum().backward()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


KILLED: set[int] = set()


def kill_worker(server_pid: int, timeout: float = 60) -> int:
    """SIGKILL the server's `peakmem estimate` worker process once one is running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in descendants(server_pid):
            if pid not in KILLED and "-m peakmem estimate" in cmdline(pid):
                time.sleep(1.0)  # let it get into the job
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                KILLED.add(pid)
                return pid
        time.sleep(0.05)
    raise RuntimeError("no worker process appeared")


def wait_final(client: httpx.Client, job_id: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/v1/estimates/{job_id}").json()
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(0.1)
    raise RuntimeError(f"{job_id} never became final: lost")


def service_faults() -> dict:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "peakmem", "serve", "--port", str(port), "--workers", "1",
         "--max-seconds", "120", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(300):
                try:
                    client.get("/healthz")
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            once = {"files": {"train.py": SLOW_JOB.format(seconds=4)},
                    "command": ["python", "train.py"], "options": {"mode": "fake"}}
            job_id = client.post("/v1/estimates", json=once).json()["id"]
            kill_worker(server.pid)
            retried = wait_final(client, job_id)
            always = {"files": {"train.py": SLOW_JOB.format(seconds=30)},
                      "command": ["python", "train.py"], "options": {"mode": "fake"}}
            job_id = client.post("/v1/estimates", json=always).json()["id"]
            kill_worker(server.pid)
            kill_worker(server.pid)
            failed = wait_final(client, job_id)
            resubmitted = client.post("/v1/estimates", json=always).status_code
            sandbox = client.get("/healthz").json()["sandbox"]
    finally:
        server.terminate()
        server.wait(30)
        for pid in descendants(server.pid):
            os.kill(pid, signal.SIGKILL)
    return {
        "sandbox": sandbox,
        "killed_once_status": retried["status"],
        "killed_once_attempts": retried["attempts"],
        "killed_once_peak_bytes": (retried["result"] or {}).get("peak_bytes"),
        "killed_always_status": failed["status"],
        "killed_always_attempts": failed["attempts"],
        "killed_always_error": failed["error"],
        "resubmitted_http_status": resubmitted,
    }


def ray_faults(jobs: int = 6) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.jsonl"
        path.write_text("".join(
            json.dumps({"id": f"j{i}", "files": {"t.py": f"# {i}"}, "command": ["python", "t.py"]})
            + "\n" for i in range(jobs)))
        env = {**os.environ, "PEAKMEM_FAKE_ESTIMATE_SECONDS": "6"}
        batch = subprocess.Popen(
            [sys.executable, "-m", "peakmem", "batch", str(path), "--workers", "2", "--json",
             "--estimator", "peakmem.service.estimators:fake_estimator"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        killed = None
        deadline = time.monotonic() + 120
        while killed is None and time.monotonic() < deadline and batch.poll() is None:
            for pid in descendants(os.getpid()):
                if cmdline(pid).startswith("ray::run_one"):
                    time.sleep(1.0)
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
                    break
            time.sleep(0.1)
        out, _ = batch.communicate(timeout=600)
        lines = [json.loads(line) for line in (Path(tmp) / "jobs.results.jsonl").read_text().splitlines()]
    return {
        "ray_worker_killed": killed is not None,
        "ray_summary": json.loads(out.strip().splitlines()[-1]) if out.strip() else None,
        "ray_result_ids": sorted(line["id"] for line in lines),
        "ray_all_done": all(line["status"] == "done" for line in lines) and len(lines) == jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    report = service_faults()
    if not args.skip_ray:
        report.update(ray_faults())
    ok = (report["killed_once_status"] == "done" and report["killed_once_attempts"] == 2
          and report["killed_always_status"] == "failed"
          and report["killed_always_error"]["signal"] == "SIGKILL"
          and report["resubmitted_http_status"] == 202
          and (args.skip_ray or report["ray_all_done"]))
    report["ok"] = ok
    print(json.dumps(report, indent=None if args.json else 2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
