"""The admission webhook's request handling: find the pod's job, estimate it (or read the cache)
within the time budget, answer with the patch or by the failure policy."""

from __future__ import annotations

import asyncio
from typing import Any

from peakmem.service.admission import (
    AdmissionConfig,
    AdmissionError,
    ConfigMapReader,
    build_patch,
    pod_job,
    review,
)
from peakmem.service.jobs import job_problem
from peakmem.service.queue import JobQueue, QueueFull


async def admit(request: dict[str, Any], policy: AdmissionConfig, queue: JobQueue,
                 configmaps: ConfigMapReader | None) -> dict[str, Any]:
    uid = request["uid"]
    pod = request.get("object")
    if not isinstance(pod, dict) or request.get("operation", "CREATE") != "CREATE":
        return review(uid, True)  # a running pod's resources cannot change
    if _mapping(request.get("kind")).get("kind", "Pod") != "Pod":
        return review(uid, True)
    namespace = request.get("namespace") or _mapping(pod.get("metadata")).get("namespace") or "default"

    def give_up(message: str) -> dict[str, Any]:
        if policy.failure_policy == "closed":
            return review(uid, False, message=f"peakmem: {message}", code=403)
        return review(uid, True, warnings=[f"peakmem: no GPU memory request added: {message}"])

    try:
        found = await asyncio.to_thread(pod_job, pod, namespace, configmaps, policy.default_gpu,
                                        policy.workdir)
    except AdmissionError as exc:
        return give_up(str(exc))
    except (TypeError, ValueError, AttributeError) as exc:  # a malformed object in the review
        return give_up(f"malformed pod object ({type(exc).__name__})")
    if found is None:
        return review(uid, True)
    problem = job_problem(found.job)
    if problem is not None:
        if problem.startswith("script not found"):
            problem += (" (ship it in a ConfigMap named by peakmem.io/configmap, or start the "
                        "service with --admission-workdir)")
        return give_up(problem)
    try:
        record, _ = queue.submit(found.job)
    except QueueFull as exc:
        return give_up(str(exc))
    if not await queue.wait(record, policy.budget_seconds):
        return give_up(f"the estimate {record.id} was not ready within "
                       f"{policy.budget_seconds:g} s (it goes on; a retry reads it)")
    if record.status != "done" or record.result is None:
        message = (record.error or {}).get("message", "the estimate failed")
        return give_up(f"the estimate failed: {message}")
    from peakmem.schedule.emit import container_request

    try:
        emitted = container_request(record.result, policy.fmt)
    except Exception as exc:  # noqa: BLE001 - a format that cannot use this estimate
        return give_up(f"cannot emit the {policy.fmt} request: {type(exc).__name__}: {exc}")
    extra = {"peakmem.io/estimate-id": record.id,
             "peakmem.io/peak-bytes": str(record.result.get("peak_bytes"))}
    try:
        patch = build_patch(pod, found.container_index, emitted, extra)
    except AdmissionError as exc:
        return give_up(str(exc))
    return review(uid, True, patch=patch)


def _mapping(value: Any) -> dict[str, Any]:
    """`value` where it is a JSON object, else an empty one (a review's optional objects may
    come as any JSON value: `"kind": "Pod"` instead of `{"kind": "Pod", ...}`)."""
    return value if isinstance(value, dict) else {}
