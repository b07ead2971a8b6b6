"""The estimation API with injected estimators (no real estimates: fast)."""

from __future__ import annotations

import io
import tarfile
import threading

import pytest
from fastapi.testclient import TestClient

from peakmem.service.app import ServiceConfig, create_app
from peakmem.service.estimators import fake_estimator
from peakmem.service.jobs import WorkerLost

from .conftest import wait_final

JOB = {"files": {"train.py": "print('hi')\n"}, "command": ["python", "train.py", "--bs", "8"]}


def client_for(estimator=fake_estimator, **config) -> TestClient:
    return TestClient(create_app(ServiceConfig(sandbox="off", **config), estimator=estimator))


def test_submit_then_done_with_the_estimate_and_cached_under_the_same_id():
    with client_for() as client:
        first = client.post("/v1/estimates", json=JOB)
        assert first.status_code == 202
        job_id = first.json()["id"]
        body = wait_final(client, job_id)
        assert body["status"] == "done" and body["error"] is None
        assert body["result"]["peak_bytes"] > 0
        assert any("without a sandbox" in note for note in body["result"]["notes"])
        again = client.post("/v1/estimates", json=JOB)
        assert again.status_code == 200 and again.json() == {"id": job_id, "status": "done"}
        other = client.post("/v1/estimates", json={**JOB, "options": {"steps": 2}})
        assert other.json()["id"] != job_id
        other_gpu = client.post("/v1/estimates", json={**JOB, "gpu": "a100-40gb"})
        assert other_gpu.json()["id"] not in (job_id, other.json()["id"])


def test_failed_job_reports_the_contract_error_object():
    with client_for() as client:
        job_id = client.post("/v1/estimates", json={**JOB, "command": ["fail"],
                                                     "files": {"fail": "x"}}).json()["id"]
        body = wait_final(client, job_id)
        assert body["status"] == "failed" and body["result"] is None
        assert body["error"]["kind"] == "job_failed" and body["error"]["exit_code"] == 1


