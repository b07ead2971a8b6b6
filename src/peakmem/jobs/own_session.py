"""`os.setsid()` / `os.setpgid(0, 0)` / `os.setpgrp()` in a job that peakmem already started in
its own session.

peakmem starts each job process in a session of its own (jobs/supervisor.py `popen_child`, the
warm process's `_become_job_process`), so that a timeout or a memory cap ends the job's whole
group. That makes the job's process a session leader, and Linux refuses both calls to a session
leader (EPERM), while `python train.py` launched from a batch script, cron or a scheduler (not a
group leader) gets its new session or group: a job that detaches itself that way failed with
PermissionError under peakmem only (adversarial round k7). What the job asked for (a session or
group of its own, led by itself) is already the case, so while the job runs these calls answer as
they would have: `setsid()` returns the session id, `setpgid` to the process's own group is
accepted. Every other call, and every other refusal, goes to the OS as it is.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def _leads_own_session() -> bool:
    pid = os.getpid()
    return os.getsid(0) == pid and os.getpgrp() == pid


@contextlib.contextmanager
def own_session_calls() -> Iterator[None]:
    """Patch os.setsid / os.setpgid / os.setpgrp for the job's run (put back afterwards)."""
    real_setsid, real_setpgid = os.setsid, os.setpgid
    real_setpgrp = getattr(os, "setpgrp", None)

    def setsid() -> int:
        try:
            return real_setsid()
        except PermissionError:
            if _leads_own_session():  # already the job's own session (peakmem made it)
                return os.getpid()
            raise

    def setpgid(pid: int, pgrp: int, /) -> None:
        try:
            real_setpgid(pid, pgrp)
        except PermissionError:
            me = os.getpid()
            if pid in (0, me) and pgrp in (0, me) and _leads_own_session():
                return None  # its group is already its own
            raise

    def setpgrp() -> None:
        setpgid(0, 0)

    os.setsid, os.setpgid = setsid, setpgid  # type: ignore[assignment]
    if real_setpgrp is not None:
        os.setpgrp = setpgrp  # type: ignore[assignment]
    try:
        yield
    finally:
        os.setsid, os.setpgid = real_setsid, real_setpgid  # type: ignore[assignment]
        if real_setpgrp is not None:
            os.setpgrp = real_setpgrp  # type: ignore[assignment]
