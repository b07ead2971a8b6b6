"""The Kubernetes mutating admission webhook's logic (AdmissionReview v1), free of HTTP.

A pod opts in with annotations (prefix ``peakmem.io/``):

- ``command``: the job's command, a JSON list (``["python", "train.py"]``) or shell words;
- ``configmap``: a ConfigMap in the pod's namespace whose keys are the job's files (the command
  defaults to the container's ``command`` + ``args`` when only this is given);
  (without one, the command runs in the service's ``--admission-workdir``, or must be
  ``python -m module`` of a module installed with the service);
- ``gpu`` (profile name), ``options`` (a JSON object of estimate options), ``container`` (the
  container to patch; default the first).

The response patches that container's resources (and the pod's annotations, env, node selector)
with the scheduler format's request (:func:`peakmem.schedule.emit.container_request`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from peakmem.service.jobs import DEFAULT_GPU, OPTION_NAMES, EstimateJob
from peakmem.shell_words import shell_words

PREFIX = "peakmem.io/"
FAILURE_POLICIES = ("open", "closed")

ConfigMapReader = Callable[[str, str], dict[str, bytes]]
"""(namespace, name) -> the ConfigMap's files (data and binaryData); raises LookupError."""


class AdmissionError(ValueError):
    """The pod's opt-in annotations cannot be used."""


@dataclass(frozen=True)
class AdmissionConfig:
    fmt: str = "hami"
    budget_seconds: float = 8.0
    """How long the webhook waits for an estimate (Kubernetes gives a webhook at most 30 s)."""
    failure_policy: str = "open"
    """open: admit the pod unchanged (with a warning) when no estimate is ready in the budget or
    it failed; closed: refuse it."""
    default_gpu: str = DEFAULT_GPU
    workdir: str | None = None
    """Where a pod's command runs when no ConfigMap sends its files (a directory the service
    can read, such as a shared code volume); without it such a command must be `-m module`."""


@dataclass(frozen=True)
class PodJob:
    job: EstimateJob
    container_index: int


