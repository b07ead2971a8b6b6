"""The warm job process's server: a unix socket in a per-user runtime directory.

- The directory (``$PEAKMEM_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/peakmem``, else
  ``/tmp/peakmem-UID``) is created mode 0700 and refused unless it is a real directory owned by
  this user and closed to group and others; the socket is private to the user too, and every
  connection's peer must be this user (``SO_PEERCRED``).
- One socket per python / peakmem source (:func:`socket_path`): interpreters do not share one.
- Messages are JSON lines (never pickles). A ``run`` request carries the cold child's command
  line, working directory, environment, umask and the requester's identity, and one file
  descriptor (``SCM_RIGHTS``) for the job's stdout and stderr. The server answers
  ``{"pid": N}`` (or ``{"error": ...}``), then ``{"exit": code}`` when the child has ended
  (``Popen.returncode``'s convention: -N for signal N). A requester that disconnects early has its
  child's group killed. ``status`` and ``stop`` answer one line.
- The server exits after ``idle_seconds`` without a request and with no child running.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peakmem.jobs.zygote_leftovers import Leftovers, become_subreaper

MAX_MESSAGE_BYTES = 1 << 20
DEFAULT_IDLE_SECONDS = 1800.0


class RuntimeDirError(OSError):
    """The runtime directory exists but is not private to this user."""


def runtime_dir() -> Path:
    """The private per-user directory of warm processes (created 0700 when missing)."""
    explicit = os.environ.get("PEAKMEM_RUNTIME_DIR")
    if explicit:
        base = Path(explicit)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        base = Path(os.environ["XDG_RUNTIME_DIR"]) / "peakmem"
    else:
        base = Path("/tmp") / f"peakmem-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RuntimeDirError(f"{base} is not a directory owned by this user")
    if info.st_mode & 0o077:
        raise RuntimeDirError(f"{base} is open to other users (mode {info.st_mode & 0o777:o})")
    return base


def server_key(python: str | None = None, source: str | None = None) -> str:
    from peakmem.jobs.zygote import SOURCE_DIR

    text = f"{python or sys.executable}\0{source or SOURCE_DIR}"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def socket_path(directory: Path | None = None) -> Path:
    """This python's and this peakmem source's socket."""
    return (directory or runtime_dir()) / f"warm-{server_key()}.sock"


# -- messages -----------------------------------------------------------------------------------


def send_message(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        sent = socket.send_fds(sock, [data], list(fds))
        data = data[sent:]
    if data:
        sock.sendall(data)


class LineReader:
    """JSON lines (and received file descriptors) from one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.fds: list[int] = []
        self.closed = False

    def feed(self) -> None:
        """One read (blocking unless the socket is non-blocking); EOF sets `closed`."""
        data, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, 4)
        self.fds.extend(fds)
        if not data:
            self.closed = True
        self.buffer += data
        if len(self.buffer) > MAX_MESSAGE_BYTES:
            raise ValueError("message too long")

    def next_message(self) -> dict[str, Any] | None:
        line, newline, rest = self.buffer.partition(b"\n")
        if not newline:
            return None
        self.buffer = rest
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("a message must be a JSON object")
        return message

    def read_message(self) -> dict[str, Any] | None:
        """The next message, reading as needed; None at EOF."""
        while True:
            message = self.next_message()
            if message is not None or self.closed:
                return message
            self.feed()


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end (Linux SO_PEERCRED); None where unknown."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    return struct.unpack("3i", raw)[2]


# -- server -------------------------------------------------------------------------------------


@dataclass
class _Connection:
    sock: socket.socket
    reader: LineReader
    child: int | None = None


@dataclass
class _State:
    identity: dict[str, Any]
    preload: list[str]
    preload_errors: list[str]
    idle_seconds: float | None
    nonce: str = ""
    started: float = field(default_factory=time.time)
    served: int = 0
    last_request: float = field(default_factory=time.monotonic)
    stopping: bool = False
    children: dict[int, _Connection] = field(default_factory=dict)
    leftovers: Leftovers = field(default_factory=Leftovers)
    """The jobs' descendants outside their groups, ended with their job."""

    def status(self, path: Path) -> dict[str, Any]:
        return {
            "running": True, "pid": os.getpid(), "socket": str(path),
            "python": self.identity["python"], "peakmem": self.identity["peakmem"],
            "source": self.identity["source"], "preload": self.preload,
            "preload_errors": self.preload_errors, "idle_seconds": self.idle_seconds,
            "started": self.started, "served": self.served, "running_jobs": len(self.children),
            "nonce": self.nonce,
        }


