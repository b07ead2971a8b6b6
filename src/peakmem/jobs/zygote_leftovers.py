"""What the warm job process's jobs leave behind: their descendants outside the job's group.

A job forked by the warm process runs in its own session; the warm process SIGKILLs that group
when the job ends. A grandchild that made its own session (``os.setsid()``) and whose parent
then exited (a daemon's double fork; one that stopped itself with SIGSTOP waits for ever) was
reparented to init: nobody ended it, neither the warm process nor the requesting peakmem (which
finds a cold child's orphans because they are reparented to it, a subreaper). The warm process
is made a subreaper too (:func:`become_subreaper`): such orphans come to it, and
:class:`Leftovers` remembers which job each descendant descends from (scanned from ``/proc``
after each ``select``, so at most a second late), and ends them with their job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Collection
from dataclasses import dataclass, field

from peakmem.jobs.supervisor import _proc_table

UNKNOWN_JOB = -1
"""The job of an orphan that came to the warm process before it was seen: ended with the last
running job."""
MAX_DEPTH = 4096


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux PR_SET_CHILD_SUBREAPER);
    whether that worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parent_death_signal(parent: int) -> None:
    """In a child just forked from `parent`: SIGKILL it when `parent` ends (Linux
    PR_SET_PDEATHSIG); exit at once if `parent` ended already."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


@dataclass
class Leftovers:
    """Which job (the pid the warm process forked) each of its other descendants belongs to."""

    owner: dict[int, int] = field(default_factory=dict)

    def track(self, jobs: Collection[int]) -> None:
        """Scan the process table: note the job of every new descendant; forget those gone."""
        if not jobs and not self.owner:
            return
        table = _proc_table()
        me = os.getpid()
        owner = {pid: job for pid, job in self.owner.items() if pid in table}
        for pid in table:
            if pid in owner or pid in jobs:
                continue
            chain, current, found = [], pid, None
            while current in table and current not in (0, 1, me) and len(chain) < MAX_DEPTH:
                if current in jobs:
                    found = current
                    break
                if current in owner:
                    found = owner[current]
                    break
                chain.append(current)
                current = table[current][0]
            if found is None and current == me:
                found = UNKNOWN_JOB  # reparented here (a subreaper) before it was seen
            if found is not None:
                owner.update(dict.fromkeys(chain, found))
        self.owner = owner

    def end(self, job: int, running: Collection[int]) -> list[int]:
        """SIGKILL what `job` left (and, when no job runs any more, every orphan of unknown
        job); the pids signalled."""
        self.track({job, *running})
        ended = [pid for pid, owner in self.owner.items()
                 if owner == job or (owner == UNKNOWN_JOB and not running)]
        mine = _descendants(os.getpid())  # a pid reused since the last scan is left alone
        for pid in ended:
            if pid in mine:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            del self.owner[pid]
        return [pid for pid in ended if pid in mine]


def _descendants(root: int) -> set[int]:
    """Every process below `root` in the process tree (its orphans are reparented to it)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgid) in _proc_table().items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for kid in children.get(stack.pop(), ()):
            if kid not in found:
                found.add(kid)
                stack.append(kid)
    return found
