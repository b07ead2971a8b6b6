"""ASGI middleware: a cap on the request body (413 past it, also for chunked bodies), the
multipart POST to /v1/estimates routed to the archive route, a deadline on receiving a body
(408: a client trickling or stalling its body held a connection and its task for ever), and
compressed bodies refused (415) rather than parsed as JSON."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

ARCHIVE_ROUTE = "/v1/estimate-archives"


class BodyLimit:
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
        encoding = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()
        if scope["method"] in ("POST", "PUT", "PATCH") and encoding not in ("", "identity"):
            await unsupported_encoding(encoding)(scope, receive, send)
            return
        ctype = headers.get(b"content-type", b"").decode("latin-1").lower()
        if scope["method"] == "POST" and scope["path"] == "/v1/estimates" and ctype.startswith(
            "multipart/form-data"
        ):
            scope = {**scope, "path": ARCHIVE_ROUTE, "raw_path": ARCHIVE_ROUTE.encode()}
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await too_large(self.limit)(scope, receive, send)
            return
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except BodyTooLarge:
            await too_large(self.limit)(scope, receive, send)


class BodyTooLarge(StarletteHTTPException):
    """Raised while the body is read: the framework lets HTTP exceptions through."""

    def __init__(self) -> None:
        super().__init__(413, "the request body is too large")


def too_large(limit: int) -> Response:
    return JSONResponse({"detail": f"the request body is larger than {limit} bytes"}, 413)


def unsupported_encoding(encoding: str) -> Response:
    """415 for a compressed body: it was parsed as it came (`malformed request: There was an
    error parsing the body`); nothing here inflates a body (no gzip bomb to defuse)."""
    shown = encoding if len(encoding) <= 40 and encoding.isprintable() else repr(encoding[:40])
    return JSONResponse({"detail": f"Content-Encoding {shown} is not supported: send the body "
                                   "uncompressed"}, 415)


BODY_SECONDS = 120.0
"""How long a request body may take to arrive, from the first read of it (96 MiB at 1 MB/s)."""


class BodyTooSlow(StarletteHTTPException):
    """The request body did not arrive whole in time."""

    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"the request body did not arrive within {seconds:g} s")


class BodyDeadline:
    """ASGI middleware (outermost: the fast path reads bodies too): a request whose body is not
    received whole within `seconds` of the first read is answered 408. A slowloris client (a
    partial body, then nothing, or a byte a minute) held its connection and a task for ever."""

    def __init__(self, app: Any, seconds: float | None = None) -> None:
        self.app = app
        self.seconds = BODY_SECONDS if seconds is None else seconds

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        complete = False

        async def timed() -> dict:
            nonlocal deadline, complete
            if complete:
                return await receive()
            if deadline is None:
                deadline = loop.time() + self.seconds
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.001))
            except TimeoutError:
                raise BodyTooSlow(self.seconds) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        try:
            await self.app(scope, timed, send)
        except BodyTooSlow as exc:
            await JSONResponse({"detail": exc.detail}, 408,
                               headers={"connection": "close"})(scope, receive, send)
