"""Property-based fuzzing of the OpenAPI spec (schemathesis) against a live server with the fake
estimator: every documented operation, a few examples each, every response checked against the
spec (status codes, content types, schemas, no 5xx). Schemathesis is driven through its Python
API (each operation's hypothesis strategy), not its pytest plugin, which follows pytest's
internals release by release."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import positive_data_acceptance  # noqa: E402

from peakmem.service.app import ServiceConfig, create_app  # noqa: E402
from peakmem.service.estimators import fake_estimator  # noqa: E402

from .conftest import running_server  # noqa: E402


@pytest.fixture(scope="module")
def live_schema():
    app = create_app(ServiceConfig(sandbox="off", max_queue=10000), estimator=fake_estimator)
    with running_server(app) as url:
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


def _operations(schema) -> list:
    operations = []
    for result in schema.get_all_operations():
        operations.append(result.ok())
    return operations


def test_api_conforms_to_its_openapi_spec(live_schema):
    operations = _operations(live_schema)
    assert len(operations) >= 4, [op.label for op in operations]
    calls = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=8, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), database=None)
        def conforms(case):
            # A schema-valid job can still be refused with a documented 400 (a script that is
            # not among the files sent, an unknown GPU profile): rules no JSON schema can state.
            calls.append(case.operation.label)
            case.call_and_validate(timeout=10, excluded_checks=[positive_data_acceptance])

        conforms()
    assert set(calls) == {op.label for op in operations} and len(calls) > 2 * len(operations)
