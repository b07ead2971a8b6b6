"""The CUDA runtime as the job sees it during a capture: one device shaped like the target GPU.

`torch.cuda` (availability, device count, name, properties, streams, events, synchronize),
`torch.accelerator`, cuDNN availability and pinned memory are patched for the duration of the
capture and restored afterwards; the themed modules of `patch_providers()` add the rest (memory
readings from the allocator simulation, RNG, graphs and profilers, processes, legacy tensor
types, tensor methods). Streams and events are no-ops: the capture runs everything in program
order on one stream. docs/capture.md ("The fake CUDA runtime") lists what is supported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from peakmem.capture import compiled_code, compiled_timing, memory_size_reads
from peakmem.capture.device_ordinals import checked_set_device
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
    max_threads_per_block: int = 1024
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 49152
    shared_memory_per_block_optin: int = 232448
    shared_memory_per_multiprocessor: int = 233472
    L2_cache_size: int = 0  # noqa: N815  (torch's spelling)
    clock_rate: int = 0
    memory_clock_rate: int = 0
    memory_bus_width: int = 0
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0
    uuid: str = "00000000-0000-0000-0000-000000000000"
    gcnArchName: str = "NVIDIA CUDA"  # noqa: N815
    on_memory_read: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    """Called when the job reads `total_memory` (peakmem's, not torch's: see
    memory_size_reads)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "total_memory":
            hook = object.__getattribute__(self, "on_memory_read")
            if hook is not None:
                hook()
        return object.__getattribute__(self, name)

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={object.__getattribute__(self, 'total_memory') // 2**20}MB, "
            f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
            f"pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
            f"pci_domain_id={self.pci_domain_id}, L2_cache_size={self.L2_cache_size // 2**20}MB)"
        )


class FakeDeviceContext:
    """`torch.cuda.device(0)` / `device_of(tensor)`: selecting the only device."""

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self.idx = 0
        self.prev_idx = 0

    def __enter__(self) -> FakeDeviceContext:
        if not isinstance(self.device, torch.Tensor):  # `device_of(tensor)`: its own device
            checked_set_device(self.device)  # an ordinal the job has no GPU of raises, as on CUDA
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _settling_device_context(session: CaptureSession) -> type[FakeDeviceContext]:
    """`torch.cuda.device(i)`: entering it for a device (not -1) initialises CUDA
    (`_exchange_device` -> `device_lazy_init`), settling the job's allocator configuration
    (`device(None)` already when made: torch asks `current_device()` for its index)."""

    class DeviceContext(FakeDeviceContext):
        def __init__(self, device: Any = None) -> None:
            if device is None:
                settle_memory(session)
            super().__init__(device)

        def __enter__(self) -> FakeDeviceContext:
            if not isinstance(self.device, torch.Tensor) and self.device != -1:
                settle_memory(session)
            return super().__enter__()

    DeviceContext.__name__ = DeviceContext.__qualname__ = "device"
    return DeviceContext


def _set_device(device: Any) -> None:
    """`torch.cuda.set_device`: the one GPU; an ordinal beyond it raises, as on CUDA."""
    checked_set_device(device)


