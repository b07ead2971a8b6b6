"""ASGI middleware: a repeated `POST /v1/estimates` whose job is already known (done, or queued or
running under the same id) is answered from the store, before FastAPI's routing, dependency
injection and request validation run.

The answer is the slow path's own (`200 {"id", "status"}`, rendered by the same JSONResponse).
Only a body the slow path would accept can hit: the fast path computes the content key from the
raw JSON only when its shape is the request model's (known fields, the right JSON types), and a
key can only match a record made from a request that passed every check, so anything else (a
new job, a malformed body, a missing or wrong token, a chunked body, a retryable failure) goes
to the slow path unchanged, its body replayed, after the requests the store can answer
(:data:`MISS_YIELDS`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

from fastapi.responses import JSONResponse

from peakmem.service.jobs import DEFAULT_GPU, OPTION_NAMES, job_key
from peakmem.service.metrics import ServiceMetrics
from peakmem.service.queue import JobQueue

ROUTE = "/v1/estimates"
THREAD_HASH_BYTES = 2**20
"""Bodies larger than this are parsed and hashed in a worker thread, not on the event loop."""
MISS_YIELDS = 3
"""Times a request the store cannot answer gives the event loop back before the slow path runs.
The slow path (routing, validation, checks, queueing) runs without awaiting anything, about ten
times a cached answer's work: in a burst, the requests uvicorn has already parsed that the store
can answer are answered first instead of waiting behind it (figures: docs/BENCHMARKS.md, "The
service")."""
SWITCH_INTERVAL_SECONDS = 0.0005
"""`sys.setswitchinterval` of the serving process. The job-supervision threads (one per worker,
blocked in `communicate()` or running an in-process estimator) hold the GIL for CPython's default
5 ms slices; with the event loop waiting up to a slice each time it wants the GIL back, cached
answers queue behind them. 0.5 ms lets the loop in ten times as often."""

_FIELDS = frozenset({"files", "command", "gpu", "options"})
_OPTIONS = frozenset(OPTION_NAMES)


def request_key(body: bytes) -> str | None:
    """The content key the slow path would give this JSON body (:meth:`EstimateJob.key`), or
    None where the body is not plainly of the request model's shape (the slow path decides)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not data.keys() <= _FIELDS:
        return None
    files = data.get("files", {})
    command = data.get("command")
    gpu = data.get("gpu", DEFAULT_GPU)
    options = data.get("options", {})
    if not (isinstance(files, dict) and all(isinstance(text, str) for text in files.values())):
        return None
    if not (isinstance(command, list) and command and all(isinstance(w, str) for w in command)):
        return None
    if not (isinstance(gpu, str) and isinstance(options, dict) and options.keys() <= _OPTIONS):
        return None
    timeout = options.get("timeout")
    if type(timeout) is int:  # the model holds it as a float: 300 -> 300.0, as validation does
        options = {**options, "timeout": float(timeout)}
    try:
        encoded = {name: text.encode("utf-8") for name, text in files.items()}
    except UnicodeEncodeError:
        return None
    return job_key(encoded, command, gpu, options)


class FastPath:
    """ASGI middleware in front of the app's routes (see the module's docstring)."""

    def __init__(self, app: Any, *, queue: JobQueue, max_body_bytes: int,
                 token: str | None = None, metrics: ServiceMetrics | None = None,
                 miss_yields: int = MISS_YIELDS) -> None:
        self.app = app
        self.miss_yields = miss_yields
        self.queue = queue
        self.max_body_bytes = max_body_bytes
        self.authorization = f"bearer {token}".encode() if token else None
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not self._candidate(scope):
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        if body is None:  # the client went away while sending
            return
        replay = _replay(body, more, receive)
        key = (await asyncio.to_thread(request_key, body) if len(body) > THREAD_HASH_BYTES
               else request_key(body))
        record = self.queue.lookup(key) if key is not None else None
        if record is None:
            for _ in range(self.miss_yields):  # cached answers already parsed go out first
                await asyncio.sleep(0)
            await self.app(scope, replay, send)
            return
        if self.metrics is not None:
            self.metrics.fast_answers.inc()
        await JSONResponse({"id": record.id, "status": record.status}, 200)(scope, replay, send)

    def _candidate(self, scope: dict) -> bool:
        """A POST of a JSON body of a declared size within the limit, with the token if one is
        required."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != ROUTE:
            return False
        ctype = length = authorization = None
        for name, value in scope.get("headers") or ():
            if name == b"content-type":
                ctype = value
            elif name == b"content-length":
                length = value
            elif name == b"authorization":
                authorization = value
        if ctype is None or ctype.split(b";", 1)[0].strip().lower() != b"application/json":
            return False
        if length is None or not length.isdigit() or int(length) > self.max_body_bytes:
            return False
        if self.authorization is None:
            return True
        if authorization is None or len(authorization) != len(self.authorization):
            return False
        scheme, _, given = authorization.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(
            b"bearer " + given, self.authorization)


async def _read_body(receive: Any) -> tuple[bytes | None, dict | None]:
    """The whole request body (None when the client disconnected first), and the disconnect
    message if one came right after it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, after: dict | None, receive: Any) -> Any:
    """A `receive` that gives the body already read once, then the client's own messages."""
    sent = False

    async def again() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return after if after is not None else await receive()

    return again
