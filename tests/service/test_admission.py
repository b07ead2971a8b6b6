"""The mutating admission webhook: AdmissionReview objects built from the Kubernetes object model,
sent over real HTTP (and HTTPS) to a live server."""

from __future__ import annotations

import base64
import json
import math
import shutil
import ssl
import subprocess
import threading

import httpx
import pytest

kubernetes = pytest.importorskip("kubernetes")
from kubernetes.client import (  # noqa: E402
    ApiClient,
    V1ConfigMap,
    V1Container,
    V1EnvVar,
    V1ObjectMeta,
    V1Pod,
    V1PodSpec,
    V1ResourceRequirements,
)

from peakmem.service.admission import AdmissionConfig, build_patch, pod_job  # noqa: E402
from peakmem.service.app import ServiceConfig, create_app  # noqa: E402
from peakmem.service.estimators import fake_estimator  # noqa: E402

from .conftest import running_server  # noqa: E402

SCRIPT = "import torch\nprint(torch.zeros(1, device='cuda'))\n"
CONFIGMAPS = {("team-a", "train-script"): V1ConfigMap(data={"train.py": SCRIPT})}


def read_configmap(namespace: str, name: str) -> dict[str, bytes]:
    found = CONFIGMAPS.get((namespace, name))
    if found is None:
        raise LookupError("not found")
    return {key: value.encode() for key, value in found.data.items()}


def pod(annotations: dict[str, str] | None, *, resources=None, env=None, containers=None) -> dict:
    model = V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=V1ObjectMeta(name="trainer", namespace="team-a", annotations=annotations),
        spec=V1PodSpec(containers=containers or [
            V1Container(name="train", image="pytorch/pytorch:latest",
                        command=["python", "train.py"], resources=resources, env=env)
        ]),
    )
    return ApiClient().sanitize_for_serialization(model)


def admission_review(pod_object: dict, uid: str = "0f1e2d3c-1111-2222-3333-444455556666") -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "operation": "CREATE",
            "object": pod_object,
        },
    }


def apply_patch(document: dict, patch: list[dict]) -> dict:
    """A small RFC 6902 `add` applier, enough to check the patch against the pod."""
    document = json.loads(json.dumps(document))
    for op in patch:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = document
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target.append(op["value"]) if parts[-1] == "-" else target.insert(int(parts[-1]), op["value"])
        else:
            target[parts[-1]] = op["value"]
    return document


def serve(estimator=fake_estimator, **admission):
    app = create_app(ServiceConfig(sandbox="off", admission=AdmissionConfig(**admission)),
                     estimator=estimator, configmaps=read_configmap)
    return running_server(app)


def post(url: str, body: dict, **kwargs) -> dict:
    response = httpx.post(f"{url}/v1/admission", json=body, timeout=30, **kwargs)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    return answer["response"]


def patched(response: dict, original: dict) -> dict:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    return apply_patch(original, json.loads(base64.b64decode(response["patch"])))


def test_opted_in_pod_gets_the_hami_request_and_annotations():
    original = pod({"peakmem.io/command": "python -m peakmem.examples.mlp_train --batch-size 8"})
    with serve() as url:
        review = admission_review(original)
        response = post(url, review)
        assert response["uid"] == review["request"]["uid"]
        result = patched(response, original)
        again = post(url, admission_review(original, uid="another"))  # answered from the cache
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    annotations = result["metadata"]["annotations"]
    peak_bytes = int(annotations["peakmem.io/peak-bytes"])
    assert int(limits["nvidia.com/gpumem"]) == math.ceil(int(peak_bytes * 1.05) / 2**20)
    assert annotations["peakmem.io/command"].endswith("mlp_train --batch-size 8")
    assert again["patch"] == response["patch"] and again["uid"] == "another"


def test_existing_resources_and_env_are_kept():
    resources = V1ResourceRequirements(limits={"cpu": "4", "memory": "16Gi"})
    original = pod({"peakmem.io/command": '["python", "train.py"]'}, resources=resources,
                   env=[V1EnvVar(name="A", value="1")])
    with serve(workdir="/tmp") as url:
        result = patched(post(url, admission_review(original)), original)
    container = result["spec"]["containers"][0]
    assert container["resources"]["limits"]["cpu"] == "4"
    assert container["resources"]["limits"]["memory"] == "16Gi"
    assert "nvidia.com/gpumem" in container["resources"]["limits"]
    assert container["env"] == [{"name": "A", "value": "1"}]


