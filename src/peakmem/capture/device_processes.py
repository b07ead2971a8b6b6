"""`multiprocessing.Process` workers handed the job's device tensors (pytorch/examples
mnist_hogwild: `model.share_memory()`, then one `mp.Process(target=train, args=(rank, ..., model))`
per worker, each training the shared model).

A real child process would run on this machine's CPU-only torch, outside the fake GPU: it fails
("Torch not compiled with CUDA enabled") and its training is lost from the estimate, which then
sees a forward-only job. During a capture the first such process runs its target in the
capture's process when it is started, as the representative worker (its gradients, optimizer
state and activations are the job's); later ones are not run, and a note says so. `join`,
`is_alive`, `exitcode` and `close` behave as for a process that finished with exit code 0.
Processes whose arguments hold no device tensor (host-only helpers) start as usual.
"""

from __future__ import annotations

import multiprocessing.process
import os
from collections.abc import Iterable
from typing import Any

import torch

from peakmem.capture.session import CaptureSession

MAX_DEPTH = 4
"""How deep into lists, tuples and dicts of the target's arguments device tensors are looked for."""


def holds_device_tensor(value: Any, depth: int = 0) -> bool:
    """Whether `value` is, or holds (a module's parameters and buffers, an optimizer's
    parameters, a container's items), a tensor on the (fake) CUDA device."""
    if isinstance(value, torch.Tensor):
        return bool(value.is_cuda)
    if isinstance(value, torch.nn.Module):
        return any(t.is_cuda for t in _chain(value.parameters(), value.buffers()))
    if isinstance(value, torch.optim.Optimizer):
        return any(p.is_cuda for group in value.param_groups for p in group["params"])
    if depth >= MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return any(holds_device_tensor(item, depth + 1) for item in value.values())
    if isinstance(value, (list, tuple, set)):
        return any(holds_device_tensor(item, depth + 1) for item in value)
    return False


def _chain(*iterables: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    for iterable in iterables:
        yield from iterable


class FinishedPopen:
    """The `_popen` of a process that ran in the capture's process (or was not run): it has
    already exited with code 0."""

    returncode = 0

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.sentinel = -1

    def poll(self, flag: int = 0) -> int:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode

    def terminate(self) -> None:
        return None

    kill = terminate

    def close(self) -> None:
        return None


def _note(session: CaptureSession, ran: int, skipped: int) -> None:
    prefix = "multiprocessing.Process worker(s) given device tensors"
    session.notes[:] = [note for note in session.notes if not note.startswith(prefix)]
    note = (f"{prefix}: the first ran in the capture's process when started (its device memory is "
            "the job's)")
    if skipped:
        note += (f"; {skipped} more were not run: on a real GPU each is a process of its own with "
                 "its own CUDA context, gradients, optimizer state and activations, not in this "
                 "estimate")
    session.notes.append(note)


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    base = multiprocessing.process.BaseProcess
    real_start = base.start
    counts = {"ran": 0, "skipped": 0}

    def start(self: Any) -> None:
        target = getattr(self, "_target", None)
        module = getattr(target, "__module__", "") or ""
        arguments = (getattr(self, "_args", ()), getattr(self, "_kwargs", {}))
        if target is None or module.startswith("torch.utils.data") or not holds_device_tensor(
                arguments):
            return real_start(self)
        self._popen = FinishedPopen()
        self._sentinel = -1
        if counts["ran"]:
            counts["skipped"] += 1
            _note(session, counts["ran"], counts["skipped"])
            return None
        counts["ran"] += 1
        _note(session, counts["ran"], counts["skipped"])
        self.run()
        return None

    return {(base, "start"): start}
