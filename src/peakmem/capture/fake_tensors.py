"""Tensor-level and build-level facts of a CUDA runtime during a capture: `share_memory_()` of a
device tensor (a no-op, as on CUDA), pinned host memory (`pin_memory()` and `pin_memory=True`
give a host tensor that says `is_pinned()`, as with CUDA; a CPU-only torch has no pinned
allocator, so it stays in ordinary host memory), the CUDA build's version strings (`torch.version.cuda`:
the stack profile's `cuda_version`, "12.1" for torch 2.4's wheels, "13.0" for 2.11's;
`torch.backends.cuda.is_built()`, `torch.backends.cudnn.version()`: the stack's `cudnn_version`), and
the default device a job sets (`torch.set_default_device("cuda")`), put back afterwards."""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.session import CaptureSession
from peakmem.cuda_rules.true_device import is_meta

PINNED_ATTRIBUTE = "_peakmem_pinned"


def mark_pinned(tensor: Any) -> Any:
    """Make a host tensor say `is_pinned()` (what CUDA's pinned allocator would have given)."""
    if isinstance(tensor, torch.Tensor) and not is_meta(tensor):
        setattr(tensor, PINNED_ATTRIBUTE, True)
    return tensor


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    original_share = torch.Tensor.share_memory_
    original_is_pinned = torch.Tensor.is_pinned
    original_is_shared = torch.Tensor.is_shared
    original_set_default_device = torch.set_default_device
    original_get_default_device = torch.get_default_device

    def share_memory_(self: torch.Tensor) -> torch.Tensor:
        if is_meta(self):  # CUDA tensors are shared through CUDA IPC: nothing to move
            return self
        return original_share(self)

    def is_shared(self: torch.Tensor) -> bool:
        return True if is_meta(self) else original_is_shared(self)

    def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        """CUDA returns a pinned copy; here the host tensor itself, marked pinned: no second
        host copy, and the capture keeps following the batch it collated (a device tensor is
        returned as is)."""
        return self if is_meta(self) else mark_pinned(self)

    def is_pinned(self: torch.Tensor, device: Any = None) -> bool:
        if is_meta(self):
            return False
        return getattr(self, PINNED_ATTRIBUTE, False) or original_is_pinned(self)

    def set_default_device(device: Any) -> None:
        """A CUDA default device becomes the capture device underneath the capture's modes
        (torch puts the default-device mode at the bottom of the stack, below them)."""
        session.default_device_set = True
        if device is not None and torch.device(device).type == "cuda":
            session.default_device_cuda = True
            original_set_default_device("meta")
        else:
            session.default_device_cuda = False
            original_set_default_device(device)

    def get_default_device() -> torch.device:
        innermost = _innermost_device_context()
        if innermost is not None and innermost.device.type == "cuda":  # `with torch.device("cuda")`
            return torch.device("cuda", innermost.device.index or 0)
        if job_default_is_device(session):
            return torch.device("cuda", 0)
        return original_get_default_device()

    scaler_class = torch.amp.GradScaler
    original_get_scale = scaler_class.get_scale

    def get_scale(self: Any) -> float:
        """A fake device's scale has no value: the scale a GPU run keeps while no step overflows
        (fake gradients never do), the initial one (growth every `growth_interval` steps aside)."""
        scale = getattr(self, "_scale", None)
        if self._enabled and isinstance(scale, torch.Tensor) and is_meta(scale) and not session.eager:
            return float(self._init_scale)
        return original_get_scale(self)

    return {
        (scaler_class, "get_scale"): get_scale,
        (torch.Tensor, "share_memory_"): share_memory_,
        (torch.Tensor, "is_shared"): is_shared,
        (torch.Tensor, "pin_memory"): pin_memory,
        (torch.Tensor, "is_pinned"): is_pinned,
        (torch.version, "cuda"): "{}.{}".format(*session.stack.cuda_version),
        (torch.backends.cuda, "is_built"): lambda: True,
        (torch.backends.cudnn, "version"): lambda: session.stack.cudnn_version,
        (torch, "set_default_device"): set_default_device,
        (torch, "get_default_device"): get_default_device,
    }


def _innermost_device_context() -> Any:
    """The `torch.device` context mode nearest the top of the torch-function mode stack."""
    from torch.utils._device import DeviceContext

    stack = torch.overrides._get_current_function_mode_stack()
    return next((m for m in reversed(stack) if isinstance(m, DeviceContext)), None)


def job_default_is_device(session: CaptureSession) -> bool:
    """Whether a tensor the job makes without naming a device is a device tensor: the job called
    `torch.set_default_device("cuda")` (below the capture's modes, that default is the capture
    device, meta) and no `with torch.device(...)` block of its own is nearer."""
    if not session.default_device_cuda:
        return False
    job_default = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return _innermost_device_context() is job_default


def restore_default_device(session: CaptureSession, original_set_default_device: Any) -> None:
    """Undo a default device the job set (after the capture's modes are gone)."""
    if session.default_device_set:
        original_set_default_device(None)