def pod_job(pod: Mapping[str, Any], namespace: str, read_configmap: ConfigMapReader | None,
            default_gpu: str = DEFAULT_GPU, workdir: str | None = None) -> PodJob | None:
    """The job a pod opted in for, or None when it did not opt in."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {} if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise AdmissionError("the pod's metadata.annotations is not a map of strings")
    command_text = annotations.get(PREFIX + "command")
    configmap = annotations.get(PREFIX + "configmap")
    if command_text is None and configmap is None:
        return None
    spec = pod.get("spec") or {}
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not containers or not all(
        isinstance(c, dict) for c in containers
    ):
        raise AdmissionError("the pod has no containers")
    index = _container_index(containers, annotations.get(PREFIX + "container"))
    if command_text is not None:
        command = _parse_command(command_text)
    else:
        container = containers[index]
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        if not all(isinstance(word, str) for word in command):
            raise AdmissionError("the container's command is not a list of strings")
        if not command:
            raise AdmissionError(f"set {PREFIX}command: the container has no command")
    files: dict[str, bytes] = {}
    if configmap is not None:
        if read_configmap is None:
            raise AdmissionError("this webhook cannot read ConfigMaps (no Kubernetes access)")
        try:
            files = read_configmap(namespace, configmap)
        except LookupError as exc:
            raise AdmissionError(f"ConfigMap {namespace}/{configmap}: {exc}") from None
    options = _parse_options(annotations.get(PREFIX + "options"))
    gpu = annotations.get(PREFIX + "gpu") or default_gpu
    cwd = workdir if configmap is None else None
    return PodJob(EstimateJob(tuple(command), files, gpu, options, cwd), index)


def _container_index(containers: list[dict[str, Any]], name: str | None) -> int:
    if name is None:
        return 0
    for index, container in enumerate(containers):
        if container.get("name") == name:
            return index
    raise AdmissionError(f"no container named {name!r} in the pod")


def _parse_command(text: str) -> list[str]:
    text = text.strip()
    try:
        words = json.loads(text) if text.startswith("[") else shell_words(text)
    except ValueError as exc:
        raise AdmissionError(f"{PREFIX}command cannot be parsed: {exc}") from None
    except RecursionError:
        raise AdmissionError(f"{PREFIX}command cannot be parsed: JSON nested too deeply") from None
    if not words or not all(isinstance(word, str) for word in words):
        raise AdmissionError(f"{PREFIX}command must be a non-empty list of strings")
    return words


def _parse_options(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        options = json.loads(text, object_pairs_hook=_unique_keys)
    except ValueError as exc:
        raise AdmissionError(f"{PREFIX}options is not JSON: {exc}") from None
    except RecursionError:
        raise AdmissionError(f"{PREFIX}options is not JSON: nested too deeply") from None
    if not isinstance(options, dict) or set(options) - set(OPTION_NAMES):
        raise AdmissionError(f"{PREFIX}options must be an object with keys among "
                             f"{', '.join(OPTION_NAMES)}")
    # the values as POST /v1/estimates checks them: `{"steps": -1}` was queued as it was, and
    # failed (or, with an estimator that ignores it, passed) later without naming the field
    from pydantic import ValidationError

    from peakmem.service.models import EstimateOptions

    try:
        return EstimateOptions.model_validate(options).as_dict()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise AdmissionError(f"{PREFIX}options: {where}: {first.get('msg')}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An annotation's JSON object; a ValueError where a key comes twice (`{"steps": 1,
    "steps": 2}`: json keeps the last silently, another reader the first)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key!r} appears twice")
        found[key] = value
    return found


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def build_patch(pod: Mapping[str, Any], container_index: int, request: Any,
                extra_annotations: Mapping[str, str]) -> list[dict[str, Any]]:
    """RFC 6902 operations adding `request` (a ContainerRequest) to the pod; AdmissionError
    where a field the patch extends is not an object (`resources: []`) or list (`env: {}`)."""
    ops: list[dict[str, Any]] = []
    container = ((pod.get("spec") or {}).get("containers") or [])[container_index]
    base = f"/spec/containers/{container_index}"
    resources = container.get("resources")
    _check_patchable(resources, dict, "resources")
    for part in ("limits", "requests"):
        _check_patchable((resources or {}).get(part), dict, f"resources.{part}")
    _check_patchable(container.get("env"), list, "env")
    _check_patchable((pod.get("metadata") or {}).get("annotations"), dict, "metadata.annotations")
    _check_patchable((pod.get("spec") or {}).get("nodeSelector"), dict, "spec.nodeSelector")
    if resources is None:
        ops.append({"op": "add", "path": f"{base}/resources", "value": {}})
        resources = {}
    for part in ("limits", "requests"):
        values = dict(getattr(request, part))
        if not values:
            continue
        if resources.get(part) is None:
            ops.append({"op": "add", "path": f"{base}/resources/{part}", "value": values})
        else:
            for key, value in values.items():
                ops.append({"op": "add", "path": f"{base}/resources/{part}/{_escape(key)}",
                            "value": value})
    if request.env:
        env = [{"name": k, "value": v} for k, v in request.env.items()]
        if container.get("env") is None:
            ops.append({"op": "add", "path": f"{base}/env", "value": env})
        else:
            ops += [{"op": "add", "path": f"{base}/env/-", "value": item} for item in env]
    annotations = {**dict(request.annotations), **dict(extra_annotations)}
    if annotations:
        if (pod.get("metadata") or {}).get("annotations") is None:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": annotations})
        else:
            ops += [{"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v}
                    for k, v in annotations.items()]
    if request.node_selector:
        if (pod.get("spec") or {}).get("nodeSelector") is None:
            ops.append({"op": "add", "path": "/spec/nodeSelector",
                        "value": dict(request.node_selector)})
        else:
            ops += [{"op": "add", "path": f"/spec/nodeSelector/{_escape(k)}", "value": v}
                    for k, v in request.node_selector.items()]
    return ops


def _check_patchable(value: Any, kind: type, where: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise AdmissionError(f"the pod's {where} is a {type(value).__name__}, not "
                             f"{'an object' if kind is dict else 'a list'}: it cannot be patched")


REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
"""The AdmissionReview versions answered; the response has the request's version (the API
server refuses another one), v1 where the request's is none of these."""


def review(uid: str, allowed: bool, *, patch: list[dict[str, Any]] | None = None,
           warnings: list[str] | None = None, message: str | None = None,
           code: int | None = None, api_version: Any = None) -> dict[str, Any]:
    """An AdmissionReview response, of the request's `api_version` (v1 by default)."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        response["warnings"] = [w[:500] for w in warnings]
    if message is not None or code is not None:
        response["status"] = {"code": code or (200 if allowed else 403), "message": message or ""}
    version = api_version if api_version in REVIEW_VERSIONS else REVIEW_VERSIONS[0]
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def kubernetes_configmaps() -> ConfigMapReader:
    """A ConfigMap reader using the pod's service account (in cluster) or ~/.kube/config."""
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    api = kubernetes.client.CoreV1Api()

    def read(namespace: str, name: str) -> dict[str, bytes]:
        try:
            cm = api.read_namespaced_config_map(name, namespace)
        except kubernetes.client.ApiException as exc:
            raise LookupError(f"cannot be read ({exc.status} {exc.reason})") from None
        files = {k: v.encode() for k, v in (cm.data or {}).items()}
        files.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
        return files

    return read
