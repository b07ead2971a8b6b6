"""The estimation service (FastAPI): `create_app(config, estimator=...)`.

POST /v1/estimates (JSON, or multipart with an archive) -> {"id"}; GET /v1/estimates/{id} ->
{"status", "result", "error"}; POST /v1/admission (Kubernetes mutating webhook); /healthz;
/metrics (Prometheus)."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, File, Form, Path, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from peakmem import __version__
from peakmem.service.admission import AdmissionConfig, ConfigMapReader, review
from peakmem.service.body_limit import (
    ARCHIVE_ROUTE,
    BodyDeadline,
    BodyLimit,
    BodyTooLarge,
    too_large,
)
from peakmem.service.fast_path import FastPath
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
from peakmem.service.store import ResultStore
from peakmem.service.webhook import admit
from peakmem.shell_words import shell_words

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
    store_dir: str | None = None
    """A directory of final results shared by the server processes of this machine
    (:mod:`peakmem.service.store`); None: results in memory only."""
    job_nice: int = 10
    """Niceness added to each job's worker process (`peakmem serve --job-nice`): estimates are
    CPU-bound, and at the server's own priority they would slow its answers."""
    fast_path: bool = True
    """Answer repeated submissions of known jobs before routing and validation
    (:mod:`peakmem.service.fast_path`)."""
    token: str | None = None
    """When set, the estimate routes need `Authorization: Bearer <token>` (401 otherwise);
    /healthz, /metrics and the webhook (behind TLS, called by the API server) do not."""


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
        metrics=metrics, workdir_base=config.workdir_base, job_nice=config.job_nice,
        store=ResultStore(config.store_dir, stale_seconds=config.max_seconds * 2 + 120)
        if config.store_dir else None,
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
        if isinstance(exc, BodyTooLarge):
            return too_large(config.max_body_bytes)
        return JSONResponse({"detail": str(exc.detail)}, exc.status_code, headers=exc.headers)

    app.state.metrics = metrics
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    if config.fast_path:  # added last: it runs first
        app.add_middleware(FastPath, queue=queue, max_body_bytes=config.max_body_bytes,
                           token=config.token, metrics=metrics)
    app.add_middleware(BodyDeadline)  # outermost: bounds every read of a body, the fast path's too
    submit_responses: dict[int | str, dict[str, Any]] = {
        200: {"model": Submitted, "description": "already known (cached, queued or running)"},
        400: {"model": ErrorResponse, "description": "bad files, command or GPU"},
        413: {"model": Detail, "description": "request body too large"},
        429: {"model": Detail, "description": "the queue is full"},
    }

    guarded: list[Any] = []
    if config.token:
        bearer = HTTPBearer(auto_error=False, description="the service's token (--token-file)")
        expected = config.token.encode()

        async def require_token(
            credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
        ) -> None:
            given = (credentials.credentials if credentials else "").encode("utf-8", "replace")
            if not hmac.compare_digest(given, expected):
                raise StarletteHTTPException(401, "a valid bearer token is required",
                                             headers={"WWW-Authenticate": "Bearer"})

        guarded = [Depends(require_token)]
        submit_responses[401] = {"model": Detail, "description": "no valid bearer token"}

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
              responses=submit_responses, dependencies=guarded)
    async def submit_estimate(body: EstimateRequest) -> JSONResponse:
        """Queue an estimate of `command` run over `files` (JSON). A multipart form with an
        `archive` (tar or zip) is accepted here too (see POST /v1/estimate-archives)."""
        try:
            files = check_files({k: v.encode("utf-8") for k, v in body.files.items()},
                                config.file_limits)
        except (FilesError, UnicodeEncodeError) as exc:
            return _bad_input(str(exc))
        return enqueue(EstimateJob(tuple(body.command), files, body.gpu, body.options.as_dict()))

    @app.post(ARCHIVE_ROUTE, status_code=202, response_model=Submitted,
              responses=submit_responses, dependencies=guarded)
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
            words = (json.loads(command) if command.strip().startswith("[")
                     else shell_words(command))
            parsed = EstimateRequest.model_validate(
                {"command": words, "gpu": gpu, "options": json.loads(options or "{}")})
        except FilesError as exc:
            return _bad_input(str(exc))
        except ValueError as exc:  # JSON, shell words, or the request model
            return _bad_input(f"bad form field: {' '.join(str(exc).split())[:500]}")
        except RecursionError:  # json.loads of a form field nested thousands deep
            return _bad_input("bad form field: JSON nested too deeply")
        return enqueue(EstimateJob(tuple(parsed.command), files, parsed.gpu,
                                   parsed.options.as_dict()))

    @app.get("/v1/estimates/{estimate_id}", response_model=EstimateStatus, dependencies=guarded,
             responses={404: {"model": Detail, "description": "no such estimate"},
                        **({401: submit_responses[401]} if config.token else {})})
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
        answer = await admit(request, config.admission, queue, configmaps)
        # v1beta1 in, v1beta1 out: the API server refuses an answer of another version
        answer["apiVersion"] = review(request["uid"], True,
                                      api_version=review_body.get("apiVersion"))["apiVersion"]
        metrics.admission.labels(
            "patched" if answer["response"].get("patch") else
            "allowed" if answer["response"]["allowed"] else "denied").inc()
        return answer

    return app
