"""The deployment files, validated against the Kubernetes object model: every document
deserializes into its model without losing a field (a misspelt field would be dropped), the
pieces refer to each other, and the container's arguments are ones `peakmem serve` accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

kubernetes = pytest.importorskip("kubernetes")
yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents() -> list[dict]:
    found = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def model_of(doc: dict):
    from kubernetes.client import ApiClient

    group_version = doc["apiVersion"].split("/")
    version = group_version[-1].capitalize()
    klass = f"{version}{doc['kind']}"
    client = ApiClient()
    model = client._ApiClient__deserialize(doc, klass)  # the client's own deserializer
    return model, client.sanitize_for_serialization(model)


def by_kind(kind: str) -> list[dict]:
    return [doc for doc in documents() if doc["kind"] == kind]


def test_every_document_is_a_valid_kubernetes_object_with_no_unknown_field():
    docs = documents()
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "Service", "MutatingWebhookConfiguration", "ServiceAccount",
            "ClusterRole", "ClusterRoleBinding", "Namespace"} <= kinds
    for doc in docs:
        model, round_trip = model_of(doc)
        assert type(model).__name__.endswith(doc["kind"])
        assert round_trip == doc, f"{doc['kind']} {doc['metadata']['name']}: fields lost"


def test_webhook_points_at_the_service_and_the_admission_route():
    (webhook_config,) = by_kind("MutatingWebhookConfiguration")
    (service,) = by_kind("Service")
    (deployment,) = by_kind("Deployment")
    (hook,) = webhook_config["webhooks"]
    client = hook["clientConfig"]["service"]
    assert (client["name"], client["namespace"]) == (service["metadata"]["name"],
                                                      service["metadata"]["namespace"])
    assert client["path"] == "/v1/admission" and client["port"] == service["spec"]["ports"][0]["port"]
    assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
    assert hook["rules"][0]["resources"] == ["pods"]
    assert deployment["spec"]["replicas"] == 1  # the store's claims are one pod's processes'
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    budget = float(next(a for a in args if a.startswith("--admission-budget=")).split("=")[1])
    assert hook["timeoutSeconds"] > budget
    policy = next(a for a in args if a.startswith("--failure-policy=")).split("=")[1]
    assert hook["failurePolicy"] == {"open": "Ignore", "closed": "Fail"}[policy]


def test_the_container_arguments_parse_as_peakmem_serve(monkeypatch, tmp_path):
    import click

    from peakmem.cli.serve import serve

    (deployment,) = by_kind("Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = list(container["args"])
    assert args[0] == "serve"
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("x")
    key.write_text("x")
    args = [a.replace("/tls/tls.crt", str(cert)).replace("/tls/tls.key", str(key)) for a in args[1:]]
    ctx = serve.make_context("serve", args)
    assert ctx.params["port"] == container["ports"][0]["containerPort"]
    assert ctx.params["tls_cert"] == str(cert) and ctx.params["configmaps"] is True
    probe = container["readinessProbe"]["httpGet"]
    from peakmem.service.app import create_app

    paths = {route.path for route in create_app().routes}
    assert probe["path"] in paths and "/v1/admission" in paths
    assert isinstance(ctx, click.Context)


def test_dockerfile_runs_peakmem_serve_unprivileged():
    text = (DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["peakmem"]' in text and '"serve"' in text
    assert "USER 10001" in text and ".[service]" in text and "bubblewrap" in text


def test_the_server_processes_share_a_store_on_a_writable_volume(tmp_path):
    """--processes N with --store on a volume mounted writable (the root filesystem is read-only),
    and the estimates at once (processes x workers) fit the memory limit at --max-host-memory."""
    from peakmem.cli.common import parse_bytes
    from peakmem.cli.serve import serve

    (deployment,) = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = [a for a in container["args"][1:] if not a.startswith("--tls-")]
    params = serve.make_context("serve", args).params
    assert params["processes"] >= 2 and params["store_dir"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == params["store_dir"])
    assert not mount.get("readOnly", False) and container["securityContext"]["readOnlyRootFilesystem"]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert "emptyDir" in volume  # this pod's own: no other pod's processes claim jobs in it
    limit = parse_bytes(container["resources"]["limits"]["memory"].replace("Gi", "GiB"), "limit")
    at_once = params["processes"] * params["workers"]
    assert at_once * parse_bytes(params["max_host_memory"], "--max-host-memory") < limit
    assert at_once <= float(container["resources"]["limits"]["cpu"])
