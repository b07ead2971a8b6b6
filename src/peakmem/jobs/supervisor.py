"""Run jobs in child processes and supervise them from peakmem's process (the parent side).

Each child starts in its own session (so its own process group): a wall-clock timeout or a host
memory cap ends the WHOLE group (SIGTERM, then SIGKILL after a short grace), whatever the job does
with signals. Memory is watched from here: the resident set of the child's group and of its
descendants is summed from ``/proc`` every ``POLL_SECONDS`` (``RLIMIT_AS`` breaks torch, which
reserves address space it never touches). The child's stdin is ``/dev/null``; its stdout and
stderr (file descriptors 1 and 2, so C-level writes and subprocesses too) go to a file
descriptor given here, or are copied into ``sys.stderr`` of this process.

What a child reports comes back through a file it writes (``ChildSpec.result_path``): read it
with :func:`read_result_file`, which refuses links, non-regular files and anything over a size cap
(the child runs untrusted code: parse what you read, never execute it).

``run_children`` supervises N children at once (one per rank of a multi-process launch); a
single job is ``run_children([spec])[0]``.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from peakmem.jobs.proc_stat import stat_fields

POLL_SECONDS = 0.05
MEMORY_POLL_SECONDS = 0.1
FAR_MEMORY_POLL_SECONDS = 0.5
"""The memory poll's interval while every child holds less than half its cap (a /proc scan
costs ~2 ms of CPU with 100 processes; the default cap made every estimate pay it 10 times a
second)."""
KILL_GRACE_SECONDS = 1.0
RESULT_SIZE_CAP = 1 << 30  # bytes of a child's result file


class OutcomeStatus:
    EXITED = "exited"  # the child process ended by itself with an exit status
    SIGNALED = "signaled"  # killed by a signal it did not get from us (segfault, kill -9, ...)
    TIMEOUT = "timeout"  # ran past the wall-clock limit; we ended its group
    HOST_MEMORY = "host_memory"  # went over the host memory cap; we ended its group
    CANCELLED = "cancelled"  # ended by us because another child of the launch failed


@dataclass(frozen=True)
class ChildSpec:
    """One child: its command line, where it runs, and where it writes its result."""

    argv: Sequence[str]
    result_path: Path
    cwd: str | None = None
    env: dict[str, str] | None = None
    output_fd: int | None = None
    """Where the child's stdout and stderr go (a file descriptor, e.g. an open --job-log);
    None: copied into this process's ``sys.stderr``."""


@dataclass
class ChildOutcome:
    """How one child ended, as seen from outside it."""

    status: str
    returncode: int | None
    """The exit status (EXITED), else None."""
    signal: str | None = None
    """The signal's name when the child was killed by one (``SIGSEGV``), else None."""
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    """The largest summed resident set of the child's processes seen while polling."""
    pid: int = 0
    result_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == OutcomeStatus.EXITED and self.returncode == 0


@dataclass(frozen=True)
class Limits:
    """Limits applied to every child of a launch."""

    timeout: float | None = None
    """Wall-clock seconds from the launch; None: no limit."""
    max_host_memory: int | None = None
    """Bytes of resident memory of one child's processes together; None: no cap."""

    def __post_init__(self) -> None:
        if self.timeout is not None and not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"the timeout must be a finite positive number, got {self.timeout}")
        if self.max_host_memory is not None and self.max_host_memory <= 0:
            raise ValueError(f"the memory cap must be positive, got {self.max_host_memory}")


# -- /proc ------------------------------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process visible in /proc."""
    table: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        fields = stat_fields(name)
        if fields is not None and len(fields) >= 3:
            table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def _subreaper(on: bool) -> None:
    """Make this process the reaper of its descendants' orphans (Linux) while children run: a
    job's grandchild that left the job's group (its own session) and whose parent ended is
    reparented here rather than to init, so that it can still be found and ended with the job.
    Counted, so that concurrent supervisions share it; off again when the last one ends."""
    global _subreaper_users
    if not sys.platform.startswith("linux"):
        return
    with _CHILDREN_LOCK:
        _subreaper_users += 1 if on else -1
        if _subreaper_users != int(on):  # only the first start and the last end switch it
            return
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(36, 1 if _subreaper_users else 0, 0, 0, 0)  # PR_SET_CHILD_subreaper_users
        except (OSError, AttributeError):
            pass


