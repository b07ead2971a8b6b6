"""The torch.cuda calls that initialise CUDA, so that the job's allocator configuration is read
then (capture.job_alloc_conf): the capture's fakes of these settle the configuration first.

torch reads `PYTORCH_CUDA_ALLOC_CONF` when CUDA is lazily initialised (`torch.cuda._lazy_init`),
which many calls reach before the job's first CUDA tensor. Checked against torch 2.13's
torch/cuda/__init__.py, memory.py and random.py: each name below calls `_lazy_init()` itself, or
through `get_device_properties` / `current_device` (`get_device_name`, `get_device_capability`,
`is_bf16_supported`, `is_tf32_supported`, `mem_get_info`), or in C++ through
`torch::utils::device_lazy_init` (`set_device`: `_cuda_setDevice`; the `torch.cuda.device(i)`
context: `_exchange_device`). Calls that do not initialise CUDA, and so leave a later setting of
the variable in force: `is_available`, `device_count`, `is_initialized`, `get_arch_list`,
`memory_allocated` / `memory_reserved` / `memory_stats` (they answer empty before
initialisation), `manual_seed` / `manual_seed_all` / `seed` / `set_rng_state` (queued by
`_lazy_call`), and the NVML readings (`memory_usage`, `utilization`, `device_memory_used`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

INITIALISING: dict[str, frozenset[str]] = {
    "torch.cuda": frozenset({
        "init", "_lazy_init", "cudart", "get_device_properties", "get_device_name",
        "get_device_capability", "is_bf16_supported", "is_tf32_supported",
        "can_device_access_peer", "current_device", "set_device", "synchronize", "ipc_collect",
        "current_stream", "default_stream", "current_blas_handle", "current_solver_handle",
        "set_sync_debug_mode", "get_sync_debug_mode", "_get_rng_state_offset", "get_rng_state",
        "get_rng_state_all", "initial_seed", "mem_get_info", "set_per_process_memory_fraction",
        "get_per_process_memory_fraction",
    }),
    "torch.cuda.memory": frozenset({
        "mem_get_info", "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    }),
    "torch.cuda.random": frozenset({"get_rng_state", "get_rng_state_all", "initial_seed"}),
}
"""Module -> its functions that initialise CUDA (torch 2.13)."""


def initialises(owner: Any, name: str) -> bool:
    """`owner.name` (a module's function) initialises CUDA in torch."""
    return name in INITIALISING.get(getattr(owner, "__name__", None) or "", frozenset())


def settling(replacement: Any, settle: Callable[[], None]) -> Any:
    """`replacement` (the capture's fake of an initialising call), settling the job's allocator
    configuration before it runs; a class (a fake type) is returned as it is."""
    if isinstance(replacement, type) or not callable(replacement):
        return replacement

    @functools.wraps(replacement)
    def call(*args: Any, **kwargs: Any) -> Any:
        settle()
        return replacement(*args, **kwargs)

    return call


def settle_initialising(
    patches: dict[tuple[Any, str], Any], settle: Callable[[], None]
) -> dict[tuple[Any, str], Any]:
    """`patches` with every fake of a CUDA-initialising call settling first."""
    return {
        (obj, name): settling(value, settle) if initialises(obj, name) else value
        for (obj, name), value in patches.items()
    }
