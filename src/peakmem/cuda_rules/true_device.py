"""A tensor's true device, as the capture's own machinery must read it.

During a capture the job sees device tensors as `cuda:0` tensors (capture/device_view.py): the
capture's torch-function mode answers `.device`, `.is_meta`, `.is_cuda` for them. The capture's own
code (rules, phase hooks, the recorder) must see what they really are, meta tensors, wherever it
runs, so it reads devices through these helpers, with torch functions (and so the view) off."""

from __future__ import annotations

from typing import Any

import torch

_NO_VIEW = torch._C.DisableTorchFunction


def is_meta(value: Any) -> bool:
    """Whether `value` is a tensor on the meta device (a fake device tensor, or a meta tensor
    standing for host memory or for the job's own meta tensor)."""
    if not isinstance(value, torch.Tensor):
        return False
    with _NO_VIEW():
        return value.is_meta


def true_device(tensor: torch.Tensor) -> torch.device:
    """The device `tensor` really lives on (meta for device tensors during a capture)."""
    with _NO_VIEW():
        return tensor.device
