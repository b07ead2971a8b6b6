"""The CUDA runtime as the job sees it during a capture: one device shaped like the target GPU.

`torch.cuda` (availability, device count, name, properties, memory info, streams, events,
synchronize, memory statistics), `torch.accelerator`, cuDNN availability and pinned memory are
patched for the duration of the capture and restored afterwards. Streams and events are no-ops:
the capture runs everything in program order on one stream.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from peakmem.capture.session import CaptureSession


@dataclass(frozen=True)
class FakeDeviceProperties:
    """Mirrors `torch.cuda._CudaDeviceProperties`' public fields."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048
    L2_cache_size: int = 0  # noqa: N815  (torch's spelling)
    uuid: str = "00000000-0000-0000-0000-000000000000"
    gcnArchName: str = "NVIDIA CUDA"  # noqa: N815

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 2**20}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


class _NoOpContext:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoOpContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakeEvent:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: FakeEvent) -> float:
        return 0.0


class FakeStream(_NoOpContext):
    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cuda", 0)
        self.priority = priority
        self.cuda_stream = 0
        self.stream_id = 0

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: FakeEvent | None = None) -> FakeEvent:
        return event or FakeEvent()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def is_capturing(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream)

    def __hash__(self) -> int:
        return 0


def _identity(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


def _is_cuda_location(location: Any) -> bool:
    if isinstance(location, str):
        return location == "cuda" or location.startswith("cuda:")
    if isinstance(location, torch.device):
        return location.type == "cuda"
    return isinstance(location, int) and not isinstance(location, bool)


def _load_onto_device(original_load: Any) -> Any:
    """`torch.load(..., map_location="cuda")`: load on the host (memory-mapped when possible),
    then move every tensor to the fake device, as the copy to the GPU would."""

    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not _is_cuda_location(map_location):
            return original_load(f, map_location, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)) and "mmap" not in kwargs:
            try:
                loaded = original_load(f, "cpu", *args, mmap=True, **kwargs)
            except RuntimeError:  # not a zipfile checkpoint: cannot be memory-mapped
                loaded = original_load(f, "cpu", *args, **kwargs)
        else:
            loaded = original_load(f, "cpu", *args, **kwargs)
        return tree_map(
            lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, loaded
        )

    return load


