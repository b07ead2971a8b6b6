"""Server processes sharing one on-disk result store (`peakmem serve --store DIR`): a job one of
them ran is answered by the others, a job one of them holds is joined (never run twice), and a
job whose process is gone is failed as retryable, never lost."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from fastapi.testclient import TestClient

from peakmem.service.app import ServiceConfig, create_app
from peakmem.service.estimators import fake_estimator
from peakmem.service.jobs import EstimateJob
from peakmem.service.queue import JobQueue
from peakmem.service.store import ResultStore

from .conftest import wait_final

JOB = {"files": {"train.py": "print('hi')\n"}, "command": ["python", "train.py", "--bs", "8"]}
KEY = "ab" * 32


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def client_for(store, estimator=fake_estimator, **config) -> TestClient:
    return TestClient(create_app(ServiceConfig(sandbox="off", store_dir=str(store), **config),
                                 estimator=estimator))


def test_store_round_trip_and_unreadable_records(tmp_path):
    store = ResultStore(tmp_path)
    view = {"id": KEY, "status": "done", "result": {"peak_bytes": 1}, "error": None,
            "attempts": 1, "sandbox": "none"}
    assert store.load(KEY) is None
    store.save(KEY, view, retryable=False)
    assert store.load(KEY) == {"view": view, "retryable": False}
    (tmp_path / f"{KEY}.json").write_text("{not json")
    assert store.load(KEY) is None
    (tmp_path / f"{KEY}.json").write_text(json.dumps({"view": {**view, "id": "cd" * 32}}))
    assert store.load(KEY) is None  # a record under another job's name
    assert store.load("../etc/passwd") is None
    with pytest.raises(ValueError):
        store.save("../etc/passwd", view, retryable=False)


def test_claims_are_exclusive_and_stale_ones_are_taken_over(tmp_path):
    first, second = ResultStore(tmp_path), ResultStore(tmp_path, stale_seconds=60)
    assert first.claim(KEY) and not second.claim(KEY)
    assert second.claimant(KEY).owner == first.owner
    first.release(KEY)
    assert second.claim(KEY) and not first.claim(KEY)
    claim = tmp_path / f"{KEY}.claim"
    claim.write_text(json.dumps({"pid": dead_pid(), "owner": "gone", "status": "queued",
                                 "since": time.time()}))
    assert first.claimant(KEY) is None and first.claim(KEY)
    claim.write_text(json.dumps({"pid": os.getpid(), "owner": "slow", "status": "running",
                                 "since": time.time() - 61}))
    assert second.claimant(KEY) is None and second.claim(KEY)
    claim.write_text(json.dumps({"pid": os.getpid(), "owner": "slow", "status": "queued",
                                 "since": time.time() - 3600}))
    assert not second.claim(KEY)  # queued for long is not stale while its process lives


def test_a_job_one_process_ran_is_answered_by_another(tmp_path):
    ran = []

    def counting(job, ctx):
        ran.append(job.key())
        return fake_estimator(job, ctx)

    with client_for(tmp_path, counting) as first, client_for(tmp_path, counting) as second:
        job_id = first.post("/v1/estimates", json=JOB).json()["id"]
        done = wait_final(first, job_id)
        assert done["status"] == "done"
        assert second.get(f"/v1/estimates/{job_id}").json() == done
        again = second.post("/v1/estimates", json=JOB)
        assert again.status_code == 200 and again.json() == {"id": job_id, "status": "done"}
        assert "peakmem_estimate_fast_answers_total 1.0" in second.get("/metrics").text
    assert ran == [job_id]


def test_a_job_another_process_holds_is_joined_not_run_twice(tmp_path):
    release = threading.Event()
    ran = []

    def blocking(job, ctx):
        ran.append(job.key())
        release.wait(20)
        return fake_estimator(job, ctx)

    with client_for(tmp_path, blocking) as first, client_for(tmp_path, blocking) as second:
        job_id = first.post("/v1/estimates", json=JOB).json()["id"]
        deadline = time.monotonic() + 20
        while first.get(f"/v1/estimates/{job_id}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        joined = second.post("/v1/estimates", json=JOB)
        assert joined.status_code == 200
        assert joined.json() == {"id": job_id, "status": "running"}
        assert second.get(f"/v1/estimates/{job_id}").json()["status"] == "running"
        release.set()
        body = wait_final(second, job_id)
        assert body["status"] == "done" and body == wait_final(first, job_id)
    assert ran == [job_id]


def test_a_job_whose_process_is_gone_fails_retryable_and_runs_again(tmp_path):
    key = EstimateJob(tuple(JOB["command"]), {"train.py": JOB["files"]["train.py"].encode()},
                      "h100-80gb").key()
    (tmp_path / f"{key}.claim").write_text(json.dumps({
        "pid": dead_pid(), "owner": "gone", "status": "running", "since": time.time()}))
    with client_for(tmp_path) as client:
        lost = client.get(f"/v1/estimates/{key}").json()
        assert lost["status"] == "failed" and lost["error"]["kind"] == "job_failed"
        assert "stopped before it finished" in lost["error"]["message"]
        again = client.post("/v1/estimates", json=JOB)
        assert again.status_code == 202 and again.json()["id"] == key
        assert wait_final(client, key)["status"] == "done"
    assert json.loads((tmp_path / f"{key}.json").read_text())["view"]["status"] == "done"
    assert not (tmp_path / f"{key}.claim").exists()


def test_waiting_on_a_job_another_process_runs_sees_it_finish(tmp_path):
    release = threading.Event()

    def blocking(job, ctx):
        release.wait(20)
        return fake_estimator(job, ctx)

    async def scenario() -> tuple[bool, bool, str]:
        first = JobQueue(blocking, store=ResultStore(tmp_path))
        second = JobQueue(fake_estimator, store=ResultStore(tmp_path))
        await first.start()
        await second.start()
        try:
            job = EstimateJob(("python", "train.py"), {"train.py": b"x"})
            mine, created = first.submit(job)
            theirs, joined_new = second.submit(job)
            assert created and not joined_new and theirs.remote and theirs.id == mine.id
            early = await second.wait(theirs, 0.3)
            release.set()
            late = await second.wait(theirs, 20)
            return early, late, theirs.status
        finally:
            release.set()
            await first.stop()
            await second.stop()

    assert asyncio.run(scenario()) == (False, True, "done")


def test_of_many_stores_claiming_at_once_exactly_one_wins(tmp_path):
    stores = [ResultStore(tmp_path) for _ in range(6)]
    for round_ in range(30):
        key = f"{round_:064x}"
        barrier = threading.Barrier(len(stores))
        won: list[ResultStore] = []

        def race(store: ResultStore, key: str = key, barrier=barrier, won=won) -> None:
            barrier.wait()
            if store.claim(key):
                won.append(store)

        threads = [threading.Thread(target=race, args=(store,)) for store in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1, round_
        assert stores[0].claimant(key).owner == won[0].owner
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_job_finished_between_the_lookup_and_the_claim_is_not_run_again(tmp_path, monkeypatch):
    ran = []

    def counting(job, ctx):
        ran.append(job.key())
        return fake_estimator(job, ctx)

    async def scenario() -> tuple[str, bool]:
        first = JobQueue(counting, store=ResultStore(tmp_path))
        second = JobQueue(counting, store=ResultStore(tmp_path))
        await first.start()
        await second.start()
        try:
            job = EstimateJob(("python", "train.py"), {"train.py": b"x"})
            record, _ = first.submit(job)
            await first.wait(record, 20)
            # the second process looked the job up just before the first one finished it
            monkeypatch.setattr(second, "lookup", lambda key: None)
            late, created = second.submit(job)
            await asyncio.sleep(0.2)
            return late.status, created
        finally:
            await first.stop()
            await second.stop()

    assert asyncio.run(scenario()) == ("done", False)
    assert len(ran) == 1 and not list(tmp_path.glob("*.claim"))