def test_configmap_script_and_named_container():
    containers = [
        V1Container(name="sidecar", image="busybox"),
        V1Container(name="train", image="pytorch", command=["python"], args=["train.py"]),
    ]
    original = pod({"peakmem.io/configmap": "train-script", "peakmem.io/container": "train",
                    "peakmem.io/gpu": "a100-40gb"}, containers=containers)
    seen = {}

    def looking(job, ctx):
        seen["files"] = dict(job.files)
        seen["command"] = job.command
        seen["gpu"] = job.gpu
        return fake_estimator(job, ctx)

    with serve(looking) as url:
        result = patched(post(url, admission_review(original)), original)
    assert seen == {"files": {"train.py": SCRIPT.encode()}, "command": ("python", "train.py"),
                    "gpu": "a100-40gb"}
    assert "resources" not in result["spec"]["containers"][0] or not result["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpumem" in result["spec"]["containers"][1]["resources"]["limits"]


def test_pods_that_do_not_opt_in_are_admitted_unchanged():
    with serve() as url:
        response = post(url, admission_review(pod({"team": "a"})))
        unannotated = post(url, admission_review(pod(None)))
    assert response == {"uid": response["uid"], "allowed": True}
    assert unannotated["allowed"] is True and "patch" not in unannotated


@pytest.mark.parametrize("policy", ["open", "closed"])
def test_failure_policy_on_a_failed_estimate_a_missing_configmap_and_a_slow_one(policy):
    release = threading.Event()

    def slow_or_failing(job, ctx):
        if job.command[-1] == "slow.py":
            release.wait(10)
        return fake_estimator(job, ctx)

    cases = [
        pod({"peakmem.io/command": "fail now"}),
        pod({"peakmem.io/configmap": "missing"}),
        pod({"peakmem.io/command": "python -m slow.py"}),
        pod({"peakmem.io/command": "python train.py", "peakmem.io/options": "{not json"}),
        pod({"peakmem.io/command": "python train.py"}),  # no ConfigMap, no workdir
    ]
    with serve(slow_or_failing, failure_policy=policy, budget_seconds=0.5) as url:
        responses = [post(url, admission_review(case)) for case in cases]
        release.set()
    for response in responses:
        assert "patch" not in response
        if policy == "open":
            assert response["allowed"] is True
            assert response["warnings"][0].startswith("peakmem: no GPU memory request added")
        else:
            assert response["allowed"] is False
            assert response["status"]["code"] == 403
            assert response["status"]["message"].startswith("peakmem: ")
    assert "not ready within 0.5 s" in (responses[2].get("warnings") or [responses[2]["status"]["message"]])[0]


def test_updates_and_other_kinds_are_admitted_unchanged():
    original = pod({"peakmem.io/command": "python -m peakmem.examples.mlp_train"})
    update = admission_review(original)
    update["request"]["operation"] = "UPDATE"
    deployment = admission_review(original)
    deployment["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    with serve() as url:
        for review in (update, deployment):
            response = post(url, review)
            assert response == {"uid": review["request"]["uid"], "allowed": True}


MANGLES = [
    lambda p: p["metadata"].update(annotations=["peakmem.io/command"]),
    lambda p: p["metadata"]["annotations"].update({"peakmem.io/command": 42}),
    lambda p: p["spec"].update(containers="train"),
    lambda p: p["spec"].update(containers=[]),
    lambda p: p.update(metadata="x"),
    lambda p: p["metadata"]["annotations"].update({"peakmem.io/container": "nope"}),
    lambda p: p["metadata"]["annotations"].update({"peakmem.io/command": "python 'unclosed"}),
    lambda p: p["metadata"]["annotations"].update({"peakmem.io/options": '{"evil": 1}'}),
    lambda p: (p["metadata"].update(annotations={"peakmem.io/configmap": "train-script"}),
               p["spec"]["containers"][0].update(command=[1, 2])),
]


def test_malformed_pods_follow_the_failure_policy():
    with serve(failure_policy="closed") as url:
        for mangle in MANGLES:
            original = pod({"peakmem.io/command": "python -m peakmem.examples.mlp_train"})
            mangle(original)
            response = post(url, admission_review(original))
            assert response["allowed"] is False
            assert response["status"]["message"].startswith("peakmem: ")


def test_not_an_admission_review_is_400():
    with serve() as url:
        response = httpx.post(f"{url}/v1/admission", json={"hello": 1}, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["kind"] == "bad_input"


def test_build_patch_escapes_keys_and_fills_missing_maps():
    from peakmem.schedule.emit import ContainerRequest

    request = ContainerRequest(limits={"nvidia.com/gpumem": "100"}, requests={"a/b": "1"},
                               annotations={"x/y": "z"}, env={"E": "1"},
                               node_selector={"gpu/type": "h100"})
    original = pod(None, resources=V1ResourceRequirements(limits={"cpu": "1"}))
    patch = build_patch(original, 0, request, {"peakmem.io/estimate-id": "abc"})
    assert {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpumem",
            "value": "100"} in patch
    result = apply_patch(original, patch)
    assert result["metadata"]["annotations"] == {"x/y": "z", "peakmem.io/estimate-id": "abc"}
    assert result["spec"]["nodeSelector"] == {"gpu/type": "h100"}
    assert result["spec"]["containers"][0]["env"] == [{"name": "E", "value": "1"}]
    assert result["spec"]["containers"][0]["resources"]["requests"] == {"a/b": "1"}


def test_pod_job_parses_the_annotations():
    found = pod_job(pod({"peakmem.io/command": "python train.py --x 'a b'",
                         "peakmem.io/options": '{"steps": 2, "mode": "fake"}'}), "team-a", None)
    assert found.job.command == ("python", "train.py", "--x", "a b")
    assert dict(found.job.options) == {"steps": 2, "mode": "fake"}
    assert pod_job(pod({}), "team-a", None) is None


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_webhook_over_tls(tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=peakmem.peakmem.svc", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    original = pod({"peakmem.io/command": "python -m peakmem.examples.mlp_train"})
    app = create_app(ServiceConfig(sandbox="off"), estimator=fake_estimator)
    with running_server(app, ssl_certfile=str(cert), ssl_keyfile=str(key)) as url:
        assert url.startswith("https://")
        response = post(url, admission_review(original),
                        verify=ssl.create_default_context(cafile=str(cert)))
        with pytest.raises(httpx.ConnectError):
            httpx.post(f"{url}/v1/admission", json=admission_review(original), timeout=10)
    assert patched(response, original)["spec"]["containers"][0]["resources"]["limits"]
