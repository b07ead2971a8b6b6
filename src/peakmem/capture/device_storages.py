"""Device storages the job makes directly: `torch.UntypedStorage(nbytes, device="cuda")` and the
`torch.TypedStorage(n, dtype=..., device="cuda")` built on it.

The storage constructor is no torch function: the capture's mode never saw it, and torch refused
the device ("Storage device not recognized: cuda"), reported as the job's failure where a GPU
runs it. During a capture a device storage of a size is the storage of a new uint8 device
tensor of that many bytes (`torch.empty`, seen and recorded like any allocation; the storage
outlives the tensor as long as the job holds it). Storages made from data
(`UntypedStorage([1, 2], device="cuda")`) and every host storage go to torch as before.
"""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.device_specs import is_cuda_spec
from peakmem.capture.session import CaptureSession


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    original = torch.UntypedStorage.__new__

    def new(cls: type, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if (cls is torch.UntypedStorage and device is not None and is_cuda_spec(device)
                and len(args) == 1 and set(kwargs) == {"device"}
                and isinstance(args[0], int) and not isinstance(args[0], bool)):
            if args[0] < 0:
                raise RuntimeError(f"Trying to create tensor with negative dimension {args[0]}: "
                                   f"[{args[0]}]")
            return torch.empty(args[0], dtype=torch.uint8, device=device).untyped_storage()
        return original(cls, *args, **kwargs)

    return {(torch.UntypedStorage, "__new__"): new}