def serve(listener: socket.socket, socket_path: Path, identity: dict[str, Any], preload: list[str],
          preload_errors: list[str], idle_seconds: float | None = DEFAULT_IDLE_SECONDS,
          nonce: str = "", env_changes: dict[str, str | None] | None = None) -> None:
    """Serve on `listener` (bound to `socket_path` by :func:`listen`) until stopped, idle, or
    the socket file is taken over by another server. `env_changes`: what the warm-up's imports
    did to the environment, made to each job's too (zygote.environment_changes)."""
    from peakmem.jobs.zygote import identity_difference, unfit_preloads

    state = _State(identity, preload, preload_errors, idle_seconds or None, nonce)
    become_subreaper()  # a job's orphans come here, not to init: ended with their job
    inode = os.stat(socket_path).st_ino
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: setattr(state, "stopping", True))
    # taken synchronously after each select (sigtimedwait names the sender): a job's own
    # os.kill(os.getppid(), SIGTERM) must not stop the warm process; the forked job unblocks
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listen")
    selector.register(wake_read, selectors.EVENT_READ, "wake")
    connections: dict[int, _Connection] = {}

    def close(conn: _Connection) -> None:
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn.sock)
        connections.pop(conn.sock.fileno(), None)
        for fd in conn.reader.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.reader.fds.clear()
        conn.sock.close()
        if conn.child is not None and conn.child in state.children:  # the requester left
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(conn.child, signal.SIGKILL)

    def handle(conn: _Connection, message: dict[str, Any]) -> None:
        state.last_request = time.monotonic()
        op = message.get("op")
        if op == "status":
            send_message(conn.sock, state.status(socket_path))
        elif op == "stop":
            state.stopping = True
            send_message(conn.sock, {"stopping": True})
        elif op == "run":
            difference = identity_difference(state.identity, message.get("identity") or {})
            unfit = unfit_preloads(state.preload, message.get("job_imports") or [])
            if difference is None and unfit:
                difference = f"it preloaded {', '.join(unfit)}, which the job does not import"
            if difference is not None or len(conn.reader.fds) != 1 or conn.child is not None:
                send_message(conn.sock, {"error": difference or "one output descriptor expected"})
                return
            output_fd = conn.reader.fds.pop()
            open_fds = [listener.fileno(), wake_read, wake_write, selector.fileno(),
                        *(c.sock.fileno() for c in connections.values())]
            try:
                pid = _fork(message, output_fd, open_fds, env_changes)
            except (ValueError, TypeError, KeyError, OSError) as exc:
                send_message(conn.sock, {"error": f"{type(exc).__name__}: {exc}"})
                return
            finally:
                os.close(output_fd)
            conn.child = pid
            state.children[pid] = conn
            state.served += 1
            send_message(conn.sock, {"pid": pid})
        else:
            send_message(conn.sock, {"error": f"unknown request {op!r}"})

    try:
        while not (state.stopping and not state.children):
            for key, _events in selector.select(timeout=1.0):
                if key.data == "listen":
                    _accept(listener, selector, connections)
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        while os.read(wake_read, 512):
                            pass
                else:
                    conn = key.data
                    try:
                        conn.reader.feed()
                        while (message := conn.reader.next_message()) is not None:
                            handle(conn, message)
                    except (OSError, ValueError):
                        conn.reader.closed = True
                    if conn.reader.closed:
                        close(conn)
            _take_stop_signals(state)
            _reap(state, close)
            state.leftovers.track(state.children.keys())
            if _socket_gone(socket_path, inode):
                state.stopping = True
            idle = time.monotonic() - state.last_request
            if (state.idle_seconds is not None and not state.children and not connections
                    and idle > state.idle_seconds):
                state.stopping = True
    finally:
        if not _socket_gone(socket_path, inode):
            with contextlib.suppress(OSError):
                os.unlink(socket_path)
        listener.close()


def listen(path: Path) -> socket.socket:
    """Bind the socket, replacing a stale one (nobody answering on it)."""
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            os.unlink(path)
        else:
            raise RuntimeError(f"a warm process already serves {path}")
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    listener.listen(16)
    listener.setblocking(False)
    return listener


def _accept(listener: socket.socket, selector: selectors.BaseSelector,
            connections: dict[int, _Connection]) -> None:
    try:
        sock, _ = listener.accept()
    except BlockingIOError:
        return
    if peer_uid(sock) not in (None, os.getuid()):
        sock.close()
        return
    sock.setblocking(False)
    conn = _Connection(sock, LineReader(sock))
    connections[sock.fileno()] = conn
    selector.register(sock, selectors.EVENT_READ, conn)


def _fork(message: dict[str, Any], output_fd: int, open_fds: list[int],
          env_changes: dict[str, str | None] | None = None) -> int:
    from peakmem.jobs.zygote import fork_job

    env = message["env"]
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the environment must map strings to strings")
    return fork_job(
        [str(word) for word in message["argv"]], str(message["cwd"]), env,
        int(message["umask"]) & 0o777, output_fd, open_fds, env_changes,
    )


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
"""Signals that stop the warm process, unless one of its jobs sent them."""


def _take_stop_signals(state: _State) -> None:
    """Pending stop signals: a job's (its process, group or session) is dropped; anyone else's
    stops the server (SIGINT at once, as Ctrl-C did; SIGTERM / SIGHUP after its running jobs)."""
    while (info := signal.sigtimedwait(STOP_SIGNALS, 0)) is not None:
        if _sent_by_a_job(info.si_pid, state):
            continue
        if info.si_signo == signal.SIGINT:
            raise KeyboardInterrupt
        state.stopping = True


def _sent_by_a_job(pid: int, state: _State) -> bool:
    if pid <= 0 or pid == os.getpid():
        return False
    if pid in state.children:
        return True
    try:
        return os.getpgid(pid) in state.children or os.getsid(pid) in state.children
    except OSError:  # gone already: not known as a job's
        return False


def _reap(state: _State, close: Any) -> None:
    """Collect ended children (and orphans of jobs reparented here), kill what they left in
    their group and outside it, tell their requesters."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            state.children.clear()
            return
        if pid == 0:
            return
        conn = state.children.pop(pid, None)
        if conn is None:  # an orphan of a job, reparented here (a subreaper)
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        state.leftovers.end(pid, state.children.keys())
        if conn is not None:
            conn.child = None
            try:
                send_message(conn.sock, {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:
                close(conn)


def _socket_gone(path: Path, inode: int) -> bool:
    try:
        return os.stat(path).st_ino != inode
    except OSError:
        return True
