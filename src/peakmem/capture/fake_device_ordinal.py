"""`torch.device(0)`: a bare ordinal is a device of the current accelerator. A CPU-only torch has
none, so its C++ constructor raises ("Cannot access accelerator device when none is available")
before any Python hook runs; FSDP's `device_id`, accelerate's and transformers' `device_map`
(`torch.device(0)`) and scripts that do `torch.device(rank)` all build devices that way.

During a capture `torch.device` is a stand-in class whose construction maps a bare int to
`cuda:N` (as on a CUDA machine) and passes everything else to the real type; `isinstance(x,
torch.device)` and `issubclass` answer for the real type, and every object it makes IS a real
`torch.device`. Code that imported the name before the capture (`from torch import device`)
keeps the real type."""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.session import CaptureSession

_REAL = torch.device


class _DeviceType(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, _REAL)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, _REAL)


class device(metaclass=_DeviceType):  # noqa: N801 - stands in for torch.device
    """`torch.device` as a CUDA build parses it (the objects made are real `torch.device`s)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
        if len(args) == 1 and not kwargs and type(args[0]) is int:
            return _REAL("cuda", args[0])
        return _REAL(*args, **kwargs)


# Pickle looks the type up by name: `torch.device.__reduce__` names whatever `torch.device` is,
# so the stand-in must pickle as "torch.device" (it unpickles as the real type, or as this
# stand-in during a capture: both make real devices).
device.__module__, device.__qualname__ = "torch", "device"


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    return {(torch, "device"): device}
