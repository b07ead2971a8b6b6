"""The child side of a supervised job: helpers for the process that runs the user's code.

- :class:`ResultWriter` delivers the child's one result, atomically (a temporary file renamed
  over the result path), and only from the ORIGINAL child process: a job that forks (its own
  ``os.fork``, multiprocessing, DataLoader workers) runs the rest of the job in the fork too, and
  that copy must not deliver a second result.
- :func:`os_exit_hook` replaces ``os._exit`` while the job runs, so that a job ending its process
  with ``os._exit(n)`` still delivers what was captured up to that point (the hook runs in the
  original process only; forks exit at once as they asked).
- :func:`end_process` ends the child without waiting for the job's non-daemon threads or running
  its atexit handlers: the result is delivered, nothing the job does afterwards matters.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import operator
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_REAL_EXIT = os._exit
# What delivering the result calls, bound when peakmem's child starts: the job runs in this
# process and may rebind the module attributes afterwards (`builtins.open = None`, its own
# `os.replace`, `os.getpid`); a job that writes nothing more runs fine so under python.
_OPEN, _REPLACE, _GETPID = io.open, os.replace, os.getpid


class ResultWriter:
    """Writes the child's result once, from the process that created the writer."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.pid = _GETPID()
        self.written = False
        self._resource = _resource_module()
        self._limits = _file_limits(self._resource)
        self._temporary = self.path.with_name(f".{self.path.name}.{self.pid}.tmp")
        # opened now, before the job runs: a job may later forbid itself new files (an audit
        # hook that raises on "open", RLIMIT_NOFILE lowered for good); writing to an open
        # descriptor needs neither (os.write raises no audit event)
        self._early = _open_early(self._temporary, self._resource)

    @property
    def in_original_process(self) -> bool:
        return _GETPID() == self.pid

    def write(self, data: bytes) -> bool:
        """Deliver `data`; False (nothing written) in a fork or when already delivered."""
        if self.written or not self.in_original_process:
            return False
        # the job may have set RLIMIT_FSIZE 0 (valid for a job that writes nothing): the result
        # is peakmem's file, written under peakmem's limits
        _restore_limits(self._resource, self._limits)
        if not self._write_early(data):
            with _OPEN(self._temporary, "wb") as handle:
                handle.write(data)
        _REPLACE(self._temporary, self.path)
        self.written = True
        return True

    def _write_early(self, data: bytes) -> bool:
        """Write `data` through the descriptor opened before the job ran; False where there is
        none or it is no longer that file (the job closed it: its number may now be one of the
        job's own files, which is left alone)."""
        if self._early is None:
            return False
        fd, identity = self._early
        self._early = None
        try:
            status = _FSTAT(fd)
        except OSError:
            return False
        if (status.st_dev, status.st_ino) != identity:
            return False
        try:
            if status.st_size >= len(data) > _file_size_limit(self._resource):
                _write_mapped(fd, data)  # the job lowered RLIMIT_FSIZE for good
            else:
                view, offset = memoryview(data), 0
                while offset < len(data):  # at an offset: the job may have moved the file's
                    offset += _PWRITE(fd, view[offset:], offset)  # (writing to every fd it has)
            _FTRUNCATE(fd, len(data))  # the room made before the job ran, given back
        except (OSError, ValueError):
            return False  # then written by name, as before
        finally:
            with contextlib.suppress(OSError):
                _CLOSE(fd)
        return True


_FSTAT, _PWRITE, _CLOSE, _OPEN_FD, _FTRUNCATE = os.fstat, os.pwrite, os.close, os.open, os.ftruncate
_MMAP = mmap.mmap
RESULT_ROOM = 1 << 30
"""Bytes the result's file is extended to (sparse) before the job runs: a job may lower its hard
RLIMIT_FSIZE to 0 afterwards, which fails every write() to a file, while storing through a
shared mapping of a file already that large is not limited (shrinking it to the result's size
is allowed too). The supervisor reads at most this much (supervisor.RESULT_SIZE_CAP)."""