def _dumpable(on: bool) -> None:
    """Make this process non-dumpable while children run (Linux PR_SET_DUMPABLE): a job of the
    same (non-root) user then cannot open /proc/PEAKMEM/fd/1 and write a forged estimate into
    peakmem's stdout, nor read its memory. Counted as the subreaper is; back on afterwards."""
    global _dumpable_users, _dumpable_before
    if not sys.platform.startswith("linux"):
        return
    with _CHILDREN_LOCK:
        _dumpable_users += -1 if on else 1
        if _dumpable_users != int(not on):  # only the first start and the last end switch it
            return
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if not on:
                _dumpable_before = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
            if _dumpable_before == 1:  # as it was: an already non-dumpable process stays so
                libc.prctl(4, 1 if on else 0, 0, 0, 0)  # PR_SET_DUMPABLE
        except (OSError, AttributeError):
            pass


_dumpable_before = 1
_dumpable_users = 0  # supervisions running with this process made non-dumpable
_subreaper_users = 0  # supervisions running
_LIVE_CHILDREN: set[int] = set()  # pids of the children started here and not yet reaped
_CHILDREN_LOCK = threading.RLock()  # a child is in _LIVE_CHILDREN before anyone looks for orphans


def group_members(leader: int, table: dict[int, tuple[int, int]] | None = None) -> set[int]:
    """Processes of the child's group plus every descendant of the child (a grandchild that
    made its own session is still found while its parent lives), and the orphans of jobs that
    were reparented to this process (subreaper): those outside this process's own group."""
    table = _proc_table() if table is None else table
    members = {pid for pid, (_ppid, pgid) in table.items() if pgid == leader}
    if leader in table:
        members.add(leader)
    me, my_group = os.getpid(), os.getpgrp()
    members |= {
        pid
        for pid, (ppid, pgid) in table.items()
        if ppid == me and pgid != my_group and pid not in _LIVE_CHILDREN
    }
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgid) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = list(members)
    while stack:
        for kid in children.get(stack.pop(), ()):
            if kid not in members:
                members.add(kid)
                stack.append(kid)
    return members


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def group_rss(leader: int) -> int:
    """Summed resident set of the child's processes (shared pages counted once per process)."""
    return sum(_rss_bytes(pid) for pid in group_members(leader))


