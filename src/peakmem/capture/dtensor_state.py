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
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import

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


# -- DTensor's random-number tracker ------------------------------------------------------------

DTENSOR_RANDOM_MODULE = "torch.distributed.tensor._random"


def _host_device_state(self: Any) -> torch.Tensor:
    """`OffsetBasedRNGTracker._get_device_state`: the generator's state (a 16-byte host tensor)
    is copied to the device to be broadcast; that copy is made while DTensor dispatches a random
    op (`nn.init.normal_` on a sharded parameter: FSDP2's meta init, `reset_parameters`), where
    the capture's device mapping does not apply, so it reached the CPU build's CUDA backend.
    Here the state stays on the host: the fake group's broadcast leaves it as it is, and the
    device copy (one 512-byte block, freed at once) is not traced."""
    return self._device_handle.get_rng_state()


def _patch_rng_tracker(module: Any) -> Undo:
    tracker = getattr(module, "OffsetBasedRNGTracker", None)
    original = vars(tracker).get("_get_device_state") if tracker is not None else None
    if original is None:
        return lambda: None
    tracker._get_device_state = _host_device_state

    def undo() -> None:
        tracker._get_device_state = original

    return undo


@register_library_patch("dtensor_rng_state_on_host")
@contextmanager
def dtensor_rng_state_on_host() -> Iterator[None]:
    with patch_on_import(DTENSOR_RANDOM_MODULE, _patch_rng_tracker):
        yield


def _fake_cuda_uniform_(original: Any) -> Any:
    """aten.uniform_'s Python decomposition, which FakeTensorMode runs when DTensor propagates
    the sharding of `tensor.uniform_()` on a sharded parameter (`nn.init.kaiming_uniform_` in
    `reset_parameters` after FSDP2's meta init): it draws from the CUDA generator, which a
    CPU-only build does not have. A fake tensor holds no values: it is returned as it is (the
    in-place op keeps its shape, dtype and device)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def uniform_(self: Any, low: float = 0, high: float = 1, generator: Any = None) -> Any:
        if isinstance(self, FakeTensor) and self.device.type == "cuda" and \
                not torch.backends.cuda.is_built():
            return self
        return original(self, low, high, generator)

    return uniform_


@register_library_patch("dtensor_fake_cuda_uniform")
@contextmanager
def dtensor_fake_cuda_uniform() -> Iterator[None]:
    from torch._decomp import decomposition_table

    op = torch.ops.aten.uniform_.default
    original = decomposition_table.get(op)
    if original is None:
        yield
        return
    decomposition_table[op] = _fake_cuda_uniform_(original)
    try:
        yield
    finally:
        decomposition_table[op] = original
