"""`torch.cuda`'s memory functions as the job calls them during a capture, answered from the
allocator simulation (`fake_memory.SimulatedMemory`): allocated / reserved / peaks,
`memory_stats` with c10's key names, `memory_summary`, `memory_snapshot`, `mem_get_info`,
`set_per_process_memory_fraction`, the memory-history recorder and nvidia-smi-like queries."""

from __future__ import annotations

import collections
import functools
import pickle
import sys
from collections.abc import Callable
from typing import Any

import torch

from peakmem.capture import memory_size_reads
from peakmem.capture.fake_memory import SimulatedMemory, build
from peakmem.capture.session import CaptureSession
from peakmem.capture.unsupported import Unsupported

RAW_POINTER_BASE = 0x7F00_0000_0000


def _flatten(nested: dict[str, Any]) -> collections.OrderedDict[str, Any]:
    """`torch.cuda.memory_stats`: the nested stats as sorted "a.b.c" keys."""
    rows: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            rows.append((prefix, value))

    walk("", nested)
    rows.sort()
    return collections.OrderedDict(rows)


def check_device(device: Any) -> None:
    """Refuse a `device` argument as torch.cuda's memory functions do on a GPU: ValueError for
    a device that is not CUDA (torch's `_get_device_index`), RuntimeError for an ordinal the job
    has no GPU of (the caching allocator's device check). Before, `mem_get_info(device=-7)` or
    `memory_stats("cpu")` answered as if for GPU 0: an estimate of a job that fails on a GPU."""
    if device is None:
        return
    from torch.cuda._utils import _get_device_index

    index = _get_device_index(device, optional=True)
    if not 0 <= index < torch.cuda.device_count():
        raise RuntimeError(f"Invalid device argument {index}: did you call init?")


