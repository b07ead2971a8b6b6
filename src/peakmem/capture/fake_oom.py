"""The `torch.OutOfMemoryError` a job sees when the simulated allocator, capped by
`set_per_process_memory_fraction`, cannot satisfy an allocation: CUDA's message, and the trace
rewritten as the GPU would have left it (the allocation did not happen; the allocator freed its
cache trying)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from peakmem.trace.events import NO_TAG, EventKind

if TYPE_CHECKING:
    from peakmem.capture.fake_memory import SimulatedMemory


class SimulatedOutOfMemory(torch.OutOfMemoryError):
    """`torch.OutOfMemoryError` raised in the job by the simulated (fraction-capped) allocator."""

    peakmem_simulated_oom = True


def _format(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.2f} {unit}" if unit != "bytes" else f"{int(size)} bytes"
        size /= 1024
    return f"{size:.2f} GiB"


_SKIP_DIRS = (str(Path(torch.__file__).parent), str(Path(__file__).resolve().parents[1]))


def job_location() -> str | None:
    """`file:line` of the innermost frame of the job's own code on the current stack."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_SKIP_DIRS) and not name.startswith("<") and "contextlib" not in name:
            return f"{Path(name).name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def job_error(memory: SimulatedMemory, size: int, index: int) -> SimulatedOutOfMemory:
    """CUDA's out-of-memory error for the allocation at `index`, which did not happen: the event
    becomes what the allocator did instead (freed its cache), and the OOM is noted in the trace."""
    trace = memory.trace
    trace.kinds[index], trace.ids[index] = EventKind.EMPTY_CACHE, -1
    trace.sizes[index], trace.tag_ids[index] = 0, NO_TAG
    allocator = memory.allocator
    reserved, allocated = allocator.total_allocated_memory, allocator.allocated_bytes
    limit = allocator._allowed_memory_maximum or 0
    free = max(memory.total_bytes - memory.outside_bytes() - reserved, 0)
    in_use = memory.outside_bytes() + reserved
    where = job_location()
    allowed = (
        f" Process has {_format(limit)} memory allowed (per-process memory fraction "
        f"{memory.fraction})."
        if memory.fraction is not None
        else ""
    )
    message = (
        f"CUDA out of memory. Tried to allocate {_format(size)}. GPU 0 has a total capacity of "
        f"{_format(memory.total_bytes)} of which {_format(free)} is free. Including non-PyTorch "
        f"memory, this process has {_format(in_use)} memory in use.{allowed} Of the allocated "
        f"memory {_format(allocated)} is allocated by "
        f"PyTorch, and {_format(reserved - allocated)} is reserved by PyTorch but unallocated. "
        "(peakmem: simulated by the caching-allocator model, no GPU was used)"
    )
    trace.meta.setdefault("simulated_ooms", []).append(
        {"bytes": size, "where": where, "fraction": memory.fraction, "event": index}
    )
    return SimulatedOutOfMemory(message)


