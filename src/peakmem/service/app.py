"""The estimation service (FastAPI): `create_app(config, estimator=...)`.

POST /v1/estimates (JSON, or multipart with an archive) -> {"id"}; GET /v1/estimates/{id} ->
{"status", "result", "error"}; POST /v1/admission (Kubernetes mutating webhook); /healthz;
/metrics (Prometheus)."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, File, Form, Path, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from peakmem import __version__
from peakmem.service.admission import (
    AdmissionConfig,
    AdmissionError,
    ConfigMapReader,
    build_patch,
    pod_job,
    review,
)
from peakmem.service.files import (
    DEFAULT_LIMITS,
    FileLimits,
    FilesError,
    check_files,
    extract_archive,
)
from peakmem.service.jobs import DEFAULT_GPU, EstimateJob, Estimator, error_object, job_problem
from peakmem.service.metrics import ServiceMetrics
from peakmem.service.models import (
    Detail,
    ErrorResponse,
    EstimateRequest,
    EstimateStatus,
    Health,
    Submitted,
)
from peakmem.service.queue import JobQueue, QueueFull, SandboxChoice, choose_sandbox

log = logging.getLogger("peakmem.service")

ID_PATTERN = r"^[0-9a-f]{64}$"


@dataclass(frozen=True)
class ServiceConfig:
    workers: int = 2
    max_queue: int = 64
    max_attempts: int = 2
    max_seconds: float = 600.0
    """Wall-clock limit of one estimate (a request's `timeout` may only lower it)."""
    max_host_memory: int | None = 16 * 2**30
    """Host RAM one job's processes may hold (a request's `max_host_memory` may only lower it)."""
    sandbox: str = "auto"
    """required | auto | off (see :func:`peakmem.service.queue.choose_sandbox`)."""
    max_body_bytes: int = 96 * 2**20
    file_limits: FileLimits = DEFAULT_LIMITS
    max_records: int = 10000
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    workdir_base: str | None = None


class _BodyLimit:
    """ASGI middleware: 413 past `limit` bytes of request body; a multipart POST to
    /v1/estimates goes to the archive route."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        ctype = headers.get(b"content-type", b"").decode("latin-1").lower()
        if scope["method"] == "POST" and scope["path"] == "/v1/estimates" and ctype.startswith(
            "multipart/form-data"
        ):
            scope = {**scope, "path": "/v1/estimate-archives", "raw_path": b"/v1/estimate-archives"}
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _too_large(self.limit)(scope, receive, send)
            return
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLarge:
            await _too_large(self.limit)(scope, receive, send)


class _BodyTooLarge(StarletteHTTPException):
    """Raised while the body is read: the framework lets HTTP exceptions through."""

    def __init__(self) -> None:
        super().__init__(413, "the request body is too large")


def _too_large(limit: int) -> Response:
    return JSONResponse({"detail": f"the request body is larger than {limit} bytes"}, 413)


def _bad_input(message: str) -> JSONResponse:
    return JSONResponse({"error": error_object("bad_input", message, 2, "bad_input")}, 400)


def create_app(
    config: ServiceConfig | None = None,
    estimator: Estimator | None = None,
    configmaps: ConfigMapReader | None = None,
) -> FastAPI:
    """The service. `estimator` runs one job (default: `peakmem estimate --json` in a child
    process); `configmaps` reads ConfigMaps for the webhook (default: none)."""
    config = config or ServiceConfig()
    if estimator is None:
        from peakmem.service.estimators import cli_estimator

        estimator = cli_estimator
    metrics = ServiceMetrics()
    queue = JobQueue(
        estimator, workers=config.workers, max_queue=config.max_queue,
        max_attempts=config.max_attempts, max_seconds=config.max_seconds,
        max_host_memory=config.max_host_memory, max_records=config.max_records,
        metrics=metrics, workdir_base=config.workdir_base,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        queue.sandbox = await asyncio.to_thread(choose_sandbox, config.sandbox)
        if not queue.sandbox.enabled:
            log.warning("peakmem service: %s", queue.sandbox.reason)
        await queue.start()
        try:
            yield
        finally:
            await queue.stop()
            from peakmem.service.estimators import kill_running

            kill_running()

    app = FastAPI(
        title="peakmem",
        version=__version__,
        description="Peak GPU memory estimates of PyTorch training jobs, without a GPU.",
        lifespan=lifespan,
    )
    app.state.queue = queue

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Any, exc: RequestValidationError) -> JSONResponse:
        """422 without echoing the input back (it may be large, or not encodable)."""
        detail = [
            {"type": str(error.get("type", "")),
             "loc": [part if isinstance(part, int) else str(part).encode("utf-8", "replace")
                     .decode() for part in error.get("loc", ())],
             "msg": str(error.get("msg", "")).encode("utf-8", "replace").decode()}
            for error in exc.errors()[:20]
        ]
        return JSONResponse({"detail": detail}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Any, exc: StarletteHTTPException) -> JSONResponse:
        """400s raised by the framework (a malformed multipart body) carry the contract's error
        object like peakmem's own; the others a `detail` line."""
        if exc.status_code == 400:
            return _bad_input(f"malformed request: {exc.detail}")
        if isinstance(exc, _BodyTooLarge):
            return _too_large(config.max_body_bytes)
        return JSONResponse({"detail": str(exc.detail)}, exc.status_code, headers=exc.headers)

    app.state.metrics = metrics
    app.add_middleware(_BodyLimit, limit=config.max_body_bytes)
    submit_responses: dict[int | str, dict[str, Any]] = {
        200: {"model": Submitted, "description": "already known (cached, queued or running)"},
        400: {"model": ErrorResponse, "description": "bad files, command or GPU"},
        413: {"model": Detail, "description": "request body too large"},
        429: {"model": Detail, "description": "the queue is full"},
    }

    def enqueue(job: EstimateJob) -> JSONResponse:
        problem = job_problem(job)
        if problem is not None:
            return _bad_input(problem)
        try:
            record, created = queue.submit(job)
        except QueueFull as exc:
            return JSONResponse({"detail": str(exc)}, 429, headers={"Retry-After": "5"})
        return JSONResponse({"id": record.id, "status": record.status}, 202 if created else 200)

    @app.post("/v1/estimates", status_code=202, response_model=Submitted,
              responses=submit_responses)
    async def submit_estimate(body: EstimateRequest) -> JSONResponse:
        """Queue an estimate of `command` run over `files` (JSON). A multipart form with an
        `archive` (tar or zip) is accepted here too (see POST /v1/estimate-archives)."""
        try:
            files = check_files({k: v.encode("utf-8") for k, v in body.files.items()},
                                config.file_limits)
        except (FilesError, UnicodeEncodeError) as exc:
            return _bad_input(str(exc))
        return enqueue(EstimateJob(tuple(body.command), files, body.gpu, body.options.as_dict()))

    @app.post("/v1/estimate-archives", status_code=202, response_model=Submitted,
              responses=submit_responses)
    async def submit_archive(
        archive: UploadFile = File(..., description="tar (optionally compressed) or zip"),  # noqa: B008
        command: str = Form(..., description="JSON list of words, or shell words"),
        gpu: str = Form(DEFAULT_GPU, pattern=r"^[A-Za-z0-9._-]{1,64}$"),
        options: str = Form("{}", description="JSON object of estimate options"),
    ) -> JSONResponse:
        """Queue an estimate whose files come as an archive (multipart form)."""
        data = await archive.read(config.file_limits.max_total_bytes * 2 + 1)
        if len(data) > config.file_limits.max_total_bytes * 2:
            return _bad_input("the archive is larger than the service accepts")
        try:
            files = await asyncio.to_thread(extract_archive, data, config.file_limits)
            words = json.loads(command) if command.strip().startswith("[") else shlex.split(command)
            parsed = EstimateRequest.model_validate(
                {"command": words, "gpu": gpu, "options": json.loads(options or "{}")})
        except FilesError as exc:
            return _bad_input(str(exc))
        except ValueError as exc:  # JSON, shell words, or the request model
            return _bad_input(f"bad form field: {' '.join(str(exc).split())[:500]}")
        return enqueue(EstimateJob(tuple(parsed.command), files, parsed.gpu,
                                   parsed.options.as_dict()))

    @app.get("/v1/estimates/{estimate_id}", response_model=EstimateStatus,
             responses={404: {"model": Detail, "description": "no such estimate"}})
    async def get_estimate(estimate_id: str = Path(..., pattern=ID_PATTERN)) -> Any:
        """The status of an estimate, with its result or error once it is final."""
        record = queue.get(estimate_id)
        if record is None:
            return JSONResponse({"detail": f"no estimate {estimate_id}"}, 404)
        return record.view()

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Any:
        """Liveness and readiness."""
        sandbox: SandboxChoice = queue.sandbox
        return {"status": "ok", "version": __version__, "sandbox": sandbox.backend,
                "sandbox_note": sandbox.reason, "workers": queue.workers, "queued": queue.depth,
                "running": queue.running, "max_queue": queue.max_queue}

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}})
    async def prometheus_metrics() -> Response:
        """Prometheus metrics."""
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/admission", responses={400: {"model": ErrorResponse}})
    async def admission(review_body: dict[str, Any]) -> Any:
        """Kubernetes mutating admission webhook (AdmissionReview v1) for pods that opt in."""
        request = review_body.get("request")
        if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
            return _bad_input("not an AdmissionReview with a request uid")
        answer = await _admit(request, config.admission, queue, configmaps)
        metrics.admission.labels(
            "patched" if answer["response"].get("patch") else
            "allowed" if answer["response"]["allowed"] else "denied").inc()
        return answer

    return app


async def _admit(request: dict[str, Any], policy: AdmissionConfig, queue: JobQueue,
                 configmaps: ConfigMapReader | None) -> dict[str, Any]:
    uid = request["uid"]
    pod = request.get("object")
    if not isinstance(pod, dict) or request.get("operation", "CREATE") != "CREATE":
        return review(uid, True)  # a running pod's resources cannot change
    if (request.get("kind") or {}).get("kind", "Pod") != "Pod":
        return review(uid, True)
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "default"

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
    patch = build_patch(pod, found.container_index, emitted, extra)
    return review(uid, True, patch=patch)