@pytest.mark.parametrize(
    "request_body, words",
    [
        ({**JOB, "files": {"../evil.py": "x"}}, "'..'"),
        ({**JOB, "files": {"/etc/passwd": "x"}}, "absolute"),
        ({**JOB, "files": {"a": "x", "a/b": "y"}}, "both a file and a directory"),
        ({**JOB, "command": ["python", "missing.py"]}, "not among the files"),
        ({**JOB, "command": ["python", "/etc/hosts"]}, "relative path"),
        ({**JOB, "command": ["python", "--version"]}, "unsupported python option"),
        ({**JOB, "gpu": "no-such-gpu"}, "no-such-gpu"),
    ],
)
def test_bad_input_is_400_with_a_bad_input_error(request_body, words):
    with client_for() as client:
        response = client.post("/v1/estimates", json=request_body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["kind"] == "bad_input" and error["exit_code"] == 2
        assert words in error["message"]


@pytest.mark.parametrize(
    "request_body",
    [
        {"command": []},
        {"files": {"train.py": "x"}},
        {**JOB, "options": {"timeout": -1}},
        {**JOB, "options": {"steps": 0}},
        {**JOB, "options": {"mode": "turbo"}},
        {**JOB, "options": {"unknown": 1}},
        {**JOB, "command": ["python", "train.py\x00"]},
        {**JOB, "gpu": "../../x"},
    ],
)
def test_malformed_requests_are_422(request_body):
    with client_for() as client:
        assert client.post("/v1/estimates", json=request_body).status_code == 422


def test_unknown_and_malformed_ids():
    with client_for() as client:
        assert client.get("/v1/estimates/" + "0" * 64).status_code == 404
        assert client.get("/v1/estimates/xyz").status_code == 422


def test_bounded_queue_answers_429_and_keeps_the_queued_jobs():
    release = threading.Event()

    def blocking(job, ctx):
        release.wait(10)
        return fake_estimator(job, ctx)

    with client_for(blocking, workers=1, max_queue=2) as client:
        ids, codes = [], []
        for n in range(6):
            response = client.post("/v1/estimates", json={**JOB, "command": ["python", "train.py", str(n)]})
            codes.append(response.status_code)
            if response.status_code == 202:
                ids.append(response.json()["id"])
        assert 429 in codes and codes.count(202) >= 2
        assert client.post("/v1/estimates", json=JOB).status_code in (202, 429)
        release.set()
        assert all(wait_final(client, job_id)["status"] == "done" for job_id in ids)
        assert client.get("/healthz").json()["queued"] == 0


def test_a_lost_worker_is_retried_then_the_job_fails_never_lost():
    calls = []

    def flaky(job, ctx):
        calls.append(job.command)
        if job.command[-1] == "always" or len(calls) == 1:
            raise WorkerLost("the estimate's worker process was killed by SIGKILL", signal="SIGKILL")
        return fake_estimator(job, ctx)

    with client_for(flaky, max_attempts=2) as client:
        once = client.post("/v1/estimates", json=JOB).json()["id"]
        body = wait_final(client, once)
        assert body["status"] == "done" and body["attempts"] == 2
        always = client.post("/v1/estimates", json={**JOB, "command": ["python", "train.py", "always"]}).json()["id"]
        body = wait_final(client, always)
        assert body["status"] == "failed" and body["attempts"] == 2
        assert body["error"]["signal"] == "SIGKILL" and "tried 2 times" in body["error"]["message"]
        # not the job's own failure: a new submission runs it again
        assert client.post("/v1/estimates", json={**JOB, "command": ["python", "train.py", "always"]}).status_code == 202
        metrics = client.get("/metrics").text
        assert "peakmem_job_retries_total" in metrics


def test_an_estimator_bug_fails_the_job_as_internal():
    def broken(job, ctx):
        raise ZeroDivisionError("oops")

    with client_for(broken) as client:
        body = wait_final(client, client.post("/v1/estimates", json=JOB).json()["id"])
        assert body["status"] == "failed" and body["error"]["kind"] == "internal"


def test_the_estimator_sees_the_files_in_its_work_directory_and_capped_limits():
    seen = {}

    def looking(job, ctx):
        seen["text"] = (ctx.workdir / "pkg" / "train.py").read_text()
        seen["limits"] = (ctx.max_seconds, ctx.max_host_memory)
        return fake_estimator(job, ctx)

    with client_for(looking, max_seconds=5.0, max_host_memory=2**30) as client:
        body = {"files": {"pkg/train.py": "x = 1\n"}, "command": ["python", "pkg/train.py"]}
        wait_final(client, client.post("/v1/estimates", json=body).json()["id"])
    assert seen == {"text": "x = 1\n", "limits": (5.0, 2**30)}


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_multipart_archive_on_the_same_path():
    with client_for() as client:
        response = client.post(
            "/v1/estimates",
            files={"archive": ("job.tar.gz", _tar({"src/train.py": b"print(1)\n"}), "application/gzip")},
            data={"command": "python src/train.py --lr 0.1", "options": '{"steps": 2}'},
        )
        assert response.status_code == 202, response.text
        assert wait_final(client, response.json()["id"])["status"] == "done"
        bad = client.post(
            "/v1/estimates",
            files={"archive": ("job.tar.gz", _tar({"../x.py": b"1"}), "application/gzip")},
            data={"command": "python x.py"},
        )
        assert bad.status_code == 400 and bad.json()["error"]["kind"] == "bad_input"
        junk = client.post("/v1/estimate-archives", files={"archive": ("a", b"junk", "x/y")},
                           data={"command": "python a.py"})
        assert junk.status_code == 400


@pytest.mark.parametrize("raw, status", [
    (b'{"files": {"train.py": "\\ud800"}, "command": ["python", "train.py"]}', 400),
    (b'{"files": {"train.py": ""}, "command": ["python", "train.py", "\\ud800"]}', 422),
    (b'{"files": {"train.py": ""}, "command": ["python", "train.py"], '
     b'"options": {"alloc_conf": "x\\udfff"}}', 422),
])
def test_lone_surrogates_are_refused(raw, status):
    with client_for() as client:
        response = client.post("/v1/estimates", content=raw,
                               headers={"content-type": "application/json"})
    assert response.status_code == status, response.text


def test_body_over_the_limit_is_413():
    with client_for(max_body_bytes=1000) as client:
        big = {**JOB, "files": {"train.py": "x" * 5000}}
        assert client.post("/v1/estimates", json=big).status_code == 413


def test_required_sandbox_that_is_unavailable_fails_jobs_as_unsupported(monkeypatch):
    from peakmem.service import app as app_module
    from peakmem.service.queue import SandboxChoice

    monkeypatch.setattr(app_module, "choose_sandbox",
                        lambda mode: SandboxChoice("none", "user namespaces are disabled", refuse=True))
    with client_for() as client:
        body = wait_final(client, client.post("/v1/estimates", json=JOB).json()["id"])
        health = client.get("/healthz").json()
    assert body["status"] == "failed"
    assert body["error"]["kind"] == "unsupported" and body["error"]["exit_code"] == 3
    assert body["error"]["reason"] == "sandbox_unavailable"
    assert "user namespaces are disabled" in body["error"]["message"]
    assert health["sandbox"] == "none" and "user namespaces" in health["sandbox_note"]


def test_an_estimator_returning_garbage_fails_the_job_not_the_api():
    with client_for(lambda job, ctx: ["not", "a", "dict"]) as client:
        body = wait_final(client, client.post("/v1/estimates", json=JOB).json()["id"])
    assert body["status"] == "failed" and body["error"]["kind"] == "internal"


def test_finished_jobs_do_not_keep_their_files_in_memory():
    with client_for() as client:
        job_id = client.post("/v1/estimates", json=JOB).json()["id"]
        assert wait_final(client, job_id)["status"] == "done"
        record = client.app.state.queue.get(job_id)
        assert record.job.files == {} and record.result is not None


def test_chunked_body_over_the_limit_is_413():
    def chunks():
        yield b'{"files": {"train.py": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}, "command": ["python", "train.py"]}'

    with client_for(max_body_bytes=1000) as client:
        response = client.post("/v1/estimates", content=chunks(),
                               headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert client.get("/healthz").status_code == 200


def test_a_token_guards_the_estimate_routes_only():
    with client_for(token="s3cret-token") as client:
        assert client.post("/v1/estimates", json=JOB).status_code == 401
        wrong = client.post("/v1/estimates", json=JOB, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        good = {"Authorization": "Bearer s3cret-token"}
        job_id = client.post("/v1/estimates", json=JOB, headers=good).json()["id"]
        assert client.get(f"/v1/estimates/{job_id}").status_code == 401
        assert client.get(f"/v1/estimates/{job_id}", headers=good).status_code == 200
        assert client.get("/healthz").status_code == 200
        assert client.get("/metrics").status_code == 200
        assert client.post("/v1/admission", json={"request": {"uid": "u"}}).status_code == 200
        spec = client.get("/openapi.json").json()
        assert "401" in spec["paths"]["/v1/estimates"]["post"]["responses"]
