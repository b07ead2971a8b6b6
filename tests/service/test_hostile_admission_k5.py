"""AdmissionReviews whose fields have the wrong JSON type or nest too deeply: the webhook answers
by its failure policy (or admits an object it need not touch), never with a 500.

Before the fix each of these was `500 Internal Server Error` (an AttributeError on `"kind":
"Pod"` or `"metadata": "x"`, a RecursionError from json.loads of a nested annotation, an
AttributeError from build_patch on `resources: []`), found by benchmarks/hostile_service_k5.py.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from peakmem.service.admission import (
    AdmissionConfig,
    AdmissionError,
    _parse_command,
    _parse_options,
)
from peakmem.service.app import ServiceConfig, create_app
from peakmem.service.estimators import fake_estimator

COMMAND = {"peakmem.io/command": "python -m peakmem.examples.mlp_train --batch-size 8"}


def _pod(annotations: dict, container: dict | None = None, metadata: object = None) -> dict:
    return {"metadata": {"annotations": annotations, "namespace": "ns"} if metadata is None else metadata,
            "spec": {"containers": [container or {"name": "c", "image": "i"}]}}


def _review(request: dict) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", **request}}


@pytest.fixture(scope="module")
def client():
    app = create_app(ServiceConfig(sandbox="off", workers=1,
                                   admission=AdmissionConfig(failure_policy="closed", budget_seconds=20)),
                     estimator=fake_estimator)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def _answer(client: TestClient, request: dict) -> dict:
    response = client.post("/v1/admission", json=_review(request))
    assert response.status_code == 200, response.text
    return response.json()["response"]


@pytest.mark.parametrize("request_fields", [
    {"kind": "Pod", "object": _pod({})},  # kind a string: the pod did not opt in, admitted
    {"kind": ["Pod"], "object": _pod({})},
    {"object": _pod({}, metadata="x")},  # metadata a string: no annotations
])
def test_a_review_field_of_the_wrong_type_is_not_a_500(client, request_fields):
    answer = _answer(client, request_fields)
    assert answer["uid"] == "u-1" and "allowed" in answer


@pytest.mark.parametrize("annotation, words", [
    ({"peakmem.io/command": "[" * 100_000}, "command cannot be parsed: JSON nested too deeply"),
    ({**COMMAND, "peakmem.io/options": '{"a":' * 100_000}, "options is not JSON: nested too deeply"),
])
def test_a_deeply_nested_annotation_is_refused_by_the_failure_policy(client, annotation, words):
    answer = _answer(client, {"object": _pod(annotation)})
    assert answer["allowed"] is False and words in answer["status"]["message"]


@pytest.mark.parametrize("container, where", [
    ({"name": "c", "resources": []}, "resources is a list"),
    ({"name": "c", "resources": {"limits": "8"}}, "resources.limits is a str"),
    ({"name": "c", "env": {"A": "1"}}, "env is a dict"),
])
def test_a_container_field_the_patch_extends_of_the_wrong_type_is_refused(client, container, where):
    answer = _answer(client, {"object": _pod(COMMAND, container)})
    assert answer["allowed"] is False, answer
    assert where in answer["status"]["message"] and "cannot be patched" in answer["status"]["message"]


def test_the_annotation_parsers_raise_only_admission_errors_on_deep_nesting():
    with pytest.raises(AdmissionError, match="nested too deeply"):
        _parse_command("[" * 50_000 + "]" * 50_000)
    with pytest.raises(AdmissionError, match="nested too deeply"):
        _parse_options('{"a":' * 50_000 + "1" + "}" * 50_000)
