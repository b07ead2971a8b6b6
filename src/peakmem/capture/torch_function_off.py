"""Device work the job does with peakmem's torch-function mode turned off: unsupported, one line.

The capture's torch-function mode (capture/capture_modes.py) maps the job's "cuda" devices to the
meta device. A job that turns it off (`torch._C.DisableTorchFunction()`,
`torch.overrides._pop_mode_temporarily()`) and makes a device tensor there (`torch.empty(n,
device="cuda")`, `x.to("cuda")`) sends a real CUDA device down to the dispatcher, where this
CPU-only torch has no CUDA kernel: torch's 60-line "Could not run 'aten::empty.memory_format'
with arguments from the 'CUDA' backend" came out as the job's failure (or a fake-mode limit).
Ops on device tensors the job already holds run there as before (meta tensors, recorded).

Only an op that failed is looked at (`names_cuda`): no cost per op.
"""

from __future__ import annotations

from typing import Any

import torch

TORCH_FUNCTION_OFF = ("device tensors made with peakmem's torch-function mode turned off "
                      "(torch._C.DisableTorchFunction, torch.overrides._pop_mode_temporarily)")


def _is_cuda(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    return False


def names_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether an aten op's arguments name a CUDA device (a `device` argument, a device in its
    positional arguments): the capture's mapping to the meta device did not run for it."""
    if _is_cuda(kwargs.get("device")):
        return True
    return any(isinstance(value, torch.device) and value.type == "cuda" for value in args)


NOT_LINKED = "PyTorch is not linked with support for cuda devices"
"""What this CPU-only torch raises where C++ code sets a CUDA device (`Tensor.cuda()`,
`Module.to("cuda")` with the torch-function mode off reach a device guard before any aten op)."""


def is_unmapped_cuda(exc: BaseException) -> bool:
    """The job's exception is torch's refusal of a CUDA device that peakmem did not map: the
    job would not fail on a GPU; peakmem cannot follow it there."""
    return type(exc) is RuntimeError and exc.args[:1] == (NOT_LINKED,)