def _device_checked(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def checked(device: Any = None, *args: Any, **kwargs: Any) -> Any:
        check_device(device)
        return function(device, *args, **kwargs)

    return checked


_HISTORY_OPTIONS = (
    ("enabled", ("state", "all"), "expected state to be 'state', 'all', or None"),
    ("context", ("state", "alloc", "all"), "expected context to be 'state', 'alloc', 'all', or None"),
)


def _history_impl(enabled: Any = "all", context: Any = "all", stacks: Any = "all",
                  max_entries: Any = sys.maxsize, device: Any = None, clear_history: Any = False,
                  compile_context: Any = False, global_record_annotations: Any = False,
                  skip_actions: Any = None) -> dict[str, Any]:
    return locals()


def check_history_arguments(enabled: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """torch's checks of `_record_memory_history(...)` (its C++ `checkOptionIn`s, pybind's
    argument types); a bool `enabled` is the legacy form, not checked."""
    if isinstance(enabled, bool):
        return
    given = _history_impl(enabled, *args, **kwargs)  # TypeError for unknown arguments
    for name, valid, message in _HISTORY_OPTIONS:
        value = given[name]
        if value is not None and (not isinstance(value, str) or value not in valid):
            raise RuntimeError(message)
    if not isinstance(given["stacks"], str) or given["stacks"] not in ("python", "all"):
        raise RuntimeError("expected stacks to be 'python', or 'all'")
    entries = given["max_entries"]
    if isinstance(entries, bool) or not isinstance(entries, int) or not 0 <= entries < 2**64:
        raise TypeError("_cuda_record_memory_history(): incompatible function arguments: "
                        f"max_entries must be a non-negative integer, got {entries!r:.40}")


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    """Builds the capture's allocator simulation (`session.memory`) and the functions reading it."""
    from peakmem.estimate.first_use import first_use_bytes
    from peakmem.estimate.margin_kinds import op_packets

    gpu, stack = session.gpu, session.stack
    context = int(stack.context_for(gpu).value)
    # the first-use families of the ops run so far (estimate/first_use.py; GPUs with a table):
    # the trace's new tags read once each, the families recomputed when a new op appears
    ops: set[str] = set()
    families = {"tags": 0, "bytes": sum(first_use_bytes(stack, gpu, ()).values())}

    def outside_bytes() -> int:
        tags = session.trace.tags
        if len(tags) != families["tags"]:
            new = set(op_packets(tag.op for tag in tags[families["tags"]:])) - ops
            families["tags"] = len(tags)
            if new:
                ops.update(new)
                families["bytes"] = sum(first_use_bytes(stack, gpu, ops).values())
        return context + sum(session.libraries.values()) + families["bytes"]

    memory = build(
        session.trace,
        total_bytes=gpu.total_memory_bytes,
        outside_bytes=outside_bytes,
        default_version="{}.{}".format(*stack.torch_min),
        notes=session.notes,
    )
    session.memory = memory
    return memory_patches(session, memory)


def memory_patches(session: CaptureSession, memory: SimulatedMemory) -> dict[tuple[Any, str], Any]:
    cuda = torch.cuda
    cuda_memory = torch.cuda.memory
    history: dict[str, Any] = {"enabled": None}

    def memory_stats(device: Any = None) -> collections.OrderedDict[str, Any]:
        with session._lock:
            return _flatten(memory.nested_stats())

    def nested(device: Any = None) -> dict[str, Any]:
        with session._lock:
            return memory.nested_stats()

    def reading(name: str, metric: str) -> Any:
        def read(device: Any = None) -> int:
            with session._lock:
                return memory.stat(name, metric)

        return read

    def reset_peaks(device: Any = None) -> None:
        with session._lock:
            memory.reset_peaks()

    def reset_accumulated(device: Any = None) -> None:
        with session._lock:
            memory.reset_accumulated()

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        memory_size_reads.note_memory_size_read(session, "torch.cuda.mem_get_info()")
        with session._lock:
            return memory.mem_get_info()

    def empty_cache() -> None:
        session.empty_cache()

    def set_fraction(fraction: float, device: Any = None) -> None:
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        if not 0 <= fraction <= 1:  # NaN passes torch's Python checks; its C++ TORCH_CHECK not
            raise RuntimeError(f"invalid fraction:{fraction}. Please set within [0, 1].")
        with session._lock:
            session.trace.meta["memory_fraction"] = fraction
            memory.set_fraction(fraction)

    def get_fraction(device: Any = None) -> float:
        return memory.fraction if memory.fraction is not None else 1.0

    def segments(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        with session._lock:
            return memory.segments()

    def snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
        with session._lock:
            return {
                "segments": memory.segments(),
                "device_traces": [[]],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": memory.config.source},
            }

    def dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
        # The job's own file, written as torch writes it; peakmem never reads it back.
        with open(filename, "wb") as handle:
            pickle.dump(snapshot(), handle)

    def record_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
        check_history_arguments(enabled, args, kwargs)
        history["enabled"] = enabled
        note = (
            "torch.cuda.memory._record_memory_history: the snapshot holds the simulated "
            "segments and blocks, without stack traces or an event history"
        )
        if enabled and note not in session.notes:
            session.notes.append(note)

    def list_gpu_processes(device: Any = None) -> str:
        return "GPU:0\nno processes are running (peakmem: a simulated device)"

    pointers: dict[int, int] = {}  # fake device pointer -> scratch allocation id

    def raw_alloc(size: int, device: Any = None, stream: Any = None) -> int:
        """`caching_allocator_alloc`: a raw block from the caching allocator."""
        ident = session.scratch(int(size), category="other", op="caching_allocator_alloc")
        pointer = RAW_POINTER_BASE + 512 * (len(pointers) + 1 + max(ident, 0))
        pointers[pointer] = ident
        return pointer

    def raw_delete(mem_ptr: int) -> None:
        ident = pointers.pop(mem_ptr, None)
        if ident is not None:
            session.release(ident)

    def device_memory_used(device: Any = None) -> int:
        """nvidia-smi's used memory: context, libraries and what the allocator reserved."""
        with session._lock:
            return memory.outside_bytes() + memory.stat("reserved_bytes")

    def refuse(what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise Unsupported(what)

        return refused

    zero = lambda device=None: 0  # noqa: E731

    patches: dict[tuple[Any, str], Any] = {}
    device_checked = {  # torch.cuda's: they check their device argument
        "memory_stats": memory_stats,
        "memory_stats_as_nested_dict": nested,
        "memory_allocated": reading("allocated_bytes", "current"),
        "max_memory_allocated": reading("allocated_bytes", "peak"),
        "memory_reserved": reading("reserved_bytes", "current"),
        "max_memory_reserved": reading("reserved_bytes", "peak"),
        "memory_cached": reading("reserved_bytes", "current"),
        "max_memory_cached": reading("reserved_bytes", "peak"),
        "reset_peak_memory_stats": reset_peaks,
        "reset_max_memory_allocated": reset_peaks,
        "reset_max_memory_cached": reset_peaks,
        "reset_accumulated_memory_stats": reset_accumulated,
        "mem_get_info": mem_get_info,
    }
    for owner in (cuda, cuda_memory):
        patches.update({(owner, name): _device_checked(function)
                        for name, function in device_checked.items()})
        patches.update(
            {
                (owner, "empty_cache"): empty_cache,
                (owner, "set_per_process_memory_fraction"): set_fraction,
                (owner, "get_per_process_memory_fraction"): get_fraction,
                (owner, "memory_snapshot"): segments,
                (owner, "list_gpu_processes"): list_gpu_processes,
                (owner, "_snapshot"): snapshot,
                (owner, "_dump_snapshot"): dump_snapshot,
                (owner, "_record_memory_history"): record_history,
                (owner, "_record_memory_history_legacy"): record_history,
                (owner, "_set_memory_metadata"): lambda metadata: None,
                (owner, "_get_memory_metadata"): lambda: "",
                (owner, "caching_allocator_enable"): lambda value=True: None,
                (owner, "host_memory_stats"): lambda: collections.OrderedDict(),
                (owner, "reset_peak_host_memory_stats"): lambda: None,
                (owner, "reset_accumulated_host_memory_stats"): lambda: None,
                (owner, "caching_allocator_alloc"): raw_alloc,
                (owner, "caching_allocator_delete"): raw_delete,
                (owner, "get_allocator_backend"): lambda: memory.config.backend,
                (owner, "change_current_allocator"): refuse("a custom CUDA allocator"),
                (owner, "CUDAPluggableAllocator"): refuse("a custom CUDA allocator"),
                (owner, "_set_allocator_settings"): refuse(
                    "changing the CUDA allocator settings at run time"
                ),
            }
        )
    for name in ("utilization", "temperature", "power_draw", "clock_rate"):
        patches[(cuda, name)] = zero
    patches[(cuda, "memory_usage")] = lambda device=None: 0
    patches[(cuda, "device_memory_used")] = device_memory_used
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        for owner in (accelerator, getattr(accelerator, "memory", None)):
            if owner is None:
                continue
            patches.update(
                {
                    (owner, "memory_stats"): memory_stats,
                    (owner, "memory_allocated"): reading("allocated_bytes", "current"),
                    (owner, "max_memory_allocated"): reading("allocated_bytes", "peak"),
                    (owner, "memory_reserved"): reading("reserved_bytes", "current"),
                    (owner, "max_memory_reserved"): reading("reserved_bytes", "peak"),
                    (owner, "reset_peak_memory_stats"): reset_peaks,
                    (owner, "reset_accumulated_memory_stats"): reset_accumulated,
                    (owner, "empty_cache"): empty_cache,
                    (owner, "get_memory_info"): mem_get_info,
                }
            )
    return patches
