"""DTensor's sharding-propagation caches, reset around each capture.

DTensor caches its sharding decisions per process (the C++ dispatch fast path's cache, the
Python `ShardingPropagator.propagate_op_sharding` LRU cache and its tensor-meta cache), keyed by
the op schema: the mesh and placements, never the rank or the local shapes. Ranks captured one
after another in one process (`estimate_command(..., isolate=False)`, the Python API, tests)
would reuse the first rank's decisions (rank 3 of an uneven split computing with rank 0's
local shapes). `peakmem estimate` runs each rank in a process of its own; this reset makes the
in-process path agree with it. Nothing happens before the job imports DTensor.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from peakmem.capture.library_patches import register_library_patch

DTENSOR_MODULE = "torch.distributed.tensor"


def reset_dtensor_caches() -> None:
    """Forget every sharding decision DTensor cached in this process (this thread's)."""
    if DTENSOR_MODULE not in sys.modules:
        return
    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:
        with contextlib.suppress(Exception):
            clear_native()
    dtensor = getattr(sys.modules[DTENSOR_MODULE], "DTensor", None)
    dispatcher = getattr(dtensor, "_op_dispatcher", None)
    propagator = getattr(dispatcher, "sharding_propagator", None)
    if propagator is None:
        return
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        cached = getattr(propagator, name, None)
        clear = getattr(cached, "cache_clear", None)
        if clear is not None:
            with contextlib.suppress(Exception):
                clear()


@register_library_patch("dtensor_caches_reset")
@contextmanager
def dtensor_caches_reset() -> Iterator[None]:
    reset_dtensor_caches()
    try:
        yield
    finally:
        reset_dtensor_caches()
