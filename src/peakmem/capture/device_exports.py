"""Device tensors handed out of torch's reach: DLPack capsules and CUDA IPC handles.

A fake device tensor has no memory to export: `torch.utils.dlpack.to_dlpack(x)`,
`x.__dlpack__()` (what `torch.from_dlpack`, CuPy and JAX call) raised "BufferError: Cannot pack
tensors on meta", and `storage._share_cuda_()` (torch.multiprocessing's CUDA tensor sharing)
"CUDA is not available": both reported as the job's own failure, where a GPU runs them. Until
they are modelled the capture stops with `unsupported` (exit 3), one line naming the call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.dlpack

from peakmem.capture.session import CaptureSession
from peakmem.capture.unsupported import Unsupported

DLPACK = "DLPack export of device tensors (torch.utils.dlpack.to_dlpack, Tensor.__dlpack__, " \
         "torch.from_dlpack of a device tensor)"
IPC = "CUDA IPC sharing of device storages (UntypedStorage._share_cuda_, torch.multiprocessing)"


def is_device_tensor(session: CaptureSession, value: Any) -> bool:
    """A fake device tensor (meta, not a host tensor kept fake nor the job's own meta one)."""
    if not isinstance(value, torch.Tensor):
        return False
    with torch._C.DisableTorchFunction():
        if not value.is_meta or value.layout != torch.strided:
            return False
        return id(value.untyped_storage()) not in session.storage_kinds


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    to_dlpack = torch.utils.dlpack.to_dlpack
    dunder = torch.Tensor.__dlpack__
    dunder_device = torch.Tensor.__dlpack_device__
    share = torch.UntypedStorage._share_cuda_

    def guarded_to_dlpack(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if is_device_tensor(session, tensor):
            raise Unsupported(DLPACK)
        return to_dlpack(tensor, *args, **kwargs)

    def guarded_dunder(self: Any, *args: Any, **kwargs: Any) -> Any:
        if is_device_tensor(session, self):
            raise Unsupported(DLPACK)
        return dunder(self, *args, **kwargs)

    def guarded_dunder_device(self: Any, *args: Any, **kwargs: Any) -> Any:
        if is_device_tensor(session, self):  # `torch.from_dlpack(x)` asks first
            raise Unsupported(DLPACK)
        return dunder_device(self, *args, **kwargs)

    def guarded_share(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.device.type == "meta":
            raise Unsupported(IPC)
        return share(self, *args, **kwargs)

    found: dict[tuple[Any, str], Any] = {
        (torch.utils.dlpack, "to_dlpack"): guarded_to_dlpack,
        (torch.Tensor, "__dlpack__"): guarded_dunder,
        (torch.Tensor, "__dlpack_device__"): guarded_dunder_device,
        (torch.UntypedStorage, "_share_cuda_"): guarded_share,
    }
    if getattr(torch, "to_dlpack", None) is to_dlpack:
        found[(torch, "to_dlpack")] = guarded_to_dlpack
    return found
