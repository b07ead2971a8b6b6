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
  `torch.cuda.nccl.version()` answers NCCL_VERSION and `is_nccl_available()` True to torchtune
  (NCCL_PROBES); other callers get the CPU build's answer.
"""

from __future__ import annotations

import sys
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


NCCL_PROBES = ("torchtune.",)
"""Modules whose `is_nccl_available()` is a hardware-capability check (torchtune's bf16 check),
answered True. Everyone else gets the CPU build's answer (False), so a single-process job that
picks its backend by it (`"nccl" if dist.is_nccl_available() else "gloo"`) keeps the backend it
can start here."""


def _nccl_available_to_probes(original: Any) -> Any:
    def is_nccl_available() -> bool:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return True if str(caller).startswith(NCCL_PROBES) else bool(original())

    return is_nccl_available


@register_library_patch("cuda_raw_stream")
@contextmanager
def cuda_raw_stream() -> Iterator[None]:
    """`torch._C._cuda_getCurrentRawStream` (bitsandbytes' CUDA backend binds it at import)."""
    with provided(torch._C, "_cuda_getCurrentRawStream", _raw_stream):
        yield


@register_library_patch("nccl_present")
@contextmanager
def nccl_present() -> Iterator[None]:
    """`torch.cuda.nccl.version()` as a CUDA build answers it, and
    `torch.distributed.is_nccl_available()` True to torchtune's bf16 check (NCCL_PROBES)."""
    with ExitStack() as stack:
        nccl = getattr(torch.cuda, "nccl", None)
        if nccl is not None:
            stack.enter_context(provided(nccl, "version", _nccl_version))
        if torch.distributed.is_available():
            answer = _nccl_available_to_probes(torch.distributed.is_nccl_available)
            stack.enter_context(provided(torch.distributed, "is_nccl_available", answer))
        yield
