"""Several server processes on one listening socket (`peakmem serve --processes N`).

The parent binds the socket and forks N children; each builds its own app (its own queue, its
own claim owner in the shared store) and runs uvicorn on the inherited socket, so the kernel hands
each connection to whichever child accepts it first. The parent forwards SIGTERM/SIGINT to the
children, and starts a new child for one that is killed or exits after `MIN_UPTIME_SECONDS` (one
that exits sooner failed to start: the parent stops the others and fails)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

log = logging.getLogger("peakmem.service")

MIN_UPTIME_SECONDS = 5.0


class ChildFailed(RuntimeError):
    """A server process exited during its start-up."""


def listen(host: str, port: int) -> socket.socket:
    """The listening socket the children share (OSError where it cannot be bound)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


def serve_processes(make_app: Callable[[], Any], sock: socket.socket, processes: int,
                    uvicorn_options: dict[str, Any]) -> None:
    """Run `processes` uvicorn servers of `make_app()` on `sock` until SIGTERM/SIGINT."""
    children: dict[int, float] = {}
    stopping = False

    def start_child() -> None:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                import uvicorn

                server = uvicorn.Server(uvicorn.Config(make_app(), **uvicorn_options))
                server.run(sockets=[sock])
            except BaseException:  # noqa: BLE001 - report and leave with a status, whatever it was
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = time.monotonic()

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for _ in range(processes):
            start_child()
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            started = children.pop(pid, None)
            if started is None or stopping:
                continue
            killed = os.WIFSIGNALED(status)  # OOM killer, an operator: not a start-up failure
            if not killed and time.monotonic() - started < MIN_UPTIME_SECONDS:
                stop(signal.SIGTERM, None)
                _reap(children)
                raise ChildFailed(f"a server process exited during its start-up "
                                  f"(status {os.waitstatus_to_exitcode(status)})")
            log.warning("peakmem service: server process %d exited (status %d); starting another",
                        pid, os.waitstatus_to_exitcode(status))
            start_child()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


def _reap(children: dict[int, float]) -> None:
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        children.pop(pid, None)