def runtime_patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    """(object, attribute) -> replacement, for everything the capture fakes."""
    gpu = session.gpu
    major, minor = gpu.capability
    total = gpu.total_memory_bytes
    context = int(session.stack.context_for(gpu).value)
    props = FakeDeviceProperties(
        name=gpu.device_name,
        major=major,
        minor=minor,
        total_memory=total,
        multi_processor_count=int(gpu.sm_count.value),
    )
    default_stream = FakeStream()

    def allocated(device: Any = None) -> int:
        return session.allocated_bytes

    def max_allocated(device: Any = None) -> int:
        return session.max_allocated_bytes

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        libraries = sum(session.libraries.values())
        return max(total - context - libraries - session.allocated_bytes, 0), total

    def empty_cache() -> None:
        if not session.closed:
            session.trace.empty_cache()

    def reset_peak(device: Any = None) -> None:
        session.max_allocated_bytes = session.allocated_bytes

    original_clear_autocast_cache = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        original_clear_autocast_cache()
        session.autocast_cache.clear()

    def compile_as_eager(model: Any = None, **kwargs: Any) -> Any:
        """torch.compile: the job runs eagerly. The note names what was compiled; calls of a
        compiled module or function are bracketed by "compiled region" / "compiled region end"
        marks, so the estimate can bound what Inductor would not materialise."""
        import functools

        from peakmem.trace.vocab import Mark

        seen = compile_as_eager.__dict__.setdefault("seen", {"names": [], "modes": []})
        mode = kwargs.get("mode")

        def start(*args: Any) -> None:
            session.mark(Mark.COMPILED.value)

        def end(*args: Any) -> None:
            session.mark(Mark.COMPILED_END.value)

        def apply(target: Any) -> Any:
            owner = getattr(target, "__self__", None)
            if isinstance(target, torch.nn.Module):
                name = type(target).__name__
                target.register_forward_pre_hook(start)
                target.register_forward_hook(end, always_call=True)
                result = target
            else:
                name = getattr(target, "__qualname__", None) or type(target).__name__
                if isinstance(owner, torch.nn.Module):  # Module.compile(): its _call_impl
                    name = type(owner).__name__
                result = target
                if callable(target):

                    @functools.wraps(target)
                    def result(*args: Any, **kw: Any) -> Any:
                        start()
                        try:
                            return target(*args, **kw)
                        finally:
                            end()

            if name not in seen["names"]:
                seen["names"].append(name)
            if mode in ("reduce-overhead", "max-autotune") and mode not in seen["modes"]:
                seen["modes"].append(mode)
            names = seen["names"]
            listed = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            note = (
                f"torch.compile was not applied: {listed} ran eagerly; Inductor fuses chains of "
                "elementwise ops and frees (or recomputes in backward) their intermediates, so "
                "the activations traced are an upper bound for the compiled run"
            )
            for graph_mode in seen["modes"]:
                note += (
                    f"; mode={graph_mode!r} also records CUDA graphs, whose private memory "
                    "pools are not modelled"
                )
            session.notes[:] = [
                n for n in session.notes if not n.startswith("torch.compile was not applied")
            ]
            session.notes.append(note)
            return result

        if model is None:  # used as @torch.compile(...)
            return apply
        return apply(model)

    cuda = torch.cuda
    patches: dict[tuple[Any, str], Any] = {
        (cuda, "is_available"): lambda: True,
        (cuda, "is_initialized"): lambda: True,
        (cuda, "init"): lambda: None,
        (cuda, "_lazy_init"): lambda: None,
        (cuda, "device_count"): lambda: 1,
        (cuda, "current_device"): lambda: 0,
        (cuda, "set_device"): lambda device: None,
        (cuda, "get_device_name"): lambda device=None: gpu.device_name,
        (cuda, "get_device_properties"): lambda device=None: props,
        (cuda, "get_device_capability"): lambda device=None: (major, minor),
        (cuda, "get_arch_list"): lambda: [f"sm_{major}{minor}"],
        (cuda, "is_bf16_supported"): lambda including_emulation=True: major >= 8,
        (cuda, "mem_get_info"): mem_get_info,
        (cuda, "synchronize"): lambda device=None: None,
        (cuda, "ipc_collect"): lambda: None,
        (cuda, "empty_cache"): empty_cache,
        (cuda, "memory_allocated"): allocated,
        (cuda, "max_memory_allocated"): max_allocated,
        (cuda, "memory_reserved"): allocated,
        (cuda, "max_memory_reserved"): max_allocated,
        (cuda, "reset_peak_memory_stats"): reset_peak,
        (cuda, "reset_max_memory_allocated"): reset_peak,
        (cuda, "memory_stats"): lambda device=None: {},
        (cuda, "set_per_process_memory_fraction"): lambda fraction, device=None: None,
        (cuda, "Stream"): FakeStream,
        (cuda, "Event"): FakeEvent,
        (cuda, "stream"): lambda stream=None: _NoOpContext(),
        (cuda, "current_stream"): lambda device=None: default_stream,
        (cuda, "default_stream"): lambda device=None: default_stream,
        (cuda, "device"): _NoOpContext,
        (cuda, "device_of"): _NoOpContext,
        (torch.accelerator, "is_available"): lambda: True,
        (torch.accelerator, "current_accelerator"): lambda check_available=False: torch.device("cuda"),
        (torch.accelerator, "device_count"): lambda: 1,
        (torch.accelerator, "current_device_index"): lambda: 0,
        (torch.accelerator, "set_device_index"): lambda device: None,
        (torch.accelerator, "synchronize"): lambda device=None: None,
        (torch.accelerator, "current_stream"): lambda device=None: default_stream,
        (cuda, "is_current_stream_capturing"): lambda: False,
        (torch.backends.cudnn, "is_available"): lambda: True,
        (torch.Tensor, "pin_memory"): _identity,
        (torch, "clear_autocast_cache"): clear_autocast_cache,
        (torch, "compile"): compile_as_eager,
        (torch, "load"): _load_onto_device(torch.load),
    }
    return {(obj, name): value for (obj, name), value in patches.items() if hasattr(obj, name)}


@contextmanager
def fake_cuda_runtime(session: CaptureSession) -> Iterator[None]:
    saved = []
    try:
        for (obj, name), value in runtime_patches(session).items():
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, original in reversed(saved):
            setattr(obj, name, original)
