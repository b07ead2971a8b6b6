"""What a job can observe of CUDA's state, answered as torch answers it on the target GPU.

- `torch.cuda.is_initialized()`: False until CUDA's lazy initialisation (the job's first CUDA
  tensor or first initialising call: capture.cuda_init_calls), True after, as torch's
  `_initialized` (torch/cuda/__init__.py: `return _initialized and not _is_in_bad_fork()`).
  Scripts branch on it: `if torch.cuda.is_initialized(): torch.cuda.synchronize()`, or set
  PYTORCH_CUDA_ALLOC_CONF only while it is False (capture.job_alloc_conf then reads their value).
- `torch.cuda.is_bf16_supported(including_emulation=True)` (torch 2.13, the same since 2.3):
  True for compute capability 8.0 and later; below, False with `including_emulation=False`, else
  torch creates a bfloat16 tensor on the device (`_check_bf16_tensor_supported`, `lru_cache`d per
  device): it succeeds on every CUDA GPU (V100, T4: emulated), so True, and that first call
  allocates the 2-byte tensor (a 512-byte block, a 2 MiB segment of the small pool). Torch 2.1
  and earlier (the torch-1.10 stack): `major >= 8 and int(torch.version.cuda.split(".")[0]) >= 11`,
  no emulation.
- `torch.cuda.memory._get_current_allocator()`: a `_CUDAAllocator` wrapping one opaque handle
  (the native caching allocator; custom allocators are refused: capture.fake_memory_api).
"""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.session import CaptureSession

EMULATED_BF16_SINCE = (2, 3)
"""The first torch release whose `is_bf16_supported` falls back to creating a bfloat16 tensor
(2.1's torch/cuda/__init__.py has only the capability and CUDA major test)."""


class NativeAllocatorHandle:
    """Stands for `torch._C._cuda_CUDAAllocator` (the native caching allocator)."""

    def __repr__(self) -> str:
        return "<torch._C._cuda_CUDAAllocator (native caching allocator)>"


def bf16_supported(session: CaptureSession, including_emulation: bool = True) -> bool:
    """`torch.cuda.is_bf16_supported` of the target stack on the target GPU."""
    major = session.gpu.capability[0]
    cuda_major = session.stack.cuda_version[0]
    if session.stack.torch_min < EMULATED_BF16_SINCE:
        return major >= 8 and cuda_major >= 11
    if major >= 8 and cuda_major >= 11:
        return True
    if not including_emulation:
        return False
    if session.first_time("bf16_tensor_check"):  # `_check_bf16_tensor_supported`'s lru_cache
        torch.tensor([1.0], dtype=torch.bfloat16, device="cuda")
    return True


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    memory_module = torch.cuda.memory
    handle = NativeAllocatorHandle()

    def is_initialized() -> bool:
        return session.memory is not None and session.memory.initialized

    def current_allocator() -> Any:
        return memory_module._CUDAAllocator(handle)

    return {
        (torch.cuda, "is_initialized"): is_initialized,
        (torch.cuda, "is_bf16_supported"):
            lambda including_emulation=True: bf16_supported(session, including_emulation),
        (memory_module, "_get_current_allocator"): current_allocator,
    }