def kill_group(leader: int, grace: float = KILL_GRACE_SECONDS, wait: ProcessHandle | None = None,
               ) -> None:
    """SIGTERM the child's group and descendants, then SIGKILL whatever is left after `grace`."""
    _signal_all(leader, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if wait is not None and wait.poll() is None:
            time.sleep(POLL_SECONDS)
            continue
        if not group_members(leader) - {leader}:
            break
        time.sleep(POLL_SECONDS)
    _signal_all(leader, signal.SIGKILL)


def _signal_all(leader: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)
    with _CHILDREN_LOCK:
        for pid in group_members(leader):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


# -- output -----------------------------------------------------------------------------------


def _stderr_fd() -> int | None:
    """This process's stderr as a file descriptor the child can write to, when it has one."""
    try:
        sys.stderr.flush()
        fd = sys.stderr.fileno()
        os.fstat(fd)
        return fd
    except (AttributeError, OSError, ValueError):
        return None


class _Forwarder(threading.Thread):
    """Copies a child's output pipe into a text stream (sys.stderr without a file descriptor)."""

    def __init__(self, read_fd: int, sink: IO[str]) -> None:
        super().__init__(daemon=True)
        self._fd, self._sink = read_fd, sink

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with contextlib.suppress(Exception):
                self._sink.write(chunk.decode("utf-8", "replace"))
        with contextlib.suppress(OSError):
            os.close(self._fd)


# -- running ----------------------------------------------------------------------------------


@dataclass
class _Running:
    spec: ChildSpec
    process: ProcessHandle
    started: float
    forwarder: _Forwarder | None = None
    outcome: ChildOutcome | None = None
    peak_rss: int = 0
    notes: list[str] = field(default_factory=list)
    stopped_since: float | None = None
    """When the child's process was first seen stopped (None: it runs)."""


STOPPED_SECONDS = 3.0
"""How long the job's process may stay stopped (SIGSTOP, SIGTSTP...) before peakmem ends it."""


def _left_stopped(run: _Running, now: float) -> bool:
    """Whether the child's process has been stopped (state T, not a debugger's t) for
    STOPPED_SECONDS: a job that stops itself (`os.kill(os.getpid(), SIGSTOP)`) waits for a
    SIGCONT nobody sends; without --timeout peakmem waited for ever. It runs in its own
    session, so a terminal's Ctrl-Z does not stop it."""
    fields = stat_fields(run.process.pid)
    if not fields or fields[0] != b"T":
        run.stopped_since = None
        return False
    if run.stopped_since is None:
        run.stopped_since = now
    return now - run.stopped_since >= STOPPED_SECONDS


class SandboxLike(Protocol):
    """What ``peakmem.jobs.sandbox.Sandbox`` offers a launcher (duck-typed here)."""

    def wrap(self, argv: Sequence[str], scratch: Path, env: Mapping[str, str] | None = None
             ) -> list[str]: ...

    def environment(self, scratch: Path, env: Mapping[str, str] | None = None
                    ) -> dict[str, str]: ...

    def preexec_fn(self) -> None: ...


Sandboxing = Sequence[str] | SandboxLike | None
"""A command prefix for each child, or a sandbox object (its `wrap`, `environment`,
`preexec_fn`; the scratch directory is the one holding the child's result file)."""


def _launch(spec: ChildSpec, sandbox: Sandboxing) -> tuple[list[str], dict[str, str] | None, Any]:
    """The child's command line, environment and preexec function under `sandbox`."""
    if sandbox is None:
        return list(spec.argv), spec.env, None
    if hasattr(sandbox, "wrap"):
        scratch = spec.result_path.parent
        return (sandbox.wrap(spec.argv, scratch, spec.env),
                sandbox.environment(scratch, spec.env), sandbox.preexec_fn)
    return [*sandbox, *spec.argv], spec.env, None


class ProcessHandle(Protocol):
    """What the supervisor needs of a started child: ``subprocess.Popen``'s pid, poll and wait
    (a warm job process's child, :mod:`peakmem.jobs.zygote_client`, offers the same)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


class Starter(Protocol):
    """Starts one child: the spec, and the file descriptor for its stdout and stderr."""

    def __call__(self, spec: ChildSpec, output_fd: int) -> ProcessHandle: ...


def _dies_with_this_process() -> Callable[[], None] | None:
    """A preexec function that has the kernel SIGKILL the child when the thread that started
    it ends (Linux PR_SET_PDEATHSIG; None elsewhere). A job that SIGKILLs peakmem
    (`os.kill(os.getppid(), SIGKILL)`, which nothing can catch) lived on, an orphan nobody
    supervised any more; `run_children` starts and supervises its children in one thread."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent ended before the line above took effect
            os._exit(128 + signal.SIGKILL)

    return arm


def _chained(*functions: Callable[[], None] | None) -> Callable[[], None] | None:
    """One preexec function that calls each of `functions` (None ones left out) in order."""
    present = [function for function in functions if function is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def run_all() -> None:
        for function in present:
            function()

    return run_all


def popen_child(argv: Sequence[str], output_fd: int, *, cwd: str | None = None,
                env: Mapping[str, str] | None = None, preexec: Any = None) -> subprocess.Popen:
    """A cold child: a fresh interpreter in its own session, stdin /dev/null, stdout and stderr
    to `output_fd`, killed by the kernel if this process dies before it (Linux)."""
    preexec = _chained(_dies_with_this_process(), preexec)
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=output_fd,
        stderr=output_fd,
        cwd=cwd,
        env=None if env is None else dict(env),
        preexec_fn=preexec,
        start_new_session=True,
        close_fds=True,
    )


def _start(spec: ChildSpec, sandbox: Sandboxing, starter: Starter | None = None) -> _Running:
    out_fd, forwarder, write_end = spec.output_fd, None, None
    if out_fd is None:
        out_fd = _stderr_fd()
    if out_fd is None:
        read_end, write_end = os.pipe()
        forwarder = _Forwarder(read_end, sys.stderr)
        out_fd = write_end
    try:
        _CHILDREN_LOCK.acquire()
        if starter is not None:
            process = starter(spec, out_fd)
        else:
            argv, env, preexec = _launch(spec, sandbox)
            process = popen_child(argv, out_fd, cwd=spec.cwd, env=env, preexec=preexec)
        _LIVE_CHILDREN.add(process.pid)
    finally:
        _CHILDREN_LOCK.release()
        if write_end is not None:
            os.close(write_end)
    if forwarder is not None:
        forwarder.start()
    return _Running(spec, process, time.monotonic(), forwarder)


def _finish(run: _Running, status: str, note: str | None = None) -> None:
    """End the child's whole group (also when it exited: what it left behind) and record how it
    ended."""
    _LIVE_CHILDREN.discard(run.process.pid)
    kill_group(run.process.pid, grace=0.0 if status == OutcomeStatus.EXITED else KILL_GRACE_SECONDS,
               wait=run.process)
    code = run.process.wait()
    _reap_orphans()
    if run.forwarder is not None:
        run.forwarder.join(timeout=2.0)
    outcome = ChildOutcome(
        status=status,
        returncode=None,
        seconds=time.monotonic() - run.started,
        peak_rss_bytes=run.peak_rss,
        pid=run.process.pid,
        result_path=run.spec.result_path,
    )
    if status == OutcomeStatus.EXITED:
        if code < 0:
            outcome.status = OutcomeStatus.SIGNALED
            outcome.signal = _signal_name(-code)
        else:
            outcome.returncode = code
    if note:
        outcome.notes.append(note)
    outcome.notes += run.notes
    run.outcome = outcome


def _reap_orphans() -> None:
    """Collect the exit status of orphans reparented here (they were just killed)."""
    me, my_group = os.getpid(), os.getpgrp()
    for _ in range(20):
        with _CHILDREN_LOCK:
            orphans = [
                pid
                for pid, (ppid, pgid) in _proc_table().items()
                if ppid == me and pgid != my_group and pid not in _LIVE_CHILDREN
            ]
        reaped = 0
        for pid in orphans:
            try:
                reaped += os.waitpid(pid, os.WNOHANG)[0] == pid
            except (ChildProcessError, OSError):
                reaped += 1
        if reaped == len(orphans):
            return
        time.sleep(POLL_SECONDS)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def run_children(
    specs: Sequence[ChildSpec],
    limits: Limits | None = None,
    *,
    sandbox: Sandboxing = None,
    fail_fast: bool = True,
    starter: Starter | None = None,
) -> list[ChildOutcome]:
    """Start every child, supervise them until all have ended, and say how each ended.

    ``sandbox``: a command prefix for each child's command line, or a sandbox object
    (``peakmem.jobs.sandbox.Sandbox``: wrap/environment/preexec_fn). With
    ``fail_fast``, a child that ends badly (non-zero, signal, timeout, memory) ends the others
    (status CANCELLED): ranks of one launch wait for each other. Every child's process group is
    ended when the call returns, also when this process is interrupted. ``starter``: how each
    child is started (None: a fresh interpreter; a warm job process, jobs.zygote_client); a
    sandbox always starts fresh interpreters.
    """
    limits = limits or Limits()
    running: list[_Running] = []
    _subreaper(True)
    _dumpable(False)
    restore = _exit_on_termination()
    try:
        for spec in specs:
            running.append(_start(spec, sandbox, None if sandbox else starter))
        deadline = None if limits.timeout is None else time.monotonic() + limits.timeout
        next_memory_poll = 0.0
        while any(run.outcome is None for run in running):
            now = time.monotonic()
            check_memory = limits.max_host_memory is not None and now >= next_memory_poll
            all_far = True  # every child under half its cap: the next poll can wait longer
            for run in running:
                if run.outcome is not None:
                    continue
                if run.process.poll() is not None:
                    _finish(run, OutcomeStatus.EXITED)
                elif deadline is not None and now >= deadline:
                    _finish(run, OutcomeStatus.TIMEOUT,
                            f"ran past the time limit of {limits.timeout:g} s")
                elif _left_stopped(run, now):
                    _finish(run, OutcomeStatus.SIGNALED,
                            f"stopped for {STOPPED_SECONDS:g} s by a stop signal: ended")
                    if run.outcome is not None:
                        run.outcome.signal = "SIGSTOP"
                elif check_memory:
                    rss = group_rss(run.process.pid)
                    run.peak_rss = max(run.peak_rss, rss)
                    all_far = all_far and 2 * rss < limits.max_host_memory
                    if rss > limits.max_host_memory:
                        _finish(run, OutcomeStatus.HOST_MEMORY)
                if fail_fast and run.outcome is not None and not run.outcome.ok:
                    for other in running:
                        if other.outcome is None:
                            _finish(other, OutcomeStatus.CANCELLED)
            if check_memory:
                next_memory_poll = now + (FAR_MEMORY_POLL_SECONDS if all_far
                                          else MEMORY_POLL_SECONDS)
            _wait_ignoring_the_jobs_signals(POLL_SECONDS, running)
    finally:
        for run in running:
            if run.outcome is None:
                with contextlib.suppress(Exception):
                    _finish(run, OutcomeStatus.CANCELLED)
        restore()
        _dumpable(True)
        _subreaper(False)
    return [run.outcome for run in running if run.outcome is not None]


_WATCHED_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1,
                              signal.SIGUSR2})
