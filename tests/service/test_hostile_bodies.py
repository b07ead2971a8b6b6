"""Arbitrary JSON (and non-JSON) bodies never make the API fail with a 5xx."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peakmem.service.app import ServiceConfig, create_app
from peakmem.service.estimators import fake_estimator

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["files", "command", "gpu", "options", "request", "uid",
                                       "object", "metadata", "annotations", "spec", "steps",
                                       "peakmem.io/command", "x"]) | st.text(max_size=8),
                      children, max_size=4),
    max_leaves=20,
)

CLIENT = TestClient(create_app(ServiceConfig(sandbox="off", max_queue=100000),
                               estimator=fake_estimator), raise_server_exceptions=False)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=JSON, path=st.sampled_from(["/v1/estimates", "/v1/admission",
                                        "/v1/estimate-archives"]))
def test_arbitrary_json_is_never_a_server_error(body, path):
    with CLIENT:
        response = CLIENT.post(path, content=json.dumps(body),
                               headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200), ctype=st.sampled_from(
    ["application/json", "multipart/form-data; boundary=x", "text/plain", ""]))
def test_arbitrary_bytes_are_never_a_server_error(raw, ctype):
    with CLIENT:
        response = CLIENT.post("/v1/estimates", content=raw, headers={"content-type": ctype})
    assert response.status_code < 500, response.text
