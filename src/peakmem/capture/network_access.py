"""Hosts the job could not reach (a dataset's `download=True`, pretrained weights from
`torch.hub` / torchvision, a model hub) while it ran without network access.

The job's own error says little of the cause (torchvision's MNIST: "Error downloading
train-images-idx3-ubyte.gz:", torch.hub: "URLError: <urlopen error [Errno -2] Name or service
not known>"). During a capture `socket.getaddrinfo` (under urllib, requests / urllib3 and httpx)
records each host whose name did not resolve: a note names it, and a job that then fails gets
the host and what to do in its one-line error (`CaptureResult.failure_hint`). Nothing is
downloaded or retried; a job that reaches the network does so as usual.

The hint is left out of the error of a job that fails with a programming error
(UNRELATED_ERRORS: a TypeError, an AttributeError, a NotImplementedError, ...) after a lookup
that it survived: a library that tried the hub, swallowed the failure and went on (a model
card's metadata, an optional file) did not cause it. The note still names the host.

Usage pings that libraries send on their own and whose failure they swallow (`datasets`'
`load_dataset("csv", data_files=...)` HEADs s3.amazonaws.com to count the load) download
nothing the job needs: a lookup made under one of TELEMETRY_CALLERS is not recorded.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

from peakmem.capture.session import CaptureSession

LOCAL_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1", "0.0.0.0"})

TELEMETRY_CALLERS: frozenset[tuple[str, str]] = frozenset({
    ("datasets.load", "increase_load_count"),  # a dataset's download count, errors swallowed
    ("huggingface_hub.utils._telemetry", "send_telemetry"),
    ("huggingface_hub.utils._telemetry", "_send_telemetry_in_thread"),
})
"""(module, function) of library calls that only report usage and ignore a failed request."""

MAX_CALLER_DEPTH = 64


def from_telemetry(depth: int = MAX_CALLER_DEPTH) -> bool:
    """Whether the current call runs under one of TELEMETRY_CALLERS."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return False
        if (frame.f_globals.get("__name__"), frame.f_code.co_name) in TELEMETRY_CALLERS:
            return True
        frame = frame.f_back
    return False


def unreachable_note(host: str) -> str:
    return (f"the job could not reach {host} (no network access here): what it downloads from "
            "there (a dataset, pretrained weights) was not fetched")


def unreachable_hint(host: str) -> str:
    return (f"it could not reach {host}: there is no network access here; download what the "
            "job fetches (datasets, pretrained weights) beforehand and let the job find it "
            "locally (the dataset's root folder, torch.hub's cache $TORCH_HOME/hub/checkpoints, "
            "HF_HUB_OFFLINE=1 with a local model), or build the model without pretrained "
            "weights: the memory is the same")


def record_unreachable(session: CaptureSession, host: Any) -> None:
    name = host.decode(errors="replace") if isinstance(host, bytes) else str(host)
    if name.lower() in LOCAL_HOSTS:
        return
    note = unreachable_note(name)
    if note not in session.notes:
        session.notes.append(note)
    if not any(hint.startswith("it could not reach ") for hint in session.failure_hints):
        session.failure_hints.append(unreachable_hint(name))


UNRELATED_ERRORS: tuple[type[BaseException], ...] = (
    TypeError, AttributeError, NameError, NotImplementedError, IndexError, ZeroDivisionError,
    SyntaxError, RecursionError,
)
"""Errors of the job's own code or of an op, never of a download that did not happen (an
unreachable host gives OSError / ConnectionError / URLError / HTTP errors, a missing dataset
RuntimeError / FileNotFoundError / ValueError)."""


def relevant_hints(hints: list[str], error: BaseException | None) -> list[str]:
    """The failure hints that belong in the error of a job that raised `error`: all of them,
    but the unreachable-host one when `error` is one of UNRELATED_ERRORS."""
    if not isinstance(error, UNRELATED_ERRORS):
        return list(hints)
    return [hint for hint in hints if not hint.startswith("it could not reach ")]


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return real_getaddrinfo(host, *args, **kwargs)
        except socket.gaierror:
            if not from_telemetry():
                record_unreachable(session, host)
            raise

    return {(socket, "getaddrinfo"): getaddrinfo}