"""Signals that end (or unwind) this process: one sent by a job to peakmem (`os.kill(
os.getppid(), SIGTERM)`) is ignored, one from anyone else ends the supervision as before."""


def _wait_ignoring_the_jobs_signals(seconds: float, running: Sequence[_Running]) -> None:
    """Sleep `seconds`; in the main thread, take the watched signals that arrive meanwhile
    synchronously (sigtimedwait tells who sent each). A job's own processes cannot stop peakmem
    this way: their signal is dropped with a note. Anyone else's unwinds this process as the
    handlers would (KeyboardInterrupt for SIGINT, else SystemExit(128 + signal)).
    Elsewhere (a worker thread, no sigtimedwait): a plain sleep."""
    if (threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "sigtimedwait")):
        time.sleep(seconds)
        return
    # blocked only while waiting: the children started outside this window inherit no mask
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED_SIGNALS)
    try:
        info = signal.sigtimedwait(_WATCHED_SIGNALS, seconds)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if info is None:
        return
    sender = _job_of(info.si_pid, running)
    if sender is not None:
        sender.notes.append(f"the job sent {_signal_name(info.si_signo)} to peakmem "
                            f"(process {info.si_pid}): ignored")
        return
    if info.si_signo == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + info.si_signo)


def _job_of(pid: int, running: Sequence[_Running]) -> _Running | None:
    """The run whose child, or a process of its group or descent, is `pid`."""
    if pid <= 0 or pid == os.getpid():
        return None
    for run in running:
        if pid == run.process.pid:
            return run
    table = _proc_table()
    for run in running:
        if run.outcome is None and pid in group_members(run.process.pid, table):
            return run
    return None


