"""Threads the job starts during the capture run under the capture's modes.

Torch-function and dispatch modes are thread-local: without this, a model run from a
`threading.Thread` or a `concurrent.futures.ThreadPoolExecutor` worker would escape the capture
(its "cuda" tensors would fail on the CPU build, its allocations would go unrecorded). A thread
started while `traced_threads()` is active takes the starting thread's mode stacks with it: they
are pushed when the thread begins and popped when it ends. The session is shared and guarded by
its lock.

A thread that outlives the capture (an idle pool worker) keeps the modes; the session is closed
by then, so nothing more is recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils._python_dispatch import _pop_mode as _pop_dispatch_mode
from torch.utils._python_dispatch import _push_mode as _push_dispatch_mode

_ATTRIBUTE = "_peakmem_modes"


def _run_with_modes(original: Any) -> Any:
    def bootstrap_inner(self: threading.Thread) -> None:
        modes = getattr(self, _ATTRIBUTE, None)
        if not modes:
            return original(self)
        function_modes, dispatch_modes = modes
        pushed_function = pushed_dispatch = 0
        try:
            for mode in function_modes:
                torch._C._push_on_torch_function_stack(mode)
                pushed_function += 1
            for mode in dispatch_modes:
                _push_dispatch_mode(mode)
                pushed_dispatch += 1
            return original(self)
        finally:
            for _ in range(pushed_dispatch):
                _pop_dispatch_mode()
            for _ in range(pushed_function):
                torch._C._pop_torch_function_stack()

    return bootstrap_inner


@contextmanager
def traced_threads() -> Iterator[None]:
    """While active, threads started carry the starting thread's torch modes."""
    thread_class = threading.Thread
    original_start = thread_class.start
    original_bootstrap = thread_class._bootstrap_inner  # type: ignore[attr-defined]

    def start(self: threading.Thread) -> None:
        function_modes = list(_get_current_function_mode_stack())
        dispatch_modes = list(_get_current_dispatch_mode_stack())
        if function_modes or dispatch_modes:
            setattr(self, _ATTRIBUTE, (function_modes, dispatch_modes))
        original_start(self)

    thread_class.start = start  # type: ignore[method-assign]
    thread_class._bootstrap_inner = _run_with_modes(original_bootstrap)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        thread_class.start = original_start  # type: ignore[method-assign]
        thread_class._bootstrap_inner = original_bootstrap  # type: ignore[attr-defined]


JOB_THREAD_GRACE_SECONDS = 5.0
"""How long the end of a job waits for the non-daemon threads it started, as python's own
shutdown does (threading._shutdown, before the atexit handlers), before the estimate ends."""


def join_job_threads(before: set[threading.Thread],
                     grace: float = JOB_THREAD_GRACE_SECONDS) -> list[str]:
    """Wait (at most `grace` seconds in all) for the non-daemon threads started since `before`
    was taken; the names of those still running after it. `python train.py` waits for them
    before it exits, so what they allocate after the main thread's last line is part of the
    run's peak: the estimate ended at that line and left it out."""
    deadline = time.monotonic() + grace
    current = threading.current_thread()
    waiting = [thread for thread in threading.enumerate()
               if thread not in before and thread is not current and not thread.daemon]
    for thread in waiting:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread.name for thread in waiting if thread.is_alive()]


def threads_note(names: list[str], grace: float = JOB_THREAD_GRACE_SECONDS) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{len(names)} non-daemon thread(s) of the job ({shown}) still ran {grace:g} s after "
            "its main thread ended: python would wait for them; what they allocate later is "
            "not in the estimate")
