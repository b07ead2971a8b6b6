"""Library loops that catch CUDA's out-of-memory error and try again with a smaller batch:
accelerate's `find_executable_batch_size` (also behind the Trainer's `--auto_find_batch_size`)
and Lightning's batch-size finder (`Tuner.scale_batch_size`, the `BatchSizeFinder` callback).

On the GPU such a loop sees `torch.OutOfMemoryError` at the first batch that does not fit and
goes on with a smaller one; without a memory fraction the capture otherwise lets every
allocation through, so the loop would keep its first (too large) batch. While one of these
loops is on the stack, an allocation the simulated allocator cannot place raises the error in
the job (capture.fake_oom), as the GPU would."""

from __future__ import annotations

import os
import sys

RETRY_LOOPS: dict[str, frozenset[str]] = {
    os.path.join("accelerate", "utils", "memory.py"): frozenset(
        {"find_executable_batch_size.<locals>.decorator"}
    ),
    os.path.join("lightning", "pytorch", "tuner", "batch_size_scaling.py"): frozenset(
        {"_run_power_scaling", "_run_binary_scaling"}
    ),
    os.path.join("pytorch_lightning", "tuner", "batch_size_scaling.py"): frozenset(
        {"_run_power_scaling", "_run_binary_scaling"}
    ),
}
"""File (its path's tail) -> qualified names of the functions in it that catch the error and
retry with a smaller batch (accelerate's `should_reduce_batch_size`, Lightning's
`is_oom_error`)."""


def _retries(filename: str, qualname: str) -> bool:
    return any(
        qualname in names and filename.endswith(tail) for tail, names in RETRY_LOOPS.items()
    )


class _RetryLoopIndex:
    """What the stack walk needs, worked out once, not per allocation: the retry loops'
    function names (a set test per frame, files after), and whether a file of RETRY_LOOPS is
    loaded at all (scanned again only when `sys.modules` or RETRY_LOOPS changed size). While
    none is, no frame of a retry loop can be on the stack and the walk is skipped; once one has
    been seen it stays seen (the walk runs from then on)."""

    def __init__(self) -> None:
        self.names: frozenset[str] = frozenset()
        self.loaded = False
        self._modules_seen = -1
        self._loops_seen = -1

    def refresh(self) -> None:
        loops = len(RETRY_LOOPS)
        if loops != self._loops_seen:
            self._loops_seen = loops
            self.names = frozenset().union(*RETRY_LOOPS.values())
            self.loaded = False
            self._modules_seen = -1
        modules = len(sys.modules)
        if modules == self._modules_seen:
            return
        self._modules_seen = modules
        if self.loaded:
            return
        stems = tuple(os.path.splitext(tail)[0] for tail in RETRY_LOOPS)  # .py or .pyc
        for module in list(sys.modules.values()):
            filename = getattr(module, "__file__", None)
            if isinstance(filename, str) and os.path.splitext(filename)[0].endswith(stems):
                self.loaded = True
                return


_INDEX = _RetryLoopIndex()


def retry_loop_on_stack() -> bool:
    """Whether a frame of a retry loop (RETRY_LOOPS) is on the calling thread's stack."""
    index = _INDEX
    if len(sys.modules) != index._modules_seen or len(RETRY_LOOPS) != index._loops_seen:
        index.refresh()
    if not index.loaded:
        return False
    names = index.names
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_qualname in names and _retries(code.co_filename, code.co_qualname):
            return True
        frame = frame.f_back
    return False


def near_capacity(allocated_bytes: int, nbytes: int, total_bytes: int) -> bool:
    """Cheap test first: an allocation can fail only once the live bytes come near the GPU's
    memory (here: past half of it, leaving room for the cache and fragmentation)."""
    return 2 * (allocated_bytes + nbytes) > total_bytes
