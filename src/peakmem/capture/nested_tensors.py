"""Strided nested tensors on the device: not modelled yet.

`torch.nested.nested_tensor([...])` / `as_nested_tensor([...])` of device tensors (or with
`device="cuda"`) in torch's default strided layout build a NestedTensorImpl, whose constructor
asserts a CPU / CUDA / ... storage and fails on the capture's meta tensors with "INTERNAL ASSERT
FAILED", reported as the job's failure where a GPU runs it. Until modelled the capture stops with
`unsupported` (exit 3), one line. The jagged layout (`layout=torch.jagged`, a Python tensor
subclass over plain tensors) runs under the capture and is left alone.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nested

from peakmem.capture.device_exports import is_device_tensor
from peakmem.capture.device_specs import is_cuda_spec
from peakmem.capture.session import CaptureSession
from peakmem.capture.unsupported import Unsupported

STRIDED_NESTED = ("strided nested tensors on the device (torch.nested.nested_tensor / "
                  "as_nested_tensor without layout=torch.jagged)")


def _on_device(session: CaptureSession, tensors: Any, device: Any) -> bool:
    if device is not None:
        return is_cuda_spec(device)
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return any(is_device_tensor(session, t) for t in tensors or ())


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    nested_tensor = torch.nested.nested_tensor
    as_nested_tensor = torch.nested.as_nested_tensor

    def guarded_nested_tensor(tensor_list: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("layout") in (None, torch.strided) and _on_device(
                session, tensor_list, kwargs.get("device")
        ):
            raise Unsupported(STRIDED_NESTED)
        return nested_tensor(tensor_list, *args, **kwargs)

    def guarded_as_nested_tensor(ts: Any, dtype: Any = None, device: Any = None,
                                 layout: Any = None) -> Any:
        if layout in (None, torch.strided) and _on_device(session, ts, device):
            raise Unsupported(STRIDED_NESTED)
        return as_nested_tensor(ts, dtype=dtype, device=device, layout=layout)

    return {(torch.nested, "nested_tensor"): guarded_nested_tensor,
            (torch.nested, "as_nested_tensor"): guarded_as_nested_tensor}
