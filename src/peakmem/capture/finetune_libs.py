"""Fine-tuning libraries that probe the CUDA runtime at import or set-up (bitsandbytes,
torchtune): the few runtime pieces they reach for, registered as library patches.

- bitsandbytes imports its CUDA backend when `torch.cuda.is_available()`; the backend binds
  `torch._C._cuda_getCurrentRawStream` at import (a CPU-only torch has none): here it answers
  stream 0 (one stream runs everything in program order). Its native CUDA library cannot load
  (no libcudart): bitsandbytes falls back to a stand-in that raises only when a kernel is
  called, and on fake device tensors its ops run their registered fake (meta) kernels instead,
  which give the real output shapes (capture.bitsandbytes_rules models the allocations their CUDA
  kernels make beyond the outputs);
- torchtune checks bf16 support with `torch.distributed.is_nccl_available()` and
  `torch.cuda.nccl.version() >= (2, 10)`: a CUDA build of torch has NCCL, so here
  `torch.cuda.nccl.version()` answers NCCL_VERSION; `is_nccl_available()` answers True to every
  caller (capture.fake_distributed: a job that picks "nccl" by it gets the fake process group).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch

NCCL_VERSION = (2, 21, 5)
"""The NCCL a CUDA build of torch 2.4-2.6 ships (nvidia-nccl-cu12 2.21.5)."""

_MISSING = object()


@contextmanager
def provided(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name = value` for the duration, whether or not `owner` has `name` (a CPU-only
    torch lacks the CUDA bindings); the original (or its absence) restored afterwards."""
    original = getattr(owner, name, _MISSING)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if original is _MISSING:
            if getattr(owner, name, _MISSING) is value:
                delattr(owner, name)
        else:
            setattr(owner, name, original)


def _raw_stream(device: Any = None) -> int:
    return 0


def _nccl_version() -> tuple[int, int, int]:
    return NCCL_VERSION


@register_library_patch("cuda_raw_stream")
@contextmanager
def cuda_raw_stream() -> Iterator[None]:
    """`torch._C._cuda_getCurrentRawStream` (bitsandbytes' CUDA backend binds it at import)."""
    with provided(torch._C, "_cuda_getCurrentRawStream", _raw_stream):
        yield


@register_library_patch("nccl_present")
@contextmanager
def nccl_present() -> Iterator[None]:
    """`torch.cuda.nccl.version()` as a CUDA build answers it (`is_nccl_available()` is
    capture.fake_distributed's)."""
    with ExitStack() as stack:
        nccl = getattr(torch.cuda, "nccl", None)
        if nccl is not None:
            stack.enter_context(provided(nccl, "version", _nccl_version))
        yield
