"""Processes and data parallelism during a capture. `torch.multiprocessing.spawn` /
`start_processes`: process 0 runs in this process as rank 0 (its device memory is the job's);
with more than one process, rank 0 is the representative rank (the others are not run: their
process groups are fake, capture.fake_distributed). (`nn.DataParallel` on the one device:
capture.library_patches.)"""

from __future__ import annotations

from typing import Any

import torch.multiprocessing
import torch.multiprocessing.spawn as spawn_module

from peakmem.capture.session import CaptureSession
from peakmem.capture.unsupported import Unsupported


class InProcessContext:
    """What `spawn(..., join=False)` returns: the only "process" has already finished."""

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.error_files: list[Any] = []

    def pids(self) -> list[int]:
        import os

        return [os.getpid()]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        return True


def _run(session: CaptureSession, fn: Any, args: tuple, nprocs: int, join: bool) -> Any:
    if not isinstance(nprocs, int) or nprocs < 1:
        raise Unsupported(f"multi-process spawn with {nprocs!r} processes")
    note = "torch.multiprocessing spawn of 1 process: it ran in the capture's process as rank 0"
    if nprocs > 1:
        note = (f"torch.multiprocessing spawn of {nprocs} processes: rank 0 ran in the capture's "
                "process as the representative rank; the others were not run")
    if note not in session.notes:
        session.notes.append(note)
    fn(0, *args)
    return None if join else InProcessContext()


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    def spawn(fn: Any, args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
              start_method: str = "spawn") -> Any:
        return _run(session, fn, tuple(args), nprocs, join)

    def start_processes(fn: Any, args: tuple = (), nprocs: int = 1, join: bool = True,
                        daemon: bool = False, start_method: str = "spawn") -> Any:
        return _run(session, fn, tuple(args), nprocs, join)

    found: dict[tuple[Any, str], Any] = {}
    for owner in (torch.multiprocessing, spawn_module):
        found[(owner, "spawn")] = spawn
        found[(owner, "start_processes")] = start_processes
    return found
