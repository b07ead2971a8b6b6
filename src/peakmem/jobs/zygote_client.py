"""The requester's side of the warm job process: start, stop and ask it, and start a job's child
through it (:class:`WarmStarter`, a ``starter`` for :func:`peakmem.jobs.supervisor.run_child`).

A child started warm is supervised exactly as a cold one (same pid-based group kill, memory
watch and result file): :class:`WarmProcess` offers the ``pid`` / ``poll`` / ``wait`` of a
``subprocess.Popen``. When no warm process is running for this python and peakmem source, or the
one running cannot serve this request (another start-up environment, peakmem edited since, a
broken socket), the child is started cold and :attr:`WarmStarter.note` says why.

``PEAKMEM_WARM=0`` turns the warm path off for a process.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from peakmem.jobs.supervisor import ChildSpec, ProcessHandle, popen_child
from peakmem.jobs.zygote_server import (
    DEFAULT_IDLE_SECONDS,
    LineReader,
    RuntimeDirError,
    runtime_dir,
    send_message,
    socket_path,
)

CONNECT_TIMEOUT_SECONDS = 5.0
START_TIMEOUT_SECONDS = 120.0

WARM_NOTE = "the job ran in a child of the warm job process (peakmem warm)"


def warm_enabled() -> bool:
    return os.environ.get("PEAKMEM_WARM", "1").strip().lower() not in ("0", "false", "no", "off")


def find_socket() -> Path | None:
    """This python's warm socket when one exists (None: no warm process, or warm turned off)."""
    if not warm_enabled():
        return None
    try:
        path = socket_path()
    except (RuntimeDirError, OSError):
        return None
    return path if path.exists() else None


def _connect(path: Path, timeout: float = CONNECT_TIMEOUT_SECONDS) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


def request(message: dict[str, Any], path: Path | None = None) -> dict[str, Any] | None:
    """One request, one answer; None when no warm process answers."""
    path = path or find_socket()
    if path is None:
        return None
    try:
        with _connect(path) as sock:
            send_message(sock, message)
            return LineReader(sock).read_message()
    except (OSError, ValueError):
        return None


def status() -> dict[str, Any] | None:
    """The warm process's status (pid, preloads, served requests, ...); None when none runs."""
    return request({"op": "status"})


def stop(wait_seconds: float = 10.0) -> bool:
    """Ask the warm process to exit (after its running jobs); True when one was running."""
    path = find_socket()
    answer = request({"op": "stop"}, path)
    if answer is None:
        return False
    deadline = time.monotonic() + wait_seconds
    while path is not None and path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def start(preload: Sequence[str] = (), idle_seconds: float | None = DEFAULT_IDLE_SECONDS,
          log: Path | None = None, timeout: float = START_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Start a warm process in its own session and wait until it answers; its status.
    RuntimeError (with the end of its log) when it does not come up."""
    from peakmem.jobs.zygote import SOURCE_DIR, ZYGOTE_BOOT

    directory = runtime_dir()
    path = socket_path(directory)
    log = log or path.with_suffix(".log")
    nonce = os.urandom(8).hex()
    config = {"socket": str(path), "preload": list(preload), "idle": idle_seconds,
              "nonce": nonce}
    fd, config_path = tempfile.mkstemp(prefix="warm-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        env = {k: v for k, v in os.environ.items() if k != "PEAKMEM_WARM"}
        process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE_BOOT.format(src=SOURCE_DIR), config_path],
            stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, cwd="/", env=env,
            start_new_session=True, close_fds=True,
        )
    finally:
        os.close(log_fd)
    code = process.wait(timeout)  # it binds the socket, forks the warm process off and exits
    deadline = time.monotonic() + timeout
    while code == 0 and path.exists() and time.monotonic() < deadline:
        answer = request({"op": "status"}, path)  # answered once its imports are done
        if answer is not None and answer.get("nonce") == nonce:
            return answer
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.unlink(config_path)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"the warm process did not start (status {code}):\n{tail}")


def current_umask() -> int:
    """This process's umask, read without setting it (/proc; other threads may create files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


class WarmProcess:
    """A child forked by the warm process, as ``subprocess.Popen`` offers it: pid, poll, wait."""

    def __init__(self, sock: socket.socket, reader: LineReader, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._sock, self._reader = sock, reader

    def _take(self, message: dict[str, Any] | None) -> None:
        if message is None:  # the warm process went away: the child was killed with it
            self.returncode = -9
        else:
            self.returncode = int(message.get("exit", -9))
        self._sock.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._sock.setblocking(False)
            try:
                self._reader.feed()
            except (BlockingIOError, InterruptedError):
                pass
            except (OSError, ValueError):
                self._reader.closed = True
            message = self._reader.next_message()
            if message is not None or self._reader.closed:
                self._take(message)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self._sock.setblocking(True)
            try:
                self._take(self._reader.read_message())
            except (OSError, ValueError):
                self._take(None)
        return self.returncode if self.returncode is not None else -9


class WarmStarter:
    """Starts the job's child through the warm process at `path`, or cold when it cannot."""

    def __init__(self, path: Path, job_argv: Sequence[str] = ()) -> None:
        self.path = path
        self.job_argv = list(job_argv)
        self.note: str | None = None
        self.warm = False

    def __call__(self, spec: ChildSpec, output_fd: int) -> ProcessHandle:
        env = dict(os.environ) if spec.env is None else dict(spec.env)
        try:
            return self._warm(spec, output_fd, env)
        except (OSError, ValueError, RuntimeError) as exc:
            reason = str(exc) or type(exc).__name__
            self.note = f"the warm job process could not run the job ({reason}): started cold"
        return popen_child(spec.argv, output_fd, cwd=spec.cwd, env=spec.env)

    def _warm(self, spec: ChildSpec, output_fd: int, env: dict[str, str]) -> WarmProcess:
        from peakmem.jobs.zygote import identity, job_imports

        umask = current_umask()
        message = {
            "op": "run", "argv": list(spec.argv), "cwd": spec.cwd or os.getcwd(), "env": env,
            "umask": umask, "identity": identity(env), "job_imports": job_imports(self.job_argv),
        }
        sock = _connect(self.path)
        try:
            send_message(sock, message, [output_fd])
            reader = LineReader(sock)
            answer = reader.read_message()
        except BaseException:
            sock.close()
            raise
        if answer is None or "pid" not in answer:
            sock.close()
            raise RuntimeError((answer or {}).get("error") or "no answer")
        self.warm, self.note = True, WARM_NOTE
        return WarmProcess(sock, reader, int(answer["pid"]))


def warm_starter(job_argv: Sequence[str] = ()) -> WarmStarter | None:
    """A starter when a warm process may serve this python (None: start cold, nothing to say).
    `job_argv`: the job's `python script.py ...` (its imports decide whether the warm process's
    preloaded modules fit it)."""
    path = find_socket()
    return None if path is None else WarmStarter(path, job_argv)
