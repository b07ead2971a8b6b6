"""ASGI middleware: a cap on the request body (413 past it, also for chunked bodies), and the
multipart POST to /v1/estimates routed to the archive route."""

from __future__ import annotations

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
