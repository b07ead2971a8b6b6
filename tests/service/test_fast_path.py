"""The fast path: a repeated submission of a known job is answered before routing and validation,
with exactly the slow path's answer; anything the slow path would refuse never hits."""

from __future__ import annotations

import json
import re
import threading

import pytest
from fastapi.testclient import TestClient

from peakmem.service import fast_path
from peakmem.service.app import ServiceConfig, create_app
from peakmem.service.estimators import fake_estimator
from peakmem.service.files import check_files
from peakmem.service.jobs import EstimateJob, WorkerLost
from peakmem.service.models import EstimateRequest

from .conftest import wait_final

JOB = {"files": {"train.py": "print('hi')\n", "lib/util.py": "X = 1\n"},
       "command": ["python", "train.py", "--bs", "8"], "gpu": "a100-80gb",
       "options": {"steps": 2, "timeout": 300, "mode": "auto"}}


def client_for(fast: bool, estimator=fake_estimator, **config) -> TestClient:
    return TestClient(create_app(ServiceConfig(sandbox="off", fast_path=fast, **config),
                                 estimator=estimator))


def fast_answers(client: TestClient) -> int:
    text = client.get("/metrics").text
    return int(float(re.search(r"^peakmem_estimate_fast_answers_total (\S+)$", text, re.M)[1]))


def post(client: TestClient, body: object, **headers: str):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/v1/estimates", content=data,
                       headers={"content-type": "application/json", **headers})


def answer(response) -> tuple:
    return (response.status_code, response.content, response.headers.get("content-type"),
            response.headers.get("content-length"))


@pytest.mark.parametrize("body", [
    JOB,
    {"files": {}, "command": ["python", "-m", "json.tool"]},
    {"command": ["python", "-m", "json.tool"], "options": {"steps": "all", "timeout": 2.5}},
    {**JOB, "options": {"alloc_conf": "expandable_segments:True", "torch": "2.4.1",
                        "max_host_memory": 2**30, "mode": None}},
    {**JOB, "files": {"train.py": "print('héllo ✓')\n"}},
])
def test_request_key_is_the_validated_jobs_key(body):
    model = EstimateRequest.model_validate(body)
    job = EstimateJob(tuple(model.command),
                      check_files({k: v.encode() for k, v in model.files.items()}),
                      model.gpu, model.options.as_dict())
    assert fast_path.request_key(json.dumps(body).encode()) == job.key()


def test_a_cached_answer_is_the_slow_paths_answer_byte_for_byte():
    variants = [JOB, {**JOB, "options": {**JOB["options"], "timeout": 300.0}},
                dict(reversed(list(JOB.items()))), {**JOB, "options": {**JOB["options"],
                                                                        "torch": None}}]
    answers = {}
    for fast in (True, False):
        with client_for(fast) as client:
            first = post(client, JOB)
            assert first.status_code == 202
            assert wait_final(client, first.json()["id"])["status"] == "done"
            answers[fast] = [answer(post(client, body)) for body in variants]
            answers[fast].append(answer(post(client, json.dumps(JOB, indent=2).encode(),
                                             **{"content-type": "application/json; charset=utf-8"})))
            assert fast_answers(client) == (len(variants) + 1 if fast else 0)
    assert answers[True] == answers[False]
    assert all(a[0] == 200 and json.loads(a[1])["status"] == "done" for a in answers[True])


def test_a_queued_or_running_job_is_joined_on_the_fast_path():
    release = threading.Event()

    def blocking(job, ctx):
        release.wait(10)
        return fake_estimator(job, ctx)

    with client_for(True, blocking, workers=1) as client:
        first = post(client, JOB)
        other = post(client, {**JOB, "gpu": "h100-80gb"})
        assert (first.status_code, other.status_code) == (202, 202)
        again = post(client, {**JOB, "gpu": "h100-80gb"})
        assert again.status_code == 200
        assert again.json() == {"id": other.json()["id"], "status": "queued"}
        assert fast_answers(client) == 1
        release.set()
        assert wait_final(client, other.json()["id"])["status"] == "done"


@pytest.mark.parametrize("body, code", [
    ({**JOB, "extra": None}, 422),
    ({**JOB, "gpu": None}, 422),
    ({**JOB, "files": None}, 422),
    ({**JOB, "options": None}, 422),
    ({**JOB, "options": {**JOB["options"], "bogus": None}}, 422),
    ({**JOB, "command": "python train.py --bs 8"}, 422),
    ([JOB], 422),
    # validation turns true into 1.0: a job of its own, never the cached one
    ({**JOB, "options": {**JOB["options"], "timeout": True}}, 202),
])
def test_bodies_the_slow_path_refuses_or_reads_otherwise_never_hit(body, code):
    outcomes = {}
    for fast in (True, False):
        with client_for(fast) as client:
            assert wait_final(client, post(client, JOB).json()["id"])["status"] == "done"
            outcomes[fast] = answer(post(client, body))
            assert fast_answers(client) == 0
    assert outcomes[True] == outcomes[False] and outcomes[True][0] == code