def _file_size_limit(resource: Any) -> float:
    """The soft RLIMIT_FSIZE now (bytes; infinite where there is none)."""
    if resource is None or not hasattr(resource, "RLIMIT_FSIZE"):
        return float("inf")
    try:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (OSError, ValueError):
        return float("inf")
    return float("inf") if soft == resource.RLIM_INFINITY else soft


def _write_mapped(fd: int, data: bytes) -> None:
    """`data` stored at the start of the file open on `fd` (at least that large) through a
    shared mapping, and flushed to the file."""
    if not data:
        return
    mapping = _MMAP(fd, len(data), mmap.MAP_SHARED, mmap.PROT_WRITE | mmap.PROT_READ)
    try:
        mapping[:] = data
        mapping.flush()
    finally:
        mapping.close()


def _open_early(path: Path, resource: Any = None) -> tuple[int, tuple[int, int]] | None:
    """`path` created and opened for writing (descriptor, (device, inode)); None where it
    cannot be (the result is then written by name)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)  # RDWR: mmap
    try:
        fd = _OPEN_FD(path, flags, 0o600)
    except OSError:
        return None
    try:
        status = _FSTAT(fd)
    except OSError:
        with contextlib.suppress(OSError):
            _CLOSE(fd)
        return None
    with contextlib.suppress(OSError, ValueError, OverflowError):  # sparse: takes no disk
        _FTRUNCATE(fd, int(min(RESULT_ROOM, _file_size_limit(resource))))  # (see RESULT_ROOM)
    return fd, (status.st_dev, status.st_ino)


_FILE_LIMITS = ("RLIMIT_FSIZE", "RLIMIT_NOFILE")
"""Resource limits that decide whether the result file can be written."""


def _resource_module() -> Any:
    """The `resource` module (None where it is not: not POSIX), imported before the job runs
    (a job may put None in sys.modules["resource"])."""
    try:
        import resource
    except ImportError:
        return None
    return resource


def _file_limits(resource: Any) -> dict[int, tuple[int, int]]:
    if resource is None:
        return {}
    return {getattr(resource, name): resource.getrlimit(getattr(resource, name))
            for name in _FILE_LIMITS if hasattr(resource, name)}


def _restore_limits(resource: Any, saved: dict[int, tuple[int, int]]) -> None:
    """Put back the soft limits the child started with, where the job lowered them (a lowered
    hard limit cannot be raised again: the write then fails and no result is reported)."""
    if not saved:
        return
    for which, limits in saved.items():
        with contextlib.suppress(ValueError, OSError):
            if resource.getrlimit(which) != limits:
                current_hard = resource.getrlimit(which)[1]
                soft = limits[0]
                if current_hard != resource.RLIM_INFINITY and (
                        soft == resource.RLIM_INFINITY or soft > current_hard):
                    soft = current_hard
                resource.setrlimit(which, (soft, current_hard))


@contextlib.contextmanager
def os_exit_hook(writer: ResultWriter, on_exit: Callable[[int], None]) -> Iterator[None]:
    """While the block runs, ``os._exit(n)`` in the original process first calls
    ``on_exit(n)`` (which should deliver a result through `writer`), then ends the process with
    status n. Errors in ``on_exit`` never stop the exit."""

    def _exit(code: int = 0) -> None:  # the same signature as os._exit
        code = _c_int(code)  # what os._exit raises for a bad code, before anything is written
        if writer.in_original_process and not writer.written:
            with contextlib.suppress(BaseException):
                on_exit(code)
        _REAL_EXIT(code)

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = _REAL_EXIT


def _c_int(code: object) -> int:
    """`code` as os._exit takes it (a C int); TypeError / OverflowError as os._exit raises."""
    number = operator.index(code)  # type: ignore[arg-type]
    if not -(1 << 31) <= number < (1 << 31):
        raise OverflowError("Python int too large to convert to C int")
    return number


def end_process(code: int) -> None:
    """Flush what the job printed and end the process now (no atexit, no thread joins)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    _REAL_EXIT(code)
