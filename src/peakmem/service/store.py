"""Final results on disk (`peakmem serve --store DIR`), shared by the server processes of one
machine (`--processes N`): a job one process ran is answered by whichever process receives the
next request for it.

`DIR/<id>.json` holds a final record (what `GET /v1/estimates/{id}` shows, and whether the failure
is retryable), written whole and renamed into place. `DIR/<id>.claim` marks a job a process has
queued (`{"pid", "started", "owner", "status", "since"}`), created exclusively so that one process runs each job:
another process that receives the same job joins it, and reads its status and final record from
here. A claim whose process is gone, or that has been running longer than `stale_seconds`, is
taken over. Process ids are this machine's: the processes sharing a store run on one machine.
A claim also holds its process's start time (`started`, clock ticks since boot, from /proc), so a
process id that was reused (a restarted container numbers its processes from 1 again while an
emptyDir store keeps the old claims) does not keep a dead process's claim alive.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peakmem.jobs.proc_stat import stat_fields

_KEY = re.compile(r"^[0-9a-f]{64}$")
FINAL = ("done", "failed")


@dataclass(frozen=True)
class Claim:
    pid: int
    """The claiming process (a claim whose process is gone is stale)."""
    owner: str
    """The claiming store (one per server process): whose claim it is."""
    status: str
    since: float
    started: int | None = None
    """The claiming process's start time (clock ticks since boot), where /proc gives it: a live
    process with the same id but another start time is a reused id, not the claimant."""


class ResultStore:
    def __init__(self, root: str | os.PathLike, stale_seconds: float = 3600.0) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.stale_seconds = stale_seconds
        self.owner = uuid.uuid4().hex

    def _path(self, key: str, suffix: str) -> Path:
        if not _KEY.match(key):
            raise ValueError(f"not a job id: {key!r}")
        return self.root / f"{key}{suffix}"

    def load(self, key: str) -> dict[str, Any] | None:
        """The final record saved for `key` (`{"view": {...}, "retryable": bool}`), or None
        (none, or unreadable: a record that cannot be read is as good as none)."""
        try:
            saved = json.loads(self._path(key, ".json").read_bytes())
        except (OSError, ValueError):
            return None
        view = saved.get("view") if isinstance(saved, dict) else None
        if not isinstance(view, dict) or view.get("status") not in FINAL or view.get("id") != key:
            return None
        return {"view": view, "retryable": bool(saved.get("retryable"))}

    def save(self, key: str, view: dict[str, Any], retryable: bool) -> None:
        """Save a final record (atomically: readers see the old file or the whole new one)."""
        self._write(self._path(key, ".json"), {"view": view, "retryable": retryable})

    def claim(self, key: str) -> bool:
        """Claim `key` for this process (True), or False where a live claim of another process
        holds it. A stale claim (its process gone, or older than `stale_seconds`) is replaced."""
        path = self._path(key, ".claim")
        for _ in range(2):
            try:
                self._create(path, self._claim_body("queued"))
            except FileExistsError:
                with self._locked():  # two processes replacing one stale claim: one wins
                    held = self.claimant(key)
                    if held is not None and not self.mine(held):
                        return False
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                continue
            return True
        return False

    def mark(self, key: str, status: str) -> None:
        """Record this process's claim's status (queued -> running)."""
        self._write(self._path(key, ".claim"), self._claim_body(status))

    def claimant(self, key: str) -> Claim | None:
        """The live claim on `key`, or None (none, stale, or unreadable)."""
        claim = self.read_claim(key)
        return claim if claim is not None and self.live(claim) else None

    def read_claim(self, key: str) -> Claim | None:
        """The claim on `key`, live or stale, or None (none, or unreadable)."""
        try:
            body = json.loads(self._path(key, ".claim").read_bytes())
            started = body.get("started")
            return Claim(int(body["pid"]), str(body["owner"]), str(body["status"]),
                         float(body["since"]), int(started) if started is not None else None)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def live(self, claim: Claim) -> bool:
        """Whether its process is alive and, if running, not for longer than `stale_seconds`."""
        too_long = claim.status == "running" and time.time() - claim.since > self.stale_seconds
        return not too_long and _alive(claim.pid, claim.started)

    def mine(self, claim: Claim) -> bool:
        return claim.owner == self.owner

    def release(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key, ".claim").unlink()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a") as handle:  # noqa: SIM117 - flock needs the handle
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _claim_body(self, status: str) -> dict[str, Any]:
        pid = os.getpid()
        return {"pid": pid, "started": process_start_time(pid), "owner": self.owner,
                "status": status, "since": time.time()}

    def _write(self, path: Path, body: dict[str, Any]) -> None:
        """`path` holds `body`, replaced whole (readers never see a part of it)."""
        tmp = self._staged(body)
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _create(self, path: Path, body: dict[str, Any]) -> None:
        """`path` created holding `body`, whole, or FileExistsError where it exists (a hard
        link is both exclusive and atomic: no reader sees an empty claim)."""
        tmp = self._staged(body)
        try:
            os.link(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _staged(self, body: dict[str, Any]) -> str:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(body, handle, separators=(",", ":"))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return tmp


def process_start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat, field 22), or None
    where /proc does not say (not Linux, no such process)."""
    fields = stat_fields(pid)
    try:
        return None if fields is None else int(fields[22 - 3])
    except (ValueError, IndexError):
        return None


def _alive(pid: int, started: int | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if started is None:
        return True
    now = process_start_time(pid)
    return now is None or now == started  # another start time: the id was reused
