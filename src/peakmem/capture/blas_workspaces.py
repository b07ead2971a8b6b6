"""`torch.backends.cuda.cublas_workspace_size()` / `cublaslt_workspace_size()` (torch 2.13's
API; `blas_workspace_size()` dispatches to them) during a capture.

On a CPU-only torch they reach `torch._C._cuda_getCublasWorkspaceSize`, which raises (no CUDA
build). On a GPU, a query returns the size a handle's workspace gets: the one set through this
API, else CUBLAS_WORKSPACE_CONFIG's, else the default for the device (aten/src/ATen/cuda/
CublasHandlePool.cpp `getChosenWorkspaceSize`); for cuBLASLt the set one, else
CUBLASLT_WORKSPACE_SIZE (KiB), else 1024 KiB. A size set takes precedence over the variables
and applies to handles first used afterwards ("changes take effect lazily"): here it goes to
the capture session (`blas_workspace_sizes`), which cuda_rules/blas.py reads at each handle's
first use, so the estimate allocates what the job asked for.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from peakmem.capture.session import CaptureSession
from peakmem.cublas_workspace_config import WorkspaceConfigError, workspace_config_bytes

CUBLASLT_DEFAULT_BYTES = 1024 * 1024
"""CUBLASLT_WORKSPACE_SIZE's default, 1024 KiB (CublasHandlePool.cpp)."""


def _checked(size: Any) -> int:
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"workspace size must be an int, not {type(size).__name__}")
    if size < 0:
        raise RuntimeError(f"workspace size must be non-negative, got {size}")
    return size


def cublas_size(session: CaptureSession) -> int:
    """The cuBLAS workspace a handle first used now would get."""
    chosen = session.blas_workspace_sizes.get("cublas")
    if chosen is not None:
        return chosen
    try:
        configured = workspace_config_bytes(os.environ.get("CUBLAS_WORKSPACE_CONFIG") or "")
    except WorkspaceConfigError:  # refused before the job ran (estimate/api.py)
        configured = None
    if configured is not None:
        return configured
    return int(session.stack.cublas_workspace_for(session.gpu.capability).value)


def cublaslt_size(session: CaptureSession) -> int:
    """The cuBLASLt workspace a handle first used now would get."""
    chosen = session.blas_workspace_sizes.get("cublaslt")
    if chosen is not None:
        return chosen
    text = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "")
    if text.strip().isdigit():
        return int(text) * 1024
    workspace = session.stack.cublaslt_workspace
    return int(workspace.value) if workspace is not None else CUBLASLT_DEFAULT_BYTES


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    backends = torch.backends.cuda

    def cublas_workspace_size(size: int | None = None) -> int:
        if size is not None:
            session.blas_workspace_sizes["cublas"] = _checked(size)
        return cublas_size(session)

    def cublaslt_workspace_size(size: int | None = None) -> int:
        if size is not None:
            session.blas_workspace_sizes["cublaslt"] = _checked(size)
        return cublaslt_size(session)

    found = {"cublas_workspace_size": cublas_workspace_size,
             "cublaslt_workspace_size": cublaslt_workspace_size}
    return {(backends, name): fn for name, fn in found.items() if hasattr(backends, name)}