def _exit_on_termination() -> Callable[[], None]:
    """While children run, SIGTERM / SIGHUP to this process unwind it (SystemExit) so that the
    children's groups are ended too (Ctrl-C raises KeyboardInterrupt already). Returns the
    function that puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def _unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            previous[signum] = signal.signal(signum, _unwind)

    def restore() -> None:
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, handler)

    return restore


def run_child(spec: ChildSpec, limits: Limits | None = None, *,
              sandbox: Sandboxing = None, starter: Starter | None = None) -> ChildOutcome:
    """One child: ``run_children([spec])[0]``."""
    return run_children([spec], limits, sandbox=sandbox, starter=starter)[0]


# -- results ----------------------------------------------------------------------------------


class ResultFileError(ValueError):
    """A child's result file is missing, not a regular file, or too large."""


def read_result_file(path: Path, cap: int = RESULT_SIZE_CAP) -> bytes | None:
    """The bytes a child wrote to its result file; None when there is none. Links, FIFOs and
    other non-regular files, and files over ``cap`` bytes, are refused (ResultFileError)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ResultFileError(f"cannot open the job's result ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ResultFileError("the job's result is not a regular file")
        if info.st_size > cap:
            raise ResultFileError(f"the job's result is over {cap} bytes")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > cap:
                raise ResultFileError(f"the job's result is over {cap} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