def test_with_a_token_only_the_right_token_hits():
    token = "s3cret-token"
    auth = {"authorization": f"Bearer {token}"}
    outcomes = {}
    for fast in (True, False):
        with client_for(fast, token=token) as client:
            job_id = post(client, JOB, **auth).json()["id"]
            client.headers.update(auth)
            assert wait_final(client, job_id)["status"] == "done"
            client.headers.pop("authorization")
            outcomes[fast] = [answer(post(client, JOB, **headers)) for headers in (
                auth, {"authorization": f"bearer {token}"}, {}, {"authorization": "Bearer nope"},
                {"authorization": f"Basic {token}"})]
            assert fast_answers(client) == (2 if fast else 0)
    assert outcomes[True] == outcomes[False]
    assert [a[0] for a in outcomes[True]] == [200, 200, 401, 401, 401]


def test_a_retryable_failure_is_queued_again_by_the_slow_path():
    calls = []

    def lost(job, ctx):
        calls.append(1)
        raise WorkerLost("killed", signal="SIGKILL")

    with client_for(True, lost, max_attempts=1) as client:
        job_id = post(client, JOB).json()["id"]
        assert wait_final(client, job_id)["status"] == "failed"
        again = post(client, JOB)
        assert again.status_code == 202 and fast_answers(client) == 0
        wait_final(client, job_id)
        assert len(calls) == 2


def test_a_large_body_is_hashed_off_the_event_loop(monkeypatch):
    threaded = []
    real = fast_path.asyncio.to_thread

    async def spy(fn, *args):
        threaded.append(fn)
        return await real(fn, *args)

    monkeypatch.setattr(fast_path.asyncio, "to_thread", spy)
    big = {**JOB, "files": {**JOB["files"], "data.txt": "x" * (fast_path.THREAD_HASH_BYTES + 1)}}
    with client_for(True) as client:
        assert wait_final(client, post(client, big).json()["id"])["status"] == "done"
        threaded.clear()
        assert post(client, big).status_code == 200 and fast_answers(client) == 1
        assert threaded == [fast_path.request_key]
        assert post(client, JOB).status_code == 202 and threaded == [fast_path.request_key]


def test_chunked_and_oversized_bodies_take_the_slow_path():
    with client_for(True, max_body_bytes=4096) as client:
        job_id = post(client, JOB).json()["id"]
        assert wait_final(client, job_id)["status"] == "done"
        chunked = client.post("/v1/estimates", content=iter([json.dumps(JOB).encode()]),
                              headers={"content-type": "application/json"})
        assert chunked.status_code == 200 and chunked.json()["id"] == job_id
        too_big = post(client, {**JOB, "files": {**JOB["files"], "x": "y" * 5000}})
        assert too_big.status_code == 413
        assert fast_answers(client) == 0


class _Record:
    id = "a" * 64
    status = "done"


class _Store:
    def __init__(self, known: str) -> None:
        self.known = known

    def lookup(self, key: str):
        return _Record() if key == self.known else None


@pytest.mark.parametrize("miss_yields, first", [(fast_path.MISS_YIELDS, "hit"), (0, "miss")])
def test_in_a_burst_cached_answers_go_out_before_the_slow_path(miss_yields, first):
    import asyncio

    known = {**JOB, "gpu": "h100-80gb"}
    sent: list[str] = []

    async def slow_app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    middleware = fast_path.FastPath(slow_app, queue=_Store(fast_path.request_key(
        json.dumps(known).encode())), max_body_bytes=2**20, miss_yields=miss_yields)

    async def call(name: str, body: dict) -> None:
        data = json.dumps(body).encode()
        scope = {"type": "http", "method": "POST", "path": "/v1/estimates", "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]}

        async def receive():
            return {"type": "http.request", "body": data, "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                sent.append(f"{name} {message['status']}")

        await middleware(scope, receive, send)

    async def burst():
        await asyncio.gather(call("miss", JOB), call("hit", known))

    asyncio.run(burst())
    assert sent[0].split()[0] == first and sorted(sent) == ["hit 200", "miss 202"]
