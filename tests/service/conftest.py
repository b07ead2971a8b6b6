from __future__ import annotations

import importlib.util
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# the service's packages are the `service` extra (CI installs them with `dev`)
if any(importlib.util.find_spec(name) is None for name in ("fastapi", "uvicorn", "httpx")):
    collect_ignore_glob = ["test_[!f]*.py"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(app, **kwargs) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port in a thread; yields its base URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **kwargs)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    scheme = "https" if kwargs.get("ssl_certfile") else "http"
    try:
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def wait_final(client, job_id: str, seconds: float = 30.0) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        body = client.get(f"/v1/estimates/{job_id}").json()
        if body["status"] in ("done", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.02)
