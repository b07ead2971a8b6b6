"""Opening `--job-log FILE`, the file the job's stdout and stderr go to, without hanging: a
named FIFO that no process reads would block `open` for ever (process substitution,
`--job-log >(tee log)`, has its reader and opens at once)."""

from __future__ import annotations

import errno
import os


class JobLogError(OSError):
    """The job log cannot be opened; its message is one line naming the file."""


def open_job_log(path: str | os.PathLike[str]) -> int:
    """A blocking, write-only file descriptor on `path` (created or truncated)."""
    name = os.path.abspath(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(name, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO without a reader
            raise JobLogError(f"cannot open the job log {os.fspath(path)!r}: a FIFO that no "
                              "process reads") from None
        raise JobLogError(f"cannot open the job log {os.fspath(path)!r}: "
                          f"{exc.strerror or exc}") from None
    os.set_blocking(fd, True)
    return fd