class _NoOpContext:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoOpContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakeEvent:
    """A CUDA event; timing events measure the process's CPU time between records (a job's
    throughput arithmetic then sees a positive time; capture/compiled_timing.py)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self.recorded_at: float | None = None
        self.compiled_at = 0.0  # compiled_timing's clock when recorded

    def record(self, stream: Any = None) -> None:
        self.recorded_at, self.compiled_at = compiled_timing.reading()

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: FakeEvent) -> float:
        """The process's CPU milliseconds between the records, compiled code's time discounted
        (capture/compiled_timing.py)."""
        now = compiled_timing.reading()
        start = (self.recorded_at, self.compiled_at) if self.recorded_at is not None else now
        end_at = getattr(end_event, "recorded_at", None)
        end = (end_at, getattr(end_event, "compiled_at", 0.0)) if end_at else now
        elapsed, discounted = compiled_timing.elapsed_ms(start, end)
        live = compiled_code.current_session()
        if discounted and live is not None and compiled_timing.NOTE not in live.notes:
            live.notes.append(compiled_timing.NOTE)
        return elapsed


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


class FakeCudart:
    """`torch.cuda.cudart()`: the few runtime calls Python code makes through it."""

    def __init__(self, mem_get_info: Callable[[Any], tuple[int, int]]) -> None:
        self._mem_get_info = mem_get_info

    def cudaMemGetInfo(self, device: Any = 0) -> tuple[int, int]:  # noqa: N802  (CUDA's name)
        return self._mem_get_info(device)

    def cudaProfilerStart(self) -> int:  # noqa: N802
        return 0

    def cudaProfilerStop(self) -> int:  # noqa: N802
        return 0

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        return 0

    def cudaGetErrorString(self, error: Any) -> str:  # noqa: N802
        return "no error"


LIBRARY_KERNEL_COMPILES = compiled_code.LIBRARY_KERNEL_COMPILES
MODELLED_KERNEL_COMPILES = compiled_code.MODELLED_KERNEL_COMPILES


def runtime_patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    """(object, attribute) -> replacement, for everything the capture fakes."""
    gpu = session.gpu
    major, minor = gpu.capability
    total = gpu.total_memory_bytes
    props = FakeDeviceProperties(
        name=gpu.device_name,
        major=major,
        minor=minor,
        total_memory=total,
        multi_processor_count=int(gpu.sm_count.value),
        on_memory_read=lambda: memory_size_reads.note_memory_size_read(
            session, "torch.cuda.get_device_properties(...).total_memory"),
    )
    default_stream = FakeStream()

    original_clear_autocast_cache = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        original_clear_autocast_cache()
        session.autocast_cache.clear()

    def compile_as_eager(model: Any = None, **kwargs: Any) -> Any:
        """torch.compile: the job runs eagerly. The note names what was compiled and then ran
        (a library may compile functions at import that the job never calls); calls of a
        compiled module or function are bracketed by "compiled region" / "compiled region end"
        marks, so the estimate can bound what Inductor would not materialise. A call is
        recorded in the capture running when it is made (a module compiled during one capture
        may be called in the next one of the same process: `peakmem warm`, pytest)."""
        import functools

        from peakmem.capture import fused_updates

        mode = compiled_code.graph_mode(kwargs.get("mode"), kwargs.get("options"))

        def apply(target: Any) -> Any:
            fused = compiled_code.fused_note(target)
            if fused is not None:  # Inductor keeps none of its temporaries
                return compiled_code.fused_stand_in(target, fused)
            if compiled_code.is_modelled_or_library(target):
                return compiled_code.stand_in(target)  # a library's host kernels, or a kernel
                # the capture records
            name = compiled_code.compiled_name(target)

            if isinstance(target, torch.nn.Module):
                # OptimizedModule's stand-in: the module's own calls stay eager
                result = compiled_code.compiled_view(target, name, mode)
            else:
                result = target
                if callable(target):

                    @functools.wraps(target)
                    def result(*args: Any, **kw: Any) -> Any:
                        live = compiled_code.region_start(name, mode)
                        if live is None:  # called outside any capture
                            return target(*args, **kw)
                        fused = fused_updates.begin(live, bool(kwargs.get("fullgraph")))
                        try:
                            returned = target(*args, **kw)
                            fused_updates.end(live, fused, returned)
                            return returned
                        finally:
                            compiled_code.region_end(live)

            compiled_code.compiled_runs(session).declare(name, mode)
            return result

        if model is None:  # used as @torch.compile(...)
            return apply
        return apply(model)

    cuda = torch.cuda
    patches: dict[tuple[Any, str], Any] = {
        (cuda, "is_available"): lambda: True,
        (cuda, "init"): lambda: None,  # settles: capture.cuda_init_calls
        (cuda, "_lazy_init"): lambda: None,
        (cuda, "device_count"): lambda: 1,
        (cuda, "current_device"): lambda: 0,
        (cuda, "set_device"): _set_device,
        (cuda, "get_device_name"): lambda device=None: gpu.device_name,
        (cuda, "get_device_properties"): lambda device=None: props,
        (cuda, "get_device_capability"): lambda device=None: (major, minor),
        # the wheels' architectures (stack profile `arch_list`), not only the GPU's
        (cuda, "get_arch_list"): lambda: list(session.stack.arch_list) or [f"sm_{major}{minor}"],
        (cuda, "synchronize"): lambda device=None: None,
        (cuda, "ipc_collect"): lambda: None,
        (cuda, "Stream"): FakeStream,
        (cuda, "Event"): FakeEvent,
        (cuda, "stream"): lambda stream=None: _NoOpContext(),
        (cuda, "current_stream"): lambda device=None: default_stream,
        (cuda, "default_stream"): lambda device=None: default_stream,
        (cuda, "device"): _settling_device_context(session),
        (cuda, "device_of"): FakeDeviceContext,
        (torch.accelerator, "is_available"): lambda: True,
        (torch.accelerator, "current_accelerator"): lambda check_available=False: torch.device("cuda"),
        (torch.accelerator, "device_count"): lambda: 1,
        (torch.accelerator, "current_device_index"): lambda: 0,
        (torch.accelerator, "set_device_index"): _set_device,
        (torch.accelerator, "synchronize"): lambda device=None: None,
        (torch.accelerator, "current_stream"): lambda device=None: default_stream,
        (cuda, "is_current_stream_capturing"): lambda: False,
        (cuda, "cudart"): lambda: FakeCudart(lambda device=None: torch.cuda.mem_get_info(device)),
        (cuda, "is_tf32_supported"): lambda: major >= 8,
        (cuda, "can_device_access_peer"): lambda device, peer_device: False,
        (cuda, "current_blas_handle"): lambda: 0,
        (cuda, "current_solver_handle"): lambda: 0,
        (cuda, "get_sync_debug_mode"): lambda: 0,
        (cuda, "set_sync_debug_mode"): lambda debug_mode: None,
        (cuda, "_get_rng_state_offset"): lambda device="cuda": 0,
        (cuda, "_set_rng_state_offset"): lambda offset, device="cuda": None,
        (torch.backends.cudnn, "is_available"): lambda: True,
        (torch, "clear_autocast_cache"): clear_autocast_cache,
        (torch, "compile"): compile_as_eager,
    }
    nccl = getattr(cuda, "nccl", None)
    if nccl is not None:
        patches[(nccl, "version")] = lambda: (2, 21, 5)
    return {(obj, name): value for (obj, name), value in patches.items() if hasattr(obj, name)}


PatchProvider = Callable[[CaptureSession], dict[tuple[Any, str], Any]]


def patch_providers() -> list[PatchProvider]:
    """The fake runtime's themes beyond the basics above, each a module giving (object,
    attribute) -> replacement: CUDA's observable state, memory readings, RNG, graphs and
    profiling, processes, tensors."""
    from peakmem.capture import (
        blas_workspaces,
        cuda_state,
        data_parallel,
        device_exports,
        device_processes,
        device_storages,
        fake_device_ordinal,
        fake_distributed,
        fake_graphs,
        fake_legacy,
        fake_memory_api,
        fake_processes,
        fake_rng,
        fake_streams,
        fake_tensors,
        host_broadcasts,
        nested_tensors,
        network_access,
        python_subprocesses,
        spawned_children,
        storage_resize,
    )

    return [
        cuda_state.patches,
        blas_workspaces.patches,
        fake_memory_api.patches,
        fake_legacy.patches,
        fake_rng.patches,
        fake_graphs.patches,
        fake_processes.patches,
        device_processes.patches,
        fake_tensors.patches,
        fake_device_ordinal.patches,
        data_parallel.patches,  # before fake_distributed: a rank's device count wins
        fake_distributed.patches,
        storage_resize.patches,
        device_storages.patches,
        device_exports.patches,
        nested_tensors.patches,
        fake_streams.patches,
        host_broadcasts.patches,
        python_subprocesses.patches,
        spawned_children.patches,
        network_access.patches,
    ]


def settle_memory(session: CaptureSession) -> None:
    """CUDA is initialised now: torch reads the job's allocator configuration
    (capture.job_alloc_conf, `SimulatedMemory.settle`)."""
    if session.memory is not None:
        session.memory.settle()


def all_patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    from peakmem.capture.cuda_init_calls import settle_initialising

    patches = runtime_patches(session)
    for provider in patch_providers():
        patches.update(provider(session))
    patches = settle_initialising(patches, lambda: settle_memory(session))
    return {(obj, name): value for (obj, name), value in patches.items() if hasattr(obj, name)}


@contextmanager
def fake_cuda_runtime(session: CaptureSession) -> Iterator[None]:
    from peakmem.capture import fake_tensors
    from peakmem.capture.process_state import process_state_kept

    saved = []
    default_dtype = torch.get_default_dtype()
    # precision flags, library singletons (capture.process_state): put back after the patches
    with process_state_kept():
        try:
            for (obj, name), value in all_patches(session).items():
                own = not isinstance(obj, type) or name in vars(obj)  # else inherited: delete after
                saved.append((obj, name, getattr(obj, name), own))
                setattr(obj, name, value)
            yield
        finally:
            for obj, name, original, own in reversed(saved):
                if own:
                    setattr(obj, name, original)
                else:
                    delattr(obj, name)
            fake_tensors.restore_default_device(session, torch.set_default_device)
            torch.set_default_dtype(default_dtype)  # a job's set_default_dtype / _tensor_type
