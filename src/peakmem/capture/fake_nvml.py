"""NVML (`pynvml`, from the nvidia-ml-py package) answering for the target GPU during a capture.

Scripts query NVML for the device's memory (to log it, to size a batch from the free memory) and
monitoring loops poll its utilization; without a driver `nvmlInit()` raises
NVMLError_LibraryNotFound and the job dies. During a capture, the module's device queries
answer like the fake `nvidia-smi` (capture.fake_nvidia_smi), for the target GPU (--gpu), but
from inside the job: memory used is the CUDA context, the libraries and what the simulated
allocator reserves now, as NVML reports the process's device memory. Everything else in the
module is left as it is (an unknown call still reaches the missing library and raises)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from typing import Any

import torch

from peakmem.capture import memory_size_reads
from peakmem.capture.compiled_code import current_session
from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import

DRIVER_VERSION = "550.54.15"
CUDA_DRIVER_VERSION = 12040


def driver() -> tuple[str, int]:
    """The driver's version and the CUDA it supports (NVML's 12040 for 12.4): the capture's
    stack profile's `driver_version` / `driver_cuda_version`, as the fake nvidia-smi says."""
    stack = getattr(current_session(), "stack", None)
    if stack is None:
        return DRIVER_VERSION, CUDA_DRIVER_VERSION
    major, minor = stack.driver_cuda_version
    return stack.driver_version, major * 1000 + minor * 10


class FakeHandle:
    """An NVML device handle (`nvmlDeviceGetHandleByIndex`)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<peakmem nvmlDevice {self.index}>"


def _session() -> Any:
    session = current_session()
    if session is None:
        raise RuntimeError("peakmem's NVML answers only during a capture")
    return session


def _device_used_bytes() -> int:
    return int(torch.cuda.device_memory_used())  # the fake runtime's: outside + reserved


def _memory_info(module: Any) -> Callable[..., Any]:
    def memory_info(handle: Any, version: Any = None) -> Any:
        session = _session()
        memory_size_reads.note_memory_size_read(session, "pynvml.nvmlDeviceGetMemoryInfo")
        total = session.gpu.total_memory_bytes
        used = min(_device_used_bytes(), total)
        struct = getattr(module, "c_nvmlMemory_t", None)
        info = struct() if struct is not None else SimpleNamespace()
        info.total, info.free, info.used = total, total - used, used
        return info

    return memory_info


def _utilization(module: Any) -> Callable[[Any], Any]:
    def utilization(handle: Any) -> Any:
        struct = getattr(module, "c_nvmlUtilization_t", None)
        rates = struct() if struct is not None else SimpleNamespace()
        rates.gpu, rates.memory = 0, 0
        return rates

    return utilization


def _handle_by_index(index: int) -> FakeHandle:
    index = int(index)
    if not 0 <= index < torch.cuda.device_count():
        import pynvml

        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return FakeHandle(index)


def _answers(module: Any) -> dict[str, Any]:
    """Function name -> stand-in, for those the module has."""
    name = lambda handle: _session().gpu.device_name  # noqa: E731
    capability = lambda handle: _session().gpu.capability  # noqa: E731
    answers: dict[str, Any] = {
        "nvmlInit": lambda: None,
        "nvmlInitWithFlags": lambda flags: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: torch.cuda.device_count(),
        "nvmlDeviceGetHandleByIndex": _handle_by_index,
        "nvmlDeviceGetIndex": lambda handle: handle.index,
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetUUID": lambda handle: f"GPU-00000000-0000-0000-0000-{handle.index:012d}",
        "nvmlDeviceGetMemoryInfo": _memory_info(module),
        "nvmlDeviceGetUtilizationRates": _utilization(module),
        "nvmlDeviceGetCudaComputeCapability": capability,
        "nvmlDeviceGetComputeRunningProcesses": lambda handle: [],
        "nvmlDeviceGetComputeRunningProcesses_v2": lambda handle: [],
        "nvmlDeviceGetComputeRunningProcesses_v3": lambda handle: [],
        "nvmlDeviceGetGraphicsRunningProcesses": lambda handle: [],
        "nvmlDeviceGetTemperature": lambda handle, sensor=0: 30,
        "nvmlDeviceGetPowerUsage": lambda handle: 50_000,
        "nvmlDeviceGetFanSpeed": lambda handle: 0,
        "nvmlSystemGetDriverVersion": lambda: driver()[0],
        "nvmlSystemGetCudaDriverVersion": lambda: driver()[1],
        "nvmlSystemGetCudaDriverVersion_v2": lambda: driver()[1],
    }
    return {key: value for key, value in answers.items() if hasattr(module, key)}


def _patch(module: Any) -> Undo:
    stack = ExitStack()
    for key, value in _answers(module).items():
        stack.enter_context(patched(module, key, value))
    return stack.close


@register_library_patch("pynvml_target_gpu")
@contextmanager
def nvml_answers_for_the_target() -> Iterator[None]:
    with patch_on_import("pynvml", _patch):
        yield
