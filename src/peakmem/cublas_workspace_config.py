"""CUBLAS_WORKSPACE_CONFIG read as torch reads it, without torch: the estimate's parent process
checks the job's value before the job runs (importing `peakmem.cuda_rules` would import torch
there) and the cuBLAS rules size the workspace from it."""

from __future__ import annotations

import re

_STOI_MAX = 2**31 - 1
"""torch reads each number of CUBLAS_WORKSPACE_CONFIG with std::stoi (`parseChosenWorkspaceSize`,
aten/src/ATen/cuda/CublasHandlePool.cpp): a larger one throws std::out_of_range."""
_SIZE_T = 2**64
_LARGEST_REQUEST = 2**56
"""64 PiB: no GPU holds nearly as much, so a larger workspace fails like this one (out of
memory); capped so that the peak it makes stays an int64 wherever peakmem records it."""


class WorkspaceConfigError(ValueError):
    """A CUBLAS_WORKSPACE_CONFIG value torch's first cuBLAS call would fail on."""


def workspace_config_bytes(config: str) -> int | None:
    """Bytes requested by a CUBLAS_WORKSPACE_CONFIG value like ":4096:8" or ":4096:2:16:8", as
    torch sums them (in a size_t); None where it has no `:SIZE:COUNT` (torch warns and uses its
    default). WorkspaceConfigError where a number is over std::stoi's range."""
    numbers = re.findall(r":(\d+):(\d+)", config)
    if not numbers:
        return None
    for kib, count in numbers:
        for text in (kib, count):
            digits = text.lstrip("0") or "0"
            if len(digits) > 10 or int(digits) > _STOI_MAX:
                shown = text if len(text) <= 24 else text[:20] + "..."
                raise WorkspaceConfigError(
                    f"CUBLAS_WORKSPACE_CONFIG: {shown} is over {_STOI_MAX}, the most torch reads "
                    "(std::stoi): its first cuBLAS call would fail")
    total = sum(int(kib) * 1024 * int(count) for kib, count in numbers) % _SIZE_T
    return min(total, _LARGEST_REQUEST)
